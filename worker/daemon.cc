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
#include "worker/ipc/local_protocol.h"

namespace bitpush::worker {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kMaxPollWait{500};

}  // namespace

struct Daemon::Conn {
  std::shared_ptr<ipc::Channel> channel;
  pid_t pid = 0;
  bool hello = false;
  uint32_t local_rank = 0;
  std::string who;  // "local rank 1 (pid 4711)" after Hello, "pid 4711" before
  bool goodbye = false;
  bool dead = false;  // to be removed after this poll round
  uint32_t next_decl = 0;
  uint64_t next_barrier = 0;
  std::vector<uint64_t> next_round;  // per tensor
  std::map<std::string, std::shared_ptr<ipc::ShmSegment>> segments;
  // CUDA IPC mappings of the process's staging buffers, by handle bytes.
  std::map<std::string, std::shared_ptr<gpu::IpcMapping>> gpu_maps;
};

struct Daemon::TensorState {
  uint32_t index = 0;
  // Declaration (poll loop).
  v1::LocalDeclare first;
  std::string first_who;
  std::vector<std::shared_ptr<ipc::Channel>> waiting;  // declared, verdict not sent yet
  uint32_t declared = 0;
  bool decided = false;
  Status verdict;
  // Accepted tensors.
  TensorId engine_id;
  DType dtype = DType::kFloat32;
  size_t elements = 0;
  size_t bytes = 0;
  float scale = 1.0f;
  bool cuda = false;         // the GPU path (LocalDeclare.cuda)
  gpu::PinnedBuffer pinned;  // CUDA tensors: the fp16 sum / result in page-locked memory
  // The node's reduced input and the engine's output (aliased). Touched by the round and
  // completion threads only while in_flight.
  std::vector<uint8_t> buffer;
  Status error;  // sticky: a round failed while gathering (rounds out of step)
  // Gathering (poll loop).
  uint64_t round = 0;
  uint32_t handed = 0;
  std::vector<bool> present;
  std::vector<Slot> slots;
  Clock::time_point deadline;
  bool in_flight = false;
  uint64_t flight_round = 0;  // the round in_flight is about
  // Completion threads -> poll loop, guarded by mu_: every round below this one left the engine
  // (set before its Dones go out, so a process that got its Done finds the round ended even
  // before the poll loop took it from finished_).
  uint64_t rounds_ended = 0;
};

Daemon::Daemon(DaemonOptions options) : options_(std::move(options)) {}

