#include "compressors/loco/loco.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/counter_rng.h"
#include "common/half.h"
#include "common/little_endian.h"
#include "common/vector_ops.h"
#include "compressors/method.h"

namespace bitpush::compressors {
namespace {

using loco::PassCounts;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

size_t Ceil(size_t n, size_t d) {
  return (n + d - 1) / d;
}

inline bool Finite(float v) {
  return v - v == 0.0f;
}

inline int RoundClamp(float t, float lo, float hi) {
  return loco::RoundClampCode(t, lo, hi);
}

std::string Where(size_t i) {
  return std::to_string(i);
}

}  // namespace

// ---- LocoCompressor ---------------------------------------------------------------------

LocoCompressor::LocoCompressor(const v1::LocoParams& params, IsaLevel isa)
    : CompressorBase(v1::COMPRESSOR_ID_LOCO, isa), params_(params), block_(params.block()) {
  fixed_.s = static_cast<float>(params.scale());
  fixed_.step = static_cast<float>(1.0 / static_cast<double>(fixed_.s));
}

size_t LocoCompressor::PushBodyBytes(size_t n) const {
  const size_t scales = block_ == 0 ? 1 : Ceil(n, block_);
  return kBodyHeaderBytes + 4 * scales + Ceil(n, 2);
}

size_t LocoCompressor::MaxBodyBytes(size_t n, DType) const {
  size_t reply = 0;
  switch (params_.pull()) {
    case v1::PULL_FORMAT_FP32: reply = kBodyHeaderBytes + 4 * n; break;
    case v1::PULL_FORMAT_FP16:
    case v1::PULL_FORMAT_BF16: reply = kBodyHeaderBytes + 2 * n; break;
    default: break;
  }
  return std::max(PushBodyBytes(n), reply);
}

LocoCompressor::Kind LocoCompressor::KindFor(const CompressContext& ctx) const {
  if (ctx.worker == kServerStream) {
    switch (params_.pull()) {
      case v1::PULL_FORMAT_FP32: return kFp32;
      case v1::PULL_FORMAT_FP16: return kFp16;
      case v1::PULL_FORMAT_BF16: return kBf16;
      default: break;
    }
  }
  return block_ == 0 ? kFixed : kBlock;
}

void LocoCompressor::TakeTelemetry(CompressorTelemetry* into) {
  CompressorBase::TakeTelemetry(into);
  into->values += telemetry_.values;
  into->saturated += telemetry_.saturated;
  into->error_values += telemetry_.error_values;
  into->error_saturated += telemetry_.error_saturated;
  if (telemetry_.error_reported) {
    into->error_sq = telemetry_.error_sq;
    into->error_reported = true;
  }
  telemetry_ = CompressorTelemetry();
}

size_t LocoCompressor::EncodeBlocks(const float* x, size_t n, float* residual, uint8_t* body) {
  const size_t nb = Ceil(n, block_);
  uint8_t* steps = body + kBodyHeaderBytes;
  PassCounts c;
  loco::QuantizeBlocks(x, n, block_, steps, steps + 4 * nb, residual, &c, isa());
  NoteInputCheck(!c.finite);  // every block's absmax read its values
  telemetry_.values += n;
  return kBodyHeaderBytes + 4 * nb + Ceil(n, 2);
}

size_t LocoCompressor::Encode(const float* x, size_t n, Kind kind, float* residual, uint8_t* body) {
  body[0] = kind;
  body[1] = body[2] = body[3] = 0;
  PutU32(body + 4, kind == kBlock ? block_ : 0);
  uint8_t* data = body + kBodyHeaderBytes;
  switch (kind) {
    case kFp32:
      std::memcpy(data, x, 4 * n);
      if (residual != nullptr) std::fill(residual, residual + n, 0.0f);
      return kBodyHeaderBytes + 4 * n;
    case kFp16:
    case kBf16: {
      uint16_t* v = reinterpret_cast<uint16_t*>(data);
      // The cast checks its values in its pass (a server's aggregate replied in fp16 / bf16).
      NoteInputCheck(
          !(kind == kFp16 ? FloatToHalfArray(x, v, n, isa()) : FloatToBf16Array(x, v, n, isa())));
      if (residual != nullptr) {
        for (size_t i = 0; i < n; ++i) {
          const float r = kind == kFp16 ? HalfToFloat(v[i]) : Bf16ToFloat(v[i]);
          const float d = x[i] - r;
          residual[i] = Finite(d) ? d : 0.0f;  // a non-finite value resets, not poisons
        }
      }
      return kBodyHeaderBytes + 2 * n;
    }
    case kBlock: return EncodeBlocks(x, n, residual, body);
    case kFixed: break;
  }
  uint8_t* codes = data + 4;
  PassCounts c;
  loco::QuantizeFixed(x, n, fixed_, codes, residual, &c, isa());
  NoteInputCheck(!c.finite);
  telemetry_.values += n;
  telemetry_.saturated += c.saturated;
  if (!c.finite) {
    std::memset(codes, 0, Ceil(n, 2));
    if (residual != nullptr) std::fill(residual, residual + n, 0.0f);
    PutF32(data, kNaN);
  } else {
    PutF32(data, fixed_.step);
  }
  return kBodyHeaderBytes + 4 + Ceil(n, 2);
}

size_t LocoCompressor::EncodeBody(const float* x, size_t n, DType, const CompressContext& ctx,
                                  uint8_t* body) {
  return Encode(x, n, KindFor(ctx), nullptr, body);
}

size_t LocoCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType, const CompressContext& ctx,
                                              uint8_t* body) {
  // The kernels read x and write the residual in one pass; in place is fine element-wise
  // except for the fp16/bf16 kinds, which convert the whole array first.
  return Encode(q, n, KindFor(ctx), q, body);
}

