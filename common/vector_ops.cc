#include "common/vector_ops.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "common/half.h"

namespace bitpush {
namespace {

// ---- scalar -------------------------------------------------------------------------------
// Element access goes through memcpy: payload bodies arrive at any alignment (inside network
// frames), and a typed load from a misaligned address is undefined behaviour. Compilers turn
// these into plain moves.

template <typename T>
inline T Ld(const T* p, size_t i) {
  T v;
  std::memcpy(&v, p + i, sizeof(T));
  return v;
}
template <typename T>
inline void St(T* p, size_t i, T v) {
  std::memcpy(p + i, &v, sizeof(T));
}

// The narrowing casts' check: a value stores finite iff |x| < the limit (an unordered compare,
// so NaN fails it). fp16: 65520 and above round to inf; bf16: bit patterns from 0x7F7F8000 up
// round to inf.
constexpr float kHalfInfFrom = 65520.0f;
constexpr uint32_t kBf16InfFromBits = 0x7F7F8000u;
inline float Bf16InfFrom() {
  float f;
  std::memcpy(&f, &kBf16InfFromBits, 4);
  return f;
}

void HalfToFloatScalar(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) St(d, i, HalfToFloat(Ld(s, i)));
}
bool FloatToHalfScalar(const float* s, uint16_t* d, size_t n) {
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float x = Ld(s, i);
    St(d, i, FloatToHalf(x));
    finite &= std::fabs(x) < kHalfInfFrom;
  }
  return finite;
}
void Bf16ToFloatScalar(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) St(d, i, Bf16ToFloat(Ld(s, i)));
}
bool FloatToBf16Scalar(const float* s, uint16_t* d, size_t n) {
  const float limit = Bf16InfFrom();
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float x = Ld(s, i);
    St(d, i, FloatToBf16(x));
    finite &= std::fabs(x) < limit;
  }
  return finite;
}
void AddHalfScalar(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) St(d, i, Ld(d, i) + HalfToFloat(Ld(s, i)));
}
void AddBf16Scalar(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) St(d, i, Ld(d, i) + Bf16ToFloat(Ld(s, i)));
}
void AddFloatScalar(const float* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) St(d, i, Ld(d, i) + Ld(s, i));
}
void AddScaleFloatScalar(const float* s, float* d, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) {
    const float sum = Ld(d, i) + Ld(s, i);  // rounded before the multiply
    St(d, i, sum * scale);
  }
}

void ScaleFloatScalar(float* d, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) St(d, i, Ld(d, i) * scale);
}

// The first element at or after `i` whose exponent bits are all ones (inf or NaN), else n.
size_t FirstNonFiniteF32Scalar(const float* x, size_t i, size_t n) {
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    if ((bits & 0x7F800000u) == 0x7F800000u) return i;
  }
  return n;
}

size_t FirstNonFinite16Scalar(const uint16_t* x, size_t n, uint16_t exponent) {
  for (size_t i = 0; i < n; ++i) {
    if ((x[i] & exponent) == exponent) return i;
  }
  return n;
}

size_t FirstNonFiniteScalar(const float* x, size_t n) {
  return FirstNonFiniteF32Scalar(x, 0, n);
}

bool CastWithResidualScalar(const float* g, float* e, TensorView out) {
  const size_t n = out.count();
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float q = g ? g[i] + e[i] : e[i];
    float back = q;
    switch (out.dtype()) {
      case DType::kFloat32: St(out.f32(), i, q); break;
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(q);
        St(out.u16(), i, h);
        back = HalfToFloat(h);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t b = FloatToBf16(q);
        St(out.u16(), i, b);
        back = Bf16ToFloat(b);
        break;
      }
    }
    const float r = q - back;
    const bool ok = r - r == 0.0f;  // r - r is NaN exactly when r is NaN or inf
    e[i] = ok ? r : 0.0f;
    finite &= ok;
  }
  return finite;
}

// ---- AVX2 + F16C --------------------------------------------------------------------------

BP_TARGET_AVX2 __m256i FloatToBf16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);  // 8 x u32 holding u16 values
}

