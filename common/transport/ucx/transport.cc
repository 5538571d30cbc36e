#include "common/transport/ucx/transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log_limiter.h"
#include "common/logging.h"
#include "common/transport/block_pool.h"
#include "common/transport/ucx/hello_auth.h"
#include "common/transport/ucx/info.h"
#include "common/transport/ucx/wire.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kScheme[] = "ucx://";
// Reconnect attempts to a peer: the first after kRetryMin, then twice as long up to kRetryMax.
constexpr milliseconds kRetryMin{100};
constexpr milliseconds kRetryMax{1000};
// The longest the progress thread sleeps without a wake-up (a bound, not a poll interval: UCX
// and Send wake it through its file descriptors).
constexpr milliseconds kIdleWait{200};
// How long Close (and the end of a Disconnect) lets UCX flush what was already handed to it.
constexpr milliseconds kCloseFlush{1000};
// Messages up to this size are packed into one contiguous buffer (UCX copies them anyway:
// eager short and bcopy); larger ones go to UCX as an iov of the caller's frames.
constexpr size_t kPackBelowBytes = 16 * 1024;
// To a peer reached through shared memory, one-frame messages from this size on go as kData
// (UCX pipelines their rendezvous through the shared-memory lane); smaller ones as kFrame.
constexpr size_t kShmPipelineFromBytes = size_t{1} << 20;
// What the receive block pool keeps for reuse at most (block_pool.h): the blocks of a round
// of large messages in flight, whose pages then stay mapped.
constexpr size_t kKeptBlockBytes = size_t{256} << 20;

alignas(64) constexpr uint8_t kZeros[64] = {};

// ucp_ep_print_info's text for `ep` (info.h ParseEpLanes reads it); nullopt when no memory
// stream could be opened.
std::optional<std::string> EpInfo(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return std::nullopt;
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string out(text, size);
  std::free(text);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  return out;
}

// Whether the Active Messages of `ep` go through shared memory (the peer is on this host).
bool AmOverSharedMemory(ucp_ep_h ep) {
  const std::optional<std::string> info = EpInfo(ep);
  if (!info) return false;
  for (const UcxLane& lane : ParseEpLanes(*info)) {
    const bool shm = lane.transport == "sysv" || lane.transport == "posix" ||
                     lane.transport == "xpmem" || lane.transport == "knem";
    if (shm && (" " + lane.ops + " ").find(" am ") != std::string::npos) return true;
  }
  return false;
}

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* Addr() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// ucx://HOST:PORT (HOST an IPv4 literal, [IPv6] or a name, resolved here: its first IPv4
// address, else its first IPv6 one).
StatusOr<SockAddr> ParseAddress(const std::string& address) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(
        fmt::format("address '{}' is not ucx://HOST:PORT ({})", address, why));
  };
  if (address.rfind(kScheme, 0) != 0) return bad("scheme");
  const std::string rest = address.substr(sizeof(kScheme) - 1);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) return bad("no port");
  std::string host = rest.substr(0, colon);
  const std::string port_text = rest.substr(colon + 1);
  if (port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return bad("port");
  const int port = std::stoi(port_text);
  if (port > 65535) return bad("port above 65535");
  if (host.front() == '[') {
    if (host.back() != ']') return bad("unterminated [");
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int err = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (err != 0 || found == nullptr) {
    return bad(fmt::format("host '{}' does not resolve: {}", host, gai_strerror(err)));
  }
  const addrinfo* pick = nullptr;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
    if (a->ai_family == AF_INET6 && pick == nullptr) pick = a;
  }
  SockAddr out;
  if (pick != nullptr) {
    std::memcpy(&out.storage, pick->ai_addr, pick->ai_addrlen);
    out.length = pick->ai_addrlen;
  }
  freeaddrinfo(found);
  if (pick == nullptr) return bad(fmt::format("host '{}' has no IP address", host));
  if (out.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&out.storage)->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in6*>(&out.storage)->sin6_port = htons(static_cast<uint16_t>(port));
  }
  return out;
}

std::string FormatAddress(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return fmt::format("{}{}:{}", kScheme, text, ntohs(in->sin_port));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
  return fmt::format("{}[{}]:{}", kScheme, text, ntohs(in6->sin6_port));
}

// A send or receive that failed because its connection failed (the error handler reports the
// peer), as opposed to one that failed on its own (reported as kSendFailed).
bool IsConnectionError(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_CANCELED:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT: return true;
    default: return false;
  }
}

// Whether `config`'s TLS (if any) allows UCX's shared-memory transports: no TLS, an exclusion
// list ("^tcp"), or one naming them or an alias that includes them.
bool MayUseSharedMemory(const std::map<std::string, std::string>& config) {
  auto tls = config.find("TLS");
  if (tls == config.end() || tls->second.empty() || tls->second[0] == '^') return true;
  size_t start = 0;
  while (start <= tls->second.size()) {
    size_t end = tls->second.find(',', start);
    if (end == std::string::npos) end = tls->second.size();
    const std::string name = tls->second.substr(start, end - start);
    for (const char* shm : {"all", "sm", "shm", "mm", "posix", "sysv"}) {
      if (name == shm) return true;
    }
    start = end + 1;
  }
  return false;
}

