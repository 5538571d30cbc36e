// The server's metrics (docs/metrics.md): rounds published, pushes accepted and refused, payload
// bytes in and out (compressed and raw), engine time, per-engine-thread queue depth and keys,
// and its endpoint's messages, bytes and refusals.
//
// Thread-safety: reads Server::stats(), engine_threads() and endpoint_stats(), which may be
// called from any thread; the MetricSet is the caller's.
#pragma once

#include "common/metrics/registry.h"
#include "server/server.h"

namespace bitpush::server {

void AddServerMetrics(const Server& server, metrics::MetricSet& set);

}  // namespace bitpush::server