StatusOr<size_t> LocoCompressor::CompressWithState(ConstTensorView input, LocoState& state,
                                                   const CompressContext& ctx,
                                                   MutableByteSpan out) {
  const size_t n = input.count();
  BP_RETURN_IF_ERROR(CheckElementCount(n));
  if (state.size() != n) {
    return InvalidArgumentError("loco error state has " + std::to_string(state.size()) +
                                " elements but the tensor has " + std::to_string(n));
  }
  BP_ASSIGN_OR_RETURN(const DType dtype, PayloadDType(input.dtype(), ctx));
  if (out.size() < MaxCompressedBytes(n, dtype)) {
    return InvalidArgumentError("output buffer of " + std::to_string(out.size()) +
                                " bytes is smaller than the " +
                                std::to_string(MaxCompressedBytes(n, dtype)) +
                                " bytes the payload may need (MaxCompressedBytes)");
  }
  const float* g = input.f32();
  if (input.dtype() != DType::kFloat32) {
    input_.resize(n);  // not Scratch(): the block step uses that
    ConvertToFloat(input, input_.data(), isa());
    g = input_.data();
  }
  const size_t body = StepBody(g, n, state, ctx, out.data() + kPayloadHeaderBytes);
  return FinishPayload(dtype, n, body, out.data());
}

size_t LocoCompressor::StepBody(const float* g, size_t n, LocoState& st, const CompressContext& ctx,
                                uint8_t* body) {
  const Kind kind = KindFor(ctx);
  const bool reset = params_.reset() > 0 && ctx.round % params_.reset() == 0;
  const float beta = static_cast<float>(params_.beta());
  body[0] = kind;
  body[1] = body[2] = body[3] = 0;
  PutU32(body + 4, kind == kBlock ? block_ : 0);
  uint8_t* data = body + kBodyHeaderBytes;
  PassCounts c;
  size_t bytes = 0;
  if (kind == kFixed) {
    loco::ErrorStep es;
    es.se = st.se_;
    es.step_e = st.step_e_;
    es.beta = beta;
    es.reset = reset;
    uint8_t* codes = data + 4;
    loco::LocoStepFixed(g, st.fp32_ ? nullptr : st.e8_.data(), st.fp32_ ? st.e32_.data() : nullptr,
                        n, fixed_, es, codes, &c, isa());
    PutF32(data, fixed_.step);
    if (!c.finite) {
      std::memset(codes, 0, Ceil(n, 2));
      PutF32(data, kNaN);
    }
    bytes = kBodyHeaderBytes + 4 + Ceil(n, 2);
  } else {
    // Block scale (the absmax scale never clamps: no saturation is counted).
    const size_t nb = Ceil(n, block_);
    uint8_t* codes = data + 4 * nb;
    if (!st.fp32_) {
      loco::BlockError err;
      err.e8 = st.e8_.data();
      err.step_e = st.block_step_.data();
      loco::LocoStepBlocks(g, n, block_, beta, reset, err, Scratch(std::min<size_t>(n, block_)),
                           data, codes, &c, isa());
    } else {
      // fp32 error: h and the new error through an fp32 scratch.
      float* h = Scratch(2 * n);
      float* e_prev = h + n;
      st.Dequantize(e_prev, isa());
      for (size_t i = 0; i < n; ++i) h[i] = g[i] + e_prev[i];
      loco::QuantizeBlocks(h, n, block_, data, codes, h, &c, isa());  // h <- h - C(h)
      loco::MovingAverage(h, e_prev, n, beta, isa());
      if (c.finite) st.Requantize(h, reset, isa());
      double sq = 0;
      for (float e : st.e32_) sq += static_cast<double>(e) * e;
      c.error_sq = sq;
    }
    bytes = kBodyHeaderBytes + 4 * nb + Ceil(n, 2);
  }
  if (!c.finite) st.Reset();  // a non-finite gradient resets the state (docs/errors.md)
  NoteInputCheck(!c.finite);
  telemetry_.values += n;
  telemetry_.saturated += c.saturated;
  telemetry_.error_values += st.fp32_ ? 0 : n;
  telemetry_.error_saturated += c.error_saturated;
  telemetry_.error_sq = c.finite ? c.error_sq : 0.0;
  telemetry_.error_reported = true;
  return bytes;
}

