#include "worker/client.h"

#include <fmt/format.h>

#include <utility>

#include "common/logging.h"
#include "config/node_metrics.h"
#include "worker/client_backend.h"
#include "worker/daemon_client.h"
#include "worker/engine.h"
#include "worker/engine_metrics.h"

namespace bitpush::worker {

namespace {

// How long Wait() waits past an op's deadline before it gives up on the engine (which
// completes every op by its deadline; reaching this would be an engine bug).
constexpr std::chrono::seconds kWaitGrace{60};

}  // namespace

Status PushPullHandle::Wait() const {
  if (!op_) return FailedPreconditionError("Wait on an empty PushPullHandle");
  std::unique_lock<std::mutex> lock(op_->mu);
  if (op_->deadline == EngineClock::time_point()) {
    // Completed at creation (validation) or not started yet: PushPull completes such ops
    // before returning.
    op_->cv.wait(lock, [&] { return op_->done; });
    return op_->status;
  }
  if (!op_->cv.wait_until(lock, op_->deadline + kWaitGrace, [&] { return op_->done; })) {
    BP_LOG_ERROR("push_pull of tensor '{}' not complete {} s after its deadline", op_->tensor,
                 kWaitGrace.count());
    return InternalError(fmt::format(
        "push_pull of tensor '{}' not complete {} s after its deadline (worker.op_timeout)",
        op_->tensor, kWaitGrace.count()));
  }
  return op_->status;
}

Status PushPullHandle::Wait(std::chrono::milliseconds timeout) const {
  if (!op_) return FailedPreconditionError("Wait on an empty PushPullHandle");
  std::unique_lock<std::mutex> lock(op_->mu);
  if (!op_->cv.wait_for(lock, timeout, [&] { return op_->done; })) {
    return TimeoutError(fmt::format("push_pull of tensor '{}' not complete after {} ms",
                                    op_->tensor, timeout.count()));
  }
  return op_->status;
}

bool PushPullHandle::Ready() const {
  if (!op_) return false;
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->done;
}

uint64_t PushPullHandle::bytes_pushed() const {
  return op_ ? op_->bytes_pushed.load() : 0;
}

uint64_t PushPullHandle::bytes_pulled() const {
  return op_ ? op_->bytes_pulled.load() : 0;
}

namespace {

// Embedded mode: this process is the worker node; its Engine does everything, and it serves
// the node's metrics when metrics.port is set.
class EngineBackend final : public ClientBackend {
 public:
  EngineBackend(std::unique_ptr<Engine> engine, std::unique_ptr<config::NodeMetrics> metrics)
      : engine_(std::move(engine)), metrics_(std::move(metrics)) {
    if (metrics_) {
      registration_ = metrics_->registry().Add(
          [e = engine_.get()](metrics::MetricSet& set) { AddEngineMetrics(*e, set); });
    }
  }

  StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                             const TensorOptions& options) override {
    if (options.cuda) {
      return UnimplementedError(fmt::format(
          "Declare '{}': CUDA tensors need daemon mode (the node's bitpush-worker runs the GPU "
          "reduce); in embedded mode copy the tensor to host memory",
          name));
    }
    return engine_->Declare(name, elements, dtype, options);
  }
  Status CommitDeclarations() override { return engine_->CommitDeclarations(); }
  PushPullHandle PushPull(TensorId tensor, ConstTensorView input, TensorView output) override {
    return engine_->PushPull(tensor, input, output);
  }
  PushPullHandle PushPull(TensorId tensor, ConstTensorView gradient, TensorView weights,
                          float lr) override {
    return engine_->PushPull(tensor, gradient, weights, lr);
  }
  Status InitServerWeights(TensorId tensor, TensorView weights) override {
    return engine_->InitServerWeights(tensor, weights);
  }
  Status PullServerWeights(TensorId tensor, TensorView weights) override {
    return engine_->PullServerWeights(tensor, weights);
  }
  StatusOr<std::vector<std::string>> ServerOptimizerState(TensorId tensor) override {
    return engine_->ServerOptimizerState(tensor);
  }
  Status RestoreServerOptimizerState(TensorId tensor,
                                     const std::vector<std::string>& saved) override {
    return engine_->RestoreServerOptimizerState(tensor, saved);
  }
  Status WaitForServers(std::chrono::milliseconds timeout) override {
    return engine_->WaitForServers(timeout);
  }
  Status Barrier() override { return engine_->Barrier(); }
  Status Shutdown(std::chrono::milliseconds timeout) override { return engine_->Shutdown(timeout); }
  void Close() override { engine_->Close(); }
  uint32_t rank() const override { return engine_->rank(); }
  uint32_t num_workers() const override { return engine_->num_workers(); }
  uint32_t num_servers() const override { return engine_->num_servers(); }
  Status status() const override { return engine_->status(); }
  ClientStats stats() const override { return engine_->stats(); }
  StatusOr<std::vector<float>> ErrorFeedbackState(TensorId tensor) override {
    return engine_->ErrorFeedbackState(tensor);
  }
  Status RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved) override {
    return engine_->RestoreErrorFeedbackState(tensor, saved);
  }
  Status SetErrorFeedbackDecay(TensorId tensor, float decay) override {
    return engine_->SetErrorFeedbackDecay(tensor, decay);
  }
  StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor) override {
    return engine_->ServerErrorFeedbackState(tensor);
  }
  Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) override {
    return engine_->RestoreServerErrorFeedbackState(tensor, saved);
  }
  StatusOr<uint64_t> TensorRounds(TensorId tensor) override {
    return engine_->TensorRounds(tensor);
  }
  Status RestoreTensorRounds(TensorId tensor, uint64_t next) override {
    return engine_->RestoreTensorRounds(tensor, next);
  }
  void TraceOptimizer(int64_t start_ns, int64_t end_ns) override {
    engine_->TraceStep(trace::SpanKind::kOptimizer, start_ns, end_ns);
  }

 private:
  // Destroyed in reverse: the collector goes first, then the exporter, then the engine.
  const std::unique_ptr<Engine> engine_;
  const std::unique_ptr<config::NodeMetrics> metrics_;
  metrics::Registry::Registration registration_;
};

constexpr char kServerOptimizerInDaemonMode[] =
    "tensors whose optimizer runs on the servers need an embedded worker (one training process "
    "per worker node, BITPUSH_MODE=embedded); the node's bitpush-worker does not relay weights";

// Daemon mode: one of the node's training processes; the node's bitpush-worker does the rest.
class DaemonBackend final : public ClientBackend {
 public:
  explicit DaemonBackend(std::unique_ptr<DaemonClient> daemon) : daemon_(std::move(daemon)) {}

  StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                             const TensorOptions& options) override {
    if (options.server_optimizer) {
      return UnimplementedError(
          fmt::format("Declare '{}': {}", name, kServerOptimizerInDaemonMode));
    }
    return daemon_->Declare(name, elements, dtype, options);
  }
  Status CommitDeclarations() override { return daemon_->CommitDeclarations(); }
  PushPullHandle PushPull(TensorId tensor, ConstTensorView input, TensorView output) override {
    return daemon_->PushPull(tensor, input, output);
  }
  PushPullHandle PushPull(TensorId, ConstTensorView, TensorView, float) override {
    auto op = std::make_shared<OpState>();
    op->Complete(UnimplementedError(kServerOptimizerInDaemonMode));
    return PushPullHandle(op);
  }
  Status InitServerWeights(TensorId, TensorView) override {
    return UnimplementedError(kServerOptimizerInDaemonMode);
  }
  Status PullServerWeights(TensorId, TensorView) override {
    return UnimplementedError(kServerOptimizerInDaemonMode);
  }
  StatusOr<std::vector<std::string>> ServerOptimizerState(TensorId) override {
    return UnimplementedError(kServerOptimizerInDaemonMode);
  }
  Status RestoreServerOptimizerState(TensorId, const std::vector<std::string>&) override {
    return UnimplementedError(kServerOptimizerInDaemonMode);
  }
  Status WaitForServers(std::chrono::milliseconds timeout) override {
    return daemon_->WaitForServers(timeout);
  }
  Status Barrier() override { return daemon_->Barrier(); }
  // The daemon bounds the clean end itself (its own op_timeout).
  Status Shutdown(std::chrono::milliseconds) override { return daemon_->Shutdown(); }
  void Close() override { daemon_->Close(); }
  uint32_t rank() const override { return daemon_->node_rank(); }
  uint32_t num_workers() const override { return daemon_->num_nodes(); }
  uint32_t num_servers() const override { return 0; }  // unknown to a training process
  Status status() const override { return daemon_->status(); }
  ClientStats stats() const override { return daemon_->stats(); }
  StatusOr<std::vector<float>> ErrorFeedbackState(TensorId tensor) override {
    return daemon_->ErrorFeedbackState(tensor);
  }
  Status RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved) override {
    return daemon_->RestoreErrorFeedbackState(tensor, saved);
  }
  Status SetErrorFeedbackDecay(TensorId, float) override {
    return UnimplementedError(
        "SetErrorFeedbackDecay: daemon mode keeps the residual in the node's bitpush-worker, "
        "which takes no decay; decay it through ErrorFeedbackState / RestoreErrorFeedbackState");
  }
  StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor) override {
    return daemon_->ServerErrorFeedbackState(tensor);
  }
  Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) override {
    return daemon_->RestoreServerErrorFeedbackState(tensor, saved);
  }
  StatusOr<uint64_t> TensorRounds(TensorId tensor) override {
    return daemon_->TensorRounds(tensor);
  }
  Status RestoreTensorRounds(TensorId tensor, uint64_t next) override {
    return daemon_->RestoreTensorRounds(tensor, next);
  }
  // The node's daemon records it (its engine writes the node's worker spans).
  void TraceOptimizer(int64_t start_ns, int64_t end_ns) override {
    daemon_->TraceOptimizer(start_ns, end_ns);
  }

 private:
  const std::unique_ptr<DaemonClient> daemon_;
};

}  // namespace

StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.mode == ClientMode::kDaemon) {
    DaemonClientOptions d;
    d.socket_path = DaemonSocketPath(options.daemon_socket, options.cluster, options.rank);
    d.local_rank = options.local_rank;
    d.local_size = options.local_size;
    d.startup_timeout = options.cluster.startup_timeout;
    BP_ASSIGN_OR_RETURN(std::unique_ptr<DaemonClient> daemon, DaemonClient::Connect(d));
    return std::unique_ptr<Client>(new Client(std::make_unique<DaemonBackend>(std::move(daemon)),
                                              options.cluster.compression));
  }
  if (options.cluster.ProcessCountsDiffer()) {
    // An embedded node pushes its one gradient unscaled; with different counts per node only
    // the daemons weight processes equally (daemon.h).
    return FailedPreconditionError(fmt::format(
        "worker {} runs embedded (one process, no bitpush-worker), but {} gives the worker "
        "nodes different numbers of training processes; that needs the bitpush-worker daemon "
        "on every node (bitpush launch starts them; BITPUSH_MODE=daemon)",
        options.rank,
        options.cluster.source.empty() ? "the cluster config" : options.cluster.source));
  }
  config::CompressionSettings compression = options.cluster.compression;
  // The node's metrics (docs/metrics.md), bound before registration so a taken port fails
  // before the cluster counts this worker.
  BP_ASSIGN_OR_RETURN(std::unique_ptr<config::NodeMetrics> metrics,
                      config::NodeMetrics::Start(options.cluster, v1::ROLE_WORKER, options.rank));
  EngineOptions e;
  e.cluster = std::move(options.cluster);
  e.rank = options.rank;
  e.inproc_hub = std::move(options.inproc_hub);
  e.clock = std::move(options.clock);
  e.check_non_finite = options.check_non_finite;
  BP_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(std::move(e)));
  return std::unique_ptr<Client>(
      new Client(std::make_unique<EngineBackend>(std::move(engine), std::move(metrics)),
                 std::move(compression)));
}

Client::Client(std::unique_ptr<ClientBackend> backend, config::CompressionSettings compression)
    : backend_(std::move(backend)), compression_(std::move(compression)) {}

Client::~Client() {
  Close();
}

StatusOr<TensorId> Client::Declare(const std::string& name, size_t elements, DType dtype,
                                   const TensorOptions& options) {
  StatusOr<TensorId> id = backend_->Declare(name, elements, dtype, options);
  if (!id.ok()) return id;
  StatusOr<TensorCompression> plan =
      DecideCompression(compression_, name, elements, dtype, options.compression);
  std::lock_guard<std::mutex> lock(declared_mu_);
  if (declared_.size() <= id->index) declared_.resize(id->index + 1);
  if (plan.ok()) declared_[id->index] = std::move(plan).value();
  return id;
}

