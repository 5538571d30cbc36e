// The zmq endpoint (ZmqTransport): the object behind CreateZmqTransport (transport.h), private
// to the backend. It owns one ZeroMQ context and every socket in it, the I/O thread, and the
// state callers share with that thread. Its methods are defined by job, each file saying which
// thread runs them:
//   transport.cc     the caller API (Connect, Disconnect, Send, Receive, Close, stats): any thread
//   listen.cc        Start: the context, the listening ROUTER, socket options and monitors
//   io_thread.cc     the I/O thread: its poll loop, peers' sockets (watched through
//                    socket_watch.h), outboxes handed to ZeroMQ, peers reported up and down
//   receive.cc       reading the ROUTERs into the inbox (framing.h), connection accounting, and
//                    (Receive's thread) opening sealed messages
//   curve.cc         what security mode curve adds: the keys, the ZAP handler, both ends of the
//                    sealed-lane handshake (lane.h)
// The socket plumbing is in sockets.h, the queue to Receive in inbox.h.
//
// Thread-safety: as Transport (transport.h). Members are grouped by who touches them: callers
// and the I/O thread share what mu_ guards; the I/O thread alone owns the sockets once Start
// returned (ZeroMQ sockets are not thread-safe), and hands Receive its work through inbox_.
#pragma once

#include <zmq.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/log_limiter.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "common/transport/zmq/inbox.h"
#include "common/transport/zmq/lane.h"
#include "common/transport/zmq/socket_watch.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {

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

// Hands a peer's sockets (created by the calling thread) to the I/O thread, or retires them.
struct Command {
  enum class Kind { kAdd, kRemove };
  Kind kind;
  PeerId peer;
  std::shared_ptr<PeerShared> shared;
  void* dealer = nullptr;
  void* monitor = nullptr;
};

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

// kCurve: a lane this endpoint opened for a sender (I/O thread only).
struct LaneIn {
  std::string ticket;
  bool ticket_used = false;
  std::shared_ptr<LaneRx> rx;
};

class ZmqTransport final : public Transport {
 public:
  explicit ZmqTransport(const TransportOptions& options) : options_(options) {}
  ~ZmqTransport() override;

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
  void Wake();

  // listen.cc: socket set-up (Start's sockets, Connect's and OpenLane's DEALERs).
  Status OpenMonitor(void* socket, int events, void** monitor);
  // What every listening ROUTER (the main one, the lane one) and every sending DEALER (to a
  // peer, to its lane) share: bounds, limits, timeouts, and the ROUTER's monitor.
  Status SetListenerOptions(void* router, int64_t max_part, const std::string& address,
                            void** monitor);
  void SetSenderOptions(void* dealer, const std::string& address);

  // io_thread.cc: the I/O thread's loop, its peers and their outgoing messages.
  void IoLoop();
  void ApplyCommands(std::deque<Command>* commands);
  // Looks at a peer's sockets (it signalled or was used): reads what is ready.
  void ServicePeer(const PeerId& name, IoPeer* p);
  // Adds a peer's new socket to watch_ (an error is logged).
  void Watch(const PeerId& name, void* socket);
  void CloseIoPeer(IoPeer* p);
  void CollectOutboxes();
  void FlushPending(const PeerId& name, IoPeer* p);
  void ReadPeerMonitor(const PeerId& name, IoPeer* p);
  // The peer's connection (kNone: its DEALER; kCurve: its lane) is established / dropped.
  void PeerUp(const PeerId& name, IoPeer* p);
  void PeerDown(const PeerId& name, IoPeer* p);
  void PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status);

  // receive.cc: the I/O thread's reading of the ROUTERs; OpenIncoming runs on Receive's.
  // Reads the main ROUTER (lane == false) or, under kCurve, the lane ROUTER.
  void ReadRouter(bool lane);
  // kCurve: the sender of a received message (its key's PeerId), or "" when the message is
  // refused (counted); kNone: the routing id.
  PeerId SenderOf(const PeerId& routing_id, zmq_msg_t* first_part);
  void ReadRouterMonitor(void* monitor, bool lane);
  // Receive's thread: opens a sealed message in place into in->r; an error (counted, logged)
  // when it is refused or is not a sealed bitpush message.
  Status OpenIncoming(Incoming* in);

  // curve.cc: security mode curve (Start, then the I/O thread).
  Status LoadCurveKeys();
  Status BindLaneRouter(const std::string& bind_address);
  void AnswerZap();
  // A sender asked for a lane (lane.h step 2): opens it and answers with the offer.
  void IssueLane(const PeerId& from, const std::string& routing_id, uint64_t request);
  // Lane socket: the sender a lane connection was admitted for, or "" (counted).
  PeerId LaneSenderOf(zmq_msg_t* first_part);
  // The peer's answers on its CURVE connection (offers).
  void ReadDealer(const PeerId& name, IoPeer* p);
  void RequestLane(const PeerId& name, IoPeer* p);
  void OpenLane(const PeerId& name, IoPeer* p, const LaneOffer& offer);
  void CloseLane(IoPeer* p);
  void ReadLaneMonitor(const PeerId& name, IoPeer* p);

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
  Inbox inbox_{options_.max_queued_per_peer};

  // I/O thread only.
  std::map<PeerId, IoPeer> io_peers_;
  SocketWatch watch_;                  // their sockets (opened by Start)
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

}  // namespace bitpush::transport::zmq_backend
