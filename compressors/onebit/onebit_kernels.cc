#include "compressors/onebit/onebit_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace bitpush::compressors {
namespace {

constexpr int kLanes = 16;
// Decompress into the caller's tensor with non-temporal stores from this many elements on.
constexpr size_t kStreamDecodeMin = size_t{1} << 16;

// Pass order: the residual passes (pass 2 of compress with feedback, worker and server) walk
// the words backwards. Pass 1 has just gone through the partition front to back, so its end
// is still in L2 (a partition is typically 4 MB, L2 1-2 MB): starting there saves that much of
// the re-read from memory. Elements are independent, so the order changes no value.

// Words are written with memcpy: the body may sit at any alignment.
inline void StoreWord(uint8_t* words, size_t j, uint64_t w) {
  std::memcpy(words + 8 * j, &w, 8);
}
inline uint64_t LoadWord(const uint8_t* words, size_t j) {
  uint64_t w;
  std::memcpy(&w, words + 8 * j, 8);
  return w;
}

double ReduceLanes(const double* lanes) {
  double s = 0.0;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  return s;
}

using PushSigns = OnebitSignWords;

// The value C(q)[i] of a sign word and scale: bit set -> -scale.
inline float SignedScale(const uint8_t* words, size_t i, float scale) {
  return ((LoadWord(words, i / 64) >> (i % 64)) & 1) ? -scale : scale;
}

// ---- scalar -------------------------------------------------------------------------------
// Pass 1: writes the sign words of q = a (+ b when b != nullptr), stores q into q_out when
// q_out != nullptr, and returns sum |q|. With `prev` (deferred error feedback, which needs b
// and q_out), b holds the last round's q whose correction is still pending: the residual is
// e = b - C_prev (prev's words and scale), computed on the fly, and q = a + e.

double SignsScalar(const float* a, const float* b, size_t n, uint8_t* words, float* q_out,
                   const PushSigns* prev, float decay) {
  double lanes[kLanes] = {};
  for (size_t j = 0; j * 64 < n; ++j) {
    uint64_t w = 0;
    const size_t end = std::min(n, j * 64 + 64);
    for (size_t i = j * 64; i < end; ++i) {
      float e = b ? b[i] : 0.0f;
      if (prev) e = e - SignedScale(prev->words, i, prev->scale);
      e = e * decay;  // exact for decay 1
      const float q = b ? a[i] + e : a[i];
      if (q_out) q_out[i] = q;
      lanes[i % kLanes] += static_cast<double>(std::fabs(q));
      w |= static_cast<uint64_t>(q < 0.0f) << (i - j * 64);
    }
    StoreWord(words, j, w);
  }
  return ReduceLanes(lanes);
}

// Pass 2 (error feedback): e[i] = q[i] - (bit ? -scale : scale), q = a (+ b).
void ResidualScalar(const float* a, const float* b, float* e, size_t n, const uint8_t* words,
                    float scale) {
  for (size_t j = 0; j * 64 < n; ++j) {
    const uint64_t w = LoadWord(words, j);
    const size_t end = std::min(n, j * 64 + 64);
    for (size_t i = j * 64; i < end; ++i) {
      const float q = b ? a[i] + b[i] : a[i];
      e[i] = q - (((w >> (i - j * 64)) & 1) ? -scale : scale);
    }
  }
}

void DecodeScalar(const uint8_t* words, size_t n, float scale, float* out, bool add) {
  for (size_t j = 0; j * 64 < n; ++j) {
    const uint64_t w = LoadWord(words, j);
    const size_t end = std::min(n, j * 64 + 64);
    for (size_t i = j * 64; i < end; ++i) {
      const float v = ((w >> (i - j * 64)) & 1) ? -scale : scale;
      out[i] = add ? out[i] + v : v;
    }
  }
}

void DecodeRangeScalar(const uint8_t* words, size_t begin, size_t end, float scale, float* out) {
  for (size_t i = begin; i < end; ++i) {
    out[i] = ((LoadWord(words, i / 64) >> (i % 64)) & 1) ? -scale : scale;
  }
}

// ---- AVX2 ---------------------------------------------------------------------------------
// Lanes: acc[k] holds lanes 4k..4k+3, matching the scalar lane i mod 16.

// The 8 values ±scale of elements 8c..8c+7 of a sign word (bit set: -scale).
BP_TARGET_AVX2 inline __m256 SignedScaleAvx2(uint64_t w, int c, __m256 pos, __m256 neg) {
  const __m256i bit_sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i byte = _mm256_set1_epi32(static_cast<int>((w >> (c * 8)) & 0xFF));
  const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(byte, bit_sel), bit_sel);
  return _mm256_blendv_ps(pos, neg, _mm256_castsi256_ps(set));
}

