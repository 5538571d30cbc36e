#include "compressors/randomk/randomk.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/counter_rng.h"
#include "common/logging.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"

namespace bitpush::compressors {
namespace {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;  // |x| bits >= this: inf or NaN

// ---- finiteness scan: max over |bits|, compared with the inf pattern once at the end ---------

bool AllFiniteScalar(const float* x, size_t n) {
  uint32_t acc = 0;
  for (size_t i = 0; i < n; ++i) acc = std::max(acc, FloatBits(x[i]) & kAbsMask);
  return acc < kInfBits;
}

bool AddAllFiniteScalar(const float* g, float* e, size_t n) {
  uint32_t acc = 0;
  for (size_t i = 0; i < n; ++i) {
    const float q = g[i] + e[i];
    e[i] = q;
    acc = std::max(acc, FloatBits(q) & kAbsMask);
  }
  return acc < kInfBits;
}

BP_TARGET_AVX2 uint32_t HorizontalMaxAvx2(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

BP_TARGET_AVX2 bool AllFiniteAvx2(const float* x, size_t n) {
  const __m256i abs = _mm256_set1_epi32(static_cast<int32_t>(kAbsMask));
  __m256i a0 = _mm256_setzero_si256();
  __m256i a1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_max_epu32(
        a0, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs));
    a1 = _mm256_max_epu32(
        a1, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs));
  }
  return HorizontalMaxAvx2(_mm256_max_epu32(a0, a1)) < kInfBits && AllFiniteScalar(x + i, n - i);
}

BP_TARGET_AVX2 bool AddAllFiniteAvx2(const float* g, float* e, size_t n) {
  const __m256i abs = _mm256_set1_epi32(static_cast<int32_t>(kAbsMask));
  __m256i a0 = _mm256_setzero_si256();
  __m256i a1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 q0 = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(e + i));
    const __m256 q1 = _mm256_add_ps(_mm256_loadu_ps(g + i + 8), _mm256_loadu_ps(e + i + 8));
    _mm256_storeu_ps(e + i, q0);
    _mm256_storeu_ps(e + i + 8, q1);
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(q0), abs));
    a1 = _mm256_max_epu32(a1, _mm256_and_si256(_mm256_castps_si256(q1), abs));
  }
  // The scalar tail must run (it finishes the add) whatever the vector part found.
  const bool tail = AddAllFiniteScalar(g + i, e + i, n - i);
  return HorizontalMaxAvx2(_mm256_max_epu32(a0, a1)) < kInfBits && tail;
}

// AVX-512: OR together the "|bits| >= inf" masks (compare straight into a mask register).
BP_TARGET_AVX512 inline __mmask16 NonFiniteAvx512(__mmask16 lanes, __m512i v) {
  return _mm512_mask_cmpge_epu32_mask(
      lanes, _mm512_and_si512(v, _mm512_set1_epi32(static_cast<int32_t>(kAbsMask))),
      _mm512_set1_epi32(static_cast<int32_t>(kInfBits)));
}

BP_TARGET_AVX512 bool AllFiniteAvx512(const float* x, size_t n) {
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    bad |= NonFiniteAvx512(0xFFFF, _mm512_loadu_si512(x + i)) |
           NonFiniteAvx512(0xFFFF, _mm512_loadu_si512(x + i + 16));
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    bad |= NonFiniteAvx512(m, _mm512_maskz_loadu_epi32(m, x + i));
  }
  return bad == 0;
}

BP_TARGET_AVX512 bool AddAllFiniteAvx512(const float* g, float* e, size_t n) {
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 q0 = _mm512_add_ps(_mm512_loadu_ps(g + i), _mm512_loadu_ps(e + i));
    const __m512 q1 = _mm512_add_ps(_mm512_loadu_ps(g + i + 16), _mm512_loadu_ps(e + i + 16));
    _mm512_storeu_ps(e + i, q0);
    _mm512_storeu_ps(e + i + 16, q1);
    bad |= NonFiniteAvx512(0xFFFF, _mm512_castps_si512(q0)) |
           NonFiniteAvx512(0xFFFF, _mm512_castps_si512(q1));
  }
  for (; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 q =
        _mm512_add_ps(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, e + i));
    _mm512_mask_storeu_ps(e + i, m, q);
    bad |= NonFiniteAvx512(m, _mm512_castps_si512(q));
  }
  return bad == 0;
}

}  // namespace

bool RandomkAllFinite(const float* x, size_t n, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return AllFiniteAvx512(x, n);
    case IsaLevel::kAvx2: return AllFiniteAvx2(x, n);
    case IsaLevel::kScalar: break;
  }
  return AllFiniteScalar(x, n);
}

bool RandomkAddAllFinite(const float* g, float* e, size_t n, IsaLevel isa) {
  switch (isa) {
    case IsaLevel::kAvx512: return AddAllFiniteAvx512(g, e, n);
    case IsaLevel::kAvx2: return AddAllFiniteAvx2(g, e, n);
    case IsaLevel::kScalar: break;
  }
  return AddAllFiniteScalar(g, e, n);
}

