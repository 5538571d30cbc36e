// Compressor: the interface every gradient compressor implements, and CompressorBase, the
// shared implementation of headers, validation and dtype handling that concrete compressors
// derive from.
//
// Operations (n elements, any DType; payload formats in docs/wire-format.md):
//   MaxCompressedBytes(n, dtype)   upper bound on the payload, header included
//   Compress                       payload = C(x)
//   CompressWithFeedback           q = x + e; payload = C(q); e <- q - C(q)   (e is fp32)
//   Decompress                     out = C(x), in the payload's dtype
//   DecompressAdd                  acc += C(x), acc fp32 (the server's fused path)
//   DecompressToFloat              out = C(x) as fp32 (the server's first push of a round)
//   ValidatePayload                the checks of Decompress, without decoding (server fast path)
//   AggregateCompress              the server's whole round in one call, where the compressor
//                                  fuses it (FusesServerRound): a = scale * sum_w C(x_w);
//                                  payload = C(a + e), e <- (a + e) - C(a + e)  (or C(a)),
//                                  in fp32 or CompressContext::store_as
// C(q) is, by definition, exactly what Decompress returns, so error feedback telescopes:
// sum_t C(q_t) + e_T = sum_t x_t up to fp32 rounding of the additions.
//
// Decoders never trust a payload: header, body length, indices and levels are all checked
// against the buffer and the expected element count, and the destination is not modified
// unless the call returns OK (a bad push cannot corrupt a server's accumulator).
//
// Ownership and thread-safety: a Compressor instance holds scratch buffers and is used by one
// thread at a time (in bitpush: one instance per partition, owned by the partition's
// pipeline stage or the key's server engine thread). Different instances are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "common/aligned_buffer.h"
#include "common/cpu_features.h"
#include "common/span.h"
#include "common/status.h"
#include "common/tensor_view.h"
#include "compressors/payload.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

// Identifies one compression call; randomized compressors derive their random stream from
// (params.seed, worker, key, round) (common/counter_rng.h): a rerun draws the same numbers,
// two workers compressing the same key and round draw independent ones.
struct CompressContext {
  uint64_t key = 0;
  uint64_t round = 0;
  // Whose stream: the pushing worker's rank, or kServerStream for a server's aggregate.
  uint32_t worker = 0;
  // The payload's dtype when the input is fp32 and should travel narrower (the server's
  // aggregate of an fp16 / bf16 key is summed in fp32 and replied in the key's dtype): values
  // the format stores are rounded to it once, and with error feedback the rounding error stays
  // in the residual. Unset: the input's dtype. Set on a non-fp32 input to anything but that
  // input's dtype: InvalidArgument.
  std::optional<DType> store_as = std::nullopt;
  // With error feedback: the residual is multiplied by this before it is added to the input,
  // q = x + residual_decay * e (CLAN's error_feedback_decay γ, set per tensor on the worker:
  // Client::SetErrorFeedbackDecay). In [0, 1]; 1 (the default) leaves e as it is. A
  // compressor whose fused fp32 path forms q itself applies it there (FusesResidualDecay:
  // onebit); for every other one CompressWithFeedback scales e in place first. Either way the
  // values are those of scaling the residual in fp32 and then adding, each rounded.
  float residual_decay = 1.0f;
};

// What a quantising method reports about its own encodings (loco), or an error-feedback state
// about itself (separate: ErrorFeedback::TakeTelemetry), since the last TakeTelemetry; zero
// for methods that report nothing.
struct CompressorTelemetry {
  uint64_t values = 0;           // values quantised
  uint64_t saturated = 0;        // of which clamped to the code range
  uint64_t error_values = 0;     // error-state values re-quantised (loco's int8 error)
  uint64_t error_saturated = 0;  // of which clamped
  // The squared L2 norm of the error state after the last compression through it (a level,
  // not a sum); meaningful where error_reported.
  double error_sq = 0;
  bool error_reported = false;
  // The squared L2 norm of the gradient that last compression took (a level; meaningful
  // where gradient_reported): with error_sq, the ratio ||e|| / ||g|| (separate).
  double gradient_sq = 0;
  bool gradient_reported = false;
  // Whether the compressions since the last TakeTelemetry read every input value on a path
  // that shows a NaN / inf (CompressorBase::NoteInputCheck: onebit's scale, sdp4bit's group
  // scales), and if so whether one was there.
  // Where input_checked is false the worker engine makes its own pass (FirstNonFinite).
  bool input_checked = false;
  bool input_non_finite = false;
};

