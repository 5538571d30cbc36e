#include "bench/cluster/control_plane.h"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bench/cluster/probes.h"
#include "common/logging.h"
#include "common/node/identity.h"
#include "common/transport/transport.h"
#include "fmt/format.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_client.h"
#include "tests/harness/faulty_transport.h"

namespace bitpush::bench::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Bound of one barrier, and slack added to every phase's bound (a 2-core machine running
// hundreds of node threads).
constexpr milliseconds kBarrierTimeout{30000};
constexpr milliseconds kSlack{30000};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int64_t Ms(Clock::duration d) {
  return std::chrono::duration_cast<milliseconds>(d).count();
}

// Ordered: a node waiting for a phase is released by any later one.
enum class Phase { kRegister, kBarriers, kFinish, kAbort };

struct NodeRun {
  v1::Role role = v1::ROLE_UNSPECIFIED;
  uint32_t rank = 0;
  std::string name;   // PeerId
  std::string label;  // "worker 3"
  std::shared_ptr<testing::FaultSwitch> faults = std::make_shared<testing::FaultSwitch>();
  std::thread thread;
  // Guarded by ControlPlaneCluster::mu_.
  Clock::time_point started{};
  Clock::time_point registered_at{};
  bool registered = false;
  bool barriers_done = false;
  bool finished = false;
  std::vector<Clock::time_point> enter, exit;  // per barrier
  Status failure;                              // a failure before the kill
  // The first error its client reported (on_error, on the node's I/O thread), and when.
  std::optional<Clock::time_point> error_at;
  Status first_error;
};

class ControlPlaneCluster {
 public:
  explicit ControlPlaneCluster(const ClusterSpec& spec)
      : spec_(spec),
        config_(MakeClusterConfig(spec, spec.first_port)),
        hub_(transport::NewInprocHub()) {}
  ~ControlPlaneCluster() {
    ForceStop();
    Join();
  }
  ControlPlaneCluster(const ControlPlaneCluster&) = delete;
  ControlPlaneCluster& operator=(const ControlPlaneCluster&) = delete;

  Status Run(ClusterFigures* f);

 private:
  Status Register(ClusterFigures* f);
  Status Barriers(ClusterFigures* f);
  Status Idle(ClusterFigures* f);
  Status Kill(ClusterFigures* f);
  Status Teardown();

  void RunNode(NodeRun* n);
  void OnNodeError(NodeRun* n, const Status& error);
  // The node's wait for the coordinator to open `phase`, at most `bound`.
  Status WaitForPhase(const NodeRun& n, Phase phase, Clock::duration bound, const char* what);
  void SetPhase(Phase phase);
  // Waits until `done` holds for every node but `skip`, a node failed, or `deadline`; the
  // failure, or Timeout naming the nodes it waited for, `what` saying for what.
  Status WaitForNodes(const std::function<bool(const NodeRun&)>& done, Clock::time_point deadline,
                      const std::string& what, const NodeRun* skip = nullptr);
  // Stops the scheduler and crashes every endpoint: every blocked call returns.
  void ForceStop();
  void Join();

  const ClusterSpec spec_;
  const config::ClusterConfig config_;
  const std::shared_ptr<transport::InprocHub> hub_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;  // made and destroyed on the caller's thread
  std::vector<pid_t> scheduler_io_threads_;          // the threads its endpoint started
  std::thread scheduler_thread_;
  std::vector<std::unique_ptr<NodeRun>> nodes_;

  std::mutex mu_;
  std::condition_variable cv_;
  Phase phase_ = Phase::kRegister;  // guarded by mu_
  bool scheduler_done_ = false;     // guarded by mu_
  Status scheduler_status_;         // guarded by mu_
};

Status ControlPlaneCluster::Run(ClusterFigures* f) {
  BP_RETURN_IF_ERROR(Register(f));
  BP_RETURN_IF_ERROR(Barriers(f));
  BP_RETURN_IF_ERROR(Idle(f));
  BP_RETURN_IF_ERROR(Kill(f));
  return Teardown();
}

