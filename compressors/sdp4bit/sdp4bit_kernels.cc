#include "compressors/sdp4bit/sdp4bit_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/counter_rng.h"
#include "common/half.h"
#include "common/little_endian.h"

namespace bitpush::compressors::sdp4bit {
namespace {

#define BP_SDP_INLINE __attribute__((always_inline)) inline

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr float kTwo16 = 0x1p16f;
constexpr float kInv32 = 0.03125f;
// Decoding with the transform folds the final * 2^-5 into the scale (code * (scale * 2^-5),
// the butterflies, no last product) for scales in [2^-96, 2^96]: every intermediate is then a
// normal fp32 number (nonzero magnitudes >= ulp(scale) * 2^-5 >= 2^-124, all <= 2^106), so
// scaling by 2^-5 commutes with each rounding and the values are bit for bit those of the
// definition. Other scales (and NaN) take the literal path.
constexpr float kFoldMin = 0x1p-96f;
constexpr float kFoldMax = 0x1p96f;
// A tiny absmax (L / absmax overflows fp32) is scaled up by this power of two first (exact).
constexpr float kPrescale = 0x1p64f;

// An optimisation barrier: the compiler cannot fuse a product passed through it into a later
// addition (-ffp-contract=fast would do so only where FMA is enabled, i.e. on the SIMD levels,
// and this code may be inlined there).
inline float Opaque(float v) {
  __asm__("" : "+x"(v));
  return v;
}

// ---- group parameters (shared by every level) -----------------------------------------------

enum class Mode : uint8_t {
  kNormal,     // w = y * inv16
  kZero,       // stored scale 1, codes 0 (all-zero group, or absmax / L underflows to 0)
  kNonFinite,  // stored scale NaN, codes 0
  kTiny,       // w = (y * 2^64) * inv16, inv16 = fp32(L / (absmax * 2^64)) * 2^16
};

struct GroupParams {
  Mode mode;
  float scale;  // stored
  float inv16;  // fp32(L / absmax) * 2^16 (exact), or the tiny variant
};

BP_SDP_INLINE GroupParams ParamsFor(uint32_t amax_bits, uint32_t levels) {
  if (amax_bits >= kInfBits) {
    return {Mode::kNonFinite, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  }
  if (amax_bits == 0) return {Mode::kZero, 1.0f, 0.0f};
  const float amax = BitsToFloat(amax_bits);
  const float l = static_cast<float>(levels);
  const float scale = amax / l;
  if (scale == 0.0f) return {Mode::kZero, 1.0f, 0.0f};
  const float inv16 = (l / amax) * kTwo16;
  if (FloatBits(inv16) >= kInfBits) return {Mode::kTiny, scale, (l / (amax * kPrescale)) * kTwo16};
  return {Mode::kNormal, scale, inv16};
}

// The 16-bit uniform of element i: CounterRandom32Lite at ((i >> 5) << 4) | (i & 15) (elements i
// and i + 16 of a 32-block share one number), its low half for i & 16 clear, else its high half.
BP_SDP_INLINE uint32_t Uniform16(uint64_t stream, size_t i) {
  const uint32_t r = CounterRandom32Lite(stream, static_cast<uint32_t>(((i >> 5) << 4) | (i & 15)));
  return (i & 16) != 0 ? r >> 16 : r & 0xFFFFu;
}

// ---- scalar (the reference) ------------------------------------------------------------------

uint32_t AmaxBitsScalar(const float* y, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, FloatBits(y[i]) & kAbsMask);
  return m;
}

// Stages h = 1, 2, 4, 8, 16; (a, b) -> (a + b, a - b).
void Fwht32Scalar(float* x) {
  for (size_t h = 1; h < kBlock; h <<= 1) {
    for (size_t i = 0; i < kBlock; ++i) {
      if ((i & h) != 0) continue;
      const float a = x[i];
      const float b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
  }
}

// w = v * 2^16 finite with |w| <= L 2^16 (1 + 2^-22) < 2^23: (floor(w) + r16) >> 16 (an
// arithmetic shift: floor division by 2^16), clamped to [-L, L].
BP_SDP_INLINE int32_t CodeOf(float w, uint32_t r16, int32_t levels) {
  int32_t f = static_cast<int32_t>(w);    // truncation
  if (static_cast<float>(f) > w) f -= 1;  // floor
  return std::clamp((f + static_cast<int32_t>(r16)) >> 16, -levels, levels);
}

// Codes of one group y[0..len) starting at element `first` (even).
__attribute__((noinline)) void QuantizeGroupScalar(const float* y, size_t len, size_t first,
                                                   const GroupParams& gp, uint32_t bits,
                                                   uint64_t stream, uint8_t* codes) {
  uint8_t* out = codes + CodeBytes(first, bits);
  if (gp.mode == Mode::kZero || gp.mode == Mode::kNonFinite) {
    std::memset(out, 0, CodeBytes(len, bits));
    return;
  }
  const int32_t levels = static_cast<int32_t>(MaxCode(bits));
  const bool tiny = gp.mode == Mode::kTiny;
  auto code_at = [&](size_t k) {
    float yk = y[k];
    if (tiny) yk = Opaque(yk * kPrescale);
    const float w = Opaque(yk * gp.inv16);
    return CodeOf(w, Uniform16(stream, first + k), levels);
  };
  if (bits == 8) {
    for (size_t k = 0; k < len; ++k) out[k] = static_cast<uint8_t>(code_at(k));
    return;
  }
  for (size_t k = 0; k < len; k += 2) {
    const int32_t c0 = code_at(k);
    const int32_t c1 = k + 1 < len ? code_at(k + 1) : 0;
    out[k / 2] = static_cast<uint8_t>(((c0 & 0xF) << 4) | (c1 & 0xF));
  }
}

// Element i of a validated code array.
BP_SDP_INLINE int32_t CodeAt(const uint8_t* codes, size_t i, uint32_t bits) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  const uint8_t b = codes[i / 2];
  const uint8_t nib = (i % 2 == 0) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
  return static_cast<int8_t>(static_cast<uint8_t>(nib << 4)) >> 4;
}

__attribute__((noinline)) void QuantizeScalar(const float* x, size_t count, size_t len,
                                              size_t first, bool transform, const Layout& lay,
                                              uint8_t* scales, uint8_t* codes, float* work) {
  const size_t g = lay.group;
  const uint32_t levels = MaxCode(lay.bits);
  for (size_t s = 0; s < len; s += g) {
    const size_t glen = std::min(g, len - s);
    const float* y = x + s;
    if (transform || s + glen > count) {
      const size_t have = count > s ? std::min(count - s, glen) : 0;
      if (have) std::memcpy(work, x + s, have * sizeof(float));
      std::fill(work + have, work + glen, 0.0f);
      if (transform) {
        for (size_t b = 0; b < glen; b += kBlock) Fwht32Scalar(work + b);
      }
      y = work;
    }
    const GroupParams gp = ParamsFor(AmaxBitsScalar(y, glen), levels);
    PutF32(scales + 4 * ((first + s) / g), gp.scale);
    QuantizeGroupScalar(y, glen, first + s, gp, lay.bits, lay.stream, codes);
  }
}

// Writes (or adds) v to out[k] where k < valid.
BP_SDP_INLINE void Emit(float* out, size_t k, size_t valid, float v, bool add) {
  if (k >= valid) return;
  out[k] = add ? out[k] + v : v;
}

__attribute__((noinline)) void DequantizeScalar(const uint8_t* scales, const uint8_t* codes,
                                                size_t first, size_t len, size_t valid,
                                                const Layout& lay, bool inverse, float* out,
                                                bool add) {
  const size_t g = lay.group;
  for (size_t s = 0; s < len; s += g) {
    const size_t glen = std::min(g, len - s);
    const float scale = GetF32(scales + 4 * ((first + s) / g));
    if (!inverse) {
      for (size_t k = 0; k < glen && s + k < valid; ++k) {
        const float v = Opaque(static_cast<float>(CodeAt(codes, first + s + k, lay.bits)) * scale);
        Emit(out, s + k, valid, v, add);
      }
      continue;
    }
    for (size_t b = 0; b < glen && s + b < valid; b += kBlock) {
      float t[kBlock];
      for (size_t j = 0; j < kBlock; ++j) {
        t[j] = Opaque(static_cast<float>(CodeAt(codes, first + s + b + j, lay.bits)) * scale);
      }
      Fwht32Scalar(t);
      for (size_t j = 0; j < kBlock; ++j) Emit(out, s + b + j, valid, Opaque(t[j] * kInv32), add);
    }
  }
}

void TransformScalar(float* x, size_t m, bool inverse) {
  for (size_t b = 0; b < m; b += kBlock) {
    Fwht32Scalar(x + b);
    if (inverse) {
      for (size_t j = 0; j < kBlock; ++j) x[b + j] = Opaque(x[b + j] * kInv32);
    }
  }
}

// Where a partial last block is decoded into a buffer first: the first `rem` values.
BP_SDP_INLINE void StoreTail(const float* buf, float* out, size_t rem, bool add) {
  for (size_t j = 0; j < rem; ++j) out[j] = add ? out[j] + buf[j] : buf[j];
}

// ---- shared SSE-level helpers (compiled into each target) --------------------------------------

// 16 bytes of 4-bit codes -> 32 signed int8 codes in element order (e0: 0..15, e1: 16..31).
#define BP_SDP_UNPACK4(b, e0, e1)                                                               \
  do {                                                                                          \
    const __m128i lut_ = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1); \
    const __m128i nib_ = _mm_set1_epi8(0x0F);                                                   \
    const __m128i lo_ = _mm_shuffle_epi8(lut_, _mm_and_si128((b), nib_));                       \
    const __m128i hi_ = _mm_shuffle_epi8(lut_, _mm_and_si128(_mm_srli_epi16((b), 4), nib_));    \
    (e0) = _mm_unpacklo_epi8(hi_, lo_);                                                         \
    (e1) = _mm_unpackhi_epi8(hi_, lo_);                                                         \
  } while (0)

// ---- AVX2 --------------------------------------------------------------------------------------

BP_TARGET_AVX2 BP_SDP_INLINE __m256 Opaque256(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

BP_TARGET_AVX2 BP_SDP_INLINE __m256i Fmix256(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// +1 in the lanes whose element index has bit h clear (h = 1, 2, 4 within 8 lanes), -1 where
// it is set.
BP_TARGET_AVX2 BP_SDP_INLINE __m256 SignLanes256(int h) {
  switch (h) {
    case 1: return _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    case 2: return _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    default: return _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
  }
}

// lo lanes: x + partner; hi lanes: partner - x (one rounding of an exact x * (+-1) + partner).
BP_TARGET_AVX2 BP_SDP_INLINE __m256 Butterfly256(__m256 x, __m256 partner, __m256 sign) {
  return _mm256_fmadd_ps(x, sign, partner);
}

struct Signs256 {
  __m256 s1, s2, s4;
};

BP_TARGET_AVX2 BP_SDP_INLINE __m256 InRegister256(__m256 x, const Signs256& s) {
  x = Butterfly256(x, _mm256_permute_ps(x, 0xB1), s.s1);
  x = Butterfly256(x, _mm256_permute_ps(x, 0x4E), s.s2);
  x = Butterfly256(x, _mm256_permute2f128_ps(x, x, 0x01), s.s4);
  return x;
}

BP_TARGET_AVX2 BP_SDP_INLINE void Fwht256(__m256* r, const Signs256& s) {
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) r[k] = InRegister256(r[k], s);
  const __m256 a0 = _mm256_add_ps(r[0], r[1]), a1 = _mm256_sub_ps(r[0], r[1]);
  const __m256 a2 = _mm256_add_ps(r[2], r[3]), a3 = _mm256_sub_ps(r[2], r[3]);
  r[0] = _mm256_add_ps(a0, a2);
  r[2] = _mm256_sub_ps(a0, a2);
  r[1] = _mm256_add_ps(a1, a3);
  r[3] = _mm256_sub_ps(a1, a3);
}

BP_TARGET_AVX2 BP_SDP_INLINE Signs256 MakeSigns256() {
  return {SignLanes256(1), SignLanes256(2), SignLanes256(4)};
}

struct Quant256 {
  __m256 inv16;
  __m256i hi;     // the stream's high word
  __m256i low16;  // 0xFFFF per lane
  __m256i step8;  // 8 counters further
  __m256i lmax;   // +L per byte
  __m256i lmin;   // -L per byte
};

// (floor(y * inv16) + r16) >> 16 per lane (the clamp comes after narrowing).
BP_TARGET_AVX2 BP_SDP_INLINE __m256i Codes256(__m256 y, __m256i r16, const Quant256& q) {
  const __m256 w = _mm256_floor_ps(_mm256_mul_ps(y, q.inv16));
  return _mm256_srai_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(w), r16), 16);
}

