// worker/local_reduce.h: every ISA level and every thread count gives the bits of a plain
// scalar reference (fp32 sum in source order, one multiply by scale, one rounding to the
// destination dtype), for P = 1..8 sources, odd sizes, misaligned buffers and in place.
#include "worker/local_reduce.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "tests/unit/test_util.h"

namespace bitpush::worker {
namespace {

using bitpush::testing::SupportedIsaLevels;

// A buffer of `count` elements of `dtype` starting `offset` bytes into its storage, or with
// `align64`, `offset` bytes after the first 64-byte-aligned address of its storage.
class Buf {
 public:
  Buf(DType dtype, size_t count, size_t offset, bool align64 = false)
      : dtype_(dtype), storage_(count * DTypeSize(dtype) + offset + 64) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    start_ = offset + (align64 ? (64 - base % 64) % 64 : 0);
  }
  void* Data() { return storage_.data() + start_; }
  const void* Data() const { return storage_.data() + start_; }
  uint32_t Bits(size_t i) const {
    uint32_t b = 0;
    std::memcpy(&b, static_cast<const uint8_t*>(Data()) + i * DTypeSize(dtype_), DTypeSize(dtype_));
    return b;
  }
  float Get(size_t i) const {
    const uint32_t b = Bits(i);
    switch (dtype_) {
      case DType::kFloat32: return BitsToFloat(b);
      case DType::kFloat16: return HalfToFloat(static_cast<uint16_t>(b));
      case DType::kBFloat16: return Bf16ToFloat(static_cast<uint16_t>(b));
    }
    return 0;
  }
  void Set(size_t i, float v) {
    uint32_t b = 0;
    switch (dtype_) {
      case DType::kFloat32: b = FloatBits(v); break;
      case DType::kFloat16: b = FloatToHalf(v); break;
      case DType::kBFloat16: b = FloatToBf16(v); break;
    }
    std::memcpy(static_cast<uint8_t*>(Data()) + i * DTypeSize(dtype_), &b, DTypeSize(dtype_));
  }
  void SetBits(size_t i, uint32_t b) {
    std::memcpy(static_cast<uint8_t*>(Data()) + i * DTypeSize(dtype_), &b, DTypeSize(dtype_));
  }

 private:
  DType dtype_;
  std::vector<uint8_t> storage_;
  size_t start_ = 0;
};

// The reference: written independently of the kernels, one element at a time.
uint32_t ReferenceBits(DType dtype, const std::vector<const Buf*>& srcs, size_t i, float scale) {
  float acc = srcs[0]->Get(i);
  for (size_t p = 1; p < srcs.size(); ++p) acc = acc + srcs[p]->Get(i);
  if (scale != 1.0f) acc = acc * scale;
  switch (dtype) {
    case DType::kFloat32: return FloatBits(acc);
    case DType::kFloat16: return FloatToHalf(acc);
    case DType::kBFloat16: return FloatToBf16(acc);
  }
  return 0;
}

bool IsNanBits(DType dtype, uint32_t b) {
  switch (dtype) {
    case DType::kFloat32: return (b & 0x7FFFFFFFu) > 0x7F800000u;
    case DType::kFloat16: return (b & 0x7FFFu) > 0x7C00u;
    case DType::kBFloat16: return (b & 0x7FFFu) > 0x7F80u;
  }
  return false;
}

// Random normal values, with a sprinkling of values that exercise the edges: infinities,
// values that overflow fp16 when summed, fp16/fp32 subnormals, signed zeros, and (when
// `nans`) NaNs.
void Fill(Buf* b, DType dtype, size_t count, uint64_t seed, bool nans) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  for (size_t i = 0; i < count; ++i) {
    float v = normal(rng);
    switch (pick(rng)) {
      case 0: v = std::numeric_limits<float>::infinity(); break;
      case 1: v = -std::numeric_limits<float>::infinity(); break;
      case 2: v = 40000.0f; break;  // two of them overflow fp16
      case 3: v = 3.0e-8f; break;   // an fp16 subnormal
      case 4: v = 1.0e-40f; break;  // an fp32 subnormal
      case 5: v = -0.0f; break;
      case 6: v = 1.0f + 1.0f / 2048; break;  // ties when rounded to fp16
      case 7:
        if (nans) v = std::numeric_limits<float>::quiet_NaN();
        break;
      default: break;
    }
    b->Set(i, v);
  }
}