Status ControlPlaneCluster::Register(ClusterFigures* f) {
  const int64_t rss_before = ResidentKib();
  const int64_t fds_before = OpenFds();
  scheduler::SchedulerOptions so;
  so.cluster = config_;
  so.inproc_hub = hub_;
  // No other thread starts meanwhile: the threads that appear are the scheduler endpoint's.
  const std::vector<pid_t> threads_before = ThreadIds();
  BP_ASSIGN_OR_RETURN(scheduler_, scheduler::Scheduler::Create(so));
  for (pid_t tid : ThreadIds()) {
    if (std::find(threads_before.begin(), threads_before.end(), tid) == threads_before.end()) {
      scheduler_io_threads_.push_back(tid);
    }
  }
  const int64_t fds_per_endpoint = OpenFds() - fds_before;
  scheduler_thread_ = std::thread([this] {
    Status s = scheduler_->Run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      scheduler_done_ = true;
      scheduler_status_ = std::move(s);
    }
    cv_.notify_all();
  });
  for (v1::Role role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    const uint32_t count = role == v1::ROLE_SERVER ? spec_.servers() : spec_.workers();
    for (uint32_t rank = 0; rank < count; ++rank) {
      auto n = std::make_unique<NodeRun>();
      n->role = role;
      n->rank = rank;
      n->name = node::NodePeerId(role, rank);
      n->label = fmt::format("{} {}", node::RoleName(role), rank);
      n->enter.resize(spec_.barriers);
      n->exit.resize(spec_.barriers);
      nodes_.push_back(std::move(n));
    }
  }
  for (auto& n : nodes_) n->thread = std::thread([this, p = n.get()] { RunNode(p); });
  BP_RETURN_IF_ERROR(WaitForNodes([](const NodeRun& n) { return n.registered; },
                                  Clock::now() + config_.startup_timeout + kSlack, "register"));
  std::lock_guard<std::mutex> lock(mu_);
  Clock::time_point first_start = nodes_.front()->started;
  Clock::time_point last_start = first_start;
  Clock::time_point last_registered = nodes_.front()->registered_at;
  for (const auto& n : nodes_) {
    first_start = std::min(first_start, n->started);
    last_start = std::max(last_start, n->started);
    last_registered = std::max(last_registered, n->registered_at);
  }
  f->register_s = Seconds(last_registered - last_start);
  f->register_total_s = Seconds(last_registered - first_start);
  f->rss_per_node_kib =
      static_cast<double>(ResidentKib() - rss_before) / static_cast<double>(spec_.nodes);
  f->threads = ThreadCount();
  f->fds = OpenFds();
  const double nodes = spec_.nodes;
  f->fds_per_endpoint = static_cast<double>(fds_per_endpoint);
  f->fds_per_connection =
      static_cast<double>(f->fds - fds_before - (spec_.nodes + 1) * fds_per_endpoint) / (2 * nodes);
  return Status::Ok();
}

Status ControlPlaneCluster::Barriers(ClusterFigures* f) {
  SetPhase(Phase::kBarriers);
  BP_RETURN_IF_ERROR(WaitForNodes([](const NodeRun& n) { return n.barriers_done; },
                                  Clock::now() + spec_.barriers * kBarrierTimeout + kSlack,
                                  fmt::format("pass {} barriers", spec_.barriers)));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> ms, first_release_ms, fanout_ms;
  for (uint32_t k = 0; k < spec_.barriers; ++k) {
    Clock::time_point last_enter = nodes_.front()->enter[k];
    Clock::time_point first_exit = nodes_.front()->exit[k];
    Clock::time_point last_exit = first_exit;
    for (const auto& n : nodes_) {
      last_enter = std::max(last_enter, n->enter[k]);
      first_exit = std::min(first_exit, n->exit[k]);
      last_exit = std::max(last_exit, n->exit[k]);
    }
    ms.push_back(Seconds(last_exit - last_enter) * 1e3);
    first_release_ms.push_back(Seconds(first_exit - last_enter) * 1e3);
    fanout_ms.push_back(Seconds(last_exit - first_exit) * 1e3);
  }
  f->barrier_ms_median = Percentile(ms, 50);
  f->barrier_ms_p99 = Percentile(ms, 99);
  f->barrier_ms_max = Percentile(ms, 100);
  f->barrier_first_release_ms_median = Percentile(first_release_ms, 50);
  f->barrier_fanout_ms_median = Percentile(fanout_ms, 50);
  return Status::Ok();
}

