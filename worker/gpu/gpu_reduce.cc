// The CUDA + NCCL implementation of gpu_reduce.h (the stub is gpu_reduce_stub.cc).
//
// Every operation runs in phases on the slots' own streams: enqueue CUDA work (casts,
// copies), enqueue the NCCL collective inside one ncclGroupStart/End, wait until the
// non-blocking communicators report the collective enqueued (not ncclInProgress) before
// enqueueing anything that must follow it, then record one event per stream and poll the
// events and ncclCommGetAsyncError until done or the deadline. Any failure after work was
// enqueued aborts the communicators and makes the group's failure sticky: a collective that
// half-ran cannot be resumed, and NCCL requires the same sequence of calls on every rank.
#include "worker/gpu/gpu_reduce.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

namespace bitpush::worker::gpu {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == sizeof(GpuGroupId::bytes), "ncclUniqueId size changed");

// Poll period of the bounded waits: short next to a collective on a multi-MiB tensor.
constexpr auto kPollInterval = std::chrono::microseconds(20);

Status CudaError(const std::string& context, const char* api, cudaError_t e) {
  std::string message =
      context + ": " + api + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
      e == cudaErrorMemoryAllocation) {
    return UnavailableError(std::move(message));
  }
  if (e == cudaErrorInvalidValue || e == cudaErrorInvalidDevice ||
      e == cudaErrorInvalidDevicePointer) {
    return InvalidArgumentError(std::move(message));
  }
  return InternalError(std::move(message));
}

Status NcclError(const std::string& context, const char* api, ncclResult_t r, ncclComm_t comm) {
  std::string message = context + ": " + api + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') message += std::string(" (") + last + ")";
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return InvalidArgumentError(std::move(message));
    case ncclRemoteError:
    case ncclSystemError: return UnavailableError(std::move(message));
    default: return InternalError(std::move(message));
  }
}

// Restores the calling thread's current device on scope exit.
class DeviceRestorer {
 public:
  DeviceRestorer() { ok_ = cudaGetDevice(&device_) == cudaSuccess; }
  ~DeviceRestorer() {
    if (ok_) cudaSetDevice(device_);
  }
  DeviceRestorer(const DeviceRestorer&) = delete;
  DeviceRestorer& operator=(const DeviceRestorer&) = delete;

 private:
  int device_ = 0;
  bool ok_ = false;
};

}  // namespace

Status GpuViability() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {  // typically no driver (cudaErrorInsufficientDriver) or no device
    return UnavailableError(std::string("GPU path not viable: cudaGetDeviceCount failed: ") +
                            cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
  if (n == 0) return UnavailableError("GPU path not viable: the CUDA runtime sees 0 devices");
  return Status::Ok();
}

StatusOr<int> GpuDeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return CudaError("GpuDeviceCount", "cudaGetDeviceCount", e);
  return n;
}

// ---- PinnedBuffer ----

StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  const cudaError_t e = cudaHostAlloc(&b.data_, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    b.data_ = nullptr;
    return CudaError("PinnedBuffer of " + std::to_string(bytes) + " bytes", "cudaHostAlloc", e);
  }
  b.size_ = bytes;
  return b;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    PinnedBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

// ---- LocalGpuGroup ----

struct LocalGpuGroup::Impl {
  struct Slot {
    int rank = 0;
    int device = 0;
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    uint16_t* scratch = nullptr;  // fp16, scratch_count elements, on `device`
    size_t scratch_count = 0;
  };

  LocalGpuGroupOptions options;
  int nranks = 0;
  std::vector<int> devices;
  std::vector<Slot> slots;
  Status failed;  // sticky: set once communicators were aborted

  ~Impl();

  std::string Name(const Slot& s) const {
    return "rank " + std::to_string(s.rank) + " (device " + std::to_string(s.device) + ")";
  }
  int RootSlot() const {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].rank == options.root) return static_cast<int>(i);
    }
    return -1;
  }

  Status Setup(const ncclUniqueId& id);
  Status Fail(const Status& s);
  void AbortAll();
  // Sticky failure, one non-null buffer per slot: checked before anything is enqueued.
  template <typename T>
  Status CheckCall(const char* op, Span<T* const> buffers, size_t count) const;
  Status EnsureScratch(size_t count);
  // Waits until no communicator reports ncclInProgress (a non-blocking call finished).
  Status WaitCommsReady(const char* op, Clock::time_point deadline);
  // Runs call(slot) for every slot inside one NCCL group, then WaitCommsReady.
  template <typename F>
  Status GroupCall(const char* op, const char* api, Clock::time_point deadline, F call);
  // Records an event on every stream and polls them (and NCCL's async errors) until done.
  Status WaitStreams(const char* op, Clock::time_point deadline);
  // Runs a whole operation: a failure of `body` aborts and sticks (see top of file).
  template <typename F>
  Status Run(const char* op, size_t count, F body);
};