// 32 int32 codes (4 vectors) -> 32 int8 in element order.
BP_TARGET_AVX2 BP_SDP_INLINE __m256i Narrow256(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i w01 = _mm256_packs_epi32(c0, c1);
  const __m256i w23 = _mm256_packs_epi32(c2, c3);
  const __m256i b = _mm256_packs_epi16(w01, w23);
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 32 int8 codes in element order -> 16 bytes, element 2i in the high nibble.
BP_TARGET_AVX2 BP_SDP_INLINE __m128i Pack4From8Avx2(__m256i b) {
  const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(b, 4), _mm256_set1_epi16(0x00F0));
  const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(b, 8), _mm256_set1_epi16(0x000F));
  const __m256i w = _mm256_or_si256(hi, lo);
  return _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

// The counters (idx * golden + low word) of idx = first .. first + 7.
BP_TARGET_AVX2 BP_SDP_INLINE __m256i Counter256(uint64_t stream, size_t first) {
  const __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                       _mm256_set1_epi32(static_cast<int>(first)));
  return _mm256_add_epi32(_mm256_mullo_epi32(idx, _mm256_set1_epi32(static_cast<int>(kGolden32))),
                          _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream))));
}

// Codes of one 32-block y[0..4) (elements 0..7, 8..15, 16..23, 24..31) to out (16 bytes for 4
// bits, 32 for 8); ctr: the counters of its first 8 random numbers (elements 0..7 and 16..23),
// the next 8 serve elements 8..15 and 24..31.
template <uint32_t kBits>
BP_TARGET_AVX2 BP_SDP_INLINE void QuantBlock256(const __m256* y, __m256i ctr, const Quant256& q,
                                                uint8_t* out) {
  const __m256i h0 = Fmix256(_mm256_xor_si256(ctr, q.hi));
  const __m256i h1 = Fmix256(_mm256_xor_si256(_mm256_add_epi32(ctr, q.step8), q.hi));
  const __m256i c0 = Codes256(y[0], _mm256_and_si256(h0, q.low16), q);
  const __m256i c1 = Codes256(y[1], _mm256_and_si256(h1, q.low16), q);
  const __m256i c2 = Codes256(y[2], _mm256_srli_epi32(h0, 16), q);
  const __m256i c3 = Codes256(y[3], _mm256_srli_epi32(h1, 16), q);
  __m256i b = Narrow256(c0, c1, c2, c3);
  b = _mm256_max_epi8(_mm256_min_epi8(b, q.lmax), q.lmin);
  if constexpr (kBits == 4) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Pack4From8Avx2(b));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), b);
  }
}