Status ControlPlaneCluster::Idle(ClusterFigures* f) {
  // Let the last barrier's releases and the nodes' wake-ups pass first.
  std::this_thread::sleep_for(2 * config_.heartbeat_interval);
  const pthread_t thread = scheduler_thread_.native_handle();
  auto io_cpu = [this]() -> StatusOr<double> {
    double sum = 0;
    for (pid_t tid : scheduler_io_threads_) {
      BP_ASSIGN_OR_RETURN(const double s, TidCpuSeconds(tid));
      sum += s;
    }
    return sum;
  };
  BP_ASSIGN_OR_RETURN(const double sched0, ThreadCpuSeconds(thread));
  BP_ASSIGN_OR_RETURN(const double io0, io_cpu());
  const double process0 = ProcessCpuSeconds();
  const Clock::time_point t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(spec_.idle_s));
  BP_ASSIGN_OR_RETURN(const double sched1, ThreadCpuSeconds(thread));
  BP_ASSIGN_OR_RETURN(const double io1, io_cpu());
  const double process1 = ProcessCpuSeconds();
  const double wall = Seconds(Clock::now() - t0);
  f->idle_s = wall;
  f->scheduler_cpu_pct = 100.0 * (sched1 - sched0) / wall;
  f->scheduler_io_cpu_pct = 100.0 * (io1 - io0) / wall;
  f->process_cpu_pct = 100.0 * (process1 - process0) / wall;
  // Heartbeats alone must not have ended anything.
  std::lock_guard<std::mutex> lock(mu_);
  if (scheduler_done_) {
    return InternalError("the scheduler ended while the cluster was idle: " +
                         scheduler_status_.ToString());
  }
  for (const auto& n : nodes_) {
    if (n->error_at) {
      return InternalError(fmt::format("{} failed while the cluster was idle (heartbeats only): {}",
                                       n->label, n->first_error.ToString()));
    }
  }
  return Status::Ok();
}

Status ControlPlaneCluster::Kill(ClusterFigures* f) {
  NodeRun* victim = nodes_.back().get();  // the last worker
  f->killed = victim->label;
  const Clock::time_point killed_at = Clock::now();
  victim->faults->SetSilent(true);
  BP_RETURN_IF_ERROR(WaitForNodes([](const NodeRun& n) { return n.error_at.has_value(); },
                                  killed_at + config_.heartbeat_timeout + kSlack,
                                  fmt::format("be told that {} failed", victim->label), victim));
  std::lock_guard<std::mutex> lock(mu_);
  // The verdict must name the victim: "worker 6 at tcp://... failed: no heartbeat for ...".
  const std::string verdict = victim->label + " at ";
  Clock::time_point last = killed_at;
  for (const auto& n : nodes_) {
    if (n.get() == victim) continue;
    if (n->first_error.message().find(verdict) == std::string::npos) {
      return InternalError(fmt::format("{} was silenced, but {} first heard: {}", victim->label,
                                       n->label, n->first_error.ToString()));
    }
    last = std::max(last, n->error_at.value_or(killed_at));  // set: WaitForNodes saw it
  }
  f->kill_named_s = Seconds(last - killed_at);
  return Status::Ok();
}

Status ControlPlaneCluster::Teardown() {
  SetPhase(Phase::kFinish);
  nodes_.back()->faults->Crash();  // the silent node's process dies now
  const Clock::time_point deadline = Clock::now() + 2 * config_.heartbeat_timeout + kSlack;
  BP_RETURN_IF_ERROR(WaitForNodes([](const NodeRun& n) { return n.finished; }, deadline, "exit"));
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return scheduler_done_; })) {
    return TimeoutError(
        fmt::format("the scheduler did not end within {} ms of the last node's exit",
                    Ms(deadline - Clock::now())));
  }
  // Its verdict: the killed node failed.
  if (scheduler_status_.code() != StatusCode::kUnavailable ||
      scheduler_status_.message().find(nodes_.back()->label + " at ") == std::string::npos) {
    return InternalError(fmt::format("the scheduler ended with {}, not the verdict on {}",
                                     scheduler_status_.ToString(), nodes_.back()->label));
  }
  return Status::Ok();
}