Status LocoCompressor::Validate(ByteSpan body, size_t n, Kind* kind_out) const {
  if (body.size() < kBodyHeaderBytes) {
    return DataLossError("loco body of " + std::to_string(body.size()) +
                         " bytes is shorter than its 8-byte header");
  }
  const uint8_t* p = body.data();
  const uint8_t k = p[0];
  if (k < kFixed || k > kBf16) {
    return DataLossError("loco body kind " + std::to_string(k) + " is unknown; valid: 1..5");
  }
  const Kind kind = static_cast<Kind>(k);
  if (p[1] != 0 || p[2] != 0 || p[3] != 0) return DataLossError("loco body: reserved bytes set");
  const uint32_t block = GetU32(p + 4);
  if (kind == kBlock ? block != block_ : block != 0) {
    return DataLossError(
        "loco body: block " + std::to_string(block) + " but this key uses " +
        (kind == kBlock ? std::to_string(block_) : std::string("0 for kind ") + std::to_string(k)));
  }
  if ((kind == kFixed && block_ != 0) || (kind == kBlock && block_ == 0)) {
    return DataLossError("loco body kind " + std::to_string(k) +
                         " does not match block=" + std::to_string(block_));
  }
  if (kind >= kFp32) {
    const v1::PullFormat want = kind == kFp32   ? v1::PULL_FORMAT_FP32
                                : kind == kFp16 ? v1::PULL_FORMAT_FP16
                                                : v1::PULL_FORMAT_BF16;
    if (params_.pull() != want) {
      return DataLossError("loco body holds " +
                           std::string(kind == kFp32   ? "fp32"
                                       : kind == kFp16 ? "fp16"
                                                       : "bf16") +
                           " values but this key's pulls are not in that format");
    }
  }
  size_t expect = 0;
  switch (kind) {
    case kFixed:
    case kBlock: expect = PushBodyBytes(n); break;
    case kFp32: expect = kBodyHeaderBytes + 4 * n; break;
    case kFp16:
    case kBf16: expect = kBodyHeaderBytes + 2 * n; break;
  }
  if (body.size() != expect) {
    return DataLossError("loco body of " + std::to_string(body.size()) + " bytes; " +
                         std::to_string(n) + " elements of kind " + std::to_string(k) + " take " +
                         std::to_string(expect));
  }
  *kind_out = kind;
  if (kind >= kFp32) return Status::Ok();
  const size_t nscales = kind == kFixed ? 1 : Ceil(n, block_);
  const uint8_t* codes = p + kBodyHeaderBytes + 4 * nscales;
  if (n % 2 == 1 && (codes[n / 2] >> 4) != 0) {
    return DataLossError("loco body: the padding nibble after element " + Where(n - 1) +
                         " is not zero");
  }
  auto zero_codes = [&](size_t first, size_t m) {
    for (size_t i = first; i < first + m; ++i) {
      if (loco::Nibble(codes, i) != 0) return false;
    }
    return true;
  };
  if (kind == kFixed) {
    const float step = GetF32(p + kBodyHeaderBytes);
    if (std::isnan(step)) {
      if (!zero_codes(0, n)) return DataLossError("loco body: NaN step with nonzero codes");
    } else if (step != fixed_.step) {  // exactly the key's step (no NaN here)
      return DataLossError("loco body: step " + std::to_string(step) +
                           " is not this key's 1/scale (" + std::to_string(fixed_.step) + ")");
    }
    return Status::Ok();
  }
  for (size_t b = 0; b < nscales; ++b) {
    const float step = GetF32(p + kBodyHeaderBytes + 4 * b);
    const size_t first = b * block_;
    const size_t m = std::min<size_t>(block_, n - first);
    if (std::isnan(step)) {
      if (!zero_codes(first, m)) {
        return DataLossError("loco body: block " + Where(b) + " has a NaN step and nonzero codes");
      }
    } else if (!(step >= 0) || std::isinf(step)) {
      return DataLossError("loco body: block " + Where(b) + " step " + std::to_string(step) +
                           " is not a finite value >= 0");
    }
  }
  const size_t bytes = Ceil(n, 2);
  const size_t j = loco::FindCodeMinus8(codes, bytes, isa());
  if (j < bytes) {
    const size_t i = (codes[j] & 0xF) == 0x8 ? 2 * j : 2 * j + 1;
    return DataLossError("loco body: element " + Where(i) +
                         " has code -8, outside the block quantiser's -7..7");
  }
  return Status::Ok();
}

