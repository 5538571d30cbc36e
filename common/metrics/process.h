// Process metrics: what every bitpush process reports about itself, whatever its role —
// resident and virtual memory (/proc/self/statm), CPU time (getrusage), open file descriptors
// (/proc/self/fd), and an info gauge naming the node (`bitpush_node_info{role, rank}` = 1).
// Names follow the Prometheus client libraries' `process_*` conventions.
//
// Thread-safety: pure functions over the process's own /proc entries; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/metrics/registry.h"

namespace bitpush::metrics {

// Adds the process_* samples. A /proc entry that cannot be read leaves its sample out.
void AddProcessMetrics(MetricSet& set);

// bitpush_node_info{role="server",rank="0"} 1 (rank "" for the scheduler is left out).
void AddNodeInfo(MetricSet& set, const std::string& role, const std::string& rank);

// The resident set size in bytes (/proc/self/statm × page size); 0 when unreadable.
uint64_t ResidentBytes();

}  // namespace bitpush::metrics
