// The element arithmetic of SEPARATE's Gaussian stream (gaussian.h has the definition), shared
// by the CPU kernels (separate_kernels.cc: the scalar reference every ISA level matches) and
// the CUDA generator (worker/gpu/separate_gaussian.cu): one source for the tables, the
// constants and the pair function, compiled for the host and, under nvcc, for the device.
// Every line of GaussianPairFrom is one IEEE-754 single operation, rounded once; callers
// compile it without contraction (-ffp-contract=off / nvcc --fmad=false), so host and device
// give the same bits.
//
// Thread-safety: pure functions and constants.
#pragma once

#include <cstdint>

#include "common/counter_rng.h"

#if defined(__CUDACC__)
#define BITPUSH_SEPARATE_HD __host__ __device__
#else
#define BITPUSH_SEPARATE_HD
#endif

namespace bitpush::compressors::separate {

// -2 ln u by a 32-entry table: u = f 2^-17 with f = m 2^(e + [m < 1]), e = getexp(f) and m in
// [0.75, 1.5) (getmant's interval); i = the top 5 fraction bits of m's fp32 encoding. i < 16:
// m in [1 + i/32, 1 + (i+1)/32), centre c_i = 1 + (i + 0.5)/32, kLnC[i] = fp32(-2 ln c_i);
// 16 <= i < 31: m in [(32 + i)/64, (33 + i)/64), c_i = (32.5 + i)/64, kLnC[i] = fp32(-2 ln 2c_i)
// (the [m < 1] of the exponent); i = 31 (m just below 1, u near 1): c_i = 1 and kLnC[i] =
// kMinus2Ln2 itself, so (e - 17) kMinus2Ln2 + kLnC[i] is exactly 0 there and r keeps its
// relative accuracy as u -> 1. kInvC[i] = fp32(1 / c_i); t = m / c_i - 1 in [-1/64, 1/64] and
// -2 ln(1 + t) = t (-2 + t (1 - 2t/3)) (|error| < 3e-8).
#define BITPUSH_SEPARATE_INV_C                                                                     \
  {                                                                                                \
    0x1.f81f82p-1f, 0x1.e9131ap-1f, 0x1.dae608p-1f, 0x1.cd8568p-1f, 0x1.c0e07p-1f, 0x1.b4e81cp-1f, \
        0x1.a98ef6p-1f, 0x1.9ec8eap-1f, 0x1.948b1p-1f, 0x1.8acb9p-1f, 0x1.818182p-1f,              \
        0x1.78a4c8p-1f, 0x1.702e06p-1f, 0x1.681682p-1f, 0x1.605816p-1f, 0x1.58ed24p-1f,            \
        0x1.51d07ep+0f, 0x1.4afd6ap+0f, 0x1.446f86p+0f, 0x1.3e22ccp+0f, 0x1.381382p+0f,            \
        0x1.323e34p+0f, 0x1.2c9fb4p+0f, 0x1.27350cp+0f, 0x1.21fb78p+0f, 0x1.1cf06ap+0f,            \
        0x1.181182p+0f, 0x1.135c82p+0f, 0x1.0ecf56p+0f, 0x1.0a681p+0f, 0x1.0624dep+0f, 0x1.0p+0f   \
  }

#define BITPUSH_SEPARATE_LN_C                                                                \
  {                                                                                          \
    -0x1.fc0a8cp-6f, -0x1.77459p-4f, -0x1.341d7ap-3f, -0x1.a926d4p-3f, -0x1.0d77e8p-2f,      \
        -0x1.44d2b6p-2f, -0x1.7ab89p-2f, -0x1.af3c94p-2f, -0x1.e27076p-2f, -0x1.0a324ep-1f,  \
        -0x1.22942p-1f, -0x1.3a64c6p-1f, -0x1.51aad8p-1f, -0x1.686c82p-1f, -0x1.7eaf84p-1f,  \
        -0x1.947942p-1f, -0x1.a9cecap-1f, -0x1.beb4dap-1f, -0x1.d32fe8p-1f, -0x1.e74426p-1f, \
        -0x1.faf588p-1f, -0x1.0723e6p+0f, -0x1.109f3ap+0f, -0x1.19ee6cp+0f, -0x1.23130ep+0f, \
        -0x1.2c0e9ep+0f, -0x1.34e28ap+0f, -0x1.3d9026p+0f, -0x1.4618bcp+0f, -0x1.4e7d82p+0f, \
        -0x1.56bf9ep+0f, -0x1.62e43p+0f                                                      \
  }

inline constexpr float kMinus2Ln2 = -0x1.62e43p+0f;  // fp32(-2 ln 2)
inline constexpr float kMinusTwoThirds = -0x1.555556p-1f;
// sin a = a + a y S(y), cos a = 1 + y C(y), y = a^2, a in [0, pi/2] (|error| < 2e-7).
inline constexpr float kS0 = -0.16666665966663552f;
inline constexpr float kS1 = 0.00833324233936099f;
inline constexpr float kS2 = -0.00019822761487411304f;
inline constexpr float kS3 = 2.634815732772284e-06f;
inline constexpr float kC0 = -0.4999999234908889f;
inline constexpr float kC1 = 0.04166567177667821f;
inline constexpr float kC2 = -0.0013868639015691098f;
inline constexpr float kC3 = 2.34768493312373e-05f;
inline constexpr float kAngleStep = 4.7936899621426287e-05f;  // fp32(pi / 65536)

BITPUSH_SEPARATE_HD inline float FloatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}
BITPUSH_SEPARATE_HD inline uint32_t BitsOfFloat(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(uint32_t, f);
#endif
}
BITPUSH_SEPARATE_HD inline float SqrtRounded(float v) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(v);
#else
  return __builtin_sqrtf(v);
