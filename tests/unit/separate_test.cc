// SEPARATE (paper 003; compressors/separate/): the common Gaussian stream (bit-identical across
// ISA levels and processes, N(0, 1) moments), the projection's statistics (unbiased, variance
// (d + 1) / m ||g||^2), linearity and the server's sum, the moving-average error feedback
// (telescoping between resets in both conventions, the reset), the wire size and the
// decoder's refusals.
#include "compressors/separate/separate.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "common/little_endian.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "compressors/separate/gaussian.h"
#include "compressors/separate/separate_kernels.h"
#include "compressors/spec_registry.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using separate::BlockStream;
using separate::FillGaussians;
using separate::GaussianAt;
using testing::RandomFloats;

std::unique_ptr<Compressor> Make(const std::string& spec, IsaLevel isa = BestIsaLevel()) {
  CompressorOptions o;
  o.isa = isa;
  auto c = CreateCompressor(spec, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

std::unique_ptr<ErrorFeedback> MakeState(const std::string& spec, size_t n) {
  auto cfg = ParseCompressorSpec(spec);
  EXPECT_TRUE(cfg.ok());
  auto s = CreateErrorFeedback(*cfg, ErrorFeedbackSide::kWorker, n);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

std::vector<uint8_t> Push(Compressor& c, const std::vector<float>& x, CompressContext ctx) {
  std::vector<uint8_t> out(c.MaxCompressedBytes(x.size(), DType::kFloat32));
  auto r = c.Compress(ConstTensorView(x.data(), x.size()), ctx, {out.data(), out.size()});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  out.resize(r.ok() ? *r : 0);
  return out;
}

std::vector<float> Decode(Compressor& c, const std::vector<uint8_t>& p, size_t n) {
  std::vector<float> out(n);
  const Status s = c.Decompress({p.data(), p.size()}, TensorView(out.data(), n));
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::vector<float> Projections(const std::vector<uint8_t>& p) {
  const size_t k = (p.size() - kPayloadHeaderBytes - 16) / 4;
  std::vector<float> v(k);
  std::memcpy(v.data(), p.data() + kPayloadHeaderBytes + 16, 4 * k);
  return v;
}

double Norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return s;
}

// ---- the Gaussian stream ------------------------------------------------------------------

TEST(SeparateGaussian, FillMatchesTheDefinitionOnEveryLevelAtAnyOffset) {
  for (IsaLevel isa : testing::SupportedIsaLevels()) {
    SCOPED_TRACE(std::string(IsaLevelName(isa)));
    for (uint64_t stream : {uint64_t{0}, uint64_t{0x123456789ABCDEFull}, ~uint64_t{0}}) {
      for (uint32_t first : {0u, 1u, 15u, 16u, 31u, 32u, 33u, 1000u, 0xFFFFFF00u}) {
        for (size_t count :
             {size_t{0}, size_t{1}, size_t{17}, size_t{32}, size_t{95}, size_t{200}}) {
          std::vector<float> got(count + 1, 7.0f);
          FillGaussians(stream, first, count, got.data(), isa);
          for (size_t k = 0; k < count; ++k) {
            const float want = GaussianAt(stream, first + static_cast<uint32_t>(k));
            ASSERT_EQ(0, std::memcmp(&got[k], &want, 4))
                << "stream " << stream << " position " << first + k << ": " << got[k] << " vs "
                << want;
          }
          ASSERT_EQ(got[count], 7.0f) << "wrote past count";
        }
      }
    }
  }
}

TEST(SeparateGaussian, SimdKernelsMatchScalarBitForBit) {
  for (IsaLevel isa : testing::SupportedIsaLevels()) {
    SCOPED_TRACE(std::string(IsaLevelName(isa)));
    for (size_t d : {1, 15, 16, 17, 31, 32, 33, 48, 64, 100, 128, 1000}) {
      for (size_t m : {1, 3, 8}) {
        const std::vector<float> h = RandomFloats(d, 5 + d);
        const std::vector<float> q = RandomFloats(m, 9 + m);
        const uint64_t bs = BlockStream(77, d * 10 + m);
        std::vector<float> p1(m), p2(m), r1(d, 1.0f), r2(d, 2.0f);
        separate::ProjectBlock(bs, h.data(), d, m, p1.data(), IsaLevel::kScalar);
        separate::ProjectBlock(bs, h.data(), d, m, p2.data(), isa);
        EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), 4 * m)) << "project d=" << d << " m=" << m;
        separate::ReconstructBlock(bs, q.data(), d, m, r1.data(), IsaLevel::kScalar);
        separate::ReconstructBlock(bs, q.data(), d, m, r2.data(), isa);
        EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), 4 * d))
            << "reconstruct d=" << d << " m=" << m;
      }
    }
  }
}