// A UCP context configured for bitpush: Active Messages and wake-up, `config` applied over the
// UCX_* environment.
StatusOr<ucp_context_h> NewContext(const std::map<std::string, std::string>& config) {
  ucp_config_t* cfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
  if (s != UCS_OK)
    return UnavailableError(fmt::format("ucp_config_read: {}", ucs_status_string(s)));
  // A restarted endpoint listens on its old port again at once (ZeroMQ does the same), even
  // while connections of its previous life linger in TIME_WAIT; a port that a live endpoint
  // listens on stays refused. `config` may say otherwise.
  // UCX 1.13 leaves its shared-memory transports (posix, sysv) out of endpoints that need peer
  // failure handling unless MM_ERROR_HANDLING is on (openucx/ucx#8477): without it, two
  // endpoints on one host would talk over TCP loopback. (Not set when TLS rules them out: UCX
  // would warn about a setting no transport reads.)
  // Shared-memory segments of 32 KiB instead of UCX's 8 KiB: without a zero-copy transport
  // (CMA, KNEM, XPMEM) UCX moves a rendezvous message through the FIFO in segment-sized
  // fragments, and a fourth of the fragments is 1.3-1.5x the push/pull goodput (1 worker x 1
  // server, 100 MB; docs/transport-ucx.md). 64 KiB and above trip an assertion in UCX 1.13 (a
  // fragment's length is 16 bits wide).
  // Each of these defaults yields to its UCX_* environment variable and to `config`.
  // (RNDV_THRESH stays UCX's: eager sends of large messages stream one way faster over tcp and
  // shared memory here, but a push/pull cluster, both ways at once, runs at 0.4x of rendezvous.)
  std::map<std::string, std::string> defaults = {{"CM_REUSEADDR", "y"}};
  if (MayUseSharedMemory(config)) {
    defaults["MM_ERROR_HANDLING"] = "y";
    defaults["MM_SEG_SIZE"] = "32k";
  }
  std::map<std::string, std::string> entries;
  for (const auto& [key, value] : defaults) {
    if (std::getenv(("UCX_" + key).c_str()) == nullptr) entries[key] = value;
  }
  for (const auto& [key, value] : config) entries[key] = value;
  for (const auto& [key, value] : entries) {
    s = ucp_config_modify(cfg, key.c_str(), value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(cfg);
      return InvalidArgumentError(
          fmt::format("ucx_config {}={}: {}", key, value, ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "bitpush";
  ucp_context_h context = nullptr;
  s = ucp_init(&params, cfg, &context);
  ucp_config_release(cfg);
  if (s != UCS_OK) return UnavailableError(fmt::format("ucp_init: {}", ucs_status_string(s)));
  return context;
}

enum class PeerState { kConnecting, kConnected, kDisconnected };

// What callers and the progress thread share about one peer (guarded by UcxTransport::mu_).
struct PeerShared {
  std::string address;
  SockAddr sockaddr;
  PeerId key_owner;         // whose identity the listener has (Connect's key_owner)
  std::string hello_token;  // the HELLO's token: kCurve, token(this endpoint -> key_owner)
  PeerState state = PeerState::kConnecting;
  bool removed = false;        // Disconnect()ed or replaced by another Connect
  std::deque<Message> outbox;  // accepted by Send, not yet handed to UCX (no credit yet)
  Status last_error;           // why the peer is kDisconnected
};

// DescribePeerEndpoint's question to the progress thread, and its answer.
struct EpQuery {
  PeerId peer;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  StatusOr<std::string> answer{UnavailableError("not answered")};
};

struct Command {
  enum class Kind { kAdd, kRemove };
  Kind kind;
  PeerId peer;
  std::shared_ptr<PeerShared> shared;
};

// The progress thread's view of a peer: its client endpoint.
struct IoPeer {
  std::shared_ptr<PeerShared> shared;
  ucp_ep_h ep = nullptr;
  bool welcomed = false;  // the listener granted credits on `ep`: the connection is established
  // UCX completed the HELLO on `ep`: the listener accepted the connection request (a send
  // completes only once the connection is wired up), so if `ep` fails before it is welcomed,
  // the listener closed it: most likely it refused the HELLO.
  bool hello_sent = false;
  uint64_t credits = 0;  // messages that may still be sent on `ep`
  // The Active Messages of `ep` go through shared memory (set when it is welcomed). Large
  // one-frame messages then go as kData (UCX pipelines their rendezvous through the shared
  // memory lane), not as kFrame (whose contiguous rendezvous takes the rma_bw lane: tcp when
  // UCX offers no cma, 0.8x instead of 1.0-1.6x ZeroMQ in a push/pull cluster here).
  bool am_over_shm = false;
  uint64_t next_seq = 0;
  Clock::time_point retry_at;  // when `ep` is null: the next connection attempt
  milliseconds backoff = kRetryMin;
};

class UcxTransport;

// One Active Message on its way out; lives until UCX completes it, keeping its bytes alive.
struct SendOp {
  UcxTransport* transport = nullptr;
  uint8_t am_header[kAmHeaderBytes] = {};
  std::string frame_am_header;  // kFrame: am_header followed by the message header
  std::string packed;  // HELLO; or the message header, frame sizes and padding (or everything)
  std::vector<ucp_dt_iov_t> iov;
  Message msg;                  // the frames handed to UCX by pointer
  PeerId peer;                  // kData: the peer, for kSendFailed
  ucp_ep_h hello_ep = nullptr;  // kHello: the client endpoint it opens
  ucp_ep_h ep = nullptr;        // where it was posted, and when (send_complete_timeout)
  std::chrono::steady_clock::time_point posted{};
  // Set while ucp_am_send_nbx runs: UCX may complete a request inside the call, run the
  // callback (which deletes the op) and still return the request, so Post reads this flag
  // instead of the op after the call.
  bool* finished_in_call = nullptr;
};

// A message received by rendezvous into `block`.
struct RecvOp {
  UcxTransport* transport = nullptr;
  uint64_t conn = 0;
  AmHeader header;
  std::shared_ptr<uint8_t> block;
  size_t size = 0;
  std::string message_header;  // kFrame: the message header, from the AM header
  // Set while ucp_am_recv_data_nbx runs: a rendezvous receive can complete inside the call
  // (the sender's endpoint failed, say), run RecvCallback (which deletes the op) and still
  // return the request, so OnData reads this flag instead of the op after the call.
  bool* finished_in_call = nullptr;
};

// A message of a connection, arrived and possibly not received yet, waiting for its turn.
struct Slot {
  bool done = false;
  bool delivered = false;  // false when done: dropped (failed or malformed)
  Message msg;
};

// A connection accepted by the listener (the server endpoint): it receives.
struct InConn {
  uint64_t id = 0;
  ucp_ep_h ep = nullptr;
  PeerId name;  // from the HELLO
  bool hello = false;
  bool refused = false;             // being closed: whatever else arrives on it is dropped unseen
  uint64_t granted = 0;             // credits granted in total
  uint64_t next_deliver = 0;        // the seq of the next message to hand to Receive
  uint64_t dropped_unreturned = 0;  // credits of dropped messages not given back yet
  std::map<uint64_t, Slot> slots;
  // Since when a later message is here but next_deliver has not arrived (epoch: no gap).
  std::chrono::steady_clock::time_point gap_since{};
};

// Receive's queue entry: a message (of connection `conn`) or an event (conn 0).
struct Incoming {
  Received r;
  uint64_t conn = 0;
};

// Per accepted connection, what Receive and the progress thread share (guarded by in_mu_).
struct CreditShare {
  size_t queued = 0;       // its messages in the inbox
  uint64_t to_return = 0;  // taken by Receive, not yet given back to the sender as credits
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& options)
      : options_(options), credit_batch_(std::max<size_t>(1, options.max_queued_per_peer / 4)) {}
  ~UcxTransport() override {
    Close();
    if (wake_fd_ >= 0) close(wake_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  Status Start();

  const PeerId& name() const override { return options_.name; }
  std::string address() const override { return address_; }
  using Transport::Connect;
  Status Connect(const PeerId& peer, const std::string& address, const PeerId& key_owner) override;
  void Disconnect(const PeerId& peer) override;
  Status Send(const PeerId& peer, Message msg) override;
  StatusOr<Received> Receive(milliseconds timeout) override;
  void Close() override;
  TransportStats stats() const override;
  // ucp_ep_print_info of the client endpoint to `peer` (transport.h: DescribePeerEndpoint).
  StatusOr<std::string> DescribePeer(const PeerId& peer, milliseconds timeout);

  // UCX callbacks (progress thread).
  ucs_status_t OnAm(const void* header, size_t header_length, void* data, size_t length,
                    const ucp_am_recv_param_t* param);
  void OnEpError(ucp_ep_h ep, ucs_status_t status) { failed_eps_.emplace_back(ep, status); }
  void OnConnRequest(ucp_conn_request_h request) { conn_requests_.push_back(request); }
  void OnSendDone(SendOp* op, ucs_status_t status);
  void OnRecvDone(RecvOp* op, ucs_status_t status);

 private:
  std::string Prefix() const {
    return fmt::format("endpoint '{}' ({}): ", options_.name,
                       address_.empty() ? options_.listen_address : address_);
  }
  void Wake();

  // Progress thread.
  void Loop();
  void Progress();
  void ApplyCommands(std::deque<Command>* commands);
  void AnswerQueries(std::vector<std::shared_ptr<EpQuery>>* queries);
  void HandleDeferred();
  void AcceptConnection(ucp_conn_request_h request);
  void HandleEpError(ucp_ep_h ep, ucs_status_t status);
  void StartConnect(const PeerId& name, IoPeer* p);
  void ReconnectDue(Clock::time_point now, milliseconds* wait);
  // Notes when a connection's next message goes missing behind later ones (NoteGap), and closes
  // connections whose gap outlived options_.sequence_gap_timeout; lowers *wait to the next due.
  // gapped_ holds the connections with a gap, so the loop looks at those only.
  void NoteGap(InConn* c);
  void CloseGapped(Clock::time_point now, milliseconds* wait);
  void FlushOutboxes();
  void ReturnCredits();
  void SendData(const PeerId& name, IoPeer* p, Message msg);
  void SendControl(ucp_ep_h ep, AmType type, uint64_t seq, std::string payload, bool hello = false);
  void Post(ucp_ep_h ep, SendOp* op, const void* buffer, size_t count, bool iov);
  void CloseEp(ucp_ep_h ep, bool force);
  void PollClosing();
  bool IsClosing(ucp_ep_h ep) const {
    return std::any_of(closing_.begin(), closing_.end(),
                       [ep](const auto& c) { return c.second == ep; });
  }
  void CloseInConn(uint64_t id, bool force);
  // Closes every connection with a send older than send_complete_timeout (HandleEpError: the
  // peer is reported disconnected and reconnected later); lowers *wait to the next such time.
  void ExpireStalledSends(Clock::time_point now, std::chrono::milliseconds* wait);
  static constexpr std::chrono::milliseconds kSendCheckEvery{100};
  Clock::time_point next_send_check_{};  // progress thread
  void DropIoPeer(IoPeer* p, bool force);
  void OnHello(InConn* c, const void* data, size_t length, bool rndv);
  // A connection whose HELLO was just accepted takes the name over from any older connection
  // under it (a restarted node, as in the zmq backend): those are closed after this progress
  // and counted (identity_refused).
  void SupersedeOlderConnections(const InConn& newer);
  // kData and kFrame (whose message header follows the AM header: `frame_header`).
  ucs_status_t OnData(InConn* c, const AmHeader& h, const uint8_t* frame_header, void* data,
                      size_t length, bool rndv);
  // Both take the block over: once the message is in Receive's queue, its frames are the only
  // owners of the block, so a receiver may take the bytes over (use_count() == 1).
  void Complete(InConn* c, uint64_t seq, const AmHeader& h, std::shared_ptr<uint8_t> block,
                size_t size);
  void CompleteFrame(InConn* c, uint64_t seq, std::string message_header,
                     std::shared_ptr<uint8_t> block, size_t size);
  void Deliver(InConn* c);
  void Malformed(const std::string& what);
  void Refuse(InConn* c, const std::string& what);
  void RefuseHello(InConn* c, const PeerId& claimed, const std::string& why);
  void PeerUp(const PeerId& name, IoPeer* p);
  void PeerDown(const PeerId& name, IoPeer* p, ucs_status_t why);
  void PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status);
  void Shutdown();

  const TransportOptions options_;
  const size_t credit_batch_;
  std::optional<HelloAuth> auth_;  // kCurve; written by Start only
  std::string address_;            // resolved; written by Start only
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  std::thread thread_;
  std::mutex close_mu_;  // serialises Close

  // Callers <-> progress thread.
  std::mutex mu_;
  std::condition_variable space_;  // an outbox shrank, a peer changed state, or closed
  size_t blocked_senders_ = 0;
  bool closed_ = false;
  bool dirty_ = false;  // something for the progress thread since it last looked
  std::map<PeerId, std::shared_ptr<PeerShared>> peers_;
  std::deque<Command> commands_;
  std::vector<std::shared_ptr<EpQuery>> queries_;

  // Progress thread -> Receive (and credits back).
  std::mutex in_mu_;
  std::condition_variable in_cv_;
  std::deque<Incoming> inbox_;
  std::unordered_map<uint64_t, CreditShare> credit_;  // by accepted connection
  bool credits_due_ = false;                          // some to_return reached its batch
  bool in_closed_ = false;

  // Progress thread only.
  std::map<PeerId, IoPeer> io_peers_;
  std::unordered_map<ucp_ep_h, PeerId> out_by_ep_;
  std::map<uint64_t, InConn> in_conns_;
  std::unordered_map<ucp_ep_h, uint64_t> in_by_ep_;
  uint64_t next_conn_id_ = 1;
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> failed_eps_;
  std::vector<ucp_conn_request_h> conn_requests_;
  std::vector<std::pair<uint64_t, std::string>> refused_;  // connections to close
  std::set<uint64_t> gapped_;  // in_conns_ ids whose next message is missing behind later ones
  std::vector<std::pair<void*, ucp_ep_h>> closing_;  // ucp_ep_close_nbx requests and their eps
  std::set<SendOp*> send_ops_;
  std::set<RecvOp*> recv_ops_;
  LogLimiter log_limiter_;
  // Received messages' blocks (aligned, recycled; taken on the progress thread, handed back by
  // whoever drops the last view of a message).
  const std::shared_ptr<BlockPool> blocks_ = BlockPool::Create(kKeptBlockBytes);

  std::atomic<uint64_t> messages_sent_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> messages_received_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> malformed_dropped_{0};
  std::atomic<uint64_t> connections_refused_{0};
  std::atomic<uint64_t> auth_refused_{0};
  std::atomic<uint64_t> identity_refused_{0};
};

// ---- UCX callbacks -------------------------------------------------------------------------

ucs_status_t AmCallback(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->OnAm(header, header_length, data, length, param);
}

void EpErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<UcxTransport*>(arg)->OnEpError(ep, status);
}

void ConnRequestCallback(ucp_conn_request_h request, void* arg) {
  static_cast<UcxTransport*>(arg)->OnConnRequest(request);
}

void SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  ucp_request_free(request);
  op->transport->OnSendDone(op, status);
}

void RecvCallback(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  auto* op = static_cast<RecvOp*>(user_data);
  ucp_request_free(request);
  op->transport->OnRecvDone(op, status);
}

// ---- Start, caller API ---------------------------------------------------------------------

Status UcxTransport::Start() {
  if (options_.security.mode == TransportSecurity::Mode::kCurve) {
    StatusOr<HelloAuth> auth = HelloAuth::Create(options_.name, options_.security);
    if (!auth.ok()) return Status(auth.status().code(), Prefix() + auth.status().message());
    auth_ = std::move(auth).value();
  }
  StatusOr<SockAddr> listen = ParseAddress(options_.listen_address);
  if (!listen.ok()) return Status(listen.status().code(), Prefix() + listen.status().message());
  StatusOr<ucp_context_h> context = NewContext(options_.ucx_config);
  if (!context.ok()) return Status(context.status().code(), Prefix() + context.status().message());
  context_ = *context;

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread uses the worker at a time: Start here, then only the progress thread.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return UnavailableError(Prefix() + "ucp_worker_create: " + ucs_status_string(s));

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &AmCallback;
  am.arg = this;
  s = ucp_worker_set_am_recv_handler(worker_, &am);
  if (s != UCS_OK)
    return InternalError(Prefix() + "ucp_worker_set_am_recv_handler: " + ucs_status_string(s));

  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = listen->Addr();
  lp.sockaddr.addrlen = listen->length;
  lp.conn_handler.cb = &ConnRequestCallback;
  lp.conn_handler.arg = this;
  s = ucp_listener_create(worker_, &lp, &listener_);
  if (s == UCS_ERR_BUSY) {
    return UnavailableError(Prefix() +
                            fmt::format("address {} is in use", options_.listen_address));
  }
  if (s != UCS_OK) {
    return UnavailableError(Prefix() + fmt::format("cannot listen on '{}': {}",
                                                   options_.listen_address, ucs_status_string(s)));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_, &attr);
  if (s != UCS_OK) return InternalError(Prefix() + "ucp_listener_query: " + ucs_status_string(s));
  address_ = FormatAddress(attr.sockaddr);

  int worker_fd = -1;
  s = ucp_worker_get_efd(worker_, &worker_fd);
  if (s != UCS_OK) return InternalError(Prefix() + "ucp_worker_get_efd: " + ucs_status_string(s));
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) {
    return InternalError(Prefix() + "eventfd/epoll: " + std::strerror(errno));
  }
  for (int fd : {worker_fd, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return InternalError(Prefix() + "epoll_ctl: " + std::strerror(errno));
    }
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "bp-ucx");
    Loop();
  });
  return Status::Ok();
}