StatusOr<std::unique_ptr<Daemon>> Daemon::Create(DaemonOptions options) {
  BP_RETURN_IF_ERROR(scheduler::ValidateClusterConfig(options.cluster));
  if (options.rank >= options.cluster.workers.size()) {
    return InvalidArgumentError(
        fmt::format("bitpush-worker: rank {} but the cluster has {} workers", options.rank,
                    options.cluster.workers.size()));
  }
  const std::string& numa = options.cluster.worker.numa;
  if (numa != "auto" && numa != "on" && numa != "off") {
    return InvalidArgumentError(fmt::format("worker.numa must be auto, on or off, got '{}'", numa));
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
  if (o.cluster.worker.numa != "off") {
    if (cores.ok()) {
      d->cpu_plan_ = PlanWorkerCpus(*cores, d->reduce_threads_, d->compress_threads_);
    } else if (o.cluster.worker.numa == "on") {
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
  BP_ASSIGN_OR_RETURN(d->engine_, Engine::Create(std::move(eo)));
  d->round_thread_ = std::thread([p = d.get()] { p->RoundLoop(); });
  pthread_setname_np(d->round_thread_.native_handle(), "bp-dround");
  d->barrier_thread_ = std::thread([p = d.get()] { p->BarrierLoop(); });
  pthread_setname_np(d->barrier_thread_.native_handle(), "bp-dbarrier");
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
  barrier_cv_.notify_all();
  if (barrier_thread_.joinable()) barrier_thread_.join();
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
      if (Status cluster = engine_->status(); !cluster.ok()) {
        FailNode(Status(cluster.code(),
                        fmt::format("{}: the cluster failed: {}", label_, cluster.message())),
                 nullptr);
      }
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

void Daemon::AcceptOne() {
  StatusOr<std::unique_ptr<ipc::Channel>> ch = listener_->Accept(milliseconds(0));
  if (!ch.ok()) {
    if (ch.status().code() != StatusCode::kTimeout) {
      BP_LOG_WARN("{}: {}", label_, ch.status().ToString());
    }
    return;
  }
  auto c = std::make_unique<Conn>();
  c->channel = std::shared_ptr<ipc::Channel>(std::move(ch).value());
  c->pid = c->channel->peer().pid;
  c->who = fmt::format("pid {}", c->pid);
  conns_.push_back(std::move(c));
}

void Daemon::ReadFrom(Conn& c) {
  for (;;) {
    StatusOr<v1::LocalMessage> m = ipc::ReceiveLocalMessage(*c.channel, milliseconds(0));
    Status s = m.ok() ? Handle(c, *m) : m.status();
    if (m.status().code() == StatusCode::kTimeout) return;  // drained
    if (s.ok()) {
      if (ended_ || c.dead) return;
      continue;
    }
    if (!c.hello || c.goodbye || !decl_error_.ok()) {
      // Refused, never introduced itself, left cleanly, or left a node whose declarations
      // already failed (it was told why; its siblings are told on their own).
      DropConn(c);
      return;
    }
    FailNode(UnavailableError(
                 fmt::format("{}: training process {} failed: {}", label_, c.who, s.message())),
             &c);
    return;
  }
}

Status Daemon::Handle(Conn& c, const v1::LocalMessage& m) {
  if (m.has_hello()) {
    if (c.hello) return InvalidArgumentError(fmt::format("{} sent a second Hello", c.who));
    OnHello(c, m.hello());
    return Status::Ok();
  }
  if (!c.hello) {
    return InvalidArgumentError(fmt::format("{} sent a message before its Hello", c.who));
  }
  if (m.has_declare()) {
    if (m.declare().index() != c.next_decl) {
      return InvalidArgumentError(fmt::format("{} declared tensor #{} but #{} was next", c.who,
                                              m.declare().index(), c.next_decl));
    }
    ++c.next_decl;
    OnDeclare(c, m.declare());
    return Status::Ok();
  }
  if (m.has_push_pull()) {
    OnPushPull(c, m.push_pull());
    return Status::Ok();
  }
  if (m.has_error_feedback()) {
    OnErrorFeedback(c, m.error_feedback());
    return Status::Ok();
  }
  if (m.has_barrier()) {
    if (m.barrier().seq() != c.next_barrier) {
      return InvalidArgumentError(fmt::format("{} entered barrier {} but {} was next", c.who,
                                              m.barrier().seq(), c.next_barrier));
    }
    ++c.next_barrier;
    OnBarrier(c, m.barrier().seq());
    return Status::Ok();
  }
  if (m.has_goodbye()) {
    c.goodbye = true;
    ++goodbyes_;
    return Status::Ok();
  }
  return InvalidArgumentError(
      fmt::format("{} sent a message a training process never sends", c.who));
}

void Daemon::OnHello(Conn& c, const v1::LocalHello& h) {
  std::map<uint32_t, pid_t> ranks;
  for (const auto& o : conns_) {
    if (o->hello && !o->dead) ranks[o->local_rank] = o->pid;
  }
  v1::LocalHelloReply reply = ipc::JudgeHello(h, c.pid, local_size_, ranks);
  if (reply.refusal() == v1::LocalHelloReply::REFUSAL_NONE && ended_) {
    reply.set_refusal(v1::LocalHelloReply::REFUSAL_SHUTTING_DOWN);
    reply.set_reason(fmt::format("{} is shutting down", label_));
  }
  reply.set_node_rank(options_.rank);
  reply.set_num_nodes(static_cast<uint32_t>(options_.cluster.workers.size()));
  reply.set_op_timeout_ms(static_cast<uint64_t>(options_.cluster.worker.op_timeout.count()));
  v1::LocalMessage m;
  *m.mutable_hello_reply() = reply;
  const Status sent = ipc::SendLocalMessage(*c.channel, m);
  if (reply.refusal() != v1::LocalHelloReply::REFUSAL_NONE || !sent.ok()) {
    BP_LOG_WARN("{}: refused {}: {}", label_, c.who, reply.reason());
    DropConn(c);
    return;
  }
  if (local_size_ == 0) local_size_ = h.local_size();
  c.hello = true;
  c.local_rank = h.local_rank();
  joined_.insert(c.local_rank);
  c.who = ipc::DescribeLocalProcess(c.local_rank, c.pid);
  c.channel->set_peer_name(c.who);
  BP_LOG_INFO("{}: {} joined ({} of {})", label_, c.who, ranks.size() + 1, local_size_);
}

void Daemon::OnDeclare(Conn& c, const v1::LocalDeclare& d) {
  auto reply = [&](ipc::Channel& ch, const Status& s) {
    v1::LocalMessage m;
    v1::LocalDeclareReply* r = m.mutable_declare_reply();
    r->set_index(d.index());
    r->set_status_code(static_cast<uint32_t>(s.code()));
    r->set_message(s.message());
    (void)ipc::SendLocalMessage(ch, m);
  };
  if (d.index() == tensors_.size()) {
    auto t = std::make_unique<TensorState>();
    t->index = d.index();
    t->first = d;
    t->first_who = c.who;
    tensors_.push_back(std::move(t));
  }
  TensorState& t = *tensors_[d.index()];
  if (t.decided) {
    reply(*c.channel, t.verdict);
    return;
  }
  if (t.declared > 0) {
    if (std::optional<std::string> diff =
            ipc::DeclarationDifference(t.first, t.first_who, d, c.who)) {
      t.decided = true;
      t.verdict = InvalidArgumentError(*diff);
      if (decl_error_.ok()) {
        decl_error_ = t.verdict;
        decl_error_deadline_ = Clock::now() + gather_timeout_;
      }
      BP_LOG_ERROR("{}: {}", label_, *diff);
      for (const auto& ch : t.waiting) reply(*ch, t.verdict);
      t.waiting.clear();
      reply(*c.channel, t.verdict);
      return;
    }
  }
  t.waiting.push_back(c.channel);
  if (++t.declared < local_size_) return;
  // Every local process declared the same: declare it once for the node — on the round
  // thread, in order with the rounds already dispatched. The engine announces the tensors
  // declared since its last check with the next push_pull, and that push_pull runs on the round
  // thread: declaring there too makes what is announced with which round the same on every
  // node (each process declares and pushes in the same order), never a race between this loop
  // and the round thread. The verdict comes back through FinishDeclaration.
  auto job = std::make_unique<RoundJob>();
  job->tensor = &t;
  job->declare = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_queue_.push_back(std::move(job));
  }
  round_cv_.notify_one();
}

void Daemon::DeclareForNode(TensorState& t) {
  const v1::LocalDeclare& d = t.first;
  if (d.dtype() > static_cast<uint32_t>(DType::kBFloat16)) {
    t.verdict = InvalidArgumentError(
        fmt::format("tensor #{} '{}': unknown dtype {}", d.index(), d.name(), d.dtype()));
    return;
  }
  TensorOptions o;
  o.priority = d.priority();
  o.compression = d.compression();
  o.op = d.sum() ? ReduceOp::kSum : ReduceOp::kAverage;
  t.dtype = static_cast<DType>(d.dtype());
  t.elements = d.elements();
  t.bytes = t.elements * DTypeSize(t.dtype);
  t.cuda = d.cuda();
  t.verdict = Status::Ok();
  if (t.cuda) {
    // The GPU path needs CUDA + NCCL here and a usable GPU; fp32 only (the cast kernels).
    t.verdict = gpu::GpuViability();
    if (t.verdict.ok() && t.dtype != DType::kFloat32) {
      t.verdict = InvalidArgumentError("a CUDA tensor must be float32");
    }
    if (t.verdict.ok()) {
      StatusOr<gpu::PinnedBuffer> pinned = gpu::PinnedBuffer::Allocate(t.elements * 2);
      t.verdict = pinned.status();
      if (pinned.ok()) t.pinned = std::move(pinned).value();
    }
    if (!t.verdict.ok()) {
      t.verdict = t.verdict.WithContext(
          fmt::format("{}: tensor #{} '{}' is on a GPU but this daemon cannot run the GPU path",
                      label_, d.index(), d.name()));
    }
  }
  StatusOr<TensorId> id =
      t.verdict.ok() ? engine_->Declare(d.name(), t.elements, t.dtype, o) : t.verdict;
  t.verdict = id.status();
  if (id.ok()) {
    t.engine_id = *id;
    t.scale = d.sum()                  ? 1.0f
              : average_scale_ != 0.0f ? average_scale_
              : local_size_ == 1       ? 1.0f
                                       : 1.0f / static_cast<float>(local_size_);
    t.buffer.resize(t.bytes);
  }
}

void Daemon::FinishDeclaration(TensorState& t) {
  t.decided = true;
  if (t.verdict.ok()) {
    t.present.assign(local_size_, false);
    t.slots.resize(local_size_);
  } else if (decl_error_.ok()) {
    // A refused tensor (bad spec, GPU path not viable, ...) ends the node like a declaration
    // difference: every process is told, and may leave without being a failure.
    decl_error_ = t.verdict;
    decl_error_deadline_ = Clock::now() + gather_timeout_;
    BP_LOG_ERROR("{}: {}", label_, t.verdict.message());
  }
  for (const auto& ch : t.waiting) {
    v1::LocalMessage m;
    v1::LocalDeclareReply* r = m.mutable_declare_reply();
    r->set_index(t.index);
    r->set_status_code(static_cast<uint32_t>(t.verdict.code()));
    r->set_message(t.verdict.message());
    (void)ipc::SendLocalMessage(*ch, m);
  }
  t.waiting.clear();
}

void Daemon::OnBarrier(Conn& c, uint64_t seq) {
  if (seq != barrier_seq_) {
    // Another process is still in an earlier barrier: this one waits for the next gathering.
    // (Every process enters barriers in order, so seq is barrier_seq_ or barrier_seq_ + 1.)
    if (seq != barrier_seq_ + 1) {
      SendBarrierDone(*c.channel, seq,
                      InvalidArgumentError(fmt::format(
                          "{}: {} entered barrier {} while barrier {} is being gathered", label_,
                          c.who, seq, barrier_seq_)));
      return;
    }
    barrier_next_.push_back(c.channel);
    return;
  }
  barrier_waiting_.push_back(c.channel);
  if (local_size_ == 0 || barrier_waiting_.size() < local_size_) return;
  auto job = std::make_unique<BarrierJob>();
  job->seq = barrier_seq_;
  job->channels = std::move(barrier_waiting_);
  barrier_waiting_ = std::move(barrier_next_);
  barrier_next_.clear();
  ++barrier_seq_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    barrier_queue_.push_back(std::move(job));
  }
  barrier_cv_.notify_one();
}

void Daemon::SendBarrierDone(ipc::Channel& ch, uint64_t seq, const Status& s) {
  v1::LocalMessage m;
  v1::LocalBarrierDone* d = m.mutable_barrier_done();
  d->set_seq(seq);
  d->set_status_code(static_cast<uint32_t>(s.code()));
  d->set_message(s.message());
  const Status sent = ipc::SendLocalMessage(ch, m);
  if (!sent.ok()) BP_LOG_DEBUG("{}: {}", label_, sent.ToString());
}

void Daemon::BarrierLoop() {
  for (;;) {
    std::unique_ptr<BarrierJob> job;
    Status node_error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      barrier_cv_.wait(lock, [&] { return stop_threads_ || !barrier_queue_.empty(); });
      if (barrier_queue_.empty()) return;
      job = std::move(barrier_queue_.front());
      barrier_queue_.pop_front();
      node_error = node_error_;
    }
    // The cluster's worker barrier: one per node (bounded by the scheduler client's barrier
    // timeout; Close() ends it).
    Status s = node_error.ok() ? engine_->Barrier() : node_error;
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!node_error_.ok() && s.code() == StatusCode::kCancelled) s = node_error_;
    }
    for (const auto& ch : job->channels) SendBarrierDone(*ch, job->seq, s);
  }
}

