#include "worker/daemon/gpu_rounds.h"

#include <fmt/format.h>

#include <utility>

#include "common/cpu_features.h"
#include "common/logging.h"
#include "common/span.h"
#include "common/vector_ops.h"

namespace bitpush::worker {

GpuRounds::GpuRounds(std::string label, std::chrono::milliseconds timeout)
    : label_(std::move(label)), timeout_(timeout) {}

Status GpuRounds::Reduce(const std::vector<GpuContribution>& inputs, const std::string& tensor,
                         uint64_t round, size_t elements, gpu::PinnedBuffer* pinned,
                         float* node_sum, float scale) {
  std::vector<const float*> grads;
  std::vector<int> devices;
  for (const GpuContribution& in : inputs) {
    grads.push_back(in.data);
    devices.push_back(in.device);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!group_) {
      // One NCCL rank per local process, in local-rank order, root = local rank 0's GPU.
      for (size_t i = 0; i < devices.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
          if (devices[i] == devices[j]) {
            return InvalidArgumentError(fmt::format(
                "{}: {} and {} both use GPU {}: the GPU path needs one GPU per training process",
                label_, inputs[j].who, inputs[i].who, devices[i]));
          }
        }
      }
      gpu::LocalGpuGroupOptions go;
      go.timeout = timeout_;
      StatusOr<std::unique_ptr<gpu::LocalGpuGroup>> group =
          gpu::LocalGpuGroup::CreateForDevices(devices, go);
      if (!group.ok()) return group.status().WithContext(label_ + ": NCCL group of the node");
      group_ = std::move(group).value();
      devices_ = devices;
      BP_LOG_INFO("{}: GPU path over {} GPU(s)", label_, devices.size());
    } else if (devices != devices_) {
      return InvalidArgumentError(fmt::format(
          "{}: tensor '{}' round {}: the training processes' GPUs changed since the first GPU "
          "round",
          label_, tensor, round));
    }
    BP_RETURN_IF_ERROR(group_->ReduceToHost(Span<const float* const>(grads.data(), grads.size()),
                                            elements, pinned));
  }
  // The node's fp16 sum -> fp32 x scale for the engine.
  HalfToFloatArray(pinned->halfs(), node_sum, elements, BestIsaLevel());
  if (scale != 1.0f) {
    for (size_t i = 0; i < elements; ++i) node_sum[i] *= scale;
  }
  return Status::Ok();
}

Status GpuRounds::Broadcast(const float* result, size_t elements, gpu::PinnedBuffer* pinned,
                            const std::vector<float*>& outs) {
  FloatToHalfArray(result, pinned->halfs(), elements, BestIsaLevel());
  std::lock_guard<std::mutex> lock(mu_);
  if (!group_) return InternalError(label_ + ": GPU broadcast without a GPU group");
  return group_->BroadcastFromHost(pinned, elements, Span<float* const>(outs.data(), outs.size()));
}

}  // namespace bitpush::worker
