// Tests of the common layer: Status, dtypes, fp16/bf16 conversion (scalar vs hardware,
// exhaustive where feasible), vector ops across ISA levels, aligned buffers, CPU detection,
// counter-based RNG.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "common/aligned_buffer.h"
#include "common/counter_rng.h"
#include "common/cpu_features.h"
#include "common/cpu_topology.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/status.h"
#include "common/vector_ops.h"
#include "tests/unit/test_util.h"

namespace bitpush {
namespace {

using testing::RandomFloats;
using testing::SupportedIsaLevels;

TEST(Status, OkAndErrors) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status e = DataLossError("truncated");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.code(), StatusCode::kDataLoss);
  EXPECT_EQ(e.ToString(), "DataLoss: truncated");
  EXPECT_EQ(e.WithContext("key 7").message(), "key 7: truncated");
  EXPECT_TRUE(Status().WithContext("x").ok());
}

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd");
  return x / 2;
}
Status UseHalf(int x, int* out) {
  BP_ASSIGN_OR_RETURN(*out, Half(x));
  return Status::Ok();
}

TEST(Status, StatusOrAndMacros) {
  int v = 0;
  EXPECT_TRUE(UseHalf(8, &v).ok());
  EXPECT_EQ(v, 4);
  Status s = UseHalf(3, &v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(v, 4);
  StatusOr<int> bad(Status::Ok());  // an OK status is not a value
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_DEATH({ (void)Half(1).value(); }, "odd");
}

TEST(DType, NamesAndParse) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(*ParseDType("fp16"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
  const Status s = ParseDType("int8").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int8"), std::string::npos);
  EXPECT_NE(s.message().find("bfloat16"), std::string::npos);
  EXPECT_FALSE(IsValidDType(3));
}

TEST(Half, ExhaustiveHalfToFloatMatchesHardwareAndIsExact) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> ref(65536);
  HalfToFloatArray(all.data(), ref.data(), all.size(), IsaLevel::kScalar);
  for (IsaLevel isa : SupportedIsaLevels()) {
    std::vector<float> got(65536);
    HalfToFloatArray(all.data(), got.data(), all.size(), isa);
    ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), 65536 * 4)) << IsaLevelName(isa);
  }
  // Round trip of every half (NaNs come back as the same quiet NaN).
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
    const uint16_t back = FloatToHalf(HalfToFloat(h));
    if (nan) {
      EXPECT_EQ(back, h | 0x200) << i;
    } else {
      EXPECT_EQ(back, h) << i;
    }
  }
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
}

// Floats that exercise every rounding path: all exponents, mantissas near ties.
std::vector<float> ConversionProbe() {
  std::vector<float> v;
  for (uint32_t e = 0; e < 256; ++e) {
    for (uint32_t m : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFu, 0x8000u,
                       0x8001u, 0x18000u, 0x7FFFFFu, 0x400000u, 0x7FE000u, 0x7FF000u}) {
      for (uint32_t s : {0u, 1u}) v.push_back(BitsToFloat((s << 31) | (e << 23) | m));
    }
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) v.push_back(BitsToFloat(rng()));
  for (float f : RandomFloats(100000, 7, 1000.0f)) v.push_back(f);
  v.push_back(65504.0f);
  v.push_back(65519.99f);
  v.push_back(65520.0f);
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  v.push_back(std::numeric_limits<float>::signaling_NaN());
  return v;
}

TEST(Half, FloatToHalfAndBf16BitExactAcrossIsa) {
  const std::vector<float> src = ConversionProbe();
  std::vector<uint16_t> ref_h(src.size()), ref_b(src.size());
  FloatToHalfArray(src.data(), ref_h.data(), src.size(), IsaLevel::kScalar);
  FloatToBf16Array(src.data(), ref_b.data(), src.size(), IsaLevel::kScalar);
  for (IsaLevel isa : SupportedIsaLevels()) {
    std::vector<uint16_t> h(src.size()), b(src.size());
    FloatToHalfArray(src.data(), h.data(), src.size(), isa);
    FloatToBf16Array(src.data(), b.data(), src.size(), isa);
    for (size_t i = 0; i < src.size(); ++i) {
      ASSERT_EQ(h[i], ref_h[i]) << IsaLevelName(isa) << " fp16 of " << src[i] << " bits 0x"
                                << std::hex << FloatBits(src[i]);
      ASSERT_EQ(b[i], ref_b[i]) << IsaLevelName(isa) << " bf16 of 0x" << std::hex
                                << FloatBits(src[i]);
    }
  }
}

