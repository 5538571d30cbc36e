#include "compressors/separate/separate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/counter_rng.h"
#include "common/little_endian.h"
#include "common/vector_ops.h"
#include "compressors/method.h"
#include "compressors/separate/separate_kernels.h"

namespace bitpush::compressors {
namespace {

using separate::BlockStream;
using separate::ProjectBlock;
using separate::ReconstructBlock;

// The largest block a body may declare (the spec's bound).
constexpr uint64_t kMaxBlock = uint64_t{1} << 24;

uint64_t Ceil(uint64_t n, uint64_t d) {
  return (n + d - 1) / d;
}

// Projections of the last block of d elements (d <= block).
uint64_t LastRows(uint64_t d, uint64_t block, uint64_t m) {
  return std::max<uint64_t>(1, Ceil(d * m, block));
}

uint64_t RowsOf(uint64_t d, uint64_t block, uint64_t m) {
  return d == block ? m : LastRows(d, block, m);
}

// Elements [first, first + d) of a tensor.
ConstTensorView Slice(ConstTensorView t, size_t first, size_t d) {
  return {static_cast<const uint8_t*>(t.data()) + first * DTypeSize(t.dtype()), d, t.dtype()};
}
TensorView Slice(TensorView t, size_t first, size_t d) {
  return {static_cast<uint8_t*>(t.data()) + first * DTypeSize(t.dtype()), d, t.dtype()};
}

inline bool Finite(float v) {
  return v - v == 0.0f;
}

// q[r] = p[r] * fp32(1 / m), the scaled projections a reconstruction sums.
void ScaleRows(const float* p, size_t m, float* q) {
  const float inv = static_cast<float>(1.0 / static_cast<double>(m));
  for (size_t r = 0; r < m; ++r) q[r] = p[r] * inv;
}

}  // namespace

// ---- SeparateCompressor -------------------------------------------------------------------

SeparateCompressor::SeparateCompressor(const v1::SeparateParams& params, IsaLevel isa)
    : CompressorBase(v1::COMPRESSOR_ID_SEPARATE, isa), params_(params), block_(params.block()) {
  const double m = std::ceil(static_cast<double>(block_) / params.ratio());
  m_ = static_cast<uint32_t>(std::clamp(m, 1.0, static_cast<double>(block_)));
}

void SeparateCompressor::Reserve(size_t d, size_t m) {
  if (h_.size() < d) h_.resize(d);
  if (p_.size() < m) p_.resize(m);
}

uint64_t SeparateCompressor::Projections(uint64_t n, uint64_t block, uint64_t m) {
  if (n == 0) return 0;
  const uint64_t full = n / block;
  const uint64_t last = n - full * block;
  return full * m + (last > 0 ? LastRows(last, block, m) : 0);
}

uint64_t SeparateCompressor::StreamFor(const CompressContext& ctx) const {
  return StreamKey(params_.seed(), kCommonStream, ctx.key, ctx.round);
}

size_t SeparateCompressor::MaxBodyBytes(size_t n, DType) const {
  return kBodyHeaderBytes + 4 * Projections(n, block_, m_);
}

size_t SeparateCompressor::Project(const float* x, size_t n, uint64_t stream, uint8_t* body) {
  PutU64(body, stream);
  PutU32(body + 8, block_);
  PutU32(body + 12, m_);
  uint8_t* out = body + kBodyHeaderBytes;
  size_t rows = 0;
  for (size_t j = 0, first = 0; first < n; ++j, first += block_) {
    const size_t d = std::min<size_t>(block_, n - first);
    const size_t m = RowsOf(d, block_, m_);
    Reserve(0, m);
    ProjectBlock(BlockStream(stream, j), x + first, d, m, p_.data(), isa());
    std::memcpy(out + 4 * rows, p_.data(), 4 * m);
    rows += m;
  }
  return kBodyHeaderBytes + 4 * rows;
}

size_t SeparateCompressor::EncodeBody(const float* x, size_t n, DType, const CompressContext& ctx,
                                      uint8_t* body) {
  return Project(x, n, StreamFor(ctx), body);
}

size_t SeparateCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType,
                                                  const CompressContext& ctx, uint8_t* body) {
  const size_t bytes = Project(q, n, StreamFor(ctx), body);
  // q <- q - C(q), C(q) the reconstruction of this body (what DecodeBody gives).
  Layout layout{GetU64(body), block_, m_};
  Reserve(std::min<size_t>(block_, n), 0);
  bool finite = true;
  for (size_t j = 0, first = 0; first < n; ++j, first += block_) {
    const size_t d = std::min<size_t>(block_, n - first);
    ReconstructBlockOf(body, layout, j, d, h_.data());
    for (size_t i = 0; i < d; ++i) {
      const float r = q[first + i] - h_[i];
      finite &= Finite(r);
      q[first + i] = r;
    }
  }
  if (!finite) std::fill(q, q + n, 0.0f);  // a non-finite value resets, not poisons
  return bytes;
}

