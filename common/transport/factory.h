// The transport factory: which backend serves which address scheme. One table (factory.cc)
// lists the backends; CreateTransport (transport.h) picks the backend from the scheme of the
// listen address, so a node configured with `tcp://` or `ipc://` addresses gets ZeroMQ and
// one with `inproc://` addresses the in-process queues. Adding a backend means its directory
// (common/transport/<name>/, repeating transport.h) and one line in the table.
//
// A backend that cannot run on this machine reports why through `viable`; asking for it is
// an error naming the reason, never a silent fallback to another backend.
//
// Pure functions over an immutable table; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/transport/transport.h"

namespace bitpush::transport {

struct TransportBackend {
  // The backend's name, as cluster.transport and TransportOptions::backend spell it.
  std::string_view name;
  // The address schemes it serves ("tcp", "ipc"), without "://".
  std::vector<std::string_view> schemes;
  // Binds an endpoint (options already checked for the backend-independent rules).
  StatusOr<std::unique_ptr<Transport>> (*create)(const TransportOptions& options);
  // OK where the backend can run on this machine; otherwise why not.
  Status (*viable)();
};

// Every backend, in table order.
const std::vector<TransportBackend>& TransportBackends();

// The backend named `name`; InvalidArgument "unknown transport backend 'x'; valid: inproc, zmq,
// ucx".
StatusOr<const TransportBackend*> FindTransportBackend(std::string_view name);

// The backend serving `address`'s scheme; InvalidArgument naming the address and the valid
// schemes when none does.
StatusOr<const TransportBackend*> BackendForAddress(std::string_view address);

}  // namespace bitpush::transport
