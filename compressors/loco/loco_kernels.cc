// Every level must compute the same bits: no mul-add pair may be fused behind our back (GCC
// contracts them by default where the target has FMA); the fused steps are written as fma.
#pragma GCC optimize("fp-contract=off")

#include "compressors/loco/loco_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/little_endian.h"

namespace bitpush::compressors::loco {
namespace {

// ---- scalar: the definition every other level reproduces bit for bit --------------------

inline bool Finite(float h) {
  return h - h == 0.0f;
}

inline int RoundClamp(float t, float lo, float hi) {
  return RoundClampCode(t, lo, hi);
}

// The code of h, counting saturation and non-finite values.
inline int Code(float h, const FixedScale& fs, PassCounts* c) {
  if (!Finite(h)) {
    c->finite = false;
    return 0;
  }
  const float t = h * fs.s;
  if (t >= 7.5f || t < -8.5f) ++c->saturated;
  return RoundClamp(t, -8.0f, 7.0f);
}

inline void Put(uint8_t* codes, size_t i, int q) {
  const uint8_t v = static_cast<uint8_t>(q & 0xF);
  if (i % 2 == 0) {
    codes[i / 2] = v;
  } else {
    codes[i / 2] = static_cast<uint8_t>(codes[i / 2] | (v << 4));
  }
}

void QuantizeScalar(const float* x, size_t begin, size_t n, FixedScale fs, uint8_t* codes,
                    float* residual, PassCounts* c) {
  for (size_t i = begin; i < n; ++i) {
    const int q = Code(x[i], fs, c);
    Put(codes, i, q);
    if (residual != nullptr) residual[i] = std::fmaf(-static_cast<float>(q), fs.step, x[i]);
  }
}

void StepScalar(const float* g, int8_t* e8, float* e32, size_t begin, size_t n, FixedScale fs,
                ErrorStep es, uint8_t* codes, PassCounts* c) {
  const float omb = 1.0f - es.beta;
  const bool beta_one = es.beta == 1.0f;
  double sq = 0;
  for (size_t i = begin; i < n; ++i) {
    const float ep = e8 != nullptr ? static_cast<float>(e8[i]) * es.step_e : e32[i];
    const float h = g[i] + ep;
    const int q = Code(h, fs, c);
    Put(codes, i, q);
    const float r = std::fmaf(-static_cast<float>(q), fs.step, h);
    const float en = beta_one ? r : std::fmaf(es.beta, r, omb * ep);
    if (e8 != nullptr) {
      int v = 0;
      if (!es.reset) {
        const float t = en * es.se;
        if (t >= 127.5f || t < -128.5f) ++c->error_saturated;
        v = Finite(t) ? RoundClamp(t, -128.0f, 127.0f) : 0;
      }
      e8[i] = static_cast<int8_t>(v);
      const float d = static_cast<float>(v) * es.step_e;
      sq += static_cast<double>(d) * d;
    } else {
      e32[i] = es.reset ? 0.0f : en;
      sq += static_cast<double>(e32[i]) * e32[i];
    }
  }
  c->error_sq += sq;
}

void DecodeScalar(const uint8_t* codes, size_t begin, size_t n, float step, float* out, bool add) {
  for (size_t i = begin; i < n; ++i) {
    const float v = static_cast<float>(Nibble(codes, i)) * step;
    out[i] = add ? out[i] + v : v;
  }
}

// ---- scalar: the block scale's passes over one block (also the SIMD passes' tails) -------

constexpr float kFloatMax = std::numeric_limits<float>::max();

struct BlockQuant {
  float s = 0;
  float step = 0;
};

// A block's quantiser from its absmax a: 7 / a capped at FLT_MAX, so a subnormal absmax
// gives a finite scale (0 * s stays 0) on every level.
inline BlockQuant BlockQuantOf(float a) {
  BlockQuant b;
  b.s = a > 0 ? std::min(7.0f / a, kFloatMax) : 0.0f;
  b.step = a / 7.0f;
  return b;
}

// h[i] = g[i] + E[i] * step_e for i in [i, m); max |h| into *amax, *finite cleared on inf/NaN.
void SumScalar(const float* g, const int8_t* e8, float step_e, size_t i, size_t m, float* h,
               float* amax, bool* finite) {
  for (; i < m; ++i) {
    const float v = g[i] + static_cast<float>(e8[i]) * step_e;
    h[i] = v;
    if (!Finite(v)) *finite = false;
    *amax = std::max(*amax, std::fabs(v));
  }
}

// The parameters of one block's quantise pass.
struct QuantPass {
  BlockQuant bq;
  const int8_t* e8 = nullptr;  // the old error (LoCo's step); null: out = the residual
  float step_e = 0;            // its step
  float beta = 1;
};

// codes of h[i, m); out (may be null; may alias h) <- the residual or, with an error, the new
// error e; max |out| into *amax.
void QuantScalar(const float* h, size_t i, size_t m, const QuantPass& p, uint8_t* codes, float* out,
                 float* amax) {
  const float omb = 1.0f - p.beta;
  for (; i < m; ++i) {
    const float v = h[i];
    const int q = RoundClamp(v * p.bq.s, -8.0f, 7.0f);
    Put(codes, i, q);
    if (out == nullptr) continue;
    float r = std::fmaf(-static_cast<float>(q), p.bq.step, v);
    if (p.e8 != nullptr && p.beta != 1.0f) {
      r = std::fmaf(p.beta, r, omb * (static_cast<float>(p.e8[i]) * p.step_e));
    }
    out[i] = r;
    *amax = std::max(*amax, std::fabs(r));
  }
}

// E[i] = clamp(round_half_even(e[i] * inv), -127, 127); the sum of E^2 into *sq.
void RequantScalar(const float* e, size_t i, size_t m, float inv, int8_t* e8, uint64_t* sq) {
  for (; i < m; ++i) {
    const int v = RoundClamp(e[i] * inv, -127.0f, 127.0f);
    e8[i] = static_cast<int8_t>(v);
    *sq += static_cast<uint64_t>(v * v);
  }
}

// ---- AVX2 ------------------------------------------------------------------------------

BP_TARGET_AVX2 inline __m256i Sub1Where(__m256i count, __m256 mask) {
  return _mm256_sub_epi32(count, _mm256_castps_si256(mask));  // all-ones lanes are -1
}

BP_TARGET_AVX2 inline uint64_t Sum8(__m256i v) {
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  uint64_t t = 0;
  for (uint32_t x : lanes) t += x;
  return t;
}

struct Codes256 {
  __m256i q;
  __m256 qf;
};

// As Code512: r = round_half_even(h * s), q = clamp(r, -8, 7), r != q is saturated.
BP_TARGET_AVX2 inline Codes256 Code256(__m256 h, __m256 s, __m256* bad, __m256i* sat) {
  *bad = _mm256_or_ps(*bad, _mm256_cmp_ps(_mm256_sub_ps(h, h), _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256 r =
      _mm256_round_ps(_mm256_mul_ps(h, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 qf = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-8.0f)), _mm256_set1_ps(7.0f));
  *sat = Sub1Where(*sat, _mm256_cmp_ps(r, qf, _CMP_NEQ_OQ));
  return {_mm256_cvttps_epi32(qf), qf};
}

// 32 int32 in [-128, 127] (four vectors) -> 32 int8 in element order.
BP_TARGET_AVX2 inline __m256i Int8x32(const __m256i v[4]) {
  return _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 32 codes (four vectors of int32 in [-8, 7]) -> 16 bytes, element 2i low nibble.
BP_TARGET_AVX2 inline void Pack32Avx2(const __m256i q[4], uint8_t* out) {
  const __m256i b = Int8x32(q);
  const __m256i lo = _mm256_and_si256(b, _mm256_set1_epi16(0x000F));
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00F0));
  const __m256i w = _mm256_or_si256(lo, hi);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

BP_TARGET_AVX2 size_t QuantizeAvx2(const float* x, size_t n, FixedScale fs, uint8_t* codes,
                                   float* residual, PassCounts* c) {
  const __m256 s = _mm256_set1_ps(fs.s);
  const __m256 step = _mm256_set1_ps(fs.step);
  __m256 bad = _mm256_setzero_ps();
  __m256i sat = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 h = _mm256_loadu_ps(x + i + 8 * k);
      const Codes256 a = Code256(h, s, &bad, &sat);
      q[k] = a.q;
      if (residual != nullptr) {
        _mm256_storeu_ps(residual + i + 8 * k, _mm256_fnmadd_ps(a.qf, step, h));
      }
    }
    Pack32Avx2(q, codes + i / 2);
  }
  c->saturated += Sum8(sat);
  if (_mm256_movemask_ps(bad) != 0) c->finite = false;
  return i;
}

BP_TARGET_AVX2 size_t StepAvx2(const float* g, int8_t* e8, size_t n, FixedScale fs, ErrorStep es,
                               uint8_t* codes, PassCounts* c) {
  const __m256 s = _mm256_set1_ps(fs.s);
  const __m256 step = _mm256_set1_ps(fs.step);
  const __m256 se = _mm256_set1_ps(es.se);
  const __m256 step_e = _mm256_set1_ps(es.step_e);
  const __m256 beta = _mm256_set1_ps(es.beta);
  const __m256 omb = _mm256_set1_ps(1.0f - es.beta);
  const bool beta_one = es.beta == 1.0f;
  __m256 bad = _mm256_setzero_ps();
  __m256i sat = _mm256_setzero_si256(), esat = _mm256_setzero_si256();
  __m256 sq = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4], e[4];
    for (int k = 0; k < 4; ++k) {
      const size_t j = i + 8 * static_cast<size_t>(k);
      const __m128i eb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(e8 + j));
      const __m256 ep = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eb)), step_e);
      const __m256 h = _mm256_add_ps(_mm256_loadu_ps(g + j), ep);
      const Codes256 a = Code256(h, s, &bad, &sat);
      q[k] = a.q;
      const __m256 r = _mm256_fnmadd_ps(a.qf, step, h);
      const __m256 en = beta_one ? r : _mm256_fmadd_ps(beta, r, _mm256_mul_ps(omb, ep));
      __m256i ei = _mm256_setzero_si256();
      if (!es.reset) {
        const __m256 re =
            _mm256_round_ps(_mm256_mul_ps(en, se), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 qe =
            _mm256_min_ps(_mm256_max_ps(re, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
        esat = Sub1Where(esat, _mm256_cmp_ps(re, qe, _CMP_NEQ_OQ));
        ei = _mm256_cvttps_epi32(qe);
        sq = _mm256_fmadd_ps(qe, qe, sq);
      }
      e[k] = ei;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(e8 + i), Int8x32(e));
    Pack32Avx2(q, codes + i / 2);
  }
  c->saturated += Sum8(sat);
  c->error_saturated += Sum8(esat);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sq);
  double total = 0;
  for (float v : lanes) total += static_cast<double>(v);
  c->error_sq += total * static_cast<double>(es.step_e) * static_cast<double>(es.step_e);
  if (_mm256_movemask_ps(bad) != 0) c->finite = false;
  return i;
}

