#include "worker/daemon.h"

#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "common/logging.h"
#include "common/vector_ops.h"
#include "worker/daemon/daemon_state.h"
#include "worker/ipc/local_protocol.h"

namespace bitpush::worker {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kMaxPollWait{500};

}  // namespace

Daemon::Daemon(DaemonOptions options) : options_(std::move(options)) {}

DaemonStats Daemon::stats() const {
  DaemonStats s;
  s.refused_connections = refused_connections_.load(std::memory_order_relaxed);
  return s;
}

StatusOr<std::unique_ptr<Daemon>> Daemon::Create(DaemonOptions options) {
  BP_RETURN_IF_ERROR(config::ValidateClusterConfig(options.cluster));
  if (options.rank >= options.cluster.workers.size()) {
    return InvalidArgumentError(
        fmt::format("bitpush-worker: rank {} but the cluster has {} workers", options.rank,
                    options.cluster.workers.size()));
  }
  if (options.completion_threads == 0) {
    return InvalidArgumentError("DaemonOptions.completion_threads must be >= 1");
  }
  std::unique_ptr<Daemon> d(new Daemon(std::move(options)));
  DaemonOptions& o = d->options_;
  d->label_ = fmt::format("bitpush-worker node {}", o.rank);
  d->socket_path_ = DaemonSocketPath(o.socket_path, o.cluster, o.rank);
  d->local_size_ = o.local_size != 0 ? o.local_size : o.cluster.ProcessesOnNode(o.rank);
  if (o.cluster.ProcessCountsDiffer()) {
    const uint32_t configured = o.cluster.ProcessesOnNode(o.rank);
    if (d->local_size_ != configured) {
      return InvalidArgumentError(fmt::format(
          "{}: --local-size {} differs from the {} training processes cluster.workers[{}] has in "
          "{}; the nodes run different numbers of processes, so each must run exactly its "
          "configured count (the averaging weights depend on it)",
          d->label_, d->local_size_, configured, o.rank, o.cluster.source));
    }
    // Servers divide by the number of nodes W; the node's sum times W / (all processes) makes
    // the result the average over every process of the cluster.
    d->average_scale_ = static_cast<float>(o.cluster.workers.size()) /
                        static_cast<float>(o.cluster.TotalProcesses());
  }
  d->gather_timeout_ =
      o.gather_timeout.count() > 0 ? o.gather_timeout : o.cluster.worker.op_timeout;
  if (o.sweep_stale_segments) {
    StatusOr<std::vector<std::string>> swept = ipc::SweepStaleSegments();
    if (!swept.ok()) {
      BP_LOG_WARN("{}: sweeping stale segments: {}", d->label_, swept.status().ToString());
    } else if (!swept->empty()) {
      BP_LOG_INFO("{}: removed {} stale shared-memory segment(s) of crashed processes", d->label_,
                  swept->size());
    }
  }
  BP_ASSIGN_OR_RETURN(d->listener_, ipc::Listener::Listen(d->socket_path_));
  d->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (d->wake_fd_ < 0) return InternalError(fmt::format("{}: eventfd failed", d->label_));
  // The CPU split (header comment).
  StatusOr<std::vector<CpuSlot>> cores = ProcessCores();
  const size_t core_count = cores.ok() ? cores->size() : AllowedCpuCount();
  d->reduce_threads_ = o.reduce_threads != 0                  ? o.reduce_threads
                       : o.cluster.worker.reduce_threads != 0 ? o.cluster.worker.reduce_threads
                                                              : DefaultReduceThreads(core_count);
  d->compress_threads_ = o.cluster.worker.compress_threads != 0
                             ? o.cluster.worker.compress_threads
                             : DefaultCompressThreads(core_count, d->reduce_threads_);
  if (o.cluster.worker.numa != config::NumaMode::kOff) {
    if (cores.ok()) {
      d->cpu_plan_ = PlanWorkerCpus(*cores, d->reduce_threads_, d->compress_threads_);
    } else if (o.cluster.worker.numa == config::NumaMode::kOn) {
      return cores.status().WithContext("worker.numa is on");
    } else {
      BP_LOG_WARN("{}: threads not pinned: {}", d->label_, cores.status().ToString());
    }
  }
  BP_LOG_INFO("{}: {} core(s): {} reduce thread(s), {} compression thread(s); {}", d->label_,
              core_count, d->reduce_threads_, d->compress_threads_,
              d->cpu_plan_.network_cpu < 0 ? std::string("not pinned")
                                           : DescribeWorkerCpuPlan(d->cpu_plan_));
  LocalReduceOptions ro;
  ro.threads = d->reduce_threads_;
  ro.cpus = d->cpu_plan_.reduce_cpus;
  ro.name = "bp-dreduce";
  BP_ASSIGN_OR_RETURN(d->reducer_, LocalReducer::Create(ro));
  // Threads started from here on inherit the network core (the engine's I/O and dispatcher
  // threads, the round and completion threads); the compression pool pins itself.
  std::optional<ScopedThreadAffinity> network;
  if (d->cpu_plan_.network_cpu >= 0) network.emplace(d->cpu_plan_.network_cpu);
  EngineOptions eo;
  eo.cluster = o.cluster;
  eo.cluster.worker.compress_threads = d->compress_threads_;
  eo.compress_cpus = d->cpu_plan_.compress_cpus;
  eo.rank = o.rank;
  eo.inproc_hub = o.inproc_hub;
  eo.trace_process = "daemon";
  BP_ASSIGN_OR_RETURN(d->engine_, Engine::Create(std::move(eo)));
  d->round_thread_ = std::thread([p = d.get()] { p->RoundLoop(); });
  pthread_setname_np(d->round_thread_.native_handle(), "bp-dround");
  NodeBarrierOptions bo;
  bo.label = d->label_;
  bo.cluster_barrier = [p = d.get()] { return p->engine_->Barrier(); };
  bo.wait_for_servers = [p = d.get()](std::chrono::milliseconds timeout) {
    return p->engine_->WaitForServers(timeout);
  };
  bo.node_error = [p = d.get()] {
    std::lock_guard<std::mutex> lock(p->mu_);
    return p->node_error_;
  };
  d->barrier_ = std::make_unique<NodeBarrier>(std::move(bo));
  d->gpu_ = std::make_unique<GpuRounds>(d->label_, d->gather_timeout_);
  for (uint32_t i = 0; i < o.completion_threads; ++i) {
    d->done_threads_.emplace_back([p = d.get()] { p->DoneLoop(); });
    pthread_setname_np(d->done_threads_.back().native_handle(), "bp-ddone");
  }
  return d;
}

