#include "compressors/dithering/dithering_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/counter_rng.h"

namespace bitpush::compressors::dithering {
namespace {

#define BP_DITHER_INLINE __attribute__((always_inline)) inline

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kOneBits = 0x3F800000u;  // 1.0f
constexpr uint32_t kMantissaMask = 0x007FFFFFu;
constexpr float kTwoM24 = 0x1p-24f;
constexpr size_t kL2Lanes = 32;

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Payload words are little-endian; bitpush only runs on little-endian hosts (x86-64).
inline uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void StoreU64(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, sizeof v);
}

inline size_t BlockBytes(uint32_t bits) {
  return (bits + 1) * sizeof(uint64_t);
}

double CombineLanes(const double* lanes) {
  double s = 0.0;
  for (size_t k = 0; k < kL2Lanes; ++k) s += lanes[k];
  return s;
}

// ---- scalar -------------------------------------------------------------------------------

uint32_t MaxAbsBitsScalar(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, FloatBits(x[i]) & kAbsMask);
  return m;
}
uint32_t AddMaxAbsBitsScalar(const float* g, float* e, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    e[i] += g[i];
    m = std::max(m, FloatBits(e[i]) & kAbsMask);
  }
  return m;
}
// Adds x[i]^2 for i in [begin, n) to lanes[i % 32]. x*x is exact in double, so this equals a
// fused multiply-add of the SIMD kernels.
void SumSquaresTail(const float* x, size_t begin, size_t n, double* lanes) {
  for (size_t i = begin; i < n; ++i) {
    const double v = x[i];
    lanes[i % kL2Lanes] += v * v;
  }
}
void AddSumSquaresTail(const float* g, float* e, size_t begin, size_t n, double* lanes) {
  for (size_t i = begin; i < n; ++i) {
    e[i] += g[i];
    const double v = e[i];
    lanes[i % kL2Lanes] += v * v;
  }
}
double SumSquaresScalar(const float* x, size_t n) {
  double lanes[kL2Lanes] = {};
  SumSquaresTail(x, 0, n, lanes);
  return CombineLanes(lanes);
}
double AddSumSquaresScalar(const float* g, float* e, size_t n) {
  double lanes[kL2Lanes] = {};
  AddSumSquaresTail(g, e, 0, n, lanes);
  return CombineLanes(lanes);
}

// The code of one element, t = |x| * factor, r its 32-bit random number. The SIMD kernels
// perform exactly these operations.
//   linear:  c = floor(t) + (r24 * 2^-24 < frac(t))
//   natural: t >= 1, t in [2^e, 2^(e+1)): c = e + 1 + (r23 < mantissa(t)), i.e. rounds up with
//            probability exactly (t - 2^e) / 2^e; t < 1: c = (r24 * 2^-24 < t).
inline uint32_t CodeLinear(float t, uint32_t r, uint32_t s) {
  const int32_t fl = static_cast<int32_t>(t);  // t in [0, s * (1 + 2^-23)]: truncation = floor
  const float frac = t - static_cast<float>(fl);
  const float rf = static_cast<float>(r >> 8) * kTwoM24;
  const uint32_t c = static_cast<uint32_t>(fl) + (rf < frac ? 1u : 0u);
  return std::min(c, s);
}
inline uint32_t CodeNatural(float t, uint32_t r, uint32_t s) {
  const uint32_t tb = FloatBits(t);
  uint32_t c;
  if (tb >= kOneBits) {
    c = (tb >> 23) - 126 + ((r >> 9) < (tb & kMantissaMask) ? 1u : 0u);
  } else {
    c = static_cast<float>(r >> 8) * kTwoM24 < t ? 1u : 0u;
  }
  return std::min(c, s);
}

void QuantizeScalar(const float* x, float* res, size_t n, const QuantizeArgs& a, uint8_t* out) {
  const Levels& lv = *a.levels;
  const uint32_t s = lv.s;
  const uint32_t bits = lv.bits;
  const bool prescaled = a.prescale != 1.0f;
  for (size_t base = 0; base < n; base += kBlockElements) {
    const size_t cnt = std::min(kBlockElements, n - base);
    uint64_t words[9] = {};
    for (size_t t = 0; t < cnt; ++t) {
      const size_t i = base + t;
      const float xi = x[i];
      const uint32_t xb = FloatBits(xi);
      float ax = BitsFloat(xb & kAbsMask);
      if (prescaled) ax *= a.prescale;
      const float tt = ax * a.factor;
      const uint32_t r = CounterRandom32(a.stream, static_cast<uint32_t>(i));
      const uint32_t c = lv.natural ? CodeNatural(tt, r, s) : CodeLinear(tt, r, s);
      const bool neg = (xb >> 31) != 0 && c != 0;
      words[0] |= static_cast<uint64_t>(neg) << t;
      for (uint32_t p = 0; p < bits; ++p) words[1 + p] |= static_cast<uint64_t>((c >> p) & 1u) << t;
      if (res != nullptr) {
        const float d = lv.table[c];
        res[i] = xi - (neg ? -d : d);
      }
    }
    for (uint32_t w = 0; w <= bits; ++w) StoreU64(out + w * 8, words[w]);
    out += BlockBytes(bits);
  }
}