std::string Where(IsaLevel isa, DType dtype, size_t p, size_t n, size_t i) {
  return std::string(IsaLevelName(isa)) + " " + std::string(DTypeName(dtype)) +
         " P=" + std::to_string(p) + " n=" + std::to_string(n) + " i=" + std::to_string(i);
}

void ExpectMatchesReference(DType dtype, const std::vector<const Buf*>& srcs, const Buf& dst,
                            size_t n, float scale, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t want = ReferenceBits(dtype, srcs, i, scale);
    const uint32_t got = dst.Bits(i);
    if (IsNanBits(dtype, want)) {
      // x86 propagates one NaN operand; which one may differ between an addss the compiler
      // commuted and a vector add. Both must be NaN.
      ASSERT_TRUE(IsNanBits(dtype, got)) << what << " i=" << i;
    } else {
      ASSERT_EQ(got, want) << what << " i=" << i << " want " << BitsToFloat(want) << " got "
                           << dst.Get(i);
    }
  }
}

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const size_t kSizes[] = {0,  1,  2,  3,  7,  8,  9,   15,  16,   17,
                         31, 32, 33, 63, 64, 65, 127, 129, 1000, 4099};

TEST(LocalReduceKernel, MatchesScalarReferenceAtEveryIsaLevel) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (DType dtype : kDTypes) {
      for (size_t p = 1; p <= 8; ++p) {
        for (size_t n : kSizes) {
          for (float scale : {1.0f, 1.0f / static_cast<float>(p)}) {
            std::vector<Buf> srcs;
            for (size_t k = 0; k < p; ++k) {
              // Every source at its own misalignment (0, 2, 4, ... bytes: below fp32 alignment
              // for fp32, odd element offsets for 16-bit dtypes).
              srcs.emplace_back(dtype, n, (2 * k + 2 * (n % 3)) % 70);
              Fill(&srcs.back(), dtype, n, 1000 * p + 7 * n + k, /*nans=*/true);
            }
            Buf dst(dtype, n, 6);
            std::vector<const void*> ptrs;
            std::vector<const Buf*> bufs;
            for (const Buf& b : srcs) {
              ptrs.push_back(b.Data());
              bufs.push_back(&b);
            }
            LocalReduceKernel(dtype, ptrs.data(), p, dst.Data(), n, scale, isa);
            ExpectMatchesReference(dtype, bufs, dst, n, scale, Where(isa, dtype, p, n, 0));
          }
        }
      }
    }
  }
}

TEST(LocalReduceKernel, AllIsaLevelsGiveIdenticalBits) {
  const size_t n = 10007;
  for (DType dtype : kDTypes) {
    for (size_t p : {2, 3, 5, 8}) {
      std::vector<Buf> srcs;
      std::vector<const void*> ptrs;
      for (size_t k = 0; k < p; ++k) srcs.emplace_back(dtype, n, 0);
      for (size_t k = 0; k < p; ++k) {
        Fill(&srcs[k], dtype, n, 77 + k, /*nans=*/false);
        ptrs.push_back(srcs[k].Data());
      }
      Buf first(dtype, n, 0);
      LocalReduceKernel(dtype, ptrs.data(), p, first.Data(), n, 0.25f, IsaLevel::kScalar);
      for (IsaLevel isa : SupportedIsaLevels()) {
        Buf dst(dtype, n, 0);
        LocalReduceKernel(dtype, ptrs.data(), p, dst.Data(), n, 0.25f, isa);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst.Bits(i), first.Bits(i)) << Where(isa, dtype, p, n, i);
        }
      }
    }
  }
}

