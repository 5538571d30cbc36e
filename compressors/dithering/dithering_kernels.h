// Kernels of the dithering compressor (compressors/dithering/dithering.h): norms, stochastic
// quantisation + bit-sliced packing (with fused error-feedback decode-and-subtract), and
// unpacking. Each exists as scalar C++, AVX2 and AVX-512, dispatched on an explicit IsaLevel;
// all levels produce bit-identical blocks, residuals and decoded values (integer RNG, the
// same float operations in the same order, fixed lane structure for the l2 sum).
//
// Block layout (see docs/dithering.md): block j covers elements 64j..64j+63 and is
// (bits + 1) little-endian u64 words: word 0 = sign bits (bit t set iff element 64j+t is
// negative and its code is nonzero), word 1+p = bit p of every element's code.
//
// Internal to the compressor; callers validate their inputs (the decoder runs on validated
// blocks only). Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"

namespace bitpush::compressors::dithering {

inline constexpr size_t kBlockElements = 64;
inline constexpr uint32_t kMaxCodes = 256;  // codes are in [0, s], s <= 255

// ceil(log2(s + 1)): bits per code.
inline uint32_t BitsForLevels(uint32_t s) {
  uint32_t b = 0;
  while ((uint64_t{1} << b) <= s) ++b;
  return b;
}

// The code -> magnitude map of one call (scale finite and >= 0):
//   linear:  L(c) = c == s ? scale : float(c) * step,  step = scale / s
//   natural: L(c) = c == 0 ? 0 : scale * 2^(c - s)     (an exact power-of-two multiply)
// table[c] = L(c) for c <= s and 0 above; SIMD kernels either index it or compute the same
// formula with the same float operations.
struct Levels {
  uint32_t s = 0;
  uint32_t bits = 0;
  bool natural = false;
  float scale = 0.0f;
  float step = 0.0f;
  alignas(64) float table[kMaxCodes];
};
void InitLevels(uint32_t s, bool natural, float scale, Levels* out);

struct QuantizeArgs {
  const Levels* levels = nullptr;
  // t_i = (|x_i| * prescale) * factor; prescale is 1 except for scales below 2^-64, where it
  // is 2^64 and only the scalar kernel runs (the dispatcher enforces it).
  float factor = 0.0f;
  float prescale = 1.0f;
  uint64_t stream = 0;  // CounterRandom32 stream; element i uses counter uint32_t(i)
};

// Largest |x_i| as raw fp32 bits (0 for n == 0); > 0x7F800000 means a NaN was seen,
// == 0x7F800000 an infinity.
uint32_t MaxAbsBits(const float* x, size_t n, IsaLevel isa);
// e[i] += g[i], then MaxAbsBits of the new e.
uint32_t AddMaxAbsBits(const float* g, float* e, size_t n, IsaLevel isa);
// sum x_i^2 in double over 32 fixed lanes (lane = i mod 32, combined in lane order):
// bit-identical across levels. Not finite iff some x_i is not finite.
double SumSquares(const float* x, size_t n, IsaLevel isa);
// e[i] += g[i], then SumSquares of the new e.
double AddSumSquares(const float* g, float* e, size_t n, IsaLevel isa);

// Quantises x[0..n) into ceil(n/64) blocks written to `blocks` (unaligned is fine).
void QuantizePack(const float* x, size_t n, const QuantizeArgs& args, uint8_t* blocks,
                  IsaLevel isa);
// As QuantizePack, and q[i] <- q[i] - decoded[i] in the same pass.
void QuantizePackFeedback(float* q, size_t n, const QuantizeArgs& args, uint8_t* blocks,
                          IsaLevel isa);

// Decodes validated blocks (every code <= s): out[i] = or += sign_i * L(code_i).
void DecodeBlocks(const uint8_t* blocks, size_t n, const Levels& levels, float* out, bool add,
                  IsaLevel isa);

}  // namespace bitpush::compressors::dithering
