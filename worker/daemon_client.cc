#include "worker/daemon_client.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "common/logging.h"
#include "worker/engine.h"
#include "worker/ipc/local_protocol.h"
#include "worker/ipc/socket_dir.h"

namespace bitpush::worker {

namespace {

using Clock = std::chrono::steady_clock;

// The reader wakes at least this often to enforce op deadlines.
constexpr std::chrono::milliseconds kReaderTick{100};

// How long a failed send waits for the reader to read what the daemon said before it closed.
constexpr std::chrono::milliseconds kLastWordsWait{1000};

Status StatusFromCode(uint32_t code, const std::string& message) {
  if (code == 0) return Status::Ok();
  if (code > static_cast<uint32_t>(StatusCode::kUnimplemented)) {
    return InternalError(message);
  }
  return Status(static_cast<StatusCode>(code), message);
}

}  // namespace

std::string DefaultDaemonSocketPath(uint32_t rank) {
  return ipc::DefaultSocketPath(rank);
}

std::string DaemonSocketPath(const std::string& explicit_path, const config::ClusterConfig& cluster,
                             uint32_t rank) {
  if (!explicit_path.empty()) return explicit_path;
  if (!cluster.worker.socket.empty()) return cluster.worker.SocketFor(rank);
  return DefaultDaemonSocketPath(rank);
}

DaemonClient::DaemonClient(const DaemonClientOptions& options) : options_(options) {}

StatusOr<std::unique_ptr<DaemonClient>> DaemonClient::Connect(const DaemonClientOptions& options) {
  if (options.local_size == 0 || options.local_rank >= options.local_size) {
    return InvalidArgumentError(
        fmt::format("daemon mode: local_rank {} must be below local_size {} (> 0)",
                    options.local_rank, options.local_size));
  }
  std::unique_ptr<DaemonClient> c(new DaemonClient(options));
  BP_ASSIGN_OR_RETURN(c->channel_,
                      ipc::Channel::Connect(options.socket_path, options.startup_timeout));
  c->daemon_name_ = fmt::format("bitpush-worker daemon at {} (pid {})", options.socket_path,
                                c->channel_->peer().pid);
  c->channel_->set_peer_name(c->daemon_name_);
  v1::LocalMessage hello;
  *hello.mutable_hello() = ipc::MakeHello(options.local_rank, options.local_size);
  BP_RETURN_IF_ERROR(ipc::SendLocalMessage(*c->channel_, hello));
  BP_ASSIGN_OR_RETURN(v1::LocalMessage reply,
                      ipc::ReceiveLocalMessage(*c->channel_, options.startup_timeout));
  if (!reply.has_hello_reply()) {
    return DataLossError(
        fmt::format("{} answered the Hello with another message", c->daemon_name_));
  }
  BP_RETURN_IF_ERROR(ipc::HelloReplyStatus(reply.hello_reply(), options.local_rank));
  c->node_rank_ = reply.hello_reply().node_rank();
  c->num_nodes_ = reply.hello_reply().num_nodes();
  c->daemon_minor_ = reply.hello_reply().version().minor();
  c->daemon_traces_ =
      c->daemon_minor_ >= ipc::kLocalMinorOptimizerSpan && reply.hello_reply().tracing();
  c->op_wait_ = std::chrono::milliseconds(reply.hello_reply().op_timeout_ms()) + kDaemonWaitMargin;
  c->reader_ = std::thread([p = c.get()] { p->ReaderLoop(); });
  return c;
}

DaemonClient::~DaemonClient() {
  Close();
}

StatusOr<TensorId> DaemonClient::Declare(const std::string& name, size_t elements, DType dtype,
                                         const TensorOptions& options) {
  if (name.empty()) return InvalidArgumentError("Declare: the tensor name is empty");
  // send_mu_ keeps the indices in order on the wire; mu_ is not held while sending, so the
  // reader can take the daemon's replies (and the daemon keep reading) meanwhile.
  std::lock_guard<std::mutex> send_lock(send_mu_);
  v1::LocalMessage m;
  TensorId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    if (closed_) return CancelledError("Declare: the client was closed");
    for (const auto& t : tensors_) {
      if (t->decl.name() == name) {
        return InvalidArgumentError(fmt::format("Declare: tensor '{}' is already declared", name));
      }
    }
    auto t = std::make_unique<Tensor>();
    t->decl.set_index(static_cast<uint32_t>(tensors_.size()));
    t->decl.set_name(name);
    t->decl.set_elements(elements);
    t->decl.set_dtype(static_cast<uint32_t>(dtype));
    t->decl.set_priority(options.priority);
    t->decl.set_compression(options.compression);
    t->decl.set_sum(options.op == ReduceOp::kSum);
    t->decl.set_cuda(options.cuda);
    if (options.cuda && dtype != DType::kFloat32) {
      return InvalidArgumentError(fmt::format("Declare '{}': a CUDA tensor must be float32, not {}",
                                              name, DTypeName(dtype)));
    }
    t->dtype = dtype;
    t->bytes = elements * DTypeSize(dtype);
    *m.mutable_declare() = t->decl;
    id.index = t->decl.index();
    tensors_.push_back(std::move(t));
  }
  Status sent = ipc::SendLocalMessage(*channel_, m);
  if (!sent.ok()) {
    std::unique_lock<std::mutex> lock(mu_);
    return SendFailedLocked(lock, sent);
  }
  return id;
}

