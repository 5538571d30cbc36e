// CPU topology and pinning for the server's engine threads (server.numa, docs/config.md).
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
// Owned by the server module. Thread-safety: pure functions; PinCurrentThread affects the
// calling thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace bitpush::server {

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

}  // namespace bitpush::server
