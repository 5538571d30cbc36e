#include "worker/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/logging.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "config/node_security.h"
#include "config/node_trace.h"

namespace bitpush::worker {

using std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------
// Construction and shutdown

StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  BP_RETURN_IF_ERROR(config::ValidateClusterConfig(options.cluster));
  if (options.rank >= options.cluster.workers.size()) {
    return InvalidArgumentError(fmt::format("worker rank {} is not in the cluster ({} workers)",
                                            options.rank, options.cluster.workers.size()));
  }
  BP_ASSIGN_OR_RETURN(
      v1::ErrorFeedbackPolicy policy,
      compressors::ParseErrorFeedbackPolicy(options.cluster.compression.error_feedback));
  BP_RETURN_IF_ERROR(compressors::ParseCompressorSpec(options.cluster.compression.spec)
                         .status()
                         .WithContext("compression.spec"));
  for (const auto& o : options.cluster.compression.overrides) {
    BP_RETURN_IF_ERROR(compressors::ParseCompressorSpec(o.spec).status().WithContext(
        "compression.overrides pattern '" + o.pattern + "'"));
  }
  if (options.cluster.worker.credit_bytes == 0) {
    return InvalidArgumentError("worker.credit_bytes must be > 0");
  }
  if (options.cluster.worker.op_timeout <= milliseconds(0)) {
    return InvalidArgumentError("worker.op_timeout_s must be > 0");
  }
  std::unique_ptr<Engine> engine(new Engine(options, policy));
  BP_RETURN_IF_ERROR(engine->Start(options));
  return engine;
}

Engine::Engine(EngineOptions& options, v1::ErrorFeedbackPolicy policy)
    : rank_(options.rank),
      state_(options.rank, options.cluster, policy, options.clock),
      declarations_(state_),
      scheduler_(state_,
                 [this](Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op, uint64_t round) {
                   return pipeline_.PostCompressLocked(t, j, op, round);
                 }),
      pipeline_(state_, scheduler_),
      state_calls_(state_, declarations_),
      failures_(state_, scheduler_, declarations_, state_calls_) {
  state_.check_non_finite = options.check_non_finite;
}

Status Engine::Start(EngineOptions& options) {
  const config::ClusterConfig& cluster = state_.cluster;
  const std::string& label = state_.label;
  BP_ASSIGN_OR_RETURN(trace_,
                      config::OpenNodeTrace(cluster, "worker", rank_, options.trace_process));
  state_.trace = trace_.get();
  pipeline_.Start(options.compress_cpus);
  scheduler_.Start();

  node::NodeEndpointOptions eo;
  eo.self = node::NodeIdentity{v1::ROLE_WORKER, rank_};
  eo.listen_address = cluster.workers[rank_];
  eo.backend = cluster.transport;
  eo.inproc_hub = options.inproc_hub;
  BP_RETURN_IF_ERROR(config::ConfigureNodeEndpoint(cluster, &eo));
  eo.clock = state_.clock;
  const bool injected = options.transport != nullptr;
  StatusOr<std::unique_ptr<node::NodeEndpoint>> endpoint =
      node::NodeEndpoint::Create(std::move(eo), std::move(options.transport));
  if (!endpoint.ok()) {
    if (injected) return endpoint.status();
    return endpoint.status().WithContext(
        fmt::format("worker {}: cannot listen at {}", rank_, cluster.workers[rank_]));
  }
  endpoint_ = std::move(endpoint).value();
  state_.endpoint = endpoint_.get();

  scheduler::SchedulerClientOptions so;
  so.cluster = cluster;
  so.role = v1::ROLE_WORKER;
  so.rank = rank_;
  so.initial_backoff = options.initial_backoff;
  so.max_backoff = options.max_backoff;
  so.on_error = [this](const Status& s) { failures_.OnClusterError(s); };
  so.on_shutdown = [this](const Status& verdict) { failures_.OnShutdownVerdict(verdict); };
  so.on_server_lost = [this](uint32_t, uint64_t generation, const Status& why) {
    failures_.OnServerLost(generation, why);
  };
  so.on_server_rejoined = [this](uint32_t server, uint64_t generation) {
    failures_.OnServerRejoined(server, generation);
  };
  so.on_worker_finished = [this](uint32_t worker, const std::vector<uint64_t>& rounds) {
    failures_.OnWorkerFinished(worker, rounds);
  };
  if (trace::Recorder* tracer = trace_.get()) {
    so.on_clock_sample = [tracer](int64_t t0, int64_t t1, int64_t t2, int64_t t3) {
      tracer->Clock(t0, t1, t2, t3);
    };
  }
  BP_ASSIGN_OR_RETURN(client_, scheduler::SchedulerClient::Create(std::move(so), endpoint_.get()));
  state_.client = client_.get();
  RegisterHandlers();
  endpoint_->Start();
  BP_RETURN_IF_ERROR(client_->Register());
  const v1::Assignment& a = client_->assignment();
  num_workers_ = static_cast<uint32_t>(a.workers_size());
  num_servers_ = static_cast<uint32_t>(a.servers_size());
  for (const v1::NodeInfo& s : a.servers()) {
    const std::string peer = node::NodePeerId(v1::ROLE_SERVER, s.rank());
    // The server's data plane: its data address when it has one (transport ucx).
    const std::string& address = s.data_address().empty() ? s.address() : s.data_address();
    BP_RETURN_IF_ERROR(endpoint_->Connect(peer, address)
                           .WithContext(fmt::format("{}: connecting to server {} at {}", label,
                                                    s.rank(), address)));
  }
  BP_LOG_INFO("{}: engine started ({} compression threads, credit {} bytes, op timeout {} ms)",
              label, pipeline_.threads(), cluster.worker.credit_bytes,
              cluster.worker.op_timeout.count());
  return Status::Ok();
}