BP_TARGET_AVX2 size_t DecodeAvx2(const uint8_t* codes, size_t n, float step, float* out, bool add) {
  // Element j of a 32-bit word is bits [4j, 4j + 4): shift it to the top, then down signed.
  const __m256i shl = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
  const __m256 vs = _mm256_set1_ps(step);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint32_t w;
    __builtin_memcpy(&w, codes + i / 2, sizeof w);
    const __m256i v =
        _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shl), 28);
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), vs);
    if (add) f = _mm256_add_ps(_mm256_loadu_ps(out + i), f);
    _mm256_storeu_ps(out + i, f);
  }
  return i;
}

BP_TARGET_AVX2 size_t MovingAverageAvx2(float* r, const float* ep, size_t n, float beta) {
  const __m256 b = _mm256_set1_ps(beta);
  const __m256 omb = _mm256_set1_ps(1.0f - beta);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(r + i, _mm256_fmadd_ps(b, _mm256_loadu_ps(r + i),
                                            _mm256_mul_ps(omb, _mm256_loadu_ps(ep + i))));
  }
  return i;
}

// ---- AVX-512 ---------------------------------------------------------------------------

// 32 codes (two vectors of int32 in [-8, 7]) -> 16 bytes, element 2i low nibble.
BP_TARGET_AVX512 inline void Pack32(__m512i q0, __m512i q1, uint8_t* out) {
  const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)),
                                            _mm512_cvtepi32_epi8(q1), 1);
  const __m256i lo = _mm256_and_si256(b, _mm256_set1_epi16(0x000F));
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00F0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtepi16_epi8(_mm256_or_si256(lo, hi)));
}