BP_TARGET_AVX2 BP_SDP_INLINE __m256i AbsBits256(__m256 v) {
  return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(static_cast<int>(kAbsMask)));
}

BP_TARGET_AVX2 BP_SDP_INLINE uint32_t HorizontalMax256(__m256i v) {
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  uint32_t m = 0;
  for (uint32_t l : lanes) m = std::max(m, l);
  return m;
}

// Loads the 32-block at x[e..e+32) of an input with `count` values (zeros beyond).
BP_TARGET_AVX2 BP_SDP_INLINE void LoadBlock256(const float* x, size_t e, size_t count, __m256* r) {
  if (e + kBlock <= count) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) r[k] = _mm256_loadu_ps(x + e + 8 * k);
    return;
  }
  alignas(32) float buf[kBlock] = {};
  if (count > e) std::memcpy(buf, x + e, (count - e) * sizeof(float));
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) r[k] = _mm256_load_ps(buf + 8 * k);
}

template <uint32_t kBits>
BP_TARGET_AVX2 void QuantizeAvx2T(const float* x, size_t count, size_t len, size_t first,
                                  bool transform, const Layout& lay, uint8_t* scales,
                                  uint8_t* codes, float* work) {
  const size_t g = lay.group;
  const uint32_t levels = MaxCode(kBits);
  const Signs256 sg = MakeSigns256();
  Quant256 q;
  q.hi = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(lay.stream >> 32)));
  q.low16 = _mm256_set1_epi32(0xFFFF);
  q.step8 = _mm256_set1_epi32(static_cast<int>(8u * kGolden32));
  q.lmax = _mm256_set1_epi8(static_cast<char>(levels));
  q.lmin = _mm256_set1_epi8(static_cast<char>(-static_cast<int>(levels)));
  const __m256i inc = _mm256_set1_epi32(static_cast<int>(16u * kGolden32));
  for (size_t s = 0; s < len; s += g) {
    const size_t glen = std::min(g, len - s);
    if (glen % kBlock != 0) {
      QuantizeScalar(x + s, count > s ? count - s : 0, glen, first + s, transform, lay, scales,
                     codes, work);
      continue;
    }
    const float* y = x + s;
    __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
    if (transform || s + glen > count) {
      for (size_t b = 0; b < glen; b += kBlock) {
        __m256 r[4];
        LoadBlock256(x, s + b, count, r);
        if (transform) Fwht256(r, sg);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) _mm256_store_ps(work + b + 8 * k, r[k]);
        m0 = _mm256_max_epu32(m0, _mm256_max_epu32(AbsBits256(r[0]), AbsBits256(r[1])));
        m1 = _mm256_max_epu32(m1, _mm256_max_epu32(AbsBits256(r[2]), AbsBits256(r[3])));
      }
      y = work;
    } else {
      for (size_t k = 0; k < glen; k += 16) {
        m0 = _mm256_max_epu32(m0, AbsBits256(_mm256_loadu_ps(y + k)));
        m1 = _mm256_max_epu32(m1, AbsBits256(_mm256_loadu_ps(y + k + 8)));
      }
    }
    const GroupParams gp = ParamsFor(HorizontalMax256(_mm256_max_epu32(m0, m1)), levels);
    PutF32(scales + 4 * ((first + s) / g), gp.scale);
    if (gp.mode != Mode::kNormal) {
      QuantizeGroupScalar(y, glen, first + s, gp, kBits, lay.stream, codes);
      continue;
    }
    q.inv16 = _mm256_set1_ps(gp.inv16);
    // Whole 32-blocks: the first random number of the group is number (first + s) / 2.
    __m256i ctr = Counter256(lay.stream, (first + s) / 2);
    uint8_t* out = codes + CodeBytes(first + s, kBits);
    for (size_t k = 0; k < glen; k += kBlock) {
      __m256 r[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) r[j] = _mm256_loadu_ps(y + k + 8 * j);
      QuantBlock256<kBits>(r, ctr, q, out + CodeBytes(k, kBits));
      ctr = _mm256_add_epi32(ctr, inc);
    }
  }
}

// 32 codes of the block at element i -> 4 vectors of 8 values code * scale.
template <uint32_t kBits>
BP_TARGET_AVX2 BP_SDP_INLINE void DecodeBlock256(const uint8_t* codes, size_t i, __m256 scale,
                                                 __m256* r) {
  __m128i e0, e1;
  if constexpr (kBits == 4) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2));
    BP_SDP_UNPACK4(b, e0, e1);
  } else {
    e0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    e1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i + 16));
  }
  const __m128i parts[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
    r[k] = Opaque256(_mm256_mul_ps(c, scale));
  }
}

template <uint32_t kBits, bool kInverse, bool kAdd>
BP_TARGET_AVX2 void DequantizeAvx2T(const uint8_t* scales, const uint8_t* codes, size_t first,
                                    size_t len, size_t valid, const Layout& lay, float* out) {
  const size_t g = lay.group;
  const Signs256 sg = MakeSigns256();
  const __m256 inv32 = _mm256_set1_ps(kInv32);
  for (size_t s = 0; s < len && s < valid; s += g) {
    const size_t glen = std::min(g, len - s);
    if (glen % kBlock != 0) {
      DequantizeScalar(scales, codes, first + s, glen, valid - s, lay, kInverse, out + s, kAdd);
      continue;
    }
    const float sc = GetF32(scales + 4 * (first / g + s / g));
    const bool fold = kInverse && sc >= kFoldMin && sc <= kFoldMax;  // see kFoldMin
    const __m256 scale = _mm256_set1_ps(fold ? sc * kInv32 : sc);
    size_t b = 0;
    // Two whole blocks at a time (their independent chains interleave).
    for (; b + 2 * kBlock <= glen && s + b + 2 * kBlock <= valid; b += 2 * kBlock) {
      __m256 r[8];
      DecodeBlock256<kBits>(codes, first + s + b, scale, r);
      DecodeBlock256<kBits>(codes, first + s + b + kBlock, scale, r + 4);
      if constexpr (kInverse) {
        Fwht256(r, sg);
        Fwht256(r + 4, sg);
        if (!fold) {
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) r[k] = Opaque256(_mm256_mul_ps(r[k], inv32));
        }
      }
      float* o = out + s + b;
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        _mm256_storeu_ps(o + 8 * k, kAdd ? _mm256_add_ps(_mm256_loadu_ps(o + 8 * k), r[k]) : r[k]);
      }
    }
    for (; b < glen && s + b < valid; b += kBlock) {
      __m256 r[4];
      DecodeBlock256<kBits>(codes, first + s + b, scale, r);
      if constexpr (kInverse) {
        Fwht256(r, sg);
        if (!fold) {
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) r[k] = Opaque256(_mm256_mul_ps(r[k], inv32));
        }
      }
      float* o = out + s + b;
      if (s + b + kBlock <= valid) {
        if constexpr (kAdd) {
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            _mm256_storeu_ps(o + 8 * k, _mm256_add_ps(_mm256_loadu_ps(o + 8 * k), r[k]));
          }
        } else {
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) _mm256_storeu_ps(o + 8 * k, r[k]);
        }
      } else {
        alignas(32) float buf[kBlock];
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) _mm256_store_ps(buf + 8 * k, r[k]);
        StoreTail(buf, o, valid - (s + b), kAdd);
      }
    }
  }
}