void DecodeScalar(const uint8_t* blocks, size_t n, const Levels& lv, float* out, bool add) {
  const uint32_t bits = lv.bits;
  for (size_t base = 0; base < n; base += kBlockElements) {
    const size_t cnt = std::min(kBlockElements, n - base);
    uint64_t words[9];
    for (uint32_t w = 0; w <= bits; ++w) words[w] = LoadU64(blocks + w * 8);
    blocks += BlockBytes(bits);
    for (size_t t = 0; t < cnt; ++t) {
      uint32_t c = 0;
      for (uint32_t p = 0; p < bits; ++p) c |= static_cast<uint32_t>((words[1 + p] >> t) & 1u) << p;
      float v = lv.table[c];
      if ((words[0] >> t) & 1u) v = -v;
      if (add) {
        out[base + t] += v;
      } else {
        out[base + t] = v;
      }
    }
  }
}

// ---- AVX2 ---------------------------------------------------------------------------------

struct Q256 {
  __m256 factor;
  __m256i s;
  __m256i hi;
  __m256 step;
  __m256 scale;
  __m256i pow2_bias;  // 127 - s
};

BP_TARGET_AVX2 BP_DITHER_INLINE __m256i Fmix256(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

BP_TARGET_AVX2 BP_DITHER_INLINE __m256i SetupCounter256(uint64_t stream, size_t first) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(first)));
  return _mm256_add_epi32(_mm256_mullo_epi32(idx, _mm256_set1_epi32(static_cast<int>(kGolden32))),
                          _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream))));
}

template <bool kNatural>
BP_TARGET_AVX2 BP_DITHER_INLINE __m256i Codes256(__m256 x, __m256i ctr, const Q256& q) {
  const __m256i r = Fmix256(_mm256_xor_si256(Fmix256(ctr), q.hi));
  const __m256 ax =
      _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kAbsMask))));
  const __m256 t = _mm256_mul_ps(ax, q.factor);
  const __m256 rf =
      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(kTwoM24));
  __m256i c;
  if constexpr (kNatural) {
    const __m256i tb = _mm256_castps_si256(t);
    const __m256i big = _mm256_cmpgt_epi32(tb, _mm256_set1_epi32(static_cast<int>(kOneBits - 1)));
    const __m256i e1 = _mm256_sub_epi32(_mm256_srli_epi32(tb, 23), _mm256_set1_epi32(126));
    const __m256i m = _mm256_and_si256(tb, _mm256_set1_epi32(static_cast<int>(kMantissaMask)));
    const __m256i up_big = _mm256_cmpgt_epi32(m, _mm256_srli_epi32(r, 9));
    const __m256i c_big = _mm256_sub_epi32(e1, up_big);
    const __m256i up_small = _mm256_castps_si256(_mm256_cmp_ps(rf, t, _CMP_LT_OQ));
    const __m256i c_small = _mm256_srli_epi32(up_small, 31);
    c = _mm256_blendv_epi8(c_small, c_big, big);
  } else {
    const __m256i fl = _mm256_cvttps_epi32(t);
    const __m256 frac = _mm256_sub_ps(t, _mm256_cvtepi32_ps(fl));
    const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(rf, frac, _CMP_LT_OQ));
    c = _mm256_sub_epi32(fl, up);
  }
  return _mm256_min_epu32(c, q.s);
}

// L(c) for codes c <= s (see Levels).
template <bool kNatural>
BP_TARGET_AVX2 BP_DITHER_INLINE __m256 Magnitude256(__m256i c, const Q256& q) {
  if constexpr (kNatural) {
    const __m256 pw = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(c, q.pow2_bias), 23));
    const __m256 v = _mm256_mul_ps(q.scale, pw);
    const __m256i zero = _mm256_cmpeq_epi32(c, _mm256_setzero_si256());
    return _mm256_andnot_ps(_mm256_castsi256_ps(zero), v);
  } else {
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(c), q.step);
    return _mm256_blendv_ps(v, q.scale, _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, q.s)));
  }
}

template <bool kNatural, bool kFeedback>
BP_TARGET_AVX2 BP_DITHER_INLINE __m256i Group256(const float* x, float* res, __m256i ctr,
                                                 const Q256& q, uint64_t* sign, int g) {
  const __m256 v = _mm256_loadu_ps(x);
  const __m256i c = Codes256<kNatural>(v, ctr, q);
  const __m256i nz = _mm256_cmpgt_epi32(c, _mm256_setzero_si256());
  const __m256i neg = _mm256_and_si256(_mm256_castps_si256(v), nz);  // sign bit: negative, c != 0
  *sign |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_castsi256_ps(neg))) << (8 * g);
  if constexpr (kFeedback) {
    const __m256i sbit = _mm256_and_si256(neg, _mm256_set1_epi32(static_cast<int>(kSignMask)));
    const __m256 d = _mm256_xor_ps(Magnitude256<kNatural>(c, q), _mm256_castsi256_ps(sbit));
    _mm256_storeu_ps(res, _mm256_sub_ps(v, d));
  }
  return c;
}