// Templated like SignsAvx512Impl: with run-time checks of b / q_out / prev in the inner loop the
// compiler kept them there, and compress ran at half speed.
// One 8-element chunk c of a word: q (formed as in SignsScalar), stored when kStore; its sign
// bits into *w and |q| into the two accumulators of its lanes (8(c&1) .. 8(c&1)+7).
template <bool kAdd, bool kStore, bool kDefer>
BP_TARGET_AVX2 inline void SignsChunkAvx2(const float* a, const float* b, float* q_out, uint64_t pw,
                                          int c, __m256 ppos, __m256 pneg, __m256 gamma,
                                          uint64_t* w, __m256d* lo, __m256d* hi) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 q = _mm256_loadu_ps(a);
  if (kAdd) {
    __m256 e = _mm256_loadu_ps(b);
    if (kDefer) e = _mm256_sub_ps(e, SignedScaleAvx2(pw, c, ppos, pneg));
    q = _mm256_add_ps(q, _mm256_mul_ps(e, gamma));
  }
  if (kStore) _mm256_storeu_ps(q_out, q);
  *w |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_LT_OQ)))
        << (c * 8);
  const __m256 aq = _mm256_and_ps(q, abs_mask);
  *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(aq)));
  *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(aq, 1)));
}

// Templated like SignsAvx512Impl, and the four accumulators are named registers: with the
// chunk loop rolled and acc[] indexed by (c & 1), GCC kept them on the stack and the adds
// chained through store forwarding (compress at a third of the unrolled speed).
template <bool kAdd, bool kStore, bool kDefer>
BP_TARGET_AVX2 double SignsAvx2Impl(const float* a, const float* b, size_t n, uint8_t* words,
                                    float* q_out, const PushSigns* prev, float decay) {
  const __m256 gamma = _mm256_set1_ps(decay);
  const __m256 ppos = _mm256_set1_ps(kDefer ? prev->scale : 0.0f);
  const __m256 pneg = _mm256_set1_ps(kDefer ? -prev->scale : 0.0f);
  // acc0/acc1: lanes 0..3 / 4..7 (even chunks), acc2/acc3: lanes 8..11 / 12..15 (odd chunks).
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
  const size_t full = n / 64;
  for (size_t j = 0; j < full; ++j) {
    uint64_t w = 0;
    const uint64_t pw = kDefer ? LoadWord(prev->words, j) : 0;
    for (int c = 0; c < 8; c += 2) {
      const size_t i = j * 64 + c * 8;
      SignsChunkAvx2<kAdd, kStore, kDefer>(a + i, kAdd ? b + i : nullptr,
                                           kStore ? q_out + i : nullptr, pw, c, ppos, pneg, gamma,
                                           &w, &acc0, &acc1);
      SignsChunkAvx2<kAdd, kStore, kDefer>(a + i + 8, kAdd ? b + i + 8 : nullptr,
                                           kStore ? q_out + i + 8 : nullptr, pw, c + 1, ppos, pneg,
                                           gamma, &w, &acc2, &acc3);
    }
    StoreWord(words, j, w);
  }
  const __m256d acc[4] = {acc0, acc1, acc2, acc3};
  double lanes[kLanes];
  for (int k = 0; k < 4; ++k) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
  if (full * 64 < n) {  // tail: finish in scalar with the same lane assignment
    uint64_t w = 0;
    for (size_t i = full * 64; i < n; ++i) {
      float e = b ? b[i] : 0.0f;
      if (prev) e = e - SignedScale(prev->words, i, prev->scale);
      e = e * decay;
      const float q = b ? a[i] + e : a[i];
      if (q_out) q_out[i] = q;
      lanes[i % kLanes] += static_cast<double>(std::fabs(q));
      w |= static_cast<uint64_t>(q < 0.0f) << (i - full * 64);
    }
    StoreWord(words, full, w);
  }
  return ReduceLanes(lanes);
}

// `prev` requires b and q_out, as in SignsAvx512.
double SignsAvx2(const float* a, const float* b, size_t n, uint8_t* words, float* q_out,
                 const PushSigns* prev, float decay) {
  if (prev != nullptr) return SignsAvx2Impl<true, true, true>(a, b, n, words, q_out, prev, decay);
  if (b != nullptr) {
    return q_out != nullptr ? SignsAvx2Impl<true, true, false>(a, b, n, words, q_out, prev, decay)
                            : SignsAvx2Impl<true, false, false>(a, b, n, words, q_out, prev, decay);
  }
  return q_out != nullptr ? SignsAvx2Impl<false, true, false>(a, b, n, words, q_out, prev, decay)
                          : SignsAvx2Impl<false, false, false>(a, b, n, words, q_out, prev, decay);
}

