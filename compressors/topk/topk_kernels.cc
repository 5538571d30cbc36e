#include "compressors/topk/topk_kernels.h"

#include <immintrin.h>

#include <algorithm>

namespace bitpush::compressors {
namespace {

// ---- scalar -------------------------------------------------------------------------------
// A plain branch: for the small k that topk is used with it is almost never taken, which beats
// branch-free stores of every element.

size_t FilterScalar(const float* x, size_t begin, size_t end, uint32_t t, uint32_t* out_index,
                    uint32_t* out_key) {
  size_t c = 0;
  for (size_t i = begin; i < end; ++i) {
    const uint32_t key = TopkKey(x[i]);
    if (key >= t) {
      out_index[c] = static_cast<uint32_t>(i);
      out_key[c] = key;
      ++c;
    }
  }
  return c;
}

size_t AddFilterScalar(const float* g, float* e, size_t begin, size_t end, uint32_t t,
                       uint32_t* out_index, uint32_t* out_key) {
  size_t c = 0;
  for (size_t i = begin; i < end; ++i) {
    const float q = g[i] + e[i];
    e[i] = q;
    const uint32_t key = TopkKey(q);
    if (key >= t) {
      out_index[c] = static_cast<uint32_t>(i);
      out_key[c] = key;
      ++c;
    }
  }
  return c;
}

// ---- AVX2 ---------------------------------------------------------------------------------
// 8 lanes: compare -> movemask -> left-pack lane indices and keys with a permutation from a
// 256-entry table (AVX2 has no compress instruction), store 8 lanes, advance by popcount.

struct CompressTable {
  uint8_t perm[256][8];
  constexpr CompressTable() : perm() {
    for (int m = 0; m < 256; ++m) {
      int c = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (m & (1 << lane)) perm[m][c++] = static_cast<uint8_t>(lane);
      }
      for (; c < 8; ++c) perm[m][c] = 0;
    }
  }
};
constexpr CompressTable kCompressTable;

// Keys are < 2^31, so a signed compare is exact: key >= t  <=>  key > t - 1 (t above 2^31
// matches no key, like 2^31 itself).
inline int32_t SignedThresholdMinus1(uint32_t t) {
  return static_cast<int32_t>(std::min<uint32_t>(t, 0x80000000u) - 1u);
}

BP_TARGET_AVX2 inline __m256i KeyAvx2(__m256 v) {
  return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF));
}

BP_TARGET_AVX2 inline uint32_t PassMaskAvx2(__m256i key, __m256i thr_minus_1) {
  return static_cast<uint32_t>(
      _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, thr_minus_1))));
}

BP_TARGET_AVX2 inline size_t PackAvx2(uint32_t mask, __m256i index, __m256i key,
                                      uint32_t* out_index, uint32_t* out_key) {
  const __m128i bytes =
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompressTable.perm[mask]));
  const __m256i perm = _mm256_cvtepu8_epi32(bytes);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_index),
                      _mm256_permutevar8x32_epi32(index, perm));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_key), _mm256_permutevar8x32_epi32(key, perm));
  return static_cast<size_t>(_mm_popcnt_u32(mask));
}

// Filters 32 keys starting at element i (4 vectors); returns the number appended.
BP_TARGET_AVX2 inline size_t Filter32Avx2(size_t i, __m256i k0, __m256i k1, __m256i k2, __m256i k3,
                                          __m256i thr, uint32_t* out_index, uint32_t* out_key) {
  const uint32_t m0 = PassMaskAvx2(k0, thr);
  const uint32_t m1 = PassMaskAvx2(k1, thr);
  const uint32_t m2 = PassMaskAvx2(k2, thr);
  const uint32_t m3 = PassMaskAvx2(k3, thr);
  if ((m0 | m1 | m2 | m3) == 0) return 0;  // the common case for small k
  const __m256i base = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(i)),
                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  size_t c = PackAvx2(m0, base, k0, out_index, out_key);
  c += PackAvx2(m1, _mm256_add_epi32(base, _mm256_set1_epi32(8)), k1, out_index + c, out_key + c);
  c += PackAvx2(m2, _mm256_add_epi32(base, _mm256_set1_epi32(16)), k2, out_index + c, out_key + c);
  c += PackAvx2(m3, _mm256_add_epi32(base, _mm256_set1_epi32(24)), k3, out_index + c, out_key + c);
  return c;
}

