// BinSGDM (paper 004, Algorithm 1; digest shared/papers/004-binsgdm.notes.md): one-bit
// stochastic binarisation of the whole optimizer update, no scale. The spec half, parameters and
// error-feedback policies are in binsgdm_spec.cc; the element kernels, their exact formulas and
// the single-process reference of the algorithm in optimizers/binsgdm.h; the body layout in
// docs/wire-format.md "binsgdm (id 11)".
//
//   worker (BinsgdmState, the worker's error-feedback state of a partition: m, b, e, fp32):
//     m = beta m + (1 - beta) g;  b = beta b + (1 - beta) |g|;  y = m / (b + eps) + e;
//     push u = Q(y) (1 bit per element);  e = y - u
//   server (compressed-domain round, AggregateCompress; residual e_bar where the key keeps one):
//     a = (1/n) sum_w u_w, counted from the bits;  y = a + e_bar;  reply Q(y);  e_bar = y - Q(y)
//   worker: decodes the reply to exactly +-1 (the optimizer applies x <- x - lr u_bar).
// Q(y) = +1 with probability clamp((y + 1) / 2, 0, 1), else -1, from the counter-based stream
// StreamKey(seed, ctx.worker, ctx.key, ctx.round) (optimizers/binsgdm.h BinsgdmBit).
//
// As a Compressor (the interface's own operations, used by tests, tools and the server):
//   Compress(x) = Q(x); CompressWithFeedback is vanilla error feedback (q = x + e, push Q(q),
//   e = q - Q(q)); Decompress gives exactly +1.0 / -1.0 in the payload's dtype;
//   AggregateCompress is the server's round above, bit for bit the unfused sequence (decode,
//   sum in rank order, scale, CompressWithFeedback / Compress: the sums of +-1 are exact
//   integers, so a = float(2c - k) * scale equals them), for both server-residual settings.
//
// Body: ceil(n/8) bytes, bit i of byte i/8 (LSB first) is element i, 1 = +1; the padding bits
// of the last byte are 0. No scale, no header of its own: the payload header carries n and the
// dtype. Decoders check the exact length and the padding (DataLoss naming the problem).
//
// Non-finite input: an element whose y (or b) is not finite restarts (m = b = 0, y = 0, so it
// pushes a fair coin and e = -u); the format has no way to carry NaN/inf, so a non-finite
// gradient does not reach the decoded output (docs/errors.md).
//
// Thread-safety: one thread per instance (compressors/compressor.h); states likewise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "optimizers/binsgdm.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

class BinsgdmCompressor final : public CompressorBase {
 public:
  // params must be canonical (binsgdm_spec.cc fills and range-checks them).
  BinsgdmCompressor(const v1::BinsgdmParams& params, IsaLevel isa);

  static size_t BodyBytes(size_t n) { return (n + 7) / 8; }

  const optimizers::BinsgdmHyper& hyper() const { return hyper_; }
  // The random stream of a compression under ctx.
  uint64_t Stream(const CompressContext& ctx) const;

  // The worker step of BinsgdmState: gradient `g` (any dtype; fp16 / bf16 converted exactly)
  // through the moments m, b and the residual e (g.count() floats each, updated), payload to
  // `out`. The checks of CompressWithFeedback (element count, capacity, store_as).
  StatusOr<size_t> CompressStep(ConstTensorView g, float* m, float* b, float* e,
                                const CompressContext& ctx, MutableByteSpan out);

  bool FusesServerRound(bool) const override { return true; }

 protected:
  size_t MaxBodyBytes(size_t n, DType) const override { return BodyBytes(n); }
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  size_t EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n, const CompressContext& ctx,
                                   uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;
  // Decompress into an fp32 tensor: the same values, with non-temporal stores for large n.
  Status DecodeBodyToTensor(ByteSpan body, size_t n, DType dtype, float* out) override;
  Status ValidateBody(ByteSpan body, size_t n, DType dtype) override;
  size_t AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype, float scale,
                       float* residual, const CompressContext& ctx, uint8_t* body) override;

 private:
  uint64_t seed_;
  optimizers::BinsgdmHyper hyper_;
  std::vector<const uint8_t*> push_bits_;  // AggregateBody's view of the pushes
};

// The worker's error-feedback state of one partition: BinSGDM's m, b and e (fp32, zeros at
// first), updated by Compress through the fused worker step. residual() is the whole state,
// m then b then e (state_size() = 3 size()); Restore takes the same. Compress needs the
// partition's BinsgdmCompressor (FailedPrecondition otherwise). It is a worker-side state: the
// server keeps a plain ResidualState (e_bar), so FusesServerRound is false here.
class BinsgdmState final : public ErrorFeedback {
 public:
  explicit BinsgdmState(size_t elements);

  size_t size() const override { return n_; }
  size_t state_size() const override { return 3 * n_; }
  StatusOr<size_t> Compress(Compressor& compressor, ConstTensorView x, const CompressContext& ctx,
                            MutableByteSpan out) override;
  bool FusesServerRound(const Compressor&) const override { return false; }
  StatusOr<size_t> AggregateCompress(Compressor& compressor, Span<const ByteSpan> pushes,
                                     float scale, const CompressContext& ctx,
                                     MutableByteSpan out) override;
  Span<const float> residual() const override { return state_.span(); }
  Status Restore(Span<const float> saved) override;
  void Reset() override { state_.zero(); }

  // The parts of the state (tests).
  Span<const float> m() const { return {state_.data(), n_}; }
  Span<const float> b() const { return {state_.data() + n_, n_}; }
  Span<const float> e() const { return {state_.data() + 2 * n_, n_}; }

 private:
  size_t n_;
  AlignedBuffer<float> state_;  // m | b | e
};

}  // namespace bitpush::compressors
