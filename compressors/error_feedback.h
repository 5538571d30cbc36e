// Error feedback as a policy object beside the compressor (paper 001 Algorithms 3 and 4).
//
// ErrorFeedback is the state one side keeps for one partition between rounds, and the step
// that compresses through it. Each method's descriptor supplies the factory of its state
// (MethodKernels::new_error_feedback, compressors/method.h; compressors/registry.h
// CreateErrorFeedback), so a method with its own kind of error feedback brings it in its
// folder.
//
// ResidualState is vanilla error feedback, the state every method keeps: an fp32 residual
// e, updated through the compressor's fused kernels: q = x + e; send C(q); e <- q - C(q).
//   - worker residual: x is the worker's (locally reduced) gradient partition;
//   - server residual: x is the aggregate of the decompressed pushes (Algorithm 4's ẽ);
// the update is the same on both sides. The policy (none / worker / server / both) says
// which sides keep a state for a compressed key.
//
// Residuals are fp32, zero-initialised, and can be saved and restored with checkpoints.
//
// Ownership and thread-safety: one state per (partition, side), owned by whoever owns the
// partition's compressor; used by one thread at a time.
#pragma once

#include <cstddef>
#include <memory>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "compressors/method.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

inline bool WorkerKeepsResidual(v1::ErrorFeedbackPolicy p) {
  return p == v1::ERROR_FEEDBACK_WORKER || p == v1::ERROR_FEEDBACK_BOTH;
}
inline bool ServerKeepsResidual(v1::ErrorFeedbackPolicy p) {
  return p == v1::ERROR_FEEDBACK_SERVER || p == v1::ERROR_FEEDBACK_BOTH;
}

class ErrorFeedback {
 public:
  virtual ~ErrorFeedback() = default;

  // Elements of the partition.
  virtual size_t size() const = 0;

  // Compresses x through the state into `out` (payload = C(x + e) for vanilla error feedback)
  // and updates the state. x.count() must equal size().
  virtual StatusOr<size_t> Compress(Compressor& compressor, ConstTensorView x,
                                    const CompressContext& ctx, MutableByteSpan out) = 0;

  // Whether Compress honours CompressContext::residual_decay (the worker residual's decay,
  // CLAN's error_feedback_decay): the vanilla residual states do; a method's own kind of
  // state (loco, separate, binsgdm) does not, and the engine refuses a decay for it.
  virtual bool AppliesResidualDecay() const { return false; }

  // Whether the server's fused round (Compressor::AggregateCompress) can run with this state.
  virtual bool FusesServerRound(const Compressor& compressor) const = 0;

  // The server's fused round with this state: pushes validated, size() > 0, and
  // FusesServerRound(compressor).
  virtual StatusOr<size_t> AggregateCompress(Compressor& compressor, Span<const ByteSpan> pushes,
                                             float scale, const CompressContext& ctx,
                                             MutableByteSpan out) = 0;

  // Worker side: decodes the server's reply `payload` into `out` (the round ctx's aggregate,
  // which the worker hands to its optimizer). States whose update needs the aggregate override
  // it (separate: the residual against the global reconstruction, paper 003 Algorithm 1,
  // fused into the decode). Default: compressor.Decompress(payload, out), the state untouched.
  virtual Status DecompressReply(Compressor& compressor, ByteSpan payload,
                                 const CompressContext& ctx, TensorView out) {
    (void)ctx;
    return compressor.Decompress(payload, out);
  }

  // Adds what this state reports since the last call (error and gradient norms:
  // CompressorTelemetry) to `into`. Default: nothing.
  virtual void TakeTelemetry(CompressorTelemetry* into) { (void)into; }

  // The state as fp32 values, for checkpoints and tests: state_size() of them (size() for a
  // residual; a state that keeps more per element — binsgdm's moments — says so).
  virtual Span<const float> residual() const = 0;
  virtual size_t state_size() const { return size(); }
  // Replaces the state with values residual() gave earlier (checkpoint restore); the size
  // must match (state_size()).
  virtual Status Restore(Span<const float> saved) = 0;
  virtual void Reset() = 0;
};

// Vanilla error feedback: the fp32 residual e.
class ResidualState final : public ErrorFeedback {
 public:
  explicit ResidualState(size_t elements) : residual_(elements) { residual_.zero(); }

  size_t size() const override { return residual_.size(); }

  // Compresses x + e into `out` and leaves e = (x + e) - C(x + e). x.count() must equal size().
  StatusOr<size_t> Compress(Compressor& compressor, ConstTensorView x, const CompressContext& ctx,
                            MutableByteSpan out) override {
    return compressor.CompressWithFeedback(x, residual_.span(), ctx, out);
  }

  bool AppliesResidualDecay() const override { return true; }
  bool FusesServerRound(const Compressor& compressor) const override {
    return compressor.FusesServerRound(/*with_residual=*/true);
  }

  // The server's fused round (Compressor::AggregateCompress) with this residual: pushes
  // validated, n == size() > 0.
  StatusOr<size_t> AggregateCompress(Compressor& compressor, Span<const ByteSpan> pushes,
                                     float scale, const CompressContext& ctx,
                                     MutableByteSpan out) override {
    return compressor.AggregateCompress(pushes, residual_.size(), scale, residual_.data(), ctx,
                                        out);
  }

  Span<const float> residual() const override { return residual_.span(); }

  // Replaces the residual (checkpoint restore); the size must match.
  Status Restore(Span<const float> saved) override;
  void Reset() override { residual_.zero(); }

 private:
  AlignedBuffer<float> residual_;
};

// The error-feedback factory of every method that keeps vanilla error feedback
// (MethodKernels::new_error_feedback): a zeroed ResidualState of `elements`, on either side.
std::unique_ptr<ErrorFeedback> NewResidualState(const v1::CompressorConfig& config,
                                                ErrorFeedbackSide side, size_t elements);

}  // namespace bitpush::compressors