BP_TARGET_AVX2 size_t FilterAvx2(const float* x, size_t begin, size_t end, uint32_t t,
                                 uint32_t* out_index, uint32_t* out_key) {
  const __m256i thr = _mm256_set1_epi32(SignedThresholdMinus1(t));
  size_t c = 0;
  size_t i = begin;
  for (; i + 32 <= end; i += 32) {
    c += Filter32Avx2(i, KeyAvx2(_mm256_loadu_ps(x + i)), KeyAvx2(_mm256_loadu_ps(x + i + 8)),
                      KeyAvx2(_mm256_loadu_ps(x + i + 16)), KeyAvx2(_mm256_loadu_ps(x + i + 24)),
                      thr, out_index + c, out_key + c);
  }
  return c + FilterScalar(x, i, end, t, out_index + c, out_key + c);
}

BP_TARGET_AVX2 size_t AddFilterAvx2(const float* g, float* e, size_t begin, size_t end, uint32_t t,
                                    uint32_t* out_index, uint32_t* out_key) {
  const __m256i thr = _mm256_set1_epi32(SignedThresholdMinus1(t));
  size_t c = 0;
  size_t i = begin;
  for (; i + 32 <= end; i += 32) {
    const __m256 q0 = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(e + i));
    const __m256 q1 = _mm256_add_ps(_mm256_loadu_ps(g + i + 8), _mm256_loadu_ps(e + i + 8));
    const __m256 q2 = _mm256_add_ps(_mm256_loadu_ps(g + i + 16), _mm256_loadu_ps(e + i + 16));
    const __m256 q3 = _mm256_add_ps(_mm256_loadu_ps(g + i + 24), _mm256_loadu_ps(e + i + 24));
    _mm256_storeu_ps(e + i, q0);
    _mm256_storeu_ps(e + i + 8, q1);
    _mm256_storeu_ps(e + i + 16, q2);
    _mm256_storeu_ps(e + i + 24, q3);
    c += Filter32Avx2(i, KeyAvx2(q0), KeyAvx2(q1), KeyAvx2(q2), KeyAvx2(q3), thr, out_index + c,
                      out_key + c);
  }
  return c + AddFilterScalar(g, e, i, end, t, out_index + c, out_key + c);
}

// ---- AVX-512 ------------------------------------------------------------------------------
// 16 lanes: unsigned compare straight into a mask, VPCOMPRESSD into a register (the
// memory-destination form is slow on several cores), full store, advance by popcount.

BP_TARGET_AVX512 inline __m512i KeyAvx512(__m512 v) {
  return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF));
}

BP_TARGET_AVX512 inline size_t PackAvx512(__mmask16 mask, __m512i index, __m512i key,
                                          uint32_t* out_index, uint32_t* out_key) {
  _mm512_storeu_si512(out_index, _mm512_maskz_compress_epi32(mask, index));
  _mm512_storeu_si512(out_key, _mm512_maskz_compress_epi32(mask, key));
  return static_cast<size_t>(_mm_popcnt_u32(mask));
}

// Filters 64 keys starting at element i (4 vectors); returns the number appended.
BP_TARGET_AVX512 inline size_t Filter64Avx512(size_t i, __m512i k0, __m512i k1, __m512i k2,
                                              __m512i k3, __m512i thr, uint32_t* out_index,
                                              uint32_t* out_key) {
  const __mmask16 m0 = _mm512_cmpge_epu32_mask(k0, thr);
  const __mmask16 m1 = _mm512_cmpge_epu32_mask(k1, thr);
  const __mmask16 m2 = _mm512_cmpge_epu32_mask(k2, thr);
  const __mmask16 m3 = _mm512_cmpge_epu32_mask(k3, thr);
  if ((m0 | m1 | m2 | m3) == 0) return 0;  // the common case for small k
  const __m512i base =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(i)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  size_t c = PackAvx512(m0, base, k0, out_index, out_key);
  c +=
      PackAvx512(m1, _mm512_add_epi32(base, _mm512_set1_epi32(16)), k1, out_index + c, out_key + c);
  c +=
      PackAvx512(m2, _mm512_add_epi32(base, _mm512_set1_epi32(32)), k2, out_index + c, out_key + c);
  c +=
      PackAvx512(m3, _mm512_add_epi32(base, _mm512_set1_epi32(48)), k3, out_index + c, out_key + c);
  return c;
}