// Every radius (16 bits) and every angle (14 bits) against the exact Box-Muller values.
TEST(SeparateGaussian, EveryRadiusAndAngleIsAccurate) {
  double worst_r = 0, worst_a = 0;
  for (uint32_t k1 = 0; k1 < 65536; ++k1) {
    float c, s;
    separate::GaussianPair(k1, &c, &s);  // angle index 0, both signs +
    const double u = (2.0 * k1 + 1) / 131072.0;
    const double r = std::sqrt(-2 * std::log(u));
    const double a = M_PI / 65536;
    worst_r = std::max(worst_r, std::fabs(std::hypot(double{c}, double{s}) - r));
    ASSERT_GT(c, 0.0f);
    ASSERT_GT(s, 0.0f);
    ASSERT_NEAR(c, r * std::cos(a), 2e-5) << k1;
  }
  for (uint32_t k2 = 0; k2 < 16384; ++k2) {
    float c, s;
    const uint32_t k1 = 12345;  // r = 1.37...
    separate::GaussianPair(k1 | (k2 << 18), &c, &s);
    const double r = std::sqrt(-2 * std::log((2.0 * k1 + 1) / 131072.0));
    const double a = (2.0 * k2 + 1) * M_PI / 65536;
    worst_a =
        std::max(worst_a, std::max(std::fabs(c - r * std::cos(a)), std::fabs(s - r * std::sin(a))));
  }
  // Signs: bits 16 and 17 flip the two halves.
  float c0, s0, c1, s1;
  separate::GaussianPair(777, &c0, &s0);
  separate::GaussianPair(777 | (3u << 16), &c1, &s1);
  EXPECT_EQ(c1, -c0);
  EXPECT_EQ(s1, -s0);
  printf("max |r - exact| = %.3g, max |z - exact| over the angles = %.3g\n", worst_r, worst_a);
  EXPECT_LT(worst_r, 2e-5);
  EXPECT_LT(worst_a, 2e-6);
}

// A child process draws the stream (scalar) and sends its bytes back through a pipe: the
// parent's draw at its best level is identical.
TEST(SeparateGaussian, AnotherProcessDrawsTheSameBytes) {
  constexpr size_t kCount = 100000;
  const uint64_t stream = StreamKey(3407, kCommonStream, 12, 345);
  int fds[2];
  ASSERT_EQ(0, pipe(fds));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    std::vector<float> v(kCount);
    FillGaussians(stream, 5, kCount, v.data(), IsaLevel::kScalar);
    const char* p = reinterpret_cast<const char*>(v.data());
    size_t left = kCount * 4;
    while (left > 0) {
      const ssize_t w = write(fds[1], p, left);
      if (w <= 0) _exit(2);
      p += w;
      left -= static_cast<size_t>(w);
    }
    _exit(0);
  }
  close(fds[1]);
  std::vector<float> theirs(kCount);
  char* p = reinterpret_cast<char*>(theirs.data());
  size_t got = 0;
  while (got < kCount * 4) {
    const ssize_t r = read(fds[0], p + got, kCount * 4 - got);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(got, kCount * 4);
  std::vector<float> mine(kCount);
  FillGaussians(stream, 5, kCount, mine.data(), BestIsaLevel());
  EXPECT_EQ(0, std::memcmp(mine.data(), theirs.data(), kCount * 4));
}