struct Codes512 {
  __m512i q;
  __m512 qf;
};

// h's codes: r = round_half_even(h * s) (roundscale), q = clamp(r, -8, 7); r != q counts as
// saturated (a non-finite h is flagged in *bad; its code does not matter).
BP_TARGET_AVX512 inline Codes512 Code512(__m512 h, __m512 s, __mmask16* bad, __m512i* sat) {
  *bad |= _mm512_fpclass_ps_mask(h, 0x99);  // QNaN | SNaN | +inf | -inf
  const __m512 r =
      _mm512_roundscale_ps(_mm512_mul_ps(h, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 qf = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-8.0f)), _mm512_set1_ps(7.0f));
  const __mmask16 m = _mm512_cmp_ps_mask(r, qf, _CMP_NEQ_OQ);
  *sat = _mm512_mask_sub_epi32(*sat, m, *sat, _mm512_set1_epi32(-1));
  return {_mm512_cvttps_epi32(qf), qf};
}

BP_TARGET_AVX512 inline uint64_t Sum(__m512i v) {
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, v);
  uint64_t t = 0;
  for (uint32_t x : lanes) t += x;
  return t;
}

// The largest lane of v (by shuffles; GCC's _mm512_reduce_max_ps warns in its header).
BP_TARGET_AVX512 inline float MaxLane(__m512 v) {
  const __m256 a = _mm256_max_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_max_ps(b, _mm_movehl_ps(b, b));
  b = _mm_max_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

BP_TARGET_AVX512 size_t QuantizeAvx512(const float* x, size_t n, FixedScale fs, uint8_t* codes,
                                       float* residual, PassCounts* c) {
  const __m512 s = _mm512_set1_ps(fs.s);
  const __m512 step = _mm512_set1_ps(fs.step);
  __mmask16 bad = 0;
  __m512i sat = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 h0 = _mm512_loadu_ps(x + i);
    const __m512 h1 = _mm512_loadu_ps(x + i + 16);
    const Codes512 a = Code512(h0, s, &bad, &sat);
    const Codes512 b = Code512(h1, s, &bad, &sat);
    Pack32(a.q, b.q, codes + i / 2);
    if (residual != nullptr) {
      _mm512_storeu_ps(residual + i, _mm512_fnmadd_ps(a.qf, step, h0));
      _mm512_storeu_ps(residual + i + 16, _mm512_fnmadd_ps(b.qf, step, h1));
    }
  }
  c->saturated += Sum(sat);
  if (bad != 0) c->finite = false;
  return i;
}

