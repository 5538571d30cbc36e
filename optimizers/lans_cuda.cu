// LansStepCuda (optimizers/lans.h): the fused LANS update on device buffers.
//
// Three kernels on the caller's stream, then one cudaStreamSynchronize:
//   [GradSumSqKernel]  only with normalize_grad: per-block partial Σ g² into device scratch;
//   Pass1Kernel        m, v updated; per-block partial ‖x‖², ‖r+λx‖², ‖c+λx‖² into scratch;
//   Pass2Kernel        every block reduces the partials itself (the same fixed order in every
//                      block, so all agree and the result is deterministic), computes the trust
//                      ratios with the CPU's LansTrustScales and updates x.
// No atomics and no host round trip between the passes. The element arithmetic is the CPU's
// (LansElement), compiled with --fmad=false and IEEE sqrt/division, so a step matches the CPU
// kernel to the same tolerance the CPU levels match each other (lans_test).
//
// Thread-safety: no shared state. The scratch (4 doubles per block, at most 32 KiB) is cached
// per calling thread and device (thread_local): a call ends with its stream synchronised, so
// the thread's next call finds it free, and two threads never share one. Allocating it per call
// with cudaMallocAsync cost ~100 us a call on an H100 (the default memory pool hands freed
// memory back to the driver at every synchronisation), more than the update of a 1M-element
// tensor.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "optimizers/lans.h"
#include "optimizers/lans_kernels.h"

namespace bitpush::optimizers {
namespace {

using internal::LansConstants;
using internal::LansRatioInputs;
using internal::LansScales;
using internal::LansSums;

constexpr unsigned kThreads = 256;
// Partials are reduced by every block of the second pass: keep their number small.
constexpr size_t kMaxBlocks = 1024;

// Sums `count` values per thread slot into shared memory and tree-reduces them (fixed order).
template <int kN>
__device__ void BlockReduce(double (&vals)[kN], double (*sh)[kThreads]) {
  for (int j = 0; j < kN; ++j) sh[j][threadIdx.x] = vals[j];
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      for (int j = 0; j < kN; ++j) sh[j][threadIdx.x] += sh[j][threadIdx.x + half];
    }
    __syncthreads();
  }
  for (int j = 0; j < kN; ++j) vals[j] = sh[j][0];
  __syncthreads();
}

// Reduces partials[j * blocks + b] over b for j < kN, the same way in every block.
template <int kN>
__device__ void ReducePartials(const double* partials, unsigned blocks, double (&out)[kN],
                               double (*sh)[kThreads]) {
  for (int j = 0; j < kN; ++j) {
    out[j] = 0;
    for (unsigned b = threadIdx.x; b < blocks; b += kThreads) out[j] += partials[j * blocks + b];
  }
  BlockReduce<kN>(out, sh);
}

__device__ float GradScale(const LansConstants& k, bool normalize, const double* gpartials,
                           unsigned blocks, double (*sh)[kThreads]) {
  if (!normalize) return k.grad_scale;
  double g[1];
  ReducePartials<1>(gpartials, blocks, g, sh);
  return internal::LansGradScale(g[0]);
}

__global__ void GradSumSqKernel(const float* __restrict__ g, size_t n, double* partials) {
  __shared__ double sh[1][kThreads];
  double s[1] = {0};
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double gd = g[i];
    s[0] += gd * gd;
  }
  BlockReduce<1>(s, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

__global__ void Pass1Kernel(LansConstants k, bool normalize, const float* __restrict__ x,
                            float* __restrict__ m, float* __restrict__ v,
                            const float* __restrict__ g, size_t n, const double* gpartials,
                            double* partials) {
  __shared__ double sh[3][kThreads];
  k.grad_scale = GradScale(k, normalize, gpartials, gridDim.x, sh);
  double s[3] = {0, 0, 0};
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float gi = g[i] * k.grad_scale;
    const float mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
    const float vi = k.beta2 * v[i] + k.one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float xi = x[i];
    const internal::LansDirections d = internal::LansElement(k, xi, mi, vi, gi);
    const double xd = xi, rd = d.r, cd = d.c;
    s[0] += xd * xd;
    s[1] += rd * rd;
    s[2] += cd * cd;
  }
  BlockReduce<3>(s, sh);
  if (threadIdx.x == 0) {
    for (int j = 0; j < 3; ++j) partials[j * gridDim.x + blockIdx.x] = s[j];
  }
}

