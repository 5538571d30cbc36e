// The GPU half of the intra-node reduce: the building blocks the worker daemon uses
// on a node whose training processes each drive one GPU.
//
// Pipeline (paper 001 §4.2: on GPUs the intra-node "compression" is the FP16 cast):
//   push: every device casts its fp32 gradient to fp16 (a CUDA kernel), NCCL reduces (sum, in
//         fp16) to the root device, the root copies the sum into pinned host memory, where the
//         CPU compression pipeline takes it (LocalGpuGroup::ReduceToHost);
//   pull: the root copies the aggregate from pinned host memory to the device, NCCL broadcasts
//         it, and every device casts fp16 back to fp32 (LocalGpuGroup::BroadcastFromHost).
//
// Built only when CUDA and NCCL are (BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL in
// bitpush/config.h, see cmake/BitpushCuda.cmake); otherwise the same API is compiled as stubs
// that return Unimplemented naming why, so CPU-only builds and their callers compile unchanged.
// GpuViability() is the one check callers (and tests, to skip) use before anything else.
//
// Waits are never unbounded: communicators are non-blocking, and every operation polls CUDA
// events and ncclCommGetAsyncError against a deadline (LocalGpuGroupOptions::timeout). An
// expired deadline or an asynchronous NCCL error aborts the group's communicators
// (ncclCommAbort) and fails the group for good; the Status names the operation, rank and
// device. CUDA/NCCL errors become a Status carrying the API name and the library's message.
//
// Ownership: a LocalGpuGroup owns its NCCL communicators, one CUDA stream, one event and one
// fp16 scratch buffer per local device; PinnedBuffer owns page-locked host memory. Callers own
// every device buffer they pass in; it must be resident on the slot's device.
//
// Thread-safety: GpuViability, GpuDeviceCount and the casts are safe from any thread. A
// LocalGpuGroup and a PinnedBuffer are used by one thread at a time (the daemon's reduce
// thread). Calls change the calling thread's current CUDA device only for their duration.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bitpush/config.h"
#include "common/span.h"
#include "common/status.h"

namespace bitpush::worker::gpu {

// True when this build carries the real implementation (CUDA and NCCL found at configure).
inline constexpr bool kGpuBuiltIn = BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL;

// OK when the CUDA runtime sees at least one device and NCCL is built in. Otherwise
// Unimplemented (built without CUDA/NCCL) or Unavailable (driver missing or too old, no
// device: the cudaGetDeviceCount error), with the reason in the message.
Status GpuViability();

// Number of CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applies).
StatusOr<int> GpuDeviceCount();

// A cudaStream_t, kept opaque so this header needs no CUDA headers. nullptr: the legacy
// default stream of `device`.
using GpuStream = void*;

// Element-wise casts of `count` elements between device buffers on `device`, enqueued on
// `stream` (asynchronous: returns once launched; synchronise through the stream). Bit for bit
// common/half.h's FloatToHalf / HalfToFloat: round-to-nearest-even, overflow to ±inf,
// subnormals kept, NaN quieted with sign and top payload bits kept. src and dst must not
// overlap. Errors: InvalidArgument for null buffers with count > 0; CUDA launch errors.
Status CastFloatToHalf(int device, const float* src, uint16_t* dst, size_t count, GpuStream stream);
Status CastHalfToFloat(int device, const uint16_t* src, float* dst, size_t count, GpuStream stream);

// Page-locked (pinned, portable to every device) host memory: what device<->host copies need
// to run asynchronously at full speed. Move-only; freed on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  uint16_t* halfs() const { return static_cast<uint16_t*>(data_); }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// The NCCL unique id of a multi-process group (ncclUniqueId's 128 bytes), created by one rank
// (LocalGpuGroup::NewGroupId) and handed to the others by the caller (the daemon: local IPC).
struct GpuGroupId {
  std::array<uint8_t, 128> bytes{};
};

struct LocalGpuGroupOptions {
  // NCCL rank that receives the reduce and sources the broadcast (0 <= root < nranks).
  int root = 0;
  // Bound on every wait: communicator creation, each operation (from its call to its
  // completion on this object's devices), teardown. Expired: Timeout, communicators aborted,
  // the group unusable. Must be > 0.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};

