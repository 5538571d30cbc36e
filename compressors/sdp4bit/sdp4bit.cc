#include "compressors/sdp4bit/sdp4bit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/counter_rng.h"
#include "common/little_endian.h"
#include "common/vector_ops.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"

namespace bitpush::compressors {
namespace {

using sdp4bit::CodeBytes;
using sdp4bit::MaxCode;

// Elements per chunk of the fused server round (whole groups; at least one group).
constexpr size_t kChunkElements = 8192;
// Elements per step of the 16-bit conversions through a stack buffer.
constexpr size_t kConvertChunk = 1024;

size_t Ceil(size_t n, size_t d) {
  return (n + d - 1) / d;
}

inline bool Finite(float v) {
  return v - v == 0.0f;
}

std::string FloatString(float v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

const char* KindName(uint8_t kind) {
  switch (kind) {
    case Sdp4bitCompressor::kQuantized: return "quantised";
    case Sdp4bitCompressor::kFp32: return "fp32";
    case Sdp4bitCompressor::kFp16: return "fp16";
    case Sdp4bitCompressor::kBf16: return "bf16";
    default: return "unknown";
  }
}

const char* PullName(v1::PullFormat pull) {
  switch (pull) {
    case v1::PULL_FORMAT_FP32: return "fp32";
    case v1::PULL_FORMAT_FP16: return "fp16";
    case v1::PULL_FORMAT_BF16: return "bf16";
    default: return "sdp4bit";
  }
}

size_t ValueBytes(uint8_t kind) {
  return kind == Sdp4bitCompressor::kFp32 ? 4 : 2;
}

// data <- x[0..count) stored as the kind's values (unaligned is fine).
void WriteValues(const float* x, size_t count, uint8_t kind, uint8_t* data, IsaLevel isa) {
  if (kind == Sdp4bitCompressor::kFp32) {
    if (count) std::memcpy(data, x, count * sizeof(float));
    return;
  }
  alignas(64) uint16_t tmp[kConvertChunk];
  for (size_t i = 0; i < count; i += kConvertChunk) {
    const size_t c = std::min(kConvertChunk, count - i);
    if (kind == Sdp4bitCompressor::kFp16) {
      FloatToHalfArray(x + i, tmp, c, isa);
    } else {
      FloatToBf16Array(x + i, tmp, c, isa);
    }
    std::memcpy(data + 2 * i, tmp, 2 * c);
  }
}

// out[0..count) = (or +=) the kind's values at data.
void LoadValues(const uint8_t* data, uint8_t kind, size_t count, float* out, bool add,
                IsaLevel isa) {
  if (kind == Sdp4bitCompressor::kFp32 && !add) {
    if (count) std::memcpy(out, data, count * sizeof(float));
    return;
  }
  alignas(64) uint16_t half[kConvertChunk];
  alignas(64) float tmp[kConvertChunk];
  for (size_t i = 0; i < count; i += kConvertChunk) {
    const size_t c = std::min(kConvertChunk, count - i);
    if (kind == Sdp4bitCompressor::kFp32) {
      std::memcpy(tmp, data + 4 * i, 4 * c);
    } else {
      std::memcpy(half, data + 2 * i, 2 * c);
      if (kind == Sdp4bitCompressor::kFp16) {
        HalfToFloatArray(half, tmp, c, isa);
      } else {
        Bf16ToFloatArray(half, tmp, c, isa);
      }
    }
    float* o = out + i;
    if (add) {
      for (size_t j = 0; j < c; ++j) o[j] = o[j] + tmp[j];
    } else {
      std::memcpy(o, tmp, c * sizeof(float));
    }
  }
}

}  // namespace

Sdp4bitCompressor::Sdp4bitCompressor(const v1::Sdp4bitParams& params, IsaLevel isa)
    : CompressorBase(v1::COMPRESSOR_ID_SDP4BIT, isa),
      bits_(params.bits()),
      group_(params.group()),
      hadamard_(params.hadamard()),
      seed_(params.seed()),
      pull_(params.pull()) {}

size_t Sdp4bitCompressor::QuantizedBodyBytes(size_t n) const {
  const size_t m = PaddedLength(n);
  return kBodyHeaderBytes + 4 * Ceil(m, group_) + CodeBytes(m, bits_);
}

size_t Sdp4bitCompressor::MaxBodyBytes(size_t n, DType) const {
  size_t reply = 0;
  switch (pull_) {
    case v1::PULL_FORMAT_FP32: reply = kBodyHeaderBytes + 4 * n; break;
    case v1::PULL_FORMAT_FP16:
    case v1::PULL_FORMAT_BF16: reply = kBodyHeaderBytes + 2 * n; break;
    default: break;
  }
  return std::max(QuantizedBodyBytes(n), reply);
}

Sdp4bitCompressor::Kind Sdp4bitCompressor::KindFor(const CompressContext& ctx) const {
  if (ctx.worker == kServerStream) {
    switch (pull_) {
      case v1::PULL_FORMAT_FP32: return kFp32;
      case v1::PULL_FORMAT_FP16: return kFp16;
      case v1::PULL_FORMAT_BF16: return kBf16;
      default: break;
    }
  }
  return kQuantized;
}

sdp4bit::Layout Sdp4bitCompressor::LayoutFor(const CompressContext& ctx) const {
  sdp4bit::Layout lay;
  lay.bits = bits_;
  lay.group = group_;
  lay.stream = StreamKey(seed_, ctx.worker, ctx.key, ctx.round);
  return lay;
}

void Sdp4bitCompressor::WriteHeader(Kind kind, uint8_t* body) const {
  body[0] = kind;
  body[1] = static_cast<uint8_t>(bits_);
  body[2] = hadamard_ ? 1 : 0;
  body[3] = 0;
  PutU32(body + 4, group_);
}

size_t Sdp4bitCompressor::Encode(const float* x, size_t n, Kind kind, const CompressContext& ctx,
                                 uint8_t* body) {
  WriteHeader(kind, body);
  uint8_t* data = body + kBodyHeaderBytes;
  if (kind != kQuantized) {
    WriteValues(x, n, kind, data, isa());
    return kBodyHeaderBytes + ValueBytes(kind) * n;
  }
  const size_t m = PaddedLength(n);
  work_.resize(group_);
  uint8_t* codes = data + 4 * Ceil(m, group_);
  sdp4bit::QuantizeGroups(x, n, m, 0, hadamard_, LayoutFor(ctx), data, codes, work_.data(), isa());
  // Every value went into its group's absmax: a NaN scale (the non-finite marker) is the input
  // check (NoteInputCheck), read from the scales alone (one float per group).
  bool non_finite = false;
  for (size_t g = 0, groups = Ceil(m, group_); g < groups && !non_finite; ++g) {
    non_finite = std::isnan(GetF32(data + 4 * g));
  }
  NoteInputCheck(non_finite);
  return QuantizedBodyBytes(n);
}

void Sdp4bitCompressor::Decode(const uint8_t* body, size_t n, Kind kind, float* out, bool add) {
  const uint8_t* data = body + kBodyHeaderBytes;
  if (kind != kQuantized) {
    LoadValues(data, kind, n, out, add, isa());
    return;
  }
  const size_t m = PaddedLength(n);
  const uint8_t* codes = data + 4 * Ceil(m, group_);
  sdp4bit::DequantizeGroups(data, codes, 0, m, n, LayoutFor({}), hadamard_, out, add, isa());
}

size_t Sdp4bitCompressor::EncodeBody(const float* x, size_t n, DType, const CompressContext& ctx,
                                     uint8_t* body) {
  return Encode(x, n, KindFor(ctx), ctx, body);
}

size_t Sdp4bitCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType,
                                                 const CompressContext& ctx, uint8_t* body) {
  const Kind kind = KindFor(ctx);
  const size_t bytes = Encode(q, n, kind, ctx, body);
  // C(q) is by definition what the decoder produces: decode the body just written.
  decoded_.resize(n);
  float* c = decoded_.data();
  Decode(body, n, kind, c, false);
  for (size_t i = 0; i < n; ++i) {
    const float d = q[i] - c[i];
    q[i] = Finite(d) ? d : 0.0f;  // a non-finite value resets the residual, not poisons it
  }
  return bytes;
}

Status Sdp4bitCompressor::Validate(ByteSpan body, size_t n, Kind* kind_out) const {
  if (body.size() < kBodyHeaderBytes) {
    return DataLossError("sdp4bit: body of " + std::to_string(body.size()) +
                         " bytes is shorter than its 8-byte header");
  }
  const uint8_t* p = body.data();
  const uint8_t k = p[0];
  if (k < kQuantized || k > kBf16) {
    return DataLossError("sdp4bit: body kind " + std::to_string(k) +
                         " is unknown; valid: 1 (quantised), 2 (fp32), 3 (fp16), 4 (bf16)");
  }
  if (p[1] != bits_) {
    return DataLossError("sdp4bit: body has bits=" + std::to_string(p[1]) +
                         " but this key uses bits=" + std::to_string(bits_));
  }
  if (p[2] != (hadamard_ ? 1 : 0)) {
    return DataLossError("sdp4bit: body has hadamard byte " + std::to_string(p[2]) +
                         " but this key uses hadamard=" + (hadamard_ ? "on (1)" : "off (0)"));
  }
  if (p[3] != 0) {
    return DataLossError("sdp4bit: body header byte 3 is " + std::to_string(p[3]) +
                         "; it is reserved and must be 0");
  }
  const uint32_t group = GetU32(p + 4);
  if (group != group_) {
    return DataLossError("sdp4bit: body has group=" + std::to_string(group) +
                         " but this key uses group=" + std::to_string(group_));
  }
  const Kind kind = static_cast<Kind>(k);
  if (kind != kQuantized) {
    const v1::PullFormat want = kind == kFp32   ? v1::PULL_FORMAT_FP32
                                : kind == kFp16 ? v1::PULL_FORMAT_FP16
                                                : v1::PULL_FORMAT_BF16;
    if (pull_ != want) {
      return DataLossError(std::string("sdp4bit: body holds ") + KindName(k) +
                           " values but this key's pulls are " + PullName(pull_));
    }
  }
  const size_t expect =
      kind == kQuantized ? QuantizedBodyBytes(n) : kBodyHeaderBytes + ValueBytes(kind) * n;
  if (body.size() != expect) {
    return DataLossError("sdp4bit: body is " + std::to_string(body.size()) + " bytes; " +
                         std::to_string(n) + " elements of kind " + std::to_string(k) + " (" +
                         KindName(k) + ") need " + std::to_string(expect));
  }
  *kind_out = kind;
  if (kind != kQuantized) return Status::Ok();

  const size_t m = PaddedLength(n);
  const size_t groups = Ceil(m, group_);
  const uint8_t* scales = p + kBodyHeaderBytes;
  const uint8_t* codes = scales + 4 * groups;
  const size_t code_bytes = CodeBytes(m, bits_);
  if (bits_ == 4 && m % 2 == 1 && (codes[m / 2] & 0xF) != 0) {
    return DataLossError("sdp4bit: the padding nibble after element " + std::to_string(m - 1) +
                         " is not zero");
  }
  const size_t bad = sdp4bit::FindOutOfRangeCode(codes, code_bytes, bits_);
  if (bad < code_bytes) {
    const size_t element = bits_ == 8 ? bad : ((codes[bad] >> 4) == 0x8 ? 2 * bad : 2 * bad + 1);
    const int levels = static_cast<int>(MaxCode(bits_));
    return DataLossError("sdp4bit: element " + std::to_string(element) + " has code " +
                         std::to_string(-levels - 1) + ", outside " + std::to_string(-levels) +
                         ".." + std::to_string(levels));
  }
  for (size_t g = 0; g < groups; ++g) {
    const float s = GetF32(scales + 4 * g);
    if (std::isnan(s)) {
      const size_t first = g * group_;
      const size_t len = std::min<size_t>(group_, m - first);
      const uint8_t* c = codes + CodeBytes(first, bits_);
      const size_t bytes = CodeBytes(len, bits_);
      if (std::any_of(c, c + bytes, [](uint8_t b) { return b != 0; })) {
        return DataLossError("sdp4bit: group " + std::to_string(g) +
                             " has a NaN scale (the non-finite marker) but nonzero codes");
      }
    } else if (!(s > 0.0f) || std::isinf(s)) {
      return DataLossError("sdp4bit: group " + std::to_string(g) + " has scale " + FloatString(s) +
                           "; it must be finite and > 0 (or NaN, the non-finite marker)");
    }
  }
  return Status::Ok();
}

Status Sdp4bitCompressor::ValidateBody(ByteSpan body, size_t n, DType) {
  Kind kind;
  return Validate(body, n, &kind);
}

Status Sdp4bitCompressor::DecodeBody(ByteSpan body, size_t n, DType, float* out, bool add) {
  Kind kind;
  BP_RETURN_IF_ERROR(Validate(body, n, &kind));
  Decode(body.data(), n, kind, out, add);
  return Status::Ok();
}

size_t Sdp4bitCompressor::AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType,
                                        float scale, float*, const CompressContext& ctx,
                                        uint8_t* body) {
  const Kind kind = KindFor(ctx);
  WriteHeader(kind, body);
  const size_t m = PaddedLength(n);
  const size_t groups = Ceil(m, group_);
  const size_t chunk = group_ * std::max<size_t>(1, kChunkElements / group_);
  const sdp4bit::Layout lay = LayoutFor(ctx);
  uint8_t* data = body + kBodyHeaderBytes;
  if (m > 0) {
    sum_.resize(std::min(chunk, m));
    work_.resize(group_);
  }
  float* z = sum_.data();
  // Every push quantised: the fused round (sum, scale and re-quantisation or store in one pass,
  // sdp4bit::SumGroups) on the groups where this level has it; the passes below on the rest.
  bool fused = count > 0;
  for (size_t w = 0; w < count; ++w) fused = fused && bodies[w].data()[0] == kQuantized;
  if (fused) {
    push_scales_.resize(count);
    push_codes_.resize(count);
    for (size_t w = 0; w < count; ++w) {
      push_scales_[w] = bodies[w].data() + kBodyHeaderBytes;
      push_codes_[w] = push_scales_[w] + 4 * groups;
    }
  }
  for (size_t start = 0; start < m; start += chunk) {
    const size_t len = std::min(chunk, m - start);
    const size_t valid = std::min(len, n - start);  // start < n: chunks are whole 32-blocks
    const size_t done = fused ? sdp4bit::SumGroups(push_scales_.data(), push_codes_.data(), count,
                                                   start, len, scale, lay, kind == kQuantized, data,
                                                   data + 4 * groups, work_.data(), z, isa())
                              : 0;
    const size_t rest = len - done;  // elements [start + done, start + len): a multiple of G in
    float* zr = z + done;            // front of the chunk's end, or the whole chunk
    for (size_t w = 0; w < count && rest > 0; ++w) {
      const uint8_t* b = bodies[w].data();
      const uint8_t* in = b + kBodyHeaderBytes;
      if (b[0] == kQuantized) {
        // Hadamard domain: no inverse transform per push.
        sdp4bit::DequantizeGroups(in, in + 4 * groups, start + done, rest, rest, lay, false, zr,
                                  w > 0, isa());
        continue;
      }
      // A validated push of 16/32-bit values (real domain): transformed like a push would be
      // (fused is false here, so done == 0).
      values_.resize(std::min(chunk, m));
      float* v = values_.data();
      LoadValues(in + ValueBytes(b[0]) * start, b[0], valid, v, false, isa());
      std::fill(v + valid, v + len, 0.0f);
      if (hadamard_) sdp4bit::TransformBlocks(v, len, false, isa());
      for (size_t i = 0; i < len; ++i) z[i] = w > 0 ? z[i] + v[i] : v[i];
    }
    if (rest > 0 && scale != 1.0f) sdp4bit::ScaleInPlace(zr, rest, scale);
    if (kind == kQuantized) {
      if (rest > 0) {
        sdp4bit::QuantizeGroups(zr, rest, rest, start + done, false, lay, data, data + 4 * groups,
                                work_.data(), isa());
      }
    } else {
      if (hadamard_) sdp4bit::TransformBlocks(z, len, true, isa());
      WriteValues(z, valid, kind, data + ValueBytes(kind) * start, isa());
    }
  }
  return kind == kQuantized ? QuantizedBodyBytes(n) : kBodyHeaderBytes + ValueBytes(kind) * n;
}

namespace {
std::unique_ptr<Compressor> NewSdp4bit(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<Sdp4bitCompressor>(config.sdp4bit(), isa);
}
}  // namespace

// The kernel half of sdp4bit (compressors/method.h; spec half in sdp4bit_spec.cc).
const MethodKernels kSdp4bitMethodKernels = {&kSdp4bitMethodSpec, &NewSdp4bit, &NewResidualState};

}  // namespace bitpush::compressors