// Streaming stores cover only the 64-byte-aligned bulk of dst; the head before it and the tail
// use ordinary stores. Every split must give the reference bits, including a dst that is not
// even element-aligned (no streaming at all).
TEST(LocalReduceKernel, NonTemporalStoresGiveTheSameBits) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (DType dtype : kDTypes) {
      for (size_t n : {size_t{5}, size_t{64}, size_t{100}, size_t{257}, size_t{1000}}) {
        for (size_t dst_offset : {0, 1, 2, 4, 6, 30, 62}) {
          std::vector<Buf> srcs;
          std::vector<const void*> ptrs;
          std::vector<const Buf*> bufs;
          for (size_t k = 0; k < 3; ++k) srcs.emplace_back(dtype, n, 4 * k);
          for (size_t k = 0; k < 3; ++k) {
            Fill(&srcs[k], dtype, n, 900 + k + n, /*nans=*/false);
            ptrs.push_back(srcs[k].Data());
            bufs.push_back(&srcs[k]);
          }
          Buf aligned(dtype, n, dst_offset, /*align64=*/true);
          LocalReduceKernel(dtype, ptrs.data(), 3, aligned.Data(), n, 0.5f, isa,
                            /*non_temporal=*/true);
          ExpectMatchesReference(
              dtype, bufs, aligned, n, 0.5f,
              Where(isa, dtype, 3, n, 0) + " nt dst_offset=" + std::to_string(dst_offset));
        }
      }
    }
  }
}

TEST(LocalReduceKernel, InPlaceOnAnySource) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (DType dtype : kDTypes) {
      for (size_t n : {size_t{1}, size_t{33}, size_t{1001}}) {
        for (size_t target : {0, 2}) {  // dst == src0 (the usual case) and dst == src2
          std::vector<Buf> srcs, copies;
          for (size_t k = 0; k < 4; ++k) {
            srcs.emplace_back(dtype, n, 2 * k);
            copies.emplace_back(dtype, n, 0);
            Fill(&srcs[k], dtype, n, 31 * k + n, /*nans=*/false);
            std::memcpy(copies[k].Data(), srcs[k].Data(), n * DTypeSize(dtype));
          }
          std::vector<const void*> ptrs;
          std::vector<const Buf*> bufs;
          for (size_t k = 0; k < 4; ++k) {
            ptrs.push_back(srcs[k].Data());
            bufs.push_back(&copies[k]);
          }
          LocalReduceKernel(dtype, ptrs.data(), 4, srcs[target].Data(), n, 1.0f, isa);
          ExpectMatchesReference(
              dtype, bufs, srcs[target], n, 1.0f,
              Where(isa, dtype, 4, n, 0) + " in place on " + std::to_string(target));
        }
      }
    }
  }
}

// fp16 sums are rounded once, at the end, not after every addition: 1 + 2^-11 + 2^-11 is
// 1 + 2^-10 (exact in fp16), where a chain of fp16 additions would give 1 (each step is a tie
// that rounds to even).
TEST(LocalReduceKernel, Fp16IsRoundedOnceAtTheEnd) {
  const uint16_t one = FloatToHalf(1.0f);
  const uint16_t tiny = FloatToHalf(1.0f / 2048);                 // 2^-11, exact in fp16
  ASSERT_EQ(HalfToFloat(FloatToHalf(1.0f + 1.0f / 2048)), 1.0f);  // the chained result
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t n : {size_t{1}, size_t{16}, size_t{70}}) {
      std::vector<uint16_t> a(n, one), b(n, tiny), c(n, tiny), out(n, 0);
      const void* srcs[] = {a.data(), b.data(), c.data()};
      LocalReduceKernel(DType::kFloat16, srcs, 3, out.data(), n, 1.0f, isa);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(HalfToFloat(out[i]), 1.0f + 1.0f / 1024) << IsaLevelName(isa) << " i=" << i;
      }
    }
  }
}