BP_TARGET_AVX512 size_t StepAvx512(const float* g, int8_t* e8, size_t n, FixedScale fs,
                                   ErrorStep es, uint8_t* codes, PassCounts* c) {
  const __m512 s = _mm512_set1_ps(fs.s);
  const __m512 step = _mm512_set1_ps(fs.step);
  const __m512 se = _mm512_set1_ps(es.se);
  const __m512 step_e = _mm512_set1_ps(es.step_e);
  const __m512 beta = _mm512_set1_ps(es.beta);
  const __m512 omb = _mm512_set1_ps(1.0f - es.beta);
  const bool beta_one = es.beta == 1.0f;
  __mmask16 bad = 0;
  __m512i sat = _mm512_setzero_si512(), esat = _mm512_setzero_si512();
  __m512 sq = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i q[2];
    for (int half = 0; half < 2; ++half) {
      const size_t k = i + 16 * static_cast<size_t>(half);
      const __m128i eb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e8 + k));
      const __m512 ep = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(eb)), step_e);
      const __m512 h = _mm512_add_ps(_mm512_loadu_ps(g + k), ep);
      const Codes512 a = Code512(h, s, &bad, &sat);
      q[half] = a.q;
      const __m512 r = _mm512_fnmadd_ps(a.qf, step, h);
      const __m512 en = beta_one ? r : _mm512_fmadd_ps(beta, r, _mm512_mul_ps(omb, ep));
      __m512i ei = _mm512_setzero_si512();
      if (!es.reset) {
        const __m512 re = _mm512_roundscale_ps(_mm512_mul_ps(en, se),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 qe =
            _mm512_min_ps(_mm512_max_ps(re, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
        const __mmask16 m = _mm512_cmp_ps_mask(re, qe, _CMP_NEQ_OQ);
        esat = _mm512_mask_sub_epi32(esat, m, esat, _mm512_set1_epi32(-1));
        ei = _mm512_cvttps_epi32(qe);
        sq = _mm512_fmadd_ps(qe, qe, sq);  // in int8 units; scaled by step_e^2 below
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(e8 + k), _mm512_cvtepi32_epi8(ei));
    }
    Pack32(q[0], q[1], codes + i / 2);
  }
  c->saturated += Sum(sat);
  c->error_saturated += Sum(esat);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sq);
  double total = 0;
  for (float v : lanes) total += static_cast<double>(v);
  c->error_sq += total * static_cast<double>(es.step_e) * static_cast<double>(es.step_e);
  if (bad != 0) c->finite = false;
  return i;
}