void Daemon::SendDone(ipc::Channel& ch, uint32_t tensor, uint64_t round, const Status& s) {
  v1::LocalMessage m;
  v1::LocalPushPullDone* d = m.mutable_push_pull_done();
  d->set_tensor(tensor);
  d->set_round(round);
  d->set_status_code(static_cast<uint32_t>(s.code()));
  d->set_message(s.message());
  const Status sent = ipc::SendLocalMessage(ch, m);
  if (!sent.ok()) BP_LOG_DEBUG("{}: {}", label_, sent.ToString());
}

void Daemon::OnPushPull(Conn& c, const v1::LocalPushPull& p) {
  auto refuse = [&](const Status& s) { SendDone(*c.channel, p.tensor(), p.round(), s); };
  if (p.tensor() >= tensors_.size() || !tensors_[p.tensor()]->decided) {
    refuse(FailedPreconditionError(fmt::format(
        "{}: push_pull of tensor #{} before every local process declared it", label_, p.tensor())));
    return;
  }
  TensorState& t = *tensors_[p.tensor()];
  if (!t.verdict.ok()) return refuse(t.verdict);
  if (!t.error.ok()) return refuse(t.error);
  if (c.next_round.size() <= t.index) c.next_round.resize(t.index + 1, 0);
  if (p.round() != c.next_round[t.index]) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} handed in round {} of tensor '{}', "
                    "expected round {}",
                    label_, c.who, p.round(), t.first.name(), c.next_round[t.index])));
  }
  Slot slot;
  slot.channel = c.channel;
  slot.who = c.who;
  if (t.cuda != p.has_gpu()) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} handed in tensor '{}' {} but it was declared {}", label_, c.who,
                    t.first.name(), p.has_gpu() ? "in GPU memory" : "in shared memory",
                    t.cuda ? "on a GPU" : "in host memory")));
  }
  if (t.cuda) {
    const v1::GpuSlice& g = p.gpu();
    if (g.bytes() != t.bytes || g.ipc_handle().size() != sizeof(gpu::GpuIpcHandle::bytes)) {
      return refuse(InvalidArgumentError(fmt::format(
          "{}: {}: GPU slice of tensor '{}' has {} bytes and a {}-byte handle, expected {} and {}",
          label_, c.who, t.first.name(), g.bytes(), g.ipc_handle().size(), t.bytes,
          sizeof(gpu::GpuIpcHandle::bytes))));
    }
    std::shared_ptr<gpu::IpcMapping>& map = c.gpu_maps[g.ipc_handle()];
    if (!map) {
      StatusOr<int> device = gpu::DeviceFromPciBusId(g.pci_bus_id());
      gpu::GpuIpcHandle h;
      std::memcpy(h.bytes.data(), g.ipc_handle().data(), h.bytes.size());
      StatusOr<gpu::IpcMapping> opened = device.ok() ? gpu::IpcMapping::Open(h, *device)
                                                     : StatusOr<gpu::IpcMapping>(device.status());
      if (!opened.ok()) {
        c.gpu_maps.erase(g.ipc_handle());
        return refuse(opened.status().WithContext(
            fmt::format("{}: GPU buffer of {} for tensor '{}'", label_, c.who, t.first.name())));
      }
      map = std::make_shared<gpu::IpcMapping>(std::move(opened).value());
    }
    slot.gpu = map;
  }
  for (int k = 0; k < 2 && !t.cuda; ++k) {
    const v1::ShmSlice& s = k == 0 ? p.input() : p.output();
    StatusOr<std::shared_ptr<ipc::ShmSegment>> seg =
        MapSlice(c, s, t.bytes, k == 0 ? "input" : "output");
    if (!seg.ok()) return refuse(seg.status());
    (k == 0 ? slot.in : slot.out) = *seg;
    (k == 0 ? slot.in_offset : slot.out_offset) = s.offset();
  }
  if (t.handed == 0) {
    t.round = p.round();
    t.deadline = Clock::now() + gather_timeout_;
  } else if (p.round() != t.round) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} handed in round {} of tensor '{}' while round {} is being gathered",
                    label_, c.who, p.round(), t.first.name(), t.round)));
  }
  ++c.next_round[t.index];
  t.present[c.local_rank] = true;
  t.slots[c.local_rank] = std::move(slot);
  ++t.handed;
  MaybeDispatch(t);
}

