#include "tests/harness/cluster_harness.h"

#include "common/logging.h"
#include "fmt/format.h"
#include "tests/harness/test_cluster.h"

namespace bitpush::testing {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

std::string ClusterResult::Describe() const {
  auto line = [](const std::string& name, const NodeResult& r) {
    return fmt::format("  {}: {}\n", name,
                       r.finished ? r.status.ToString() : std::string("(not run)"));
  };
  std::string out = line("scheduler", scheduler);
  for (const auto& [name, r] : nodes) out += line(name, r);
  return out;
}

ClusterHarness::ClusterHarness(ClusterHarnessOptions options)
    : options_(std::move(options)), hub_(transport::NewInprocHub()) {
  TestClusterOptions t;
  t.source = "cluster_harness";
  t.servers = options_.num_servers;
  t.workers = options_.num_workers;
  t.token = options_.token;
  t.heartbeat_interval = options_.heartbeat_interval;
  t.heartbeat_timeout = options_.heartbeat_timeout;
  t.startup_timeout = options_.startup_timeout;
  t.compression = options_.compression;
  config_ = TestClusterConfig(t);
  faults_[node::kSchedulerPeerId] = std::make_shared<FaultSwitch>();
  for (uint32_t i = 0; i < options_.num_servers; ++i) {
    faults_[node::NodePeerId(v1::ROLE_SERVER, i)] = std::make_shared<FaultSwitch>();
  }
  for (uint32_t i = 0; i < options_.num_workers; ++i) {
    faults_[node::NodePeerId(v1::ROLE_WORKER, i)] = std::make_shared<FaultSwitch>();
  }
}

ClusterHarness::~ClusterHarness() {
  if (started_ && !joined_) (void)Join(milliseconds(0));
}

scheduler::SchedulerClientOptions ClusterHarness::ClientOptions(v1::Role role,
                                                                uint32_t rank) const {
  scheduler::SchedulerClientOptions o;
  o.cluster = config_;
  o.role = role;
  o.rank = rank;
  o.inproc_hub = hub_;
  o.initial_backoff = milliseconds(10);
  o.max_backoff = milliseconds(200);
  o.barrier_timeout = options_.node_wait;
  o.clock = options_.clock;
  return o;
}

FaultSwitch& ClusterHarness::faults(const std::string& peer) {
  auto it = faults_.find(peer);
  BP_CHECK(it != faults_.end(), "ClusterHarness::faults: no endpoint named '{}'", peer);
  return *it->second;
}

bool ClusterHarness::SleepUnlessAborted(milliseconds delay) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, delay, [&] { return aborting_; });
  return !aborting_;
}

void ClusterHarness::Finish(Runner* runner, Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner->result.finished = true;
    runner->result.status = std::move(status);
    runner->result.finished_at = Clock::now();
  }
  cv_.notify_all();
}

void ClusterHarness::RunScheduler(Runner* runner) {
  if (!SleepUnlessAborted(options_.scheduler_start_delay)) {
    Finish(runner, CancelledError("harness: stopped before the scheduler started"));
    return;
  }
  transport::TransportOptions t;
  t.backend = "inproc";
  t.name = node::kSchedulerPeerId;
  t.listen_address = config_.scheduler_address;
  t.inproc_hub = hub_;
  StatusOr<std::unique_ptr<transport::Transport>> inner = transport::CreateTransport(t);
  if (!inner.ok()) {
    Finish(runner, inner.status());
    return;
  }
  auto wrapped = std::make_unique<FaultyTransport>(
      std::shared_ptr<transport::Transport>(std::move(inner).value()),
      faults_.at(node::kSchedulerPeerId));
  scheduler::SchedulerOptions so;
  so.cluster = config_;
  so.inproc_hub = hub_;
  so.clock = options_.clock;
  StatusOr<std::unique_ptr<scheduler::Scheduler>> made =
      scheduler::Scheduler::Create(so, std::move(wrapped));
  if (!made.ok()) {
    Finish(runner, made.status());
    return;
  }
  scheduler::Scheduler* s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_ = std::move(made).value();
    s = scheduler_.get();
    if (aborting_) s->Stop();
  }
  Status status = s->Run();
  // The scheduler "process" exits: its endpoint closes.
  std::unique_ptr<scheduler::Scheduler> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = std::move(scheduler_);
  }
  done.reset();
  Finish(runner, std::move(status));
}

