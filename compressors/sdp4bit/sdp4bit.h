// SDP4Bit's gradient path, TLq-HS (paper 002; digest shared/papers/002-sdp4bit.notes.md §2, §4,
// §10): the push-side quantiser of a partition, with the 32x32 Hadamard smoother fused in, and
// the server's fused round, which sums the pushes in the Hadamard domain and applies one inverse
// transform per key (or re-quantises the transformed sum directly). The spec half, parameters
// and error-feedback policy are in sdp4bit_spec.cc; the body layout in docs/wire-format.md
// "sdp4bit (id 9)".
//
// Algorithm, per partition of n values (fp32 math; 16-bit inputs are converted exactly first):
//   1. hadamard=on: pad to m = ceil(n/32)*32 with zeros; y = H32 x per 32-block, H32 the
//      unnormalised Sylvester matrix (entries +-1, H32 H32 = 32 I), as a fast Walsh-Hadamard
//      transform (5 butterfly stages). hadamard=off: m = n, y = x.
//   2. Groups of G consecutive y (the last may be shorter when G does not divide m); per group
//      L = 2^(bits-1) - 1 (7 or 127), absmax = max |y|, stored scale = fp32(absmax / L),
//      inv = fp32(L / absmax), v = y * inv, stochastic rounding with a 16-bit uniform r16:
//        w = fp32(y * (inv * 2^16))     (= v * 2^16 exactly unless v is subnormal)
//        code = clamp((floor(w) + r16) >> 16, -L, L)     (>> arithmetic: floor division)
//        r = CounterRandom32Lite(StreamKey(seed, worker, key, round), ((i >> 5) << 4) | (i & 15)),
//        r16 = (i & 16) ? r >> 16 : r & 0xFFFF
//      with i the element's index in the padded vector (common/counter_rng.h): elements i and
//      i + 16 of a 32-block share one 32-bit number, one half each. So code = floor(v) + 1 with
//      probability floor(frac(v) 2^16) / 2^16, i.e. E[code] - v lies in (-2^-16, 0]: unbiased
//      to within 2^-16 of a step (E[code * scale] = y up to that and fp32 rounding); error
//      variance <= scale^2 / 4 per element.
//   3. Decode: code * scale, then (hadamard) x = (H32 block) * 0.03125 per block; the first n.
// Every ISA level (scalar, AVX2, AVX-512) produces the same bytes and the same decoded values
// (sdp4bit_kernels.h says how).
//
// Body (little-endian), an 8-byte header then the data of its kind:
//   u8 kind | u8 bits (4 | 8) | u8 hadamard (0 | 1) | u8 0 | u32 group G
//   (the key's bits, hadamard and G, written and checked in every kind)
//   kind 1, quantised:  f32 scale[ceil(m/G)] | codes
//                       bits=4: ceil(m/2) bytes, element 2i in the high nibble and 2i+1 in the
//                       low one, two's complement (-7..7); an odd m leaves the last low nibble 0
//                       bits=8: m int8 (-127..127)
//                       = 8 + 4 ceil(m/G) + ceil(m/2) (or + m) bytes
//   kind 2, fp32 values: n x f32;  kind 3, fp16 values: n x u16;  kind 4, bf16 values: n x u16
// Workers push kind 1. The server's reply (CompressContext::worker == kServerStream) is kind 1
// with pull=sdp4bit (quantised from the server's own stream), else kind 2/3/4 for pull=fp32 /
// fp16 / bf16. The payload header's dtype (fp16 / bf16 keys, CompressContext::store_as) is
// independent of the kind: a 16-bit payload of kind 1 or 2 decodes to fp32 first and is rounded
// to the tensor's dtype once.
//
// Policies:
//   - zero group (absmax 0): stored scale 1, codes 0 (the paper's "zero groups -> scale 1").
//     A group whose absmax / L underflows fp32 to 0 (absmax below ~64 * 2^-149) is encoded the
//     same way (decodes to 0). A tiny absmax where fp32(L / absmax) * 2^16 overflows fp32
//     (absmax below ~L * 2^-112) quantises w = (y * 2^64) * (fp32(L / (absmax * 2^64)) * 2^16)
//     instead (the same codes up to rounding).
//   - non-finite group (absmax inf or NaN, i.e. a NaN/inf input in the group, or with the
//     transform a block whose sums overflow fp32): stored scale NaN, codes 0; it decodes to NaN
//     over the whole group (and the inverse transform keeps it inside those blocks), so AMP's
//     overflow check sees it. With error feedback the residual of such elements restarts from
//     0 rather than staying NaN (every compressor's policy, docs/errors.md).
//   - decoders validate everything before writing: exact body size for the kind, a known kind
//     that this key can produce, bits / hadamard / G equal to the key's, reserved byte 0,
//     scales finite and > 0 or NaN (then every code of the group is 0), codes within [-L, L]
//     (so -8 / -128 are refused), the odd-m padding nibble 0. DataLoss naming the problem.
//
// Server round (AggregateCompress, without a server residual only): for every push in order
// z += code * scale in the Hadamard domain (no inverse transform per push); z *= scale when it is
// not 1; then pull=sdp4bit quantises z as it is (z already is the transformed aggregate) from the
// server's stream, pull=fp32/fp16/bf16 applies one inverse transform per block and stores the
// values. Because the sum happens in the Hadamard domain, the fused round equals the unfused
// sequence (decode each push to real values, sum, compress) only up to fp32 rounding, not bit
// for bit, with hadamard=on; with hadamard=off it is the same sequence of operations, bit for
// bit. The round is computed in cache-sized chunks of whole groups: no accumulator of n values.
//
// Thread-safety: one thread per instance (compressors/compressor.h); the scratch buffers below
// are the instance's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/aligned_buffer.h"
#include "compressors/compressor.h"
#include "compressors/sdp4bit/sdp4bit_kernels.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

