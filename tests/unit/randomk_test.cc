// Tests of the randomk compressor: indices as a pure function of (seed, key, round, n, k)
// (against an independent Floyd reference, identical on every ISA level), uniformity of the
// sampled coordinates and subsets (chi-square bounds), unbiasedness of the n/k scaling
// (Monte-Carlo with a variance-derived bound), exact stored values, error feedback (fused ==
// generic, residual rule, telescoping), the non-finite policy, and the finiteness kernels.
#include "compressors/randomk/randomk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "common/half.h"
#include "compressors/registry.h"
#include "tests/unit/compressor_test_util.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using bitpush::testing::Compress;
using bitpush::testing::CompressEf;
using bitpush::testing::Parse;
using bitpush::testing::RandomFloats;
using bitpush::testing::Sparse;
using bitpush::testing::SupportedIsaLevels;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::unique_ptr<RandomkCompressor> MakeRandomk(const std::string& spec, IsaLevel isa) {
  StatusOr<v1::CompressorConfig> c = ParseCompressorSpec(spec);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::make_unique<RandomkCompressor>(c->randomk(), isa);
}

// Independent reference of the documented sampling: Floyd's algorithm over a vector<bool>,
// draw j = UniformBelow(CounterRandom64(StreamKey(seed, worker, key, round), j), n - k + j + 1).
std::vector<uint32_t> ReferenceIndices(uint64_t seed, uint64_t key, uint64_t round, uint64_t n,
                                       uint64_t k, uint32_t worker = 0) {
  const uint64_t stream = StreamKey(seed, worker, key, round);
  std::vector<bool> chosen(n, false);
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t top = n - k + j;
    const uint64_t r = UniformBelow(CounterRandom64(stream, j), top + 1);
    chosen[chosen[r] ? top : r] = true;
  }
  std::vector<uint32_t> out;
  for (uint64_t i = 0; i < n; ++i) {
    if (chosen[i]) out.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

TEST(Randomk, IndicesArePureFunctionOfSeedKeyRound) {
  const std::vector<IsaLevel> levels = SupportedIsaLevels();
  for (size_t n : {size_t{1}, size_t{33}, size_t{1000}, size_t{1} << 20}) {
    const std::vector<float> x = RandomFloats(n, n);
    for (const std::string spec : {"randomk:ratio=0.01", "randomk:k=5,seed=3",
                                   "randomk:ratio=0.5,unbiased=true", "randomk:ratio=1,seed=9"}) {
      SCOPED_TRACE(spec + " n=" + std::to_string(n));
      const uint64_t seed = spec.find("seed=3") != std::string::npos   ? 3
                            : spec.find("seed=9") != std::string::npos ? 9
                                                                       : 0;
      for (uint64_t round : {0ull, 1ull, 977ull}) {
        const CompressContext ctx{42, round};
        std::vector<uint8_t> first;
        for (IsaLevel isa : levels) {
          auto c = MakeRandomk(spec, isa);
          const std::vector<uint8_t> p = Compress(*c, ConstTensorView(x.data(), n), ctx);
          const Sparse s = Parse(p, DType::kFloat32);
          const size_t k = c->KeepCount(n);
          ASSERT_EQ(s.idx.size(), k);
          for (size_t j = 0; j < k; ++j) {
            ASSERT_LT(s.idx[j], n);
            if (j) {
              ASSERT_LT(s.idx[j - 1], s.idx[j]);
            }
          }
          ASSERT_EQ(s.idx, ReferenceIndices(seed, 42, round, n, k));
          if (first.empty()) {
            first = p;
          } else {
            ASSERT_EQ(p, first) << IsaLevelName(isa);
          }
          // A second call on the same instance gives the same payload (no hidden state).
          ASSERT_EQ(Compress(*c, ConstTensorView(x.data(), n), ctx), p);
        }
      }
    }
  }
}

TEST(Randomk, DifferentRoundKeyOrSeedGiveDifferentIndices) {
  const size_t n = 1000;
  const std::vector<float> x = RandomFloats(n, 1);
  auto a = MakeRandomk("randomk:k=10", BestIsaLevel());
  auto b = MakeRandomk("randomk:k=10,seed=1", BestIsaLevel());
  const auto idx = [&](RandomkCompressor& c, uint64_t key, uint64_t round) {
    return Parse(Compress(c, ConstTensorView(x.data(), n), {key, round}), DType::kFloat32).idx;
  };
  const std::vector<uint32_t> base = idx(*a, 5, 7);
  EXPECT_EQ(idx(*a, 5, 7), base);
  EXPECT_NE(idx(*a, 5, 8), base);  // round
  EXPECT_NE(idx(*a, 6, 7), base);  // key
  EXPECT_NE(idx(*b, 5, 7), base);  // seed
  // Across many rounds, all distinct (P(collision) ~ 1e-20 per pair).
  std::set<std::vector<uint32_t>> seen;
  for (uint64_t r = 0; r < 200; ++r) seen.insert(idx(*a, 5, r));
  EXPECT_EQ(seen.size(), 200u);
}

TEST(Randomk, WorkersDrawIndependentIndicesAndRerunsAreBitIdentical) {
  // Two workers (and the server's stream) compressing the same key and round: each picks the
  // reference's indices for its own (seed, worker, key, round), a rerun on a new instance is
  // bit-identical, and the index sets overlap as independent samples do: k^2/n expected
  // (hypergeometric), where a shared stream would give all k.
  const size_t n = 1 << 20;
  const std::vector<float> x = RandomFloats(n, 3);
  auto c = MakeRandomk("randomk:ratio=0.01,seed=4", BestIsaLevel());
  const size_t k = c->KeepCount(n);
  const double p = double(k) / n;
  const double mean = k * p, sd = std::sqrt(k * p * (1 - p) * (n - k) / (n - 1.0));
  double overlap_sum = 0;
  int pairs = 0;
  for (uint64_t round : {0ull, 1ull, 2ull, 3ull}) {
    std::vector<std::vector<uint32_t>> sets;
    for (uint32_t worker : {0u, 1u, 2u, kServerStream}) {
      const CompressContext ctx{11, round, worker};
      const std::vector<uint8_t> payload = Compress(*c, ConstTensorView(x.data(), n), ctx);
      EXPECT_EQ(Compress(*MakeRandomk("randomk:ratio=0.01,seed=4", BestIsaLevel()),
                         ConstTensorView(x.data(), n), ctx),
                payload)
          << "rerun of worker " << worker;
      sets.push_back(Parse(payload, DType::kFloat32).idx);
      ASSERT_EQ(sets.back(), ReferenceIndices(4, 11, round, n, k, worker));
    }
    for (size_t a = 0; a < sets.size(); ++a) {
      for (size_t b = a + 1; b < sets.size(); ++b) {
        std::vector<uint32_t> common;
        std::set_intersection(sets[a].begin(), sets[a].end(), sets[b].begin(), sets[b].end(),
                              std::back_inserter(common));
        EXPECT_LT(std::fabs(double(common.size()) - mean), 6 * sd)
            << "round " << round << " streams " << a << ", " << b << ": " << common.size()
            << " common indices of " << k;
        overlap_sum += double(common.size());
        ++pairs;
      }
    }
  }
  // The average over 24 pairs: 6 standard errors.
  EXPECT_LT(std::fabs(overlap_sum / pairs - mean), 6 * sd / std::sqrt(double(pairs)));
}

TEST(Randomk, EachIndexChosenWithFrequencyKOverN) {
  // n = 100, k = 10, R = 20000 rounds: each count c_i has mean R p and variance R p (1 - p)
  // (p = k/n), so S = sum_i (c_i - R p)^2 / (R p (1 - p)) has mean n = 100 and a standard
  // deviation of about sqrt(2n) = 14. Bound: |S - 100| < 6 sd; and every |z_i| < 6.
  const size_t n = 100, k = 10, rounds = 20000;
  auto c = MakeRandomk("randomk:k=10,seed=11", BestIsaLevel());
  const std::vector<float> x(n, 1.0f);
  std::vector<double> count(n, 0.0);
  for (size_t r = 0; r < rounds; ++r) {
    for (uint32_t i :
         Parse(Compress(*c, ConstTensorView(x.data(), n), {3, r}), DType::kFloat32).idx) {
      count[i] += 1;
    }
  }
  double total = 0;
  for (double v : count) total += v;
  ASSERT_EQ(total, static_cast<double>(rounds * k));
  const double p = static_cast<double>(k) / n;
  const double mean = rounds * p, var = rounds * p * (1 - p);
  double s = 0;
  for (size_t i = 0; i < n; ++i) {
    const double z = (count[i] - mean) / std::sqrt(var);
    EXPECT_LT(std::fabs(z), 6.0) << "index " << i << " count " << count[i];
    s += z * z;
  }
  EXPECT_LT(std::fabs(s - 100.0), 6.0 * std::sqrt(200.0)) << s;
}

TEST(Randomk, SubsetsAreUniform) {
  // Without replacement, every k-subset is equally likely: Pearson chi-square over the
  // C(n, k) subsets, R = 20000 rounds; mean = dof, sd = sqrt(2 dof); bound mean + 6 sd.
  for (size_t k : {size_t{3}, size_t{4}}) {
    const size_t n = 6, rounds = 20000;
    auto c = MakeRandomk("randomk:k=" + std::to_string(k), BestIsaLevel());
    const std::vector<float> x(n, 1.0f);
    std::map<std::vector<uint32_t>, double> count;
    for (size_t r = 0; r < rounds; ++r) {
      count[Parse(Compress(*c, ConstTensorView(x.data(), n), {1, r}), DType::kFloat32).idx] += 1;
    }
    const double subsets = k == 3 ? 20 : 15;
    ASSERT_EQ(count.size(), subsets);
    const double expect = rounds / subsets;
    double chi2 = 0;
    for (const auto& [subset, cnt] : count) chi2 += (cnt - expect) * (cnt - expect) / expect;
    const double dof = subsets - 1;
    EXPECT_LT(chi2, dof + 6 * std::sqrt(2 * dof)) << "k=" << k;
  }
}

TEST(Randomk, UnbiasedMeanConverges) {
  // E[C(x)_i] = x_i; per round Var(C(x)_i) = x_i^2 (n/k - 1). The mean over R rounds has
  // standard deviation |x_i| sqrt((n/k - 1) / R); bound: 6 of those (plus the relative error
  // of float(n/k), < 1e-7).
  for (const auto& [n, k] : {std::pair<size_t, size_t>{64, 8}, {60, 7}}) {
    const size_t rounds = 20000;
    auto c =
        MakeRandomk("randomk:k=" + std::to_string(k) + ",unbiased=true,seed=5", BestIsaLevel());
    const std::vector<float> x = RandomFloats(n, 17);
    std::vector<double> sum(n, 0.0);
    std::vector<float> out(n);
    for (size_t r = 0; r < rounds; ++r) {
      const std::vector<uint8_t> p = Compress(*c, ConstTensorView(x.data(), n), {9, r});
      ASSERT_TRUE(c->Decompress(ByteSpan(p.data(), p.size()), TensorView(out.data(), n)).ok());
      for (size_t i = 0; i < n; ++i) sum[i] += out[i];
    }
    const double ratio = static_cast<double>(n) / k;
    for (size_t i = 0; i < n; ++i) {
      const double sd = std::fabs(x[i]) * std::sqrt((ratio - 1) / rounds);
      EXPECT_NEAR(sum[i] / rounds, x[i], 6 * sd + 1e-6 * std::fabs(x[i])) << i;
    }
  }
}

TEST(Randomk, StoredValuesAreExact) {
  const size_t n = 4097;
  const std::vector<float> x = RandomFloats(n, 8);
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto plain = MakeRandomk("randomk:ratio=0.03", isa);
    Sparse s = Parse(Compress(*plain, ConstTensorView(x.data(), n), {1, 2}), DType::kFloat32);
    for (size_t j = 0; j < s.idx.size(); ++j) ASSERT_EQ(s.value_bits[j], FloatBits(x[s.idx[j]]));

    auto unbiased = MakeRandomk("randomk:ratio=0.03,unbiased=true", isa);
    const size_t k = unbiased->KeepCount(n);
    const float scale = static_cast<float>(static_cast<double>(n) / k);
    s = Parse(Compress(*unbiased, ConstTensorView(x.data(), n), {1, 2}), DType::kFloat32);
    for (size_t j = 0; j < s.idx.size(); ++j) {
      ASSERT_EQ(s.value_bits[j], FloatBits(x[s.idx[j]] * scale));
    }

    // fp16 input, unscaled: the input's own bits.
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(x[i]);
    s = Parse(Compress(*plain, ConstTensorView(h.data(), n, DType::kFloat16), {1, 2}),
              DType::kFloat16);
    for (size_t j = 0; j < s.idx.size(); ++j) ASSERT_EQ(s.value_bits[j], h[s.idx[j]]);
  }
}