TEST(SeparateGaussian, MomentsAreStandardNormal) {
  constexpr size_t kCount = size_t{1} << 23;
  std::vector<float> z(kCount);
  FillGaussians(0xABCDEF, 0, kCount, z.data(), BestIsaLevel());
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0, lag1 = 0, pair = 0, pair_sq = 0, max_abs = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const double v = z[i];
    ASSERT_NE(v, 0.0) << i;
    s1 += v;
    s2 += v * v;
    s3 += v * v * v;
    s4 += v * v * v * v;
    max_abs = std::max(max_abs, std::fabs(v));
    if (i + 1 < kCount) lag1 += v * z[i + 1];
    if (i % 32 < 16) {  // the cos and sin halves of one hash
      pair += v * z[i + 16];
      pair_sq += v * v * z[i + 16] * z[i + 16];
    }
  }
  const double n = kCount;
  const double half = n / 2;
  printf("E z = %.5f, E z^2 = %.5f, E z^3 = %.5f, E z^4 = %.5f, max |z| = %.3f\n", s1 / n, s2 / n,
         s3 / n, s4 / n, max_abs);
  EXPECT_NEAR(s1 / n, 0.0, 0.002);
  EXPECT_NEAR(s2 / n, 1.0, 0.003);
  EXPECT_NEAR(s3 / n, 0.0, 0.01);
  EXPECT_NEAR(s4 / n, 3.0, 0.015);
  EXPECT_NEAR(lag1 / n, 0.0, 0.002);
  EXPECT_NEAR(pair / half, 0.0, 0.003);
  EXPECT_NEAR(pair_sq / half, 1.0, 0.01);  // independent halves: E z1^2 z2^2 = 1
  EXPECT_LT(max_abs, 4.86);
}

// ---- the projection's statistics ----------------------------------------------------------

// d = 256 in one block, m = 16 (CR 16), T rounds (each a fresh stream): the mean of the
// reconstructions approaches g as sqrt((d + 1) / (m T)), and E ||g~ - g||^2 = (d + 1) / m ||g||^2.
TEST(SeparateProjection, UnbiasedWithTheExactVariance) {
  constexpr size_t d = 256;
  constexpr int kRounds = 20000;
  auto c = Make("separate:ratio=16,block=256");
  const std::vector<float> g = RandomFloats(d, 42);
  double gsq = 0;
  for (float v : g) gsq += double{v} * v;
  std::vector<double> mean(d, 0.0);
  double sum_err = 0, sum_err_sq = 0;
  for (int t = 0; t < kRounds; ++t) {
    const std::vector<float> rec = Decode(*c, Push(*c, g, {9, uint64_t(t)}), d);
    double err = 0;
    for (size_t i = 0; i < d; ++i) {
      mean[i] += rec[i];
      err += (double{rec[i]} - g[i]) * (double{rec[i]} - g[i]);
    }
    sum_err += err / gsq;
    sum_err_sq += (err / gsq) * (err / gsq);
  }
  std::vector<double> bias(d);
  for (size_t i = 0; i < d; ++i) bias[i] = mean[i] / kRounds - g[i];
  const double rel_bias = std::sqrt(Norm2(bias) / gsq);
  const double expect_bias = std::sqrt((d + 1.0) / (16.0 * kRounds));
  const double var = sum_err / kRounds;
  const double var_se = std::sqrt((sum_err_sq / kRounds - var * var) / kRounds);
  printf(
      "||mean - g|| / ||g|| = %.4f (expected %.4f); E||g~ - g||^2 / ||g||^2 = %.3f +- %.3f "
      "(exact %.4f)\n",
      rel_bias, expect_bias, var, var_se, (d + 1.0) / 16.0);
  EXPECT_GT(rel_bias, 0.75 * expect_bias);
  EXPECT_LT(rel_bias, 1.25 * expect_bias);
  EXPECT_NEAR(var, (d + 1.0) / 16.0, 4 * var_se);
}

