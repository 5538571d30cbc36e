// The optimizer state of one tensor held where the update runs: its fp32 master weights, the
// moments of its update rule and the step count, advanced by Step() with the round's aggregated
// gradient. This is the building block of the server-side optimizer mode (servers own the
// weights and the optimizer state of their keys, workers push gradients and pull weights):
// a server keeps one ParamState per key.
//
// Rules follow torch.optim's definitions, so a job keeps its meaning when the optimizer moves
// from the workers to the servers (η: lr, λ: weight_decay, t: step, 1-based):
//   sgd:   d = g + λ w;  with momentum μ > 0: b = μ b + d (b = d at t = 1),
//          d = nesterov ? d + μ b : b;  w -= η d
//   adamw: w *= 1 - η λ;  m = β1 m + (1 - β1) g;  v = β2 v + (1 - β2) g²;
//          w -= (η / (1 - β1^t)) · m / (sqrt(v) / sqrt(1 - β2^t) + ε)
//   lans:  optimizers/lans.h (LANS, and CLAN's update), its options in `lans`
// Each element's arithmetic is fixed (this library builds with -ffp-contract=off), so the same
// inputs give the same bits on every machine.
//
// Save()/Load() carry the whole state (rule, step, weights, moments) for checkpoints; Load
// refuses a blob of another rule, size or format, naming what differs.
//
// Thread-safety: none; one owner (a server's engine thread for its key).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/cpu_features.h"
#include "common/span.h"
#include "common/status.h"
#include "optimizers/lans.h"

namespace bitpush::optimizers {

enum class UpdateRule : uint8_t { kSgd = 1, kAdamW = 2, kLans = 3 };

// "sgd", "adamw", "lans".
const char* UpdateRuleName(UpdateRule rule);
// InvalidArgument naming the valid names.
StatusOr<UpdateRule> ParseUpdateRule(std::string_view name);

struct UpdateOptions {
  UpdateRule rule = UpdateRule::kSgd;
  float weight_decay = 0.0f;  // λ >= 0 (sgd, adamw; lans uses lans.weight_decay)
  float momentum = 0.0f;      // sgd: 0 <= μ < 1
  bool nesterov = false;      // sgd: needs μ > 0
  float beta1 = 0.9f;         // adamw: 0 <= β1 < 1
  float beta2 = 0.999f;       // adamw: 0 <= β2 < 1
  float eps = 1e-8f;          // adamw: > 0
  LansOptions lans;           // lans

  // InvalidArgument naming the field and its valid range.
  Status Validate() const;
};

// The options of rule `rule` ("sgd", "adamw", "lans") with these hyper-parameters, the way a
// server-side optimizer is declared (worker::ServerOptimizerOptions, the wire's
// v1::ServerOptimizer): lans takes weight_decay, beta1, beta2 and eps into `lans`, its other
// switches at their defaults. InvalidArgument for an unknown rule or an invalid value.
StatusOr<UpdateOptions> MakeUpdateOptions(std::string_view rule, float weight_decay, float momentum,
                                          bool nesterov, float beta1, float beta2, float eps);

class ParamState {
 public:
  // The state of a tensor whose weights start as `weights`, moments at zero, step 0.
  // InvalidArgument for invalid options.
  static StatusOr<ParamState> Create(const UpdateOptions& options, Span<const float> weights);

  // One update with the aggregated gradient (grad.size() == size()); step() grows by one.
  // InvalidArgument for a size mismatch or lr < 0 / NaN; the state is unchanged then.
  Status Step(float lr, Span<const float> grad);
  // The same at a given SIMD level (sgd and adamw have AVX-512 loops; the others run the scalar
  // one): every level gives the same bits.
  Status Step(float lr, Span<const float> grad, IsaLevel isa);

  size_t size() const { return weights_.size(); }
  uint64_t step() const { return step_; }
  const UpdateOptions& options() const { return options_; }
  Span<const float> weights() const { return {weights_.data(), weights_.size()}; }

  // The whole state as bytes (little-endian; the layout is in docs/optimizer.md).
  std::string Save() const;
  // Replaces the state with a saved one of the same rule and size. DataLoss naming the problem
  // (truncated, another format, another rule, another size, trailing bytes); unchanged then.
  Status Load(std::string_view blob);

 private:
  ParamState(const UpdateOptions& options, Span<const float> weights);
  size_t MomentCount() const;

  UpdateOptions options_;
  uint64_t step_ = 0;
  std::vector<float> weights_;
  std::vector<float> m_;  // sgd: the momentum buffer b; adamw, lans: m
  std::vector<float> v_;  // adamw, lans: v
};

}  // namespace bitpush::optimizers
