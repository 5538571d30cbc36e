// Device memory shared between a training process and its node's bitpush-worker daemon (the
// GPU path, docs/local-ipc.md "GPU tensors"): a training process copies its CUDA
// gradient into a DeviceBuffer it owns and exports that buffer's CUDA IPC handle once; the
// daemon maps the handle (IpcMapping) on the same GPU, found by PCI bus id because the two
// processes may number devices differently (CUDA_VISIBLE_DEVICES), reduces from it and
// broadcasts the result back into it.
//
// Built for real with CUDA (BITPUSH_HAVE_CUDA); otherwise every function returns Unimplemented
// naming why (device_memory_stub.cc), like gpu_reduce.h.
//
// Ownership: DeviceBuffer owns its cudaMalloc'd memory, IpcMapping its mapping (closed on
// destruction); both move-only. Thread-safety: distinct objects from any thread; the calls
// change the calling thread's current device only for their duration.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace bitpush::worker::gpu {

// cudaIpcMemHandle_t's 64 bytes.
struct GpuIpcHandle {
  std::array<uint8_t, 64> bytes{};
};

// The device `ptr` points into; InvalidArgument when it is not CUDA device memory (host
// memory, a null pointer).
StatusOr<int> DeviceOfPointer(const void* ptr);
// "0000:3b:00.0" of `device`, and back (NotFound when this process does not see that GPU).
StatusOr<std::string> DevicePciBusId(int device);
StatusOr<int> DeviceFromPciBusId(const std::string& bus_id);

// Synchronous copy of `bytes` between two device buffers (or device and host: unified
// addressing decides), on `device`'s legacy default stream.
Status CopyDeviceMemory(int device, void* dst, const void* src, size_t bytes);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> Allocate(int device, size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  bool valid() const { return data_ != nullptr; }
  // The CUDA IPC handle another process opens with IpcMapping::Open.
  StatusOr<GpuIpcHandle> ExportIpcHandle() const;

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
};

class IpcMapping {
 public:
  IpcMapping() = default;
  // Maps another process's buffer on `device` (the device that holds it, in this process's
  // numbering).
  static StatusOr<IpcMapping> Open(const GpuIpcHandle& handle, int device);
  IpcMapping(IpcMapping&& other) noexcept;
  IpcMapping& operator=(IpcMapping&& other) noexcept;
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  ~IpcMapping();

  void* data() const { return data_; }
  int device() const { return device_; }

 private:
  void* data_ = nullptr;
  int device_ = -1;
};

}  // namespace bitpush::worker::gpu
