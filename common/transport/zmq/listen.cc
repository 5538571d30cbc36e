// Start (zmq_transport.h): the context, the listening ROUTER, and the options and monitors of
// every socket the endpoint opens.
#include <sys/eventfd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/transport/zmq/sockets.h"
#include "common/transport/zmq/zmq_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {
namespace {

constexpr int kMaxSockets = 4096;

}  // namespace

Status ZmqTransport::Start() {
  const std::string& listen = options_.listen_address;
  if (!HasScheme(listen)) {
    return InvalidArgumentError(Prefix() + fmt::format("listen address '{}' is not tcp://HOST:PORT "
                                                       "or ipc://PATH",
                                                       listen));
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return InternalError(Prefix() + "eventfd: " + std::strerror(errno));
  if (Status s = watch_.Open(); !s.ok()) return InternalError(Prefix() + s.message());
  ctx_ = zmq_ctx_new();
  if (!ctx_) return InternalError(Prefix() + "zmq_ctx_new: " + ZmqError());
  zmq_ctx_set(ctx_, ZMQ_MAX_SOCKETS, kMaxSockets);

  if (curve_) {
    BP_RETURN_IF_ERROR(LoadCurveKeys());
    // The ZAP handler must exist before the ROUTER accepts anyone: without one, libzmq admits
    // CURVE clients unauthenticated.
    zap_ = zmq_socket(ctx_, ZMQ_REP);
    if (!zap_) return InternalError(Prefix() + "zmq_socket(REP): " + ZmqError());
    SetInt(zap_, ZMQ_LINGER, 0);
    if (zmq_bind(zap_, kZapEndpoint) != 0) {
      return InternalError(Prefix() + "binding the ZAP handler: " + ZmqError());
    }
  }
  router_ = zmq_socket(ctx_, ZMQ_ROUTER);
  if (!router_) return InternalError(Prefix() + "zmq_socket(ROUTER): " + ZmqError());
  SetInt(router_, ZMQ_LINGER, 0);  // receive only
  // kNone: a restarted peer takes over its name (the routing id it gives itself). kCurve:
  // peers give no routing id (ZeroMQ numbers the connections); the sender is the PeerId of
  // the connection's key, and a takeover is decided by SenderOf between connections of the
  // same key.
  SetInt(router_, ZMQ_ROUTER_HANDOVER, curve_ ? 0 : 1);
  // kCurve: the main socket carries only lane requests (lane.h), so a peer, authenticated or
  // not, can make it hold a few KiB at most.
  const int64_t max_part =
      curve_
          ? kCurveMaxPartBytes
          : static_cast<int64_t>(std::min<uint64_t>(options_.max_message_bytes, uint64_t{1} << 62));
  if (curve_) {
    SetInt(router_, ZMQ_CURVE_SERVER, 1);
    zmq_setsockopt(router_, ZMQ_CURVE_SECRETKEY, secret_key_.data(), secret_key_.size());
    zmq_setsockopt(router_, ZMQ_ZAP_DOMAIN, kZapDomain, sizeof(kZapDomain) - 1);
  }
  BP_RETURN_IF_ERROR(SetListenerOptions(router_, max_part, listen, &router_monitor_));

  StatusOr<std::string> bindable = BindableAddress(listen);
  if (!bindable.ok())
    return Status(bindable.status().code(), Prefix() + bindable.status().message());
  std::string bind_address = *bindable;
  if (listen.rfind("tcp://", 0) == 0 && bind_address.size() > 2 &&
      bind_address.compare(bind_address.size() - 2, 2, ":0") == 0) {
    bind_address.replace(bind_address.size() - 1, 1, "*");  // any free port
  }
  if (listen.rfind("ipc://", 0) == 0) {
    Status s = CheckIpcPathFree(listen);
    if (!s.ok()) return Status(s.code(), Prefix() + s.message());
  }
  if (zmq_bind(router_, bind_address.c_str()) != 0) {
    const int err = zmq_errno();
    if (err == EADDRINUSE) {
      return UnavailableError(Prefix() + fmt::format("address {} is in use", listen));
    }
    return InvalidArgumentError(
        Prefix() + fmt::format("cannot listen on '{}': {}", listen, zmq_strerror(err)));
  }
  char resolved[1024];
  size_t resolved_len = sizeof(resolved);
  if (zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, resolved, &resolved_len) != 0) {
    return InternalError(Prefix() + "ZMQ_LAST_ENDPOINT: " + ZmqError());
  }
  address_ = resolved;
  if (curve_) BP_RETURN_IF_ERROR(BindLaneRouter(bind_address));
  io_thread_ = std::thread([this] { IoLoop(); });
  return Status::Ok();
}