Status LocoCompressor::DecodeBody(ByteSpan body, size_t n, DType, float* out, bool add) {
  Kind kind;
  BP_RETURN_IF_ERROR(Validate(body, n, &kind));
  const uint8_t* data = body.data() + kBodyHeaderBytes;
  switch (kind) {
    case kFp32:
      for (size_t i = 0; i < n; ++i) {
        const float v = GetF32(data + 4 * i);
        out[i] = add ? out[i] + v : v;
      }
      return Status::Ok();
    case kFp16:
    case kBf16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t u;
        std::memcpy(&u, data + 2 * i, 2);
        const float v = kind == kFp16 ? HalfToFloat(u) : Bf16ToFloat(u);
        out[i] = add ? out[i] + v : v;
      }
      return Status::Ok();
    case kFixed: {
      const float step = GetF32(data);
      if (std::isnan(step)) {
        for (size_t i = 0; i < n; ++i) out[i] = add ? out[i] + kNaN : kNaN;
        return Status::Ok();
      }
      loco::DecodeFixed(data + 4, n, step, out, add, isa());
      return Status::Ok();
    }
    case kBlock: break;
  }
  loco::DecodeBlocks(data + 4 * Ceil(n, block_), n, block_, data, out, add, isa());
  return Status::Ok();
}

// ---- LocoState --------------------------------------------------------------------------

LocoState::LocoState(const v1::LocoParams& params, size_t elements)
    : n_(elements), fp32_(params.error() == v1::LOCO_ERROR_PRECISION_FP32), block_(params.block()) {
  const double se = params.scale() * params.error_scale();
  se_ = static_cast<float>(se);
  step_e_ = static_cast<float>(1.0 / static_cast<double>(se_));
  if (fp32_) {
    e32_.resize(n_);
  } else {
    e8_.resize(n_);
    if (block_ != 0) block_step_.resize(Ceil(n_, block_));
  }
  Reset();
}

void LocoState::Reset() {
  e32_.zero();
  e8_.zero();
  block_step_.zero();
}

StatusOr<size_t> LocoState::Compress(Compressor& compressor, ConstTensorView x,
                                     const CompressContext& ctx, MutableByteSpan out) {
  auto* loco = dynamic_cast<LocoCompressor*>(&compressor);
  if (loco == nullptr) {
    return InvalidArgumentError("a loco error state compresses through a loco compressor, not " +
                                v1::CompressorId_Name(compressor.id()));
  }
  return loco->CompressWithState(x, *this, ctx, out);
}

StatusOr<size_t> LocoState::AggregateCompress(Compressor&, Span<const ByteSpan>, float,
                                              const CompressContext&, MutableByteSpan) {
  return FailedPreconditionError("loco does not fuse the server round");
}

