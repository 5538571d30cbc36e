// LoCo's element loops (compressors/loco/loco.h has the method and the format): the 4-bit
// quantiser with the fixed scale s, fused with LoCo's error step where a state is given, and
// the 4-bit decoder; the same three for the per-block absmax scale (the block's passes fused,
// one block at a time); and the helpers of the block-scale state. Scalar, AVX2 (fixed scale)
// and AVX-512 implementations; every ISA level writes the same bytes and the same state.
//
// Per element (fixed scale; step = fp32(1/s), step_e = fp32(1/s_e)):
//   e_prev = E[i] * step_e                          (int8 error; fp32 error: E[i])
//   h      = g[i] + e_prev
//   q      = clamp(round_half_even(h * s), -8, 7)   (the 4-bit code)
//   r      = fma(-q, step, h)                       (h - C(h), one rounding)
//   e_new  = beta == 1 ? r : fma(beta, r, (1 - beta) * e_prev)
//   E[i]   = reset ? 0 : clamp(round_half_even(e_new * s_e), -128, 127)   (int8)
//            reset ? 0 : e_new                                            (fp32)
// Codes are packed two per byte, element 2i in the low nibble, 2i+1 in the high nibble.
//
// Thread-safety: pure functions over the caller's buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"

namespace bitpush::compressors::loco {

// Telemetry of one pass (added to, not reset).
struct PassCounts {
  uint64_t saturated = 0;        // 4-bit codes clamped (round(h*s) outside [-8, 7])
  uint64_t error_saturated = 0;  // int8 error values clamped
  double error_sq = 0;           // sum of the new error's squares (dequantised)
  bool finite = true;            // false: some h was inf or NaN (the pass's output is garbage)
};

struct FixedScale {
  float s = 1;
  float step = 1;  // fp32(1/s)
};

// The LoCo error step's parameters (fixed scale).
struct ErrorStep {
  float se = 1;
  float step_e = 1;  // fp32(1/s_e)
  float beta = 1;
  bool reset = false;  // this round zeroes the error
};

// codes <- Q(x); residual (if not null) <- x - C(x) (r above, with h = x). n may be odd (the
// last high nibble is 0).
void QuantizeFixed(const float* x, size_t n, FixedScale fs, uint8_t* codes, float* residual,
                   PassCounts* counts, IsaLevel isa);

// LoCo's step with an int8 error E (in place) or an fp32 error E32 (in place; exactly one of
// the two is non-null).
void LocoStepFixed(const float* g, int8_t* e8, float* e32, size_t n, FixedScale fs, ErrorStep es,
                   uint8_t* codes, PassCounts* counts, IsaLevel isa);

// out[i] = code_i * step (add: out[i] += code_i * step).
void DecodeFixed(const uint8_t* codes, size_t n, float step, float* out, bool add, IsaLevel isa);

// The block scale (block = B, even; the last block may be shorter). Per block b of x:
//   a = max |x|,  step_b = a / 7,  s_b = a > 0 ? min(7 / a, FLT_MAX) : 0
//   q = clamp(round_half_even(x * s_b), -8, 7)   (-7..7 in practice: |x * s_b| <= 7 up to
//                                                 one rounding)
// steps (little-endian f32 per block) <- step_b; residual (may be null) <- fma(-q, step_b, x).
// A block holding an inf or NaN gets step NaN, codes 0 and residual 0, and counts->finite
// is cleared. Saturation is not counted (the absmax scale does not clip).
void QuantizeBlocks(const float* x, size_t n, uint32_t block, uint8_t* steps, uint8_t* codes,
                    float* residual, PassCounts* counts, IsaLevel isa);

// The block-scale error state: the int8 error E and one fp32 step per block (E * step_e_b
// decodes it).
struct BlockError {
  int8_t* e8 = nullptr;
  float* step_e = nullptr;  // ceil(n / block) steps
};

// LoCo's step with the block scale and the int8 error, fused per block (one block's values
// stay in `scratch`, min(n, block) floats, between the passes):
//   ep = E[i] * step_e_b,  h = g[i] + ep,  q and step_b of h as QuantizeBlocks
//   r  = fma(-q, step_b, h),  e = beta == 1 ? r : fma(beta, r, (1 - beta) * ep)
//   a_e = max |e|,  step_e_b = a_e / 127,
//   E[i] = a_e > 0 ? clamp(round_half_even(e * min(127 / a_e, FLT_MAX)), -127, 127) : 0
// reset: E = 0 and step_e_b = 0 instead. counts->error_sq += sum_b step_e_b^2 * sum E^2. A
// block with a non-finite h is written as QuantizeBlocks writes it and its error is left as
// it was (counts->finite is cleared: the caller resets the whole state).
void LocoStepBlocks(const float* g, size_t n, uint32_t block, float beta, bool reset,
                    BlockError err, float* scratch, uint8_t* steps, uint8_t* codes,
                    PassCounts* counts, IsaLevel isa);

// The block scale's decoder: out[i] = code_i * step_b (add: +=); steps little-endian f32.
void DecodeBlocks(const uint8_t* codes, size_t n, uint32_t block, const uint8_t* steps, float* out,
                  bool add, IsaLevel isa);

// The index of the first of `bytes` code bytes holding the code -8 in either nibble, or
// `bytes` if none does (the block quantiser never writes -8).
size_t FindCodeMinus8(const uint8_t* codes, size_t bytes, IsaLevel isa);

// Helpers of the block-scale state (same values on every level):
// max |x[i]| and whether every x[i] is finite.
float AbsMax(const float* x, size_t n, bool* finite, IsaLevel isa);
// r[i] = beta == 1 ? r[i] : fma(beta, r[i], (1 - beta) * ep[i]).
void MovingAverage(float* r, const float* ep, size_t n, float beta, IsaLevel isa);
// out[i] = clamp(round_half_even(e[i] * inv), -127, 127) (e finite).
void RequantizeInt8(const float* e, size_t n, float inv, int8_t* out, IsaLevel isa);
// out[i] = e[i] * step.
void DequantizeInt8(const int8_t* e, size_t n, float step, float* out, IsaLevel isa);

// round_half_even(clamp(t, lo, hi)) for integer bounds with |lo|, |hi| < 2^22, which equals
// clamp(round_half_even(t), lo, hi): the magic-number rounding is exact in that range and
// needs no library call (the SIMD kernels round with roundscale, to the same values).
inline int RoundClampCode(float t, float lo, float hi) {
  t = t < lo ? lo : t;
  t = t > hi ? hi : t;
  constexpr float kMagic = 0x1.8p23f;
  return static_cast<int>((t + kMagic) - kMagic);
}

// The 4-bit code of element i.
inline int Nibble(const uint8_t* codes, size_t i) {
  const int b = codes[i / 2];
  const int v = (i % 2 == 0) ? (b & 0xF) : (b >> 4);
  return v >= 8 ? v - 16 : v;
}

}  // namespace bitpush::compressors::loco