BP_TARGET_AVX512 size_t DecodeAvx512(const uint8_t* codes, size_t n, float step, float* out,
                                     bool add) {
  const __m512i idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i shl =
      _mm512_set_epi32(24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28);
  const __m512 vs = _mm512_set1_ps(step);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint64_t w;
    __builtin_memcpy(&w, codes + i / 2, sizeof w);
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(w)));
    const __m512i v =
        _mm512_srai_epi32(_mm512_sllv_epi32(_mm512_permutexvar_epi32(idx, bytes), shl), 28);
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), vs);
    if (add) f = _mm512_add_ps(_mm512_loadu_ps(out + i), f);
    _mm512_storeu_ps(out + i, f);
  }
  return i;
}

BP_TARGET_AVX512 inline size_t AbsMaxAvx512(const float* x, size_t n, bool* finite, float* out) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  __m512 m = _mm512_setzero_ps();
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    bad |= _mm512_fpclass_ps_mask(v, 0x99);
    m = _mm512_max_ps(m, _mm512_and_ps(v, abs_mask));
  }
  *out = MaxLane(m);
  if (bad != 0) *finite = false;
  return i;
}

BP_TARGET_AVX512 size_t MovingAverageAvx512(float* r, const float* ep, size_t n, float beta) {
  const __m512 b = _mm512_set1_ps(beta);
  const __m512 omb = _mm512_set1_ps(1.0f - beta);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v =
        _mm512_fmadd_ps(b, _mm512_loadu_ps(r + i), _mm512_mul_ps(omb, _mm512_loadu_ps(ep + i)));
    _mm512_storeu_ps(r + i, v);
  }
  return i;
}

BP_TARGET_AVX512 size_t RequantizeAvx512(const float* e, size_t n, float inv, int8_t* out) {
  const __m512 vi = _mm512_set1_ps(inv);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(e + i), vi);
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    const __m512i q = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(q));
  }
  return i;
}

BP_TARGET_AVX512 size_t DequantizeAvx512(const int8_t* e, size_t n, float step, float* out) {
  const __m512 vs = _mm512_set1_ps(step);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e + i));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), vs));
  }
  return i;
}

// ---- AVX-512: the block scale's passes (the whole 16- or 32-element chunks of a block) ----

BP_TARGET_AVX512 inline size_t SumAvx512(const float* g, const int8_t* e8, float step_e, size_t m,
                                         float* h, float* amax, bool* finite) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 vs = _mm512_set1_ps(step_e);
  __m512 mx = _mm512_setzero_ps();
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e8 + i));
    const __m512 ep = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), vs);
    const __m512 v = _mm512_add_ps(_mm512_loadu_ps(g + i), ep);
    _mm512_storeu_ps(h + i, v);
    bad |= _mm512_fpclass_ps_mask(v, 0x99);
    mx = _mm512_max_ps(mx, _mm512_and_ps(v, abs_mask));
  }
  *amax = std::max(*amax, MaxLane(mx));
  if (bad != 0) *finite = false;
  return i;
}

