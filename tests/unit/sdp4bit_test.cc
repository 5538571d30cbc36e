// Tests of the sdp4bit compressor (compressors/sdp4bit/sdp4bit.h, paper 002 TLq-HS): the 32-point
// Hadamard transform (H H = 32 I, a dense +-1 matrix, inverse, outlier spreading), the quantiser's
// golden bytes (scale = absmax / L, zero groups, int4 packing with the even element in the high
// nibble), stochastic rounding (unbiased, variance <= step^2 / 4), exact round trips, the
// paper's point (the transform lowers the error on outlier-heavy inputs), payload sizes, the
// decoder's refusals, the server's reply kinds, the fused server round (exact cases, a float64
// reference, bit for bit with hadamard=off) and ISA agreement on special values.
#include "compressors/sdp4bit/sdp4bit.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "common/half.h"
#include "compressors/payload.h"
#include "compressors/registry.h"
#include "compressors/sdp4bit/sdp4bit_kernels.h"
#include "tests/unit/compressor_test_util.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using bitpush::testing::RandomFloats;
using bitpush::testing::SupportedIsaLevels;

constexpr size_t kH = 32;
const CompressContext kServer{1, 0, kServerStream};

std::unique_ptr<Compressor> Make(const std::string& spec, IsaLevel isa = BestIsaLevel()) {
  CompressorOptions o;
  o.isa = isa;
  auto c = CreateCompressor(spec, o);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status().ToString();
  return std::move(c).value();
}

std::vector<uint8_t> Compress(Compressor& c, const std::vector<float>& x,
                              CompressContext ctx = {3, 0}) {
  std::vector<uint8_t> out(c.MaxCompressedBytes(x.size(), DType::kFloat32));
  auto r = c.Compress(ConstTensorView(x.data(), x.size()), ctx, {out.data(), out.size()});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  out.resize(r.ok() ? *r : 0);
  return out;
}

std::vector<float> Decompress(Compressor& c, const std::vector<uint8_t>& p, size_t n) {
  std::vector<float> out(n, 12345.0f);
  const Status s = c.Decompress({p.data(), p.size()}, TensorView(out.data(), n));
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// Sylvester's H32: entry (i, j) = (-1)^popcount(i & j).
int H(size_t i, size_t j) {
  return __builtin_popcountll(i & j) % 2 ? -1 : 1;
}

// A kind-1 payload parsed from the documented layout.
struct Parsed {
  uint8_t kind, bits, hadamard, reserved;
  uint32_t group;
  std::vector<float> scales;
  std::vector<int> codes;  // m codes
};

Parsed Parse(const std::vector<uint8_t>& p, size_t n) {
  Parsed r{};
  const uint8_t* b = p.data() + kPayloadHeaderBytes;
  r.kind = b[0];
  r.bits = b[1];
  r.hadamard = b[2];
  r.reserved = b[3];
  std::memcpy(&r.group, b + 4, 4);
  const size_t m = r.hadamard ? (n + kH - 1) / kH * kH : n;
  const size_t groups = (m + r.group - 1) / r.group;
  EXPECT_EQ(p.size(), kPayloadHeaderBytes + 8 + 4 * groups + (r.bits == 4 ? (m + 1) / 2 : m));
  r.scales.resize(groups);
  if (groups) std::memcpy(r.scales.data(), b + 8, 4 * groups);
  const uint8_t* c = b + 8 + 4 * groups;
  for (size_t i = 0; i < m; ++i) {
    if (r.bits == 8) {
      r.codes.push_back(static_cast<int8_t>(c[i]));
    } else {
      const int nib = i % 2 == 0 ? c[i / 2] >> 4 : c[i / 2] & 0xF;
      r.codes.push_back(nib >= 8 ? nib - 16 : nib);
    }
  }
  return r;
}

// y = H32 x per block in fp32 through the scalar kernel (the reference the others must equal).
std::vector<float> Transformed(std::vector<float> x) {
  x.resize((x.size() + kH - 1) / kH * kH, 0.0f);
  sdp4bit::TransformBlocks(x.data(), x.size(), false, IsaLevel::kScalar);
  return x;
}

// ---- Hadamard transform ------------------------------------------------------------------------

TEST(Sdp4bitHadamard, ForwardIsTheSylvesterMatrixAndSquaresTo32I) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    SCOPED_TRACE(IsaLevelName(isa));
    for (size_t j = 0; j < kH; ++j) {
      std::vector<float> e(kH, 0.0f);
      e[j] = 1.0f;
      sdp4bit::TransformBlocks(e.data(), kH, false, isa);
      for (size_t i = 0; i < kH; ++i) ASSERT_EQ(e[i], static_cast<float>(H(i, j))) << i << "," << j;
      sdp4bit::TransformBlocks(e.data(), kH, false, isa);
      for (size_t i = 0; i < kH; ++i) ASSERT_EQ(e[i], i == j ? 32.0f : 0.0f) << i << "," << j;
    }
  }
}

TEST(Sdp4bitHadamard, EqualsDenseMatrixProductOnIntegers) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> d(-1000, 1000);
  const size_t m = 7 * kH;
  std::vector<float> x(m);
  for (float& v : x) v = static_cast<float>(d(rng));
  for (IsaLevel isa : SupportedIsaLevels()) {
    std::vector<float> y = x;
    sdp4bit::TransformBlocks(y.data(), m, false, isa);
    for (size_t b = 0; b < m; b += kH) {
      for (size_t i = 0; i < kH; ++i) {
        double want = 0;
        for (size_t j = 0; j < kH; ++j) want += H(i, j) * static_cast<double>(x[b + j]);
        ASSERT_EQ(y[b + i], static_cast<float>(want)) << IsaLevelName(isa) << " " << b + i;
      }
    }
  }
}

TEST(Sdp4bitHadamard, InverseUndoesForwardAndLevelsAgree) {
  const size_t m = 64 * kH;
  std::vector<float> x = RandomFloats(m, 11);
  x[100] = 1e6f;  // an outlier in one block
  std::vector<float> first;
  for (IsaLevel isa : SupportedIsaLevels()) {
    std::vector<float> y = x;
    sdp4bit::TransformBlocks(y.data(), m, false, isa);
    std::vector<float> fwd = y;
    sdp4bit::TransformBlocks(y.data(), m, true, isa);
    for (size_t b = 0; b < m; b += kH) {
      float amax = 0;
      for (size_t j = 0; j < kH; ++j) amax = std::max(amax, std::fabs(x[b + j]));
      for (size_t j = 0; j < kH; ++j) {
        ASSERT_NEAR(y[b + j], x[b + j], 1e-6f * amax) << IsaLevelName(isa) << " " << b + j;
      }
    }
    fwd.insert(fwd.end(), y.begin(), y.end());
    if (first.empty()) {
      first = fwd;
    } else {
      EXPECT_TRUE(SameBits(fwd, first)) << IsaLevelName(isa);
    }
  }
}