Status DaemonClient::CommitDeclarations() {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::time_point deadline = Clock::now() + options_.startup_timeout;
  // All decided, or one refused (the others may never be decided: a sibling that declared
  // differently stops declaring).
  auto all_decided = [&] {
    bool all = true;
    for (const auto& t : tensors_) {
      if (t->verdict && !t->verdict->ok()) return true;
      all = all && t->verdict.has_value();
    }
    return all;
  };
  if (!cv_.wait_until(lock, deadline, [&] { return !error_.ok() || closed_ || all_decided(); })) {
    return TimeoutError(fmt::format(
        "no declaration verdict from the {} within {} ms (are all {} training processes of the "
        "node running and declaring?)",
        daemon_name_, options_.startup_timeout.count(), options_.local_size));
  }
  // A refusal names the cause; the node's end that may follow it (a sibling leaving) does not.
  for (const auto& t : tensors_) {
    if (t->verdict && !t->verdict->ok() && t->verdict->message() != error_.message()) {
      return *t->verdict;
    }
  }
  if (!error_.ok()) return error_;
  if (closed_) return CancelledError("CommitDeclarations: the client was closed");
  return Status::Ok();
}

PushPullHandle DaemonClient::PushPull(TensorId id, ConstTensorView input, TensorView output) {
  auto op = std::make_shared<OpState>();
  PushPullHandle handle(op);
  std::unique_lock<std::mutex> lock(mu_);
  if (id.index >= tensors_.size()) {
    op->Complete(InvalidArgumentError(fmt::format("PushPull: no tensor #{}", id.index)));
    return handle;
  }
  Tensor& t = *tensors_[id.index];
  op->tensor = t.decl.name();
  op->tensor_index = id.index;
  if (input.count() != t.decl.elements() || output.count() != t.decl.elements() ||
      input.dtype() != t.dtype || output.dtype() != t.dtype) {
    op->Complete(
        InvalidArgumentError(fmt::format("PushPull of tensor '{}': input/output must be {} x {}",
                                         t.decl.name(), t.decl.elements(), DTypeName(t.dtype))));
    return handle;
  }
  if (t.op) {
    op->Complete(FailedPreconditionError(
        fmt::format("PushPull of tensor '{}': a push_pull of it is in flight", t.decl.name())));
    return handle;
  }
  if (!error_.ok()) {
    op->Complete(error_);
    return handle;
  }
  if (!t.error.ok()) {
    op->Complete(t.error);
    return handle;
  }
  if (!t.verdict) {
    lock.unlock();
    const Status s = CommitDeclarations();
    lock.lock();
    if (!s.ok() && (!t.verdict || t.verdict->ok())) {
      op->Complete(s);
      return handle;
    }
  }
  if (!t.verdict) {
    op->Complete(
        InternalError("the daemon committed the declarations without a verdict on this tensor"));
    return handle;
  }
  if (!t.verdict->ok()) {
    op->Complete(*t.verdict);
    return handle;
  }
  if (t.bytes == 0) {
    op->Complete(Status::Ok());
    return handle;
  }
  v1::LocalMessage m;
  v1::LocalPushPull* p = m.mutable_push_pull();
  p->set_tensor(id.index);
  p->set_round(t.next_round);
  if (t.decl.cuda()) {
    // The GPU path: the gradient goes into this process's staging buffer (on the gradient's
    // device), which the daemon maps once by its CUDA IPC handle.
    const Status staged = StageOnDevice(t, input.data(), output.data());
    if (!staged.ok()) {
      op->Complete(staged);
      return handle;
    }
    v1::GpuSlice* g = p->mutable_gpu();
    g->set_ipc_handle(t.staging_ipc);
    g->set_pci_bus_id(t.staging_bus_id);
    g->set_bytes(t.bytes);
  } else {
    if (!t.segment.valid()) {
      StatusOr<ipc::ShmSegment> seg = ipc::ShmSegment::Create(t.bytes);
      if (!seg.ok()) {
        op->Complete(seg.status());
        return handle;
      }
      t.segment = std::move(seg).value();
    }
    std::memcpy(t.segment.data(), input.data(), t.bytes);
    v1::ShmSlice* in = p->mutable_input();
    in->set_segment(t.segment.name());
    in->set_segment_bytes(t.segment.size());
    in->set_offset(0);
    in->set_bytes(t.bytes);
    *p->mutable_output() = *in;
  }
  op->input = input;
  op->output = output;
  op->deadline = Clock::now() + op_wait_;
  t.op = op;
  t.op_round = t.next_round++;
  // Sent without mu_: the reader must be able to take answers (and so the daemon to send
  // them) while this frame waits for room in the socket.
  lock.unlock();
  Status sent = ipc::SendLocalMessage(*channel_, m);
  if (!sent.ok()) {
    lock.lock();
    (void)SendFailedLocked(lock, sent);  // completes the op with the cause
  }
  return handle;
}

