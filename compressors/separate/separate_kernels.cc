// Every level must compute the same bits: no multiply-add pair may be fused (GCC contracts them
// by default where the target has FMA, intrinsics included; clang honours the STDC pragma).
#pragma GCC optimize("fp-contract=off")
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "compressors/separate/separate_kernels.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/counter_rng.h"
#include "compressors/separate/gaussian_pair.h"

namespace bitpush::compressors::separate {
namespace {

alignas(64) constexpr float kInvC[32] = BITPUSH_SEPARATE_INV_C;
alignas(64) constexpr float kLnC[32] = BITPUSH_SEPARATE_LN_C;

// The pair of lane hash x: half 0 (cos) and half 1 (sin) — gaussian_pair.h, the reference
// every level matches.
inline void PairScalar(uint32_t x, float* c_out, float* s_out) {
  GaussianPairFrom(x, kInvC, kLnC, c_out, s_out);
}

inline uint32_t LaneHash(uint64_t stream, uint32_t group, uint32_t lane) {
  return GaussianLaneHash(stream, group, lane);
}

void GroupScalar(uint64_t stream, uint32_t group, float* out) {
  for (uint32_t l = 0; l < 16; ++l) PairScalar(LaneHash(stream, group, l), out + l, out + 16 + l);
}

template <typename Group>
void FillWith(uint64_t stream, uint32_t first, size_t count, float* out, Group group_fn) {
  if (count == 0) return;
  const uint64_t end = uint64_t{first} + count;
  uint64_t pos = first;
  float tmp[kGaussianGroup];
  while (pos < end) {
    const uint32_t g = static_cast<uint32_t>(pos / kGaussianGroup);
    const uint64_t g0 = uint64_t{g} * kGaussianGroup;
    float* dst = out + (pos - first);
    if (pos == g0 && end - pos >= kGaussianGroup) {
      group_fn(stream, g, dst);
      pos += kGaussianGroup;
      continue;
    }
    group_fn(stream, g, tmp);
    const uint64_t stop = end < g0 + kGaussianGroup ? end : g0 + kGaussianGroup;
    std::memcpy(dst, tmp + (pos - g0), (stop - pos) * sizeof(float));
    pos = stop;
  }
}

// ---- AVX-512: 16 lanes, the group's two halves in two registers -------------------------

// The hash input of lane l of group g is (16 g + l) golden + lo: `pre`, advanced by 16 golden
// per group by the callers.
BP_TARGET_AVX512 inline __m512i FirstPre(uint64_t stream, uint32_t group) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(group * 16u)), lane);
  return _mm512_add_epi32(_mm512_mullo_epi32(idx, _mm512_set1_epi32(int32_t(kGolden32))),
                          _mm512_set1_epi32(static_cast<int32_t>(stream)));
}

BP_TARGET_AVX512 inline __m512i NextPre(__m512i pre) {
  return _mm512_add_epi32(pre, _mm512_set1_epi32(static_cast<int32_t>(16u * kGolden32)));
}