void UcxTransport::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

Status UcxTransport::Connect(const PeerId& peer, const std::string& address,
                             const PeerId& key_owner) {
  if (peer.empty()) return InvalidArgumentError(Prefix() + "Connect: empty peer name");
  StatusOr<SockAddr> sockaddr = ParseAddress(address);
  if (!sockaddr.ok()) {
    return InvalidArgumentError(
        Prefix() + fmt::format("Connect to '{}': {}", peer, sockaddr.status().message()));
  }
  std::string token;
  if (auth_) {
    StatusOr<std::string> t = auth_->TokenTo(key_owner);
    if (!t.ok()) {
      return InvalidArgumentError(Prefix() +
                                  fmt::format("Connect to '{}': {}", peer, t.status().message()));
    }
    token = std::move(t).value();
  }
  std::shared_ptr<PeerShared> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + fmt::format("Connect to '{}': closed", peer));
    std::shared_ptr<PeerShared>& slot = peers_[peer];
    if (slot && slot->address == address && slot->key_owner == key_owner) return Status::Ok();
    auto shared = std::make_shared<PeerShared>();
    shared->address = address;
    shared->sockaddr = *sockaddr;
    shared->key_owner = key_owner;
    shared->hello_token = std::move(token);
    old = std::move(slot);
    if (old) {
      old->removed = true;
      space_.notify_all();
    }
    slot = shared;
    commands_.push_back({Command::Kind::kAdd, peer, shared});
    dirty_ = true;
  }
  Wake();
  return Status::Ok();
}