TEST(Sdp4bitHadamard, OneHotOutlierSpreadsOverTheWholeBlock) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t j : {0, 5, 31}) {
      std::vector<float> x(2 * kH, 0.0f);
      x[kH + j] = -96.0f;
      sdp4bit::TransformBlocks(x.data(), x.size(), false, isa);
      for (size_t i = 0; i < kH; ++i) {
        EXPECT_EQ(x[i], 0.0f);
        // Unnormalised: +-96 everywhere (the orthonormal H32 / sqrt(32) would give 96 / sqrt(32)).
        EXPECT_EQ(x[kH + i], -96.0f * static_cast<float>(H(i, j))) << i;
      }
    }
  }
}

// ---- quantiser golden values -------------------------------------------------------------------

TEST(Sdp4bitQuantizer, Int4GoldenBytesEvenElementInTheHighNibble) {
  auto c = Make("sdp4bit:hadamard=off,group=8");
  // absmax 7: scale 1, inv 1, every value an integer: stochastic rounding is exact.
  const std::vector<float> x = {7, -7, 1, -1, 0, 3, -3, 2, /* group 2 */ 0, 0, 0, 0, 0};
  const std::vector<uint8_t> p = Compress(*c, x);
  const std::vector<uint8_t> want = {
      1,    4,    0,    0,    8,    0,    0,    0,     // kind 1, bits 4, hadamard 0, G = 8
      0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x80, 0x3F,  // scales 1.0f, 1.0f (a zero group)
      0x79, 0x1F, 0x03, 0xD2,                          // (7,-7) (1,-1) (0,3) (-3,2)
      0x00, 0x00, 0x00};                               // 5 zeros; the odd m: last low nibble 0
  ASSERT_EQ(p.size(), kPayloadHeaderBytes + want.size());
  EXPECT_EQ(std::vector<uint8_t>(p.begin() + kPayloadHeaderBytes, p.end()), want);
  EXPECT_TRUE(SameBits(Decompress(*c, p, x.size()), x));
}

TEST(Sdp4bitQuantizer, Int8GoldenBytes) {
  auto c = Make("sdp4bit:bits=8,hadamard=off,group=4");
  const std::vector<float> x = {127, -127, 1, -1, 0, 0, 0, 0, -254, 2, 0, 6};
  const std::vector<uint8_t> p = Compress(*c, x);
  const std::vector<uint8_t> want = {1,    8,    0,    0,    4,    0,    0,    0,     // header
                                     0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x80, 0x3F,  // 1, 1
                                     0x00, 0x00, 0x00, 0x40,                          // 2
                                     0x7F, 0x81, 0x01, 0xFF, 0,    0,    0,    0,     //
                                     0x81, 0x01, 0x00, 0x03};
  ASSERT_EQ(p.size(), kPayloadHeaderBytes + want.size());
  EXPECT_EQ(std::vector<uint8_t>(p.begin() + kPayloadHeaderBytes, p.end()), want);
  EXPECT_TRUE(SameBits(Decompress(*c, p, x.size()), x));
}

// Stored scale == fp32(absmax / L) of the (transformed) group, codes within +-L, the absmax
// element on +-L, all-zero groups -> scale 1 and codes 0; on every level.
TEST(Sdp4bitQuantizer, ScalesAreAbsmaxOverLAndCodesInRange) {
  for (const std::string spec : {"sdp4bit", "sdp4bit:hadamard=off", "sdp4bit:bits=8,group=256",
                                 "sdp4bit:hadamard=off,group=30", "sdp4bit:group=32"}) {
    for (IsaLevel isa : SupportedIsaLevels()) {
      SCOPED_TRACE(spec + " " + std::string(IsaLevelName(isa)));
      auto c = Make(spec, isa);
      auto* s = dynamic_cast<Sdp4bitCompressor*>(c.get());
      ASSERT_NE(s, nullptr);
      const size_t n = 1000;
      std::vector<float> x = RandomFloats(n, 17, 3.0f);
      std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // whole zero groups (G <= 256)
      const std::vector<uint8_t> p = Compress(*c, x);
      const Parsed r = Parse(p, n);
      EXPECT_EQ(r.kind, 1);
      EXPECT_EQ(r.bits, s->bits());
      EXPECT_EQ(r.hadamard, s->hadamard() ? 1 : 0);
      EXPECT_EQ(r.reserved, 0);
      EXPECT_EQ(r.group, s->group());
      const std::vector<float> y = s->hadamard() ? Transformed(x) : x;
      const int levels = s->bits() == 4 ? 7 : 127;
      ASSERT_EQ(y.size(), r.codes.size());
      for (size_t g = 0; g < r.scales.size(); ++g) {
        const size_t first = g * s->group();
        const size_t last = std::min<size_t>(first + s->group(), y.size());
        float amax = 0;
        size_t arg = first;
        for (size_t i = first; i < last; ++i) {
          if (std::fabs(y[i]) > amax) {
            amax = std::fabs(y[i]);
            arg = i;
          }
        }
        for (size_t i = first; i < last; ++i) {
          ASSERT_LE(std::abs(r.codes[i]), levels) << i;
          if (amax == 0) {
            ASSERT_EQ(r.codes[i], 0) << i;
          }
        }
        if (amax == 0) {
          EXPECT_EQ(r.scales[g], 1.0f) << g;
        } else {
          EXPECT_EQ(r.scales[g], amax / static_cast<float>(levels)) << g;
          EXPECT_EQ(std::abs(r.codes[arg]), levels) << arg;
          EXPECT_EQ(r.codes[arg] < 0, y[arg] < 0) << arg;
        }
      }
    }
  }
}