BP_TARGET_AVX512 inline void PairsAvx512(__m512i pre, __m512i hi, __m512* cos_half,
                                         __m512* sin_half) {
  __m512i x = _mm512_xor_si512(pre, hi);
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int32_t(0x85EBCA6Bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int32_t(0xC2B2AE35u)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));

  // f = ((x << 1) & 0x1FFFE) | 1   (ternary logic: (A & B) | C)
  const __m512i fi = _mm512_ternarylogic_epi32(_mm512_slli_epi32(x, 1), _mm512_set1_epi32(0x1FFFE),
                                               _mm512_set1_epi32(1), 0xEA);
  const __m512 f = _mm512_cvtepi32_ps(fi);
  const __m512 m = _mm512_getmant_ps(f, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_src);
  const __m512 e = _mm512_getexp_ps(f);
  const __m512i i = _mm512_srli_epi32(_mm512_castps_si512(m), 18);  // the permutes read bits 0..4
  const __m512 inv_c = _mm512_permutex2var_ps(_mm512_load_ps(kInvC), i, _mm512_load_ps(kInvC + 16));
  const __m512 ln_c = _mm512_permutex2var_ps(_mm512_load_ps(kLnC), i, _mm512_load_ps(kLnC + 16));
  const __m512 t = _mm512_sub_ps(_mm512_mul_ps(m, inv_c), _mm512_set1_ps(1.0f));
  __m512 q = _mm512_add_ps(_mm512_mul_ps(t, _mm512_set1_ps(kMinusTwoThirds)), _mm512_set1_ps(1.0f));
  q = _mm512_add_ps(_mm512_mul_ps(q, t), _mm512_set1_ps(-2.0f));
  q = _mm512_mul_ps(q, t);
  const __m512 w = _mm512_add_ps(
      _mm512_add_ps(
          _mm512_mul_ps(_mm512_sub_ps(e, _mm512_set1_ps(17.0f)), _mm512_set1_ps(kMinus2Ln2)), ln_c),
      q);
  const __m512 r = _mm512_sqrt_ps(w);

  const __m512i k2 = _mm512_or_si512(_mm512_srli_epi32(x, 17), _mm512_set1_epi32(1));
  const __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(k2), _mm512_set1_ps(kAngleStep));
  const __m512 y = _mm512_mul_ps(a, a);
  __m512 s = _mm512_set1_ps(kS3);
  s = _mm512_add_ps(_mm512_mul_ps(s, y), _mm512_set1_ps(kS2));
  s = _mm512_add_ps(_mm512_mul_ps(s, y), _mm512_set1_ps(kS1));
  s = _mm512_add_ps(_mm512_mul_ps(s, y), _mm512_set1_ps(kS0));
  const __m512 sn = _mm512_add_ps(a, _mm512_mul_ps(_mm512_mul_ps(a, y), s));
  __m512 c = _mm512_set1_ps(kC3);
  c = _mm512_add_ps(_mm512_mul_ps(c, y), _mm512_set1_ps(kC2));
  c = _mm512_add_ps(_mm512_mul_ps(c, y), _mm512_set1_ps(kC1));
  c = _mm512_add_ps(_mm512_mul_ps(c, y), _mm512_set1_ps(kC0));
  const __m512 cs = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(y, c));
  // z ^ ((x << 15) & sign)   (ternary logic: A ^ (B & C))
  const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
  *cos_half = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
      _mm512_castps_si512(_mm512_mul_ps(r, cs)), _mm512_slli_epi32(x, 15), sign, 0x78));
  *sin_half = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
      _mm512_castps_si512(_mm512_mul_ps(r, sn)), _mm512_slli_epi32(x, 14), sign, 0x78));
}

BP_TARGET_AVX512 inline __m512i HiOf(uint64_t stream) {
  return _mm512_set1_epi32(static_cast<int32_t>(stream >> 32));
}

BP_TARGET_AVX512 void GroupAvx512(uint64_t stream, uint32_t group, float* out) {
  __m512 zc, zs;
  PairsAvx512(FirstPre(stream, group), HiOf(stream), &zc, &zs);
  _mm512_storeu_ps(out, zc);
  _mm512_storeu_ps(out + 16, zs);
}

BP_TARGET_AVX512 void FillAvx512(uint64_t stream, uint32_t first, size_t count, float* out) {
  if (count == 0) return;
  const uint64_t end = uint64_t{first} + count;
  uint64_t pos = first;
  float tmp[kGaussianGroup];
  while (pos < end) {
    const uint32_t g = static_cast<uint32_t>(pos / kGaussianGroup);
    const uint64_t g0 = uint64_t{g} * kGaussianGroup;
    if (pos == g0 && end - pos >= kGaussianGroup) {  // whole groups straight into out
      float* dst = out + (pos - first);
      const uint64_t whole = (end - pos) / kGaussianGroup;
      for (uint64_t k = 0; k < whole; ++k)
        GroupAvx512(stream, g + static_cast<uint32_t>(k), dst + 32 * k);
      pos += whole * kGaussianGroup;
      if (pos == end) break;
      continue;
    }
    GroupAvx512(stream, g, tmp);
    const uint64_t stop = end < g0 + kGaussianGroup ? end : g0 + kGaussianGroup;
    std::memcpy(out + (pos - first), tmp + (pos - g0), (stop - pos) * sizeof(float));
    pos = stop;
  }
}

// ---- block kernels ------------------------------------------------------------------------

float FoldLanes(float* acc) {
  for (int w = 16; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] = acc[l] + acc[l + w];
  }
  return acc[0];
}