void UcxTransport::Disconnect(const PeerId& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    it->second->removed = true;
    commands_.push_back({Command::Kind::kRemove, peer, it->second});
    peers_.erase(it);
    dirty_ = true;
    space_.notify_all();
  }
  Wake();
}

Status UcxTransport::Send(const PeerId& peer, Message msg) {
  if (Status g = CheckGlue(msg); !g.ok()) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {}", peer, g.message()));
  }
  if (msg.frames.size() > UINT32_MAX || msg.header.size() > UINT32_MAX) {
    return InvalidArgumentError(Prefix() + fmt::format("send to '{}': {} frames, {}-byte header",
                                                       peer, msg.frames.size(), msg.header.size()));
  }
  const uint64_t bytes = msg.header.size() + msg.payload_bytes();
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
    if (p->state != PeerState::kDisconnected && p->outbox.size() >= limit) {
      ++blocked_senders_;
      space_.wait_for(lock, options_.send_block_timeout, [&] {
        return closed_ || p->removed || p->state == PeerState::kDisconnected ||
               p->outbox.size() < limit;
      });
      --blocked_senders_;
      if (closed_) return CancelledError(Prefix() + fmt::format("send to '{}': closed", peer));
      if (p->removed) {
        return NotFoundError(Prefix() +
                             fmt::format("send to '{}': the peer was disconnected while the send "
                                         "waited",
                                         peer));
      }
      if (p->state != PeerState::kDisconnected && p->outbox.size() >= limit) {
        return UnavailableError(
            Prefix() + fmt::format("send to '{}' at {}: {} messages queued, none sent for {} ms",
                                   peer, p->address, p->outbox.size(),
                                   options_.send_block_timeout.count()));
      }
    }
    if (p->state == PeerState::kDisconnected) {
      return UnavailableError(Prefix() + fmt::format("send to '{}' at {}: {}", peer, p->address,
                                                     p->last_error.message()));
    }
    p->outbox.push_back(std::move(msg));
    wake = !dirty_;
    dirty_ = true;
  }
  messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  if (wake) Wake();
  return Status::Ok();
}

StatusOr<Received> UcxTransport::Receive(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
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
    if (in.conn != 0) {
      auto it = credit_.find(in.conn);
      if (it != credit_.end()) {
        --it->second.queued;
        ++it->second.to_return;
        if (!credits_due_ && (it->second.to_return >= credit_batch_ || it->second.queued == 0)) {
          credits_due_ = true;
          wake = true;
        }
      }
    }
  }
  if (wake) Wake();
  return std::move(in.r);
}

void UcxTransport::Close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    space_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    in_closed_ = true;
    in_cv_.notify_all();
  }
  if (thread_.joinable()) {
    Wake();
    thread_.join();  // the thread closed every UCP object it used (Shutdown)
  } else if (listener_ != nullptr) {
    ucp_listener_destroy(listener_);  // Start failed part-way
  }
  listener_ = nullptr;
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  // UCX completed or abandoned every operation: release what it still held.
  for (SendOp* op : send_ops_) delete op;
  send_ops_.clear();
  for (RecvOp* op : recv_ops_) delete op;
  recv_ops_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
  std::deque<Incoming> dropped;
  std::map<PeerId, std::shared_ptr<PeerShared>> peers;
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    dropped.swap(inbox_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers.swap(peers_);
    commands_.clear();
  }
}

TransportStats UcxTransport::stats() const {
  TransportStats s;
  s.messages_sent = messages_sent_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.messages_received = messages_received_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  s.malformed_dropped = malformed_dropped_.load(std::memory_order_relaxed);
  s.connections_refused = connections_refused_.load(std::memory_order_relaxed);
  s.auth_refused = auth_refused_.load(std::memory_order_relaxed);
  s.identity_refused = identity_refused_.load(std::memory_order_relaxed);
  return s;
}

// ---- progress thread -----------------------------------------------------------------------

void UcxTransport::Progress() {
  while (ucp_worker_progress(worker_) != 0) {
  }
  HandleDeferred();
  PollClosing();
}

void UcxTransport::Loop() {
  while (true) {
    std::deque<Command> commands;
    std::vector<std::shared_ptr<EpQuery>> queries;
    bool closing = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
      queries.swap(queries_);
      closing = closed_;
      dirty_ = false;
    }
    ApplyCommands(&commands);
    AnswerQueries(&queries);
    if (closing) break;
    Progress();
    ReturnCredits();
    milliseconds wait = kIdleWait;
    ReconnectDue(Clock::now(), &wait);
    CloseGapped(Clock::now(), &wait);
    ExpireStalledSends(Clock::now(), &wait);
    FlushOutboxes();
    Progress();
    if (!failed_eps_.empty() || !conn_requests_.empty()) continue;
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;  // more to progress
    if (armed != UCS_OK) {
      BP_LOG_ERROR("{}ucp_worker_arm: {}", Prefix(), ucs_status_string(armed));
      wait = milliseconds(10);  // still bounded, never a hot spin
    }
    epoll_event events[2];
    const int n = epoll_wait(epoll_fd_, events, 2, static_cast<int>(wait.count()));
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t count = 0;
        (void)!read(wake_fd_, &count, sizeof(count));
      }
    }
  }
  Shutdown();
}

void UcxTransport::Shutdown() {
  ucp_listener_destroy(listener_);
  listener_ = nullptr;
  // Flush what was handed to UCX (each close flushes its endpoint), then tell the peers.
  for (auto& [name, p] : io_peers_) DropIoPeer(&p, /*force=*/false);
  io_peers_.clear();
  std::vector<uint64_t> ids;
  ids.reserve(in_conns_.size());
  for (const auto& [id, c] : in_conns_) ids.push_back(id);
  for (uint64_t id : ids) CloseInConn(id, /*force=*/false);
  const auto deadline = Clock::now() + kCloseFlush;
  while (!closing_.empty() && Clock::now() < deadline) {
    Progress();
    if (closing_.empty()) break;
    if (ucp_worker_arm(worker_) == UCS_OK) {
      epoll_event events[2];
      epoll_wait(epoll_fd_, events, 2, 10);
    }
  }
  if (!closing_.empty()) {
    BP_LOG_DEBUG("{}{} endpoint(s) did not finish closing within {} ms", Prefix(), closing_.size(),
                 kCloseFlush.count());
  }
  for (const auto& [r, ep] : closing_) ucp_request_free(r);
  closing_.clear();
}

StatusOr<std::string> UcxTransport::DescribePeer(const PeerId& peer, milliseconds timeout) {
  auto q = std::make_shared<EpQuery>();
  q->peer = peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(Prefix() + "closed");
    queries_.push_back(q);
    dirty_ = true;
  }
  Wake();
  std::unique_lock<std::mutex> lock(q->mu);
  if (!q->cv.wait_for(lock, timeout, [&] { return q->done; })) {
    return TimeoutError(Prefix() +
                        fmt::format("no answer about '{}' in {} ms", peer, timeout.count()));
  }
  return q->answer;
}