BP_TARGET_AVX2 void ResidualAvx2(const float* a, const float* b, float* e, size_t n,
                                 const uint8_t* words, float scale) {
  const __m256 pos = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_set1_ps(-scale);
  const size_t full = n / 64;
  for (size_t j = full; j-- > 0;) {  // backwards, see "Pass order"
    const uint64_t w = LoadWord(words, j);
    for (int c = 0; c < 8; ++c) {
      const size_t i = j * 64 + c * 8;
      const __m256 v = SignedScaleAvx2(w, c, pos, neg);
      __m256 q = _mm256_loadu_ps(a + i);
      if (b) q = _mm256_add_ps(q, _mm256_loadu_ps(b + i));
      _mm256_storeu_ps(e + i, _mm256_sub_ps(q, v));
    }
  }
  if (full * 64 < n) {
    ResidualScalar(a + full * 64, b ? b + full * 64 : nullptr, e + full * 64, n - full * 64,
                   words + full * 8, scale);
  }
}

BP_TARGET_AVX2 void DecodeAvx2(const uint8_t* words, size_t n, float scale, float* out, bool add) {
  const __m256 pos = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_set1_ps(-scale);
  const size_t full = n / 64;
  for (size_t j = 0; j < full; ++j) {
    const uint64_t w = LoadWord(words, j);
    for (int c = 0; c < 8; ++c) {
      const size_t i = j * 64 + c * 8;
      __m256 v = SignedScaleAvx2(w, c, pos, neg);
      if (add) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
      _mm256_storeu_ps(out + i, v);
    }
  }
  if (full * 64 < n) DecodeScalar(words + full * 8, n - full * 64, scale, out + full * 64, add);
}

// ---- AVX-512 ------------------------------------------------------------------------------
// acc[0] holds lanes 0..7, acc[1] lanes 8..15: element i of a 16-wide chunk is lane i.

// The |q| of one 16-wide chunk into the lane accumulators: its low 8 elements are lanes 0..7
// (acc0), its high 8 lanes 8..15 (acc1).
BP_TARGET_AVX512 inline void AddAbsAvx512(__m512 aq, __m512d* acc0, __m512d* acc1) {
  *acc0 = _mm512_add_pd(*acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(aq)));
  *acc1 = _mm512_add_pd(
      *acc1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(aq), 1))));
}

// Chunk c (0..3) of a 64-element word: its sign bits (q < 0) into *w, |q| added to the
// double accumulators (lanes 0..7 and 8..15).
BP_TARGET_AVX512 inline void SignAndAbsAvx512(__m512 q, size_t c, uint64_t* w, __m512d* acc0,
                                              __m512d* acc1) {
  const __mmask16 neg = _mm512_cmp_ps_mask(q, _mm512_setzero_ps(), _CMP_LT_OQ);
  *w |= static_cast<uint64_t>(neg) << (c * 16);
  AddAbsAvx512(_mm512_abs_ps(q), acc0, acc1);
}

// One full 64-element word of pass 1: plain (unmasked) loads and stores and no per-chunk bounds
// checks. On an AMD Zen 5 a stream read through masked loads ran at a quarter of the plain
// speed out of cache (onebit.h).
template <bool kAdd, bool kStore, bool kDefer>
BP_TARGET_AVX512 inline uint64_t SignsWordAvx512(const float* a, const float* b, float* q_out,
                                                 uint64_t pw, __m512 ppos, __m512 pneg,
                                                 __m512 gamma, __m512d* acc0, __m512d* acc1) {
  __m512 q[4];
  for (int c = 0; c < 4; ++c) {
    q[c] = _mm512_loadu_ps(a + 16 * c);
    if (kAdd) {
      __m512 e = _mm512_loadu_ps(b + 16 * c);
      if (kDefer) {
        e = _mm512_sub_ps(e,
                          _mm512_mask_blend_ps(static_cast<__mmask16>(pw >> (16 * c)), ppos, pneg));
      }
      q[c] = _mm512_add_ps(q[c], _mm512_mul_ps(e, gamma));
    }
    if (kStore) _mm512_storeu_ps(q_out + 16 * c, q[c]);
  }
  uint64_t w = 0;
  for (int c = 0; c < 4; ++c) {
    const __mmask16 neg = _mm512_cmp_ps_mask(q[c], _mm512_setzero_ps(), _CMP_LT_OQ);
    w |= static_cast<uint64_t>(neg) << (16 * c);
  }
  // The double additions stay in element order per lane: that order is the contract.
  for (int c = 0; c < 4; ++c) AddAbsAvx512(_mm512_abs_ps(q[c]), acc0, acc1);
  return w;
}

