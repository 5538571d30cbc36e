#include "optimizers/param_state.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "common/little_endian.h"
#include "optimizers/param_state_kernels.h"

namespace bitpush::optimizers {
namespace {

// Save()'s layout: magic, format version, rule, 3 zero bytes, step (u64), size (u64), then
// `size` fp32 weights and `size` fp32 values per moment (sgd with momentum: 1; adamw, lans: 2).
constexpr char kMagic[4] = {'B', 'P', 'P', 'S'};
constexpr uint8_t kFormat = 1;
constexpr size_t kHeaderBytes = 4 + 1 + 1 + 2 + 8 + 8;

bool InUnit(float v) {  // 0 <= v < 1
  return v >= 0.0f && v < 1.0f;
}

std::string Num(float v) {
  return std::to_string(v);
}

void PutFloats(const std::vector<float>& v, std::string* out) {
  const size_t at = out->size();
  out->resize(at + 4 * v.size());
  auto* p = reinterpret_cast<uint8_t*>(out->data() + at);
  for (size_t i = 0; i < v.size(); ++i) PutF32(p + 4 * i, v[i]);
}

void GetFloats(const uint8_t* p, std::vector<float>* v) {
  for (size_t i = 0; i < v->size(); ++i) (*v)[i] = GetF32(p + 4 * i);
}

}  // namespace

const char* UpdateRuleName(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kSgd: return "sgd";
    case UpdateRule::kAdamW: return "adamw";
    case UpdateRule::kLans: return "lans";
  }
  return "unknown";
}

StatusOr<UpdateRule> ParseUpdateRule(std::string_view name) {
  for (UpdateRule r : {UpdateRule::kSgd, UpdateRule::kAdamW, UpdateRule::kLans}) {
    if (name == UpdateRuleName(r)) return r;
  }
  return InvalidArgumentError("unknown optimizer '" + std::string(name) +
                              "'; valid: sgd, adamw, lans");
}

Status UpdateOptions::Validate() const {
  switch (rule) {
    case UpdateRule::kSgd:
    case UpdateRule::kAdamW:
      if (!(weight_decay >= 0.0f) || std::isinf(weight_decay)) {
        return InvalidArgumentError("optimizer weight_decay must be a finite value >= 0 (got " +
                                    Num(weight_decay) + ")");
      }
      break;
    case UpdateRule::kLans: return lans.Validate();
    default: return InvalidArgumentError("optimizer rule must be sgd, adamw or lans");
  }
  if (rule == UpdateRule::kSgd) {
    if (!InUnit(momentum)) {
      return InvalidArgumentError("sgd momentum must be in [0, 1) (got " + Num(momentum) + ")");
    }
    if (nesterov && momentum == 0.0f) {
      return InvalidArgumentError("sgd nesterov needs a momentum > 0");
    }
    return Status::Ok();
  }
  if (!InUnit(beta1)) {
    return InvalidArgumentError("adamw beta1 must be in [0, 1) (got " + Num(beta1) + ")");
  }
  if (!InUnit(beta2)) {
    return InvalidArgumentError("adamw beta2 must be in [0, 1) (got " + Num(beta2) + ")");
  }
  if (!(eps > 0.0f) || std::isinf(eps)) {
    return InvalidArgumentError("adamw eps must be a finite value > 0 (got " + Num(eps) + ")");
  }
  return Status::Ok();
}

ParamState::ParamState(const UpdateOptions& options, Span<const float> weights)
    : options_(options), weights_(weights.begin(), weights.end()) {
  const size_t moments = MomentCount();
  if (moments >= 1) m_.assign(weights_.size(), 0.0f);
  if (moments >= 2) v_.assign(weights_.size(), 0.0f);
}

StatusOr<ParamState> ParamState::Create(const UpdateOptions& options, Span<const float> weights) {
  Status st = options.Validate();
  if (!st.ok()) return st;
  return ParamState(options, weights);
}

size_t ParamState::MomentCount() const {
  switch (options_.rule) {
    case UpdateRule::kSgd: return options_.momentum > 0.0f ? 1 : 0;
    case UpdateRule::kAdamW:
    case UpdateRule::kLans: return 2;
  }
  return 0;
}

StatusOr<UpdateOptions> MakeUpdateOptions(std::string_view rule, float weight_decay, float momentum,
                                          bool nesterov, float beta1, float beta2, float eps) {
  UpdateOptions u;
  BP_ASSIGN_OR_RETURN(u.rule, ParseUpdateRule(rule));
  u.weight_decay = weight_decay;
  u.momentum = momentum;
  u.nesterov = nesterov;
  u.beta1 = beta1;
  u.beta2 = beta2;
  u.eps = eps;
  u.lans.weight_decay = weight_decay;
  u.lans.beta1 = beta1;
  u.lans.beta2 = beta2;
  u.lans.eps = eps;
  BP_RETURN_IF_ERROR(u.Validate());
  return u;
}

namespace internal {

void SgdStepScalar(const SgdConstants& k, float* w, float* b, const float* g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float d = k.weight_decay != 0.0f ? g[i] + k.weight_decay * w[i] : g[i];
    if (k.momentum > 0.0f) {
      b[i] = k.first_step ? d : k.momentum * b[i] + d;
      d = k.nesterov ? d + k.momentum * b[i] : b[i];
    }
    w[i] = w[i] - k.lr * d;
  }
}

