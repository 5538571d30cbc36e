#include "compressors/sdp4bit/sdp4bit_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/counter_rng.h"

namespace bitpush::compressors::sdp4bit {
namespace {

#define BP_SDP_INLINE __attribute__((always_inline)) inline

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr float kTwoM24 = 0x1p-24f;
constexpr float kInv32 = 0.03125f;
// A tiny absmax (L / absmax overflows fp32) is scaled up by this power of two first (exact).
constexpr float kPrescale = 0x1p64f;

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
inline void StoreF32(uint8_t* p, float v) {
  std::memcpy(p, &v, sizeof v);
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// An optimisation barrier: the compiler cannot fuse a product passed through it into a later
// addition (-ffp-contract=fast would do so only where FMA is enabled, i.e. on the SIMD levels,
// and this code may be inlined there).
inline float Opaque(float v) {
  __asm__("" : "+x"(v));
  return v;
}

// ---- group parameters (shared by every level) -----------------------------------------------

enum class Mode : uint8_t {
  kNormal,     // v = y * inv
  kZero,       // stored scale 1, codes 0 (all-zero group, or absmax / L underflows to 0)
  kNonFinite,  // stored scale NaN, codes 0
  kTiny,       // v = (y * 2^64) * inv, inv = L / (absmax * 2^64)
};

struct GroupParams {
  Mode mode;
  float scale;  // stored
  float inv;
};

GroupParams ParamsFor(uint32_t amax_bits, uint32_t levels) {
  if (amax_bits >= kInfBits) {
    return {Mode::kNonFinite, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  }
  if (amax_bits == 0) return {Mode::kZero, 1.0f, 0.0f};
  const float amax = BitsFloat(amax_bits);
  const float l = static_cast<float>(levels);
  const float scale = amax / l;
  if (scale == 0.0f) return {Mode::kZero, 1.0f, 0.0f};
  const float inv = l / amax;
  if (FloatBits(inv) >= kInfBits) return {Mode::kTiny, scale, l / (amax * kPrescale)};
  return {Mode::kNormal, scale, inv};
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

// v finite with |v| <= L (1 + 2^-23): floor(v) + Bernoulli(frac), clamped to [-L, L].
BP_SDP_INLINE int32_t CodeOf(float v, uint32_t r, int32_t levels) {
  float lo = static_cast<float>(static_cast<int32_t>(v));  // truncation
  if (lo > v) lo -= 1.0f;                                  // floor
  const float p = v - lo;
  const float u = static_cast<float>(r >> 8) * kTwoM24;
  const int32_t c = static_cast<int32_t>(lo) + (u < p ? 1 : 0);
  return std::clamp(c, -levels, levels);
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
    const float v = Opaque(yk * gp.inv);
    return CodeOf(v, CounterRandom32(stream, static_cast<uint32_t>(first + k)), levels);
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
    StoreF32(scales + 4 * ((first + s) / g), gp.scale);
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
    const float scale = LoadF32(scales + 4 * ((first + s) / g));
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
    const __m128i lo_ = _mm_shuffle_epi8(lut_, _mm_and_si128(b, nib_));                         \
    const __m128i hi_ = _mm_shuffle_epi8(lut_, _mm_and_si128(_mm_srli_epi16(b, 4), nib_));      \
    e0 = _mm_unpacklo_epi8(hi_, lo_);                                                           \
    e1 = _mm_unpackhi_epi8(hi_, lo_);                                                           \
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
  __m256 inv;
  __m256i hi;
  __m256i lmax;
  __m256i lmin;
};

BP_TARGET_AVX2 BP_SDP_INLINE __m256i Codes256(__m256 y, __m256i ctr, const Quant256& q) {
  const __m256 v = Opaque256(_mm256_mul_ps(y, q.inv));
  const __m256 lo = _mm256_floor_ps(v);
  const __m256 p = _mm256_sub_ps(v, lo);
  const __m256i r = Fmix256(_mm256_xor_si256(Fmix256(ctr), q.hi));
  const __m256 u =
      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(kTwoM24));
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(u, p, _CMP_LT_OQ));
  const __m256i c = _mm256_sub_epi32(_mm256_cvttps_epi32(lo), up);  // up = -1 where rounding up
  return _mm256_max_epi32(_mm256_min_epi32(c, q.lmax), q.lmin);
}

// 32 int32 codes (4 vectors) -> 32 int8 in element order.
BP_TARGET_AVX2 BP_SDP_INLINE __m256i Narrow256(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i w01 = _mm256_packs_epi32(c0, c1);
  const __m256i w23 = _mm256_packs_epi32(c2, c3);
  const __m256i b = _mm256_packs_epi16(w01, w23);
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 32 int8 codes in element order -> 16 bytes, element 2i in the high nibble.
BP_TARGET_AVX2 BP_SDP_INLINE __m128i Pack4From8_256(__m256i b) {
  const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(b, 4), _mm256_set1_epi16(0x00F0));
  const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(b, 8), _mm256_set1_epi16(0x000F));
  const __m256i w = _mm256_or_si256(hi, lo);
  return _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

BP_TARGET_AVX2 BP_SDP_INLINE __m256i Counter256(uint64_t stream, size_t first) {
  const __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                       _mm256_set1_epi32(static_cast<int>(first)));
  return _mm256_add_epi32(_mm256_mullo_epi32(idx, _mm256_set1_epi32(static_cast<int>(kGolden32))),
                          _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream))));
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
  q.lmax = _mm256_set1_epi32(static_cast<int>(levels));
  q.lmin = _mm256_set1_epi32(-static_cast<int>(levels));
  const __m256i inc = _mm256_set1_epi32(static_cast<int>(8u * kGolden32));
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
    StoreF32(scales + 4 * ((first + s) / g), gp.scale);
    if (gp.mode != Mode::kNormal) {
      QuantizeGroupScalar(y, glen, first + s, gp, kBits, lay.stream, codes);
      continue;
    }
    q.inv = _mm256_set1_ps(gp.inv);
    __m256i ctr = Counter256(lay.stream, first + s);
    uint8_t* out = codes + CodeBytes(first + s, kBits);
    for (size_t k = 0; k < glen; k += kBlock) {
      __m256i c[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        c[j] = Codes256(_mm256_loadu_ps(y + k + 8 * j), ctr, q);
        ctr = _mm256_add_epi32(ctr, inc);
      }
      const __m256i b = Narrow256(c[0], c[1], c[2], c[3]);
      if constexpr (kBits == 4) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k / 2), Pack4From8_256(b));
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), b);
      }
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

