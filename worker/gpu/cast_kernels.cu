// fp32 <-> fp16 cast kernels of the GPU path (declared in gpu_reduce.h), bit for bit
// common/half.h. Finite values and infinities go through the hardware conversion
// (cvt.rn.f16.f32 / cvt.f32.f16: round-to-nearest-even, subnormals kept, overflow to inf),
// which is exactly half.h's arithmetic; NaNs are handled here because the hardware returns a
// canonical NaN while half.h (like F16C) keeps the sign and the top payload bits.
//
// Thread-safety: stateless; launches are safe from any thread.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "worker/gpu/gpu_reduce.h"

namespace bitpush::worker::gpu {
namespace {

__host__ __device__ inline uint16_t FloatToHalfBits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN: quiet it, keep sign and the top 9 payload bits
    return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7E00u | ((a >> 13) & 0x1FFu));
  }
  const __half_raw r = __float2half_rn(f);
  return r.x;
}

__host__ __device__ inline float HalfToFloatBits(uint16_t h) {
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0) {  // NaN: quiet it, keep the payload
    const uint32_t x = (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7FC00000u |
                       (static_cast<uint32_t>(h & 0x03FFu) << 13);
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
  }
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}

__global__ void FloatToHalfKernel(const float* __restrict__ src, uint16_t* __restrict__ dst,
                                  size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = FloatToHalfBits(src[i]);
  }
}

__global__ void HalfToFloatKernel(const uint16_t* __restrict__ src, float* __restrict__ dst,
                                  size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = HalfToFloatBits(src[i]);
  }
}

constexpr unsigned kThreads = 256;
// Enough blocks to fill any current GPU several times; the grid-stride loop does the rest.
constexpr size_t kMaxBlocks = 4096;

unsigned BlocksFor(size_t count) {
  return static_cast<unsigned>(std::min(kMaxBlocks, (count + kThreads - 1) / kThreads));
}

Status CudaStatus(const char* what, int device, cudaError_t e) {
  return InternalError(std::string(what) + " on device " + std::to_string(device) + ": " +
                       cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Launches kernel(src, dst, count) on `device`/`stream`, restoring the current device.
template <typename Src, typename Dst>
Status Launch(const char* what, void (*kernel)(const Src*, Dst*, size_t), int device,
              const Src* src, Dst* dst, size_t count, GpuStream stream) {
  if (count == 0) return Status::Ok();
  if (src == nullptr || dst == nullptr) {
    return InvalidArgumentError(std::string(what) + ": null buffer with count " +
                                std::to_string(count));
  }
  int previous = 0;
  cudaError_t e = cudaGetDevice(&previous);
  if (e != cudaSuccess) return CudaStatus("cudaGetDevice", device, e);
  if ((e = cudaSetDevice(device)) != cudaSuccess) return CudaStatus("cudaSetDevice", device, e);
  kernel<<<BlocksFor(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, count);
  e = cudaGetLastError();
  cudaSetDevice(previous);
  if (e != cudaSuccess) return CudaStatus(what, device, e);
  return Status::Ok();
}

}  // namespace

Status CastFloatToHalf(int device, const float* src, uint16_t* dst, size_t count,
                       GpuStream stream) {
  return Launch("CastFloatToHalf kernel launch", FloatToHalfKernel, device, src, dst, count,
                stream);
}

Status CastHalfToFloat(int device, const uint16_t* src, float* dst, size_t count,
                       GpuStream stream) {
  return Launch("CastHalfToFloat kernel launch", HalfToFloatKernel, device, src, dst, count,
                stream);
}

namespace internal {
uint16_t KernelFloatToHalfOnHost(float f) {
  return FloatToHalfBits(f);
}
float KernelHalfToFloatOnHost(uint16_t h) {
  return HalfToFloatBits(h);
}
}  // namespace internal

}  // namespace bitpush::worker::gpu
