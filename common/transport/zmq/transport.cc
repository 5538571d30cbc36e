#include "common/transport/zmq/transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/log_limiter.h"
#include "common/logging.h"
#include "common/transport/zmq/framing.h"
#include "common/transport/zmq/lane.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {
namespace {

// How long Close() lets ZeroMQ flush messages already handed to a connected peer.
constexpr int kCloseLingerMs = 2000;
// Frames below this size are copied into / out of ZeroMQ messages: cheaper than the
// bookkeeping of a zero-copy hand-over.
constexpr size_t kCopyBelowBytes = 4096;
// Largest part a DEALER accepts: it never reads what its peer sends, so anything beyond the
// handshake is refused (a hostile listener cannot fill our memory through it).
constexpr int64_t kDealerMaxPartBytes = 64 * 1024;
// Largest part the main ROUTER accepts under kCurve (it carries only lane requests).
constexpr int64_t kCurveMaxPartBytes = 4 * 1024;
// How long a connection may take for the ZMTP greeting and security handshake.
constexpr int kHandshakeMs = 10000;
// The ZAP endpoint libzmq asks to authenticate CURVE clients (RFC 27), and our domain.
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr char kZapDomain[] = "bitpush";
// Messages taken from the ROUTER per wake-up before looking at other sockets.
constexpr int kReceiveBatch = 256;
constexpr int kMaxSockets = 4096;

std::string ZmqError() {
  return zmq_strerror(zmq_errno());
}

bool HasScheme(const std::string& address) {
  return address.rfind("tcp://", 0) == 0 || address.rfind("ipc://", 0) == 0;
}

// Owns one zmq_msg_t; a received Buffer keeps it alive instead of copying its bytes.
struct MsgHolder {
  MsgHolder() { zmq_msg_init(&msg); }
  ~MsgHolder() { zmq_msg_close(&msg); }
  MsgHolder(const MsgHolder&) = delete;
  MsgHolder& operator=(const MsgHolder&) = delete;
  zmq_msg_t msg;
};

// ThreadSanitizer cannot see the synchronisation inside libzmq (not built with it); these mark
// the hand-over of a zero-copy Buffer from the I/O thread to ZeroMQ's thread that releases it.
#if defined(__SANITIZE_THREAD__)
#define BP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BP_TSAN 1
#endif
#endif
#ifdef BP_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void HandOver(void* p) {
  __tsan_release(p);
}
void TakeOver(void* p) {
  __tsan_acquire(p);
}
#else
void HandOver(void*) {}
void TakeOver(void*) {}
#endif

// ZeroMQ calls this (from its I/O thread) when it no longer needs a zero-copy part.
void ReleaseBuffer(void* /*data*/, void* hint) {
  TakeOver(hint);
  delete static_cast<Buffer*>(hint);
}

void SetInt(void* socket, int option, int value) {
  zmq_setsockopt(socket, option, &value, sizeof(value));
}

enum class PeerState { kConnecting, kConnected, kDisconnected };

// A message on its way out: as given to Send, or (kCurve) sealed by the I/O thread for the lane
// whose cipher `sealed_with` is (lane.h SealMessage: the frames are the sealed parts), kept so
// until ZeroMQ takes it.
struct Outgoing {
  Message msg;
  const LaneCipher* sealed_with = nullptr;
};

// What callers and the I/O thread share about one peer (guarded by ZmqTransport::mu_).
struct PeerShared {
  std::string address;
  PeerState state = PeerState::kConnecting;
  bool removed = false;         // Disconnect()ed or replaced by another Connect
  std::deque<Outgoing> outbox;  // accepted by Send, not yet taken by the I/O thread
  size_t io_held = 0;           // taken by the I/O thread, not yet handed to ZeroMQ
  Status last_error;            // why the peer is kDisconnected
};

// The address zmq_bind is given for `listen` (host names resolved; see the definition).
StatusOr<std::string> BindableAddress(const std::string& listen);

// Hands a peer's sockets (created by the calling thread) to the I/O thread, or retires them.
struct Command {
  enum class Kind { kAdd, kRemove };
  Kind kind;
  PeerId peer;
  std::shared_ptr<PeerShared> shared;
  void* dealer = nullptr;
  void* monitor = nullptr;
};

bool ReadMonitorEvent(void* monitor, uint16_t* event, std::string* endpoint,
                      uint32_t* value = nullptr);

// Offers `frames` to `socket` as the rest of a message (first_taken: its first part was
// already accepted) or as a whole message. 0 when sent; EAGAIN when ZeroMQ took nothing
// (retry later); another errno when the message was lost part-way.
int SendFrames(void* socket, const std::vector<Buffer>& frames, bool first_taken);

// The I/O thread's view of a peer.
struct IoPeer {
  std::shared_ptr<PeerShared> shared;
  void* dealer = nullptr;
  void* monitor = nullptr;
  std::deque<Outgoing> pending;
  // kCurve: the sealed lane to the peer (lane.h). `dealer` (CURVE) carries only the lane
  // request and the offer; every message goes through `lane` once its handshake succeeded.
  bool control_up = false;      // the CURVE connection is established
  bool lane_requested = false;  // a request went out, no offer came back yet
  uint64_t lane_request = 0;    // the number of the latest request
  void* lane = nullptr;         // PLAIN DEALER to the peer's lane socket
  void* lane_monitor = nullptr;
  bool lane_up = false;
  std::unique_ptr<LaneCipher> lane_cipher;
};

// kCurve: the receiving end of a lane. Created by the I/O thread, then used only by the thread
// in Receive, which opens the lane's messages (so sealing, on the I/O thread, and opening run
// in parallel).
struct LaneRx {
  explicit LaneRx(const std::string& key) : cipher(key) {}
  LaneCipher cipher;
  int fd = -1;  // the lane connection, once a message opened on it
};

// kCurve: a lane this endpoint opened for a sender (I/O thread only).
struct LaneIn {
  std::string ticket;
  bool ticket_used = false;
  std::shared_ptr<LaneRx> rx;
};

// What the I/O thread hands to Receive: a message or event, or under kCurve a sealed message
// that Receive opens (its lane, the connection it came on, its parts).
struct Incoming {
  Incoming() = default;
  explicit Incoming(Received received) : r(std::move(received)) {}
  Received r;
  std::shared_ptr<LaneRx> lane;
  int fd = -1;
  std::vector<std::shared_ptr<MsgHolder>> sealed;
};

class ZmqTransport final : public Transport {
 public:
  explicit ZmqTransport(const TransportOptions& options) : options_(options) {}
  ~ZmqTransport() override {
    Close();
    if (wake_fd_ >= 0) close(wake_fd_);  // only now: a racing Send may still Wake()
  }

  Status Start();

  const PeerId& name() const override { return options_.name; }
  std::string address() const override { return address_; }
  using Transport::Connect;
  Status Connect(const PeerId& peer, const std::string& address, const PeerId& key_owner) override;
  void Disconnect(const PeerId& peer) override;
  Status Send(const PeerId& peer, Message msg) override;
  StatusOr<Received> Receive(std::chrono::milliseconds timeout) override;
  void Close() override;
  TransportStats stats() const override;

 private:
  std::string Prefix() const {
    return fmt::format("endpoint '{}' ({}): ", options_.name,
                       address_.empty() ? options_.listen_address : address_);
  }
  Status OpenMonitor(void* socket, int events, void** monitor);
  // What every listening ROUTER (the main one, the lane one) and every sending DEALER (to a
  // peer, to its lane) share: bounds, limits, timeouts, and the ROUTER's monitor.
  Status SetListenerOptions(void* router, int64_t max_part, const std::string& address,
                            void** monitor);
  void SetSenderOptions(void* dealer, const std::string& address);
  void Wake();