void UcxTransport::AnswerQueries(std::vector<std::shared_ptr<EpQuery>>* queries) {
  for (const std::shared_ptr<EpQuery>& q : *queries) {
    StatusOr<std::string> answer =
        UnavailableError(Prefix() + fmt::format("no established connection to '{}'", q->peer));
    auto it = io_peers_.find(q->peer);
    if (it != io_peers_.end() && it->second.ep != nullptr && it->second.welcomed) {
      std::optional<std::string> info = EpInfo(it->second.ep);
      if (info) {
        answer = std::move(*info);
      } else {
        answer = InternalError(Prefix() + "open_memstream failed");
      }
    }
    std::lock_guard<std::mutex> lock(q->mu);
    q->answer = std::move(answer);
    q->done = true;
    q->cv.notify_all();
  }
}

void UcxTransport::ApplyCommands(std::deque<Command>* commands) {
  for (Command& c : *commands) {
    auto it = io_peers_.find(c.peer);
    if (it != io_peers_.end()) {
      if (c.kind == Command::Kind::kRemove && it->second.shared != c.shared) continue;
      DropIoPeer(&it->second, /*force=*/false);
      io_peers_.erase(it);
    }
    if (c.kind == Command::Kind::kAdd) {
      IoPeer& p = io_peers_[c.peer];
      p.shared = c.shared;
      StartConnect(c.peer, &p);
    }
  }
}

void UcxTransport::DropIoPeer(IoPeer* p, bool force) {
  if (p->ep == nullptr) return;
  out_by_ep_.erase(p->ep);
  CloseEp(p->ep, force);
  p->ep = nullptr;
}

void UcxTransport::StartConnect(const PeerId& name, IoPeer* p) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = p->shared->sockaddr.Addr();
  ep.sockaddr.addrlen = p->shared->sockaddr.length;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &EpErrorCallback;
  ep.err_handler.arg = this;
  p->welcomed = false;
  p->credits = 0;
  p->next_seq = 0;
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &p->ep);
  if (s != UCS_OK) {
    p->ep = nullptr;
    p->retry_at = Clock::now() + p->backoff;
    p->backoff = std::min(2 * p->backoff, kRetryMax);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("connect:" + name, &suppressed)) {
      BP_LOG_WARN("{}connecting to '{}' at {}: {}; retrying", Prefix(), name, p->shared->address,
                  ucs_status_string(s));
    }
    return;
  }
  out_by_ep_[p->ep] = name;
  // The first message on every connection names this endpoint (and under kCurve proves it).
  p->hello_sent = false;
  SendControl(p->ep, AmType::kHello, 0,
              EncodeHello(HelloPayload{options_.name, p->shared->hello_token}), /*hello=*/true);
}

void UcxTransport::ReconnectDue(Clock::time_point now, milliseconds* wait) {
  for (auto& [name, p] : io_peers_) {
    if (p.ep != nullptr) continue;
    if (p.retry_at <= now) {
      StartConnect(name, &p);
    } else {
      *wait = std::min(*wait, std::chrono::ceil<milliseconds>(p.retry_at - now));
    }
  }
}

void UcxTransport::FlushOutboxes() {
  for (auto& [name, p] : io_peers_) {
    if (p.ep == nullptr || !p.welcomed || p.credits == 0) continue;
    std::vector<Message> batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::deque<Message>& outbox = p.shared->outbox;
      const size_t n = std::min<uint64_t>(p.credits, outbox.size());
      if (n == 0) continue;
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(outbox.front()));
        outbox.pop_front();
      }
      if (blocked_senders_ > 0) space_.notify_all();
    }
    for (Message& m : batch) SendData(name, &p, std::move(m));
  }
}

void UcxTransport::SendData(const PeerId& name, IoPeer* p, Message msg) {
  auto op = std::make_unique<SendOp>();
  op->transport = this;
  op->peer = name;
  // Wire frames: a glued run of frames is one frame, sent from where its parts are.
  const std::vector<WireFrame> wire = WireFrames(msg);
  std::vector<uint64_t> sizes(wire.size());
  AmHeader h;
  h.type = AmType::kData;
  h.seq = p->next_seq++;
  h.header_bytes = static_cast<uint32_t>(msg.header.size());
  h.frame_count = static_cast<uint32_t>(wire.size());
  h.largest_part = 0;
  for (size_t i = 0; i < wire.size(); ++i) {
    sizes[i] = wire[i].bytes;
    h.largest_part = std::max<uint64_t>(h.largest_part, sizes[i]);
  }
  // Appends wire frame i's parts to op->iov.
  auto push_parts = [&](size_t i) {
    for (size_t k = wire[i].first; k < wire[i].first + wire[i].count; ++k) {
      const Buffer& part = msg.frames[k];
      if (!part.empty()) op->iov.push_back({const_cast<uint8_t*>(part.data()), part.size()});
    }
  };
  if (sizes.size() == 1 && sizes[0] >= kPackBelowBytes &&
      (!p->am_over_shm || sizes[0] < kShmPipelineFromBytes) &&
      msg.header.size() <= kMaxFrameMessageHeader) {
    // kFrame: the message header rides in the AM header; the frame is the data. A glued frame
    // whose parts before its last are at most kMaxFramePrefix bytes sends those in the AM
    // header too (the prefix), so the data stays one contiguous part; other glued frames go
    // as an iov of their parts.
    h.type = AmType::kFrame;
    const size_t last = wire[0].first + wire[0].count - 1;
    const uint64_t prefix = sizes[0] - msg.frames[last].size();
    const bool prefixed = wire[0].count > 1 && prefix <= kMaxFramePrefix;
    if (prefixed) h.prefix_bytes = static_cast<uint8_t>(prefix);
    EncodeAmHeader(h, op->am_header);
    op->frame_am_header.reserve(kAmHeaderBytes + msg.header.size() + h.prefix_bytes);
    op->frame_am_header.append(reinterpret_cast<const char*>(op->am_header), kAmHeaderBytes);
    op->frame_am_header.append(msg.header);
    if (prefixed) {
      for (size_t k = wire[0].first; k < last; ++k) {
        op->frame_am_header.append(reinterpret_cast<const char*>(msg.frames[k].data()),
                                   msg.frames[k].size());
      }
    } else if (wire[0].count > 1) {
      push_parts(0);
    }
    --p->credits;
    op->msg = std::move(msg);
    SendOp* raw = op.release();
    if (raw->iov.empty()) {
      const Buffer& data = raw->msg.frames[prefixed ? last : wire[0].first];
      Post(p->ep, raw, data.data(), data.size(), /*iov=*/false);
    } else {
      Post(p->ep, raw, raw->iov.data(), raw->iov.size(), /*iov=*/true);
    }
    return;
  }
  EncodeAmHeader(h, op->am_header);
  StatusOr<DataLayout> layout = ComputeLayout(msg.header.size(), sizes);
  if (!layout.ok()) {  // cannot happen for frames that exist in memory
    PushEvent(
        name, TransportEvent::Kind::kSendFailed,
        InternalError(Prefix() + fmt::format("send to '{}': {}", name, layout.status().message())));
    return;
  }
  --p->credits;
  // The packed part: header, sizes, and the padding up to the first frame; everything when
  // the message is small.
  const bool pack_all = layout->total < kPackBelowBytes;
  const size_t packed_bytes =
      pack_all ? layout->total : (wire.empty() ? layout->total : layout->frame_offsets[0]);
  op->packed.assign(packed_bytes, '\0');
  auto* out = reinterpret_cast<uint8_t*>(op->packed.data());
  std::copy(msg.header.begin(), msg.header.end(), out);
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      out[layout->sizes_offset + 8 * i + b] = static_cast<uint8_t>(sizes[i] >> (8 * b));
    }
  }
  if (pack_all) {
    for (size_t i = 0; i < wire.size(); ++i) {
      size_t at = layout->frame_offsets[i];
      for (size_t k = wire[i].first; k < wire[i].first + wire[i].count; ++k) {
        const Buffer& part = msg.frames[k];
        if (!part.empty()) std::memcpy(out + at, part.data(), part.size());
        at += part.size();
      }
    }
    Post(p->ep, op.release(), out, packed_bytes, /*iov=*/false);
    return;
  }
  op->iov.push_back({out, packed_bytes});
  size_t end = packed_bytes;
  for (size_t i = 0; i < wire.size(); ++i) {
    if (layout->frame_offsets[i] > end) {
      op->iov.push_back({const_cast<uint8_t*>(kZeros), layout->frame_offsets[i] - end});
    }
    push_parts(i);
    end = layout->frame_offsets[i] + sizes[i];
  }
  op->msg = std::move(msg);
  SendOp* raw = op.release();
  Post(p->ep, raw, raw->iov.data(), raw->iov.size(), /*iov=*/true);
}

