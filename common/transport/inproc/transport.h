// The inproc transport backend: endpoints of one in-process cluster (threads as nodes in
// tests, embedded clusters) exchanging messages through queues, with no copies and no sockets.
//
// An InprocHub is the registry of the endpoints of one cluster, keyed by their address
// (`inproc://NAME`); every endpoint of the cluster is created with the same hub
// (TransportOptions::inproc_hub), so two clusters in one process never see each other. There
// is no process-wide registry.
//
// Each endpoint owns a Mailbox: its receive queue. Send(peer) finds the peer's mailbox through
// the hub and moves the Message (its Buffers keep sharing the sender's bytes) into it. Per
// (sender, receiver) pair at most TransportOptions::max_queued_per_peer messages wait in the
// receiver's mailbox; beyond that Send blocks (backpressure) for at most send_block_timeout.
// When an endpoint closes, every endpoint that Connect()ed to it receives a kPeerDisconnected
// event, and later sends to it fail with Unavailable (until an endpoint registers the address
// again).
//
// The backend has no threads of its own: senders push, the receiver's Receive pops.
//
// Thread-safety: InprocHub and the endpoints are safe to use from any thread (Receive by one
// thread at a time, as the Transport contract says). The hub outlives nothing: endpoints keep
// a shared_ptr to it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "common/transport/transport.h"

namespace bitpush::transport {

namespace inproc {
class Mailbox;
}  // namespace inproc

class InprocHub {
 public:
  InprocHub() = default;
  InprocHub(const InprocHub&) = delete;
  InprocHub& operator=(const InprocHub&) = delete;

  // Backend-internal: used by the inproc endpoints.
  // Registers `mailbox` at `address`; Unavailable if a live endpoint already listens there.
  Status Register(const std::string& address, const std::shared_ptr<inproc::Mailbox>& mailbox);
  // Removes `mailbox` from `address` (no-op if another mailbox holds the address now).
  void Unregister(const std::string& address, const inproc::Mailbox* mailbox);
  // The live mailbox at `address`, or null.
  std::shared_ptr<inproc::Mailbox> Find(const std::string& address) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::weak_ptr<inproc::Mailbox>> endpoints_;  // guarded by mu_
};

namespace inproc {

// Creates an inproc endpoint (options already validated by CreateTransport, except the
// backend-specific parts: the address and the hub, checked here).
StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(const TransportOptions& options);

}  // namespace inproc
}  // namespace bitpush::transport
