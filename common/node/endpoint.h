// NodeEndpoint: the one endpoint of a bitpush process (scheduler, server, worker engine). It
// owns the transport (created by the transport factory from the listen address's scheme, or
// injected by a test) and the receive loop, learns each message's sender from the transport,
// parses the header of its plane and dispatches it by message type to the handlers the
// node's parts registered: the control-plane client (scheduler/scheduler_client.h) or the
// scheduler itself, the server (server/server.h), the worker engine (worker/engine.h).
// Adding a message type means registering a handler, not editing someone else's loop.
//
// Planes. A message is control-plane when the scheduler is at either end (its header is a
// v1::ControlMessage) and data-plane otherwise (worker <-> server; its header is a
// v1::DataHeader and its frames are payloads). Each handler is registered for one message
// type and the set of roles that may send it; the sender's role comes from the transport's
// name for it (common/node/identity.h), never from a payload field. A message from another
// role, one whose header does not parse and one of a type nobody handles go to the plane's
// refused / malformed / unhandled handler (default: logged and counted). Refused and malformed
// messages are all counted, but the handler (which logs) hears of at most one per 10 s per
// sender and reason, so a peer sending garbage in a loop cannot grow the log.
//
// Transports. The main transport listens at listen_address and carries the control plane, and
// the data plane too unless the node has a data transport: a second transport (options
// data_listen_address, e.g. ucx:// under cluster.transport ucx) created by the same factory with
// the same name, security and limits. Then Connect/Disconnect/Send* to a server or worker (from
// a server or worker) go on the data transport, everything else on the main one. Messages
// that arrive on the data transport must be data-plane: one from the scheduler (or any
// control-plane message) is refused and counted (stats().refused); so is a data-plane message
// that arrives on the main transport of a node with a data transport (every server and worker
// of such a cluster has one). Transport events are not refused.
//
// Loop. Start() runs the loop on the endpoint's own I/O thread ("bp-io"); a process that owns
// its loop (the scheduler) calls Poll() instead. Timers registered with AddTimer run on the
// loop before every wait and say when they next need to run; the loop blocks in the
// transport until then (at most idle_wait). A data transport has its own receive thread
// ("bp-io-data", started by Start() or the first Poll()) that waits in the data transport (at
// most idle_wait) and dispatches into the same handlers under the same dispatch lock, so
// handlers still run one at a time. When either transport fails, the failure handlers are
// called once (whichever fails first) and that transport's loop ends.
//
// Holding a plane. Messages of a held plane (HoldPlane) are kept in arrival order and
// dispatched, in order and before anything newer, by ReleasePlane — for a server that must
// not see workers' data before its own assignment arrived.
//
// Ownership: the endpoint owns both transports and both threads. Its owner (Server, Engine,
// Scheduler, or a SchedulerClient created without one) closes it before destroying the objects
// whose handlers it calls; Close closes both transports and joins both threads.
// Thread-safety: register handlers before Start()/the first Poll(); afterwards Connect, Send*,
// ReleasePlane, Close and stats() may be called from any thread. Handlers and timers run on
// the loop's thread or the data receive thread, one at a time (under the dispatch lock); they
// may send, but must not call Close, ReleasePlane or Poll, and must not block for long.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/node/identity.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "proto/bitpush/v1/control.pb.h"

namespace bitpush::node {

enum class Plane { kControl, kData };
std::string_view PlaneName(Plane plane);  // "control", "data"

// Who sent a message, as the transport reported it.
struct Sender {
  transport::PeerId peer;            // the transport's name for the sender
  std::optional<NodeIdentity> node;  // the node that name belongs to; nullopt: no node's name

