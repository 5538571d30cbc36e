// optimizers/lans.h: the LANS/CLAN update.
//
//  - every kernel (scalar, each SIMD level this CPU runs) against an independent double-precision
//    reference written here element by element, 20 steps on blocks of odd sizes, for each
//    switch (ε placement, weight decay, normalize_grad, φ clamp, trust-ratio fallback);
//  - the SIMD levels against the scalar kernel (m, v bit for bit; x to 1e-6 relative);
//  - zero blocks with and without the fallback, a zero gradient, the per-step length bound;
//  - every validation error and the size mismatch;
//  - LansStepCuda: against the CPU kernel where a CUDA device is usable, otherwise skipped with
//    the reason (the stub's Unimplemented message is checked in builds without CUDA).
#include "optimizers/lans.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bitpush/config.h"
#include "common/cpu_features.h"

#if BITPUSH_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace bitpush::optimizers {
namespace {

constexpr size_t kSizes[] = {0, 1, 7, 33, 1000, 100003};
constexpr int kSteps = 20;
constexpr float kLr = 0.01f;

// ---- the reference: the header's formula in double, one element at a time -------------------

struct RefState {
  std::vector<double> x, m, v;
};

void RefStep(const LansOptions& o, double lr, uint64_t t, const std::vector<float>& grad,
             RefState* s) {
  const size_t n = grad.size();
  std::vector<double> g(grad.begin(), grad.end());
  if (o.normalize_grad) {
    double sq = 0;
    for (double gi : g) sq += gi * gi;
    const double norm = std::sqrt(sq);
    if (norm > 0 && std::isfinite(norm)) {
      for (double& gi : g) gi /= norm;
    }
  }
  const double b1 = o.beta1, b2 = o.beta2, eps = o.eps, wd = o.weight_decay;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(t));
  std::vector<double> r(n), c(n);
  double xn = 0, rn = 0, cn = 0;
  for (size_t i = 0; i < n; ++i) {
    s->m[i] = b1 * s->m[i] + (1 - b1) * g[i];
    s->v[i] = b2 * s->v[i] + (1 - b2) * g[i] * g[i];
    const double mh = s->m[i] / bc1, vh = s->v[i] / bc2;
    const double den =
        o.eps_mode == EpsMode::kOutsideSqrt ? std::sqrt(vh) + eps : std::sqrt(vh + eps);
    r[i] = mh / den + wd * s->x[i];
    c[i] = g[i] / den + wd * s->x[i];
    xn += s->x[i] * s->x[i];
    rn += r[i] * r[i];
    cn += c[i] * c[i];
  }
  xn = std::sqrt(xn);
  rn = std::sqrt(rn);
  cn = std::sqrt(cn);
  const double phi =
      std::min(std::max(xn, static_cast<double>(o.phi_lower)), static_cast<double>(o.phi_upper));
  auto ratio = [&](double unorm) {
    if (o.trust_ratio_fallback) {
      const double q = phi / unorm;
      return (q == 0 || !std::isfinite(q)) ? 1.0 : q;
    }
    return unorm == 0 ? 0.0 : phi / unorm;
  };
  const double tr = ratio(rn), tc = ratio(cn);
  for (size_t i = 0; i < n; ++i) s->x[i] -= lr * (b1 * tr * r[i] + (1 - b1) * tc * c[i]);
}

// ---- helpers ----------------------------------------------------------------------------------

struct Block {
  std::vector<float> x, m, v;
};

Block RandomBlock(size_t n, uint64_t seed, bool zero_x = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Block b{std::vector<float>(n), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  for (float& x : b.x) x = zero_x ? 0.0f : d(rng);
  return b;
}

std::vector<float> RandomGrad(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> g(n);
  // A spread of magnitudes (1e-3 .. 1e1), as real gradients have.
  constexpr float kScales[] = {1e-3f, 1e-2f, 1e-1f, 1.0f, 1e1f};
  for (float& x : g) x = d(rng) * kScales[rng() % 5];
  return g;
}

RefState ToRef(const Block& b) {
  return {std::vector<double>(b.x.begin(), b.x.end()), std::vector<double>(b.m.begin(), b.m.end()),
          std::vector<double>(b.v.begin(), b.v.end())};
}

Status StepWith(IsaLevel level, const LansOptions& o, float lr, uint64_t t, Block* b,
                const std::vector<float>& g) {
  return LansStepWithIsa(level, o, lr, t, Span<float>(b->x), Span<float>(b->m), Span<float>(b->v),
                         Span<const float>(g));
}

std::vector<IsaLevel> SupportedLevels() {
  std::vector<IsaLevel> out;
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (IsaSupported(l)) out.push_back(l);
  }
  return out;
}

