// bitpush-bench localreduce: throughput of the worker daemon's intra-node reduce
// (worker/local_reduce.h) of P processes' tensors held in POSIX shared memory, against memcpy of
// one tensor measured in the same run with the same threads.
//
// gbps = bytes of ONE process's tensor (mb MiB of the chosen dtype) / fastest reduce time: the
// rate at which the node's gradient of that size is reduced, which is what a training process
// sees. The memory traffic behind it is (P + 1) times that (P sources read, one result written).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/half.h"
#include "worker/local_reduce.h"

namespace bitpush::bench {
namespace {

struct Options {
  bool json = false;
  std::vector<size_t> procs = {2, 4};
  size_t mb = 64;
  uint32_t threads = 1;
  DType dtype = DType::kFloat32;
  IsaLevel isa = BestIsaLevel();
  double min_seconds = 0.3;
  bool non_temporal = true;  // LocalReduceOptions::non_temporal_min_bytes as defaulted
};

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench localreduce [--json] [--procs 2,4] [--mb 64] [--threads 1]\n"
      "                                 [--dtype float32|float16|bfloat16] [--isa auto]\n"
      "                                 [--min-time SECONDS] [--no-nt]\n"
      "Sums P source tensors of mb MiB each (one per simulated training process, each in its\n"
      "own POSIX shared-memory segment) into a result segment, as the worker daemon does, and\n"
      "copies one tensor with memcpy in the same run (the same threads and chunks).\n"
      "gbps = bytes of one process's tensor / best time; ratio_to_memcpy = gbps / memcpy_gbps.\n"
      "--no-nt: never use non-temporal stores (default: the reducer's default threshold).\n");
}

[[noreturn]] void UsageError(const std::string& msg) {
  bench::UsageError("localreduce", msg);
}

size_t ParsePositive(const std::string& flag, const std::string& text, size_t max) {
  return bench::ParsePositive("localreduce", flag, text, max);
}

