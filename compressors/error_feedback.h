// Error feedback as a policy beside the compressor (paper 001 Algorithms 3 and 4).
//
// ResidualState holds the residual e of one partition on one side and applies the fused
// update through the compressor: q = x + e; send C(q); e <- q - C(q).
//   - worker residual: x is the worker's (locally reduced) gradient partition;
//   - server residual: x is the aggregate of the decompressed pushes (Algorithm 4's ẽ);
// the update is the same on both sides. The policy (none / worker / server / both) says
// which sides keep a ResidualState for a compressed key.
//
// Residuals are fp32, zero-initialised, and can be saved and restored with checkpoints.
//
// Ownership and thread-safety: one ResidualState per (partition, side), owned by whoever owns
// the partition's compressor; used by one thread at a time.
#pragma once

#include <cstddef>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

inline bool WorkerKeepsResidual(v1::ErrorFeedbackPolicy p) {
  return p == v1::ERROR_FEEDBACK_WORKER || p == v1::ERROR_FEEDBACK_BOTH;
}
inline bool ServerKeepsResidual(v1::ErrorFeedbackPolicy p) {
  return p == v1::ERROR_FEEDBACK_SERVER || p == v1::ERROR_FEEDBACK_BOTH;
}

class ResidualState {
 public:
  explicit ResidualState(size_t elements) : residual_(elements) { residual_.zero(); }

  size_t size() const { return residual_.size(); }

  // Compresses x + e into `out` and leaves e = (x + e) - C(x + e). x.count() must equal size().
  StatusOr<size_t> Compress(Compressor& compressor, ConstTensorView x, const CompressContext& ctx,
                            MutableByteSpan out) {
    return compressor.CompressWithFeedback(x, residual_.span(), ctx, out);
  }

  // The server's fused round (Compressor::AggregateCompress) with this residual: pushes
  // validated, n == size() > 0.
  StatusOr<size_t> AggregateCompress(Compressor& compressor, Span<const ByteSpan> pushes,
                                     float scale, const CompressContext& ctx,
                                     MutableByteSpan out) {
    return compressor.AggregateCompress(pushes, residual_.size(), scale, residual_.data(), ctx,
                                        out);
  }

  Span<const float> residual() const { return residual_.span(); }

  // Replaces the residual (checkpoint restore); the size must match.
  Status Restore(Span<const float> saved);
  void Reset() { residual_.zero(); }

 private:
  AlignedBuffer<float> residual_;
};

}  // namespace bitpush::compressors
