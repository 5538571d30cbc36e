// Tests of LoCo (compressors/loco/loco.h), the faithfulness plan of paper 000's digest: the
// quantiser's golden values and tie rounding, the payload size, beta = 1 / reset = 0 / fp32
// reducing to classic error feedback bit for bit, Lemma 1's identity in fp64, the reset
// schedule, non-accumulation of the compression error against 4-bit without compensation,
// bit-identical state and payloads across ISA levels, checkpoints, the server's reply kinds,
// non-finite gradients and the telemetry.
#include "compressors/loco/loco.h"

#include <gtest/gtest.h>

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

std::unique_ptr<Compressor> Make(const std::string& spec, IsaLevel isa = BestIsaLevel()) {
  CompressorOptions o;
  o.isa = isa;
  auto c = CreateCompressor(spec, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

std::unique_ptr<ErrorFeedback> State(const std::string& spec, size_t n,
                                     ErrorFeedbackSide side = ErrorFeedbackSide::kWorker) {
  auto cfg = ParseCompressorSpec(spec);
  EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto s = CreateErrorFeedback(*cfg, side, n);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

std::vector<uint8_t> Buffer(Compressor& c, size_t n) {
  return std::vector<uint8_t>(c.MaxCompressedBytes(n, DType::kFloat32));
}

std::vector<float> Decode(Compressor& c, const std::vector<uint8_t>& payload, size_t bytes,
                          size_t n) {
  std::vector<float> out(n);
  Status s = c.DecompressToFloat({payload.data(), bytes}, {out.data(), n});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(Loco, QuantizerGoldenValuesTiesToEvenAndSaturation) {
  // scale = 2: t = 2x; ties (0.5, 1.5, 2.5, -0.5, -1.5, 7.5, -8.5) round to even.
  const std::vector<float> x = {0.25f, 0.75f, 1.25f,  -0.25f, -0.75f, 3.7f, 3.75f,
                                50.0f, -4.2f, -4.25f, -4.5f,  1.6f,   0.0f};
  const std::vector<int> want = {0, 2, 2, 0, -2, 7, 7, 7, -8, -8, -8, 3, 0};
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make("loco:scale=2", isa);
    std::vector<uint8_t> p = Buffer(*c, x.size());
    auto bytes = c->Compress(ConstTensorView(x.data(), x.size()), {}, {p.data(), p.size()});
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    ASSERT_EQ(*bytes, kPayloadHeaderBytes + 8 + 4 + 7u);
    const uint8_t* body = p.data() + kPayloadHeaderBytes;
    EXPECT_EQ(body[0], 1);  // kind: fixed scale
    float step;
    std::memcpy(&step, body + 8, 4);
    EXPECT_EQ(step, 0.5f);
    const uint8_t* codes = body + 12;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(loco::Nibble(codes, i), want[i]) << "element " << i << " isa " << int(isa);
    }
    EXPECT_EQ(codes[0], 0x20);    // element 0 in the low nibble, element 1 in the high one
    EXPECT_EQ(codes[6] >> 4, 0);  // padding nibble of odd n
    const std::vector<float> d = Decode(*c, p, *bytes, x.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(d[i], want[i] * 0.5f);
    // |x - C(x)| <= 1/(2s) in range (Lemma 5); 3.75, 50 and -4.5 saturate.
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] * 2 < 7.5f && x[i] * 2 >= -8.5f) {
        EXPECT_LE(std::fabs(x[i] - d[i]), 0.25f);
      }
    }
    CompressorTelemetry t;
    c->TakeTelemetry(&t);
    EXPECT_EQ(t.values, x.size());
    EXPECT_EQ(t.saturated, 3u);
  }
}