void ProjectScalar(uint64_t block_stream, const float* h, size_t d, size_t m, float* p) {
  float z[kGaussianGroup];
  for (size_t r = 0; r < m; ++r) {
    const uint64_t rs = RowStream(block_stream, r);
    float acc[kGaussianGroup] = {};
    for (size_t c0 = 0; c0 < d; c0 += kGaussianGroup) {
      GroupScalar(rs, static_cast<uint32_t>(c0 / kGaussianGroup), z);
      const size_t k_end = d - c0 < kGaussianGroup ? d - c0 : kGaussianGroup;
      for (size_t k = 0; k < k_end; ++k) acc[k] = acc[k] + z[k] * h[c0 + k];
    }
    p[r] = FoldLanes(acc);
  }
}

void ReconstructScalar(uint64_t block_stream, const float* q, size_t d, size_t m, float* out) {
  float z[kGaussianGroup];
  for (size_t r = 0; r < m; ++r) {
    const uint64_t rs = RowStream(block_stream, r);
    const float qr = q[r];
    for (size_t c0 = 0; c0 < d; c0 += kGaussianGroup) {
      GroupScalar(rs, static_cast<uint32_t>(c0 / kGaussianGroup), z);
      const size_t k_end = d - c0 < kGaussianGroup ? d - c0 : kGaussianGroup;
      float* o = out + c0;
      if (r == 0) {
        for (size_t k = 0; k < k_end; ++k) o[k] = qr * z[k];
      } else {
        for (size_t k = 0; k < k_end; ++k) o[k] = o[k] + qr * z[k];
      }
    }
  }
}

// ---- AVX2: the 16 lanes of a group as two sets of 8 (same operations, same bits) ----------

// The hash inputs of lanes 8k..8k+7 of group 0: (8k + l) golden + lo; +16 golden per group.
BP_TARGET_AVX2 inline __m256i FirstPre8(uint64_t stream, int k) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(8 * k), lane);
  return _mm256_add_epi32(_mm256_mullo_epi32(idx, _mm256_set1_epi32(int32_t(kGolden32))),
                          _mm256_set1_epi32(static_cast<int32_t>(stream)));
}

BP_TARGET_AVX2 inline __m256i NextPre8(__m256i pre) {
  return _mm256_add_epi32(pre, _mm256_set1_epi32(static_cast<int32_t>(16u * kGolden32)));
}

// table[i] for i in 0..31: four 8-entry permutes, blended by bits 3 and 4 of i (faster than a
// gather here).
BP_TARGET_AVX2 inline __m256 Lookup32Avx2(const float* table, __m256i i) {
  const __m256 p0 = _mm256_permutevar8x32_ps(_mm256_load_ps(table), i);
  const __m256 p1 = _mm256_permutevar8x32_ps(_mm256_load_ps(table + 8), i);
  const __m256 p2 = _mm256_permutevar8x32_ps(_mm256_load_ps(table + 16), i);
  const __m256 p3 = _mm256_permutevar8x32_ps(_mm256_load_ps(table + 24), i);
  const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(i, 28));  // blendv reads bit 31
  const __m256 bit4 = _mm256_castsi256_ps(_mm256_slli_epi32(i, 27));
  return _mm256_blendv_ps(_mm256_blendv_ps(p0, p1, bit3), _mm256_blendv_ps(p2, p3, bit3), bit4);
}