struct CompressorOptions {
  // SIMD level of the kernels. Default: the best this CPU supports. Creating a compressor with
  // a level the CPU lacks fails with FailedPrecondition.
  IsaLevel isa = BestIsaLevel();
};

class Compressor {
 public:
  virtual ~Compressor() = default;

  virtual v1::CompressorId id() const = 0;
  virtual IsaLevel isa() const = 0;

  virtual size_t MaxCompressedBytes(size_t n, DType dtype) const = 0;

  // Returns the number of bytes written to `out`. `out.size()` must be at least
  // MaxCompressedBytes(input.count(), input.dtype()) (InvalidArgument otherwise).
  virtual StatusOr<size_t> Compress(ConstTensorView input, const CompressContext& ctx,
                                    MutableByteSpan out) = 0;

  // residual.size() must equal input.count().
  virtual StatusOr<size_t> CompressWithFeedback(ConstTensorView input, Span<float> residual,
                                                const CompressContext& ctx,
                                                MutableByteSpan out) = 0;

  // When Compress(input, ctx) would be a payload header followed by the input's own bytes
  // (`none`), writes that header (kPayloadHeaderBytes) to `header` and returns true: a sender
  // may send the header and the input's bytes as one frame (transport::Message::glue_next)
  // instead of compressing them into a copy. False otherwise (the default).
  virtual bool RawBodyHeader(ConstTensorView /*input*/, const CompressContext& /*ctx*/,
                             uint8_t* /*header*/) const {
    return false;
  }

  // Adds what this instance counted since the last call to `into` (see CompressorTelemetry)
  // and starts counting afresh. Default: nothing to report (CompressorBase: its input checks).
  virtual void TakeTelemetry(CompressorTelemetry* /*into*/) {}

  // out.count() must equal the payload's element count and out.dtype() its dtype.
  virtual Status Decompress(ByteSpan payload, TensorView out) = 0;

  // accumulator.size() must equal the payload's element count.
  virtual Status DecompressAdd(ByteSpan payload, Span<float> accumulator) = 0;

  // out = C(x) as fp32, whatever the payload's dtype (the server's "copy first" of a round:
  // no zeroing pass). out.size() must equal the payload's element count. Same values as
  // DecompressAdd into zeros, except that a -0.0 stays -0.0.
  virtual Status DecompressToFloat(ByteSpan payload, Span<float> out) = 0;

  // ---- server fast path (optional; KeyState uses it where FusesServerRound says so) ----

  // Whether AggregateCompress is implemented, for a round with (Algorithm 4) or without
  // (Algorithm 3) a server residual.
  virtual bool FusesServerRound(bool with_residual) const = 0;

  // Every check Decompress makes on a payload of n elements (header, body length, indices,
  // levels, padding), without decoding it: OK iff DecompressAdd would succeed.
  virtual Status ValidatePayload(ByteSpan payload, size_t n) = 0;