template <uint32_t kBits, bool kInverse>
void DequantizeAvx2Dispatch(const uint8_t* scales, const uint8_t* codes, size_t first, size_t len,
                            size_t valid, const Layout& lay, float* out, bool add) {
  if (add)
    return DequantizeAvx2T<kBits, kInverse, true>(scales, codes, first, len, valid, lay, out);
  DequantizeAvx2T<kBits, kInverse, false>(scales, codes, first, len, valid, lay, out);
}

BP_TARGET_AVX2 void TransformAvx2(float* x, size_t m, bool inverse) {
  const Signs256 sg = MakeSigns256();
  const __m256 inv32 = _mm256_set1_ps(kInv32);
  for (size_t b = 0; b < m; b += kBlock) {
    __m256 r[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) r[k] = _mm256_loadu_ps(x + b + 8 * k);
    Fwht256(r, sg);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(x + b + 8 * k, inverse ? Opaque256(_mm256_mul_ps(r[k], inv32)) : r[k]);
    }
  }
}

// The server's sum of `count` quantised bodies over the whole groups of [first, first + len)
// (G a multiple of 32), times `scale` unless it is 1, stored to z: the products and additions
// of DequantizeGroups per body and ScaleInPlace, in one pass. Returns the elements handled.
template <uint32_t kBits>
BP_TARGET_AVX2 size_t SumGroupsAvx2T(const uint8_t* const* in_scales,
                                     const uint8_t* const* in_codes, size_t count, size_t first,
                                     size_t len, float scale, const Layout& lay, float* z) {
  const size_t g = lay.group;
  const size_t whole = len / g * g;
  const __m256 vs = _mm256_set1_ps(scale);
  for (size_t s = 0; s < whole; s += g) {
    const size_t e = first + s;
    for (size_t b = 0; b < g; b += kBlock) {
      __m256 acc[4];
      for (size_t w = 0; w < count; ++w) {
        const __m256 sc = _mm256_set1_ps(GetF32(in_scales[w] + 4 * (e / g)));
        __m256 r[4];
        DecodeBlock256<kBits>(in_codes[w], e + b, sc, r);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) acc[k] = w == 0 ? r[k] : _mm256_add_ps(acc[k], r[k]);
      }
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        if (scale != 1.0f) acc[k] = Opaque256(_mm256_mul_ps(acc[k], vs));
        _mm256_storeu_ps(z + s + b + 8 * k, acc[k]);
      }
    }
  }
  return whole;
}

// ---- AVX-512 -----------------------------------------------------------------------------------

BP_TARGET_AVX512 BP_SDP_INLINE __m512 Opaque512(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

BP_TARGET_AVX512 BP_SDP_INLINE __m512i Fmix512(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

struct Signs512 {
  __m512 s1, s2, s4, s8;
};

// +1 in the lanes whose element index has bit h clear, -1 where it is set.
BP_TARGET_AVX512 BP_SDP_INLINE Signs512 MakeSigns512() {
  const __m512 one = _mm512_set1_ps(1.0f), minus = _mm512_set1_ps(-1.0f);
  return {_mm512_mask_mov_ps(one, 0xAAAA, minus), _mm512_mask_mov_ps(one, 0xCCCC, minus),
          _mm512_mask_mov_ps(one, 0xF0F0, minus), _mm512_mask_mov_ps(one, 0xFF00, minus)};
}

// lo lanes: x + partner; hi lanes: partner - x. One rounding of an exact x * (+-1) + partner:
// the same value as the scalar a + b / a - b.
BP_TARGET_AVX512 BP_SDP_INLINE __m512 Butterfly512(__m512 x, __m512 partner, __m512 sign) {
  return _mm512_fmadd_ps(x, sign, partner);
}

BP_TARGET_AVX512 BP_SDP_INLINE __m512 InRegister512(__m512 x, const Signs512& s) {
  x = Butterfly512(x, _mm512_permute_ps(x, 0xB1), s.s1);
  x = Butterfly512(x, _mm512_permute_ps(x, 0x4E), s.s2);
  x = Butterfly512(x, _mm512_shuffle_f32x4(x, x, 0xB1), s.s4);
  x = Butterfly512(x, _mm512_shuffle_f32x4(x, x, 0x4E), s.s8);
  return x;
}

BP_TARGET_AVX512 BP_SDP_INLINE void Fwht512(__m512* a, __m512* b, const Signs512& s) {
  const __m512 x = InRegister512(*a, s);
  const __m512 y = InRegister512(*b, s);
  *a = _mm512_add_ps(x, y);
  *b = _mm512_sub_ps(x, y);
}

// Stage-major over kN blocks (a[k], c[k]), so that the independent chains interleave.
template <int kN>
BP_TARGET_AVX512 BP_SDP_INLINE void FwhtN512(__m512* a, __m512* c, const Signs512& s) {
#pragma GCC unroll 4
  for (int k = 0; k < kN; ++k) {
    a[k] = Butterfly512(a[k], _mm512_permute_ps(a[k], 0xB1), s.s1);
    c[k] = Butterfly512(c[k], _mm512_permute_ps(c[k], 0xB1), s.s1);
  }
#pragma GCC unroll 4
  for (int k = 0; k < kN; ++k) {
    a[k] = Butterfly512(a[k], _mm512_permute_ps(a[k], 0x4E), s.s2);
    c[k] = Butterfly512(c[k], _mm512_permute_ps(c[k], 0x4E), s.s2);
  }
#pragma GCC unroll 4
  for (int k = 0; k < kN; ++k) {
    a[k] = Butterfly512(a[k], _mm512_shuffle_f32x4(a[k], a[k], 0xB1), s.s4);
    c[k] = Butterfly512(c[k], _mm512_shuffle_f32x4(c[k], c[k], 0xB1), s.s4);
  }
#pragma GCC unroll 4
  for (int k = 0; k < kN; ++k) {
    a[k] = Butterfly512(a[k], _mm512_shuffle_f32x4(a[k], a[k], 0x4E), s.s8);
    c[k] = Butterfly512(c[k], _mm512_shuffle_f32x4(c[k], c[k], 0x4E), s.s8);
  }
#pragma GCC unroll 4
  for (int k = 0; k < kN; ++k) {
    const __m512 x = a[k], y = c[k];
    a[k] = _mm512_add_ps(x, y);
    c[k] = _mm512_sub_ps(x, y);
  }
}

struct Quant512 {
  __m512 inv16;
  __m512i hi;     // the stream's high word
  __m512i low16;  // 0xFFFF per lane
  __m512i nib;    // 0x0F per lane
  __m512i lmax;   // +L per int16
  __m512i lmin;   // -L per int16
  __m512i lmax8;  // +L per int8
  __m512i lmin8;  // -L per int8
  __m512i nib16;  // 0x000F per int16
};

// Codes of one 32-block (a: elements 0..15, c: 16..31) to out (16 bytes for 4 bits, 32 for 8);
// ctr: the counters of its 16 random numbers (number j serves elements j and 16 + j).
// The 32 rounded, unclamped codes of one 32-block (a: elements 0..15, c: 16..31) as int16;
// 128-bit lane k holds elements 4k..4k+3, then 16+4k..16+4k+3. ctr: the counters of its 16
// random numbers (number j serves elements j and 16 + j).
BP_TARGET_AVX512 BP_SDP_INLINE __m512i RoundBlock512(__m512 a, __m512 c, __m512i ctr,
                                                     const Quant512& q) {
  constexpr int kFloor = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
  const __m512i r = Fmix512(_mm512_xor_si512(ctr, q.hi));
  const __m512i fa = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, q.inv16), kFloor);
  const __m512i fc = _mm512_cvt_roundps_epi32(_mm512_mul_ps(c, q.inv16), kFloor);
  const __m512i ca = _mm512_srai_epi32(_mm512_add_epi32(fa, _mm512_and_si512(r, q.low16)), 16);
  const __m512i cc = _mm512_srai_epi32(_mm512_add_epi32(fc, _mm512_srli_epi32(r, 16)), 16);
  return _mm512_packs_epi32(ca, cc);
}