Status DaemonClient::Barrier() {
  return NodeCollective(std::nullopt);
}

Status DaemonClient::WaitForServers(std::chrono::milliseconds timeout) {
  if (daemon_minor_ < ipc::kLocalMinorWaitForServers) {
    return UnimplementedError(fmt::format(
        "WaitForServers: the {} speaks local protocol {}.{}; a server rejoining a running job "
        "(cluster.server_rejoin_timeout_s) in daemon mode needs {}.{} (update bitpush-worker)",
        daemon_name_, ipc::kLocalProtocolMajor, daemon_minor_, ipc::kLocalProtocolMajor,
        ipc::kLocalMinorWaitForServers));
  }
  if (timeout.count() < 0) timeout = std::chrono::milliseconds(0);
  return NodeCollective(timeout);
}

Status DaemonClient::NodeCollective(std::optional<std::chrono::milliseconds> wait_for_servers) {
  const char* what = wait_for_servers ? "wait_for_servers" : "barrier";
  std::lock_guard<std::mutex> one_at_a_time(barrier_mu_);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    if (closed_) return CancelledError(fmt::format("{}: the client was closed", what));
    seq = next_barrier_++;
  }
  v1::LocalMessage m;
  m.mutable_barrier()->set_seq(seq);
  // The wait may last its timeout once every local process entered, which may take an op.
  std::chrono::milliseconds bound = op_wait_;
  if (wait_for_servers) {
    m.mutable_barrier()->set_wait_for_servers(true);
    m.mutable_barrier()->set_wait_timeout_ms(static_cast<uint64_t>(wait_for_servers->count()));
    bound += *wait_for_servers;
  }
  Status sent = ipc::SendLocalMessage(*channel_, m);
  std::unique_lock<std::mutex> lock(mu_);
  if (!sent.ok()) return SendFailedLocked(lock, sent);
  const bool answered = cv_.wait_for(
      lock, bound, [&] { return barrier_done_.count(seq) > 0 || !error_.ok() || closed_; });
  if (auto it = barrier_done_.find(seq); it != barrier_done_.end()) {
    Status s = it->second;
    barrier_done_.erase(it);
    return s;
  }
  if (!error_.ok()) return error_;
  if (closed_) return CancelledError(fmt::format("{}: the client was closed", what));
  (void)answered;
  // Later barriers would be out of step with the daemon's count: the connection is unusable.
  error_ = TimeoutError(fmt::format("{} {}: no answer from the {} within {} ms", what, seq,
                                    daemon_name_, bound.count()));
  FailAllLocked(error_);
  return error_;
}

