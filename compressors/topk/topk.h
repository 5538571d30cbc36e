// topk: keeps the k elements of largest magnitude (exact top-k), drops the rest. Biased
// (delta-approximate with delta = k/n); meant to be used with error feedback.
//
// Body: the sparse format of compressors/sparse/sparse_format.h —
//   u32 k | k x int32 indices, strictly increasing | k x values in the payload dtype.
// k: ratio=R -> max(1, floor(R * n)); k=K -> min(K, n); n == 0 -> k = 0.
//
// Selection: by key = float bits & 0x7FFFFFFF, an exact integer order of |x|.
//  - Ties at the k-th key: the lowest indices win, so the result is a pure function of the
//    input (identical on every ISA level and every run).
//  - Non-finite values are kept: NaN keys rank above +inf, which ranks above every finite
//    value, so every NaN and inf of the tensor (up to k of them) is selected and shows up in
//    the decompressed tensor; AMP's overflow check on the pulled aggregate still fires.
//  - -0.0 and 0.0 have the same key (0).
//
// Error feedback: e <- q - C(q). For fp32 payloads the selected residuals are set to 0 (the
// paper's O(k) update: e <- q, then zero the k kept entries). For fp16 / bf16 payloads the
// stored value is round(q) and the residual keeps q - float(round(q)). The fp32 fast path
// forms q = g + e in the same pass that filters it.
// Non-finite values must not poison the residual (docs/errors.md): a kept element whose stored
// value is inf or NaN leaves residual 0, and if non-finite elements were left out (more than k
// of them) the whole residual is reset to 0 (AMP skips that step anyway).
//
// Algorithm (no heap, no full sort): estimate a threshold key t from a fixed, deterministic
// sample (256 blocks of 16 contiguous elements, one at a hashed offset in each of 256 equal
// strata) so that about 1.25 k + 4 sigma elements pass; one SIMD pass collects (index, key)
// of every element with key >= t, in index order; if fewer than k passed, lower t and repeat
// down to t = 1, which passes every nonzero element (a sample whose k-th key is 0 starts
// there: a mostly-zero tensor, such as the server's residual, never makes every element a
// candidate); if fewer than k elements are nonzero, the first zeros by index fill the rest. The
// exact k-th key T comes from a radix histogram of the candidate keys (top 13 bits) plus an
// nth_element inside T's bucket; one ordered walk then keeps every candidate with key > T and the
// first (k - #{key > T}) with key == T. The filter pass runs at about memory speed (AVX-512:
// compare into a mask, VPCOMPRESSD indices and keys; AVX2: movemask + permutation table).
//
// Server round (FusesServerRound, Algorithm 4): the pushes are sparse, so the aggregate is
// zero outside the union U of their indices and q = a + e equals e there. AggregateBody adds
// the aggregate into the residual at U only (merging the pushes' sorted index lists; at each
// index a = v_0 or +0, + v_w in rank order, * 1/n — the fp32 operations of the unfused path),
// then selects on e with the read-only filter: one read of e instead of a zeroed accumulator,
// an averaging pass and the fused add pass. Bit-identical to the unfused path (up to the sign
// of a zero residual entry untouched by any push, which is -0.0 only after a restore).
//
// Limits: at most kMaxSparseElements (2^31 - 1) elements (int32 wire indices); larger
// tensors are refused with InvalidArgument (MaxElements()).
//
// Thread-safety: see compressors/compressor.h (one thread per instance). Scratch buffers are
// members and are reused across calls.
#pragma once

#include <cstdint>
#include <vector>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "compressors/sparse/sparse_format.h"

namespace bitpush::compressors {

class TopkCompressor final : public CompressorBase {
 public:
  TopkCompressor(const v1::TopkParams& params, IsaLevel isa);

  // The k used for an n-element tensor.
  uint64_t KeepCount(uint64_t n) const { return size_.KeepCount(n); }
  // Filter passes the last selection made (1 unless the sampled threshold was too high).
  // Diagnostics and tests.
  int last_filter_passes() const { return last_filter_passes_; }
  // Elements the last selection's final filter pass kept as candidates (diagnostics, tests).
  size_t last_candidates() const { return last_candidates_; }

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
  Status ValidateBody(ByteSpan body, size_t n, DType dtype) override;
  Status DecodeBodyToTensor(ByteSpan body, size_t n, DType dtype, float* out) override;
  // Algorithm 4 only: without a residual the server takes the unfused path.
  bool FusesServerRound(bool with_residual) const override { return with_residual; }
  size_t AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype, float mult,
                       float* residual, const CompressContext& ctx, uint8_t* body) override;

 private:
  // One element of some push in a fused server round: sorted by (index, rank).
  struct PushEntry {
    uint32_t index;
    uint32_t rank;
    float value;
  };

  // Selects the top-k of q into candidates_[0..k), ascending. With g == nullptr, q is `data`;
  // otherwise q = g + data, and data receives q (the fused error-feedback pass).
  const uint32_t* Select(const float* g, float* data, size_t n, size_t k);
  // Whether one of the first `count` candidates' keys is a NaN / inf (Select's input check).
  bool NonFiniteCandidate(size_t count) const;
  // The selection when fewer than k elements are nonzero: the `count` candidates (every
  // nonzero element) plus the first k - count zero elements, ascending, in work_.
  const uint32_t* SelectWithZeros(size_t n, size_t k, size_t count);
  // Threshold key for the first filter pass, from the sample (0 = keep everything).
  uint32_t FirstThreshold(const float* g, const float* data, size_t n, size_t k);
  // A lower threshold after a pass that kept fewer than k (0 = keep everything).
  uint32_t LowerThreshold(uint32_t t);
  // One filter pass over [0, n) into candidates_ / candidate_keys_; returns the count.
  size_t FilterPass(const float* g, float* data, size_t n, uint32_t t, bool fused);
  // The k-th largest of keys[0..count), 1 <= k <= count; *above = how many keys exceed it.
  uint32_t KthLargestKey(const uint32_t* keys, size_t count, size_t k, size_t* above);
  void SetSampleBlocks(size_t n);

  SparseSize size_;
  AlignedBuffer<uint32_t> candidates_;      // candidate indices, then the selected ones
  AlignedBuffer<uint32_t> candidate_keys_;  // their keys
  std::vector<uint32_t> hist_;              // radix histogram of the candidate keys
  std::vector<uint32_t> work_;           // keys of the k-th key's bucket, for nth_element; or the
                                         // selection of SelectWithZeros
  std::vector<uint32_t> sample_;         // sampled keys
  std::vector<uint32_t> sample_blocks_;  // start of each sampled block, for sample_n_
  std::vector<PushEntry> entries_;       // AggregateBody's merged pushes (> 2 pushes)
  size_t sample_n_ = 0;
  size_t sample_rank_ = 0;  // 1-based rank in sample_ of the current threshold
  int last_filter_passes_ = 0;
  size_t last_candidates_ = 0;
  bool nonfinite_left_out_ = false;  // the last selection left out a NaN / inf element
};

}  // namespace bitpush::compressors
