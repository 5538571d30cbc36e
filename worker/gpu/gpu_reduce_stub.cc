// gpu_reduce.h in a build without CUDA or NCCL: every entry point returns Unimplemented with
// the reason CMake recorded (BITPUSH_GPU_STUB_REASON, see worker/gpu/CMakeLists.txt), so the
// callers compile and fail with a clear message instead of at link time.
#include <string>

#include "worker/gpu/gpu_reduce.h"

#ifndef BITPUSH_GPU_STUB_REASON
#define BITPUSH_GPU_STUB_REASON "built without CUDA"
#endif

namespace bitpush::worker::gpu {
namespace {

Status NotBuilt(const char* what) {
  return UnimplementedError(std::string(what) + ": " + BITPUSH_GPU_STUB_REASON);
}

}  // namespace

// Never constructed: no factory succeeds. Defined so the unique_ptr member can be destroyed.
struct LocalGpuGroup::Impl {
  LocalGpuGroupOptions options;
  std::vector<int> devices;
};

Status GpuViability() {
  return NotBuilt("GPU path not viable");
}
StatusOr<int> GpuDeviceCount() {
  return NotBuilt("GpuDeviceCount");
}

Status CastFloatToHalf(int, const float*, uint16_t*, size_t, GpuStream) {
  return NotBuilt("CastFloatToHalf");
}
Status CastHalfToFloat(int, const uint16_t*, float*, size_t, GpuStream) {
  return NotBuilt("CastHalfToFloat");
}

StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t) {
  return NotBuilt("PinnedBuffer");
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&&) noexcept {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&&) noexcept {
  return *this;
}
// Out of line and not defaulted: the CUDA build's destructor frees device memory, so the
// class must not become trivially destructible in the stub build.
PinnedBuffer::~PinnedBuffer() {}  // NOLINT(modernize-use-equals-default)

StatusOr<GpuGroupId> LocalGpuGroup::NewGroupId() {
  return NotBuilt("LocalGpuGroup::NewGroupId");
}
StatusOr<std::unique_ptr<LocalGpuGroup>> LocalGpuGroup::CreateForDevices(
    const std::vector<int>&, const LocalGpuGroupOptions&) {
  return NotBuilt("LocalGpuGroup::CreateForDevices");
}
StatusOr<std::unique_ptr<LocalGpuGroup>> LocalGpuGroup::CreateRank(const GpuGroupId&, int, int, int,
                                                                   const LocalGpuGroupOptions&) {
  return NotBuilt("LocalGpuGroup::CreateRank");
}

LocalGpuGroup::LocalGpuGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalGpuGroup::~LocalGpuGroup() = default;
int LocalGpuGroup::nranks() const {
  return 0;
}
int LocalGpuGroup::root() const {
  return impl_->options.root;
}
int LocalGpuGroup::first_rank() const {
  return 0;
}
const std::vector<int>& LocalGpuGroup::devices() const {
  return impl_->devices;
}
int LocalGpuGroup::root_slot() const {
  return -1;
}

Status LocalGpuGroup::ReduceToRoot(Span<uint16_t* const>, size_t) {
  return NotBuilt("LocalGpuGroup::ReduceToRoot");
}
Status LocalGpuGroup::BroadcastFromRoot(Span<uint16_t* const>, size_t) {
  return NotBuilt("LocalGpuGroup::BroadcastFromRoot");
}
Status LocalGpuGroup::AllReduce(Span<uint16_t* const>, size_t) {
  return NotBuilt("LocalGpuGroup::AllReduce");
}
Status LocalGpuGroup::ReduceToHost(Span<const float* const>, size_t, PinnedBuffer*) {
  return NotBuilt("LocalGpuGroup::ReduceToHost");
}
Status LocalGpuGroup::BroadcastFromHost(const PinnedBuffer*, size_t, Span<float* const>) {
  return NotBuilt("LocalGpuGroup::BroadcastFromHost");
}

}  // namespace bitpush::worker::gpu