// 32 codes (4 vectors of 8) -> 32 bytes in element order.
BP_TARGET_AVX2 BP_DITHER_INLINE __m256i PackBytes256(__m256i c0, __m256i c1, __m256i c2,
                                                     __m256i c3) {
  const __m256i w01 = _mm256_packus_epi32(c0, c1);
  const __m256i w23 = _mm256_packus_epi32(c2, c3);
  const __m256i b = _mm256_packus_epi16(w01, w23);
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <bool kNatural, bool kFeedback>
BP_TARGET_AVX2 BP_DITHER_INLINE void Block256(const float* x, float* res, __m256i* ctr,
                                              const Q256& q, uint32_t bits, uint8_t* out) {
  const __m256i inc = _mm256_set1_epi32(static_cast<int>(8u * kGolden32));
  uint64_t sign = 0;
  __m256i c[8];
  // Written out (no loop) so the vectors stay in registers.
#define BP_DITHER_G(g)                                                                            \
  c[g] = Group256<kNatural, kFeedback>(x + 8 * (g), kFeedback ? res + 8 * (g) : nullptr, *ctr, q, \
                                       &sign, g);                                                 \
  *ctr = _mm256_add_epi32(*ctr, inc)
  BP_DITHER_G(0);
  BP_DITHER_G(1);
  BP_DITHER_G(2);
  BP_DITHER_G(3);
  BP_DITHER_G(4);
  BP_DITHER_G(5);
  BP_DITHER_G(6);
  BP_DITHER_G(7);
#undef BP_DITHER_G
  const __m256i lo = PackBytes256(c[0], c[1], c[2], c[3]);
  const __m256i hi = PackBytes256(c[4], c[5], c[6], c[7]);
  StoreU64(out, sign);
  for (uint32_t p = 0; p < bits; ++p) {
    const __m128i sh = _mm_cvtsi32_si128(static_cast<int>(7 - p));  // bit p -> bit 7 of each byte
    const uint32_t mlo = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_sll_epi16(lo, sh)));
    const uint32_t mhi = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_sll_epi16(hi, sh)));
    StoreU64(out + 8 * (1 + p), static_cast<uint64_t>(mlo) | (static_cast<uint64_t>(mhi) << 32));
  }
}

template <bool kNatural, bool kFeedback>
BP_TARGET_AVX2 void QuantizeAvx2T(const float* x, float* res, size_t n, const QuantizeArgs& a,
                                  uint8_t* out) {
  const Levels& lv = *a.levels;
  Q256 q;
  q.factor = _mm256_set1_ps(a.factor);
  q.s = _mm256_set1_epi32(static_cast<int>(lv.s));
  q.hi = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(a.stream >> 32)));
  q.step = _mm256_set1_ps(lv.step);
  q.scale = _mm256_set1_ps(lv.scale);
  q.pow2_bias = _mm256_set1_epi32(127 - static_cast<int>(lv.s));
  __m256i ctr = SetupCounter256(a.stream, 0);
  const size_t bb = BlockBytes(lv.bits);
  const size_t full = n / kBlockElements;
  for (size_t j = 0; j < full; ++j) {
    const size_t off = j * kBlockElements;
    Block256<kNatural, kFeedback>(x + off, kFeedback ? res + off : nullptr, &ctr, q, lv.bits,
                                  out + j * bb);
  }
  const size_t rem = n - full * kBlockElements;
  if (rem) {
    const size_t off = full * kBlockElements;
    alignas(64) float buf[kBlockElements] = {};
    std::memcpy(buf, x + off, rem * sizeof(float));
    Block256<kNatural, kFeedback>(buf, buf, &ctr, q, lv.bits, out + full * bb);
    if (kFeedback) std::memcpy(res + off, buf, rem * sizeof(float));
  }
}

BP_TARGET_AVX2 BP_DITHER_INLINE __m256i ExpandBits256(uint32_t m) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)), shuf);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

template <bool kNatural, bool kAdd>
BP_TARGET_AVX2 BP_DITHER_INLINE void Decode8Avx2(__m128i codes8, __m128i signs8, const Q256& q,
                                                 float* out) {
  const __m256i c = _mm256_cvtepu8_epi32(codes8);
  const __m256i sb = _mm256_slli_epi32(_mm256_cvtepi8_epi32(signs8), 31);
  const __m256 v = _mm256_xor_ps(Magnitude256<kNatural>(c, q), _mm256_castsi256_ps(sb));
  if constexpr (kAdd) {
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), v));
  } else {
    _mm256_storeu_ps(out, v);
  }
}