TEST(Randomk, DecompressExactAndAdd) {
  const size_t n = 1000;
  const std::vector<float> x = RandomFloats(n, 12);
  auto c = MakeRandomk("randomk:k=50", BestIsaLevel());
  const std::vector<uint8_t> p = Compress(*c, ConstTensorView(x.data(), n), {4, 4});
  const Sparse s = Parse(p, DType::kFloat32);
  std::vector<bool> kept(n, false);
  for (uint32_t i : s.idx) kept[i] = true;
  std::vector<float> out(n, 3.0f);
  ASSERT_TRUE(c->Decompress(ByteSpan(p.data(), p.size()), TensorView(out.data(), n)).ok());
  const std::vector<float> base = RandomFloats(n, 13);
  std::vector<float> acc = base;
  ASSERT_TRUE(c->DecompressAdd(ByteSpan(p.data(), p.size()), Span<float>(acc.data(), n)).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(FloatBits(out[i]), kept[i] ? FloatBits(x[i]) : 0u);
    ASSERT_EQ(acc[i], kept[i] ? base[i] + x[i] : base[i]);
  }
  // A bad index is rejected with the compressor's name, leaving the accumulator alone.
  std::vector<uint8_t> bad = p;
  const uint32_t oob = 1000;
  std::memcpy(bad.data() + kPayloadHeaderBytes + 4, &oob, 4);
  std::vector<float> acc2 = base;
  const Status st = c->DecompressAdd(ByteSpan(bad.data(), bad.size()), Span<float>(acc2.data(), n));
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.message().rfind("randomk: index 1000 at position 0", 0), 0u) << st.message();
  EXPECT_EQ(acc2, base);
}

