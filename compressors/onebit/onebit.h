// Scaled 1-bit (sign) compressor, paper 001 §3.1: C(x) = scale · sign(x), one bit per element.
//
// scale = mean |x| (= ||x||_1 / n) when scaled=true, 1 when scaled=false (signSGD).
// Sign convention: bit = 1 iff x < 0; +0, -0 and NaN map to +scale.
//
// Body (after the 16-byte payload header):
//   f32 scale (little-endian)
//   ceil(n/64) little-endian u64 words; bit t of word j is the sign bit of element 64j+t;
//   the bits past element n-1 in the last word are 0.
//   => 4 + 8*ceil(n/64) bytes (32x smaller than fp32 for large n).
//
// The mean |x| is accumulated in double, in 16 lanes (element i into lane i mod 16), and the
// lanes are summed in order: every ISA level computes the identical scale, so payloads are
// bit-identical across scalar / AVX2 / AVX-512.
//
// Non-finite input: any NaN or inf makes the stored scale NaN (in both modes), so every
// decoded element is NaN and AMP's overflow check still fires; with error feedback the
// residual is reset to zero instead of being poisoned. Nothing traps.
//
// Error feedback is fused: the residual is updated as e = q - (±scale) straight from the
// sign bits; the decompressed tensor is never materialised. With fp32 input the sum g + e is
// formed inside both passes and never written separately.
//
// Decompress into an fp32 tensor of 64 Ki elements or more uses non-temporal stores (AVX-512):
// the output is overwritten whole, so its lines need not be read first.
//
// Server round (FusesServerRound, both algorithms): AggregateBody computes the aggregate of the
// pushes element by element from their sign bits inside the two passes (pass 1 signs + |q|,
// pass 2 the residual), so the server never materialises it: bit-identical to decompressing,
// averaging and compressing, with two passes over the residual instead of six over
// accumulator and residual.
//
// Thread-safety: one thread per instance (compressors/compressor.h).
#pragma once

#include <vector>

#include "compressors/compressor.h"

namespace bitpush::compressors {

class OnebitCompressor final : public CompressorBase {
 public:
  OnebitCompressor(bool scaled, IsaLevel isa)
      : CompressorBase(v1::COMPRESSOR_ID_ONEBIT, isa), scaled_(scaled) {}

  static size_t BodyBytes(size_t n) { return 4 + 8 * ((n + 63) / 64); }

 protected:
  size_t MaxBodyBytes(size_t n, DType) const override { return BodyBytes(n); }
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  size_t EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n, const CompressContext& ctx,
                                   uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;
  Status ValidateBody(ByteSpan body, size_t n, DType dtype) override;
  Status DecodeBodyToTensor(ByteSpan body, size_t n, DType dtype, float* out) override;
  bool FusesServerRound(bool) const override { return true; }
  size_t AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype, float mult,
                       float* residual, const CompressContext& ctx, uint8_t* body) override;

 public:
  // One push of a fused server round (AggregateBody): its sign words and scale.
  struct PushSigns {
    const uint8_t* words;
    float scale;
  };

 private:
  float ScaleFromSum(double sum_abs, size_t n) const;
  // e <- q - C(q) from the sign words (or zero when the scale is NaN).
  void UpdateResidual(float* q, size_t n, const uint8_t* words, float scale);

  bool scaled_;
  std::vector<PushSigns> pushes_;     // AggregateBody's view of the pushes
  std::vector<uint64_t> push_words_;  // their sign words at the current position
};

}  // namespace bitpush::compressors