// One source with scale 1 reproduces every fp16 and bf16 value (the fp32 round trip is exact);
// NaNs stay NaN, quieted, as VCVTPH2PS/VCVTPS2PH do.
TEST(LocalReduceKernel, SingleSourceIsTheIdentityForEvery16BitValue) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> out(all.size());
      const void* srcs[] = {all.data()};
      LocalReduceKernel(dtype, srcs, 1, out.data(), all.size(), 1.0f, isa);
      for (uint32_t i = 0; i < 65536; ++i) {
        if (IsNanBits(dtype, i)) {
          ASSERT_TRUE(IsNanBits(dtype, out[i])) << IsaLevelName(isa) << " " << i;
        } else {
          ASSERT_EQ(out[i], i) << IsaLevelName(isa) << " " << DTypeName(dtype);
        }
      }
    }
  }
}

TEST(LocalReduceKernel, Fp16OverflowIsInfinity) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    const uint16_t big = FloatToHalf(40000.0f);
    std::vector<uint16_t> a(20, big), b(20, big), out(20);
    const void* srcs[] = {a.data(), b.data()};
    LocalReduceKernel(DType::kFloat16, srcs, 2, out.data(), 20, 1.0f, isa);
    for (uint16_t h : out) EXPECT_EQ(h, 0x7C00) << IsaLevelName(isa);
    // Averaged, the same sum fits again: the fp32 intermediate does not overflow.
    LocalReduceKernel(DType::kFloat16, srcs, 2, out.data(), 20, 0.5f, isa);
    for (uint16_t h : out) EXPECT_EQ(h, big) << IsaLevelName(isa);
  }
}

std::unique_ptr<LocalReducer> MakeReducer(uint32_t threads, IsaLevel isa, size_t chunk,
                                          std::vector<int> cpus = {}, size_t nt_min_bytes = 0) {
  LocalReduceOptions o;
  o.non_temporal_min_bytes = nt_min_bytes;
  o.threads = threads;
  o.isa = isa;
  o.chunk_elements = chunk;
  o.min_parallel_elements = 0;
  o.cpus = std::move(cpus);
  auto r = LocalReducer::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

TEST(LocalReducer, ThreadCountsOneToFourGiveIdenticalBits) {
  const size_t n = 100003;  // not a multiple of any chunk
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (DType dtype : kDTypes) {
      std::vector<Buf> srcs;
      std::vector<const void*> ptrs;
      std::vector<const Buf*> bufs;
      for (size_t k = 0; k < 3; ++k) srcs.emplace_back(dtype, n, 2 * k);
      for (size_t k = 0; k < 3; ++k) {
        Fill(&srcs[k], dtype, n, 500 + k, /*nans=*/false);
        ptrs.push_back(srcs[k].Data());
        bufs.push_back(&srcs[k]);
      }
      Buf one(dtype, n, 0);
      ASSERT_TRUE(
          MakeReducer(1, isa, 4096)->Reduce(dtype, ptrs.data(), 3, one.Data(), n, 1.0f / 3).ok());
      ExpectMatchesReference(dtype, bufs, one, n, 1.0f / 3, std::string(IsaLevelName(isa)));
      for (uint32_t t = 1; t <= 4; ++t) {
        for (size_t chunk : {size_t{64}, size_t{1000}, size_t{32768}}) {
          // Streaming stores in every other configuration.
          auto reducer = MakeReducer(t, isa, chunk, {}, chunk == 1000 ? 1 : 0);
          Buf dst(dtype, n, 0);
          ASSERT_TRUE(reducer->Reduce(dtype, ptrs.data(), 3, dst.Data(), n, 1.0f / 3).ok());
          ASSERT_EQ(std::memcmp(dst.Data(), one.Data(), n * DTypeSize(dtype)), 0)
              << IsaLevelName(isa) << " " << DTypeName(dtype) << " threads=" << t
              << " chunk=" << chunk;
        }
      }
    }
  }
}

TEST(LocalReducer, InPlaceWithThreads) {
  const size_t n = 50001;
  std::vector<float> a = bitpush::testing::RandomFloats(n, 1);
  std::vector<float> b = bitpush::testing::RandomFloats(n, 2);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  auto reducer = MakeReducer(3, BestIsaLevel(), 128);
  const void* srcs[] = {a.data(), b.data()};
  ASSERT_TRUE(reducer->Reduce(DType::kFloat32, srcs, 2, a.data(), n).ok());
  ASSERT_EQ(a, want);  // random normal data: no NaNs, so == compares every value exactly
}

