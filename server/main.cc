// bitpush-server: one compression server of a cluster.
//
//   bitpush-server --config cluster.yaml --rank N [--stats-json PATH] [--set KEY=VALUE]...
//                  [--log-level info]
//
// Registers with the scheduler as server N, aggregates the keys the scheduler's mapping gives
// it (docs/data-plane.md) until the cluster shuts down. --stats-json writes the server's
// counters (ServerStats, engine threads) as one JSON object at exit, for benchmarks.
//
// Exit status: 0 clean shutdown, or stopped by SIGINT/SIGTERM (as asked: `systemctl stop`
// leaves the unit inactive, not failed); 1 a failure (registration refused or timed out, a
// node declared dead); 2 a usage or config error.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/logging.h"
#include "common/process_memory.h"
#include "common/sd_notify.h"
#include "common/termination_signals.h"
#include "config/daemon_command_line.h"
#include "config/node_metrics.h"
#include "config/node_security.h"
#include "server/server.h"
#include "server/server_metrics.h"

namespace {

constexpr char kSummary[] =
    "Runs server N of the cluster described by CLUSTER.yaml (docs/config.md).";
constexpr char kExitStatus[] =
    "Exit status: 0 clean shutdown or stopped by SIGINT/SIGTERM, 1 failure, 2 usage or config "
    "error.";

void WriteStats(const std::string& path, const bitpush::server::Server& server) {
  const bitpush::server::ServerStats s = server.stats();
  std::string threads;
  for (const auto& t : server.engine_threads()) {
    if (!threads.empty()) threads += ", ";
    threads +=
        "{\"cpu\": " + std::to_string(t.cpu) + ", \"numa_node\": " + std::to_string(t.numa_node) +
        ", \"keys\": " + std::to_string(t.keys) + ", \"load\": " + std::to_string(t.load) + "}";
  }
  std::ofstream out(path);
  out << "{\"rank\": " << server.rank() << ", \"keys\": " << s.keys
      << ", \"pushes_accepted\": " << s.pushes_accepted
      << ", \"pushes_rejected\": " << s.pushes_rejected << ", \"replies_sent\": " << s.replies_sent
      << ", \"rounds_published\": " << s.rounds_published
      << ", \"bytes_received\": " << s.bytes_received << ", \"bytes_sent\": " << s.bytes_sent
      << ", \"engine_busy_ns\": " << s.engine_busy_ns << ", \"engine_cpu_ns\": " << s.engine_cpu_ns
      << ", \"quantized_values\": " << s.quantized_values
      << ", \"quantized_saturated\": " << s.quantized_saturated
      << ", \"error_values\": " << s.error_values << ", \"error_saturated\": " << s.error_saturated
      << ", \"engine_threads\": [" << threads << "]}\n";
  if (!out) BP_LOG_WARN("bitpush-server: cannot write {}", path);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace bitpush;
  KeepLargeBuffersInProcess();
  config::DaemonCommandLine cli(
      {"bitpush-server",
       kSummary,
       kExitStatus,
       {{"--rank", "N", "this server's rank in cluster.servers", config::FlagKind::kCount, true},
        {"--stats-json", "PATH", "write the server's counters as JSON at exit"}}});
  if (int exit_code = cli.ParseOrExit(argc, argv); exit_code >= 0) return exit_code;
  const config::ClusterConfig& config = cli.config();
  const uint64_t rank = cli.flags().count("--rank", 0);
  const std::string stats_path = cli.flags().text("--stats-json");
  if (rank >= config.servers.size()) {
    return cli.UsageError("--rank " + std::to_string(rank) + " but " + cli.config_path() +
                          " lists " + std::to_string(config.servers.size()) + " server(s)");
  }
  // Keys are configuration: a missing or unsafe key file is a config error (exit 2).
  if (Status s = config::NodeTransportSecurity(
                     config, node::NodePeerId(v1::ROLE_SERVER, static_cast<uint32_t>(rank)))
                     .status();
      !s.ok()) {
    return cli.ConfigError(s.message());
  }

  // SIGINT/SIGTERM close the server from their own thread (common/termination_signals.h).
  std::atomic<server::Server*> running{nullptr};
  TerminationSignals signals([&running](int sig) {
    server::Server* s = running.load();
    BP_LOG_WARN("bitpush-server: received {}; stopping", strsignal(sig));
    if (s == nullptr) std::_Exit(0);  // still starting: nothing to lose
    s->Close();
  });

  // metrics.port (docs/metrics.md): served from before registration to the end.
  StatusOr<std::unique_ptr<config::NodeMetrics>> node_metrics =
      config::NodeMetrics::Start(config, v1::ROLE_SERVER, static_cast<uint32_t>(rank));
  if (!node_metrics.ok()) {
    std::fprintf(stderr, "bitpush-server: error: %s\n", node_metrics.status().ToString().c_str());
    return 1;
  }

  server::ServerOptions options;
  options.cluster = config;
  options.rank = static_cast<uint32_t>(rank);
  StatusOr<std::unique_ptr<server::Server>> srv = server::Server::Create(std::move(options));
  if (!srv.ok()) {
    std::fprintf(stderr, "bitpush-server: error: %s\n", srv.status().ToString().c_str());
    return 1;
  }
  running = srv->get();
  metrics::Registry::Registration server_metrics;
  if (*node_metrics) {
    server_metrics = (*node_metrics)->registry().Add([s = srv->get()](metrics::MetricSet& set) {
      server::AddServerMetrics(*s, set);
    });
  }
  // systemd (Type=notify, docs/deploy.md): ready once registered, assigned and serving.
  if (Status n = NotifyReady("server " + std::to_string(rank) + " serving"); !n.ok()) {
    BP_LOG_WARN("bitpush-server: {}", n.ToString());
  }
  // The cluster ends by the scheduler's Shutdown; the wait is bounded only by it (a dead
  // scheduler is detected by the heartbeat timeout and ends the wait with an error).
  Status result = (*srv)->Wait(std::chrono::hours(24 * 365));
  (void)NotifyStopping();
  signals.Stop();
  running = nullptr;
  const bool interrupted = signals.received();
  (*srv)->Close();
  if (!stats_path.empty()) WriteStats(stats_path, **srv);
  server_metrics.Reset();  // no scrape reads the server from here on
  srv->reset();
  if (interrupted) {
    BP_LOG_INFO("bitpush-server: stopped by a signal");
    return 0;
  }
  if (!result.ok()) {
    std::fprintf(stderr, "bitpush-server: error: %s\n", result.ToString().c_str());
    return 1;
  }
  BP_LOG_INFO("bitpush-server: clean shutdown");
  return 0;
}