// Every code is floor(v) or floor(v) + 1, v = y * fp32(L / absmax), chosen by the documented
// 16-bit random number: an independent encoder from the layout and common/counter_rng.h, written
// as the comparison it amounts to (floor(w) + r16 >= 2^16 (k + 1) exactly when the fraction's
// 16-bit floor plus r16 carries).
TEST(Sdp4bitQuantizer, CodesFollowTheDocumentedStochasticRounding) {
  for (const std::string spec : {"sdp4bit:seed=9", "sdp4bit:hadamard=off,bits=8,seed=9",
                                 "sdp4bit:hadamard=off,group=30,seed=9"}) {
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto c = Make(spec, isa);
      auto* s = dynamic_cast<Sdp4bitCompressor*>(c.get());
      const size_t n = 777;
      const std::vector<float> x = RandomFloats(n, 23);
      const CompressContext ctx{12, 34, 5};
      const Parsed r = Parse(Compress(*c, x, ctx), n);
      const std::vector<float> y = s->hadamard() ? Transformed(x) : x;
      const uint64_t stream = StreamKey(9, 5, 12, 34);
      const float levels = s->bits() == 4 ? 7.0f : 127.0f;
      size_t ups = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        const size_t g = i / s->group();
        float gmax = 0;
        for (size_t k = g * s->group(); k < std::min<size_t>((g + 1) * s->group(), y.size()); ++k) {
          gmax = std::max(gmax, std::fabs(y[k]));
        }
        const float v = y[i] * (levels / gmax);
        const double lo = std::floor(static_cast<double>(v));
        // The 16-bit floor of the fraction (v * 2^16 is exact in double).
        const double frac16 = std::floor((static_cast<double>(v) - lo) * 65536.0);
        // Elements i and i + 16 of a 32-block share a number: low and high half.
        const uint32_t rnd =
            CounterRandom32Lite(stream, static_cast<uint32_t>((i / 32) * 16 + i % 16));
        const uint32_t r16 = (i / 16) % 2 == 0 ? rnd & 0xFFFFu : rnd >> 16;
        const bool up = frac16 + r16 >= 65536.0;
        ups += up ? 1 : 0;
        int want = static_cast<int>(lo) + (up ? 1 : 0);
        want = std::max(-static_cast<int>(levels), std::min(static_cast<int>(levels), want));
        ASSERT_EQ(r.codes[i], want) << spec << " " << IsaLevelName(isa) << " element " << i;
      }
      EXPECT_GT(ups, y.size() / 8) << spec;  // the rounding does go up (not all floor)
    }
  }
}

// The random numbers of the rounding: 16-bit halves of CounterRandom32Lite, a pure function of
// (stream, element index): element i of a 32-block takes the low half of the number at
// (i / 32) * 16 + i % 16 for i % 32 < 16, its high half otherwise. Checked exactly on values
// whose fraction is known: with absmax L (inv 1, v = y) and y = k + f, f = j / 2^16, the code is
// k + 1 exactly when r16 >= 2^16 - j.
TEST(Sdp4bitQuantizer, RandomNumbersAreTheDocumentedSixteenBitHalves) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    SCOPED_TRACE(IsaLevelName(isa));
    auto c = Make("sdp4bit:hadamard=off,group=64,seed=4", isa);
    const size_t n = 4096;
    const CompressContext ctx{2, 6, 1};
    const uint64_t stream = StreamKey(4, 1, 2, 6);
    // Fraction 1/2 exactly: the code says whether r16 >= 2^15 (the top bit of the half).
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = i % 64 == 0 ? 7.0f : 2.5f;
    const Parsed r = Parse(Compress(*c, x, ctx), n);
    for (size_t i = 0; i < n; ++i) {
      if (i % 64 == 0) continue;
      const uint32_t rnd =
          CounterRandom32Lite(stream, static_cast<uint32_t>((i / 32) * 16 + i % 16));
      const uint32_t r16 = (i / 16) % 2 == 0 ? rnd & 0xFFFFu : rnd >> 16;
      ASSERT_EQ(r.codes[i], r16 >= 0x8000u ? 3 : 2) << i;
    }
    // Fraction 1/2^16: up only for r16 = 0xFFFF; fraction 1 - 2^-16: down only for r16 = 0.
    for (const float f : {0x1p-16f, 1.0f - 0x1p-16f}) {
      for (size_t i = 0; i < n; ++i) x[i] = i % 64 == 0 ? 7.0f : 1.0f + f;
      const Parsed q = Parse(Compress(*c, x, ctx), n);
      for (size_t i = 0; i < n; ++i) {
        if (i % 64 == 0) continue;
        const uint32_t rnd =
            CounterRandom32Lite(stream, static_cast<uint32_t>((i / 32) * 16 + i % 16));
        const uint32_t r16 = (i / 16) % 2 == 0 ? rnd & 0xFFFFu : rnd >> 16;
        const uint32_t j = static_cast<uint32_t>(f * 65536.0f);
        ASSERT_EQ(q.codes[i], r16 >= 65536u - j ? 2 : 1) << i << " f=" << f;
      }
    }
  }
}

// ---- stochastic rounding: unbiased, bounded variance -------------------------------------------

void CheckUnbiased(const std::string& spec, bool real_domain_bound) {
  auto c = Make(spec);
  auto* s = dynamic_cast<Sdp4bitCompressor*>(c.get());
  const size_t n = 256;
  const int rounds = 4000;
  const std::vector<float> x = RandomFloats(n, 41);
  std::vector<double> sum(n, 0.0), sum2(n, 0.0);
  std::vector<float> step;
  for (int t = 0; t < rounds; ++t) {
    const std::vector<uint8_t> p = Compress(*c, x, {7, static_cast<uint64_t>(t)});
    if (t == 0) step = Parse(p, n).scales;  // the same every round: x is fixed
    const std::vector<float> d = Decompress(*c, p, n);
    for (size_t i = 0; i < n; ++i) {
      sum[i] += d[i];
      sum2[i] += static_cast<double>(d[i]) * d[i];
    }
  }
  const std::vector<float> y = s->hadamard() ? Transformed(x) : x;
  double var_sum = 0, want_var_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double delta = step[i / s->group()];
    const double mean = sum[i] / rounds;
    const double var = sum2[i] / rounds - mean * mean;
    // Per element: the decoded value is Delta * (floor(v) + Bernoulli(p)) in the quantised
    // domain, variance Delta^2 p (1 - p) <= Delta^2 / 4; through the inverse transform (an
    // average of 32 independent such errors) <= Delta^2 / (4 * 32).
    const double bound = real_domain_bound ? delta * delta / (4.0 * kH) : delta * delta / 4.0;
    EXPECT_NEAR(mean, x[i], 4.0 * std::sqrt(bound / rounds) + 1e-6 * delta) << spec << " " << i;
    EXPECT_LE(var, bound * 1.02 + 1e-12) << spec << " " << i;
    var_sum += var;
    if (!real_domain_bound) {
      const double v = y[i] / delta;  // y / Delta = y * L / absmax, up to rounding
      const double p = v - std::floor(v);
      want_var_sum += delta * delta * p * (1 - p);
    }
  }
  if (!real_domain_bound) {
    // The summed variance is the binomial one (relative spread ~ sqrt(2 / rounds) / sqrt(n)).
    EXPECT_NEAR(var_sum / want_var_sum, 1.0, 0.02) << spec;
  }
}

