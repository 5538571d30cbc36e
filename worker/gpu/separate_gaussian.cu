// SeparateGaussiansOnDevice (separate_gaussian.h): one thread per lane hash, two values each,
// from compressors/separate/gaussian_pair.h with the tables in constant memory. This file is
// compiled with --fmad=false (worker/gpu/CMakeLists.txt): no multiply-add is fused, so every
// value is the CPU's bit for bit.
#include <cuda_runtime.h>

#include <string>

#include "compressors/separate/gaussian_pair.h"
#include "worker/gpu/separate_gaussian.h"

namespace bitpush::worker::gpu {
namespace {

using compressors::separate::GaussianLaneHash;
using compressors::separate::GaussianPairFrom;

__constant__ float kInvCDevice[32] = BITPUSH_SEPARATE_INV_C;
__constant__ float kLnCDevice[32] = BITPUSH_SEPARATE_LN_C;

// Thread t computes the pair of lane hash (group t / 16, lane t % 16) of the groups that cover
// [first, first + count): positions 32 g + l (cos half) and 32 g + 16 + l (sin half).
__global__ void GaussianKernel(uint64_t stream, uint32_t first_group, uint64_t first,
                               uint64_t count, float* out) {
  const uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const uint32_t group = first_group + static_cast<uint32_t>(t / 16);
  const uint32_t lane = static_cast<uint32_t>(t % 16);
  const uint64_t base = uint64_t{group} * 32;
  if (base >= first + count) return;
  float c, s;
  GaussianPairFrom(GaussianLaneHash(stream, group, lane), kInvCDevice, kLnCDevice, &c, &s);
  const uint64_t pc = base + lane;
  const uint64_t ps = base + 16 + lane;
  if (pc >= first && pc < first + count) out[pc - first] = c;
  if (ps >= first && ps < first + count) out[ps - first] = s;
}

Status CudaError(cudaError_t e, const char* what) {
  return UnavailableError(std::string("SeparateGaussiansOnDevice: ") + what + ": " +
                          cudaGetErrorString(e));
}

}  // namespace

Status SeparateGaussiansOnDevice(int device, uint64_t stream, uint32_t first, size_t count,
                                 float* out) {
  if (uint64_t{first} + count > (uint64_t{1} << 32)) {
    return InvalidArgumentError("SeparateGaussiansOnDevice: positions " + std::to_string(first) +
                                " + " + std::to_string(count) +
                                " pass 2^32 (positions are 32-bit)");
  }
  if (count == 0) return Status::Ok();
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
  float* d = nullptr;
  if (cudaError_t e = cudaMalloc(&d, count * sizeof(float)); e != cudaSuccess) {
    return CudaError(e, "cudaMalloc");
  }
  const uint32_t first_group = first / 32;
  const uint64_t last_group = (uint64_t{first} + count - 1) / 32;
  const uint64_t threads = (last_group - first_group + 1) * 16;
  const unsigned block = 256;
  const unsigned grid = static_cast<unsigned>((threads + block - 1) / block);
  GaussianKernel<<<grid, block>>>(stream, first_group, first, count, d);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(out, d, count * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return e == cudaSuccess ? Status::Ok() : CudaError(e, "kernel or copy");
}

}  // namespace bitpush::worker::gpu
