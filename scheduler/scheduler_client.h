// SchedulerClient: a server's or worker's side of the control plane — what every node
// embeds to register with the scheduler, learn its assignment, join barriers, exchange
// heartbeats and hear about failures and shutdown.
//
// Life of a client:
//   Create(o, endpoint) attaches to the node's NodeEndpoint (common/node/endpoint.h): registers
//                      the control-plane handlers and the heartbeat timer on it; the node
//                      (Server, Engine) then registers its data-plane handlers and starts it.
//   Create(o)          a node that is only a control-plane client (tests, bitpush-test-node):
//                      binds its own endpoint (its YAML address at its rank, PeerId "server:0"
//                      / "worker:1"), attaches and starts it.
//   Register()         sends RegisterRequest, retrying with exponential back-off while the
//                      scheduler does not answer (it may start later), at most
//                      cluster.startup_timeout; then waits (bounded) for the Assignment.
//   Barrier(group)     blocks until the scheduler releases the group's next barrier.
//   Done()             (workers) this worker finished; once every worker is done the
//                      scheduler shuts the cluster down cleanly.
//   WaitForShutdown()  OK on a clean shutdown; the error otherwise.
//
// Failures are sticky: the first error (refused registration, a node declared dead, an
// error shutdown, the scheduler silent for heartbeat_timeout, a barrier that timed out) is
// kept, every later call returns it, and SchedulerClientOptions::on_error is called once.
//
// One endpoint per node carries the control plane and the data plane; the client handles the
// control plane only (messages from the scheduler), the node's other parts register their own
// handlers on the same endpoint.
//
// Thread-safety: every method may be called from any thread; Register, Barrier,
// WaitForShutdown block the caller (bounded, on the client's clock). Callbacks run on the
// endpoint's I/O thread without the client's lock held; they must not block for long and must
// not call Close().
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/node/endpoint.h"
#include "common/status.h"
#include "common/transport/protocol.h"
#include "common/transport/transport.h"
#include "config/cluster_config.h"
#include "proto/bitpush/v1/control.pb.h"

namespace bitpush::scheduler {

struct SchedulerClientOptions {
  // This node's view of the cluster (its copy of the YAML): its own address, the
  // scheduler's, the token and the settings it must agree on.
  config::ClusterConfig cluster;
  // Who this node is: ROLE_SERVER or ROLE_WORKER and the index in that YAML list.
  v1::Role role = v1::ROLE_UNSPECIFIED;
  uint32_t rank = 0;
  // inproc backend only, when the client binds its own endpoint: the hub shared by the
  // in-process cluster's endpoints.
  std::shared_ptr<transport::InprocHub> inproc_hub;
  // The protocol version announced (tests change it to check the scheduler's refusal).
  uint32_t protocol_major = kProtocolMajor;
  uint32_t protocol_minor = kProtocolMinor;
  // Sent in RegisterRequest (e.g. "data:v1"); the scheduler does not read them.
  std::vector<std::string> capabilities;
  // Pause after the first unanswered registration attempt; doubles up to max_backoff.
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{2000};
  // Bound of Barrier(group) without an explicit timeout. Default 10 minutes.
  std::chrono::milliseconds barrier_timeout{600000};
  // Called once with the first (sticky) error, on the thread that detected it.
  std::function<void(const Status&)> on_error;
  // Called once on the I/O thread when the scheduler's Shutdown arrives, clean or not, with its
  // verdict: for an error shutdown the sticky RemoteError ("the scheduler at ADDR shut the
  // cluster down: REASON", on_error has seen it first); for a clean one Cancelled "the scheduler
  // at ADDR shut the cluster down (clean shutdown: every worker sent Done)". A worker that did
  // not send Done learns here that its job ended under it.
  std::function<void(const Status& verdict)> on_shutdown;
  // Workers: called on the I/O thread when the scheduler says another worker is done, with that
  // worker's rank and the rounds it completed of each tensor (WorkerFinished).
  std::function<void(uint32_t worker, const std::vector<uint64_t>& rounds)> on_worker_finished;
  // cluster.server_rejoin_timeout_s: called on the I/O thread when a server died and the
  // scheduler waits for it to register again (instead of the sticky error: the job is not over),
  // with the data plane's new generation and `why` (naming the server and the wait); and when it
  // rejoined. A node without on_server_lost treats the failure as fatal.
  std::function<void(uint32_t server, uint64_t generation, const Status& why)> on_server_lost;
  std::function<void(uint32_t server, uint64_t generation)> on_server_rejoined;
  // The timeline's clock exchange (docs/observability.md): called on the endpoint's thread for
  // each scheduler heartbeat that echoes one of this node's, with this node's send time t0,
  // the scheduler's receive time t1 and send time t2, and this node's receive time t3 (steady
  // clocks, ns).
  std::function<void(int64_t t0, int64_t t1, int64_t t2, int64_t t3)> on_clock_sample;
  // The clock of heartbeats, silence verdicts, registration back-off and every bounded wait;
  // null = the endpoint's clock.
  std::shared_ptr<const Clock> clock;
};

class SchedulerClient {
 public:
  // Validates the options (the role/rank must exist in the YAML) and attaches to `endpoint`,
  // the node's, which must not be started yet and must outlive the client: its owner closes
  // it before destroying the client.
  static StatusOr<std::unique_ptr<SchedulerClient>> Create(SchedulerClientOptions options,
                                                           node::NodeEndpoint* endpoint);
  // Validates the options, binds the node's own endpoint (or wraps `transport`, whose name
  // must be the node's PeerId), attaches to it and starts it. The client owns that endpoint.
  static StatusOr<std::unique_ptr<SchedulerClient>> Create(
      SchedulerClientOptions options, std::unique_ptr<transport::Transport> transport = nullptr);