TEST(Sdp4bitStochasticRounding, UnbiasedWithVarianceAtMostAQuarterStepSquared) {
  CheckUnbiased("sdp4bit:hadamard=off,group=64", false);
  CheckUnbiased("sdp4bit:hadamard=off,bits=8,group=32", false);
  CheckUnbiased("sdp4bit:group=64", true);
}

TEST(Sdp4bitStochasticRounding, StreamsDependOnWorkerKeyRoundAndSeed) {
  auto c = Make("sdp4bit");
  auto c2 = Make("sdp4bit:seed=1");
  const std::vector<float> x = RandomFloats(4096, 3);
  const auto base = Compress(*c, x, {1, 2, 3});
  EXPECT_EQ(Compress(*c, x, {1, 2, 3}), base);  // reproducible
  EXPECT_NE(Compress(*c, x, {1, 2, 4}), base);
  EXPECT_NE(Compress(*c, x, {1, 3, 3}), base);
  EXPECT_NE(Compress(*c, x, {2, 2, 3}), base);
  EXPECT_NE(Compress(*c2, x, {1, 2, 3}), base);
}

// ---- exact cases -------------------------------------------------------------------------------

// Inputs whose Hadamard-domain values are integer multiples of a power-of-two step with +-L in
// every group: every operation is exact, so the quantiser is the identity (p = 0).
std::vector<float> ExactInput(size_t n, uint32_t bits, uint32_t group, bool hadamard, float step,
                              uint64_t seed) {
  const int levels = bits == 4 ? 7 : 127;
  const size_t m = hadamard ? (n + kH - 1) / kH * kH : n;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int> d(-levels, levels);
  std::vector<float> y(m);
  for (float& v : y) v = static_cast<float>(d(rng)) * step;
  for (size_t g = 0; g < m; g += group) y[g] = (g / group % 2 ? -levels : levels) * step;
  if (!hadamard) return y;
  // x = H y / 32: exact (integer sums, a power-of-two scale); H x = y exactly again.
  sdp4bit::TransformBlocks(y.data(), m, true, IsaLevel::kScalar);
  EXPECT_TRUE(n == m) << "choose n a multiple of 32 so the padding stays zero";
  return y;
}

TEST(Sdp4bitExact, QuantiserIsTheIdentityOnGridInputs) {
  for (const std::string spec : {"sdp4bit", "sdp4bit:hadamard=off", "sdp4bit:bits=8,group=256",
                                 "sdp4bit:bits=8,hadamard=off,group=6"}) {
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto c = Make(spec, isa);
      auto* s = dynamic_cast<Sdp4bitCompressor*>(c.get());
      const size_t n = 32 * 40;
      const std::vector<float> x = ExactInput(n, s->bits(), s->group(), s->hadamard(), 0.25f, 1);
      for (uint64_t round = 0; round < 3; ++round) {
        EXPECT_TRUE(SameBits(Decompress(*c, Compress(*c, x, {1, round}), n), x))
            << spec << " " << IsaLevelName(isa);
      }
    }
  }
}

// The fused round over W grid pushes y_w = a_w * P * step (one pattern P with +-L in each group,
// powers of two a_w summing to a power of two): the Hadamard-domain sum is again on a grid, so
// re-quantising it is exact, and the reply is the exact sum (scale 1) or average (W = 1, 2).
TEST(Sdp4bitExact, FusedRoundOfGridPushesIsTheExactSum) {
  const std::vector<std::vector<float>> weights = {{1}, {1, 1}, {1, 1, 2}, {1, 1, 2, 4, 8}};
  for (const std::string pull : {"sdp4bit", "fp32"}) {
    for (const std::string base : {"sdp4bit", "sdp4bit:hadamard=off,bits=8,group=64"}) {
      const std::string spec = base + (base == "sdp4bit" ? ":" : ",") + "pull=" + pull;
      for (IsaLevel isa : SupportedIsaLevels()) {
        auto worker = Make(spec, isa);
        auto server = Make(spec, isa);
        auto* s = dynamic_cast<Sdp4bitCompressor*>(server.get());
        const size_t n = 32 * 70;
        const std::vector<float> pattern =
            ExactInput(n, s->bits(), s->group(), s->hadamard(), 1.0f, 7);
        for (const auto& a : weights) {
          const size_t w_count = a.size();
          std::vector<std::vector<uint8_t>> pushes;
          std::vector<float> sum(n, 0.0f);
          for (size_t w = 0; w < w_count; ++w) {
            std::vector<float> xw(n);
            for (size_t i = 0; i < n; ++i) xw[i] = pattern[i] * a[w] * 0.5f;
            for (size_t i = 0; i < n; ++i) sum[i] += xw[i];
            pushes.push_back(Compress(*worker, xw, {4, 9, static_cast<uint32_t>(w)}));
          }
          std::vector<ByteSpan> spans;
          for (const auto& p : pushes) {
            ASSERT_TRUE(server->ValidatePayload({p.data(), p.size()}, n).ok());
            spans.emplace_back(p.data(), p.size());
          }
          for (float scale : {1.0f, 1.0f / static_cast<float>(w_count)}) {
            if (w_count > 2 && scale != 1.0f) continue;  // 1/3, 1/5 are not exact
            SCOPED_TRACE(spec + " " + std::string(IsaLevelName(isa)) +
                         " W=" + std::to_string(w_count) + " scale " + std::to_string(scale));
            std::vector<uint8_t> out(server->MaxCompressedBytes(n, DType::kFloat32));
            CompressContext ctx = kServer;
            auto r =
                server->AggregateCompress(spans, n, scale, nullptr, ctx, {out.data(), out.size()});
            ASSERT_TRUE(r.ok()) << r.status().ToString();
            out.resize(*r);
            EXPECT_EQ(out[kPayloadHeaderBytes], pull == "fp32" ? 2 : 1);
            std::vector<float> want = sum;
            for (float& v : want) v *= scale;
            EXPECT_TRUE(SameBits(Decompress(*server, out, n), want));
          }
        }
      }
    }
  }
}

// ---- the paper's point: the transform smooths outliers -----------------------------------------

double Mse(Compressor& c, const std::vector<float>& x, int rounds) {
  double se = 0;
  for (int t = 0; t < rounds; ++t) {
    const std::vector<float> d =
        Decompress(c, Compress(c, x, {1, static_cast<uint64_t>(t)}), x.size());
    for (size_t i = 0; i < x.size(); ++i) se += (d[i] - x[i]) * static_cast<double>(d[i] - x[i]);
  }
  return se / (static_cast<double>(x.size()) * rounds);
}