TEST(Loco, PayloadIsHalfAByteAnElementPlusScales) {
  for (size_t n : {size_t{1}, size_t{2}, size_t{31}, size_t{4097}, size_t{1} << 20}) {
    const std::vector<float> g = RandomFloats(n, 7, 1e-5f);
    auto c = Make("loco:scale=524288");
    std::vector<uint8_t> p = Buffer(*c, n);
    auto st = State("loco:scale=524288", n);
    auto bytes = st->Compress(*c, ConstTensorView(g.data(), n), {1, 1, 0}, {p.data(), p.size()});
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(*bytes, kPayloadHeaderBytes + 8 + 4 + (n + 1) / 2) << n;
    auto b = Make("loco:block=128");
    std::vector<uint8_t> q = Buffer(*b, n);
    auto bb = b->Compress(ConstTensorView(g.data(), n), {}, {q.data(), q.size()});
    ASSERT_TRUE(bb.ok());
    EXPECT_EQ(*bb, kPayloadHeaderBytes + 8 + 4 * ((n + 127) / 128) + (n + 1) / 2) << n;
  }
}

TEST(Loco, BlockScaleGoldenValues) {
  // One block of 4 with absmax 7: step 1, codes round(x) (ties to even).
  const std::vector<float> x = {7.0f, -2.5f, 0.5f, 3.4f, 0.0f, 0.0f};
  auto c = Make("loco:block=4");
  std::vector<uint8_t> p = Buffer(*c, x.size());
  auto bytes = c->Compress(ConstTensorView(x.data(), x.size()), {}, {p.data(), p.size()});
  ASSERT_TRUE(bytes.ok());
  const uint8_t* body = p.data() + kPayloadHeaderBytes;
  EXPECT_EQ(body[0], 2);
  float s0, s1;
  std::memcpy(&s0, body + 8, 4);
  std::memcpy(&s1, body + 12, 4);
  EXPECT_EQ(s0, 1.0f);
  EXPECT_EQ(s1, 0.0f);  // an all-zero block
  const std::vector<float> d = Decode(*c, p, *bytes, x.size());
  EXPECT_EQ(d, (std::vector<float>{7.0f, -2.0f, 0.0f, 3.0f, 0.0f, 0.0f}));
}

TEST(Loco, ErrorStepGoldenValues) {
  // scale 1, s_e = 4, beta = 0.5, no reset: hand-computed rounds.
  auto c = Make("loco:scale=1,error_scale=4,beta=0.5,reset=0");
  auto st = State("loco:scale=1,error_scale=4,beta=0.5,reset=0", 2);
  std::vector<uint8_t> p = Buffer(*c, 2);
  const float g[2] = {0.3f, 2.6f};
  // Round 0: e = 0; h = g; q = (0, 3); h - d = (0.3, -0.4); e_new = 0.5 * that = (0.15, -0.2);
  // E = round(4 e_new) = (1, -1) -> dec = (0.25, -0.25).
  auto b = st->Compress(*c, ConstTensorView(g, 2), {1, 0, 0}, {p.data(), p.size()});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Decode(*c, p, *b, 2), (std::vector<float>{0.0f, 3.0f}));
  EXPECT_EQ(std::vector<float>(st->residual().begin(), st->residual().end()),
            (std::vector<float>{0.25f, -0.25f}));
  // Round 1: h = (0.55, 2.35); q = (1, 2); h - d = (-0.45, 0.35);
  // e_new = 0.5 * (0.25, -0.25) + 0.5 * (-0.45, 0.35) = (-0.1, 0.05); E = round(4 e) = (0, 0).
  b = st->Compress(*c, ConstTensorView(g, 2), {1, 1, 0}, {p.data(), p.size()});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Decode(*c, p, *b, 2), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(std::vector<float>(st->residual().begin(), st->residual().end()),
            (std::vector<float>{0.0f, 0.0f}));
}