TEST(SeparateProjection, LinearAndTheServerSumDecodesToTheReconstructionOfTheMean) {
  constexpr size_t n = 1000;  // blocks of 64: 15 full and one of 40
  constexpr int kWorkers = 3;
  auto c = Make("separate:ratio=4,block=64");
  const CompressContext ctx{4, 17, 0};
  std::vector<std::vector<float>> h;
  std::vector<float> sum(n, 0.0f), mean(n);
  std::vector<std::vector<uint8_t>> pushes;
  std::vector<ByteSpan> spans;
  for (int w = 0; w < kWorkers; ++w) {
    h.push_back(RandomFloats(n, 100 + w));
    for (size_t i = 0; i < n; ++i) sum[i] += h[w][i];
    CompressContext cw = ctx;
    cw.worker = static_cast<uint32_t>(w);  // the stream is common: the rank does not matter
    pushes.push_back(Push(*c, h[w], cw));
  }
  for (auto& p : pushes) spans.push_back({p.data(), p.size()});
  for (size_t i = 0; i < n; ++i) mean[i] = sum[i] / kWorkers;
  // sum_n P(h_n) == P(sum_n h_n) to fp32 rounding (|p| <= 4.86 sum|h| bounds each term).
  const std::vector<float> p_sum = Projections(Push(*c, sum, ctx));
  std::vector<std::vector<float>> p;
  for (auto& push : pushes) p.push_back(Projections(push));
  double max_abs_h = 0;
  for (float v : sum) max_abs_h = std::max(max_abs_h, double{std::fabs(v)});
  for (size_t r = 0; r < p_sum.size(); ++r) {
    const double lhs = double{p[0][r]} + p[1][r] + p[2][r];
    EXPECT_NEAR(lhs, p_sum[r], 1e-5 * 64 * 4.86 * 3 * 4) << "projection " << r;
  }
  // The server's round: (sum in rank order) * 1/N, exactly; decoded: the reconstruction of the
  // mean.
  std::vector<uint8_t> reply(c->MaxCompressedBytes(n, DType::kFloat32));
  auto r = c->AggregateCompress(spans, n, 1.0f / kWorkers, nullptr, {4, 17, kServerStream},
                                {reply.data(), reply.size()});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  reply.resize(*r);
  const std::vector<float> agg = Projections(reply);
  for (size_t k = 0; k < agg.size(); ++k) {
    float a = p[0][k];
    a += p[1][k];
    a += p[2][k];
    a *= 1.0f / kWorkers;
    ASSERT_EQ(agg[k], a) << k;
  }
  const std::vector<float> from_server = Decode(*c, reply, n);
  const std::vector<float> direct = Decode(*c, Push(*c, mean, ctx), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(from_server[i], direct[i], 1e-3 * (1 + std::fabs(direct[i]))) << i;
  }
}

TEST(SeparateProjection, WireSizeIsHeaderPlusOneFloatPerProjection) {
  struct Case {
    const char* spec;
    size_t n;
    size_t projections;
  };
  const Case cases[] = {
      {"separate", 0, 0},
      {"separate", 1, 1},                                 // last block 1 of 64: max(1, ceil(4/64))
      {"separate", 128, 8},                               // two full blocks, m = 4
      {"separate", 1000, 15 * 4 + 3},                     // 15 full, last 40: ceil(40*4/64) = 3
      {"separate:block=128", 1000, 7 * 8 + 7},            // 7 full, last 104: ceil(104*8/128) = 7
      {"separate:ratio=4,block=64", 1000, 15 * 16 + 10},  // last 40: ceil(40*16/64) = 10
      {"separate:ratio=3,block=10", 25, 2 * 4 + 2},       // m = ceil(10/3) = 4; last 5: 2
      {"separate:ratio=1,block=7", 9, 7 + 2},
  };
  for (const Case& k : cases) {
    auto c = Make(k.spec);
    const std::vector<float> x = RandomFloats(k.n, 3);
    const std::vector<uint8_t> p = Push(*c, x, {1, 2});
    EXPECT_EQ(p.size(), kPayloadHeaderBytes + 16 + 4 * k.projections) << k.spec << " n=" << k.n;
    EXPECT_EQ(p.size(), c->MaxCompressedBytes(k.n, DType::kFloat32));
    EXPECT_EQ(SeparateCompressor::Projections(k.n, dynamic_cast<SeparateCompressor&>(*c).block(),
                                              dynamic_cast<SeparateCompressor&>(*c).rows()),
              k.projections);
  }
}

