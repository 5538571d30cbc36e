// optimizers/param_state.h: each rule against its definition (in fp32 element by element, bit
// for bit, and in fp64 within a stated tolerance), LANS against LansStep, save / load continuing
// bit for bit, and the refusals (options, sizes, blobs).
#include "optimizers/param_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace bitpush::optimizers {
namespace {

std::vector<float> Normal(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

ParamState Make(const UpdateOptions& o, const std::vector<float>& w) {
  auto s = ParamState::Create(o, {w.data(), w.size()});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(*s);
}

constexpr size_t kN = 1003;
constexpr int kSteps = 6;

// SGD, element by element as the definition reads, in fp32 (exact) and fp64 (tolerance).
TEST(ParamStateTest, SgdFollowsTheDefinition) {
  struct Case {
    float momentum, wd;
    bool nesterov;
  };
  for (const Case c : {Case{0.0f, 0.0f, false}, Case{0.9f, 0.0f, false}, Case{0.9f, 1e-2f, false},
                       Case{0.8f, 1e-3f, true}, Case{0.0f, 0.1f, false}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " wd " + std::to_string(c.wd) +
                 (c.nesterov ? " nesterov" : ""));
    UpdateOptions o;
    o.rule = UpdateRule::kSgd;
    o.momentum = c.momentum;
    o.weight_decay = c.wd;
    o.nesterov = c.nesterov;
    const std::vector<float> w0 = Normal(kN, 1);
    ParamState s = Make(o, w0);
    std::vector<float> w = w0, b(kN, 0.0f);
    std::vector<double> wd(w0.begin(), w0.end()), bd(kN, 0.0);
    for (int t = 1; t <= kSteps; ++t) {
      const float lr = 0.1f / static_cast<float>(t);
      const std::vector<float> g = Normal(kN, 100 + t);
      ASSERT_TRUE(s.Step(lr, {g.data(), kN}).ok());
      for (size_t i = 0; i < kN; ++i) {
        float d = c.wd != 0.0f ? g[i] + c.wd * w[i] : g[i];
        double dd = g[i] + static_cast<double>(c.wd) * wd[i];
        if (c.momentum > 0.0f) {
          b[i] = t == 1 ? d : c.momentum * b[i] + d;
          bd[i] = t == 1 ? dd : c.momentum * bd[i] + dd;
          d = c.nesterov ? d + c.momentum * b[i] : b[i];
          dd = c.nesterov ? dd + c.momentum * bd[i] : bd[i];
        }
        w[i] = w[i] - lr * d;
        wd[i] = wd[i] - static_cast<double>(lr) * dd;
      }
      EXPECT_EQ(s.step(), static_cast<uint64_t>(t));
    }
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(s.weights()[i], w[i]) << i;
      ASSERT_NEAR(s.weights()[i], wd[i], 1e-5 * (std::fabs(wd[i]) + 1.0)) << i;
    }
  }
}

TEST(ParamStateTest, AdamWFollowsTheDefinition) {
  for (const float wdecay : {0.0f, 0.01f}) {
    UpdateOptions o;
    o.rule = UpdateRule::kAdamW;
    o.weight_decay = wdecay;
    o.beta1 = 0.9f;
    o.beta2 = 0.99f;
    o.eps = 1e-8f;
    const std::vector<float> w0 = Normal(kN, 2);
    ParamState s = Make(o, w0);
    std::vector<double> w(w0.begin(), w0.end()), m(kN, 0.0), v(kN, 0.0);
    for (int t = 1; t <= kSteps; ++t) {
      const float lr = 1e-2f;
      const std::vector<float> g = Normal(kN, 200 + t, 1e-2f);
      ASSERT_TRUE(s.Step(lr, {g.data(), kN}).ok());
      const double bc1 = 1.0 - std::pow(0.9, t), bc2 = 1.0 - std::pow(0.99, t);
      for (size_t i = 0; i < kN; ++i) {
        w[i] *= 1.0 - static_cast<double>(lr) * wdecay;
        m[i] = 0.9 * m[i] + 0.1 * g[i];
        v[i] = 0.99 * v[i] + 0.01 * static_cast<double>(g[i]) * g[i];
        w[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + 1e-8);
      }
    }
    // Each step moves an element by about lr (Adam's normalised step): fp32 rounding of the
    // moments and the division keeps the result within 1e-4 lr per step of fp64.
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_NEAR(s.weights()[i], w[i], kSteps * 1e-6 + 1e-6 * std::fabs(w[i])) << i;
    }
    // The first step with zero-initialised moments moves each element by lr * g / (|g| + eps):
    // about sign(g) * lr (the bias corrections cancel the (1 - β) factors).
    ParamState s1 = Make(o, w0);
    const std::vector<float> g = Normal(kN, 7, 1.0f);
    ASSERT_TRUE(s1.Step(0.5f, {g.data(), kN}).ok());
    for (size_t i = 0; i < kN; ++i) {
      const double decayed = w0[i] * (1.0 - 0.5 * wdecay);
      const double step = 0.5 * g[i] / (std::fabs(static_cast<double>(g[i])) + 1e-8);
      ASSERT_NEAR(s1.weights()[i], decayed - step, 1e-5) << i << " g " << g[i];
    }
  }
}

