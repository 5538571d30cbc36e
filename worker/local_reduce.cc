#include "worker/local_reduce.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "common/half.h"
#include "common/logging.h"

namespace bitpush::worker {
namespace {

// Every kernel reduces the elements [begin, end) of the full arrays: srcs[p] + i and dst + i
// address element i, so a chunk of a larger reduce needs no pointer arithmetic by the caller.
struct Range {
  const void* const* srcs;
  size_t num_srcs;
  void* dst;
  size_t begin;
  size_t end;
  float scale;
  bool scaled;  // scale != 1: multiply once after the sum
  bool nt;      // non-temporal stores in the main loops (SIMD levels only)
};

// Elements from `i` until dst's element address is 64-byte aligned (where non-temporal vector
// stores may start); `end - i` if dst is not even element-aligned.
inline size_t ElementsToAlignment(const Range& r, size_t i, size_t esize) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(r.dst) + i * esize;
  if (a % esize != 0) return r.end - i;
  return std::min(r.end - i, ((64 - a % 64) % 64) / esize);
}

template <typename T>
inline const T* Src(const Range& r, size_t p) {
  return static_cast<const T*>(r.srcs[p]);
}
template <typename T>
inline T* Dst(const Range& r) {
  return static_cast<T*>(r.dst);
}

// ---- scalar (the reference; also the tails of the AVX2 kernels) -----------------------------
// Loads and stores go through memcpy: buffers may be at any alignment.

inline float LoadF32(const void* p, size_t i) {
  float v;
  std::memcpy(&v, static_cast<const float*>(p) + i, sizeof(v));
  return v;
}
inline uint16_t LoadU16(const void* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const uint16_t*>(p) + i, sizeof(v));
  return v;
}

struct F32Scalar {
  static float Load(const void* p, size_t i) { return LoadF32(p, i); }
  static void Store(void* p, size_t i, float v) {
    std::memcpy(static_cast<float*>(p) + i, &v, sizeof(v));
  }
};
struct F16Scalar {
  static float Load(const void* p, size_t i) { return HalfToFloat(LoadU16(p, i)); }
  static void Store(void* p, size_t i, float v) {
    const uint16_t h = FloatToHalf(v);
    std::memcpy(static_cast<uint16_t*>(p) + i, &h, sizeof(h));
  }
};
struct Bf16Scalar {
  static float Load(const void* p, size_t i) { return Bf16ToFloat(LoadU16(p, i)); }
  static void Store(void* p, size_t i, float v) {
    const uint16_t b = FloatToBf16(v);
    std::memcpy(static_cast<uint16_t*>(p) + i, &b, sizeof(b));
  }
};

template <typename Io>
void ReduceScalar(const Range& r) {
  for (size_t i = r.begin; i < r.end; ++i) {
    float acc = Io::Load(r.srcs[0], i);
    for (size_t p = 1; p < r.num_srcs; ++p) acc += Io::Load(r.srcs[p], i);
    if (r.scaled) acc *= r.scale;
    Io::Store(r.dst, i, acc);
  }
}

void ReduceScalarDispatch(DType dtype, const Range& r) {
  switch (dtype) {
    case DType::kFloat32: ReduceScalar<F32Scalar>(r); return;
    case DType::kFloat16: ReduceScalar<F16Scalar>(r); return;
    case DType::kBFloat16: ReduceScalar<Bf16Scalar>(r); return;
  }
}

// ---- AVX2 + F16C: 8 lanes -------------------------------------------------------------------

struct F32Avx2 {
  BP_TARGET_AVX2 static __m256 Load(const void* p, size_t i) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  }
  BP_TARGET_AVX2 static void Store(void* p, size_t i, __m256 v) {
    _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  }
  BP_TARGET_AVX2 static void StoreNt(void* p, size_t i, __m256 v) {
    _mm256_stream_ps(static_cast<float*>(p) + i, v);
  }
  using Scalar = F32Scalar;
  static constexpr size_t kSize = 4;
};
struct F16Avx2 {
  BP_TARGET_AVX2 static __m256 Load(const void* p, size_t i) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  }
  BP_TARGET_AVX2 static void Store(void* p, size_t i, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  BP_TARGET_AVX2 static void StoreNt(void* p, size_t i, __m256 v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  using Scalar = F16Scalar;
  static constexpr size_t kSize = 2;
};
struct Bf16Avx2 {
  BP_TARGET_AVX2 static __m256 Load(const void* p, size_t i) {
    const __m256i w = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // Round-to-nearest-even on the integer bits, NaN quieted (FloatToBf16).
  BP_TARGET_AVX2 static void Store(void* p, size_t i, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), Round(v));
  }
  BP_TARGET_AVX2 static void StoreNt(void* p, size_t i, __m256 v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), Round(v));
  }
  BP_TARGET_AVX2 static __m128i Round(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i b = _mm256_blendv_epi8(rounded, quiet, is_nan);  // 8 x u32 holding u16
    return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  }
  using Scalar = Bf16Scalar;
  static constexpr size_t kSize = 2;
};

