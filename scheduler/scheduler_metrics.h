// The scheduler's metrics (docs/metrics.md): nodes expected, registered, dead and done,
// registrations refused, barriers released, heartbeat rounds, and its endpoint's messages,
// bytes and refusals.
//
// Thread-safety: reads Scheduler::stats(), which may be called from any thread while Run()
// runs; the MetricSet is the caller's.
#pragma once

#include "common/metrics/registry.h"
#include "scheduler/scheduler.h"

namespace bitpush::scheduler {

void AddSchedulerMetrics(const Scheduler& scheduler, metrics::MetricSet& set);

}  // namespace bitpush::scheduler
