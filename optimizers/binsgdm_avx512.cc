// The AVX-512 half of BinSGDM's kernels (optimizers/binsgdm_kernels.h): 16 elements per vector,
// the main loops two full vectors per step with plain loads and stores (two independent
// divisions and hashes in flight; with masked loads on every vector and one vector per step the
// worker step ran at half the speed on an AMD Zen 5), masked loads and stores for the tail only;
// CounterRandom32Lite evaluated 16 lanes at once, the decisions stored as bytes of the bit vector.
// Each element goes through binsgdm.h's fp32 operations in the scalar order, with separate multiply
// and add instructions (no FMA), so the results are bit for bit the scalar ones. Compiled with
// per-function target attributes, never -m flags.
#include <immintrin.h>

#include <cstring>

#include "common/counter_rng.h"
#include "common/cpu_features.h"
#include "optimizers/binsgdm_kernels.h"

namespace bitpush::optimizers::internal {
namespace {

struct Rng512 {
  __m512i lanes;  // lane * kGolden32 + low word of the stream, lane = 0..15
  __m512i hi, c1, c2;
};

BP_TARGET_AVX512 inline Rng512 MakeRng(uint64_t stream) {
  Rng512 r;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  r.lanes =
      _mm512_add_epi32(_mm512_mullo_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(kGolden32))),
                       _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(stream))));
  r.hi = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(stream >> 32)));
  r.c1 = _mm512_set1_epi32(static_cast<int32_t>(0x85EBCA6Bu));
  r.c2 = _mm512_set1_epi32(static_cast<int32_t>(0xC2B2AE35u));
  return r;
}

BP_TARGET_AVX512 inline __m512i Fmix(const Rng512& r, __m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, r.c1);
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, r.c2);
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

// BinsgdmBit for elements i .. i + 15: bit j set iff element i + j is +1. CounterRandom32Lite of
// index i + j is Fmix32(((i + j) * golden + lo) ^ hi); (i + j) * golden + lo = i * golden +
// (j * golden + lo) mod 2^32, so the per-lane part is precomputed (Rng512::lanes).
BP_TARGET_AVX512 inline __mmask16 Bits(const Rng512& r, size_t i, __m512 y) {
  const uint32_t base = static_cast<uint32_t>(i) * kGolden32;
  const __m512i h =
      Fmix(r, _mm512_xor_si512(
                  _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(base)), r.lanes), r.hi));
  const __m512 u = _mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8));
  const __m512 t = _mm512_mul_ps(_mm512_add_ps(y, _mm512_set1_ps(1.0f)), _mm512_set1_ps(0x1p23f));
  return _mm512_cmp_ps_mask(u, t, _CMP_LT_OQ);
}

// Lanes where v is finite (v - v == 0).
BP_TARGET_AVX512 inline __mmask16 FiniteMask(__m512 v) {
  return _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ);
}

// e = y - u, u = +1 where the bit is set, else -1.
BP_TARGET_AVX512 inline __m512 Residual(__m512 y, __mmask16 bits) {
  return _mm512_sub_ps(y, _mm512_mask_blend_ps(bits, _mm512_set1_ps(-1.0f), _mm512_set1_ps(1.0f)));
}

inline __mmask16 TailMask(size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// Stores the 16 decisions of elements i .. i + 15 (only the bytes that hold elements < n).
inline void StoreBits(uint8_t* bits, size_t i, size_t left, __mmask16 k) {
  const uint16_t v = static_cast<uint16_t>(k);
  if (left >= 16) {
    std::memcpy(bits + i / 8, &v, 2);
  } else {
    const uint8_t b0 = static_cast<uint8_t>(v);
    bits[i / 8] = b0;
    if (left > 8) bits[i / 8 + 1] = static_cast<uint8_t>(v >> 8);
  }
}

// The 16 bits of elements i .. i + 15 of a pushed vector (padding bits are 0).
inline __mmask16 LoadBits(const uint8_t* bits, size_t i, size_t left) {
  uint16_t v = 0;
  if (left > 8) {
    std::memcpy(&v, bits + i / 8, 2);
  } else {
    v = bits[i / 8];
  }
  return static_cast<__mmask16>(v);
}

template <bool kX, bool kE>
// Returns the 16 decisions in the low half and the lanes whose y was not finite in the high
// half (a value, not an out-parameter: the bit stores may alias memory, registers do not).
BP_TARGET_AVX512 inline uint32_t Binarize16(const Rng512& r, size_t i, __mmask16 mask,
                                            const float* x, float* e) {
  __m512 y;
  if (kX && kE) {
    y = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, x + i), _mm512_maskz_loadu_ps(mask, e + i));
  } else if (kX) {
    y = _mm512_maskz_loadu_ps(mask, x + i);
  } else {
    y = _mm512_maskz_loadu_ps(mask, e + i);
  }
  const __mmask16 finite = FiniteMask(y);
  y = _mm512_maskz_mov_ps(finite, y);
  const __mmask16 k = Bits(r, i, y) & mask;
  if (kE) _mm512_mask_storeu_ps(e + i, mask, Residual(y, k));
  return uint32_t{k} | (uint32_t{static_cast<__mmask16>(~finite & mask)} << 16);
}

