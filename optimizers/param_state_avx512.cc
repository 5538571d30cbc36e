// The AVX-512 halves of ParamState's sgd and adamw updates (optimizers/param_state.h): 16 lanes,
// masked loads and stores for the tail. Each element goes through the same float operations in
// the same order as the scalar loop in param_state.cc (the library is compiled with
// -ffp-contract=off; sqrt and division are correctly rounded in both), so the result is bit for
// bit the scalar one: a server's weights do not depend on its CPU. Compiled with per-function
// target attributes, never -m flags.
//
// Thread-safety: pure functions of their arguments.
#include <immintrin.h>

#include "common/cpu_features.h"
#include "optimizers/param_state_kernels.h"

namespace bitpush::optimizers::internal {

BP_TARGET_AVX512 void SgdStepAvx512(const SgdConstants& k, float* w, float* b, const float* g,
                                    size_t n) {
  const __m512 lr = _mm512_set1_ps(k.lr);
  const __m512 wd = _mm512_set1_ps(k.weight_decay);
  const __m512 mu = _mm512_set1_ps(k.momentum);
  const bool decay = k.weight_decay != 0.0f;
  const bool momentum = k.momentum > 0.0f;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 wi = _mm512_maskz_loadu_ps(mask, w + i);
    __m512 d = _mm512_maskz_loadu_ps(mask, g + i);
    if (decay) d = _mm512_add_ps(d, _mm512_mul_ps(wd, wi));
    if (momentum) {
      __m512 bi = d;
      if (!k.first_step)
        bi = _mm512_add_ps(_mm512_mul_ps(mu, _mm512_maskz_loadu_ps(mask, b + i)), d);
      _mm512_mask_storeu_ps(b + i, mask, bi);
      d = k.nesterov ? _mm512_add_ps(d, _mm512_mul_ps(mu, bi)) : bi;
    }
    _mm512_mask_storeu_ps(w + i, mask, _mm512_sub_ps(wi, _mm512_mul_ps(lr, d)));
  }
}

BP_TARGET_AVX512 void AdamWStepAvx512(const AdamWConstants& k, float* w, float* m, float* v,
                                      const float* g, size_t n) {
  const __m512 decay = _mm512_set1_ps(k.decay);
  const __m512 b1 = _mm512_set1_ps(k.beta1);
  const __m512 omb1 = _mm512_set1_ps(k.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(k.beta2);
  const __m512 omb2 = _mm512_set1_ps(k.one_minus_beta2);
  const __m512 bc2_sqrt = _mm512_set1_ps(k.bc2_sqrt);
  const __m512 eps = _mm512_set1_ps(k.eps);
  const __m512 step_size = _mm512_set1_ps(k.step_size);
  const bool decays = k.weight_decay != 0.0f;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 wi = _mm512_maskz_loadu_ps(mask, w + i);
    const __m512 gi = _mm512_maskz_loadu_ps(mask, g + i);
    if (decays) wi = _mm512_mul_ps(wi, decay);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_maskz_loadu_ps(mask, m + i)),
                                    _mm512_mul_ps(omb1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_maskz_loadu_ps(mask, v + i)),
                                    _mm512_mul_ps(omb2, _mm512_mul_ps(gi, gi)));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2_sqrt), eps);
    // Masked-off lanes divide 0 by eps: no exception is raised for them (masked division).
    const __m512 upd = _mm512_maskz_div_ps(mask, mi, denom);
    _mm512_mask_storeu_ps(m + i, mask, mi);
    _mm512_mask_storeu_ps(v + i, mask, vi);
    _mm512_mask_storeu_ps(w + i, mask, _mm512_sub_ps(wi, _mm512_mul_ps(step_size, upd)));
  }
}

}  // namespace bitpush::optimizers::internal