Daemon::~Daemon() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_threads_ = true;
  }
  round_cv_.notify_all();
  if (engine_) engine_->Close();
  if (round_thread_.joinable()) round_thread_.join();
  if (barrier_) barrier_->Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_done_ = true;
  }
  done_cv_.notify_all();
  for (std::thread& t : done_threads_) {
    if (t.joinable()) t.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Daemon::Stop() {
  stop_requested_.store(true);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

// ---------------------------------------------------------------------------------------------
// Poll loop

Status Daemon::Run() {
  BP_LOG_INFO("{}: serving {} training process(es) at {}", label_,
              local_size_ == 0 ? std::string("a number of") : std::to_string(local_size_),
              socket_path_);
  bool clean = false;
  while (!ended_) {
    std::vector<TensorState*> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished.swap(finished_);
    }
    std::vector<TensorState*> declared;
    {
      std::lock_guard<std::mutex> lock(mu_);
      declared.swap(declared_);
    }
    for (TensorState* t : declared) FinishDeclaration(*t);
    for (TensorState* t : finished) {
      t->in_flight = false;
      MaybeDispatch(*t);
    }
    if (stop_requested_.load()) {
      FailNode(CancelledError(fmt::format("{} is shutting down (stopped)", label_)), nullptr);
      end_status_ = Status::Ok();
      break;
    }
    if (local_size_ > 0 && goodbyes_ == local_size_) {
      clean = true;
      break;
    }
    std::vector<pollfd> fds;
    fds.push_back({listener_->fd(), POLLIN, 0});
    fds.push_back({wake_fd_, POLLIN, 0});
    for (const auto& c : conns_) fds.push_back({c->channel->fd(), POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), static_cast<int>(NextPollTimeout().count()));
    if (n < 0 && errno != EINTR) {
      FailNode(InternalError(fmt::format("{}: poll failed: {}", label_, strerror(errno))), nullptr);
      break;
    }
    if (fds[1].revents != 0) {
      uint64_t v = 0;
      (void)!read(wake_fd_, &v, sizeof(v));
    }
    // Only the connections that were polled (AcceptOne appends to conns_).
    const size_t polled = fds.size() - 2;
    if (fds[0].revents != 0) AcceptOne();
    for (size_t i = 0; i < polled && !ended_; ++i) {
      if (fds[i + 2].revents != 0 && !conns_[i]->dead) ReadFrom(*conns_[i]);
    }
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::unique_ptr<Conn>& c) { return c->dead; }),
                 conns_.end());
    if (!ended_) CheckGatherDeadlines();
    if (!ended_) {
      // The cluster is gone (the scheduler shut it down, a server died): the node can never
      // serve again, so it ends now — idle or not — instead of waiting for a push_pull to
      // fail (or for a signal, under systemd). Noticed within kMaxPollWait.
      if (Status cluster = ClusterFailure(); !cluster.ok()) FailNode(cluster, nullptr);
    }
    if (!ended_ && !decl_error_.ok() &&
        ((joined_.size() >= local_size_ &&
          std::none_of(conns_.begin(), conns_.end(),
                       [](const std::unique_ptr<Conn>& c) { return c->hello; })) ||
         Clock::now() >= decl_error_deadline_)) {
      // Every local rank joined (and was or will be told the difference) and is gone, or the
      // missing ones did not come within the gathering bound.
      ended_ = true;
      end_status_ = decl_error_;
    }
  }

  Status result = end_status_;
  if (clean) {
    BP_LOG_INFO("{}: every training process said Goodbye; shutting the node down", label_);
    result = engine_->Shutdown(options_.cluster.startup_timeout);
  } else {
    engine_->Close();  // pending push_pulls fail now (the completion thread answers them)
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_threads_ = true;
  }
  round_cv_.notify_all();
  round_thread_.join();  // answers what it still had: the completion thread takes it
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_done_ = true;
  }
  done_cv_.notify_all();
  for (std::thread& t : done_threads_) t.join();
  for (const auto& c : conns_) c->channel->Shutdown();
  conns_.clear();
  listener_.reset();  // unlinks the socket path
  return result;
}