BP_TARGET_AVX512 inline size_t QuantAvx512(const float* h, size_t m, const QuantPass& p,
                                           uint8_t* codes, float* out, float* amax) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 s = _mm512_set1_ps(p.bq.s);
  const __m512 step = _mm512_set1_ps(p.bq.step);
  const __m512 step_e = _mm512_set1_ps(p.step_e);
  const __m512 beta = _mm512_set1_ps(p.beta);
  const __m512 omb = _mm512_set1_ps(1.0f - p.beta);
  const bool mix = p.e8 != nullptr && p.beta != 1.0f;
  __m512 mx = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= m; i += 32) {
    __m512i q[2];
    for (int half = 0; half < 2; ++half) {
      const size_t k = i + 16 * static_cast<size_t>(half);
      const __m512 v = _mm512_loadu_ps(h + k);
      const __m512 r =
          _mm512_roundscale_ps(_mm512_mul_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 qf =
          _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-8.0f)), _mm512_set1_ps(7.0f));
      q[half] = _mm512_cvttps_epi32(qf);
      if (out == nullptr) continue;
      __m512 e = _mm512_fnmadd_ps(qf, step, v);
      if (mix) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.e8 + k));
        const __m512 ep = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), step_e);
        e = _mm512_fmadd_ps(beta, e, _mm512_mul_ps(omb, ep));
      }
      _mm512_storeu_ps(out + k, e);
      mx = _mm512_max_ps(mx, _mm512_and_ps(e, abs_mask));
    }
    Pack32(q[0], q[1], codes + i / 2);
  }
  *amax = std::max(*amax, MaxLane(mx));
  return i;
}

BP_TARGET_AVX512 inline size_t RequantAvx512(const float* e, size_t m, float inv, int8_t* e8,
                                             uint64_t* sq) {
  const __m512 vi = _mm512_set1_ps(inv);
  size_t i = 0;
  // int32 lanes hold at most 2^16 squares of 127^2 each before they are summed into *sq.
  constexpr size_t kFlush = size_t{16} << 16;
  while (i + 16 <= m) {
    const size_t end = std::min(m - (m - i) % 16, i + kFlush);
    __m512i acc = _mm512_setzero_si512();
    for (; i < end; i += 16) {
      __m512 t = _mm512_mul_ps(_mm512_loadu_ps(e + i), vi);
      t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
      const __m512i q = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(e8 + i), _mm512_cvtepi32_epi8(q));
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(q, q));
    }
    *sq += Sum(acc);
  }
  return i;
}

// LocoStepBlocks' block of m elements, m a multiple of 32, in AVX-512 throughout (the
// passes inlined); the same values as the generic loop. Returns false for a non-finite block
// (nothing written).
BP_TARGET_AVX512 bool StepBlockAvx512(const float* g, int8_t* e8, float* step_e, size_t m,
                                      float beta, bool reset, float* h, uint8_t* codes, float* step,
                                      double* sq) {
  bool finite = true;
  float a = 0;
  SumAvx512(g, e8, *step_e, m, h, &a, &finite);
  if (!finite) return false;
  QuantPass p;
  p.bq = BlockQuantOf(a);
  p.e8 = e8;
  p.step_e = *step_e;
  p.beta = beta;
  float ae = 0;
  QuantAvx512(h, m, p, codes, h, &ae);
  *step = p.bq.step;
  if (reset || !(ae > 0)) {
    std::fill(e8, e8 + m, int8_t{0});
    *step_e = 0;
    return true;
  }
  uint64_t isq = 0;
  RequantAvx512(h, m, std::min(127.0f / ae, kFloatMax), e8, &isq);
  *step_e = ae / 127.0f;
  *sq += static_cast<double>(isq) * static_cast<double>(*step_e) * static_cast<double>(*step_e);
  return true;
}

// QuantizeBlocks' block of m elements, m a multiple of 32, in AVX-512 throughout. Returns
// false for a non-finite block (nothing written).
BP_TARGET_AVX512 bool QuantizeBlockAvx512(const float* x, size_t m, uint8_t* codes, float* residual,
                                          float* step) {
  bool finite = true;
  float a = 0;
  AbsMaxAvx512(x, m, &finite, &a);
  if (!finite) return false;
  QuantPass p;
  p.bq = BlockQuantOf(a);
  float unused = 0;
  QuantAvx512(x, m, p, codes, residual, &unused);
  *step = p.bq.step;
  return true;
}