void ControlPlaneCluster::RunNode(NodeRun* n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    n->started = Clock::now();
  }
  // The node's thread ends: a failure before the kill is the run's error.
  auto finish = [this, n](const Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (n->failure.ok() && phase_ < Phase::kFinish) n->failure = s;
      n->finished = true;
    }
    cv_.notify_all();
  };
  transport::TransportOptions t;
  t.backend = spec_.transport;
  t.name = n->name;
  t.listen_address = config_.NodeAddress(n->role, n->rank);
  t.inproc_hub = hub_;
  StatusOr<std::unique_ptr<transport::Transport>> inner = transport::CreateTransport(t);
  if (!inner.ok()) {
    finish(inner.status().WithContext(
        fmt::format("{}: cannot listen at {}", n->label, t.listen_address)));
    return;
  }
  auto wrapped = std::make_unique<testing::FaultyTransport>(
      std::shared_ptr<transport::Transport>(std::move(inner).value()), n->faults);
  scheduler::SchedulerClientOptions o;
  o.cluster = config_;
  o.role = n->role;
  o.rank = n->rank;
  o.inproc_hub = hub_;
  o.barrier_timeout = kBarrierTimeout;
  o.on_error = [this, n](const Status& error) { OnNodeError(n, error); };
  StatusOr<std::unique_ptr<scheduler::SchedulerClient>> client =
      scheduler::SchedulerClient::Create(o, std::move(wrapped));
  if (!client.ok()) {
    finish(client.status());
    return;
  }
  Status s = (*client)->Register();
  {
    std::lock_guard<std::mutex> lock(mu_);
    n->registered_at = Clock::now();
    n->registered = s.ok();
  }
  cv_.notify_all();
  if (s.ok()) {
    s = WaitForPhase(*n, Phase::kBarriers, config_.startup_timeout + kSlack, "start the barriers");
  }
  for (uint32_t k = 0; s.ok() && k < spec_.barriers; ++k) {
    const Clock::time_point enter = Clock::now();
    s = (*client)->Barrier(v1::GROUP_ALL);
    const Clock::time_point exit = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    n->enter[k] = enter;
    n->exit[k] = exit;
  }
  if (s.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      n->barriers_done = true;
    }
    cv_.notify_all();
    const auto bound =
        spec_.barriers * kBarrierTimeout +
        std::chrono::duration_cast<milliseconds>(std::chrono::duration<double>(spec_.idle_s)) +
        config_.heartbeat_timeout + 2 * kSlack;
    s = WaitForPhase(*n, Phase::kFinish, bound, "end the run");
  }
  if (s.ok()) {
    // The cluster ends with the error of the killed node (returned here at once: it is sticky).
    (void)(*client)->WaitForShutdown(2 * config_.heartbeat_timeout + kSlack);
  }
  client->reset();  // the node "exits": its endpoint closes
  finish(s);
}

void ControlPlaneCluster::OnNodeError(NodeRun* n, const Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n->error_at) return;
    n->error_at = Clock::now();
    n->first_error = error;
  }
  cv_.notify_all();
}

Status ControlPlaneCluster::WaitForPhase(const NodeRun& n, Phase phase, Clock::duration bound,
                                         const char* what) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool reached = cv_.wait_for(lock, bound, [&] { return phase_ >= phase; });
  if (phase_ == Phase::kAbort) return CancelledError(n.label + ": the benchmark stopped");
  if (!reached) {
    return TimeoutError(
        fmt::format("{}: waited {} ms for the benchmark to {}", n.label, Ms(bound), what));
  }
  return Status::Ok();
}

void ControlPlaneCluster::SetPhase(Phase phase) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = phase;
  }
  cv_.notify_all();
}

Status ControlPlaneCluster::WaitForNodes(const std::function<bool(const NodeRun&)>& done,
                                         Clock::time_point deadline, const std::string& what,
                                         const NodeRun* skip) {
  const Clock::time_point start = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  const NodeRun* failed = nullptr;
  cv_.wait_until(lock, deadline, [&] {
    bool all = true;
    for (const auto& n : nodes_) {
      if (!n->failure.ok()) {
        failed = n.get();
        return true;
      }
      if (n.get() != skip && !done(*n)) all = false;
    }
    return all;
  });
  if (failed != nullptr) {
    const Status& s = failed->failure;
    if (s.message().rfind(failed->label, 0) == 0) return s;
    return s.WithContext(failed->label);
  }
  std::vector<std::string> late;
  for (const auto& n : nodes_) {
    if (n.get() != skip && !done(*n)) late.push_back(n->label);
  }
  if (late.empty()) return Status::Ok();
  std::string names;
  for (size_t i = 0; i < late.size() && i < 10; ++i) names += (i ? ", " : "") + late[i];
  if (late.size() > 10) names += fmt::format(" and {} more", late.size() - 10);
  return TimeoutError(fmt::format("waited {} ms for {} of {} nodes to {}: {}",
                                  Ms(Clock::now() - start), late.size(), nodes_.size(), what,
                                  names));
}

void ControlPlaneCluster::ForceStop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != Phase::kAbort && !scheduler_done_ && scheduler_) scheduler_->Stop();
    phase_ = Phase::kAbort;
  }
  cv_.notify_all();
  for (auto& n : nodes_) {
    bool finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished = n->finished;
    }
    if (!finished) n->faults->Crash();
  }
}

void ControlPlaneCluster::Join() {
  // Every node's and the scheduler's waits are bounded, and ForceStop ended them.
  for (auto& n : nodes_) {
    if (n->thread.joinable()) n->thread.join();
  }
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
  scheduler_.reset();
}

}  // namespace

Status RunControlPlane(const ClusterSpec& spec, ClusterFigures* figures) {
  ControlPlaneCluster cluster(spec);
  return cluster.Run(figures);
}

}  // namespace bitpush::bench::cluster
