// BinSGDM (paper 004; compressors/binsgdm, optimizers/binsgdm.h): the quantiser's statistics and
// clamp, the invariants of Algorithm 1 (|m/b| <= 1, u_1 = sign(g_1), |e|, |e_bar| <= 2, the
// one-worker echo, the exact error-feedback identities), the wire sizes, AVX-512 == scalar bit
// for bit, the fused server round against the unfused sequence, the reference against the
// compressor / state / server pieces run by hand, bad bodies and bad specs.
#include "compressors/binsgdm/binsgdm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "common/half.h"
#include "common/vector_ops.h"
#include "compressors/registry.h"
#include "optimizers/binsgdm.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

// memcmp that allows empty ranges (an empty vector's data() may be null, and memcmp of a null
// pointer is undefined even for 0 bytes).
int SameBytesCmp(const void* a, const void* b, size_t bytes) {
  return bytes == 0 ? 0 : std::memcmp(a, b, bytes);
}

using bitpush::testing::RandomFloats;
using optimizers::BinsgdmReference;

std::unique_ptr<Compressor> Make(const std::string& spec, IsaLevel isa = BestIsaLevel()) {
  CompressorOptions o;
  o.isa = isa;
  auto c = CreateCompressor(spec, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

std::unique_ptr<ErrorFeedback> MakeState(const std::string& spec, ErrorFeedbackSide side,
                                         size_t n) {
  auto s = CreateErrorFeedback(*ParseCompressorSpec(spec), side, n);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

bool Bit(const uint8_t* bits, size_t i) {
  return (bits[i / 8] >> (i % 8)) & 1;
}

// Gradients with a per-element scale spread over several decades and a sign bias, so the
// moments take every kind of value.
std::vector<float> Gradients(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    const float scale = std::ldexp(1.0f, static_cast<int>(i % 13) - 6);
    g[i] = scale * (normal(rng) + 0.3f * static_cast<float>(static_cast<int>(i % 3) - 1));
  }
  return g;
}

bool AvxAvailable() {
  return IsaSupported(IsaLevel::kAvx512);
}

// ---- the quantiser ----

TEST(BinsgdmQuantiser, MeanIsYAndVarianceIsOneMinusYSquared) {
  const size_t n = 1 << 18;
  for (float y : {-0.9f, -0.5f, -0.1f, 0.0f, 0.3f, 0.77f, 0.999f}) {
    SCOPED_TRACE("y=" + std::to_string(y));
    const std::vector<float> x(n, y);
    std::vector<uint8_t> bits(optimizers::BinsgdmBitBytes(n));
    double sum = 0, sum_sq_err = 0;
    for (uint64_t round = 0; round < 4; ++round) {
      optimizers::BinsgdmBinarize(StreamKey(1, 2, 3, round), x.data(), nullptr, n, bits.data(),
                                  IsaLevel::kScalar);
      for (size_t i = 0; i < n; ++i) {
        const double u = Bit(bits.data(), i) ? 1.0 : -1.0;
        sum += u;
        sum_sq_err += (y - u) * (y - u);
      }
    }
    const double draws = 4.0 * n;
    const double var = 1.0 - static_cast<double>(y) * y;
    // 6 standard errors of the mean (var / draws) and of the squared error's mean.
    EXPECT_NEAR(sum / draws, y, 6.0 * std::sqrt(var / draws) + 1e-6);
    // (y - u)^2 takes the values (1 - y)^2 and (1 + y)^2 (a Bernoulli with spread 4|y|).
    const double sq_sd = 4.0 * std::fabs(y) * std::sqrt(var / 4.0);
    EXPECT_NEAR(sum_sq_err / draws, var, 6.0 * sq_sd / std::sqrt(draws) + 1e-6);
  }
}

TEST(BinsgdmQuantiser, OutsideMinusOneOneIsTheSignDeterministically) {
  const size_t n = 100000;
  std::vector<uint8_t> bits(optimizers::BinsgdmBitBytes(n));
  for (float y : {1.0f, 1.0000001f, 1.5f, 3.0f, 1e30f, -1.0f, -1.0001f, -2.5f, -1e30f}) {
    const std::vector<float> x(n, y);
    for (IsaLevel isa : bitpush::testing::SupportedIsaLevels()) {
      optimizers::BinsgdmBinarize(StreamKey(9, 0, 1, 7), x.data(), nullptr, n, bits.data(), isa);
      size_t plus = 0;
      for (size_t i = 0; i < n; ++i) plus += Bit(bits.data(), i);
      EXPECT_EQ(plus, y > 0 ? n : 0) << "y=" << y;
    }
  }
}

// ---- invariants of Algorithm 1 ----

TEST(BinsgdmAlgorithm, RatioIsBoundedAndResidualsStayWithinTwo) {
  const size_t workers = 4, n = 1000;
  BinsgdmReference::Options o;
  o.workers = workers;
  o.beta = 0.9;
  o.seed = 5;
  BinsgdmReference ref(o);
  std::vector<float> x(n, 0.0f);
  const optimizers::BinsgdmHyper h = optimizers::MakeBinsgdmHyper(o.beta, o.eps);
  float max_e = 0, max_server_e = 0;
  for (uint64_t t = 0; t < 200; ++t) {
    std::vector<std::vector<float>> g(workers);
    std::vector<const float*> ptrs;
    for (size_t w = 0; w < workers; ++w) {
      g[w] = Gradients(n, 1000 * t + w);
      ptrs.push_back(g[w].data());
    }
    ASSERT_TRUE(ref.Step(7, t, ptrs, n, x.data(), 0.01f, 0.0).ok());
    const BinsgdmReference::KeyState& s = *ref.state(7);
    for (const BinsgdmReference::WorkerState& ws : s.workers) {
      for (size_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(ws.m[i]), ws.b[i]) << "t=" << t << " i=" << i;
        ASSERT_LE(std::fabs(ws.m[i] / (ws.b[i] + h.eps)), 1.0f);
        max_e = std::max(max_e, std::fabs(ws.e[i]));
      }
    }
    for (float v : s.server_e) max_server_e = std::max(max_server_e, std::fabs(v));
  }
  EXPECT_LE(max_e, 2.0f);
  EXPECT_LE(max_server_e, 2.0f);
  EXPECT_GT(max_e, 1.0f);  // the bound is not vacuous
}

TEST(BinsgdmAlgorithm, FirstStepPushesTheSignWithZeroResidual) {
  // eps at its minimum: b + eps == b in fp32, so r_1 = g_1 / |g_1| exactly.
  const size_t n = 4097;
  std::vector<float> g = Gradients(n, 3);
  for (float& v : g) v = v >= 0 ? v + 1e-3f : v - 1e-3f;  // away from 0
  for (IsaLevel isa : bitpush::testing::SupportedIsaLevels()) {
    auto c = Make("binsgdm:eps=1.2e-38", isa);
    auto state = MakeState("binsgdm:eps=1.2e-38", ErrorFeedbackSide::kWorker, n);
    std::vector<uint8_t> out(c->MaxCompressedBytes(n, DType::kFloat32));
    ASSERT_TRUE(
        state->Compress(*c, ConstTensorView(g.data(), n), {1, 0, 2}, {out.data(), out.size()})
            .ok());
    auto* bs = static_cast<BinsgdmState*>(state.get());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bit(out.data() + kPayloadHeaderBytes, i), g[i] > 0) << i;
      ASSERT_EQ(bs->e()[i], 0.0f) << i;
    }
  }
}