StatusOr<std::shared_ptr<ipc::ShmSegment>> Daemon::MapSlice(Conn& c, const v1::ShmSlice& s,
                                                            uint64_t expected_bytes,
                                                            std::string_view what) {
  BP_RETURN_IF_ERROR(ipc::ValidateSlice(s, c.pid, expected_bytes, what));
  std::shared_ptr<ipc::ShmSegment>& seg = c.segments[s.segment()];
  if (!seg) {
    StatusOr<ipc::ShmSegment> opened = ipc::ShmSegment::Open(s.segment(), s.segment_bytes());
    if (!opened.ok()) {
      c.segments.erase(s.segment());
      return opened.status();
    }
    seg = std::make_shared<ipc::ShmSegment>(std::move(opened).value());
  } else if (seg->size() != s.segment_bytes()) {
    return InvalidArgumentError(fmt::format("{}: segment {} is {} bytes, not {}", label_,
                                            s.segment(), seg->size(), s.segment_bytes()));
  }
  BP_RETURN_IF_ERROR(seg->CheckSize());
  return seg;
}

bool Daemon::RoundInEngine(const TensorState& t) {
  if (!t.in_flight) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return t.rounds_ended <= t.flight_round;
}

void Daemon::OnErrorFeedback(Conn& c, const v1::LocalErrorFeedback& e) {
  const char* what = e.restore() ? "restoring the error-feedback state" : "error-feedback state";
  auto answer = [&](const Status& s, uint64_t values, bool applied) {
    v1::LocalMessage m;
    v1::LocalErrorFeedbackDone* d = m.mutable_error_feedback_done();
    d->set_seq(e.seq());
    d->set_tensor(e.tensor());
    d->set_status_code(static_cast<uint32_t>(s.code()));
    d->set_message(s.message());
    d->set_values(values);
    d->set_applied(applied);
    const Status sent = ipc::SendLocalMessage(*c.channel, m);
    if (!sent.ok()) BP_LOG_DEBUG("{}: {}", label_, sent.ToString());
  };
  auto refuse = [&](const Status& s) { answer(s, 0, false); };
  if (e.tensor() >= tensors_.size() || !tensors_[e.tensor()]->decided) {
    return refuse(NotFoundError(
        fmt::format("{}: {} of tensor #{} asked by {}: no such tensor declared by every local "
                    "process",
                    label_, what, e.tensor(), c.who)));
  }
  TensorState& t = *tensors_[e.tensor()];
  const std::string name = t.first.name();
  if (!t.verdict.ok()) return refuse(t.verdict);
  if (!t.error.ok()) return refuse(t.error);
  if (c.local_rank < t.present.size() && t.present[c.local_rank]) {
    return refuse(FailedPreconditionError(
        fmt::format("{}: {} of tensor '{}' asked by {}: its push_pull of round {} is in flight "
                    "(handed in, waiting for the other local processes)",
                    label_, what, name, c.who, t.round)));
  }
  if (RoundInEngine(t)) {
    return refuse(FailedPreconditionError(
        fmt::format("{}: {} of tensor '{}' asked by {}: round {} of it is in flight", label_, what,
                    name, c.who, t.flight_round)));
  }
  const std::string slice_what = fmt::format("{}: {} of tensor '{}' ({} x float32) asked by {}",
                                             label_, what, name, t.elements, c.who);
  StatusOr<std::shared_ptr<ipc::ShmSegment>> seg =
      MapSlice(c, e.slice(), t.elements * sizeof(float), slice_what);
  if (!seg.ok()) return refuse(seg.status());
  float* values =
      reinterpret_cast<float*>(static_cast<uint8_t*>((*seg)->data()) + e.slice().offset());
  if (!e.restore()) {
    StatusOr<std::vector<float>> state = engine_->ErrorFeedbackState(t.engine_id);
    if (!state.ok()) return refuse(state.status().WithContext(label_));
    if (state->size() > t.elements) {
      return refuse(
          InternalError(fmt::format("{}: tensor '{}' keeps {} residual values for {} "
                                    "elements",
                                    label_, name, state->size(), t.elements)));
    }
    if (!state->empty()) std::memcpy(values, state->data(), state->size() * sizeof(float));
    return answer(Status::Ok(), state->size(), false);
  }
  if (e.values() > t.elements) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} values given, the tensor has {}", slice_what, e.values(), t.elements)));
  }
  const Span<const float> saved(values, e.values());
  if (c.local_rank == 0) {
    const Status s = engine_->RestoreErrorFeedbackState(t.engine_id, saved);
    return s.ok() ? answer(s, e.values(), true) : refuse(s.WithContext(label_));
  }
  // Not local rank 0: checked like rank 0's (the size the tensor keeps), not applied.
  StatusOr<std::vector<float>> kept = engine_->ErrorFeedbackState(t.engine_id);
  if (!kept.ok()) return refuse(kept.status().WithContext(label_));
  if (kept->empty() && !saved.empty()) {
    return refuse(InvalidArgumentError(fmt::format(
        "{}: it keeps no worker residual (uncompressed, or compression.error_feedback keeps none "
        "on workers) but {} values were given",
        slice_what, saved.size())));
  }
  if (!kept->empty() && saved.size() != kept->size()) {
    return refuse(InvalidArgumentError(fmt::format("{}: {} values given, the tensor has {}",
                                                   slice_what, saved.size(), t.elements)));
  }
  answer(Status::Ok(), e.values(), false);
}