// max over i of |a - b| / (|b| + scale): relative error with a floor at `scale`.
template <typename A, typename B>
double MaxRelErr(const std::vector<A>& a, const std::vector<B>& b, double scale) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::max(worst, d / (std::fabs(static_cast<double>(b[i])) + scale));
  }
  return worst;
}

// The floor for MaxRelErr: 1% of the block's RMS, so elements that happen to sit near zero
// (m after cancellation, x crossing zero) are judged against the block's scale.
template <typename T>
double Floor(const std::vector<T>& ref) {
  double sq = 0;
  for (T v : ref) sq += static_cast<double>(v) * v;
  return 1e-2 * std::sqrt(sq / std::max<size_t>(ref.size(), 1)) + 1e-30;
}

bool AllFinite(const std::vector<float>& a) {
  for (float x : a) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

struct Config {
  const char* name;
  LansOptions options;
};

std::vector<Config> Configs() {
  std::vector<Config> out;
  out.push_back({"defaults", LansOptions()});
  LansOptions o;
  o.eps_mode = EpsMode::kInsideSqrt;
  out.push_back({"eps_inside_sqrt", o});
  o = LansOptions();
  o.weight_decay = 0.01f;
  out.push_back({"weight_decay", o});
  o = LansOptions();
  o.normalize_grad = true;
  out.push_back({"normalize_grad", o});
  o = LansOptions();
  o.phi_lower = 0.5f;
  o.phi_upper = 2.0f;
  out.push_back({"phi_clamp", o});
  o = LansOptions();
  o.trust_ratio_fallback = false;
  out.push_back({"no_fallback", o});
  o = LansOptions();
  o.eps_mode = EpsMode::kInsideSqrt;
  o.weight_decay = 0.1f;
  o.normalize_grad = true;
  o.phi_lower = 1.0f;
  o.phi_upper = 10.0f;
  o.beta1 = 0.8f;
  o.beta2 = 0.99f;
  o.eps = 1e-4f;
  out.push_back({"all_switches", o});
  return out;
}

// ---- against the reference --------------------------------------------------------------------

// Float kernels vs the double reference after 20 steps: x within 5e-5 and m, v within 1e-4
// relative (to
// max(|ref|, 1% of the block's RMS)).
TEST(LansTest, EveryKernelMatchesTheDoubleReference) {
  for (const Config& cfg : Configs()) {
    for (size_t n : kSizes) {
      std::vector<std::vector<float>> grads;
      for (int t = 1; t <= kSteps; ++t) grads.push_back(RandomGrad(n, 1000 * n + t));
      for (bool zero_x : {false, true}) {
        const Block start = RandomBlock(n, 17 + n, zero_x);
        RefState ref = ToRef(start);
        for (int t = 1; t <= kSteps; ++t) RefStep(cfg.options, kLr, t, grads[t - 1], &ref);
        for (IsaLevel level : SupportedLevels()) {
          SCOPED_TRACE(std::string(cfg.name) + " " + std::string(IsaLevelName(level)) +
                       " n=" + std::to_string(n) + (zero_x ? " zero x" : ""));
          Block b = start;
          for (int t = 1; t <= kSteps; ++t) {
            ASSERT_TRUE(StepWith(level, cfg.options, kLr, t, &b, grads[t - 1]).ok());
          }
          EXPECT_LE(MaxRelErr(b.x, ref.x, Floor(ref.x)), 5e-5);
          EXPECT_LE(MaxRelErr(b.m, ref.m, Floor(ref.m)), 1e-4);  // float rounding of sums
          EXPECT_LE(MaxRelErr(b.v, ref.v, Floor(ref.v)), 1e-4);
          EXPECT_TRUE(AllFinite(b.x));
        }
      }
    }
  }
}

// The SIMD levels compute the scalar kernel's element arithmetic exactly (m, v bit for bit
// where no ‖g‖ is involved); x differs only through the order the norms are summed in.
TEST(LansTest, SimdKernelsMatchTheScalarKernel) {
  for (const Config& cfg : Configs()) {
    for (IsaLevel level : SupportedLevels()) {
      if (level == IsaLevel::kScalar) continue;
      for (size_t n : kSizes) {
        SCOPED_TRACE(std::string(cfg.name) + " " + std::string(IsaLevelName(level)) +
                     " n=" + std::to_string(n));
        Block a = RandomBlock(n, 5 + n), s = a;
        double worst = 0;
        for (int t = 1; t <= kSteps; ++t) {
          const std::vector<float> g = RandomGrad(n, 77 * n + t);
          ASSERT_TRUE(StepWith(level, cfg.options, kLr, t, &a, g).ok());
          ASSERT_TRUE(LansStepScalar(cfg.options, kLr, t, Span<float>(s.x), Span<float>(s.m),
                                     Span<float>(s.v), Span<const float>(g))
                          .ok());
          worst = std::max(worst, MaxRelErr(a.x, s.x, 1e-6));
        }
        EXPECT_LE(worst, 1e-6);
        if (!cfg.options.normalize_grad) {
          EXPECT_EQ(a.m, s.m);
          EXPECT_EQ(a.v, s.v);
        }
      }
    }
  }
}

TEST(LansTest, LansStepUsesTheBestLevel) {
  EXPECT_EQ(std::string(LansKernelName()), std::string(IsaLevelName(BestIsaLevel())));
  const size_t n = 1000;
  Block a = RandomBlock(n, 3), b = a;
  const std::vector<float> g = RandomGrad(n, 4);
  ASSERT_TRUE(LansStep(LansOptions(), kLr, 1, Span<float>(a.x), Span<float>(a.m), Span<float>(a.v),
                       Span<const float>(g))
                  .ok());
  ASSERT_TRUE(StepWith(BestIsaLevel(), LansOptions(), kLr, 1, &b, g).ok());
  EXPECT_EQ(a.x, b.x);
}

// ---- zero blocks, zero gradients, the length bound ---------------------------------------------

TEST(LansTest, ZeroBlockMovesWithFallbackAndStaysZeroWithout) {
  for (IsaLevel level : SupportedLevels()) {
    for (float wd : {0.0f, 0.01f}) {
      SCOPED_TRACE(std::string(IsaLevelName(level)) + " wd=" + std::to_string(wd));
      LansOptions o;
      o.weight_decay = wd;
      const size_t n = 33;
      Block with = RandomBlock(n, 1, /*zero_x=*/true), without = with;
      o.trust_ratio_fallback = true;
      const std::vector<float> g = RandomGrad(n, 2);
      ASSERT_TRUE(StepWith(level, o, kLr, 1, &with, g).ok());
      EXPECT_TRUE(AllFinite(with.x));
      double moved = 0;
      for (float x : with.x) moved += std::fabs(x);
      EXPECT_GT(moved, 0);
      o.trust_ratio_fallback = false;
      for (int t = 1; t <= 3; ++t) ASSERT_TRUE(StepWith(level, o, kLr, t, &without, g).ok());
      for (float x : without.x) {
        EXPECT_EQ(x, 0.0f);
        EXPECT_FALSE(std::signbit(x) && x != 0.0f);
      }
      EXPECT_TRUE(AllFinite(without.m) && AllFinite(without.v));
    }
  }
}

// g = 0 at step 1: m = v = r = c = 0, ‖r‖ = ‖c‖ = 0 (0/0 in the formula). x must not move and
// nothing may become NaN, with or without the fallback.
TEST(LansTest, ZeroGradientLeavesXAndNeverMakesNaN) {
  for (IsaLevel level : SupportedLevels()) {
    for (bool fallback : {true, false}) {
      for (bool normalize : {true, false}) {
        SCOPED_TRACE(std::string(IsaLevelName(level)) + (fallback ? " fallback" : "") +
                     (normalize ? " normalize" : ""));
        LansOptions o;
        o.trust_ratio_fallback = fallback;
        o.normalize_grad = normalize;
        Block b = RandomBlock(100, 9);
        const std::vector<float> x0 = b.x;
        ASSERT_TRUE(StepWith(level, o, kLr, 1, &b, std::vector<float>(100, 0.0f)).ok());
        EXPECT_EQ(b.x, x0);
        EXPECT_TRUE(AllFinite(b.m) && AllFinite(b.v));
      }
    }
  }
}

// The paper's eq. 2: ‖x_{t+1} - x_t‖ <= η φ(‖x_t‖) per block (each term has norm φ, the weights
// sum to 1).
TEST(LansTest, StepLengthIsBoundedByLrTimesPhi) {
  LansOptions o;
  o.weight_decay = 0.01f;
  o.phi_lower = 0.5f;
  o.phi_upper = 3.0f;
  const size_t n = 1000;
  Block b = RandomBlock(n, 11);
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<float> x0 = b.x;
    double xn = 0;
    for (float x : x0) xn += static_cast<double>(x) * x;
    const double phi = std::min(std::max(std::sqrt(xn), 0.5), 3.0);
    ASSERT_TRUE(LansStep(o, 0.1f, t, Span<float>(b.x), Span<float>(b.m), Span<float>(b.v),
                         Span<const float>(RandomGrad(n, t)))
                    .ok());
    double d = 0;
    for (size_t i = 0; i < n; ++i) d += std::pow(static_cast<double>(b.x[i]) - x0[i], 2);
    EXPECT_LE(std::sqrt(d), 0.1 * phi * (1 + 1e-5));
    EXPECT_GE(std::sqrt(d), 0.1 * phi * 0.5);  // both terms point roughly the same way
  }
}