Status ZmqTransport::OpenMonitor(void* socket, int events, void** monitor) {
  const std::string addr = fmt::format("inproc://bitpush-monitor-{}", monitor_seq_.fetch_add(1));
  if (zmq_socket_monitor(socket, addr.c_str(), events) != 0) {
    return InternalError(Prefix() + "zmq_socket_monitor: " + ZmqError());
  }
  void* pair = zmq_socket(ctx_, ZMQ_PAIR);
  if (!pair) return InternalError(Prefix() + "zmq_socket(PAIR): " + ZmqError());
  SetInt(pair, ZMQ_LINGER, 0);
  if (zmq_connect(pair, addr.c_str()) != 0) {
    const std::string err = ZmqError();
    zmq_close(pair);
    return InternalError(Prefix() + "monitor connect: " + err);
  }
  *monitor = pair;
  return Status::Ok();
}

Status ZmqTransport::SetListenerOptions(void* router, int64_t max_part, const std::string& address,
                                        void** monitor) {
  SetInt(router, ZMQ_RCVHWM,
         static_cast<int>(std::min<size_t>(options_.max_queued_per_peer, 1 << 30)));
  zmq_setsockopt(router, ZMQ_MAXMSGSIZE, &max_part, sizeof(max_part));
  SetInt(router, ZMQ_HANDSHAKE_IVL, kHandshakeMs);
  // The kernel's accept queue (listen(2)'s backlog): libzmq's default of 100 overflows when a
  // few hundred nodes connect to the scheduler at once (each refused SYN waits out TCP's 1 s
  // retry); the kernel caps it at net.core.somaxconn.
  SetInt(router, ZMQ_BACKLOG, kListenBacklog);
  if (address.find('[') != std::string::npos) SetInt(router, ZMQ_IPV6, 1);
  return OpenMonitor(router,
                     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_ACCEPTED |
                         ZMQ_EVENT_DISCONNECTED,
                     monitor);
}

void ZmqTransport::SetSenderOptions(void* dealer, const std::string& address) {
  const int64_t dealer_max_part = kDealerMaxPartBytes;
  zmq_setsockopt(dealer, ZMQ_MAXMSGSIZE, &dealer_max_part, sizeof(dealer_max_part));
  SetInt(dealer, ZMQ_RCVHWM, 1);
  SetInt(dealer, ZMQ_HANDSHAKE_IVL, kHandshakeMs);
  SetInt(dealer, ZMQ_LINGER, kCloseLingerMs);
  SetInt(dealer, ZMQ_IMMEDIATE, 1);  // queue only on live connections: nothing stale on reconnect
  SetInt(dealer, ZMQ_SNDHWM,
         static_cast<int>(std::min<size_t>(options_.max_queued_per_peer, 1 << 30)));
  SetInt(dealer, ZMQ_RECONNECT_IVL, 100);
  SetInt(dealer, ZMQ_RECONNECT_IVL_MAX, 1000);
  if (address.find('[') != std::string::npos) SetInt(dealer, ZMQ_IPV6, 1);
}

}  // namespace bitpush::transport::zmq_backend