// Up to 16 elements at i, under a lane mask (the tail after the 64-element blocks).
BP_TARGET_AVX512 inline size_t FilterTailAvx512(size_t i, __m512i key, __mmask16 lanes, __m512i thr,
                                                uint32_t* out_index, uint32_t* out_key) {
  const __mmask16 m = _mm512_mask_cmpge_epu32_mask(lanes, key, thr);
  const __m512i index =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(i)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return PackAvx512(m, index, key, out_index, out_key);
}

inline __mmask16 TailLanes(size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

BP_TARGET_AVX512 size_t FilterAvx512(const float* x, size_t begin, size_t end, uint32_t t,
                                     uint32_t* out_index, uint32_t* out_key) {
  const __m512i thr = _mm512_set1_epi32(static_cast<int32_t>(t));
  size_t c = 0;
  size_t i = begin;
  for (; i + 64 <= end; i += 64) {
    c +=
        Filter64Avx512(i, KeyAvx512(_mm512_loadu_ps(x + i)), KeyAvx512(_mm512_loadu_ps(x + i + 16)),
                       KeyAvx512(_mm512_loadu_ps(x + i + 32)),
                       KeyAvx512(_mm512_loadu_ps(x + i + 48)), thr, out_index + c, out_key + c);
  }
  for (; i < end; i += 16) {
    const __mmask16 lanes = TailLanes(end - i);
    c += FilterTailAvx512(i, KeyAvx512(_mm512_maskz_loadu_ps(lanes, x + i)), lanes, thr,
                          out_index + c, out_key + c);
  }
  return c;
}

BP_TARGET_AVX512 size_t AddFilterAvx512(const float* g, float* e, size_t begin, size_t end,
                                        uint32_t t, uint32_t* out_index, uint32_t* out_key) {
  const __m512i thr = _mm512_set1_epi32(static_cast<int32_t>(t));
  size_t c = 0;
  size_t i = begin;
  for (; i + 64 <= end; i += 64) {
    const __m512 q0 = _mm512_add_ps(_mm512_loadu_ps(g + i), _mm512_loadu_ps(e + i));
    const __m512 q1 = _mm512_add_ps(_mm512_loadu_ps(g + i + 16), _mm512_loadu_ps(e + i + 16));
    const __m512 q2 = _mm512_add_ps(_mm512_loadu_ps(g + i + 32), _mm512_loadu_ps(e + i + 32));
    const __m512 q3 = _mm512_add_ps(_mm512_loadu_ps(g + i + 48), _mm512_loadu_ps(e + i + 48));
    _mm512_storeu_ps(e + i, q0);
    _mm512_storeu_ps(e + i + 16, q1);
    _mm512_storeu_ps(e + i + 32, q2);
    _mm512_storeu_ps(e + i + 48, q3);
    c += Filter64Avx512(i, KeyAvx512(q0), KeyAvx512(q1), KeyAvx512(q2), KeyAvx512(q3), thr,
                        out_index + c, out_key + c);
  }
  for (; i < end; i += 16) {
    const __mmask16 lanes = TailLanes(end - i);
    const __m512 q =
        _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, g + i), _mm512_maskz_loadu_ps(lanes, e + i));
    _mm512_mask_storeu_ps(e + i, lanes, q);
    c += FilterTailAvx512(i, KeyAvx512(q), lanes, thr, out_index + c, out_key + c);
  }
  return c;
}

}  // namespace

size_t TopkFilter(const float* x, size_t begin, size_t end, uint32_t t, uint32_t* out_index,
                  uint32_t* out_key, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return FilterAvx512(x, begin, end, t, out_index, out_key);
    case IsaLevel::kAvx2: return FilterAvx2(x, begin, end, t, out_index, out_key);
    case IsaLevel::kScalar: break;
  }
  return FilterScalar(x, begin, end, t, out_index, out_key);
}

size_t TopkAddFilter(const float* g, float* e, size_t begin, size_t end, uint32_t t,
                     uint32_t* out_index, uint32_t* out_key, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return AddFilterAvx512(g, e, begin, end, t, out_index, out_key);
    case IsaLevel::kAvx2: return AddFilterAvx2(g, e, begin, end, t, out_index, out_key);
    case IsaLevel::kScalar: break;
  }
  return AddFilterScalar(g, e, begin, end, t, out_index, out_key);
}

}  // namespace bitpush::compressors