void SeparateCompressor::ReconstructBlockOf(const uint8_t* body, const Layout& layout, size_t j,
                                            size_t d, float* out) {
  // Blocks before j are full (m rows each).
  const size_t m = RowsOf(d, layout.block, layout.m);
  const uint8_t* p = body + kBodyHeaderBytes + 4 * (j * size_t{layout.m});
  Reserve(0, m);
  for (size_t r = 0; r < m; ++r) p_[r] = GetF32(p + 4 * r);
  ScaleRows(p_.data(), m, p_.data());
  ReconstructBlock(BlockStream(layout.stream, j), p_.data(), d, m, out, isa());
}

Status SeparateCompressor::Validate(ByteSpan body, size_t n, Layout* layout) const {
  if (body.size() < kBodyHeaderBytes) {
    return DataLossError("separate body of " + std::to_string(body.size()) +
                         " bytes is shorter than its 16-byte header");
  }
  layout->stream = GetU64(body.data());
  layout->block = GetU32(body.data() + 8);
  layout->m = GetU32(body.data() + 12);
  if (layout->block < 1 || layout->block > kMaxBlock) {
    return DataLossError("separate body: block " + std::to_string(layout->block) +
                         " is outside 1..16777216");
  }
  if (layout->m < 1 || layout->m > layout->block) {
    return DataLossError("separate body: " + std::to_string(layout->m) +
                         " projections per block of " + std::to_string(layout->block) +
                         " (valid: 1..block)");
  }
  const uint64_t want = kBodyHeaderBytes + 4 * Projections(n, layout->block, layout->m);
  if (body.size() != want) {
    return DataLossError("separate body is " + std::to_string(body.size()) + " bytes but " +
                         std::to_string(n) + " elements in blocks of " +
                         std::to_string(layout->block) + " with " + std::to_string(layout->m) +
                         " projections each take " + std::to_string(want));
  }
  return Status::Ok();
}

Status SeparateCompressor::ValidateBody(ByteSpan body, size_t n, DType) {
  Layout layout;
  return Validate(body, n, &layout);
}

Status SeparateCompressor::DecodeBody(ByteSpan body, size_t n, DType, float* out, bool add) {
  Layout layout;
  BP_RETURN_IF_ERROR(Validate(body, n, &layout));
  Reserve(std::min<size_t>(layout.block, n), 0);
  for (size_t j = 0, first = 0; first < n; ++j, first += layout.block) {
    const size_t d = std::min<size_t>(layout.block, n - first);
    if (!add) {
      ReconstructBlockOf(body.data(), layout, j, d, out + first);
      continue;
    }
    ReconstructBlockOf(body.data(), layout, j, d, h_.data());
    for (size_t i = 0; i < d; ++i) out[first + i] += h_[i];
  }
  return Status::Ok();
}

Status SeparateCompressor::ValidateAggregate(const ByteSpan* bodies, size_t count, size_t) {
  for (size_t w = 1; w < count; ++w) {
    if (std::memcmp(bodies[w].data(), bodies[0].data(), kBodyHeaderBytes) != 0) {
      return DataLossError("separate: push " + std::to_string(w) + " projects with stream " +
                           std::to_string(GetU64(bodies[w].data())) + ", block " +
                           std::to_string(GetU32(bodies[w].data() + 8)) + ", m " +
                           std::to_string(GetU32(bodies[w].data() + 12)) +
                           " but push 0 with stream " + std::to_string(GetU64(bodies[0].data())) +
                           ", block " + std::to_string(GetU32(bodies[0].data() + 8)) + ", m " +
                           std::to_string(GetU32(bodies[0].data() + 12)) +
                           ": the workers used different seeds, rounds or separate parameters");
    }
  }
  return Status::Ok();
}

size_t SeparateCompressor::AggregateBody(const ByteSpan* bodies, size_t count, size_t, DType,
                                         float scale, float*, const CompressContext&,
                                         uint8_t* body) {
  std::memcpy(body, bodies[0].data(), kBodyHeaderBytes);
  const size_t rows = (bodies[0].size() - kBodyHeaderBytes) / 4;
  uint8_t* out = body + kBodyHeaderBytes;
  for (size_t i = 0; i < rows; ++i) {
    float a = GetF32(bodies[0].data() + kBodyHeaderBytes + 4 * i);
    for (size_t w = 1; w < count; ++w) a += GetF32(bodies[w].data() + kBodyHeaderBytes + 4 * i);
    if (scale != 1.0f) a *= scale;
    PutF32(out + 4 * i, a);
  }
  return kBodyHeaderBytes + 4 * rows;
}