template <uint32_t kBits, bool kInverse>
BP_TARGET_AVX2 void DequantizeAvx2T(const uint8_t* scales, const uint8_t* codes, size_t first,
                                    size_t len, size_t valid, const Layout& lay, float* out,
                                    bool add) {
  const size_t g = lay.group;
  const Signs256 sg = MakeSigns256();
  const __m256 inv32 = _mm256_set1_ps(kInv32);
  for (size_t s = 0; s < len && s < valid; s += g) {
    const size_t glen = std::min(g, len - s);
    if (glen % kBlock != 0) {
      DequantizeScalar(scales, codes, first + s, glen, valid - s, lay, kInverse, out + s, add);
      continue;
    }
    const __m256 scale = _mm256_set1_ps(LoadF32(scales + 4 * ((first + s) / g)));
    for (size_t b = 0; b < glen && s + b < valid; b += kBlock) {
      __m256 r[4];
      DecodeBlock256<kBits>(codes, first + s + b, scale, r);
      if constexpr (kInverse) {
        Fwht256(r, sg);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) r[k] = Opaque256(_mm256_mul_ps(r[k], inv32));
      }
      float* o = out + s + b;
      if (s + b + kBlock <= valid) {
        if (add) {
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
        StoreTail(buf, o, valid - (s + b), add);
      }
    }
  }
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

struct Quant512 {
  __m512 inv;
  __m512i hi;
  __m512i lmax;
  __m512i lmin;
};

BP_TARGET_AVX512 BP_SDP_INLINE __m512i Codes512(__m512 y, __m512i ctr, const Quant512& q) {
  const __m512 v = Opaque512(_mm512_mul_ps(y, q.inv));
  const __m512 lo = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 p = _mm512_sub_ps(v, lo);
  const __m512i r = Fmix512(_mm512_xor_si512(Fmix512(ctr), q.hi));
  const __m512 u =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 8)), _mm512_set1_ps(kTwoM24));
  const __mmask16 up = _mm512_cmp_ps_mask(u, p, _CMP_LT_OQ);
  __m512i c = _mm512_cvttps_epi32(lo);
  c = _mm512_mask_add_epi32(c, up, c, _mm512_set1_epi32(1));
  return _mm512_max_epi32(_mm512_min_epi32(c, q.lmax), q.lmin);
}

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