__global__ void Pass2Kernel(LansConstants k, bool normalize, LansRatioInputs ratio,
                            float* __restrict__ x, const float* __restrict__ m,
                            const float* __restrict__ v, const float* __restrict__ g, size_t n,
                            const double* gpartials, const double* partials) {
  __shared__ double sh[3][kThreads];
  k.grad_scale = GradScale(k, normalize, gpartials, gridDim.x, sh);
  double t[3];
  ReducePartials<3>(partials, gridDim.x, t, sh);
  LansSums sums;
  sums.x = t[0];
  sums.r = t[1];
  sums.c = t[2];
  const LansScales s = internal::LansTrustScales(ratio, sums);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float gi = g[i] * k.grad_scale;
    const float xi = x[i];
    const internal::LansDirections d = internal::LansElement(k, xi, m[i], v[i], gi);
    x[i] = xi - (s.ur * d.r + s.uc * d.c);
  }
}

Status CudaError(const char* api, cudaError_t e) {
  return InternalError(std::string("LansStepCuda: ") + api + " failed: " + cudaGetErrorName(e) +
                       ": " + cudaGetErrorString(e));
}

// The calling thread's scratch on each device it used, kMaxBlocks * 4 doubles each, freed when
// the thread ends (errors ignored: at process exit the runtime may already be gone).
class ThreadScratch {
 public:
  ThreadScratch() = default;
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
  ~ThreadScratch() {
    for (const auto& [device, p] : buffers_) {
      if (cudaSetDevice(device) == cudaSuccess) cudaFree(p);
    }
  }
  // The current device's buffer, allocated on first use.
  StatusOr<double*> Get() {
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return CudaError("cudaGetDevice", e);
    for (const auto& [d, p] : buffers_) {
      if (d == device) return p;
    }
    double* p = nullptr;
    e = cudaMalloc(reinterpret_cast<void**>(&p), sizeof(double) * 4 * kMaxBlocks);
    if (e != cudaSuccess) return CudaError("cudaMalloc", e);
    buffers_.emplace_back(device, p);
    return p;
  }

 private:
  std::vector<std::pair<int, double*>> buffers_;
};

}  // namespace

Status LansStepCuda(const LansOptions& options, float lr, uint64_t step, float* x, float* m,
                    float* v, const float* grad, size_t n, void* stream) {
  LansConstants k;
  LansRatioInputs ratio;
  Status st = internal::PrepareLans(options, lr, step, &k, &ratio);
  if (!st.ok()) return st;
  if (n == 0) return Status::Ok();
  if (x == nullptr || m == nullptr || v == nullptr || grad == nullptr) {
    return InvalidArgumentError("LansStepCuda: null device pointer for " + std::to_string(n) +
                                " elements");
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks =
      static_cast<unsigned>(std::min(kMaxBlocks, (n + kThreads - 1) / kThreads));
  // Scratch: [Σ g² partials | ‖x‖², ‖r+λx‖², ‖c+λx‖² partials], blocks doubles each.
  thread_local ThreadScratch thread_scratch;
  StatusOr<double*> scratch = thread_scratch.Get();
  if (!scratch.ok()) return scratch.status();
  double* gpartials = *scratch;
  double* partials = *scratch + blocks;
  Status result = Status::Ok();
  cudaError_t e = cudaSuccess;
  if (options.normalize_grad) {
    GradSumSqKernel<<<blocks, kThreads, 0, s>>>(grad, n, gpartials);
    e = cudaGetLastError();
    if (e != cudaSuccess) result = CudaError("GradSumSqKernel launch", e);
  }
  if (result.ok()) {
    Pass1Kernel<<<blocks, kThreads, 0, s>>>(k, options.normalize_grad, x, m, v, grad, n, gpartials,
                                            partials);
    e = cudaGetLastError();
    if (e != cudaSuccess) result = CudaError("Pass1Kernel launch", e);
  }
  if (result.ok()) {
    Pass2Kernel<<<blocks, kThreads, 0, s>>>(k, options.normalize_grad, ratio, x, m, v, grad, n,
                                            gpartials, partials);
    e = cudaGetLastError();
    if (e != cudaSuccess) result = CudaError("Pass2Kernel launch", e);
  }
  // Whatever happened, wait for what was launched: the scratch is free again afterwards.
  e = cudaStreamSynchronize(s);
  if (e != cudaSuccess && result.ok()) result = CudaError("cudaStreamSynchronize", e);
  return result;
}

}  // namespace bitpush::optimizers