milliseconds Daemon::NextPollTimeout() const {
  Clock::time_point next = Clock::now() + kMaxPollWait;
  for (const auto& t : tensors_) {
    if (t->handed > 0 && t->handed < local_size_) next = std::min(next, t->deadline);
  }
  const auto wait = std::chrono::duration_cast<milliseconds>(next - Clock::now()) + milliseconds(1);
  return std::max(milliseconds(0), wait);
}

Status Daemon::ClusterFailure() const {
  Status cluster = engine_->status();
  if (cluster.ok()) return cluster;
  return Status(cluster.code(),
                fmt::format("{}: the cluster failed: {}", label_, cluster.message()));
}

void Daemon::FailNode(const Status& error, const Conn* dead) {
  if (ended_) return;
  ended_ = true;
  end_status_ = error;
  BP_LOG_ERROR("{}", error.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    node_error_ = error;
  }
  if (dead != nullptr) {
    // Its segments go now (the name; a round in flight keeps its mapping until it ends).
    for (const auto& [name, seg] : dead->segments) {
      const Status s = ipc::UnlinkSegment(name);
      if (!s.ok()) BP_LOG_WARN("{}: {}", label_, s.ToString());
    }
  }
  for (const auto& tp : tensors_) {
    TensorState& t = *tp;
    for (uint32_t r = 0; r < t.present.size(); ++r) {
      if (!t.present[r]) continue;
      if (dead == nullptr || t.slots[r].channel != dead->channel) {
        SendDone(*t.slots[r].channel, t.index, t.round, error);
      }
    }
    t.slots.assign(t.present.size(), Slot());
    t.present.assign(t.present.size(), false);
    t.handed = 0;
    for (const auto& ch : t.waiting) {
      v1::LocalMessage m;
      v1::LocalDeclareReply* r = m.mutable_declare_reply();
      r->set_index(t.index);
      r->set_status_code(static_cast<uint32_t>(error.code()));
      r->set_message(error.message());
      (void)ipc::SendLocalMessage(*ch, m);
    }
    t.waiting.clear();
  }
  barrier_->FailWaiting(error, dead == nullptr ? nullptr : dead->channel.get());
  for (const auto& c : conns_) {
    if (c.get() == dead || !c->hello || c->dead) continue;
    v1::LocalMessage m;
    m.mutable_goodbye()->set_reason(error.message());
    (void)ipc::SendLocalMessage(*c->channel, m);
  }
}

}  // namespace bitpush::worker