TEST(Half, RoundToNearestEvenAndSpecials) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // tie rounds to even = inf
  EXPECT_EQ(FloatToHalf(1e9f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e9f), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> even
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp -> even (2)
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F818000)), 0x3F82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
}

TEST(VectorOps, ConvertAndAddAgreeAcrossIsa) {
  for (size_t n : {0u, 1u, 7u, 8u, 15u, 16u, 17u, 33u, 1000u, 4097u}) {
    const std::vector<float> x = RandomFloats(n, n + 1);
    std::vector<uint16_t> h(n), b(n);
    FloatToHalfArray(x.data(), h.data(), n, IsaLevel::kScalar);
    FloatToBf16Array(x.data(), b.data(), n, IsaLevel::kScalar);
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const void* src = dt == DType::kFloat32   ? static_cast<const void*>(x.data())
                        : dt == DType::kFloat16 ? static_cast<const void*>(h.data())
                                                : static_cast<const void*>(b.data());
      const ConstTensorView view(src, n, dt);
      std::vector<float> ref(n);
      ConvertToFloat(view, ref.data(), IsaLevel::kScalar);
      std::vector<float> acc_ref = RandomFloats(n, 99);
      AddToFloat(view, acc_ref.data(), IsaLevel::kScalar);
      for (IsaLevel isa : SupportedIsaLevels()) {
        std::vector<float> got(n);
        ConvertToFloat(view, got.data(), isa);
        EXPECT_EQ(got, ref) << IsaLevelName(isa) << " n=" << n;
        std::vector<float> acc = RandomFloats(n, 99);
        AddToFloat(view, acc.data(), isa);
        EXPECT_EQ(acc, acc_ref) << IsaLevelName(isa) << " n=" << n;
      }
    }
  }
}

TEST(VectorOps, AddScaleIsTheAddThenTheScaleOnEveryIsa) {
  // (d + s) * k, each rounded: exactly what an add pass and a scaling pass give, on every
  // ISA and at every tail length; 1/3 is not a power of two, so a fused multiply-add or a
  // reassociation would show.
  for (size_t n : {0u, 1u, 7u, 15u, 16u, 17u, 31u, 32u, 33u, 1000u, 4097u}) {
    const std::vector<float> s = RandomFloats(n, n + 3);
    const std::vector<float> d0 = RandomFloats(n, n + 4);
    for (float k : {0.5f, 1.0f / 3.0f, 0.125f}) {
      std::vector<float> want(n);
      for (size_t i = 0; i < n; ++i) {
        const volatile float sum = d0[i] + s[i];
        want[i] = sum * k;
      }
      for (IsaLevel isa : SupportedIsaLevels()) {
        std::vector<float> got = d0;
        AddScaleFloatArray(s.data(), got.data(), n, k, isa);
        // Bit patterns, so that a -0.0 for a +0.0 would show (memcmp would need n > 0).
        std::vector<uint32_t> got_bits(n), want_bits(n);
        for (size_t i = 0; i < n; ++i) {
          std::memcpy(&got_bits[i], &got[i], sizeof(float));
          std::memcpy(&want_bits[i], &want[i], sizeof(float));
        }
        EXPECT_EQ(got_bits, want_bits) << IsaLevelName(isa) << " n=" << n << " k=" << k;
      }
    }
  }
}