  // I/O thread.
  void IoLoop();
  void ApplyCommands(std::deque<Command>* commands);
  void CloseIoPeer(IoPeer* p);
  void CollectOutboxes();
  void FlushPending(const PeerId& name, IoPeer* p);
  int SendMessage(void* dealer, const Message& m);
  // A sealed message: its parts as they are (no envelope).
  int SendParts(void* socket, const std::vector<Buffer>& parts);
  bool InboxHasRoom();
  // Reads the main ROUTER (lane == false) or, under kCurve, the lane ROUTER.
  void ReadRouter(bool lane);
  // kCurve: a sender asked for a lane (lane.h step 2): opens it and answers with the offer.
  void IssueLane(const PeerId& from, const std::string& routing_id, uint64_t request);
  // kCurve, lane socket: the sender a lane connection was admitted for, or "" (counted).
  PeerId LaneSenderOf(zmq_msg_t* first_part);
  // Receive's thread: opens a sealed message in place into in->r; an error (counted, logged)
  // when it is refused or is not a sealed bitpush message.
  Status OpenIncoming(Incoming* in);
  // kCurve: the peer's answers on its CURVE connection (offers).
  void ReadDealer(const PeerId& name, IoPeer* p);
  void RequestLane(const PeerId& name, IoPeer* p);
  void OpenLane(const PeerId& name, IoPeer* p, const LaneOffer& offer);
  void CloseLane(IoPeer* p);
  void ReadLaneMonitor(const PeerId& name, IoPeer* p);
  // The peer's connection (kNone: its DEALER; kCurve: its lane) is established / dropped.
  void PeerUp(const PeerId& name, IoPeer* p);
  void PeerDown(const PeerId& name, IoPeer* p);
  // kCurve: the sender of a received message (its key's PeerId), or "" when the message is
  // refused (counted); kNone: the routing id.
  PeerId SenderOf(const PeerId& routing_id, zmq_msg_t* first_part);
  void ReadRouterMonitor(void* monitor, bool lane);
  Status LoadCurveKeys();
  Status BindLaneRouter(const std::string& bind_address);
  void AnswerZap();
  void ReadPeerMonitor(const PeerId& name, IoPeer* p);
  void PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status);

  const TransportOptions options_;
  std::string address_;  // resolved; written by Start only
  void* ctx_ = nullptr;
  void* router_ = nullptr;
  void* router_monitor_ = nullptr;
  void* zap_ = nullptr;  // kCurve: the ZAP handler (REP), owned by the I/O thread once started
  // kCurve: the lane ROUTER (PLAIN, admitted by ticket; lane.h) and its resolved address.
  void* lane_router_ = nullptr;
  void* lane_router_monitor_ = nullptr;
  std::string lane_address_;
  int wake_fd_ = -1;
  const bool curve_ = options_.security.mode == TransportSecurity::Mode::kCurve;
  // kCurve: 32-byte public key -> the PeerId it is bound to; this endpoint's keys (binary).
  std::map<std::string, PeerId> key_names_;
  std::string public_key_, secret_key_;
  std::thread io_thread_;
  std::atomic<uint64_t> monitor_seq_{0};
  std::mutex close_mu_;  // serialises Close
  // Connect calls between their closed_ check and handing their sockets over; Close waits
  // for them before terminating the context they use.
  size_t connects_in_flight_ = 0;
  std::condition_variable connects_done_;

  // Callers <-> I/O thread.
  std::mutex mu_;
  std::condition_variable space_;  // an outbox shrank, or a peer changed state, or closed
  size_t blocked_senders_ = 0;
  bool closed_ = false;
  bool outbox_dirty_ = false;  // an outbox grew since the I/O thread last looked
  std::map<PeerId, std::shared_ptr<PeerShared>> peers_;
  std::deque<Command> commands_;

  // I/O thread -> Receive.
  std::mutex in_mu_;
  std::condition_variable in_cv_;
  std::deque<Incoming> inbox_;
  size_t inbox_messages_ = 0;   // messages (not events) in inbox_
  bool reader_paused_ = false;  // the I/O thread stopped reading: inbox_ full
  bool in_closed_ = false;

  // I/O thread only.
  std::map<PeerId, IoPeer> io_peers_;
  std::map<PeerId, LaneIn> lanes_in_;  // kCurve: by the sender they were opened for
  // kCurve: the connection (file descriptor) each authenticated PeerId speaks through, and
  // connections a newer one of the same PeerId took over (their messages are refused).
  std::map<PeerId, int> bound_fd_;
  std::set<int> superseded_fds_;
  size_t open_connections_ = 0;  // accepted, not yet disconnected
  LogLimiter log_limiter_;
  LogLimiter receive_log_limiter_;  // Receive's thread (OpenIncoming)

  std::atomic<uint64_t> messages_sent_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> messages_received_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> malformed_dropped_{0};
  std::atomic<uint64_t> auth_refused_{0};
  std::atomic<uint64_t> identity_refused_{0};
  std::atomic<uint64_t> connections_refused_{0};
};

// Refuses an ipc:// path that a live process listens on (ZeroMQ would silently unlink it and
// steal the address); a stale socket file is fine.
Status CheckIpcPathFree(const std::string& address) {
  const std::string path = address.substr(6);
  if (path.empty() || path[0] == '@') return Status::Ok();
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Status::Ok();
  sockaddr_un sa{};
  if (path.size() >= sizeof(sa.sun_path)) return Status::Ok();  // ZeroMQ reports it
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Ok();
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  close(fd);
  if (live) return UnavailableError(fmt::format("address {} is in use", address));
  return Status::Ok();
}

// A Z85 key (40 characters) as its 32 bytes; "" when it is not one.
std::string DecodeZ85Key(const std::string& z85) {
  if (z85.size() != 40) return "";
  std::string out(32, '\0');
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(out.data()), z85.c_str()) == nullptr) return "";
  return out;
}

Status ZmqTransport::LoadCurveKeys() {
  const TransportSecurity& sec = options_.security;
  public_key_ = DecodeZ85Key(sec.public_key);
  secret_key_ = DecodeZ85Key(sec.secret_key);
  if (public_key_.empty() || secret_key_.empty()) {
    return InvalidArgumentError(Prefix() +
                                "security mode curve needs this endpoint's public and secret "
                                "keys as Z85 text of 40 characters");
  }
  char derived[41];
  if (zmq_curve_public(derived, sec.secret_key.c_str()) != 0 || sec.public_key != derived) {
    return InvalidArgumentError(Prefix() + "the secret key does not belong to the public key");
  }
  for (const auto& [peer, z85] : sec.peer_keys) {
    const std::string key = DecodeZ85Key(z85);
    if (key.empty()) {
      return InvalidArgumentError(
          Prefix() + fmt::format("the public key of '{}' is not Z85 text of 40 characters", peer));
    }
    auto [it, fresh] = key_names_.emplace(key, peer);
    if (!fresh) {
      return InvalidArgumentError(Prefix() + fmt::format("'{}' and '{}' have the same public key; "
                                                         "each node needs its own",
                                                         it->second, peer));
    }
  }
  return Status::Ok();
}