void Daemon::MaybeDispatch(TensorState& t) {
  if (ended_ || t.in_flight || local_size_ == 0 || t.handed < local_size_) return;
  auto job = std::make_unique<RoundJob>();
  job->tensor = &t;
  job->round = t.round;
  job->slots = std::move(t.slots);
  t.slots.assign(local_size_, Slot());
  t.present.assign(local_size_, false);
  t.handed = 0;
  t.in_flight = true;
  t.flight_round = job->round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_queue_.push_back(std::move(job));
  }
  round_cv_.notify_one();
}

void Daemon::CheckGatherDeadlines() {
  const Clock::time_point now = Clock::now();
  for (const auto& tp : tensors_) {
    TensorState& t = *tp;
    if (t.handed == 0 || t.handed >= local_size_ || now < t.deadline) continue;
    std::string missing;
    for (uint32_t r = 0; r < local_size_; ++r) {
      if (t.present[r]) continue;
      std::string who = fmt::format("local rank {}", r);
      for (const auto& c : conns_) {
        if (c->hello && c->local_rank == r) who = c->who;
      }
      missing += (missing.empty() ? "" : ", ") + who;
    }
    t.error = TimeoutError(
        fmt::format("{}: round {} of tensor '{}' incomplete after {} ms: no push_pull from {}",
                    label_, t.round, t.first.name(), gather_timeout_.count(), missing));
    BP_LOG_ERROR("{}", t.error.message());
    for (uint32_t r = 0; r < local_size_; ++r) {
      if (t.present[r]) SendDone(*t.slots[r].channel, t.index, t.round, t.error);
    }
    t.slots.assign(local_size_, Slot());
    t.present.assign(local_size_, false);
    t.handed = 0;
  }
}

