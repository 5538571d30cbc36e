// CPU topology and pinning: the server's engine threads (server.numa) and the worker daemon's
// CPU split (worker.numa, PlanWorkerCpus), docs/config.md.
//
// ProcessCores() reads the machine with hwloc: the physical cores this process may run on
// (its affinity mask, so `taskset`/`numactl`/systemd CPUAffinity= given by a launcher are
// honoured), one CPU (the first hardware thread) per core, each with its NUMA node, ordered
// by node then core. PlanEngineThreads() gives each engine thread its own core, taking nodes
// in turn (thread 0 on node 0, thread 1 on node 1, ...) so keys — placed on threads by load —
// spread over the nodes' memory; start at an offset of rank × threads so servers sharing a
// host (paper 001 §4.2.5 puts two per worker node) take different cores; wrap around when
// there are more threads than cores. A pinned engine thread creates its keys' buffers itself,
// so first-touch allocation puts them on its node (no explicit memory binding).
//
// PlanWorkerCpus() splits the cores of a worker daemon (bitpush-worker) between its three
// kinds of work (paper 001 §4.2.6: fixed CPU sets, contiguous inside a NUMA node, so pipeline
// threads do not straddle nodes): one core for networking (the poll loop, round and completion
// threads, the engine's I/O and dispatcher threads: mostly waiting), then the local-reduce
// threads, then the compression pool, taking cores in order (node by node) and wrapping around
// when there are more threads than cores.
//
// Shared by the server and the worker daemon. Thread-safety: pure functions; PinCurrentThread
// and ScopedThreadAffinity affect the calling thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace bitpush {

struct CpuSlot {
  int cpu = -1;        // OS CPU number (a hardware thread)
  int numa_node = -1;  // OS NUMA node number, -1 when unknown
};

// The cores this process may use, one CpuSlot per physical core, ordered by NUMA node then
// core. Internal error naming hwloc's failure if the topology cannot be read.
StatusOr<std::vector<CpuSlot>> ProcessCores();

// CPUs in this process's affinity mask (hardware threads), at least 1.
size_t AllowedCpuCount();

// One slot per engine thread (see above). `cores` must not be empty.
std::vector<CpuSlot> PlanEngineThreads(const std::vector<CpuSlot>& cores, size_t threads,
                                       uint32_t rank);

// Pins the calling thread to `cpu`. Internal error naming the CPU and errno on failure.
Status PinCurrentThread(int cpu);

// The worker daemon's CPU split (see above).
struct WorkerCpuPlan {
  int network_cpu = -1;
  std::vector<int> reduce_cpus;    // one per reduce thread
  std::vector<int> compress_cpus;  // one per compression thread
};
// The default thread counts for `cores` cores (>= 1): reduce = max(1, cores / 4), compress =
// max(1, cores - 1 - reduce), at most 8 each.
uint32_t DefaultReduceThreads(size_t cores);
uint32_t DefaultCompressThreads(size_t cores, uint32_t reduce_threads);
// `cores` must not be empty; thread counts >= 1.
WorkerCpuPlan PlanWorkerCpus(const std::vector<CpuSlot>& cores, uint32_t reduce_threads,
                             uint32_t compress_threads);
// "network cpu 0, reduce cpus [1], compress cpus [0]" (for logs).
std::string DescribeWorkerCpuPlan(const WorkerCpuPlan& plan);

// Restricts the calling thread to one CPU for the object's lifetime and restores its previous
// mask after: threads started meanwhile inherit the CPU (how the daemon pins the engine's
// threads without the engine knowing). A failure to read or set the mask is logged and leaves
// the thread as it was.
class ScopedThreadAffinity {
 public:
  explicit ScopedThreadAffinity(int cpu);
  ~ScopedThreadAffinity();
  ScopedThreadAffinity(const ScopedThreadAffinity&) = delete;
  ScopedThreadAffinity& operator=(const ScopedThreadAffinity&) = delete;

 private:
  bool restore_ = false;
  std::vector<unsigned char> saved_;  // a cpu_set_t's bytes
};

}  // namespace bitpush
