// The per-ISA halves of the fused LANS CPU kernel (optimizers/lans.h), private to
// bitpush_optimizers. lans.cc validates, computes the per-call constants in double, picks a
// level and runs pass 1 (moments + norms), the trust ratios, then pass 2 (the x update).
//
// Every level evaluates the element formula below with the same float operations in the same
// order (the library is compiled with -ffp-contract=off, so no level fuses a multiply and an
// add behind our back): m, v, r, c and the update term are bit-identical across levels. Only
// the three norms are summed in a different order (in double), which moves the two trust
// ratios by ~1e-16 relative, far below a float ulp. lans_test checks levels against each other
// to 1e-6 relative on x (in practice they agree exactly).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "optimizers/lans.h"

// The trust-ratio arithmetic is shared with the CUDA kernel (optimizers/lans_cuda.cu).
#ifdef __CUDACC__
#define BP_LANS_HD __host__ __device__
#else
#define BP_LANS_HD
#endif

namespace bitpush::optimizers::internal {

// Per-call constants (bias corrections computed in double once, then rounded to float).
struct LansConstants {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float inv_bc1 = 1;  // 1 / (1 - β1^t)
  float inv_bc2 = 1;  // 1 / (1 - β2^t)
  float eps = 0;
  bool eps_inside = false;  // EpsMode::kInsideSqrt
  float weight_decay = 0;
  float grad_scale = 1;  // 1 / ‖g‖ with normalize_grad (and a nonzero finite norm), else 1
};

// Pass 1's sums of squares, in double: ‖x‖², ‖r+λx‖², ‖c+λx‖².
struct LansSums {
  double x = 0;
  double r = 0;
  double c = 0;
};

// Pass 2's multipliers: ur = η β1 φ/‖r+λx‖ and uc = η (1-β1) φ/‖c+λx‖ (after the fallback),
// so x -= ur (r+λx) + uc (c+λx).
struct LansScales {
  float ur = 0;
  float uc = 0;
};

// What the trust ratios need besides the sums (all in double).
struct LansRatioInputs {
  double lr = 0;
  double beta1 = 0;
  double phi_lower = 0;
  double phi_upper = 0;
  bool fallback = true;
};

// φ(‖x‖)/‖u‖ for one term. With the fallback a ratio that is 0, infinite or NaN becomes 1; without
// it a term whose direction is all zeros (‖u‖ = 0) gets 0: it contributes nothing, where the
// formula as written would give 0·∞ = NaN.
BP_LANS_HD inline double LansTrustRatio(double phi, double unorm, bool fallback) {
  if (fallback) {
    const double t = phi / unorm;
    return (t > 0 && t <= DBL_MAX) ? t : 1.0;  // false for 0, inf and NaN
  }
  return unorm == 0 ? 0.0 : phi / unorm;
}

// Pass 2's multipliers from pass 1's sums of squares.
BP_LANS_HD inline LansScales LansTrustScales(const LansRatioInputs& in, const LansSums& s) {
  const double xnorm = sqrt(s.x);
  double phi = xnorm < in.phi_lower ? in.phi_lower : xnorm;
  phi = phi > in.phi_upper ? in.phi_upper : phi;
  const double tr = LansTrustRatio(phi, sqrt(s.r), in.fallback);
  const double tc = LansTrustRatio(phi, sqrt(s.c), in.fallback);
  LansScales out;
  out.ur = static_cast<float>(in.lr * in.beta1 * tr);
  out.uc = static_cast<float>(in.lr * (1.0 - in.beta1) * tc);
  return out;
}

// One element of both passes: from the updated m, v (and g, x) the two update directions
// r + λx and c + λx. The single reciprocal (1/den, then two multiplies) is part of the
// definition every level shares.
struct LansDirections {
  float r;
  float c;
};
BP_LANS_HD inline LansDirections LansElement(const LansConstants& k, float x, float m, float v,
                                             float g) {
  const float mh = m * k.inv_bc1;
  const float vh = v * k.inv_bc2;
  const float den = k.eps_inside ? sqrtf(vh + k.eps) : sqrtf(vh) + k.eps;
  const float inv = 1.0f / den;
  const float wx = k.weight_decay * x;
  return {mh * inv + wx, g * inv + wx};
}

// Pass 1 on element i (scalar; also the tails of the AVX2 kernel).
inline void LansPass1Element(const LansConstants& k, const float* x, float* m, float* v,
                             const float* g, size_t i, double* sx, double* sr, double* sc) {
  const float gi = g[i] * k.grad_scale;
  const float mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
  const float vi = k.beta2 * v[i] + k.one_minus_beta2 * (gi * gi);
  m[i] = mi;
  v[i] = vi;
  const LansDirections d = LansElement(k, x[i], mi, vi, gi);
  const double xd = x[i], rd = d.r, cd = d.c;
  *sx += xd * xd;
  *sr += rd * rd;
  *sc += cd * cd;
}

// Pass 2 on element i.
inline void LansPass2Element(const LansConstants& k, const LansScales& s, float* x, const float* m,
                             const float* v, const float* g, size_t i) {
  const float gi = g[i] * k.grad_scale;
  const LansDirections d = LansElement(k, x[i], m[i], v[i], gi);
  x[i] = x[i] - (s.ur * d.r + s.uc * d.c);
}

// Validates (options, lr, step) and computes the per-call constants: bias corrections in double
// once, then rounded. grad_scale is left at 1: the caller sets it from its own ‖g‖ pass.
Status PrepareLans(const LansOptions& options, float lr, uint64_t step, LansConstants* k,
                   LansRatioInputs* ratio);

// grad_scale for normalize_grad from Σ g²: 1/‖g‖, or 1 where that is not a finite number
// (a zero or overflowing norm leaves g~ as is).
BP_LANS_HD inline float LansGradScale(double sum_sq) {
  const double inv = 1.0 / sqrt(sum_sq);
  return (inv > 0 && inv <= FLT_MAX) ? static_cast<float>(inv) : 1.0f;
}

// Σ g² in double (the normalize_grad pre-pass).
double GradSumSqScalar(const float* g, size_t n);
void Pass1Scalar(const LansConstants& k, const float* x, float* m, float* v, const float* g,
                 size_t n, LansSums* sums);
void Pass2Scalar(const LansConstants& k, const LansScales& s, float* x, const float* m,
                 const float* v, const float* g, size_t n);

// AVX2 + FMA (8 lanes) and AVX-512 (16 lanes, masked tails); call only where the level is
// supported (common/cpu_features.h).
double GradSumSqAvx2(const float* g, size_t n);
void Pass1Avx2(const LansConstants& k, const float* x, float* m, float* v, const float* g, size_t n,
               LansSums* sums);
void Pass2Avx2(const LansConstants& k, const LansScales& s, float* x, const float* m,
               const float* v, const float* g, size_t n);

double GradSumSqAvx512(const float* g, size_t n);
void Pass1Avx512(const LansConstants& k, const float* x, float* m, float* v, const float* g,
                 size_t n, LansSums* sums);
void Pass2Avx512(const LansConstants& k, const LansScales& s, float* x, const float* m,
                 const float* v, const float* g, size_t n);

}  // namespace bitpush::optimizers::internal