Status LocalGpuGroup::Impl::Setup(const ncclUniqueId& id) {
  const Clock::time_point deadline = Clock::now() + options.timeout;
  DeviceRestorer restore;
  for (Slot& s : slots) {
    cudaError_t e = cudaSetDevice(s.device);
    if (e != cudaSuccess) return CudaError(Name(s), "cudaSetDevice", e);
    e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      return CudaError(Name(s), "cudaStreamCreateWithFlags", e);
    }
    e = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      return CudaError(Name(s), "cudaEventCreateWithFlags", e);
    }
  }
  // Non-blocking communicators: ncclCommInitRank(Config) returns at once and initialisation
  // (which waits for the other ranks) is polled against the deadline like everything else.
  Status s =
      GroupCall("creating the communicator", "ncclCommInitRankConfig", deadline, [&](Slot& slot) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        return ncclCommInitRankConfig(&slot.comm, nranks, id, slot.rank, &config);
      });
  if (!s.ok()) return Fail(s);
  return Status::Ok();
}

void LocalGpuGroup::Impl::AbortAll() {
  for (Slot& s : slots) {
    if (s.comm != nullptr) ncclCommAbort(s.comm);
    s.comm = nullptr;
  }
}

Status LocalGpuGroup::Impl::Fail(const Status& s) {
  AbortAll();
  failed = Status(s.code(), s.message() + " (NCCL communicators aborted; this group is unusable)");
  return failed;
}

LocalGpuGroup::Impl::~Impl() {
  DeviceRestorer restore;
  bool live = false;
  for (Slot& s : slots) {
    if (s.comm == nullptr) continue;
    // Non-blocking: returns ncclInProgress; an error shows up in the poll below (-> abort).
    (void)ncclCommFinalize(s.comm);
    live = true;
  }
  if (live) {
    if (WaitCommsReady("finalizing", Clock::now() + options.timeout).ok()) {
      for (Slot& s : slots) {
        if (s.comm != nullptr) ncclCommDestroy(s.comm);
        s.comm = nullptr;
      }
    } else {
      AbortAll();
    }
  }
  for (Slot& s : slots) {
    cudaSetDevice(s.device);
    if (s.scratch != nullptr) cudaFree(s.scratch);
    if (s.done != nullptr) cudaEventDestroy(s.done);
    if (s.stream != nullptr) cudaStreamDestroy(s.stream);
  }
}

template <typename T>
Status LocalGpuGroup::Impl::CheckCall(const char* op, Span<T* const> buffers, size_t count) const {
  const std::string what = std::string("LocalGpuGroup::") + op;
  if (!failed.ok()) return failed.WithContext(what);
  if (buffers.size() != slots.size()) {
    return InvalidArgumentError(what + ": " + std::to_string(buffers.size()) + " buffers for " +
                                std::to_string(slots.size()) + " local device(s)");
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (count > 0 && buffers[i] == nullptr) {
      return InvalidArgumentError(what + ": null buffer for " + Name(slots[i]));
    }
  }
  return Status::Ok();
}

Status LocalGpuGroup::Impl::EnsureScratch(size_t count) {
  DeviceRestorer restore;
  for (Slot& s : slots) {
    if (s.scratch_count >= count) continue;
    cudaError_t e = cudaSetDevice(s.device);
    if (e != cudaSuccess) return CudaError(Name(s), "cudaSetDevice", e);
    if (s.scratch != nullptr) cudaFree(s.scratch);
    s.scratch = nullptr;
    s.scratch_count = 0;
    void* p = nullptr;
    e = cudaMalloc(&p, count * sizeof(uint16_t));
    if (e != cudaSuccess) {
      return CudaError(Name(s) + ": fp16 scratch of " + std::to_string(count) + " elements",
                       "cudaMalloc", e);
    }
    s.scratch = static_cast<uint16_t*>(p);
    s.scratch_count = count;
  }
  return Status::Ok();
}

