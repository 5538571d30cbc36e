#include "worker/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/logging.h"
#include "common/vector_ops.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "config/node_security.h"
#include "optimizers/param_state.h"
#include "worker/compression_plan.h"

namespace bitpush::worker {

namespace {

using compressors::CompressContext;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

constexpr char kServer0[] = "server:0";
// Partitions listed by name in a timeout message; the rest are counted.
constexpr size_t kListedPartitions = 8;

uint64_t Ns(EngineClock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<nanoseconds>(d).count());
}

// The Status a server's OP_ERROR carries (its code when it is a valid one).
Status RemoteStatus(uint32_t code, std::string message) {
  if (code == 0 || code > static_cast<uint32_t>(StatusCode::kUnimplemented)) {
    return RemoteError(std::move(message));
  }
  return Status(static_cast<StatusCode>(code), std::move(message));
}

std::string ServerLabel(const std::string& peer) {
  return peer.rfind("server:", 0) == 0 ? "server " + peer.substr(7) : peer;
}

// The wire form of a tensor's server-side optimizer (canonical pull config, the pull form
// resolved against the cluster's optimizer section). InvalidArgument naming the field.
StatusOr<v1::ServerOptimizer> ServerOptimizerFor(const ServerOptimizerOptions& o,
                                                 const config::OptimizerSettings& cluster) {
  BP_ASSIGN_OR_RETURN(optimizers::UpdateOptions u,
                      optimizers::MakeUpdateOptions(o.rule, o.weight_decay, o.momentum, o.nesterov,
                                                    o.beta1, o.beta2, o.eps));
  v1::ServerOptimizer w;
  w.set_rule(optimizers::UpdateRuleName(u.rule));
  w.set_weight_decay(o.weight_decay);
  w.set_momentum(o.momentum);
  w.set_nesterov(o.nesterov);
  w.set_beta1(o.beta1);
  w.set_beta2(o.beta2);
  w.set_eps(o.eps);
  config::OptimizerSettings pull = cluster;
  if (!o.pull.empty()) pull.pull = o.pull;
  if (!o.pull_form.empty()) pull.pull_form = o.pull_form;
  if (pull.pull_form != "auto" && pull.pull_form != "difference" && pull.pull_form != "raw") {
    return InvalidArgumentError(
        fmt::format("pull_form '{}': expected auto, difference or raw", pull.pull_form));
  }
  StatusOr<v1::CompressorConfig> config = compressors::ParseCompressorSpec(pull.pull);
  if (!config.ok()) return config.status().WithContext("the weights' pull compressor");
  pull.pull = compressors::CompressorSpecString(*config);
  w.set_difference(pull.PullDifference());
  if (!w.difference()) BP_RETURN_IF_ERROR(compressors::CheckRawWeightPull(*config));
  *w.mutable_pull() = std::move(config).value();
  return w;
}

// One line for messages and the declaration check: "adamw(weight_decay=0.01, ...) pull ...".
std::string DescribeServerOptimizer(const v1::ServerOptimizer& w) {
  std::string params;
  if (w.rule() == "sgd") {
    params = fmt::format("weight_decay={}, momentum={}, nesterov={}", w.weight_decay(),
                         w.momentum(), w.nesterov());
  } else {
    params = fmt::format("weight_decay={}, beta1={}, beta2={}, eps={}", w.weight_decay(), w.beta1(),
                         w.beta2(), w.eps());
  }
  return fmt::format("server {}({}) pull {} {}", w.rule(), params,
                     compressors::CompressorSpecString(w.pull()),
                     w.difference() ? "difference" : "raw");
}

}  // namespace

void OpState::Complete(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    done = true;
    status = std::move(s);
  }
  cv.notify_all();
}

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
    : label_(fmt::format("worker {}", options.rank)),
      rank_(options.rank),
      cluster_(options.cluster),
      policy_(policy),
      isa_(BestIsaLevel()),
      clock_(options.clock ? options.clock : SystemClock()) {}

Status Engine::Start(EngineOptions& options) {
  pool_ = std::make_unique<TaskPool>(ResolveCompressThreads(cluster_.worker.compress_threads),
                                     "bp-wpool", options.compress_cpus);
  dispatcher_ = std::thread([this] { DispatchLoop(); });

  node::NodeEndpointOptions eo;
  eo.self = node::NodeIdentity{v1::ROLE_WORKER, rank_};
  eo.listen_address = cluster_.workers[rank_];
  eo.backend = cluster_.transport;
  eo.inproc_hub = options.inproc_hub;
  BP_RETURN_IF_ERROR(config::ConfigureNodeEndpoint(cluster_, &eo));
  eo.clock = clock_;
  const bool injected = options.transport != nullptr;
  StatusOr<std::unique_ptr<node::NodeEndpoint>> endpoint =
      node::NodeEndpoint::Create(std::move(eo), std::move(options.transport));
  if (!endpoint.ok()) {
    if (injected) return endpoint.status();
    return endpoint.status().WithContext(
        fmt::format("worker {}: cannot listen at {}", rank_, cluster_.workers[rank_]));
  }
  endpoint_ = std::move(endpoint).value();

  scheduler::SchedulerClientOptions so;
  so.cluster = cluster_;
  so.role = v1::ROLE_WORKER;
  so.rank = rank_;
  so.initial_backoff = options.initial_backoff;
  so.max_backoff = options.max_backoff;
  so.on_error = [this](const Status& s) { OnClusterError(s); };
  so.on_shutdown = [this](const Status& verdict) { OnShutdownVerdict(verdict); };
  so.on_server_lost = [this](uint32_t, uint64_t generation, const Status& why) {
    OnServerLost(generation, why);
  };
  so.on_server_rejoined = [this](uint32_t server, uint64_t generation) {
    OnServerRejoined(server, generation);
  };
  so.on_worker_finished = [this](uint32_t worker, const std::vector<uint64_t>& rounds) {
    OnWorkerFinished(worker, rounds);
  };
  BP_ASSIGN_OR_RETURN(client_, scheduler::SchedulerClient::Create(std::move(so), endpoint_.get()));
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
                           .WithContext(fmt::format("{}: connecting to server {} at {}", label_,
                                                    s.rank(), address)));
  }
  BP_LOG_INFO("{}: engine started ({} compression threads, credit {} bytes, op timeout {} ms)",
              label_, pool_->size(), cluster_.worker.credit_bytes,
              cluster_.worker.op_timeout.count());
  return Status::Ok();
}

Engine::~Engine() {
  Close();
}

void Engine::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    FailAllLocked(CancelledError(label_ + ": the client was closed"));
  }
  decl_cv_.notify_all();
  state_cv_.notify_all();
  // No more messages (no more decompress jobs) once the I/O thread is joined.
  if (endpoint_) endpoint_->Close();
  if (client_) client_->Close();
  // Runs what is queued: every job sees its op failed and only cleans up.
  if (pool_) pool_->Shutdown();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_dispatcher_ = true;
  }
  dispatch_cv_.notify_all();
  if (dispatcher_.joinable()) dispatcher_.join();
}

Status Engine::Shutdown(milliseconds timeout) {
  std::vector<uint64_t> rounds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(label_ + ": the client was closed");
    // What the others can still pair with — only when this worker's rounds are in step with
    // the servers (no failed push_pull): otherwise the others learn of the failure from the
    // scheduler, and an early "this worker is done" would hide it.
    bool in_step = cluster_error_.ok();
    for (const auto& t : tensors_) in_step = in_step && t->error.ok();
    if (in_step) {
      for (const auto& t : tensors_) rounds.push_back(t->rounds_done);
    }
    shutting_down_ = true;
    FailAllLocked(CancelledError(label_ + ": the client is shutting down"));
  }
  decl_cv_.notify_all();
  if (Status done = client_->Done(rounds); !done.ok()) {
    // After the scheduler's shutdown the cluster's own reason beats "the cluster has shut down".
    std::lock_guard<std::mutex> lock(mu_);
    return cluster_error_.ok() ? done : cluster_error_;
  }
  return client_->WaitForShutdown(timeout);
}

