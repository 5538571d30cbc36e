// Tests of the dithering compressor (compressors/dithering/dithering.h): the byte format
// (golden vectors and an independent reference encoder), bit-identical payloads, residuals
// and decoded values across ISA levels, exact level-grid math, unbiasedness (Monte-Carlo),
// error-feedback telescoping, the fused fp32 EF path, and decoder validation.
#include "compressors/dithering/dithering.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "common/half.h"
#include "compressors/payload.h"
#include "compressors/registry.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using bitpush::testing::RandomFloats;
using bitpush::testing::SupportedIsaLevels;

struct Config {
  bool natural;
  uint32_t s;
  bool l2;
};

std::string Spec(const Config& c, uint64_t seed) {
  return "dithering:levels=" + std::to_string(c.s) +
         ",partition=" + (c.natural ? "natural" : "linear") + ",norm=" + (c.l2 ? "l2" : "max") +
         ",seed=" + std::to_string(seed);
}
std::string Name(const Config& c) {
  return Spec(c, 7);
}

std::vector<Config> AllConfigs() {
  std::vector<Config> out;
  for (bool l2 : {false, true}) {
    for (uint32_t s : {1u, 3u, 15u, 63u, 255u}) out.push_back({false, s, l2});
    for (uint32_t s : {1u, 3u, 8u, 31u}) out.push_back({true, s, l2});
  }
  return out;
}

const size_t kSizes[] = {0, 1, 31, 32, 33, 63, 64, 65, 4097, size_t{1} << 20};

std::unique_ptr<Compressor> Make(const Config& c, IsaLevel isa, uint64_t seed = 7) {
  CompressorOptions opt;
  opt.isa = isa;
  auto r = CreateCompressor(Spec(c, seed), opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r.value());
}

uint32_t CodeBits(uint32_t s) {
  uint32_t b = 0;
  while ((1u << b) <= s) ++b;
  return b;
}
size_t BodySize(size_t n, uint32_t s) {
  return 4 + (n + 63) / 64 * (CodeBits(s) + 1) * 8;
}

std::vector<uint8_t> Compress(Compressor& c, const std::vector<float>& x, uint64_t key = 3,
                              uint64_t round = 0, uint32_t worker = 0) {
  std::vector<uint8_t> out(c.MaxCompressedBytes(x.size(), DType::kFloat32));
  auto r = c.Compress(ConstTensorView(x.data(), x.size()), CompressContext{key, round, worker},
                      MutableByteSpan(out.data(), out.size()));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.ok() ? *r : 0, out.size());
  return out;
}

std::vector<uint8_t> CompressEf(Compressor& c, const std::vector<float>& x, std::vector<float>* e,
                                uint64_t key = 3, uint64_t round = 0) {
  std::vector<uint8_t> out(c.MaxCompressedBytes(x.size(), DType::kFloat32));
  auto r =
      c.CompressWithFeedback(ConstTensorView(x.data(), x.size()), Span<float>(*e),
                             CompressContext{key, round}, MutableByteSpan(out.data(), out.size()));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.ok() ? *r : 0, out.size());
  return out;
}