void Daemon::DropConn(Conn& c) {
  c.dead = true;
  c.channel->Shutdown();
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
  for (auto* waiting : {&barrier_waiting_, &barrier_next_}) {
    for (const auto& ch : *waiting) {
      if (dead == nullptr || ch != dead->channel) {
        SendBarrierDone(*ch, waiting == &barrier_waiting_ ? barrier_seq_ : barrier_seq_ + 1, error);
      }
    }
    waiting->clear();
  }
  for (const auto& c : conns_) {
    if (c.get() == dead || !c->hello || c->dead) continue;
    v1::LocalMessage m;
    m.mutable_goodbye()->set_reason(error.message());
    (void)ipc::SendLocalMessage(*c->channel, m);
  }
}

// ---------------------------------------------------------------------------------------------
// Round thread: local reduce, then the engine.

void Daemon::RoundLoop() {
  for (;;) {
    std::unique_ptr<RoundJob> job;
    Status node_error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      round_cv_.wait(lock, [&] { return stop_threads_ || !round_queue_.empty(); });
      if (round_queue_.empty()) return;
      job = std::move(round_queue_.front());
      round_queue_.pop_front();
      node_error = node_error_;
    }
    TensorState& t = *job->tensor;
    if (job->declare) {
      if (node_error.ok()) {
        DeclareForNode(t);
      } else {
        t.verdict = node_error;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        declared_.push_back(&t);
      }
      const uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
      continue;
    }
    if (!node_error.ok()) {
      job->error = node_error;
    } else {
      // CUDA tensors take the GPU path (GpuReduce); everything else in the round is the same.
      std::vector<const void*> srcs;
      if (t.cuda) job->error = GpuReduce(*job);
      for (const Slot& s : job->slots) {
        if (t.cuda) break;
        const Status size = s.in->CheckSize();
        if (!size.ok()) {
          job->error =
              DataLossError(fmt::format("{}: input of {}: {}", label_, s.who, size.message()));
          break;
        }
        srcs.push_back(static_cast<const uint8_t*>(s.in->data()) + s.in_offset);
      }
      if (job->error.ok() && !t.cuda) {
        job->error = reducer_->Reduce(t.dtype, srcs.data(), srcs.size(), t.buffer.data(),
                                      t.elements, t.scale);
      }
      if (job->error.ok()) {
        job->handle =
            engine_->PushPull(t.engine_id, ConstTensorView(t.buffer.data(), t.elements, t.dtype),
                              TensorView(t.buffer.data(), t.elements, t.dtype));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_queue_.push_back(std::move(job));
    }
    done_cv_.notify_one();
  }
}

