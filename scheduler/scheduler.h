// Scheduler: the control plane of one bitpush cluster (docs/architecture.md, "Scheduler and
// control plane").
//
// It waits (bounded by cluster.startup_timeout) for every server and worker of the cluster
// YAML to register, refusing wrong protocol versions, wrong cluster tokens, unknown or
// duplicate nodes and nodes whose compression/partition config differs from its own; then it
// sends every node its Assignment (ranks in YAML order, every node's address, the key
// mapping). Afterwards it releases barriers per group, exchanges heartbeats with every node,
// declares a node silent for heartbeat_timeout dead (tells every other node, then shuts the
// cluster down with an error), and shuts the cluster down cleanly once every worker is Done.
// It never touches gradient bytes.
//
// Objects, not singletons: built from SchedulerOptions and an optional injected Transport (so
// tests wrap it for fault injection and several schedulers can live in one process) and clock.
// The scheduler's NodeEndpoint (common/node/endpoint.h) owns the transport; the scheduler
// registers its control-plane handlers on it and runs the loop itself (NodeEndpoint::Poll).
//
// Thread-safety: Run() is called once, by one thread, which owns all scheduler state (a
// single-threaded event loop: the endpoint's handlers run on the Run thread). Stop(),
// address() and stats() may be called from any thread (stats() reads counters the loop
// publishes in atomics).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/node/endpoint.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "config/cluster_config.h"
#include "proto/bitpush/v1/control.pb.h"

namespace bitpush::scheduler {

struct SchedulerOptions {
  // The cluster (the scheduler's YAML is the reference for config agreement). Validated by
  // Create (ValidateClusterConfig).
  config::ClusterConfig cluster;
  // inproc backend only: the hub shared by the endpoints of the in-process cluster.
  std::shared_ptr<transport::InprocHub> inproc_hub;
  // After sending Shutdown, how long to wait for every live node's ShutdownAck before
  // returning (so the last messages are not lost with the socket). 0 = heartbeat_timeout.
  std::chrono::milliseconds shutdown_ack_timeout{0};
  // The clock of heartbeats, silence verdicts and the startup timeout; null = SystemClock().
  std::shared_ptr<const Clock> clock;
};

// What the scheduler has seen so far (docs/metrics.md).
struct SchedulerStats {
  uint64_t nodes_expected = 0;         // servers + workers of the YAML
  uint64_t nodes_registered = 0;       // registered so far (dead ones included)
  uint64_t nodes_dead = 0;             // declared dead
  uint64_t workers_done = 0;           // workers that sent Done
  uint64_t registrations_refused = 0;  // RegisterRefused answers sent
  uint64_t barriers_released = 0;      // over all groups
  uint64_t heartbeat_rounds = 0;       // times a heartbeat went to every live node
  node::EndpointStats endpoint;
};

class Scheduler {
 public:
  // Validates the options and binds the scheduler's endpoint (named kSchedulerPeerId at
  // cluster.scheduler_address), unless `transport` is given: then that endpoint is used as is
  // (its name must be kSchedulerPeerId).
  static StatusOr<std::unique_ptr<Scheduler>> Create(
      SchedulerOptions options, std::unique_ptr<transport::Transport> transport = nullptr);

  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Runs the cluster to its end; call once. Returns
  //  - OK when every worker sent Done (every node was told to shut down cleanly);
  //  - Timeout naming role, rank and expected address of every node that did not register
  //    within startup_timeout;
  //  - Unavailable naming the node(s) declared dead (silent for heartbeat_timeout);
  //  - Cancelled "scheduler interrupted" after Stop();
  //  - the transport's error if the endpoint itself fails.
  // Every non-OK end first sends Shutdown{error} to every live node.
  Status Run();

  // Asks Run() to end (it returns Cancelled within ~50 ms). Safe from any thread or from a
  // signal-handling thread; idempotent.
  void Stop();

  // The scheduler's resolved listen address.
  std::string address() const;

  SchedulerStats stats() const;

 private:
  using time_point = Clock::time_point;

  struct Slot {
    v1::Role role;
    uint32_t rank;
    std::string name;     // PeerId, "server:0"
    std::string address;  // from the YAML
    std::string
        data_address;  // config::ClusterConfig::DataAddress ("" = the data plane uses address)
    bool registered = false;
    uint64_t incarnation = 0;
    std::string host;
    uint32_t pid = 0;
    time_point last_heard;
    bool dead = false;
    bool done = false;  // workers: sent Done
    bool shutdown_acked = false;
    bool disconnected = false;  // the transport reported its endpoint gone (no verdict)
    std::string last_refusal;   // why its last registration attempt was refused, if it was
    // A dead server that may register again (cluster.server_rejoin_timeout_s) until this.
    bool rejoining = false;
    time_point rejoin_deadline{};
    // Its latest heartbeat not yet echoed: its sent_ns and this scheduler's steady clock when
    // it arrived (the timeline's clock exchange; 0 = none).
    int64_t heartbeat_sent_ns = 0;
    int64_t heartbeat_received_ns = 0;
  };

