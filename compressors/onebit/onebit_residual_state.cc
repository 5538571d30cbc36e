// OnebitResidualState (compressors/onebit/onebit.h): onebit's deferred error feedback, the
// state an engine or a server keeps per onebit key, and ApplyOnebitCorrection, its one residual
// pass. The passes themselves are onebit_kernels.h's.
#include <cmath>
#include <cstring>
#include <string>

#include "compressors/onebit/onebit.h"
#include "compressors/onebit/onebit_kernels.h"
#include "compressors/payload.h"

namespace bitpush::compressors {

void ApplyOnebitCorrection(float* q, size_t n, const OnebitCompressor::PushSigns& prev) {
  if (std::isnan(prev.scale)) {
    if (n) std::memset(q, 0, n * sizeof(float));
    return;
  }
  OnebitResidualPass(BestIsaLevel(), q, nullptr, q, n, prev.words, prev.scale);
}

OnebitResidualState::OnebitResidualState(size_t elements)
    : buf_(elements), words_((elements + 63) / 64) {
  buf_.zero();
}

void OnebitResidualState::Materialise() const {
  if (!pending_) return;
  ApplyOnebitCorrection(buf_.data(), buf_.size(),
                        {reinterpret_cast<const uint8_t*>(words_.data()), scale_});
  pending_ = false;
}

void OnebitResidualState::Defer(const uint8_t* payload) {
  const uint8_t* body = payload + kPayloadHeaderBytes;
  std::memcpy(&scale_, body, 4);
  pending_ = !std::isnan(scale_);
  if (pending_ && !words_.empty()) std::memcpy(words_.data(), body + 4, words_.size() * 8);
}

StatusOr<size_t> OnebitResidualState::Compress(Compressor& compressor, ConstTensorView x,
                                               const CompressContext& ctx, MutableByteSpan out) {
  auto* onebit = dynamic_cast<OnebitCompressor*>(&compressor);
  if (onebit == nullptr || x.dtype() != DType::kFloat32 ||
      (ctx.store_as && *ctx.store_as != DType::kFloat32)) {
    Materialise();
    return compressor.CompressWithFeedback(x, buf_.span(), ctx, out);
  }
  const OnebitCompressor::PushSigns prev{reinterpret_cast<const uint8_t*>(words_.data()), scale_};
  BP_ASSIGN_OR_RETURN(
      const size_t bytes,
      onebit->CompressDeferred(x, buf_.span(), pending_ ? &prev : nullptr, ctx, out));
  Defer(out.data());
  return bytes;
}

StatusOr<size_t> OnebitResidualState::AggregateCompress(Compressor& compressor,
                                                        Span<const ByteSpan> pushes, float scale,
                                                        const CompressContext& ctx,
                                                        MutableByteSpan out) {
  auto* onebit = dynamic_cast<OnebitCompressor*>(&compressor);
  if (onebit == nullptr) {
    Materialise();
    return compressor.AggregateCompress(pushes, buf_.size(), scale, buf_.data(), ctx, out);
  }
  const OnebitCompressor::PushSigns prev{reinterpret_cast<const uint8_t*>(words_.data()), scale_};
  BP_ASSIGN_OR_RETURN(const size_t bytes,
                      onebit->AggregateCompressDeferred(pushes, scale, buf_.span(),
                                                        pending_ ? &prev : nullptr, ctx, out));
  Defer(out.data());
  return bytes;
}

Span<const float> OnebitResidualState::residual() const {
  Materialise();
  return buf_.span();
}

Status OnebitResidualState::Restore(Span<const float> saved) {
  if (saved.size() != buf_.size()) {
    return InvalidArgumentError("saved residual has " + std::to_string(saved.size()) +
                                " elements; this partition has " + std::to_string(buf_.size()));
  }
  if (!saved.empty()) std::memcpy(buf_.data(), saved.data(), saved.size() * sizeof(float));
  pending_ = false;
  return Status::Ok();
}

void OnebitResidualState::Reset() {
  buf_.zero();
  pending_ = false;
}

}  // namespace bitpush::compressors