BP_TARGET_AVX512 size_t FindMinus8Avx512(const uint8_t* codes, size_t bytes) {
  const __m512i lo_mask = _mm512_set1_epi8(0x0F);
  const __m512i eight = _mm512_set1_epi8(0x08);
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m512i b = _mm512_loadu_si512(codes + i);
    const __m512i lo = _mm512_and_si512(b, lo_mask);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo_mask);
    if ((_mm512_cmpeq_epi8_mask(lo, eight) | _mm512_cmpeq_epi8_mask(hi, eight)) != 0) return i;
  }
  return i;  // the caller's scalar scan finds the byte from here
}

}  // namespace

float AbsMax(const float* x, size_t n, bool* finite, IsaLevel isa) {
  float m = 0;
  size_t i = 0;
  if (isa == IsaLevel::kAvx512) i = AbsMaxAvx512(x, n, finite, &m);
  for (; i < n; ++i) {
    if (!Finite(x[i])) *finite = false;
    m = std::max(m, std::fabs(x[i]));
  }
  return m;
}

void MovingAverage(float* r, const float* ep, size_t n, float beta, IsaLevel isa) {
  if (beta == 1.0f) return;
  size_t i = 0;
  if (isa == IsaLevel::kAvx512) i = MovingAverageAvx512(r, ep, n, beta);
  if (isa == IsaLevel::kAvx2) i = MovingAverageAvx2(r, ep, n, beta);
  const float omb = 1.0f - beta;
  for (; i < n; ++i) r[i] = std::fmaf(beta, r[i], omb * ep[i]);
}

void RequantizeInt8(const float* e, size_t n, float inv, int8_t* out, IsaLevel isa) {
  size_t i = 0;
  if (isa == IsaLevel::kAvx512) i = RequantizeAvx512(e, n, inv, out);
  for (; i < n; ++i) out[i] = static_cast<int8_t>(RoundClamp(e[i] * inv, -127.0f, 127.0f));
}

void DequantizeInt8(const int8_t* e, size_t n, float step, float* out, IsaLevel isa) {
  size_t i = 0;
  if (isa == IsaLevel::kAvx512) i = DequantizeAvx512(e, n, step, out);
  for (; i < n; ++i) out[i] = static_cast<float>(e[i]) * step;
}

void QuantizeFixed(const float* x, size_t n, FixedScale fs, uint8_t* codes, float* residual,
                   PassCounts* counts, IsaLevel isa) {
  size_t done = 0;
  if (isa == IsaLevel::kAvx512) done = QuantizeAvx512(x, n, fs, codes, residual, counts);
  if (isa == IsaLevel::kAvx2) done = QuantizeAvx2(x, n, fs, codes, residual, counts);
  QuantizeScalar(x, done, n, fs, codes, residual, counts);
}

void LocoStepFixed(const float* g, int8_t* e8, float* e32, size_t n, FixedScale fs, ErrorStep es,
                   uint8_t* codes, PassCounts* counts, IsaLevel isa) {
  size_t done = 0;
  if (isa == IsaLevel::kAvx512 && e8 != nullptr) {
    done = StepAvx512(g, e8, n, fs, es, codes, counts);
  }
  if (isa == IsaLevel::kAvx2 && e8 != nullptr) done = StepAvx2(g, e8, n, fs, es, codes, counts);
  StepScalar(g, e8, e32, done, n, fs, es, codes, counts);
}

void DecodeFixed(const uint8_t* codes, size_t n, float step, float* out, bool add, IsaLevel isa) {
  size_t done = 0;
  if (isa == IsaLevel::kAvx512) done = DecodeAvx512(codes, n, step, out, add);
  if (isa == IsaLevel::kAvx2) done = DecodeAvx2(codes, n, step, out, add);
  DecodeScalar(codes, done, n, step, out, add);
}