template <bool kAdd, bool kStore, bool kDefer>
BP_TARGET_AVX512 double SignsAvx512Impl(const float* a, const float* b, size_t n, uint8_t* words,
                                        float* q_out, const PushSigns* prev, float decay) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  const __m512 gamma = _mm512_set1_ps(decay);
  const __m512 ppos = _mm512_set1_ps(kDefer ? prev->scale : 0.0f);
  const __m512 pneg = _mm512_set1_ps(kDefer ? -prev->scale : 0.0f);
  const size_t full = n / 64;
  for (size_t j = 0; j < full; ++j) {
    const size_t i = j * 64;
    const uint64_t pw = kDefer ? LoadWord(prev->words, j) : 0;
    StoreWord(words, j,
              SignsWordAvx512<kAdd, kStore, kDefer>(a + i, kAdd ? b + i : nullptr,
                                                    kStore ? q_out + i : nullptr, pw, ppos, pneg,
                                                    gamma, &acc0, &acc1));
  }
  if (full * 64 < n) {  // the last, partial word: masked; lanes past n are zero
    uint64_t w = 0;
    for (int c = 0; c < 4; ++c) {
      const size_t i = full * 64 + c * 16;
      if (i >= n) break;
      const size_t left = n - i;
      const __mmask16 lm = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
      __m512 q = _mm512_maskz_loadu_ps(lm, a + i);
      if (kAdd) {
        __m512 e = _mm512_maskz_loadu_ps(lm, b + i);
        if (kDefer) {  // lanes past n stay zero
          const auto pm = static_cast<__mmask16>(LoadWord(prev->words, full) >> (16 * c));
          e = _mm512_maskz_sub_ps(lm, e, _mm512_mask_blend_ps(pm, ppos, pneg));
        }
        q = _mm512_add_ps(q, _mm512_mul_ps(e, gamma));
      }
      if (kStore) _mm512_mask_storeu_ps(q_out + i, lm, q);
      SignAndAbsAvx512(q, c, &w, &acc0, &acc1);
    }
    StoreWord(words, full, w);
  }
  double lanes[kLanes];
  _mm512_storeu_pd(lanes, acc0);
  _mm512_storeu_pd(lanes + 8, acc1);
  return ReduceLanes(lanes);
}

// `prev` requires b and q_out (deferred error feedback always stores this round's q).
double SignsAvx512(const float* a, const float* b, size_t n, uint8_t* words, float* q_out,
                   const PushSigns* prev, float decay) {
  if (prev != nullptr) {
    return SignsAvx512Impl<true, true, true>(a, b, n, words, q_out, prev, decay);
  }
  if (b != nullptr) {
    return q_out != nullptr
               ? SignsAvx512Impl<true, true, false>(a, b, n, words, q_out, prev, decay)
               : SignsAvx512Impl<true, false, false>(a, b, n, words, q_out, prev, decay);
  }
  return q_out != nullptr
             ? SignsAvx512Impl<false, true, false>(a, b, n, words, q_out, prev, decay)
             : SignsAvx512Impl<false, false, false>(a, b, n, words, q_out, prev, decay);
}

BP_TARGET_AVX512 void ResidualAvx512(const float* a, const float* b, float* e, size_t n,
                                     const uint8_t* words, float scale) {
  const __m512 pos = _mm512_set1_ps(scale);
  const __m512 neg = _mm512_set1_ps(-scale);
  const size_t full = n / 64;
  for (size_t i = full * 64; i < n; i += 16) {  // the partial last word first (backwards)
    const size_t left = n - i;
    const __mmask16 lm = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __mmask16 m = static_cast<__mmask16>(LoadWord(words, full) >> (i % 64));
    __m512 q = _mm512_maskz_loadu_ps(lm, a + i);
    if (b) q = _mm512_add_ps(q, _mm512_maskz_loadu_ps(lm, b + i));
    _mm512_mask_storeu_ps(e + i, lm, _mm512_sub_ps(q, _mm512_mask_blend_ps(m, pos, neg)));
  }
  for (size_t j = full; j-- > 0;) {  // backwards, see "Pass order"
    const uint64_t w = LoadWord(words, j);
    for (int c = 0; c < 4; ++c) {
      const size_t i = j * 64 + c * 16;
      const __mmask16 m = static_cast<__mmask16>(w >> (c * 16));
      __m512 q = _mm512_loadu_ps(a + i);
      if (b) q = _mm512_add_ps(q, _mm512_loadu_ps(b + i));
      _mm512_storeu_ps(e + i, _mm512_sub_ps(q, _mm512_mask_blend_ps(m, pos, neg)));
    }
  }
}