TEST(Sdp4bitHadamard, SmoothingLowersTheErrorOnOutliersAndCostsNothingWithout) {
  auto on = Make("sdp4bit");
  auto off = Make("sdp4bit:hadamard=off");
  const size_t n = 1 << 16;
  std::vector<float> gauss = RandomFloats(n, 99);
  std::vector<float> outliers = gauss;
  for (size_t i = 0; i < n; i += 64) outliers[i] *= 100.0f;
  const double mse_on = Mse(*on, outliers, 4), mse_off = Mse(*off, outliers, 4);
  // One outlier per two blocks: without the transform it sets the step of its whole group;
  // with it, the step grows ~sqrt(32) less relative to the spread values (about 30x less MSE).
  EXPECT_LT(mse_on, 0.2 * mse_off) << mse_on << " vs " << mse_off;
  const double g_on = Mse(*on, gauss, 4), g_off = Mse(*off, gauss, 4);
  EXPECT_LT(g_on, 1.5 * g_off) << g_on << " vs " << g_off;
  EXPECT_LT(g_off, 1.5 * g_on) << g_on << " vs " << g_off;
}

// ---- payload size ------------------------------------------------------------------------------

TEST(Sdp4bitPayload, SizeIsHeaderScalesAndPackedCodes) {
  for (const std::string spec : {"sdp4bit", "sdp4bit:hadamard=off", "sdp4bit:bits=8",
                                 "sdp4bit:bits=8,hadamard=off,group=30"}) {
    auto c = Make(spec);
    auto* s = dynamic_cast<Sdp4bitCompressor*>(c.get());
    for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{4097},
                     size_t{1} << 20}) {
      const size_t m = s->hadamard() ? (n + 31) / 32 * 32 : n;
      const size_t want = kPayloadHeaderBytes + 8 + 4 * ((m + s->group() - 1) / s->group()) +
                          (s->bits() == 4 ? (m + 1) / 2 : m);
      const std::vector<uint8_t> p = Compress(*c, RandomFloats(n, n));
      EXPECT_EQ(p.size(), want) << spec << " n=" << n;
      EXPECT_LE(p.size(), c->MaxCompressedBytes(n, DType::kFloat32));
    }
  }
  // 2^20 fp32 at G = 128: 557 064 body bytes (docs/wire-format.md), ratio 7.53.
  auto c = Make("sdp4bit");
  EXPECT_EQ(c->MaxCompressedBytes(1 << 20, DType::kFloat32), kPayloadHeaderBytes + 557064u);
}

// ---- decoder refusals --------------------------------------------------------------------------

void ExpectRefused(Compressor& c, const std::vector<uint8_t>& bad, size_t n, const char* what,
                   const std::string& message) {
  std::vector<float> acc = RandomFloats(n, 5);
  const std::vector<float> acc0 = acc;
  const Status s = c.DecompressAdd({bad.data(), bad.size()}, {acc.data(), n});
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << what << ": " << s.ToString();
  EXPECT_CONTAINS(s.message(), message);
  EXPECT_TRUE(SameBits(acc, acc0)) << what << ": accumulator modified";
  const Status v = c.ValidatePayload({bad.data(), bad.size()}, n);
  EXPECT_EQ(v.code(), s.code()) << what;
  EXPECT_EQ(v.message(), s.message()) << what;
}

TEST(Sdp4bitDecoder, RefusesEveryMalformedBodyAndLeavesTheAccumulator) {
  const size_t n = 130;  // hadamard=on: m = 160, 2 groups
  auto c = Make("sdp4bit");
  const std::vector<uint8_t> good = Compress(*c, RandomFloats(n, 1));
  const size_t body = kPayloadHeaderBytes;
  const size_t codes = body + 8 + 8;
  auto with = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> b = good;
    b[at] = v;
    return b;
  };
  auto with_scale = [&](size_t g, float s) {
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + body + 8 + 4 * g, &s, 4);
    return b;
  };
  ExpectRefused(*c, with(body, 0), n, "kind 0", "kind 0 is unknown");
  ExpectRefused(*c, with(body, 5), n, "kind 5", "kind 5 is unknown");
  ExpectRefused(*c, with(body, 2), n, "kind 2 with pull=sdp4bit", "fp32 values but this key");
  ExpectRefused(*c, with(body + 1, 8), n, "bits 8", "bits=8 but this key uses bits=4");
  ExpectRefused(*c, with(body + 2, 0), n, "hadamard off", "hadamard byte 0");
  ExpectRefused(*c, with(body + 3, 1), n, "reserved", "reserved");
  ExpectRefused(*c, with(body + 4, 64), n, "group 64", "group=64 but this key uses group=128");
  ExpectRefused(*c, with(codes + 3, 0x83), n, "code -8 (high)", "element 6 has code -8");
  ExpectRefused(*c, with(codes + 3, 0x38), n, "code -8 (low)", "element 7 has code -8");
  ExpectRefused(*c, with_scale(1, std::nanf("")), n, "NaN scale, nonzero codes",
                "group 1 has a NaN scale");
  for (float s : {-1.0f, 0.0f, -0.0f, INFINITY, -INFINITY}) {
    ExpectRefused(*c, with_scale(0, s), n, "bad scale", "group 0 has scale");
  }
  std::vector<uint8_t> b = good;
  b.pop_back();
  ExpectRefused(*c, b, n, "truncated", "");  // the payload header's body size no longer matches
  b = good;
  b.push_back(0);
  ExpectRefused(*c, b, n, "extended", "");
  // A NaN scale with all its codes zero is the non-finite marker: accepted, decodes to NaN.
  std::vector<uint8_t> nan = with_scale(1, std::nanf(""));
  std::fill(nan.begin() + codes + 64, nan.begin() + codes + 80, 0);
  std::vector<float> acc(n, 0.0f);
  ASSERT_TRUE(c->DecompressAdd({nan.data(), nan.size()}, {acc.data(), n}).ok());
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(std::isnan(acc[i]), i >= 128) << i;

  // int8: code -128; hadamard=off with an odd m: the padding nibble.
  auto c8 = Make("sdp4bit:bits=8");
  const std::vector<uint8_t> good8 = Compress(*c8, RandomFloats(n, 2));
  std::vector<uint8_t> bad8 = good8;
  bad8[codes + 9] = 0x80;
  ExpectRefused(*c8, bad8, n, "code -128", "element 9 has code -128, outside -127..127");
  auto odd = Make("sdp4bit:hadamard=off,group=8");
  const size_t n_odd = 13;
  const std::vector<uint8_t> good_odd = Compress(*odd, RandomFloats(n_odd, 3));
  std::vector<uint8_t> pad = good_odd;
  pad.back() |= 0x01;
  ExpectRefused(*odd, pad, n_odd, "padding nibble", "padding nibble after element 12");
}