Status Engine::Barrier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return CancelledError(label_ + ": the client was closed");
  }
  return client_->Barrier(v1::GROUP_WORKERS);
}

Status Engine::status() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!cluster_error_.ok()) return cluster_error_;
  }
  return client_ ? client_->status() : Status::Ok();
}

size_t Engine::StateValues(const Tensor& t) {
  size_t values = 0;
  for (const Partition& p : t.partitions) values += p.residual ? p.residual->state_size() : 0;
  return values;
}

StatusOr<std::vector<float>> Engine::ErrorFeedbackState(TensorId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id.index >= tensors_.size()) {
    return InvalidArgumentError(fmt::format("ErrorFeedbackState: no tensor #{}", id.index));
  }
  const Tensor& t = *tensors_[id.index];
  if (t.op) {
    return FailedPreconditionError(
        fmt::format("ErrorFeedbackState of tensor '{}': a push_pull of it is in flight", t.name));
  }
  std::vector<float> out;
  if (t.partitions.empty() || !t.partitions.front().residual) return out;  // keeps none
  out.reserve(StateValues(t));
  for (const Partition& p : t.partitions) {
    const Span<const float> r = p.residual->residual();
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

Status Engine::RestoreErrorFeedbackState(TensorId id, Span<const float> saved) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id.index >= tensors_.size()) {
    return InvalidArgumentError(fmt::format("RestoreErrorFeedbackState: no tensor #{}", id.index));
  }
  Tensor& t = *tensors_[id.index];
  if (t.op) {
    return FailedPreconditionError(fmt::format(
        "RestoreErrorFeedbackState of tensor '{}': a push_pull of it is in flight", t.name));
  }
  const bool keeps = !t.partitions.empty() && t.partitions.front().residual != nullptr;
  if (!keeps) {
    if (saved.empty()) return Status::Ok();
    return InvalidArgumentError(fmt::format(
        "RestoreErrorFeedbackState of tensor '{}': it keeps no worker residual (uncompressed, or "
        "compression.error_feedback keeps none on workers) but {} values were given",
        t.name, saved.size()));
  }
  if (saved.size() != StateValues(t)) {
    const size_t values = StateValues(t);
    return InvalidArgumentError(fmt::format(
        "RestoreErrorFeedbackState of tensor '{}': {} values given, the tensor has {}{}", t.name,
        saved.size(), t.elements,
        values == t.elements ? "" : fmt::format(" elements and its state {} values", values)));
  }
  size_t at = 0;
  for (Partition& p : t.partitions) {
    BP_RETURN_IF_ERROR(p.residual->Restore(saved.subspan(at, p.residual->state_size())));
    at += p.residual->state_size();
  }
  return Status::Ok();
}

ClientStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClientStats s = stats_;
  s.bytes_in_flight = in_flight_bytes_;
  s.partitions_queued = ready_.size();
  return s;
}

node::EndpointStats Engine::endpoint_stats() const {
  return endpoint_->stats();
}

std::optional<Status> Engine::StoppedLocked() const {
  if (!cluster_error_.ok()) return cluster_error_;
  if (closed_) return CancelledError(label_ + ": the client was closed");
  if (shutting_down_) return CancelledError(label_ + ": the client is shutting down");
  if (recovering_) return recovering_;
  return std::nullopt;
}

void Engine::OnServerLost(uint64_t generation, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !cluster_error_.ok()) return;
    const Status error(why.code(), label_ + ": " + why.message());
    recovering_ = error;
    generation_ = std::max(generation_.load(), generation);
    FailAllLocked(error);
  }
  decl_cv_.notify_all();
  state_cv_.notify_all();
  recover_cv_.notify_all();
}

void Engine::OnServerRejoined(uint32_t server, uint64_t generation) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !cluster_error_.ok()) return;
    // The job rolls back: every server dropped its keys and declarations of the old
    // generation, so every tensor is declared, announced and (server-side optimizer) given its
    // weights again; rounds start over (a restored optimizer state says where, when pulled).
    generation_ = std::max(generation_.load(), generation);
    for (const auto& tp : tensors_) {
      Tensor& t = *tp;
      t.committed = false;
      t.error = Status::Ok();
      t.rounds_done = 0;
      t.weights_ready = false;
      for (Partition& p : t.partitions) p.next_round = 0;
    }
    finished_workers_.clear();
  }
  // The old process's connection is gone for good (the transport refuses sends on it): connect
  // to the new one at the same address before anything is sent there.
  const std::string peer = node::NodePeerId(v1::ROLE_SERVER, server);
  for (const v1::NodeInfo& s : client_->assignment().servers()) {
    if (s.rank() != server) continue;
    const std::string& address = s.data_address().empty() ? s.address() : s.data_address();
    endpoint_->Disconnect(peer);
    if (Status c = endpoint_->Connect(peer, address); !c.ok()) {
      OnClusterError(c.WithContext(fmt::format("{}: reconnecting to the rejoined server {} at {}",
                                               label_, server, address)));
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    BP_LOG_WARN(
        "{}: server {} rejoined: the job continues in generation {} (restore its "
        "checkpoint before the next step)",
        label_, server, generation_.load());
    recovering_.reset();
  }
  recover_cv_.notify_all();
}

