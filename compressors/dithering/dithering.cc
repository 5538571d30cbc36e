#include "compressors/dithering/dithering.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "common/counter_rng.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"

namespace bitpush::compressors {
namespace {

using dithering::kBlockElements;

// Below this scale the factor s / scale could overflow fp32: the encoder multiplies |x| by
// kPrescale first (exact), which only the scalar kernel does (see dithering_kernels.h).
constexpr float kTinyScale = 0x1p-64f;
constexpr float kPrescale = 0x1p64f;

size_t NumBlocks(size_t n) {
  return (n + kBlockElements - 1) / kBlockElements;
}

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The float f >= target / scale closest to it: target / scale rounded up, so that
// |x| == scale gives t = |x| * f >= target exactly (the max element lands on the top level).
// f * scale is exact in double (24 + 24 significant bits).
float RoundedUpFactor(float target, float scale) {
  float f = target / scale;
  while (static_cast<double>(f) * static_cast<double>(scale) < static_cast<double>(target)) {
    f = std::nextafter(f, std::numeric_limits<float>::infinity());
  }
  return f;
}

std::string FloatString(float v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

}  // namespace

DitheringCompressor::DitheringCompressor(const v1::DitheringParams& params, IsaLevel isa)
    : CompressorBase(v1::COMPRESSOR_ID_DITHERING, isa),
      levels_(params.levels()),
      bits_(dithering::BitsForLevels(params.levels())),
      natural_(params.partition() == v1::DITHERING_PARTITION_NATURAL),
      l2_(params.norm() == v1::DITHERING_NORM_L2),
      seed_(params.seed()) {}

size_t DitheringCompressor::BodyBytes(size_t n) const {
  return sizeof(float) + NumBlocks(n) * (bits_ + 1) * sizeof(uint64_t);
}

float DitheringCompressor::ScaleFromMaxBits(uint32_t max_abs_bits) const {
  if (max_abs_bits >= 0x7F800000u) return std::numeric_limits<float>::quiet_NaN();
  float scale;
  std::memcpy(&scale, &max_abs_bits, sizeof scale);
  return scale;
}

float DitheringCompressor::ScaleFromSumSquares(double sum) const {
  // Squares of finite floats are finite in double, so a non-finite sum means non-finite input.
  if (!std::isfinite(sum)) return std::numeric_limits<float>::quiet_NaN();
  const double norm = std::sqrt(sum);
  return norm >= static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(norm);
}

size_t DitheringCompressor::Encode(float* x, bool feedback, size_t n, float scale,
                                   const CompressContext& ctx, uint8_t* body) {
  // The scale's pass read every value (max |x| or the sum of squares): NaN iff one was not
  // finite (ScaleFromMaxBits, ScaleFromSumSquares), the engine's input check.
  NoteInputCheck(std::isnan(scale));
  std::memcpy(body, &scale, sizeof scale);
  uint8_t* blocks = body + sizeof(float);
  const size_t bytes = BodyBytes(n);
  if (!(scale > 0.0f)) {  // zero input, or the non-finite marker (NaN)
    std::memset(blocks, 0, bytes - sizeof(float));
    if (feedback && std::isnan(scale) && n) {
      // Non-finite input: the residual restarts from zero instead of turning NaN forever
      // (docs/errors.md).
      std::memset(x, 0, n * sizeof(float));
    }
    // scale == 0: C(q) = +0 everywhere and q - 0 == q, so the residual is already right.
    return bytes;
  }
  dithering::InitLevels(levels_, natural_, scale, &table_);
  dithering::QuantizeArgs args;
  args.levels = &table_;
  args.stream = StreamKey(seed_, ctx.worker, ctx.key, ctx.round);
  const float target =
      natural_ ? std::ldexp(1.0f, static_cast<int>(levels_) - 1) : static_cast<float>(levels_);
  if (scale < kTinyScale) {
    args.prescale = kPrescale;
    args.factor = RoundedUpFactor(target, scale * kPrescale);
  } else {
    args.factor = RoundedUpFactor(target, scale);
  }
  if (feedback) {
    dithering::QuantizePackFeedback(x, n, args, blocks, isa());
  } else {
    dithering::QuantizePack(x, n, args, blocks, isa());
  }
  return bytes;
}

size_t DitheringCompressor::EncodeBody(const float* x, size_t n, DType, const CompressContext& ctx,
                                       uint8_t* body) {
  const float scale = l2_ ? ScaleFromSumSquares(dithering::SumSquares(x, n, isa()))
                          : ScaleFromMaxBits(dithering::MaxAbsBits(x, n, isa()));
  // Not written through when feedback is false.
  return Encode(const_cast<float*>(x), false, n, scale, ctx, body);
}

size_t DitheringCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType,
                                                   const CompressContext& ctx, uint8_t* body) {
  const float scale = l2_ ? ScaleFromSumSquares(dithering::SumSquares(q, n, isa()))
                          : ScaleFromMaxBits(dithering::MaxAbsBits(q, n, isa()));
  return Encode(q, true, n, scale, ctx, body);
}

size_t DitheringCompressor::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                      const CompressContext& ctx, uint8_t* body) {
  // Pass 1: e <- g + e and its norm in one sweep; pass 2: quantise, pack, e <- e - C(e).
  const float scale = l2_ ? ScaleFromSumSquares(dithering::AddSumSquares(g, e, n, isa()))
                          : ScaleFromMaxBits(dithering::AddMaxAbsBits(g, e, n, isa()));
  return Encode(e, true, n, scale, ctx, body);
}