TEST(SeparateProjection, BadBodiesAreRefusedNamingTheProblem) {
  auto c = Make("separate:ratio=4,block=64");
  const size_t n = 100;
  const std::vector<uint8_t> good = Push(*c, RandomFloats(n, 1), {1, 1});
  auto refused = [&](std::vector<uint8_t> bad, const std::string& words) {
    // Keep the header's body length consistent so the body itself is judged.
    PutU32(bad.data() + 4, static_cast<uint32_t>(bad.size() - kPayloadHeaderBytes));
    std::vector<float> acc(n, 1.0f);
    const Status s = c->DecompressAdd({bad.data(), bad.size()}, {acc.data(), n});
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << words << ": " << s.ToString();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.ToString();
    EXPECT_EQ(acc, std::vector<float>(n, 1.0f));
    EXPECT_EQ(c->ValidatePayload({bad.data(), bad.size()}, n).code(), StatusCode::kDataLoss);
  };
  uint8_t* body = nullptr;
  std::vector<uint8_t> b = good;
  b.resize(kPayloadHeaderBytes + 10);
  refused(b, "shorter than its 16-byte header");
  b = good;
  body = b.data() + kPayloadHeaderBytes;
  PutU32(body + 8, 0);
  refused(b, "block 0");
  b = good;
  body = b.data() + kPayloadHeaderBytes;
  PutU32(body + 8, (1u << 24) + 1);
  refused(b, "outside 1..16777216");
  b = good;
  body = b.data() + kPayloadHeaderBytes;
  PutU32(body + 12, 0);
  refused(b, "0 projections per block");
  b = good;
  body = b.data() + kPayloadHeaderBytes;
  PutU32(body + 12, 65);
  refused(b, "65 projections per block of 64");
  b = good;
  b.push_back(0);
  refused(b, "take");
  b = good;
  body = b.data() + kPayloadHeaderBytes;
  PutU32(body + 8, 32);  // a valid block whose projection count the length does not match
  refused(b, "blocks of 32");
  // A different block that fits the length decodes (the body describes itself).
  b = good;
  body = b.data() + kPayloadHeaderBytes;
  // n = 100 at block 64, m 16: 16 + ceil(36*16/64) = 25 projections; block 100, m 25: 25 too.
  PutU32(body + 8, 100);
  PutU32(body + 12, 25);
  std::vector<float> out(n);
  EXPECT_TRUE(c->Decompress({b.data(), b.size()}, TensorView(out.data(), n)).ok());
}

TEST(SeparateProjection, ServerRefusesPushesOfDifferentStreams) {
  auto c = Make("separate:ratio=4,block=64");
  const size_t n = 100;
  const std::vector<float> x = RandomFloats(n, 1);
  const std::vector<uint8_t> a = Push(*c, x, {1, 5}), b = Push(*c, x, {1, 6});
  const ByteSpan spans[] = {{a.data(), a.size()}, {b.data(), b.size()}};
  std::vector<uint8_t> out(c->MaxCompressedBytes(n, DType::kFloat32));
  auto r = c->AggregateCompress({spans, 2}, n, 0.5f, nullptr, {1, 5, kServerStream},
                                {out.data(), out.size()});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("different seeds, rounds"), std::string::npos)
      << r.status().ToString();
  EXPECT_FALSE(c->FusesServerRound(true));
  EXPECT_TRUE(c->FusesServerRound(false));
}

// ---- the worker's moving-average error ----------------------------------------------------

