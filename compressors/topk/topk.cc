#include "compressors/topk/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "common/counter_rng.h"
#include "common/logging.h"
#include "compressors/error_feedback.h"
#include "compressors/method.h"
#include "compressors/topk/topk_kernels.h"

namespace bitpush::compressors {
namespace {

// Tensors up to this size skip the sample: every element is a candidate.
constexpr size_t kFullSelectMax = 2048;
// Sample: up to kMaxSampleBlocks blocks of kSampleBlockLen contiguous elements (64 bytes),
// one block at a fixed pseudo-random offset inside each of that many equal strata.
constexpr size_t kSampleBlockLen = 16;
constexpr size_t kMaxSampleBlocks = 256;  // 4096 sampled elements
// The filter runs over chunks of this many elements, so the candidate buffer only has to
// grow by a chunk at a time (it stays near the candidate count, not n).
constexpr size_t kFilterChunk = 16384;
constexpr uint64_t kSampleSalt = 0x746F706B53616D70ull;  // "topkSamp"
// Radix step of the k-th key search: buckets by the top 13 of the 31 key bits (1/32 of an
// octave of magnitude each).
constexpr int kBucketShift = 18;
constexpr size_t kBuckets = size_t{1} << (31 - kBucketShift);
// Keys at or above this are +-inf or NaN.
constexpr uint32_t kNonFiniteKey = 0x7F800000u;

}  // namespace

TopkCompressor::TopkCompressor(const v1::TopkParams& params, IsaLevel isa)
    : CompressorBase(v1::COMPRESSOR_ID_TOPK, isa), size_(SparseSize::FromParams(params)) {}

size_t TopkCompressor::MaxBodyBytes(size_t n, DType dtype) const {
  return SparseBodyBytes(size_.KeepCount(n), dtype);
}

void TopkCompressor::SetSampleBlocks(size_t n) {
  if (sample_n_ == n) return;
  // n > kFullSelectMax, so every stratum holds at least 8 blocks' worth of elements.
  const size_t blocks = std::min(kMaxSampleBlocks, n / (8 * kSampleBlockLen));
  sample_blocks_.resize(blocks);
  for (size_t j = 0; j < blocks; ++j) {
    const uint64_t lo = static_cast<uint64_t>(j) * n / blocks;
    const uint64_t hi = static_cast<uint64_t>(j + 1) * n / blocks;
    const uint64_t span = hi - lo - kSampleBlockLen + 1;
    sample_blocks_[j] = static_cast<uint32_t>(lo + UniformBelow(Mix64(kSampleSalt + j), span));
  }
  sample_.resize(blocks * kSampleBlockLen);
  sample_n_ = n;
}

uint32_t TopkCompressor::FirstThreshold(const float* g, const float* data, size_t n, size_t k) {
  if (n <= kFullSelectMax) return 0;
  SetSampleBlocks(n);
  const size_t m = sample_.size();
  // Expected number of sampled elements at or above the k-th key: m * k / n. Aim above it by
  // 25% plus four standard deviations so a second pass is rare, while the candidate count
  // stays a small multiple of k.
  const double mp = static_cast<double>(m) * static_cast<double>(k) / static_cast<double>(n);
  const double r = std::ceil(1.25 * mp + 4.0 * std::sqrt(mp) + 4.0);
  if (r >= static_cast<double>(m)) return 0;
  uint32_t* s = sample_.data();
  for (size_t b = 0; b < sample_blocks_.size(); ++b) {
    const size_t p = sample_blocks_[b];
    uint32_t* dst = s + b * kSampleBlockLen;
    if (g == nullptr) {
      for (size_t i = 0; i < kSampleBlockLen; ++i) dst[i] = TopkKey(data[p + i]);
    } else {  // the same q = g + e that the fused pass forms
      for (size_t i = 0; i < kSampleBlockLen; ++i) dst[i] = TopkKey(g[p + i] + data[p + i]);
    }
  }
  sample_rank_ = static_cast<size_t>(r);
  size_t above = 0;
  return KthLargestKey(sample_.data(), m, sample_rank_, &above);
}

uint32_t TopkCompressor::LowerThreshold(uint32_t t) {
  if (t == 0) return 0;
  // Ranks 4x deeper in the sample until the key drops below t (ties can hold it at t); past
  // the end of the sample, keep everything.
  while (true) {
    sample_rank_ = sample_rank_ * 4 + 16;
    if (sample_rank_ >= sample_.size()) return 0;
    size_t above = 0;
    const uint32_t lower = KthLargestKey(sample_.data(), sample_.size(), sample_rank_, &above);
    if (lower < t) return lower;
  }
}

size_t TopkCompressor::FilterPass(const float* g, float* data, size_t n, uint32_t t, bool fused) {
  size_t count = 0;
  for (size_t begin = 0; begin < n; begin += kFilterChunk) {
    const size_t end = std::min(n, begin + kFilterChunk);
    const size_t need = count + (end - begin) + kTopkFilterSlack;
    if (need > candidates_.size()) {
      const size_t grown = std::max(need, 2 * candidates_.size());
      candidates_.resize(grown);
      candidate_keys_.resize(grown);
    }
    uint32_t* out_index = candidates_.data() + count;
    uint32_t* out_key = candidate_keys_.data() + count;
    count += fused ? TopkAddFilter(g, data, begin, end, t, out_index, out_key, isa())
                   : TopkFilter(data, begin, end, t, out_index, out_key, isa());
  }
  return count;
}

uint32_t TopkCompressor::KthLargestKey(const uint32_t* keys, size_t count, size_t k,
                                       size_t* above) {
  // Radix step: histogram of the top key bits, then walk down from the largest bucket to the
  // one holding the k-th largest key.
  hist_.assign(kBuckets, 0);
  for (size_t j = 0; j < count; ++j) ++hist_[keys[j] >> kBucketShift];
  size_t higher = 0;  // keys in buckets above b
  size_t b = kBuckets - 1;
  while (higher + hist_[b] < k) higher += hist_[b--];  // terminates: the total is >= k
  // The k-th largest is the (k - higher)-th largest inside bucket b: select among those only.
  const size_t in_bucket = hist_[b];
  work_.resize(in_bucket + 1);  // +1: the branch-free copy writes one past the last match
  size_t w = 0;
  for (size_t j = 0; j < count; ++j) {
    work_[w] = keys[j];
    w += (keys[j] >> kBucketShift) == b;
  }
  const size_t r = k - higher;
  std::nth_element(work_.begin(), work_.begin() + (r - 1), work_.begin() + in_bucket,
                   std::greater<uint32_t>());
  const uint32_t kth = work_[r - 1];
  // work_[0..r-1) >= kth and the rest of the bucket <= kth: larger keys are all in front.
  *above = higher + static_cast<size_t>(std::count_if(work_.begin(), work_.begin() + (r - 1),
                                                      [kth](uint32_t key) { return key > kth; }));
  return kth;
}

bool TopkCompressor::NonFiniteCandidate(size_t count) const {
  // The largest key of the tensor is a candidate (every threshold is a key at most that
  // large), and a NaN / inf has the largest keys there are: the input held one iff a candidate
  // does. Reads the candidates' keys only (about k of them).
  const uint32_t* keys = candidate_keys_.data();
  uint32_t top = 0;
  for (size_t j = 0; j < count; ++j) top = std::max(top, keys[j]);
  return top >= kNonFiniteKey;
}

const uint32_t* TopkCompressor::Select(const float* g, float* data, size_t n, size_t k) {
  BP_CHECK(n <= kMaxSparseElements, "topk: {} elements exceed the int32 index range", n);
  // The lowest threshold is 1, not 0: it passes every nonzero element, so a tensor that is
  // mostly zeros (a server residual, ReLU gradients) never makes every element a candidate.
  uint32_t t = std::max<uint32_t>(FirstThreshold(g, data, n, k), 1);
  size_t count = FilterPass(g, data, n, t, g != nullptr);
  last_filter_passes_ = 1;
  nonfinite_left_out_ = false;
  while (count < k) {
    if (t == 1) {  // every nonzero element passed: fewer than k
      NoteInputCheck(NonFiniteCandidate(count));
      last_candidates_ = count;
      return SelectWithZeros(n, k, count);
    }
    t = std::max<uint32_t>(LowerThreshold(t), 1);
    count = FilterPass(nullptr, data, n, t, false);  // data holds q after a fused pass
    ++last_filter_passes_;
  }
  NoteInputCheck(NonFiniteCandidate(count));
  last_candidates_ = count;
  uint32_t* cand = candidates_.data();
  if (count == k) return cand;

  // The exact k-th largest key among the candidates; every element outside them has a key
  // below t, so it is the k-th largest of the tensor.
  const uint32_t* keys = candidate_keys_.data();
  size_t above = 0;
  const uint32_t kth = KthLargestKey(keys, count, k, &above);
  if (kth >= kNonFiniteKey) {
    // Non-finite keys rank first and are all candidates (their keys exceed any t): some are
    // left out iff more than k candidates are non-finite.
    nonfinite_left_out_ = static_cast<size_t>(std::count_if(keys, keys + count, [](uint32_t key) {
                            return key >= kNonFiniteKey;
                          })) > k;
  }
  // Keep, in index order, every key > kth and the first (k - above) keys == kth: ties go to
  // the lowest indices. Compacts in place (out <= j).
  size_t ties_left = k - above;
  size_t out = 0;
  for (size_t j = 0; j < count; ++j) {
    const uint32_t key = keys[j];
    const bool tie = key == kth && ties_left > 0;
    ties_left -= tie;
    cand[out] = cand[j];
    out += (key > kth) | tie;
  }
  BP_DCHECK(out == k);
  return cand;
}

const uint32_t* TopkCompressor::SelectWithZeros(size_t n, size_t k, size_t count) {
  // candidates_[0..count) are the indices of every nonzero element (key >= 1), ascending; the
  // k-th largest key is 0, and ties go to the lowest indices: merge the first k - count zero
  // elements (the indices that are not candidates) into them, in index order.
  const uint32_t* cand = candidates_.data();
  work_.resize(k);
  size_t zeros_left = k - count;
  size_t c = 0;
  size_t out = 0;
  for (size_t i = 0; zeros_left > 0 && i < n; ++i) {  // n - count >= k - count zeros
    if (c < count && cand[c] == i) {
      work_[out++] = cand[c++];
    } else {
      work_[out++] = static_cast<uint32_t>(i);
      --zeros_left;
    }
  }
  std::copy(cand + c, cand + count, work_.begin() + static_cast<std::ptrdiff_t>(out));
  return work_.data();
}

size_t TopkCompressor::EncodeBody(const float* x, size_t n, DType dtype, const CompressContext&,
                                  uint8_t* body) {
  const size_t k = size_.KeepCount(n);
  // Select never writes `data` unless fused (g != nullptr).
  const uint32_t* idx = k ? Select(nullptr, const_cast<float*>(x), n, k) : nullptr;
  uint8_t* values = WriteSparseHead(idx, k, body);
  for (size_t j = 0; j < k; ++j) StoreSparseValue(x[idx[j]], dtype, j, values);
  return SparseBodyBytes(k, dtype);
}

size_t TopkCompressor::EncodeBodyWithFeedback(float* q, size_t n, DType dtype,
                                              const CompressContext&, uint8_t* body) {
  const size_t k = size_.KeepCount(n);
  const uint32_t* idx = k ? Select(nullptr, q, n, k) : nullptr;
  uint8_t* values = WriteSparseHead(idx, k, body);
  for (size_t j = 0; j < k; ++j) {
    const float v = q[idx[j]];
    const float decoded = StoreSparseValue(v, dtype, j, values);
    // fp32: exact, nothing left. fp16 / bf16: the rounding error, unless the stored value is
    // inf or NaN (kept non-finite, or fp16 overflow), which leaves no residual.
    q[idx[j]] = dtype == DType::kFloat32 || !std::isfinite(decoded) ? 0.0f : v - decoded;
  }
  if (k && nonfinite_left_out_) std::memset(q, 0, n * sizeof(float));
  return SparseBodyBytes(k, dtype);
}

size_t TopkCompressor::EncodeBodyWithFeedbackF32(const float* g, float* e, size_t n,
                                                 const CompressContext&, uint8_t* body) {
  const size_t k = size_.KeepCount(n);
  if (k == 0) return static_cast<size_t>(WriteSparseHead(nullptr, 0, body) - body);
  const uint32_t* idx = Select(g, e, n, k);  // e = g + e after this
  uint8_t* values = WriteSparseHead(idx, k, body);
  for (size_t j = 0; j < k; ++j) {
    StoreSparseValue(e[idx[j]], DType::kFloat32, j, values);
    e[idx[j]] = 0.0f;
  }
  if (nonfinite_left_out_) std::memset(e, 0, n * sizeof(float));
  return SparseBodyBytes(k, DType::kFloat32);
}

Status TopkCompressor::DecodeBodyToTensor(ByteSpan body, size_t n, DType dtype, float* out) {
  return DecodeSparseBodyToTensor("topk", body, n, dtype, out, isa());
}

Status TopkCompressor::ValidateBody(ByteSpan body, size_t n, DType dtype) {
  return ValidateSparseBody("topk", body, n, dtype);
}

size_t TopkCompressor::AggregateBody(const ByteSpan* bodies, size_t count, size_t n, DType dtype,
                                     float mult, float* e, const CompressContext& ctx,
                                     uint8_t* body) {
  const bool do_mult = mult != 1.0f;
  // q = a + e where some push holds the index (a built exactly as DecompressToFloat of push 0
  // then DecompressAdd of the others, in rank order, would build it).
  auto finish = [&](uint32_t i, float a) {
    if (do_mult) a = a * mult;
    e[i] = a + e[i];
  };
  auto head = [&](size_t w, uint32_t* k, const uint8_t** idx, const uint8_t** values) {
    std::memcpy(k, bodies[w].data(), 4);
    *idx = bodies[w].data() + kSparseCountBytes;
    *values = *idx + size_t{*k} * kSparseIndexBytes;
  };
  auto index_at = [](const uint8_t* idx, size_t j) {
    uint32_t i;
    std::memcpy(&i, idx + 4 * j, 4);
    return i;
  };
  if (count <= 2) {  // the common case: a two-way merge of the sorted index lists
    uint32_t k0 = 0, k1 = 0;
    const uint8_t *idx0, *val0, *idx1 = nullptr, *val1 = nullptr;
    head(0, &k0, &idx0, &val0);
    if (count == 2) head(1, &k1, &idx1, &val1);
    size_t a = 0, b = 0;
    // The indices are scattered over e (n floats, beyond the caches when n is large): each
    // update would wait for its line from memory. Prefetching the lines kPrefetchAhead entries
    // ahead lets those loads overlap.
    constexpr size_t kPrefetchAhead = 64;
    while (a < k0 || b < k1) {
      if (a + kPrefetchAhead < k0) __builtin_prefetch(e + index_at(idx0, a + kPrefetchAhead), 1);
      if (b + kPrefetchAhead < k1) __builtin_prefetch(e + index_at(idx1, b + kPrefetchAhead), 1);
      const uint32_t i0 = a < k0 ? index_at(idx0, a) : UINT32_MAX;
      const uint32_t i1 = b < k1 ? index_at(idx1, b) : UINT32_MAX;
      if (i0 <= i1) {
        float v = LoadSparseValue(val0, a++, dtype);
        if (i0 == i1) v = v + LoadSparseValue(val1, b++, dtype);
        finish(i0, v);
      } else {
        float v = 0.0f;  // push 0 does not hold it: the accumulator's zero
        v = v + LoadSparseValue(val1, b++, dtype);
        finish(i1, v);
      }
    }
  } else {
    entries_.clear();
    for (size_t w = 0; w < count; ++w) {
      uint32_t k = 0;
      const uint8_t *idx, *values;
      head(w, &k, &idx, &values);
      for (size_t j = 0; j < k; ++j) {
        entries_.push_back(
            {index_at(idx, j), static_cast<uint32_t>(w), LoadSparseValue(values, j, dtype)});
      }
    }
    std::sort(entries_.begin(), entries_.end(), [](const PushEntry& x, const PushEntry& y) {
      return x.index != y.index ? x.index < y.index : x.rank < y.rank;
    });
    for (size_t j = 0; j < entries_.size();) {
      const uint32_t i = entries_[j].index;
      float v = 0.0f;
      if (entries_[j].rank == 0) {
        v = entries_[j++].value;
      }
      for (; j < entries_.size() && entries_[j].index == i; ++j) v = v + entries_[j].value;
      if (j + 64 < entries_.size()) __builtin_prefetch(e + entries_[j + 64].index, 1);
      finish(i, v);
    }
  }
  return EncodeBodyWithFeedback(e, n, ctx.store_as.value_or(DType::kFloat32), ctx, body);
}

Status TopkCompressor::DecodeBody(ByteSpan body, size_t n, DType dtype, float* out, bool add) {
  return DecodeSparseBody("topk", body, n, dtype, out, add);
}

namespace {
std::unique_ptr<Compressor> NewTopk(const v1::CompressorConfig& config, IsaLevel isa) {
  return std::make_unique<TopkCompressor>(config.topk(), isa);
}
}  // namespace

// The kernel half of topk (compressors/method.h; spec half in topk_spec.cc).
const MethodKernels kTopkMethodKernels = {&kTopkMethodSpec, &NewTopk, &NewResidualState};

}  // namespace bitpush::compressors
