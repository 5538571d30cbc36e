// bitpush-bench gpureduce: the GPU half of the intra-node reduce (worker/gpu/gpu_reduce.h) on
// the GPUs of this machine, against a plain CUDA copy of the same fp32 gradient measured in the
// same run.
//
// Ops (gbps = fp32 bytes of ONE device's gradient / fastest time, which is what a training
// process sees):
//   reduce_to_host       cast fp32->fp16 on every device, NCCL reduce to the root, fp16 copy into
//                        pinned host memory (LocalGpuGroup::ReduceToHost), against
//                        d2h_fp32: cudaMemcpy of the fp32 gradient into pinned host memory;
//   broadcast_from_host  fp16 copy from pinned host memory, NCCL broadcast, fp16->fp32 cast
//                        (LocalGpuGroup::BroadcastFromHost), against h2d_fp32;
//   cast_float_to_half / cast_half_to_float   the cast kernels alone, against d2d_fp32 (a
//                        device-to-device copy of the fp32 gradient).
// ratio_to_baseline = gbps / baseline_gbps. The FP16 cast halves what crosses PCIe/NVLink, so a
// reduce_to_host ratio near 2 means the cast and NCCL cost little next to the copy.
//
// Without a usable GPU (no device, or built without CUDA/NCCL) it prints one record with
// `skipped` naming why (GpuViability()) and succeeds: the CPU path has nothing to measure here.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "worker/gpu/gpu_reduce.h"

#if BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace bitpush::bench {
namespace {

struct Options {
  bool json = false;
  size_t mb = 100;
  size_t devices = 0;  // 0: every visible device
  double min_seconds = 0.5;
};

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench gpureduce [--json] [--mb 100] [--devices N] [--min-time SECONDS]\n"
      "The GPU intra-node reduce (worker/gpu/gpu_reduce.h) of an fp32 gradient of mb MiB per\n"
      "device over N visible GPUs (default: all), against a CUDA copy of the same fp32 bytes in\n"
      "the same run: reduce_to_host vs d2h_fp32, broadcast_from_host vs h2d_fp32, the cast\n"
      "kernels vs d2d_fp32. gbps = fp32 bytes of one device's gradient / best time;\n"
      "ratio_to_baseline = gbps / baseline_gbps. Without a usable GPU: one record whose\n"
      "`skipped` names why.\n");
}

[[noreturn]] void UsageError(const std::string& msg) {
  bench::UsageError("gpureduce", msg);
}

void ParseArgs(int argc, char** argv, Options* o) {
  for (ArgCursor args("gpureduce", argc, argv); args.Next();) {
    const std::string& a = args.flag();
    if (a == "--json") {
      o->json = true;
    } else if (a == "--mb") {
      o->mb = bench::ParsePositive("gpureduce", "--mb", args.Value(), 1 << 15);
    } else if (a == "--devices") {
      o->devices = bench::ParsePositive("gpureduce", "--devices", args.Value(), 64);
    } else if (a == "--min-time") {
      o->min_seconds = ParseSeconds("gpureduce", "--min-time", args.Value());
    } else if (args.IsHelp()) {
      args.Help(PrintHelp);
    } else {
      args.Unknown(PrintHelp);
    }
  }
}

int Skipped(const Options& opt, const std::string& why) {
  if (opt.json) {
    std::fputs(JsonArray({JsonRecord().Add("name", "gpureduce").Add("skipped", why)}).c_str(),
               stdout);
  } else {
    std::printf("gpureduce skipped: %s\n", why.c_str());
  }
  return 0;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "bitpush-bench gpureduce: %s\n", what.c_str());
  return 1;
}

#if BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL

std::string CudaError(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorString(e);
}

// Device memory of one device, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  explicit DeviceBuffer(int device) : device_(device) {}
  ~DeviceBuffer() {
    if (p_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(p_);
    }
  }
  Status Allocate(size_t bytes) {
    cudaSetDevice(device_);
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e != cudaSuccess) return InternalError(CudaError("cudaMalloc", e));
    // Normal-looking values: 1/1024 steps in [-4, 4), no subnormals or NaNs.
    std::vector<float> host(bytes / sizeof(float));
    for (size_t i = 0; i < host.size(); ++i) {
      host[i] = static_cast<float>(static_cast<int>(i % 8192) - 4096) / 1024.0f;
    }
    const cudaError_t c =
        cudaMemcpy(p_, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    return c == cudaSuccess ? Status::Ok() : InternalError(CudaError("cudaMemcpy", c));
  }
  template <typename T>
  T* Get() const {
    return static_cast<T*>(p_);
  }

 private:
  int device_;
  void* p_ = nullptr;
};

