// The timeline recorder of one component of a cluster (common/trace/recorder.h), opened from
// the `trace:` section of its cluster config (docs/observability.md): a worker engine, a server
// or a worker daemon's engine each open their own when trace.dir is set.
//
// Thread-safety: a pure function; the recorder it returns is the caller's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/trace/recorder.h"
#include "config/cluster_config.h"

namespace bitpush::config {

// Null when trace.dir is empty and $BITPUSH_TRACE_DIR unset (which overrides trace.dir). `role` is
// "worker" or "server"; `process` names the part of the node ("engine", "daemon", "server"). Errors
// name trace.dir or trace.steps.
StatusOr<std::unique_ptr<trace::Recorder>> OpenNodeTrace(const ClusterConfig& config,
                                                         const std::string& role, uint32_t rank,
                                                         const std::string& process);

}  // namespace bitpush::config