std::vector<float> Decompress(Compressor& c, const std::vector<uint8_t>& p, size_t n) {
  std::vector<float> out(n, 12345.0f);
  const Status s =
      c.Decompress(ByteSpan(p.data(), p.size()), TensorView(out.data(), n, DType::kFloat32));
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// Test data: normal values plus zeros, a negative zero and repeated extremes.
std::vector<float> TestData(size_t n, uint64_t seed) {
  std::vector<float> x = RandomFloats(n, seed);
  for (size_t i = 0; i < n; i += 17) x[i] = 0.0f;
  if (n > 5) x[5] = -0.0f;
  if (n > 40) x[40] = -x[n / 2];
  return x;
}

// ---- reference parser and encoder, written from docs/dithering.md ---------------------------

struct Parsed {
  float scale = 0;
  std::vector<uint32_t> code;
  std::vector<bool> neg;
};

uint64_t Word(const uint8_t* body, uint32_t s, size_t block, uint32_t w) {
  uint64_t v;
  std::memcpy(&v, body + 4 + (block * (CodeBits(s) + 1) + w) * 8, 8);
  return v;
}

Parsed Parse(const std::vector<uint8_t>& payload, size_t n, uint32_t s) {
  Parsed p;
  EXPECT_EQ(payload.size(), kPayloadHeaderBytes + BodySize(n, s));
  const uint8_t* body = payload.data() + kPayloadHeaderBytes;
  std::memcpy(&p.scale, body, 4);
  const uint32_t b = CodeBits(s);
  for (size_t i = 0; i < n; ++i) {
    uint32_t c = 0;
    for (uint32_t q = 0; q < b; ++q) c |= ((Word(body, s, i / 64, 1 + q) >> (i % 64)) & 1) << q;
    p.code.push_back(c);
    p.neg.push_back((Word(body, s, i / 64, 0) >> (i % 64)) & 1);
  }
  return p;
}

// The body the format defines for x (scale >= 2^-64, finite input).
std::vector<uint8_t> ReferenceBody(const std::vector<float>& x, const Config& cfg, uint64_t seed,
                                   uint64_t key, uint64_t round, uint32_t worker = 0) {
  const size_t n = x.size();
  float scale = 0;
  if (cfg.l2) {
    double lanes[32] = {};
    for (size_t i = 0; i < n; ++i) lanes[i % 32] += double(x[i]) * double(x[i]);
    double sum = 0;
    for (double l : lanes) sum += l;
    scale = static_cast<float>(std::sqrt(sum));
  } else {
    for (float v : x) scale = std::max(scale, std::fabs(v));
  }
  const uint32_t s = cfg.s;
  const uint32_t b = CodeBits(s);
  std::vector<uint8_t> body(BodySize(n, s), 0);
  std::memcpy(body.data(), &scale, 4);
  if (scale == 0) return body;
  const float target = cfg.natural ? std::ldexp(1.0f, int(s) - 1) : float(s);
  float factor = target / scale;
  while (double(factor) * double(scale) < double(target)) factor = std::nextafter(factor, INFINITY);
  const uint64_t stream = StreamKey(seed, worker, key, round);
  for (size_t i = 0; i < n; ++i) {
    const float t = std::fabs(x[i]) * factor;
    const uint32_t r = CounterRandom32(stream, uint32_t(i));
    const float r24 = float(r >> 8) * 0x1p-24f;
    uint32_t c;
    if (!cfg.natural) {
      const float fl = std::floor(t);
      c = uint32_t(fl) + (r24 < t - fl ? 1 : 0);
    } else if (t >= 1.0f) {
      const int e = std::ilogb(t);
      const double mant = (double(t) / std::ldexp(1.0, e) - 1.0) * 0x1p23;  // an integer
      c = uint32_t(e + 1) + (double(r >> 9) < mant ? 1 : 0);
    } else {
      c = r24 < t ? 1 : 0;
    }
    c = std::min(c, s);
    uint8_t* blk = body.data() + 4 + (i / 64) * (b + 1) * 8;
    const auto set = [&](uint32_t w) { blk[w * 8 + (i % 64) / 8] |= uint8_t(1u << (i % 8)); };
    if (c != 0 && std::signbit(x[i])) set(0);
    for (uint32_t q = 0; q < b; ++q) {
      if ((c >> q) & 1) set(1 + q);
    }
  }
  return body;
}

// |x| / scale bracketed by the level grid: the two neighbouring codes (equal when on the grid).
void Bracket(double u, const Config& c, uint32_t* lo, uint32_t* hi) {
  if (!c.natural) {
    const double t = u * c.s;
    *lo = uint32_t(std::floor(t));
    *hi = uint32_t(std::ceil(t));
    return;
  }
  const double smallest = std::ldexp(1.0, 1 - int(c.s));
  if (u < smallest) {
    *lo = 0;
    *hi = u == 0 ? 0 : 1;
    return;
  }
  const int e = std::ilogb(u);  // u in [2^e, 2^(e+1))
  *lo = uint32_t(e + int(c.s));
  *hi = std::ldexp(1.0, e) == u ? *lo : *lo + 1;
}

// Magnitude of code c for a scale (as the format defines it).
float Level(uint32_t c, float scale, const Config& cfg) {
  if (cfg.natural) return c == 0 ? 0.0f : scale * std::ldexp(1.0f, int(c) - int(cfg.s));
  return c == cfg.s ? scale : float(c) * (scale / float(cfg.s));
}

// ---- tests --------------------------------------------------------------------------------

TEST(Dithering, RegistryAndSizes) {
  auto r = CreateCompressor("dithering:levels=3,partition=natural", CompressorOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto* d = dynamic_cast<DitheringCompressor*>(r.value().get());
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->natural());
  EXPECT_EQ(d->levels(), 3u);
  EXPECT_EQ(d->code_bits(), 2u);
  EXPECT_FALSE(d->l2_norm());
  for (const Config& c : AllConfigs()) {
    auto comp = Make(c, BestIsaLevel());
    for (size_t n : {size_t{0}, size_t{1}, size_t{64}, size_t{65}, size_t{1} << 20}) {
      EXPECT_EQ(comp->MaxCompressedBytes(n, DType::kFloat32), 16 + BodySize(n, c.s));
      EXPECT_EQ(comp->MaxCompressedBytes(n, DType::kFloat16), 16 + BodySize(n, c.s));
    }
  }
  EXPECT_EQ(CodeBits(15), 4u);
  EXPECT_EQ(CodeBits(3), 2u);
  EXPECT_EQ(CodeBits(63), 6u);
  EXPECT_EQ(CodeBits(255), 8u);
  EXPECT_EQ(BodySize(65, 15), 84u);
}

TEST(Dithering, GoldenBytes) {
  // Deterministic inputs (every |x|/scale on the grid), so the bytes do not depend on the RNG.
  for (IsaLevel isa : SupportedIsaLevels()) {
    {
      auto c = Make({false, 1, false}, isa);
      const auto p = Compress(*c, {1.0f, -1.0f, 0.0f, -0.0f});
      const std::vector<uint8_t> body = {0x00, 0x00, 0x80, 0x3F,               // scale 1.0f
                                         2,    0,    0,    0,    0, 0, 0, 0,   // sign: element 1
                                         3,    0,    0,    0,    0, 0, 0, 0};  // codes 1, 1, 0, 0
      EXPECT_EQ(std::vector<uint8_t>(p.begin() + 16, p.end()), body) << IsaLevelName(isa);
      EXPECT_EQ(p[1], v1::COMPRESSOR_ID_DITHERING);
    }
    {
      auto c = Make({true, 3, false}, isa);
      const auto p = Compress(*c, {-1.0f, -0.5f, 0.25f, 0.0f, 0.5f});
      // codes 3, 2, 1, 0, 2; negative nonzero: elements 0, 1
      const std::vector<uint8_t> body = {0x00,    0x00, 0x80,    0x3F, 3, 0, 0, 0, 0, 0,
                                         0,       0,    0b00101, 0,    0, 0, 0, 0, 0, 0,
                                         0b10011, 0,    0,       0,    0, 0, 0, 0};
      EXPECT_EQ(std::vector<uint8_t>(p.begin() + 16, p.end()), body) << IsaLevelName(isa);
    }
  }
}

TEST(Dithering, MatchesReferenceEncoder) {
  for (const Config& cfg : AllConfigs()) {
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto c = Make(cfg, isa, 11);
      for (size_t n : {size_t{1}, size_t{33}, size_t{65}, size_t{4097}}) {
        const auto x = TestData(n, n + 1);
        const auto p = Compress(*c, x, 5, 9);
        EXPECT_EQ(std::vector<uint8_t>(p.begin() + 16, p.end()), ReferenceBody(x, cfg, 11, 5, 9))
            << Name(cfg) << " n=" << n << " " << IsaLevelName(isa);
      }
    }
  }
}