#endif
}

// The pair of lane hash x — half 0 (r cos a, the sign of bit 16) and half 1 (r sin a, the sign
// of bit 17) — with the tables at inv_c and ln_c (BITPUSH_SEPARATE_INV_C / _LN_C, wherever the
// caller keeps them: host constants, device constant memory). Each line is one IEEE operation
// of the AVX-512 kernel (getexp / getmant are exact).
BITPUSH_SEPARATE_HD inline void GaussianPairFrom(uint32_t x, const float* inv_c, const float* ln_c,
                                                 float* c_out, float* s_out) {
  // radius: r^2 = -2 ln u, u = f 2^-17, f = 2 (x & 0xFFFF) + 1 = m 2^e, m in [0.75, 1.5)
  const float f = static_cast<float>(static_cast<int32_t>(((x << 1) & 0x1FFFEu) | 1u));
  const uint32_t fb = BitsOfFloat(f);
  const uint32_t hi = (fb >> 22) & 1u;  // fraction >= 0.5: getmant halves m
  const uint32_t mb = (fb & 0x7FFFFFu) | (hi != 0 ? 0x3F000000u : 0x3F800000u);  // getmant
  const float e = static_cast<float>(static_cast<int32_t>(fb >> 23) - 127);      // getexp
  const uint32_t i = (mb >> 18) & 31u;
  const float t = FloatFromBits(mb) * inv_c[i] - 1.0f;
  float q = t * kMinusTwoThirds + 1.0f;
  q = q * t + -2.0f;
  q = q * t;
  const float r = SqrtRounded(((e - 17.0f) * kMinus2Ln2 + ln_c[i]) + q);
  // angle a = (2 (x >> 18) + 1) pi / 65536 in (0, pi/2)
  const float a = static_cast<float>(static_cast<int32_t>((x >> 17) | 1u)) * kAngleStep;
  const float y = a * a;
  float s = kS3;
  s = s * y + kS2;
  s = s * y + kS1;
  s = s * y + kS0;
  const float sn = a + (a * y) * s;
  float c = kC3;
  c = c * y + kC2;
  c = c * y + kC1;
  c = c * y + kC0;
  const float cs = 1.0f + y * c;
  *c_out = FloatFromBits(BitsOfFloat(r * cs) ^ ((x << 15) & 0x80000000u));
  *s_out = FloatFromBits(BitsOfFloat(r * sn) ^ ((x << 14) & 0x80000000u));
}

// The lane hash of (stream, group, lane): CounterRandom32Lite(stream, 16 group + lane).
BITPUSH_SEPARATE_HD inline uint32_t GaussianLaneHash(uint64_t stream, uint32_t group,
                                                     uint32_t lane) {
  return CounterRandom32Lite(stream, group * 16u + lane);
}

}  // namespace bitpush::compressors::separate