// ---- server replies ----------------------------------------------------------------------------

// The group scales' NaN marker is the engine's non-finite input check: TakeTelemetry says the
// quantised compression read every value (input_checked) and whether one was NaN / inf, on
// every ISA level, with and without the transform; an fp32 reply (server stream) reports
// nothing, and a second take nothing either.
TEST(Sdp4bitTelemetry, ReportsANonFiniteInputFromTheGroupScales) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (const std::string spec : {"sdp4bit", "sdp4bit:hadamard=off,group=64"}) {
      SCOPED_TRACE(spec + " " + std::string(IsaLevelName(isa)));
      auto c = Make(spec, isa);
      std::vector<float> x = RandomFloats(1000, 5);
      for (float bad : {0.5f, std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity()}) {
        x[777] = bad;
        Compress(*c, x);
        SCOPED_TRACE(bad);
        bitpush::testing::ExpectInputCheck(*c, !std::isfinite(bad));
      }
    }
  }
  auto fp32 = Make("sdp4bit:pull=fp32");
  std::vector<float> x(100, std::numeric_limits<float>::quiet_NaN());
  Compress(*fp32, x, kServer);
  CompressorTelemetry t;
  fp32->TakeTelemetry(&t);
  EXPECT_FALSE(t.input_checked || t.input_non_finite);
}

TEST(Sdp4bitReply, ServerRepliesInThePullFormat) {
  const size_t n = 1000;
  const std::vector<float> x = RandomFloats(n, 8);
  for (IsaLevel isa : SupportedIsaLevels()) {
    struct Case {
      const char* pull;
      uint8_t kind;
    };
    for (const Case& k : {Case{"fp32", 2}, Case{"fp16", 3}, Case{"bf16", 4}, Case{"sdp4bit", 1}}) {
      SCOPED_TRACE(std::string(k.pull) + " " + std::string(IsaLevelName(isa)));
      auto c = Make(std::string("sdp4bit:pull=") + k.pull, isa);
      const std::vector<uint8_t> reply = Compress(*c, x, kServer);
      ASSERT_GT(reply.size(), kPayloadHeaderBytes);
      EXPECT_EQ(reply[kPayloadHeaderBytes], k.kind);
      EXPECT_LE(reply.size(), c->MaxCompressedBytes(n, DType::kFloat32));
      const std::vector<float> d = Decompress(*c, reply, n);
      std::vector<float> want = x;
      if (k.kind == 3) {
        for (float& v : want) v = HalfToFloat(FloatToHalf(v));
      } else if (k.kind == 4) {
        for (float& v : want) v = Bf16ToFloat(FloatToBf16(v));
      }
      if (k.kind != 1) {
        EXPECT_EQ(reply.size(), kPayloadHeaderBytes + 8 + (k.kind == 2 ? 4 : 2) * n);
        EXPECT_TRUE(SameBits(d, want));
      }
      // A worker's push is kind 1 whatever the pull format.
      EXPECT_EQ(Compress(*c, x, {1, 0, 0})[kPayloadHeaderBytes], 1);
      // With error feedback the residual is what the stored values lost.
      std::vector<float> e(n, 0.0f);
      std::vector<uint8_t> out(c->MaxCompressedBytes(n, DType::kFloat32));
      auto r = c->CompressWithFeedback(ConstTensorView(x.data(), n), {e.data(), n}, kServer,
                                       {out.data(), out.size()});
      ASSERT_TRUE(r.ok());
      out.resize(*r);
      const std::vector<float> dec = Decompress(*c, out, n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(e[i], x[i] - dec[i]) << i;
    }
  }
}

// ---- the fused server round --------------------------------------------------------------------

std::vector<std::vector<uint8_t>> WorkerPushes(const std::string& spec, IsaLevel isa,
                                               size_t w_count, size_t n, uint64_t round) {
  auto worker = Make(spec, isa);
  std::vector<std::vector<uint8_t>> pushes;
  for (size_t w = 0; w < w_count; ++w) {
    pushes.push_back(
        Compress(*worker, RandomFloats(n, 100 * round + w), {5, round, static_cast<uint32_t>(w)}));
  }
  return pushes;
}

std::vector<uint8_t> Fused(Compressor& c, const std::vector<std::vector<uint8_t>>& pushes, size_t n,
                           float scale, CompressContext ctx) {
  std::vector<ByteSpan> spans;
  for (const auto& p : pushes) {
    EXPECT_TRUE(c.ValidatePayload({p.data(), p.size()}, n).ok());
    spans.emplace_back(p.data(), p.size());
  }
  std::vector<uint8_t> out(c.MaxCompressedBytes(n, DType::kFloat32));
  auto r = c.AggregateCompress(spans, n, scale, nullptr, ctx, {out.data(), out.size()});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  out.resize(r.ok() ? *r : 0);
  return out;
}

std::vector<uint8_t> Unfused(Compressor& c, const std::vector<std::vector<uint8_t>>& pushes,
                             size_t n, float scale, CompressContext ctx) {
  std::vector<float> acc(n);
  for (size_t w = 0; w < pushes.size(); ++w) {
    const ByteSpan p(pushes[w].data(), pushes[w].size());
    EXPECT_TRUE(
        (w == 0 ? c.DecompressToFloat(p, {acc.data(), n}) : c.DecompressAdd(p, {acc.data(), n}))
            .ok());
  }
  if (scale != 1.0f) {
    for (float& v : acc) v *= scale;
  }
  return Compress(c, acc, ctx);
}

// hadamard=on, pull=fp32: the reply is H32 (scale * sum_w code_w * scale_w) / 32, computed in
// fp32; against the same in float64 it is within a few ulps of the block's magnitude.
TEST(Sdp4bitServerRound, FusedRoundMatchesAFloat64Reference) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t w_count : {1, 2, 3, 5}) {
      for (size_t n : {1, 63, 1000, 70001}) {
        for (bool average : {false, true}) {
          SCOPED_TRACE(std::string(IsaLevelName(isa)) + " W=" + std::to_string(w_count) +
                       " n=" + std::to_string(n) + (average ? " average" : " sum"));
          const std::string spec = "sdp4bit:pull=fp32";
          auto server = Make(spec, isa);
          const float scale = average ? 1.0f / static_cast<float>(w_count) : 1.0f;
          const auto pushes = WorkerPushes(spec, isa, w_count, n, 3);
          const std::vector<float> got =
              Decompress(*server, Fused(*server, pushes, n, scale, kServer), n);
          const size_t m = (n + 31) / 32 * 32;
          std::vector<double> z(m, 0.0);
          for (const auto& p : pushes) {
            const Parsed r = Parse(p, n);
            for (size_t i = 0; i < m; ++i)
              z[i] += r.codes[i] * static_cast<double>(r.scales[i / 128]);
          }
          for (double& v : z) v *= scale;
          for (size_t b = 0; b < m; b += kH) {
            double mag = 0;
            for (size_t j = 0; j < kH; ++j) mag += std::fabs(z[b + j]);
            for (size_t i = 0; i < kH && b + i < n; ++i) {
              double want = 0;
              for (size_t j = 0; j < kH; ++j) want += H(i, j) * z[b + j];
              want /= 32.0;
              ASSERT_NEAR(got[b + i], want, 4e-7 * mag / 32.0 * (w_count + 5) + 1e-30)
                  << "element " << b + i;
            }
          }
          // ... and within the same tolerance of the unfused sequence (decode each push to real
          // values, sum, compress), which is not bit for bit the same.
          const std::vector<float> unfused =
              Decompress(*server, Unfused(*server, pushes, n, scale, kServer), n);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_NEAR(got[i], unfused[i], 1e-5 * (std::fabs(unfused[i]) + 1.0) * w_count) << i;
          }
        }
      }
    }
  }
}

