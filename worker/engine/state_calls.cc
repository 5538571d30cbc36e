#include "worker/engine/state_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "common/logging.h"

namespace bitpush::worker {

StateCalls::StateCalls(EngineState& state, TensorDeclarations& declarations)
    : state_(state), declarations_(declarations) {}

size_t StateCalls::StateValues(const Tensor& t) {
  size_t values = 0;
  for (const Partition& p : t.partitions) values += p.residual ? p.residual->state_size() : 0;
  return values;
}

StatusOr<std::vector<float>> StateCalls::ErrorFeedbackState(TensorId id) const {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (id.index >= state_.tensors.size()) {
    return InvalidArgumentError(fmt::format("ErrorFeedbackState: no tensor #{}", id.index));
  }
  const Tensor& t = *state_.tensors[id.index];
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

Status StateCalls::SetErrorFeedbackDecay(TensorId id, float decay) {
  if (!(decay >= 0.0f && decay <= 1.0f)) {
    return InvalidArgumentError(
        fmt::format("SetErrorFeedbackDecay: decay {} is not in [0, 1] (1 keeps the whole "
                    "residual)",
                    decay));
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  if (id.index >= state_.tensors.size()) {
    return InvalidArgumentError(fmt::format("SetErrorFeedbackDecay: no tensor #{}", id.index));
  }
  Tensor& t = *state_.tensors[id.index];
  if (t.partitions.empty() || !t.partitions.front().residual) {
    return FailedPreconditionError(fmt::format(
        "SetErrorFeedbackDecay of tensor '{}': it keeps no worker residual (uncompressed, or "
        "compression.error_feedback keeps none on workers)",
        t.name));
  }
  // The states are fixed at declaration; which kind a partition has does not change.
  for (const Partition& p : t.partitions) {
    if (!p.residual->AppliesResidualDecay()) {
      return UnimplementedError(fmt::format(
          "SetErrorFeedbackDecay of tensor '{}': its method ({}) keeps its own kind of error "
          "state, which takes no decay",
          t.name, t.spec));
    }
  }
  t.ef_decay = decay;  // from the tensor's next push_pull on
  return Status::Ok();
}

Status StateCalls::RestoreErrorFeedbackState(TensorId id, Span<const float> saved) {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (id.index >= state_.tensors.size()) {
    return InvalidArgumentError(fmt::format("RestoreErrorFeedbackState: no tensor #{}", id.index));
  }
  Tensor& t = *state_.tensors[id.index];
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

StatusOr<std::vector<float>> StateCalls::ServerErrorFeedbackState(TensorId tensor) {
  std::vector<transport::Buffer> parts;
  BP_RETURN_IF_ERROR(ServerStateCall(tensor, StateKind::kResidual, /*write=*/false, {}, &parts));
  std::vector<float> out;
  bool any = false;
  for (const transport::Buffer& b : parts) any = any || b.size() != 0;
  if (!any) return out;  // no partition keeps a server residual
  std::lock_guard<std::mutex> lock(state_.mu);
  const Tensor& t = *state_.tensors[tensor.index];
  out.reserve(t.elements);
  for (size_t j = 0; j < t.partitions.size(); ++j) {
    const Partition& p = t.partitions[j];
    if (parts[j].size() != p.range.elements * sizeof(float)) {
      return DataLossError(fmt::format(
          "{}: ServerErrorFeedbackState of tensor '{}': {} sent {} bytes for key {}, which has {} "
          "values",
          state_.label, t.name, ServerLabel(p.peer), parts[j].size(), p.range.key,
          p.range.elements));
    }
    const size_t at = out.size();
    out.resize(at + p.range.elements);
    if (p.range.elements > 0) std::memcpy(out.data() + at, parts[j].data(), parts[j].size());
  }
  return out;
}

Status StateCalls::RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) {
  std::vector<std::string> parts;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (tensor.index >= state_.tensors.size()) {
      return InvalidArgumentError(
          fmt::format("RestoreServerErrorFeedbackState: no tensor #{}", tensor.index));
    }
    const Tensor& t = *state_.tensors[tensor.index];
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

StatusOr<uint64_t> StateCalls::TensorRounds(TensorId tensor) const {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (tensor.index >= state_.tensors.size()) {
    return InvalidArgumentError(fmt::format("TensorRounds: no tensor #{}", tensor.index));
  }
  const Tensor& t = *state_.tensors[tensor.index];
  if (t.op) {
    return FailedPreconditionError(
        fmt::format("TensorRounds of tensor '{}': a push_pull of it is in flight", t.name));
  }
  return t.rounds_done;
}

Status StateCalls::RestoreTensorRounds(TensorId tensor, uint64_t next) {
  size_t partitions = 0;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (tensor.index >= state_.tensors.size()) {
      return InvalidArgumentError(fmt::format("RestoreTensorRounds: no tensor #{}", tensor.index));
    }
    const Tensor& t = *state_.tensors[tensor.index];
    if (t.server_optimizer) {
      return InvalidArgumentError(
          fmt::format("RestoreTensorRounds of tensor '{}': its optimizer runs on the servers; "
                      "RestoreServerOptimizerState + PullServerWeights move its rounds",
                      t.name));
    }
    partitions = t.partitions.size();
  }
  BP_RETURN_IF_ERROR(ServerStateCall(tensor, StateKind::kRounds, /*write=*/true,
                                     std::vector<std::string>(partitions), nullptr, nullptr, 0,
                                     SIZE_MAX, next));
  std::lock_guard<std::mutex> lock(state_.mu);
  Tensor& t = *state_.tensors[tensor.index];
  if (t.op) {
    return FailedPreconditionError(
        fmt::format("RestoreTensorRounds of tensor '{}': a push_pull of it is in flight", t.name));
  }
  t.rounds_done = next;
  for (Partition& p : t.partitions) p.next_round = next;
  return Status::Ok();
}

namespace {

// Weights move to and from the servers in batches of whole partitions of at most this many bytes
// (one partition when larger), so a worker's transient copies stay bounded whatever the model.
constexpr uint64_t kWeightBatchBytes = 16ull << 20;

}  // namespace

std::vector<std::pair<size_t, size_t>> StateCalls::WeightBatches(const Tensor& t) {
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

Status StateCalls::CheckServerWeightsCall(TensorId tensor, const TensorView& weights,
                                          const char* what) {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (tensor.index >= state_.tensors.size()) {
    return InvalidArgumentError(fmt::format("{}: no tensor #{}", what, tensor.index));
  }
  const Tensor& t = *state_.tensors[tensor.index];
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

Status StateCalls::InitServerWeights(TensorId tensor, TensorView weights) {
  constexpr const char* kWhat = "InitServerWeights";
  BP_RETURN_IF_ERROR(CheckServerWeightsCall(tensor, weights, kWhat));
  // Worker 0 installs; every worker (worker 0 too) then reads what the servers hold, which
  // waits at each server for worker 0's install.
  if (state_.rank == 0) {
    const Tensor* t;
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      t = state_.tensors[tensor.index].get();  // partitions are immutable after Declare
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

Status StateCalls::PullServerWeights(TensorId tensor, TensorView weights) {
  constexpr const char* kWhat = "PullServerWeights";
  BP_RETURN_IF_ERROR(CheckServerWeightsCall(tensor, weights, kWhat));
  return ReadServerWeights(tensor, weights, kWhat);
}

Status StateCalls::ReadServerWeights(TensorId tensor, TensorView weights, const char* what) {
  const Tensor* tp;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    tp = state_.tensors[tensor.index].get();
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
            state_.label, what, t.name, *round, t.partitions[0].range.key, rounds[k], p.range.key));
      }
      if (parts[k].size() != p.range.elements * sizeof(float)) {
        return DataLossError(
            fmt::format("{}: {} of tensor '{}': {} sent {} bytes of weights for key {}, which "
                        "has {} values",
                        state_.label, what, t.name, ServerLabel(p.peer), parts[k].size(),
                        p.range.key, p.range.elements));
      }
      if (parts[k].size() != 0) {
        std::memcpy(out + p.range.offset * sizeof(float), parts[k].data(), parts[k].size());
      }
    }
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  Tensor& mt = *state_.tensors[tensor.index];
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

StatusOr<std::vector<std::string>> StateCalls::ServerOptimizerState(TensorId tensor) {
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

Status StateCalls::RestoreServerOptimizerState(TensorId tensor,
                                               const std::vector<std::string>& saved) {
  return ServerStateCall(tensor, StateKind::kOptimizerState, /*write=*/true, saved, nullptr);
}

Status StateCalls::ServerStateCall(TensorId id, StateKind kind, bool write,
                                   std::vector<std::string> saved,
                                   std::vector<transport::Buffer>* out,
                                   std::vector<uint64_t>* rounds, size_t first, size_t count,
                                   uint64_t next_round) {
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
    case StateKind::kRounds:
      what = "RestoreTensorRounds";
      state = "the key's rounds";
      break;
  }
  bool needs_commit = false;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (id.index >= state_.tensors.size()) {
      return InvalidArgumentError(fmt::format("{}: no tensor #{}", what, id.index));
    }
    needs_commit = !state_.tensors[id.index]->committed;
  }
  // The servers know a tensor's keys once its declaration is committed.
  if (needs_commit) BP_RETURN_IF_ERROR(declarations_.Commit());
  std::lock_guard<std::mutex> call_lock(state_call_mu_);
  Tensor* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (std::optional<Status> stopped = state_.StoppedLocked()) return *stopped;
    t = state_.tensors[id.index].get();
    const std::string name = fmt::format("{} of tensor '{}'", what, t->name);
    if (!t->error.ok()) return t->error.WithContext(name);
    if (t->op) return FailedPreconditionError(name + ": a push_pull of it is in flight");
    if ((kind == StateKind::kOptimizerState || kind == StateKind::kWeights) &&
        !t->server_optimizer) {
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
    h.set_generation(state_.generation.load());
    h.set_key(p.range.key);
    h.set_sender(state_.rank);
    h.set_optimizer_state(kind == StateKind::kOptimizerState);
    h.set_weights(kind == StateKind::kWeights);
    std::vector<transport::Buffer> frames;
    if (kind == StateKind::kRounds) {
      h.set_rounds(true);
      h.set_round(next_round);
    } else if (write) {
      const std::string& part = saved[j - first];
      if (kind != StateKind::kOptimizerState) h.set_element_count(part.size() / sizeof(float));
      h.set_byte_count(part.size());
      frames.push_back(transport::Buffer::Take(std::move(saved[j - first])));
    }
    const Status sent = state_.endpoint->SendData(p.peer, h, std::move(frames));
    if (!sent.ok()) {
      std::lock_guard<std::mutex> lock(state_.mu);
      state_calls_.clear();
      return sent.WithContext(fmt::format("{}: {} of tensor '{}' (key {}) to server {}",
                                          state_.label, what, t->name, p.range.key, p.server));
    }
  }
  std::unique_lock<std::mutex> lock(state_.mu);
  const bool answered = state_cv_.wait_for(lock, state_.cluster.worker.op_timeout, [&] {
    if (!state_.cluster_error.ok() || state_.closed || state_.recovering || state_.rolled_back) {
      return true;  // a server rejoined meanwhile: its old process will not answer
    }
    for (const auto& [key, call] : state_calls_) {
      if (!call.done) return false;
    }
    return true;
  });
  std::map<uint64_t, StateCall> calls = std::move(state_calls_);
  state_calls_.clear();
  if (!state_.cluster_error.ok()) return state_.cluster_error;
  if (state_.closed) return CancelledError(state_.label + ": the client was closed");
  if (state_.recovering) return *state_.recovering;
  if (state_.rolled_back) return *state_.rolled_back;
  if (!answered) {
    for (const auto& [key, call] : calls) {
      if (!call.done) {
        return TimeoutError(fmt::format(
            "{}: {} of tensor '{}': no answer from {} for key {} within {} ms "
            "(worker.op_timeout){}",
            state_.label, what, t->name, ServerLabel(call.peer), key,
            state_.cluster.worker.op_timeout.count(),
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

void StateCalls::OnStateReply(const std::string& from, const v1::DataHeader& h,
                              const transport::Message& m) {
  std::lock_guard<std::mutex> lock(state_.mu);
  auto call = state_calls_.find(h.key());
  if (call == state_calls_.end() || call->second.peer != from || call->second.done) {
    BP_LOG_WARN("{}: {} sent a server-state reply for key {} that nobody asked for", state_.label,
                ServerLabel(from), h.key());
    return;
  }
  StateCall& c = call->second;
  c.done = true;
  if (h.refused_op() == v1::DataHeader::OP_STATE_READ) {
    if (m.frames.size() != 1) {
      c.status = DataLossError(fmt::format("{}: {} sent {} of key {} in {} frames (one expected)",
                                           state_.label, ServerLabel(from), c.what, h.key(),
                                           m.frames.size()));
    } else {
      c.frame = m.frames[0];  // shares the received bytes
      c.round = h.round();
    }
  }
  state_cv_.notify_all();
}

void StateCalls::OnRefused(const std::string& from, const v1::DataHeader& h) {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    auto call = state_calls_.find(h.key());
    if (call == state_calls_.end() || call->second.peer != from || call->second.done) return;
    call->second.done = true;
    call->second.status = RemoteStatus(
        h.error_code(), fmt::format("{}: {} refused {} of key {}: {}", state_.label,
                                    ServerLabel(from), call->second.what, h.key(), h.error()));
  }
  state_cv_.notify_all();
}

}  // namespace bitpush::worker