TEST(Loco, BetaOneNoResetFp32ErrorIsClassicErrorFeedbackBitForBit) {
  const std::string spec = "loco:scale=4,beta=1,reset=0,error=fp32";
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t n : {size_t{1}, size_t{33}, size_t{4097}}) {
      auto c1 = Make(spec, isa);
      auto c2 = Make(spec, isa);
      auto loco = State(spec, n);
      ResidualState classic(n);
      std::vector<uint8_t> p1 = Buffer(*c1, n), p2 = Buffer(*c2, n);
      for (uint64_t k = 0; k < 40; ++k) {
        const std::vector<float> g = RandomFloats(n, 100 + k, 0.7f);
        const CompressContext ctx{3, k, 0};
        auto b1 = loco->Compress(*c1, ConstTensorView(g.data(), n), ctx, {p1.data(), p1.size()});
        auto b2 = classic.Compress(*c2, ConstTensorView(g.data(), n), ctx, {p2.data(), p2.size()});
        ASSERT_TRUE(b1.ok() && b2.ok());
        ASSERT_EQ(*b1, *b2);
        ASSERT_EQ(0, std::memcmp(p1.data(), p2.data(), *b1)) << "round " << k << " n " << n;
        ASSERT_EQ(0, std::memcmp(loco->residual().data(), classic.residual().data(), 4 * n))
            << "round " << k << " n " << n;
      }
    }
  }
}

// Lemma 1 (paper 000), in fp64 over the fp32 values: the decoded push d_k satisfies
// d_k - g_k = (e_k - e_{k+1}) / beta + (e_{k+1} - e_new) / beta, where e_k is the error the
// state holds before round k (dec(E_k)) and e_new the moving average before its re-quantisation:
// exactly 0 for an fp32 error, at most step_e / 2 per element for the int8 one.
TEST(Loco, LemmaOneIdentity) {
  const size_t n = 1000;
  for (const char* error : {"fp32", "int8"}) {
    const std::string spec =
        std::string("loco:scale=16,error_scale=8,beta=0.2,reset=0,error=") + error;
    const double beta = 0.2, step_e = 1.0 / 128;
    const bool exact = std::string(error) == "fp32";
    auto c = Make(spec);
    auto st = State(spec, n);
    std::vector<uint8_t> p = Buffer(*c, n);
    double worst = 0;
    for (uint64_t k = 0; k < 30; ++k) {
      const std::vector<float> g = RandomFloats(n, 500 + k, 0.2f);
      const std::vector<float> e_k(st->residual().begin(), st->residual().end());
      auto b = st->Compress(*c, ConstTensorView(g.data(), n), {1, k, 0}, {p.data(), p.size()});
      ASSERT_TRUE(b.ok());
      const std::vector<float> d = Decode(*c, p, *b, n);
      const std::vector<float> e_k1(st->residual().begin(), st->residual().end());
      for (size_t i = 0; i < n; ++i) {
        const double lhs = static_cast<double>(d[i]) - g[i];
        const double rhs = (static_cast<double>(e_k[i]) - e_k1[i]) / beta;
        // fp32 rounding of h, h - d and the average, amplified by 1/beta.
        const double fp = 4e-7 * (std::fabs(g[i]) + std::fabs(e_k[i]) + 1.0) / beta;
        const double slack = exact ? fp : step_e / 2 / beta + fp;
        worst = std::max(worst, std::fabs(lhs - rhs) / slack);
        ASSERT_LE(std::fabs(lhs - rhs), slack) << error << " round " << k << " element " << i;
      }
    }
    EXPECT_GT(worst, 0.0) << error;  // the check compared something nontrivial
  }
}