TEST(BinsgdmAlgorithm, OneWorkerServerEchoesThePushAndKeepsNoResidual) {
  const size_t n = 1001;
  BinsgdmReference::Options o;
  o.workers = 1;
  BinsgdmReference ref(o);
  std::vector<float> x(n, 0.0f);
  for (uint64_t t = 0; t < 30; ++t) {
    const std::vector<float> g = Gradients(n, t);
    ASSERT_TRUE(ref.Step(1, t, {g.data()}, n, x.data(), 0.1f, 0.0).ok());
    const BinsgdmReference::KeyState& s = *ref.state(1);
    EXPECT_EQ(s.reply, s.pushes[0]) << t;
    for (float v : s.server_e) ASSERT_EQ(v, 0.0f);
  }
  // The compressor's round, with and without a residual.
  auto c = Make("binsgdm");
  const std::vector<float> g = Gradients(n, 99);
  std::vector<uint8_t> push(c->MaxCompressedBytes(n, DType::kFloat32)), reply(push.size());
  const size_t bytes =
      *c->Compress(ConstTensorView(g.data(), n), {1, 3, 0}, {push.data(), push.size()});
  const ByteSpan pushes[] = {{push.data(), bytes}};
  std::vector<float> e(n, 0.0f);
  for (float* residual : {e.data(), static_cast<float*>(nullptr)}) {
    auto r = c->AggregateCompress(Span<const ByteSpan>(pushes, 1), n, 1.0f, residual,
                                  {1, 3, kServerStream}, {reply.data(), reply.size()});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(*r, bytes);
    EXPECT_EQ(0, SameBytesCmp(reply.data(), push.data(), bytes));
  }
  for (float v : e) ASSERT_EQ(v, 0.0f);
}