// ---- validation ---------------------------------------------------------------------------------

void ExpectInvalid(const Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(field), std::string::npos) << field << ": " << s.ToString();
}

TEST(LansTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(LansOptions().Validate().ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* field;
    void (*set)(LansOptions*, float);
    std::vector<float> bad;
  };
  const std::vector<Case> cases = {
      {"beta1", [](LansOptions* o, float f) { o->beta1 = f; }, {-0.1f, 1.0f, 1.5f, nan}},
      {"beta2", [](LansOptions* o, float f) { o->beta2 = f; }, {-0.1f, 1.0f, nan}},
      {"eps", [](LansOptions* o, float f) { o->eps = f; }, {0.0f, -1e-6f, inf, nan}},
      {"weight_decay", [](LansOptions* o, float f) { o->weight_decay = f; }, {-0.1f, inf, nan}},
      {"phi_lower", [](LansOptions* o, float f) { o->phi_lower = f; }, {-1.0f, inf, nan}},
      {"phi_upper", [](LansOptions* o, float f) { o->phi_upper = f; }, {0.0f, -1.0f, nan}},
  };
  for (const Case& c : cases) {
    for (float f : c.bad) {
      LansOptions o;
      c.set(&o, f);
      SCOPED_TRACE(std::string(c.field) + "=" + std::to_string(f));
      ExpectInvalid(o.Validate(), std::string("LansOptions.") + c.field);
      // Every entry point validates.
      std::vector<float> x(4), m(4), v(4), g(4);
      ExpectInvalid(
          LansStep(o, kLr, 1, Span<float>(x), Span<float>(m), Span<float>(v), Span<const float>(g)),
          c.field);
      ExpectInvalid(LansStepScalar(o, kLr, 1, Span<float>(x), Span<float>(m), Span<float>(v),
                                   Span<const float>(g)),
                    c.field);
    }
  }
  LansOptions o;
  o.phi_lower = 2.0f;
  o.phi_upper = 1.0f;
  ExpectInvalid(o.Validate(), "phi_upper");
  o = LansOptions();
  o.eps_mode = static_cast<EpsMode>(7);
  ExpectInvalid(o.Validate(), "eps_mode");
  // Valid edge values.
  o = LansOptions();
  o.beta1 = 0.0f;
  o.beta2 = 0.0f;
  o.phi_lower = 1.0f;
  o.phi_upper = 1.0f;
  EXPECT_TRUE(o.Validate().ok());
}