StatusOr<size_t> SeparateCompressor::CompressWithState(ConstTensorView input, SeparateState& st,
                                                       const CompressContext& ctx,
                                                       MutableByteSpan out) {
  const size_t n = input.count();
  BP_RETURN_IF_ERROR(CheckElementCount(n));
  if (st.size() != n) {
    return InvalidArgumentError("separate error state has " + std::to_string(st.size()) +
                                " elements but the tensor has " + std::to_string(n));
  }
  BP_ASSIGN_OR_RETURN(const DType dtype, PayloadDType(input.dtype(), ctx));
  if (out.size() < MaxCompressedBytes(n, dtype)) {
    return InvalidArgumentError("output buffer of " + std::to_string(out.size()) +
                                " bytes is smaller than the " +
                                std::to_string(MaxCompressedBytes(n, dtype)) +
                                " bytes the payload may need (MaxCompressedBytes)");
  }
  const bool reset = st.reset_ > 0 && ctx.round % st.reset_ == 0;
  const uint64_t stream = StreamFor(ctx);
  Reserve(std::min<size_t>(block_, n), RowsOf(std::min<size_t>(block_, n), block_, m_));
  uint8_t* body = out.data() + kPayloadHeaderBytes;
  PutU64(body, stream);
  PutU32(body + 8, block_);
  PutU32(body + 12, m_);
  uint8_t* proj = body + kBodyHeaderBytes;
  float* e = st.e_.data();
  const float a_old = st.a_old_;
  const float a_new = st.a_new_;
  double gsq = 0;
  bool finite = true;
  size_t rows = 0;
  for (size_t j = 0, first = 0; first < n; ++j, first += block_) {
    const size_t d = std::min<size_t>(block_, n - first);
    const size_t m = RowsOf(d, block_, m_);
    float* h = h_.data();
    const bool f32 = input.dtype() == DType::kFloat32;
    if (!f32) ConvertToFloat(Slice(input, first, d), h, isa());
    const float* g = f32 ? input.f32() + first : h;  // in place: h = g + e element by element
    gsq += separate::AddAndSquare(g, e + first, h, d, isa());
    ProjectBlock(BlockStream(stream, j), h, d, m, p_.data(), isa());
    for (size_t r = 0; r < m; ++r) finite &= Finite(p_[r]);
    std::memcpy(proj + 4 * rows, p_.data(), 4 * m);
    rows += m;
    float* eb = e + first;
    if (reset) {
      std::fill(eb, eb + d, 0.0f);
    } else {
      separate::MovingAverage(eb, h, d, a_old, a_new, isa());
    }
  }
  finite &= std::isfinite(gsq);
  if (!finite) st.e_.zero();  // the projections carry the NaN / inf; the state starts afresh
  st.pending_ = true;
  st.pending_reset_ = reset || !finite;
  st.pending_round_ = ctx.round;
  st.gradient_sq_ = gsq;
  st.input_non_finite_ = !finite;
  if (reset || !finite) st.error_sq_ = 0;
  st.reported_ = true;
  return FinishPayload(dtype, n, kBodyHeaderBytes + 4 * rows, out.data());
}

Status SeparateCompressor::DecompressWithState(ByteSpan payload, SeparateState& st,
                                               const CompressContext& ctx, TensorView out) {
  const size_t n = out.count();
  BP_ASSIGN_OR_RETURN(PayloadHeader hdr, ParsePayloadHeader(payload));
  if (hdr.compressor_id != v1::COMPRESSOR_ID_SEPARATE) {
    return DataLossError("payload was written by compressor " +
                         v1::CompressorId_Name(hdr.compressor_id) +
                         " but this decoder is COMPRESSOR_ID_SEPARATE");
  }
  if (hdr.element_count != n) {
    return DataLossError("payload holds " + std::to_string(hdr.element_count) + " elements but " +
                         std::to_string(n) + " were expected");
  }
  if (hdr.dtype != out.dtype()) {
    return InvalidArgumentError("payload dtype is " + std::string(DTypeName(hdr.dtype)) +
                                " but the output tensor is " + std::string(DTypeName(out.dtype())));
  }
  if (st.size() != n) {
    return InvalidArgumentError("separate error state has " + std::to_string(st.size()) +
                                " elements but the tensor has " + std::to_string(n));
  }
  const ByteSpan body = payload.subspan(kPayloadHeaderBytes, hdr.body_bytes);
  Layout layout;
  BP_RETURN_IF_ERROR(Validate(body, n, &layout));
  // The reply of this state's push: e <- e - a_new h~ (skipped after a reset push).
  const bool update = st.pending_ && st.pending_round_ == ctx.round && !st.pending_reset_;
  st.pending_ = false;
  Reserve(std::min<size_t>(layout.block, n), 0);
  float* e = st.e_.data();
  const float a_new = st.a_new_;
  bool finite = true;
  double esq = 0;
  for (size_t j = 0, first = 0; first < n; ++j, first += layout.block) {
    const size_t d = std::min<size_t>(layout.block, n - first);
    float* ht = out.dtype() == DType::kFloat32 ? out.f32() + first : h_.data();
    ReconstructBlockOf(body.data(), layout, j, d, ht);
    if (out.dtype() != DType::kFloat32) ConvertFromFloat(ht, Slice(out, first, d), isa());
    if (!update) continue;
    esq += separate::SubtractScaled(e + first, ht, d, a_new, &finite, isa());
  }
  if (update) {
    if (!finite) {
      st.e_.zero();
      esq = 0;
    }
    st.error_sq_ = esq;
    st.reported_ = true;
  }
  return Status::Ok();
}