// Sum_s u_s = Sum_s r_s - e_t on every worker, Sum_s u_bar_s = Sum_s a_s - e_bar_t on the server
// (a = the average of the pushes), in double, up to the fp32 roundings of y = r + e.
TEST(BinsgdmAlgorithm, ErrorFeedbackIdentitiesHold) {
  const size_t workers = 3, n = 513;
  const uint64_t rounds = 150;
  BinsgdmReference::Options o;
  o.workers = workers;
  o.seed = 11;
  BinsgdmReference ref(o);
  const optimizers::BinsgdmHyper h = optimizers::MakeBinsgdmHyper(o.beta, o.eps);
  std::vector<float> x(n, 0.0f);
  std::vector<std::vector<double>> sum_u(workers, std::vector<double>(n)),
      sum_r(workers, std::vector<double>(n));
  std::vector<double> sum_ubar(n), sum_a(n);
  for (uint64_t t = 0; t < rounds; ++t) {
    std::vector<std::vector<float>> g(workers);
    std::vector<const float*> ptrs;
    for (size_t w = 0; w < workers; ++w) {
      g[w] = Gradients(n, 77 * t + w);
      ptrs.push_back(g[w].data());
    }
    ASSERT_TRUE(ref.Step(4, t, ptrs, n, x.data(), 0.01f, 0.0).ok());
    const BinsgdmReference::KeyState& s = *ref.state(4);
    for (size_t i = 0; i < n; ++i) {
      double a = 0;
      for (size_t w = 0; w < workers; ++w) {
        const double u = Bit(s.pushes[w].data(), i) ? 1.0 : -1.0;
        sum_u[w][i] += u;
        sum_r[w][i] += s.workers[w].m[i] / (s.workers[w].b[i] + h.eps);
        a += u;
      }
      sum_a[i] += a / workers;
      sum_ubar[i] += Bit(s.reply.data(), i) ? 1.0 : -1.0;
    }
  }
  const BinsgdmReference::KeyState& s = *ref.state(4);
  const double tol = rounds * 4e-7;
  for (size_t i = 0; i < n; ++i) {
    for (size_t w = 0; w < workers; ++w) {
      ASSERT_NEAR(sum_u[w][i], sum_r[w][i] - s.workers[w].e[i], tol)
          << "worker " << w << " i=" << i;
    }
    ASSERT_NEAR(sum_ubar[i], sum_a[i] - s.server_e[i], tol) << "server i=" << i;
  }
}

TEST(BinsgdmAlgorithm, PositiveGradientRescalingChangesNothing) {
  // Scaling by a power of two is exact in fp32, so m and b scale exactly and m / b does not move
  // (eps at its minimum so it does not count).
  const size_t n = 999;
  auto c = Make("binsgdm:eps=1.2e-38");
  auto s1 = MakeState("binsgdm:eps=1.2e-38", ErrorFeedbackSide::kWorker, n);
  auto s2 = MakeState("binsgdm:eps=1.2e-38", ErrorFeedbackSide::kWorker, n);
  std::vector<uint8_t> p1(c->MaxCompressedBytes(n, DType::kFloat32)), p2(p1.size());
  for (uint64_t t = 0; t < 20; ++t) {
    std::vector<float> g = Gradients(n, t), g8 = g;
    for (float& v : g8) v *= 8.0f;
    ASSERT_TRUE(
        s1->Compress(*c, ConstTensorView(g.data(), n), {2, t, 1}, {p1.data(), p1.size()}).ok());
    ASSERT_TRUE(
        s2->Compress(*c, ConstTensorView(g8.data(), n), {2, t, 1}, {p2.data(), p2.size()}).ok());
    ASSERT_EQ(p1, p2) << t;
  }
}

// ---- wire format ----

TEST(BinsgdmWire, PushAndReplyAreOneBitPerElement) {
  auto c = Make("binsgdm");
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1000}, size_t{1} << 20}) {
    SCOPED_TRACE(n);
    const std::vector<float> g = RandomFloats(n, n);
    auto state = MakeState("binsgdm", ErrorFeedbackSide::kWorker, n);
    std::vector<uint8_t> push(c->MaxCompressedBytes(n, DType::kFloat32));
    EXPECT_EQ(push.size(), kPayloadHeaderBytes + (n + 7) / 8);
    auto bytes =
        state->Compress(*c, ConstTensorView(g.data(), n), {1, 0, 0}, {push.data(), push.size()});
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(*bytes, kPayloadHeaderBytes + (n + 7) / 8);
    if (n == 0) continue;
    auto server = MakeState("binsgdm", ErrorFeedbackSide::kServer, n);
    const ByteSpan pushes[] = {{push.data(), *bytes}, {push.data(), *bytes}};
    std::vector<uint8_t> reply(c->MaxCompressedBytes(n, DType::kFloat32));
    auto r = server->AggregateCompress(*c, Span<const ByteSpan>(pushes, 2), 0.5f,
                                       {1, 0, kServerStream}, {reply.data(), reply.size()});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, kPayloadHeaderBytes + (n + 7) / 8);
    // Decoded: exactly +-1.
    std::vector<float> out(n);
    ASSERT_TRUE(c->Decompress(ByteSpan(reply.data(), *r), TensorView(out.data(), n)).ok());
    for (float v : out) ASSERT_TRUE(v == 1.0f || v == -1.0f);
  }
}