BP_TARGET_AVX2 inline void Pairs8Avx2(__m256i pre, __m256i hi, __m256* cos_half, __m256* sin_half) {
  __m256i x = _mm256_xor_si256(pre, hi);
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int32_t(0x85EBCA6Bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int32_t(0xC2B2AE35u)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));

  const __m256i fi = _mm256_or_si256(
      _mm256_and_si256(_mm256_slli_epi32(x, 1), _mm256_set1_epi32(0x1FFFE)), _mm256_set1_epi32(1));
  const __m256 f = _mm256_cvtepi32_ps(fi);
  const __m256i fb = _mm256_castps_si256(f);
  const __m256i half = _mm256_and_si256(_mm256_srli_epi32(fb, 22), _mm256_set1_epi32(1));
  const __m256 e =
      _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(fb, 23), _mm256_set1_epi32(127)));
  // m's exponent: 0x3F800000 - (hi << 23) (126 where the fraction is >= 0.5)
  const __m256i mb =
      _mm256_or_si256(_mm256_and_si256(fb, _mm256_set1_epi32(0x7FFFFF)),
                      _mm256_sub_epi32(_mm256_set1_epi32(0x3F800000), _mm256_slli_epi32(half, 23)));
  const __m256i i = _mm256_and_si256(_mm256_srli_epi32(mb, 18), _mm256_set1_epi32(31));
  const __m256 inv_c = Lookup32Avx2(kInvC, i);
  const __m256 ln_c = Lookup32Avx2(kLnC, i);
  const __m256 t =
      _mm256_sub_ps(_mm256_mul_ps(_mm256_castsi256_ps(mb), inv_c), _mm256_set1_ps(1.0f));
  __m256 q = _mm256_add_ps(_mm256_mul_ps(t, _mm256_set1_ps(kMinusTwoThirds)), _mm256_set1_ps(1.0f));
  q = _mm256_add_ps(_mm256_mul_ps(q, t), _mm256_set1_ps(-2.0f));
  q = _mm256_mul_ps(q, t);
  const __m256 w = _mm256_add_ps(
      _mm256_add_ps(
          _mm256_mul_ps(_mm256_sub_ps(e, _mm256_set1_ps(17.0f)), _mm256_set1_ps(kMinus2Ln2)), ln_c),
      q);
  const __m256 r = _mm256_sqrt_ps(w);

  const __m256i k2 = _mm256_or_si256(_mm256_srli_epi32(x, 17), _mm256_set1_epi32(1));
  const __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(k2), _mm256_set1_ps(kAngleStep));
  const __m256 y = _mm256_mul_ps(a, a);
  __m256 s = _mm256_set1_ps(kS3);
  s = _mm256_add_ps(_mm256_mul_ps(s, y), _mm256_set1_ps(kS2));
  s = _mm256_add_ps(_mm256_mul_ps(s, y), _mm256_set1_ps(kS1));
  s = _mm256_add_ps(_mm256_mul_ps(s, y), _mm256_set1_ps(kS0));
  const __m256 sn = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(a, y), s));
  __m256 c = _mm256_set1_ps(kC3);
  c = _mm256_add_ps(_mm256_mul_ps(c, y), _mm256_set1_ps(kC2));
  c = _mm256_add_ps(_mm256_mul_ps(c, y), _mm256_set1_ps(kC1));
  c = _mm256_add_ps(_mm256_mul_ps(c, y), _mm256_set1_ps(kC0));
  const __m256 cs = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(y, c));
  const __m256i sign = _mm256_set1_epi32(int32_t(0x80000000u));
  *cos_half = _mm256_castsi256_ps(_mm256_xor_si256(
      _mm256_castps_si256(_mm256_mul_ps(r, cs)), _mm256_and_si256(_mm256_slli_epi32(x, 15), sign)));
  *sin_half = _mm256_castsi256_ps(_mm256_xor_si256(
      _mm256_castps_si256(_mm256_mul_ps(r, sn)), _mm256_and_si256(_mm256_slli_epi32(x, 14), sign)));
}

// The 32 values of a group: z[0] positions 0..7, z[1] 8..15, z[2] 16..23, z[3] 24..31.
BP_TARGET_AVX2 inline void GroupRegsAvx2(__m256i pre0, __m256i pre1, __m256i hi, __m256* z) {
  Pairs8Avx2(pre0, hi, &z[0], &z[2]);
  Pairs8Avx2(pre1, hi, &z[1], &z[3]);
}

BP_TARGET_AVX2 void GroupAvx2(uint64_t stream, uint32_t group, float* out) {
  const __m256i step = _mm256_set1_epi32(static_cast<int32_t>(group * 16u * kGolden32));
  const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(stream >> 32));
  __m256 z[4];
  GroupRegsAvx2(_mm256_add_epi32(FirstPre8(stream, 0), step),
                _mm256_add_epi32(FirstPre8(stream, 1), step), hi, z);
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + 8 * k, z[k]);
}