// ---------------------------------------------------------------------------------------------
// Completion threads: results out to every process.

void Daemon::DoneLoop() {
  for (;;) {
    std::unique_ptr<RoundJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return !done_queue_.empty() || stop_done_; });
      if (done_queue_.empty()) return;
      job = std::move(done_queue_.front());
      done_queue_.pop_front();
    }
    TensorState& t = *job->tensor;
    Status s = job->error.ok() ? job->handle.Wait() : job->error;
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!node_error_.ok() && s.code() == StatusCode::kCancelled) s = node_error_;
    }
    if (s.ok() && t.cuda) s = GpuBroadcast(*job);
    {
      // The engine is done with this round (its handle completed): error-feedback requests of
      // the processes that get their Done below may go ahead (RoundInEngine).
      std::lock_guard<std::mutex> lock(mu_);
      t.rounds_ended = job->round + 1;
    }
    for (const Slot& slot : job->slots) {
      Status mine = s;
      if (mine.ok() && !t.cuda) {
        const Status size = slot.out->CheckSize();
        if (size.ok()) {
          std::memcpy(static_cast<uint8_t*>(slot.out->data()) + slot.out_offset, t.buffer.data(),
                      t.bytes);
        } else {
          mine =
              DataLossError(fmt::format("{}: output of {}: {}", label_, slot.who, size.message()));
        }
      }
      SendDone(*slot.channel, t.index, job->round, mine);
    }
    job.reset();  // drops the mappings a dead process's segments may still hold
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_.push_back(&t);
    }
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

