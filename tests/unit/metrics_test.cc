// The metrics module (common/metrics/): the Prometheus text rendering (exact text), the
// registry's collectors, the HTTP exporter over real loopback sockets (200 on GET /metrics, 404
// elsewhere, 405 for other methods, a taken port refused naming the address), NodeMetrics'
// per-role ports and the `metrics:` knobs' validation.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <limits>
#include <string>

#include "common/metrics/exporter.h"
#include "common/metrics/process.h"
#include "common/metrics/registry.h"
#include "config/cluster_config.h"
#include "config/cluster_knobs.h"
#include "config/node_metrics.h"
#include "tests/harness/child_process.h"
#include "tests/harness/http_get.h"
#include "tests/unit/test_util.h"

namespace bitpush::testing {
namespace {

using metrics::Exporter;
using metrics::ExporterOptions;
using metrics::MetricSet;
using metrics::Registry;

TEST(MetricSet, RendersTheTextFormatExactly) {
  MetricSet set;
  set.Counter("bitpush_x_total", "Things done.", uint64_t{3}, {{"kind", "a"}});
  set.Gauge("bitpush_depth", "Queue depth.", uint64_t{7});
  set.Counter("bitpush_x_total", "Things done.", uint64_t{18446744073709551615ull},
              {{"kind", "b"}, {"side", "in"}});
  set.Gauge("bitpush_ratio", "A ratio\nwith a backslash \\.", 0.25);
  set.Summary("bitpush_stage_seconds", "Stage time.", 4, 1.5, {{"stage", "compress"}});
  set.Gauge("bitpush_odd", "Odd values.", std::numeric_limits<double>::infinity(),
            {{"v", "q\"uote\\back\nline"}});
  set.Gauge("bitpush_odd", "Odd values.", -std::numeric_limits<double>::infinity(), {{"v", "neg"}});
  set.Gauge("bitpush_odd", "Odd values.", std::numeric_limits<double>::quiet_NaN(), {{"v", "nan"}});
  EXPECT_EQ(set.Render(),
            "# HELP bitpush_x_total Things done.\n"
            "# TYPE bitpush_x_total counter\n"
            "bitpush_x_total{kind=\"a\"} 3\n"
            "bitpush_x_total{kind=\"b\",side=\"in\"} 18446744073709551615\n"
            "# HELP bitpush_depth Queue depth.\n"
            "# TYPE bitpush_depth gauge\n"
            "bitpush_depth 7\n"
            "# HELP bitpush_ratio A ratio\\nwith a backslash \\\\.\n"
            "# TYPE bitpush_ratio gauge\n"
            "bitpush_ratio 0.25\n"
            "# HELP bitpush_stage_seconds Stage time.\n"
            "# TYPE bitpush_stage_seconds summary\n"
            "bitpush_stage_seconds_sum{stage=\"compress\"} 1.5\n"
            "bitpush_stage_seconds_count{stage=\"compress\"} 4\n"
            "# HELP bitpush_odd Odd values.\n"
            "# TYPE bitpush_odd gauge\n"
            "bitpush_odd{v=\"q\\\"uote\\\\back\\nline\"} +Inf\n"
            "bitpush_odd{v=\"neg\"} -Inf\n"
            "bitpush_odd{v=\"nan\"} NaN\n");
  EXPECT_EQ(MetricSet().Render(), "");
}

TEST(MetricSet, FormatsValuesExactlyAndChecksNames) {
  EXPECT_EQ(metrics::FormatValue(uint64_t{0}), "0");
  EXPECT_EQ(metrics::FormatValue(3.0), "3");
  EXPECT_EQ(metrics::FormatValue(0.1), "0.1");
  EXPECT_EQ(metrics::FormatValue(1e21), "1e+21");
  EXPECT_TRUE(metrics::ValidMetricName("bitpush_a:b_1"));
  EXPECT_FALSE(metrics::ValidMetricName("1abc"));
  EXPECT_FALSE(metrics::ValidMetricName("a-b"));
  EXPECT_FALSE(metrics::ValidMetricName(""));
  EXPECT_TRUE(metrics::ValidLabelName("direction"));
  EXPECT_FALSE(metrics::ValidLabelName("__reserved"));
  EXPECT_FALSE(metrics::ValidLabelName("a:b"));
}

TEST(MetricSetDeathTest, AFamilyAddedWithAnotherTypeIsABug) {
  EXPECT_DEATH(
      {
        MetricSet set;
        set.Counter("bitpush_x_total", "x", uint64_t{1});
        set.Gauge("bitpush_x_total", "x", uint64_t{1});
      },
      "");  // BP_CHECK logs through spdlog (stdout)
  EXPECT_DEATH(
      {
        MetricSet set;
        set.Gauge("bad-name", "x", uint64_t{1});
      },
      "");
}

TEST(Registry, RunsCollectorsInOrderUntilTheirRegistrationGoes) {
  Registry registry;
  EXPECT_EQ(registry.Render(), "");
  std::atomic<int> calls{0};
  Registry::Registration a = registry.Add([&](MetricSet& s) {
    ++calls;
    s.Gauge("bitpush_a", "A.", uint64_t{1});
  });
  {
    Registry::Registration b =
        registry.Add([](MetricSet& s) { s.Gauge("bitpush_b", "B.", uint64_t{2}); });
    EXPECT_EQ(registry.Render(),
              "# HELP bitpush_a A.\n# TYPE bitpush_a gauge\nbitpush_a 1\n"
              "# HELP bitpush_b B.\n# TYPE bitpush_b gauge\nbitpush_b 2\n");
  }
  EXPECT_EQ(registry.Render(), "# HELP bitpush_a A.\n# TYPE bitpush_a gauge\nbitpush_a 1\n");
  Registry::Registration moved = std::move(a);
  moved.Reset();
  moved.Reset();  // idempotent
  EXPECT_EQ(registry.Render(), "");
  EXPECT_EQ(calls.load(), 2);
}

TEST(ProcessMetrics, ReportResidentMemoryAndTheNode) {
  EXPECT_GT(metrics::ResidentBytes(), 0u);
  MetricSet set;
  metrics::AddNodeInfo(set, "server", "3");
  metrics::AddProcessMetrics(set);
  const std::string text = set.Render();
  EXPECT_EQ(SampleValue(text, "bitpush_node_info{role=\"server\",rank=\"3\"}"), 1);
  EXPECT_GT(SampleValue(text, "process_resident_memory_bytes"), 1e5);
  EXPECT_GT(SampleValue(text, "process_virtual_memory_bytes"), 1e5);
  EXPECT_GE(SampleValue(text, "process_cpu_seconds_total"), 0);
  EXPECT_GT(SampleValue(text, "process_open_fds"), 0);
}

// An exporter on a free port below the ephemeral range (tests/harness/child_process.h).
std::unique_ptr<Exporter> StartExporter(const Registry* registry, ExporterOptions o = {}) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int port = FreeTcpPort();
    if (port <= 0) break;
    o.port = static_cast<uint16_t>(port);
    StatusOr<std::unique_ptr<Exporter>> e = Exporter::Start(o, registry);
    if (e.ok()) return std::move(e).value();
  }
  ADD_FAILURE() << "no exporter could start";
  return nullptr;
}

