// The ucx endpoint (UcxTransport): the object behind CreateUcxTransport (transport.h), private to
// the backend. It owns one UCP context, worker and listener, every UCP endpoint, the progress
// thread, and the state callers share with that thread. Its methods are defined by job, each
// file saying which thread runs them:
//   transport.cc     the caller API (Connect, Disconnect, Send, Receive, Close, stats,
//                    DescribePeer): any thread
//   worker.cc        Start (the worker, its Active Message handler, the listener) and the
//                    progress thread's loop and shutdown
//   connections.cc   client endpoints to peers (connect, reconnect, up and down) and the
//                    connections the listener accepts; closing endpoints
//   send.cc          outboxes handed to UCX within the peer's credits, their completion, stalled
//                    sends, and credits returned to senders
//   receive.cc       Active Messages in: the HELLO (hello_auth.h), messages (wire.h) into blocks
//                    of the block pool, put in order per connection and into the inbox
// The UCP context and addresses are in context.h, Receive's queue and the credits it owes in
// inbox.h.
//
// Thread-safety: as Transport (transport.h). Members are grouped by who touches them: callers
// and the progress thread share what mu_ guards; the progress thread alone uses the worker and
// every UCP object once Start returned (UCS_THREAD_MODE_SERIALIZED), and hands Receive its
// messages through inbox_.
#pragma once

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log_limiter.h"
#include "common/status.h"
#include "common/transport/block_pool.h"
#include "common/transport/transport.h"
#include "common/transport/ucx/context.h"
#include "common/transport/ucx/hello_auth.h"
#include "common/transport/ucx/inbox.h"
#include "common/transport/ucx/wire.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Reconnect attempts to a peer: the first after kRetryMin, then twice as long up to kRetryMax.
inline constexpr milliseconds kRetryMin{100};
inline constexpr milliseconds kRetryMax{1000};
// What the receive block pool keeps for reuse at most (block_pool.h): the blocks of a round
// of large messages in flight, whose pages then stay mapped.
inline constexpr size_t kKeptBlockBytes = size_t{256} << 20;

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

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& options) : options_(options) {}
  ~UcxTransport() override;

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

  // worker.cc: the progress thread's loop.
  void Loop();
  void Progress();
  void AnswerQueries(std::vector<std::shared_ptr<EpQuery>>* queries);
  // The connection requests and endpoint failures UCX reported inside ucp_worker_progress, and
  // the connections refused meanwhile, handled outside it.
  void HandleDeferred();
  void PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status);
  void Shutdown();

  // connections.cc: client endpoints (one per Connect()ed peer) and accepted connections.
  void ApplyCommands(std::deque<Command>* commands);
  void StartConnect(const PeerId& name, IoPeer* p);
  void ReconnectDue(Clock::time_point now, milliseconds* wait);
  void DropIoPeer(IoPeer* p, bool force);
  void AcceptConnection(ucp_conn_request_h request);
  void CloseInConn(uint64_t id, bool force);
  void HandleEpError(ucp_ep_h ep, ucs_status_t status);
  void PeerUp(const PeerId& name, IoPeer* p);
  void PeerDown(const PeerId& name, IoPeer* p, ucs_status_t why);
  void CloseEp(ucp_ep_h ep, bool force);
  void PollClosing();
  bool IsClosing(ucp_ep_h ep) const {
    return std::any_of(closing_.begin(), closing_.end(),
                       [ep](const auto& c) { return c.second == ep; });
  }

  // send.cc: outboxes to UCX, and the completion of every send.
  void FlushOutboxes();
  void ReturnCredits();
  void SendData(const PeerId& name, IoPeer* p, Message msg);
  void SendControl(ucp_ep_h ep, AmType type, uint64_t seq, std::string payload, bool hello = false);
  void Post(ucp_ep_h ep, SendOp* op, const void* buffer, size_t count, bool iov);
  // Closes every connection with a send older than send_complete_timeout (HandleEpError: the
  // peer is reported disconnected and reconnected later); lowers *wait to the next such time.
  void ExpireStalledSends(Clock::time_point now, std::chrono::milliseconds* wait);
  static constexpr std::chrono::milliseconds kSendCheckEvery{100};
  Clock::time_point next_send_check_{};  // progress thread

  // receive.cc: Active Messages in, in order, into the inbox.
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
  // Notes when a connection's next message goes missing behind later ones (NoteGap), and closes
  // connections whose gap outlived options_.sequence_gap_timeout; lowers *wait to the next due.
  // gapped_ holds the connections with a gap, so the loop looks at those only.
  void NoteGap(InConn* c);
  void CloseGapped(Clock::time_point now, milliseconds* wait);
  void Malformed(const std::string& what);
  void Refuse(InConn* c, const std::string& what);
  void RefuseHello(InConn* c, const PeerId& claimed, const std::string& why);

  const TransportOptions options_;
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
  Inbox inbox_{options_.max_queued_per_peer};

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

}  // namespace bitpush::transport::ucx_backend