// Codes of one 32-block to out (16 bytes for 4 bits, 32 for 8).
template <uint32_t kBits>
BP_TARGET_AVX512 BP_SDP_INLINE void QuantBlock512(__m512 a, __m512 c, __m512i ctr,
                                                  const Quant512& q, uint8_t* out) {
  __m512i p = RoundBlock512(a, c, ctr, q);
  p = _mm512_max_epi16(_mm512_min_epi16(p, q.lmax), q.lmin);
  if constexpr (kBits == 4) {
    // The low byte of every dword (two codes, even element first): (even << 4) | (odd & 0xF).
    const __m512i t =
        _mm512_ternarylogic_epi32(_mm512_slli_epi32(p, 4), _mm512_srli_epi32(p, 16), q.nib, 0xF8);
    const __m128i b = _mm512_cvtepi32_epi8(t);
    const __m128i order = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(b, order));
  } else {
    const __m256i b = _mm512_cvtepi16_epi8(p);
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(b, order));
  }
}

// 4-bit codes of two consecutive 32-blocks (x: a0/c0, y: a1/c1) to out[0..32): both blocks'
// int16 codes narrowed to int8 together, clamped, paired into nibbles as words and narrowed
// again; the same bytes as two QuantBlock512<4> calls.
BP_TARGET_AVX512 BP_SDP_INLINE void QuantPair512(__m512 a0, __m512 c0, __m512 a1, __m512 c1,
                                                 __m512i ctr, __m512i inc, const Quant512& q,
                                                 uint8_t* out) {
  const __m512i p0 = RoundBlock512(a0, c0, ctr, q);
  const __m512i p1 = RoundBlock512(a1, c1, _mm512_add_epi32(ctr, inc), q);
  // Lane k: block 0's elements 4k..4k+3, 16+4k..16+4k+3, then block 1's (|code| <= L + 1: no
  // saturation).
  __m512i b = _mm512_packs_epi16(p0, p1);
  b = _mm512_max_epi8(_mm512_min_epi8(b, q.lmax8), q.lmin8);
  // Low byte of every word: (even << 4) | (odd & 0xF).
  const __m512i t =
      _mm512_ternarylogic_epi32(_mm512_slli_epi16(b, 4), _mm512_srli_epi16(b, 8), q.nib16, 0xF8);
  // Word w of 128-bit lane k is the byte of element pair: block w / 4, pair 2k + (w & 1) +
  // 8 * ((w >> 1) & 1); as 16-bit words of the 32 output bytes: dest word d <- source word
  // 4 (d % 4) + d / 4.
  const __m256i bytes = _mm512_cvtepi16_epi8(t);
  const __m256i order = _mm256_setr_epi16(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutexvar_epi16(order, bytes));
}

// The counters (idx * golden + low word) of idx = first .. first + 15.
BP_TARGET_AVX512 BP_SDP_INLINE __m512i Counter512(uint64_t stream, size_t first) {
  const __m512i idx =
      _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_epi32(static_cast<int>(first)));
  return _mm512_add_epi32(_mm512_mullo_epi32(idx, _mm512_set1_epi32(static_cast<int>(kGolden32))),
                          _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream))));
}

BP_TARGET_AVX512 BP_SDP_INLINE __m512i AbsBits512(__m512 v) {
  return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(static_cast<int>(kAbsMask)));
}

BP_TARGET_AVX512 BP_SDP_INLINE __mmask16 FirstLanes(size_t k) {
  return k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << k) - 1);
}

// Loads the 32-block at x[e..e+32) of an input with `count` values (zeros beyond).
BP_TARGET_AVX512 BP_SDP_INLINE void LoadBlock512(const float* x, size_t e, size_t count, __m512* a,
                                                 __m512* c) {
  if (e + kBlock <= count) {
    *a = _mm512_loadu_ps(x + e);
    *c = _mm512_loadu_ps(x + e + 16);
  } else if (e < count) {
    const size_t have = count - e;
    *a = _mm512_maskz_loadu_ps(FirstLanes(have), x + e);
    *c = have > 16 ? _mm512_maskz_loadu_ps(FirstLanes(have - 16), x + e + 16) : _mm512_setzero_ps();
  } else {
    *a = *c = _mm512_setzero_ps();
  }
}

BP_TARGET_AVX512 BP_SDP_INLINE Quant512 MakeQuant512(const Layout& lay, uint32_t levels) {
  Quant512 q;
  q.inv16 = _mm512_setzero_ps();
  q.hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(lay.stream >> 32)));
  q.low16 = _mm512_set1_epi32(0xFFFF);
  q.nib = _mm512_set1_epi32(0x0F);
  q.lmax = _mm512_set1_epi16(static_cast<int16_t>(levels));
  q.lmin = _mm512_set1_epi16(static_cast<int16_t>(-static_cast<int>(levels)));
  q.lmax8 = _mm512_set1_epi8(static_cast<char>(levels));
  q.lmin8 = _mm512_set1_epi8(static_cast<char>(-static_cast<int>(levels)));
  q.nib16 = _mm512_set1_epi16(0x000F);
  return q;
}

// Any G that is a multiple of 32 (the transformed group goes through `work`).
template <uint32_t kBits>
BP_TARGET_AVX512 void QuantizeAvx512T(const float* x, size_t count, size_t len, size_t first,
                                      bool transform, const Layout& lay, uint8_t* scales,
                                      uint8_t* codes, float* work) {
  const size_t g = lay.group;
  const uint32_t levels = MaxCode(kBits);
  const Signs512 sg = MakeSigns512();
  Quant512 q = MakeQuant512(lay, levels);
  const __m512i inc = _mm512_set1_epi32(static_cast<int>(16u * kGolden32));
  for (size_t s = 0; s < len; s += g) {
    const size_t glen = std::min(g, len - s);
    if (glen % kBlock != 0) {
      QuantizeScalar(x + s, count > s ? count - s : 0, glen, first + s, transform, lay, scales,
                     codes, work);
      continue;
    }
    const float* y = x + s;
    __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
    if (transform || s + glen > count) {
      for (size_t b = 0; b < glen; b += kBlock) {
        __m512 a, c;
        LoadBlock512(x, s + b, count, &a, &c);
        if (transform) Fwht512(&a, &c, sg);
        _mm512_store_ps(work + b, a);
        _mm512_store_ps(work + b + 16, c);
        m0 = _mm512_max_epu32(m0, AbsBits512(a));
        m1 = _mm512_max_epu32(m1, AbsBits512(c));
      }
      y = work;
    } else {
      for (size_t k = 0; k < glen; k += kBlock) {
        m0 = _mm512_max_epu32(m0, AbsBits512(_mm512_loadu_ps(y + k)));
        m1 = _mm512_max_epu32(m1, AbsBits512(_mm512_loadu_ps(y + k + 16)));
      }
    }
    const GroupParams gp = ParamsFor(_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1)), levels);
    PutF32(scales + 4 * ((first + s) / g), gp.scale);
    if (gp.mode != Mode::kNormal) {
      QuantizeGroupScalar(y, glen, first + s, gp, kBits, lay.stream, codes);
      continue;
    }
    q.inv16 = _mm512_set1_ps(gp.inv16);
    // Whole 32-blocks: the first random number of the group is number (first + s) / 2.
    __m512i ctr = Counter512(lay.stream, (first + s) / 2);
    uint8_t* out = codes + CodeBytes(first + s, kBits);
    for (size_t k = 0; k < glen; k += kBlock) {
      QuantBlock512<kBits>(_mm512_loadu_ps(y + k), _mm512_loadu_ps(y + k + 16), ctr, q,
                           out + CodeBytes(k, kBits));
      ctr = _mm512_add_epi32(ctr, inc);
    }
  }
}