Status ZmqTransport::Start() {
  const std::string& listen = options_.listen_address;
  if (!HasScheme(listen)) {
    return InvalidArgumentError(Prefix() + fmt::format("listen address '{}' is not tcp://HOST:PORT "
                                                       "or ipc://PATH",
                                                       listen));
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return InternalError(Prefix() + "eventfd: " + std::strerror(errno));
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

// The lane socket listens next to the main one: the same interface with a port the system
// picks (tcp), or the main path + ".lane" (ipc). Senders learn its address from the offer.
Status ZmqTransport::BindLaneRouter(const std::string& bind_address) {
  std::string lane_bind;
  if (bind_address.rfind("tcp://", 0) == 0) {
    lane_bind = bind_address.substr(0, bind_address.rfind(':')) + ":*";
  } else {
    lane_bind = bind_address + ".lane";
    Status s = CheckIpcPathFree(lane_bind);
    if (!s.ok()) return Status(s.code(), Prefix() + s.message());
  }
  lane_router_ = zmq_socket(ctx_, ZMQ_ROUTER);
  if (!lane_router_) return InternalError(Prefix() + "zmq_socket(ROUTER): " + ZmqError());
  SetInt(lane_router_, ZMQ_LINGER, 0);
  SetInt(lane_router_, ZMQ_ROUTER_HANDOVER, 0);
  SetInt(lane_router_, ZMQ_PLAIN_SERVER, 1);
  zmq_setsockopt(lane_router_, ZMQ_ZAP_DOMAIN, kZapDomain, sizeof(kZapDomain) - 1);
  // Sealed messages come in chunks (lane.h): no part above kLaneChunkBytes, before the
  // handshake or after.
  BP_RETURN_IF_ERROR(
      SetListenerOptions(lane_router_, kLaneChunkBytes, lane_bind, &lane_router_monitor_));
  if (zmq_bind(lane_router_, lane_bind.c_str()) != 0) {
    return UnavailableError(Prefix() + fmt::format("cannot listen on '{}' (the lane socket): {}",
                                                   lane_bind, ZmqError()));
  }
  char resolved[1024];
  size_t resolved_len = sizeof(resolved);
  if (zmq_getsockopt(lane_router_, ZMQ_LAST_ENDPOINT, resolved, &resolved_len) != 0) {
    return InternalError(Prefix() + "ZMQ_LAST_ENDPOINT: " + ZmqError());
  }
  lane_address_ = resolved;
  return Status::Ok();
}

// ZeroMQ binds "tcp://NAME:port" to the network interface called NAME, not to the host NAME:
// a YAML that names its machines (ps0:9000) would fail with "No such device". A tcp address
// whose host is neither an IP literal nor "*" is therefore resolved first (its first IPv4
// address, else its first IPv6 one); one that does not resolve is left to ZeroMQ (an
// interface name).
StatusOr<std::string> BindableAddress(const std::string& listen) {
  if (listen.rfind("tcp://", 0) != 0) return listen;
  const std::string rest = listen.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return listen;
  const std::string host = rest.substr(0, colon);
  if (host.empty() || host == "*" || host[0] == '[') return listen;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return listen;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return listen;
  std::string v4_text, v6_text;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET && v4_text.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
      v4_text = text;
    } else if (a->ai_family == AF_INET6 && v6_text.empty()) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      v6_text = fmt::format("[{}]", text);
    }
  }
  freeaddrinfo(found);
  const std::string& ip = v4_text.empty() ? v6_text : v4_text;
  if (ip.empty()) return listen;
  return "tcp://" + ip + rest.substr(colon);
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

void ZmqTransport::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

Status ZmqTransport::Connect(const PeerId& peer, const std::string& address,
                             const PeerId& key_owner) {
  if (peer.empty()) return InvalidArgumentError(Prefix() + "Connect: empty peer name");
  if (!HasScheme(address)) {
    return InvalidArgumentError(
        Prefix() + fmt::format("Connect to '{}': address '{}' is not tcp://HOST:PORT or "
                               "ipc://PATH",
                               peer, address));
  }
  std::string server_key;
  if (curve_) {
    auto key = options_.security.peer_keys.find(key_owner);
    if (key == options_.security.peer_keys.end()) {
      return InvalidArgumentError(
          Prefix() + fmt::format("Connect to '{}': no public key for '{}' in the cluster's key "
                                 "list (security.public_keys)",
                                 peer, key_owner));
    }
    server_key = DecodeZ85Key(key->second);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + fmt::format("Connect to '{}': closed", peer));
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second->address == address) return Status::Ok();
    ++connects_in_flight_;
  }
  struct InFlight {
    ZmqTransport* t;
    ~InFlight() {
      std::lock_guard<std::mutex> lock(t->mu_);
      if (--t->connects_in_flight_ == 0) t->connects_done_.notify_all();
    }
  } in_flight{this};
  // The sockets are created here, then handed to the I/O thread (the mutex hand-over is the
  // full memory barrier ZeroMQ requires when a socket changes threads).
  void* dealer = zmq_socket(ctx_, ZMQ_DEALER);
  if (!dealer) {
    return UnavailableError(Prefix() + fmt::format("Connect to '{}': {}", peer, ZmqError()));
  }
  if (curve_) {
    // No routing id: the receiver names us by our key, not by what we call ourselves.
    SetInt(dealer, ZMQ_CURVE_SERVER, 0);
    zmq_setsockopt(dealer, ZMQ_CURVE_SERVERKEY, server_key.data(), server_key.size());
    zmq_setsockopt(dealer, ZMQ_CURVE_PUBLICKEY, public_key_.data(), public_key_.size());
    zmq_setsockopt(dealer, ZMQ_CURVE_SECRETKEY, secret_key_.data(), secret_key_.size());
  } else {
    zmq_setsockopt(dealer, ZMQ_ROUTING_ID, options_.name.data(), options_.name.size());
  }
  SetSenderOptions(dealer, address);
  void* monitor = nullptr;
  Status s = OpenMonitor(dealer,
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
                         &monitor);
  if (s.ok() && zmq_connect(dealer, address.c_str()) != 0) {
    s = InvalidArgumentError(Prefix() +
                             fmt::format("Connect to '{}' at '{}': {}", peer, address, ZmqError()));
  }
  if (!s.ok()) {
    if (monitor) zmq_close(monitor);
    SetInt(dealer, ZMQ_LINGER, 0);
    zmq_close(dealer);
    return s;
  }
  std::shared_ptr<PeerShared> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      auto shared = std::make_shared<PeerShared>();
      shared->address = address;
      std::shared_ptr<PeerShared>& slot = peers_[peer];
      old = std::move(slot);
      if (old) old->removed = true;
      slot = shared;
      commands_.push_back({Command::Kind::kAdd, peer, shared, dealer, monitor});
      dealer = monitor = nullptr;
      if (old) space_.notify_all();
    }
  }
  if (dealer) {  // closed meanwhile
    zmq_close(monitor);
    SetInt(dealer, ZMQ_LINGER, 0);
    zmq_close(dealer);
    return CancelledError(Prefix() + fmt::format("Connect to '{}': closed", peer));
  }
  Wake();
  return Status::Ok();
}

void ZmqTransport::Disconnect(const PeerId& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    it->second->removed = true;
    commands_.push_back({Command::Kind::kRemove, peer, it->second});
    peers_.erase(it);
    space_.notify_all();
  }
  Wake();
}