// pull=sdp4bit: the reply quantises the fp32 Hadamard-domain sum (pushes in order, then x scale)
// from the server's stream, groups as in a push.
TEST(Sdp4bitServerRound, FusedRoundRequantisesTheHadamardDomainSum) {
  const size_t n = 5000;
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (const std::string spec : {"sdp4bit", "sdp4bit:bits=8,group=256"}) {
      auto server = Make(spec, isa);
      auto* s = dynamic_cast<Sdp4bitCompressor*>(server.get());
      const auto pushes = WorkerPushes(spec, isa, 3, n, 1);
      const float scale = 1.0f / 3.0f;
      const std::vector<uint8_t> got = Fused(*server, pushes, n, scale, kServer);
      const size_t m = s->PaddedLength(n);
      std::vector<float> z(m, 0.0f);
      for (const auto& p : pushes) {
        const Parsed r = Parse(p, n);
        for (size_t i = 0; i < m; ++i) {
          const float v = static_cast<float>(r.codes[i]) * r.scales[i / s->group()];
          z[i] = z[i] + v;
        }
      }
      for (float& v : z) v = v * scale;
      std::vector<uint8_t> want(server->MaxCompressedBytes(n, DType::kFloat32));
      uint8_t* body = want.data() + kPayloadHeaderBytes;
      std::memcpy(body, got.data() + kPayloadHeaderBytes, 8);
      const size_t groups = (m + s->group() - 1) / s->group();
      std::vector<float> work(s->group());
      sdp4bit::Layout lay;
      lay.bits = s->bits();
      lay.group = s->group();
      lay.stream = StreamKey(0, kServerStream, kServer.key, kServer.round);
      sdp4bit::QuantizeGroups(z.data(), m, m, 0, false, lay, body + 8, body + 8 + 4 * groups,
                              work.data(), IsaLevel::kScalar);
      want.resize(got.size());
      std::memcpy(want.data(), got.data(), kPayloadHeaderBytes);
      EXPECT_EQ(got, want) << spec << " " << IsaLevelName(isa);
    }
  }
}

// hadamard=off: the fused round performs the unfused sequence's operations, bit for bit.
TEST(Sdp4bitServerRound, FusedEqualsUnfusedBitForBitWithoutTheTransform) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (const std::string spec :
         {"sdp4bit:hadamard=off", "sdp4bit:hadamard=off,bits=8,group=64,pull=fp32",
          "sdp4bit:hadamard=off,group=30,pull=bf16"}) {
      for (size_t w_count : {1, 2, 3, 5}) {
        for (size_t n : {1, 63, 1000, 70001}) {
          SCOPED_TRACE(spec + " " + std::string(IsaLevelName(isa)) +
                       " W=" + std::to_string(w_count) + " n=" + std::to_string(n));
          auto fused = Make(spec, isa);
          auto unfused = Make(spec, isa);
          const auto pushes = WorkerPushes(spec, isa, w_count, n, 2);
          for (float scale : {1.0f, 1.0f / static_cast<float>(w_count)}) {
            for (const CompressContext& ctx : {kServer, CompressContext{5, 1, 0}}) {
              ASSERT_EQ(Fused(*fused, pushes, n, scale, ctx),
                        Unfused(*unfused, pushes, n, scale, ctx));
            }
          }
        }
      }
    }
  }
}

TEST(Sdp4bitServerRound, FusedRoundAgreesAcrossIsaLevelsAndFusesOnlyWithoutResidual) {
  const size_t n = 70001;
  for (const std::string spec : {"sdp4bit", "sdp4bit:pull=fp16", "sdp4bit:bits=8,group=256"}) {
    auto ref = Make(spec, IsaLevel::kScalar);
    EXPECT_TRUE(ref->FusesServerRound(false));
    EXPECT_FALSE(ref->FusesServerRound(true));
    const auto pushes = WorkerPushes(spec, IsaLevel::kScalar, 3, n, 4);
    const auto want = Fused(*ref, pushes, n, 1.0f / 3.0f, kServer);
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto c = Make(spec, isa);
      EXPECT_EQ(Fused(*c, pushes, n, 1.0f / 3.0f, kServer), want) << spec << IsaLevelName(isa);
    }
  }
}

// The one-pass kernel (sdp4bit::SumGroups: AVX-512, G <= 128) against the scalar passes on every
// group size it takes and one it does not, both widths, every reply kind, pushes holding zero,
// NaN, infinite and tiny groups, and lengths with a short last group.
TEST(Sdp4bitServerRound, OnePassKernelEqualsTheScalarPassesForEveryGroupShape) {
  for (const std::string spec :
       {"sdp4bit:group=32", "sdp4bit:group=64,bits=8", "sdp4bit:group=96,pull=fp32",
        "sdp4bit:group=128,pull=fp16", "sdp4bit:group=128,bits=8,pull=bf16", "sdp4bit:group=160",
        "sdp4bit:hadamard=off,group=64", "sdp4bit:hadamard=off,group=96,bits=8"}) {
    for (size_t w_count : {1, 2, 4}) {
      for (size_t n : {size_t{37}, size_t{96 * 3 + 5}, size_t{4096 + 32}, size_t{70001}}) {
        SCOPED_TRACE(spec + " W=" + std::to_string(w_count) + " n=" + std::to_string(n));
        auto worker = Make(spec, IsaLevel::kScalar);
        std::vector<std::vector<uint8_t>> pushes;
        for (size_t w = 0; w < w_count; ++w) {
          std::vector<float> x = RandomFloats(n, 77 + w);
          for (size_t i = 0; i < std::min<size_t>(n, 192); ++i) x[i] = 0.0f;      // zero groups
          for (size_t i = 400; i < std::min<size_t>(n, 560); ++i) x[i] = 1e-41f;  // tiny groups
          if (n > 1000 && w == 0) x[1000] = std::numeric_limits<float>::quiet_NaN();
          if (n > 3000 && w + 1 == w_count) x[3000] = std::numeric_limits<float>::infinity();
          pushes.push_back(Compress(*worker, x, {5, 2, static_cast<uint32_t>(w)}));
        }
        auto ref = Make(spec, IsaLevel::kScalar);
        for (float scale : {1.0f, 1.0f / static_cast<float>(w_count + 2)}) {
          const auto want = Fused(*ref, pushes, n, scale, kServer);
          for (IsaLevel isa : SupportedIsaLevels()) {
            auto c = Make(spec, isa);
            ASSERT_EQ(Fused(*c, pushes, n, scale, kServer), want)
                << IsaLevelName(isa) << " scale " << scale;
          }
        }
      }
    }
  }
}

