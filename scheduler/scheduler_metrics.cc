#include "scheduler/scheduler_metrics.h"

#include "common/node/endpoint_metrics.h"

namespace bitpush::scheduler {

void AddSchedulerMetrics(const Scheduler& scheduler, metrics::MetricSet& set) {
  const SchedulerStats s = scheduler.stats();
  constexpr char kNodes[] = "bitpush_scheduler_nodes";
  constexpr char kNodesHelp[] =
      "Nodes of the cluster by state: expected (servers and workers of the YAML), registered, "
      "dead (declared so), done (workers that finished).";
  set.Gauge(kNodes, kNodesHelp, s.nodes_expected, {{"state", "expected"}});
  set.Gauge(kNodes, kNodesHelp, s.nodes_registered, {{"state", "registered"}});
  set.Gauge(kNodes, kNodesHelp, s.nodes_dead, {{"state", "dead"}});
  set.Gauge(kNodes, kNodesHelp, s.workers_done, {{"state", "done"}});
  set.Counter("bitpush_scheduler_registrations_refused_total",
              "Registration attempts refused (version, token, identity, duplicate, config).",
              s.registrations_refused);
  set.Counter("bitpush_scheduler_barriers_released_total", "Barriers released, over all groups.",
              s.barriers_released);
  set.Counter("bitpush_scheduler_heartbeat_rounds_total",
              "Times the scheduler sent a heartbeat to every live node.", s.heartbeat_rounds);
  node::AddEndpointMetrics(s.endpoint, set);
}

}  // namespace bitpush::scheduler