Status ZmqTransport::Send(const PeerId& peer, Message msg) {
  if (Status g = CheckGlue(msg); !g.ok()) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {}", peer, g.message()));
  }
  JoinGlued(&msg);  // frames travel whole here: a glued run becomes one Buffer (a copy)
  const uint64_t bytes = msg.header.size() + msg.payload_bytes();
  if (msg.frames.size() > UINT32_MAX || msg.header.size() > UINT32_MAX) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {} frames, {}-byte header",
                                                       peer, msg.frames.size(), msg.header.size()));
  }
  bool wake = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + fmt::format("send to '{}': closed", peer));
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return NotFoundError(Prefix() +
                           fmt::format("send to unknown peer '{}' (not connected)", peer));
    }
    std::shared_ptr<PeerShared> p = it->second;
    const size_t limit = options_.max_queued_per_peer;
    auto blocked = [&] { return p->outbox.size() + p->io_held >= limit; };
    if (p->state != PeerState::kDisconnected && blocked()) {
      ++blocked_senders_;
      space_.wait_for(lock, options_.send_block_timeout, [&] {
        return closed_ || p->removed || p->state == PeerState::kDisconnected || !blocked();
      });
      --blocked_senders_;
      if (closed_) return CancelledError(Prefix() + fmt::format("send to '{}': closed", peer));
      if (p->removed) {
        return NotFoundError(Prefix() +
                             fmt::format("send to '{}': the peer was disconnected while the send "
                                         "waited",
                                         peer));
      }
      if (p->state != PeerState::kDisconnected && blocked()) {
        return UnavailableError(
            Prefix() + fmt::format("send to '{}' at {}: {} messages queued, none sent for {} ms",
                                   peer, p->address, p->outbox.size() + p->io_held,
                                   options_.send_block_timeout.count()));
      }
    }
    if (p->state == PeerState::kDisconnected) {
      return UnavailableError(Prefix() + fmt::format("send to '{}' at {}: {}", peer, p->address,
                                                     p->last_error.message()));
    }
    p->outbox.push_back(Outgoing{std::move(msg)});
    wake = !outbox_dirty_;
    outbox_dirty_ = true;
  }
  messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  if (wake) Wake();
  return Status::Ok();
}

StatusOr<Received> ZmqTransport::Receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    bool wake = false;
    Incoming in;
    {
      std::unique_lock<std::mutex> lock(in_mu_);
      if (!in_cv_.wait_until(lock, deadline, [&] { return in_closed_ || !inbox_.empty(); })) {
        return TimeoutError(Prefix() + fmt::format("no message within {} ms", timeout.count()));
      }
      if (in_closed_) return CancelledError(Prefix() + "closed");
      in = std::move(inbox_.front());
      inbox_.pop_front();
      if (in.r.is_message()) --inbox_messages_;
      if (reader_paused_ && inbox_messages_ < options_.max_queued_per_peer) {
        reader_paused_ = false;
        wake = true;
      }
    }
    if (wake) Wake();
    if (!in.lane || OpenIncoming(&in).ok()) return std::move(in.r);
    // Refused: the next one, within the same time.
  }
}

void ZmqTransport::Close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    space_.notify_all();
    connects_done_.wait(lock, [&] { return connects_in_flight_ == 0; });
  }
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    in_closed_ = true;
    in_cv_.notify_all();
  }
  if (io_thread_.joinable()) {
    Wake();
    io_thread_.join();
  } else {  // Start failed part-way: close what it opened
    if (router_monitor_) zmq_close(router_monitor_);
    if (router_) zmq_close(router_);
    if (lane_router_monitor_) zmq_close(lane_router_monitor_);
    if (lane_router_) zmq_close(lane_router_);
    if (zap_) zmq_close(zap_);
  }
  router_ = router_monitor_ = lane_router_ = lane_router_monitor_ = zap_ = nullptr;
  if (ctx_) zmq_ctx_term(ctx_);  // waits at most kCloseLingerMs for messages to flush
  ctx_ = nullptr;
  std::deque<Incoming> dropped;
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    dropped.swap(inbox_);
  }
  std::map<PeerId, std::shared_ptr<PeerShared>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers.swap(peers_);
    commands_.clear();
  }
}

TransportStats ZmqTransport::stats() const {
  TransportStats s;
  s.messages_sent = messages_sent_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.messages_received = messages_received_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  s.malformed_dropped = malformed_dropped_.load(std::memory_order_relaxed);
  s.auth_refused = auth_refused_.load(std::memory_order_relaxed);
  s.identity_refused = identity_refused_.load(std::memory_order_relaxed);
  s.connections_refused = connections_refused_.load(std::memory_order_relaxed);
  return s;
}

// ---- I/O thread ----------------------------------------------------------------------------

void ZmqTransport::IoLoop() {
  std::vector<zmq_pollitem_t> items;
  // For each peer: the index of its first item (monitor, dealer, then under kCurve the lane's
  // monitor and the lane).
  struct ItemPeer {
    const PeerId* name;
    IoPeer* peer;
    size_t first;
  };
  std::vector<ItemPeer> item_peers;
  while (true) {
    std::deque<Command> commands;
    bool closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
      closing = closed_;
      outbox_dirty_ = false;
    }
    ApplyCommands(&commands);
    CollectOutboxes();
    for (auto& [name, p] : io_peers_) {
      if (!p.pending.empty()) FlushPending(name, &p);
    }
    if (closing) break;

    items.clear();
    item_peers.clear();
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    items.push_back({router_, 0, static_cast<short>(InboxHasRoom() ? ZMQ_POLLIN : 0), 0});
    items.push_back({router_monitor_, 0, ZMQ_POLLIN, 0});
    items.push_back({zap_, -1, static_cast<short>(zap_ ? ZMQ_POLLIN : 0), 0});
    const bool lane_room = curve_ && items[1].events != 0;
    items.push_back({lane_router_, -1, static_cast<short>(lane_room ? ZMQ_POLLIN : 0), 0});
    items.push_back(
        {lane_router_monitor_, -1, static_cast<short>(lane_router_monitor_ ? ZMQ_POLLIN : 0), 0});
    for (auto& [name, p] : io_peers_) {
      item_peers.push_back({&name, &p, items.size()});
      const bool waiting = !p.pending.empty();
      if (!curve_) {
        items.push_back({p.monitor, 0, ZMQ_POLLIN, 0});
        items.push_back({p.dealer, 0, static_cast<short>(waiting ? ZMQ_POLLOUT : 0), 0});
        continue;
      }
      // kCurve: the dealer is read (the offer); the lane is written.
      items.push_back({p.monitor, 0, ZMQ_POLLIN, 0});
      items.push_back({p.dealer, 0, ZMQ_POLLIN, 0});
      items.push_back({p.lane_monitor, -1, static_cast<short>(p.lane_monitor ? ZMQ_POLLIN : 0), 0});
      items.push_back(
          {p.lane, -1, static_cast<short>(p.lane && p.lane_up && waiting ? ZMQ_POLLOUT : 0), 0});
    }

    if (zmq_poll(items.data(), static_cast<int>(items.size()), -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      BP_LOG_ERROR("{}zmq_poll: {}; the I/O thread stops", Prefix(), ZmqError());
      break;
    }
    if (items[0].revents) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
    if (items[3].revents & ZMQ_POLLIN) AnswerZap();
    if (items[2].revents & ZMQ_POLLIN) ReadRouterMonitor(router_monitor_, false);
    if (items[5].revents & ZMQ_POLLIN) ReadRouterMonitor(lane_router_monitor_, true);
    if (items[1].revents & ZMQ_POLLIN) ReadRouter(false);
    if (items[4].revents & ZMQ_POLLIN) ReadRouter(true);
    for (const ItemPeer& ip : item_peers) {
      if (items[ip.first].revents & ZMQ_POLLIN) ReadPeerMonitor(*ip.name, ip.peer);
      if (!curve_) continue;
      // The dealer or the lane may have been replaced meanwhile: their items then refer to
      // closed sockets, whose revents are not looked at again.
      if ((items[ip.first + 1].revents & ZMQ_POLLIN) &&
          ip.peer->dealer == items[ip.first + 1].socket)
        ReadDealer(*ip.name, ip.peer);
      if ((items[ip.first + 2].revents & ZMQ_POLLIN) && ip.peer->lane_monitor != nullptr &&
          ip.peer->lane_monitor == items[ip.first + 2].socket)
        ReadLaneMonitor(*ip.name, ip.peer);
      // POLLOUT on a dealer or lane: its pending messages go out at the top of the loop.
    }
  }
  for (auto& [name, p] : io_peers_) CloseIoPeer(&p);
  io_peers_.clear();
  lanes_in_.clear();
  zmq_close(router_monitor_);
  zmq_close(router_);
  if (lane_router_) {
    zmq_close(lane_router_monitor_);
    zmq_close(lane_router_);
  }
  if (zap_) zmq_close(zap_);  // after the ROUTERs: no connection is admitted without it
}

