// The AVX-512 half of the fused LANS kernel (optimizers/lans_kernels.h): 16 lanes, masked loads
// and stores for the tail, sums of squares in double (each float vector widened into two
// 8-lane double accumulators). Compiled with per-function target attributes, never -m flags.
#include <immintrin.h>

#include "common/cpu_features.h"
#include "optimizers/lans_kernels.h"

namespace bitpush::optimizers::internal {
namespace {

struct Consts512 {
  __m512 beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bc1, inv_bc2, eps, wd, gscale, one;
  bool eps_inside;
};

BP_TARGET_AVX512 inline Consts512 Broadcast(const LansConstants& k) {
  Consts512 c;
  c.beta1 = _mm512_set1_ps(k.beta1);
  c.one_minus_beta1 = _mm512_set1_ps(k.one_minus_beta1);
  c.beta2 = _mm512_set1_ps(k.beta2);
  c.one_minus_beta2 = _mm512_set1_ps(k.one_minus_beta2);
  c.inv_bc1 = _mm512_set1_ps(k.inv_bc1);
  c.inv_bc2 = _mm512_set1_ps(k.inv_bc2);
  c.eps = _mm512_set1_ps(k.eps);
  c.wd = _mm512_set1_ps(k.weight_decay);
  c.gscale = _mm512_set1_ps(k.grad_scale);
  c.one = _mm512_set1_ps(1.0f);
  c.eps_inside = k.eps_inside;
  return c;
}

// LansElement, 16 lanes, the same operations in the same order.
BP_TARGET_AVX512 inline void Directions(const Consts512& c, __m512 x, __m512 m, __m512 v, __m512 g,
                                        __m512* r, __m512* u) {
  const __m512 mh = _mm512_mul_ps(m, c.inv_bc1);
  const __m512 vh = _mm512_mul_ps(v, c.inv_bc2);
  const __m512 den = c.eps_inside ? _mm512_sqrt_ps(_mm512_add_ps(vh, c.eps))
                                  : _mm512_add_ps(_mm512_sqrt_ps(vh), c.eps);
  const __m512 inv = _mm512_div_ps(c.one, den);
  const __m512 wx = _mm512_mul_ps(c.wd, x);
  *r = _mm512_add_ps(_mm512_mul_ps(mh, inv), wx);
  *u = _mm512_add_ps(_mm512_mul_ps(g, inv), wx);
}

BP_TARGET_AVX512 inline void AccumulateSq(__m512 a, __m512d* lo, __m512d* hi) {
  const __m512d l = _mm512_cvtps_pd(_mm512_castps512_ps256(a));
  const __m512d h = _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1));
  *lo = _mm512_fmadd_pd(l, l, *lo);
  *hi = _mm512_fmadd_pd(h, h, *hi);
}

// Through memory rather than _mm512_reduce_add_pd, whose GCC 12 expansion warns
// (-Wuninitialized on _mm256_undefined_pd inside the intrinsic headers).
BP_TARGET_AVX512 inline double Sum(__m512d lo, __m512d hi) {
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(lo, hi));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// One vector of pass 1 (mask: the lanes to touch; loads of the others read as zeros, which add
// nothing to the sums: r = c = 0 there).
struct Acc512 {
  __m512d xl, xh, rl, rh, cl, ch;
};

BP_TARGET_AVX512 inline void Pass1Vector(const Consts512& c, const float* x, float* m, float* v,
                                         const float* g, size_t i, __mmask16 mask, Acc512* a) {
  const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i);
  const __m512 gv = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, g + i), c.gscale);
  const __m512 mv = _mm512_add_ps(_mm512_mul_ps(c.beta1, _mm512_maskz_loadu_ps(mask, m + i)),
                                  _mm512_mul_ps(c.one_minus_beta1, gv));
  const __m512 vv = _mm512_add_ps(_mm512_mul_ps(c.beta2, _mm512_maskz_loadu_ps(mask, v + i)),
                                  _mm512_mul_ps(c.one_minus_beta2, _mm512_mul_ps(gv, gv)));
  _mm512_mask_storeu_ps(m + i, mask, mv);
  _mm512_mask_storeu_ps(v + i, mask, vv);
  __m512 r, u;
  Directions(c, xv, mv, vv, gv, &r, &u);
  AccumulateSq(xv, &a->xl, &a->xh);
  AccumulateSq(r, &a->rl, &a->rh);
  AccumulateSq(u, &a->cl, &a->ch);
}

BP_TARGET_AVX512 inline void Pass2Vector(const Consts512& c, __m512 ur, __m512 uc, float* x,
                                         const float* m, const float* v, const float* g, size_t i,
                                         __mmask16 mask) {
  const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i);
  const __m512 gv = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, g + i), c.gscale);
  __m512 r, u;
  Directions(c, xv, _mm512_maskz_loadu_ps(mask, m + i), _mm512_maskz_loadu_ps(mask, v + i), gv, &r,
             &u);
  const __m512 step = _mm512_add_ps(_mm512_mul_ps(ur, r), _mm512_mul_ps(uc, u));
  _mm512_mask_storeu_ps(x + i, mask, _mm512_sub_ps(xv, step));
}

BP_TARGET_AVX512 inline __mmask16 TailMask(size_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

}  // namespace

BP_TARGET_AVX512 double GradSumSqAvx512(const float* g, size_t n) {
  __m512d l0 = _mm512_setzero_pd(), h0 = _mm512_setzero_pd();
  __m512d l1 = _mm512_setzero_pd(), h1 = _mm512_setzero_pd();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    AccumulateSq(_mm512_loadu_ps(g + i), &l0, &h0);
    AccumulateSq(_mm512_loadu_ps(g + i + 16), &l1, &h1);
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    AccumulateSq(_mm512_maskz_loadu_ps(left >= 16 ? 0xFFFF : TailMask(left), g + i), &l0, &h0);
  }
  return Sum(_mm512_add_pd(l0, l1), _mm512_add_pd(h0, h1));
}

BP_TARGET_AVX512 void Pass1Avx512(const LansConstants& k, const float* x, float* m, float* v,
                                  const float* g, size_t n, LansSums* sums) {
  const Consts512 c = Broadcast(k);
  Acc512 a;
  a.xl = a.xh = a.rl = a.rh = a.cl = a.ch = _mm512_setzero_pd();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) Pass1Vector(c, x, m, v, g, i, 0xFFFF, &a);
  if (i < n) Pass1Vector(c, x, m, v, g, i, TailMask(n - i), &a);
  sums->x += Sum(a.xl, a.xh);
  sums->r += Sum(a.rl, a.rh);
  sums->c += Sum(a.cl, a.ch);
}

BP_TARGET_AVX512 void Pass2Avx512(const LansConstants& k, const LansScales& s, float* x,
                                  const float* m, const float* v, const float* g, size_t n) {
  const Consts512 c = Broadcast(k);
  const __m512 ur = _mm512_set1_ps(s.ur);
  const __m512 uc = _mm512_set1_ps(s.uc);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) Pass2Vector(c, ur, uc, x, m, v, g, i, 0xFFFF);
  if (i < n) Pass2Vector(c, ur, uc, x, m, v, g, i, TailMask(n - i));
}

}  // namespace bitpush::optimizers::internal