  Status Validate() const;
};

// The GPUs of one node as the ranks of one NCCL communicator. An object holds one or more
// "local slots": slot i is NCCL rank first_rank() + i on device devices()[i]. Every operation
// takes one buffer per local slot (resident on that slot's device) and returns once it has
// completed on all of this object's devices, or the deadline expired. Operations are
// collective: every rank of the group must call the same ones in the same order with the
// same count.
class LocalGpuGroup {
 public:
  // (a) One process owning every rank: rank i on devices[i] (distinct devices). The
  //     single-process form of ncclCommInitAll, built with non-blocking communicators so
  //     creation is bounded too.
  static StatusOr<std::unique_ptr<LocalGpuGroup>> CreateForDevices(
      const std::vector<int>& devices, const LocalGpuGroupOptions& options);

  // (b) One rank per process: this process is `rank` of `nranks` on `device`
  //     (ncclCommInitRank); every rank passes the same id. Returns once all ranks joined, or
  //     Timeout after options.timeout.
  static StatusOr<GpuGroupId> NewGroupId();
  static StatusOr<std::unique_ptr<LocalGpuGroup>> CreateRank(const GpuGroupId& id, int nranks,
                                                             int rank, int device,
                                                             const LocalGpuGroupOptions& options);

  LocalGpuGroup(const LocalGpuGroup&) = delete;
  LocalGpuGroup& operator=(const LocalGpuGroup&) = delete;
  // Finalizes the communicators (bounded by options.timeout; aborted when that expires) and
  // frees streams, events and scratch memory.
  ~LocalGpuGroup();

  int nranks() const;
  int root() const;
  int first_rank() const;
  const std::vector<int>& devices() const;
  // Slot of the root rank in this object, or -1 when another process holds it.
  int root_slot() const;

  // Collectives on fp16 device buffers, in place, `count` elements each, one buffer per slot.
  // Sum in fp16 arithmetic (NCCL's ncclFloat16 ncclSum). ReduceToRoot: the root's buffer gets
  // the sum (the others' are left as they were). BroadcastFromRoot: every buffer gets the
  // root's. AllReduce: every buffer gets the sum.
  Status ReduceToRoot(Span<uint16_t* const> buffers, size_t count);
  Status BroadcastFromRoot(Span<uint16_t* const> buffers, size_t count);
  Status AllReduce(Span<uint16_t* const> buffers, size_t count);

  // Push half: casts each slot's fp32 `grads` to fp16 (in the slot's scratch), reduces to the
  // root and, on the process holding the root, copies the fp16 sum into `host` (>= 2 * count
  // bytes; ignored, may be null, elsewhere). The callers' fp32 buffers are not modified.
  Status ReduceToHost(Span<const float* const> grads, size_t count, PinnedBuffer* host);
  // Pull half: on the root's process copies `count` fp16 values from `host` to the root,
  // broadcasts them and casts them to fp32 into every slot's `out` (host ignored elsewhere).
  Status BroadcastFromHost(const PinnedBuffer* host, size_t count, Span<float* const> out);

 private:
  struct Impl;  // gpu_reduce.cc (the stub build never creates one)
  explicit LocalGpuGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace internal {
// The per-element conversions of the cast kernels, compiled for the host from the same
// __host__ __device__ source: lets a machine without a GPU check the NaN handling and the
// rounding the kernels rely on. Only in builds with CUDA (kGpuBuiltIn).
uint16_t KernelFloatToHalfOnHost(float f);
float KernelHalfToFloatOnHost(uint16_t h);
}  // namespace internal

}  // namespace bitpush::worker::gpu