void QuantizeBlocks(const float* x, size_t n, uint32_t block, uint8_t* steps, uint8_t* codes,
                    float* residual, PassCounts* counts, IsaLevel isa) {
  const bool avx512 = isa == IsaLevel::kAvx512;
  for (size_t first = 0, b = 0; first < n; first += block, ++b) {
    const size_t m = std::min<size_t>(block, n - first);
    const float* h = x + first;
    uint8_t* c = codes + first / 2;  // blocks start at even elements: whole bytes
    float* out = residual != nullptr ? residual + first : nullptr;
    float step = 0;
    if (avx512 && m % 32 == 0 && QuantizeBlockAvx512(h, m, c, out, &step)) {
      PutF32(steps + 4 * b, step);
      continue;
    }
    bool finite = true;
    const float a = AbsMax(h, m, &finite, isa);
    if (!finite) {
      counts->finite = false;
      std::fill(c, c + (m + 1) / 2, uint8_t{0});
      if (out != nullptr) std::fill(out, out + m, 0.0f);
      PutF32(steps + 4 * b, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    QuantPass p;
    p.bq = BlockQuantOf(a);
    float unused = 0;
    const size_t i = avx512 ? QuantAvx512(h, m, p, c, out, &unused) : 0;
    QuantScalar(h, i, m, p, c, out, &unused);
    PutF32(steps + 4 * b, p.bq.step);
  }
}

void LocoStepBlocks(const float* g, size_t n, uint32_t block, float beta, bool reset,
                    BlockError err, float* scratch, uint8_t* steps, uint8_t* codes,
                    PassCounts* counts, IsaLevel isa) {
  const bool avx512 = isa == IsaLevel::kAvx512;
  double sq = 0;
  for (size_t first = 0, b = 0; first < n; first += block, ++b) {
    const size_t m = std::min<size_t>(block, n - first);
    const float* gb = g + first;
    int8_t* e8 = err.e8 + first;
    uint8_t* c = codes + first / 2;
    float* h = scratch;
    if (avx512 && m % 32 == 0) {
      float step = 0;
      if (StepBlockAvx512(gb, e8, err.step_e + b, m, beta, reset, h, c, &step, &sq)) {
        PutF32(steps + 4 * b, step);
        continue;
      }
    }
    bool finite = true;
    float a = 0;
    size_t i = avx512 ? SumAvx512(gb, e8, err.step_e[b], m, h, &a, &finite) : 0;
    SumScalar(gb, e8, err.step_e[b], i, m, h, &a, &finite);
    if (!finite) {
      counts->finite = false;
      std::fill(c, c + (m + 1) / 2, uint8_t{0});
      PutF32(steps + 4 * b, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    QuantPass p;
    p.bq = BlockQuantOf(a);
    p.e8 = e8;
    p.step_e = err.step_e[b];
    p.beta = beta;
    float ae = 0;
    i = avx512 ? QuantAvx512(h, m, p, c, h, &ae) : 0;
    QuantScalar(h, i, m, p, c, h, &ae);  // h now holds the new error e
    PutF32(steps + 4 * b, p.bq.step);
    if (reset || !(ae > 0)) {
      std::fill(e8, e8 + m, int8_t{0});
      err.step_e[b] = 0;
      continue;
    }
    const float inv = std::min(127.0f / ae, kFloatMax);
    uint64_t isq = 0;
    i = avx512 ? RequantAvx512(h, m, inv, e8, &isq) : 0;
    RequantScalar(h, i, m, inv, e8, &isq);
    err.step_e[b] = ae / 127.0f;
    sq += static_cast<double>(isq) * static_cast<double>(err.step_e[b]) *
          static_cast<double>(err.step_e[b]);
  }
  counts->error_sq += sq;
}

void DecodeBlocks(const uint8_t* codes, size_t n, uint32_t block, const uint8_t* steps, float* out,
                  bool add, IsaLevel isa) {
  for (size_t first = 0, b = 0; first < n; first += block, ++b) {
    DecodeFixed(codes + first / 2, std::min<size_t>(block, n - first), GetF32(steps + 4 * b),
                out + first, add, isa);
  }
}

size_t FindCodeMinus8(const uint8_t* codes, size_t bytes, IsaLevel isa) {
  size_t i = isa == IsaLevel::kAvx512 ? FindMinus8Avx512(codes, bytes) : 0;
  for (; i < bytes; ++i) {
    if ((codes[i] & 0xF) == 0x8 || (codes[i] >> 4) == 0x8) return i;
  }
  return bytes;
}

}  // namespace bitpush::compressors::loco