Status DitheringCompressor::ValidateBlocks(const uint8_t* blocks, size_t n, bool nan_scale) const {
  const size_t nb = NumBlocks(n);
  const uint32_t bits = bits_;
  const size_t block_bytes = (bits + 1) * sizeof(uint64_t);
  const bool full_range = levels_ == (1u << bits) - 1;  // every b-bit code is <= s
  const size_t rem = n % kBlockElements;
  for (size_t j = 0; j < nb; ++j) {
    const uint8_t* blk = blocks + j * block_bytes;
    uint64_t w[9];
    uint64_t nz = 0;
    for (uint32_t i = 0; i <= bits; ++i) w[i] = LoadU64(blk + i * sizeof(uint64_t));
    for (uint32_t p = 0; p < bits; ++p) nz |= w[1 + p];
    uint64_t too_big = 0;
    if (!full_range) {  // bit-sliced compare of 64 codes against s, most significant bit first
      uint64_t eq = ~uint64_t{0};
      for (uint32_t p = bits; p-- > 0;) {
        if ((levels_ >> p) & 1u) {
          eq &= w[1 + p];
        } else {
          too_big |= eq & w[1 + p];
          eq &= ~w[1 + p];
        }
      }
    }
    const uint64_t bad_sign = w[0] & ~nz;
    const uint64_t pad = (j + 1 == nb && rem != 0) ? (nz | w[0]) & ~((uint64_t{1} << rem) - 1) : 0;
    const uint64_t nan_bad = nan_scale ? (nz | w[0]) : 0;
    if ((too_big | bad_sign | pad | nan_bad) == 0) continue;
    const auto element = [&](uint64_t mask) { return j * kBlockElements + __builtin_ctzll(mask); };
    const auto code = [&](uint64_t mask) {
      const unsigned t = __builtin_ctzll(mask);
      uint32_t c = 0;
      for (uint32_t p = 0; p < bits; ++p) c |= static_cast<uint32_t>((w[1 + p] >> t) & 1u) << p;
      return c;
    };
    if (pad) {
      return DataLossError("dithering: padding slot " + std::to_string(element(pad)) +
                           " of the last block is not zero (the tensor has " + std::to_string(n) +
                           " elements)");
    }
    if (too_big) {
      return DataLossError("dithering: element " + std::to_string(element(too_big)) +
                           " has level code " + std::to_string(code(too_big)) +
                           " but levels=" + std::to_string(levels_));
    }
    if (bad_sign) {
      return DataLossError("dithering: element " + std::to_string(element(bad_sign)) +
                           " has its sign bit set but level code 0");
    }
    return DataLossError("dithering: scale is NaN (the non-finite marker) but element " +
                         std::to_string(element(nan_bad)) + " has a nonzero code or sign bit");
  }
  return Status::Ok();
}

Status DitheringCompressor::DecodeBody(ByteSpan body, size_t n, DType, float* out, bool add) {
  const size_t want = BodyBytes(n);
  if (body.size() != want) {
    return DataLossError("dithering: body is " + std::to_string(body.size()) + " bytes; " +
                         std::to_string(n) + " elements at levels=" + std::to_string(levels_) +
                         " (" + std::to_string(bits_) + "-bit codes) need " + std::to_string(want));
  }
  float scale;
  std::memcpy(&scale, body.data(), sizeof scale);
  const bool nan_scale = std::isnan(scale);
  if (!nan_scale && (std::isinf(scale) || std::signbit(scale))) {
    return DataLossError("dithering: scale is " + FloatString(scale) +
                         "; it must be finite and >= +0 (or NaN, the non-finite marker)");
  }
  const uint8_t* blocks = body.data() + sizeof(float);
  BP_RETURN_IF_ERROR(ValidateBlocks(blocks, n, nan_scale));
  if (nan_scale) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i < n; ++i) out[i] = add ? out[i] + nan : nan;
    return Status::Ok();
  }
  dithering::InitLevels(levels_, natural_, scale, &table_);
  dithering::DecodeBlocks(blocks, n, table_, out, add, isa());
  return Status::Ok();
}

namespace {
std::unique_ptr<Compressor> NewDithering(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<DitheringCompressor>(config.dithering(), isa);
}
}  // namespace

// The kernel half of dithering (compressors/method.h; spec half in dithering_spec.cc).
const MethodKernels kDitheringMethodKernels = {&kDitheringMethodSpec, &NewDithering,
                                               &NewResidualState};

}  // namespace bitpush::compressors