TEST(BinsgdmWire, BadBodiesAreRefused) {
  auto c = Make("binsgdm");
  const size_t n = 13;
  const std::vector<float> g = RandomFloats(n, 1);
  std::vector<uint8_t> p(c->MaxCompressedBytes(n, DType::kFloat32));
  p.resize(*c->Compress(ConstTensorView(g.data(), n), {}, {p.data(), p.size()}));
  ASSERT_EQ(p.size(), kPayloadHeaderBytes + 2);
  std::vector<float> acc(n, 0.0f);
  // Padding bits 13..15 set.
  std::vector<uint8_t> bad = p;
  bad.back() |= 0x20;
  Status s = c->ValidatePayload({bad.data(), bad.size()}, n);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(s.message(), "padding bits after element 12 are not zero");
  EXPECT_EQ(c->DecompressAdd({bad.data(), bad.size()}, {acc.data(), n}).code(),
            StatusCode::kDataLoss);
  for (float v : acc) ASSERT_EQ(v, 0.0f);
  // A body one byte longer, with the header announcing it.
  bad = p;
  bad.push_back(0);
  PayloadHeader h = *ParsePayloadHeader({p.data(), p.size()});
  h.body_bytes += 1;
  WritePayloadHeader(h, bad.data());
  s = c->ValidatePayload({bad.data(), bad.size()}, n);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(s.message(), "binsgdm: body is 3 bytes; 13 elements need exactly 2");
  // Every padding bit of a full byte is meaningful: n = 16 has no padding to check.
  EXPECT_TRUE(c->ValidatePayload({p.data(), p.size()}, n).ok());
}

// ---- ISA levels ----

TEST(BinsgdmKernels, Avx512MatchesScalarBitForBit) {
  if (!AvxAvailable()) GTEST_SKIP() << "no AVX-512 here";
  const optimizers::BinsgdmHyper h = optimizers::MakeBinsgdmHyper(0.9, 1e-8);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17},
                   size_t{63}, size_t{64}, size_t{65}, size_t{1000}, size_t{4097}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    // Worker step over several rounds, with non-finite gradients sprinkled in.
    std::vector<float> m1(n, 0.0f), b1(n, 0.0f), e1(n, 0.0f), m2 = m1, b2 = b1, e2 = e1;
    const size_t bytes = optimizers::BinsgdmBitBytes(n);
    std::vector<uint8_t> bits1(bytes + 1, 0xAB), bits2(bytes + 1, 0xCD);
    for (uint64_t t = 0; t < 6; ++t) {
      std::vector<float> g = Gradients(n, 10 * n + t);
      if (n > 5 && t == 3) {
        g[2] = std::nanf("");
        g[5] = INFINITY;
      }
      const uint64_t stream = StreamKey(3, 1, n, t);
      optimizers::BinsgdmWorkerStep(h, stream, g.data(), m1.data(), b1.data(), e1.data(), n,
                                    bits1.data(), IsaLevel::kScalar);
      optimizers::BinsgdmWorkerStep(h, stream, g.data(), m2.data(), b2.data(), e2.data(), n,
                                    bits2.data(), IsaLevel::kAvx512);
      ASSERT_EQ(0, SameBytesCmp(bits1.data(), bits2.data(), bytes)) << t;
      ASSERT_EQ(bits1[bytes], 0xAB);  // nothing written past the body
      ASSERT_EQ(bits2[bytes], 0xCD);
      ASSERT_EQ(0, SameBytesCmp(m1.data(), m2.data(), 4 * n));
      ASSERT_EQ(0, SameBytesCmp(b1.data(), b2.data(), 4 * n));
      ASSERT_EQ(0, SameBytesCmp(e1.data(), e2.data(), 4 * n));
      if (n % 8) {
        ASSERT_EQ(bits1[bytes - 1] >> (n % 8), 0);  // padding zero
      }
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(e1[i]) && std::isfinite(m1[i]));
    }
    // Binarise, all three forms.
    const std::vector<float> x = Gradients(n, n + 1);
    std::vector<float> r1 = RandomFloats(n, 4, 0.5f), r2 = r1;
    for (int form = 0; form < 3; ++form) {
      const float* xp = form == 2 ? nullptr : x.data();
      optimizers::BinsgdmBinarize(9, xp, form == 1 ? nullptr : r1.data(), n, bits1.data(),
                                  IsaLevel::kScalar);
      optimizers::BinsgdmBinarize(9, xp, form == 1 ? nullptr : r2.data(), n, bits2.data(),
                                  IsaLevel::kAvx512);
      ASSERT_EQ(0, SameBytesCmp(bits1.data(), bits2.data(), bytes)) << form;
      ASSERT_EQ(0, SameBytesCmp(r1.data(), r2.data(), 4 * n)) << form;
    }
    // Server round, 1..5 pushes, with and without a residual, averaged and summed.
    for (size_t k = 1; k <= 5; ++k) {
      std::vector<std::vector<uint8_t>> pushes(k, std::vector<uint8_t>(bytes));
      std::vector<const uint8_t*> ptrs;
      for (size_t w = 0; w < k; ++w) {
        const std::vector<float> v = RandomFloats(n, 100 * k + w);
        optimizers::BinsgdmBinarize(w, v.data(), nullptr, n, pushes[w].data(), IsaLevel::kScalar);
        ptrs.push_back(pushes[w].data());
      }
      for (float scale : {1.0f / static_cast<float>(k), 1.0f}) {
        std::vector<float> s1 = RandomFloats(n, 5, 0.7f), s2 = s1;
        for (bool residual : {true, false}) {
          optimizers::BinsgdmServerRound(ptrs.data(), k, n, scale, residual ? s1.data() : nullptr,
                                         77, bits1.data(), IsaLevel::kScalar);
          optimizers::BinsgdmServerRound(ptrs.data(), k, n, scale, residual ? s2.data() : nullptr,
                                         77, bits2.data(), IsaLevel::kAvx512);
          ASSERT_EQ(0, SameBytesCmp(bits1.data(), bits2.data(), bytes)) << k;
          ASSERT_EQ(0, SameBytesCmp(s1.data(), s2.data(), 4 * n)) << k;
        }
      }
    }
  }
}