Status Engine::WaitForServers(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  // A push_pull can fail on a server's dropped connection before the scheduler's verdict: with
  // no server missing yet, wait up to two heartbeat timeouts for one to be declared.
  if (!recovering_ && cluster_error_.ok() && !closed_) {
    const uint64_t before = generation_.load();
    recover_cv_.wait_for(lock, std::min(timeout, 2 * cluster_.heartbeat_timeout), [&] {
      return recovering_.has_value() || generation_.load() != before || !cluster_error_.ok() ||
             closed_;
    });
  }
  const bool back = recover_cv_.wait_for(
      lock, timeout, [&] { return !recovering_.has_value() || !cluster_error_.ok() || closed_; });
  if (!cluster_error_.ok()) return cluster_error_;
  if (closed_) return CancelledError(label_ + ": the client was closed");
  if (!back && recovering_) {
    return TimeoutError(fmt::format("{}: the failed server did not rejoin within {} ms: {}", label_,
                                    timeout.count(), recovering_->message()));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Declarations

StatusOr<TensorId> Engine::Declare(const std::string& name, size_t elements, DType dtype,
                                   const TensorOptions& options) {
  std::lock_guard<std::mutex> declare_lock(declare_mu_);
  const std::string what = fmt::format("{}: Declare('{}')", label_, name);
  if (name.empty()) return InvalidArgumentError(label_ + ": Declare: the tensor name is empty");
  uint32_t index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<Status> stopped = StoppedLocked()) return *stopped;
    if (names_.count(name) != 0) {
      return InvalidArgumentError(
          fmt::format("{}: tensor '{}' is already declared (#{})", what, name, names_.at(name)));
    }
    if (tensors_.size() >= (uint64_t{1} << 32) - 1) {
      return InvalidArgumentError(what + ": too many tensors (2^32)");
    }
    index = static_cast<uint32_t>(tensors_.size());
  }
  StatusOr<TensorCompression> plan =
      DecideCompression(cluster_.compression, name, elements, dtype, options.compression);
  if (!plan.ok()) return plan.status().WithContext(what + ": compression");

  std::optional<v1::ServerOptimizer> server_optimizer;
  if (options.server_optimizer) {
    if (dtype != DType::kFloat32) {
      return InvalidArgumentError(fmt::format(
          "{}: a tensor whose optimizer runs on the servers must be float32 (the servers keep "
          "fp32 master weights), not {}",
          what, DTypeName(dtype)));
    }
    const compressors::MethodSpec& method = *compressors::FindMethod(plan->config.id());
    if (method.aggregation == compressors::AggregationMode::kCompressedDomainSum) {
      return InvalidArgumentError(fmt::format(
          "{}: {} aggregates by {}: servers never see its gradients, so they cannot run the "
          "optimizer; keep this tensor's optimizer on the workers (optimizer.overrides) or "
          "compress it with another method",
          what, method.name, compressors::AggregationModeName(method.aggregation)));
    }
    StatusOr<v1::ServerOptimizer> w =
        ServerOptimizerFor(*options.server_optimizer, cluster_.optimizer);
    if (!w.ok()) return w.status().WithContext(what + ": server-side optimizer");
    server_optimizer = std::move(w).value();
  }

  auto t = std::make_unique<Tensor>();
  t->index = index;
  t->server_optimizer = server_optimizer;
  t->name = name;
  t->elements = elements;
  t->dtype = dtype;
  t->options = options;
  t->compressed = plan->compressed();
  t->config = std::move(plan->config);
  t->spec = compressors::CompressorSpecString(t->config);

  StatusOr<std::vector<PartitionRange>> ranges =
      PartitionTensor(index, elements, dtype, cluster_.compression.partition_bytes,
                      t->compressed ? compressors::PartitionAlign(t->config) : 1);
  if (!ranges.ok()) return ranges.status().WithContext(what);
  const bool worker_residual = t->compressed && compressors::WorkerKeepsResidual(policy_);
  compressors::CompressorOptions copts;
  copts.isa = isa_;
  t->partitions.resize(ranges->size());
  for (size_t j = 0; j < ranges->size(); ++j) {
    Partition& p = t->partitions[j];
    p.range = (*ranges)[j];
    p.server = client_->ServerForKey(p.range.key);
    p.peer = node::NodePeerId(v1::ROLE_SERVER, p.server);
    p.bytes = static_cast<uint64_t>(p.range.elements) * DTypeSize(dtype);
    StatusOr<std::unique_ptr<compressors::Compressor>> c =
        compressors::CreateCompressor(t->config, copts);
    if (!c.ok()) return c.status().WithContext(what);
    p.compressor = std::move(c).value();
    if (worker_residual) {
      // The method's own worker state (compressors/method.h new_error_feedback).
      StatusOr<std::unique_ptr<compressors::ErrorFeedback>> r = compressors::CreateErrorFeedback(
          t->config, compressors::ErrorFeedbackSide::kWorker, p.range.elements);
      if (!r.ok()) return r.status().WithContext(what);
      p.residual = std::move(r).value();
    }
    if (t->server_optimizer) {
      StatusOr<std::unique_ptr<compressors::Compressor>> pc =
          compressors::CreateCompressor(t->server_optimizer->pull(), copts);
      if (!pc.ok()) return pc.status().WithContext(what + ": the weights' pull compressor");
      p.pull = std::move(pc).value();
      p.pull_codec = std::make_unique<compressors::CompressorPullCodec>(p.pull.get());
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  names_[name] = index;
  tensors_.push_back(std::move(t));
  return TensorId{index};
}

Status Engine::CommitDeclarations() {
  std::lock_guard<std::mutex> decl_lock(decl_mu_);
  std::vector<uint32_t> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<Status> stopped = StoppedLocked()) return *stopped;
    for (const auto& t : tensors_) {
      if (!t->committed && t->error.ok()) fresh.push_back(t->index);
    }
  }
  if (fresh.empty()) return Status::Ok();
  // A rejoined server started a new generation: the servers' declaration epochs start over.
  if (const uint64_t g = generation_.load(); g != epoch_generation_) {
    epoch_generation_ = g;
    next_epoch_ = 0;
  }
  const uint64_t epoch = next_epoch_++;
  Status s = CheckDeclarations(epoch, fresh);
  if (s.ok()) s = AnnounceKeys(fresh);
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i : fresh) {
    Tensor& t = *tensors_[i];
    if (s.ok()) {
      t.committed = true;
    } else if (t.error.ok() && cluster_error_.ok() && !closed_ && !shutting_down_) {
      // A verdict on these declarations: sticky for them.
      t.error = s;
    }
  }
  return s;
}

Status Engine::CheckDeclarations(uint64_t epoch, const std::vector<uint32_t>& tensors) {
  v1::TensorManifest manifest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i : tensors) {
      const Tensor& t = *tensors_[i];
      v1::TensorDeclaration* d = manifest.add_tensors();
      d->set_index(t.index);
      d->set_name(t.name);
      d->set_elements(t.elements);
      d->set_dtype(static_cast<uint32_t>(t.dtype));
      d->set_compression(t.spec);
      d->set_sum(t.options.op == ReduceOp::kSum);
      if (t.server_optimizer) d->set_optimizer(DescribeServerOptimizer(*t.server_optimizer));
    }
    pending_epoch_ = epoch;
    declare_verdict_.reset();
  }
  v1::DataHeader h;
  h.set_op(v1::DataHeader::OP_DECLARE);
  h.set_generation(generation_.load());
  h.set_round(epoch);
  h.set_sender(rank_);
  std::string body;
  manifest.SerializeToString(&body);
  Status sent = endpoint_->SendData(kServer0, h, {transport::Buffer::Take(std::move(body))});

  std::unique_lock<std::mutex> lock(mu_);
  Status result;
  if (!sent.ok()) {
    result = sent.WithContext(
        fmt::format("{}: sending the tensor declarations of epoch {} to server 0", label_, epoch));
  } else {
    const Clock::time_point deadline = clock_->Now() + cluster_.startup_timeout;
    clock_->WaitUntil(lock, decl_cv_, deadline,
                      [&] { return declare_verdict_.has_value() || StoppedLocked().has_value(); });
    if (declare_verdict_) {
      result = *declare_verdict_;
    } else if (std::optional<Status> stopped = StoppedLocked()) {
      result = *stopped;
    } else {
      result = TimeoutError(fmt::format(
          "{}: no answer from server 0 to the tensor declarations of epoch {} within {} ms "
          "(cluster.startup_timeout; every worker must declare and push_pull the same tensors)",
          label_, epoch, cluster_.startup_timeout.count()));
    }
  }
  pending_epoch_.reset();
  declare_verdict_.reset();
  return result;
}

Status Engine::AnnounceKeys(const std::vector<uint32_t>& tensors) {
  for (uint32_t i : tensors) {
    const Tensor* t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t = tensors_[i].get();
    }
    // Partitions' keys, owners and configs are immutable after Declare.
    for (const Partition& p : t->partitions) {
      v1::DataHeader h;
      h.set_op(v1::DataHeader::OP_INIT_KEY);
      h.set_generation(generation_.load());
      h.set_key(p.range.key);
      h.set_sender(rank_);
      h.set_element_count(p.range.elements);
      h.set_dtype(static_cast<uint32_t>(t->dtype));
      *h.mutable_compressor_config() = t->config;
      h.set_compressor(t->config.id());
      h.set_tensor(t->name);
      // A server-side optimizer key publishes weights, not the aggregate: no server residual.
      h.set_server_residual(t->compressed && !t->server_optimizer &&
                            compressors::ServerKeepsResidual(policy_));
      h.set_sum(t->options.op == ReduceOp::kSum);
      if (t->server_optimizer) *h.mutable_server_optimizer() = *t->server_optimizer;
      BP_RETURN_IF_ERROR(endpoint_->SendData(p.peer, h).WithContext(
          fmt::format("{}: announcing key {} (tensor '{}' partition {}) to server {}", label_,
                      p.range.key, t->name, p.range.index, p.server)));
    }
  }
  return Status::Ok();
}

void Engine::OnDeclareVerdict(uint64_t epoch, Status verdict) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_epoch_ || *pending_epoch_ != epoch) {
      BP_LOG_WARN("{}: dropped a declaration verdict for epoch {} (none pending)", label_, epoch);
      return;
    }
    declare_verdict_ = std::move(verdict);
  }
  decl_cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// push_pull