TEST(Dithering, WorkersRoundIndependentlyAndRerunsAreBitIdentical) {
  // Every |x| / scale sits halfway between two levels, so each element rounds up with
  // probability 1/2. Independent streams: both workers round an element up with probability
  // 1/4 (a shared stream would make it 1/2). Each worker's payload is the reference encoder's
  // for its own (seed, worker, key, round), and a rerun on a new instance is bit-identical.
  const Config cfg{false, 3, false};  // linear, s = 3: levels 0, 1/3, 2/3, 1
  const size_t n = 1 << 16;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * 0.5f;
  x[0] = 1.0f;  // scale 1 (norm = max): |x| / scale = 0.5 = halfway between 1/3 and 2/3
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make(cfg, isa, 5);
    const std::vector<uint8_t> p0 = Compress(*c, x, 9, 4, 0);
    const std::vector<uint8_t> p1 = Compress(*c, x, 9, 4, 1);
    EXPECT_EQ(std::vector<uint8_t>(p0.begin() + 16, p0.end()), ReferenceBody(x, cfg, 5, 9, 4, 0));
    EXPECT_EQ(std::vector<uint8_t>(p1.begin() + 16, p1.end()), ReferenceBody(x, cfg, 5, 9, 4, 1));
    EXPECT_EQ(Compress(*Make(cfg, isa, 5), x, 9, 4, 1), p1) << "rerun";
    const std::vector<float> d0 = Decompress(*c, p0, n);
    const std::vector<float> d1 = Decompress(*c, p1, n);
    size_t up0 = 0, up1 = 0, both = 0;
    for (size_t i = 1; i < n; ++i) {
      const bool u0 = std::fabs(d0[i]) > 0.5f, u1 = std::fabs(d1[i]) > 0.5f;
      up0 += u0, up1 += u1, both += u0 && u1;
    }
    const double m = double(n - 1);
    // Binomial bounds at 6 sigma: sd of a count with p = 1/2 is sqrt(m)/2, with p = 1/4 it is
    // sqrt(3m)/4.
    EXPECT_LT(std::fabs(up0 - m / 2), 6 * std::sqrt(m) / 2) << IsaLevelName(isa);
    EXPECT_LT(std::fabs(up1 - m / 2), 6 * std::sqrt(m) / 2) << IsaLevelName(isa);
    EXPECT_LT(std::fabs(both - m / 4), 6 * std::sqrt(3 * m) / 4) << IsaLevelName(isa);
  }
}

