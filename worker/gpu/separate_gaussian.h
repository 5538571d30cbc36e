// SEPARATE's common Gaussian stream on a GPU (compressors/separate/gaussian.h has the
// definition): the same values, bit for bit, as the CPU kernels (compressors::separate::
// FillGaussians), computed by a CUDA kernel from the one shared element function
// (compressors/separate/gaussian_pair.h, compiled with nvcc --fmad=false). Workers that
// project on the GPU draw the projection matrices from it; every worker, CPU or GPU, then
// projects onto the same directions.
//
// Built for real where CUDA is (bitpush_gpu, worker/gpu/CMakeLists.txt); otherwise the call
// returns Unimplemented with the build's reason. Check GpuViability() (gpu_reduce.h) first.
//
// Thread-safety: any thread; each call uses its own device buffer and the default stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace bitpush::worker::gpu {

// out[k] = the value at position first + k of Gaussian stream `stream`, k < count, computed on
// `device` and copied to the host buffer `out` (count floats). first + count <= 2^32.
// InvalidArgument for a range past 2^32; Unavailable naming the CUDA error otherwise.
Status SeparateGaussiansOnDevice(int device, uint64_t stream, uint32_t first, size_t count,
                                 float* out);

}  // namespace bitpush::worker::gpu