BP_TARGET_AVX2 void HalfToFloatAvx2(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  HalfToFloatScalar(s + i, d + i, n - i);
}
// The lanes of v that do not store finite: !(|v| < limit), true for NaN.
BP_TARGET_AVX2 inline __m256 NotBelowAvx2(__m256 v, __m256 limit) {
  const __m256 abs = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  return _mm256_cmp_ps(abs, limit, _CMP_NLT_UQ);
}
BP_TARGET_AVX2 bool FloatToHalfAvx2(const float* s, uint16_t* d, size_t n) {
  const __m256 limit = _mm256_set1_ps(kHalfInfFrom);
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(s + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    bad = _mm256_or_ps(bad, NotBelowAvx2(v, limit));
  }
  const bool tail = FloatToHalfScalar(s + i, d + i, n - i);
  return _mm256_movemask_ps(bad) == 0 && tail;
}
BP_TARGET_AVX2 void Bf16ToFloatAvx2(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  Bf16ToFloatScalar(s + i, d + i, n - i);
}
BP_TARGET_AVX2 bool FloatToBf16Avx2(const float* s, uint16_t* d, size_t n) {
  const __m256 limit = _mm256_set1_ps(Bf16InfFrom());
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(s + i);
    const __m256 b = _mm256_loadu_ps(s + i + 8);
    const __m256i lo = FloatToBf16x8(a);
    const __m256i hi = FloatToBf16x8(b);
    // packus works per 128-bit lane: fix the order with a permute.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), packed);
    bad = _mm256_or_ps(bad, _mm256_or_ps(NotBelowAvx2(a, limit), NotBelowAvx2(b, limit)));
  }
  const bool tail = FloatToBf16Scalar(s + i, d + i, n - i);
  return _mm256_movemask_ps(bad) == 0 && tail;
}
BP_TARGET_AVX2 void AddHalfAvx2(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), v));
  }
  AddHalfScalar(s + i, d + i, n - i);
}
BP_TARGET_AVX2 void AddBf16Avx2(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), v));
  }
  AddBf16Scalar(s + i, d + i, n - i);
}
BP_TARGET_AVX2 void AddScaleFloatAvx2(const float* s, float* d, size_t n, float scale) {
  const __m256 k = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(d + i), _mm256_loadu_ps(s + i));
    const __m256 b = _mm256_add_ps(_mm256_loadu_ps(d + i + 8), _mm256_loadu_ps(s + i + 8));
    _mm256_storeu_ps(d + i, _mm256_mul_ps(a, k));
    _mm256_storeu_ps(d + i + 8, _mm256_mul_ps(b, k));
  }
  AddScaleFloatScalar(s + i, d + i, n - i, scale);
}
BP_TARGET_AVX2 void ScaleFloatAvx2(float* d, size_t n, float scale) {
  const __m256 k = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_mul_ps(_mm256_loadu_ps(d + i), k));
  ScaleFloatScalar(d + i, n - i, scale);
}
BP_TARGET_AVX2 void AddFloatAvx2(const float* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), _mm256_loadu_ps(s + i)));
    _mm256_storeu_ps(d + i + 8,
                     _mm256_add_ps(_mm256_loadu_ps(d + i + 8), _mm256_loadu_ps(s + i + 8)));
  }
  AddFloatScalar(s + i, d + i, n - i);
}

// 32 floats per test (four vectors OR-ed); a block that holds one is scanned by the scalar loop.
BP_TARGET_AVX2 size_t FirstNonFiniteAvx2(const float* x, size_t n) {
  const __m256i exp = _mm256_set1_epi32(0x7F800000);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i any = _mm256_setzero_si256();
    for (size_t k = 0; k < 32; k += 8) {
      const __m256i v =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + k)), exp);
      any = _mm256_or_si256(any, _mm256_cmpeq_epi32(v, exp));
    }
    if (!_mm256_testz_si256(any, any)) return FirstNonFiniteF32Scalar(x, i, i + 32);
  }
  return FirstNonFiniteF32Scalar(x, i, n);
}

// 16-bit: 64 values per test (four vectors OR-ed); a block that holds one is scanned.
BP_TARGET_AVX2 size_t FirstNonFinite16Avx2(const uint16_t* x, size_t n, uint16_t exponent) {
  const __m256i exp = _mm256_set1_epi16(static_cast<int16_t>(exponent));
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256i any = _mm256_setzero_si256();
    for (size_t k = 0; k < 64; k += 16) {
      const __m256i v =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + k)), exp);
      any = _mm256_or_si256(any, _mm256_cmpeq_epi16(v, exp));
    }
    if (!_mm256_testz_si256(any, any)) return i + FirstNonFinite16Scalar(x + i, 64, exponent);
  }
  return i + FirstNonFinite16Scalar(x + i, n - i, exponent);
}