// The main loop: 32 elements per step, four independent accumulators hide the add latency.
// Returns where it stopped.
template <typename Io, bool kNt>
BP_TARGET_AVX2 size_t ReduceAvx2Main(const Range& r, size_t i) {
  const __m256 scale = _mm256_set1_ps(r.scale);
  for (; i + 32 <= r.end; i += 32) {
    const void* s = r.srcs[0];
    __m256 a0 = Io::Load(s, i), a1 = Io::Load(s, i + 8);
    __m256 a2 = Io::Load(s, i + 16), a3 = Io::Load(s, i + 24);
    for (size_t p = 1; p < r.num_srcs; ++p) {
      s = r.srcs[p];
      a0 = _mm256_add_ps(a0, Io::Load(s, i));
      a1 = _mm256_add_ps(a1, Io::Load(s, i + 8));
      a2 = _mm256_add_ps(a2, Io::Load(s, i + 16));
      a3 = _mm256_add_ps(a3, Io::Load(s, i + 24));
    }
    if (r.scaled) {
      a0 = _mm256_mul_ps(a0, scale);
      a1 = _mm256_mul_ps(a1, scale);
      a2 = _mm256_mul_ps(a2, scale);
      a3 = _mm256_mul_ps(a3, scale);
    }
    if (kNt) {
      Io::StoreNt(r.dst, i, a0);
      Io::StoreNt(r.dst, i + 8, a1);
      Io::StoreNt(r.dst, i + 16, a2);
      Io::StoreNt(r.dst, i + 24, a3);
    } else {
      Io::Store(r.dst, i, a0);
      Io::Store(r.dst, i + 8, a1);
      Io::Store(r.dst, i + 16, a2);
      Io::Store(r.dst, i + 24, a3);
    }
  }
  return i;
}

// Elements [i, end) with 8-element steps and a scalar tail.
template <typename Io>
BP_TARGET_AVX2 void ReduceAvx2Small(const Range& r, size_t i, size_t end) {
  const __m256 scale = _mm256_set1_ps(r.scale);
  for (; i + 8 <= end; i += 8) {
    __m256 a = Io::Load(r.srcs[0], i);
    for (size_t p = 1; p < r.num_srcs; ++p) a = _mm256_add_ps(a, Io::Load(r.srcs[p], i));
    if (r.scaled) a = _mm256_mul_ps(a, scale);
    Io::Store(r.dst, i, a);
  }
  Range tail = r;
  tail.begin = i;
  tail.end = end;
  ReduceScalar<typename Io::Scalar>(tail);
}

template <typename Io>
BP_TARGET_AVX2 void ReduceAvx2(const Range& r) {
  size_t i = r.begin;
  if (r.nt) {
    const size_t head = ElementsToAlignment(r, i, Io::kSize);
    ReduceAvx2Small<Io>(r, i, i + head);
    i = ReduceAvx2Main<Io, true>(r, i + head);
    _mm_sfence();  // streaming stores are weakly ordered: visible before the job completes
  } else {
    i = ReduceAvx2Main<Io, false>(r, i);
  }
  ReduceAvx2Small<Io>(r, i, r.end);
}

void ReduceAvx2Dispatch(DType dtype, const Range& r) {
  switch (dtype) {
    case DType::kFloat32: ReduceAvx2<F32Avx2>(r); return;
    case DType::kFloat16: ReduceAvx2<F16Avx2>(r); return;
    case DType::kBFloat16: ReduceAvx2<Bf16Avx2>(r); return;
  }
}

// ---- AVX-512: 16 lanes, masked tail ---------------------------------------------------------
// Masked loads never touch (or fault on) the masked-off elements.