TEST(Randomk, ZeroElements) {
  auto c = MakeRandomk("randomk:ratio=0.5", BestIsaLevel());
  const std::vector<uint8_t> p =
      Compress(*c, ConstTensorView(static_cast<const float*>(nullptr), 0));
  EXPECT_EQ(p.size(), kPayloadHeaderBytes + 4);
  std::vector<float> e;
  EXPECT_EQ(CompressEf(*c, ConstTensorView(static_cast<const float*>(nullptr), 0), e), p);
}

TEST(RandomkErrorFeedback, FusedEqualsGenericAndResidualRule) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (const std::string spec : {"randomk:ratio=0.05", "randomk:ratio=0.05,unbiased=true"}) {
      for (size_t n : {size_t{33}, size_t{4097}}) {
        SCOPED_TRACE(spec + " n=" + std::to_string(n));
        const std::vector<float> g = RandomFloats(n, n + 1);
        const std::vector<float> e0 = RandomFloats(n, n + 2, 0.5f);
        std::vector<float> q(n);
        for (size_t i = 0; i < n; ++i) q[i] = g[i] + e0[i];
        const CompressContext ctx{7, 3};

        auto c = MakeRandomk(spec, isa);
        std::vector<float> e_fused = e0;
        const std::vector<uint8_t> fused =
            CompressEf(*c, ConstTensorView(g.data(), n), e_fused, ctx);
        std::vector<float> e_generic = q;
        std::vector<uint8_t> body(c->MaxCompressedBytes(n, DType::kFloat32));
        const size_t bytes =
            c->EncodeBodyWithFeedback(e_generic.data(), n, DType::kFloat32, ctx, body.data());
        ASSERT_EQ(bytes + kPayloadHeaderBytes, fused.size());
        ASSERT_EQ(0, std::memcmp(body.data(), fused.data() + kPayloadHeaderBytes, bytes));
        ASSERT_EQ(0, std::memcmp(e_generic.data(), e_fused.data(), n * 4));
        ASSERT_EQ(Compress(*c, ConstTensorView(q.data(), n), ctx), fused);

        std::vector<float> decoded(n);
        ASSERT_TRUE(
            c->Decompress(ByteSpan(fused.data(), fused.size()), TensorView(decoded.data(), n))
                .ok());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(e_fused[i], q[i] - decoded[i]) << i;  // exact
      }
    }
  }
}