StatusOr<std::vector<float>> DaemonClient::ErrorFeedbackState(TensorId tensor) {
  std::vector<float> read;
  BP_RETURN_IF_ERROR(StateRequest(tensor, v1::LocalErrorFeedback::STATE_WORKER_RESIDUAL, false, {},
                                  0, &read, nullptr));
  return read;
}

Status DaemonClient::RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  return StateRequest(tensor, v1::LocalErrorFeedback::STATE_WORKER_RESIDUAL, true, saved, 0,
                      nullptr, nullptr);
}

StatusOr<std::vector<float>> DaemonClient::ServerErrorFeedbackState(TensorId tensor) {
  std::vector<float> read;
  BP_RETURN_IF_ERROR(StateRequest(tensor, v1::LocalErrorFeedback::STATE_SERVER_RESIDUAL, false, {},
                                  0, &read, nullptr));
  return read;
}

Status DaemonClient::RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  return StateRequest(tensor, v1::LocalErrorFeedback::STATE_SERVER_RESIDUAL, true, saved, 0,
                      nullptr, nullptr);
}

StatusOr<uint64_t> DaemonClient::TensorRounds(TensorId tensor) {
  uint64_t rounds = 0;
  BP_RETURN_IF_ERROR(
      StateRequest(tensor, v1::LocalErrorFeedback::STATE_ROUNDS, false, {}, 0, nullptr, &rounds));
  return rounds;
}

Status DaemonClient::RestoreTensorRounds(TensorId tensor, uint64_t next) {
  return StateRequest(tensor, v1::LocalErrorFeedback::STATE_ROUNDS, true, {}, next, nullptr,
                      nullptr);
}