BP_TARGET_AVX2 void ProjectAvx2(uint64_t block_stream, const float* h, size_t d, size_t m,
                                float* p) {
  const size_t groups = (d + kGaussianGroup - 1) / kGaussianGroup;
  const size_t whole = d / kGaussianGroup;
  float tail[kGaussianGroup] = {};
  if (whole < groups)
    std::memcpy(tail, h + whole * kGaussianGroup, 4 * (d - whole * kGaussianGroup));
  for (size_t r = 0; r < m; ++r) {
    const uint64_t rs = RowStream(block_stream, r);
    const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(rs >> 32));
    __m256i pre0 = FirstPre8(rs, 0), pre1 = FirstPre8(rs, 1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (size_t g = 0; g < groups; ++g, pre0 = NextPre8(pre0), pre1 = NextPre8(pre1)) {
      __m256 z[4];
      GroupRegsAvx2(pre0, pre1, hi, z);
      // A partial last group reads zeros past d (adding +0 leaves a lane sum as it is, as the
      // scalar reference's skipped terms do: no lane sum is ever -0).
      const float* hh = g < whole ? h + kGaussianGroup * g : tail;
      for (int k = 0; k < 4; ++k) {
        acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(z[k], _mm256_loadu_ps(hh + 8 * k)));
      }
    }
    // fold: l + 16, l + 8, l + 4, l + 2, l + 1
    const __m256 a16 = _mm256_add_ps(acc[0], acc[2]);
    const __m256 b16 = _mm256_add_ps(acc[1], acc[3]);
    const __m256 x8 = _mm256_add_ps(a16, b16);
    __m128 x4 = _mm_add_ps(_mm256_castps256_ps128(x8), _mm256_extractf128_ps(x8, 1));
    __m128 x2 = _mm_add_ps(x4, _mm_movehl_ps(x4, x4));
    __m128 x1 = _mm_add_ss(x2, _mm_shuffle_ps(x2, x2, 1));
    p[r] = _mm_cvtss_f32(x1);
  }
}

BP_TARGET_AVX2 void ReconstructAvx2(uint64_t block_stream, const float* q, size_t d, size_t m,
                                    float* out) {
  const size_t groups = (d + kGaussianGroup - 1) / kGaussianGroup;
  const size_t whole = d / kGaussianGroup;
  const size_t left = d - whole * kGaussianGroup;
  float tail[kGaussianGroup] = {};
  for (size_t r = 0; r < m; ++r) {
    const uint64_t rs = RowStream(block_stream, r);
    const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(rs >> 32));
    __m256i pre0 = FirstPre8(rs, 0), pre1 = FirstPre8(rs, 1);
    const __m256 qr = _mm256_set1_ps(q[r]);
    for (size_t g = 0; g < groups; ++g, pre0 = NextPre8(pre0), pre1 = NextPre8(pre1)) {
      __m256 z[4];
      GroupRegsAvx2(pre0, pre1, hi, z);
      float* o = g < whole ? out + kGaussianGroup * g : tail;
      for (int k = 0; k < 4; ++k) {
        const __m256 v = _mm256_mul_ps(qr, z[k]);
        _mm256_storeu_ps(o + 8 * k, r == 0 ? v : _mm256_add_ps(_mm256_loadu_ps(o + 8 * k), v));
      }
    }
  }
  if (left > 0) std::memcpy(out + whole * kGaussianGroup, tail, 4 * left);
}

BP_TARGET_AVX2 void FillAvx2(uint64_t stream, uint32_t first, size_t count, float* out) {
  FillWith(stream, first, count, out, &GroupAvx2);
}

BP_TARGET_AVX512 inline __mmask16 TailMask(size_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
}

