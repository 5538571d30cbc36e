// device_memory.h in a build without CUDA: every entry point returns Unimplemented with the
// reason CMake recorded (BITPUSH_GPU_STUB_REASON, worker/gpu/CMakeLists.txt).
#include <string>
#include <utility>

#include "worker/gpu/device_memory.h"

#ifndef BITPUSH_GPU_STUB_REASON
#define BITPUSH_GPU_STUB_REASON "built without CUDA"
#endif

namespace bitpush::worker::gpu {
namespace {

Status NotBuilt(const char* what) {
  return UnimplementedError(std::string(what) + ": " + BITPUSH_GPU_STUB_REASON);
}

}  // namespace

StatusOr<int> DeviceOfPointer(const void*) {
  return NotBuilt("DeviceOfPointer");
}
StatusOr<std::string> DevicePciBusId(int) {
  return NotBuilt("DevicePciBusId");
}
StatusOr<int> DeviceFromPciBusId(const std::string&) {
  return NotBuilt("DeviceFromPciBusId");
}
Status CopyDeviceMemory(int, void*, const void*, size_t) {
  return NotBuilt("CopyDeviceMemory");
}
StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int, size_t) {
  return NotBuilt("DeviceBuffer::Allocate");
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  device_ = std::exchange(other.device_, -1);
  return *this;
}
// Out of line and not defaulted: the CUDA build's destructor frees device memory, so the
// class must not become trivially destructible in the stub build.
DeviceBuffer::~DeviceBuffer() {}  // NOLINT(modernize-use-equals-default)
StatusOr<GpuIpcHandle> DeviceBuffer::ExportIpcHandle() const {
  return NotBuilt("DeviceBuffer::ExportIpcHandle");
}
StatusOr<IpcMapping> IpcMapping::Open(const GpuIpcHandle&, int) {
  return NotBuilt("IpcMapping::Open");
}
IpcMapping::IpcMapping(IpcMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), device_(std::exchange(other.device_, -1)) {}
IpcMapping& IpcMapping::operator=(IpcMapping&& other) noexcept {
  data_ = std::exchange(other.data_, nullptr);
  device_ = std::exchange(other.device_, -1);
  return *this;
}
// Out of line and not defaulted: the CUDA build's destructor frees device memory, so the
// class must not become trivially destructible in the stub build.
IpcMapping::~IpcMapping() {}  // NOLINT(modernize-use-equals-default)

}  // namespace bitpush::worker::gpu