Status DaemonClient::StateRequest(TensorId id, v1::LocalErrorFeedback::State state, bool restore,
                                  Span<const float> saved, uint64_t next, std::vector<float>* read,
                                  uint64_t* count) {
  const bool rounds = state == v1::LocalErrorFeedback::STATE_ROUNDS;
  const bool worker = state == v1::LocalErrorFeedback::STATE_WORKER_RESIDUAL;
  const char* what = rounds    ? (restore ? "RestoreTensorRounds" : "TensorRounds")
                     : worker  ? (restore ? "RestoreErrorFeedbackState" : "ErrorFeedbackState")
                     : restore ? "RestoreServerErrorFeedbackState"
                               : "ServerErrorFeedbackState";
  std::lock_guard<std::mutex> one_at_a_time(ef_mu_);
  const uint32_t needs = worker ? ipc::kLocalMinorErrorFeedback : ipc::kLocalMinorJobState;
  if (daemon_minor_ < needs) {
    return UnimplementedError(
        fmt::format("{}: the {} speaks local protocol {}.{}; {} in daemon mode needs {}.{} (update "
                    "bitpush-worker)",
                    what, daemon_name_, ipc::kLocalProtocolMajor, daemon_minor_,
                    rounds   ? "reading or restoring the rounds"
                    : worker ? "the error-feedback state"
                             : "reading or restoring the servers' residual",
                    ipc::kLocalProtocolMajor, needs));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (id.index >= tensors_.size()) {
    return InvalidArgumentError(fmt::format("{}: no tensor #{}", what, id.index));
  }
  Tensor& t = *tensors_[id.index];
  const std::string name = t.decl.name();
  if (t.op) {
    return FailedPreconditionError(
        fmt::format("{} of tensor '{}': a push_pull of it is in flight", what, name));
  }
  if (!error_.ok()) return error_;
  if (closed_) return CancelledError(fmt::format("{}: the client was closed", what));
  if (!t.verdict) {
    // The daemon knows the tensor once every local process declared it.
    lock.unlock();
    Status s = CommitDeclarations();
    lock.lock();
    if (!s.ok() && (!t.verdict || t.verdict->ok())) return s;
  }
  if (!t.verdict) {
    return InternalError(fmt::format(
        "{}: the daemon committed the declarations without a verdict on this tensor", what));
  }
  if (!t.verdict->ok()) return *t.verdict;
  const size_t elements = rounds ? 0 : t.decl.elements();
  if (restore && saved.size() > elements) {
    return InvalidArgumentError(fmt::format("{} of tensor '{}': {} values given, the tensor has {}",
                                            what, name, saved.size(), elements));
  }
  if (!rounds && elements == 0) return Status::Ok();  // nothing to keep (and no 0-byte segment)
  if (!rounds && !t.ef_segment.valid()) {
    StatusOr<ipc::ShmSegment> seg = ipc::ShmSegment::Create(elements * sizeof(float));
    if (!seg.ok()) return seg.status().WithContext(fmt::format("{} of tensor '{}'", what, name));
    t.ef_segment = std::move(seg).value();
  }
  // ef_mu_ makes this process's requests (the only users of ef_segment) one at a time.
  float* values = rounds ? nullptr : static_cast<float*>(t.ef_segment.data());
  if (restore && !saved.empty()) std::memcpy(values, saved.data(), saved.size() * sizeof(float));
  v1::LocalMessage m;
  v1::LocalErrorFeedback* e = m.mutable_error_feedback();
  const uint64_t seq = next_ef_++;
  e->set_seq(seq);
  e->set_tensor(id.index);
  e->set_restore(restore);
  e->set_state(state);
  if (rounds) {
    e->set_values(restore ? next : 0);
  } else {
    e->set_values(restore ? saved.size() : 0);
    v1::ShmSlice* slice = e->mutable_slice();
    slice->set_segment(t.ef_segment.name());
    slice->set_segment_bytes(t.ef_segment.size());
    slice->set_offset(0);
    slice->set_bytes(elements * sizeof(float));
  }
  lock.unlock();
  Status sent = ipc::SendLocalMessage(*channel_, m);
  lock.lock();
  if (!sent.ok()) return SendFailedLocked(lock, sent);
  cv_.wait_for(lock, op_wait_, [&] { return ef_done_.count(seq) > 0 || !error_.ok() || closed_; });
  auto it = ef_done_.find(seq);
  if (it == ef_done_.end()) {
    if (!error_.ok()) return error_;
    if (closed_) return CancelledError(fmt::format("{}: the client was closed", what));
    // A late answer would write into the segment a later request uses: the connection is
    // unusable (as after a lost barrier).
    error_ = TimeoutError(fmt::format("{} of tensor '{}': no answer from the {} within {} ms", what,
                                      name, daemon_name_, op_wait_.count()));
    FailAllLocked(error_);
    return error_;
  }
  const v1::LocalErrorFeedbackDone done = std::move(it->second);
  ef_done_.erase(it);
  BP_RETURN_IF_ERROR(StatusFromCode(done.status_code(), done.message()));
  if (count != nullptr) *count = done.values();
  if (read != nullptr) {
    if (done.values() > elements) {
      return DataLossError(
          fmt::format("{} of tensor '{}': the {} answered {} values for {} elements", what, name,
                      daemon_name_, done.values(), elements));
    }
    read->assign(values, values + done.values());
  }
  return Status::Ok();
}

void DaemonClient::TraceOptimizer(int64_t start_ns, int64_t end_ns) {
  if (!daemon_traces_) return;  // set before the reader started, never changed: no lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok() || closed_) return;
  }
  v1::LocalMessage m;
  v1::LocalOptimizerSpan* span = m.mutable_optimizer_span();
  span->set_start_ns(start_ns);
  span->set_end_ns(end_ns);
  // Each frame is one atomic sendmsg: a failed send leaves nothing half-written behind.
  const Status sent = ipc::SendLocalMessage(*channel_, m);
  if (!sent.ok())
    BP_LOG_DEBUG("optimizer span to the {} dropped: {}", daemon_name_, sent.message());
}