void ZmqTransport::ApplyCommands(std::deque<Command>* commands) {
  for (Command& c : *commands) {
    auto it = io_peers_.find(c.peer);
    if (c.kind == Command::Kind::kRemove) {
      if (it != io_peers_.end() && it->second.shared == c.shared) {
        CloseIoPeer(&it->second);
        io_peers_.erase(it);
      }
      continue;
    }
    if (it != io_peers_.end()) {
      CloseIoPeer(&it->second);
      io_peers_.erase(it);
    }
    IoPeer& p = io_peers_[c.peer];
    p.shared = std::move(c.shared);
    p.dealer = c.dealer;
    p.monitor = c.monitor;
  }
  commands->clear();
}

void ZmqTransport::CloseIoPeer(IoPeer* p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    p->shared->io_held = 0;
  }
  p->pending.clear();
  CloseLane(p);
  zmq_close(p->monitor);
  zmq_close(p->dealer);  // lingers (in ZeroMQ's threads) up to kCloseLingerMs
  p->monitor = p->dealer = nullptr;
}

void ZmqTransport::CloseLane(IoPeer* p) {
  if (p->lane_monitor) zmq_close(p->lane_monitor);
  if (p->lane) zmq_close(p->lane);  // lingers like the dealer
  p->lane = p->lane_monitor = nullptr;
  p->lane_up = false;
  p->lane_cipher.reset();
}

void ZmqTransport::RequestLane(const PeerId& name, IoPeer* p) {
  if (p->lane_requested || !p->control_up) return;
  const std::string request = EncodeLaneRequest(p->lane_request + 1);
  if (zmq_send(p->dealer, request.data(), request.size(), ZMQ_DONTWAIT) < 0) {
    BP_LOG_DEBUG("{}asking '{}' for a lane: {}; asking again when the connection is back", Prefix(),
                 name, ZmqError());
    return;
  }
  ++p->lane_request;
  p->lane_requested = true;
}

void ZmqTransport::ReadDealer(const PeerId& name, IoPeer* p) {
  while (true) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, p->dealer, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      return;
    }
    const bool single = !zmq_msg_more(&m);
    StatusOr<LaneOffer> offer =
        ParseLaneOffer(static_cast<const uint8_t*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    zmq_msg_close(&m);
    if (!single) {  // drain the rest: not from a bitpush node
      int more = 1;
      size_t more_size = sizeof(more);
      while (more && zmq_getsockopt(p->dealer, ZMQ_RCVMORE, &more, &more_size) == 0 && more) {
        zmq_msg_init(&m);
        const int got = zmq_msg_recv(&m, p->dealer, ZMQ_DONTWAIT);
        zmq_msg_close(&m);
        if (got < 0) break;
      }
    }
    if (single && offer.ok() && offer->request != p->lane_request) continue;  // superseded
    if (!single || !offer.ok() || !p->lane_requested) {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped an unexpected message from '{}' on its CURVE connection", Prefix(),
                   name);
      continue;
    }
    OpenLane(name, p, *offer);
  }
}

void ZmqTransport::OpenLane(const PeerId& name, IoPeer* p, const LaneOffer& offer) {
  p->lane_requested = false;
  CloseLane(p);
  StatusOr<std::string> address = LaneAddressFor(p->shared->address, offer.address);
  if (!address.ok()) {
    BP_LOG_WARN("{}'{}' offered a lane this node cannot reach: {}", Prefix(), name,
                address.status().message());
    return;
  }
  void* lane = zmq_socket(ctx_, ZMQ_DEALER);
  if (!lane) {
    BP_LOG_WARN("{}a lane to '{}': zmq_socket(DEALER): {}", Prefix(), name, ZmqError());
    return;
  }
  const std::string password = TicketPassword(offer.ticket);
  zmq_setsockopt(lane, ZMQ_PLAIN_USERNAME, options_.name.data(), options_.name.size());
  zmq_setsockopt(lane, ZMQ_PLAIN_PASSWORD, password.data(), password.size());
  SetSenderOptions(lane, *address);
  void* monitor = nullptr;
  Status s = OpenMonitor(lane,
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                         &monitor);
  if (s.ok() && zmq_connect(lane, address->c_str()) != 0) {
    s = UnavailableError(fmt::format("connect to '{}': {}", *address, ZmqError()));
  }
  if (!s.ok()) {
    if (monitor) zmq_close(monitor);
    SetInt(lane, ZMQ_LINGER, 0);
    zmq_close(lane);
    BP_LOG_WARN("{}a lane to '{}': {}", Prefix(), name, s.message());
    return;
  }
  p->lane = lane;
  p->lane_monitor = monitor;
  p->lane_cipher = std::make_unique<LaneCipher>(offer.key);
}

void ZmqTransport::ReadLaneMonitor(const PeerId& name, IoPeer* p) {
  uint16_t event;
  std::string endpoint;
  while (p->lane_monitor != nullptr && ReadMonitorEvent(p->lane_monitor, &event, &endpoint)) {
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      p->lane_up = true;
      PeerUp(name, p);
      continue;
    }
    // The lane is gone (dropped, or its ticket refused): its ticket is spent, so ZeroMQ must
    // not reconnect with it. Messages already handed to it are lost (PeerDown says so), and a
    // new lane is asked for over the CURVE connection.
    if (event != ZMQ_EVENT_DISCONNECTED) {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow("lane:" + name, &suppressed)) {
        BP_LOG_WARN(
            "{}'{}' refused this node's lane connection at {} (event {:#x}); asking for "
            "a new lane{}",
            Prefix(), name, endpoint, event,
            suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
      }
    }
    const bool was_up = p->lane_up;
    CloseLane(p);
    if (was_up) PeerDown(name, p);
    RequestLane(name, p);
    return;
  }
}

void ZmqTransport::PeerUp(const PeerId& name, IoPeer* p) {
  bool reconnected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reconnected = p->shared->state == PeerState::kDisconnected;
    p->shared->state = PeerState::kConnected;
    p->shared->last_error = Status::Ok();
  }
  if (reconnected) PushEvent(name, TransportEvent::Kind::kPeerConnected, Status::Ok());
}