BP_TARGET_AVX2 bool CastWithResidualAvx2(const float* g, float* e, TensorView out) {
  const size_t n = out.count();
  const DType dt = out.dtype();
  const __m256 zero = _mm256_setzero_ps();
  __m256 all_finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 q = _mm256_loadu_ps(e + i);
    if (g) q = _mm256_add_ps(q, _mm256_loadu_ps(g + i));
    __m256 back = q;
    if (dt == DType::kFloat32) {
      _mm256_storeu_ps(out.f32() + i, q);
    } else if (dt == DType::kFloat16) {
      const __m128i h = _mm256_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.u16() + i), h);
      back = _mm256_cvtph_ps(h);
    } else {
      const __m256i b = FloatToBf16x8(q);  // 8 x u32 holding u16 values
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.u16() + i), packed);
      back = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
    }
    const __m256 r = _mm256_sub_ps(q, back);
    const __m256 finite = _mm256_cmp_ps(_mm256_sub_ps(r, r), zero, _CMP_EQ_OQ);
    _mm256_storeu_ps(e + i, _mm256_and_ps(r, finite));
    all_finite = _mm256_and_ps(all_finite, finite);
  }
  const bool tail = CastWithResidualScalar(
      g ? g + i : nullptr, e + i,
      TensorView(static_cast<uint8_t*>(out.data()) + i * DTypeSize(dt), n - i, dt));
  return _mm256_movemask_ps(all_finite) == 0xFF && tail;
}

// ---- AVX-512 ------------------------------------------------------------------------------

BP_TARGET_AVX512 void HalfToFloatAvx512(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(d + i,
                     _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
  }
}
// The lanes of v (within m) that do not store finite: !(|v| < limit), true for NaN.
BP_TARGET_AVX512 inline __mmask16 NotBelowAvx512(__mmask16 m, __m512 v, __m512 limit) {
  return _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(v), limit, _CMP_NLT_UQ);
}
BP_TARGET_AVX512 bool FloatToHalfAvx512(const float* s, uint16_t* d, size_t n) {
  const __m512 limit = _mm512_set1_ps(kHalfInfFrom);
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(s + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    bad |= NotBelowAvx512(0xFFFF, v, limit);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, s + i);
    _mm256_mask_storeu_epi16(d + i, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    bad |= NotBelowAvx512(m, v, limit);
  }
  return bad == 0;
}
BP_TARGET_AVX512 __m512 LoadBf16x16(const uint16_t* s, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
BP_TARGET_AVX512 __m256i FloatToBf16x16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm512_mask_or_epi32(r, is_nan, hi, _mm512_set1_epi32(0x40));
  return _mm512_maskz_cvtepi32_epi16(0xFFFF, r);
}
BP_TARGET_AVX512 void Bf16ToFloatAvx512(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    _mm512_mask_storeu_ps(d + i, m, LoadBf16x16(s + i, m));
  }
}
BP_TARGET_AVX512 bool FloatToBf16Avx512(const float* s, uint16_t* d, size_t n) {
  const __m512 limit = _mm512_set1_ps(Bf16InfFrom());
  __mmask16 bad = 0;
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, s + i);
    _mm256_mask_storeu_epi16(d + i, m, FloatToBf16x16(v));
    bad |= NotBelowAvx512(m, v, limit);
  }
  return bad == 0;
}
BP_TARGET_AVX512 void AddHalfAvx512(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i));
    _mm512_mask_storeu_ps(d + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + i), v));
  }
}
BP_TARGET_AVX512 void AddBf16Avx512(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    _mm512_mask_storeu_ps(d + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + i), LoadBf16x16(s + i, m)));
  }
}
BP_TARGET_AVX512 void ScaleFloatAvx512(float* d, size_t n, float scale) {
  const __m512 k = _mm512_set1_ps(scale);
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    _mm512_mask_storeu_ps(d + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, d + i), k));
  }
}
BP_TARGET_AVX512 void AddScaleFloatAvx512(const float* s, float* d, size_t n, float scale) {
  const __m512 k = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_add_ps(_mm512_loadu_ps(d + i), _mm512_loadu_ps(s + i));
    const __m512 b = _mm512_add_ps(_mm512_loadu_ps(d + i + 16), _mm512_loadu_ps(s + i + 16));
    _mm512_storeu_ps(d + i, _mm512_mul_ps(a, k));
    _mm512_storeu_ps(d + i + 16, _mm512_mul_ps(b, k));
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 a =
        _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + i), _mm512_maskz_loadu_ps(m, s + i));
    _mm512_mask_storeu_ps(d + i, m, _mm512_mul_ps(a, k));
  }
}
BP_TARGET_AVX512 void AddFloatAvx512(const float* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(d + i), _mm512_loadu_ps(s + i)));
    _mm512_storeu_ps(d + i + 16,
                     _mm512_add_ps(_mm512_loadu_ps(d + i + 16), _mm512_loadu_ps(s + i + 16)));
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    _mm512_mask_storeu_ps(
        d + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + i), _mm512_maskz_loadu_ps(m, s + i)));
  }
}