// The AVX-512 loops give the scalar loop's bits (sizes with and without a tail, every switch).
TEST(ParamStateTest, SimdLevelsGiveTheScalarBits) {
  if (!IsaSupported(IsaLevel::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<UpdateOptions> cases;
  for (float wd : {0.0f, 0.02f}) {
    for (float mu : {0.0f, 0.9f}) {
      for (bool nesterov : {false, true}) {
        if (nesterov && mu == 0.0f) continue;
        UpdateOptions o;
        o.rule = UpdateRule::kSgd;
        o.weight_decay = wd;
        o.momentum = mu;
        o.nesterov = nesterov;
        cases.push_back(o);
      }
    }
    UpdateOptions a;
    a.rule = UpdateRule::kAdamW;
    a.weight_decay = wd;
    cases.push_back(a);
  }
  for (size_t n : {size_t{1}, size_t{16}, size_t{17}, kN}) {
    for (const UpdateOptions& o : cases) {
      const std::vector<float> w0 = Normal(n, 3);
      ParamState scalar = Make(o, w0);
      ParamState simd = Make(o, w0);
      for (int t = 0; t < kSteps; ++t) {
        const std::vector<float> g = Normal(n, 100 + t, 0.1f);
        const float lr = 0.05f / static_cast<float>(t + 1);
        ASSERT_TRUE(scalar.Step(lr, {g.data(), n}, IsaLevel::kScalar).ok());
        ASSERT_TRUE(simd.Step(lr, {g.data(), n}, IsaLevel::kAvx512).ok());
      }
      EXPECT_EQ(scalar.Save(), simd.Save())
          << UpdateRuleName(o.rule) << " n=" << n << " wd=" << o.weight_decay
          << " momentum=" << o.momentum << " nesterov=" << o.nesterov;
    }
  }
}

TEST(ParamStateTest, LansIsLansStepBitForBit) {
  UpdateOptions o;
  o.rule = UpdateRule::kLans;
  o.lans.weight_decay = 0.01f;
  const std::vector<float> w0 = Normal(kN, 3);
  ParamState s = Make(o, w0);
  std::vector<float> w = w0, m(kN, 0.0f), v(kN, 0.0f);
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<float> g = Normal(kN, 300 + t);
    ASSERT_TRUE(s.Step(0.01f, {g.data(), kN}).ok());
    ASSERT_TRUE(
        LansStep(o.lans, 0.01f, t, {w.data(), kN}, {m.data(), kN}, {v.data(), kN}, {g.data(), kN})
            .ok());
  }
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(s.weights()[i], w[i]) << i;
}

// Three steps, save, three more on a fresh state loaded from the blob: the same bits as six
// steps in one state, for every rule (the moments and the step count travel).
TEST(ParamStateTest, SavedStateContinuesBitForBit) {
  UpdateOptions sgd, adamw, lans;
  sgd.rule = UpdateRule::kSgd;
  sgd.momentum = 0.9f;
  adamw.rule = UpdateRule::kAdamW;
  adamw.weight_decay = 0.01f;
  lans.rule = UpdateRule::kLans;
  for (const UpdateOptions& o : {sgd, adamw, lans}) {
    SCOPED_TRACE(UpdateRuleName(o.rule));
    const std::vector<float> w0 = Normal(kN, 4);
    ParamState whole = Make(o, w0);
    ParamState first = Make(o, w0);
    ParamState resumed = Make(o, std::vector<float>(kN, 0.0f));
    for (int t = 1; t <= 6; ++t) {
      const std::vector<float> g = Normal(kN, 400 + t);
      ASSERT_TRUE(whole.Step(0.05f, {g.data(), kN}).ok());
      if (t <= 3) {
        ASSERT_TRUE(first.Step(0.05f, {g.data(), kN}).ok());
      }
      if (t == 3) {
        ASSERT_TRUE(resumed.Load(first.Save()).ok());
      }
      if (t > 3) {
        ASSERT_TRUE(resumed.Step(0.05f, {g.data(), kN}).ok());
      }
    }
    EXPECT_EQ(resumed.step(), 6u);
    EXPECT_EQ(resumed.Save(), whole.Save());
  }
}

TEST(ParamStateTest, RefusesBadOptionsArgumentsAndBlobsNamingTheProblem) {
  const std::vector<float> w(16, 1.0f);
  UpdateOptions o;
  o.momentum = 1.0f;
  EXPECT_NE(ParamState::Create(o, {w.data(), w.size()}).status().message().find("momentum"),
            std::string::npos);
  o = {};
  o.nesterov = true;
  EXPECT_NE(ParamState::Create(o, {w.data(), w.size()}).status().message().find("nesterov"),
            std::string::npos);
  o = {};
  o.rule = UpdateRule::kAdamW;
  o.eps = 0.0f;
  EXPECT_NE(ParamState::Create(o, {w.data(), w.size()}).status().message().find("eps"),
            std::string::npos);
  o.eps = 1e-8f;
  o.weight_decay = -1.0f;
  EXPECT_NE(ParamState::Create(o, {w.data(), w.size()}).status().message().find("weight_decay"),
            std::string::npos);
  EXPECT_EQ(ParseUpdateRule("adamw").value(), UpdateRule::kAdamW);
  EXPECT_NE(ParseUpdateRule("adam").status().message().find("valid: sgd, adamw, lans"),
            std::string::npos);

  UpdateOptions sgd;
  sgd.momentum = 0.5f;
  ParamState s = Make(sgd, w);
  const std::string before = s.Save();
  const std::vector<float> short_g(15, 1.0f);
  EXPECT_NE(s.Step(0.1f, {short_g.data(), 15}).message().find("15 elements"), std::string::npos);
  const std::vector<float> g(16, 1.0f);
  EXPECT_FALSE(s.Step(NAN, {g.data(), 16}).ok());
  EXPECT_FALSE(s.Step(-1.0f, {g.data(), 16}).ok());
  EXPECT_EQ(s.Save(), before);  // refused steps change nothing

  // Blobs: truncated, foreign, another rule, another size, trailing bytes.
  EXPECT_NE(s.Load(before.substr(0, 10)).message().find("no BPPS header"), std::string::npos);
  EXPECT_NE(s.Load(before.substr(0, before.size() - 1)).message().find("expected"),
            std::string::npos);
  EXPECT_NE(s.Load(before + "x").message().find("expected"), std::string::npos);
  UpdateOptions adam;
  adam.rule = UpdateRule::kAdamW;
  EXPECT_NE(s.Load(Make(adam, w).Save()).message().find("'adamw'"), std::string::npos);
  const std::vector<float> w8(8, 1.0f);
  EXPECT_NE(s.Load(Make(sgd, w8).Save()).message().find("saved for 8 elements"), std::string::npos);
  EXPECT_EQ(s.Save(), before);  // refused loads change nothing
}

}  // namespace
}  // namespace bitpush::optimizers