// ---- special values ----------------------------------------------------------------------------

// Zero, tiny (L / absmax overflows), huge (the transform overflows), NaN and inf groups: the same
// bytes on every level, valid bodies, and the documented decodings.
TEST(Sdp4bitSpecialValues, AgreeAcrossLevelsAndDecodeAsDocumented) {
  const size_t n = 128 * 8;
  std::vector<float> x = RandomFloats(n, 61);
  for (size_t i = 0; i < 128; ++i) x[i] = 0.0f;                          // group 0: zero
  for (size_t i = 128; i < 256; ++i) x[i] *= 1e-39f;                     // group 1: subnormal
  for (size_t i = 256; i < 384; ++i) x[i] *= 4e-45f;                     // group 2: a few ulps
  for (size_t i = 384; i < 512; ++i) x[i] = i % 2 ? FLT_MAX : -FLT_MAX;  // group 3: overflow
  x[600] = std::numeric_limits<float>::quiet_NaN();                      // group 4
  x[700] = -INFINITY;                                                    // group 5
  for (size_t i = 768; i < 896; ++i) x[i] *= 1e30f;                      // group 6: large
  for (const std::string spec : {"sdp4bit", "sdp4bit:hadamard=off", "sdp4bit:bits=8"}) {
    auto ref = Make(spec, IsaLevel::kScalar);
    const auto want = Compress(*ref, x);
    const std::vector<float> d = Decompress(*ref, want, n);
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto c = Make(spec, isa);
      EXPECT_EQ(Compress(*c, x), want) << spec << " " << IsaLevelName(isa);
      EXPECT_TRUE(SameBits(Decompress(*c, want, n), d)) << spec << " " << IsaLevelName(isa);
    }
    const bool had = spec != "sdp4bit:hadamard=off";
    const Parsed a = Parse(want, n);
    for (size_t i = 0; i < n; ++i) {
      const size_t g = i / 128;
      bool ok = true;
      if (g == 0) ok = d[i] == 0.0f;
      if (g == 1) ok = std::fabs(d[i] - x[i]) <= a.scales[1];
      if (g == 2 || g == 6 || g == 7) ok = std::isfinite(d[i]);
      if (g == 3 && had) ok = std::isnan(d[i]);  // the transform's sums overflow
      if (g == 4 || g == 5) ok = std::isnan(d[i]);
      ASSERT_TRUE(ok) << spec << " element " << i << " decodes to " << d[i] << " from " << x[i];
    }
    // The groups without a special value are unaffected: same codes as with that group zeroed.
    std::vector<float> clean = x;
    std::fill(clean.begin() + 512, clean.begin() + 768, 0.0f);
    const Parsed b = Parse(Compress(*ref, clean), n);
    EXPECT_EQ(a.scales[7], b.scales[7]);
    EXPECT_EQ(std::vector<int>(a.codes.begin() + 896, a.codes.end()),
              std::vector<int>(b.codes.begin() + 896, b.codes.end()));
    EXPECT_TRUE(std::isnan(a.scales[4]) && std::isnan(a.scales[5]));
    EXPECT_EQ(a.scales[0], 1.0f);
  }
}

// Every group size and scale range the vector kernels treat differently: G of 32..128 (held in
// registers), other multiples of 32 and other even G, a shorter last group, partial last blocks,
// scales below 2^-96 and above 2^96 (the inverse transform without the folded 2^-5), tiny and
// subnormal groups. Compress, decompress and decompress-add agree with scalar bit for bit.
TEST(Sdp4bitSpecialValues, EveryGroupShapeAndScaleRangeAgreesAcrossLevels) {
  const float mult[] = {1.0f, 1e-30f, 3e-28f, 1e27f, 1e31f, 1e-37f, 1e-40f, 1e-44f};
  for (const std::string spec :
       {"sdp4bit:group=32", "sdp4bit:group=64", "sdp4bit:group=96", "sdp4bit:group=128",
        "sdp4bit:group=160", "sdp4bit:bits=8,group=96", "sdp4bit:hadamard=off,group=96",
        "sdp4bit:hadamard=off,group=30", "sdp4bit:hadamard=off,bits=8,group=128"}) {
    for (const size_t n : {size_t{96 * 8 + 40}, size_t{1000}, size_t{31}}) {
      std::vector<float> x = RandomFloats(n, 71);
      for (size_t i = 0; i < n; ++i) x[i] *= mult[(i / 90) % 8];
      auto ref = Make(spec, IsaLevel::kScalar);
      const auto want = Compress(*ref, x, {5, 9});
      const std::vector<float> d = Decompress(*ref, want, n);
      std::vector<float> acc = RandomFloats(n, 72);
      std::vector<float> want_acc = acc;
      ASSERT_TRUE(ref->DecompressAdd({want.data(), want.size()}, {want_acc.data(), n}).ok());
      for (IsaLevel isa : SupportedIsaLevels()) {
        SCOPED_TRACE(spec + " n=" + std::to_string(n) + " " + std::string(IsaLevelName(isa)));
        auto c = Make(spec, isa);
        EXPECT_EQ(Compress(*c, x, {5, 9}), want);
        EXPECT_TRUE(SameBits(Decompress(*c, want, n), d));
        std::vector<float> got = acc;
        ASSERT_TRUE(c->DecompressAdd({want.data(), want.size()}, {got.data(), n}).ok());
        EXPECT_TRUE(SameBits(got, want_acc));
      }
    }
  }
}

}  // namespace
}  // namespace bitpush::compressors