TEST(Dithering, BitIdenticalAcrossIsaLevels) {
  const auto levels = SupportedIsaLevels();
  for (const Config& cfg : AllConfigs()) {
    for (size_t n : kSizes) {
      const auto x = TestData(n, 100 + n);
      std::vector<float> e0 = RandomFloats(n, 200 + n, 0.1f);
      std::vector<uint8_t> ref_p, ref_pe;
      std::vector<float> ref_d, ref_acc, ref_e;
      for (IsaLevel isa : levels) {
        auto c = Make(cfg, isa);
        const auto p = Compress(*c, x, 1, 2);
        std::vector<float> e = e0;
        const auto pe = CompressEf(*c, x, &e, 1, 2);
        const auto d = Decompress(*c, p, n);
        std::vector<float> acc = e0;
        ASSERT_TRUE(c->DecompressAdd(ByteSpan(pe.data(), pe.size()), Span<float>(acc)).ok());
        if (isa == levels.front()) {
          ref_p = p, ref_pe = pe, ref_d = d, ref_acc = acc, ref_e = e;
          continue;
        }
        const std::string where =
            Name(cfg) + " n=" + std::to_string(n) + " " + std::string(IsaLevelName(isa));
        EXPECT_EQ(p, ref_p) << where;
        EXPECT_EQ(pe, ref_pe) << where;
        EXPECT_TRUE(SameBits(d, ref_d)) << where;
        EXPECT_TRUE(SameBits(acc, ref_acc)) << where;
        EXPECT_TRUE(SameBits(e, ref_e)) << where;
      }
    }
  }
}

TEST(Dithering, DecodedValuesLieOnTheGridAndBracketTheInput) {
  for (const Config& cfg : AllConfigs()) {
    auto c = Make(cfg, BestIsaLevel());
    for (size_t n : kSizes) {
      if (n == 0) continue;
      const auto x = TestData(n, 300 + n);
      const auto p = Compress(*c, x);
      const Parsed parsed = Parse(p, n, cfg.s);
      const auto d = Decompress(*c, p, n);
      const float scale = parsed.scale;
      double l2 = 0;
      float mx = 0;
      size_t imax = 0;
      for (size_t i = 0; i < n; ++i) {
        l2 += double(x[i]) * x[i];
        if (std::fabs(x[i]) > mx) mx = std::fabs(x[i]), imax = i;
      }
      if (cfg.l2) {
        EXPECT_NEAR(scale, std::sqrt(l2), 1e-6 * std::sqrt(l2));
      } else {
        EXPECT_EQ(scale, mx);
        EXPECT_EQ(std::fabs(d[imax]), scale) << Name(cfg) << " n=" << n;  // max -> exactly ±scale
        EXPECT_EQ(std::signbit(d[imax]), std::signbit(x[imax]));
      }
      size_t bad = 0;
      for (size_t i = 0; i < n && bad < 5; ++i) {
        const uint32_t code = parsed.code[i];
        const float want = Level(code, scale, cfg);
        const float got = d[i];
        bool ok = code <= cfg.s && std::fabs(got) == want &&
                  parsed.neg[i] == (code != 0 && std::signbit(x[i])) &&
                  (code == 0 ? !std::signbit(got) : std::signbit(got) == std::signbit(x[i]));
        // Bracketing, with slack for the rounding of |x| * factor near a grid point.
        const double u = std::fabs(double(x[i])) / scale;
        uint32_t lo, hi, lo2, hi2;
        Bracket(std::max(0.0, u * (1 - 1e-6)), cfg, &lo, &hi2);
        Bracket(std::min(1.0, u * (1 + 1e-6)), cfg, &lo2, &hi);
        ok = ok && code >= lo && code <= hi;
        if (x[i] == 0) ok = ok && code == 0;
        if (!ok) {
          ++bad;
          ADD_FAILURE() << Name(cfg) << " n=" << n << " i=" << i << " x=" << x[i]
                        << " scale=" << scale << " code=" << code << " decoded=" << got
                        << " bracket=[" << lo << "," << hi << "]";
        }
      }
    }
  }
}