BP_TARGET_AVX512 void DecodeAvx512(const uint8_t* words, size_t n, float scale, float* out,
                                   bool add) {
  const __m512 pos = _mm512_set1_ps(scale);
  const __m512 neg = _mm512_set1_ps(-scale);
  const size_t full = n / 64;
  for (size_t j = 0; j < full; ++j) {
    const uint64_t w = LoadWord(words, j);
    float* o = out + j * 64;
    const __m512 v0 = _mm512_mask_blend_ps(static_cast<__mmask16>(w), pos, neg);
    const __m512 v1 = _mm512_mask_blend_ps(static_cast<__mmask16>(w >> 16), pos, neg);
    const __m512 v2 = _mm512_mask_blend_ps(static_cast<__mmask16>(w >> 32), pos, neg);
    const __m512 v3 = _mm512_mask_blend_ps(static_cast<__mmask16>(w >> 48), pos, neg);
    if (add) {
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), v0));
      _mm512_storeu_ps(o + 16, _mm512_add_ps(_mm512_loadu_ps(o + 16), v1));
      _mm512_storeu_ps(o + 32, _mm512_add_ps(_mm512_loadu_ps(o + 32), v2));
      _mm512_storeu_ps(o + 48, _mm512_add_ps(_mm512_loadu_ps(o + 48), v3));
    } else {
      _mm512_storeu_ps(o, v0);
      _mm512_storeu_ps(o + 16, v1);
      _mm512_storeu_ps(o + 32, v2);
      _mm512_storeu_ps(o + 48, v3);
    }
  }
  if (full * 64 < n) DecodeScalar(words + full * 8, n - full * 64, scale, out + full * 64, add);
}

// ---- fused server round ---------------------------------------------------------------------
// The server's aggregate of `count` onebit pushes is never materialised: element i of it is
//   a = v_0; a = a + v_w (w = 1..count-1); a = a * mult (when mult != 1); q = a (+ e[i])
// with v_w = bit ? -scale_w : scale_w — exactly the fp32 operations, in the same order, of
// DecompressToFloat + DecompressAdd + the averaging loop + CompressWithFeedback, so the
// payload and the residual are bit-identical. Pass 1 packs the signs of q and sums |q| (the
// 16 lanes of Signs); pass 2 recomputes q and writes e = q - (+-S). Neither pass writes q:
// pass 1 only reads e. With deferred error feedback (`prev`, OnebitResidualState) pass 1 reads
// e = buffer - C_prev, stores q over it, and there is no pass 2.

inline float AggregateScalarAt(const PushSigns* p, size_t count, size_t i, float mult,
                               bool do_mult) {
  const size_t j = i / 64;
  const unsigned t = static_cast<unsigned>(i % 64);
  float a = ((LoadWord(p[0].words, j) >> t) & 1) ? -p[0].scale : p[0].scale;
  for (size_t w = 1; w < count; ++w) {
    const float v = ((LoadWord(p[w].words, j) >> t) & 1) ? -p[w].scale : p[w].scale;
    a = a + v;
  }
  if (do_mult) a = a * mult;
  return a;
}

// q_out: where q is stored (deferred error feedback: over e), or nullptr. With `prev` (needs e),
// e holds the last round's q and the residual is e - C_prev, formed on the fly.
void AggSignsScalar(const PushSigns* p, size_t count, size_t begin, size_t n, float mult,
                    bool do_mult, const float* e, float* q_out, uint8_t* words, double* lanes,
                    const PushSigns* prev) {
  for (size_t j = begin / 64; j * 64 < n; ++j) {
    uint64_t w = 0;
    const size_t end = std::min(n, j * 64 + 64);
    for (size_t i = j * 64; i < end; ++i) {
      const float a = AggregateScalarAt(p, count, i, mult, do_mult);
      float ev = e ? e[i] : 0.0f;
      if (prev) ev = ev - SignedScale(prev->words, i, prev->scale);
      const float q = e ? a + ev : a;
      if (q_out) q_out[i] = q;
      lanes[i % kLanes] += static_cast<double>(std::fabs(q));
      w |= static_cast<uint64_t>(q < 0.0f) << (i - j * 64);
    }
    StoreWord(words, j, w);
  }
}

void AggResidualScalar(const PushSigns* p, size_t count, size_t begin, size_t n, float mult,
                       bool do_mult, float* e, const uint8_t* words, float scale) {
  for (size_t i = begin; i < n; ++i) {
    const float a = AggregateScalarAt(p, count, i, mult, do_mult);
    const float q = a + e[i];
    e[i] = q - (((LoadWord(words, i / 64) >> (i % 64)) & 1) ? -scale : scale);
  }
}