void ClusterHarness::RunNode(Runner* runner, const NodePlan& plan) {
  if (!SleepUnlessAborted(plan.start_delay)) {
    Finish(runner, CancelledError("harness: stopped before " + runner->name + " started"));
    return;
  }
  const scheduler::SchedulerClientOptions& o = plan.client;
  transport::TransportOptions t;
  t.backend = "inproc";
  t.name = node::NodePeerId(o.role, o.rank);
  t.listen_address = o.cluster.NodeAddress(o.role, o.rank);
  t.inproc_hub = hub_;
  StatusOr<std::unique_ptr<transport::Transport>> inner = transport::CreateTransport(t);
  if (!inner.ok()) {
    Finish(runner, inner.status());
    return;
  }
  auto wrapped = std::make_unique<FaultyTransport>(
      std::shared_ptr<transport::Transport>(std::move(inner).value()), faults_.at(runner->name));
  StatusOr<std::unique_ptr<scheduler::SchedulerClient>> client =
      scheduler::SchedulerClient::Create(plan.client, std::move(wrapped));
  if (!client.ok()) {
    Finish(runner, client.status());
    return;
  }
  Status status = (*client)->Register();
  if (status.ok() && plan.body) status = plan.body(**client);
  client->reset();  // the node "exits"
  Finish(runner, std::move(status));
}

Status ClusterHarness::Start() {
  BP_CHECK(!started_, "ClusterHarness::Start called twice");
  started_ = true;
  BP_RETURN_IF_ERROR(config::ValidateClusterConfig(config_));
  const milliseconds wait = options_.node_wait;
  NodeBody server_body = options_.server_body;
  if (!server_body) {
    server_body = [wait](scheduler::SchedulerClient& c) { return c.WaitForShutdown(wait); };
  }
  NodeBody worker_body = options_.worker_body;
  if (!worker_body) {
    worker_body = [wait](scheduler::SchedulerClient& c) {
      BP_RETURN_IF_ERROR(c.Done());
      return c.WaitForShutdown(wait);
    };
  }
  if (options_.run_scheduler) {
    auto r = std::make_unique<Runner>();
    r->name = node::kSchedulerPeerId;
    Runner* raw = r.get();
    runners_.push_back(std::move(r));
    raw->thread = std::thread([this, raw] { RunScheduler(raw); });
  }
  for (v1::Role role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    const uint32_t n = role == v1::ROLE_SERVER ? options_.num_servers : options_.num_workers;
    for (uint32_t rank = 0; rank < n; ++rank) {
      const NodeId id{role, rank};
      NodePlan plan;
      plan.client = ClientOptions(role, rank);
      plan.body = role == v1::ROLE_SERVER ? server_body : worker_body;
      if (options_.plan) options_.plan(id, plan);
      if (!plan.launch) continue;
      auto r = std::make_unique<Runner>();
      r->name = id.name();
      Runner* raw = r.get();
      runners_.push_back(std::move(r));
      raw->thread = std::thread([this, raw, p = std::move(plan)] { RunNode(raw, p); });
    }
  }
  return Status::Ok();
}

void ClusterHarness::StopScheduler() {
  std::lock_guard<std::mutex> lock(mu_);
  if (scheduler_) scheduler_->Stop();
}

void ClusterHarness::ForceStop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborting_ = true;
    if (scheduler_) scheduler_->Stop();
  }
  cv_.notify_all();
  for (auto& [name, sw] : faults_) sw->Crash();
}

ClusterResult ClusterHarness::Join(milliseconds timeout) {
  BP_CHECK(started_ && !joined_, "ClusterHarness::Join: call once, after Start");
  joined_ = true;
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<std::string> late;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline, [&] {
      for (const auto& r : runners_) {
        if (!r->result.finished) return false;
      }
      return true;
    });
    for (const auto& r : runners_) {
      if (!r->result.finished) late.push_back(r->name);
    }
  }
  if (!late.empty()) {
    std::string names;
    for (const std::string& n : late) names += (names.empty() ? "" : ", ") + n;
    BP_LOG_ERROR("harness: still running after {} ms: {}; forcing them to stop", timeout.count(),
                 names);
    ForceStop();
  }
  for (auto& r : runners_) {
    if (r->thread.joinable()) r->thread.join();
  }
  ClusterResult out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : runners_) {
    NodeResult res = r->result;
    for (const std::string& name : late) {
      if (name == r->name) {
        res.status =
            TimeoutError(fmt::format("harness: {} still running after {} ms (was then "
                                     "forced to stop: {})",
                                     name, timeout.count(), res.status.ToString()));
      }
    }
    if (r->name == node::kSchedulerPeerId) {
      out.scheduler = res;
    } else {
      out.nodes[r->name] = res;
    }
  }
  return out;
}

}  // namespace bitpush::testing