TEST(Dithering, OnGridInputsAreExact) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    // linear, max norm: scale s makes factor 1, so integer inputs are exact levels.
    for (uint32_t s : {1u, 3u, 15u, 63u, 255u}) {
      const Config cfg{false, s, false};
      auto c = Make(cfg, isa);
      std::vector<float> x(1000);
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % (s + 1)) * (i % 3 ? 1.0f : -1.0f);
      x[7] = float(s);
      for (uint64_t round = 0; round < 3; ++round) {
        EXPECT_TRUE(SameBits(Decompress(*c, Compress(*c, x, 1, round), x.size()),
                             [&] {
                               std::vector<float> y = x;
                               for (float& v : y) v = v == 0 ? 0.0f : v;  // -0 decodes to +0
                               return y;
                             }()))
            << "linear s=" << s;
      }
    }
    // natural, max norm 1: powers of two down to 2^(1-s) and zero are exact.
    for (uint32_t s : {1u, 3u, 8u, 31u}) {
      const Config cfg{true, s, false};
      auto c = Make(cfg, isa);
      std::vector<float> x;
      for (int k = 0; k < int(s); ++k) x.push_back((k % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f, -k));
      x.push_back(0.0f);
      for (uint64_t round = 0; round < 3; ++round) {
        EXPECT_TRUE(SameBits(Decompress(*c, Compress(*c, x, 1, round), x.size()), x))
            << "natural s=" << s;
      }
    }
  }
}

TEST(Dithering, UnbiasedMonteCarlo) {
  constexpr size_t kN = 100;
  constexpr int kRounds = 4000;
  for (const Config& cfg : AllConfigs()) {
    auto c = Make(cfg, BestIsaLevel(), 99);
    std::vector<float> x = RandomFloats(kN, 42);
    x[3] = 0.0f;
    x[10] *= 0.001f;  // deep in the lowest interval
    std::vector<double> sum(kN, 0.0);
    float scale = 0;
    for (int r = 0; r < kRounds; ++r) {
      const auto p = Compress(*c, x, 17, r);
      std::memcpy(&scale, p.data() + 16, 4);
      const auto d = Decompress(*c, p, kN);
      for (size_t i = 0; i < kN; ++i) sum[i] += d[i];
    }
    for (size_t i = 0; i < kN; ++i) {
      const double u = std::fabs(double(x[i])) / scale;
      uint32_t lo, hi;
      Bracket(u, cfg, &lo, &hi);
      const double gap = Level(hi, scale, cfg) - Level(lo, scale, cfg);  // local level gap
      const double sigma = gap / 2;  // sd of a Bernoulli step of size gap is at most gap / 2
      const double mean = sum[i] / kRounds;
      EXPECT_LE(std::fabs(mean - x[i]), 6 * sigma / std::sqrt(double(kRounds)) + 1e-6 * scale)
          << Name(cfg) << " i=" << i << " x=" << x[i] << " mean=" << mean << " gap=" << gap;
    }
  }
}