Status DaemonClient::StageOnDevice(Tensor& t, const void* input, const void* output) {
  const std::string what = fmt::format("push_pull of CUDA tensor '{}'", t.decl.name());
  StatusOr<int> device = gpu::DeviceOfPointer(input);
  if (!device.ok()) return device.status().WithContext(what + " input");
  StatusOr<int> out_device = gpu::DeviceOfPointer(output);
  if (!out_device.ok()) return out_device.status().WithContext(what + " output");
  if (*out_device != *device) {
    return InvalidArgumentError(
        fmt::format("{}: input on GPU {} but output on GPU {}", what, *device, *out_device));
  }
  if (!t.staging.valid()) {
    StatusOr<gpu::DeviceBuffer> staging = gpu::DeviceBuffer::Allocate(*device, t.bytes);
    if (!staging.ok()) return staging.status().WithContext(what);
    StatusOr<gpu::GpuIpcHandle> h = staging->ExportIpcHandle();
    if (!h.ok()) return h.status().WithContext(what);
    StatusOr<std::string> bus = gpu::DevicePciBusId(*device);
    if (!bus.ok()) return bus.status().WithContext(what);
    t.staging = std::move(staging).value();
    t.staging_ipc.assign(reinterpret_cast<const char*>(h->bytes.data()), h->bytes.size());
    t.staging_bus_id = *bus;
  } else if (t.staging.device() != *device) {
    return InvalidArgumentError(
        fmt::format("{}: the tensor moved from GPU {} to GPU {} (a tensor stays on its GPU)", what,
                    t.staging.device(), *device));
  }
  return gpu::CopyDeviceMemory(*device, t.staging.data(), input, t.bytes).WithContext(what);
}

void DaemonClient::OnDone(const v1::LocalPushPullDone& done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done.tensor() >= tensors_.size()) return;
  Tensor& t = *tensors_[done.tensor()];
  if (!t.op || t.op_round != done.round()) return;  // a late answer to a timed-out round
  std::shared_ptr<OpState> op = std::move(t.op);
  t.op.reset();
  Status s = StatusFromCode(done.status_code(), done.message());
  if (s.ok() && t.decl.cuda()) {
    s = gpu::CopyDeviceMemory(t.staging.device(), op->output.data(), t.staging.data(), t.bytes)
            .WithContext(
                fmt::format("push_pull of tensor '{}': result to the output", t.decl.name()));
  } else if (s.ok()) {
    std::memcpy(op->output.data(), t.segment.data(), t.bytes);
  }
  if (s.ok()) {
    ++stats_.ops_completed;
  } else {
    ++stats_.ops_failed;
  }
  stats_.bytes_pushed += done.bytes_pushed();
  stats_.bytes_pulled += done.bytes_pulled();
  op->Complete(std::move(s));
}

