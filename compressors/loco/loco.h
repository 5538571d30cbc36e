// LoCo (paper 000): a 4-bit quantiser and its compensated error (docs/compressors.md "loco",
// the layout in docs/wire-format.md "loco (id 8)").
//
// LocoCompressor is the quantiser. Fixed scale (block = 0, the paper's Eq. 1):
//   q = clamp(round_half_even(h * s), -8, 7), decoded as q * step, step = fp32(1/s).
// Block scale (block = B; the default spec's B = 256): per block of B elements step_b =
//   absmax / 7 (fp32), q = clamp(round_half_even(h * min(7 / absmax, FLT_MAX)), -7, 7),
//   decoded as q * step_b; an all-zero block has step 0.
// The server's reply with pull = fp16 | bf16 | fp32 (CompressContext::worker == kServerStream)
// carries the values in that format instead; pull = loco replies in 4 bits like a push.
//
// LocoState is LoCo's error feedback (the method's ErrorFeedback, compressors/method.h), one
// per partition and side; per round k (ctx.round):
//   h = g + dec(E);  push q(h);  e_new = (1 - beta) dec(E) + beta (h - C(h));
//   E = 0 if reset > 0 and k % reset == 0, else requantise(e_new)
// with E int8 (fixed scale s_e = error_scale * s, or per block absmax / 127) or fp32 (exact);
// the block scale's int8 step is fused per block (loco::LocoStepBlocks).
// beta = 1, reset = 0, error = fp32 is classic error feedback, bit for bit (e = h - C(h)).
// The state is zeroed on a non-finite gradient (policy of every compressor, docs/errors.md).
//
// Body (little-endian):
//   u8 kind | u8 0 | u16 0 | u32 block     then, by kind:
//   1 fixed int4:  f32 step | ceil(n/2) code bytes
//   2 block int4:  f32 step[ceil(n/B)] | ceil(n/2) code bytes
//   3 fp32 values: n x f32;  4 fp16 values: n x u16;  5 bf16 values: n x u16   (replies)
// Codes: element 2i in the low nibble, 2i+1 in the high one, two's complement; an odd n leaves
// the last high nibble 0. Non-finite input: the fixed step (or the block's step) is NaN and its
// codes are 0; it decodes to NaN, so AMP's overflow check sees it.
//
// Thread-safety: one thread per instance (compressors/compressor.h); a LocoState is used with
// one LocoCompressor by the thread that owns the partition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/loco/loco_kernels.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

class LocoState;

class LocoCompressor final : public CompressorBase {
 public:
  enum Kind : uint8_t { kFixed = 1, kBlock = 2, kFp32 = 3, kFp16 = 4, kBf16 = 5 };
  static constexpr size_t kBodyHeaderBytes = 8;

  // params must be canonical (loco_spec.cc).
  LocoCompressor(const v1::LocoParams& params, IsaLevel isa);

  const v1::LocoParams& params() const { return params_; }
  // The body size of a 4-bit push of n elements.
  size_t PushBodyBytes(size_t n) const;
  // The kind a compression under ctx writes.
  Kind KindFor(const CompressContext& ctx) const;

  // LoCo's step through `state` (LocoState::Compress): payload = q(x + dec(E)), E updated.
  StatusOr<size_t> CompressWithState(ConstTensorView input, LocoState& state,
                                     const CompressContext& ctx, MutableByteSpan out);

  void TakeTelemetry(CompressorTelemetry* into) override;

 protected:
  size_t MaxBodyBytes(size_t n, DType dtype) const override;
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;

 private:
  // Writes a body of `kind` for x; residual (may be null) <- x - C(x). Returns the body size.
  size_t Encode(const float* x, size_t n, Kind kind, float* residual, uint8_t* body);
  size_t EncodeBlocks(const float* x, size_t n, float* residual, uint8_t* body);
  size_t StepBody(const float* g, size_t n, LocoState& st, const CompressContext& ctx,
                  uint8_t* body);
  Status Validate(ByteSpan body, size_t n, Kind* kind) const;

  v1::LocoParams params_;
  loco::FixedScale fixed_;
  uint32_t block_;
  CompressorTelemetry telemetry_;
  AlignedBuffer<float> input_;  // a 16-bit input converted to fp32 (CompressWithState)
};

class LocoState final : public ErrorFeedback {
 public:
  LocoState(const v1::LocoParams& params, size_t elements);

  size_t size() const override { return n_; }
  StatusOr<size_t> Compress(Compressor& compressor, ConstTensorView x, const CompressContext& ctx,
                            MutableByteSpan out) override;
  bool FusesServerRound(const Compressor&) const override { return false; }
  StatusOr<size_t> AggregateCompress(Compressor& compressor, Span<const ByteSpan> pushes,
                                     float scale, const CompressContext& ctx,
                                     MutableByteSpan out) override;
  // dec(E) as fp32 (materialised at each call).
  Span<const float> residual() const override;
  // E = requantise(saved) (int8) or saved (fp32); the size must match.
  Status Restore(Span<const float> saved) override;
  void Reset() override;

 private:
  friend class LocoCompressor;
  // E = requantise(e) (zero where reset); every ISA level gives the same E.
  void Requantize(const float* e, bool reset, IsaLevel isa = IsaLevel::kScalar);
  // out[0..n) = dec(E).
  void Dequantize(float* out, IsaLevel isa = IsaLevel::kScalar) const;

  size_t n_;
  bool fp32_;
  uint32_t block_;
  float se_;      // fixed scale: s_e
  float step_e_;  // fixed scale: fp32(1/s_e)
  AlignedBuffer<int8_t> e8_;
  AlignedBuffer<float> e32_;
  AlignedBuffer<float> block_step_;  // block scale: per block absmax / 127
  mutable AlignedBuffer<float> view_;
};

}  // namespace bitpush::compressors