TEST(Exporter, ServesMetricsOverHttpAndNothingElse) {
  Registry registry;
  std::atomic<uint64_t> rounds{0};
  Registry::Registration r = registry.Add(
      [&](MetricSet& s) { s.Counter("bitpush_test_rounds_total", "Rounds.", rounds.load()); });
  std::unique_ptr<Exporter> e = StartExporter(&registry);
  ASSERT_NE(e, nullptr);
  ASSERT_LT(e->port(), 32768);
  EXPECT_EQ(e->url(), "http://127.0.0.1:" + std::to_string(e->port()) + "/metrics");

  HttpAnswer a = HttpGet(e->port(), "/metrics");
  ASSERT_EQ(a.status, 200) << a.head;
  EXPECT_CONTAINS(a.head, "Content-Type: text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(a.body,
            "# HELP bitpush_test_rounds_total Rounds.\n"
            "# TYPE bitpush_test_rounds_total counter\n"
            "bitpush_test_rounds_total 0\n");
  rounds = 5;
  // Values are read at scrape time; a query string is ignored.
  EXPECT_EQ(SampleValue(HttpGet(e->port(), "/metrics?x=1").body, "bitpush_test_rounds_total"), 5);

  EXPECT_EQ(HttpGet(e->port(), "/").status, 404);
  EXPECT_EQ(HttpGet(e->port(), "/metricsx").status, 404);
  EXPECT_EQ(HttpGet(e->port(), "/metrics/").status, 404);
  HttpAnswer post = HttpRequest(e->port(), "POST", "/metrics", "Content-Length: 5\r\n");
  EXPECT_EQ(post.status, 405);
  EXPECT_CONTAINS(post.head, "Allow: GET");
  EXPECT_EQ(HttpRequest(e->port(), "DELETE", "/metrics").status, 405);
  // Request headers beyond the per-connection memory are refused, not buffered.
  const std::string huge = "X-Big: " + std::string(64 * 1024, 'a') + "\r\n";
  const HttpAnswer big = HttpRequest(e->port(), "GET", "/metrics", huge);
  EXPECT_NE(big.status, 200);

  const int port = e->port();
  e->Stop();
  e->Stop();  // idempotent
  EXPECT_EQ(HttpGet(port, "/metrics").status, 0) << "still answering after Stop";
}