void LocoState::Dequantize(float* out, IsaLevel isa) const {
  if (fp32_) {
    std::copy(e32_.begin(), e32_.end(), out);
    return;
  }
  if (block_ == 0) {
    loco::DequantizeInt8(e8_.data(), n_, step_e_, out, isa);
    return;
  }
  for (size_t b = 0; b < block_step_.size(); ++b) {
    const size_t first = b * block_;
    const size_t m = std::min<size_t>(block_, n_ - first);
    loco::DequantizeInt8(e8_.data() + first, m, block_step_[b], out + first, isa);
  }
}

Span<const float> LocoState::residual() const {
  if (fp32_) return e32_.span();
  view_.resize(n_);
  Dequantize(view_.data());
  return view_.span();
}

void LocoState::Requantize(const float* e, bool reset, IsaLevel isa) {
  if (reset) {
    Reset();
    return;
  }
  if (fp32_) {
    std::copy(e, e + n_, e32_.data());
    return;
  }
  if (block_ == 0) {
    for (size_t i = 0; i < n_; ++i) {
      const float t = e[i] * se_;
      e8_[i] = static_cast<int8_t>(Finite(t) ? RoundClamp(t, -128.0f, 127.0f) : 0);
    }
    return;
  }
  for (size_t b = 0; b < block_step_.size(); ++b) {
    const size_t first = b * block_;
    const size_t m = std::min<size_t>(block_, n_ - first);
    bool finite = true;
    float absmax = loco::AbsMax(e + first, m, &finite, isa);
    if (!finite) absmax = 0;
    block_step_[b] = absmax / 127.0f;
    if (absmax > 0) {
      // (capped as LocoStepBlocks caps it: a subnormal absmax keeps a finite scale)
      const float inv = std::min(127.0f / absmax, std::numeric_limits<float>::max());
      loco::RequantizeInt8(e + first, m, inv, e8_.data() + first, isa);
    } else {
      std::fill(e8_.data() + first, e8_.data() + first + m, int8_t{0});
    }
  }
}

Status LocoState::Restore(Span<const float> saved) {
  if (saved.size() != n_) {
    return InvalidArgumentError("saved loco error has " + std::to_string(saved.size()) +
                                " elements; this partition has " + std::to_string(n_));
  }
  Requantize(saved.data(), false);
  if (fp32_ || block_ == 0) return Status::Ok();
  // Block scale: saved = E * step with step = absmax / 127 as the state held it; absmax / 127
  // recomputed from the saved values can be one ulp off that step, so the neighbours are
  // tried too and the one that reproduces every saved value exactly is kept (a bit-exact
  // resume).
  for (size_t b = 0; b < block_step_.size(); ++b) {
    const size_t first = b * block_;
    const size_t end = std::min<size_t>(first + block_, n_);
    const float base = block_step_[b];
    for (float step : {base, std::nextafter(base, 0.0f), std::nextafter(base, 1e30f)}) {
      if (!(step > 0)) continue;
      bool exact = true;
      for (size_t i = first; i < end && exact; ++i) {
        const float t = saved[i] / step;
        const int e = Finite(t) ? RoundClamp(t, -127.0f, 127.0f) : 0;
        exact = static_cast<float>(e) * step == saved[i];
      }
      if (!exact) continue;
      block_step_[b] = step;
      for (size_t i = first; i < end; ++i) {
        e8_[i] = static_cast<int8_t>(RoundClamp(saved[i] / step, -127.0f, 127.0f));
      }
      break;
    }
  }
  return Status::Ok();
}

namespace {

std::unique_ptr<Compressor> NewLoco(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<LocoCompressor>(config.loco(), isa);
}

// The worker keeps LoCo's error; so does the server where it replies in LoCo's 4 bits (the
// two-hop variant). A server replying in 16/32 bits keeps the vanilla residual of that
// rounding.
std::unique_ptr<ErrorFeedback> NewLocoState(const v1::CompressorConfig& config,
                                            ErrorFeedbackSide side, size_t elements) {
  if (side == ErrorFeedbackSide::kServer && config.loco().pull() != v1::PULL_FORMAT_METHOD) {
    return NewResidualState(config, side, elements);
  }
  return std::make_unique<LocoState>(config.loco(), elements);
}

}  // namespace

// The kernel half of loco (compressors/method.h; spec half in loco_spec.cc).
const MethodKernels kLocoMethodKernels = {&kLocoMethodSpec, &NewLoco, &NewLocoState};

}  // namespace bitpush::compressors
