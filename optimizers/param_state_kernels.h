// The per-ISA halves of ParamState's sgd and adamw updates (optimizers/param_state.h), private to
// the optimizers library: param_state.cc computes the per-step constants once and runs the best
// level's loop. Every level evaluates param_state.h's element formulas with the same float
// operations in the same order (-ffp-contract=off), so all levels give the same bits; the
// param_state_test compares them.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"

namespace bitpush::optimizers::internal {

struct SgdConstants {
  float lr = 0;
  float weight_decay = 0;
  float momentum = 0;
  bool nesterov = false;
  bool first_step = false;  // t == 1: the momentum buffer starts as d
};

struct AdamWConstants {
  float weight_decay = 0;
  float decay = 1;  // 1 - lr * weight_decay
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float bc2_sqrt = 1;  // sqrt(1 - β2^t)
  float eps = 0;
  float step_size = 0;  // lr / (1 - β1^t)
};

void SgdStepScalar(const SgdConstants& k, float* w, float* b, const float* g, size_t n);
void AdamWStepScalar(const AdamWConstants& k, float* w, float* m, float* v, const float* g,
                     size_t n);
void SgdStepAvx512(const SgdConstants& k, float* w, float* b, const float* g, size_t n);
void AdamWStepAvx512(const AdamWConstants& k, float* w, float* m, float* v, const float* g,
                     size_t n);

}  // namespace bitpush::optimizers::internal