void AdamWStepScalar(const AdamWConstants& k, float* w, float* m, float* v, const float* g,
                     size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (k.weight_decay != 0.0f) w[i] = w[i] * k.decay;
    m[i] = k.beta1 * m[i] + k.one_minus_beta1 * g[i];
    v[i] = k.beta2 * v[i] + k.one_minus_beta2 * (g[i] * g[i]);
    const float denom = std::sqrt(v[i]) / k.bc2_sqrt + k.eps;
    w[i] = w[i] - k.step_size * (m[i] / denom);
  }
}

}  // namespace internal

Status ParamState::Step(float lr, Span<const float> grad) {
  static const IsaLevel best = BestIsaLevel();
  return Step(lr, grad, best);
}

Status ParamState::Step(float lr, Span<const float> grad, IsaLevel isa) {
  if (grad.size() != weights_.size()) {
    return InvalidArgumentError("optimizer step: gradient of " + std::to_string(grad.size()) +
                                " elements for weights of " + std::to_string(weights_.size()));
  }
  if (!(lr >= 0.0f) || std::isinf(lr)) {
    return InvalidArgumentError("optimizer step: lr must be a finite value >= 0 (got " + Num(lr) +
                                ")");
  }
  const size_t n = weights_.size();
  float* w = weights_.data();
  const float* g = grad.data();
  const uint64_t t = step_ + 1;
  const bool avx512 = isa == IsaLevel::kAvx512;
  switch (options_.rule) {
    case UpdateRule::kSgd: {
      internal::SgdConstants k;
      k.lr = lr;
      k.weight_decay = options_.weight_decay;
      k.momentum = options_.momentum;
      k.nesterov = options_.nesterov;
      k.first_step = t == 1;
      (avx512 ? internal::SgdStepAvx512 : internal::SgdStepScalar)(k, w, m_.data(), g, n);
      break;
    }
    case UpdateRule::kAdamW: {
      internal::AdamWConstants k;
      const float b1 = options_.beta1;
      const float b2 = options_.beta2;
      const double td = static_cast<double>(t);
      k.weight_decay = options_.weight_decay;
      k.decay = 1.0f - lr * options_.weight_decay;
      k.beta1 = b1;
      k.one_minus_beta1 = 1.0f - b1;
      k.beta2 = b2;
      k.one_minus_beta2 = 1.0f - b2;
      k.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), td)));
      k.eps = options_.eps;
      k.step_size = lr / static_cast<float>(1.0 - std::pow(static_cast<double>(b1), td));
      (avx512 ? internal::AdamWStepAvx512 : internal::AdamWStepScalar)(k, w, m_.data(), v_.data(),
                                                                       g, n);
      break;
    }
    case UpdateRule::kLans: {
      Status st = LansStep(options_.lans, lr, t, {weights_.data(), n}, {m_.data(), n},
                           {v_.data(), n}, grad);
      if (!st.ok()) return st;
      break;
    }
  }
  step_ = t;
  return Status::Ok();
}

std::string ParamState::Save() const {
  std::string out(kHeaderBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, kMagic, 4);
  p[4] = kFormat;
  p[5] = static_cast<uint8_t>(options_.rule);
  PutU64(p + 8, step_);
  PutU64(p + 16, weights_.size());
  PutFloats(weights_, &out);
  if (!m_.empty()) PutFloats(m_, &out);
  if (!v_.empty()) PutFloats(v_, &out);
  return out;
}

Status ParamState::Load(std::string_view blob) {
  const auto* p = reinterpret_cast<const uint8_t*>(blob.data());
  if (blob.size() < kHeaderBytes || std::memcmp(p, kMagic, 4) != 0) {
    return DataLossError("optimizer state: not a saved ParamState (" + std::to_string(blob.size()) +
                         " bytes, no BPPS header)");
  }
  if (p[4] != kFormat) {
    return DataLossError("optimizer state: format version " + std::to_string(p[4]) +
                         ", this build reads version " + std::to_string(kFormat));
  }
  if (p[5] != static_cast<uint8_t>(options_.rule)) {
    const auto saved = static_cast<UpdateRule>(p[5]);
    return DataLossError(std::string("optimizer state: saved by optimizer '") +
                         UpdateRuleName(saved) + "', this tensor's is '" +
                         UpdateRuleName(options_.rule) + "'");
  }
  const uint64_t size = GetU64(p + 16);
  if (size != weights_.size()) {
    return DataLossError("optimizer state: saved for " + std::to_string(size) +
                         " elements, this tensor has " + std::to_string(weights_.size()));
  }
  const size_t want = kHeaderBytes + 4 * weights_.size() * (1 + MomentCount());
  if (blob.size() != want) {
    return DataLossError("optimizer state: " + std::to_string(blob.size()) + " bytes, expected " +
                         std::to_string(want) + " for " + std::to_string(size) + " elements with " +
                         std::to_string(MomentCount()) + " moment(s)");
  }
  step_ = GetU64(p + 8);
  const uint8_t* data = p + kHeaderBytes;
  GetFloats(data, &weights_);
  data += 4 * weights_.size();
  if (!m_.empty()) {
    GetFloats(data, &m_);
    data += 4 * m_.size();
  }
  if (!v_.empty()) GetFloats(data, &v_);
  return Status::Ok();
}

}  // namespace bitpush::optimizers