PushPullHandle Engine::PushPull(TensorId id, ConstTensorView input, TensorView output,
                                std::optional<float> lr) {
  auto op = std::make_shared<OpState>();
  PushPullHandle handle(op);
  auto fail = [&](Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.ops_failed;
    }
    op->Complete(std::move(s));
    return handle;
  };
  Tensor* t = nullptr;
  bool needs_commit = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id.index >= tensors_.size()) {
      ++stats_.ops_failed;
      op->Complete(InvalidArgumentError(
          fmt::format("{}: push_pull of tensor #{}: no such tensor ({} declared)", label_, id.index,
                      tensors_.size())));
      return handle;
    }
    t = tensors_[id.index].get();
    needs_commit = !t->committed;
  }
  op->tensor = t->name;
  op->tensor_index = t->index;
  op->input = input;
  op->output = output;
  op->lr = lr;
  const std::string what = fmt::format("{}: push_pull of tensor '{}'", label_, t->name);
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
    Status committed = CommitDeclarations();
    if (!committed.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!t->committed && t->error.ok()) {
        ++stats_.ops_failed;
        op->Complete(committed);
        return handle;
      }
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  Status error;
  if (std::optional<Status> stopped = StoppedLocked()) {
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
  } else if (std::optional<Status> blocked = FinishedWorkerBlocksLocked(*t)) {
    error = *blocked;
  }
  if (!error.ok()) {
    ++stats_.ops_failed;
    op->Complete(error);
    return handle;
  }
  if (t->partitions.empty()) {
    ++stats_.ops_completed;
    op->Complete(Status::Ok());
    return handle;
  }
  op->deadline = clock_->Now() + cluster_.worker.op_timeout;
  op->remaining = t->partitions.size();
  t->op = op;
  deadlines_.insert({op->deadline, t->index});
  const uint64_t seq = next_op_seq_++;
  for (Partition& p : t->partitions) {
    p.stage = Stage::kQueued;
    p.seq = seq;
    active_.insert({seq, t->index, p.range.index});
    ready_.push(Ready{t->options.priority, t->index, p.range.index});
  }
  dispatch_cv_.notify_one();
  return handle;
}

// ---------------------------------------------------------------------------------------------
// Dispatcher

void Engine::DispatchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t credit = cluster_.worker.credit_bytes;
  while (!stop_dispatcher_) {
    while (!ready_.empty()) {
      const Ready top = ready_.top();
      Tensor& t = *tensors_[top.tensor];
      Partition& p = t.partitions[top.partition];
      if (!t.op || t.op->failed || p.stage != Stage::kQueued) {
        ready_.pop();  // left by an op that failed
        continue;
      }
      if (in_flight_bytes_ > 0 && in_flight_bytes_ + p.bytes > credit) break;
      ready_.pop();
      StartLocked(t, top.partition);
    }
    // The first partition in posting order always goes (see "Credit without deadlock").
    if (!active_.empty()) {
      const auto [seq, ti, j] = *active_.begin();
      Tensor& t = *tensors_[ti];
      if (t.partitions[j].stage == Stage::kQueued && t.op && !t.op->failed) StartLocked(t, j);
    }
    const Clock::time_point now = clock_->Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const uint32_t ti = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      Tensor& t = *tensors_[ti];
      if (t.op && !t.op->failed) {
        std::shared_ptr<OpState> op = t.op;
        FailOpLocked(t, op, TimeoutStatusLocked(t, *op));
        MaybeFinishLocked(t, op);
      }
    }
    if (stop_dispatcher_) break;
    if (deadlines_.empty()) {
      dispatch_cv_.wait(lock);
    } else {
      // A copy: the set's element may be erased while the lock is released.
      const Clock::time_point next = deadlines_.begin()->first;
      clock_->WaitOnce(lock, dispatch_cv_, next);
    }
  }
}

Status Engine::TimeoutStatusLocked(const Tensor& t, const OpState& op) const {
  std::set<uint32_t> servers;
  std::string listed;
  size_t missing = 0;
  for (const Partition& p : t.partitions) {
    if (p.stage == Stage::kIdle) continue;  // complete
    ++missing;
    servers.insert(p.server);
    if (missing > kListedPartitions) continue;
    std::string state;
    switch (p.stage) {
      case Stage::kQueued: state = "not started (waiting for credit)"; break;
      case Stage::kCompressing: state = fmt::format("compressing round {}", p.round); break;
      case Stage::kOnWire: state = fmt::format("pushed round {}, no reply", p.round); break;
      case Stage::kDecompressing: state = fmt::format("decompressing round {}", p.round); break;
      case Stage::kIdle: break;
    }
    listed += fmt::format("{}partition {} (key {}) on server {}: {}", listed.empty() ? "" : "; ",
                          p.range.index, p.range.key, p.server, state);
  }
  if (missing > kListedPartitions) {
    listed += fmt::format("; and {} more", missing - kListedPartitions);
  }
  std::string server_list;
  for (uint32_t s : servers) server_list += (server_list.empty() ? "" : ", ") + std::to_string(s);
  return TimeoutError(fmt::format(
      "{}: push_pull of tensor '{}' timed out after {} ms (worker.op_timeout): {} of {} "
      "partitions incomplete, waiting for server(s) {}: {}",
      label_, t.name, cluster_.worker.op_timeout.count(), missing, t.partitions.size(), server_list,
      listed));
}

// ---------------------------------------------------------------------------------------------
// Pool jobs

bool Engine::DropJobIfFailed(Tensor& t, Partition& p, const std::shared_ptr<OpState>& op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!op->failed) return false;
  SetIdleLocked(t, p);
  JobDoneLocked(t, op);
  return true;
}