StatusOr<TensorId> Client::Declare(const std::string& name, size_t elements, DType dtype,
                                   int64_t priority, const std::string& compression) {
  TensorOptions o;
  o.priority = priority;
  o.compression = compression;
  return Declare(name, elements, dtype, o);
}

Status Client::CommitDeclarations() {
  return backend_->CommitDeclarations();
}

PushPullHandle Client::PushPull(TensorId tensor, ConstTensorView input, TensorView output) {
  return backend_->PushPull(tensor, input, output);
}

PushPullHandle Client::PushPull(TensorId tensor, ConstTensorView gradient, TensorView weights,
                                float lr) {
  return backend_->PushPull(tensor, gradient, weights, lr);
}

Status Client::InitServerWeights(TensorId tensor, TensorView weights) {
  return backend_->InitServerWeights(tensor, weights);
}

Status Client::PullServerWeights(TensorId tensor, TensorView weights) {
  return backend_->PullServerWeights(tensor, weights);
}

StatusOr<std::vector<std::string>> Client::ServerOptimizerState(TensorId tensor) {
  return backend_->ServerOptimizerState(tensor);
}

Status Client::RestoreServerOptimizerState(TensorId tensor, const std::vector<std::string>& saved) {
  return backend_->RestoreServerOptimizerState(tensor, saved);
}

Status Client::WaitForServers(std::chrono::milliseconds timeout) {
  return backend_->WaitForServers(timeout);
}

Status Client::Barrier() {
  return backend_->Barrier();
}

Status Client::Shutdown(std::chrono::milliseconds timeout) {
  return backend_->Shutdown(timeout);
}

void Client::Close() {
  backend_->Close();
}

uint32_t Client::rank() const {
  return backend_->rank();
}
uint32_t Client::num_workers() const {
  return backend_->num_workers();
}
uint32_t Client::num_servers() const {
  return backend_->num_servers();
}
Status Client::status() const {
  return backend_->status();
}
ClientStats Client::stats() const {
  return backend_->stats();
}

StatusOr<std::vector<float>> Client::ErrorFeedbackState(TensorId tensor) const {
  return backend_->ErrorFeedbackState(tensor);
}

Status Client::RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  return backend_->RestoreErrorFeedbackState(tensor, saved);
}

Status Client::SetErrorFeedbackDecay(TensorId tensor, float decay) {
  return backend_->SetErrorFeedbackDecay(tensor, decay);
}

StatusOr<std::vector<float>> Client::ServerErrorFeedbackState(TensorId tensor) {
  return backend_->ServerErrorFeedbackState(tensor);
}

Status Client::RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  return backend_->RestoreServerErrorFeedbackState(tensor, saved);
}

StatusOr<uint64_t> Client::TensorRounds(TensorId tensor) {
  return backend_->TensorRounds(tensor);
}

Status Client::RestoreTensorRounds(TensorId tensor, uint64_t next) {
  return backend_->RestoreTensorRounds(tensor, next);
}

void Client::TraceOptimizer(int64_t start_ns, int64_t end_ns) {
  backend_->TraceOptimizer(start_ns, end_ns);
}

StatusOr<std::string> Client::DescribeCompression(const std::vector<TensorId>& tensors) const {
  BP_ASSIGN_OR_RETURN(std::vector<TensorCompression> plans, CompressionOf(tensors));
  return worker::DescribeCompression(plans, compression_.min_compress_bytes);
}

StatusOr<std::vector<TensorCompression>> Client::CompressionOf(
    const std::vector<TensorId>& tensors) const {
  std::vector<TensorCompression> plans;
  plans.reserve(tensors.size());
  std::lock_guard<std::mutex> lock(declared_mu_);
  for (TensorId t : tensors) {
    if (t.index >= declared_.size() || declared_[t.index].name.empty()) {
      return NotFoundError(fmt::format("DescribeCompression: tensor #{} is not declared", t.index));
    }
    plans.push_back(declared_[t.index]);
  }
  return plans;
}

}  // namespace bitpush::worker