// ---- the server round: fused == unfused ----

TEST(BinsgdmServerRound, FusedEqualsDecompressSumCompress) {
  for (IsaLevel isa : bitpush::testing::SupportedIsaLevels()) {
    auto c = Make("binsgdm:seed=4", isa);
    for (size_t n : {size_t{1}, size_t{9}, size_t{100}, size_t{4097}}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
        for (size_t k = 1; k <= 5; ++k) {
          SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k));
          std::vector<std::vector<uint8_t>> bufs(k);
          std::vector<ByteSpan> pushes;
          for (size_t w = 0; w < k; ++w) {
            const std::vector<float> g = RandomFloats(n, 31 * w + n);
            std::vector<uint16_t> half(n);
            ConvertFromFloat(g.data(), TensorView(half.data(), n, DType::kFloat16),
                             IsaLevel::kScalar);
            const ConstTensorView view = dtype == DType::kFloat32
                                             ? ConstTensorView(g.data(), n)
                                             : ConstTensorView(half.data(), n, DType::kFloat16);
            bufs[w].resize(c->MaxCompressedBytes(n, dtype));
            bufs[w].resize(*c->Compress(view, {6, 2, static_cast<uint32_t>(w)},
                                        {bufs[w].data(), bufs[w].size()}));
            pushes.emplace_back(bufs[w].data(), bufs[w].size());
          }
          for (float scale : {1.0f / static_cast<float>(k), 1.0f}) {
            for (bool with_residual : {true, false}) {
              const CompressContext ctx{6, 2, kServerStream};
              std::vector<float> e1 = RandomFloats(n, 8, 0.6f), e2 = e1;
              std::vector<uint8_t> fused(c->MaxCompressedBytes(n, DType::kFloat32)),
                  unfused(fused.size());
              auto r1 = c->AggregateCompress(pushes, n, scale, with_residual ? e1.data() : nullptr,
                                             ctx, {fused.data(), fused.size()});
              ASSERT_TRUE(r1.ok()) << r1.status().ToString();
              std::vector<float> acc(n);
              ASSERT_TRUE(c->DecompressToFloat(pushes[0], {acc.data(), n}).ok());
              for (size_t w = 1; w < k; ++w)
                ASSERT_TRUE(c->DecompressAdd(pushes[w], {acc.data(), n}).ok());
              if (scale != 1.0f) {
                for (float& v : acc) v *= scale;
              }
              auto r2 = with_residual ? c->CompressWithFeedback(ConstTensorView(acc.data(), n),
                                                                {e2.data(), n}, ctx,
                                                                {unfused.data(), unfused.size()})
                                      : c->Compress(ConstTensorView(acc.data(), n), ctx,
                                                    {unfused.data(), unfused.size()});
              ASSERT_TRUE(r2.ok());
              ASSERT_EQ(*r1, *r2);
              EXPECT_EQ(0, SameBytesCmp(fused.data(), unfused.data(), *r1));
              EXPECT_EQ(0, SameBytesCmp(e1.data(), e2.data(), 4 * n));
            }
          }
        }
      }
    }
  }
}

// ---- the reference against the pieces ----

