#include "bench/cluster/pushpull_round.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/cluster/probes.h"
#include "common/logging.h"
#include "fmt/format.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "worker/client.h"

namespace bitpush::bench::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kOpTimeout{60000};
constexpr milliseconds kSlack{30000};
// Share of RLIMIT_NOFILE the estimate may take (the rest: what the estimate misses).
constexpr double kFdHeadroom = 0.8;

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

struct NodeThread {
  std::string label;  // "server 0", "worker 3"
  std::thread thread;
  // Guarded by PushPullCluster::mu_.
  bool finished = false;
  Status failure;
  Clock::time_point failed_at{};
  std::vector<Clock::time_point> start, done;  // workers: per round (warm-up first)
};

class PushPullCluster {
 public:
  explicit PushPullCluster(const ClusterSpec& spec);
  ~PushPullCluster();
  PushPullCluster(const PushPullCluster&) = delete;
  PushPullCluster& operator=(const PushPullCluster&) = delete;

  Status Run(ClusterFigures* f);

 private:
  void RunServer(NodeThread* n, uint32_t rank);
  void RunWorker(NodeThread* n, uint32_t rank);
  Status WorkerRounds(NodeThread* n, worker::Client& client, uint32_t rank);
  void Finish(NodeThread* n, const Status& s);
  // The earliest failure (the others usually follow from the shutdown it caused), naming the
  // node; OK if none.
  Status FirstFailureLocked() const;
  void StopScheduler();

  const ClusterSpec spec_;
  const uint32_t rounds_;  // warm-up + timed
  config::ClusterConfig config_;
  const std::shared_ptr<transport::InprocHub> hub_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::thread scheduler_thread_;
  std::vector<std::unique_ptr<NodeThread>> nodes_;  // servers, then workers

  std::mutex mu_;
  std::condition_variable cv_;
  bool scheduler_done_ = false;  // guarded by mu_
  Status scheduler_status_;      // guarded by mu_
};

PushPullCluster::PushPullCluster(const ClusterSpec& spec)
    : spec_(spec),
      rounds_(spec.pushpull_rounds + 1),
      config_(MakeClusterConfig(spec, spec.first_port + static_cast<int>(spec.nodes) + 1)),
      hub_(transport::NewInprocHub()) {
  const uint64_t partition = uint64_t{4} * spec.pushpull_floats;
  config_.compression.spec = "none";
  config_.compression.partition_bytes = partition;
  config_.compression.raw_partition_bytes = partition;
  config_.server.engine_threads = 1;
  config_.server.numa = config::NumaMode::kOff;
  config_.worker.compress_threads = 1;
  config_.worker.numa = config::NumaMode::kOff;
  config_.worker.op_timeout = kOpTimeout;
}

PushPullCluster::~PushPullCluster() {
  StopScheduler();
  // Every node's waits are bounded (startup_timeout, op_timeout, the shutdown), and the
  // scheduler's Shutdown ends them sooner.
  for (auto& n : nodes_) {
    if (n->thread.joinable()) n->thread.join();
  }
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
  scheduler_.reset();
}

void PushPullCluster::StopScheduler() {
  std::lock_guard<std::mutex> lock(mu_);
  if (scheduler_ && !scheduler_done_) scheduler_->Stop();
}