void ZmqTransport::PeerDown(const PeerId& name, IoPeer* p) {
  std::deque<Outgoing> dropped;
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A connection that never completed the handshake is still "connecting".
    if (p->shared->state != PeerState::kConnected) return;
    dropped.swap(p->shared->outbox);
    const size_t n = dropped.size() + p->pending.size();
    why = UnavailableError(
        fmt::format("peer '{}' at {} disconnected{}", name, p->shared->address,
                    n ? fmt::format(" ({} queued messages dropped)", n) : std::string()));
    p->shared->state = PeerState::kDisconnected;
    p->shared->last_error = why;
    p->shared->io_held = 0;
    space_.notify_all();
  }
  p->pending.clear();
  dropped.clear();
  PushEvent(name, TransportEvent::Kind::kPeerDisconnected, why);
}

void ZmqTransport::CollectOutboxes() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, p] : io_peers_) {
    std::deque<Outgoing>& outbox = p.shared->outbox;
    if (outbox.empty()) continue;
    p.shared->io_held += outbox.size();
    if (p.pending.empty()) {
      p.pending.swap(outbox);
    } else {
      for (Outgoing& o : outbox) p.pending.push_back(std::move(o));
      outbox.clear();
    }
  }
}

void ZmqTransport::FlushPending(const PeerId& name, IoPeer* p) {
  // kCurve: messages wait for the lane.
  void* socket = curve_ ? (p->lane_up ? p->lane : nullptr) : p->dealer;
  if (socket == nullptr) return;
  int events = 0;
  size_t events_size = sizeof(events);
  if (zmq_getsockopt(socket, ZMQ_EVENTS, &events, &events_size) == 0 && !(events & ZMQ_POLLOUT)) {
    return;  // not connected or at the high-water mark: poll for POLLOUT
  }
  size_t handed = 0;
  while (!p->pending.empty()) {
    Outgoing& o = p->pending.front();
    int err;
    if (!curve_) {
      err = SendMessage(p->dealer, o.msg);
    } else {
      // Sealed here, once: a message ZeroMQ did not take (EAGAIN) stays sealed for the retry.
      // One sealed for a lane that is gone cannot be opened on this one (a lane is replaced
      // only after its peer was reported disconnected, which dropped what was queued).
      err = 0;
      if (o.sealed_with == nullptr) {
        Status sealed = SealMessage(p->lane_cipher.get(), &o.msg);
        if (sealed.ok()) {
          o.sealed_with = p->lane_cipher.get();
        } else {
          BP_LOG_ERROR("{}send to '{}': {}", Prefix(), name, sealed.message());
          err = EPROTO;
        }
      }
      if (o.sealed_with == p->lane_cipher.get()) err = SendParts(p->lane, o.msg.frames);
    }
    if (err == EAGAIN) break;  // not connected or at the high-water mark: wait for POLLOUT
    if (err != 0) {
      PushEvent(name, TransportEvent::Kind::kSendFailed,
                UnavailableError(Prefix() + fmt::format("send to '{}' at {} failed: {}", name,
                                                        p->shared->address, zmq_strerror(err))));
    }
    p->pending.pop_front();
    ++handed;
  }
  if (handed == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  p->shared->io_held -= handed;
  if (blocked_senders_ > 0) space_.notify_all();
}

// 0 when sent, EAGAIN when ZeroMQ took nothing (retry later), another errno when the message
// was lost part-way.
int ZmqTransport::SendMessage(void* dealer, const Message& m) {
  const size_t n = m.frames.size();
  zmq_msg_t part;
  zmq_msg_init_size(&part, kEnvelopeFixedBytes + m.header.size());
  EncodeEnvelope(m.header, static_cast<uint32_t>(n), static_cast<uint8_t*>(zmq_msg_data(&part)));
  if (zmq_msg_send(&part, dealer, ZMQ_DONTWAIT | (n ? ZMQ_SNDMORE : 0)) < 0) {
    const int err = zmq_errno();
    zmq_msg_close(&part);
    return err;
  }
  return SendFrames(dealer, m.frames, /*first_taken=*/true);
}

int ZmqTransport::SendParts(void* socket, const std::vector<Buffer>& parts) {
  return SendFrames(socket, parts, /*first_taken=*/false);
}

int SendFrames(void* socket, const std::vector<Buffer>& frames, bool first_taken) {
  // Once the first part is accepted the rest are too, unless the connection died meanwhile;
  // then every remaining part must still be offered so that ZeroMQ drops the whole message.
  int first_error = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const Buffer& f = frames[i];
    zmq_msg_t part;
    if (f.empty()) {
      zmq_msg_init(&part);
    } else if (f.size() < kCopyBelowBytes) {
      zmq_msg_init_size(&part, f.size());
      std::memcpy(zmq_msg_data(&part), f.data(), f.size());
    } else {
      auto* owner = new Buffer(f);
      HandOver(owner);
      zmq_msg_init_data(&part, const_cast<uint8_t*>(f.data()), f.size(), ReleaseBuffer, owner);
    }
    if (zmq_msg_send(&part, socket, ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0)) < 0) {
      const int err = zmq_errno();
      zmq_msg_close(&part);
      if (i == 0 && !first_taken) return err;  // nothing taken (EAGAIN: retry later)
      if (!first_error) first_error = err;
    }
  }
  return first_error == EAGAIN ? EPIPE : first_error;
}

bool ZmqTransport::InboxHasRoom() {
  std::lock_guard<std::mutex> lock(in_mu_);
  reader_paused_ = inbox_messages_ >= options_.max_queued_per_peer;
  return !reader_paused_;
}

// Whether a message received by the ROUTER is bitpush traffic (see framing.h).
Status CheckMessage(const PeerId& from, std::deque<zmq_msg_t>& parts, const uint8_t** header,
                    size_t* header_bytes) {
  // ZeroMQ names peers that set no routing id "\0" + 4 bytes: not a bitpush endpoint.
  if (from.empty() || from[0] == '\0') {
    return DataLossError("the sender has no name (no ZMQ_ROUTING_ID)");
  }
  if (parts.empty()) return DataLossError("no envelope");
  return ParseEnvelope(static_cast<const uint8_t*>(zmq_msg_data(&parts[0])),
                       zmq_msg_size(&parts[0]), parts.size() - 1, header, header_bytes);
}