// Loads (and transforms) the kNb blocks of the group at x[s..) into a / c; its absmax bits.
template <int kNb>
BP_TARGET_AVX512 BP_SDP_INLINE uint32_t LoadGroup512(const float* x, size_t s, size_t count,
                                                     bool transform, const Signs512& sg, __m512* a,
                                                     __m512* c) {
#pragma GCC unroll 4
  for (int b = 0; b < kNb; ++b) LoadBlock512(x, s + kBlock * b, count, &a[b], &c[b]);
  if (transform) FwhtN512<kNb>(a, c, sg);
  __m512i m = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int b = 0; b < kNb; ++b) {
    m = _mm512_max_epu32(m, _mm512_max_epu32(AbsBits512(a[b]), AbsBits512(c[b])));
  }
  return _mm512_reduce_max_epu32(m);
}

// Loads (and transforms) the group of a partition's input at x[s..) into registers.
template <int kNb>
struct InputGroups512 {
  const float* x;
  size_t count;
  bool transform;
  Signs512 sg;
  BP_TARGET_AVX512 BP_SDP_INLINE uint32_t operator()(size_t s, __m512* a, __m512* c) const {
    return LoadGroup512<kNb>(x, s, count, transform, sg, a, c);
  }
};

// G = 32 kNb <= 128, `whole` elements (a multiple of G) whose groups `load(s, a, c)` puts in
// registers (returning their absmax bits): a group's values stay in registers, and the next
// group is loaded before this one is quantised (the two chains overlap).
template <uint32_t kBits, int kNb, typename Load>
BP_TARGET_AVX512 BP_SDP_INLINE void QuantizeRegs512(const Load& load, size_t whole, size_t first,
                                                    const Layout& lay, uint8_t* scales,
                                                    uint8_t* codes, float* work) {
  constexpr size_t kGroup = kNb * kBlock;
  const uint32_t levels = MaxCode(kBits);
  Quant512 q = MakeQuant512(lay, levels);
  const __m512i inc = _mm512_set1_epi32(static_cast<int>(16u * kGolden32));
  uint8_t* scale_at = scales + 4 * (first / kGroup);  // first: a multiple of G
  const __m512i group_inc = _mm512_set1_epi32(static_cast<int>(kGroup / 2 * kGolden32));
  // The counters of the group's first 16 random numbers (number (first + s) / 2 onwards).
  __m512i group_ctr = Counter512(lay.stream, first / 2);
  __m512 a[kNb], c[kNb];
  uint32_t amax = whole > 0 ? load(0, a, c) : 0;
  for (size_t s = 0; s < whole;
       s += kGroup, scale_at += 4, group_ctr = _mm512_add_epi32(group_ctr, group_inc)) {
    const GroupParams gp = ParamsFor(amax, levels);
    PutF32(scale_at, gp.scale);
    __m512 na[kNb], nc[kNb];
    if (s + kGroup < whole) amax = load(s + kGroup, na, nc);
    if (gp.mode != Mode::kNormal) {
#pragma GCC unroll 4
      for (int k = 0; k < kNb; ++k) {
        _mm512_store_ps(work + kBlock * k, a[k]);
        _mm512_store_ps(work + kBlock * k + 16, c[k]);
      }
      QuantizeGroupScalar(work, kGroup, first + s, gp, kBits, lay.stream, codes);
    } else {
      q.inv16 = _mm512_set1_ps(gp.inv16);
      __m512i ctr = group_ctr;
      uint8_t* out = codes + CodeBytes(first + s, kBits);
      int k = 0;
      if constexpr (kBits == 4) {
#pragma GCC unroll 2
        for (; k + 1 < kNb; k += 2) {
          QuantPair512(a[k], c[k], a[k + 1], c[k + 1], ctr, inc, q, out + CodeBytes(kBlock * k, 4));
          ctr = _mm512_add_epi32(ctr, _mm512_add_epi32(inc, inc));
        }
      }
#pragma GCC unroll 4
      for (; k < kNb; ++k) {
        QuantBlock512<kBits>(a[k], c[k], ctr, q, out + CodeBytes(kBlock * k, kBits));
        ctr = _mm512_add_epi32(ctr, inc);
      }
    }
#pragma GCC unroll 4
    for (int k = 0; k < kNb; ++k) {
      a[k] = na[k];
      c[k] = nc[k];
    }
  }
}

template <uint32_t kBits, int kNb>
BP_TARGET_AVX512 void QuantizeAvx512Regs(const float* x, size_t count, size_t len, size_t first,
                                         bool transform, const Layout& lay, uint8_t* scales,
                                         uint8_t* codes, float* work) {
  constexpr size_t kGroup = kNb * kBlock;
  const size_t whole = len / kGroup * kGroup;
  const InputGroups512<kNb> load{x, count, transform, MakeSigns512()};
  QuantizeRegs512<kBits, kNb>(load, whole, first, lay, scales, codes, work);
  if (whole < len) {  // a shorter last group
    QuantizeAvx512T<kBits>(x + whole, count > whole ? count - whole : 0, len - whole, first + whole,
                           transform, lay, scales, codes, work);
  }
}

template <uint32_t kBits>
void QuantizeAvx512Dispatch(const float* x, size_t count, size_t len, size_t first, bool transform,
                            const Layout& lay, uint8_t* scales, uint8_t* codes, float* work) {
  switch (lay.group) {
    case 32:
      return QuantizeAvx512Regs<kBits, 1>(x, count, len, first, transform, lay, scales, codes,
                                          work);
    case 64:
      return QuantizeAvx512Regs<kBits, 2>(x, count, len, first, transform, lay, scales, codes,
                                          work);
    case 96:
      return QuantizeAvx512Regs<kBits, 3>(x, count, len, first, transform, lay, scales, codes,
                                          work);
    case 128:
      return QuantizeAvx512Regs<kBits, 4>(x, count, len, first, transform, lay, scales, codes,
                                          work);
    default: break;
  }
  QuantizeAvx512T<kBits>(x, count, len, first, transform, lay, scales, codes, work);
}

// The 32 codes of the block at element i, looked up (4 bits: lut[code & 15]) or converted and
// multiplied by scale (8 bits): a holds elements 0..15, c 16..31.
template <uint32_t kBits>
BP_TARGET_AVX512 BP_SDP_INLINE void DecodeBlock512(const uint8_t* codes, size_t i, __m512 lut,
                                                   __m512 scale, __m512* a, __m512* c) {
  if constexpr (kBits == 4) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2));
    const __m128i h = _mm_srli_epi16(b, 4);
    // Element 2j: the high nibble of byte j (bits 0..3 of h's byte j), element 2j + 1: its low
    // nibble; vpermps reads bits 0..3 of each index only.
    *a = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(h, b)), lut);
    *c = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(h, b)), lut);
  } else {
    const __m128i e0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    const __m128i e1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i + 16));
    *a = Opaque512(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e0)), scale));
    *c = Opaque512(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e1)), scale));
  }
}