template <bool kNatural, bool kAdd>
BP_TARGET_AVX2 BP_DITHER_INLINE void DecodeBlockAvx2(const uint8_t* blk, uint32_t bits,
                                                     const Q256& q, float* out) {
  const uint64_t sign = LoadU64(blk);
  for (int h = 0; h < 2; ++h) {
    __m256i codes = _mm256_setzero_si256();
    for (uint32_t p = 0; p < bits; ++p) {
      const uint32_t m = static_cast<uint32_t>(LoadU64(blk + 8 * (1 + p)) >> (32 * h));
      codes = _mm256_or_si256(
          codes, _mm256_and_si256(ExpandBits256(m), _mm256_set1_epi8(static_cast<char>(1u << p))));
    }
    const __m256i signs = ExpandBits256(static_cast<uint32_t>(sign >> (32 * h)));
    const __m128i clo = _mm256_castsi256_si128(codes);
    const __m128i chi = _mm256_extracti128_si256(codes, 1);
    const __m128i slo = _mm256_castsi256_si128(signs);
    const __m128i shi = _mm256_extracti128_si256(signs, 1);
    float* o = out + 32 * h;
    Decode8Avx2<kNatural, kAdd>(clo, slo, q, o);
    Decode8Avx2<kNatural, kAdd>(_mm_srli_si128(clo, 8), _mm_srli_si128(slo, 8), q, o + 8);
    Decode8Avx2<kNatural, kAdd>(chi, shi, q, o + 16);
    Decode8Avx2<kNatural, kAdd>(_mm_srli_si128(chi, 8), _mm_srli_si128(shi, 8), q, o + 24);
  }
}

// The last, partial block is decoded into a full-block buffer; this writes (or adds) its
// first `rem` values.
template <bool kAdd>
inline void StoreTail(const float* buf, float* out, size_t rem) {
  for (size_t t = 0; t < rem; ++t) {
    if (kAdd) {
      out[t] += buf[t];
    } else {
      out[t] = buf[t];
    }
  }
}

template <bool kNatural, bool kAdd>
BP_TARGET_AVX2 void DecodeAvx2T(const uint8_t* blocks, size_t n, const Levels& lv, float* out) {
  Q256 q;
  q.s = _mm256_set1_epi32(static_cast<int>(lv.s));
  q.step = _mm256_set1_ps(lv.step);
  q.scale = _mm256_set1_ps(lv.scale);
  q.pow2_bias = _mm256_set1_epi32(127 - static_cast<int>(lv.s));
  const size_t bb = BlockBytes(lv.bits);
  const size_t full = n / kBlockElements;
  for (size_t j = 0; j < full; ++j) {
    DecodeBlockAvx2<kNatural, kAdd>(blocks + j * bb, lv.bits, q, out + j * kBlockElements);
  }
  const size_t rem = n - full * kBlockElements;
  if (rem) {
    alignas(64) float buf[kBlockElements];
    DecodeBlockAvx2<kNatural, false>(blocks + full * bb, lv.bits, q, buf);
    StoreTail<kAdd>(buf, out + full * kBlockElements, rem);
  }
}

BP_TARGET_AVX2 uint32_t MaxAbsBitsAvx2(const float* x, size_t n) {
  const __m256i abs = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_epu32(
        m0, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs));
    m1 = _mm256_max_epu32(
        m1, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(m0, m1));
  uint32_t m = MaxAbsBitsScalar(x + i, n - i);
  for (uint32_t l : lanes) m = std::max(m, l);
  return m;
}

BP_TARGET_AVX2 uint32_t AddMaxAbsBitsAvx2(const float* g, float* e, size_t n) {
  const __m256i abs = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(e + i), _mm256_loadu_ps(g + i));
    const __m256 b = _mm256_add_ps(_mm256_loadu_ps(e + i + 8), _mm256_loadu_ps(g + i + 8));
    _mm256_storeu_ps(e + i, a);
    _mm256_storeu_ps(e + i + 8, b);
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_castps_si256(a), abs));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_castps_si256(b), abs));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(m0, m1));
  uint32_t m = AddMaxAbsBitsScalar(g + i, e + i, n - i);
  for (uint32_t l : lanes) m = std::max(m, l);
  return m;
}

// 32 lanes as 8 x 4 doubles: accumulator k holds lanes 4k..4k+3.
template <bool kAddFirst>
BP_TARGET_AVX2 double SumSquaresAvx2T(const float* g, float* e, size_t n) {
  __m256d acc[8];
  for (auto& a : acc) a = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + kL2Lanes <= n; i += kL2Lanes) {
    for (int k = 0; k < 4; ++k) {
      __m256 v = _mm256_loadu_ps(e + i + 8 * k);
      if (kAddFirst) {
        v = _mm256_add_ps(v, _mm256_loadu_ps(g + i + 8 * k));
        _mm256_storeu_ps(e + i + 8 * k, v);
      }
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      acc[2 * k] = _mm256_fmadd_pd(lo, lo, acc[2 * k]);
      acc[2 * k + 1] = _mm256_fmadd_pd(hi, hi, acc[2 * k + 1]);
    }
  }
  double lanes[kL2Lanes];
  for (int k = 0; k < 8; ++k) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
  if (kAddFirst) {
    AddSumSquaresTail(g, e, i, n, lanes);
  } else {
    SumSquaresTail(e, i, n, lanes);
  }
  return CombineLanes(lanes);
}

