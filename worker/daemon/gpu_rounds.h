// GpuRounds: the worker daemon's GPU path for CUDA tensors (docs/local-ipc.md "GPU tensors").
// Before the push (round thread): the node's processes' fp32 gradients, each in its own GPU's
// staging buffer (mapped through CUDA IPC), are cast to FP16 and summed by NCCL onto local rank
// 0's GPU, copied to page-locked host memory, and widened to fp32 x scale into the node buffer
// the engine pushes. After the pull (completion thread): the node's result goes back as FP16 to
// the root GPU, an NCCL broadcast, and a cast back into every process's staging buffer.
//
// One NCCL group over the node's GPUs (local-rank order) is created at the first GPU round;
// every later round must use the same GPUs, one per process.
//
// Ownership: one per Daemon. Thread-safety: Reduce and Broadcast from any thread; one mutex
// serialises the group's collectives (the round thread's reduces and the completion threads'
// broadcasts).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/gpu/gpu_reduce.h"

namespace bitpush::worker {

// One training process's staging buffer of a round.
struct GpuContribution {
  const float* data = nullptr;  // its GPU buffer (mapped in the daemon)
  int device = -1;              // the GPU that holds it, in the daemon's numbering
  std::string who;              // "local rank 1 (pid 4711)"
};

class GpuRounds {
 public:
  // `timeout` bounds the NCCL group's collectives (the daemon's gathering bound).
  GpuRounds(std::string label, std::chrono::milliseconds timeout);

  // The node's sum of `inputs` (one per process, local-rank order) of tensor `tensor` round
  // `round`: FP16 + NCCL into `pinned`, then fp32 x `scale` into `node_sum` (`elements`).
  Status Reduce(const std::vector<GpuContribution>& inputs, const std::string& tensor,
                uint64_t round, size_t elements, gpu::PinnedBuffer* pinned, float* node_sum,
                float scale);

  // `result` (fp32, `elements`) into every process's buffer `outs` through `pinned`.
  Status Broadcast(const float* result, size_t elements, gpu::PinnedBuffer* pinned,
                   const std::vector<float*>& outs);

 private:
  const std::string label_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::unique_ptr<gpu::LocalGpuGroup> group_;  // guarded by mu_
  std::vector<int> devices_;                   // guarded by mu_
};

}  // namespace bitpush::worker
