#include "compressors/binsgdm/binsgdm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "common/counter_rng.h"
#include "common/vector_ops.h"
#include "compressors/method.h"

namespace bitpush::compressors {
namespace {

// out[i] = (or +=) +1.0f where bit i is set, else -1.0f; body validated.
void DecodeScalar(const uint8_t* bits, size_t n, float* out, bool add) {
  for (size_t i = 0; i < n; ++i) {
    const float v = ((bits[i >> 3] >> (i & 7)) & 1) ? 1.0f : -1.0f;
    out[i] = add ? out[i] + v : v;
  }
}

BP_TARGET_AVX512 void DecodeAvx512(const uint8_t* bits, size_t n, float* out, bool add) {
  const __m512 plus = _mm512_set1_ps(1.0f);
  const __m512 minus = _mm512_set1_ps(-1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 mask =
        left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    uint16_t word = 0;
    if (left > 8) {
      std::memcpy(&word, bits + i / 8, 2);
    } else {
      word = bits[i / 8];
    }
    __m512 v = _mm512_mask_blend_ps(static_cast<__mmask16>(word), minus, plus);
    if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out + i), v);
    _mm512_mask_storeu_ps(out + i, mask, v);
  }
}

// Decompress into a tensor of at least this many elements streams its stores past the caches
// (the values are not read right away; a 100 MB reply written through the cache costs a read
// of every line first). Below it the plain path: the tensor likely stays in cache.
constexpr size_t kStreamDecodeMin = size_t{1} << 16;

// DecodeAvx512 without add, with non-temporal stores from the first 64-byte boundary of out
// (4-byte aligned) on; the head before it and the tail after the last whole vector go through
// the masked path.
BP_TARGET_AVX512 void DecodeStreamAvx512(const uint8_t* bits, size_t n, float* out) {
  const __m512 plus = _mm512_set1_ps(1.0f);
  const __m512 minus = _mm512_set1_ps(-1.0f);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
  const size_t head = std::min(n, static_cast<size_t>(((64 - (addr & 63)) & 63) / 4));
  DecodeScalar(bits, head, out, false);
  size_t i = head;
  for (; i + 16 <= n; i += 16) {
    // Bits i .. i + 15 lie in bytes i/8 .. (i + 15)/8, all inside the body (i + 16 <= n); a
    // third byte is read only when i is not a multiple of 8, and then it is one of them.
    const size_t byte = i / 8;
    const unsigned shift = static_cast<unsigned>(i % 8);
    uint32_t w = uint32_t{bits[byte]} | (uint32_t{bits[byte + 1]} << 8);
    if (shift != 0) w |= uint32_t{bits[byte + 2]} << 16;
    const auto mask = static_cast<__mmask16>(w >> shift);
    _mm512_stream_ps(out + i, _mm512_mask_blend_ps(mask, minus, plus));
  }
  _mm_sfence();
  for (; i < n; ++i) out[i] = ((bits[i >> 3] >> (i & 7)) & 1) ? 1.0f : -1.0f;
}

Status CheckCapacity(size_t need, MutableByteSpan out) {
  if (out.size() < need) {
    return InvalidArgumentError("output buffer of " + std::to_string(out.size()) +
                                " bytes is smaller than the " + std::to_string(need) +
                                " bytes the payload may need (MaxCompressedBytes)");
  }
  return Status::Ok();
}

}  // namespace

BinsgdmCompressor::BinsgdmCompressor(const v1::BinsgdmParams& params, IsaLevel isa)
    : CompressorBase(v1::COMPRESSOR_ID_BINSGDM, isa),
      seed_(params.seed()),
      hyper_(optimizers::MakeBinsgdmHyper(params.beta(), params.eps())) {}

uint64_t BinsgdmCompressor::Stream(const CompressContext& ctx) const {
  return StreamKey(seed_, ctx.worker, ctx.key, ctx.round);
}

StatusOr<size_t> BinsgdmCompressor::CompressStep(ConstTensorView g, float* m, float* b, float* e,
                                                 const CompressContext& ctx, MutableByteSpan out) {
  const size_t n = g.count();
  BP_RETURN_IF_ERROR(CheckElementCount(n));
  BP_ASSIGN_OR_RETURN(const DType dtype, PayloadDType(g.dtype(), ctx));
  BP_RETURN_IF_ERROR(CheckCapacity(MaxCompressedBytes(n, dtype), out));
  const float* x = g.f32();
  if (g.dtype() != DType::kFloat32) {
    float* tmp = Scratch(n);
    ConvertToFloat(g, tmp, isa());
    x = tmp;
  }
  // The step reads every g and restarts an element whose values are not finite: its report is
  // the engine's input check.
  NoteInputCheck(!optimizers::BinsgdmWorkerStep(hyper_, Stream(ctx), x, m, b, e, n,
                                                out.data() + kPayloadHeaderBytes, isa()));
  return FinishPayload(dtype, n, BodyBytes(n), out.data());
}

size_t BinsgdmCompressor::EncodeBody(const float* x, size_t n, DType, const CompressContext& ctx,
                                     uint8_t* body) {
  NoteInputCheck(!optimizers::BinsgdmBinarize(Stream(ctx), x, nullptr, n, body, isa()));
  return BodyBytes(n);
}