// ---- AVX-512 ------------------------------------------------------------------------------

struct Q512 {
  __m512 factor;
  __m512i s;
  __m512i hi;
  __m512 step;
  __m512 scale;
  __m512 tlo;  // table[0..15]
  __m512 thi;  // table[16..31]
};

BP_TARGET_AVX512 BP_DITHER_INLINE __m512i Fmix512(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

template <bool kNatural>
BP_TARGET_AVX512 BP_DITHER_INLINE __m512i Codes512(__m512 x, __m512i ctr, const Q512& q) {
  const __m512i r = Fmix512(_mm512_xor_si512(Fmix512(ctr), q.hi));
  const __m512 ax = _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(kAbsMask))));
  const __m512 t = _mm512_mul_ps(ax, q.factor);
  const __m512 rf =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 8)), _mm512_set1_ps(kTwoM24));
  const __m512i one = _mm512_set1_epi32(1);
  __m512i c;
  if constexpr (kNatural) {
    const __m512i tb = _mm512_castps_si512(t);
    const __mmask16 big =
        _mm512_cmpge_epu32_mask(tb, _mm512_set1_epi32(static_cast<int>(kOneBits)));
    const __m512i e1 = _mm512_sub_epi32(_mm512_srli_epi32(tb, 23), _mm512_set1_epi32(126));
    const __m512i m = _mm512_and_si512(tb, _mm512_set1_epi32(static_cast<int>(kMantissaMask)));
    const __mmask16 up_big = _mm512_cmplt_epu32_mask(_mm512_srli_epi32(r, 9), m);
    const __mmask16 up_small = _mm512_cmp_ps_mask(rf, t, _CMP_LT_OQ);
    const __m512i c_small = _mm512_maskz_mov_epi32(up_small, one);
    const __m512i c_big = _mm512_mask_add_epi32(e1, up_big, e1, one);
    c = _mm512_mask_mov_epi32(c_small, big, c_big);
  } else {
    const __m512i fl = _mm512_cvttps_epi32(t);
    const __m512 frac = _mm512_sub_ps(t, _mm512_cvtepi32_ps(fl));
    const __mmask16 up = _mm512_cmp_ps_mask(rf, frac, _CMP_LT_OQ);
    c = _mm512_mask_add_epi32(fl, up, fl, one);
  }
  return _mm512_min_epu32(c, q.s);
}

// L(c) for codes c <= s: a table lookup when s <= 31, else the linear formula.
template <bool kTable>
BP_TARGET_AVX512 BP_DITHER_INLINE __m512 Magnitude512(__m512i c, const Q512& q) {
  if constexpr (kTable) {
    return _mm512_permutex2var_ps(q.tlo, c, q.thi);
  } else {
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(c), q.step);
    return _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(c, q.s), q.scale);
  }
}

template <bool kNatural, bool kTable, bool kFeedback>
BP_TARGET_AVX512 BP_DITHER_INLINE __m512i Group512(const float* x, float* res, __m512i ctr,
                                                   const Q512& q, uint64_t* sign, int g) {
  const __m512 v = _mm512_loadu_ps(x);
  const __m512i c = Codes512<kNatural>(v, ctr, q);
  const __mmask16 neg =
      _mm512_mask_test_epi32_mask(_mm512_movepi32_mask(_mm512_castps_si512(v)), c, c);
  *sign |= static_cast<uint64_t>(_cvtmask16_u32(neg)) << (16 * g);
  if constexpr (kFeedback) {
    const __m512i d = _mm512_castps_si512(Magnitude512<kTable>(c, q));
    const __m512i sd =
        _mm512_mask_xor_epi32(d, neg, d, _mm512_set1_epi32(static_cast<int>(kSignMask)));
    _mm512_storeu_ps(res, _mm512_sub_ps(v, _mm512_castsi512_ps(sd)));
  }
  return c;
}