// kN whole 32-blocks at element i (valid), written or added to o.
template <uint32_t kBits, bool kInverse, bool kAdd, int kN>
BP_TARGET_AVX512 BP_SDP_INLINE void DequantBlocks512(const uint8_t* codes, size_t i, __m512 lut,
                                                     __m512 scale, bool fold, const Signs512& sg,
                                                     float* o) {
  __m512 a[kN], c[kN];
#pragma GCC unroll 4
  for (int k = 0; k < kN; ++k)
    DecodeBlock512<kBits>(codes, i + kBlock * k, lut, scale, &a[k], &c[k]);
  if constexpr (kInverse) {
    FwhtN512<kN>(a, c, sg);
    if (!fold) {
      const __m512 inv32 = _mm512_set1_ps(kInv32);
#pragma GCC unroll 4
      for (int k = 0; k < kN; ++k) {
        a[k] = Opaque512(_mm512_mul_ps(a[k], inv32));
        c[k] = Opaque512(_mm512_mul_ps(c[k], inv32));
      }
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < kN; ++k) {
    float* p = o + kBlock * k;
    if constexpr (kAdd) {
      a[k] = _mm512_add_ps(_mm512_loadu_ps(p), a[k]);
      c[k] = _mm512_add_ps(_mm512_loadu_ps(p + 16), c[k]);
    }
    _mm512_storeu_ps(p, a[k]);
    _mm512_storeu_ps(p + 16, c[k]);
  }
}

template <uint32_t kBits, bool kInverse, bool kAdd>
BP_TARGET_AVX512 void DequantizeAvx512T(const uint8_t* scales, const uint8_t* codes, size_t first,
                                        size_t len, size_t valid, const Layout& lay, float* out) {
  const size_t g = lay.group;
  const Signs512 sg = MakeSigns512();
  // The 4-bit codes by nibble: 0..7, then -8..-1.
  const __m512 code_values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
  const uint8_t* scale_at = scales + 4 * (first / g);  // first: a multiple of G
  for (size_t s = 0; s < len && s < valid; s += g, scale_at += 4) {
    const size_t glen = std::min(g, len - s);
    if (glen % kBlock != 0) {
      DequantizeScalar(scales, codes, first + s, glen, valid - s, lay, kInverse, out + s, kAdd);
      continue;
    }
    const float sc = GetF32(scale_at);
    const bool fold = kInverse && sc >= kFoldMin && sc <= kFoldMax;  // see kFoldMin
    const __m512 scale = _mm512_set1_ps(fold ? sc * kInv32 : sc);
    // fp32(code) * scale of each nibble: the products of the definition.
    const __m512 lut = Opaque512(_mm512_mul_ps(code_values, scale));
    // Whole blocks: four, two, then one at a time.
    const size_t whole = std::min(glen, valid - s) / kBlock * kBlock;
    size_t b = 0;
    for (; b + 4 * kBlock <= whole; b += 4 * kBlock) {
      DequantBlocks512<kBits, kInverse, kAdd, 4>(codes, first + s + b, lut, scale, fold, sg,
                                                 out + s + b);
    }
    for (; b + kBlock <= whole; b += kBlock) {
      DequantBlocks512<kBits, kInverse, kAdd, 1>(codes, first + s + b, lut, scale, fold, sg,
                                                 out + s + b);
    }
    if (b < glen && s + b < valid) {  // the last block, partly valid
      __m512 lo, hi;
      DecodeBlock512<kBits>(codes, first + s + b, lut, scale, &lo, &hi);
      if constexpr (kInverse) {
        Fwht512(&lo, &hi, sg);
        if (!fold) {
          lo = Opaque512(_mm512_mul_ps(lo, _mm512_set1_ps(kInv32)));
          hi = Opaque512(_mm512_mul_ps(hi, _mm512_set1_ps(kInv32)));
        }
      }
      alignas(64) float buf[kBlock];
      _mm512_store_ps(buf, lo);
      _mm512_store_ps(buf + 16, hi);
      StoreTail(buf, out + s + b, valid - (s + b), kAdd);
    }
  }
}

// Sums the group at element first + s of `count` quantised bodies (body 0, + body 1, ...: the
// order of DequantizeGroups then DequantizeGroups(add) per body), times `scale` unless it is 1
// (ScaleInPlace's product), into registers; no inverse transform (the Hadamard domain).
template <uint32_t kBits, int kNb>
struct SummedGroups512 {
  const uint8_t* const* scales;
  const uint8_t* const* codes;
  size_t count;
  size_t first;
  float scale;
  BP_TARGET_AVX512 BP_SDP_INLINE uint32_t operator()(size_t s, __m512* a, __m512* c) const {
    constexpr size_t kGroup = kNb * kBlock;
    const __m512 code_values =
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    const size_t e = first + s;
    for (size_t w = 0; w < count; ++w) {
      const __m512 sc = _mm512_set1_ps(GetF32(scales[w] + 4 * (e / kGroup)));
      const __m512 lut = Opaque512(_mm512_mul_ps(code_values, sc));
#pragma GCC unroll 4
      for (int k = 0; k < kNb; ++k) {
        __m512 x, y;
        DecodeBlock512<kBits>(codes[w], e + kBlock * k, lut, sc, &x, &y);
        a[k] = w == 0 ? x : _mm512_add_ps(a[k], x);
        c[k] = w == 0 ? y : _mm512_add_ps(c[k], y);
      }
    }
    __m512i m = _mm512_setzero_si512();
    const __m512 vs = _mm512_set1_ps(scale);
#pragma GCC unroll 4
    for (int k = 0; k < kNb; ++k) {
      if (scale != 1.0f) {
        a[k] = Opaque512(_mm512_mul_ps(a[k], vs));
        c[k] = Opaque512(_mm512_mul_ps(c[k], vs));
      }
      m = _mm512_max_epu32(m, _mm512_max_epu32(AbsBits512(a[k]), AbsBits512(c[k])));
    }
    return _mm512_reduce_max_epu32(m);
  }
};

template <uint32_t kBits, int kNb>
BP_TARGET_AVX512 size_t SumGroupsAvx512T(const uint8_t* const* in_scales,
                                         const uint8_t* const* in_codes, size_t count, size_t first,
                                         size_t len, float scale, const Layout& lay,
                                         bool requantize, uint8_t* scales, uint8_t* codes,
                                         float* work, float* out) {
  constexpr size_t kGroup = kNb * kBlock;
  const size_t whole = len / kGroup * kGroup;
  const SummedGroups512<kBits, kNb> load{in_scales, in_codes, count, first, scale};
  if (requantize) {
    QuantizeRegs512<kBits, kNb>(load, whole, first, lay, scales, codes, work);
    return whole;
  }
  for (size_t s = 0; s < whole; s += kGroup) {
    __m512 a[kNb], c[kNb];
    load(s, a, c);
#pragma GCC unroll 4
    for (int k = 0; k < kNb; ++k) {
      _mm512_storeu_ps(out + s + kBlock * k, a[k]);
      _mm512_storeu_ps(out + s + kBlock * k + 16, c[k]);
    }
  }
  return whole;
}

// G = 32, 64, 96 or 128 (kNb = G / 32 blocks); 0 for any other G.
template <uint32_t kBits>
size_t SumGroupsAvx512(const uint8_t* const* in_scales, const uint8_t* const* in_codes,
                       size_t count, size_t first, size_t len, float scale, const Layout& lay,
                       bool requantize, uint8_t* scales, uint8_t* codes, float* work, float* out) {
  using Kernel = size_t (*)(const uint8_t* const*, const uint8_t* const*, size_t, size_t, size_t,
                            float, const Layout&, bool, uint8_t*, uint8_t*, float*, float*);
  static constexpr Kernel kByBlocks[] = {&SumGroupsAvx512T<kBits, 1>, &SumGroupsAvx512T<kBits, 2>,
                                         &SumGroupsAvx512T<kBits, 3>, &SumGroupsAvx512T<kBits, 4>};
  const size_t blocks = lay.group / kBlock;
  if (lay.group % kBlock != 0 || blocks == 0 || blocks > 4) return 0;
  return kByBlocks[blocks - 1](in_scales, in_codes, count, first, len, scale, lay, requantize,
                               scales, codes, work, out);
}

BP_TARGET_AVX512 void TransformAvx512(float* x, size_t m, bool inverse) {
  const Signs512 sg = MakeSigns512();
  const __m512 inv32 = _mm512_set1_ps(kInv32);
  for (size_t b = 0; b < m; b += kBlock) {
    __m512 lo = _mm512_loadu_ps(x + b), hi = _mm512_loadu_ps(x + b + 16);
    Fwht512(&lo, &hi, sg);
    if (inverse) {
      lo = Opaque512(_mm512_mul_ps(lo, inv32));
      hi = Opaque512(_mm512_mul_ps(hi, inv32));
    }
    _mm512_storeu_ps(x + b, lo);
    _mm512_storeu_ps(x + b + 16, hi);
  }
}

template <uint32_t kBits, bool kInverse>
void DequantizeAvx512Dispatch(const uint8_t* scales, const uint8_t* codes, size_t first, size_t len,
                              size_t valid, const Layout& lay, float* out, bool add) {
  if (add)
    return DequantizeAvx512T<kBits, kInverse, true>(scales, codes, first, len, valid, lay, out);
  DequantizeAvx512T<kBits, kInverse, false>(scales, codes, first, len, valid, lay, out);
}

}  // namespace