// Algorithm 1 by hand from the system's pieces — each worker's BinsgdmState + compressor, the
// server's residual state and fused round, the reply decoded to +-1, the apply step — over two
// keys of different sizes and 25 rounds: bit for bit the reference.
TEST(BinsgdmReference, EqualsTheCompressorStateAndServerRoundPieces) {
  const std::string spec = "binsgdm:beta=0.9,eps=1e-06,seed=3";
  const size_t workers = 3;
  const float lr = 0.01f;
  const double wd = 0.05;
  for (IsaLevel isa : bitpush::testing::SupportedIsaLevels()) {
    BinsgdmReference::Options o;
    o.beta = 0.9;
    o.eps = 1e-6;
    o.seed = 3;
    o.workers = workers;
    BinsgdmReference ref(o);
    auto c = Make(spec, isa);
    struct Key {
      uint64_t id;
      size_t n;
      std::vector<std::unique_ptr<ErrorFeedback>> worker_states;
      std::unique_ptr<ErrorFeedback> server_state;
      std::vector<float> x_ref, x_sys;
    };
    std::vector<Key> keys;
    for (auto [id, n] : {std::pair<uint64_t, size_t>{10, 1000}, {11, 37}}) {
      Key k{id, n, {}, MakeState(spec, ErrorFeedbackSide::kServer, n), {}, {}};
      for (size_t w = 0; w < workers; ++w) {
        k.worker_states.push_back(MakeState(spec, ErrorFeedbackSide::kWorker, n));
      }
      k.x_ref = RandomFloats(n, id);
      k.x_sys = k.x_ref;
      keys.push_back(std::move(k));
    }
    const float mult = static_cast<float>(1.0 - static_cast<double>(lr) * wd);
    for (uint64_t round = 0; round < 25; ++round) {
      for (Key& k : keys) {
        const size_t n = k.n;
        std::vector<std::vector<float>> g(workers);
        std::vector<const float*> ptrs;
        std::vector<std::vector<uint8_t>> bufs(workers);
        std::vector<ByteSpan> pushes;
        for (size_t w = 0; w < workers; ++w) {
          g[w] = Gradients(n, 1000 * round + 10 * w + k.id);
          ptrs.push_back(g[w].data());
          bufs[w].resize(c->MaxCompressedBytes(n, DType::kFloat32));
          auto r = k.worker_states[w]->Compress(*c, ConstTensorView(g[w].data(), n),
                                                {k.id, round, static_cast<uint32_t>(w)},
                                                {bufs[w].data(), bufs[w].size()});
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          bufs[w].resize(*r);
          ASSERT_TRUE(c->ValidatePayload({bufs[w].data(), bufs[w].size()}, n).ok());
          pushes.emplace_back(bufs[w].data(), bufs[w].size());
        }
        std::vector<uint8_t> reply(c->MaxCompressedBytes(n, DType::kFloat32));
        ASSERT_TRUE(k.server_state->FusesServerRound(*c));
        auto r = k.server_state->AggregateCompress(*c, pushes, 1.0f / static_cast<float>(workers),
                                                   {k.id, round, kServerStream},
                                                   {reply.data(), reply.size()});
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        std::vector<float> ubar(n);
        ASSERT_TRUE(k.worker_states[0]
                        ->DecompressReply(*c, ByteSpan(reply.data(), *r), {k.id, round, 0},
                                          TensorView(ubar.data(), n))
                        .ok());
        for (size_t i = 0; i < n; ++i) k.x_sys[i] = k.x_sys[i] * mult - lr * ubar[i];

        ASSERT_TRUE(ref.Step(k.id, round, ptrs, n, k.x_ref.data(), lr, wd).ok());
        const BinsgdmReference::KeyState& s = *ref.state(k.id);
        for (size_t w = 0; w < workers; ++w) {
          ASSERT_EQ(0, SameBytesCmp(bufs[w].data() + kPayloadHeaderBytes, s.pushes[w].data(),
                                    s.pushes[w].size()))
              << "push of worker " << w << ", key " << k.id << ", round " << round;
          auto* st = static_cast<const BinsgdmState*>(k.worker_states[w].get());
          ASSERT_EQ(0, SameBytesCmp(st->m().data(), s.workers[w].m.data(), 4 * n));
          ASSERT_EQ(0, SameBytesCmp(st->b().data(), s.workers[w].b.data(), 4 * n));
          ASSERT_EQ(0, SameBytesCmp(st->e().data(), s.workers[w].e.data(), 4 * n));
        }
        ASSERT_EQ(0,
                  SameBytesCmp(reply.data() + kPayloadHeaderBytes, s.reply.data(), s.reply.size()));
        ASSERT_EQ(0, SameBytesCmp(k.server_state->residual().data(), s.server_e.data(), 4 * n));
        ASSERT_EQ(0, SameBytesCmp(k.x_sys.data(), k.x_ref.data(), 4 * n)) << "round " << round;
      }
    }
  }
  BinsgdmReference ref({});
  std::vector<float> x(4);
  EXPECT_EQ(ref.Step(1, 0, {}, 4, x.data(), 0.1f, 0).code(), StatusCode::kInvalidArgument);
}

TEST(BinsgdmReference, ApplyIsDecoupledWeightDecayThenTheStep) {
  BinsgdmReference::Options o;
  o.workers = 1;
  o.eps = 1.2e-38;
  BinsgdmReference ref(o);
  std::vector<float> x = {1.0f, -2.0f};
  const std::vector<float> g = {0.5f, -0.25f};  // first step: u = sign(g) (one worker: echoed)
  ASSERT_TRUE(ref.Step(0, 0, {g.data()}, 2, x.data(), 0.1f, 0.01).ok());
  const float mult = static_cast<float>(1.0 - 0.1f * 0.01);
  EXPECT_EQ(x[0], 1.0f * mult - 0.1f);
  EXPECT_EQ(x[1], -2.0f * mult + 0.1f);
}

// ---- the state ----