struct Cluster {
  std::unique_ptr<Compressor> c;
  std::vector<std::unique_ptr<ErrorFeedback>> states;
  size_t n;
  // One round: every worker pushes g[w] through its state, the server averages, every worker
  // decodes the reply through its state; returns worker 0's output.
  std::vector<float> Round(const std::vector<std::vector<float>>& g, uint64_t round) {
    std::vector<std::vector<uint8_t>> pushes(states.size());
    std::vector<ByteSpan> spans;
    for (size_t w = 0; w < states.size(); ++w) {
      pushes[w].resize(c->MaxCompressedBytes(n, DType::kFloat32));
      auto r = states[w]->Compress(*c, ConstTensorView(g[w].data(), n),
                                   {7, round, static_cast<uint32_t>(w)},
                                   {pushes[w].data(), pushes[w].size()});
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      pushes[w].resize(*r);
      spans.push_back({pushes[w].data(), pushes[w].size()});
    }
    std::vector<uint8_t> reply(c->MaxCompressedBytes(n, DType::kFloat32));
    auto r = c->AggregateCompress(spans, n, 1.0f / states.size(), nullptr,
                                  {7, round, kServerStream}, {reply.data(), reply.size()});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    reply.resize(*r);
    std::vector<float> out0;
    for (size_t w = 0; w < states.size(); ++w) {
      std::vector<float> out(n);
      const Status s = states[w]->DecompressReply(*c, {reply.data(), reply.size()},
                                                  {7, round, static_cast<uint32_t>(w)},
                                                  TensorView(out.data(), n));
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (w == 0)
        out0 = out;
      else
        EXPECT_EQ(0, std::memcmp(out.data(), out0.data(), 4 * n));  // the same everywhere
    }
    return out0;
  }
  std::vector<double> MeanError() const {
    std::vector<double> e(n, 0.0);
    for (auto& s : states) {
      for (size_t i = 0; i < n; ++i) e[i] += s->residual()[i] / double(states.size());
    }
    return e;
  }
};

Cluster MakeCluster(const std::string& spec, size_t n, int workers) {
  Cluster k{Make(spec), {}, n};
  for (int w = 0; w < workers; ++w) k.states.push_back(MakeState(spec, n));
  return k;
}

// Between resets, sum_k h~^k = sum_k mean_n g_n^k + (e^0 - e^K) / a_new (node averages), for
// both conventions (printed is unstable at these settings, so fewer rounds).
TEST(SeparateErrorFeedback, TelescopesBetweenResets) {
  for (const auto& [spec, rounds] :
       {std::pair<std::string, int>{"separate:ratio=16,block=128,reset=0", 60},
        {"separate:ratio=4,block=64,beta=0.9,reset=0,ema=stable", 60},
        {"separate:ratio=4,block=64,beta=0.95,reset=0,ema=printed", 12},
        {"separate:ratio=16,block=128,beta=0.3,reset=1000,ema=printed", 12}}) {
    SCOPED_TRACE(spec);
    constexpr size_t n = 300;
    constexpr int kWorkers = 2;
    Cluster k = MakeCluster(spec, n, kWorkers);
    const auto& st = dynamic_cast<const SeparateState&>(*k.states[0]);
    const double a_new = st.a_new();
    std::vector<double> sum_out(n, 0.0), sum_g(n, 0.0), scale(n, 0.0);
    for (int t = 1; t <= rounds; ++t) {
      std::vector<std::vector<float>> g;
      for (int w = 0; w < kWorkers; ++w) g.push_back(RandomFloats(n, 1000 * t + w));
      const std::vector<float> out = k.Round(g, t);
      for (size_t i = 0; i < n; ++i) {
        sum_out[i] += out[i];
        sum_g[i] += (double{g[0][i]} + g[1][i]) / kWorkers;
        scale[i] += std::fabs(out[i]);
      }
    }
    const std::vector<double> e = k.MeanError();
    for (size_t i = 0; i < n; ++i) {
      const double want = sum_g[i] - e[i] / a_new;
      ASSERT_NEAR(sum_out[i], want, 1e-5 * (scale[i] + std::fabs(e[i]) / a_new) + 1e-4)
          << "element " << i;
    }
  }
}