TEST(Loco, ResetZeroesTheErrorEveryTRounds) {
  const size_t n = 256;
  const std::string spec = "loco:scale=8,beta=0.5,reset=4";
  auto c = Make(spec);
  auto plain = Make(spec);
  auto st = State(spec, n);
  std::vector<uint8_t> p = Buffer(*c, n), q = Buffer(*plain, n);
  for (uint64_t k = 0; k < 13; ++k) {
    const std::vector<float> g = RandomFloats(n, 900 + k, 0.5f);
    const bool zero_before = st->residual()[0] == 0 && st->residual()[n - 1] == 0;
    auto b = st->Compress(*c, ConstTensorView(g.data(), n), {1, k, 0}, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    double norm = 0;
    for (float v : st->residual()) norm += static_cast<double>(v) * v;
    if (k % 4 == 0) {
      EXPECT_EQ(norm, 0.0) << "round " << k << " resets";
    } else {
      EXPECT_GT(norm, 0.0) << "round " << k << " keeps its error";
    }
    if (k % 4 == 1) {
      // The round after a reset is compensated by nothing: the plain quantiser's payload.
      EXPECT_TRUE(zero_before);
      auto pb = plain->Compress(ConstTensorView(g.data(), n), {1, k, 0}, {q.data(), q.size()});
      ASSERT_TRUE(pb.ok());
      ASSERT_EQ(*pb, *b);
      EXPECT_EQ(0, std::memcmp(p.data(), q.data(), *b)) << "round " << k;
    }
  }
}

// The accumulated compression error ||sum_k (d_k - g_k)|| of a biased stream (every value
// 0.3 steps, below the rounding threshold, plus noise) grows linearly without compensation and
// stays bounded with LoCo (Lemma 2; int8 error, no reset). Assumption 3 holds: the int8 error's
// step (1/32 of the 4-bit step) is finer than beta times the per-round error, so the moving
// average does not round back to zero (with error_scale=4 it would: beta * 0.3 steps is below
// half of 1/4 step, and LoCo would send what 4-bit without compensation sends).
TEST(Loco, CompressionErrorDoesNotAccumulate) {
  const size_t n = 512;
  const float s = 64;
  const std::string spec = "loco:scale=64,error_scale=32,beta=0.2,reset=0";
  auto c = Make(spec);
  auto st = State(spec, n);
  std::vector<uint8_t> p = Buffer(*c, n);
  std::vector<double> acc_loco(n, 0), acc_plain(n, 0);
  auto norm = [](const std::vector<double>& v) {
    double s2 = 0;
    for (double x : v) s2 += x * x;
    return std::sqrt(s2);
  };
  double loco_at_half = 0, plain_at_half = 0;
  const int rounds = 400;
  for (int k = 0; k < rounds; ++k) {
    std::vector<float> g = RandomFloats(n, 2000 + k, 0.05f / s);
    for (float& v : g) v += 0.3f / s;
    auto b =
        st->Compress(*c, ConstTensorView(g.data(), n), {1, uint64_t(k), 0}, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    std::vector<float> d = Decode(*c, p, *b, n);
    for (size_t i = 0; i < n; ++i) acc_loco[i] += static_cast<double>(d[i]) - g[i];
    b = c->Compress(ConstTensorView(g.data(), n), {1, uint64_t(k), 0}, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    d = Decode(*c, p, *b, n);
    for (size_t i = 0; i < n; ++i) acc_plain[i] += static_cast<double>(d[i]) - g[i];
    if (k + 1 == rounds / 2) {
      loco_at_half = norm(acc_loco);
      plain_at_half = norm(acc_plain);
    }
  }
  const double step = 1.0 / s;
  // Without compensation every element loses ~0.3 steps a round: linear growth.
  EXPECT_GT(norm(acc_plain), 0.25 * step * rounds * std::sqrt(double(n)));
  EXPECT_NEAR(norm(acc_plain) / plain_at_half, 2.0, 0.1);
  // With LoCo the accumulated error is the current error / beta plus the int8 noise: a few
  // steps per element, and not growing with the number of rounds.
  EXPECT_LT(norm(acc_loco), 3.0 * step / 0.2 * std::sqrt(double(n)));
  EXPECT_LT(norm(acc_loco), 1.5 * loco_at_half + step * std::sqrt(double(n)));
  EXPECT_LT(norm(acc_loco) * 20, norm(acc_plain));
}

TEST(Loco, StateAndPayloadsAgreeAcrossIsaLevels) {
  // Blocks of 64 and 256 run the fused AVX-512 block step (a multiple of 32 elements), 48 and
  // a last short block the generic one; the block step's error norm is exact on every level.
  for (const char* spec :
       {"loco:scale=32,beta=0.3,reset=5", "loco:scale=32,error=fp32",
        "loco:scale=32,beta=1,reset=0", "loco:block=64,beta=0.3", "loco:block=48,beta=0.3",
        "loco:beta=0.3,reset=5", "loco:block=64,beta=1"}) {
    for (size_t n : {size_t{5}, size_t{63}, size_t{1000}}) {
      std::vector<std::vector<uint8_t>> payloads;
      std::vector<std::vector<float>> states;
      std::vector<double> norms;
      for (IsaLevel isa : SupportedIsaLevels()) {
        auto c = Make(spec, isa);
        auto st = State(spec, n);
        std::vector<uint8_t> p = Buffer(*c, n), all;
        for (uint64_t k = 0; k < 12; ++k) {
          const std::vector<float> g = RandomFloats(n, 40 + k, 0.4f);  // saturates often
          auto b = st->Compress(*c, ConstTensorView(g.data(), n), {2, k, 1}, {p.data(), p.size()});
          ASSERT_TRUE(b.ok());
          all.insert(all.end(), p.begin(), p.begin() + *b);
        }
        payloads.push_back(all);
        states.emplace_back(st->residual().begin(), st->residual().end());
        CompressorTelemetry t;
        c->TakeTelemetry(&t);
        norms.push_back(t.error_sq);
      }
      for (size_t i = 1; i < payloads.size(); ++i) {
        if (std::string(spec).find("scale=") == std::string::npos) {
          // The error norm is telemetry summed in double: the same to rounding (a compiler may
          // contract the scalar path's multiply-add), while the bytes and the state are exact.
          EXPECT_NEAR(norms[i], norms[0], 1e-12 * norms[0]) << spec << " n " << n;
        }
        EXPECT_EQ(payloads[i], payloads[0]) << spec << " n " << n;
        ASSERT_EQ(states[i].size(), states[0].size());
        EXPECT_EQ(0, std::memcmp(states[i].data(), states[0].data(), 4 * n)) << spec << " " << n;
      }
    }
  }
}

TEST(Loco, CheckpointRestoreContinuesBitForBit) {
  for (const char* spec : {"loco:scale=32,beta=0.3,reset=0", "loco:block=16,beta=0.3,reset=0",
                           "loco:block=16,reset=4", "loco:scale=32,error=fp32,beta=0.3,reset=0"}) {
    const size_t n = 301;
    auto c = Make(spec);
    auto a = State(spec, n);
    std::vector<uint8_t> p = Buffer(*c, n), q = Buffer(*c, n);
    for (uint64_t k = 0; k < 5; ++k) {
      const std::vector<float> g = RandomFloats(n, 70 + k, 0.3f);
      ASSERT_TRUE(
          a->Compress(*c, ConstTensorView(g.data(), n), {1, k, 0}, {p.data(), p.size()}).ok());
    }
    const std::vector<float> saved(a->residual().begin(), a->residual().end());
    auto b = State(spec, n);
    ASSERT_TRUE(b->Restore({saved.data(), saved.size()}).ok());
    EXPECT_EQ(0, std::memcmp(b->residual().data(), saved.data(), 4 * n)) << spec;
    const std::vector<float> g = RandomFloats(n, 99, 0.3f);
    auto x = a->Compress(*c, ConstTensorView(g.data(), n), {1, 5, 0}, {p.data(), p.size()});
    auto y = b->Compress(*c, ConstTensorView(g.data(), n), {1, 5, 0}, {q.data(), q.size()});
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(*x, *y);
    EXPECT_EQ(0, std::memcmp(p.data(), q.data(), *x)) << spec;
    EXPECT_FALSE(b->Restore({saved.data(), n - 1}).ok());
  }
}

TEST(Loco, ServerRepliesInThePullFormat) {
  const size_t n = 9;
  const std::vector<float> x = {1.0f, -2.5f, 3.14159f, 0.0f, 1e-3f, 65504.0f, -7.0f, 0.1f, 2.0f};
  const CompressContext server{1, 0, kServerStream};
  struct Case {
    const char* pull;
    uint8_t kind;
    size_t body;
  };
  for (const Case& k : {Case{"fp16", 4, 8 + 2 * n}, Case{"bf16", 5, 8 + 2 * n},
                        Case{"fp32", 3, 8 + 4 * n}, Case{"loco", 1, 8 + 4 + 5}}) {
    auto c = Make(std::string("loco:scale=1,pull=") + k.pull);
    std::vector<uint8_t> p = Buffer(*c, n);
    auto b = c->Compress(ConstTensorView(x.data(), n), server, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, kPayloadHeaderBytes + k.body) << k.pull;
    EXPECT_EQ(p[kPayloadHeaderBytes], k.kind) << k.pull;
    const std::vector<float> d = Decode(*c, p, *b, n);
    for (size_t i = 0; i < n; ++i) {
      float want = x[i];
      if (k.kind == 4) want = HalfToFloat(FloatToHalf(x[i]));
      if (k.kind == 5) want = Bf16ToFloat(FloatToBf16(x[i]));
      if (k.kind == 1) want = std::max(-8.0f, std::min(7.0f, std::nearbyint(x[i])));
      EXPECT_EQ(d[i], want) << k.pull << " " << i;
    }
    // A worker's push is 4-bit whatever the pull format.
    b = c->Compress(ConstTensorView(x.data(), n), {1, 0, 0}, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(p[kPayloadHeaderBytes], 1) << k.pull;
  }
  // The server keeps LoCo's error only where it replies in LoCo's 4 bits (two-hop).
  EXPECT_NE(nullptr,
            dynamic_cast<LocoState*>(State("loco:pull=loco", n, ErrorFeedbackSide::kServer).get()));
  EXPECT_NE(nullptr, dynamic_cast<ResidualState*>(
                         State("loco:pull=fp16", n, ErrorFeedbackSide::kServer).get()));
}

TEST(Loco, NonFiniteGradientDecodesToNaNAndResetsTheState) {
  const size_t n = 100;
  for (const char* spec : {"loco:scale=8", "loco:block=32"}) {
    auto c = Make(spec);
    auto st = State(spec, n);
    std::vector<uint8_t> p = Buffer(*c, n);
    std::vector<float> g = RandomFloats(n, 3, 0.5f);
    ASSERT_TRUE(
        st->Compress(*c, ConstTensorView(g.data(), n), {1, 1, 0}, {p.data(), p.size()}).ok());
    g[40] = std::numeric_limits<float>::infinity();
    auto b = st->Compress(*c, ConstTensorView(g.data(), n), {1, 2, 0}, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    const std::vector<float> d = Decode(*c, p, *b, n);
    EXPECT_TRUE(std::isnan(d[40])) << spec;
    for (float v : st->residual()) ASSERT_EQ(v, 0.0f) << spec;
  }
}

TEST(Loco, TelemetryCountsSaturationAndTheErrorNorm) {
  const size_t n = 64;
  auto c = Make("loco:scale=1,error_scale=1,beta=1,reset=0");
  auto st = State("loco:scale=1,error_scale=1,beta=1,reset=0", n);
  std::vector<uint8_t> p = Buffer(*c, n);
  std::vector<float> g(n, 0.0f);
  g[0] = 20.0f;   // saturates the 4-bit code (7): error 13
  g[1] = 500.0f;  // saturates both: error 493 -> int8 127
  g[2] = -0.25f;  // rounds to 0: error -0.25 -> int8 0
  ASSERT_TRUE(st->Compress(*c, ConstTensorView(g.data(), n), {1, 1, 0}, {p.data(), p.size()}).ok());
  CompressorTelemetry t;
  c->TakeTelemetry(&t);
  EXPECT_EQ(t.values, n);
  EXPECT_EQ(t.saturated, 2u);
  EXPECT_EQ(t.error_values, n);
  EXPECT_EQ(t.error_saturated, 1u);
  EXPECT_TRUE(t.error_reported);
  EXPECT_DOUBLE_EQ(t.error_sq, 13.0 * 13 + 127.0 * 127);
  CompressorTelemetry again;
  c->TakeTelemetry(&again);
  EXPECT_EQ(again.values, 0u);  // taken
}

TEST(Loco, DecoderRefusesForeignScalesAndCodes) {
  const size_t n = 8;
  const std::vector<float> x = RandomFloats(n, 5, 1.0f);
  auto c = Make("loco:scale=4");
  std::vector<uint8_t> p = Buffer(*c, n);
  auto b = c->Compress(ConstTensorView(x.data(), n), {}, {p.data(), p.size()});
  ASSERT_TRUE(b.ok());
  std::vector<float> acc(n, 1.0f);
  auto refused = [&](std::vector<uint8_t> bad, const char* why) {
    Status s = c->DecompressAdd({bad.data(), *b}, {acc.data(), n});
    EXPECT_FALSE(s.ok()) << why;
    for (float v : acc) ASSERT_EQ(v, 1.0f) << why;
  };
  std::vector<uint8_t> bad = p;
  const float other = 0.5f;
  std::memcpy(bad.data() + kPayloadHeaderBytes + 8, &other, 4);
  refused(bad, "a step other than 1/scale");
  bad = p;
  bad[kPayloadHeaderBytes] = 3;  // fp32 values, but this key pulls LoCo
  refused(bad, "a reply kind the key does not use");
  bad = p;
  bad[kPayloadHeaderBytes] = 9;
  refused(bad, "unknown kind");
  auto blk = Make("loco:block=4");
  p = Buffer(*blk, n);
  b = blk->Compress(ConstTensorView(x.data(), n), {}, {p.data(), p.size()});
  ASSERT_TRUE(b.ok());
  bad = p;
  bad[kPayloadHeaderBytes + 8 + 8] = 0x08;  // element 0: code -8
  Status s = blk->DecompressAdd({bad.data(), *b}, {acc.data(), n});
  EXPECT_FALSE(s.ok());
}

TEST(Loco, BlockErrorStepGoldenValues) {
  // One block of 4, beta = 0.5, no reset. Round 0: h = g, absmax 7: step 1, q = round(h) =
  // (7, -2, 0, 3); r = h - q = (0, -0.5, 0.5, 0.4); e = 0.5 r = (0, -0.25, 0.25, 0.2); the
  // error's absmax 0.25: step_e = 0.25 / 127, E = round(e * 508) = (0, -127, 127, 102).
  const std::vector<float> g = {7.0f, -2.5f, 0.5f, 3.4f};
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make("loco:block=4,beta=0.5,reset=0", isa);
    auto st = State("loco:block=4,beta=0.5,reset=0", 4);
    std::vector<uint8_t> p = Buffer(*c, 4);
    auto b = st->Compress(*c, ConstTensorView(g.data(), 4), {1, 0, 0}, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(Decode(*c, p, *b, 4), (std::vector<float>{7.0f, -2.0f, 0.0f, 3.0f}));
    const float step_e = 0.25f / 127.0f;
    EXPECT_EQ(std::vector<float>(st->residual().begin(), st->residual().end()),
              (std::vector<float>{0.0f, -127 * step_e, 127 * step_e, 102 * step_e}));
    CompressorTelemetry t;
    c->TakeTelemetry(&t);
    EXPECT_EQ(t.saturated, 0u);
    EXPECT_DOUBLE_EQ(t.error_sq, (127.0 * 127 * 2 + 102.0 * 102) * step_e * step_e);
  }
}

// A block of subnormal values: 7 / absmax overflows fp32, so the block's scale is capped at
// FLT_MAX (0 * s stays 0); every level writes the same finite, decodable payload and state.
TEST(Loco, SubnormalBlockScalesAreFiniteAndAgreeAcrossIsaLevels) {
  const size_t n = 64;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = (static_cast<float>(i) - 32.0f) * 1e-40f;
  std::vector<std::vector<uint8_t>> payloads;
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make("loco:block=32", isa);
    auto st = State("loco:block=32", n);
    std::vector<uint8_t> p = Buffer(*c, n), all;
    for (uint64_t k = 1; k < 4; ++k) {
      auto b = st->Compress(*c, ConstTensorView(g.data(), n), {1, k, 0}, {p.data(), p.size()});
      ASSERT_TRUE(b.ok());
      for (float v : Decode(*c, p, *b, n)) ASSERT_TRUE(std::isfinite(v));
      all.insert(all.end(), p.begin(), p.begin() + *b);
      b = c->Compress(ConstTensorView(g.data(), n), {1, k, 0}, {p.data(), p.size()});
      ASSERT_TRUE(b.ok());
      const std::vector<float> d = Decode(*c, p, *b, n);
      EXPECT_NE(d[0], 0.0f);  // -32e-40 * FLT_MAX rounds to code -1 (of step 32e-40 / 7)
      all.insert(all.end(), p.begin(), p.begin() + *b);
    }
    for (float v : st->residual()) ASSERT_TRUE(std::isfinite(v));
    payloads.push_back(all);
  }
  for (size_t i = 1; i < payloads.size(); ++i) EXPECT_EQ(payloads[i], payloads[0]);
}

// The default spec (block=256) on gradient-like tensors of any magnitude: nothing saturates
// and the first push is within 20 % of the gradient (4 bits over a block's absmax: about
// 12 %); the paper's fixed scale 2^19 saturates most of a 1e-3 gradient.
TEST(Loco, DefaultDoesNotSaturateGradientLikeTensors) {
  const size_t n = 4096;
  for (float sigma : {1e-8f, 1e-5f, 1e-3f, 1.0f, 100.0f}) {
    auto c = Make("loco");
    auto st = State("loco", n);
    std::vector<uint8_t> p = Buffer(*c, n);
    const std::vector<float> g = RandomFloats(n, 11, sigma);
    auto b = st->Compress(*c, ConstTensorView(g.data(), n), {1, 1, 0}, {p.data(), p.size()});
    ASSERT_TRUE(b.ok());
    const std::vector<float> d = Decode(*c, p, *b, n);
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
      err += (static_cast<double>(d[i]) - g[i]) * (static_cast<double>(d[i]) - g[i]);
      norm += static_cast<double>(g[i]) * g[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 0.2) << sigma;
    CompressorTelemetry t;
    c->TakeTelemetry(&t);
    EXPECT_EQ(t.values, n);
    EXPECT_EQ(t.saturated, 0u) << sigma;
  }
  auto fixed = Make("loco:scale=524288");
  auto st = State("loco:scale=524288", n);
  std::vector<uint8_t> p = Buffer(*fixed, n);
  const std::vector<float> g = RandomFloats(n, 11, 1e-3f);
  ASSERT_TRUE(
      st->Compress(*fixed, ConstTensorView(g.data(), n), {1, 1, 0}, {p.data(), p.size()}).ok());
  CompressorTelemetry t;
  fixed->TakeTelemetry(&t);
  EXPECT_GT(t.saturated, n * 9 / 10);
}

TEST(Loco, SpecsParseAndRefuseBadParameters) {
  auto cfg = ParseCompressorSpec("loco");
  ASSERT_TRUE(cfg.ok());
  // The default is the block scale; a fixed scale's parameter selects the fixed scale.
  EXPECT_EQ(CompressorSpecString(*cfg),
            "loco:scale=524288,error_scale=4,block=256,beta=0.2,reset=512,error=int8,pull=loco");
  for (const char* fixed : {"loco:scale=524288", "loco:error_scale=6", "loco:block=0"}) {
    EXPECT_EQ(ParseCompressorSpec(fixed)->loco().block(), 0u) << fixed;
  }
  EXPECT_EQ(ParseCompressorSpec("loco:scale=4096,block=64")->loco().block(), 64u);
  EXPECT_EQ(ParseCompressorSpec("loco:beta=0.5")->loco().block(), 256u);
  EXPECT_EQ(PartitionAlign(*cfg), 256u);
  EXPECT_EQ(RecommendedErrorFeedback(*cfg), v1::ERROR_FEEDBACK_BOTH);
  EXPECT_EQ(RecommendedErrorFeedback(*ParseCompressorSpec("loco:pull=fp16")),
            v1::ERROR_FEEDBACK_WORKER);
  EXPECT_EQ(PartitionAlign(*ParseCompressorSpec("loco:block=128")), 128u);
  for (const char* bad :
       {"loco:scale=0", "loco:scale=-1", "loco:beta=0", "loco:beta=1.5", "loco:block=3",
        "loco:error=int4", "loco:pull=onebit", "loco:error_scale=0", "loco:bogus=1"}) {
    EXPECT_FALSE(ParseCompressorSpec(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace bitpush::compressors