  struct BarrierState {
    uint64_t next_id = 0;
    std::vector<bool> arrived;  // by slot index
    size_t count = 0;
  };

  Scheduler(SchedulerOptions options, std::unique_ptr<node::NodeEndpoint> endpoint);

  // The endpoint's handlers (the Run thread).
  void RegisterHandlers();
  void OnEvent(const transport::TransportEvent& ev);
  // The registered, live slot of `sender`, marked heard; null (and logged) otherwise.
  Slot* HeardFrom(const node::Sender& sender);
  void HandleRegister(const std::string& from, const v1::RegisterRequest& req);
  // A dead server's new process registered within its rejoin window: accepted, assigned, and
  // every live node told (NodeRejoined).
  void HandleRejoin(Slot& slot, const v1::RegisterRequest& req);
  // Whether `s` may rejoin if it dies (a server, cluster.server_rejoin_timeout_s, after the
  // assignment); LoseServer marks it dead and rejoining, bumps the generation and tells every
  // live node (NodeFailed with rejoin_deadline_ms).
  bool MayRejoin(const Slot& s) const;
  // RegisterAccepted with the counts and heartbeat timing (startup_remaining_ms unset: 0).
  v1::ControlMessage RegisterAcceptedMessage() const;
  void LoseServer(Slot& s, const std::string& reason, time_point now);
  // Status when a rejoining server's window closed, else nullopt.
  std::optional<Status> CheckRejoinDeadlines(time_point now);
  void HandleBarrier(Slot& slot, const v1::BarrierRequest& req);
  // Marks the worker done and forwards its rounds (WorkerFinished) to the workers still
  // running, whose rounds beyond them can no longer complete.
  void HandleDone(Slot& slot, const v1::Done& done);
  void Refuse(const std::string& from, const v1::RegisterRequest& req, Slot* slot,
              const std::string& error);
  void SendAssignments();
  v1::Assignment AssignmentFor(const Slot& slot) const;
  v1::NodeInfo InfoOf(const Slot& slot) const;
  bool IsMember(const Slot& slot, v1::Group group) const;

  void SendHeartbeats();
  // Status for nodes silent longer than heartbeat_timeout (marks them dead), else nullopt.
  std::optional<Status> CheckDeadNodes(time_point now);
  Status StartupTimeout();
  // Sends Shutdown{error} to every live registered worker, then (once they acknowledged, or half
  // the bound passed) to every server, waiting (bounded) for their acks.
  void ShutdownNodes(const std::string& error);
  // ShutdownNodes' one phase: Shutdown to every live node of `role`, then their acknowledgements
  // until `deadline` (the warning names those missing and the whole `bound`). Nodes whose
  // Shutdown could not be sent because they are unreachable (Unavailable: disconnected) are
  // appended to `*gone` with the reason (ShutdownNodes names them in one line); any other send
  // failure is warned about.
  void ShutdownRole(v1::Role role, const std::string& error, time_point deadline,
                    std::chrono::milliseconds bound,
                    std::vector<std::pair<std::string, Status>>* gone);
  Status SendTo(const std::string& peer, const v1::ControlMessage& msg);
  Slot* FindSlot(const std::string& peer);

  const SchedulerOptions options_;
  const config::ClusterConfig& cluster_;
  const std::shared_ptr<const Clock> clock_;
  std::unique_ptr<node::NodeEndpoint> endpoint_;
  std::vector<v1::ConfigField> config_fields_;
  uint64_t config_hash_ = 0;

  std::atomic<bool> stop_requested_{false};
  bool ran_ = false;

  // Published by the Run thread for stats() (relaxed: independent counters).
  std::atomic<uint64_t> stat_registered_{0};
  std::atomic<uint64_t> stat_dead_{0};
  std::atomic<uint64_t> stat_done_{0};
  std::atomic<uint64_t> stat_refused_{0};
  std::atomic<uint64_t> stat_barriers_{0};
  std::atomic<uint64_t> stat_heartbeats_{0};

  // Run()'s state (the Run thread only).
  std::vector<Slot> slots_;  // servers in rank order, then workers in rank order
  std::map<std::string, size_t> slot_by_name_;
  size_t registered_ = 0;
  size_t workers_done_ = 0;
  bool assigned_ = false;
  std::optional<Status> finished_;        // set when Run must end (OK = clean shutdown)
  std::map<int, BarrierState> barriers_;  // by v1::Group
  uint64_t heartbeat_seq_ = 0;
  // The data plane's generation: bumped when a server dies under server_rejoin_timeout_s.
  uint64_t generation_ = 0;
  time_point start_;
  // ShutdownNodes is waiting for acknowledgements: handlers count ShutdownAcks and departures
  // only.
  bool draining_ = false;
};

}  // namespace bitpush::scheduler