int Run(const Options& opt) {
  auto count_or = worker::gpu::GpuDeviceCount();
  if (!count_or.ok()) return Fail(count_or.status().ToString());
  const int visible = *count_or;
  const int ndev = opt.devices == 0 ? visible : static_cast<int>(opt.devices);
  if (ndev > visible) {
    UsageError("--devices " + std::to_string(ndev) + ": only " + std::to_string(visible) +
               " visible");
  }
  const size_t bytes = opt.mb << 20;
  const size_t count = bytes / sizeof(float);
  std::vector<int> devices;
  devices.reserve(ndev);
  for (int d = 0; d < ndev; ++d) devices.push_back(d);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const std::string device_name = prop.name;

  auto group_or = worker::gpu::LocalGpuGroup::CreateForDevices(devices, {});
  if (!group_or.ok()) return Fail(group_or.status().ToString());
  std::unique_ptr<worker::gpu::LocalGpuGroup> group = std::move(group_or).value();

  std::vector<std::unique_ptr<DeviceBuffer>> grads, outs;
  std::vector<const float*> grad_ptrs;
  std::vector<float*> out_ptrs;
  for (int d : devices) {
    grads.push_back(std::make_unique<DeviceBuffer>(d));
    outs.push_back(std::make_unique<DeviceBuffer>(d));
    for (auto* b : {grads.back().get(), outs.back().get()}) {
      const Status s = b->Allocate(bytes);
      if (!s.ok()) return Fail(s.ToString());
    }
    grad_ptrs.push_back(grads.back()->Get<float>());
    out_ptrs.push_back(outs.back()->Get<float>());
  }
  auto half_host = worker::gpu::PinnedBuffer::Allocate(count * 2);
  auto float_host = worker::gpu::PinnedBuffer::Allocate(bytes);
  if (!half_host.ok()) return Fail(half_host.status().ToString());
  if (!float_host.ok()) return Fail(float_host.status().ToString());
  // The cast kernels: fp32 grad 0 -> fp16 in the first half of out 0 -> fp32 in cast_out.
  uint16_t* half_dev = outs[0]->Get<uint16_t>();
  DeviceBuffer cast_out(devices[0]);
  if (const Status s = cast_out.Allocate(bytes); !s.ok()) return Fail(s.ToString());

  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return Fail(CudaError("cudaStreamCreateWithFlags", e));
  }
  Status failure;
  auto check = [&](const Status& s) {
    if (!s.ok() && failure.ok()) failure = s;
  };
  auto cuda = [&](const char* call, cudaError_t e) {
    if (e != cudaSuccess && failure.ok()) failure = InternalError(CudaError(call, e));
  };
  auto copy = [&](void* dst, const void* src, cudaMemcpyKind kind) {
    return [&, dst, src, kind] {
      cuda("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, kind, stream));
      cuda("cudaStreamSynchronize", cudaStreamSynchronize(stream));
    };
  };
  struct Op {
    const char* name;
    const char* baseline;
    std::function<void()> run;
    std::function<void()> base;
  };
  const std::vector<Op> ops = {
      {"reduce_to_host", "d2h_fp32",
       [&] { check(group->ReduceToHost(grad_ptrs, count, &*half_host)); },
       copy(float_host->data(), grad_ptrs[0], cudaMemcpyDeviceToHost)},
      {"broadcast_from_host", "h2d_fp32",
       [&] { check(group->BroadcastFromHost(&*half_host, count, out_ptrs)); },
       copy(out_ptrs[0], float_host->data(), cudaMemcpyHostToDevice)},
      {"cast_float_to_half", "d2d_fp32",
       [&] {
         check(worker::gpu::CastFloatToHalf(0, grad_ptrs[0], half_dev, count, stream));
         cuda("cudaStreamSynchronize", cudaStreamSynchronize(stream));
       },
       copy(out_ptrs[0], grad_ptrs[0], cudaMemcpyDeviceToDevice)},
      {"cast_half_to_float", "d2d_fp32",
       [&] {
         check(worker::gpu::CastHalfToFloat(0, half_dev, cast_out.Get<float>(), count, stream));
         cuda("cudaStreamSynchronize", cudaStreamSynchronize(stream));
       },
       copy(out_ptrs[0], grad_ptrs[0], cudaMemcpyDeviceToDevice)},
  };

  if (!opt.json) {
    std::printf(
        "%s x%d  %zu MiB fp32 per device  gbps = GB/s of one device's fp32 gradient "
        "(best of repeated runs)\n",
        device_name.c_str(), ndev, opt.mb);
    std::printf("%-20s %9s %9s %-9s %9s %9s\n", "op", "GB/s", "ms", "baseline", "GB/s", "ratio");
  }
  std::vector<JsonRecord> records;
  for (const Op& op : ops) {
    const Timing base = TimeIt(op.base, opt.min_seconds, 5);
    const Timing t = TimeIt(op.run, opt.min_seconds, 5);
    if (!failure.ok()) return Fail(std::string(op.name) + ": " + failure.ToString());
    const double gbps = static_cast<double>(bytes) / t.best_seconds / 1e9;
    const double base_gbps = static_cast<double>(bytes) / base.best_seconds / 1e9;
    records.push_back(JsonRecord()
                          .Add("name", "gpureduce")
                          .Add("op", op.name)
                          .Add("mb", opt.mb)
                          .Add("bytes", bytes)
                          .Add("elements", count)
                          .Add("devices", ndev)
                          .Add("device_name", device_name)
                          .Add("seconds", t.best_seconds)
                          .Add("median_seconds", t.median_seconds)
                          .Add("reps", t.reps)
                          .Add("gbps", gbps)
                          .Add("baseline", op.baseline)
                          .Add("baseline_seconds", base.best_seconds)
                          .Add("baseline_gbps", base_gbps)
                          .Add("ratio_to_baseline", gbps / base_gbps));
    if (!opt.json) {
      std::printf("%-20s %9.2f %9.3f %-9s %9.2f %9.2f\n", op.name, gbps, t.best_seconds * 1e3,
                  op.baseline, base_gbps, gbps / base_gbps);
    }
  }
  cudaStreamDestroy(stream);
  if (opt.json) std::fputs(JsonArray(records).c_str(), stdout);
  return 0;
}

#endif  // BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL

}  // namespace

int RunGpuReduceBench(int argc, char** argv) {
  Options opt;
  ParseArgs(argc, argv, &opt);
  const Status viable = worker::gpu::GpuViability();
  if (!viable.ok()) return Skipped(opt, viable.ToString());
#if BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL
  return Run(opt);
#else
  return Skipped(opt, "built without CUDA/NCCL");
#endif
}

}  // namespace bitpush::bench