// sum_t C(q_t) + e_T == sum_t g_t up to fp32 rounding of the residual updates.
void CheckTelescoping(const std::string& spec, DType dtype) {
  const size_t n = 4097;
  auto c = MakeRandomk(spec, BestIsaLevel());
  std::vector<float> e(n, 0.0f);
  std::vector<double> sum_g(n, 0.0), sum_c(n, 0.0), scale(n, 1.0);
  std::vector<uint16_t> h(n);
  for (uint64_t t = 0; t < 100; ++t) {
    std::vector<float> g = RandomFloats(n, 500 + t);
    ConstTensorView view(g.data(), n);
    if (dtype == DType::kFloat16) {
      for (size_t i = 0; i < n; ++i) {
        h[i] = FloatToHalf(g[i]);
        g[i] = HalfToFloat(h[i]);
      }
      view = ConstTensorView(h.data(), n, dtype);
    }
    const std::vector<uint8_t> p = CompressEf(*c, view, e, {2, t});
    std::vector<float> dec(n, 0.0f);
    ASSERT_TRUE(c->DecompressAdd(ByteSpan(p.data(), p.size()), Span<float>(dec.data(), n)).ok());
    for (size_t i = 0; i < n; ++i) {
      sum_g[i] += g[i];
      sum_c[i] += dec[i];
      scale[i] += std::fabs(g[i]) + std::fabs(dec[i]);  // magnitudes the rounding acts on
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sum_c[i] + e[i], sum_g[i], 1e-5 * scale[i]) << spec << " element " << i;
  }
}

