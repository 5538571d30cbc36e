// The rules between knobs of the cluster YAML (config/cluster_knobs.cc binds each to the knob
// whose error names it): each returns "" when the config keeps it, else what is wrong, said
// after the knob's name.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "config/cluster_config.h"

namespace bitpush::config {

// cluster.heartbeat_timeout_ms against the interval.
std::string HeartbeatTimeoutRule(const ClusterConfig& c);
// worker.socket: its `{rank}` where two worker nodes share a host, its length after expansion.
std::string WorkerSocketRule(const ClusterConfig& c);
// metrics.port: every node's metrics port within 65535 and off the cluster's ports.
std::string MetricsPortRule(const ClusterConfig& c);
// cluster.transport ucx: every server and worker address is tcp://.
std::string TransportRule(const ClusterConfig& c);
// cluster.ucx.port_offset: every data port within 65535 and off every other port on its host.
std::string DataPortRule(const ClusterConfig& c);

}  // namespace bitpush::config
