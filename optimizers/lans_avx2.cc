// The AVX2 half of the fused LANS kernel (optimizers/lans_kernels.h): 8 lanes, the scalar
// element functions for the tail, sums of squares in double (each float vector widened into two
// 4-lane double accumulators). Compiled with per-function target attributes, never -m flags.
#include <immintrin.h>

#include "common/cpu_features.h"
#include "optimizers/lans_kernels.h"

namespace bitpush::optimizers::internal {
namespace {

struct Consts256 {
  __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bc1, inv_bc2, eps, wd, gscale, one;
  bool eps_inside;
};

BP_TARGET_AVX2 inline Consts256 Broadcast(const LansConstants& k) {
  Consts256 c;
  c.beta1 = _mm256_set1_ps(k.beta1);
  c.one_minus_beta1 = _mm256_set1_ps(k.one_minus_beta1);
  c.beta2 = _mm256_set1_ps(k.beta2);
  c.one_minus_beta2 = _mm256_set1_ps(k.one_minus_beta2);
  c.inv_bc1 = _mm256_set1_ps(k.inv_bc1);
  c.inv_bc2 = _mm256_set1_ps(k.inv_bc2);
  c.eps = _mm256_set1_ps(k.eps);
  c.wd = _mm256_set1_ps(k.weight_decay);
  c.gscale = _mm256_set1_ps(k.grad_scale);
  c.one = _mm256_set1_ps(1.0f);
  c.eps_inside = k.eps_inside;
  return c;
}

// LansElement, 8 lanes, the same operations in the same order.
BP_TARGET_AVX2 inline void Directions(const Consts256& c, __m256 x, __m256 m, __m256 v, __m256 g,
                                      __m256* r, __m256* u) {
  const __m256 mh = _mm256_mul_ps(m, c.inv_bc1);
  const __m256 vh = _mm256_mul_ps(v, c.inv_bc2);
  const __m256 den = c.eps_inside ? _mm256_sqrt_ps(_mm256_add_ps(vh, c.eps))
                                  : _mm256_add_ps(_mm256_sqrt_ps(vh), c.eps);
  const __m256 inv = _mm256_div_ps(c.one, den);
  const __m256 wx = _mm256_mul_ps(c.wd, x);
  *r = _mm256_add_ps(_mm256_mul_ps(mh, inv), wx);
  *u = _mm256_add_ps(_mm256_mul_ps(g, inv), wx);
}

BP_TARGET_AVX2 inline void AccumulateSq(__m256 a, __m256d* lo, __m256d* hi) {
  const __m256d l = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
  const __m256d h = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
  *lo = _mm256_fmadd_pd(l, l, *lo);
  *hi = _mm256_fmadd_pd(h, h, *hi);
}

BP_TARGET_AVX2 inline double Sum(__m256d lo, __m256d hi) {
  const __m256d s = _mm256_add_pd(lo, hi);
  const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
}

}  // namespace

BP_TARGET_AVX2 double GradSumSqAvx2(const float* g, size_t n) {
  __m256d l0 = _mm256_setzero_pd(), h0 = _mm256_setzero_pd();
  __m256d l1 = _mm256_setzero_pd(), h1 = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    AccumulateSq(_mm256_loadu_ps(g + i), &l0, &h0);
    AccumulateSq(_mm256_loadu_ps(g + i + 8), &l1, &h1);
  }
  for (; i + 8 <= n; i += 8) AccumulateSq(_mm256_loadu_ps(g + i), &l0, &h0);
  double s = Sum(_mm256_add_pd(l0, l1), _mm256_add_pd(h0, h1));
  for (; i < n; ++i) {
    const double gd = g[i];
    s += gd * gd;
  }
  return s;
}

BP_TARGET_AVX2 void Pass1Avx2(const LansConstants& k, const float* x, float* m, float* v,
                              const float* g, size_t n, LansSums* sums) {
  const Consts256 c = Broadcast(k);
  __m256d xl = _mm256_setzero_pd(), xh = xl, rl = xl, rh = xl, cl = xl, ch = xl;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 gv = _mm256_mul_ps(_mm256_loadu_ps(g + i), c.gscale);
    const __m256 mv = _mm256_add_ps(_mm256_mul_ps(c.beta1, _mm256_loadu_ps(m + i)),
                                    _mm256_mul_ps(c.one_minus_beta1, gv));
    const __m256 vv = _mm256_add_ps(_mm256_mul_ps(c.beta2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(c.one_minus_beta2, _mm256_mul_ps(gv, gv)));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    __m256 r, u;
    Directions(c, xv, mv, vv, gv, &r, &u);
    AccumulateSq(xv, &xl, &xh);
    AccumulateSq(r, &rl, &rh);
    AccumulateSq(u, &cl, &ch);
  }
  double sx = Sum(xl, xh), sr = Sum(rl, rh), sc = Sum(cl, ch);
  for (; i < n; ++i) LansPass1Element(k, x, m, v, g, i, &sx, &sr, &sc);
  sums->x += sx;
  sums->r += sr;
  sums->c += sc;
}

BP_TARGET_AVX2 void Pass2Avx2(const LansConstants& k, const LansScales& s, float* x, const float* m,
                              const float* v, const float* g, size_t n) {
  const Consts256 c = Broadcast(k);
  const __m256 ur = _mm256_set1_ps(s.ur);
  const __m256 uc = _mm256_set1_ps(s.uc);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 gv = _mm256_mul_ps(_mm256_loadu_ps(g + i), c.gscale);
    __m256 r, u;
    Directions(c, xv, _mm256_loadu_ps(m + i), _mm256_loadu_ps(v + i), gv, &r, &u);
    const __m256 step = _mm256_add_ps(_mm256_mul_ps(ur, r), _mm256_mul_ps(uc, u));
    _mm256_storeu_ps(x + i, _mm256_sub_ps(xv, step));
  }
  for (; i < n; ++i) LansPass2Element(k, s, x, m, v, g, i);
}

}  // namespace bitpush::optimizers::internal
