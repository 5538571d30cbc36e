// Weight pulls in difference-against-receiver form (paper 002's qWD, 002-sdp4bit.notes.md §3):
// the sender (a server that owns a tensor's master weights) keeps the mirror w̃ of what every
// receiver (worker) holds. Each round it sends C(w − w̃), and both sides add the same decoded
// D(C(w − w̃)) to their copy. Receivers and the mirror stay bit-identical, and what C loses is
// carried into the next difference (w − w̃ keeps it: the EF21 mechanism), so any δ-compressor
// works here, biased ones included. SDP4Bit's qWD is C = `sdp4bit:hadamard=off,group=2048`
// (INT4, stochastic rounding once at the sender).
//
// The raw-weight form (send C(w), receivers set w = D(C(w))) is only sound for an unbiased or
// lossless C: with a biased one SGD can stall forever (the paper's Counterexample 4.1).
// CheckRawWeightPull refuses it.
//
// PullCodec is what either half needs from a compressor; CompressorPullCodec adapts any
// registry Compressor (compressors/compressor.h).
//
// Thread-safety: none; a MirrorPull belongs to the thread serving its tensor, a receiver's
// ApplyMirrorPull call to the thread that owns its weights.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/span.h"
#include "common/status.h"
#include "compressors/compressor.h"
#include "compressors/spec_registry.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

class PullCodec {
 public:
  virtual ~PullCodec() = default;
  // The largest payload of n values.
  virtual size_t MaxBytes(size_t n) const = 0;
  // Encodes v into out; the payload's size.
  virtual StatusOr<size_t> Encode(Span<const float> v, const CompressContext& ctx,
                                  MutableByteSpan out) = 0;
  // acc += D(payload), after validating it against acc.size() values (acc unchanged on error).
  virtual Status DecodeAdd(ByteSpan payload, Span<float> acc) = 0;
};

// A registry compressor as a PullCodec (Compress / DecompressAdd of fp32 values). The
// compressor must outlive it.
class CompressorPullCodec final : public PullCodec {
 public:
  explicit CompressorPullCodec(Compressor* compressor) : c_(compressor) {}
  size_t MaxBytes(size_t n) const override;
  StatusOr<size_t> Encode(Span<const float> v, const CompressContext& ctx,
                          MutableByteSpan out) override;
  Status DecodeAdd(ByteSpan payload, Span<float> acc) override;

 private:
  Compressor* c_;
};

// The sender's half of one tensor.
class MirrorPull {
 public:
  // The mirror starts as `initial`: what every receiver holds before the first pull (the
  // weights installed from the first worker or a checkpoint).
  MirrorPull(PullCodec* codec, Span<const float> initial);

  // Encodes C(w − w̃) into out (at least codec.MaxBytes(size()) bytes) and adds its decoding to
  // the mirror; the payload's size. InvalidArgument for a size mismatch; mirror unchanged on
  // any error.
  StatusOr<size_t> Encode(Span<const float> w, const CompressContext& ctx, MutableByteSpan out);

  size_t size() const { return mirror_.size(); }
  Span<const float> mirror() const { return {mirror_.data(), mirror_.size()}; }
  // Replaces the mirror (a checkpoint's); InvalidArgument for another size.
  Status SetMirror(Span<const float> mirror);

 private:
  PullCodec* codec_;
  std::vector<float> mirror_;
  std::vector<float> diff_;  // w − w̃
};

// The receiver's half: w += D(payload), by the codec's DecodeAdd — the call the sender makes on
// its mirror, so a receiver that held the mirror's bits holds them again. The payload is
// validated first; w is unchanged on error.
Status ApplyMirrorPull(PullCodec& codec, ByteSpan payload, Span<float> w);

// CheckRawWeightPull (compressors/spec_registry.h) refuses the raw form for biased methods.

}  // namespace bitpush::compressors