void UcxTransport::SendControl(ucp_ep_h ep, AmType type, uint64_t seq, std::string payload,
                               bool hello) {
  auto* op = new SendOp();
  op->transport = this;
  if (hello) op->hello_ep = ep;
  AmHeader h;
  h.type = type;
  h.seq = seq;
  EncodeAmHeader(h, op->am_header);
  op->packed = std::move(payload);
  Post(ep, op, op->packed.data(), op->packed.size(), /*iov=*/false);
}

void UcxTransport::Post(ucp_ep_h ep, SendOp* op, const void* buffer, size_t count, bool iov) {
  op->ep = ep;
  op->posted = Clock::now();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.datatype = iov ? ucp_dt_make_iov() : ucp_dt_make_contig(1);
  param.cb.send = &SendCallback;
  param.user_data = op;
  const bool frame = !op->frame_am_header.empty();
  bool finished = false;
  op->finished_in_call = &finished;
  send_ops_.insert(op);
  ucs_status_ptr_t r = ucp_am_send_nbx(
      ep, kAmId, frame ? static_cast<const void*>(op->frame_am_header.data()) : op->am_header,
      frame ? op->frame_am_header.size() : kAmHeaderBytes, count ? buffer : nullptr, count, &param);
  if (finished) return;  // SendCallback ran inside the call: op is gone
  op->finished_in_call = nullptr;
  if (r == nullptr) {
    OnSendDone(op, UCS_OK);  // completed at once
  } else if (UCS_PTR_IS_ERR(r)) {
    OnSendDone(op, UCS_PTR_STATUS(r));
  }  // else in flight: SendCallback finishes it
}

void UcxTransport::OnSendDone(SendOp* op, ucs_status_t status) {
  if (op->finished_in_call != nullptr) *op->finished_in_call = true;
  send_ops_.erase(op);
  if (op->hello_ep != nullptr && status == UCS_OK) {
    if (auto out = out_by_ep_.find(op->hello_ep); out != out_by_ep_.end()) {
      io_peers_.at(out->second).hello_sent = true;
    }
  }
  if (status != UCS_OK && !op->peer.empty() && !IsConnectionError(status)) {
    PushEvent(op->peer, TransportEvent::Kind::kSendFailed,
              UnavailableError(Prefix() + fmt::format("send to '{}' failed: {}", op->peer,
                                                      ucs_status_string(status))));
  }
  delete op;
}

void UcxTransport::ReturnCredits() {
  std::vector<std::pair<uint64_t, uint64_t>> give;
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    credits_due_ = false;
    for (auto& [id, share] : credit_) {
      if (share.to_return > 0 && (share.to_return >= credit_batch_ || share.queued == 0)) {
        give.emplace_back(id, share.to_return);
        share.to_return = 0;
      }
    }
  }
  for (auto& [id, c] : in_conns_) {
    if (c.dropped_unreturned > 0) {
      give.emplace_back(id, c.dropped_unreturned);
      c.dropped_unreturned = 0;
    }
  }
  for (const auto& [id, n] : give) {
    auto it = in_conns_.find(id);
    if (it == in_conns_.end()) continue;
    it->second.granted += n;
    SendControl(it->second.ep, AmType::kCredit, n, "");
  }
}

void UcxTransport::CloseEp(ucp_ep_h ep, bool force) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.emplace_back(r, ep);
}

void UcxTransport::PollClosing() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(it->first) == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(it->first);
    it = closing_.erase(it);
  }
}

void UcxTransport::CloseInConn(uint64_t id, bool force) {
  auto it = in_conns_.find(id);
  if (it == in_conns_.end()) return;
  in_by_ep_.erase(it->second.ep);
  CloseEp(it->second.ep, force);
  gapped_.erase(it->first);
  in_conns_.erase(it);  // slots still receiving: their RecvOps find no connection and drop
  std::lock_guard<std::mutex> lock(in_mu_);
  credit_.erase(id);
}

void UcxTransport::HandleDeferred() {
  while (!failed_eps_.empty() || !conn_requests_.empty() || !refused_.empty()) {
    std::vector<ucp_conn_request_h> requests;
    requests.swap(conn_requests_);
    for (ucp_conn_request_h r : requests) AcceptConnection(r);
    std::vector<std::pair<ucp_ep_h, ucs_status_t>> failed;
    failed.swap(failed_eps_);
    for (const auto& [ep, status] : failed) HandleEpError(ep, status);
    std::vector<std::pair<uint64_t, std::string>> refused;
    refused.swap(refused_);
    for (const auto& [id, why] : refused) CloseInConn(id, /*force=*/true);
  }
}

void UcxTransport::AcceptConnection(ucp_conn_request_h request) {
  if (in_conns_.size() >= options_.max_connections) {
    ucp_listener_reject(listener_, request);
    connections_refused_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("connections", &suppressed)) {
      BP_LOG_WARN("{}refused a connection: {} are open, the limit is {}{}", Prefix(),
                  in_conns_.size(), options_.max_connections,
                  suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    return;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &EpErrorCallback;
  ep.err_handler.arg = this;
  ucp_ep_h handle = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &handle);
  if (s != UCS_OK) {
    BP_LOG_WARN("{}accepting a connection: {}", Prefix(), ucs_status_string(s));
    return;
  }
  const uint64_t id = next_conn_id_++;
  InConn& c = in_conns_[id];
  c.id = id;
  c.ep = handle;
  in_by_ep_[handle] = id;
  std::lock_guard<std::mutex> lock(in_mu_);
  credit_[id] = CreditShare{};
}

void UcxTransport::HandleEpError(ucp_ep_h ep, ucs_status_t status) {
  if (auto in = in_by_ep_.find(ep); in != in_by_ep_.end()) {
    const uint64_t id = in->second;
    BP_LOG_DEBUG("{}the connection from '{}' ended: {}", Prefix(), in_conns_.at(id).name,
                 ucs_status_string(status));
    CloseInConn(id, /*force=*/true);
    return;
  }
  auto out = out_by_ep_.find(ep);
  if (out == out_by_ep_.end()) return;  // already closed by us
  const PeerId name = out->second;
  IoPeer& p = io_peers_.at(name);
  const bool was_up = p.welcomed;
  if (!was_up && p.hello_sent) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("closed-before-welcome:" + name, &suppressed)) {
      const std::string hint =
          auth_ ? fmt::format(
                      "does '{}' run security mode curve and list this node's public key "
                      "under the name '{}'?",
                      p.shared->key_owner, options_.name)
                : fmt::format("does '{}' run security mode none too?", p.shared->key_owner);
      BP_LOG_WARN(
          "{}'{}' at {} closed the connection after its HELLO, before accepting it ({}): "
          "refused? ({}) Retrying{}",
          Prefix(), name, p.shared->address, ucs_status_string(status), hint,
          suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
  }
  p.hello_sent = false;
  DropIoPeer(&p, /*force=*/true);
  p.welcomed = false;
  p.credits = 0;
  p.retry_at = Clock::now() + p.backoff;
  p.backoff = std::min(2 * p.backoff, kRetryMax);
  if (was_up) PeerDown(name, &p, status);
}

void UcxTransport::PeerUp(const PeerId& name, IoPeer* p) {
  p->welcomed = true;
  p->am_over_shm = AmOverSharedMemory(p->ep);
  p->backoff = kRetryMin;
  bool reconnected = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reconnected = p->shared->state == PeerState::kDisconnected;
    p->shared->state = PeerState::kConnected;
    p->shared->last_error = Status::Ok();
    space_.notify_all();
  }
  if (reconnected) PushEvent(name, TransportEvent::Kind::kPeerConnected, Status::Ok());
}

