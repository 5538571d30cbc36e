// The onebit compressor (OnebitCompressor, compressors/onebit/onebit.h): the payload's body
// around the passes of onebit_kernels.h — the scale, the residual's update, validation, the
// deferred entry points — and the kernel half of the method descriptor. OnebitResidualState is
// in onebit_residual_state.cc.
#include "compressors/onebit/onebit.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "compressors/error_feedback.h"
#include "compressors/method.h"
#include "compressors/onebit/onebit_kernels.h"

namespace bitpush::compressors {

float OnebitCompressor::ScaleFromSum(double sum, size_t n) {
  // The sign pass sums |x| over every input value: a NaN or inf among them leaves the sum
  // non-finite (finite floats cannot overflow a double sum), which the telemetry reports.
  NoteInputCheck(!std::isfinite(sum));
  if (!std::isfinite(sum)) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (!scaled_) return 1.0f;
  if (n == 0) return 0.0f;
  const float scale = static_cast<float>(sum / static_cast<double>(n));
  // A NaN input makes the sum NaN: store a canonical positive quiet NaN.
  return std::isnan(scale) ? std::numeric_limits<float>::quiet_NaN() : scale;
}

void OnebitCompressor::UpdateResidual(float* q, size_t n, const uint8_t* words, float scale) {
  if (std::isnan(scale)) {  // non-finite input: the residual restarts from zero (docs/errors.md)
    if (n) std::memset(q, 0, n * sizeof(float));
    return;
  }
  OnebitResidualPass(isa(), q, nullptr, q, n, words, scale);
}

size_t OnebitCompressor::EncodeBody(const float* x, size_t n, DType, const CompressContext&,
                                    uint8_t* body) {
  const double sum = OnebitSignPass(isa(), x, nullptr, n, body + 4);
  const float scale = ScaleFromSum(sum, n);
  std::memcpy(body, &scale, 4);
  return BodyBytes(n);
}

size_t OnebitCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType dtype,
                                                const CompressContext& ctx, uint8_t* body) {
  const size_t bytes = EncodeBody(q, n, dtype, ctx, body);
  float scale;
  std::memcpy(&scale, body, 4);
  UpdateResidual(q, n, body + 4, scale);
  return bytes;
}

size_t OnebitCompressor::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                   const CompressContext& ctx, uint8_t* body) {
  // Pass 1 forms q = g + γe (e = buffer - C_prev when deferred; γ = ctx.residual_decay), stores
  // it over e and packs the signs; pass 2 subtracts ±scale in place, unless deferred. (Storing q
  // measured faster than recomputing g + e in pass 2: fewer bytes read.)
  const double sum = OnebitSignPass(isa(), g, e, n, body + 4, e,
                                    deferred_ ? deferred_prev_ : nullptr, ctx.residual_decay);
  const float scale = ScaleFromSum(sum, n);
  std::memcpy(body, &scale, 4);
  if (!deferred_) {
    UpdateResidual(e, n, body + 4, scale);
  } else if (std::isnan(scale) && n) {  // as UpdateResidual: restart from zero
    std::memset(e, 0, n * sizeof(float));
  }
  return BodyBytes(n);
}

namespace {
// Sets a compressor's deferred mode for one call.
class DeferredScope {
 public:
  DeferredScope(bool* flag, const OnebitCompressor::PushSigns** prev_slot,
                const OnebitCompressor::PushSigns* prev)
      : flag_(flag), prev_slot_(prev_slot) {
    *flag_ = true;
    *prev_slot_ = prev;
  }
  ~DeferredScope() {
    *flag_ = false;
    *prev_slot_ = nullptr;
  }
  DeferredScope(const DeferredScope&) = delete;
  DeferredScope& operator=(const DeferredScope&) = delete;

 private:
  bool* flag_;
  const OnebitCompressor::PushSigns** prev_slot_;
};
}  // namespace

StatusOr<size_t> OnebitCompressor::CompressDeferred(ConstTensorView x, Span<float> q,
                                                    const PushSigns* prev,
                                                    const CompressContext& ctx,
                                                    MutableByteSpan out) {
  if (x.dtype() != DType::kFloat32 || (ctx.store_as && *ctx.store_as != DType::kFloat32)) {
    return InvalidArgumentError("onebit deferred error feedback takes fp32 input and payloads");
  }
  DeferredScope scope(&deferred_, &deferred_prev_, prev);
  return CompressWithFeedback(x, q, ctx, out);
}

