// LansOptions::Validate, the per-call constants, the scalar kernel and the dispatch of the fused
// CPU kernel (optimizers/lans.h). The SIMD halves live in lans_avx2.cc / lans_avx512.cc.
#include "optimizers/lans.h"

#include <cmath>
#include <string>

#include "common/cpu_features.h"
#include "optimizers/lans_kernels.h"

namespace bitpush::optimizers {
namespace internal {

double GradSumSqScalar(const float* g, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) {
    const double gd = g[i];
    s += gd * gd;
  }
  return s;
}

void Pass1Scalar(const LansConstants& k, const float* x, float* m, float* v, const float* g,
                 size_t n, LansSums* sums) {
  double sx = 0, sr = 0, sc = 0;
  for (size_t i = 0; i < n; ++i) LansPass1Element(k, x, m, v, g, i, &sx, &sr, &sc);
  sums->x += sx;
  sums->r += sr;
  sums->c += sc;
}

void Pass2Scalar(const LansConstants& k, const LansScales& s, float* x, const float* m,
                 const float* v, const float* g, size_t n) {
  for (size_t i = 0; i < n; ++i) LansPass2Element(k, s, x, m, v, g, i);
}

Status PrepareLans(const LansOptions& options, float lr, uint64_t step, LansConstants* k,
                   LansRatioInputs* ratio) {
  Status st = options.Validate();
  if (!st.ok()) return st;
  if (step == 0) return InvalidArgumentError("LansStep: step must be >= 1 (1-based), got 0");
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return InvalidArgumentError("LansStep: lr must be a finite number >= 0, got " +
                                std::to_string(lr));
  }
  const double b1 = options.beta1;
  const double b2 = options.beta2;
  // β^t in double; for large t it underflows to 0 and the correction becomes 1.
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  k->beta1 = options.beta1;
  k->one_minus_beta1 = static_cast<float>(1.0 - b1);
  k->beta2 = options.beta2;
  k->one_minus_beta2 = static_cast<float>(1.0 - b2);
  k->inv_bc1 = static_cast<float>(1.0 / bc1);
  k->inv_bc2 = static_cast<float>(1.0 / bc2);
  k->eps = options.eps;
  k->eps_inside = options.eps_mode == EpsMode::kInsideSqrt;
  k->weight_decay = options.weight_decay;
  k->grad_scale = 1.0f;
  ratio->lr = lr;
  ratio->beta1 = b1;
  ratio->phi_lower = options.phi_lower;
  ratio->phi_upper = options.phi_upper;
  ratio->fallback = options.trust_ratio_fallback;
  return Status::Ok();
}

}  // namespace internal

namespace {

using internal::LansConstants;
using internal::LansRatioInputs;
using internal::LansScales;
using internal::LansSums;

struct Kernel {
  const char* name;
  double (*grad_sum_sq)(const float*, size_t);
  void (*pass1)(const LansConstants&, const float*, float*, float*, const float*, size_t,
                LansSums*);
  void (*pass2)(const LansConstants&, const LansScales&, float*, const float*, const float*,
                const float*, size_t);
};

constexpr Kernel kScalar = {"scalar", internal::GradSumSqScalar, internal::Pass1Scalar,
                            internal::Pass2Scalar};
constexpr Kernel kAvx2 = {"avx2", internal::GradSumSqAvx2, internal::Pass1Avx2,
                          internal::Pass2Avx2};
constexpr Kernel kAvx512 = {"avx512", internal::GradSumSqAvx512, internal::Pass1Avx512,
                            internal::Pass2Avx512};

const Kernel& KernelFor(IsaLevel level) {
  switch (level) {
    case IsaLevel::kAvx512: return kAvx512;
    case IsaLevel::kAvx2: return kAvx2;
    case IsaLevel::kScalar: break;
  }
  return kScalar;
}

Status Run(const Kernel& kernel, const LansOptions& options, float lr, uint64_t step, Span<float> x,
           Span<float> m, Span<float> v, Span<const float> grad) {
  LansConstants k;
  LansRatioInputs ratio;
  Status st = internal::PrepareLans(options, lr, step, &k, &ratio);
  if (!st.ok()) return st;
  const size_t n = x.size();
  if (m.size() != n || v.size() != n || grad.size() != n) {
    return InvalidArgumentError("LansStep: every span must have the same size: x " +
                                std::to_string(n) + ", m " + std::to_string(m.size()) + ", v " +
                                std::to_string(v.size()) + ", grad " + std::to_string(grad.size()));
  }
  if (n == 0) return Status::Ok();
  if (options.normalize_grad) {
    k.grad_scale = internal::LansGradScale(kernel.grad_sum_sq(grad.data(), n));
  }
  LansSums sums;
  kernel.pass1(k, x.data(), m.data(), v.data(), grad.data(), n, &sums);
  const LansScales scales = internal::LansTrustScales(ratio, sums);
  kernel.pass2(k, scales, x.data(), m.data(), v.data(), grad.data(), n);
  return Status::Ok();
}

}  // namespace

Status LansOptions::Validate() const {
  auto bad = [](const char* field, const char* want, float value) {
    return InvalidArgumentError(std::string("LansOptions.") + field + " must be " + want +
                                ", got " + std::to_string(value));
  };
  if (!(beta1 >= 0.0f && beta1 < 1.0f)) return bad("beta1", "in [0, 1)", beta1);
  if (!(beta2 >= 0.0f && beta2 < 1.0f)) return bad("beta2", "in [0, 1)", beta2);
  if (!(eps > 0.0f) || !std::isfinite(eps)) return bad("eps", "a finite number > 0", eps);
  if (!(weight_decay >= 0.0f) || !std::isfinite(weight_decay)) {
    return bad("weight_decay", "a finite number >= 0", weight_decay);
  }
  if (eps_mode != EpsMode::kOutsideSqrt && eps_mode != EpsMode::kInsideSqrt) {
    return bad("eps_mode", "kOutsideSqrt or kInsideSqrt", static_cast<float>(eps_mode));
  }
  if (!(phi_lower >= 0.0f) || !std::isfinite(phi_lower)) {
    return bad("phi_lower", "a finite number >= 0", phi_lower);
  }
  if (!(phi_upper > 0.0f) || !(phi_upper >= phi_lower)) {
    return bad("phi_upper", "> 0 and >= phi_lower (infinity: no upper bound)", phi_upper);
  }
  return Status::Ok();
}

Status LansStep(const LansOptions& options, float lr, uint64_t step, Span<float> x, Span<float> m,
                Span<float> v, Span<const float> grad) {
  static const Kernel& best = KernelFor(BestIsaLevel());
  return Run(best, options, lr, step, x, m, v, grad);
}

Status LansStepScalar(const LansOptions& options, float lr, uint64_t step, Span<float> x,
                      Span<float> m, Span<float> v, Span<const float> grad) {
  return Run(kScalar, options, lr, step, x, m, v, grad);
}

Status LansStepWithIsa(IsaLevel level, const LansOptions& options, float lr, uint64_t step,
                       Span<float> x, Span<float> m, Span<float> v, Span<const float> grad) {
  Status st = CheckIsaSupported(level);
  if (!st.ok()) return st;
  return Run(KernelFor(level), options, lr, step, x, m, v, grad);
}

const char* LansKernelName() {
  return KernelFor(BestIsaLevel()).name;
}

}  // namespace bitpush::optimizers
