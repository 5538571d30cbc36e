// LocalGpuGroupOptions::Validate, shared by the CUDA build and the stub.
#include <string>

#include "worker/gpu/gpu_reduce.h"

namespace bitpush::worker::gpu {

Status LocalGpuGroupOptions::Validate() const {
  if (timeout.count() <= 0) {
    return InvalidArgumentError("LocalGpuGroupOptions.timeout must be > 0 ms (got " +
                                std::to_string(timeout.count()) + ")");
  }
  if (root < 0) {
    return InvalidArgumentError("LocalGpuGroupOptions.root must be >= 0 (got " +
                                std::to_string(root) + ")");
  }
  return Status::Ok();
}

}  // namespace bitpush::worker::gpu