// Four rows at once (their generators interleave), folded together: the same additions per
// row as the one-row fold below, in the same order.
BP_TARGET_AVX512 void Project4Avx512(uint64_t block_stream, size_t r0, const float* h, size_t d,
                                     float* p) {
  const size_t whole = d / kGaussianGroup;
  const size_t left = d - whole * kGaussianGroup;
  __m512i hi[4], pre[4];
  __m512 acc0[4], acc1[4];
  for (int k = 0; k < 4; ++k) {
    const uint64_t rs = RowStream(block_stream, r0 + k);
    hi[k] = HiOf(rs);
    pre[k] = FirstPre(rs, 0);
    acc0[k] = _mm512_setzero_ps();
    acc1[k] = _mm512_setzero_ps();
  }
  for (size_t g = 0; g < whole; ++g) {
    const __m512 h0 = _mm512_loadu_ps(h + 32 * g);
    const __m512 h1 = _mm512_loadu_ps(h + 32 * g + 16);
    for (int k = 0; k < 4; ++k) {
      __m512 zc, zs;
      PairsAvx512(pre[k], hi[k], &zc, &zs);
      pre[k] = NextPre(pre[k]);
      acc0[k] = _mm512_add_ps(acc0[k], _mm512_mul_ps(zc, h0));
      acc1[k] = _mm512_add_ps(acc1[k], _mm512_mul_ps(zs, h1));
    }
  }
  if (left > 0) {
    const float* hh = h + whole * kGaussianGroup;
    const __m512 h0 = _mm512_maskz_loadu_ps(TailMask(left), hh);
    const __m512 h1 =
        left > 16 ? _mm512_maskz_loadu_ps(TailMask(left - 16), hh + 16) : _mm512_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      __m512 zc, zs;
      PairsAvx512(pre[k], hi[k], &zc, &zs);
      acc0[k] = _mm512_add_ps(acc0[k], _mm512_mul_ps(zc, h0));
      if (left > 16) acc1[k] = _mm512_add_ps(acc1[k], _mm512_mul_ps(zs, h1));
    }
  }
  // l + 16 per row; then l + 8: 128-bit chunks (0, 1) + (2, 3) of two rows at once
  const __m512 a = _mm512_add_ps(acc0[0], acc1[0]), b = _mm512_add_ps(acc0[1], acc1[1]);
  const __m512 c = _mm512_add_ps(acc0[2], acc1[2]), e = _mm512_add_ps(acc0[3], acc1[3]);
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 ce = _mm512_add_ps(_mm512_shuffle_f32x4(c, e, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, e, _MM_SHUFFLE(3, 2, 3, 2)));
  // l + 4: chunk k of the result holds row k's four lanes
  const __m512 x4 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, ce, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(ab, ce, _MM_SHUFFLE(3, 1, 3, 1)));
  // l + 2, l + 1 within each chunk
  const __m512 x2 = _mm512_add_ps(x4, _mm512_shuffle_ps(x4, x4, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 x1 = _mm512_add_ps(x2, _mm512_shuffle_ps(x2, x2, _MM_SHUFFLE(1, 1, 1, 1)));
  const __m512 sums =
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), x1);
  _mm_storeu_ps(p + r0, _mm512_castps512_ps128(sums));
}