void ZmqTransport::ReadRouter(bool lane) {
  void* const socket = lane ? lane_router_ : router_;
  size_t room;
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    room = options_.max_queued_per_peer > inbox_messages_
               ? options_.max_queued_per_peer - inbox_messages_
               : 0;
  }
  std::vector<Incoming> batch;
  std::deque<zmq_msg_t> parts;  // a deque: zmq_msg_t must not be moved by memcpy
  while (batch.size() < room && batch.size() < static_cast<size_t>(kReceiveBatch)) {
    zmq_msg_t id;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, socket, ZMQ_DONTWAIT) < 0) {
      const int err = zmq_errno();
      zmq_msg_close(&id);
      if (err != EAGAIN) BP_LOG_WARN("{}receive: {}", Prefix(), zmq_strerror(err));
      break;
    }
    const PeerId routing_id(static_cast<const char*>(zmq_msg_data(&id)), zmq_msg_size(&id));
    bool more = zmq_msg_more(&id);
    zmq_msg_close(&id);
    while (more) {
      parts.emplace_back();
      zmq_msg_init(&parts.back());
      if (zmq_msg_recv(&parts.back(), socket, ZMQ_DONTWAIT) < 0) break;  // not for a ROUTER
      more = zmq_msg_more(&parts.back());
    }
    PeerId from = parts.empty() ? routing_id
                  : lane        ? LaneSenderOf(&parts[0])
                                : SenderOf(routing_id, &parts[0]);
    const uint8_t* header = nullptr;
    size_t header_bytes = 0;
    // Under kCurve the main socket carries lane requests, the lane socket sealed messages:
    // Receive opens those (OpenIncoming).
    Status parsed = Status::Ok();
    bool handled = from.empty() && curve_;  // refused and counted by (Lane)SenderOf
    if (!handled && curve_ && !lane && !parts.empty() &&
        zmq_msg_size(&parts[0]) == kLaneRequestBytes) {
      StatusOr<uint64_t> request = ParseLaneRequest(
          static_cast<const uint8_t*>(zmq_msg_data(&parts[0])), zmq_msg_size(&parts[0]));
      if (request.ok() && parts.size() == 1) {
        IssueLane(from, routing_id, *request);
        handled = true;
      }
    }
    if (!handled && lane) {
      Incoming in;
      in.r.from = from;
      in.lane = lanes_in_.at(in.r.from).rx;
      in.fd = zmq_msg_get(&parts[0], ZMQ_SRCFD);
      in.sealed.reserve(parts.size());
      for (zmq_msg_t& part : parts) {
        in.sealed.push_back(std::make_shared<MsgHolder>());
        zmq_msg_move(&in.sealed.back()->msg, &part);
      }
      batch.push_back(std::move(in));
      handled = true;
    } else if (!handled) {
      parsed = CheckMessage(from, parts, &header, &header_bytes);
    }
    if (handled) {
      // Nothing to deliver.
    } else if (!parsed.ok()) {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped a malformed message from '{}': {}", Prefix(), from, parsed.message());
    } else {
      Message m;
      m.header.assign(reinterpret_cast<const char*>(header), header_bytes);
      m.frames.reserve(parts.size() - 1);
      uint64_t bytes = header_bytes;
      for (size_t i = 1; i < parts.size(); ++i) {
        const size_t size = zmq_msg_size(&parts[i]);
        bytes += size;
        if (size == 0) {
          m.frames.emplace_back();
        } else if (size < kCopyBelowBytes) {
          m.frames.push_back(Buffer::Copy(zmq_msg_data(&parts[i]), size));
        } else {
          auto holder = std::make_shared<MsgHolder>();
          zmq_msg_move(&holder->msg, &parts[i]);
          const void* data = zmq_msg_data(&holder->msg);
          m.frames.push_back(Buffer::Borrow(data, size, std::move(holder)));
        }
      }
      messages_received_.fetch_add(1, std::memory_order_relaxed);
      bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
      batch.push_back(Incoming{Received{std::move(from), std::move(m)}});
    }
    for (zmq_msg_t& p : parts) zmq_msg_close(&p);
    parts.clear();
  }
  if (batch.empty()) return;
  std::lock_guard<std::mutex> lock(in_mu_);
  for (Incoming& in : batch) inbox_.push_back(std::move(in));
  inbox_messages_ += batch.size();
  in_cv_.notify_one();
}