TEST(Dithering, ErrorFeedbackTelescopesAndFusedPathMatchesGeneric) {
  constexpr size_t kN = 1000;
  constexpr int kRounds = 100;
  for (const Config& cfg : AllConfigs()) {
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto fused = Make(cfg, isa);    // fp32 input: EncodeBodyWithFeedbackF32
      auto generic = Make(cfg, isa);  // fp16 input: residual += g, EncodeBodyWithFeedback
      std::vector<float> e(kN, 0.0f), e2(kN, 0.0f);
      std::vector<double> sum_g(kN, 0.0), sum_d(kN, 0.0);
      double max_abs = 1;
      for (int t = 0; t < kRounds; ++t) {
        std::vector<float> g = RandomFloats(kN, 1000 + t);
        std::vector<uint16_t> g16(kN);
        for (size_t i = 0; i < kN; ++i) {
          g16[i] = FloatToHalf(g[i]);
          g[i] = HalfToFloat(g16[i]);
        }
        const auto p = CompressEf(*fused, g, &e, 4, t);
        std::vector<uint8_t> p2(generic->MaxCompressedBytes(kN, DType::kFloat16));
        ASSERT_TRUE(generic
                        ->CompressWithFeedback(ConstTensorView(g16.data(), kN, DType::kFloat16),
                                               Span<float>(e2), CompressContext{4, uint64_t(t)},
                                               MutableByteSpan(p2.data(), p2.size()))
                        .ok());
        ASSERT_EQ(p.size(), p2.size());
        ASSERT_TRUE(std::equal(p.begin() + 16, p.end(), p2.begin() + 16))
            << Name(cfg) << " round " << t << " " << IsaLevelName(isa);
        ASSERT_TRUE(SameBits(e, e2)) << Name(cfg) << " round " << t;
        const auto d = Decompress(*fused, p, kN);
        for (size_t i = 0; i < kN; ++i) {
          sum_g[i] += g[i];
          sum_d[i] += d[i];
          max_abs = std::max({max_abs, double(std::fabs(d[i])), double(std::fabs(e[i]))});
        }
      }
      ASSERT_TRUE(std::isfinite(max_abs)) << Name(cfg);
      // Two fp32 roundings per round on values below max_abs.
      const double tol = 2.0 * kRounds * max_abs * 0x1p-24 + 1e-6;
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_NEAR(sum_d[i] + e[i], sum_g[i], tol) << Name(cfg) << " i=" << i;
      }
    }
  }
}

TEST(Dithering, PayloadDoesNotDependOnDtype) {
  for (const Config& cfg : {Config{false, 15, false}, Config{true, 3, true}}) {
    auto c = Make(cfg, BestIsaLevel());
    const size_t n = 777;
    std::vector<uint16_t> h(n), bf(n);
    std::vector<float> xh(n), xb(n);
    const auto x = RandomFloats(n, 5);
    for (size_t i = 0; i < n; ++i) {
      h[i] = FloatToHalf(x[i]);
      xh[i] = HalfToFloat(h[i]);
      bf[i] = FloatToBf16(x[i]);
      xb[i] = Bf16ToFloat(bf[i]);
    }
    std::vector<uint8_t> ph(c->MaxCompressedBytes(n, DType::kFloat16));
    ASSERT_TRUE(c->Compress(ConstTensorView(h.data(), n, DType::kFloat16), {3, 0},
                            MutableByteSpan(ph.data(), ph.size()))
                    .ok());
    const auto pf = Compress(*c, xh);
    EXPECT_TRUE(std::equal(ph.begin() + 16, ph.end(), pf.begin() + 16));
    EXPECT_EQ(ph[2], uint8_t(DType::kFloat16));
    // Decompress into fp16 = the fp32 decode rounded to fp16.
    std::vector<uint16_t> out16(n);
    ASSERT_TRUE(
        c->Decompress(ByteSpan(ph.data(), ph.size()), TensorView(out16.data(), n, DType::kFloat16))
            .ok());
    const auto d = Decompress(*c, pf, n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out16[i], FloatToHalf(d[i]));
    std::vector<uint8_t> pb(c->MaxCompressedBytes(n, DType::kBFloat16));
    ASSERT_TRUE(c->Compress(ConstTensorView(bf.data(), n, DType::kBFloat16), {3, 0},
                            MutableByteSpan(pb.data(), pb.size()))
                    .ok());
    const auto pfb = Compress(*c, xb);
    EXPECT_TRUE(std::equal(pb.begin() + 16, pb.end(), pfb.begin() + 16));
  }
}