class Sdp4bitCompressor final : public CompressorBase {
 public:
  enum Kind : uint8_t { kQuantized = 1, kFp32 = 2, kFp16 = 3, kBf16 = 4 };
  static constexpr size_t kBodyHeaderBytes = 8;

  // params must be canonical (sdp4bit_spec.cc fills and range-checks them).
  Sdp4bitCompressor(const v1::Sdp4bitParams& params, IsaLevel isa);

  uint32_t bits() const { return bits_; }
  uint32_t group() const { return group_; }
  bool hadamard() const { return hadamard_; }
  // The padded length m of n elements.
  size_t PaddedLength(size_t n) const { return sdp4bit::PaddedLength(n, hadamard_); }
  // The exact size of a kind-1 body of n elements.
  size_t QuantizedBodyBytes(size_t n) const;
  // The kind a compression under ctx writes.
  Kind KindFor(const CompressContext& ctx) const;

  bool FusesServerRound(bool with_residual) const override { return !with_residual; }

 protected:
  size_t MaxBodyBytes(size_t n, DType dtype) const override;
  size_t EncodeBody(const float* x, size_t n, DType dtype, const CompressContext& ctx,
                    uint8_t* body) override;
  size_t EncodeBodyWithFeedback(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                uint8_t* body) override;
  Status DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) override;
  Status ValidateBody(ByteSpan body, size_t n, DType dtype) override;
  size_t AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype, float scale,
                       float* residual, const CompressContext& ctx, uint8_t* body) override;

 private:
  sdp4bit::Layout LayoutFor(const CompressContext& ctx) const;
  void WriteHeader(Kind kind, uint8_t* body) const;
  // Writes the body of `kind` for x[0..n); returns its size.
  size_t Encode(const float* x, size_t n, Kind kind, const CompressContext& ctx, uint8_t* body);
  // Decodes a validated body of `kind` (out = or += its values).
  void Decode(const uint8_t* body, size_t n, Kind kind, float* out, bool add);
  Status Validate(ByteSpan body, size_t n, Kind* kind) const;

  uint32_t bits_;
  uint32_t group_;
  bool hadamard_;
  uint64_t seed_;
  v1::PullFormat pull_;
  AlignedBuffer<float> work_;                // one group of transformed values (the quantiser)
  AlignedBuffer<float> decoded_;             // C(q) (error feedback)
  AlignedBuffer<float> sum_;                 // the fused server round: one chunk of z
  AlignedBuffer<float> values_;              // the fused server round: a 16/32-bit push's chunk
  std::vector<const uint8_t*> push_scales_;  // the fused server round: each push's scales
  std::vector<const uint8_t*> push_codes_;   // and codes
};

}  // namespace bitpush::compressors