Engine::~Engine() {
  Close();
}

void Engine::Close() {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.closed) return;
    state_.closed = true;
    scheduler_.FailAllLocked(CancelledError(state_.label + ": the client was closed"));
  }
  declarations_.WakeWaiters();
  state_calls_.WakeWaiters();
  failures_.WakeWaiters();
  // No more messages (no more decompress jobs) once the I/O thread is joined.
  if (endpoint_) endpoint_->Close();
  if (client_) client_->Close();
  // Runs what is queued: every job sees its op failed and only cleans up.
  pipeline_.Stop();
  scheduler_.Stop();
  if (trace_) trace_->Close();  // its `end` record: every span is in
}

Status Engine::Shutdown(milliseconds timeout) {
  std::vector<uint64_t> rounds;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.closed) return CancelledError(state_.label + ": the client was closed");
    // What the others can still pair with — only when this worker's rounds are in step with
    // the servers (no failed push_pull): otherwise the others learn of the failure from the
    // scheduler, and an early "this worker is done" would hide it.
    bool in_step = state_.cluster_error.ok();
    for (const auto& t : state_.tensors) in_step = in_step && t->error.ok();
    if (in_step) {
      for (const auto& t : state_.tensors) rounds.push_back(t->rounds_done);
    }
    state_.shutting_down = true;
    scheduler_.FailAllLocked(CancelledError(state_.label + ": the client is shutting down"));
  }
  declarations_.WakeWaiters();
  if (Status done = client_->Done(rounds); !done.ok()) {
    // After the scheduler's shutdown the cluster's own reason beats "the cluster has shut down".
    std::lock_guard<std::mutex> lock(state_.mu);
    return state_.cluster_error.ok() ? done : state_.cluster_error;
  }
  return client_->WaitForShutdown(timeout);
}

Status Engine::Barrier() {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.closed) return CancelledError(state_.label + ": the client was closed");
  }
  return client_->Barrier(v1::GROUP_WORKERS);
}

Status Engine::status() const {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (!state_.cluster_error.ok()) return state_.cluster_error;
  }
  return client_ ? client_->status() : Status::Ok();
}

ClientStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(state_.mu);
  ClientStats s = state_.stats;
  scheduler_.FillStatsLocked(&s);
  return s;
}

node::EndpointStats Engine::endpoint_stats() const {
  return endpoint_->stats();
}

// ---------------------------------------------------------------------------------------------
// The pieces' calls

StatusOr<TensorId> Engine::Declare(const std::string& name, size_t elements, DType dtype,
                                   const TensorOptions& options) {
  const int64_t start = trace::NowNs();
  StatusOr<TensorId> id = declarations_.Declare(name, elements, dtype, options);
  if (trace_ && id.ok()) {
    std::vector<uint64_t> keys;
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      for (const Partition& p : state_.tensors[id->index]->partitions) keys.push_back(p.range.key);
    }
    trace_->Tensor(name, keys);
    trace_->Span(trace::SpanKind::kDeclare, start, trace::NowNs(), keys.empty() ? 0 : keys[0], 0,
                 elements * DTypeSize(dtype));
  }
  return id;
}

uint64_t Engine::FirstKey(TensorId tensor) const {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (tensor.index >= state_.tensors.size()) return 0;
  const Tensor& t = *state_.tensors[tensor.index];
  return t.partitions.empty() ? 0 : t.partitions[0].range.key;
}