  // The server's round in one pass where possible, bit for bit what the unfused sequence
  // gives:  acc = DecompressToFloat(pushes[0]); DecompressAdd(pushes[w]) for w = 1, 2, ... in
  // order; acc[i] *= scale when scale != 1; then CompressWithFeedback(acc, residual) (residual
  // != nullptr: n floats) or Compress(acc) (nullptr) — with the float32 aggregate as input —
  // except that no accumulator is materialised. pushes must have passed ValidatePayload for n
  // elements and share one dtype; at least one. Requires FusesServerRound(residual !=
  // nullptr) (FailedPrecondition otherwise).
  // (Single caveat: a residual entry that is -0.0 and untouched by any push stays -0.0 where
  // the unfused sequence makes it +0.0; residuals only hold -0.0 if one was restored.)
  // A compressed-domain method (MethodSpec::aggregation == kCompressedDomainSum) defines this
  // round in its own code domain, and servers call nothing else on its pushes: binsgdm keeps
  // the contract above exactly (its codes decode to +-1, counted per element); separate's
  // reply is scale times the sum of the pushes' projection vectors (linear: the projection of
  // the sum), not a re-compression of a decoded aggregate.
  virtual StatusOr<size_t> AggregateCompress(Span<const ByteSpan> pushes, size_t n, float scale,
                                             float* residual, const CompressContext& ctx,
                                             MutableByteSpan out) = 0;
};

// Shared machinery: concrete compressors implement the fp32 body hooks below.
class CompressorBase : public Compressor {
 public:
  CompressorBase(v1::CompressorId id, IsaLevel isa) : id_(id), isa_(isa) {}

  v1::CompressorId id() const final { return id_; }
  IsaLevel isa() const final { return isa_; }
  size_t MaxCompressedBytes(size_t n, DType dtype) const final {
    return kPayloadHeaderBytes + MaxBodyBytes(n, dtype);
  }
  StatusOr<size_t> Compress(ConstTensorView input, const CompressContext& ctx,
                            MutableByteSpan out) final;
  StatusOr<size_t> CompressWithFeedback(ConstTensorView input, Span<float> residual,
                                        const CompressContext& ctx, MutableByteSpan out) final;
  Status Decompress(ByteSpan payload, TensorView out) final;
  Status DecompressAdd(ByteSpan payload, Span<float> accumulator) final;
  Status DecompressToFloat(ByteSpan payload, Span<float> out) final;
  bool FusesServerRound(bool with_residual) const override { return false; }
  bool RawBodyHeader(ConstTensorView input, const CompressContext& ctx,
                     uint8_t* header) const final;
  Status ValidatePayload(ByteSpan payload, size_t n) final;
  // input_checked / input_non_finite from NoteInputCheck. A compressor that reports more
  // overrides it and calls this one.
  void TakeTelemetry(CompressorTelemetry* into) override;
  StatusOr<size_t> AggregateCompress(Span<const ByteSpan> pushes, size_t n, float scale,
                                     float* residual, const CompressContext& ctx,
                                     MutableByteSpan out) final;

 protected:
  // Upper bound on the body (the bytes after the header) for n elements of dtype.
  virtual size_t MaxBodyBytes(size_t n, DType dtype) const = 0;

  // Whether EncodeBodyWithFeedbackF32 applies CompressContext::residual_decay itself.
  // Default: false (CompressWithFeedback scales the residual first).
  virtual bool FusesResidualDecay() const { return false; }

  // Whether the body for n values of `dtype` is those values' own bytes, in that dtype
  // (RawBodyHeader). Default: false.
  virtual bool BodyIsInputBytes(DType /*dtype*/) const { return false; }

  // Largest element count this format can encode (sparse formats use int32 indices).
  // Compress / CompressWithFeedback return InvalidArgument above it.
  virtual uint64_t MaxElements() const { return kMaxPayloadElements; }

