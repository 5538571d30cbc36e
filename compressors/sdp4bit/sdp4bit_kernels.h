// Kernels of the sdp4bit compressor (compressors/sdp4bit/sdp4bit.h): the 32-point Hadamard
// transform (fast Walsh-Hadamard, unnormalised: entries +-1, H32 * H32 = 32 I), the group-wise
// absmax + stochastic-rounding quantiser with the forward transform fused in, int4 / int8
// packing, and dequantisation with the inverse transform fused in. Each exists as scalar C++,
// AVX2 and AVX-512, dispatched on an explicit IsaLevel; all levels produce bit-identical codes,
// scales and decoded values:
//   - the transform runs the same butterflies in the same order everywhere: stages h = 1, 2, 4,
//     8, 16; in stage h every pair (i, i + h) with bit h of i clear becomes (a + b, a - b);
//   - no product feeds an addition where the compiler could contract the two into one fused
//     multiply-add on some levels and not on others (every such product goes through an
//     optimisation barrier, in the scalar code too, which may be inlined into SIMD callers);
//   - random numbers are integers (common/counter_rng.h) and the rounding decision is integer
//     arithmetic on floor(w) (exact: |w| < 2^24);
//   - groups the vector kernels do not handle (a zero, non-finite or tiny absmax, a group whose
//     length is not a multiple of 32) run through the scalar routine on every level;
//   - decoding with the inverse transform folds the final * 0.03125 into the scale (code *
//     fp32(scale * 2^-5), the butterflies, no last product) only for scales in [2^-96, 2^96],
//     where every intermediate is a normal fp32 number and scaling by 2^-5 commutes with each
//     rounding: the same values bit for bit (other scales take the literal sequence).
//
// Element i of the (padded, transformed) vector of a partition rounds with the 16-bit uniform
//   r = CounterRandom32Lite(stream, uint32_t(((i >> 5) << 4) | (i & 15))),
//   r16 = (i & 16) ? r >> 16 : r & 0xFFFF     (elements i, i + 16 of a block share r);
// a group's values are quantised as
//   w = y * inv16, inv16 = fp32(L / absmax) * 2^16  (tiny absmax: w = (y * 2^64) * inv16,
//   inv16 = fp32(L / (absmax 2^64)) * 2^16);  code = clamp((floor(w) + r16) >> 16, -L, L)
// (P(up) = floor(frac(w 2^-16) 2^16) / 2^16: bias in (-2^-16, 0] of a step), and decode as
// fp32(code) * scale (then, with the transform, H32 * block * 0.03125).
//
// Internal to the compressor; decoders run on validated bodies only. Thread-safety: pure
// functions over caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"

namespace bitpush::compressors::sdp4bit {

inline constexpr size_t kBlock = 32;  // Hadamard block

// The largest code magnitude L = 2^(bits-1) - 1: 7 or 127.
inline uint32_t MaxCode(uint32_t bits) {
  return (1u << (bits - 1)) - 1;
}
// Code bytes of m elements: ceil(m/2) (4 bits) or m (8 bits).
inline size_t CodeBytes(size_t m, uint32_t bits) {
  return bits == 4 ? (m + 1) / 2 : m;
}
// The padded length of n elements: a multiple of 32 with the transform, n without it.
inline size_t PaddedLength(size_t n, bool hadamard) {
  return hadamard ? (n + kBlock - 1) / kBlock * kBlock : n;
}

struct Layout {
  uint32_t bits = 4;    // 4 or 8
  uint32_t group = 0;   // G, even; a multiple of 32 when the transform is used
  uint64_t stream = 0;  // random stream (quantisation only)
};

// The forward (x <- H32 x) or inverse (x <- (H32 x) * 0.03125) transform of every 32-block of
// x[0..m), in place; m must be a multiple of 32.
void TransformBlocks(float* x, size_t m, bool inverse, IsaLevel isa);

// Quantises elements [first, first + len) of a partition's padded vector, whose values are
// x[0..count) followed by zeros (count <= len; x points at element `first`), transformed by H32
// block by block first when `transform`. first is a multiple of G; len is a whole number of
// groups except at the end of the vector. Writes the groups' f32 scales at scales + 4 * (first /
// G) and their codes at the code offset of element `first` (unaligned is fine). work: at least
// G floats, 64-byte aligned.
void QuantizeGroups(const float* x, size_t count, size_t len, size_t first, bool transform,
                    const Layout& layout, uint8_t* scales, uint8_t* codes, float* work,
                    IsaLevel isa);

// Dequantises elements [first, first + len) of a validated body (scales / codes: the body's
// arrays, from element 0), inverse-transformed block by block when `inverse` (then first and
// len are multiples of 32), and writes (or, with add, adds) the first `valid` of them to out.
void DequantizeGroups(const uint8_t* scales, const uint8_t* codes, size_t first, size_t len,
                      size_t valid, const Layout& layout, bool inverse, float* out, bool add,
                      IsaLevel isa);

// The server's round over `count` quantised bodies (in_scales / in_codes: each body's arrays,
// from element 0), over elements [first, first + len) (first a multiple of G): their sum in the
// transformed domain (body 0 + body 1 + ..., no inverse transform), times `scale` unless it is
// 1, then re-quantised with `lay` (requantize: scales / codes / work as QuantizeGroups,
// transform off) or stored to z[0..). Bit for bit the sequence DequantizeGroups,
// DequantizeGroups(add) per further body, ScaleInPlace, QuantizeGroups. The bodies share
// lay.bits and lay.group. AVX-512 with G <= 128 keeps each group in registers from decode to
// codes (z untouched when requantising); AVX2 sums in one pass into z, then quantises. Returns
// how many leading elements it handled: whole groups, 0 where the level has no such kernel
// (scalar, or G not a multiple of 32; AVX-512 with G > 128); the caller runs the sequence on
// the rest.
size_t SumGroups(const uint8_t* const* in_scales, const uint8_t* const* in_codes, size_t count,
                 size_t first, size_t len, float scale, const Layout& lay, bool requantize,
                 uint8_t* scales, uint8_t* codes, float* work, float* z, IsaLevel isa);

// x[i] *= s for i < n (the same rounding on every level).
void ScaleInPlace(float* x, size_t n, float s);

// The index of the first byte of codes[0..bytes) holding a code outside [-L, L] (a nibble 0x8
// for 4 bits, a byte 0x80 for 8 bits), or `bytes` when there is none.
size_t FindOutOfRangeCode(const uint8_t* codes, size_t bytes, uint32_t bits);

}  // namespace bitpush::compressors::sdp4bit