// ---------------------------------------------------------------------------------------------
// The GPU path (CUDA tensors).

Status Daemon::GpuReduce(RoundJob& job) {
  TensorState& t = *job.tensor;
  std::vector<const float*> grads;
  std::vector<int> devices;
  for (const Slot& s : job.slots) {
    grads.push_back(static_cast<const float*>(s.gpu->data()));
    devices.push_back(s.gpu->device());
  }
  {
    std::lock_guard<std::mutex> lock(gpu_mu_);
    if (!gpu_group_) {
      // One NCCL rank per local process, in local-rank order, root = local rank 0's GPU.
      for (size_t i = 0; i < devices.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
          if (devices[i] == devices[j]) {
            return InvalidArgumentError(fmt::format(
                "{}: {} and {} both use GPU {}: the GPU path needs one GPU per training process",
                label_, job.slots[j].who, job.slots[i].who, devices[i]));
          }
        }
      }
      gpu::LocalGpuGroupOptions go;
      go.timeout = gather_timeout_;
      StatusOr<std::unique_ptr<gpu::LocalGpuGroup>> group =
          gpu::LocalGpuGroup::CreateForDevices(devices, go);
      if (!group.ok()) return group.status().WithContext(label_ + ": NCCL group of the node");
      gpu_group_ = std::move(group).value();
      gpu_devices_ = devices;
      BP_LOG_INFO("{}: GPU path over {} GPU(s)", label_, devices.size());
    } else if (devices != gpu_devices_) {
      return InvalidArgumentError(fmt::format(
          "{}: tensor '{}' round {}: the training processes' GPUs changed since the first GPU "
          "round",
          label_, t.first.name(), job.round));
    }
    BP_RETURN_IF_ERROR(gpu_group_->ReduceToHost(
        Span<const float* const>(grads.data(), grads.size()), t.elements, &t.pinned));
  }
  // The node's fp16 sum -> fp32 x (1/P) for the engine.
  HalfToFloatArray(t.pinned.halfs(), reinterpret_cast<float*>(t.buffer.data()), t.elements,
                   BestIsaLevel());
  if (t.scale != 1.0f) {
    float* f = reinterpret_cast<float*>(t.buffer.data());
    for (size_t i = 0; i < t.elements; ++i) f[i] *= t.scale;
  }
  return Status::Ok();
}

Status Daemon::GpuBroadcast(RoundJob& job) {
  TensorState& t = *job.tensor;
  FloatToHalfArray(reinterpret_cast<const float*>(t.buffer.data()), t.pinned.halfs(), t.elements,
                   BestIsaLevel());
  std::vector<float*> outs;
  for (const Slot& s : job.slots) outs.push_back(static_cast<float*>(s.gpu->data()));
  std::lock_guard<std::mutex> lock(gpu_mu_);
  if (!gpu_group_) return InternalError(label_ + ": GPU broadcast without a GPU group");
  return gpu_group_->BroadcastFromHost(&t.pinned, t.elements,
                                       Span<float* const>(outs.data(), outs.size()));
}

}  // namespace bitpush::worker
