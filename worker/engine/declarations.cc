#include "worker/engine/declarations.h"

#include <fmt/format.h>

#include <memory>
#include <utility>

#include "common/logging.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "optimizers/param_state.h"
#include "worker/compression_plan.h"

namespace bitpush::worker {

namespace {

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

TensorDeclarations::TensorDeclarations(EngineState& state) : state_(state) {}

StatusOr<TensorId> TensorDeclarations::Declare(const std::string& name, size_t elements,
                                               DType dtype, const TensorOptions& options) {
  std::lock_guard<std::mutex> declare_lock(declare_mu_);
  const std::string what = fmt::format("{}: Declare('{}')", state_.label, name);
  if (name.empty()) {
    return InvalidArgumentError(state_.label + ": Declare: the tensor name is empty");
  }
  uint32_t index;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (std::optional<Status> stopped = state_.StoppedLocked()) return *stopped;
    if (state_.names.count(name) != 0) {
      return InvalidArgumentError(fmt::format("{}: tensor '{}' is already declared (#{})", what,
                                              name, state_.names.at(name)));
    }
    if (state_.tensors.size() >= (uint64_t{1} << 32) - 1) {
      return InvalidArgumentError(what + ": too many tensors (2^32)");
    }
    index = static_cast<uint32_t>(state_.tensors.size());
  }
  StatusOr<TensorCompression> plan =
      DecideCompression(state_.cluster.compression, name, elements, dtype, options.compression);
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
        ServerOptimizerFor(*options.server_optimizer, state_.cluster.optimizer);
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