struct F32Avx512 {
  BP_TARGET_AVX512 static __m512 Load(const void* p, size_t i) {
    return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  }
  BP_TARGET_AVX512 static __m512 LoadMasked(const void* p, size_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  }
  BP_TARGET_AVX512 static void Store(void* p, size_t i, __m512 v) {
    _mm512_storeu_ps(static_cast<float*>(p) + i, v);
  }
  BP_TARGET_AVX512 static void StoreNt(void* p, size_t i, __m512 v) {
    _mm512_stream_ps(static_cast<float*>(p) + i, v);
  }
  BP_TARGET_AVX512 static void StoreMasked(void* p, size_t i, __m512 v, __mmask16 m) {
    _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  }
  static constexpr size_t kSize = 4;
};
struct F16Avx512 {
  BP_TARGET_AVX512 static __m512 Load(const void* p, size_t i) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
  }
  BP_TARGET_AVX512 static __m512 LoadMasked(const void* p, size_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  }
  BP_TARGET_AVX512 static void Store(void* p, size_t i, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  BP_TARGET_AVX512 static void StoreNt(void* p, size_t i, __m512 v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  BP_TARGET_AVX512 static void StoreMasked(void* p, size_t i, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m,
                             _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static constexpr size_t kSize = 2;
};
struct Bf16Avx512 {
  BP_TARGET_AVX512 static __m512 Load(const void* p, size_t i) {
    return Widen(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
  }
  BP_TARGET_AVX512 static __m512 LoadMasked(const void* p, size_t i, __mmask16 m) {
    return Widen(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  }
  BP_TARGET_AVX512 static void Store(void* p, size_t i, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i),
                        _mm512_cvtepi32_epi16(Round(v)));
  }
  BP_TARGET_AVX512 static void StoreNt(void* p, size_t i, __m512 v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i),
                        _mm512_cvtepi32_epi16(Round(v)));
  }
  BP_TARGET_AVX512 static void StoreMasked(void* p, size_t i, __m512 v, __mmask16 m) {
    _mm512_mask_cvtepi32_storeu_epi16(static_cast<uint16_t*>(p) + i, m, Round(v));
  }
  static constexpr size_t kSize = 2;
  BP_TARGET_AVX512 static __m512 Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // Round-to-nearest-even on the integer bits, NaN quieted (FloatToBf16); 16 x u32 holding u16.
  BP_TARGET_AVX512 static __m512i Round(__m512 v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
    const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    return _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(0x40));
  }
};

// The main loop: 64 elements (one cache line per vector for fp32) per step, four accumulators.
// Returns where it stopped.
template <typename Io, bool kNt>
BP_TARGET_AVX512 size_t ReduceAvx512Main(const Range& r, size_t i) {
  const __m512 scale = _mm512_set1_ps(r.scale);
  for (; i + 64 <= r.end; i += 64) {
    const void* s = r.srcs[0];
    __m512 a0 = Io::Load(s, i), a1 = Io::Load(s, i + 16);
    __m512 a2 = Io::Load(s, i + 32), a3 = Io::Load(s, i + 48);
    for (size_t p = 1; p < r.num_srcs; ++p) {
      s = r.srcs[p];
      a0 = _mm512_add_ps(a0, Io::Load(s, i));
      a1 = _mm512_add_ps(a1, Io::Load(s, i + 16));
      a2 = _mm512_add_ps(a2, Io::Load(s, i + 32));
      a3 = _mm512_add_ps(a3, Io::Load(s, i + 48));
    }
    if (r.scaled) {
      a0 = _mm512_mul_ps(a0, scale);
      a1 = _mm512_mul_ps(a1, scale);
      a2 = _mm512_mul_ps(a2, scale);
      a3 = _mm512_mul_ps(a3, scale);
    }
    if (kNt) {
      Io::StoreNt(r.dst, i, a0);
      Io::StoreNt(r.dst, i + 16, a1);
      Io::StoreNt(r.dst, i + 32, a2);
      Io::StoreNt(r.dst, i + 48, a3);
    } else {
      Io::Store(r.dst, i, a0);
      Io::Store(r.dst, i + 16, a1);
      Io::Store(r.dst, i + 32, a2);
      Io::Store(r.dst, i + 48, a3);
    }
  }
  return i;
}

