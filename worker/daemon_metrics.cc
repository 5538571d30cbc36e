#include "worker/daemon_metrics.h"

namespace bitpush::worker {

void AddDaemonMetrics(const Daemon& daemon, metrics::MetricSet& set) {
  const DaemonStats s = daemon.stats();
  set.Counter("bitpush_worker_local_connections_refused_total",
              "Connections to the daemon's Unix socket refused because the peer runs as "
              "another user (SO_PEERCRED).",
              s.refused_connections);
}

}  // namespace bitpush::worker