BP_TARGET_AVX512 void ProjectAvx512(uint64_t block_stream, const float* h, size_t d, size_t m,
                                    float* p) {
  const size_t whole = d / kGaussianGroup;
  const size_t left = d - whole * kGaussianGroup;
  size_t r4 = 0;
  for (; r4 + 4 <= m; r4 += 4) Project4Avx512(block_stream, r4, h, d, p);
  for (size_t r = r4; r < m; ++r) {
    const uint64_t rs = RowStream(block_stream, r);
    const __m512i hi = HiOf(rs);
    __m512i pre = FirstPre(rs, 0);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (size_t g = 0; g < whole; ++g, pre = NextPre(pre)) {
      __m512 zc, zs;
      PairsAvx512(pre, hi, &zc, &zs);
      acc0 = _mm512_add_ps(acc0, _mm512_mul_ps(zc, _mm512_loadu_ps(h + 32 * g)));
      acc1 = _mm512_add_ps(acc1, _mm512_mul_ps(zs, _mm512_loadu_ps(h + 32 * g + 16)));
    }
    if (left > 0) {
      __m512 zc, zs;
      PairsAvx512(pre, hi, &zc, &zs);
      const float* hh = h + whole * kGaussianGroup;
      acc0 = _mm512_add_ps(acc0, _mm512_mul_ps(zc, _mm512_maskz_loadu_ps(TailMask(left), hh)));
      if (left > 16) {
        acc1 = _mm512_add_ps(
            acc1, _mm512_mul_ps(zs, _mm512_maskz_loadu_ps(TailMask(left - 16), hh + 16)));
      }
    }
    // fold: l + 16, l + 8, l + 4, l + 2, l + 1
    const __m512 acc = _mm512_add_ps(acc0, acc1);
    __m256 x8 = _mm256_add_ps(_mm512_castps512_ps256(acc),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
    __m128 x4 = _mm_add_ps(_mm256_castps256_ps128(x8), _mm256_extractf128_ps(x8, 1));
    __m128 x2 = _mm_add_ps(x4, _mm_movehl_ps(x4, x4));
    __m128 x1 = _mm_add_ss(x2, _mm_shuffle_ps(x2, x2, 1));
    p[r] = _mm_cvtss_f32(x1);
  }
}

// Rows r0..r0+k-1 (k <= 4) added to out, generated together and added in row order per
// element; r0 == 0 starts the sums with row 0's product.
BP_TARGET_AVX512 void ReconstructRowsAvx512(uint64_t block_stream, size_t r0, int k, const float* q,
                                            size_t d, float* out) {
  const size_t whole = d / kGaussianGroup;
  const size_t left = d - whole * kGaussianGroup;
  __m512i hi[4], pre[4];
  __m512 qr[4];
  for (int j = 0; j < k; ++j) {
    const uint64_t rs = RowStream(block_stream, r0 + j);
    hi[j] = HiOf(rs);
    pre[j] = FirstPre(rs, 0);
    qr[j] = _mm512_set1_ps(q[r0 + j]);
  }
  const size_t groups = whole + (left > 0 ? 1 : 0);
  const __mmask16 k0 = TailMask(left);
  const __mmask16 k1 = left > 16 ? TailMask(left - 16) : __mmask16(0);
  for (size_t g = 0; g < groups; ++g) {
    float* o = out + 32 * g;
    const bool full = g < whole;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    if (r0 > 0) {
      s0 = full ? _mm512_loadu_ps(o) : _mm512_maskz_loadu_ps(k0, o);
      s1 = full ? _mm512_loadu_ps(o + 16) : _mm512_maskz_loadu_ps(k1, o + 16);
    }
    for (int j = 0; j < k; ++j) {
      __m512 zc, zs;
      PairsAvx512(pre[j], hi[j], &zc, &zs);
      pre[j] = NextPre(pre[j]);
      const __m512 pc = _mm512_mul_ps(qr[j], zc), ps = _mm512_mul_ps(qr[j], zs);
      if (r0 == 0 && j == 0) {
        s0 = pc;
        s1 = ps;
      } else {
        s0 = _mm512_add_ps(s0, pc);
        s1 = _mm512_add_ps(s1, ps);
      }
    }
    if (full) {
      _mm512_storeu_ps(o, s0);
      _mm512_storeu_ps(o + 16, s1);
    } else {
      _mm512_mask_storeu_ps(o, k0, s0);
      _mm512_mask_storeu_ps(o + 16, k1, s1);
    }
  }
}

BP_TARGET_AVX512 void ReconstructAvx512(uint64_t block_stream, const float* q, size_t d, size_t m,
                                        float* out) {
  for (size_t r = 0; r < m; r += 4) {
    ReconstructRowsAvx512(block_stream, r, static_cast<int>(m - r < 4 ? m - r : 4), q, d, out);
  }
}

// ---- element loops of the error state (plain loops the compiler vectorises per level) ----

constexpr size_t kLanes = 16;

template <int kDummy = 0>
inline double AddAndSquareBody(const float* g, const float* e, float* h, size_t d) {
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const float v = g[i + l];
      acc[l] = acc[l] + v * v;
      h[i + l] = v + e[i + l];
    }
  }
  double sum = 0;
  for (; i < d; ++i) {
    sum += static_cast<double>(g[i]) * g[i];
    h[i] = g[i] + e[i];
  }
  for (size_t l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

template <int kDummy = 0>
inline void MovingAverageBody(float* e, const float* h, size_t d, float a_old, float a_new) {
  for (size_t i = 0; i < d; ++i) e[i] = a_old * e[i] + a_new * h[i];
}

template <int kDummy = 0>
inline double SubtractScaledBody(float* e, const float* ht, size_t d, float a_new, bool* finite) {
  float acc[kLanes] = {};
  float bad[kLanes] = {};  // v - v: 0 for finite v, NaN otherwise
  size_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const float v = e[i + l] - a_new * ht[i + l];
      e[i + l] = v;
      acc[l] = acc[l] + v * v;
      bad[l] = bad[l] + (v - v);
    }
  }
  double sum = 0;
  float tail_bad = 0;
  for (; i < d; ++i) {
    const float v = e[i] - a_new * ht[i];
    e[i] = v;
    sum += static_cast<double>(v) * v;
    tail_bad = tail_bad + (v - v);
  }
  for (size_t l = 0; l < kLanes; ++l) {
    sum += acc[l];
    tail_bad = tail_bad + bad[l];
  }
  if (tail_bad != 0.0f || tail_bad != tail_bad) *finite = false;
  return sum;
}