  bool Is(v1::Role role) const { return node.has_value() && node->role == role; }
};

struct NodeEndpointOptions {
  // This node: ROLE_SCHEDULER, or ROLE_SERVER / ROLE_WORKER and its rank. Names the endpoint
  // (kSchedulerPeerId / NodePeerId) and decides each message's plane.
  NodeIdentity self;
  // The address to listen on; its scheme picks the transport backend (transport/factory.h).
  std::string listen_address;
  // The cluster's transport setting (cluster.transport), checked against the scheme; "" =
  // whatever the scheme says.
  std::string backend;
  // inproc backend only: the hub of the in-process cluster.
  std::shared_ptr<transport::InprocHub> inproc_hub;
  // The node as logs name it ("server 0"); "" = derived from `self`.
  std::string label;
  // The clock timers are scheduled on; null = SystemClock().
  std::shared_ptr<const Clock> clock;
  // Longest wait of the loop while no timer is due (Close wakes it at once in any case).
  std::chrono::milliseconds idle_wait{1000};
  // How the node proves who it is and learns who sent each message, and the bounds on what a
  // peer can make it hold (transport.h; config/node_security.h fills them from the config).
  transport::TransportSecurity security;
  uint64_t max_message_bytes = uint64_t{1} << 32;
  size_t max_connections = 1024;
  // The data plane's own listen address ("ucx://HOST:PORT"); its scheme picks the data
  // transport's backend. "" = no data transport: the main transport carries both planes.
  std::string data_listen_address;
  // The data transport's UCX settings (TransportOptions::ucx_config: {"TLS", "tcp"}, ...).
  std::map<std::string, std::string> data_ucx_config;
};

struct EndpointStats {
  uint64_t dispatched = 0;              // messages handed to a registered handler
  uint64_t unhandled = 0;               // messages of a type nobody registered
  uint64_t refused = 0;                 // messages from a role that may not send their type, and
                                        // messages on the other plane's transport
  uint64_t malformed = 0;               // messages whose header did not parse
  uint64_t events = 0;                  // transport events dispatched
  transport::TransportStats transport;  // the main transport
  transport::TransportStats data_transport;  // the data transport (zero when there is none)
};

class NodeEndpoint {
 public:
  using ControlHandler = std::function<void(const Sender&, const v1::ControlMessage&)>;
  using DataHandler =
      std::function<void(const Sender&, v1::DataHeader& header, transport::Message& message)>;
  using EventHandler = std::function<void(const Sender&, const transport::TransportEvent&)>;
  // Why a message was not dispatched: its header did not parse, or its sender's role may not
  // send its type.
  enum class Rejection { kMalformed, kRefusedSender };
  // A message the plane's handlers did not take; `detail` names its type where known.
  using RejectHandler = std::function<void(const Sender&, const transport::Message&, Rejection,
                                           std::string_view detail)>;
  // Runs on the loop before every wait; returns the time by which it must run again.
  using Timer = std::function<Clock::time_point(Clock::time_point now)>;
  using FailureHandler = std::function<void(const Status&)>;

  // Binds the endpoint (or takes `transport`, whose name must be this node's PeerId), and the
  // data transport when options.data_listen_address is set (or takes `data_transport`, e.g. a
  // test's fault-injecting wrapper, named the same; the scheduler has none).
  // InvalidArgument for a bad address or name; the transport's error otherwise.
  static StatusOr<std::unique_ptr<NodeEndpoint>> Create(
      NodeEndpointOptions options, std::unique_ptr<transport::Transport> transport = nullptr,
      std::unique_ptr<transport::Transport> data_transport = nullptr);

  ~NodeEndpoint();  // Close()
  NodeEndpoint(const NodeEndpoint&) = delete;
  NodeEndpoint& operator=(const NodeEndpoint&) = delete;

  // ---- registration (before Start / the first Poll) ----

  // Control-plane messages of `kind`, from the senders common/node/authorization.h lists for
  // this node's role (a kind the table does not list for it is a bug: BP_CHECK). One handler
  // per kind.
  void OnControl(v1::ControlMessage::BodyCase kind, ControlHandler handler);
  // Data-plane messages with `op`, from the senders the table lists. One handler per op.
  void OnData(v1::DataHeader::Op op, DataHandler handler);
  // The same with explicit senders, for tests of the endpoint itself; nodes use the table.
  void OnControl(v1::ControlMessage::BodyCase kind, RoleSet senders, ControlHandler handler);
  void OnData(v1::DataHeader::Op op, RoleSet senders, DataHandler handler);
  // Control / data messages of a type no handler is registered for (default: logged, counted).
  void OnUnhandledControl(ControlHandler handler);
  void OnUnhandledData(DataHandler handler);
  // Messages of `plane` refused for their sender or their header (default: logged, counted).
  void OnRejected(Plane plane, RejectHandler handler);
  // Transport events about peers of `plane` (default: logged at debug level).
  void OnEvent(Plane plane, EventHandler handler);
  void AddTimer(Timer timer);
  // Called once when the transport fails under the loop (not after Close).
  void OnFailure(FailureHandler handler);
  // Keeps `plane`'s messages, in order, until ReleasePlane(plane).
  void HoldPlane(Plane plane);

  // ---- the loop ----