RandomkCompressor::RandomkCompressor(const v1::RandomkParams& params, IsaLevel isa)
    : CompressorBase(v1::COMPRESSOR_ID_RANDOMK, isa),
      size_(SparseSize::FromParams(params)),
      unbiased_(params.unbiased()),
      seed_(params.seed()) {}

size_t RandomkCompressor::MaxBodyBytes(size_t n, DType dtype) const {
  return SparseBodyBytes(size_.KeepCount(n), dtype);
}

const uint32_t* RandomkCompressor::Sample(const CompressContext& ctx, size_t n, size_t k) {
  BP_CHECK(n <= kMaxSparseElements, "randomk: {} elements exceed the int32 index range", n);
  const size_t words = (n + 63) / 64;
  bitmap_.resize(words);
  bitmap_.zero();
  uint64_t* bits = bitmap_.data();
  // Floyd: for j = n-k .. n-1 draw r in [0, j]; take r, or j if r is already taken. Every
  // k-subset comes out with the same probability, in exactly k draws.
  const uint64_t stream = StreamKey(seed_, ctx.worker, ctx.key, ctx.round);
  const uint64_t first = n - k;
  for (uint64_t j = first; j < n; ++j) {
    const uint64_t r = UniformBelow(CounterRandom64(stream, j - first), j + 1);
    const uint64_t bit = uint64_t{1} << (r & 63);
    if (bits[r >> 6] & bit) {
      bits[j >> 6] |= uint64_t{1} << (j & 63);
    } else {
      bits[r >> 6] |= bit;
    }
  }
  indices_.resize(k);
  uint32_t* out = indices_.data();
  size_t c = 0;
  for (size_t w = 0; w < words; ++w) {
    uint64_t b = bits[w];
    while (b) {
      out[c++] = static_cast<uint32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(b)));
      b &= b - 1;
    }
  }
  BP_DCHECK(c == k);
  return out;
}

size_t RandomkCompressor::Encode(float* q, size_t n, DType dtype, const CompressContext& ctx,
                                 bool all_finite, bool residual, uint8_t* body) {
  NoteInputCheck(!all_finite);  // the engine's check: every q was read for all_finite
  const size_t k = size_.KeepCount(n);
  const uint32_t* idx = k ? Sample(ctx, n, k) : nullptr;
  uint8_t* values = WriteSparseHead(idx, k, body);
  if (!all_finite) {
    // Every kept value NaN, so the aggregate carries it; and no residual survives this round
    // (it would hold the non-finite q forever).
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t j = 0; j < k; ++j) StoreSparseValue(nan, dtype, j, values);
    if (residual && n) std::memset(q, 0, n * sizeof(float));
    return SparseBodyBytes(k, dtype);
  }
  const float scale = unbiased_ && k ? static_cast<float>(static_cast<double>(n) / k) : 1.0f;
  for (size_t j = 0; j < k; ++j) {
    const float x = q[idx[j]];
    const float decoded = StoreSparseValue(unbiased_ ? x * scale : x, dtype, j, values);
    // e = q - C(q) at the kept index; a stored value that overflowed (n/k scaling, fp16 range)
    // leaves no residual instead of an infinite one.
    if (residual) q[idx[j]] = std::isfinite(decoded) ? x - decoded : 0.0f;
  }
  return SparseBodyBytes(k, dtype);
}

size_t RandomkCompressor::EncodeBody(const float* x, size_t n, DType dtype,
                                     const CompressContext& ctx, uint8_t* body) {
  const bool finite = RandomkAllFinite(x, n, isa());
  // Encode only writes q when residual == true.
  return Encode(const_cast<float*>(x), n, dtype, ctx, finite, false, body);
}

size_t RandomkCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType dtype,
                                                 const CompressContext& ctx, uint8_t* body) {
  const bool finite = RandomkAllFinite(q, n, isa());
  return Encode(q, n, dtype, ctx, finite, true, body);
}

size_t RandomkCompressor::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                    const CompressContext& ctx, uint8_t* body) {
  const bool finite = RandomkAddAllFinite(g, e, n, isa());  // e = q = g + e
  return Encode(e, n, DType::kFloat32, ctx, finite, true, body);
}

Status RandomkCompressor::DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) {
  return DecodeSparseBody("randomk", body, n, dtype, out, add);
}

namespace {
std::unique_ptr<Compressor> NewRandomk(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<RandomkCompressor>(config.randomk(), isa);
}
}  // namespace

// The kernel half of randomk (compressors/method.h; spec half in randomk_spec.cc).
const MethodKernels kRandomkMethodKernels = {&kRandomkMethodSpec, &NewRandomk, &NewResidualState};

}  // namespace bitpush::compressors
