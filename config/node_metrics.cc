#include "config/node_metrics.h"

#include "common/metrics/process.h"
#include "fmt/format.h"

namespace bitpush::config {

StatusOr<std::unique_ptr<NodeMetrics>> NodeMetrics::Start(const ClusterConfig& config,
                                                          v1::Role role, uint32_t rank) {
  const uint32_t port = config.MetricsPort(role, rank);
  if (port == 0) return std::unique_ptr<NodeMetrics>();
  const std::string role_name(node::RoleName(role));
  const std::string rank_text = role == v1::ROLE_SCHEDULER ? "" : std::to_string(rank);
  const std::string who = rank_text.empty() ? role_name : role_name + " " + rank_text;
  std::unique_ptr<NodeMetrics> m(new NodeMetrics());
  m->process_ = m->registry_.Add([role_name, rank_text](metrics::MetricSet& set) {
    metrics::AddNodeInfo(set, role_name, rank_text);
    metrics::AddProcessMetrics(set);
  });
  metrics::ExporterOptions o;
  o.bind_address = config.metrics.bind_address;
  o.port = static_cast<uint16_t>(port);
  o.label = who + " metrics";
  StatusOr<std::unique_ptr<metrics::Exporter>> exporter =
      metrics::Exporter::Start(std::move(o), &m->registry_);
  if (!exporter.ok()) {
    return Status(exporter.status().code(),
                  fmt::format("metrics.port: {}", exporter.status().message()));
  }
  m->exporter_ = std::move(exporter).value();
  return m;
}

NodeMetrics::~NodeMetrics() {
  Stop();
}

void NodeMetrics::Stop() {
  if (exporter_) exporter_->Stop();
}

}  // namespace bitpush::config