void Engine::CompressAndPush(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                             uint64_t round) {
  Partition& p = t->partitions[j];
  if (DropJobIfFailed(*t, p, op)) return;
  const size_t esz = DTypeSize(t->dtype);
  const ConstTensorView in(static_cast<const uint8_t*>(op->input.data()) + p.range.offset * esz,
                           p.range.elements, t->dtype);
  const CompressContext ctx{p.range.key, round, rank_};
  const EngineClock::time_point t0 = EngineClock::now();
  // `none` (no residual): the payload is its header and the input's bytes, sent as one frame
  // from the input itself (glued), not compressed into a copy.
  uint8_t raw_header[compressors::kPayloadHeaderBytes];
  const bool raw = !p.residual && p.compressor->RawBodyHeader(in, ctx, raw_header);
  const size_t in_bytes = p.range.elements * esz;
  StatusOr<size_t> bytes = compressors::kPayloadHeaderBytes + in_bytes;
  if (!raw) {
    const size_t max_bytes = p.compressor->MaxCompressedBytes(p.range.elements, t->dtype);
    // The previous payload is reused once the transport (and the server) let go of it.
    if (!p.payload || p.payload.use_count() > 1) {
      p.payload = std::make_shared<std::vector<uint8_t>>(max_bytes);
    } else if (p.payload->size() < max_bytes) {
      p.payload->resize(max_bytes);
    }
    MutableByteSpan out(p.payload->data(), p.payload->size());
    bytes = p.residual ? p.residual->Compress(*p.compressor, in, ctx, out)
                       : p.compressor->Compress(in, ctx, out);
  }
  const EngineClock::time_point t1 = EngineClock::now();
  compressors::CompressorTelemetry telemetry;  // quantisers (loco) and states (separate)
  p.compressor->TakeTelemetry(&telemetry);
  if (p.residual) p.residual->TakeTelemetry(&telemetry);

  transport::Message msg;
  if (bytes.ok()) {
    v1::DataHeader h;
    h.set_op(v1::DataHeader::OP_PUSH);
    h.set_generation(generation_.load());
    h.set_key(p.range.key);
    h.set_round(round);
    h.set_sender(rank_);
    h.set_compressor(p.compressor->id());
    h.set_element_count(p.range.elements);
    h.set_dtype(static_cast<uint32_t>(t->dtype));
    h.set_byte_count(*bytes);
    if (op->lr) h.set_lr(*op->lr);
    h.SerializeToString(&msg.header);
    if (!raw) msg.frames.push_back(transport::Buffer::Borrow(p.payload->data(), *bytes, p.payload));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.compress_ns += Ns(t1 - t0);
    stats_.quantized_values += telemetry.values;
    stats_.quantized_saturated += telemetry.saturated;
    stats_.error_values += telemetry.error_values;
    stats_.error_saturated += telemetry.error_saturated;
    if (telemetry.error_reported) {
      error_sq_ += telemetry.error_sq - p.error_sq;
      p.error_sq = telemetry.error_sq;
      stats_.error_norm = std::sqrt(std::max(0.0, error_sq_));
    }
    if (telemetry.gradient_reported) {
      gradient_sq_ += telemetry.gradient_sq - p.gradient_sq;
      p.gradient_sq = telemetry.gradient_sq;
      stats_.gradient_norm = std::sqrt(std::max(0.0, gradient_sq_));
    }
    if (op->failed || !bytes.ok()) {
      if (!op->failed) {
        FailOpLocked(*t, op,
                     bytes.status().WithContext(
                         fmt::format("{}: compressing tensor '{}' partition {} (key {}, round {})",
                                     label_, t->name, j, p.range.key, round)));
      }
      SetIdleLocked(*t, p);
      JobDoneLocked(*t, op);
      return;
    }
    p.stage = Stage::kOnWire;
    p.pushed_at = EngineClock::now();
    op->last_push = std::max(op->last_push, p.pushed_at);
    ++stats_.partitions_pushed;
    stats_.bytes_pushed += *bytes;
    op->bytes_pushed += *bytes;
    stats_.raw_bytes_pushed += p.range.elements * DTypeSize(t->dtype);
    if (raw) {
      ++op->active_jobs;  // until the transport lets go of the input (InputLease)
      msg.frames.push_back(transport::Buffer::Copy(raw_header, sizeof(raw_header)));
      msg.frames.push_back(transport::Buffer::Borrow(in.data(), in_bytes, InputLease(t, op)));
      msg.glue_next = {true, false};
    }
  }
  // Outside mu_: the transport may drop the frames (and run InputLease's release) in Send.
  const Status sent = endpoint_->Send(p.peer, std::move(msg));
  std::lock_guard<std::mutex> lock(mu_);
  if (!sent.ok()) {
    if (p.stage == Stage::kOnWire && p.round == round) SetIdleLocked(*t, p);
    FailOpLocked(*t, op,
                 sent.WithContext(fmt::format("{}: pushing tensor '{}' partition {} (key {}, "
                                              "round {}) to server {}",
                                              label_, t->name, j, p.range.key, round, p.server)));
  }
  JobDoneLocked(*t, op);
}

std::shared_ptr<const void> Engine::InputLease(Tensor* t, const std::shared_ptr<OpState>& op) {
  return std::shared_ptr<const void>(op.get(), [this, t, op](const void*) {
    std::lock_guard<std::mutex> lock(mu_);
    JobDoneLocked(*t, op);
  });
}

void Engine::DecompressAndComplete(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                                   const transport::Buffer& payload) {
  Partition& p = t->partitions[j];
  if (DropJobIfFailed(*t, p, op)) return;
  const size_t n = p.range.elements;
  void* dst = static_cast<uint8_t*>(op->output.data()) + p.range.offset * DTypeSize(t->dtype);
  const EngineClock::time_point t0 = EngineClock::now();
  Status s;
  if (!t->server_optimizer) {
    // The aggregate comes in the tensor's dtype (the server sums in fp32 and rounds once): it
    // decodes straight into the output.
    const TensorView out(dst, n, t->dtype);
    s = p.residual ? p.residual->DecompressReply(*p.compressor, payload.span(),
                                                 CompressContext{p.range.key, p.round, rank_}, out)
                   : p.compressor->Decompress(payload.span(), out);
  } else if (t->server_optimizer->difference()) {
    // The weights' change against this worker's copy, added the way the server's mirror adds it.
    s = compressors::ApplyMirrorPull(*p.pull_codec, payload.span(), {static_cast<float*>(dst), n});
  } else {
    s = p.pull->Decompress(payload.span(), TensorView(dst, n, DType::kFloat32));
  }
  const EngineClock::time_point t1 = EngineClock::now();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.decompress_ns += Ns(t1 - t0);
  if (s.ok()) stats_.raw_bytes_pulled += n * DTypeSize(t->dtype);
  if (!op->failed) {
    if (s.ok()) {
      --op->remaining;
    } else {
      FailOpLocked(*t, op,
                   s.WithContext(fmt::format("{}: the aggregate of tensor '{}' partition {} (key "
                                             "{}, round {}) from server {}",
                                             label_, t->name, j, p.range.key, p.round, p.server)));
    }
  }
  SetIdleLocked(*t, p);
  JobDoneLocked(*t, op);
}

// ---------------------------------------------------------------------------------------------
// I/O thread

void Engine::RegisterHandlers() {
  using node::Plane;
  using node::Sender;
  endpoint_->OnData(v1::DataHeader::OP_PULL_REPLY,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message& m) {
                      OnReply(from.peer, h, m);
                    });
  endpoint_->OnData(v1::DataHeader::OP_STATE_REPLY,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message& m) {
                      OnStateReply(from.peer, h, m);
                    });
  endpoint_->OnData(v1::DataHeader::OP_ERROR,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message&) {
                      OnError(from.peer, h);
                    });
  endpoint_->OnData(v1::DataHeader::OP_DECLARE_REPLY,
                    [this](const Sender& from, v1::DataHeader& h, transport::Message&) {
                      if (from.peer == kServer0) {
                        OnDeclareVerdict(h.round(), Status::Ok());
                      } else {
                        BP_LOG_WARN(
                            "{}: dropped a declaration reply from '{}' (only server 0 "
                            "checks)",
                            label_, from.peer);
                      }
                    });
  endpoint_->OnRejected(
      Plane::kData, [this](const Sender& from, const transport::Message&,
                           node::NodeEndpoint::Rejection why, std::string_view what) {
        if (why == node::NodeEndpoint::Rejection::kMalformed) {
          BP_LOG_WARN("{}: dropped a malformed data message from '{}'", label_, from.peer);
        } else {
          BP_LOG_WARN("{}: dropped a {} from '{}', which is not a server", label_, what, from.peer);
        }
      });
  endpoint_->OnEvent(Plane::kData, [this](const Sender& from, const transport::TransportEvent& ev) {
    if (ev.kind == transport::TransportEvent::Kind::kSendFailed && from.Is(v1::ROLE_SERVER)) {
      OnSendFailed(from.peer, ev.status);
      return;
    }
    // A lost connection is not a verdict: the scheduler's heartbeats decide (and op_timeout
    // bounds every op meanwhile).
    BP_LOG_DEBUG("{}: transport event about {}: {}", label_, from.peer,
                 ev.status.ok() ? std::string("connected") : ev.status.ToString());
  });
}

void Engine::OnSendFailed(const std::string& peer, const Status& why) {
  // A push that never left: fail the ops waiting on that server.
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& tp : tensors_) {
    Tensor& t = *tp;
    if (!t.op || t.op->failed) continue;
    bool affected = false;
    for (Partition& p : t.partitions) {
      if (p.stage == Stage::kOnWire && p.peer == peer) affected = true;
    }
    if (affected) {
      std::shared_ptr<OpState> op = t.op;
      FailOpLocked(t, op,
                   UnavailableError(fmt::format("{}: push_pull of tensor '{}': sending to {} "
                                                "failed: {}",
                                                label_, t.name, ServerLabel(peer), why.message())));
      MaybeFinishLocked(t, op);
    }
  }
}

Engine::Tensor* Engine::FindTensorLocked(uint64_t key, uint32_t* partition) {
  const uint64_t index = key >> 32;
  if (index >= tensors_.size()) return nullptr;
  Tensor* t = tensors_[index].get();
  const uint64_t j = key & 0xffffffffu;
  if (j >= t->partitions.size()) return nullptr;
  *partition = static_cast<uint32_t>(j);
  return t;
}

