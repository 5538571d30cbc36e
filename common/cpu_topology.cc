#include "common/cpu_topology.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "common/logging.h"

namespace bitpush {

StatusOr<std::vector<CpuSlot>> ProcessCores() {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) return InternalError("hwloc_topology_init failed");
  struct Closer {
    hwloc_topology_t t;
    ~Closer() { hwloc_topology_destroy(t); }
  } closer{topo};
  if (hwloc_topology_load(topo) != 0) {
    return InternalError(
        fmt::format("hwloc could not read the CPU topology: {}", std::strerror(errno)));
  }
  hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
  struct Freer {
    hwloc_bitmap_t b;
    ~Freer() { hwloc_bitmap_free(b); }
  } freer{allowed};
  if (hwloc_get_cpubind(topo, allowed, HWLOC_CPUBIND_PROCESS) != 0) {
    hwloc_bitmap_copy(allowed, hwloc_topology_get_allowed_cpuset(topo));
  }
  const int numa_count = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  std::vector<CpuSlot> cores;
  const int core_count = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  for (int i = 0; i < core_count; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    if (core == nullptr || core->cpuset == nullptr) continue;
    hwloc_bitmap_t mine = hwloc_bitmap_alloc();
    hwloc_bitmap_and(mine, core->cpuset, allowed);
    const int cpu = hwloc_bitmap_first(mine);
    hwloc_bitmap_free(mine);
    if (cpu < 0) continue;  // not in this process's mask
    CpuSlot slot;
    slot.cpu = cpu;
    for (int n = 0; n < numa_count; ++n) {
      hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(n));
      if (node != nullptr && node->cpuset != nullptr &&
          hwloc_bitmap_isset(node->cpuset, static_cast<unsigned>(cpu))) {
        slot.numa_node = static_cast<int>(node->os_index);
        break;
      }
    }
    cores.push_back(slot);
  }
  if (cores.empty()) {
    return InternalError("hwloc found no core in this process's CPU affinity mask");
  }
  std::stable_sort(cores.begin(), cores.end(),
                   [](const CpuSlot& a, const CpuSlot& b) { return a.numa_node < b.numa_node; });
  return cores;
}

size_t AllowedCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::vector<CpuSlot> PlanEngineThreads(const std::vector<CpuSlot>& cores, size_t threads,
                                       uint32_t rank) {
  // Interleave the nodes: node0 core0, node1 core0, node0 core1, ...
  std::map<int, std::vector<CpuSlot>> by_node;
  for (const CpuSlot& c : cores) by_node[c.numa_node].push_back(c);
  std::vector<CpuSlot> order;
  for (size_t i = 0; order.size() < cores.size(); ++i) {
    for (auto& entry : by_node) {
      if (i < entry.second.size()) order.push_back(entry.second[i]);
    }
  }
  std::vector<CpuSlot> plan;
  plan.reserve(threads);
  const size_t offset = (static_cast<size_t>(rank) * threads) % order.size();
  for (size_t t = 0; t < threads; ++t) plan.push_back(order[(offset + t) % order.size()]);
  return plan;
}

Status PinCurrentThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return InternalError(
        fmt::format("cannot pin a thread to CPU {}: {}", cpu, std::strerror(errno)));
  }
  return Status::Ok();
}

uint32_t DefaultReduceThreads(size_t cores) {
  return static_cast<uint32_t>(std::clamp<size_t>(cores / 4, 1, 8));
}

uint32_t DefaultCompressThreads(size_t cores, uint32_t reduce_threads) {
  const size_t used = 1 + static_cast<size_t>(reduce_threads);
  return static_cast<uint32_t>(std::clamp<size_t>(cores > used ? cores - used : 1, 1, 8));
}

WorkerCpuPlan PlanWorkerCpus(const std::vector<CpuSlot>& cores, uint32_t reduce_threads,
                             uint32_t compress_threads) {
  WorkerCpuPlan plan;
  size_t next = 0;
  auto take = [&] { return cores[next++ % cores.size()].cpu; };
  plan.network_cpu = take();
  for (uint32_t i = 0; i < reduce_threads; ++i) plan.reduce_cpus.push_back(take());
  for (uint32_t i = 0; i < compress_threads; ++i) plan.compress_cpus.push_back(take());
  return plan;
}

std::string DescribeWorkerCpuPlan(const WorkerCpuPlan& plan) {
  return fmt::format("network cpu {}, reduce cpus [{}], compress cpus [{}]", plan.network_cpu,
                     fmt::join(plan.reduce_cpus, ","), fmt::join(plan.compress_cpus, ","));
}

ScopedThreadAffinity::ScopedThreadAffinity(int cpu) {
  cpu_set_t old;
  CPU_ZERO(&old);
  if (sched_getaffinity(0, sizeof(old), &old) != 0) {
    BP_LOG_WARN("cannot read this thread's CPU mask: {}", std::strerror(errno));
    return;
  }
  const Status pinned = PinCurrentThread(cpu);
  if (!pinned.ok()) {
    BP_LOG_WARN("{}", pinned.ToString());
    return;
  }
  saved_.assign(reinterpret_cast<unsigned char*>(&old),
                reinterpret_cast<unsigned char*>(&old) + sizeof(old));
  restore_ = true;
}

ScopedThreadAffinity::~ScopedThreadAffinity() {
  if (!restore_) return;
  cpu_set_t old;
  std::memcpy(&old, saved_.data(), sizeof(old));
  if (sched_setaffinity(0, sizeof(old), &old) != 0) {
    BP_LOG_WARN("cannot restore this thread's CPU mask: {}", std::strerror(errno));
  }
}

}  // namespace bitpush