PeerId ZmqTransport::SenderOf(const PeerId& routing_id, zmq_msg_t* first_part) {
  if (!curve_) return routing_id;
  const char* user = zmq_msg_gets(first_part, "User-Id");
  if (user == nullptr || *user == '\0') {  // cannot happen behind our ZAP handler
    auth_refused_.fetch_add(1, std::memory_order_relaxed);
    return "";
  }
  PeerId id(user);
  const int fd = zmq_msg_get(first_part, ZMQ_SRCFD);
  auto bound = bound_fd_.find(id);
  if (bound != bound_fd_.end() && bound->second == fd) return id;
  if (superseded_fds_.count(fd) != 0) {
    // File descriptors are reused: a waiting disconnect may free this one.
    ReadRouterMonitor(router_monitor_, false);
  }
  if (superseded_fds_.count(fd) != 0) {
    identity_refused_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("identity:" + id, &suppressed)) {
      BP_LOG_WARN(
          "{}refused a message from an older connection of '{}': a newer connection "
          "authenticated with the same key took over{}",
          Prefix(), id,
          suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    return "";
  }
  bound = bound_fd_.find(id);
  if (bound != bound_fd_.end() && bound->second >= 0) {
    superseded_fds_.insert(bound->second);
    BP_LOG_INFO(
        "{}'{}' speaks through a new connection, authenticated with the same key; its "
        "older connection is no longer heard",
        Prefix(), id);
  }
  bound_fd_[id] = fd;
  return id;
}

void ZmqTransport::IssueLane(const PeerId& from, const std::string& routing_id, uint64_t request) {
  StatusOr<std::string> key = RandomBytes(kLaneKeyBytes);
  StatusOr<std::string> ticket = RandomBytes(kLaneTicketBytes);
  if (!key.ok() || !ticket.ok()) {
    BP_LOG_ERROR("{}no lane for '{}': {}", Prefix(), from,
                 (key.ok() ? ticket.status() : key.status()).message());
    return;
  }
  LaneIn& in = lanes_in_[from];  // replaces an earlier lane of the same sender
  in.ticket = *ticket;
  in.ticket_used = false;
  in.rx = std::make_shared<LaneRx>(*key);
  LaneOffer offer;
  offer.request = request;
  offer.key = *key;
  offer.ticket = *ticket;
  offer.address = lane_address_;
  const std::string text = EncodeLaneOffer(offer);
  // Unroutable (the connection went meanwhile): ZeroMQ drops it, and the sender asks again.
  if (zmq_send(router_, routing_id.data(), routing_id.size(), ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0 ||
      zmq_send(router_, text.data(), text.size(), ZMQ_DONTWAIT) < 0) {
    BP_LOG_DEBUG("{}the lane offer to '{}' was not sent: {}", Prefix(), from, ZmqError());
  }
}

PeerId ZmqTransport::LaneSenderOf(zmq_msg_t* first_part) {
  const char* user = zmq_msg_gets(first_part, "User-Id");
  if (user == nullptr || lanes_in_.count(user) == 0) {  // cannot happen behind our ZAP handler
    auth_refused_.fetch_add(1, std::memory_order_relaxed);
    return "";
  }
  return user;
}

Status ZmqTransport::OpenIncoming(Incoming* in) {
  LaneRx& rx = *in->lane;
  const PeerId& from = in->r.from;
  std::vector<ByteSpan> wire(in->sealed.size());
  for (size_t i = 0; i < in->sealed.size(); ++i) {
    wire[i] = ByteSpan(static_cast<const uint8_t*>(zmq_msg_data(&in->sealed[i]->msg)),
                       zmq_msg_size(&in->sealed[i]->msg));
  }
  StatusOr<std::vector<Buffer>> opened = rx.cipher.Open(wire);
  in->sealed.clear();  // the plain parts are new buffers
  Status s = opened.status();
  const uint8_t* header = nullptr;
  size_t header_bytes = 0;
  if (s.ok()) {
    if (rx.fd < 0) rx.fd = in->fd;
    s = ParseEnvelope((*opened)[0].data(), (*opened)[0].size(), opened->size() - 1, &header,
                      &header_bytes);
    if (!s.ok()) s = DataLossError(s.message());
  }
  if (!s.ok()) {
    std::string what, reason;
    if (s.code() == StatusCode::kFailedPrecondition && rx.fd >= 0 && in->fd != rx.fd) {
      // The lane connection of an earlier lane of the same sender: a newer one took over.
      identity_refused_.fetch_add(1, std::memory_order_relaxed);
      reason = "identity:" + from;
      what = fmt::format(
          "refused a message from an older lane connection of '{}': a newer connection "
          "authenticated with the same key took over",
          from);
    } else if (s.code() == StatusCode::kFailedPrecondition) {
      auth_refused_.fetch_add(1, std::memory_order_relaxed);
      reason = "sealed:" + from;
      what = fmt::format("refused a message on the lane of '{}': {}", from, s.message());
    } else {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped a malformed message from '{}': {}", Prefix(), from, s.message());
      return s;
    }
    uint64_t suppressed = 0;
    if (receive_log_limiter_.Allow(reason, &suppressed)) {
      BP_LOG_WARN("{}{}{}", Prefix(), what,
                  suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    return s;
  }
  Message m;
  m.header.assign(reinterpret_cast<const char*>(header), header_bytes);
  m.frames.assign(std::make_move_iterator(opened->begin() + 1),
                  std::make_move_iterator(opened->end()));
  const uint64_t bytes = header_bytes + m.payload_bytes();
  messages_received_.fetch_add(1, std::memory_order_relaxed);
  bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
  in->r.body = std::move(m);
  return Status::Ok();
}

void ZmqTransport::AnswerZap() {
  while (true) {
    std::vector<std::string> frames;
    bool more = true;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        if (frames.empty()) return;
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    // RFC 27: version, request id, domain, address, routing id, mechanism, credentials.
    const std::string version = frames.size() > 0 ? frames[0] : "1.0";
    const std::string request_id = frames.size() > 1 ? frames[1] : "";
    const std::string address = frames.size() > 3 ? frames[3] : "?";
    std::string status = "400", text, user;
    if (frames.size() >= 8 && frames[5] == "PLAIN") {
      // A lane connection (lane.h step 3): a ticket issued and not used yet. It names the
      // sender (the PLAIN user name is only what the sender calls itself).
      auto it = lanes_in_.begin();
      for (; it != lanes_in_.end(); ++it) {
        const std::string expected = TicketPassword(it->second.ticket);
        if (!it->second.ticket_used && frames[7].size() == expected.size() &&
            CRYPTO_memcmp(frames[7].data(), expected.data(), expected.size()) == 0) {
          break;
        }
      }
      if (it != lanes_in_.end()) {
        it->second.ticket_used = true;
        status = "200";
        text = "OK";
        user = it->first;
      } else {
        text = "a lane connection without a valid ticket";
      }
    } else if (frames.size() >= 7 && frames[5] == "CURVE" && frames[6].size() == 32) {
      auto it = key_names_.find(frames[6]);
      if (it != key_names_.end()) {
        status = "200";
        text = "OK";
        user = it->second;
      } else {
        char z85[41] = {};
        zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(frames[6].data()), 32);
        text = fmt::format("public key {} is not in the cluster's key list", z85);
      }
    } else {
      text = "not a CURVE request";
    }
    if (status != "200") {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow("address:" + address, &suppressed)) {
        BP_LOG_WARN("{}refused a connection from {}: {}{}", Prefix(), address, text,
                    suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
      }
    }
    const std::string reply[] = {version, request_id, status, text, user, ""};
    for (size_t i = 0; i < 6; ++i) {
      zmq_send(zap_, reply[i].data(), reply[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
    }
  }
}

// A monitor event: a 6-byte part (u16 event, u32 value) and a part with the endpoint address.
bool ReadMonitorEvent(void* monitor, uint16_t* event, std::string* endpoint, uint32_t* value) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, monitor, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  *event = 0;
  if (zmq_msg_size(&m) >= 2) std::memcpy(event, zmq_msg_data(&m), sizeof(*event));
  if (value != nullptr) {
    *value = 0;
    if (zmq_msg_size(&m) >= 6)
      std::memcpy(value, static_cast<const char*>(zmq_msg_data(&m)) + 2, 4);
  }
  bool more = zmq_msg_more(&m);
  endpoint->clear();
  while (more) {
    zmq_msg_close(&m);
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, monitor, ZMQ_DONTWAIT) < 0) break;
    endpoint->assign(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    more = zmq_msg_more(&m);
  }
  zmq_msg_close(&m);
  return true;
}

void ZmqTransport::ReadRouterMonitor(void* monitor, bool lane) {
  uint16_t event;
  uint32_t value;
  std::string endpoint;
  while (ReadMonitorEvent(monitor, &event, &endpoint, &value)) {
    const int fd = static_cast<int>(value);
    if (event == ZMQ_EVENT_ACCEPTED) {
      if (++open_connections_ > options_.max_connections) {
        // Shut, not closed: ZeroMQ owns the descriptor and cleans up when it reads the end.
        shutdown(fd, SHUT_RDWR);
        connections_refused_.fetch_add(1, std::memory_order_relaxed);
        uint64_t suppressed = 0;
        if (log_limiter_.Allow("connections", &suppressed)) {
          BP_LOG_WARN(
              "{}refused a connection: {} are open, the limit is {}{}", Prefix(),
              open_connections_ - 1, options_.max_connections,
              suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
        }
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      if (open_connections_ > 0) --open_connections_;
      superseded_fds_.erase(fd);
      for (auto it = bound_fd_.begin(); it != bound_fd_.end();) {
        it = it->second == fd ? bound_fd_.erase(it) : std::next(it);
      }
    } else if (curve_ &&
               (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH))) {
      // Under CURVE every failed handshake is a peer that did not authenticate: an unknown key
      // (logged by AnswerZap), a peer that does not speak CURVE (whichever side notices the
      // mismatch first, the other sees the connection end), or bytes that are not ZMTP.
      auth_refused_.fetch_add(1, std::memory_order_relaxed);
      if (event != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && !lane) {
        uint64_t suppressed = 0;
        if (log_limiter_.Allow("mechanism", &suppressed)) {
          BP_LOG_WARN(
              "{}refused a connection that does not speak CURVE (security.mode none on "
              "the other side, or not a bitpush node){}",
              Prefix(),
              suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
        }
      }
    } else if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) {
      malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
      BP_LOG_DEBUG("{}dropped a connection that failed the ZMTP handshake (event {:#x})", Prefix(),
                   event);
    }
  }
}

void ZmqTransport::ReadPeerMonitor(const PeerId& name, IoPeer* p) {
  uint16_t event;
  std::string endpoint;
  while (ReadMonitorEvent(p->monitor, &event, &endpoint)) {
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      if (!curve_) {
        PeerUp(name, p);
      } else {
        // The peer's state follows its lane; a (re)connected CURVE connection asks for one
        // unless a lane is open or being opened.
        p->control_up = true;
        p->lane_requested = false;
        if (p->lane == nullptr) RequestLane(name, p);
      }
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
               event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow("handshake:" + name, &suppressed)) {
        BP_LOG_WARN("{}the security handshake with '{}' at {} failed ({}); retrying{}", Prefix(),
                    name, p->shared->address,
                    event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                        ? "it refused this node's key: is this node's public key in its "
                          "security.public_keys?"
                    : curve_ ? "is security.mode curve on that node too, and its key the one "
                               "security.public_keys lists?"
                             : "is security.mode none on that node too?",
                    suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      if (!curve_) {
        PeerDown(name, p);
      } else {
        p->control_up = false;  // the lane, if any, reports its own end
        p->lane_requested = false;
      }
    }
  }
}

void ZmqTransport::PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status) {
  std::lock_guard<std::mutex> lock(in_mu_);
  if (in_closed_) return;
  inbox_.push_back(Incoming{Received{peer, TransportEvent{kind, peer, std::move(status)}}});
  in_cv_.notify_one();
}

}  // namespace

StatusOr<std::unique_ptr<Transport>> CreateZmqTransport(const TransportOptions& options) {
  auto t = std::make_unique<ZmqTransport>(options);
  Status s = t->Start();
  if (!s.ok()) return s;  // ~ZmqTransport closes what Start opened
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace bitpush::transport::zmq_backend