void Engine::OnReply(const std::string& from, const v1::DataHeader& h, transport::Message& msg) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t j = 0;
  Tensor* t = FindTensorLocked(h.key(), &j);
  if (t == nullptr) {
    BP_LOG_WARN("{}: dropped a reply from '{}' for unknown key {}", label_, from, h.key());
    return;
  }
  Partition& p = t->partitions[j];
  std::shared_ptr<OpState> op = t->op;
  if (!op || op->failed || p.stage != Stage::kOnWire || p.round != h.round() || p.peer != from) {
    // E.g. the reply to a push whose op already failed (timeout).
    BP_LOG_DEBUG("{}: dropped a stale reply from '{}' for key {} round {}", label_, from, h.key(),
                 h.round());
    return;
  }
  const EngineClock::time_point replied = EngineClock::now();
  stats_.network_ns += Ns(replied - p.pushed_at);
  if (op->first_reply == EngineClock::time_point{}) op->first_reply = replied;
  if (msg.frames.empty()) {
    SetIdleLocked(*t, p);
    FailOpLocked(
        *t, op,
        DataLossError(fmt::format("{}: {} replied to key {} (tensor '{}' partition {}, "
                                  "round {}) without a payload",
                                  label_, ServerLabel(from), h.key(), t->name, j, h.round())));
    MaybeFinishLocked(*t, op);
    return;
  }
  transport::Buffer payload = std::move(msg.frames[0]);
  stats_.bytes_pulled += payload.size();
  op->bytes_pulled += payload.size();
  p.stage = Stage::kDecompressing;
  ++op->active_jobs;
  if (!pool_->Post([this, t, j, op,
                    payload = std::move(payload)] { DecompressAndComplete(t, j, op, payload); },
                   /*urgent=*/true)) {
    SetIdleLocked(*t, p);
    FailOpLocked(*t, op, CancelledError(label_ + ": the engine is stopping"));
    JobDoneLocked(*t, op);
  }
}

void Engine::OnError(const std::string& from, const v1::DataHeader& h) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t j = 0;
  Tensor* t = FindTensorLocked(h.key(), &j);
  const bool push_match = t != nullptr && t->op && !t->op->failed &&
                          t->partitions[j].stage == Stage::kOnWire &&
                          t->partitions[j].round == h.round() && t->partitions[j].peer == from;
  // OP_ERROR names the refused request by its op (refused_op) and (key, round); a refused
  // declaration has its epoch as the round.
  if (h.refused_op() == v1::DataHeader::OP_DECLARE && from == kServer0 && pending_epoch_ &&
      *pending_epoch_ == h.round()) {
    declare_verdict_ = RemoteStatus(
        h.error_code(), fmt::format("{}: declaration check of epoch {} at server 0: {}", label_,
                                    h.round(), h.error()));
    decl_cv_.notify_all();
    return;
  }
  if (h.refused_op() == v1::DataHeader::OP_STATE_READ ||
      h.refused_op() == v1::DataHeader::OP_STATE_WRITE) {
    auto call = state_calls_.find(h.key());
    if (call != state_calls_.end() && call->second.peer == from && !call->second.done) {
      call->second.done = true;
      call->second.status = RemoteStatus(
          h.error_code(), fmt::format("{}: {} refused {} of key {}: {}", label_, ServerLabel(from),
                                      call->second.what, h.key(), h.error()));
      state_cv_.notify_all();
    }
    return;
  }
  if (!push_match) {
    BP_LOG_WARN("{}: {} reported an error for key {} round {} with no such push in flight: {}",
                label_, ServerLabel(from), h.key(), h.round(), h.error());
    return;
  }
  Partition& p = t->partitions[j];
  std::shared_ptr<OpState> op = t->op;
  SetIdleLocked(*t, p);
  FailOpLocked(*t, op,
               RemoteStatus(h.error_code(),
                            fmt::format("{}: {} refused key {} (tensor '{}' partition {}, round "
                                        "{}): {}",
                                        label_, ServerLabel(from), h.key(), t->name, j, h.round(),
                                        h.error())));
  MaybeFinishLocked(*t, op);
}

// ---------------------------------------------------------------------------------------------
// Server error-feedback state (checkpoints)

StatusOr<std::vector<float>> Engine::ServerErrorFeedbackState(TensorId tensor) {
  std::vector<transport::Buffer> parts;
  BP_RETURN_IF_ERROR(ServerStateCall(tensor, StateKind::kResidual, /*write=*/false, {}, &parts));
  std::vector<float> out;
  bool any = false;
  for (const transport::Buffer& b : parts) any = any || b.size() != 0;
  if (!any) return out;  // no partition keeps a server residual
  std::lock_guard<std::mutex> lock(mu_);
  const Tensor& t = *tensors_[tensor.index];
  out.reserve(t.elements);
  for (size_t j = 0; j < t.partitions.size(); ++j) {
    const Partition& p = t.partitions[j];
    if (parts[j].size() != p.range.elements * sizeof(float)) {
      return DataLossError(fmt::format(
          "{}: ServerErrorFeedbackState of tensor '{}': {} sent {} bytes for key {}, which has {} "
          "values",
          label_, t.name, ServerLabel(p.peer), parts[j].size(), p.range.key, p.range.elements));
    }
    const size_t at = out.size();
    out.resize(at + p.range.elements);
    if (p.range.elements > 0) std::memcpy(out.data() + at, parts[j].data(), parts[j].size());
  }
  return out;
}

Status Engine::RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  std::vector<std::string> parts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tensor.index >= tensors_.size()) {
      return InvalidArgumentError(
          fmt::format("RestoreServerErrorFeedbackState: no tensor #{}", tensor.index));
    }
    const Tensor& t = *tensors_[tensor.index];
    if (!saved.empty() && saved.size() != t.elements) {
      return InvalidArgumentError(
          fmt::format("RestoreServerErrorFeedbackState of tensor '{}': {} values given, the "
                      "tensor has {}",
                      t.name, saved.size(), t.elements));
    }
    for (const Partition& p : t.partitions) {
      parts.emplace_back(
          saved.empty() ? std::string()
                        : std::string(reinterpret_cast<const char*>(saved.data() + p.range.offset),
                                      p.range.elements * sizeof(float)));
    }
  }
  return ServerStateCall(tensor, StateKind::kResidual, /*write=*/true, std::move(parts), nullptr);
}

namespace {

// Weights move to and from the servers in batches of whole partitions of at most this many bytes
// (one partition when larger), so a worker's transient copies stay bounded whatever the model.
constexpr uint64_t kWeightBatchBytes = 16ull << 20;

}  // namespace

std::vector<std::pair<size_t, size_t>> Engine::WeightBatches(const Tensor& t) {
  std::vector<std::pair<size_t, size_t>> out;  // (first partition, count)
  uint64_t bytes = 0;
  for (size_t j = 0; j < t.partitions.size(); ++j) {
    const uint64_t b = t.partitions[j].range.elements * sizeof(float);
    if (out.empty() || bytes + b > kWeightBatchBytes) {
      out.emplace_back(j, 0);
      bytes = 0;
    }
    ++out.back().second;
    bytes += b;
  }
  return out;
}

Status Engine::CheckServerWeightsCall(TensorId tensor, const TensorView& weights,
                                      const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tensor.index >= tensors_.size()) {
    return InvalidArgumentError(fmt::format("{}: no tensor #{}", what, tensor.index));
  }
  const Tensor& t = *tensors_[tensor.index];
  if (!t.server_optimizer) {
    return InvalidArgumentError(
        fmt::format("{} of tensor '{}': its optimizer does not run on the servers", what, t.name));
  }
  if (weights.count() != t.elements || weights.dtype() != DType::kFloat32 ||
      (t.elements > 0 && weights.data() == nullptr)) {
    return InvalidArgumentError(
        fmt::format("{} of tensor '{}': the weights must be {} float32 values, got {} of {}", what,
                    t.name, t.elements, weights.count(), DTypeName(weights.dtype())));
  }
  return Status::Ok();
}

