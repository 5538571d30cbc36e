// --transport ucx: what UCX chooses for the ucx clusters of `bitpush-bench pushpull`, probed
// once before they run; the records' ucx_tls.
//
// The ucx clusters: cluster.transport ucx, the control plane on ZeroMQ and the data plane
// (worker <-> server) over UCX (docs/transport-ucx.md), with cluster.ucx.tls = --ucx-tls
// (default: UCX's choice and the UCX_* environment); each node's data port (its port +
// cluster.ucx.port_offset) is free too.
//
// Owned by the driver. Thread-safety: none; the driver's thread.
#pragma once

#include <string>

#include "bench/pushpull/link.h"
#include "common/status.h"

namespace bitpush::bench::pushpull {

// The transports UCX chooses for a worker -> server connection of the ucx clusters' configuration
// (cluster.ucx.tls = --ucx-tls, the UCX_* environment): two ucx endpoints on the workers' and the
// servers' address, one message each way, then the lanes of the worker's endpoint ("tcp/lo",
// "posix/memory,cma/memory,tcp/lo"; info.h LaneTransports). Under --link-gbit both ends are in the
// root namespace (the probe crosses loopback, not the link).
struct UcxProbe {
  std::string lanes;

  Status Run(const std::string& tls, const NetPlan& net);
};

}  // namespace bitpush::bench::pushpull