StatusOr<size_t> OnebitCompressor::AggregateCompressDeferred(Span<const ByteSpan> pushes,
                                                             float scale, Span<float> q,
                                                             const PushSigns* prev,
                                                             const CompressContext& ctx,
                                                             MutableByteSpan out) {
  DeferredScope scope(&deferred_, &deferred_prev_, prev);
  return AggregateCompress(pushes, q.size(), scale, q.data(), ctx, out);
}

Status OnebitCompressor::ValidateBody(ByteSpan body, size_t n, DType) {
  const size_t want = BodyBytes(n);
  if (body.size() != want) {
    return DataLossError("onebit body is " + std::to_string(body.size()) + " bytes; " +
                         std::to_string(n) + " elements need " + std::to_string(want));
  }
  float scale;
  std::memcpy(&scale, body.data(), 4);
  if (!scaled_ && scale != 1.0f && !std::isnan(scale)) {
    return DataLossError("onebit (scaled=false) payload has scale " + std::to_string(scale) +
                         "; expected 1 (or NaN for a non-finite input)");
  }
  if (scale < 0.0f || std::signbit(scale)) {
    return DataLossError("onebit payload has a negative scale " + std::to_string(scale));
  }
  const uint8_t* words = body.data() + 4;
  if (n % 64 != 0) {
    uint64_t last;
    std::memcpy(&last, words + 8 * (n / 64), 8);
    if (last >> (n % 64)) {
      return DataLossError("onebit payload has sign bits set past element " +
                           std::to_string(n - 1));
    }
  }
  return Status::Ok();
}

Status OnebitCompressor::DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) {
  BP_RETURN_IF_ERROR(ValidateBody(body, n, dtype));
  float scale;
  std::memcpy(&scale, body.data(), 4);
  OnebitDecode(isa(), body.data() + 4, n, scale, out, add);
  return Status::Ok();
}

Status OnebitCompressor::DecodeBodyToTensor(ByteSpan body, size_t n, DType dtype, float* out) {
  BP_RETURN_IF_ERROR(ValidateBody(body, n, dtype));
  float scale;
  std::memcpy(&scale, body.data(), 4);
  OnebitDecodeToTensor(isa(), body.data() + 4, n, scale, out);
  return Status::Ok();
}

size_t OnebitCompressor::AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType,
                                       float mult, float* e, const CompressContext&,
                                       uint8_t* body) {
  pushes_.resize(count);
  push_words_.resize(count);
  for (size_t w = 0; w < count; ++w) {
    std::memcpy(&pushes_[w].scale, bodies[w].data(), 4);
    pushes_[w].words = bodies[w].data() + 4;
  }
  uint8_t* words = body + 4;
  // Deferred (a residual only): pass 1 stores q over e and reads e - C_prev.
  const bool defer = deferred_ && e != nullptr;
  const PushSigns* prev = defer ? deferred_prev_ : nullptr;
  float* q_out = defer ? e : nullptr;
  const double sum = OnebitAggregateSignPass(isa(), pushes_.data(), count, n, mult, e, q_out, words,
                                             push_words_.data(), prev);
  const float scale = ScaleFromSum(sum, n);
  std::memcpy(body, &scale, 4);
  if (e != nullptr) {
    if (std::isnan(scale)) {  // non-finite aggregate: the residual restarts from zero
      std::memset(e, 0, n * sizeof(float));
    } else if (!defer) {
      OnebitAggregateResidualPass(isa(), pushes_.data(), count, n, mult, e, words, scale,
                                  push_words_.data());
    }
  }
  return BodyBytes(n);
}

namespace {
std::unique_ptr<Compressor> NewOnebit(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<OnebitCompressor>(config.onebit().scaled(), isa);
}

std::unique_ptr<ErrorFeedback> NewOnebitResidualState(const v1::CompressorConfig&,
                                                      ErrorFeedbackSide, size_t elements) {
  return std::make_unique<OnebitResidualState>(elements);
}
}  // namespace

// The kernel half of onebit (compressors/method.h; spec half in onebit_spec.cc).
const MethodKernels kOnebitMethodKernels = {&kOnebitMethodSpec, &NewOnebit,
                                            &NewOnebitResidualState};

}  // namespace bitpush::compressors