TEST(Dithering, ZerosTinyAndHugeInputs) {
  for (const Config& cfg : AllConfigs()) {
    std::vector<std::vector<uint8_t>> ref(3);
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto c = Make(cfg, isa);
      // All zeros: scale 0, all codes 0, decodes to +0.
      const std::vector<float> z(130, -0.0f);
      const auto pz = Compress(*c, z);
      EXPECT_TRUE(std::all_of(pz.begin() + 16, pz.end(), [](uint8_t b) { return b == 0; }));
      for (float v : Decompress(*c, pz, z.size())) EXPECT_TRUE(v == 0 && !std::signbit(v));
      // Tiny (denormal) and huge values: finite, on the grid, identical across levels.
      std::vector<float> tiny = RandomFloats(200, 8, 1e-40f);
      std::vector<float> huge = RandomFloats(200, 9, 5e37f);
      huge[3] = FLT_MAX;
      huge[4] = -FLT_MAX;
      int k = 0;
      for (const auto* x : {&tiny, &huge}) {
        const auto p = Compress(*c, *x);
        const auto d = Decompress(*c, p, x->size());
        const Parsed parsed = Parse(p, x->size(), cfg.s);
        EXPECT_TRUE(std::isfinite(parsed.scale) && parsed.scale > 0) << Name(cfg);
        if (x == &huge && cfg.l2) {
          EXPECT_EQ(parsed.scale, FLT_MAX);  // clamped l2 norm
        }
        for (size_t i = 0; i < x->size(); ++i) {
          ASSERT_TRUE(std::isfinite(d[i]));
          ASSERT_EQ(std::fabs(d[i]), Level(parsed.code[i], parsed.scale, cfg));
          ASSERT_LE(std::fabs(d[i]), parsed.scale);
        }
        if (ref[k].empty()) ref[k] = p;
        EXPECT_EQ(p, ref[k]) << Name(cfg) << " " << IsaLevelName(isa);
        ++k;
      }
    }
  }
}

TEST(Dithering, NonFiniteInputDecodesToNaN) {
  for (const Config& cfg :
       {Config{false, 15, false}, Config{true, 3, true}, Config{false, 255, true}}) {
    for (IsaLevel isa : SupportedIsaLevels()) {
      auto c = Make(cfg, isa);
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
        std::vector<float> x = RandomFloats(100, 1);
        x[50] = bad;
        const auto p = Compress(*c, x);
        const Parsed parsed = Parse(p, x.size(), cfg.s);
        EXPECT_TRUE(std::isnan(parsed.scale));
        EXPECT_TRUE(std::all_of(p.begin() + 20, p.end(), [](uint8_t b) { return b == 0; }));
        for (float v : Decompress(*c, p, x.size())) EXPECT_TRUE(std::isnan(v));
        std::vector<float> acc(x.size(), 1.0f);
        ASSERT_TRUE(c->DecompressAdd(ByteSpan(p.data(), p.size()), Span<float>(acc)).ok());
        for (float v : acc) EXPECT_TRUE(std::isnan(v));
        std::vector<float> e(x.size(), 0.0f);
        const auto pe = CompressEf(*c, x, &e);
        EXPECT_EQ(pe, p);
        for (float v : e) EXPECT_EQ(v, 0.0f);  // residual reset, not poisoned
      }
    }
  }
}

// Runs a corrupted payload through DecompressAdd and Decompress: both must fail with DataLoss
// naming `what`, leaving the destination bit-for-bit unchanged.
void ExpectRejected(Compressor& c, const std::vector<uint8_t>& p, size_t n,
                    const std::string& what) {
  std::vector<float> acc(n);
  for (size_t i = 0; i < n; ++i) acc[i] = float(i) * 0.25f - 3;
  const std::vector<float> before = acc;
  Status s = c.DecompressAdd(ByteSpan(p.data(), p.size()), Span<float>(acc));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.message() << " | want: " << what;
  EXPECT_TRUE(SameBits(acc, before));
  s = c.Decompress(ByteSpan(p.data(), p.size()), TensorView(acc.data(), n, DType::kFloat32));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(SameBits(acc, before));
}

void SetBit(std::vector<uint8_t>* p, uint32_t s, size_t block, uint32_t word, size_t bit) {
  (*p)[16 + 4 + (block * (CodeBits(s) + 1) + word) * 8 + bit / 8] |= uint8_t(1u << (bit % 8));
}
void SetScale(std::vector<uint8_t>* p, float v) {
  std::memcpy(p->data() + 16, &v, 4);
}