void Engine::TraceStep(trace::SpanKind kind, int64_t start_ns, int64_t end_ns, int32_t local_rank) {
  if (!trace_) return;
  uint64_t done = 0;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    for (const auto& t : state_.tensors) done = std::max(done, t->rounds_done);
  }
  const uint64_t round = done == 0 ? 0 : done - 1;
  if (trace_->Wants(round)) trace_->Span(kind, start_ns, end_ns, 0, round, 0, -1, -1, local_rank);
}

Status Engine::CommitDeclarations() {
  return declarations_.Commit();
}

StatusOr<std::vector<float>> Engine::ErrorFeedbackState(TensorId tensor) const {
  return state_calls_.ErrorFeedbackState(tensor);
}

Status Engine::RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  return state_calls_.RestoreErrorFeedbackState(tensor, saved);
}

Status Engine::SetErrorFeedbackDecay(TensorId tensor, float decay) {
  return state_calls_.SetErrorFeedbackDecay(tensor, decay);
}

StatusOr<std::vector<float>> Engine::ServerErrorFeedbackState(TensorId tensor) {
  return state_calls_.ServerErrorFeedbackState(tensor);
}

Status Engine::RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  return state_calls_.RestoreServerErrorFeedbackState(tensor, saved);
}

StatusOr<uint64_t> Engine::TensorRounds(TensorId tensor) {
  return state_calls_.TensorRounds(tensor);
}

Status Engine::RestoreTensorRounds(TensorId tensor, uint64_t next) {
  return state_calls_.RestoreTensorRounds(tensor, next);
}

Status Engine::InitServerWeights(TensorId tensor, TensorView weights) {
  return state_calls_.InitServerWeights(tensor, weights);
}

Status Engine::PullServerWeights(TensorId tensor, TensorView weights) {
  return state_calls_.PullServerWeights(tensor, weights);
}

StatusOr<std::vector<std::string>> Engine::ServerOptimizerState(TensorId tensor) {
  return state_calls_.ServerOptimizerState(tensor);
}

Status Engine::RestoreServerOptimizerState(TensorId tensor, const std::vector<std::string>& saved) {
  return state_calls_.RestoreServerOptimizerState(tensor, saved);
}

Status Engine::WaitForServers(milliseconds timeout) {
  return failures_.WaitForServers(timeout);
}

// ---------------------------------------------------------------------------------------------
// push_pull: the call's arguments and the tensor's state checked, then queued

PushPullHandle Engine::PushPull(TensorId id, ConstTensorView input, TensorView output,
                                std::optional<float> lr) {
  auto op = std::make_shared<OpState>();
  PushPullHandle handle(op);
  auto fail = [&](Status s) {
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      ++state_.stats.ops_failed;
    }
    op->Complete(std::move(s));
    return handle;
  };
  Tensor* t = nullptr;
  bool needs_commit = false;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (id.index >= state_.tensors.size()) {
      ++state_.stats.ops_failed;
      op->Complete(InvalidArgumentError(
          fmt::format("{}: push_pull of tensor #{}: no such tensor ({} declared)", state_.label,
                      id.index, state_.tensors.size())));
      return handle;
    }
    t = state_.tensors[id.index].get();
    needs_commit = !t->committed;
  }
  op->tensor = t->name;
  op->tensor_index = t->index;
  op->input = input;
  op->output = output;
  op->lr = lr;
  const std::string what = fmt::format("{}: push_pull of tensor '{}'", state_.label, t->name);
  if (t->server_optimizer.has_value() != lr.has_value()) {
    return fail(InvalidArgumentError(
        t->server_optimizer
            ? what + ": its optimizer runs on the servers; push_pull it with a learning rate "
                     "(gradient in, weights out)"
            : what + ": a learning rate was given but the tensor's optimizer does not run on the "
                     "servers"));
  }
  if (lr && (!(*lr >= 0.0f) || std::isinf(*lr))) {
    return fail(InvalidArgumentError(
        fmt::format("{}: learning rate {} (must be finite and >= 0)", what, *lr)));
  }
  if (lr && t->elements > 0 && input.data() == output.data()) {
    return fail(InvalidArgumentError(
        what +
        ": the gradient and the weights are the same memory; the weights receive the "
        "servers' update, the gradient must be another buffer"));
  }
  if (input.count() != t->elements || input.dtype() != t->dtype) {
    return fail(InvalidArgumentError(fmt::format(
        "{}: the input has {} elements of {} but the tensor was declared with {} elements of {}",
        what, input.count(), DTypeName(input.dtype()), t->elements, DTypeName(t->dtype))));
  }
  if (output.count() != t->elements || output.dtype() != t->dtype) {
    return fail(InvalidArgumentError(fmt::format(
        "{}: the output has {} elements of {} but the tensor was declared with {} elements of {}",
        what, output.count(), DTypeName(output.dtype()), t->elements, DTypeName(t->dtype))));
  }
  if (t->elements > 0 && (input.data() == nullptr || output.data() == nullptr)) {
    return fail(InvalidArgumentError(what + ": null input or output data"));
  }
  if (needs_commit) {
    // Checks the declarations across workers (bounded by cluster.startup_timeout). Its error,
    // if any, is recorded on the tensor and picked up below.
    Status committed = declarations_.Commit();
    if (!committed.ok()) {
      std::lock_guard<std::mutex> lock(state_.mu);
      if (!t->committed && t->error.ok()) {
        ++state_.stats.ops_failed;
        op->Complete(committed);
        return handle;
      }
    }
  }

  std::lock_guard<std::mutex> lock(state_.mu);
  Status error;
  if (std::optional<Status> stopped = state_.StoppedLocked()) {
    error = *stopped;
  } else if (!t->error.ok()) {
    error = t->error;
  } else if (t->op) {
    error = FailedPreconditionError(
        what + ": a push_pull of this tensor is already in flight; wait for its handle first");
  } else if (!t->committed) {
    error = InternalError(what + ": the tensor's declaration is not committed");
  } else if (t->server_optimizer && !t->weights_ready) {
    error = FailedPreconditionError(
        what +
        ": this worker's copy of the weights did not come from the servers yet; call "
        "InitServerWeights (every worker, before the first push_pull) or PullServerWeights "
        "after a restore");
  } else if (std::optional<Status> blocked = failures_.FinishedWorkerBlocksLocked(*t)) {
    error = *blocked;
  }
  if (!error.ok()) {
    ++state_.stats.ops_failed;
    op->Complete(error);
    return handle;
  }
  if (t->partitions.empty()) {
    ++state_.stats.ops_completed;
    op->Complete(Status::Ok());
    return handle;
  }
  op->residual_decay = t->ef_decay;
  const uint64_t round = t->partitions[0].next_round;  // the round this op pushes
  const bool traced = trace_ != nullptr && trace_->Wants(round);
  const int64_t start = traced ? trace::NowNs() : 0;
  scheduler_.EnqueueLocked(*t, op);
  if (traced) {  // the op cut into its partitions and queued for the compression pool
    trace_->Span(trace::SpanKind::kPartition, start, trace::NowNs(), t->partitions[0].range.key,
                 round, t->elements * DTypeSize(t->dtype));
  }
  return handle;
}