TEST(RandomkErrorFeedback, TelescopesOver100Rounds) {
  CheckTelescoping("randomk:ratio=0.05", DType::kFloat32);
  CheckTelescoping("randomk:ratio=0.05,unbiased=true", DType::kFloat32);
  CheckTelescoping("randomk:ratio=0.05", DType::kFloat16);
  CheckTelescoping("randomk:k=1", DType::kFloat32);
}

TEST(RandomkNonFinite, AnyNonFiniteMakesEveryStoredValueNaN) {
  const size_t n = 1000;
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (const std::string spec : {"randomk:k=10", "randomk:k=10,unbiased=true"}) {
      auto c = MakeRandomk(spec, isa);
      const CompressContext ctx{1, 1};
      const std::vector<uint32_t> picked = ReferenceIndices(0, 1, 1, n, 10);
      uint32_t victim = 0;  // an index the sample does not pick
      while (std::binary_search(picked.begin(), picked.end(), victim)) ++victim;
      for (float bad : {kNaN, kInf, -kInf}) {
        std::vector<float> x = RandomFloats(n, 2);
        x[victim] = bad;
        const std::vector<uint8_t> p = Compress(*c, ConstTensorView(x.data(), n), ctx);
        const Sparse s = Parse(p, DType::kFloat32);
        ASSERT_EQ(s.idx, picked);
        for (uint32_t bits : s.value_bits) ASSERT_TRUE(std::isnan(BitsToFloat(bits)));
        std::vector<float> acc(n, 0.0f);
        ASSERT_TRUE(
            c->DecompressAdd(ByteSpan(p.data(), p.size()), Span<float>(acc.data(), n)).ok());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::isnan(acc[i]), std::binary_search(picked.begin(), picked.end(), i));
        }
        // Error feedback: same payload; the residual is reset, not left holding the inf.
        std::vector<float> e(n, 0.5f);
        std::vector<float> g = x;
        for (float& v : g) v -= 0.5f;
        g[victim] = bad;
        EXPECT_EQ(CompressEf(*c, ConstTensorView(g.data(), n), e, ctx), p);
        EXPECT_EQ(e, std::vector<float>(n, 0.0f));
        // fp16 input (generic path): non-finite bits, NaN values, residual reset.
        std::vector<uint16_t> h(n);
        for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(x[i]);
        std::vector<float> eh(n, 0.5f);
        const Sparse sh =
            Parse(CompressEf(*c, ConstTensorView(h.data(), n, DType::kFloat16), eh, ctx),
                  DType::kFloat16);
        for (uint32_t bits : sh.value_bits)
          ASSERT_TRUE(std::isnan(HalfToFloat(static_cast<uint16_t>(bits))));
        EXPECT_EQ(eh, std::vector<float>(n, 0.0f));
      }
      // All finite (including the largest float and denormals): values stay finite.
      std::vector<float> x = RandomFloats(n, 3);
      x[victim] = std::numeric_limits<float>::max();
      x[victim + 1] = 1e-44f;
      const Sparse s = Parse(Compress(*c, ConstTensorView(x.data(), n), {5, 5}), DType::kFloat32);
      for (size_t j = 0; j < s.idx.size(); ++j) {
        if (s.idx[j] != victim) {
          ASSERT_TRUE(std::isfinite(BitsToFloat(s.value_bits[j])));
        }
      }
    }
  }
}