template <bool kNatural, bool kTable, bool kFeedback>
BP_TARGET_AVX512 BP_DITHER_INLINE void Block512(const float* x, float* res, __m512i* ctr,
                                                const Q512& q, uint32_t bits, uint8_t* out) {
  const __m512i inc = _mm512_set1_epi32(static_cast<int>(16u * kGolden32));
  uint64_t sign = 0;
  const __m512i c0 = Group512<kNatural, kTable, kFeedback>(x, res, *ctr, q, &sign, 0);
  *ctr = _mm512_add_epi32(*ctr, inc);
  const __m512i c1 = Group512<kNatural, kTable, kFeedback>(x + 16, kFeedback ? res + 16 : nullptr,
                                                           *ctr, q, &sign, 1);
  *ctr = _mm512_add_epi32(*ctr, inc);
  const __m512i c2 = Group512<kNatural, kTable, kFeedback>(x + 32, kFeedback ? res + 32 : nullptr,
                                                           *ctr, q, &sign, 2);
  *ctr = _mm512_add_epi32(*ctr, inc);
  const __m512i c3 = Group512<kNatural, kTable, kFeedback>(x + 48, kFeedback ? res + 48 : nullptr,
                                                           *ctr, q, &sign, 3);
  *ctr = _mm512_add_epi32(*ctr, inc);
  // 64 codes -> 64 bytes in element order: packs work per 128-bit lane, so dword 4l+g holds
  // elements 16g+4l..16g+4l+3; the permute transposes that back.
  const __m512i w01 = _mm512_packus_epi32(c0, c1);
  const __m512i w23 = _mm512_packus_epi32(c2, c3);
  const __m512i bytes = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
      _mm512_packus_epi16(w01, w23));
  StoreU64(out, sign);
  for (uint32_t p = 0; p < bits; ++p) {
    const __mmask64 m = _mm512_test_epi8_mask(bytes, _mm512_set1_epi8(static_cast<char>(1u << p)));
    StoreU64(out + 8 * (1 + p), _cvtmask64_u64(m));
  }
}

BP_TARGET_AVX512 BP_DITHER_INLINE void InitQ512(const Levels& lv, Q512* q) {
  q->s = _mm512_set1_epi32(static_cast<int>(lv.s));
  q->step = _mm512_set1_ps(lv.step);
  q->scale = _mm512_set1_ps(lv.scale);
  q->tlo = _mm512_loadu_ps(lv.table);
  q->thi = _mm512_loadu_ps(lv.table + 16);
}

template <bool kNatural, bool kTable, bool kFeedback>
BP_TARGET_AVX512 void QuantizeAvx512T(const float* x, float* res, size_t n, const QuantizeArgs& a,
                                      uint8_t* out) {
  const Levels& lv = *a.levels;
  Q512 q;
  InitQ512(lv, &q);
  q.factor = _mm512_set1_ps(a.factor);
  q.hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(a.stream >> 32)));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i ctr =
      _mm512_add_epi32(_mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(kGolden32))),
                       _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(a.stream))));
  const size_t bb = BlockBytes(lv.bits);
  const size_t full = n / kBlockElements;
  for (size_t j = 0; j < full; ++j) {
    const size_t off = j * kBlockElements;
    Block512<kNatural, kTable, kFeedback>(x + off, kFeedback ? res + off : nullptr, &ctr, q,
                                          lv.bits, out + j * bb);
  }
  const size_t rem = n - full * kBlockElements;
  if (rem) {
    const size_t off = full * kBlockElements;
    alignas(64) float buf[kBlockElements] = {};
    std::memcpy(buf, x + off, rem * sizeof(float));
    Block512<kNatural, kTable, kFeedback>(buf, buf, &ctr, q, lv.bits, out + full * bb);
    if (kFeedback) std::memcpy(res + off, buf, rem * sizeof(float));
  }
}

template <bool kTable, bool kAdd, int G>
BP_TARGET_AVX512 BP_DITHER_INLINE void Decode16Avx512(__m512i bytes, uint64_t sign, const Q512& q,
                                                      float* out) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(bytes, G));
  const __m512i d = _mm512_castps_si512(Magnitude512<kTable>(c, q));
  const __mmask16 neg = _cvtu32_mask16(static_cast<uint32_t>(sign >> (16 * G)) & 0xFFFFu);
  const __m512 v = _mm512_castsi512_ps(
      _mm512_mask_xor_epi32(d, neg, d, _mm512_set1_epi32(static_cast<int>(kSignMask))));
  if constexpr (kAdd) {
    _mm512_storeu_ps(out + 16 * G, _mm512_add_ps(_mm512_loadu_ps(out + 16 * G), v));
  } else {
    _mm512_storeu_ps(out + 16 * G, v);
  }
}

template <bool kTable, bool kAdd>
BP_TARGET_AVX512 BP_DITHER_INLINE void DecodeBlockAvx512(const uint8_t* blk, uint32_t bits,
                                                         const Q512& q, float* out) {
  __m512i bytes = _mm512_setzero_si512();
  for (uint32_t p = 0; p < bits; ++p) {
    const __mmask64 m = _cvtu64_mask64(LoadU64(blk + 8 * (1 + p)));
    bytes = _mm512_mask_add_epi8(bytes, m, bytes, _mm512_set1_epi8(static_cast<char>(1u << p)));
  }
  const uint64_t sign = LoadU64(blk);
  Decode16Avx512<kTable, kAdd, 0>(bytes, sign, q, out);
  Decode16Avx512<kTable, kAdd, 1>(bytes, sign, q, out);
  Decode16Avx512<kTable, kAdd, 2>(bytes, sign, q, out);
  Decode16Avx512<kTable, kAdd, 3>(bytes, sign, q, out);
}