  const uint64_t partition_bytes =
      PartitionBytesFor(static_cast<uint64_t>(elements) * DTypeSize(dtype), t->compressed,
                        PartitionSizingOf(state_.cluster));
  StatusOr<std::vector<PartitionRange>> ranges =
      PartitionTensor(index, elements, dtype, partition_bytes,
                      t->compressed ? compressors::PartitionAlign(t->config) : 1);
  if (!ranges.ok()) return ranges.status().WithContext(what);
  const bool worker_residual = t->compressed && compressors::WorkerKeepsResidual(state_.policy);
  compressors::CompressorOptions copts;
  copts.isa = state_.isa;
  t->partitions.resize(ranges->size());
  for (size_t j = 0; j < ranges->size(); ++j) {
    Partition& p = t->partitions[j];
    p.range = (*ranges)[j];
    p.server = state_.client->ServerForKey(p.range.key);
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

  std::lock_guard<std::mutex> lock(state_.mu);
  state_.names[name] = index;
  state_.tensors.push_back(std::move(t));
  return TensorId{index};
}

Status TensorDeclarations::Commit() {
  std::lock_guard<std::mutex> decl_lock(decl_mu_);
  std::vector<uint32_t> fresh;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (std::optional<Status> stopped = state_.StoppedLocked()) return *stopped;
    for (const auto& t : state_.tensors) {
      if (!t->committed && t->error.ok()) fresh.push_back(t->index);
    }
  }
  if (fresh.empty()) return Status::Ok();
  // A rejoined server started a new generation: the servers' declaration epochs start over.
  if (const uint64_t g = state_.generation.load(); g != epoch_generation_) {
    epoch_generation_ = g;
    next_epoch_ = 0;
  }
  const uint64_t epoch = next_epoch_++;
  Status s = CheckDeclarations(epoch, fresh);
  if (s.ok()) s = AnnounceKeys(fresh);
  std::lock_guard<std::mutex> lock(state_.mu);
  for (uint32_t i : fresh) {
    Tensor& t = *state_.tensors[i];
    if (s.ok()) {
      t.committed = true;
    } else if (t.error.ok() && state_.cluster_error.ok() && !state_.closed &&
               !state_.shutting_down) {
      // A verdict on these declarations: sticky for them.
      t.error = s;
    }
  }
  return s;
}

Status TensorDeclarations::CheckDeclarations(uint64_t epoch, const std::vector<uint32_t>& tensors) {
  v1::TensorManifest manifest;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    for (uint32_t i : tensors) {
      const Tensor& t = *state_.tensors[i];
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
  h.set_generation(state_.generation.load());
  h.set_round(epoch);
  h.set_sender(state_.rank);
  std::string body;
  manifest.SerializeToString(&body);
  Status sent = state_.endpoint->SendData(kServer0, h, {transport::Buffer::Take(std::move(body))});

  std::unique_lock<std::mutex> lock(state_.mu);
  Status result;
  if (!sent.ok()) {
    result = sent.WithContext(fmt::format(
        "{}: sending the tensor declarations of epoch {} to server 0", state_.label, epoch));
  } else {
    const Clock::time_point deadline = state_.clock->Now() + state_.cluster.startup_timeout;
    state_.clock->WaitUntil(lock, decl_cv_, deadline, [&] {
      return declare_verdict_.has_value() || state_.StoppedLocked().has_value();
    });
    if (declare_verdict_) {
      result = *declare_verdict_;
    } else if (std::optional<Status> stopped = state_.StoppedLocked()) {
      result = *stopped;
    } else {
      result = TimeoutError(fmt::format(
          "{}: no answer from server 0 to the tensor declarations of epoch {} within {} ms "
          "(cluster.startup_timeout; every worker must declare and push_pull the same tensors)",
          state_.label, epoch, state_.cluster.startup_timeout.count()));
    }
  }
  pending_epoch_.reset();
  declare_verdict_.reset();
  return result;
}

Status TensorDeclarations::AnnounceKeys(const std::vector<uint32_t>& tensors) {
  for (uint32_t i : tensors) {
    const Tensor* t;
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      t = state_.tensors[i].get();
    }
    // Partitions' keys, owners and configs are immutable after Declare.
    for (const Partition& p : t->partitions) {
      v1::DataHeader h;
      h.set_op(v1::DataHeader::OP_INIT_KEY);
      h.set_generation(state_.generation.load());
      h.set_key(p.range.key);
      h.set_sender(state_.rank);
      h.set_element_count(p.range.elements);
      h.set_dtype(static_cast<uint32_t>(t->dtype));
      *h.mutable_compressor_config() = t->config;
      h.set_compressor(t->config.id());
      h.set_tensor(t->name);
      // A server-side optimizer key publishes weights, not the aggregate: no server residual.
      h.set_server_residual(t->compressed && !t->server_optimizer &&
                            compressors::ServerKeepsResidual(state_.policy));
      h.set_sum(t->options.op == ReduceOp::kSum);
      if (t->server_optimizer) *h.mutable_server_optimizer() = *t->server_optimizer;
      BP_RETURN_IF_ERROR(state_.endpoint->SendData(p.peer, h).WithContext(
          fmt::format("{}: announcing key {} (tensor '{}' partition {}) to server {}", state_.label,
                      p.range.key, t->name, p.range.index, p.server)));
    }
  }
  return Status::Ok();
}

void TensorDeclarations::OnVerdict(uint64_t epoch, Status verdict) {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (!pending_epoch_ || *pending_epoch_ != epoch) {
      BP_LOG_WARN("{}: dropped a declaration verdict for epoch {} (none pending)", state_.label,
                  epoch);
      return;
    }
    declare_verdict_ = std::move(verdict);
  }
  decl_cv_.notify_all();
}

void TensorDeclarations::OnReply(const std::string& from, uint64_t epoch) {
  if (from == kServer0) {
    OnVerdict(epoch, Status::Ok());
  } else {
    BP_LOG_WARN("{}: dropped a declaration reply from '{}' (only server 0 checks)", state_.label,
                from);
  }
}

bool TensorDeclarations::OnRefused(const std::string& from, const v1::DataHeader& h) {
  // OP_ERROR names the refused request by its op (refused_op) and (key, round); a refused
  // declaration has its epoch as the round.
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (h.refused_op() != v1::DataHeader::OP_DECLARE || from != kServer0 || !pending_epoch_ ||
        *pending_epoch_ != h.round()) {
      return false;
    }
    declare_verdict_ = RemoteStatus(h.error_code(),
                                    fmt::format("{}: declaration check of epoch {} at server 0: {}",
                                                state_.label, h.round(), h.error()));
  }
  decl_cv_.notify_all();
  return true;
}

}  // namespace bitpush::worker