BP_TARGET_AVX2 inline __m256 AggregateAvx2(const PushSigns* p, size_t count, const uint64_t* w,
                                           int c, __m256 mult, bool do_mult) {
  __m256 a = SignedScaleAvx2(w[0], c, _mm256_set1_ps(p[0].scale), _mm256_set1_ps(-p[0].scale));
  for (size_t k = 1; k < count; ++k) {
    a = _mm256_add_ps(
        a, SignedScaleAvx2(w[k], c, _mm256_set1_ps(p[k].scale), _mm256_set1_ps(-p[k].scale)));
  }
  return do_mult ? _mm256_mul_ps(a, mult) : a;
}

// One 8-element chunk c of the fused round's pass 1 (see SignsChunkAvx2).
BP_TARGET_AVX2 inline void AggSignsChunkAvx2(const PushSigns* p, size_t count, const uint64_t* wbuf,
                                             int c, __m256 mult, bool do_mult, const float* e,
                                             float* q_out, uint64_t pw, const PushSigns* prev,
                                             __m256 ppos, __m256 pneg, uint64_t* w, __m256d* lo,
                                             __m256d* hi) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 q = AggregateAvx2(p, count, wbuf, c, mult, do_mult);
  if (e) {
    __m256 ev = _mm256_loadu_ps(e);
    if (prev) ev = _mm256_sub_ps(ev, SignedScaleAvx2(pw, c, ppos, pneg));
    q = _mm256_add_ps(q, ev);
  }
  if (q_out) _mm256_storeu_ps(q_out, q);
  *w |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_LT_OQ)))
        << (c * 8);
  const __m256 aq = _mm256_and_ps(q, abs_mask);
  *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(aq)));
  *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(aq, 1)));
}

BP_TARGET_AVX2 void AggSignsAvx2(const PushSigns* p, size_t count, size_t n, float mult_s,
                                 bool do_mult, const float* e, float* q_out, uint8_t* words,
                                 uint64_t* wbuf, double* lanes, const PushSigns* prev) {
  const __m256 ppos = _mm256_set1_ps(prev ? prev->scale : 0.0f);
  const __m256 pneg = _mm256_set1_ps(prev ? -prev->scale : 0.0f);
  // Named accumulators, as in SignsAvx2Impl: acc0/acc1 even chunks, acc2/acc3 odd chunks.
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
  const __m256 mult = _mm256_set1_ps(mult_s);
  const size_t full = n / 64;
  for (size_t j = 0; j < full; ++j) {
    for (size_t k = 0; k < count; ++k) wbuf[k] = LoadWord(p[k].words, j);
    const uint64_t pw = prev ? LoadWord(prev->words, j) : 0;
    uint64_t w = 0;
    for (int c = 0; c < 8; c += 2) {
      const size_t i = j * 64 + c * 8;
      AggSignsChunkAvx2(p, count, wbuf, c, mult, do_mult, e ? e + i : nullptr,
                        q_out ? q_out + i : nullptr, pw, prev, ppos, pneg, &w, &acc0, &acc1);
      AggSignsChunkAvx2(p, count, wbuf, c + 1, mult, do_mult, e ? e + i + 8 : nullptr,
                        q_out ? q_out + i + 8 : nullptr, pw, prev, ppos, pneg, &w, &acc2, &acc3);
    }
    StoreWord(words, j, w);
  }
  _mm256_storeu_pd(lanes, acc0);
  _mm256_storeu_pd(lanes + 4, acc1);
  _mm256_storeu_pd(lanes + 8, acc2);
  _mm256_storeu_pd(lanes + 12, acc3);
  if (full * 64 < n) {
    AggSignsScalar(p, count, full * 64, n, mult_s, do_mult, e, q_out, words, lanes, prev);
  }
}

BP_TARGET_AVX2 void AggResidualAvx2(const PushSigns* p, size_t count, size_t n, float mult_s,
                                    bool do_mult, float* e, const uint8_t* words, float scale,
                                    uint64_t* wbuf) {
  const __m256 pos = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_set1_ps(-scale);
  const __m256 mult = _mm256_set1_ps(mult_s);
  const size_t full = n / 64;
  for (size_t j = full; j-- > 0;) {  // backwards, see "Pass order"
    for (size_t k = 0; k < count; ++k) wbuf[k] = LoadWord(p[k].words, j);
    const uint64_t w = LoadWord(words, j);
    for (int c = 0; c < 8; ++c) {
      const size_t i = j * 64 + c * 8;
      const __m256 q =
          _mm256_add_ps(AggregateAvx2(p, count, wbuf, c, mult, do_mult), _mm256_loadu_ps(e + i));
      _mm256_storeu_ps(e + i, _mm256_sub_ps(q, SignedScaleAvx2(w, c, pos, neg)));
    }
  }
  if (full * 64 < n) AggResidualScalar(p, count, full * 64, n, mult_s, do_mult, e, words, scale);
}