Status LocalGpuGroup::Impl::WaitCommsReady(const char* op, Clock::time_point deadline) {
  for (;;) {
    const Slot* pending = nullptr;
    for (const Slot& s : slots) {
      if (s.comm == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(s.comm, &state);
      if (r != ncclSuccess)
        return NcclError(Name(s) + ": " + op, "ncclCommGetAsyncError", r, s.comm);
      if (state == ncclInProgress) {
        if (pending == nullptr) pending = &s;
      } else if (state != ncclSuccess) {
        return NcclError(Name(s) + ": " + op, "NCCL (asynchronous error)", state, s.comm);
      }
    }
    if (pending == nullptr) return Status::Ok();
    if (Clock::now() >= deadline) {
      return TimeoutError(Name(*pending) + ": " + op + ": NCCL still in progress after " +
                          std::to_string(options.timeout.count()) +
                          " ms (LocalGpuGroupOptions.timeout); are all ranks calling it?");
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

template <typename F>
Status LocalGpuGroup::Impl::GroupCall(const char* op, const char* api, Clock::time_point deadline,
                                      F call) {
  Status first;
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return NcclError(op, "ncclGroupStart", r, nullptr);
  for (Slot& s : slots) {
    const cudaError_t e = cudaSetDevice(s.device);
    if (e != cudaSuccess) {
      if (first.ok()) first = CudaError(Name(s) + ": " + op, "cudaSetDevice", e);
      continue;
    }
    r = call(s);
    if (r != ncclSuccess && r != ncclInProgress && first.ok()) {
      first = NcclError(Name(s) + ": " + op, api, r, s.comm);
    }
  }
  r = ncclGroupEnd();  // always: the group must be closed even after an error
  if (!first.ok()) return first;
  if (r != ncclSuccess && r != ncclInProgress) return NcclError(op, "ncclGroupEnd", r, nullptr);
  return WaitCommsReady(op, deadline);
}

Status LocalGpuGroup::Impl::WaitStreams(const char* op, Clock::time_point deadline) {
  for (Slot& s : slots) {
    cudaError_t e = cudaSetDevice(s.device);
    if (e == cudaSuccess) e = cudaEventRecord(s.done, s.stream);
    if (e != cudaSuccess) return CudaError(Name(s) + ": " + op, "cudaEventRecord", e);
  }
  std::vector<bool> done(slots.size(), false);
  for (;;) {
    const Slot* pending = nullptr;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (done[i]) continue;
      const Slot& s = slots[i];
      const cudaError_t e = cudaEventQuery(s.done);
      if (e == cudaSuccess) {
        done[i] = true;
        continue;
      }
      if (e != cudaErrorNotReady) return CudaError(Name(s) + ": " + op, "cudaEventQuery", e);
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(s.comm, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        return NcclError(Name(s) + ": " + op, "NCCL (asynchronous error)", state, s.comm);
      }
      if (pending == nullptr) pending = &s;
    }
    if (pending == nullptr) return Status::Ok();
    if (Clock::now() >= deadline) {
      return TimeoutError(Name(*pending) + ": " + op + " not finished on the device after " +
                          std::to_string(options.timeout.count()) +
                          " ms (LocalGpuGroupOptions.timeout)");
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

template <typename F>
Status LocalGpuGroup::Impl::Run(const char* op, size_t count, F body) {
  const Clock::time_point deadline = Clock::now() + options.timeout;
  DeviceRestorer restore;
  Status s = body(deadline);
  if (s.ok()) s = WaitStreams(op, deadline);
  if (s.ok()) return s;
  return Fail(s.WithContext(std::string("LocalGpuGroup::") + op + " of " + std::to_string(count) +
                            " elements"));
}

LocalGpuGroup::LocalGpuGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalGpuGroup::~LocalGpuGroup() = default;

int LocalGpuGroup::nranks() const {
  return impl_->nranks;
}
int LocalGpuGroup::root() const {
  return impl_->options.root;
}
int LocalGpuGroup::first_rank() const {
  return impl_->slots.front().rank;
}
const std::vector<int>& LocalGpuGroup::devices() const {
  return impl_->devices;
}
int LocalGpuGroup::root_slot() const {
  return impl_->RootSlot();
}

namespace {

// Checks options and devices shared by both constructors.
Status CheckGroupArgs(const std::vector<int>& devices, int nranks,
                      const LocalGpuGroupOptions& options) {
  BP_RETURN_IF_ERROR(options.Validate());
  if (options.root >= nranks) {
    return InvalidArgumentError("LocalGpuGroup: root " + std::to_string(options.root) +
                                " is not a rank of a group of " + std::to_string(nranks));
  }
  BP_ASSIGN_OR_RETURN(const int count, GpuDeviceCount());
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= count) {
      return InvalidArgumentError("LocalGpuGroup: device " + std::to_string(devices[i]) +
                                  " does not exist (" + std::to_string(count) +
                                  " CUDA device(s) visible)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return InvalidArgumentError("LocalGpuGroup: device " + std::to_string(devices[i]) +
                                    " listed twice (NCCL needs one rank per device)");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<GpuGroupId> LocalGpuGroup::NewGroupId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    return NcclError("LocalGpuGroup::NewGroupId", "ncclGetUniqueId", r, nullptr);
  GpuGroupId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

StatusOr<std::unique_ptr<LocalGpuGroup>> LocalGpuGroup::CreateForDevices(
    const std::vector<int>& devices, const LocalGpuGroupOptions& options) {
  if (devices.empty()) return InvalidArgumentError("LocalGpuGroup: no devices");
  const int nranks = static_cast<int>(devices.size());
  BP_RETURN_IF_ERROR(CheckGroupArgs(devices, nranks, options));
  BP_ASSIGN_OR_RETURN(const GpuGroupId id, NewGroupId());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->nranks = nranks;
  impl->devices = devices;
  for (int i = 0; i < nranks; ++i) impl->slots.push_back({i, devices[i]});
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.bytes.data(), sizeof(nccl_id));
  BP_RETURN_IF_ERROR(impl->Setup(nccl_id));
  return std::unique_ptr<LocalGpuGroup>(new LocalGpuGroup(std::move(impl)));
}

StatusOr<std::unique_ptr<LocalGpuGroup>> LocalGpuGroup::CreateRank(
    const GpuGroupId& id, int nranks, int rank, int device, const LocalGpuGroupOptions& options) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return InvalidArgumentError("LocalGpuGroup: rank " + std::to_string(rank) + " of a group of " +
                                std::to_string(nranks));
  }
  BP_RETURN_IF_ERROR(CheckGroupArgs({device}, nranks, options));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->nranks = nranks;
  impl->devices = {device};
  impl->slots.push_back({rank, device});
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.bytes.data(), sizeof(nccl_id));
  BP_RETURN_IF_ERROR(impl->Setup(nccl_id));
  return std::unique_ptr<LocalGpuGroup>(new LocalGpuGroup(std::move(impl)));
}

Status LocalGpuGroup::ReduceToRoot(Span<uint16_t* const> buffers, size_t count) {
  BP_RETURN_IF_ERROR(impl_->CheckCall("ReduceToRoot", buffers, count));
  if (count == 0) return Status::Ok();
  Impl& g = *impl_;
  return g.Run("ReduceToRoot", count, [&](Clock::time_point deadline) {
    size_t i = 0;
    return g.GroupCall("ReduceToRoot", "ncclReduce", deadline, [&](Impl::Slot& s) {
      uint16_t* b = buffers[i++];
      return ncclReduce(b, b, count, ncclFloat16, ncclSum, g.options.root, s.comm, s.stream);
    });
  });
}

Status LocalGpuGroup::BroadcastFromRoot(Span<uint16_t* const> buffers, size_t count) {
  BP_RETURN_IF_ERROR(impl_->CheckCall("BroadcastFromRoot", buffers, count));
  if (count == 0) return Status::Ok();
  Impl& g = *impl_;
  return g.Run("BroadcastFromRoot", count, [&](Clock::time_point deadline) {
    size_t i = 0;
    return g.GroupCall("BroadcastFromRoot", "ncclBroadcast", deadline, [&](Impl::Slot& s) {
      uint16_t* b = buffers[i++];
      return ncclBroadcast(b, b, count, ncclFloat16, g.options.root, s.comm, s.stream);
    });
  });
}

Status LocalGpuGroup::AllReduce(Span<uint16_t* const> buffers, size_t count) {
  BP_RETURN_IF_ERROR(impl_->CheckCall("AllReduce", buffers, count));
  if (count == 0) return Status::Ok();
  Impl& g = *impl_;
  return g.Run("AllReduce", count, [&](Clock::time_point deadline) {
    size_t i = 0;
    return g.GroupCall("AllReduce", "ncclAllReduce", deadline, [&](Impl::Slot& s) {
      uint16_t* b = buffers[i++];
      return ncclAllReduce(b, b, count, ncclFloat16, ncclSum, s.comm, s.stream);
    });
  });
}

Status LocalGpuGroup::ReduceToHost(Span<const float* const> grads, size_t count,
                                   PinnedBuffer* host) {
  BP_RETURN_IF_ERROR(impl_->CheckCall("ReduceToHost", grads, count));
  Impl& g = *impl_;
  const int root_slot = g.RootSlot();
  if (root_slot >= 0 && (host == nullptr || host->size() < count * sizeof(uint16_t))) {
    return InvalidArgumentError("LocalGpuGroup::ReduceToHost: the root's host buffer holds " +
                                std::to_string(host == nullptr ? 0 : host->size()) + " bytes, " +
                                std::to_string(count * sizeof(uint16_t)) + " needed");
  }
  if (count == 0) return Status::Ok();
  BP_RETURN_IF_ERROR(g.EnsureScratch(count));
  return g.Run("ReduceToHost", count, [&](Clock::time_point deadline) -> Status {
    for (size_t i = 0; i < g.slots.size(); ++i) {
      const Impl::Slot& s = g.slots[i];
      BP_RETURN_IF_ERROR(
          CastFloatToHalf(s.device, grads[i], s.scratch, count, s.stream).WithContext(g.Name(s)));
    }
    BP_RETURN_IF_ERROR(g.GroupCall("ReduceToHost", "ncclReduce", deadline, [&](Impl::Slot& s) {
      return ncclReduce(s.scratch, s.scratch, count, ncclFloat16, ncclSum, g.options.root, s.comm,
                        s.stream);
    }));
    if (root_slot < 0) return Status::Ok();
    const Impl::Slot& r = g.slots[root_slot];
    cudaError_t e = cudaSetDevice(r.device);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(host->data(), r.scratch, count * sizeof(uint16_t), cudaMemcpyDeviceToHost,
                          r.stream);
    }
    if (e != cudaSuccess) return CudaError(g.Name(r), "cudaMemcpyAsync (device to host)", e);
    return Status::Ok();
  });
}

Status LocalGpuGroup::BroadcastFromHost(const PinnedBuffer* host, size_t count,
                                        Span<float* const> out) {
  BP_RETURN_IF_ERROR(impl_->CheckCall("BroadcastFromHost", out, count));
  Impl& g = *impl_;
  const int root_slot = g.RootSlot();
  if (root_slot >= 0 && (host == nullptr || host->size() < count * sizeof(uint16_t))) {
    return InvalidArgumentError("LocalGpuGroup::BroadcastFromHost: the root's host buffer holds " +
                                std::to_string(host == nullptr ? 0 : host->size()) + " bytes, " +
                                std::to_string(count * sizeof(uint16_t)) + " needed");
  }
  if (count == 0) return Status::Ok();
  BP_RETURN_IF_ERROR(g.EnsureScratch(count));
  return g.Run("BroadcastFromHost", count, [&](Clock::time_point deadline) -> Status {
    if (root_slot >= 0) {
      const Impl::Slot& r = g.slots[root_slot];
      cudaError_t e = cudaSetDevice(r.device);
      if (e == cudaSuccess) {
        e = cudaMemcpyAsync(r.scratch, host->data(), count * sizeof(uint16_t),
                            cudaMemcpyHostToDevice, r.stream);
      }
      if (e != cudaSuccess) return CudaError(g.Name(r), "cudaMemcpyAsync (host to device)", e);
    }
    BP_RETURN_IF_ERROR(
        g.GroupCall("BroadcastFromHost", "ncclBroadcast", deadline, [&](Impl::Slot& s) {
          return ncclBroadcast(s.scratch, s.scratch, count, ncclFloat16, g.options.root, s.comm,
                               s.stream);
        }));
    for (size_t i = 0; i < g.slots.size(); ++i) {
      const Impl::Slot& s = g.slots[i];
      BP_RETURN_IF_ERROR(
          CastHalfToFloat(s.device, s.scratch, out[i], count, s.stream).WithContext(g.Name(s)));
    }
    return Status::Ok();
  });
}

}  // namespace bitpush::worker::gpu