// 64 floats per test (four vectors); fpclass 0x99 = QNaN | +inf | -inf | SNaN.
BP_TARGET_AVX512 size_t FirstNonFiniteAvx512(const float* x, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __mmask16 bad = _mm512_fpclass_ps_mask(_mm512_loadu_ps(x + i), 0x99) |
                          _mm512_fpclass_ps_mask(_mm512_loadu_ps(x + i + 16), 0x99) |
                          _mm512_fpclass_ps_mask(_mm512_loadu_ps(x + i + 32), 0x99) |
                          _mm512_fpclass_ps_mask(_mm512_loadu_ps(x + i + 48), 0x99);
    if (bad != 0) return FirstNonFiniteF32Scalar(x, i, i + 64);
  }
  return FirstNonFiniteF32Scalar(x, i, n);
}

// 16-bit: 128 values per test (four vectors); a block that holds one is scanned.
BP_TARGET_AVX512 size_t FirstNonFinite16Avx512(const uint16_t* x, size_t n, uint16_t exponent) {
  const __m512i exp = _mm512_set1_epi16(static_cast<int16_t>(exponent));
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __mmask32 bad = 0;
    for (size_t k = 0; k < 128; k += 32) {
      bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + k), exp), exp);
    }
    if (bad != 0) return i + FirstNonFinite16Scalar(x + i, 128, exponent);
  }
  return i + FirstNonFinite16Scalar(x + i, n - i, exponent);
}

BP_TARGET_AVX512 bool CastWithResidualAvx512(const float* g, float* e, TensorView out) {
  const size_t n = out.count();
  const DType dt = out.dtype();
  __mmask16 any_bad = 0;
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    __m512 q = _mm512_maskz_loadu_ps(m, e + i);
    if (g) q = _mm512_add_ps(q, _mm512_maskz_loadu_ps(m, g + i));
    __m512 back = q;
    if (dt == DType::kFloat32) {
      _mm512_mask_storeu_ps(out.f32() + i, m, q);
    } else if (dt == DType::kFloat16) {
      const __m256i h = _mm512_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT);
      _mm256_mask_storeu_epi16(out.u16() + i, m, h);
      back = _mm512_cvtph_ps(h);
    } else {
      const __m256i b = FloatToBf16x16(q);
      _mm256_mask_storeu_epi16(out.u16() + i, m, b);
      back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    const __m512 r = _mm512_sub_ps(q, back);
    // fpclass 0x99: QNaN | +inf | -inf | SNaN
    const __mmask16 bad = _mm512_fpclass_ps_mask(r, 0x99);
    _mm512_mask_storeu_ps(e + i, m, _mm512_maskz_mov_ps(static_cast<__mmask16>(~bad), r));
    any_bad |= bad & m;
  }
  return any_bad == 0;
}

}  // namespace

#define BP_DISPATCH(isa, name, ...)                           \
  switch (isa) {                                              \
    case IsaLevel::kAvx512: return name##Avx512(__VA_ARGS__); \
    case IsaLevel::kAvx2: return name##Avx2(__VA_ARGS__);     \
    case IsaLevel::kScalar: break;                            \
  }                                                           \
  return name##Scalar(__VA_ARGS__)