Status PushPullCluster::Run(ClusterFigures* f) {
  scheduler::SchedulerOptions so;
  so.cluster = config_;
  so.inproc_hub = hub_;
  BP_ASSIGN_OR_RETURN(scheduler_, scheduler::Scheduler::Create(so));
  scheduler_thread_ = std::thread([this] {
    Status s = scheduler_->Run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      scheduler_done_ = true;
      scheduler_status_ = std::move(s);
    }
    cv_.notify_all();
  });
  const uint32_t servers = spec_.servers();
  for (uint32_t i = 0; i < spec_.nodes; ++i) {
    auto n = std::make_unique<NodeThread>();
    const bool server = i < servers;
    n->label = server ? fmt::format("server {}", i) : fmt::format("worker {}", i - servers);
    n->start.resize(rounds_);
    n->done.resize(rounds_);
    nodes_.push_back(std::move(n));
  }
  for (uint32_t i = 0; i < spec_.nodes; ++i) {
    NodeThread* n = nodes_[i].get();
    n->thread = i < servers ? std::thread([this, n, i] { RunServer(n, i); })
                            : std::thread([this, n, i, servers] { RunWorker(n, i - servers); });
  }
  const Clock::time_point deadline =
      Clock::now() + config_.startup_timeout + rounds_ * kOpTimeout + 2 * kSlack;
  std::unique_lock<std::mutex> lock(mu_);
  auto all_finished = [&] {
    for (const auto& n : nodes_) {
      if (!n->finished) return false;
    }
    return scheduler_done_;
  };
  // On the first failure, stop the scheduler: its Shutdown ends every other node's calls.
  cv_.wait_until(lock, deadline, [&] { return all_finished() || !FirstFailureLocked().ok(); });
  if (Status failed = FirstFailureLocked(); !failed.ok()) {
    lock.unlock();
    StopScheduler();
    lock.lock();
    cv_.wait_until(lock, deadline, all_finished);
    return FirstFailureLocked();
  }
  if (!all_finished()) {
    std::string late;
    for (const auto& n : nodes_) {
      if (!n->finished) late += (late.empty() ? "" : ", ") + n->label;
    }
    if (!scheduler_done_) late += (late.empty() ? "" : ", ") + std::string("the scheduler");
    return TimeoutError(fmt::format("push/pull cluster: still running after {:.0f} ms: {}",
                                    Ms(config_.startup_timeout + rounds_ * kOpTimeout + 2 * kSlack),
                                    late));
  }
  if (!scheduler_status_.ok()) return scheduler_status_.WithContext("push/pull cluster: scheduler");
  std::vector<double> timed;
  for (uint32_t r = 0; r < rounds_; ++r) {
    Clock::time_point first_start = Clock::time_point::max();
    Clock::time_point last_done = Clock::time_point::min();
    for (uint32_t w = servers; w < spec_.nodes; ++w) {
      first_start = std::min(first_start, nodes_[w]->start[r]);
      last_done = std::max(last_done, nodes_[w]->done[r]);
    }
    const double ms = Ms(last_done - first_start);
    if (r == 0) {
      f->pushpull_first_round_ms = ms;
    } else {
      timed.push_back(ms);
    }
  }
  f->pushpull_round_ms = Percentile(timed, 50);
  f->pushpull_round_ms_max = Percentile(timed, 100);
  f->pushpull_rounds = static_cast<int64_t>(timed.size());
  return Status::Ok();
}

void PushPullCluster::RunServer(NodeThread* n, uint32_t rank) {
  server::ServerOptions o;
  o.cluster = config_;
  o.rank = rank;
  o.inproc_hub = hub_;
  StatusOr<std::unique_ptr<server::Server>> server = server::Server::Create(o);
  if (!server.ok()) {
    Finish(n, server.status());
    return;
  }
  Status s =
      (*server)->Wait(config_.startup_timeout + rounds_ * kOpTimeout + kSlack);  // clean shutdown
  // One partition of every worker's tensor per round: the round went through every server.
  const uint64_t pushes = (*server)->stats().pushes_accepted;
  const uint64_t expected = uint64_t{spec_.workers()} * rounds_;
  if (s.ok() && pushes != expected) {
    s = InternalError(fmt::format("received {} pushes, expected {} (one per worker and round)",
                                  pushes, expected));
  }
  server->reset();
  Finish(n, s);
}

