// ClusterHarness: a whole bitpush cluster as threads of one test process ("threads as
// nodes"): a Scheduler thread plus S server and W worker threads, each node running a
// SchedulerClient over the inproc transport (one InprocHub per harness, so harnesses never
// see each other) and then a caller-supplied role body. Used by the control-plane tests.
//
// ClusterHarnessOptions::clock puts the whole cluster on one clock (tests/harness/manual_clock.h
// for timing rules that must not depend on the machine's speed).
//
// Every endpoint is wrapped in a FaultyTransport whose FaultSwitch the test can reach through
// faults("server:0") / faults("scheduler"): make a node silent (it stops being heard, like a
// hung process) or crash its endpoint.
//
//   ClusterHarnessOptions o;  o.num_servers = 2;  o.num_workers = 3;
//   o.worker_body = [](SchedulerClient& c) { ...; BP_RETURN_IF_ERROR(c.Done());
//                                            return c.WaitForShutdown(10s); };
//   ClusterHarness h(o);  ASSERT_OK(h.Start());
//   ClusterResult r = h.Join(20s);   // bounded; r.scheduler, r.nodes["worker:0"].status
//
// A node thread: waits its start delay, binds its endpoint, Register()s, then runs its body;
// the node's status is Register's error or the body's result. When a body returns, the node's
// client closes (the node "exits"): return only when the node is meant to leave.
//
// Owned by tests. Thread-safety: Start/Join/StopScheduler/the destructor from the test's
// thread; faults() switches from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "config/cluster_config.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_client.h"
#include "tests/harness/faulty_transport.h"

namespace bitpush::testing {

struct NodeId {
  v1::Role role;
  uint32_t rank;
  std::string name() const { return node::NodePeerId(role, rank); }
};

// What a node does after Register() succeeded. Its result is the node's status.
using NodeBody = std::function<Status(scheduler::SchedulerClient&)>;

// How one node is started; ClusterHarnessOptions::plan may change any of it.
struct NodePlan {
  bool launch = true;                        // false: the node never starts (a missing node)
  std::chrono::milliseconds start_delay{0};  // before binding its endpoint and registering
  scheduler::SchedulerClientOptions client;  // prefilled from the harness config
  NodeBody body;                             // prefilled with the role's body
};

struct ClusterHarnessOptions {
  uint32_t num_servers = 1;
  uint32_t num_workers = 2;
  // Control-plane timing of the generated cluster config (short, for fast tests; tests that time
  // a failure detection set their own timeout).
  std::chrono::milliseconds heartbeat_interval{50};
  std::chrono::milliseconds heartbeat_timeout{2000};  // a stalled sanitizer build is no failure
  std::chrono::milliseconds startup_timeout{5000};
  config::CompressionSettings compression;
  std::string token;
  // The scheduler thread: whether it runs, and its start delay (scheduler-last starts).
  bool run_scheduler = true;
  std::chrono::milliseconds scheduler_start_delay{0};
  // Role bodies; null = the defaults: servers WaitForShutdown(node_wait); workers Done() then
  // WaitForShutdown(node_wait).
  NodeBody server_body;
  NodeBody worker_body;
  std::chrono::milliseconds node_wait{10000};
  // Called for every node before it starts, to change its plan.
  std::function<void(const NodeId&, NodePlan&)> plan;
  // The clock of the scheduler and every node's client (heartbeats, silence verdicts, bounded
  // waits); null = the system clock. A testing::ManualClock makes timing rules deterministic.
  std::shared_ptr<const bitpush::Clock> clock;
};

struct NodeResult {
  bool finished = false;
  Status status;
  std::chrono::steady_clock::time_point finished_at;
};

struct ClusterResult {
  NodeResult scheduler;
  std::map<std::string, NodeResult> nodes;  // by PeerId ("server:0", "worker:1")
  // Every status, one per line, for test failure messages.
  std::string Describe() const;
};

class ClusterHarness {
 public:
  explicit ClusterHarness(ClusterHarnessOptions options);
  // Joins what is still running (forcing it to stop, bounded).
  ~ClusterHarness();
  ClusterHarness(const ClusterHarness&) = delete;
  ClusterHarness& operator=(const ClusterHarness&) = delete;

  // The generated cluster config (TestClusterConfig, tests/harness/test_cluster.h): transport
  // inproc, addresses inproc://scheduler, inproc://server:N, inproc://worker:N.
  const config::ClusterConfig& config() const { return config_; }
  const std::shared_ptr<transport::InprocHub>& hub() const { return hub_; }
  // Client options for (role, rank) in this cluster, e.g. for an extra client in a test.
  scheduler::SchedulerClientOptions ClientOptions(v1::Role role, uint32_t rank) const;

  // Launches the scheduler and node threads. Call once.
  Status Start();

  // The fault switch of an endpoint: "scheduler", "server:0", "worker:1" (created by Start;
  // checked: aborts for an unknown name).
  FaultSwitch& faults(const std::string& peer);

  // Asks the scheduler to stop (Run returns Cancelled).
  void StopScheduler();

  // Waits until every thread finished, at most `timeout`. Threads still running then get a
  // Timeout status naming them and are forced to stop (scheduler stopped, every endpoint
  // crashed) and joined. Call once.
  ClusterResult Join(std::chrono::milliseconds timeout);

 private:
  struct Runner {
    std::string name;
    std::thread thread;
    NodeResult result;  // guarded by mu_
  };

  void Finish(Runner* runner, Status status);
  void RunNode(Runner* runner, const NodePlan& plan);
  void RunScheduler(Runner* runner);
  // Waits `delay` unless the harness is forcing a stop; false if it is.
  bool SleepUnlessAborted(std::chrono::milliseconds delay);
  void ForceStop();

  const ClusterHarnessOptions options_;
  const std::shared_ptr<transport::InprocHub> hub_;
  config::ClusterConfig config_;
  std::map<std::string, std::shared_ptr<FaultSwitch>> faults_;  // fixed after Start()

  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool joined_ = false;
  bool aborting_ = false;                            // guarded by mu_
  std::unique_ptr<scheduler::Scheduler> scheduler_;  // guarded by mu_ (set by its thread)
  std::vector<std::unique_ptr<Runner>> runners_;     // [0] = scheduler when it runs
};

}  // namespace bitpush::testing