  ~SchedulerClient();  // Close()
  SchedulerClient(const SchedulerClient&) = delete;
  SchedulerClient& operator=(const SchedulerClient&) = delete;

  // Registers and waits for the Assignment. Errors: Timeout "no answer from the scheduler at
  // ADDR after N registration attempts over T ms ..." when the scheduler never answers within
  // cluster.startup_timeout; RemoteError "the scheduler at ADDR refused server 0: ..." (version,
  // token, duplicate, config difference); Timeout when the Assignment does not follow within
  // the scheduler's remaining startup time + heartbeat_timeout (normally the scheduler's own
  // startup verdict, naming the missing nodes, arrives first as a RemoteError); or whatever
  // error came first. Idempotent once it succeeded.
  Status Register();

  // Valid after Register() returned OK.
  const v1::Assignment& assignment() const;
  const v1::NodeInfo& self() const { return assignment().self(); }
  // ServerForKey with the assigned key mapping (valid after Register()).
  uint32_t ServerForKey(uint64_t key) const;

  // Waits for every member of `group` (GROUP_WORKERS, GROUP_SERVERS, GROUP_ALL) to reach
  // its next barrier. InvalidArgument if this node is not in `group`; Timeout (sticky: the
  // barrier count can no longer be trusted) after `timeout`; Cancelled after a clean shutdown.
  Status Barrier(v1::Group group);
  Status Barrier(v1::Group group, std::chrono::milliseconds timeout);

  // Workers: tells the scheduler this worker is done, with the push_pulls it completed of each
  // tensor (by declaration index: Done's `rounds`, which the scheduler forwards to the other
  // workers as WorkerFinished). Idempotent.
  Status Done(const std::vector<uint64_t>& rounds = {});

  // OK once the scheduler shut the cluster down cleanly; the sticky error if any; Timeout
  // "no shutdown from the scheduler at ADDR within N ms" otherwise.
  Status WaitForShutdown(std::chrono::milliseconds timeout);

  // The sticky error (OK if none so far).
  Status status() const;
  // True once a Shutdown (clean or not) arrived.
  bool shut_down() const;

  // Blocked calls return Cancelled; an endpoint the client owns is closed (its loop joined).
  // Idempotent.
  void Close();

  // The node's endpoint (for tests and tools that are only control-plane clients: Connect and
  // Send to other nodes).
  node::NodeEndpoint& endpoint() { return *endpoint_; }
  const std::string& scheduler_address() const { return options_.cluster.scheduler_address; }
  // "server 0" / "worker 1".
  const std::string& node_label() const { return label_; }

 private:
  using time_point = Clock::time_point;

  SchedulerClient(SchedulerClientOptions options, node::NodeEndpoint* endpoint,
                  std::unique_ptr<node::NodeEndpoint> owned);
  static Status Validate(const SchedulerClientOptions& options);

  // Registers the control-plane handlers and the heartbeat timer on the endpoint.
  void Attach();
  // The heartbeat timer (the endpoint's loop): sends heartbeats, checks the scheduler's
  // silence; returns when it next needs to run.
  time_point Tick(time_point now);
  void HandleFromScheduler(const v1::ControlMessage& msg);
  // Records `error` as the sticky error if it is the first; notifies waiters; calls on_error.
  void Fail(const Status& error);
  Status SendToScheduler(const v1::ControlMessage& msg);
  v1::RegisterRequest MakeRequest() const;
  // The error a blocked call returns now, if any (caller holds mu_).
  std::optional<Status> StopReasonLocked() const;

  const SchedulerClientOptions options_;
  const std::string name_;     // PeerId
  const std::string address_;  // listen address (the YAML entry)
  const std::string label_;
  const uint64_t incarnation_;
  node::NodeEndpoint* const endpoint_;
  const std::unique_ptr<node::NodeEndpoint> owned_endpoint_;  // set when the client bound it
  const std::shared_ptr<const Clock> clock_;
  uint64_t heartbeat_seq_ = 0;  // the endpoint's loop only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status error_;                                  // guarded by mu_; sticky
  bool error_reported_ = false;                   // guarded by mu_
  bool closed_ = false;                           // guarded by mu_
  bool scheduler_connected_ = false;              // guarded by mu_
  bool accepted_ = false;                         // guarded by mu_
  bool assigned_ = false;                         // guarded by mu_
  bool shutdown_ = false;                         // guarded by mu_
  bool done_sent_ = false;                        // guarded by mu_
  v1::Assignment assignment_;                     // guarded by mu_; immutable once assigned_
  std::chrono::milliseconds heartbeat_interval_;  // guarded by mu_ (scheduler's once accepted)
  std::chrono::milliseconds heartbeat_timeout_;   // guarded by mu_
  // How long Register() waits for the Assignment once accepted (set by RegisterAccepted).
  std::chrono::milliseconds assignment_wait_;  // guarded by mu_
  time_point last_heard_;                      // guarded by mu_: last message from the scheduler
  time_point next_heartbeat_;                  // guarded by mu_
  std::map<int, uint64_t> next_barrier_;       // guarded by mu_: by group, the next id to request
  std::map<int, uint64_t> released_;           // guarded by mu_: by group, ids released so far
};

}  // namespace bitpush::scheduler
