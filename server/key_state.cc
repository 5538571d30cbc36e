#include "server/key_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/counter_rng.h"
#include "common/little_endian.h"
#include "common/logging.h"
#include "common/trace/recorder.h"
#include "common/vector_ops.h"
#include "compressors/payload.h"
#include "compressors/registry.h"

namespace bitpush::server {

using compressors::CompressContext;

Status CheckAggregationMode(const compressors::MethodSpec& method, const KeySpec& spec) {
  switch (method.aggregation) {
    case compressors::AggregationMode::kDecompressSumRecompress: return Status::Ok();
    case compressors::AggregationMode::kCompressedDomainSum:
      if (spec.optimizer) {
        return InvalidArgumentError(fmt::format(
            "{} aggregates by {}: servers never see its gradients, so they cannot run the "
            "optimizer (optimizer.placement: server); keep the optimizer on the workers",
            method.name, compressors::AggregationModeName(method.aggregation)));
      }
      return Status::Ok();
  }
  return UnimplementedError(
      fmt::format("{} declares aggregation mode {}, which this server does not implement",
                  method.name, static_cast<int>(method.aggregation)));
}

StatusOr<std::unique_ptr<KeyState>> KeyState::Create(
    const KeySpec& spec, const compressors::CompressorOptions& options) {
  if (spec.num_workers < 1) return InvalidArgumentError("KeySpec::num_workers must be >= 1");
  if (spec.max_rounds_in_flight < 2) {
    return InvalidArgumentError("KeySpec::max_rounds_in_flight must be >= 2");
  }
  BP_ASSIGN_OR_RETURN(std::unique_ptr<compressors::Compressor> c,
                      compressors::CreateCompressor(spec.compressor, options));
  // CreateCompressor has validated the config, so the method exists.
  const compressors::MethodSpec& method = *compressors::FindMethod(spec.compressor.id());
  if (Status s = CheckAggregationMode(method, spec); !s.ok()) {
    return s.WithContext(fmt::format("key {}", spec.key));
  }
  if (spec.elements > 0 && spec.elements > compressors::kMaxPayloadElements) {
    return InvalidArgumentError(
        fmt::format("key {}: {} elements is above the payload limit", spec.key, spec.elements));
  }
  std::unique_ptr<compressors::Compressor> pull;
  if (spec.optimizer) {
    const std::string where = fmt::format("key {}: server-side optimizer", spec.key);
    if (spec.server_residual) {
      return InvalidArgumentError(where +
                                  ": the key keeps no server residual (the server "
                                  "sends weights, not a compressed aggregate)");
    }
    if (spec.dtype != DType::kFloat32) {
      return InvalidArgumentError(
          fmt::format("{}: the key's tensor is {}; master weights are "
                      "fp32, so the tensor must be fp32",
                      where, DTypeName(spec.dtype)));
    }
    if (Status st = spec.optimizer->update.Validate(); !st.ok()) return st.WithContext(where);
    if (!spec.optimizer->difference) {
      if (Status st = compressors::CheckRawWeightPull(spec.optimizer->pull); !st.ok()) {
        return st.WithContext(where);
      }
    }
    auto made = compressors::CreateCompressor(spec.optimizer->pull, options);
    if (!made.ok()) return made.status().WithContext(where + ": the weights' pull");
    pull = std::move(*made);
  }
  std::unique_ptr<compressors::ErrorFeedback> residual;
  if (spec.server_residual) {
    BP_ASSIGN_OR_RETURN(
        residual, compressors::CreateErrorFeedback(
                      spec.compressor, compressors::ErrorFeedbackSide::kServer, spec.elements));
  }
  if (method.aggregation == compressors::AggregationMode::kCompressedDomainSum &&
      spec.elements > 0 &&
      !(residual ? residual->FusesServerRound(*c) : c->FusesServerRound(false))) {
    return UnimplementedError(fmt::format(
        "key {}: {} aggregates by {}, but its compressor has no compressed-domain round {} a "
        "server residual",
        spec.key, method.name, compressors::AggregationModeName(method.aggregation),
        residual ? "with" : "without"));
  }
  return std::unique_ptr<KeyState>(
      new KeyState(spec, std::move(c), std::move(residual), std::move(pull)));
}

KeyState::KeyState(const KeySpec& spec, std::unique_ptr<compressors::Compressor> compressor,
                   std::unique_ptr<compressors::ErrorFeedback> residual,
                   std::unique_ptr<compressors::Compressor> pull)
    : spec_(spec),
      compressor_(std::move(compressor)),
      residual_(std::move(residual)),
      pull_(std::move(pull)),
      next_round_(spec.num_workers, 0),
      oldest_round_(0) {
  if (pull_) pull_codec_ = std::make_unique<compressors::CompressorPullCodec>(pull_.get());
  // A server-side optimizer needs the fp32 average itself: pass-by-pass sum. A compressed-
  // domain method is always aggregated in one call over its held pushes (Create checked that
  // its compressor can); the decompress-sum-recompress mode takes that path where the
  // compressor fuses it.
  const bool optimizer = spec_.optimizer.has_value();
  const compressors::MethodSpec& method = *compressors::FindMethod(spec_.compressor.id());
  const bool compressed_domain =
      method.aggregation == compressors::AggregationMode::kCompressedDomainSum;
  fused_ = !optimizer && spec_.elements > 0 &&
           (compressed_domain || (residual_ ? residual_->FusesServerRound(*compressor_)
                                            : compressor_->FusesServerRound(false)));
  accumulate_in_payload_ = !optimizer && !fused_ && !residual_ && spec_.elements > 0 &&
                           spec_.dtype == DType::kFloat32 &&
                           spec_.compressor.id() == v1::COMPRESSOR_ID_NONE;
  slots_.resize(spec_.max_rounds_in_flight);
  for (Round& r : slots_) {
    r.pushed.assign(spec_.num_workers, 0);
    r.pulled.assign(spec_.num_workers, 0);
    r.held.resize(spec_.num_workers);
    // The fused round needs none; the in-payload one takes its buffer per round.
    if (!fused_ && !accumulate_in_payload_) r.accumulator.resize(spec_.elements);
  }
}

KeyState::Round* KeyState::Find(uint64_t round) {
  for (Round& r : slots_) {
    if (r.active && r.round == round) return &r;
  }
  return nullptr;
}

const KeyState::Round* KeyState::Find(uint64_t round) const {
  for (const Round& r : slots_) {
    if (r.active && r.round == round) return &r;
  }
  return nullptr;
}

Status KeyState::Reject(Status s) {
  ++stats_.pushes_rejected;
  return s;
}

std::string KeyState::Missing(const std::vector<uint8_t>& flags) const {
  std::string out;
  for (uint32_t w = 0; w < spec_.num_workers; ++w) {
    if (flags[w]) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(w);
  }
  return out;
}

Status KeyState::Push(uint32_t worker, uint64_t round, transport::Buffer buffer) {
  return PushImpl(worker, round, std::move(buffer), std::nullopt);
}

Status KeyState::Push(uint32_t worker, uint64_t round, transport::Buffer buffer, float lr) {
  return PushImpl(worker, round, std::move(buffer), lr);
}

Status KeyState::PushImpl(uint32_t worker, uint64_t round, transport::Buffer buffer,
                          std::optional<float> lr) {
  const ByteSpan payload = buffer.span();
  const uint64_t key = spec_.key;
  if (spec_.optimizer.has_value() != lr.has_value()) {
    return Reject(InvalidArgumentError(
        spec_.optimizer
            ? fmt::format("key {}: push from worker {} in round {} without a learning rate; the "
                          "key's optimizer runs on the server",
                          key, worker, round)
            : fmt::format("key {}: push from worker {} in round {} with a learning rate; the key "
                          "has no server-side optimizer",
                          key, worker, round)));
  }
  if (lr && (!(*lr >= 0.0f) || std::isinf(*lr))) {
    return Reject(InvalidArgumentError(
        fmt::format("key {}: push from worker {} in round {}: learning rate {} (must be finite "
                    "and >= 0)",
                    key, worker, round, *lr)));
  }
  if (spec_.optimizer && !param_) {
    return Reject(FailedPreconditionError(
        fmt::format("key {}: push from worker {} in round {} before the key's weights were "
                    "installed on the server",
                    key, worker, round)));
  }
  if (worker >= spec_.num_workers) {
    return Reject(InvalidArgumentError(fmt::format(
        "key {}: push from worker {} but the key has {} workers", key, worker, spec_.num_workers)));
  }
  if (round < next_round_[worker]) {
    return Reject(InvalidArgumentError(
        fmt::format("key {}: second push from worker {} in round {} (its next round is {})", key,
                    worker, round, next_round_[worker])));
  }
  if (round > next_round_[worker]) {
    return Reject(
        FailedPreconditionError(fmt::format("key {}: worker {} pushed round {} before round {}",
                                            key, worker, round, next_round_[worker])));
  }
  if (round >= oldest_round_ + spec_.max_rounds_in_flight) {
    const Round* oldest = Find(oldest_round_);
    return Reject(FailedPreconditionError(fmt::format(
        "key {}: worker {} pushed round {} while round {} is still held (not yet pulled by "
        "workers {}); at most {} rounds are kept",
        key, worker, round, oldest_round_, oldest ? Missing(oldest->pulled) : "?",
        spec_.max_rounds_in_flight)));
  }
  StatusOr<compressors::PayloadHeader> header = compressors::ParsePayloadHeader(payload);
  if (!header.ok()) {
    return Reject(header.status().WithContext(
        fmt::format("key {}: push from worker {} in round {}", key, worker, round)));
  }
  if (header->compressor_id != spec_.compressor.id()) {
    return Reject(InvalidArgumentError(
        fmt::format("key {}: worker {} pushed a {} payload but the key uses {}", key, worker,
                    compressors::CompressorName(header->compressor_id),
                    compressors::CompressorSpecString(spec_.compressor))));
  }
  if (header->element_count != spec_.elements || header->dtype != spec_.dtype) {
    return Reject(InvalidArgumentError(fmt::format(
        "key {}: worker {} pushed {} elements of {} but the key holds {} elements of {}", key,
        worker, header->element_count, DTypeName(header->dtype), spec_.elements,
        DTypeName(spec_.dtype))));
  }

  Round* r = Find(round);
  if (r != nullptr && lr && r->pushes > 0 && *lr != r->lr) {
    return Reject(InvalidArgumentError(
        fmt::format("key {}: worker {} pushed round {} with learning rate {}, another worker's "
                    "push of that round said {}; every worker must use the same schedule",
                    key, worker, round, *lr, r->lr)));
  }
  if (r == nullptr) {
    for (Round& s : slots_) {
      if (!s.active) {
        r = &s;
        break;
      }
    }
    // The window check above guarantees a free slot.
    BP_CHECK(r != nullptr, "key {}: no free round slot for round {}", key, round);
    r->active = true;
    r->round = round;
    r->pushes = r->pulls = r->next_to_add = 0;
    std::fill(r->pushed.begin(), r->pushed.end(), 0);
    std::fill(r->pulled.begin(), r->pulled.end(), 0);
    r->published = transport::Buffer();
    r->is_published = false;
    r->adopted = transport::Buffer();
    r->acc = nullptr;  // AddFirst sets it
    r->averaged = false;
    r->lr = lr.value_or(0.0f);
    r->non_finite_origin.clear();
  }
  if (worker != r->next_to_add) {  // not its turn yet: hold the payload
    r->held[worker] = std::move(buffer);
    r->pushed[worker] = 1;
    ++r->pushes;
    ++next_round_[worker];
    ++stats_.pushes_accepted;
    stats_.bytes_pushed += payload.size();
    return Status::Ok();
  }
  // Validates the whole payload before touching the accumulator. The first push of a round
  // is decoded straight into it (no zeroing pass). The fused round only validates it here and
  // keeps the buffer for Publish.
  const Status added = fused_                ? compressor_->ValidatePayload(payload, spec_.elements)
                       : r->next_to_add == 0 ? AddFirst(*r, buffer)
                                             : AddPush(*r, r->next_to_add, payload);
  if (!added.ok()) {
    if (r->pushes == 0) r->active = false;  // nothing accumulated: give the slot back
    return Reject(added.WithContext(
        fmt::format("key {}: push from worker {} in round {}", key, worker, round)));
  }
  if (fused_) r->held[worker] = std::move(buffer);
  r->pushed[worker] = 1;
  ++r->pushes;
  ++r->next_to_add;
  ++next_round_[worker];
  ++stats_.pushes_accepted;
  stats_.bytes_pushed += payload.size();
  return AddInOrder(*r);
}

Status KeyState::AddInOrder(Round& r) {
  while (r.next_to_add < spec_.num_workers && r.pushed[r.next_to_add]) {
    const uint32_t w = r.next_to_add;
    Status added;
    if (fused_) {  // validated now, aggregated by Publish: the buffer stays held
      added = compressor_->ValidatePayload(r.held[w].span(), spec_.elements);
      if (!added.ok()) r.held[w] = transport::Buffer();
    } else {
      transport::Buffer held = std::move(r.held[w]);
      r.held[w] = transport::Buffer();
      added = w == 0 ? AddFirst(r, held) : AddPush(r, w, held.span());
    }
    if (!added.ok()) {
      // Refused late: the worker may push this round again.
      r.pushed[w] = 0;
      --r.pushes;
      --next_round_[w];
      --stats_.pushes_accepted;
      ++stats_.pushes_rejected;
      late_rejections_.push_back(
          {w, r.round,
           added.WithContext(
               fmt::format("key {}: push from worker {} in round {}", spec_.key, w, r.round))});
      return Status::Ok();
    }
    ++r.next_to_add;
  }
  if (r.next_to_add == spec_.num_workers) return Publish(r);
  return Status::Ok();
}

void KeyState::PrepareAccumulator(Round& r) {
  if (!accumulate_in_payload_) {
    r.acc = r.accumulator.data();
    return;
  }
  const size_t bytes = InPayloadBytes();
  std::shared_ptr<std::vector<uint8_t>>& storage = r.payload_storage;
  if (!storage || storage.use_count() != 1 || storage->size() != bytes) {
    storage = std::make_shared<std::vector<uint8_t>>(bytes);
  }
  // The header is 16 bytes, so the floats are as aligned as operator new's block (16 bytes).
  r.acc = reinterpret_cast<float*>(storage->data() + compressors::kPayloadHeaderBytes);
}

Status KeyState::AddFirst(Round& r, transport::Buffer& buffer) {
  const size_t bytes = InPayloadBytes();
  // Push checked the header (compressor none, fp32, n elements); the body must be n floats.
  if (accumulate_in_payload_ && buffer.size() == bytes && buffer.owner().use_count() == 1 &&
      reinterpret_cast<uintptr_t>(buffer.data()) % alignof(float) == 0) {
    StatusOr<compressors::PayloadHeader> h = compressors::ParsePayloadHeader(buffer.span());
    if (h.ok() && h->body_bytes == spec_.elements * sizeof(float)) {
      // Nobody else refers to these bytes: they become the round's accumulator and reply.
      r.adopted = std::move(buffer);
      r.acc = reinterpret_cast<float*>(const_cast<uint8_t*>(r.adopted.data()) +
                                       compressors::kPayloadHeaderBytes);
      return Status::Ok();
    }
  }
  PrepareAccumulator(r);
  return compressor_->DecompressToFloat(buffer.span(), {r.acc, spec_.elements});
}

float KeyState::AverageScale() const {
  return spec_.average && spec_.num_workers > 1 ? 1.0f / static_cast<float>(spec_.num_workers)
                                                : 1.0f;
}

Status KeyState::AddPush(Round& r, uint32_t worker, ByteSpan payload) {
  const float inv = AverageScale();
  if (!accumulate_in_payload_ || inv == 1.0f || worker + 1 != spec_.num_workers) {
    return compressor_->DecompressAdd(payload, {r.acc, spec_.elements});
  }
  // The round's last push of fp32 `none`: added and averaged in one pass (the same two
  // roundings per element as the add and Publish's scaling pass would make).
  BP_RETURN_IF_ERROR(compressor_->ValidatePayload(payload, spec_.elements));
  // Unaligned loads: the body need not be float-aligned.
  const auto* body =
      reinterpret_cast<const float*>(payload.data() + compressors::kPayloadHeaderBytes);
  AddScaleFloatArray(body, r.acc, spec_.elements, inv, compressor_->isa());
  r.averaged = true;
  return Status::Ok();
}

Status KeyState::Publish(Round& r) {
  if (!timed_) return PublishRound(r);
  stats_.last_publish_start_ns = trace::NowNs();
  Status s = PublishRound(r);
  stats_.last_publish_ns = trace::NowNs() - stats_.last_publish_start_ns;
  return s;
}

Status KeyState::PublishRound(Round& r) {
  const size_t n = spec_.elements;
  const float inv = AverageScale();
  if (!fused_ && inv != 1.0f && !r.averaged) {  // the average, in place
    float* acc = r.acc;
    for (size_t i = 0; i < n; ++i) acc[i] *= inv;
  }
  if (accumulate_in_payload_) {  // C is the identity: the accumulator is the body
    if (!r.adopted.empty()) {    // rank 0's push holds the sum; its header already says so
      transport::Buffer adopted = std::move(r.adopted);
      r.adopted = transport::Buffer();
      return PublishPayload(r, std::move(adopted));
    }
    compressors::PayloadHeader h;
    h.compressor_id = v1::COMPRESSOR_ID_NONE;
    h.dtype = DType::kFloat32;
    h.body_bytes = static_cast<uint32_t>(n * sizeof(float));
    h.element_count = n;
    std::vector<uint8_t>& out = *r.payload_storage;
    compressors::WritePayloadHeader(h, out.data());
    return PublishPayload(r, transport::Buffer::Borrow(out.data(), out.size(), r.payload_storage));
  }
  // The slot's payload buffer is reused once the transport has let go of the last round's
  // (no other owner left); otherwise a new one is made.
  std::shared_ptr<std::vector<uint8_t>>& storage = r.payload_storage;
  if (!storage || storage.use_count() != 1) storage = std::make_shared<std::vector<uint8_t>>();
  std::vector<uint8_t>& out = *storage;
  const size_t max_bytes = spec_.optimizer ? pull_->MaxCompressedBytes(n, DType::kFloat32)
                                           : compressor_->MaxCompressedBytes(n, DType::kFloat32);
  if (out.size() < max_bytes) out.resize(max_bytes);
  // Summed in fp32, replied in the key's dtype (fp16 / bf16 keys: half the bytes of fp32).
  CompressContext ctx{spec_.key, r.round, kServerStream};
  if (spec_.dtype != DType::kFloat32) ctx.store_as = spec_.dtype;
  const MutableByteSpan dst(out.data(), out.size());
  StatusOr<size_t> bytes = size_t{0};
  if (spec_.optimizer) {
    bytes = StepAndEncodeWeights(r, dst);
  } else if (fused_) {
    // Decompress, average and compress in one call over the held pushes (rank order).
    std::vector<ByteSpan>& pushes = push_spans_;
    pushes.clear();
    for (const transport::Buffer& b : r.held) pushes.push_back(b.span());
    bytes = residual_ ? residual_->AggregateCompress(*compressor_, pushes, inv, ctx, dst)
                      : compressor_->AggregateCompress(pushes, n, inv, nullptr, ctx, dst);
    for (transport::Buffer& b : r.held) b = transport::Buffer();
  } else {
    const ConstTensorView aggregate(r.acc, n);
    bytes = residual_ ? residual_->Compress(*compressor_, aggregate, ctx, dst)
                      : compressor_->Compress(aggregate, ctx, dst);
  }
  if (!bytes.ok()) {
    return bytes.status().WithContext(
        fmt::format("key {}: compressing the aggregate of round {}", spec_.key, r.round));
  }
  return PublishPayload(r, transport::Buffer::Borrow(out.data(), *bytes, storage));
}

StatusOr<size_t> KeyState::StepAndEncodeWeights(Round& r, MutableByteSpan dst) {
  // Push refuses every push before InstallWeights, so a round only completes with weights.
  if (!param_) return InternalError(fmt::format("key {}: no weights installed", spec_.key));
  optimizers::ParamState& param = *param_;
  if (Status st = param.Step(r.lr, {r.acc, spec_.elements}); !st.ok()) return st;
  if (r.non_finite_origin.empty() &&
      FirstNonFinite(ConstTensorView(param.weights()), compressor_->isa()) < spec_.elements) {
    r.non_finite_origin = "the weights after the server-side optimizer's step";
  }
  stepped_ = true;
  last_stepped_round_ = r.round;
  const CompressContext ctx{spec_.key, r.round, kServerStream};
  if (mirror_) return mirror_->Encode(param.weights(), ctx, dst);
  return pull_->Compress(ConstTensorView(param.weights()), ctx, dst);
}

Status KeyState::InstallWeights(Span<const float> weights) {
  if (!spec_.optimizer) {
    return FailedPreconditionError(fmt::format(
        "key {}: weights installed on a key without a server-side optimizer", spec_.key));
  }
  if (RoundOpen()) {
    return FailedPreconditionError(
        fmt::format("key {}: weights installed while a round is open", spec_.key));
  }
  if (weights.size() != spec_.elements) {
    return InvalidArgumentError(fmt::format("key {}: {} weights for a key of {} elements",
                                            spec_.key, weights.size(), spec_.elements));
  }
  if (param_) {
    return FailedPreconditionError(fmt::format(
        "key {}: its weights are already installed (by an earlier install or a checkpoint's "
        "restore); restore a checkpoint's optimizer state to replace them",
        spec_.key));
  }
  BP_ASSIGN_OR_RETURN(optimizers::ParamState state,
                      optimizers::ParamState::Create(spec_.optimizer->update, weights));
  param_ = std::move(state);
  stepped_ = false;
  mirror_.reset();
  if (spec_.optimizer->difference) mirror_.emplace(pull_codec_.get(), weights);
  return Status::Ok();
}

StatusOr<std::vector<float>> KeyState::WorkersWeights() {
  if (!param_) {
    return FailedPreconditionError(
        fmt::format("key {}: no weights installed on the server", spec_.key));
  }
  if (mirror_) return std::vector<float>(mirror_->mirror().begin(), mirror_->mirror().end());
  const Span<const float> w = param_->weights();
  std::vector<float> out(w.begin(), w.end());
  if (!stepped_) return out;
  // Raw form: the workers hold D(C(w)) of the last published round; w has not moved since.
  const size_t n = spec_.elements;
  std::vector<uint8_t> payload(pull_->MaxCompressedBytes(n, DType::kFloat32));
  const CompressContext ctx{spec_.key, last_stepped_round_, kServerStream};
  BP_ASSIGN_OR_RETURN(
      size_t bytes,
      pull_->Compress(ConstTensorView(w), ctx, MutableByteSpan(payload.data(), payload.size())));
  BP_RETURN_IF_ERROR(pull_->Decompress(ByteSpan(payload.data(), bytes), TensorView(out.data(), n)));
  return out;
}

Span<const float> KeyState::weights() const {
  return param_ ? param_->weights() : Span<const float>();
}

Span<const float> KeyState::mirror() const {
  return mirror_ ? mirror_->mirror() : Span<const float>();
}

// Layout: u64 length of the ParamState blob, the blob, then (difference form) the mirror as
// little-endian fp32.
StatusOr<std::string> KeyState::SaveOptimizerState() const {
  if (!param_) {
    return FailedPreconditionError(
        fmt::format("key {}: no server-side optimizer state (none configured or no weights "
                    "installed)",
                    spec_.key));
  }
  const std::string state = param_->Save();
  std::string out(8, '\0');
  PutU64(reinterpret_cast<uint8_t*>(out.data()), state.size());
  out += state;
  if (mirror_) {
    const size_t at = out.size();
    out.resize(at + 4 * spec_.elements);
    auto* p = reinterpret_cast<uint8_t*>(out.data() + at);
    for (size_t i = 0; i < spec_.elements; ++i) PutF32(p + 4 * i, mirror_->mirror()[i]);
  }
  return out;
}

Status KeyState::RestoreOptimizerState(std::string_view blob) {
  if (!spec_.optimizer) {
    return FailedPreconditionError(fmt::format(
        "key {}: optimizer state restored on a key without a server-side optimizer", spec_.key));
  }
  if (RoundOpen()) {
    return FailedPreconditionError(
        fmt::format("key {}: optimizer state restored while a round is open", spec_.key));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(blob.data());
  const size_t mirror_bytes = spec_.optimizer->difference ? 4 * spec_.elements : 0;
  if (blob.size() < 8 || GetU64(p) > blob.size() - 8 ||
      blob.size() - 8 - GetU64(p) != mirror_bytes) {
    return DataLossError(fmt::format(
        "key {}: saved optimizer state of {} bytes does not hold a state and a mirror of {} "
        "elements",
        spec_.key, blob.size(), mirror_bytes / 4));
  }
  const size_t state_bytes = GetU64(p);
  const std::vector<float> zeros(spec_.elements, 0.0f);
  BP_ASSIGN_OR_RETURN(
      optimizers::ParamState state,
      optimizers::ParamState::Create(spec_.optimizer->update, {zeros.data(), zeros.size()}));
  if (Status st = state.Load(blob.substr(8, state_bytes)); !st.ok()) {
    return st.WithContext(fmt::format("key {}", spec_.key));
  }
  param_ = std::move(state);
  // Every round of a server-side optimizer key is one step: the key continues at the saved
  // step's round (no round is open, so every worker is at the same next round), and the random
  // streams of (key, round) continue with it.
  const uint64_t next = param_->step();
  std::fill(next_round_.begin(), next_round_.end(), next);
  oldest_round_ = next;
  stepped_ = param_->step() > 0;  // raw form: the workers hold D(C(w)) of the last round
  last_stepped_round_ = next == 0 ? 0 : next - 1;
  mirror_.reset();
  if (spec_.optimizer->difference) {
    std::vector<float> m(spec_.elements);
    const uint8_t* q = p + 8 + state_bytes;
    for (size_t i = 0; i < m.size(); ++i) m[i] = GetF32(q + 4 * i);
    mirror_.emplace(pull_codec_.get(), Span<const float>(m.data(), m.size()));
  }
  return Status::Ok();
}

Status KeyState::PublishPayload(Round& r, transport::Buffer payload) {
  stats_.bytes_published += payload.size();
  ++stats_.rounds_published;
  r.published = std::move(payload);
  r.is_published = true;
  return Status::Ok();
}

StatusOr<transport::Buffer> KeyState::Pull(uint32_t worker, uint64_t round) {
  const uint64_t key = spec_.key;
  if (worker >= spec_.num_workers) {
    return InvalidArgumentError(fmt::format(
        "key {}: pull from worker {} but the key has {} workers", key, worker, spec_.num_workers));
  }
  Round* r = Find(round);
  if (r == nullptr) {
    if (round < oldest_round_) {
      return InvalidArgumentError(
          fmt::format("key {}: worker {} pulled round {}, which every worker has already pulled",
                      key, worker, round));
    }
    return UnavailableError(fmt::format("key {}: round {} has no pushes yet", key, round));
  }
  if (!r->is_published) {
    return UnavailableError(fmt::format("key {}: round {} is waiting for pushes from workers {}",
                                        key, round, Missing(r->pushed)));
  }
  if (r->pulled[worker]) {
    return InvalidArgumentError(
        fmt::format("key {}: second pull from worker {} in round {}", key, worker, round));
  }
  r->pulled[worker] = 1;
  ++r->pulls;
  ++stats_.pulls_served;
  transport::Buffer result = r->published;
  if (r->pulls == spec_.num_workers) {  // every worker has it: release the slot
    r->active = false;
    r->published = transport::Buffer();
    while (Find(oldest_round_) == nullptr) {
      bool everyone_past = true;
      for (uint64_t next : next_round_) everyone_past &= next > oldest_round_;
      if (!everyone_past) break;
      ++oldest_round_;
    }
  }
  return result;
}

void KeyState::NoteNonFinite(uint64_t round, std::string origin) {
  Round* r = Find(round);
  if (r != nullptr && r->non_finite_origin.empty()) r->non_finite_origin = std::move(origin);
}

std::string KeyState::NonFiniteOrigin(uint64_t round) const {
  const Round* r = Find(round);
  return r == nullptr ? std::string() : r->non_finite_origin;
}

bool KeyState::RoundPublished(uint64_t round) const {
  const Round* r = Find(round);
  return r != nullptr && r->is_published;
}

Span<const float> KeyState::server_residual() const {
  return residual_ ? residual_->residual() : Span<const float>();
}

bool KeyState::RoundOpen() const {
  for (const Round& r : slots_) {
    if (r.active) return true;
  }
  return false;
}

Status KeyState::RestoreRounds(uint64_t next) {
  if (spec_.optimizer) {
    return FailedPreconditionError(fmt::format(
        "key {}: its optimizer runs on the servers; its rounds come with its optimizer state",
        spec_.key));
  }
  if (RoundOpen()) {
    return FailedPreconditionError(
        fmt::format("key {}: a round is open (pushed, not yet pulled by every worker); restore "
                    "the rounds before the first push_pull",
                    spec_.key));
  }
  // No round is open, so every worker is at the same next round; they all continue at `next`
  // (a repeated restore of the same value, one per worker, changes nothing).
  std::fill(next_round_.begin(), next_round_.end(), next);
  oldest_round_ = next;
  return Status::Ok();
}

Status KeyState::RestoreServerResidual(Span<const float> saved) {
  if (!residual_) {
    return FailedPreconditionError(
        fmt::format("key {}: no server residual (Algorithm 3 key)", spec_.key));
  }
  return residual_->Restore(saved);
}

}  // namespace bitpush::server
