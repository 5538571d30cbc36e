// randomk: keeps k coordinates drawn uniformly at random WITHOUT replacement.
//   unbiased=true : kept values are scaled by n/k, so E[C(x)] = x (an omega-compressor with
//                   omega = n/k - 1; for use without error feedback).
//   unbiased=false: kept values are stored as they are (biased; pair it with error feedback).
//
// Body: the sparse format of compressors/sparse/sparse_format.h —
//   u32 k | k x int32 indices, strictly increasing | k x values in the payload dtype.
// k: ratio=R -> max(1, floor(R * n)); k=K -> min(K, n); n == 0 -> k = 0.
//
// Randomness: the index set is a pure function of (seed, ctx.worker, ctx.key, ctx.round, n,
// k). The stream is StreamKey(seed, worker, key, round); draw j uses CounterRandom64(stream, j)
// through UniformBelow, in Robert Floyd's sampling algorithm (exactly k draws, each over a
// growing range [0, n-k+j]) over an n-bit membership bitmap; the indices are then read from
// the bitmap in ascending order. A rerun picks the same coordinates on every ISA level; two
// workers (and the server, kServerStream) pick independent ones, so the average of unbiased
// pushes has the variance of independent samples.
//
// Non-finite inputs (docs/errors.md): a sparse random sample would silently drop a NaN or inf
// it did not pick, hiding an fp16 overflow from AMP. So randomk scans the whole tensor (SIMD;
// fused into the q = g + e pass on the fp32 error-feedback path) and, if any element is NaN
// or +-inf, stores NaN as every kept value: the pulled aggregate then carries NaN and AMP
// skips the step. With error feedback the residual is then reset to 0 (it would otherwise
// hold the non-finite q forever).
//
// Error feedback: e <- q - C(q), where C(q) is exactly what the decoder produces: e = q
// everywhere except at the kept indices, where e = q - decoded(stored value) (0 for unscaled
// fp32; q - (n/k) q rounded for unbiased; the rounding error for fp16 / bf16; 0 where the
// stored value overflowed to inf). The update costs O(k) beyond the q = g + e pass.
//
// Limits: at most kMaxSparseElements (2^31 - 1) elements (int32 wire indices); larger
// tensors are refused with InvalidArgument (MaxElements()).
//
// Thread-safety: see compressors/compressor.h (one thread per instance). The bitmap and index
// buffers are members and are reused across calls.
#pragma once

#include <cstdint>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "compressors/sparse/sparse_format.h"

namespace bitpush::compressors {

class RandomkCompressor final : public CompressorBase {
 public:
  RandomkCompressor(const v1::RandomkParams& params, IsaLevel isa);

  // The k used for an n-element tensor.
  uint64_t KeepCount(uint64_t n) const { return size_.KeepCount(n); }

  // The CompressorBase hooks, public so tests can drive each one directly (e.g. the generic
  // EncodeBodyWithFeedback on fp32, which CompressorBase never picks for fp32 input).
  size_t MaxBodyBytes(size_t n, DType dtype) const override;
  uint64_t MaxElements() const override { return kMaxSparseElements; }
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  size_t EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n, const CompressContext& ctx,
                                   uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;

 private:
  // Draws the k indices for (ctx, n) into indices_[0..k), ascending.
  const uint32_t* Sample(const CompressContext& ctx, size_t n, size_t k);
  // Writes the body for the kept values of q. With residual == true, q is the error buffer:
  // its kept entries become q - decoded value.
  size_t Encode(float* q, size_t n, DType dtype, const CompressContext& ctx, bool all_finite,
                bool residual, uint8_t* body);

  SparseSize size_;
  bool unbiased_;
  uint64_t seed_;
  AlignedBuffer<uint64_t> bitmap_;   // n bits, membership of the sample
  AlignedBuffer<uint32_t> indices_;  // the k sampled indices, ascending
};

// Kernels (exposed for tests): true iff no element is NaN or +-inf.
bool RandomkAllFinite(const float* x, size_t n, IsaLevel isa);
// e[i] += g[i]; true iff no resulting element is NaN or +-inf.
bool RandomkAddAllFinite(const float* g, float* e, size_t n, IsaLevel isa);

}  // namespace bitpush::compressors