void HalfToFloatArray(const uint16_t* s, float* d, size_t n, IsaLevel isa) {
  BP_DISPATCH(isa, HalfToFloat, s, d, n);
}
bool FloatToHalfArray(const float* s, uint16_t* d, size_t n, IsaLevel isa) {
  BP_DISPATCH(isa, FloatToHalf, s, d, n);
}
void Bf16ToFloatArray(const uint16_t* s, float* d, size_t n, IsaLevel isa) {
  BP_DISPATCH(isa, Bf16ToFloat, s, d, n);
}
bool FloatToBf16Array(const float* s, uint16_t* d, size_t n, IsaLevel isa) {
  BP_DISPATCH(isa, FloatToBf16, s, d, n);
}
void AddFloatArray(const float* s, float* d, size_t n, IsaLevel isa) {
  BP_DISPATCH(isa, AddFloat, s, d, n);
}
void AddScaleFloatArray(const float* s, float* d, size_t n, float scale, IsaLevel isa) {
  BP_DISPATCH(isa, AddScaleFloat, s, d, n, scale);
}
void ScaleFloatArray(float* d, size_t n, float scale, IsaLevel isa) {
  BP_DISPATCH(isa, ScaleFloat, d, n, scale);
}
static void AddHalfArray(const uint16_t* s, float* d, size_t n, IsaLevel isa) {
  BP_DISPATCH(isa, AddHalf, s, d, n);
}
static void AddBf16Array(const uint16_t* s, float* d, size_t n, IsaLevel isa) {
  BP_DISPATCH(isa, AddBf16, s, d, n);
}
bool CastWithResidual(const float* g, float* e, TensorView out, IsaLevel isa) {
  BP_DISPATCH(isa, CastWithResidual, g, e, out);
}
#undef BP_DISPATCH

void ConvertToFloat(ConstTensorView src, float* dst, IsaLevel isa) {
  switch (src.dtype()) {
    case DType::kFloat32:
      if (src.count() && src.f32() != dst) std::memmove(dst, src.f32(), src.count() * 4);
      return;
    case DType::kFloat16: return HalfToFloatArray(src.u16(), dst, src.count(), isa);
    case DType::kBFloat16: return Bf16ToFloatArray(src.u16(), dst, src.count(), isa);
  }
}

void ConvertFromFloat(const float* src, TensorView dst, IsaLevel isa) {
  switch (dst.dtype()) {
    case DType::kFloat32:
      if (dst.count() && dst.f32() != src) std::memmove(dst.f32(), src, dst.count() * 4);
      return;
    case DType::kFloat16: (void)FloatToHalfArray(src, dst.u16(), dst.count(), isa); return;
    case DType::kBFloat16: (void)FloatToBf16Array(src, dst.u16(), dst.count(), isa); return;
  }
}

void AddToFloat(ConstTensorView src, float* dst, IsaLevel isa) {
  switch (src.dtype()) {
    case DType::kFloat32: return AddFloatArray(src.f32(), dst, src.count(), isa);
    case DType::kFloat16: return AddHalfArray(src.u16(), dst, src.count(), isa);
    case DType::kBFloat16: return AddBf16Array(src.u16(), dst, src.count(), isa);
  }
}

size_t FirstNonFinite(ConstTensorView v, IsaLevel isa) {
  switch (v.dtype()) {
    case DType::kFloat16:
    case DType::kBFloat16: {
      const uint16_t exponent = v.dtype() == DType::kFloat16 ? 0x7C00u : 0x7F80u;
      switch (isa) {
        case IsaLevel::kAvx512: return FirstNonFinite16Avx512(v.u16(), v.count(), exponent);
        case IsaLevel::kAvx2: return FirstNonFinite16Avx2(v.u16(), v.count(), exponent);
        case IsaLevel::kScalar: break;
      }
      return FirstNonFinite16Scalar(v.u16(), v.count(), exponent);
    }
    case DType::kFloat32: break;
  }
  switch (isa) {
    case IsaLevel::kAvx512: return FirstNonFiniteAvx512(v.f32(), v.count());
    case IsaLevel::kAvx2: return FirstNonFiniteAvx2(v.f32(), v.count());
    case IsaLevel::kScalar: break;
  }
  return FirstNonFiniteScalar(v.f32(), v.count());
}

}  // namespace bitpush