TEST(Exporter, ManySequentialScrapesStayWithinTheConnectionLimit) {
  Registry registry;
  Registry::Registration r =
      registry.Add([](MetricSet& s) { s.Gauge("bitpush_g", "G.", uint64_t{1}); });
  ExporterOptions o;
  o.max_connections = 2;
  std::unique_ptr<Exporter> e = StartExporter(&registry, o);
  ASSERT_NE(e, nullptr);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(HttpGet(e->port(), "/metrics").status, 200) << i;
}

TEST(Exporter, ATakenPortOrABadAddressIsRefusedNamingIt) {
  Registry registry;
  std::unique_ptr<Exporter> first = StartExporter(&registry);
  ASSERT_NE(first, nullptr);
  ExporterOptions o;
  o.port = first->port();
  o.label = "server 1 metrics";
  StatusOr<std::unique_ptr<Exporter>> second = Exporter::Start(o, &registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_CONTAINS(second.status().message(),
                  "server 1 metrics: cannot listen at 127.0.0.1:" + std::to_string(o.port) +
                      ": Address already in use");
  o.bind_address = "localhost";
  StatusOr<std::unique_ptr<Exporter>> bad = Exporter::Start(o, &registry);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(bad.status().message(), "'localhost' is not an IPv4 or IPv6 literal");
}

config::ClusterConfig TwoByTwo() {
  config::ClusterConfig c;
  c.scheduler_address = "tcp://127.0.0.1:19000";
  c.servers = {"tcp://127.0.0.1:19100", "tcp://127.0.0.1:19101"};
  c.workers = {"tcp://127.0.0.1:19200", "tcp://127.0.0.1:19201"};
  return c;
}

TEST(NodeMetrics, PortsByRoleAndRankAndOffByDefault) {
  config::ClusterConfig c = TwoByTwo();
  EXPECT_EQ(c.MetricsPort(v1::ROLE_SCHEDULER, 0), 0u);
  StatusOr<std::unique_ptr<config::NodeMetrics>> off =
      config::NodeMetrics::Start(c, v1::ROLE_SERVER, 0);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, nullptr);  // no thread, no socket
  c.metrics.port = 19400;
  EXPECT_EQ(c.MetricsPort(v1::ROLE_SCHEDULER, 0), 19400u);
  EXPECT_EQ(c.MetricsPort(v1::ROLE_SERVER, 0), 19401u);
  EXPECT_EQ(c.MetricsPort(v1::ROLE_SERVER, 1), 19402u);
  EXPECT_EQ(c.MetricsPort(v1::ROLE_WORKER, 0), 19403u);
  EXPECT_EQ(c.MetricsPort(v1::ROLE_WORKER, 1), 19404u);
}