  // x: n fp32 values (converted exactly from `dtype`). Writes at most MaxBodyBytes(n, dtype)
  // bytes to `body` and returns the count. n may be 0.
  virtual size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                            uint8_t* body) = 0;

  // q: n fp32 values (= input + residual). Encodes C(q) and replaces q by q - C(q) in place,
  // where C(q) is exactly what DecodeBody will produce (including the dtype rounding of any
  // stored values).
  virtual size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                        uint8_t* body) = 0;

  // fp32 fast path of CompressWithFeedback: q = g + e is formed inside (fused where the
  // compressor can), e ends as q - C(q). Default: e += g, then EncodeBodyWithFeedback(e).
  // An override that returns true from FusesResidualDecay forms q = g + ctx.residual_decay * e.
  virtual size_t EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                           const CompressContext& ctx, uint8_t* body);

  // Validates `body` completely for (n, dtype) — length, indices, levels, padding — and only
  // then writes out[i] = C(x)[i] (add == false) or out[i] += C(x)[i] (add == true).
  // Returns DataLoss naming the problem, leaving `out` untouched, if the body is bad.
  virtual Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) = 0;

  // Decompress's decode into the caller's fp32 tensor (add == false): same contract and values
  // as DecodeBody, but the output is a tensor that nobody reads right away (unlike the server's
  // accumulator), so a compressor may use non-temporal stores. Default: DecodeBody.
  virtual Status DecodeBodyToTensor(ByteSpan body, size_t n, DType dtype, float* out) {
    return DecodeBody(body, n, dtype, out, false);
  }

  // Decompress into a non-fp32 tensor of the payload's dtype without the fp32 round trip,
  // where the format stores the values in that dtype as they are (casts): validates like
  // DecodeBody and writes `out` (n values of dtype); returns true when it handled the call.
  // Default: false (Decompress then decodes to fp32 and rounds).
  virtual bool DecodeBodyInDType(ByteSpan /*body*/, size_t /*n*/, DType /*dtype*/, void* /*out*/,
                                 Status* /*status*/) {
    return false;
  }

  // The validation half of DecodeBody (same checks, same messages), writing nothing.
  // Default: Unimplemented (compressors that fuse the server round implement it).
  virtual Status ValidateBody(ByteSpan body, size_t n, DType dtype);

  // The checks a server round makes across its validated bodies before AggregateBody (a
  // compressed-domain method whose pushes must agree on a layout: separate's common stream).
  // DataLoss naming the disagreement. Default: OK.
  virtual Status ValidateAggregate(const ByteSpan* /*bodies*/, size_t /*count*/, size_t /*n*/) {
    return Status::Ok();
  }

  // The fused server round over validated bodies (see AggregateCompress): writes the body of
  // C(a + e) (residual != nullptr, e updated) or C(a), in ctx.store_as (fp32 when unset), and
  // returns its size. `dtype` is the pushes'. Only called where FusesServerRound(residual !=
  // nullptr).
  virtual size_t AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype,
                               float scale, float* residual, const CompressContext& ctx,
                               uint8_t* body);

  // An fp32 scratch buffer of at least n elements, owned by this instance.
  float* Scratch(size_t n) {
    scratch_.resize(n);
    return scratch_.data();
  }

  // For compressors that write a payload through their own entry points (loco's error step):
  // InvalidArgument above MaxElements().
  Status CheckElementCount(size_t n) const;
  // The payload dtype of compressing `input` under ctx (store_as), or InvalidArgument.
  static StatusOr<DType> PayloadDType(DType input, const CompressContext& ctx);
  // Writes the header for a body just encoded; returns the payload size.
  size_t FinishPayload(DType dtype, size_t n, size_t body_bytes, uint8_t* out) const;
  // An encode whose own pass read every input value on a path that shows a NaN / inf (a scale,
  // a norm, a selection key) says what it saw; TakeTelemetry reports it (input_checked), so
  // the worker engine makes no pass of its own.
  void NoteInputCheck(bool non_finite) {
    input_checked_ = true;
    input_non_finite_ |= non_finite;
  }

 private:
  StatusOr<PayloadHeader> CheckPayload(ByteSpan payload, size_t expected_count) const;

  v1::CompressorId id_;
  IsaLevel isa_;
  AlignedBuffer<float> scratch_;
  bool input_checked_ = false;     // an encode noted its input check since TakeTelemetry
  bool input_non_finite_ = false;  // and one saw a NaN / inf
};

}  // namespace bitpush::compressors
