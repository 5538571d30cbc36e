// LansStepCuda in a build without CUDA: validates like the real one, then returns
// Unimplemented with the reason CMake recorded (BITPUSH_OPTIMIZERS_CUDA_STUB_REASON, see
// optimizers/CMakeLists.txt), so callers compile and fail with a clear message.
#include <string>

#include "optimizers/lans.h"

#ifndef BITPUSH_OPTIMIZERS_CUDA_STUB_REASON
#define BITPUSH_OPTIMIZERS_CUDA_STUB_REASON "built without CUDA"
#endif

namespace bitpush::optimizers {

Status LansStepCuda(const LansOptions& options, float lr, uint64_t step, float* x, float* m,
                    float* v, const float* grad, size_t n, void* stream) {
  return UnimplementedError(std::string("LansStepCuda: ") + BITPUSH_OPTIMIZERS_CUDA_STUB_REASON);
}

}  // namespace bitpush::optimizers
