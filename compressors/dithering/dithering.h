// Dithering: stochastic s-level quantisation of a partition (paper 001 §3.4; QSGD's linear
// levels and "natural" power-of-two levels). Unbiased: E[C(x)] = x. Full description and
// byte layout: docs/dithering.md.
//
// scale = max |x_i| (norm=max) or ||x||_2 (norm=l2), u_i = |x_i| / scale in [0, 1]:
//   linear  (levels s in 1..255): levels {0, 1/s, ..., 1}; code c in [0, s] ~ floor(u s) +
//           Bernoulli(frac(u s)); decodes to sign * L(c), L(c) = float(c) * (scale / s), and
//           L(s) = scale exactly.
//   natural (levels s in 1..31): levels {0, 2^(1-s), ..., 1/2, 1}; code c in [0, s], code j
//           is 2^(j - s) (decodes to sign * scale * 2^(c - s)), code 0 is 0; rounding between
//           the bracketing powers of two (or between 0 and 2^(1-s)) is linear, so unbiased.
// Random numbers: element i uses CounterRandom32(StreamKey(seed, worker, key, round),
// uint32(i)), so every ISA level and every rerun produces the same bytes for the same (seed,
// worker, key, round), and different workers round independently.
//
// Body (little-endian; b = ceil(log2(s + 1)) bits per code):
//   f32 scale | ceil(n/64) blocks of (b + 1) u64 words:
//     word 0     sign bits: bit t = 1 iff element 64j+t is negative and its code is nonzero
//     word 1+p   bit p of the code of element 64j+t, at bit t
//   = 4 + ceil(n/64) * (b + 1) * 8 bytes, whatever the data and the input dtype. Padding
//   elements of the last block have code 0 and sign 0.
//
// Policies:
//   - all-zero input: scale 0, every code 0 (decodes to +0).
//   - non-finite input (some x_i is inf or NaN, so the norm is): scale is written as NaN and
//     every code as 0; the whole partition decodes to NaN, so AMP's overflow check sees it.
//     With error feedback the residual is reset to zero rather than poisoned (the policy
//     of every compressor, docs/errors.md).
//   - norm=l2 of finite input above FLT_MAX: scale is clamped to FLT_MAX (still >= max|x_i|,
//     so the result stays unbiased and finite).
//   - the decoder validates everything before it writes: exact body size; scale finite and
//     >= +0, or NaN (then all words must be 0); codes <= s; sign bits only on nonzero
//     codes; padding of the last block zero. DataLoss naming the element otherwise.
//
// Thread-safety: one thread per instance (see compressors/compressor.h); the only per-call
// state (the level table) is scratch owned by the instance.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/compressor.h"
#include "compressors/dithering/dithering_kernels.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

class DitheringCompressor final : public CompressorBase {
 public:
  // params must be canonical (dithering_spec.cc fills and range-checks them).
  DitheringCompressor(const v1::DitheringParams& params, IsaLevel isa);

  uint32_t levels() const { return levels_; }
  bool natural() const { return natural_; }
  bool l2_norm() const { return l2_; }
  // Bits per code, ceil(log2(levels + 1)).
  uint32_t code_bits() const { return bits_; }
  // The exact body size for n elements.
  size_t BodyBytes(size_t n) const;

 protected:
  size_t MaxBodyBytes(size_t n, DType dtype) const override { return BodyBytes(n); }
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  size_t EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n, const CompressContext& ctx,
                                   uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;

 private:
  // The scale of a norm result: NaN for non-finite input (see Policies).
  float ScaleFromMaxBits(uint32_t max_abs_bits) const;
  float ScaleFromSumSquares(double sum) const;
  // Writes the body for x with the given scale; when `feedback`, x is q and becomes q - C(q).
  size_t Encode(float* x, bool feedback, size_t n, float scale, const CompressContext& ctx,
                uint8_t* body);
  Status ValidateBlocks(const uint8_t* blocks, size_t n, bool nan_scale) const;

  uint32_t levels_;
  uint32_t bits_;
  bool natural_;
  bool l2_;
  uint64_t seed_;
  dithering::Levels table_;  // per-call scratch
};

}  // namespace bitpush::compressors