BP_TARGET_AVX512 inline __m512 AggregateAvx512(const PushSigns* p, size_t count, const uint64_t* w,
                                               int c, __m512 mult, bool do_mult) {
  __m512 a = _mm512_mask_blend_ps(static_cast<__mmask16>(w[0] >> (c * 16)),
                                  _mm512_set1_ps(p[0].scale), _mm512_set1_ps(-p[0].scale));
  for (size_t k = 1; k < count; ++k) {
    a = _mm512_add_ps(
        a, _mm512_mask_blend_ps(static_cast<__mmask16>(w[k] >> (c * 16)),
                                _mm512_set1_ps(p[k].scale), _mm512_set1_ps(-p[k].scale)));
  }
  return do_mult ? _mm512_mul_ps(a, mult) : a;
}

BP_TARGET_AVX512 void AggSignsAvx512(const PushSigns* p, size_t count, size_t n, float mult_s,
                                     bool do_mult, const float* e, float* q_out, uint8_t* words,
                                     uint64_t* wbuf, double* lanes, const PushSigns* prev) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  const __m512 ppos = _mm512_set1_ps(prev ? prev->scale : 0.0f);
  const __m512 pneg = _mm512_set1_ps(prev ? -prev->scale : 0.0f);
  const __m512 mult = _mm512_set1_ps(mult_s);
  const size_t words_n = (n + 63) / 64;
  for (size_t j = 0; j < words_n; ++j) {
    for (size_t k = 0; k < count; ++k) wbuf[k] = LoadWord(p[k].words, j);
    const uint64_t pw = prev ? LoadWord(prev->words, j) : 0;
    uint64_t w = 0;
    for (int c = 0; c < 4; ++c) {
      const size_t i = j * 64 + c * 16;
      if (i >= n) break;
      const size_t left = n - i;
      const __mmask16 lm = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
      // Lanes past n are zero, as the masked loads of Signs make them.
      __m512 q = _mm512_maskz_mov_ps(lm, AggregateAvx512(p, count, wbuf, c, mult, do_mult));
      if (e) {
        // Plain loads and stores for full chunks: see SignsWordAvx512.
        __m512 ev = left >= 16 ? _mm512_loadu_ps(e + i) : _mm512_maskz_loadu_ps(lm, e + i);
        if (prev) {
          ev = _mm512_maskz_sub_ps(
              lm, ev, _mm512_mask_blend_ps(static_cast<__mmask16>(pw >> (c * 16)), ppos, pneg));
        }
        q = _mm512_add_ps(q, ev);
      }
      if (q_out) {
        if (left >= 16)
          _mm512_storeu_ps(q_out + i, q);
        else
          _mm512_mask_storeu_ps(q_out + i, lm, q);
      }
      SignAndAbsAvx512(q, c, &w, &acc0, &acc1);
    }
    StoreWord(words, j, w);
  }
  _mm512_storeu_pd(lanes, acc0);
  _mm512_storeu_pd(lanes + 8, acc1);
}

BP_TARGET_AVX512 void AggResidualAvx512(const PushSigns* p, size_t count, size_t n, float mult_s,
                                        bool do_mult, float* e, const uint8_t* words, float scale,
                                        uint64_t* wbuf) {
  const __m512 pos = _mm512_set1_ps(scale);
  const __m512 neg = _mm512_set1_ps(-scale);
  const __m512 mult = _mm512_set1_ps(mult_s);
  const size_t words_n = (n + 63) / 64;
  for (size_t j = words_n; j-- > 0;) {  // backwards, see "Pass order"
    for (size_t k = 0; k < count; ++k) wbuf[k] = LoadWord(p[k].words, j);
    const uint64_t w = LoadWord(words, j);
    for (int c = 0; c < 4; ++c) {
      const size_t i = j * 64 + c * 16;
      if (i >= n) break;
      const size_t left = n - i;
      const __mmask16 lm = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
      const __m512 a = AggregateAvx512(p, count, wbuf, c, mult, do_mult);
      const __mmask16 m = static_cast<__mmask16>(w >> (c * 16));
      if (left >= 16) {  // plain loads and stores for full chunks: see SignsWordAvx512
        const __m512 q = _mm512_add_ps(a, _mm512_loadu_ps(e + i));
        _mm512_storeu_ps(e + i, _mm512_sub_ps(q, _mm512_mask_blend_ps(m, pos, neg)));
      } else {
        const __m512 q = _mm512_add_ps(a, _mm512_maskz_loadu_ps(lm, e + i));
        _mm512_mask_storeu_ps(e + i, lm, _mm512_sub_ps(q, _mm512_mask_blend_ps(m, pos, neg)));
      }
    }
  }
}

