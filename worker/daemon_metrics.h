// The bitpush-worker daemon's own metrics (docs/metrics.md): what the daemon counts beside its
// engine (DaemonStats: connections of other users refused at the socket). Served by
// bitpush-worker next to the engine's (engine_metrics.h).
//
// Thread-safety: reads Daemon::stats(), which may be called from any thread; the MetricSet is
// the caller's.
#pragma once

#include "common/metrics/registry.h"
#include "worker/daemon.h"

namespace bitpush::worker {

void AddDaemonMetrics(const Daemon& daemon, metrics::MetricSet& set);

}  // namespace bitpush::worker