Status Engine::InitServerWeights(TensorId tensor, TensorView weights) {
  constexpr const char* kWhat = "InitServerWeights";
  BP_RETURN_IF_ERROR(CheckServerWeightsCall(tensor, weights, kWhat));
  // Worker 0 installs; every worker (worker 0 too) then reads what the servers hold, which
  // waits at each server for worker 0's install.
  if (rank_ == 0) {
    const Tensor* t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t = tensors_[tensor.index].get();  // partitions are immutable after Declare
    }
    const auto* w = static_cast<const char*>(weights.data());
    for (const auto& [first, count] : WeightBatches(*t)) {
      std::vector<std::string> parts;
      for (size_t j = first; j < first + count; ++j) {
        const PartitionRange& r = t->partitions[j].range;
        parts.emplace_back(w + r.offset * sizeof(float), r.elements * sizeof(float));
      }
      BP_RETURN_IF_ERROR(ServerStateCall(tensor, StateKind::kWeights, /*write=*/true,
                                         std::move(parts), nullptr, nullptr, first, count));
    }
  }
  return ReadServerWeights(tensor, weights, kWhat);
}

Status Engine::PullServerWeights(TensorId tensor, TensorView weights) {
  constexpr const char* kWhat = "PullServerWeights";
  BP_RETURN_IF_ERROR(CheckServerWeightsCall(tensor, weights, kWhat));
  return ReadServerWeights(tensor, weights, kWhat);
}

Status Engine::ReadServerWeights(TensorId tensor, TensorView weights, const char* what) {
  const Tensor* tp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tp = tensors_[tensor.index].get();
  }
  const Tensor& t = *tp;  // partitions are immutable after Declare
  auto* out = static_cast<char*>(weights.data());
  std::optional<uint64_t> round;
  for (const auto& [first, count] : WeightBatches(t)) {
    std::vector<transport::Buffer> parts;
    std::vector<uint64_t> rounds;
    BP_RETURN_IF_ERROR(ServerStateCall(tensor, StateKind::kWeights, /*write=*/false, {}, &parts,
                                       &rounds, first, count));
    for (size_t k = 0; k < count; ++k) {
      const Partition& p = t.partitions[first + k];
      // Every partition of a tensor steps once per push_pull: they continue at the same round.
      if (!round) round = rounds[k];
      if (rounds[k] != *round) {
        return DataLossError(fmt::format(
            "{}: {} of tensor '{}': its partitions are at different rounds ({} at key {}, {} at "
            "key {}); restore every partition from the same checkpoint",
            label_, what, t.name, *round, t.partitions[0].range.key, rounds[k], p.range.key));
      }
      if (parts[k].size() != p.range.elements * sizeof(float)) {
        return DataLossError(
            fmt::format("{}: {} of tensor '{}': {} sent {} bytes of weights for key {}, which "
                        "has {} values",
                        label_, what, t.name, ServerLabel(p.peer), parts[k].size(), p.range.key,
                        p.range.elements));
      }
      if (parts[k].size() != 0) {
        std::memcpy(out + p.range.offset * sizeof(float), parts[k].data(), parts[k].size());
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Tensor& mt = *tensors_[tensor.index];
  if (mt.op) {
    return FailedPreconditionError(
        fmt::format("{} of tensor '{}': a push_pull of it is in flight", what, mt.name));
  }
  if (round) {
    mt.rounds_done = *round;
    for (Partition& p : mt.partitions) p.next_round = *round;
  }
  mt.weights_ready = true;
  return Status::Ok();
}

StatusOr<std::vector<std::string>> Engine::ServerOptimizerState(TensorId tensor) {
  std::vector<transport::Buffer> parts;
  BP_RETURN_IF_ERROR(
      ServerStateCall(tensor, StateKind::kOptimizerState, /*write=*/false, {}, &parts));
  std::vector<std::string> out;
  out.reserve(parts.size());
  for (const transport::Buffer& b : parts) {
    out.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
  }
  return out;
}

Status Engine::RestoreServerOptimizerState(TensorId tensor, const std::vector<std::string>& saved) {
  return ServerStateCall(tensor, StateKind::kOptimizerState, /*write=*/true, saved, nullptr);
}

Status Engine::ServerStateCall(TensorId id, StateKind kind, bool write,
                               std::vector<std::string> saved, std::vector<transport::Buffer>* out,
                               std::vector<uint64_t>* rounds, size_t first, size_t count) {
  const char* what = "";
  const char* state = "";
  switch (kind) {
    case StateKind::kResidual:
      what = write ? "RestoreServerErrorFeedbackState" : "ServerErrorFeedbackState";
      state = "the server residual";
      break;
    case StateKind::kOptimizerState:
      what = write ? "RestoreServerOptimizerState" : "ServerOptimizerState";
      state = "the server-side optimizer state";
      break;
    case StateKind::kWeights:
      what = write ? "InitServerWeights" : "PullServerWeights";
      state = write ? "the starting weights" : "the workers' copy of the weights";
      break;
  }
  bool needs_commit = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id.index >= tensors_.size()) {
      return InvalidArgumentError(fmt::format("{}: no tensor #{}", what, id.index));
    }
    needs_commit = !tensors_[id.index]->committed;
  }
  // The servers know a tensor's keys once its declaration is committed.
  if (needs_commit) BP_RETURN_IF_ERROR(CommitDeclarations());
  std::lock_guard<std::mutex> call_lock(state_call_mu_);
  Tensor* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<Status> stopped = StoppedLocked()) return *stopped;
    t = tensors_[id.index].get();
    const std::string name = fmt::format("{} of tensor '{}'", what, t->name);
    if (!t->error.ok()) return t->error.WithContext(name);
    if (t->op) return FailedPreconditionError(name + ": a push_pull of it is in flight");
    if (kind != StateKind::kResidual && !t->server_optimizer) {
      return InvalidArgumentError(name + ": its optimizer does not run on the servers");
    }
    first = std::min(first, t->partitions.size());
    count = std::min(count, t->partitions.size() - first);
    if (write && saved.size() != count) {
      return InvalidArgumentError(
          fmt::format("{}: {} saved part(s) given, the tensor has {} "
                      "partition(s)",
                      name, saved.size(), count));
    }
    state_calls_.clear();
    for (size_t j = first; j < first + count; ++j) {
      const Partition& p = t->partitions[j];
      StateCall& c = state_calls_[p.range.key];
      c.peer = p.peer;
      c.what = state;
    }
  }
  for (size_t j = first; j < first + count; ++j) {
    const Partition& p = t->partitions[j];
    v1::DataHeader h;
    h.set_op(write ? v1::DataHeader::OP_STATE_WRITE : v1::DataHeader::OP_STATE_READ);
    h.set_generation(generation_.load());
    h.set_key(p.range.key);
    h.set_sender(rank_);
    h.set_optimizer_state(kind == StateKind::kOptimizerState);
    h.set_weights(kind == StateKind::kWeights);
    std::vector<transport::Buffer> frames;
    if (write) {
      if (kind != StateKind::kOptimizerState) h.set_element_count(saved[j].size() / sizeof(float));
      h.set_byte_count(saved[j].size());
      frames.push_back(transport::Buffer::Take(std::move(saved[j - first])));
    }
    const Status sent = endpoint_->SendData(p.peer, h, std::move(frames));
    if (!sent.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      state_calls_.clear();
      return sent.WithContext(fmt::format("{}: {} of tensor '{}' (key {}) to server {}", label_,
                                          what, t->name, p.range.key, p.server));
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  const bool answered = state_cv_.wait_for(lock, cluster_.worker.op_timeout, [&] {
    if (!cluster_error_.ok() || closed_ || recovering_) return true;
    for (const auto& [key, call] : state_calls_) {
      if (!call.done) return false;
    }
    return true;
  });
  std::map<uint64_t, StateCall> calls = std::move(state_calls_);
  state_calls_.clear();
  if (!cluster_error_.ok()) return cluster_error_;
  if (closed_) return CancelledError(label_ + ": the client was closed");
  if (recovering_) return *recovering_;
  if (!answered) {
    for (const auto& [key, call] : calls) {
      if (!call.done) {
        return TimeoutError(fmt::format(
            "{}: {} of tensor '{}': no answer from {} for key {} within {} ms "
            "(worker.op_timeout){}",
            label_, what, t->name, ServerLabel(call.peer), key, cluster_.worker.op_timeout.count(),
            kind == StateKind::kWeights && !write
                ? "; the server answers once worker 0's InitServerWeights (or a checkpoint's "
                  "RestoreServerOptimizerState) installed the weights"
                : ""));
      }
    }
  }
  for (const auto& [key, call] : calls) BP_RETURN_IF_ERROR(call.status);
  if (out != nullptr) {
    out->clear();
    for (size_t j = first; j < first + count; ++j) {
      out->push_back(std::move(calls[t->partitions[j].range.key].frame));
    }
  }
  if (rounds != nullptr) {
    rounds->clear();
    for (size_t j = first; j < first + count; ++j) {
      rounds->push_back(calls[t->partitions[j].range.key].round);
    }
  }
  return Status::Ok();
}

void Engine::OnStateReply(const std::string& from, const v1::DataHeader& h,
                          const transport::Message& m) {
  std::lock_guard<std::mutex> lock(mu_);
  auto call = state_calls_.find(h.key());
  if (call == state_calls_.end() || call->second.peer != from || call->second.done) {
    BP_LOG_WARN("{}: {} sent a server-state reply for key {} that nobody asked for", label_,
                ServerLabel(from), h.key());
    return;
  }
  StateCall& c = call->second;
  c.done = true;
  if (h.refused_op() == v1::DataHeader::OP_STATE_READ) {
    if (m.frames.size() != 1) {
      c.status =
          DataLossError(fmt::format("{}: {} sent {} of key {} in {} frames (one expected)", label_,
                                    ServerLabel(from), c.what, h.key(), m.frames.size()));
    } else {
      c.frame = m.frames[0];  // shares the received bytes
      c.round = h.round();
    }
  }
  state_cv_.notify_all();
}

std::optional<Status> Engine::FinishedWorkerBlocksLocked(const Tensor& t) const {
  if (t.partitions.empty()) return std::nullopt;  // completes without the servers
  for (const auto& [worker, rounds] : finished_workers_) {
    const uint64_t theirs = t.index < rounds.size() ? rounds[t.index] : 0;
    if (t.rounds_done < theirs) continue;
    return FailedPreconditionError(fmt::format(
        "{}: push_pull of tensor '{}' (its push_pull #{} here) cannot complete: worker {} is "
        "done after {} push_pull{} of it (its training ended). The workers ran different "
        "numbers of steps (uneven data?): give every worker the same number of steps, e.g. "
        "the same number of batches per epoch (drop the last partial batch)",
        label_, t.name, t.rounds_done + 1, worker, theirs, theirs == 1 ? "" : "s"));
  }
  return std::nullopt;
}

void Engine::OnWorkerFinished(uint32_t worker, const std::vector<uint64_t>& rounds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (worker == rank_) return;
  finished_workers_[worker] = rounds;
  for (const auto& tp : tensors_) {
    Tensor& t = *tp;
    if (!t.op || t.op->failed) continue;
    if (std::optional<Status> blocked = FinishedWorkerBlocksLocked(t)) {
      std::shared_ptr<OpState> op = t.op;
      FailOpLocked(t, op, *blocked);
      MaybeFinishLocked(t, op);
    }
  }
}

void Engine::OnClusterError(const Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cluster_error_.ok()) cluster_error_ = error;
    FailAllLocked(error);
  }
  decl_cv_.notify_all();
  state_cv_.notify_all();
  recover_cv_.notify_all();
}