// FirstNonFinite: the exact index of the first NaN / inf at every position of a block (the
// vector loops test 32 or 64 floats at once, then scan), for every dtype and ISA level.
TEST(VectorOps, FirstNonFiniteFindsTheFirstNanOrInfExactly) {
  const float specials[] = {
      std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::signaling_NaN()};
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t n : {0u, 1u, 31u, 64u, 200u}) {
      std::vector<float> x(n, 3.0e38f);  // finite, however large
      if (n > 1) x[n / 2] = -std::numeric_limits<float>::max();
      EXPECT_EQ(FirstNonFinite(ConstTensorView(x.data(), n), isa), n) << "n " << n;
      for (size_t at = 0; at < n; ++at) {
        for (float bad : specials) {
          std::vector<float> y = x;
          y[at] = bad;
          if (at + 7 < n) y[at + 7] = bad;  // a later one does not matter
          ASSERT_EQ(FirstNonFinite(ConstTensorView(y.data(), n), isa), at)
              << "isa " << IsaLevelName(isa) << " n " << n << " value " << bad;
        }
      }
    }
  }
  // fp16 / bf16 on every ISA level: every position of blocks and tails (the vector loops test
  // 64 or 128 values at once), exponent all ones is inf or NaN, the largest finite is not.
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      const uint16_t largest = dt == DType::kFloat16 ? 0x7BFF : 0x7F7F;
      const uint16_t inf = dt == DType::kFloat16 ? 0x7C00 : 0x7F80;
      for (size_t n : {0u, 1u, 63u, 128u, 300u}) {
        std::vector<uint16_t> x(n, largest);
        if (n > 1) x[n / 2] = static_cast<uint16_t>(largest | 0x8000);
        ASSERT_EQ(FirstNonFinite(ConstTensorView(x.data(), n, dt), isa), n);
        for (size_t at = 0; at < n; ++at) {
          for (uint16_t bad :
               {inf, static_cast<uint16_t>(inf | 0x8000), static_cast<uint16_t>(inf | 0x0040)}) {
            std::vector<uint16_t> y = x;
            y[at] = bad;
            if (at + 9 < n) y[at + 9] = bad;
            ASSERT_EQ(FirstNonFinite(ConstTensorView(y.data(), n, dt), isa), at)
                << IsaLevelName(isa) << " " << DTypeName(dt) << " n " << n;
          }
        }
      }
    }
  }
  // fp16 / bf16: exponent all ones (0x7C00 / 0x7F80) is inf or NaN; the largest finite is not.
  std::vector<uint16_t> h = {0x7BFF, 0xFBFF, 0x3C00, 0xFC00, 0x7E00};
  EXPECT_EQ(FirstNonFinite(ConstTensorView(h.data(), 3, DType::kFloat16), IsaLevel::kScalar), 3u);
  EXPECT_EQ(FirstNonFinite(ConstTensorView(h.data(), 5, DType::kFloat16), IsaLevel::kScalar), 3u);
  std::vector<uint16_t> b = {0x7F7F, 0xFF7F, 0x3F80, 0x7FC0};
  EXPECT_EQ(FirstNonFinite(ConstTensorView(b.data(), 3, DType::kBFloat16), IsaLevel::kScalar), 3u);
  EXPECT_EQ(FirstNonFinite(ConstTensorView(b.data(), 4, DType::kBFloat16), IsaLevel::kScalar), 3u);
}

// The narrowing casts (and the cast with a residual) return whether every stored value is
// finite: exactly what a scan of their output says, for NaN / inf inputs and for finite inputs
// on either side of the range where rounding gives inf (fp16 65504 / 65520, bf16's largest
// finite / the next rounding boundary), at every position of vector blocks and tails.
TEST(VectorOps, NarrowingCastsReportWhetherEveryStoredValueIsFinite) {
  auto bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  const float values[] = {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          bits(0x7F7F7FFFu),
                          bits(0x7F7F8000u),
                          bits(0xFF7F8000u),
                          std::numeric_limits<float>::max()};
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t n : {1u, 15u, 16u, 17u, 40u}) {
      for (size_t at = 0; at < n; ++at) {
        for (float v : values) {
          std::vector<float> x(n, 1.5f);
          x[at] = v;
          std::vector<uint16_t> h(n), b(n);
          const bool h_ok = FloatToHalfArray(x.data(), h.data(), n, isa);
          const bool b_ok = FloatToBf16Array(x.data(), b.data(), n, isa);
          SCOPED_TRACE(std::string(IsaLevelName(isa)) + " n " + std::to_string(n) + " at " +
                       std::to_string(at) + " value " + std::to_string(v));
          ASSERT_EQ(h_ok, FirstNonFinite(ConstTensorView(h.data(), n, DType::kFloat16),
                                         IsaLevel::kScalar) == n);
          ASSERT_EQ(b_ok, FirstNonFinite(ConstTensorView(b.data(), n, DType::kBFloat16),
                                         IsaLevel::kScalar) == n);
          for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
            std::vector<float> e(n, 0.25f);
            std::vector<uint8_t> out(n * DTypeSize(dt));
            const TensorView view(out.data(), n, dt);
            const bool ok = CastWithResidual(x.data(), e.data(), view, isa);
            ASSERT_EQ(ok,
                      FirstNonFinite(ConstTensorView(out.data(), n, dt), IsaLevel::kScalar) == n)
                << DTypeName(dt);
          }
        }
      }
    }
  }
}

TEST(AlignedBuffer, AlignedAndKeepsPrefix) {
  AlignedBuffer<float> b(5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kBufferAlignment, 0u);
  for (int i = 0; i < 5; ++i) b[i] = static_cast<float>(i);
  b.resize(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kBufferAlignment, 0u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b[i], static_cast<float>(i));
  AlignedBuffer<float> moved(std::move(b));
  EXPECT_EQ(moved.size(), 1000u);
  EXPECT_EQ(b.size(), 0u);
}

