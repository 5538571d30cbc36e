// The worker engine's metrics (docs/metrics.md): push_pulls completed and failed, partitions
// pushed, payload bytes pushed and pulled (compressed and raw), cumulative time per stage
// (compress, network, decompress), bytes in flight and partitions queued for credit, and its
// endpoint's messages, bytes and refusals. Served by the bitpush-worker daemon and by an
// embedded Client (worker/client.h).
//
// Thread-safety: reads Engine::stats() and endpoint_stats(), which may be called from any
// thread; the MetricSet is the caller's.
#pragma once

#include "common/metrics/registry.h"
#include "worker/engine.h"

namespace bitpush::worker {

void AddEngineMetrics(const Engine& engine, metrics::MetricSet& set);

}  // namespace bitpush::worker
