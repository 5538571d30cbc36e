#include "worker/gpu/device_memory.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <utility>

namespace bitpush::worker::gpu {
namespace {

Status Cuda(const std::string& context, const char* api, cudaError_t e) {
  return InternalError(context + ": " + api + " failed: " + cudaGetErrorName(e) + ": " +
                       cudaGetErrorString(e));
}

// Restores the calling thread's current device on scope exit.
class DeviceScope {
 public:
  DeviceScope() { ok_ = cudaGetDevice(&device_) == cudaSuccess; }
  ~DeviceScope() {
    if (ok_) cudaSetDevice(device_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_ = 0;
  bool ok_ = false;
};

}  // namespace

StatusOr<int> DeviceOfPointer(const void* ptr) {
  if (ptr == nullptr) return InvalidArgumentError("a null pointer is not CUDA device memory");
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of this call
    return Cuda("DeviceOfPointer", "cudaPointerGetAttributes", e);
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return InvalidArgumentError("the pointer is not CUDA device memory (host memory?)");
  }
  return attr.device;
}

StatusOr<std::string> DevicePciBusId(int device) {
  char id[32] = {};
  const cudaError_t e = cudaDeviceGetPCIBusId(id, sizeof(id), device);
  if (e != cudaSuccess) {
    return Cuda("DevicePciBusId(" + std::to_string(device) + ")", "cudaDeviceGetPCIBusId", e);
  }
  return std::string(id);
}

StatusOr<int> DeviceFromPciBusId(const std::string& bus_id) {
  int device = -1;
  const cudaError_t e = cudaDeviceGetByPCIBusId(&device, bus_id.c_str());
  if (e != cudaSuccess) {
    return NotFoundError("no CUDA device with PCI bus id '" + bus_id +
                         "' is visible to this process (" + cudaGetErrorString(e) + ")");
  }
  return device;
}

Status CopyDeviceMemory(int device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  DeviceScope restore;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess) {
    return Cuda("copy of " + std::to_string(bytes) + " bytes on device " + std::to_string(device),
                "cudaMemcpy", e);
  }
  return Status::Ok();
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, size_t bytes) {
  DeviceBuffer b;
  b.device_ = device;
  if (bytes == 0) return b;
  DeviceScope restore;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMalloc(&b.data_, bytes);
  if (e != cudaSuccess) {
    b.data_ = nullptr;
    return Cuda(
        "DeviceBuffer of " + std::to_string(bytes) + " bytes on device " + std::to_string(device),
        "cudaMalloc", e);
  }
  b.size_ = bytes;
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ == nullptr) return;
  DeviceScope restore;
  if (cudaSetDevice(device_) == cudaSuccess) cudaFree(data_);
}

StatusOr<GpuIpcHandle> DeviceBuffer::ExportIpcHandle() const {
  if (data_ == nullptr) return FailedPreconditionError("ExportIpcHandle of an empty DeviceBuffer");
  cudaIpcMemHandle_t h{};
  DeviceScope restore;
  cudaError_t e = cudaSetDevice(device_);
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&h, data_);
  if (e != cudaSuccess) return Cuda("ExportIpcHandle", "cudaIpcGetMemHandle", e);
  GpuIpcHandle out;
  static_assert(sizeof(h) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), &h, sizeof(h));
  return out;
}

StatusOr<IpcMapping> IpcMapping::Open(const GpuIpcHandle& handle, int device) {
  cudaIpcMemHandle_t h{};
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  IpcMapping m;
  DeviceScope restore;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaIpcOpenMemHandle(&m.data_, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    m.data_ = nullptr;
    return Cuda("IpcMapping on device " + std::to_string(device), "cudaIpcOpenMemHandle", e);
  }
  m.device_ = device;
  return m;
}

IpcMapping::IpcMapping(IpcMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), device_(std::exchange(other.device_, -1)) {}

IpcMapping& IpcMapping::operator=(IpcMapping&& other) noexcept {
  if (this != &other) {
    IpcMapping old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

IpcMapping::~IpcMapping() {
  if (data_ == nullptr) return;
  DeviceScope restore;
  if (cudaSetDevice(device_) == cudaSuccess) cudaIpcCloseMemHandle(data_);
}

}  // namespace bitpush::worker::gpu