// Elements [i, end) with 16-element steps and one masked step.
template <typename Io>
BP_TARGET_AVX512 void ReduceAvx512Small(const Range& r, size_t i, size_t end) {
  const __m512 scale = _mm512_set1_ps(r.scale);
  for (; i + 16 <= end; i += 16) {
    __m512 a = Io::Load(r.srcs[0], i);
    for (size_t p = 1; p < r.num_srcs; ++p) a = _mm512_add_ps(a, Io::Load(r.srcs[p], i));
    if (r.scaled) a = _mm512_mul_ps(a, scale);
    Io::Store(r.dst, i, a);
  }
  if (i < end) {
    const __mmask16 m = static_cast<__mmask16>((1u << (end - i)) - 1);
    __m512 a = Io::LoadMasked(r.srcs[0], i, m);
    for (size_t p = 1; p < r.num_srcs; ++p) {
      a = _mm512_add_ps(a, Io::LoadMasked(r.srcs[p], i, m));
    }
    if (r.scaled) a = _mm512_mul_ps(a, scale);
    Io::StoreMasked(r.dst, i, a, m);
  }
}

template <typename Io>
BP_TARGET_AVX512 void ReduceAvx512(const Range& r) {
  size_t i = r.begin;
  if (r.nt) {
    const size_t head = ElementsToAlignment(r, i, Io::kSize);
    ReduceAvx512Small<Io>(r, i, i + head);
    i = ReduceAvx512Main<Io, true>(r, i + head);
    _mm_sfence();  // streaming stores are weakly ordered: visible before the job completes
  } else {
    i = ReduceAvx512Main<Io, false>(r, i);
  }
  ReduceAvx512Small<Io>(r, i, r.end);
}

void ReduceAvx512Dispatch(DType dtype, const Range& r) {
  switch (dtype) {
    case DType::kFloat32: ReduceAvx512<F32Avx512>(r); return;
    case DType::kFloat16: ReduceAvx512<F16Avx512>(r); return;
    case DType::kBFloat16: ReduceAvx512<Bf16Avx512>(r); return;
  }
}

void ReduceRange(DType dtype, IsaLevel isa, const Range& r) {
  if (r.begin >= r.end) return;
  switch (isa) {
    case IsaLevel::kAvx512: ReduceAvx512Dispatch(dtype, r); return;
    case IsaLevel::kAvx2: ReduceAvx2Dispatch(dtype, r); return;
    case IsaLevel::kScalar: ReduceScalarDispatch(dtype, r); return;
  }
}

bool PartiallyOverlaps(const void* a, const void* b, size_t bytes) {
  if (a == b || bytes == 0) return false;
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

}  // namespace

void LocalReduceKernel(DType dtype, const void* const* srcs, size_t num_srcs, void* dst,
                       size_t count, float scale, IsaLevel isa, bool non_temporal) {
  BP_CHECK(num_srcs >= 1, "LocalReduceKernel needs at least one source");
  ReduceRange(dtype, isa, Range{srcs, num_srcs, dst, 0, count, scale, scale != 1.0f, non_temporal});
}

// One Reduce or ParallelCopy call: chunks are claimed with an atomic counter, so a thread that
// the (shared, noisy) machine slows down takes fewer of them.
struct LocalReducer::Job {
  bool copy = false;
  DType dtype = DType::kFloat32;
  Range range{};     // reduce; for a copy: srcs[0] = source, element = byte
  size_t chunk = 0;  // elements (bytes for a copy)
  size_t num_chunks = 0;
  std::atomic<size_t> next{0};
};

LocalReducer::LocalReducer(const LocalReduceOptions& options) : options_(options) {
  options_.chunk_elements = std::max<size_t>(64, (options_.chunk_elements + 63) / 64 * 64);
}

StatusOr<std::unique_ptr<LocalReducer>> LocalReducer::Create(const LocalReduceOptions& options) {
  if (options.threads < 1) {
    return InvalidArgumentError("local reduce: threads must be >= 1");
  }
  BP_RETURN_IF_ERROR(CheckIsaSupported(options.isa).WithContext("local reduce"));
  for (int cpu : options.cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      return InvalidArgumentError("local reduce: CPU " + std::to_string(cpu) +
                                  " is not a valid CPU number");
    }
  }
  std::unique_ptr<LocalReducer> r(new LocalReducer(options));
  BP_RETURN_IF_ERROR(r->Start());
  return r;
}

