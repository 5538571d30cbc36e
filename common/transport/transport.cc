// CreateTransport: validates the backend-independent options and dispatches on the backend.
#include "common/transport/transport.h"

#include "common/transport/inproc/transport.h"
#include "common/transport/zmq/transport.h"
#include "fmt/format.h"

namespace bitpush::transport {

namespace {

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

}  // namespace

StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options) {
  if (options.backend != "inproc" && options.backend != "zmq") {
    return InvalidArgumentError(
        fmt::format("unknown transport backend '{}'; valid: inproc, zmq", options.backend));
  }
  BP_RETURN_IF_ERROR(ValidateCommonOptions(options));
  if (options.backend == "inproc") return inproc::CreateInprocTransport(options);
  return zmq_backend::CreateZmqTransport(options);
}

}  // namespace bitpush::transport