template <bool kTable, bool kAdd>
BP_TARGET_AVX512 void DecodeAvx512T(const uint8_t* blocks, size_t n, const Levels& lv, float* out) {
  Q512 q;
  InitQ512(lv, &q);
  const size_t bb = BlockBytes(lv.bits);
  const size_t full = n / kBlockElements;
  for (size_t j = 0; j < full; ++j) {
    DecodeBlockAvx512<kTable, kAdd>(blocks + j * bb, lv.bits, q, out + j * kBlockElements);
  }
  const size_t rem = n - full * kBlockElements;
  if (rem) {
    alignas(64) float buf[kBlockElements];
    DecodeBlockAvx512<kTable, false>(blocks + full * bb, lv.bits, q, buf);
    StoreTail<kAdd>(buf, out + full * kBlockElements, rem);
  }
}

BP_TARGET_AVX512 BP_DITHER_INLINE uint32_t HorizontalMax512(__m512i v) {
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, v);
  uint32_t m = 0;
  for (uint32_t l : lanes) m = std::max(m, l);
  return m;
}

BP_TARGET_AVX512 uint32_t MaxAbsBitsAvx512(const float* x, size_t n) {
  const __m512i abs = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_mask_max_epu32(m0, 0xFFFF, m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
    m1 = _mm512_mask_max_epu32(m1, 0xFFFF, m1,
                               _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs));
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 k = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    m0 = _mm512_mask_max_epu32(m0, 0xFFFF, m0,
                               _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + i), abs));
  }
  return HorizontalMax512(_mm512_mask_max_epu32(m0, 0xFFFF, m0, m1));
}

BP_TARGET_AVX512 uint32_t AddMaxAbsBitsAvx512(const float* g, float* e, size_t n) {
  const __m512i abs = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_add_ps(_mm512_loadu_ps(e + i), _mm512_loadu_ps(g + i));
    const __m512 b = _mm512_add_ps(_mm512_loadu_ps(e + i + 16), _mm512_loadu_ps(g + i + 16));
    _mm512_storeu_ps(e + i, a);
    _mm512_storeu_ps(e + i + 16, b);
    m0 = _mm512_mask_max_epu32(m0, 0xFFFF, m0, _mm512_and_si512(_mm512_castps_si512(a), abs));
    m1 = _mm512_mask_max_epu32(m1, 0xFFFF, m1, _mm512_and_si512(_mm512_castps_si512(b), abs));
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 k = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 a =
        _mm512_add_ps(_mm512_maskz_loadu_ps(k, e + i), _mm512_maskz_loadu_ps(k, g + i));
    _mm512_mask_storeu_ps(e + i, k, a);
    m0 = _mm512_mask_max_epu32(m0, 0xFFFF, m0, _mm512_and_si512(_mm512_castps_si512(a), abs));
  }
  return HorizontalMax512(_mm512_mask_max_epu32(m0, 0xFFFF, m0, m1));
}

// 32 lanes as 4 x 8 doubles: accumulator k holds lanes 8k..8k+7.
template <bool kAddFirst>
BP_TARGET_AVX512 double SumSquaresAvx512T(const float* g, float* e, size_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  __m512d a2 = _mm512_setzero_pd(), a3 = _mm512_setzero_pd();
  size_t i = 0;
  for (; i + kL2Lanes <= n; i += kL2Lanes) {
    __m512 u = _mm512_loadu_ps(e + i);
    __m512 v = _mm512_loadu_ps(e + i + 16);
    if (kAddFirst) {
      u = _mm512_add_ps(u, _mm512_loadu_ps(g + i));
      v = _mm512_add_ps(v, _mm512_loadu_ps(g + i + 16));
      _mm512_storeu_ps(e + i, u);
      _mm512_storeu_ps(e + i + 16, v);
    }
    const __m512d u0 = _mm512_cvtps_pd(_mm512_castps512_ps256(u));
    const __m512d u1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(u, 1));
    const __m512d v0 = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d v1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    a0 = _mm512_fmadd_pd(u0, u0, a0);
    a1 = _mm512_fmadd_pd(u1, u1, a1);
    a2 = _mm512_fmadd_pd(v0, v0, a2);
    a3 = _mm512_fmadd_pd(v1, v1, a3);
  }
  double lanes[kL2Lanes];
  _mm512_storeu_pd(lanes, a0);
  _mm512_storeu_pd(lanes + 8, a1);
  _mm512_storeu_pd(lanes + 16, a2);
  _mm512_storeu_pd(lanes + 24, a3);
  if (kAddFirst) {
    AddSumSquaresTail(g, e, i, n, lanes);
  } else {
    SumSquaresTail(e, i, n, lanes);
  }
  return CombineLanes(lanes);
}

