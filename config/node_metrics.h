// NodeMetrics: the metrics endpoint of one node of a cluster — a Registry with the process's
// own metrics (common/metrics/process.h: memory, CPU, descriptors, `bitpush_node_info`) and the
// Exporter serving it at the node's port of the `metrics:` section (docs/metrics.md: the
// scheduler at metrics.port, server r at +1+r, worker node n at +1+servers+n). Each daemon's
// main (and an embedded worker Client) starts one and adds its component's collector.
//
// Off when metrics.port is 0: Start returns null and nothing runs (no thread, no socket).
//
// Ownership: the node's owner; collectors added to registry() must be removed (their
// Registration destroyed) before the objects they read are, and before the NodeMetrics.
// Thread-safety: as Registry (Add from any thread); Start/Stop/the destructor from the owner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/metrics/exporter.h"
#include "common/metrics/registry.h"
#include "common/status.h"
#include "config/cluster_config.h"

namespace bitpush::config {

class NodeMetrics {
 public:
  // Null when config.metrics.port is 0. Errors name the key: "metrics.port: server 1 cannot
  // listen at 127.0.0.1:19101: Address already in use".
  static StatusOr<std::unique_ptr<NodeMetrics>> Start(const ClusterConfig& config, v1::Role role,
                                                      uint32_t rank);

  ~NodeMetrics();  // Stop()
  NodeMetrics(const NodeMetrics&) = delete;
  NodeMetrics& operator=(const NodeMetrics&) = delete;

  metrics::Registry& registry() { return registry_; }
  uint16_t port() const { return exporter_ ? exporter_->port() : 0; }
  std::string url() const { return exporter_ ? exporter_->url() : ""; }

  // Stops serving (joins the exporter's thread). Idempotent.
  void Stop();

 private:
  NodeMetrics() = default;

  metrics::Registry registry_;
  metrics::Registry::Registration process_;
  std::unique_ptr<metrics::Exporter> exporter_;
};

}  // namespace bitpush::config