void TransformBlocks(float* x, size_t m, bool inverse, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return TransformAvx512(x, m, inverse);
    case IsaLevel::kAvx2: return TransformAvx2(x, m, inverse);
    case IsaLevel::kScalar: break;
  }
  TransformScalar(x, m, inverse);
}

void QuantizeGroups(const float* x, size_t count, size_t len, size_t first, bool transform,
                    const Layout& lay, uint8_t* scales, uint8_t* codes, float* work, IsaLevel isa) {
  if (len == 0) return;
  if (lay.group % kBlock != 0) isa = IsaLevel::kScalar;  // vector kernels: whole 32-blocks
  const bool four = lay.bits == 4;
  switch (isa) {
    case IsaLevel::kAvx512:
      return four ? QuantizeAvx512Dispatch<4>(x, count, len, first, transform, lay, scales, codes,
                                              work)
                  : QuantizeAvx512Dispatch<8>(x, count, len, first, transform, lay, scales, codes,
                                              work);
    case IsaLevel::kAvx2:
      return four ? QuantizeAvx2T<4>(x, count, len, first, transform, lay, scales, codes, work)
                  : QuantizeAvx2T<8>(x, count, len, first, transform, lay, scales, codes, work);
    case IsaLevel::kScalar: break;
  }
  QuantizeScalar(x, count, len, first, transform, lay, scales, codes, work);
}

void DequantizeGroups(const uint8_t* scales, const uint8_t* codes, size_t first, size_t len,
                      size_t valid, const Layout& lay, bool inverse, float* out, bool add,
                      IsaLevel isa) {
  valid = std::min(valid, len);
  if (valid == 0) return;
  if (lay.group % kBlock != 0) isa = IsaLevel::kScalar;
  const bool four = lay.bits == 4;
  switch (isa) {
    case IsaLevel::kAvx512:
      if (inverse) {
        return four ? DequantizeAvx512Dispatch<4, true>(scales, codes, first, len, valid, lay, out,
                                                        add)
                    : DequantizeAvx512Dispatch<8, true>(scales, codes, first, len, valid, lay, out,
                                                        add);
      }
      return four ? DequantizeAvx512Dispatch<4, false>(scales, codes, first, len, valid, lay, out,
                                                       add)
                  : DequantizeAvx512Dispatch<8, false>(scales, codes, first, len, valid, lay, out,
                                                       add);
    case IsaLevel::kAvx2:
      if (inverse) {
        return four ? DequantizeAvx2Dispatch<4, true>(scales, codes, first, len, valid, lay, out,
                                                      add)
                    : DequantizeAvx2Dispatch<8, true>(scales, codes, first, len, valid, lay, out,
                                                      add);
      }
      return four
                 ? DequantizeAvx2Dispatch<4, false>(scales, codes, first, len, valid, lay, out, add)
                 : DequantizeAvx2Dispatch<8, false>(scales, codes, first, len, valid, lay, out,
                                                    add);
    case IsaLevel::kScalar: break;
  }
  DequantizeScalar(scales, codes, first, len, valid, lay, inverse, out, add);
}

size_t SumGroups(const uint8_t* const* in_scales, const uint8_t* const* in_codes, size_t count,
                 size_t first, size_t len, float scale, const Layout& lay, bool requantize,
                 uint8_t* scales, uint8_t* codes, float* work, float* z, IsaLevel isa) {
  if (count == 0 || lay.group % kBlock != 0) return 0;
  const bool four = lay.bits == 4;
  if (isa == IsaLevel::kAvx512) {
    return four ? SumGroupsAvx512<4>(in_scales, in_codes, count, first, len, scale, lay, requantize,
                                     scales, codes, work, z)
                : SumGroupsAvx512<8>(in_scales, in_codes, count, first, len, scale, lay, requantize,
                                     scales, codes, work, z);
  }
  if (isa != IsaLevel::kAvx2) return 0;
  // AVX2: the sum in one pass, then the quantiser's pass.
  const size_t done =
      four ? SumGroupsAvx2T<4>(in_scales, in_codes, count, first, len, scale, lay, z)
           : SumGroupsAvx2T<8>(in_scales, in_codes, count, first, len, scale, lay, z);
  if (requantize && done > 0)
    QuantizeGroups(z, done, done, first, false, lay, scales, codes, work, isa);
  return done;
}

void ScaleInPlace(float* x, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] * s;
}

size_t FindOutOfRangeCode(const uint8_t* codes, size_t bytes, uint32_t bits) {
  // A lane (nibble or byte) equal to the pattern is the forbidden code; t = w ^ pattern has a
  // zero lane exactly there, found with the borrow trick (exact as "is there any").
  const uint64_t high = bits == 4 ? 0x8888888888888888ull : 0x8080808080808080ull;
  const uint64_t ones = bits == 4 ? 0x1111111111111111ull : 0x0101010101010101ull;
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    uint64_t hit = 0;
    for (size_t k = 0; k < 32; k += 8) {
      uint64_t w;
      std::memcpy(&w, codes + i + k, sizeof w);
      const uint64_t t = w ^ high;
      hit |= (t - ones) & ~t & high;
    }
    if (hit != 0) break;
  }
  for (; i < bytes; ++i) {
    const uint8_t b = codes[i];
    const bool bad = bits == 4 ? ((b & 0xF) == 0x8 || (b >> 4) == 0x8) : b == 0x80;
    if (bad) return i;
  }
  return bytes;
}

}  // namespace bitpush::compressors::sdp4bit