size_t BinsgdmCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType,
                                                 const CompressContext& ctx, uint8_t* body) {
  // q already holds x + e; +-1 is exact in every dtype, so C(q) needs no rounding.
  NoteInputCheck(!optimizers::BinsgdmBinarize(Stream(ctx), nullptr, q, n, body, isa()));
  return BodyBytes(n);
}

size_t BinsgdmCompressor::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                    const CompressContext& ctx, uint8_t* body) {
  NoteInputCheck(!optimizers::BinsgdmBinarize(Stream(ctx), g, e, n, body, isa()));
  return BodyBytes(n);
}

Status BinsgdmCompressor::ValidateBody(ByteSpan body, size_t n, DType) {
  const size_t want = BodyBytes(n);
  if (body.size() != want) {
    return DataLossError("binsgdm: body is " + std::to_string(body.size()) + " bytes; " +
                         std::to_string(n) + " elements need exactly " + std::to_string(want) +
                         " (one bit each)");
  }
  if (n % 8 != 0 && (body.data()[want - 1] >> (n % 8)) != 0) {
    char last[8];
    std::snprintf(last, sizeof last, "0x%02x", body.data()[want - 1]);
    return DataLossError("binsgdm: the padding bits after element " + std::to_string(n - 1) +
                         " are not zero (last byte " + last + ")");
  }
  return Status::Ok();
}

Status BinsgdmCompressor::DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) {
  BP_RETURN_IF_ERROR(ValidateBody(body, n, dtype));
  if (isa() == IsaLevel::kAvx512) {
    DecodeAvx512(body.data(), n, out, add);
  } else {
    DecodeScalar(body.data(), n, out, add);
  }
  return Status::Ok();
}

Status BinsgdmCompressor::DecodeBodyToTensor(ByteSpan body, size_t n, DType dtype, float* out) {
  if (isa() != IsaLevel::kAvx512 || n < kStreamDecodeMin ||
      reinterpret_cast<uintptr_t>(out) % alignof(float) != 0) {
    return DecodeBody(body, n, dtype, out, false);
  }
  BP_RETURN_IF_ERROR(ValidateBody(body, n, dtype));
  DecodeStreamAvx512(body.data(), n, out);
  return Status::Ok();
}

size_t BinsgdmCompressor::AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType,
                                        float scale, float* residual, const CompressContext& ctx,
                                        uint8_t* body) {
  push_bits_.resize(count);
  for (size_t w = 0; w < count; ++w) push_bits_[w] = bodies[w].data();
  optimizers::BinsgdmServerRound(push_bits_.data(), count, n, scale, residual, Stream(ctx), body,
                                 isa());
  return BodyBytes(n);
}

// ---- BinsgdmState ----

BinsgdmState::BinsgdmState(size_t elements) : n_(elements), state_(3 * elements) {
  state_.zero();
}

StatusOr<size_t> BinsgdmState::Compress(Compressor& compressor, ConstTensorView x,
                                        const CompressContext& ctx, MutableByteSpan out) {
  auto* c = dynamic_cast<BinsgdmCompressor*>(&compressor);
  if (c == nullptr) {
    return FailedPreconditionError(
        "binsgdm's worker state compresses through a binsgdm compressor, not " +
        v1::CompressorId_Name(compressor.id()));
  }
  if (x.count() != n_) {
    return InvalidArgumentError("binsgdm state of " + std::to_string(n_) +
                                " elements given a tensor of " + std::to_string(x.count()));
  }
  float* s = state_.data();
  return c->CompressStep(x, s, s + n_, s + 2 * n_, ctx, out);
}

StatusOr<size_t> BinsgdmState::AggregateCompress(Compressor&, Span<const ByteSpan>, float,
                                                 const CompressContext&, MutableByteSpan) {
  return FailedPreconditionError(
      "binsgdm's worker state (m, b, e) does not run a server round; servers keep a plain "
      "residual");
}

Status BinsgdmState::Restore(Span<const float> saved) {
  if (saved.size() != state_.size()) {
    return InvalidArgumentError(
        "saved binsgdm state has " + std::to_string(saved.size()) + " values; this partition of " +
        std::to_string(n_) + " elements keeps " + std::to_string(state_.size()) + " (m, b and e)");
  }
  if (!saved.empty()) std::memcpy(state_.data(), saved.data(), saved.size() * sizeof(float));
  return Status::Ok();
}

namespace {
std::unique_ptr<Compressor> NewBinsgdm(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<BinsgdmCompressor>(config.binsgdm(), isa);
}

// Workers keep the method's state (m, b, e); servers the plain residual e_bar.
std::unique_ptr<ErrorFeedback> NewBinsgdmState(const v1::CompressorConfig& config,
                                               ErrorFeedbackSide side, size_t elements) {
  if (side == ErrorFeedbackSide::kWorker) return std::make_unique<BinsgdmState>(elements);
  return NewResidualState(config, side, elements);
}
}  // namespace

// The kernel half of binsgdm (compressors/method.h; spec half in binsgdm_spec.cc).
const MethodKernels kBinsgdmMethodKernels = {&kBinsgdmMethodSpec, &NewBinsgdm, &NewBinsgdmState};

}  // namespace bitpush::compressors