TEST(LocalReducer, ConcurrentCallersAreSerialised) {
  const size_t n = 70000;
  auto reducer = MakeReducer(2, BestIsaLevel(), 1024);
  std::vector<float> a = bitpush::testing::RandomFloats(n, 3);
  std::vector<float> b = bitpush::testing::RandomFloats(n, 4);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  std::vector<std::thread> callers;
  callers.reserve(4);
  std::vector<std::vector<float>> outs(4, std::vector<float>(n));
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      const void* srcs[] = {a.data(), b.data()};
      for (int k = 0; k < 20; ++k) {
        EXPECT_TRUE(reducer->Reduce(DType::kFloat32, srcs, 2, outs[c].data(), n).ok());
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (const auto& out : outs) ASSERT_EQ(out, want);
}

TEST(LocalReducer, ParallelCopyIsMemcpy) {
  const size_t bytes = 1000003;
  std::vector<uint8_t> src(bytes), dst(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  for (uint32_t t : {1u, 2u, 3u}) {
    auto reducer = MakeReducer(t, BestIsaLevel(), 4096);
    std::fill(dst.begin(), dst.end(), 0);
    reducer->ParallelCopy(src.data(), dst.data(), bytes);
    ASSERT_EQ(src, dst) << "threads=" << t;
  }
}

TEST(LocalReducer, PinsItsThreadsToGivenCpus) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  auto reducer = MakeReducer(2, BestIsaLevel(), 64, cpus);
  std::vector<float> a(4096, 1.0f), b(4096, 2.0f), out(4096);
  const void* srcs[] = {a.data(), b.data()};
  ASSERT_TRUE(reducer->Reduce(DType::kFloat32, srcs, 2, out.data(), out.size()).ok());
  for (float v : out) ASSERT_EQ(v, 3.0f);
}

TEST(LocalReducer, RejectsBadOptionsAndArguments) {
  LocalReduceOptions o;
  o.threads = 0;
  EXPECT_EQ(LocalReducer::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.threads = 1;
  o.cpus = {-1};
  EXPECT_EQ(LocalReducer::Create(o).status().code(), StatusCode::kInvalidArgument);
  if (!IsaSupported(IsaLevel::kAvx512)) {
    o.cpus.clear();
    o.isa = IsaLevel::kAvx512;
    EXPECT_EQ(LocalReducer::Create(o).status().code(), StatusCode::kFailedPrecondition);
  }

  auto reducer = MakeReducer(1, IsaLevel::kScalar, 64);
  std::vector<float> buf(100, 1.0f), other(100, 1.0f);
  const void* none[] = {nullptr};
  EXPECT_EQ(reducer->Reduce(DType::kFloat32, none, 0, buf.data(), 10).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(reducer->Reduce(DType::kFloat32, none, 1, buf.data(), 10).code(),
            StatusCode::kInvalidArgument);
  const void* srcs[] = {buf.data(), other.data()};
  EXPECT_EQ(reducer->Reduce(DType::kFloat32, srcs, 2, nullptr, 10).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      reducer
          ->Reduce(DType::kFloat32, srcs, 2, buf.data(), 10, std::numeric_limits<float>::infinity())
          .code(),
      StatusCode::kInvalidArgument);
  // dst one element past src0: a partial overlap, refused (dst == src0 is fine).
  const Status overlap = reducer->Reduce(DType::kFloat32, srcs, 2, buf.data() + 1, 10);
  EXPECT_EQ(overlap.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.message().find("source 0"), std::string::npos) << overlap.ToString();
  EXPECT_TRUE(reducer->Reduce(DType::kFloat32, srcs, 2, buf.data(), 10).ok());
  EXPECT_EQ(buf[0], 2.0f);
  EXPECT_EQ(buf[10], 1.0f);  // past count: untouched
  // Zero elements: nothing to do, null pointers allowed.
  EXPECT_TRUE(reducer->Reduce(DType::kFloat32, none, 1, nullptr, 0).ok());
}

}  // namespace
}  // namespace bitpush::worker