// Decompress's store: every line of the output is overwritten, so non-temporal stores skip
// reading it first (half the memory traffic of a plain store for a tensor that is not in
// cache). Vectors start at the first 64-byte boundary of `out`; their 16 bits may straddle two
// sign words.
BP_TARGET_AVX512 void DecodeStreamAvx512(const uint8_t* words, size_t n, float scale, float* out) {
  const __m512 pos = _mm512_set1_ps(scale);
  const __m512 neg = _mm512_set1_ps(-scale);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
  const size_t head = std::min(n, static_cast<size_t>(((64 - (addr & 63)) & 63) / 4));
  DecodeRangeScalar(words, 0, head, scale, out);
  size_t i = head;
  for (; i + 16 <= n; i += 16) {
    const size_t j = i / 64;
    const unsigned shift = static_cast<unsigned>(i % 64);
    uint64_t bits = LoadWord(words, j) >> shift;
    // Element i + 15 < n lies in word j + 1 when shift > 48, so that word exists.
    if (shift > 48) bits |= LoadWord(words, j + 1) << (64 - shift);
    _mm512_stream_ps(out + i, _mm512_mask_blend_ps(static_cast<__mmask16>(bits), pos, neg));
  }
  _mm_sfence();
  DecodeRangeScalar(words, i, n, scale, out);
}

}  // namespace

double OnebitSignPass(IsaLevel isa, const float* a, const float* b, size_t n, uint8_t* words,
                      float* q_out, const OnebitSignWords* prev, float decay) {
  switch (isa) {
    case IsaLevel::kAvx512: return SignsAvx512(a, b, n, words, q_out, prev, decay);
    case IsaLevel::kAvx2: return SignsAvx2(a, b, n, words, q_out, prev, decay);
    case IsaLevel::kScalar: break;
  }
  return SignsScalar(a, b, n, words, q_out, prev, decay);
}

void OnebitResidualPass(IsaLevel isa, const float* a, const float* b, float* e, size_t n,
                        const uint8_t* words, float scale) {
  switch (isa) {
    case IsaLevel::kAvx512: return ResidualAvx512(a, b, e, n, words, scale);
    case IsaLevel::kAvx2: return ResidualAvx2(a, b, e, n, words, scale);
    case IsaLevel::kScalar: break;
  }
  ResidualScalar(a, b, e, n, words, scale);
}

void OnebitDecode(IsaLevel isa, const uint8_t* words, size_t n, float scale, float* out, bool add) {
  switch (isa) {
    case IsaLevel::kAvx512: return DecodeAvx512(words, n, scale, out, add);
    case IsaLevel::kAvx2: return DecodeAvx2(words, n, scale, out, add);
    case IsaLevel::kScalar: break;
  }
  DecodeScalar(words, n, scale, out, add);
}

void OnebitDecodeToTensor(IsaLevel isa, const uint8_t* words, size_t n, float scale, float* out) {
  if (isa == IsaLevel::kAvx512 && n >= kStreamDecodeMin &&
      reinterpret_cast<uintptr_t>(out) % alignof(float) == 0) {
    DecodeStreamAvx512(words, n, scale, out);
  } else {
    OnebitDecode(isa, words, n, scale, out, false);
  }
}

double OnebitAggregateSignPass(IsaLevel isa, const OnebitSignWords* pushes, size_t count, size_t n,
                               float mult, const float* e, float* q_out, uint8_t* words,
                               uint64_t* wbuf, const OnebitSignWords* prev) {
  const bool do_mult = mult != 1.0f;
  double lanes[kLanes] = {};
  switch (isa) {
    case IsaLevel::kAvx512:
      AggSignsAvx512(pushes, count, n, mult, do_mult, e, q_out, words, wbuf, lanes, prev);
      break;
    case IsaLevel::kAvx2:
      AggSignsAvx2(pushes, count, n, mult, do_mult, e, q_out, words, wbuf, lanes, prev);
      break;
    case IsaLevel::kScalar:
      AggSignsScalar(pushes, count, 0, n, mult, do_mult, e, q_out, words, lanes, prev);
      break;
  }
  return ReduceLanes(lanes);
}

void OnebitAggregateResidualPass(IsaLevel isa, const OnebitSignWords* pushes, size_t count,
                                 size_t n, float mult, float* e, const uint8_t* words, float scale,
                                 uint64_t* wbuf) {
  const bool do_mult = mult != 1.0f;
  switch (isa) {
    case IsaLevel::kAvx512:
      AggResidualAvx512(pushes, count, n, mult, do_mult, e, words, scale, wbuf);
      break;
    case IsaLevel::kAvx2:
      AggResidualAvx2(pushes, count, n, mult, do_mult, e, words, scale, wbuf);
      break;
    case IsaLevel::kScalar:
      AggResidualScalar(pushes, count, 0, n, mult, do_mult, e, words, scale);
      break;
  }
}

}  // namespace bitpush::compressors