TEST(LansTest, StepAndLrAreValidated) {
  std::vector<float> x(4), m(4), v(4), g(4);
  auto step = [&](float lr, uint64_t t) {
    return LansStep(LansOptions(), lr, t, Span<float>(x), Span<float>(m), Span<float>(v),
                    Span<const float>(g));
  };
  ExpectInvalid(step(kLr, 0), "step");
  ExpectInvalid(step(-0.1f, 1), "lr");
  ExpectInvalid(step(std::numeric_limits<float>::quiet_NaN(), 1), "lr");
  ExpectInvalid(step(std::numeric_limits<float>::infinity(), 1), "lr");
  EXPECT_TRUE(step(0.0f, 1).ok());
  EXPECT_TRUE(step(kLr, std::numeric_limits<uint64_t>::max()).ok());  // β^t underflows to 0
}

TEST(LansTest, SizeMismatchIsInvalidArgument) {
  std::vector<float> x(8), m(8), v(8), g(8), s(7);
  auto run = [](Span<float> x, Span<float> m, Span<float> v, Span<const float> g) {
    return LansStep(LansOptions(), kLr, 1, x, m, v, g);
  };
  ExpectInvalid(run(Span<float>(s), Span<float>(m), Span<float>(v), Span<const float>(g)),
                "same size");
  ExpectInvalid(run(Span<float>(x), Span<float>(s), Span<float>(v), Span<const float>(g)),
                "same size");
  ExpectInvalid(run(Span<float>(x), Span<float>(m), Span<float>(s), Span<const float>(g)),
                "same size");
  ExpectInvalid(run(Span<float>(x), Span<float>(m), Span<float>(v), Span<const float>(s)),
                "same size");
  for (IsaLevel l : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (IsaSupported(l)) continue;
    Block b = RandomBlock(8, 1);
    EXPECT_EQ(StepWith(l, LansOptions(), kLr, 1, &b, g).code(), StatusCode::kFailedPrecondition);
  }
}