// ---- SeparateState ------------------------------------------------------------------------

SeparateState::SeparateState(const v1::SeparateParams& params, size_t elements)
    : e_(elements), reset_(params.reset()) {
  const float beta = static_cast<float>(params.beta());
  const bool printed = params.ema() == v1::SEPARATE_EMA_PRINTED;
  const float one_minus = static_cast<float>(1.0 - params.beta());
  a_old_ = printed ? one_minus : beta;
  a_new_ = printed ? beta : one_minus;
  Reset();
}

void SeparateState::Reset() {
  e_.zero();
  pending_ = false;
  error_sq_ = 0;
}

StatusOr<size_t> SeparateState::Compress(Compressor& compressor, ConstTensorView x,
                                         const CompressContext& ctx, MutableByteSpan out) {
  auto* sep = dynamic_cast<SeparateCompressor*>(&compressor);
  if (sep == nullptr) {
    return InvalidArgumentError(
        "a separate error state compresses through a separate compressor, not " +
        v1::CompressorId_Name(compressor.id()));
  }
  return sep->CompressWithState(x, *this, ctx, out);
}

Status SeparateState::DecompressReply(Compressor& compressor, ByteSpan payload,
                                      const CompressContext& ctx, TensorView out) {
  auto* sep = dynamic_cast<SeparateCompressor*>(&compressor);
  if (sep == nullptr) {
    return InvalidArgumentError(
        "a separate error state decodes through a separate compressor, not " +
        v1::CompressorId_Name(compressor.id()));
  }
  return sep->DecompressWithState(payload, *this, ctx, out);
}

StatusOr<size_t> SeparateState::AggregateCompress(Compressor&, Span<const ByteSpan>, float,
                                                  const CompressContext&, MutableByteSpan) {
  return FailedPreconditionError(
      "separate keeps no server error feedback (servers sum projections; use error_feedback: "
      "worker)");
}

void SeparateState::TakeTelemetry(CompressorTelemetry* into) {
  if (!reported_) return;
  into->gradient_sq = gradient_sq_;
  into->gradient_reported = true;
  into->error_sq = error_sq_;
  into->error_reported = true;
  // The compression read every g + e into ||h||^2 (and the projections): the engine's input
  // check, with the residual's own values included.
  into->input_checked = true;
  into->input_non_finite |= input_non_finite_;
  reported_ = false;
}

Status SeparateState::Restore(Span<const float> saved) {
  if (saved.size() != e_.size()) {
    return InvalidArgumentError("saved separate error has " + std::to_string(saved.size()) +
                                " elements; this partition has " + std::to_string(e_.size()));
  }
  std::copy(saved.begin(), saved.end(), e_.data());
  pending_ = false;
  return Status::Ok();
}

namespace {

std::unique_ptr<Compressor> NewSeparate(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<SeparateCompressor>(config.separate(), isa);
}

// The worker keeps the moving-average error; servers keep none (check_error_feedback refuses
// server and both), so a server-side request gets nothing.
std::unique_ptr<ErrorFeedback> NewSeparateState(const v1::CompressorConfig& config,
                                                ErrorFeedbackSide side, size_t elements) {
  if (side == ErrorFeedbackSide::kServer) return nullptr;
  return std::make_unique<SeparateState>(config.separate(), elements);
}

}  // namespace

// The kernel half of separate (compressors/method.h; spec half in separate_spec.cc).
const MethodKernels kSeparateMethodKernels = {&kSeparateMethodSpec, &NewSeparate,
                                              &NewSeparateState};

}  // namespace bitpush::compressors