Status LocalReducer::Start() {
  if (options_.threads == 1 && options_.cpus.empty()) return Status::Ok();
  for (uint32_t t = 0; t < options_.threads; ++t) threads_.emplace_back([this, t] { Loop(t); });
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return started_ == options_.threads; });
  return pin_status_;  // the destructor joins the threads on an error
}

LocalReducer::~LocalReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void LocalReducer::Loop(uint32_t index) {
  pthread_setname_np(pthread_self(), (options_.name + std::to_string(index)).substr(0, 15).c_str());
  Status pinned;
  if (!options_.cpus.empty()) {
    const int cpu = options_.cpus[index % options_.cpus.size()];
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      pinned = InternalError("local reduce: cannot pin thread " + std::to_string(index) +
                             " to CPU " + std::to_string(cpu) + ": " + std::strerror(errno));
    }
  }
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  if (!pinned.ok() && pin_status_.ok()) pin_status_ = pinned;
  ++started_;
  done_cv_.notify_all();
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    Job* job = job_;
    lock.unlock();
    RunChunks(job);
    lock.lock();
    if (--running_ == 0) done_cv_.notify_all();
  }
}

void LocalReducer::RunChunks(Job* job) {
  for (;;) {
    const size_t c = job->next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job->num_chunks) return;
    Range r = job->range;
    r.begin = c * job->chunk;
    r.end = std::min(job->range.end, r.begin + job->chunk);
    if (job->copy) {
      std::memcpy(static_cast<uint8_t*>(r.dst) + r.begin,
                  static_cast<const uint8_t*>(r.srcs[0]) + r.begin, r.end - r.begin);
    } else {
      ReduceRange(job->dtype, options_.isa, r);
    }
  }
}

void LocalReducer::Dispatch(Job* job) {
  job->num_chunks = (job->range.end + job->chunk - 1) / job->chunk;
  std::unique_lock<std::mutex> lock(mu_);
  job_ = job;
  ++generation_;
  running_ = static_cast<uint32_t>(threads_.size());
  work_cv_.notify_all();
  done_cv_.wait(lock, [&] { return running_ == 0; });
  job_ = nullptr;
}

Status LocalReducer::Reduce(DType dtype, const void* const* srcs, size_t num_srcs, void* dst,
                            size_t count, float scale) {
  if (num_srcs == 0 || srcs == nullptr) {
    return InvalidArgumentError("local reduce: no source buffers");
  }
  if (!std::isfinite(scale)) {
    return InvalidArgumentError("local reduce: scale must be finite");
  }
  if (count == 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgumentError("local reduce: null destination");
  const size_t bytes = count * DTypeSize(dtype);
  bool in_place = false;
  for (size_t p = 0; p < num_srcs; ++p) {
    in_place = in_place || srcs[p] == dst;
    if (srcs[p] == nullptr) {
      return InvalidArgumentError("local reduce: source " + std::to_string(p) + " is null");
    }
    if (PartiallyOverlaps(srcs[p], dst, bytes)) {
      return InvalidArgumentError("local reduce: destination partially overlaps source " +
                                  std::to_string(p) + " (only dst == source is allowed)");
    }
  }
  std::lock_guard<std::mutex> call(call_mu_);
  Job job;
  job.dtype = dtype;
  // Streaming stores skip the read-for-ownership of dst's lines; in place those lines were
  // just read anyway, and a small result is better left in cache for the compressor.
  const bool nt =
      !in_place && options_.non_temporal_min_bytes > 0 && bytes >= options_.non_temporal_min_bytes;
  job.range = Range{srcs, num_srcs, dst, 0, count, scale, scale != 1.0f, nt};
  job.chunk = options_.chunk_elements;
  if (threads_.empty() || count < options_.min_parallel_elements) {
    ReduceRange(dtype, options_.isa, job.range);
  } else {
    Dispatch(&job);
  }
  return Status::Ok();
}

void LocalReducer::ParallelCopy(const void* src, void* dst, size_t bytes) {
  std::lock_guard<std::mutex> call(call_mu_);
  if (threads_.empty() || bytes < options_.min_parallel_elements * sizeof(float)) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return;
  }
  const void* srcs[1] = {src};
  Job job;
  job.copy = true;
  job.range = Range{srcs, 1, dst, 0, bytes, 1.0f, false, false};
  job.chunk = options_.chunk_elements * sizeof(float);  // the bytes of a fp32 reduce chunk
  Dispatch(&job);
}

}  // namespace bitpush::worker