  // Starts the I/O thread. Call once.
  void Start();
  // Waits at most `timeout` for one message or event and dispatches it on the caller's thread.
  // OK when one was dispatched or none came; the transport's error (Cancelled after Close)
  // otherwise. For owners that run their own loop; not together with Start().
  Status Poll(std::chrono::milliseconds timeout);
  // Dispatches what the plane held, in order, on the caller's thread; later messages of the
  // plane are dispatched as they come.
  void ReleasePlane(Plane plane);

  // ---- sending ----

  Status Connect(const transport::PeerId& peer, const std::string& address);
  // `peer` is an alias of the node `key_owner`, which it must prove to be (Transport::Connect).
  Status Connect(const transport::PeerId& peer, const std::string& address,
                 const transport::PeerId& key_owner);
  void Disconnect(const transport::PeerId& peer);
  Status Send(const transport::PeerId& peer, transport::Message message);
  Status SendControl(const transport::PeerId& peer, const v1::ControlMessage& message);
  Status SendData(const transport::PeerId& peer, const v1::DataHeader& header,
                  std::vector<transport::Buffer> frames = {});

  // Closes the transport (a blocked Poll returns Cancelled) and joins the I/O thread: no
  // handler runs after Close returns. Idempotent.
  void Close();

  const NodeIdentity& self() const { return options_.self; }
  const transport::PeerId& name() const;
  // The resolved listen address (the real port when 0 was asked).
  std::string address() const;
  // The data transport's resolved listen address; "" when there is no data transport.
  std::string data_address() const;
  const std::string& label() const { return label_; }
  const std::shared_ptr<const Clock>& clock() const { return clock_; }
  EndpointStats stats() const;

 private:
  struct ControlRoute {
    RoleSet senders;
    ControlHandler handler;
  };
  struct DataRoute {
    RoleSet senders;
    DataHandler handler;
  };

  NodeEndpoint(NodeEndpointOptions options, std::unique_ptr<transport::Transport> transport,
               std::unique_ptr<transport::Transport> data_transport);

  void Loop();
  // The data transport's receive loop (thread bp-io-data).
  void DataLoop();
  void StartDataLoop();
  // Calls the failure handlers unless they were called before (caller holds dispatch_mu_).
  void FailLocked(const Status& failure);
  Plane PlaneOf(const Sender& sender) const;
  // The transport that carries messages to `peer`: the data transport for a server or worker
  // (when this node is one and has a data transport), the main one otherwise.
  transport::Transport& TransportFor(const transport::PeerId& peer) const;
  static bool May(RoleSet senders, const Sender& sender);
  // Dispatches one received message or event; `on_data`: it came on the data transport
  // (caller holds dispatch_mu_).
  void DispatchLocked(transport::Received& received, bool on_data = false);
  void DispatchControlLocked(const Sender& sender, transport::Message& message);
  void DispatchDataLocked(const Sender& sender, transport::Message& message);
  void RejectLocked(Plane plane, const Sender& sender, const transport::Message& message,
                    Rejection why, std::string_view detail);

  const NodeEndpointOptions options_;
  const std::string label_;
  const std::shared_ptr<const Clock> clock_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<transport::Transport> data_transport_;  // null: none

  // Registration: written before the loop starts, read-only afterwards.
  std::map<int, ControlRoute> control_routes_;
  std::map<int, DataRoute> data_routes_;
  ControlHandler unhandled_control_;
  DataHandler unhandled_data_;
  RejectHandler rejected_[2];
  EventHandler events_[2];
  std::vector<Timer> timers_;
  std::vector<FailureHandler> failure_handlers_;
  std::atomic<bool> started_{false};  // registration closes once the loop runs

  // Dispatch: one handler at a time, in order.
  std::mutex dispatch_mu_;
  bool held_[2] = {false, false};                 // guarded by dispatch_mu_
  std::deque<transport::Received> held_msgs_[2];  // guarded by dispatch_mu_

  LogLimiter reject_limiter_;  // guarded by dispatch_mu_
  bool failed_ = false;        // the failure handlers ran; guarded by dispatch_mu_

  std::atomic<bool> closed_{false};
  std::thread io_thread_;
  std::mutex data_thread_mu_;       // starting vs joining data_thread_
  bool data_loop_started_ = false;  // guarded by data_thread_mu_
  std::thread data_thread_;         // guarded by data_thread_mu_

  std::atomic<uint64_t> dispatched_{0};
  std::atomic<uint64_t> unhandled_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> events_count_{0};
};

}  // namespace bitpush::node