TEST(NodeMetrics, ServesTheProcessAndTheNodeAtItsPort) {
  config::ClusterConfig c = TwoByTwo();
  const int port = FreeTcpPort();
  ASSERT_GT(port, 3);
  c.metrics.port = static_cast<uint32_t>(port - 3);  // worker 0 = port - 3 + 1 + 2 + 0
  StatusOr<std::unique_ptr<config::NodeMetrics>> m =
      config::NodeMetrics::Start(c, v1::ROLE_WORKER, 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_NE(*m, nullptr);
  EXPECT_EQ((*m)->port(), port);
  Registry::Registration r = (*m)->registry().Add(
      [](MetricSet& s) { s.Counter("bitpush_worker_x_total", "X.", uint64_t{9}); });
  const HttpAnswer a = HttpGet(port, "/metrics");
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(SampleValue(a.body, "bitpush_node_info{role=\"worker\",rank=\"0\"}"), 1);
  EXPECT_GT(SampleValue(a.body, "process_resident_memory_bytes"), 0);
  EXPECT_EQ(SampleValue(a.body, "bitpush_worker_x_total"), 9);
  // The same port again: refused, naming the key.
  StatusOr<std::unique_ptr<config::NodeMetrics>> again =
      config::NodeMetrics::Start(c, v1::ROLE_WORKER, 0);
  ASSERT_FALSE(again.ok());
  EXPECT_CONTAINS(again.status().message(), "metrics.port: worker 0 metrics: cannot listen at");
}

TEST(MetricsKnobs, PortAndBindAddressAreValidatedNamingTheKey) {
  const std::string head =
      "cluster:\n  scheduler: 127.0.0.1:19000\n  servers: [127.0.0.1:19100, 127.0.0.1:19101]\n"
      "  workers: [127.0.0.1:19200, 127.0.0.1:19201]\n";
  StatusOr<config::ClusterConfig> ok = config::ParseClusterConfig(
      head + "metrics:\n  port: 19400\n  bind_address: '::1'\n", "c.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->metrics.port, 19400u);
  EXPECT_EQ(ok->metrics.bind_address, "::1");
  EXPECT_CONTAINS(config::DescribeClusterConfig(*ok), "metrics:\n  port: 19400");
  StatusOr<config::ClusterConfig> off = config::ParseClusterConfig(head, "c.yaml");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->metrics.port, 0u);
  EXPECT_CONTAINS(config::DescribeClusterConfig(*off), "metrics:\n  port: off");

  struct Case {
    std::string yaml;
    std::string message;
  };
  const Case cases[] = {
      {"metrics:\n  port: 70000\n", "c.yaml:6: metrics.port: must be 0..65535, got 70000"},
      {"metrics:\n  port: 65533\n",
       "metrics.port: must be at most 65531 so the 5 metrics ports from it (scheduler, 2 "
       "server(s), 2 worker(s)) fit, got 65533"},
      {"metrics:\n  port: 19099\n",
       "metrics.port: server 0's metrics port 19100 (metrics.port 19099 + its offset, "
       "docs/metrics.md) is the port of server 0 at tcp://127.0.0.1:19100"},
      {"metrics:\n  bind_address: localhost\n",
       "metrics.bind_address: expected an IPv4 or IPv6 address (127.0.0.1, 0.0.0.0, ::1, ::), "
       "got 'localhost'"},
      {"metrics:\n  prot: 1\n",
       "metrics.prot: unknown key; valid keys of metrics: "
       "bind_address, port"},
  };
  for (const Case& k : cases) {
    StatusOr<config::ClusterConfig> c = config::ParseClusterConfig(head + k.yaml, "c.yaml");
    ASSERT_FALSE(c.ok()) << k.yaml;
    EXPECT_CONTAINS(c.status().message(), k.message);
  }
  // Configs built in code get the same rules.
  config::ClusterConfig c = TwoByTwo();
  c.metrics.port = 65534;
  EXPECT_CONTAINS(config::ValidateClusterConfig(c).message(), "metrics.port: must be at most");
  // --set overrides it like any scalar knob.
  EXPECT_TRUE(config::SetClusterKnob(&c, "metrics.port", "19400").ok());
  EXPECT_EQ(c.metrics.port, 19400u);
}

}  // namespace
}  // namespace bitpush::testing