TEST(Dithering, DecoderRejectsBadPayloads) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    // Truncations (and one extra byte), with the header left as is and with it patched to agree.
    for (const Config& cfg :
         {Config{false, 15, false}, Config{true, 3, false}, Config{false, 255, true}}) {
      auto c = Make(cfg, isa);
      for (size_t n : {size_t{1}, size_t{65}, size_t{130}}) {
        const auto p = Compress(*c, TestData(n, 3));
        for (size_t len = 0; len < p.size() + 1; ++len) {
          std::vector<uint8_t> q(p.begin(), p.begin() + std::min(len, p.size()));
          if (len == p.size()) q.push_back(0);
          ExpectRejected(*c, q, n, "");
          if (len >= 16) {
            const uint32_t body = uint32_t(q.size() - 16);
            std::memcpy(q.data() + 4, &body, 4);
            ExpectRejected(*c, q, n, "dithering: body is " + std::to_string(body) + " bytes");
          }
        }
      }
    }
    // Codes above s (possible when s + 1 is not a power of two).
    for (const Config& cfg : {Config{false, 5, false}, Config{true, 8, false},
                              Config{false, 100, true}, Config{true, 31 - 1, false}}) {
      auto c = Make(cfg, isa);
      const auto p = Compress(*c, TestData(130, 4));
      std::vector<uint8_t> q = p;
      const uint32_t b = CodeBits(cfg.s);
      for (uint32_t w = 1; w <= b; ++w) SetBit(&q, cfg.s, 1, w, 70 - 64);
      ExpectRejected(*c, q, 130,
                     "element 70 has level code " + std::to_string((1u << b) - 1) +
                         " but levels=" + std::to_string(cfg.s));
      // s + 1 exactly: the smallest bad code.
      q = p;
      for (uint32_t w = 1; w <= b; ++w) {
        q[16 + 4 + (1 * (b + 1) + w) * 8 + (70 - 64) / 8] &= uint8_t(~(1u << ((70 - 64) % 8)));
        if (((cfg.s + 1) >> (w - 1)) & 1) SetBit(&q, cfg.s, 1, w, 70 - 64);
      }
      ExpectRejected(*c, q, 130, "element 70 has level code " + std::to_string(cfg.s + 1));
    }
    for (const Config& cfg : {Config{false, 15, false}, Config{true, 3, true}}) {
      auto c = Make(cfg, isa);
      std::vector<float> x = TestData(130, 5);
      x[70] = 0.0f;
      const auto p = Compress(*c, x);
      ASSERT_EQ(Parse(p, 130, cfg.s).code[70], 0u);
      std::vector<uint8_t> q = p;
      SetBit(&q, cfg.s, 1, 0, 70 - 64);  // sign without a code
      ExpectRejected(*c, q, 130, "element 70 has its sign bit set but level code 0");
      // Padding of the last block (n = 65: one element in block 1).
      const auto p65 = Compress(*c, TestData(65, 6));
      for (uint32_t w = 0; w <= CodeBits(cfg.s); ++w) {
        q = p65;
        SetBit(&q, cfg.s, 1, w, 5);
        ExpectRejected(*c, q, 65, "padding slot 69 of the last block is not zero");
      }
      // Scales.
      for (float bad : {-1.0f, -0.0f, INFINITY, -INFINITY, -FLT_MIN}) {
        q = p;
        SetScale(&q, bad);
        ExpectRejected(*c, q, 130, "dithering: scale is ");
      }
      // NaN scale: accepted only with all-zero blocks (then everything decodes to NaN).
      q = p;
      SetScale(&q, std::numeric_limits<float>::quiet_NaN());
      ExpectRejected(*c, q, 130, "non-finite marker");
      std::vector<uint8_t> zero = Compress(*c, std::vector<float>(130, 0.0f));
      SetScale(&zero, -std::numeric_limits<float>::quiet_NaN());
      for (float v : Decompress(*c, zero, 130)) EXPECT_TRUE(std::isnan(v));
      // Zero scale with codes is fine (decodes to zeros).
      q = p;
      SetScale(&q, 0.0f);
      for (float v : Decompress(*c, q, 130)) EXPECT_EQ(v, 0.0f);
    }
  }
}

}  // namespace
}  // namespace bitpush::compressors
