// LANS / CLAN parameter update (paper 001 Algorithms 2 and 5): the per-block (one block = one
// tensor) update every worker applies to its parameters after push_pull returned the
// aggregated (and, for CLAN, compressed) gradient g~. CLAN is LANS fed by compress_push_pull /
// compress_ef_push_pull, so both use this one update.
//
//   m = β1 m + (1-β1) g~            v = β2 v + (1-β2) g~²
//   m^ = m / (1-β1^t)               v^ = v / (1-β2^t)
//   r = m^ / den                    c = g~ / den        den = sqrt(v^) + ε (EpsMode::kOutsideSqrt)
//                                                       den = sqrt(v^ + ε)   (EpsMode::kInsideSqrt)
//   x -= η [ β1 · φ(‖x‖)/‖r+λx‖ · (r+λx)  +  (1-β1) · φ(‖x‖)/‖c+λx‖ · (c+λx) ]
//
// φ(z) = min(max(z, phi_lower), phi_upper) (identity by default); norms are L2 over the block,
// all taken with the x from before the update (the paper's simultaneous form). Where the paper
// is silent or differs from the MXNet reference, docs/optimizer.md records the decision and each
// choice is a switch in LansOptions.
//
// Kernels: a fused SIMD CPU kernel (two passes over x, m, v, g; AVX-512 / AVX2 / scalar chosen
// at run time, common/cpu_features.h) and a CUDA kernel (LansStepCuda, built when CUDA is).
// Thread-safety: the functions are pure apart from the buffers they are given; callers may run
// different blocks on different threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "common/cpu_features.h"
#include "common/span.h"
#include "common/status.h"

namespace bitpush::optimizers {

enum class EpsMode {
  kOutsideSqrt,  // den = sqrt(v^) + ε: the paper's proof, MXNet's LANS (default)
  kInsideSqrt,   // den = sqrt(v^ + ε): Algorithm 2 as printed
};

struct LansOptions {
  float beta1 = 0.9f;         // 0 <= β1 < 1
  float beta2 = 0.999f;       // 0 <= β2 < 1
  float eps = 1e-6f;          // > 0
  float weight_decay = 0.0f;  // λ >= 0
  EpsMode eps_mode = EpsMode::kOutsideSqrt;
  // MXNet LANS divides g~ by its block L2 norm first (a zero norm leaves g~ as is); the
  // paper's variant does not (default false).
  bool normalize_grad = false;
  // A trust ratio φ(‖x‖)/‖u‖ that is 0, infinite or NaN (a zero-initialised bias, an all-zero
  // update) is replaced by 1, as MXNet and LAMB implementations do (default true). false: the
  // paper's formula as written (a zero block never moves; 0/0 terms are dropped, never NaN).
  bool trust_ratio_fallback = true;
  // φ's clamp bounds; the defaults make φ the identity.
  float phi_lower = 0.0f;
  float phi_upper = std::numeric_limits<float>::infinity();

  // InvalidArgument naming the field for a value out of range.
  Status Validate() const;
};

// One update of one block at step `step` (1-based: the first step is 1), in place on x, m, v
// (m and v start as zeros). `grad` is the aggregated gradient; it is not modified. Every span
// must have the same size. InvalidArgument for a size mismatch, step 0, lr < 0 or NaN, or
// invalid options. Uses the fastest kernel this CPU supports.
Status LansStep(const LansOptions& options, float lr, uint64_t step, Span<float> x, Span<float> m,
                Span<float> v, Span<const float> grad);

// The same update computed by the portable scalar kernel (the reference the SIMD kernels are
// tested against; also what LansStep uses on a CPU without AVX2).
Status LansStepScalar(const LansOptions& options, float lr, uint64_t step, Span<float> x,
                      Span<float> m, Span<float> v, Span<const float> grad);

// The same update computed by the kernel of one ISA level (tests and benchmarks compare levels);
// FailedPrecondition naming the missing CPU features where `level` does not run here.
Status LansStepWithIsa(IsaLevel level, const LansOptions& options, float lr, uint64_t step,
                       Span<float> x, Span<float> m, Span<float> v, Span<const float> grad);

// The kernel LansStep uses on this CPU: "avx512", "avx2" or "scalar".
const char* LansKernelName();

// The update on CUDA device buffers (x, m, v, grad resident on the current device, `n`
// elements each), enqueued on `stream` (a cudaStream_t; nullptr = the legacy default stream)
// and synchronised before returning. Unimplemented naming why in builds without CUDA.
Status LansStepCuda(const LansOptions& options, float lr, uint64_t step, float* x, float* m,
                    float* v, const float* grad, size_t n, void* stream);

}  // namespace bitpush::optimizers