TEST(RandomkNonFinite, ScalingOverflowLeavesNoInfiniteResidual) {
  const size_t n = 10;
  auto c = MakeRandomk("randomk:k=10,unbiased=true", BestIsaLevel());  // k = n: scale 1
  auto c2 = MakeRandomk("randomk:k=1,unbiased=true", BestIsaLevel());  // scale 10
  std::vector<float> g(n, 3e38f);
  std::vector<float> e(n, 0.0f);
  CompressEf(*c, ConstTensorView(g.data(), n), e);
  EXPECT_EQ(e, std::vector<float>(n, 0.0f));
  const Sparse s = Parse(CompressEf(*c2, ConstTensorView(g.data(), n), e, {0, 1}), DType::kFloat32);
  EXPECT_EQ(BitsToFloat(s.value_bits[0]), kInf);  // 3e38 * 10 overflows: that is the math
  for (float v : e) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(e[s.idx[0]], 0.0f);
}

TEST(RandomkKernels, FinitenessScanMatchesOnEveryLevel) {
  for (size_t n = 0; n <= 100; ++n) {
    std::vector<float> x = RandomFloats(n, n);
    const std::vector<float> g = RandomFloats(n, n + 1000);
    if (n) x[n / 2] = std::numeric_limits<float>::max();
    for (IsaLevel isa : SupportedIsaLevels()) {
      ASSERT_TRUE(RandomkAllFinite(x.data(), n, isa)) << n;
      std::vector<float> e = x;
      for (float& v : e) v = std::fabs(v) * 1e-3f;
      ASSERT_TRUE(RandomkAddAllFinite(g.data(), e.data(), n, isa)) << n;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(e[i], g[i] + std::fabs(x[i]) * 1e-3f);
      for (size_t pos = 0; pos < n; ++pos) {
        for (float bad : {kNaN, kInf, -kInf}) {
          std::vector<float> y = x;
          y[pos] = bad;
          ASSERT_FALSE(RandomkAllFinite(y.data(), n, isa)) << n << " " << pos;
          // Non-finite sum from finite g and e: max + max overflows.
          std::vector<float> e2(n, 0.0f);
          std::vector<float> g2 = g;
          g2[pos] = std::numeric_limits<float>::max();
          e2[pos] = bad == kNaN ? kNaN : std::numeric_limits<float>::max();
          ASSERT_FALSE(RandomkAddAllFinite(g2.data(), e2.data(), n, isa)) << n << " " << pos;
          for (size_t i = 0; i < n; ++i) {  // the add still ran over every element
            if (i != pos) {
              ASSERT_EQ(e2[i], g2[i]) << n << " " << pos << " " << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace bitpush::compressors
