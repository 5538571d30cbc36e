// separate_gaussian.h in a build without CUDA: Unimplemented with the reason CMake recorded
// (BITPUSH_GPU_STUB_REASON, worker/gpu/CMakeLists.txt).
#include <string>

#include "worker/gpu/separate_gaussian.h"

#ifndef BITPUSH_GPU_STUB_REASON
#define BITPUSH_GPU_STUB_REASON "built without CUDA"
#endif

namespace bitpush::worker::gpu {

Status SeparateGaussiansOnDevice(int, uint64_t, uint32_t, size_t, float*) {
  return UnimplementedError(std::string("SeparateGaussiansOnDevice: ") + BITPUSH_GPU_STUB_REASON);
}

}  // namespace bitpush::worker::gpu
