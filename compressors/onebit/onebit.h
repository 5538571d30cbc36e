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
// Compress is one pass (the sign bits do not depend on the scale): signs and the 16 lane sums
// together. The SIMD kernels run whole 64-element words with plain loads and stores and mask
// only the last, partial word: with per-chunk masked loads AVX-512 compress read a 64 MiB
// tensor at 7.5 GB/s on an AMD Zen 5 (perf: most samples on the masked loads), plainly at
// 21-31 GB/s. The per-lane double adds are a dependency chain of n/16 adds (2 chains of 8
// lanes), about 100 GB/s of input on that core, so they do not limit it.
//
// Non-finite input: any NaN or inf makes the stored scale NaN (in both modes), so every
// decoded element is NaN and AMP's overflow check still fires; with error feedback the
// residual is reset to zero instead of being poisoned. Nothing traps.
//
// Error feedback is fused: the residual is updated as e = q - (±scale) straight from the
// sign bits; the decompressed tensor is never materialised. Through the Compressor interface
// (CompressWithFeedback, a plain fp32 residual) pass 1 forms q = g + e, packs its signs, sums
// |q| and stores q over e; pass 2 (once the scale is known) walks e backwards, from the end
// pass 1 left in cache, and subtracts ±scale. Out of cache that is 5 bytes moved per input
// byte (read g, e; write q; read, write e) against memcpy's 2.
//
// Deferred error feedback (OnebitResidualState, the state the engine and the servers keep for
// onebit keys) drops pass 2: the state keeps q itself with its correction C(q) pending (the
// round's sign words, n/8 bytes, and scale), and the next round's pass 1 reads
// e = q - C(q) on the fly: one pass, 3 bytes moved per input byte. The fp32 operations are
// the same, in the same order, so payloads and residuals are bit-identical to the two-pass
// form; residual() materialises e when a checkpoint or a test reads it.
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
// Files: onebit.cc (the compressor), onebit_kernels.{h,cc} (the passes, per ISA level),
// onebit_residual_state.cc (the deferred error feedback), onebit_spec.cc (the spec half).
//
// Thread-safety: one thread per instance (compressors/compressor.h).
#pragma once

#include <vector>

#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/onebit/onebit_kernels.h"

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
  bool FusesResidualDecay() const override { return true; }
  size_t AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype, float mult,
                       float* residual, const CompressContext& ctx, uint8_t* body) override;

 public:
  // One push of a fused server round (AggregateBody): its sign words and scale; also a
  // deferred residual's pending correction C(q).
  using PushSigns = OnebitSignWords;

  // CompressWithFeedback / AggregateCompress with deferred error feedback: `q` holds the last
  // round's q with its correction `prev` pending (or, with prev == nullptr, a plain residual
  // e). On return it holds this round's q, whose correction is the payload's scale and sign
  // words, or zeros when that scale is NaN (non-finite input). CompressDeferred takes fp32
  // input with an fp32 payload only (InvalidArgument otherwise).
  StatusOr<size_t> CompressDeferred(ConstTensorView x, Span<float> q, const PushSigns* prev,
                                    const CompressContext& ctx, MutableByteSpan out);
  StatusOr<size_t> AggregateCompressDeferred(Span<const ByteSpan> pushes, float scale,
                                             Span<float> q, const PushSigns* prev,
                                             const CompressContext& ctx, MutableByteSpan out);

 private:
  // The payload's scale from the sign pass's sum of |x|; notes whether the sum was finite (the
  // input non-finite check, NoteInputCheck).
  float ScaleFromSum(double sum_abs, size_t n);
  // e <- q - C(q) from the sign words (or zero when the scale is NaN).
  void UpdateResidual(float* q, size_t n, const uint8_t* words, float scale);

  bool scaled_;
  std::vector<PushSigns> pushes_;     // AggregateBody's view of the pushes
  std::vector<uint64_t> push_words_;  // their sign words at the current position
  // Set by the *Deferred entry points for the duration of one call: the residual buffer holds
  // q with this correction pending (words == nullptr: a plain residual).
  bool deferred_ = false;
  const PushSigns* deferred_prev_ = nullptr;
};

// e <- q - C(q) in place, C(q) = ±prev.scale from prev's sign words (any ISA gives the same
// values); zeros when prev.scale is NaN.
void ApplyOnebitCorrection(float* q, size_t n, const OnebitCompressor::PushSigns& prev);

// Deferred error feedback for onebit (see the header comment): the state the engine and the
// servers keep for an onebit key on either side. Holds q and its pending correction between
// rounds; residual() materialises e (so it is logically const; the buffer is mutable).
// Compressing non-fp32 input, or through another compressor, materialises first and runs the
// compressor's CompressWithFeedback. Thread-safety: one thread at a time, like every state.
class OnebitResidualState final : public ErrorFeedback {
 public:
  explicit OnebitResidualState(size_t elements);

  size_t size() const override { return buf_.size(); }
  StatusOr<size_t> Compress(Compressor& compressor, ConstTensorView x, const CompressContext& ctx,
                            MutableByteSpan out) override;
  bool AppliesResidualDecay() const override { return true; }
  bool FusesServerRound(const Compressor& compressor) const override {
    return compressor.FusesServerRound(/*with_residual=*/true);
  }
  StatusOr<size_t> AggregateCompress(Compressor& compressor, Span<const ByteSpan> pushes,
                                     float scale, const CompressContext& ctx,
                                     MutableByteSpan out) override;
  Span<const float> residual() const override;
  Status Restore(Span<const float> saved) override;
  void Reset() override;

  // Whether a correction is pending (the buffer holds q, not e): for tests.
  bool deferred() const { return pending_; }

 private:
  // e = q - C(q) in the buffer, nothing pending.
  void Materialise() const;
  // Records the payload just written as the pending correction (nothing when its scale is NaN:
  // the compressor left zeros).
  void Defer(const uint8_t* payload);

  mutable AlignedBuffer<float> buf_;
  AlignedBuffer<uint64_t> words_;  // the pending sign words, ceil(n/64)
  float scale_ = 0.0f;             // and scale
  mutable bool pending_ = false;
};

}  // namespace bitpush::compressors