// ---- dispatch helpers ---------------------------------------------------------------------

template <bool kFeedback>
void QuantizeDispatch(const float* x, float* res, size_t n, const QuantizeArgs& a, uint8_t* out,
                      IsaLevel isa) {
  if (n == 0) return;
  const Levels& lv = *a.levels;
  if (a.prescale != 1.0f) isa = IsaLevel::kScalar;  // tiny scales: scalar only (see header)
  switch (isa) {
    case IsaLevel::kAvx512:
      if (lv.natural) return QuantizeAvx512T<true, true, kFeedback>(x, res, n, a, out);
      if (lv.s <= 31) return QuantizeAvx512T<false, true, kFeedback>(x, res, n, a, out);
      return QuantizeAvx512T<false, false, kFeedback>(x, res, n, a, out);
    case IsaLevel::kAvx2:
      if (lv.natural) return QuantizeAvx2T<true, kFeedback>(x, res, n, a, out);
      return QuantizeAvx2T<false, kFeedback>(x, res, n, a, out);
    case IsaLevel::kScalar: break;
  }
  QuantizeScalar(x, res, n, a, out);
}

}  // namespace

void InitLevels(uint32_t s, bool natural, float scale, Levels* out) {
  out->s = s;
  out->bits = BitsForLevels(s);
  out->natural = natural;
  out->scale = scale;
  out->step = natural ? 0.0f : scale / static_cast<float>(s);
  for (uint32_t c = 0; c < kMaxCodes; ++c) {
    float v = 0.0f;
    if (c <= s) {
      if (natural) {
        // 2^(c - s) with c - s in [-30, 0]: a normal float built from its exponent bits.
        v = c == 0 ? 0.0f : scale * BitsFloat((c + 127 - s) << 23);
      } else {
        v = c == s ? scale : static_cast<float>(c) * out->step;
      }
    }
    out->table[c] = v;
  }
}

uint32_t MaxAbsBits(const float* x, size_t n, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return MaxAbsBitsAvx512(x, n);
    case IsaLevel::kAvx2: return MaxAbsBitsAvx2(x, n);
    case IsaLevel::kScalar: break;
  }
  return MaxAbsBitsScalar(x, n);
}

uint32_t AddMaxAbsBits(const float* g, float* e, size_t n, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return AddMaxAbsBitsAvx512(g, e, n);
    case IsaLevel::kAvx2: return AddMaxAbsBitsAvx2(g, e, n);
    case IsaLevel::kScalar: break;
  }
  return AddMaxAbsBitsScalar(g, e, n);
}

double SumSquares(const float* x, size_t n, IsaLevel isa) {
  // The kernels only read through `e` when kAddFirst is false.
  float* xe = const_cast<float*>(x);
  switch (isa) {
    case IsaLevel::kAvx512: return SumSquaresAvx512T<false>(nullptr, xe, n);
    case IsaLevel::kAvx2: return SumSquaresAvx2T<false>(nullptr, xe, n);
    case IsaLevel::kScalar: break;
  }
  return SumSquaresScalar(x, n);
}

double AddSumSquares(const float* g, float* e, size_t n, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return SumSquaresAvx512T<true>(g, e, n);
    case IsaLevel::kAvx2: return SumSquaresAvx2T<true>(g, e, n);
    case IsaLevel::kScalar: break;
  }
  return AddSumSquaresScalar(g, e, n);
}

void QuantizePack(const float* x, size_t n, const QuantizeArgs& args, uint8_t* blocks,
                  IsaLevel isa) {
  QuantizeDispatch<false>(x, nullptr, n, args, blocks, isa);
}

void QuantizePackFeedback(float* q, size_t n, const QuantizeArgs& args, uint8_t* blocks,
                          IsaLevel isa) {
  QuantizeDispatch<true>(q, q, n, args, blocks, isa);
}

void DecodeBlocks(const uint8_t* blocks, size_t n, const Levels& lv, float* out, bool add,
                  IsaLevel isa) {
  if (n == 0) return;
  switch (isa) {
    case IsaLevel::kAvx512:
      if (lv.s <= 31) {
        return add ? DecodeAvx512T<true, true>(blocks, n, lv, out)
                   : DecodeAvx512T<true, false>(blocks, n, lv, out);
      }
      return add ? DecodeAvx512T<false, true>(blocks, n, lv, out)
                 : DecodeAvx512T<false, false>(blocks, n, lv, out);
    case IsaLevel::kAvx2:
      if (lv.natural) {
        return add ? DecodeAvx2T<true, true>(blocks, n, lv, out)
                   : DecodeAvx2T<true, false>(blocks, n, lv, out);
      }
      return add ? DecodeAvx2T<false, true>(blocks, n, lv, out)
                 : DecodeAvx2T<false, false>(blocks, n, lv, out);
    case IsaLevel::kScalar: break;
  }
  DecodeScalar(blocks, n, lv, out, add);
}

}  // namespace bitpush::compressors::dithering
