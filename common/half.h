// Scalar fp16 (IEEE binary16) and bf16 conversions, bit-exact with the hardware paths
// (F16C / AVX-512 VCVTPS2PH with round-to-nearest-even; bf16 by integer RNE). The array
// versions with SIMD dispatch live in common/vector_ops.h.
//
// Rounding: round-to-nearest-even. Overflow: ±inf. NaN: stays NaN, quieted, sign and the
// top mantissa bits preserved (as VCVTPS2PH does).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace bitpush {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  if (em >= 0x7C00u) {  // inf / NaN (NaN is quieted, as VCVTPH2PS does)
    const uint32_t mant = (em & 0x3FFu) << 13;
    return BitsToFloat(sign | 0x7F800000u | mant | (mant ? 0x00400000u : 0u));
  }
  if (em < 0x0400u) {  // zero / subnormal: em * 2^-24, exact in fp32
    const float mag = static_cast<float>(em) * 5.9604644775390625e-8f;
    return BitsToFloat(sign | FloatBits(mag));
  }
  return BitsToFloat(sign | ((em << 13) + 0x38000000u));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // inf or NaN
    if (a == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x1FFu));
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (a < 0x38800000u) {  // result is subnormal or zero: exact integer rounding of a * 2^24
    // value = m * 2^(e-150) with m the 24-bit significand; result units are 2^-24.
    const uint32_t e = a >> 23;
    if (e < 102) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t odd = (a >> 13) & 1u;
  a += 0xC8000FFFu + odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (a >> 13));
}

inline float Bf16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace bitpush