TEST(SeparateErrorFeedback, ResetZeroesTheErrorAndTheTelemetryReportsIt) {
  constexpr size_t n = 200;
  Cluster k = MakeCluster("separate:ratio=8,block=64,reset=4", n, 2);
  for (uint64_t t = 1; t <= 13; ++t) {
    std::vector<std::vector<float>> g = {RandomFloats(n, t), RandomFloats(n, 50 + t)};
    k.Round(g, t);
    double esq = 0;
    for (float v : k.states[0]->residual()) esq += double{v} * v;
    if (t % 4 == 0) {
      EXPECT_EQ(esq, 0.0) << "round " << t;
    } else {
      EXPECT_GT(esq, 0.0) << "round " << t;
    }
    CompressorTelemetry tel;
    k.states[0]->TakeTelemetry(&tel);
    ASSERT_TRUE(tel.error_reported && tel.gradient_reported);
    double gsq = 0;
    for (float v : g[0]) gsq += double{v} * v;
    EXPECT_NEAR(tel.gradient_sq, gsq, 1e-6 * gsq);  // fp32 lane sums
    EXPECT_NEAR(tel.error_sq, esq, 1e-5 * esq + 1e-12);
  }
}

// The stable convention keeps ||e|| / ||g|| bounded at CR 16, beta 0.95; the printed one grows.
TEST(SeparateErrorFeedback, StableConventionStaysBoundedPrintedGrows) {
  constexpr size_t n = 512;
  for (const char* ema : {"stable", "printed"}) {
    Cluster k = MakeCluster(std::string("separate:reset=0,ema=") + ema, n, 1);
    double ratio = 0;
    for (uint64_t t = 1; t <= 40; ++t) {
      const std::vector<float> g = RandomFloats(n, t);
      k.Round({g}, t);
      CompressorTelemetry tel;
      k.states[0]->TakeTelemetry(&tel);
      ratio = std::sqrt(tel.error_sq / tel.gradient_sq);
    }
    printf("ema=%s: ||e|| / ||g|| after 40 rounds = %.3g\n", ema, ratio);
    if (std::string(ema) == "stable") {
      EXPECT_LT(ratio, 10.0);
    } else {
      EXPECT_GT(ratio, 1e6);
    }
  }
}

TEST(SeparateErrorFeedback, NonFiniteGradientReachesTheOutputAndZeroesTheState) {
  constexpr size_t n = 300;
  Cluster k = MakeCluster("separate:ratio=4,block=64", n, 2);
  std::vector<std::vector<float>> g = {RandomFloats(n, 1), RandomFloats(n, 2)};
  k.Round(g, 1);
  k.Round(g, 2);
  g[1][77] = std::nanf("");
  const std::vector<float> out = k.Round(g, 3);
  size_t non_finite = 0;
  for (float v : out) non_finite += !std::isfinite(v);
  EXPECT_GT(non_finite, 0u);
  for (auto& s : k.states) {
    for (float v : s->residual()) ASSERT_EQ(v, 0.0f);
  }
  g[1][77] = 1.0f;  // the next round is clean again
  const std::vector<float> next = k.Round(g, 4);
  for (float v : next) ASSERT_TRUE(std::isfinite(v));
}

TEST(SeparateErrorFeedback, OnlyWorkerErrorFeedback) {
  auto cfg = ParseCompressorSpec("separate");
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(ValidateErrorFeedback(*cfg, v1::ERROR_FEEDBACK_NONE).ok());
  EXPECT_TRUE(ValidateErrorFeedback(*cfg, v1::ERROR_FEEDBACK_WORKER).ok());
  for (auto p : {v1::ERROR_FEEDBACK_SERVER, v1::ERROR_FEEDBACK_BOTH}) {
    const Status s = ValidateErrorFeedback(*cfg, p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("separate"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("worker"), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(RecommendedErrorFeedback(*cfg), v1::ERROR_FEEDBACK_WORKER);
  EXPECT_EQ(PartitionAlign(*cfg), 32u);  // the default block
}

}  // namespace
}  // namespace bitpush::compressors