void DaemonClient::ReaderLoop() {
  for (;;) {
    StatusOr<v1::LocalMessage> m = ipc::ReceiveLocalMessage(*channel_, kReaderTick);
    if (m.ok()) {
      if (m->has_push_pull_done()) {
        OnDone(m->push_pull_done());
      } else if (m->has_declare_reply()) {
        const v1::LocalDeclareReply& r = m->declare_reply();
        std::lock_guard<std::mutex> lock(mu_);
        if (r.index() < tensors_.size()) {
          tensors_[r.index()]->verdict = StatusFromCode(r.status_code(), r.message());
        }
        cv_.notify_all();
      } else if (m->has_error_feedback_done()) {
        std::lock_guard<std::mutex> lock(mu_);
        ef_done_[m->error_feedback_done().seq()] = m->error_feedback_done();
        cv_.notify_all();
      } else if (m->has_barrier_done()) {
        const v1::LocalBarrierDone& b = m->barrier_done();
        std::lock_guard<std::mutex> lock(mu_);
        barrier_done_[b.seq()] = StatusFromCode(b.status_code(), b.message());
        cv_.notify_all();
      } else if (m->has_goodbye()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.ok()) {
          error_ = m->goodbye().reason().empty()
                       ? CancelledError(fmt::format("the {} shut down", daemon_name_))
                       : UnavailableError(fmt::format("the {} ended the node: {}", daemon_name_,
                                                      m->goodbye().reason()));
        }
        FailAllLocked(error_);
      }
      continue;
    }
    if (m.status().code() == StatusCode::kTimeout) {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      const Clock::time_point now = Clock::now();
      for (auto& t : tensors_) {
        if (t->op && now >= t->op->deadline) {
          t->error = TimeoutError(
              fmt::format("push_pull of tensor '{}' round {}: no answer from the {} within {} ms",
                          t->decl.name(), t->op_round, daemon_name_, op_wait_.count()));
          ++stats_.ops_failed;
          t->op->Complete(t->error);
          t->op.reset();
        }
      }
      continue;
    }
    // End of stream, garbage, or Close(): the daemon is gone for this process.
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) {
      error_ = closed_ ? CancelledError("the client was closed")
                       : UnavailableError(m.status().message());
    }
    FailAllLocked(error_);
    return;
  }
}

Status DaemonClient::SendFailedLocked(std::unique_lock<std::mutex>& lock, const Status& sent) {
  // The connection is unusable: the daemon is gone or not reading. A daemon that ended the node
  // sent its Goodbye (which says why) before it closed; the reader gets a bounded moment to read
  // it, so the error names that cause rather than the broken pipe it left.
  cv_.wait_for(lock, kLastWordsWait, [&] { return !error_.ok() || closed_; });
  if (error_.ok()) error_ = closed_ ? CancelledError("the client was closed") : sent;
  FailAllLocked(error_);  // sticky
  return error_;
}

void DaemonClient::FailAllLocked(const Status& error) {
  for (auto& t : tensors_) {
    if (t->op) {
      ++stats_.ops_failed;
      t->op->Complete(error);
      t->op.reset();
    }
    if (!t->verdict) t->verdict = error;
  }
  cv_.notify_all();
}

Status DaemonClient::Shutdown() {
  Status sticky;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& t : tensors_) {
      if (t->op) {
        return FailedPreconditionError(
            fmt::format("Shutdown: a push_pull of tensor '{}' is pending", t->decl.name()));
      }
    }
    // Taken before the Goodbye: once the daemon has every Goodbye it ends, and its end of the
    // connection is then no error of ours.
    sticky = error_;
    if (error_.ok() && !closed_) {
      v1::LocalMessage m;
      m.mutable_goodbye();
      const Status s = ipc::SendLocalMessage(*channel_, m);
      if (!s.ok()) BP_LOG_WARN("Goodbye to the {}: {}", daemon_name_, s.ToString());
    }
  }
  Close();
  // A daemon that ended the node (a sibling died) is an error; one that shut down cleanly is
  // not.
  return sticky.code() == StatusCode::kCancelled ? Status::Ok() : sticky;
}

void DaemonClient::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ && !reader_.joinable()) return;
    closed_ = true;
    FailAllLocked(CancelledError("the client was closed"));
  }
  if (channel_) channel_->Shutdown();
  if (reader_.joinable()) reader_.join();
}

Status DaemonClient::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

ClientStats DaemonClient::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace bitpush::worker