void PushPullCluster::RunWorker(NodeThread* n, uint32_t rank) {
  worker::ClientOptions o;
  o.cluster = config_;
  o.rank = rank;
  o.inproc_hub = hub_;
  StatusOr<std::unique_ptr<worker::Client>> client = worker::Client::Create(o);
  if (!client.ok()) {
    Finish(n, client.status());
    return;
  }
  Status s = WorkerRounds(n, **client, rank);
  if (s.ok()) s = (*client)->Shutdown(config_.heartbeat_timeout + kSlack);
  client->reset();
  Finish(n, s);
}

Status PushPullCluster::WorkerRounds(NodeThread* n, worker::Client& client, uint32_t rank) {
  const size_t elements = size_t{spec_.pushpull_floats} * spec_.servers();
  BP_ASSIGN_OR_RETURN(const worker::TensorId tensor,
                      client.Declare("cluster_bench", elements, DType::kFloat32, 0, "none"));
  const std::vector<float> input(elements, static_cast<float>(rank + 1));
  std::vector<float> output(elements, 0.0f);
  // The average of 1..W.
  const float expected = static_cast<float>(spec_.workers() + 1) / 2.0f;
  for (uint32_t r = 0; r < rounds_; ++r) {
    BP_RETURN_IF_ERROR(client.Barrier());
    const Clock::time_point start = Clock::now();
    BP_RETURN_IF_ERROR(client
                           .PushPull(tensor, ConstTensorView(input.data(), elements),
                                     TensorView(output.data(), elements))
                           .Wait());
    const Clock::time_point done = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      n->start[r] = start;
      n->done[r] = done;
    }
    for (size_t i = 0; i < elements; ++i) {
      if (std::fabs(output[i] - expected) > 1e-4f * expected) {
        return InternalError(
            fmt::format("round {}: element {} is {}, expected {} (the average of "
                        "1..{})",
                        r, i, output[i], expected, spec_.workers()));
      }
    }
  }
  return Status::Ok();
}

void PushPullCluster::Finish(NodeThread* n, const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    n->finished = true;
    n->failure = s;
    n->failed_at = Clock::now();
  }
  cv_.notify_all();
}

Status PushPullCluster::FirstFailureLocked() const {
  const NodeThread* first = nullptr;
  for (const auto& n : nodes_) {
    if (n->finished && !n->failure.ok() && (first == nullptr || n->failed_at < first->failed_at)) {
      first = n.get();
    }
  }
  if (first == nullptr) return Status::Ok();
  return first->failure.WithContext("push/pull cluster: " + first->label);
}

}  // namespace

Status RunPushPullRounds(const ClusterSpec& spec, int64_t fd_limit, ClusterFigures* figures) {
  if (spec.pushpull_rounds == 0) {
    figures->pushpull_skipped = "--pushpull-rounds 0";
    return Status::Ok();
  }
  if (spec.transport == "zmq") {
    // Every node to the scheduler and back, every worker to every server and back.
    const double connections =
        2.0 * spec.nodes + 2.0 * static_cast<double>(spec.workers()) * spec.servers();
    const double estimate = static_cast<double>(OpenFds()) +
                            (spec.nodes + 1) * figures->fds_per_endpoint +
                            connections * figures->fds_per_connection;
    if (!(estimate <= kFdHeadroom * static_cast<double>(fd_limit))) {
      figures->pushpull_skipped = fmt::format(
          "not run: {} workers x {} servers over zmq in one process need about {:.0f} file "
          "descriptors ({} endpoints at {:.0f} and {:.0f} connections at {:.1f}, both ends here, "
          "as counted on the control-plane cluster), above {:.0f}% of RLIMIT_NOFILE ({})",
          spec.workers(), spec.servers(), estimate, spec.nodes + 1, figures->fds_per_endpoint,
          connections, figures->fds_per_connection, 100 * kFdHeadroom, fd_limit);
      return Status::Ok();
    }
  }
  PushPullCluster cluster(spec);
  return cluster.Run(figures);
}

}  // namespace bitpush::bench::cluster