void UcxTransport::PeerDown(const PeerId& name, IoPeer* p, ucs_status_t why) {
  const Status status =
      UnavailableError(Prefix() + fmt::format("peer '{}' at {} disconnected: {}", name,
                                              p->shared->address, ucs_status_string(why)));
  std::deque<Message> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p->shared->state = PeerState::kDisconnected;
    p->shared->last_error = status;
    dropped.swap(p->shared->outbox);
    space_.notify_all();
  }
  PushEvent(name, TransportEvent::Kind::kPeerDisconnected, status);
}

void UcxTransport::PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status) {
  std::lock_guard<std::mutex> lock(in_mu_);
  if (in_closed_) return;
  inbox_.push_back(Incoming{Received{peer, TransportEvent{kind, peer, std::move(status)}}, 0});
  in_cv_.notify_one();
}

void UcxTransport::Malformed(const std::string& what) {
  malformed_dropped_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (log_limiter_.Allow("malformed", &suppressed)) {
    BP_LOG_WARN("{}dropped malformed traffic: {}{}", Prefix(), what,
                suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
  }
}

void UcxTransport::Refuse(InConn* c, const std::string& what) {
  Malformed(fmt::format("{}; closing the connection{}", what,
                        c->hello ? fmt::format(" from '{}'", c->name) : ""));
  c->refused = true;
  refused_.emplace_back(c->id, what);
}

void UcxTransport::RefuseHello(InConn* c, const PeerId& claimed, const std::string& why) {
  auth_refused_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  // The claimed name is the peer's text: escaped ({:?}), and one limiter key per name and reason
  // (the limiter bounds how many it remembers).
  if (log_limiter_.Allow(fmt::format("hello:{}:{}", why, claimed), &suppressed)) {
    BP_LOG_WARN("{}refused a connection claiming to be {:?}: {}{}", Prefix(), claimed, why,
                suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
  }
  c->refused = true;
  refused_.emplace_back(c->id, why);
}

// ---- receiving -----------------------------------------------------------------------------

ucs_status_t UcxTransport::OnAm(const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ucp_ep_h reply =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  if (reply != nullptr && IsClosing(reply)) return UCS_OK;  // we closed it: nothing is expected
  StatusOr<AmHeader> h = ParseAmHeader(header, header_length);
  if (!h.ok()) {
    Malformed(h.status().message());
    return UCS_OK;  // a rendezvous descriptor is dropped
  }
  if (h->type == AmType::kCredit) {
    auto out = out_by_ep_.find(reply);
    if (out == out_by_ep_.end()) {
      Malformed("a credit on no connection this endpoint opened");
      return UCS_OK;
    }
    IoPeer& p = io_peers_.at(out->second);
    p.credits += h->seq;
    if (!p.welcomed) PeerUp(out->second, &p);
    return UCS_OK;
  }
  auto in = in_by_ep_.find(reply);
  if (in == in_by_ep_.end()) {
    Malformed(reply == nullptr ? "an Active Message without a reply endpoint"
                               : "an Active Message on no connection this endpoint accepted");
    return UCS_OK;
  }
  InConn& c = in_conns_.at(in->second);
  if (c.refused) return UCS_OK;  // counted when it was refused; closed after this progress
  if (h->type == AmType::kHello) {
    OnHello(&c, data, length, rndv);
    return UCS_OK;
  }
  const uint8_t* frame_header =
      h->type == AmType::kFrame ? static_cast<const uint8_t*>(header) + kAmHeaderBytes : nullptr;
  return OnData(&c, *h, frame_header, data, length, rndv);
}

void UcxTransport::SupersedeOlderConnections(const InConn& newer) {
  for (auto& [id, older] : in_conns_) {
    if (id == newer.id || !older.hello || older.refused || older.name != newer.name) continue;
    identity_refused_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("superseded:" + newer.name, &suppressed)) {
      BP_LOG_WARN("{}a newer connection from {:?} took over its name: closing the older one{}",
                  Prefix(), newer.name,
                  suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    older.refused = true;  // what still arrives on it is dropped; closed after this progress
    refused_.emplace_back(id, "superseded");
  }
}

void UcxTransport::OnHello(InConn* c, const void* data, size_t length, bool rndv) {
  if (c->hello) {
    Malformed(fmt::format("a second HELLO from '{}'", c->name));
    return;
  }
  if (rndv) {
    Refuse(c, fmt::format("a HELLO of {} bytes", length));
    return;
  }
  StatusOr<HelloPayload> hello = ParseHello(data, length);
  if (!hello.ok()) {
    Refuse(c, hello.status().message());
    return;
  }
  if (auth_) {
    const HelloAuth::Verdict verdict = auth_->Check(hello->name, hello->token);
    if (verdict != HelloAuth::Verdict::kAccepted) {
      RefuseHello(c, hello->name, HelloAuth::Describe(verdict));
      return;
    }
  } else if (!hello->token.empty()) {
    // A peer under kCurve: every node of a cluster needs the same mode, so the mismatch fails
    // here as it does between zmq nodes, rather than running on with unauthenticated names.
    RefuseHello(c, hello->name,
                "a token: the peer runs security mode curve, this endpoint none (is security.mode "
                "the same on every node?)");
    return;
  }
  c->name = hello->name;
  c->hello = true;
  SupersedeOlderConnections(*c);
  c->granted = options_.max_queued_per_peer;
  SendControl(c->ep, AmType::kCredit, c->granted, "");
}

ucs_status_t UcxTransport::OnData(InConn* c, const AmHeader& h, const uint8_t* frame_header,
                                  void* data, size_t length, bool rndv) {
  if (!c->hello) {
    Malformed("a message before the HELLO");
    return UCS_OK;
  }
  const uint64_t max = options_.max_message_bytes;
  if (h.header_bytes > max || h.largest_part > max) {
    Refuse(c, fmt::format("a part of {} bytes from '{}', above max_message_bytes ({})",
                          std::max<uint64_t>(h.header_bytes, h.largest_part), c->name, max));
    return rndv ? UCS_ERR_EXCEEDS_LIMIT : UCS_OK;
  }
  if (h.seq < c->next_deliver || h.seq >= c->granted || c->slots.count(h.seq) != 0) {
    Refuse(c, fmt::format("message {} from '{}' is out of sequence or beyond its credits ({})",
                          h.seq, c->name, c->granted));
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  const bool frame = h.type == AmType::kFrame;
  // kFrame: the frame is the prefix (from the AM header, after the message header) and the data.
  const size_t prefix = frame ? h.prefix_bytes : 0;
  const uint64_t total = uint64_t{prefix} + length;
  if (frame ? (length == 0 || total > h.largest_part) : length > MaxDataBytes(h)) {
    Refuse(c, fmt::format("{} bytes of data from '{}' for {} frames of at most {} bytes", total,
                          c->name, h.frame_count, h.largest_part));
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  std::shared_ptr<uint8_t> block = blocks_->Get(total);
  if (total != 0 && block == nullptr) {
    Refuse(c, fmt::format("no memory for a message of {} bytes from '{}'", total, c->name));
    return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
  }
  c->slots[h.seq];  // its place in the order
  NoteGap(c);
  std::string message_header;
  if (frame) {
    message_header.assign(reinterpret_cast<const char*>(frame_header), h.header_bytes);
    if (prefix != 0) std::memcpy(block.get(), frame_header + h.header_bytes, prefix);
  }
  if (!rndv) {
    if (length != 0) std::memcpy(block.get() + prefix, data, length);
    if (frame) {
      CompleteFrame(c, h.seq, std::move(message_header), std::move(block), total);
    } else {
      Complete(c, h.seq, h, std::move(block), length);
    }
    return UCS_OK;
  }
  // Rendezvous: the bytes go straight into the block the frames will be views of.
  auto* op = new RecvOp();
  op->transport = this;
  op->conn = c->id;
  op->header = h;
  op->block = std::move(block);
  op->size = total;
  op->message_header = std::move(message_header);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(1);
  param.cb.recv_am = &RecvCallback;
  param.user_data = op;
  bool finished = false;
  op->finished_in_call = &finished;
  recv_ops_.insert(op);
  ucs_status_ptr_t r =
      ucp_am_recv_data_nbx(worker_, data, op->block.get() + prefix, length, &param);
  if (finished) return UCS_OK;  // RecvCallback ran inside the call: op is gone
  op->finished_in_call = nullptr;
  if (r == nullptr) {
    OnRecvDone(op, UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    OnRecvDone(op, UCS_PTR_STATUS(r));
  }  // else in flight: RecvCallback finishes it
  return UCS_OK;
}

void UcxTransport::OnRecvDone(RecvOp* op, ucs_status_t status) {
  std::unique_ptr<RecvOp> owned(op);
  if (op->finished_in_call != nullptr) *op->finished_in_call = true;
  recv_ops_.erase(op);
  auto it = in_conns_.find(op->conn);
  if (it == in_conns_.end()) return;  // the connection ended meanwhile
  InConn& c = it->second;
  if (status != UCS_OK) {
    BP_LOG_DEBUG("{}receiving message {} from '{}' failed: {}", Prefix(), op->header.seq, c.name,
                 ucs_status_string(status));
    Slot& s = c.slots[op->header.seq];
    s.done = true;
    ++c.dropped_unreturned;
    Deliver(&c);
    return;
  }
  if (op->header.type == AmType::kFrame) {
    CompleteFrame(&c, op->header.seq, std::move(op->message_header), std::move(op->block),
                  op->size);
  } else {
    Complete(&c, op->header.seq, op->header, std::move(op->block), op->size);
  }
}

void UcxTransport::CompleteFrame(InConn* c, uint64_t seq, std::string message_header,
                                 std::shared_ptr<uint8_t> block, size_t size) {
  Slot& slot = c->slots[seq];
  slot.done = true;
  slot.delivered = true;
  slot.msg.header = std::move(message_header);
  uint8_t* data = block.get();
  slot.msg.frames.push_back(Buffer::Borrow(data, size, std::move(block)));
  Deliver(c);
}

void UcxTransport::Complete(InConn* c, uint64_t seq, const AmHeader& h,
                            std::shared_ptr<uint8_t> block, size_t size) {
  Slot& slot = c->slots[seq];
  slot.done = true;
  StatusOr<ParsedData> parsed = ParseData(h, block.get(), size, options_.max_message_bytes);
  if (!parsed.ok()) {
    Malformed(fmt::format("message {} from '{}': {}", seq, c->name, parsed.status().message()));
    ++c->dropped_unreturned;
    Deliver(c);
    return;
  }
  slot.delivered = true;
  slot.msg.header.assign(reinterpret_cast<const char*>(parsed->header), parsed->header_bytes);
  slot.msg.frames.reserve(parsed->frames.size());
  for (size_t i = 0; i < parsed->frames.size(); ++i) {
    slot.msg.frames.push_back(Buffer::Borrow(parsed->frames[i], parsed->frame_sizes[i], block));
  }
  block.reset();  // the frames own it now
  Deliver(c);
}

void UcxTransport::NoteGap(InConn* c) {
  const bool gap = !c->slots.empty() && c->slots.begin()->first != c->next_deliver;
  if (!gap) {
    if (c->gap_since != Clock::time_point{}) gapped_.erase(c->id);
    c->gap_since = {};
  } else if (c->gap_since == Clock::time_point{}) {
    c->gap_since = Clock::now();
    gapped_.insert(c->id);
  }
}

void UcxTransport::CloseGapped(Clock::time_point now, milliseconds* wait) {
  const milliseconds limit = options_.sequence_gap_timeout;
  for (uint64_t id : gapped_) {
    InConn& c = in_conns_.at(id);
    if (c.refused || c.slots.empty()) continue;
    const auto due = c.gap_since + limit;
    if (now < due) {
      *wait = std::min(*wait, std::chrono::ceil<milliseconds>(due - now));
      continue;
    }
    Refuse(&c, fmt::format("message {} from '{}' never arrived while message {} did ({} ms): the "
                           "connection lost it",
                           c.next_deliver, c.name, c.slots.rbegin()->first, limit.count()));
  }
}

void UcxTransport::ExpireStalledSends(Clock::time_point now, milliseconds* wait) {
  // A scan of every op in flight, at most every kSendCheckEvery (not at each wake-up): a
  // stalled send is found within that much of its limit.
  if (now < next_send_check_) {
    *wait = std::min(*wait, std::chrono::ceil<milliseconds>(next_send_check_ - now));
    return;
  }
  next_send_check_ = now + kSendCheckEvery;
  const milliseconds limit = options_.send_complete_timeout;
  std::set<ucp_ep_h> stalled;
  bool pending = false;
  for (const SendOp* op : send_ops_) {
    if (now < op->posted + limit) {
      pending = true;
    } else {
      stalled.insert(op->ep);
    }
  }
  if (pending) *wait = std::min(*wait, kSendCheckEvery);
  for (ucp_ep_h ep : stalled) {
    std::string whom;
    if (auto in = in_by_ep_.find(ep); in != in_by_ep_.end()) {
      whom = fmt::format("the connection from '{}'", in_conns_.at(in->second).name);
    } else if (auto out = out_by_ep_.find(ep); out != out_by_ep_.end()) {
      whom = fmt::format("'{}'", out->second);
    } else {
      continue;  // closed already; UCX ends its sends
    }
    BP_LOG_WARN(
        "{}a send to {} did not complete within {} ms (send_complete_timeout): closing "
        "the connection",
        Prefix(), whom, limit.count());
    HandleEpError(ep, UCS_ERR_TIMED_OUT);
  }
}

void UcxTransport::Deliver(InConn* c) {
  std::vector<Message> ready;
  while (!c->slots.empty() && c->slots.begin()->first == c->next_deliver &&
         c->slots.begin()->second.done) {
    if (c->slots.begin()->second.delivered)
      ready.push_back(std::move(c->slots.begin()->second.msg));
    c->slots.erase(c->slots.begin());
    ++c->next_deliver;
  }
  NoteGap(c);
  if (ready.empty()) return;
  uint64_t bytes = 0;
  for (const Message& m : ready) bytes += m.header.size() + m.payload_bytes();
  messages_received_.fetch_add(ready.size(), std::memory_order_relaxed);
  bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(in_mu_);
  if (in_closed_) return;
  credit_[c->id].queued += ready.size();
  for (Message& m : ready) inbox_.push_back(Incoming{Received{c->name, std::move(m)}, c->id});
  in_cv_.notify_one();
}

}  // namespace

StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options) {
  auto t = std::make_unique<UcxTransport>(options);
  Status s = t->Start();
  if (!s.ok()) return s;  // ~UcxTransport releases what Start created
  return std::unique_ptr<Transport>(std::move(t));
}

StatusOr<std::string> DescribePeerEndpoint(Transport* t, const PeerId& peer,
                                           std::chrono::milliseconds timeout) {
  auto* ucx = dynamic_cast<UcxTransport*>(t);
  if (ucx == nullptr) return InvalidArgumentError("DescribePeerEndpoint: not a ucx endpoint");
  return ucx->DescribePeer(peer, timeout);
}

Status UcxViable() {
  // Probed once per process: creating a context reads the machine's devices.
  static const Status kViable = [] {
    StatusOr<ucp_context_h> context = NewContext({});
    if (!context.ok()) return context.status();
    ucp_cleanup(*context);
    return Status::Ok();
  }();
  return kViable;
}

}  // namespace bitpush::transport::ucx_backend