template <bool kX, bool kE>
BP_TARGET_AVX512 bool Binarize(uint64_t stream, const float* x, float* e, size_t n, uint8_t* bits) {
  const Rng512 r = MakeRng(stream);
  uint32_t bad = 0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {  // full vectors, plain loads; two halves in flight
    const uint32_t lo = Binarize16<kX, kE>(r, i, 0xFFFF, x, e);
    const uint32_t hi = Binarize16<kX, kE>(r, i + 16, 0xFFFF, x, e);
    bad |= lo | hi;
    const uint32_t word = (lo & 0xFFFF) | (hi << 16);
    std::memcpy(bits + i / 8, &word, 4);
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const uint32_t v = Binarize16<kX, kE>(r, i, TailMask(left), x, e);
    bad |= v;
    StoreBits(bits, i, left, static_cast<__mmask16>(v));
  }
  return (bad >> 16) == 0;
}

}  // namespace

namespace {

struct StepConsts {
  __m512 beta, omb, eps;
};

// The worker step of elements i .. i + 15 (lanes outside `mask` read as zeros, are not stored,
// and push bit 0); returns the 16 decisions in the low half and the restarted lanes in the
// high half.
BP_TARGET_AVX512 inline uint32_t Step16(const StepConsts& c, const Rng512& r, size_t i,
                                        __mmask16 mask, const float* g, float* m, float* b,
                                        float* e) {
  const __m512 gi = _mm512_maskz_loadu_ps(mask, g + i);
  __m512 mi = _mm512_add_ps(_mm512_mul_ps(c.beta, _mm512_maskz_loadu_ps(mask, m + i)),
                            _mm512_mul_ps(c.omb, gi));
  __m512 bi = _mm512_add_ps(_mm512_mul_ps(c.beta, _mm512_maskz_loadu_ps(mask, b + i)),
                            _mm512_mul_ps(c.omb, _mm512_abs_ps(gi)));
  // Masked-off lanes divide 0 by eps: no exception for them.
  __m512 y = _mm512_add_ps(_mm512_div_ps(mi, _mm512_add_ps(bi, c.eps)),
                           _mm512_maskz_loadu_ps(mask, e + i));
  // Finite b and y, else restart (binsgdm.h): (b - b) + (y - y) is 0 exactly when both are.
  const __mmask16 ok = _mm512_cmp_ps_mask(_mm512_add_ps(_mm512_sub_ps(bi, bi), _mm512_sub_ps(y, y)),
                                          _mm512_setzero_ps(), _CMP_EQ_OQ);
  if (ok != 0xFFFF) {
    mi = _mm512_maskz_mov_ps(ok, mi);
    bi = _mm512_maskz_mov_ps(ok, bi);
    y = _mm512_maskz_mov_ps(ok, y);
  }
  const __mmask16 k = Bits(r, i, y) & mask;
  _mm512_mask_storeu_ps(m + i, mask, mi);
  _mm512_mask_storeu_ps(b + i, mask, bi);
  _mm512_mask_storeu_ps(e + i, mask, Residual(y, k));
  return uint32_t{k} | (uint32_t{static_cast<__mmask16>(~ok & mask)} << 16);
}

}  // namespace

BP_TARGET_AVX512 bool BinsgdmWorkerStepAvx512(const BinsgdmHyper& h, uint64_t stream,
                                              const float* g, float* m, float* b, float* e,
                                              size_t n, uint8_t* bits) {
  const Rng512 r = MakeRng(stream);
  const StepConsts c{_mm512_set1_ps(h.beta), _mm512_set1_ps(h.one_minus_beta),
                     _mm512_set1_ps(h.eps)};
  uint32_t restarted = 0;
  size_t i = 0;
  // 32 elements per step: two independent halves keep more divisions and hashes in flight.
  for (; i + 32 <= n; i += 32) {
    const uint32_t lo = Step16(c, r, i, 0xFFFF, g, m, b, e);
    const uint32_t hi = Step16(c, r, i + 16, 0xFFFF, g, m, b, e);
    restarted |= lo | hi;
    const uint32_t word = (lo & 0xFFFF) | (hi << 16);
    std::memcpy(bits + i / 8, &word, 4);
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const uint32_t v = Step16(c, r, i, TailMask(left), g, m, b, e);
    restarted |= v;
    StoreBits(bits, i, left, static_cast<__mmask16>(v));
  }
  return (restarted >> 16) == 0;
}

BP_TARGET_AVX512 bool BinsgdmBinarizeAvx512(uint64_t stream, const float* x, float* e, size_t n,
                                            uint8_t* bits) {
  if (x != nullptr && e != nullptr) return Binarize<true, true>(stream, x, e, n, bits);
  if (x != nullptr) return Binarize<true, false>(stream, x, e, n, bits);
  return Binarize<false, true>(stream, x, e, n, bits);
}

BP_TARGET_AVX512 void BinsgdmServerRoundAvx512(const uint8_t* const* pushes, size_t k, size_t n,
                                               float scale, float* e, uint64_t stream,
                                               uint8_t* bits) {
  const Rng512 r = MakeRng(stream);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i count = _mm512_set1_epi32(static_cast<int32_t>(k));
  const __m512 s = _mm512_set1_ps(scale);
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 mask = TailMask(left);
    __m512i c = _mm512_setzero_si512();
    for (size_t w = 0; w < k; ++w)
      c = _mm512_mask_add_epi32(c, LoadBits(pushes[w], i, left), c, one);
    // a = float(2c - k) * scale; y = a + e
    const __m512 a =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_slli_epi32(c, 1), count)), s);
    __m512 y = e == nullptr ? a : _mm512_add_ps(a, _mm512_maskz_loadu_ps(mask, e + i));
    y = _mm512_maskz_mov_ps(FiniteMask(y), y);
    const __mmask16 kb = Bits(r, i, y) & mask;
    if (e != nullptr) _mm512_mask_storeu_ps(e + i, mask, Residual(y, kb));
    StoreBits(bits, i, left, kb);
  }
}

}  // namespace bitpush::optimizers::internal