// ---------------------------------------------------------------------------------------------
// I/O thread

void Engine::RegisterHandlers() {
  using node::Plane;
  using node::Sender;
  const std::string& label = state_.label;
  endpoint_->OnData(v1::DataHeader::OP_PULL_REPLY,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message& m) {
                      pipeline_.OnReply(from.peer, h, m);
                    });
  endpoint_->OnData(v1::DataHeader::OP_STATE_REPLY,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message& m) {
                      state_calls_.OnStateReply(from.peer, h, m);
                    });
  endpoint_->OnData(v1::DataHeader::OP_ERROR,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message&) {
                      OnError(from.peer, h);
                    });
  endpoint_->OnData(v1::DataHeader::OP_DECLARE_REPLY,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message&) {
                      declarations_.OnReply(from.peer, h.round());
                    });
  endpoint_->OnRejected(
      Plane::kData, [label](const Sender& from, const transport::Message&,
                            node::NodeEndpoint::Rejection why, std::string_view what) {
        if (why == node::NodeEndpoint::Rejection::kMalformed) {
          BP_LOG_WARN("{}: dropped a malformed data message from '{}'", label, from.peer);
        } else {
          BP_LOG_WARN("{}: dropped a {} from '{}', which is not a server", label, what, from.peer);
        }
      });
  endpoint_->OnEvent(Plane::kData, [this](const Sender& from, const transport::TransportEvent& ev) {
    if (ev.kind == transport::TransportEvent::Kind::kSendFailed && from.Is(v1::ROLE_SERVER)) {
      pipeline_.OnSendFailed(from.peer, ev.status);
      return;
    }
    // A lost connection is not a verdict: the scheduler's heartbeats decide (and op_timeout
    // bounds every op meanwhile).
    BP_LOG_DEBUG("{}: transport event about {}: {}", state_.label, from.peer,
                 ev.status.ok() ? std::string("connected") : ev.status.ToString());
  });
}

void Engine::OnError(const std::string& from, const v1::DataHeader& h) {
  // OP_ERROR names the refused request by its op (refused_op) and (key, round).
  if (declarations_.OnRefused(from, h)) return;
  if (h.refused_op() == v1::DataHeader::OP_STATE_READ ||
      h.refused_op() == v1::DataHeader::OP_STATE_WRITE) {
    state_calls_.OnRefused(from, h);
    return;
  }
  pipeline_.OnPushRefused(from, h);
}

}  // namespace bitpush::worker