BP_TARGET_AVX2 double AddAndSquareAvx2(const float* g, const float* e, float* h, size_t d) {
  return AddAndSquareBody(g, e, h, d);
}
BP_TARGET_AVX2 void MovingAverageAvx2(float* e, const float* h, size_t d, float a_old,
                                      float a_new) {
  MovingAverageBody(e, h, d, a_old, a_new);
}
BP_TARGET_AVX2 double SubtractScaledAvx2(float* e, const float* ht, size_t d, float a_new,
                                         bool* finite) {
  return SubtractScaledBody(e, ht, d, a_new, finite);
}

BP_TARGET_AVX512 double AddAndSquareAvx512(const float* g, const float* e, float* h, size_t d) {
  return AddAndSquareBody(g, e, h, d);
}
BP_TARGET_AVX512 void MovingAverageAvx512(float* e, const float* h, size_t d, float a_old,
                                          float a_new) {
  MovingAverageBody(e, h, d, a_old, a_new);
}
BP_TARGET_AVX512 double SubtractScaledAvx512(float* e, const float* ht, size_t d, float a_new,
                                             bool* finite) {
  return SubtractScaledBody(e, ht, d, a_new, finite);
}

}  // namespace

double AddAndSquare(const float* g, const float* e, float* h, size_t d, IsaLevel isa) {
  if (isa == IsaLevel::kAvx512) return AddAndSquareAvx512(g, e, h, d);
  if (isa == IsaLevel::kAvx2) return AddAndSquareAvx2(g, e, h, d);
  return AddAndSquareBody(g, e, h, d);
}

void MovingAverage(float* e, const float* h, size_t d, float a_old, float a_new, IsaLevel isa) {
  if (isa == IsaLevel::kAvx512) {
    MovingAverageAvx512(e, h, d, a_old, a_new);
  } else if (isa == IsaLevel::kAvx2) {
    MovingAverageAvx2(e, h, d, a_old, a_new);
  } else {
    MovingAverageBody(e, h, d, a_old, a_new);
  }
}

double SubtractScaled(float* e, const float* ht, size_t d, float a_new, bool* finite,
                      IsaLevel isa) {
  if (isa == IsaLevel::kAvx512) return SubtractScaledAvx512(e, ht, d, a_new, finite);
  if (isa == IsaLevel::kAvx2) return SubtractScaledAvx2(e, ht, d, a_new, finite);
  return SubtractScaledBody(e, ht, d, a_new, finite);
}

void GaussianPair(uint32_t x, float* cos_half, float* sin_half) {
  PairScalar(x, cos_half, sin_half);
}

float GaussianAt(uint64_t stream, uint32_t i) {
  float c, s;
  PairScalar(LaneHash(stream, i / kGaussianGroup, i % 16), &c, &s);
  return (i / 16) % 2 == 0 ? c : s;
}

void FillGaussians(uint64_t stream, uint32_t first, size_t count, float* out, IsaLevel isa) {
  if (isa == IsaLevel::kAvx512) {
    FillAvx512(stream, first, count, out);
    return;
  }
  if (isa == IsaLevel::kAvx2) {
    FillAvx2(stream, first, count, out);
    return;
  }
  FillWith(stream, first, count, out, &GroupScalar);
}

}  // namespace bitpush::compressors::separate

namespace bitpush::compressors::separate {

void ProjectBlock(uint64_t block_stream, const float* h, size_t d, size_t m, float* p,
                  IsaLevel isa) {
  if (isa == IsaLevel::kAvx512) {
    ProjectAvx512(block_stream, h, d, m, p);
  } else if (isa == IsaLevel::kAvx2) {
    ProjectAvx2(block_stream, h, d, m, p);
  } else {
    ProjectScalar(block_stream, h, d, m, p);
  }
}

void ReconstructBlock(uint64_t block_stream, const float* q, size_t d, size_t m, float* out,
                      IsaLevel isa) {
  if (isa == IsaLevel::kAvx512) {
    ReconstructAvx512(block_stream, q, d, m, out);
  } else if (isa == IsaLevel::kAvx2) {
    ReconstructAvx2(block_stream, q, d, m, out);
  } else {
    ReconstructScalar(block_stream, q, d, m, out);
  }
}

}  // namespace bitpush::compressors::separate