void ParseArgs(int argc, char** argv, Options* o) {
  for (ArgCursor args("localreduce", argc, argv); args.Next();) {
    const std::string& a = args.flag();
    if (a == "--json") {
      o->json = true;
    } else if (a == "--procs") {
      o->procs.clear();
      const std::string list = args.Value();
      size_t pos = 0;
      for (;;) {
        const size_t comma = list.find(',', pos);
        o->procs.push_back(ParsePositive("--procs", list.substr(pos, comma - pos), 64));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (a == "--mb") {
      o->mb = ParsePositive("--mb", args.Value(), 1 << 16);
    } else if (a == "--threads") {
      o->threads = static_cast<uint32_t>(ParsePositive("--threads", args.Value(), 256));
    } else if (a == "--dtype") {
      const std::string name = args.Value();
      auto d = ParseDType(name);
      if (!d.ok()) UsageError("--dtype: " + d.status().message());
      o->dtype = *d;
    } else if (a == "--isa") {
      auto isa = ParseIsaLevel(args.Value());
      if (!isa.ok()) UsageError(isa.status().message());
      o->isa = *isa;
    } else if (a == "--min-time") {
      o->min_seconds = ParseSeconds("localreduce", "--min-time", args.Value());
    } else if (a == "--no-nt") {
      o->non_temporal = false;
    } else if (args.IsHelp()) {
      args.Help(PrintHelp);
    } else {
      args.Unknown(PrintHelp);
    }
  }
}

// A POSIX shared-memory segment as a training process would hand to the daemon: created,
// mapped, and unlinked at once (nothing is left in /dev/shm, whatever happens next).
class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Status Create(size_t bytes, int index) {
    const std::string name =
        "/bitpush-bench-lr-" + std::to_string(getpid()) + "-" + std::to_string(index);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return InternalError("shm_open " + name + ": " + std::strerror(errno));
    shm_unlink(name.c_str());
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      close(fd);
      return InternalError("ftruncate " + name + ": " + std::strerror(err));
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) return InternalError("mmap " + name + ": " + std::strerror(err));
    data_ = p;
    bytes_ = bytes;
    return Status::Ok();
  }
  void* Data() const { return data_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Normal(0, 1) values in `dtype`: a 64 Ki-element random block repeated (the kernels' speed
// does not depend on the values; no subnormals or NaNs). Writing every page also faults the
// segment in before anything is timed.
void FillSource(void* data, size_t count, DType dtype, uint64_t seed) {
  constexpr size_t kBlock = 65536;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t esize = DTypeSize(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < std::min(count, kBlock); ++i) {
    const float v = dist(rng);
    uint32_t bits = FloatBits(v);
    if (dtype == DType::kFloat16) bits = FloatToHalf(v);
    if (dtype == DType::kBFloat16) bits = FloatToBf16(v);
    std::memcpy(bytes + i * esize, &bits, esize);
  }
  for (size_t i = kBlock; i < count; i += kBlock) {
    std::memcpy(bytes + i * esize, bytes, std::min(kBlock, count - i) * esize);
  }
}

}  // namespace

int RunLocalReduceBench(int argc, char** argv) {
  Options opt;
  ParseArgs(argc, argv, &opt);
  const Status isa_ok = CheckIsaSupported(opt.isa);
  if (!isa_ok.ok()) UsageError(isa_ok.message());

  worker::LocalReduceOptions ro;
  ro.threads = opt.threads;
  ro.isa = opt.isa;
  if (!opt.non_temporal) ro.non_temporal_min_bytes = 0;
  auto created = worker::LocalReducer::Create(ro);
  if (!created.ok()) {
    std::fprintf(stderr, "bitpush-bench localreduce: %s\n", created.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<worker::LocalReducer> reducer = std::move(created).value();

  const size_t bytes = opt.mb << 20;
  const bool streaming = ro.non_temporal_min_bytes > 0 && bytes >= ro.non_temporal_min_bytes;
  const size_t esize = DTypeSize(opt.dtype);
  const size_t count = bytes / esize;
  size_t max_procs = 0;
  for (size_t p : opt.procs) max_procs = std::max(max_procs, p);
  // Segments 0..max_procs-1 are the processes' tensors; the last one holds the result.
  std::vector<std::unique_ptr<ShmSegment>> segs;
  for (size_t s = 0; s <= max_procs; ++s) {
    segs.push_back(std::make_unique<ShmSegment>());
    const Status st = segs.back()->Create(bytes, static_cast<int>(s));
    if (!st.ok()) {
      std::fprintf(stderr, "bitpush-bench localreduce: %s\n", st.ToString().c_str());
      return 1;
    }
    if (s < max_procs) {
      FillSource(segs.back()->Data(), count, opt.dtype, 1000 + s);
    } else {
      std::memset(segs.back()->Data(), 0, bytes);
    }
  }
  void* dst = segs.back()->Data();
  const int min_reps = 5;

  const Timing mem = TimeIt([&] { reducer->ParallelCopy(segs[0]->Data(), dst, bytes); },
                            opt.min_seconds, min_reps);
  const double memcpy_gbps = static_cast<double>(bytes) / mem.best_seconds / 1e9;

  const std::string dtype_name(DTypeName(opt.dtype));
  const std::string isa_name(IsaLevelName(opt.isa));
  if (!opt.json) {
    std::printf(
        "isa=%s  threads=%u  dtype=%s  non_temporal=%d  %zu MiB per process in POSIX shm  "
        "gbps = GB/s of one process's tensor (best of repeated runs)\n",
        isa_name.c_str(), opt.threads, dtype_name.c_str(), streaming ? 1 : 0, opt.mb);
    std::printf("memcpy %9.2f GB/s\n", memcpy_gbps);
    std::printf("%6s %9s %9s %9s\n", "procs", "GB/s", "x memcpy", "ms");
  }
  std::vector<JsonRecord> records;
  for (size_t procs : opt.procs) {
    std::vector<const void*> srcs;
    srcs.reserve(procs);
    for (size_t p = 0; p < procs; ++p) srcs.push_back(segs[p]->Data());
    Status failure;
    const Timing t = TimeIt(
        [&] {
          Status s = reducer->Reduce(opt.dtype, srcs.data(), procs, dst, count);
          if (!s.ok()) failure = s;
        },
        opt.min_seconds, min_reps);
    if (!failure.ok()) {
      std::fprintf(stderr, "bitpush-bench localreduce: %s\n", failure.ToString().c_str());
      return 1;
    }
    const double gbps = static_cast<double>(bytes) / t.best_seconds / 1e9;
    records.push_back(JsonRecord()
                          .Add("name", "localreduce")
                          .Add("procs", procs)
                          .Add("mb", opt.mb)
                          .Add("bytes", bytes)
                          .Add("elements", count)
                          .Add("dtype", dtype_name)
                          .Add("threads", static_cast<int>(opt.threads))
                          .Add("isa", isa_name)
                          .Add("shm", "posix")
                          .Add("non_temporal", streaming ? 1 : 0)
                          .Add("seconds", t.best_seconds)
                          .Add("median_seconds", t.median_seconds)
                          .Add("reps", t.reps)
                          .Add("gbps", gbps)
                          .Add("memory_traffic_gbps", gbps * static_cast<double>(procs + 1))
                          .Add("memcpy_seconds", mem.best_seconds)
                          .Add("memcpy_gbps", memcpy_gbps)
                          .Add("ratio_to_memcpy", gbps / memcpy_gbps));
    if (!opt.json) {
      std::printf("%6zu %9.2f %9.2f %9.3f\n", procs, gbps, gbps / memcpy_gbps,
                  t.best_seconds * 1e3);
    }
  }
  if (opt.json) std::fputs(JsonArray(records).c_str(), stdout);
  return 0;
}

}  // namespace bitpush::bench