template <uint32_t kBits>
BP_TARGET_AVX512 void QuantizeAvx512T(const float* x, size_t count, size_t len, size_t first,
                                      bool transform, const Layout& lay, uint8_t* scales,
                                      uint8_t* codes, float* work) {
  const size_t g = lay.group;
  const uint32_t levels = MaxCode(kBits);
  const Signs512 sg = MakeSigns512();
  Quant512 q;
  q.hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(lay.stream >> 32)));
  q.lmax = _mm512_set1_epi32(static_cast<int>(levels));
  q.lmin = _mm512_set1_epi32(-static_cast<int>(levels));
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
        const size_t e = s + b;
        __m512 a, c;
        if (e + kBlock <= count) {
          a = _mm512_loadu_ps(x + e);
          c = _mm512_loadu_ps(x + e + 16);
        } else if (e < count) {
          const size_t have = count - e;
          a = _mm512_maskz_loadu_ps(FirstLanes(have), x + e);
          c = have > 16 ? _mm512_maskz_loadu_ps(FirstLanes(have - 16), x + e + 16)
                        : _mm512_setzero_ps();
        } else {
          a = c = _mm512_setzero_ps();
        }
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
    StoreF32(scales + 4 * ((first + s) / g), gp.scale);
    if (gp.mode != Mode::kNormal) {
      QuantizeGroupScalar(y, glen, first + s, gp, kBits, lay.stream, codes);
      continue;
    }
    q.inv = _mm512_set1_ps(gp.inv);
    __m512i ctr = Counter512(lay.stream, first + s);
    uint8_t* out = codes + CodeBytes(first + s, kBits);
    for (size_t k = 0; k < glen; k += kBlock) {
      const __m512i c0 = Codes512(_mm512_loadu_ps(y + k), ctr, q);
      ctr = _mm512_add_epi32(ctr, inc);
      const __m512i c1 = Codes512(_mm512_loadu_ps(y + k + 16), ctr, q);
      ctr = _mm512_add_epi32(ctr, inc);
      const __m128i b0 = _mm512_cvtepi32_epi8(c0);
      const __m128i b1 = _mm512_cvtepi32_epi8(c1);
      if constexpr (kBits == 4) {
        const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(b0), b1, 1);
        const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(b, 4), _mm256_set1_epi16(0x00F0));
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(b, 8), _mm256_set1_epi16(0x000F));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k / 2),
                         _mm256_cvtepi16_epi8(_mm256_or_si256(hi, lo)));
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), b0);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 16), b1);
      }
    }
  }
}

template <uint32_t kBits>
BP_TARGET_AVX512 BP_SDP_INLINE void DecodeBlock512(const uint8_t* codes, size_t i, __m512 scale,
                                                   __m512* a, __m512* b) {
  __m128i e0, e1;
  if constexpr (kBits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2));
    BP_SDP_UNPACK4(v, e0, e1);
  } else {
    e0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    e1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i + 16));
  }
  *a = Opaque512(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e0)), scale));
  *b = Opaque512(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e1)), scale));
}

template <uint32_t kBits, bool kInverse, bool kAdd>
BP_TARGET_AVX512 void DequantizeAvx512T(const uint8_t* scales, const uint8_t* codes, size_t first,
                                        size_t len, size_t valid, const Layout& lay, float* out) {
  const size_t g = lay.group;
  const Signs512 sg = MakeSigns512();
  const __m512 inv32 = _mm512_set1_ps(kInv32);
  for (size_t s = 0; s < len && s < valid; s += g) {
    const size_t glen = std::min(g, len - s);
    if (glen % kBlock != 0) {
      DequantizeScalar(scales, codes, first + s, glen, valid - s, lay, kInverse, out + s, kAdd);
      continue;
    }
    const __m512 scale = _mm512_set1_ps(LoadF32(scales + 4 * ((first + s) / g)));
    for (size_t b = 0; b < glen && s + b < valid; b += kBlock) {
      __m512 lo, hi;
      DecodeBlock512<kBits>(codes, first + s + b, scale, &lo, &hi);
      if constexpr (kInverse) {
        Fwht512(&lo, &hi, sg);
        lo = Opaque512(_mm512_mul_ps(lo, inv32));
        hi = Opaque512(_mm512_mul_ps(hi, inv32));
      }
      float* o = out + s + b;
      const size_t rem = valid - (s + b);
      if (rem >= kBlock) {
        if constexpr (kAdd) {
          lo = _mm512_add_ps(_mm512_loadu_ps(o), lo);
          hi = _mm512_add_ps(_mm512_loadu_ps(o + 16), hi);
        }
        _mm512_storeu_ps(o, lo);
        _mm512_storeu_ps(o + 16, hi);
      } else {
        alignas(64) float buf[kBlock];
        _mm512_store_ps(buf, lo);
        _mm512_store_ps(buf + 16, hi);
        StoreTail(buf, o, rem, kAdd);
      }
    }
  }
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
      return four ? QuantizeAvx512T<4>(x, count, len, first, transform, lay, scales, codes, work)
                  : QuantizeAvx512T<8>(x, count, len, first, transform, lay, scales, codes, work);
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
        return four ? DequantizeAvx2T<4, true>(scales, codes, first, len, valid, lay, out, add)
                    : DequantizeAvx2T<8, true>(scales, codes, first, len, valid, lay, out, add);
      }
      return four ? DequantizeAvx2T<4, false>(scales, codes, first, len, valid, lay, out, add)
                  : DequantizeAvx2T<8, false>(scales, codes, first, len, valid, lay, out, add);
    case IsaLevel::kScalar: break;
  }
  DequantizeScalar(scales, codes, first, len, valid, lay, inverse, out, add);
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