// ---- CUDA ---------------------------------------------------------------------------------------

#if !BITPUSH_HAVE_CUDA
TEST(LansCudaTest, StubSaysBuiltWithoutCuda) {
  std::vector<float> x(4), m(4), v(4), g(4);
  const Status s =
      LansStepCuda(LansOptions(), kLr, 1, x.data(), m.data(), v.data(), g.data(), 4, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
  EXPECT_NE(s.message().find("built without CUDA"), std::string::npos) << s.ToString();
}
#endif

TEST(LansCudaTest, MatchesTheCpuKernel) {
#if !BITPUSH_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: LansStepCuda is a stub";
#else
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no usable CUDA device: "
                 << (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount() == 0");
  }
  for (const Config& cfg : Configs()) {
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(cfg.name) + " n=" + std::to_string(n));
      Block cpu = RandomBlock(n, 23 + n), gpu = cpu;
      float *dx = nullptr, *dm = nullptr, *dv = nullptr, *dg = nullptr;
      const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
      ASSERT_EQ(cudaMalloc(&dx, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dm, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dv, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dg, bytes), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dx, gpu.x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dm, gpu.m.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dv, gpu.v.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
      double worst = 0;
      for (int t = 1; t <= kSteps; ++t) {
        const std::vector<float> g = RandomGrad(n, 31 * n + t);
        ASSERT_EQ(cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        const Status s = LansStepCuda(cfg.options, kLr, t, dx, dm, dv, dg, n, nullptr);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ASSERT_TRUE(LansStep(cfg.options, kLr, t, Span<float>(cpu.x), Span<float>(cpu.m),
                             Span<float>(cpu.v), Span<const float>(g))
                        .ok());
        ASSERT_EQ(cudaMemcpy(gpu.x.data(), dx, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        worst = std::max(worst, MaxRelErr(gpu.x, cpu.x, 1e-6));
      }
      ASSERT_EQ(cudaMemcpy(gpu.m.data(), dm, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gpu.v.data(), dv, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      std::printf("LansStepCuda vs CPU, %s n=%zu: max rel err on x %.3g\n", cfg.name, n, worst);
      EXPECT_LE(worst, 1e-6);
      if (!cfg.options.normalize_grad) {
        EXPECT_EQ(gpu.m, cpu.m);
        EXPECT_EQ(gpu.v, cpu.v);
      }
      cudaFree(dx);
      cudaFree(dm);
      cudaFree(dv);
      cudaFree(dg);
    }
  }
  // Validation happens before any device work.
  LansOptions bad;
  bad.eps = 0;
  ExpectInvalid(LansStepCuda(bad, kLr, 1, nullptr, nullptr, nullptr, nullptr, 4, nullptr), "eps");
  ExpectInvalid(LansStepCuda(LansOptions(), kLr, 1, nullptr, nullptr, nullptr, nullptr, 4, nullptr),
                "null");
#endif
}

}  // namespace
}  // namespace bitpush::optimizers
