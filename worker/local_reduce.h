// Intra-node reduce on the CPU: the worker daemon's sum of its local training processes'
// gradients, `dst[i] = scale * (src0[i] + src1[i] + ... + src(P-1)[i])`.
//
// Arithmetic, identical on every ISA level and for every thread count (tests check the bits):
//  - every element is summed in fp32 in source order, ((s0 + s1) + s2) + ..., one rounding per
//    addition as IEEE binary32 does it; then, when scale != 1, multiplied once by `scale`
//    (averaging over P processes is scale = 1/P; a multiply, not a division by P);
//  - fp16 and bf16 sources are converted exactly to fp32 on load (F16C / AVX-512 VCVTPH2PS,
//    or bf16 << 16), summed in fp32 as above, and the final fp32 value is rounded ONCE to the
//    destination dtype, round-to-nearest-even (overflow -> ±inf, NaN stays NaN, quieted), as
//    common/half.h's FloatToHalf / FloatToBf16. There is no rounding to fp16 between
//    additions, so the result can differ from a chain of fp16 additions (it is closer).
//  - no FMA contraction: the scale multiply is the last operation.
// Each element is computed by exactly one kernel call from its own inputs, so splitting the
// range over threads or chunks cannot change a bit.
//
// LocalReduceKernel is the single-threaded kernel (run-time ISA dispatch, like the
// compressors: scalar, AVX2 + F16C, AVX-512). LocalReducer owns a small pool of threads
// (optionally pinned to CPUs) and splits a reduce into chunks over them; it is owned by its
// caller (the worker daemon), never a process-wide object.
//
// Aliasing: dst may be exactly any source (in place, typically src0); any other overlap
// between dst and a source is an error. Sources may alias each other. No alignment required.
//
// Thread-safety: LocalReduceKernel is a pure function over caller memory. A LocalReducer may be
// called from any thread; concurrent Reduce calls on one reducer run one after the other.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/status.h"

namespace bitpush::worker {

// Sums `num_srcs` (>= 1) arrays of `count` elements of `dtype` into dst (see above) on the
// calling thread. Pointers must be valid (may be null when count == 0); `isa` must be
// supported here (CheckIsaSupported). Aliasing as described above. `non_temporal`: the SIMD
// levels write the 64-byte-aligned bulk of dst with streaming stores (same bits, fenced before
// returning); pointless in place.
void LocalReduceKernel(DType dtype, const void* const* srcs, size_t num_srcs, void* dst,
                       size_t count, float scale, IsaLevel isa, bool non_temporal = false);

struct LocalReduceOptions {
  // Threads that run a reduce (>= 1). With 1 and no `cpus`, reduces run on the caller's
  // thread and no thread is started.
  uint32_t threads = 1;
  // CPUs to pin the pool's threads to (thread t on cpus[t % cpus.size()], sched_setaffinity);
  // empty: not pinned.
  std::vector<int> cpus;
  // SIMD level of the kernels; the default is the best this CPU supports.
  IsaLevel isa = BestIsaLevel();
  // Elements per unit of work handed to a thread (rounded up to a multiple of 64). The default,
  // 32768 (128 KiB of fp32 output; with P = 2 fp32 sources, 384 KiB touched), keeps each
  // thread's streams in L2 and gives the threads enough chunks to balance a noisy machine.
  size_t chunk_elements = 32768;
  // Reduces of fewer elements than this run on the caller's thread (a handoff to the pool
  // costs more than the work).
  size_t min_parallel_elements = 65536;
  // Results of at least this many bytes that do not alias a source are written with
  // non-temporal (streaming) stores, which skip reading dst's lines before writing them
  // (bitpush-bench localreduce, P = 2 fp32 here: 0.84x memcpy with them, 0.67x without at
  // 8 MiB; 0.83x vs 0.36x at 64 MiB). Smaller results stay cached for the compressor that reads
  // them next. 0: never.
  size_t non_temporal_min_bytes = size_t{4} << 20;
  // Thread name prefix (top / gdb): thread i is `name` + i, truncated to 15 characters.
  std::string name = "bp-lreduce";
};

class LocalReducer {
 public:
  // Validates the options (threads >= 1, the ISA is supported, CPUs exist), starts the
  // threads and pins them. An error names the offending option or the failed pin.
  static StatusOr<std::unique_ptr<LocalReducer>> Create(const LocalReduceOptions& options);
  ~LocalReducer();
  LocalReducer(const LocalReducer&) = delete;
  LocalReducer& operator=(const LocalReducer&) = delete;

  // dst = scale * sum(srcs) over `count` elements, all of `dtype` (see the file comment).
  // InvalidArgument for no sources, null pointers with count > 0, a partial overlap of dst
  // with a source, or a non-finite scale. Blocks until done.
  Status Reduce(DType dtype, const void* const* srcs, size_t num_srcs, void* dst, size_t count,
                float scale = 1.0f);

  // Copies `bytes` from src to dst with the same chunks and threads as Reduce (the memcpy
  // reference of bitpush-bench localreduce). Ranges must not overlap.
  void ParallelCopy(const void* src, void* dst, size_t bytes);

  const LocalReduceOptions& options() const { return options_; }

 private:
  struct Job;
  explicit LocalReducer(const LocalReduceOptions& options);
  Status Start();
  void Loop(uint32_t index);
  void RunChunks(Job* job);
  void Dispatch(Job* job);

  LocalReduceOptions options_;
  std::mutex call_mu_;  // serialises Reduce / ParallelCopy calls
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  Job* job_ = nullptr;       // guarded by mu_
  uint64_t generation_ = 0;  // guarded by mu_; bumped per job
  uint32_t running_ = 0;     // guarded by mu_; pool threads still on the current job
  bool stopping_ = false;    // guarded by mu_
  Status pin_status_;        // guarded by mu_; the first failed pin
  uint32_t started_ = 0;     // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace bitpush::worker