void Engine::OnShutdownVerdict(const Status& verdict) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Shutdown() sent this worker's Done: the end it asked for. After Close nothing waits.
    if (shutting_down_ || closed_) return;
    // An error shutdown is the sticky error already (on_error came first); a clean one reached a
    // worker that is still training: its job ended under it, so everything fails now (sticky,
    // like a cluster error) rather than at op_timeout.
    if (cluster_error_.ok()) {
      cluster_error_ = Status(verdict.code(), fmt::format("{}: {} before this worker finished (it "
                                                          "sent no Done)",
                                                          label_, verdict.message()));
    }
    FailAllLocked(cluster_error_);
  }
  decl_cv_.notify_all();
  state_cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Bookkeeping (mu_ held)

void Engine::SetIdleLocked(Tensor& t, Partition& p) {
  if (p.stage == Stage::kIdle) return;
  if (p.stage != Stage::kQueued) {
    BP_CHECK(in_flight_bytes_ >= p.bytes, "credit accounting underflow");
    in_flight_bytes_ -= p.bytes;
  }
  active_.erase({p.seq, t.index, p.range.index});
  dispatch_cv_.notify_one();
  p.stage = Stage::kIdle;
}

void Engine::StartLocked(Tensor& t, uint32_t j) {
  Partition& p = t.partitions[j];
  in_flight_bytes_ += p.bytes;
  stats_.peak_bytes_in_flight = std::max(stats_.peak_bytes_in_flight, in_flight_bytes_);
  p.stage = Stage::kCompressing;
  p.round = p.next_round++;
  std::shared_ptr<OpState> op = t.op;
  ++op->active_jobs;
  Tensor* tp = &t;
  const uint64_t round = p.round;
  if (!pool_->Post([this, tp, j, op, round] { CompressAndPush(tp, j, op, round); })) {
    SetIdleLocked(t, p);
    FailOpLocked(t, op, CancelledError(label_ + ": the engine is stopping"));
    JobDoneLocked(t, op);
  }
}

void Engine::FailOpLocked(Tensor& t, const std::shared_ptr<OpState>& op, const Status& error) {
  if (op->failed || op->finished) return;
  op->failed = true;
  op->error = error;
  // The tensor's rounds are now out of step with the servers' (sticky).
  if (t.error.ok()) t.error = error;
  deadlines_.erase({op->deadline, t.index});
  for (Partition& p : t.partitions) {
    // Queued partitions never started; pushed ones no longer wait for their reply (a late
    // reply is dropped). Compressing/decompressing ones belong to their job, which cleans up.
    if (p.stage == Stage::kQueued || p.stage == Stage::kOnWire) SetIdleLocked(t, p);
  }
  dispatch_cv_.notify_one();
}

void Engine::FailAllLocked(const Status& error) {
  for (const auto& tp : tensors_) {
    Tensor& t = *tp;
    if (!t.op || t.op->failed) continue;
    std::shared_ptr<OpState> op = t.op;
    FailOpLocked(t, op,
                 error.WithContext(fmt::format("{}: push_pull of tensor '{}'", label_, t.name)));
    MaybeFinishLocked(t, op);
  }
}

void Engine::JobDoneLocked(Tensor& t, const std::shared_ptr<OpState>& op) {
  BP_CHECK(op->active_jobs > 0, "job accounting underflow");
  --op->active_jobs;
  MaybeFinishLocked(t, op);
}

void Engine::MaybeFinishLocked(Tensor& t, const std::shared_ptr<OpState>& op) {
  if (op->finished || op->active_jobs > 0) return;
  if (!op->failed && op->remaining > 0) return;
  op->finished = true;
  if (t.op == op) t.op.reset();
  deadlines_.erase({op->deadline, t.index});
  if (op->failed) {
    ++stats_.ops_failed;
  } else {
    ++stats_.ops_completed;
    ++t.rounds_done;
    stats_.last_push_ns += Ns(op->last_push - op->started);
    stats_.first_reply_ns += Ns(op->first_reply - op->started);
    stats_.op_ns += Ns(EngineClock::now() - op->started);
  }
  op->Complete(op->failed ? op->error : Status::Ok());
}

}  // namespace bitpush::worker
