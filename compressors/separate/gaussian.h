// SEPARATE's common Gaussian stream (docs/separate.md "The Gaussian generator"): a
// counter-based N(0, 1) generator whose value at position i of stream s is a pure function
// of (s, i), bit for bit the same on every ISA level, in every process, and (the definition
// uses only integer hashing and IEEE-754 single +, -, x and sqrt, each rounded once, in a
// fixed order, never fused: gaussian_pair.h) on a GPU (worker/gpu/separate_gaussian.h). Every
// worker regenerates the same projection
// matrix from the stream id a payload carries.
//
// Definition. Positions come in groups of 32: position i is lane l = i % 16 of half
// q = (i / 16) % 2 of group G = i / 32. The group's lane l draws one 32-bit hash
//   x = CounterRandom32Lite(s, 16 G + l) = Fmix32(((16 G + l) * 0x9E3779B1 + lo(s)) ^ hi(s))
// (common/counter_rng.h) and turns it into a pair of normals by Box-Muller with 16-bit
// uniforms:
//   u = f / 2^17, f = 2 (x & 0xFFFF) + 1                  (radius uniform, exact in fp32)
//   r = sqrt(-2 ln u)          (ln from a 32-entry table and a cubic; separate_kernels.cc)
//   a = (2 (x >> 18) + 1) * fp32(pi / 65536)              (angle in (0, pi/2), 14 bits)
//   half 0: r cos a with the sign of bit 16 of x;  half 1: r sin a with the sign of bit 17.
// The two sign bits reflect the first-quadrant angle into a uniform angle on the circle.
// Properties: |value| <= sqrt(2 ln 2^17) = 4.85 (the tail beyond, probability 1.2e-6, is
// cut); the radius takes 2^16 values and the angle 2^16; no value is 0; every radius and every
// angle is within 7e-7 of the exact Box-Muller value. Moments (tests/unit/separate_test.cc)
// E z^2 = 1 and E z^4 = 3 to well within 0.5%.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"

namespace bitpush::compressors::separate {

// Positions per group (one 32-bit hash per pair of positions q = 0, 1 of a lane).
inline constexpr uint32_t kGaussianGroup = 32;

// The value at position i of stream s (the scalar definition).
float GaussianAt(uint64_t stream, uint32_t i);

// The two values a lane hash x gives: half 0 (r cos a, sign of bit 16) and half 1 (r sin a,
// sign of bit 17), as defined above.
void GaussianPair(uint32_t x, float* cos_half, float* sin_half);

// out[k] = GaussianAt(stream, first + k) for k < count, on any level (same bits).
// first + count must not exceed 2^32 (positions are 32-bit).
void FillGaussians(uint64_t stream, uint32_t first, size_t count, float* out, IsaLevel isa);

}  // namespace bitpush::compressors::separate
