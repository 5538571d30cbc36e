// CreateTransport and the backend table: validates the backend-independent options and picks
// the backend from the listen address's scheme.
#include "common/transport/factory.h"

#include "common/transport/inproc/transport.h"
#include "common/transport/ucx/transport.h"
#include "common/transport/zmq/transport.h"
#include "fmt/format.h"

namespace bitpush::transport {

namespace {

Status AlwaysViable() {
  return Status::Ok();
}

Status ValidateCommonOptions(const TransportOptions& o) {
  if (o.name.empty()) return InvalidArgumentError("transport: the endpoint name is empty");
  // The zmq backend sends the name as the ZeroMQ routing id: 1..255 bytes, not starting with 0.
  if (o.name.size() > 255 || o.name[0] == '\0') {
    return InvalidArgumentError(fmt::format(
        "transport: endpoint name of {} bytes: must be 1..255 bytes, not starting with NUL",
        o.name.size()));
  }
  if (o.listen_address.empty()) {
    return InvalidArgumentError(fmt::format("endpoint '{}': listen_address is empty", o.name));
  }
  if (o.max_queued_per_peer == 0) {
    return InvalidArgumentError(
        fmt::format("endpoint '{}': max_queued_per_peer must be at least 1", o.name));
  }
  if (o.send_block_timeout.count() < 0) {
    return InvalidArgumentError(fmt::format("endpoint '{}': send_block_timeout is negative ({} ms)",
                                            o.name, o.send_block_timeout.count()));
  }
  return Status::Ok();
}

std::string_view SchemeOf(std::string_view address) {
  const size_t end = address.find("://");
  return end == std::string_view::npos ? std::string_view() : address.substr(0, end);
}

template <typename F>
std::string JoinBackends(F&& part) {
  std::string out;
  for (const TransportBackend& b : TransportBackends()) {
    std::string p = part(b);
    if (p.empty()) continue;
    out += (out.empty() ? "" : ", ") + p;
  }
  return out;
}

}  // namespace

const std::vector<TransportBackend>& TransportBackends() {
  // One line per backend (common/transport/<name>/transport.h).
  static const std::vector<TransportBackend> kBackends = {
      {"inproc", {"inproc"}, &inproc::CreateInprocTransport, &AlwaysViable},
      {"zmq", {"tcp", "ipc"}, &zmq_backend::CreateZmqTransport, &AlwaysViable},
      {"ucx", {"ucx"}, &ucx_backend::CreateUcxTransport, &ucx_backend::UcxViable},
  };
  return kBackends;
}

StatusOr<const TransportBackend*> FindTransportBackend(std::string_view name) {
  for (const TransportBackend& b : TransportBackends()) {
    if (b.name == name) return &b;
  }
  return InvalidArgumentError(
      fmt::format("unknown transport backend '{}'; valid: {}", name,
                  JoinBackends([](const TransportBackend& b) { return std::string(b.name); })));
}

StatusOr<const TransportBackend*> BackendForAddress(std::string_view address) {
  const std::string_view scheme = SchemeOf(address);
  for (const TransportBackend& b : TransportBackends()) {
    for (std::string_view s : b.schemes) {
      if (s == scheme) return &b;
    }
  }
  return InvalidArgumentError(
      fmt::format("address '{}' has no transport scheme bitpush knows; valid: {}", address,
                  JoinBackends([](const TransportBackend& b) {
                    std::string s;
                    for (std::string_view sc : b.schemes)
                      s += (s.empty() ? "" : ", ") + std::string(sc) + "://";
                    return s;
                  })));
}

StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options) {
  const TransportBackend* requested = nullptr;
  if (!options.backend.empty()) {
    BP_ASSIGN_OR_RETURN(requested, FindTransportBackend(options.backend));
  }
  BP_RETURN_IF_ERROR(ValidateCommonOptions(options));
  StatusOr<const TransportBackend*> by_scheme = BackendForAddress(options.listen_address);
  const TransportBackend* backend = nullptr;
  if (by_scheme.ok()) {
    backend = *by_scheme;
    if (requested != nullptr && requested != backend) {
      return InvalidArgumentError(fmt::format(
          "endpoint '{}': listen address '{}' is a {} address, but the transport backend is {}",
          options.name, options.listen_address, backend->name, requested->name));
    }
  } else if (requested != nullptr) {
    backend = requested;  // its own validation names what is wrong with the address
  } else {
    return Status(by_scheme.status().code(),
                  fmt::format("endpoint '{}': {}", options.name, by_scheme.status().message()));
  }
  if (Status viable = backend->viable(); !viable.ok()) {
    return UnavailableError(fmt::format("endpoint '{}': the {} transport cannot run here: {}",
                                        options.name, backend->name, viable.message()));
  }
  return backend->create(options);
}

}  // namespace bitpush::transport
