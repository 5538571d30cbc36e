// The node endpoint's metrics (docs/metrics.md): messages and wire bytes of the transport, and
// the messages the endpoint refused (a sender whose role may not send the type, a header that
// does not parse, a type nobody handles, traffic the transport dropped as not bitpush).
//
// Thread-safety: a pure function of an EndpointStats snapshot (NodeEndpoint::stats() may be
// taken from any thread).
#pragma once

#include "common/metrics/registry.h"
#include "common/node/endpoint.h"

namespace bitpush::node {

void AddEndpointMetrics(const EndpointStats& stats, metrics::MetricSet& set);

}  // namespace bitpush::node
