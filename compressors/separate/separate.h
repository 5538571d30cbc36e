// SEPARATE (paper 003): a common Gaussian random projection (docs/separate.md; the body in
// docs/wire-format.md "separate (id 10)").
//
// SeparateCompressor is the projection. A partition of n elements is cut into blocks of
// `block` elements (the last one d_l <= block); block j is projected onto m_j Gaussian
// directions, p_j = Xi_j h_j, with m = ceil(block / ratio) for a full block and
// m_l = max(1, ceil(d_l m / block)) for the last, and decoded as the unbiased reconstruction
// h~_j = (1 / m_j) Xi_j^T p_j. Xi_j is regenerated from the stream the body carries
// (separate_kernels.h), a function of (seed, key, round) common to every worker:
//   stream = StreamKey(seed, kCommonStream, key, round).
// The map is linear, so servers sum the pushes' projection vectors (AggregateCompress: the
// reply is scale x the rank-ordered sum) and never decode; every worker then reconstructs the
// same average.
// CompressWithFeedback is vanilla error feedback (q = x + e; e <- q - C(q)) for the generic
// contract; the method's own error feedback is SeparateState.
//
// SeparateState is the worker's moving-average error e (paper 003 Algorithm 1, global
// residual), one per partition; per round k (ctx.round), with (a_old, a_new) = (beta, 1 - beta)
// (ema=stable) or (1 - beta, beta) (ema=printed):
//   push  (Compress):         h = g + e;  send P(h);  e <- a_old e + a_new h
//   reply (DecompressReply):  out = h~ (the reconstruction of the averaged projections);
//                             e <- e - a_new h~
// so that after the round e = a_old e + a_new (h - h~). When reset > 0 and k % reset == 0, e
// is zeroed at the push and the reply leaves it alone. A non-finite gradient reaches the
// projections (and so every worker's output) and zeroes the state (docs/errors.md).
//
// Body (little-endian): u64 stream | u32 block | u32 m | f32 p[sum_j m_j], blocks in order.
//
// Thread-safety: one thread per instance (compressors/compressor.h); a SeparateState is used
// with one SeparateCompressor by the thread that owns the partition.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

class SeparateState;

// The stream owner shared by every worker (the projection must be common): not a rank, and
// not kServerStream.
inline constexpr uint32_t kCommonStream = 0xFFFFFFFEu;

class SeparateCompressor final : public CompressorBase {
 public:
  static constexpr size_t kBodyHeaderBytes = 16;

  // params must be canonical (separate_spec.cc).
  SeparateCompressor(const v1::SeparateParams& params, IsaLevel isa);

  const v1::SeparateParams& params() const { return params_; }
  uint32_t block() const { return block_; }
  // Projections of a full block.
  uint32_t rows() const { return m_; }

  // Projections of a partition of n elements cut into blocks of `block` with m per full block.
  static uint64_t Projections(uint64_t n, uint64_t block, uint64_t m);
  // The common stream of (key, round).
  uint64_t StreamFor(const CompressContext& ctx) const;

  // The push through `state` (SeparateState::Compress).
  StatusOr<size_t> CompressWithState(ConstTensorView input, SeparateState& state,
                                     const CompressContext& ctx, MutableByteSpan out);
  // The reply through `state` (SeparateState::DecompressReply).
  Status DecompressWithState(ByteSpan payload, SeparateState& state, const CompressContext& ctx,
                             TensorView out);

  bool FusesServerRound(bool with_residual) const override { return !with_residual; }

 protected:
  size_t MaxBodyBytes(size_t n, DType dtype) const override;
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;
  Status ValidateBody(ByteSpan body, size_t n, DType dtype) override;
  Status ValidateAggregate(const ByteSpan* bodies, size_t count, size_t n) override;
  size_t AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype, float scale,
                       float* residual, const CompressContext& ctx, uint8_t* body) override;

 private:
  struct Layout {
    uint64_t stream = 0;
    uint32_t block = 1;
    uint32_t m = 1;
  };
  // Writes the body header and the projections of x; returns the body size.
  size_t Project(const float* x, size_t n, uint64_t stream, uint8_t* body);
  // Reconstruction of block j (first element `first`, d elements) of a validated body into
  // out[0..d).
  void ReconstructBlockOf(const uint8_t* body, const Layout& layout, size_t j, size_t d,
                          float* out);
  Status Validate(ByteSpan body, size_t n, Layout* layout) const;
  // Grows the scratch to at least d block values and m projections (allocated on first use:
  // a partition smaller than the block needs less).
  void Reserve(size_t d, size_t m);

  v1::SeparateParams params_;
  uint32_t block_;
  uint32_t m_;
  AlignedBuffer<float> h_;  // one block: h (push) or h~ (reply)
  AlignedBuffer<float> p_;  // one block's projections
};

class SeparateState final : public ErrorFeedback {
 public:
  SeparateState(const v1::SeparateParams& params, size_t elements);

  size_t size() const override { return e_.size(); }
  StatusOr<size_t> Compress(Compressor& compressor, ConstTensorView x, const CompressContext& ctx,
                            MutableByteSpan out) override;
  bool FusesServerRound(const Compressor&) const override { return false; }
  StatusOr<size_t> AggregateCompress(Compressor& compressor, Span<const ByteSpan> pushes,
                                     float scale, const CompressContext& ctx,
                                     MutableByteSpan out) override;
  Status DecompressReply(Compressor& compressor, ByteSpan payload, const CompressContext& ctx,
                         TensorView out) override;
  void TakeTelemetry(CompressorTelemetry* into) override;
  Span<const float> residual() const override { return e_.span(); }
  Status Restore(Span<const float> saved) override;
  void Reset() override;

  // The weights of the moving average: e <- a_old e + a_new (h - h~).
  float a_old() const { return a_old_; }
  float a_new() const { return a_new_; }

 private:
  friend class SeparateCompressor;

  AlignedBuffer<float> e_;
  float a_old_;
  float a_new_;
  uint64_t reset_;
  // The push this state's next reply belongs to.
  bool pending_ = false;
  bool pending_reset_ = false;
  uint64_t pending_round_ = 0;
  double gradient_sq_ = 0;
  double error_sq_ = 0;
  bool reported_ = false;
  bool input_non_finite_ = false;  // the last compression saw a NaN / inf in h or its projections
};

}  // namespace bitpush::compressors