TEST(BinsgdmState, HoldsMomentsAndResidualAndRestores) {
  const size_t n = 300;
  auto c = Make("binsgdm");
  auto a = MakeState("binsgdm", ErrorFeedbackSide::kWorker, n);
  EXPECT_EQ(a->size(), n);
  EXPECT_EQ(a->state_size(), 3 * n);
  ASSERT_EQ(a->residual().size(), 3 * n);
  for (float v : a->residual()) ASSERT_EQ(v, 0.0f);
  EXPECT_FALSE(a->FusesServerRound(*c));
  std::vector<uint8_t> p1(c->MaxCompressedBytes(n, DType::kFloat32)), p2(p1.size());
  for (uint64_t t = 0; t < 3; ++t) {
    const std::vector<float> g = Gradients(n, t);
    ASSERT_TRUE(
        a->Compress(*c, ConstTensorView(g.data(), n), {1, t, 0}, {p1.data(), p1.size()}).ok());
  }
  // A restored copy continues bit for bit.
  auto b = MakeState("binsgdm", ErrorFeedbackSide::kWorker, n);
  const std::vector<float> saved(a->residual().begin(), a->residual().end());
  ASSERT_TRUE(b->Restore({saved.data(), saved.size()}).ok());
  const std::vector<float> g = Gradients(n, 50);
  ASSERT_TRUE(
      a->Compress(*c, ConstTensorView(g.data(), n), {1, 3, 0}, {p1.data(), p1.size()}).ok());
  ASSERT_TRUE(
      b->Compress(*c, ConstTensorView(g.data(), n), {1, 3, 0}, {p2.data(), p2.size()}).ok());
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(0, SameBytesCmp(a->residual().data(), b->residual().data(), 12 * n));
  // Wrong sizes and the wrong compressor are refused.
  EXPECT_EQ(b->Restore({saved.data(), n}).code(), StatusCode::kInvalidArgument);
  auto onebit = Make("onebit");
  std::vector<uint8_t> big(onebit->MaxCompressedBytes(n, DType::kFloat32));
  EXPECT_EQ(a->Compress(*onebit, ConstTensorView(g.data(), n), {}, {big.data(), big.size()})
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      a->Compress(*c, ConstTensorView(g.data(), n - 1), {}, {p1.data(), p1.size()}).status().code(),
      StatusCode::kInvalidArgument);
  a->Reset();
  for (float v : a->residual()) ASSERT_EQ(v, 0.0f);
  // The server side keeps the plain residual e_bar.
  auto server = MakeState("binsgdm", ErrorFeedbackSide::kServer, n);
  EXPECT_EQ(server->state_size(), n);
  EXPECT_TRUE(server->FusesServerRound(*c));
}

TEST(BinsgdmState, HalfPrecisionGradientsAreConvertedExactly) {
  const size_t n = 257;
  auto c = Make("binsgdm");
  auto s16 = MakeState("binsgdm", ErrorFeedbackSide::kWorker, n);
  auto s32 = MakeState("binsgdm", ErrorFeedbackSide::kWorker, n);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const std::vector<float> g = Gradients(n, 8);
    std::vector<uint16_t> half(n);
    ConvertFromFloat(g.data(), TensorView(half.data(), n, dtype), IsaLevel::kScalar);
    std::vector<float> exact(n);
    ConvertToFloat(ConstTensorView(half.data(), n, dtype), exact.data(), IsaLevel::kScalar);
    std::vector<uint8_t> p16(c->MaxCompressedBytes(n, dtype)), p32(p16.size());
    auto r16 = s16->Compress(*c, ConstTensorView(half.data(), n, dtype), {1, 1, 1},
                             {p16.data(), p16.size()});
    auto r32 =
        s32->Compress(*c, ConstTensorView(exact.data(), n), {1, 1, 1}, {p32.data(), p32.size()});
    ASSERT_TRUE(r16.ok() && r32.ok());
    EXPECT_EQ(ParsePayloadHeader(ByteSpan(p16.data(), *r16))->dtype, dtype);
    EXPECT_EQ(0, SameBytesCmp(p16.data() + kPayloadHeaderBytes, p32.data() + kPayloadHeaderBytes,
                              (n + 7) / 8));
    EXPECT_EQ(0, SameBytesCmp(s16->residual().data(), s32->residual().data(), 12 * n));
  }
}

TEST(BinsgdmState, NonFiniteGradientRestartsTheElement) {
  const size_t n = 64;
  auto c = Make("binsgdm");
  auto s = MakeState("binsgdm", ErrorFeedbackSide::kWorker, n);
  std::vector<uint8_t> p(c->MaxCompressedBytes(n, DType::kFloat32));
  std::vector<float> g = Gradients(n, 1);
  ASSERT_TRUE(s->Compress(*c, ConstTensorView(g.data(), n), {1, 0, 0}, {p.data(), p.size()}).ok());
  g[3] = std::nanf("");
  g[9] = INFINITY;
  g[10] = -INFINITY;
  ASSERT_TRUE(s->Compress(*c, ConstTensorView(g.data(), n), {1, 1, 0}, {p.data(), p.size()}).ok());
  auto* st = static_cast<BinsgdmState*>(s.get());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(st->m()[i]) && std::isfinite(st->b()[i]) &&
                std::isfinite(st->e()[i]));
  }
  for (size_t i : {3, 9, 10}) {
    EXPECT_EQ(st->m()[i], 0.0f);
    EXPECT_EQ(st->b()[i], 0.0f);
    EXPECT_EQ(std::fabs(st->e()[i]), 1.0f);  // y = 0, e = -u
  }
}