TEST(CpuFeatures, LevelsAndParsing) {
  EXPECT_TRUE(IsaSupported(IsaLevel::kScalar));
  EXPECT_TRUE(IsaSupported(BestIsaLevel()));
  EXPECT_TRUE(CheckIsaSupported(IsaLevel::kScalar).ok());
  EXPECT_EQ(*ParseIsaLevel("avx2"), IsaLevel::kAvx2);
  EXPECT_EQ(*ParseIsaLevel("auto"), BestIsaLevel());
  const Status s = ParseIsaLevel("sse9").status();
  EXPECT_NE(s.message().find("sse9"), std::string::npos);
  EXPECT_NE(s.message().find("avx512"), std::string::npos);
  if (IsaSupported(IsaLevel::kAvx512)) {
    EXPECT_TRUE(IsaSupported(IsaLevel::kAvx2));
  }
  EXPECT_FALSE(DetectCpuFeatures().ToString().empty());
}

TEST(CounterRng, DeterministicDistinctAndUniform) {
  const uint64_t s1 = StreamKey(7, 0, 1, 0), s2 = StreamKey(7, 0, 1, 1), s3 = StreamKey(7, 0, 2, 0),
                 s4 = StreamKey(8, 0, 1, 0), s5 = StreamKey(7, 1, 1, 0),
                 s6 = StreamKey(7, kServerStream, 1, 0);
  EXPECT_EQ(s1, StreamKey(7, 0, 1, 0));
  EXPECT_EQ(std::set<uint64_t>({s1, s2, s3, s4, s5, s6}).size(), 6u);
  // Uniformity of UniformBelow(·, 10) over 100k draws: every bucket within 5 sigma.
  const int kDraws = 100000, kBuckets = 10;
  std::vector<int> count(kBuckets);
  for (int i = 0; i < kDraws; ++i) ++count[UniformBelow(CounterRandom64(s1, i), kBuckets)];
  const double mean = kDraws / double(kBuckets), sigma = std::sqrt(mean * 0.9);
  for (int c : count) EXPECT_LT(std::fabs(c - mean), 5 * sigma);
  // 32-bit hash: mean of the top bit over 100k positions ~ 0.5.
  int ones = 0;
  for (uint32_t i = 0; i < 100000; ++i) ones += CounterRandom32(s1, i) >> 31;
  EXPECT_LT(std::fabs(ones - 50000.0), 5 * std::sqrt(25000.0));
}

TEST(CpuTopology, WorkerSplitDefaultsAndPlan) {
  // reduce = max(1, cores / 4) <= 8; compress = the rest after the network core, 1..8.
  EXPECT_EQ(DefaultReduceThreads(1), 1u);
  EXPECT_EQ(DefaultReduceThreads(2), 1u);
  EXPECT_EQ(DefaultReduceThreads(16), 4u);
  EXPECT_EQ(DefaultReduceThreads(64), 8u);
  EXPECT_EQ(DefaultCompressThreads(1, 1), 1u);
  EXPECT_EQ(DefaultCompressThreads(2, 1), 1u);
  EXPECT_EQ(DefaultCompressThreads(16, 4), 8u);
  EXPECT_EQ(DefaultCompressThreads(8, 2), 5u);
  // Cores in order (node 0 first), wrapping around.
  const std::vector<CpuSlot> two = {{4, 0}, {5, 0}};
  WorkerCpuPlan p = PlanWorkerCpus(two, 1, 1);
  EXPECT_EQ(p.network_cpu, 4);
  EXPECT_EQ(p.reduce_cpus, std::vector<int>({5}));
  EXPECT_EQ(p.compress_cpus, std::vector<int>({4}));
  EXPECT_EQ(DescribeWorkerCpuPlan(p), "network cpu 4, reduce cpus [5], compress cpus [4]");
  const std::vector<CpuSlot> eight = {{0, 0}, {1, 0}, {2, 0},  {3, 0},
                                      {8, 1}, {9, 1}, {10, 1}, {11, 1}};
  p = PlanWorkerCpus(eight, 2, 5);
  EXPECT_EQ(p.network_cpu, 0);
  EXPECT_EQ(p.reduce_cpus, std::vector<int>({1, 2}));
  EXPECT_EQ(p.compress_cpus, std::vector<int>({3, 8, 9, 10, 11}));
}

}  // namespace
}  // namespace bitpush