// ---- specs ----

TEST(BinsgdmSpec, CanonicalFormDefaultsAndBadValues) {
  EXPECT_EQ(CompressorSpecString(*ParseCompressorSpec("binsgdm")),
            "binsgdm:beta=0.95,eps=1e-08,seed=0");
  EXPECT_EQ(CompressorSpecString(*ParseCompressorSpec("binsgdm:seed=3,beta=0.9")),
            "binsgdm:beta=0.9,eps=1e-08,seed=3");
  for (const char* bad :
       {"binsgdm:beta=0", "binsgdm:beta=1", "binsgdm:beta=-0.5", "binsgdm:beta=nan",
        "binsgdm:eps=0", "binsgdm:eps=1e-40", "binsgdm:eps=1e31", "binsgdm:eps=-1",
        "binsgdm:seed=-1", "binsgdm:seed=1.5", "binsgdm:scale=2"}) {
    const Status s = ParseCompressorSpec(bad).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_CONTAINS(s.message(), "binsgdm");
  }
  EXPECT_CONTAINS(ParseCompressorSpec("binsgdm:beta=1").status().message(), "(0, 1)");
  // A config built directly is range-checked too.
  v1::CompressorConfig c;
  c.set_id(v1::COMPRESSOR_ID_BINSGDM);
  c.mutable_binsgdm()->set_beta(1.5);
  EXPECT_EQ(CanonicalizeCompressorConfig(c).status().code(), StatusCode::kInvalidArgument);
}

TEST(BinsgdmSpec, ErrorFeedbackNeedsTheWorkerState) {
  const v1::CompressorConfig c = *ParseCompressorSpec("binsgdm");
  EXPECT_TRUE(ValidateErrorFeedback(c, v1::ERROR_FEEDBACK_WORKER).ok());
  EXPECT_TRUE(ValidateErrorFeedback(c, v1::ERROR_FEEDBACK_BOTH).ok());
  for (auto policy : {v1::ERROR_FEEDBACK_NONE, v1::ERROR_FEEDBACK_SERVER}) {
    const Status s = ValidateErrorFeedback(c, policy);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(s.message(), "binsgdm keeps its optimizer moments");
    EXPECT_CONTAINS(s.message(), "Use error_feedback: both");
  }
  EXPECT_EQ(RecommendedErrorFeedback(c), v1::ERROR_FEEDBACK_BOTH);
  EXPECT_EQ(FindMethod(v1::COMPRESSOR_ID_BINSGDM)->aggregation,
            AggregationMode::kCompressedDomainSum);
}

// Decompress into an fp32 tensor streams its stores for large tensors (DecodeBodyToTensor):
// the same values as the plain decode at every alignment of the output and at lengths that
// end inside a vector and inside a byte.
TEST(BinsgdmCompressor, LargeDecompressEqualsThePlainDecodeAtEveryAlignment) {
  for (IsaLevel isa : {IsaLevel::kScalar, IsaLevel::kAvx512}) {
    if (isa == IsaLevel::kAvx512 && !AvxAvailable()) continue;
    auto c = Make("binsgdm", isa);
    for (size_t n : {size_t{65536}, size_t{70001}, size_t{131077}}) {
      const std::vector<float> g = Gradients(n, n);
      std::vector<uint8_t> payload(c->MaxCompressedBytes(n, DType::kFloat32));
      auto bytes = c->Compress(ConstTensorView(g.data(), n), CompressContext{1, 2, 3},
                               {payload.data(), payload.size()});
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      const ByteSpan p(payload.data(), *bytes);
      std::vector<float> want(n, 0.0f);
      ASSERT_TRUE(c->DecompressAdd(p, {want.data(), n}).ok());  // 0 + (+-1) = +-1
      for (size_t offset = 0; offset < 17; ++offset) {
        std::vector<float> buf(n + 17, 5.0f);
        ASSERT_TRUE(c->Decompress(p, TensorView(buf.data() + offset, n, DType::kFloat32)).ok());
        ASSERT_EQ(0, SameBytesCmp(buf.data() + offset, want.data(), 4 * n))
            << "n " << n << " offset " << offset;
        for (size_t k = 0; k < offset; ++k) ASSERT_EQ(buf[k], 5.0f);               // nothing before
        for (size_t k = offset + n; k < buf.size(); ++k) ASSERT_EQ(buf[k], 5.0f);  // or after
      }
    }
  }
}

}  // namespace
}  // namespace bitpush::compressors
