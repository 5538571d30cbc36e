// bitpush-worker: the per-node worker daemon (worker/daemon.h, docs/local-ipc.md).
//
//   bitpush-worker --config cluster.yaml --rank N [--no-sweep] [--socket PATH] [--local-size P]
//                  [--reduce-threads T] [--set KEY=VALUE]... [--log-level info]
//
// Is worker N of the cluster for the node's P training processes (worker::Client in daemon
// mode), which connect to PATH (default: worker.socket of the YAML, else worker-<N>.sock in
// the user's private socket directory, worker/ipc/socket_dir.h). At start it removes the
// shared-memory segments of crashed processes of this user (SweepStaleSegments); --no-sweep skips
// that (tests that run beside other tests of the same user, which may be inspecting such
// leftovers). Prints "bitpush-worker node N: listening at PATH" on stdout once the socket is up.
//
// Exit status: 0 after a clean end (every training process said Goodbye and the cluster shut
// down) or SIGINT/SIGTERM (pending rounds fail, Goodbye to every process, the socket file is
// removed and every segment this process made is unlinked); 1 a failure (a training process
// died, registration failed, ...: the message names it); 2 a usage or config error.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "common/process_memory.h"
#include "common/sd_notify.h"
#include "common/termination_signals.h"
#include "config/daemon_command_line.h"
#include "config/node_metrics.h"
#include "config/node_security.h"
#include "worker/daemon.h"
#include "worker/daemon_metrics.h"
#include "worker/engine_metrics.h"

namespace {

constexpr char kSummary[] =
    "Runs the worker daemon of node N for its P training processes (docs/local-ipc.md).";
constexpr char kExitStatus[] =
    "Exit status: 0 clean end or SIGINT/SIGTERM, 1 failure, 2 usage or config error.";

}  // namespace

int main(int argc, char** argv) {
  using namespace bitpush;
  KeepLargeBuffersInProcess();
  // --socket, --local-size and --reduce-threads come from the knob table (worker.socket,
  // worker.local_size, worker.reduce_threads: config/cluster_knobs.cc).
  config::DaemonCommandLine cli(
      {"bitpush-worker",
       kSummary,
       kExitStatus,
       {{"--rank", "N", "this node's rank in cluster.workers", config::FlagKind::kCount, true},
        {"--no-sweep", "", "keep other processes' leftover shared-memory segments",
         config::FlagKind::kSwitch}}});
  if (int exit_code = cli.ParseOrExit(argc, argv); exit_code >= 0) return exit_code;
  const config::ClusterConfig& config = cli.config();
  const uint64_t rank_flag = cli.flags().count("--rank", 0);
  if (rank_flag >= config.workers.size()) {
    return cli.UsageError("--rank " + std::to_string(rank_flag) + " but " + cli.config_path() +
                          " lists " + std::to_string(config.workers.size()) + " worker(s)");
  }
  // Keys are configuration: a missing or unsafe key file is a config error (exit 2).
  if (Status s = config::NodeTransportSecurity(
                     config, node::NodePeerId(v1::ROLE_WORKER, static_cast<uint32_t>(rank_flag)))
                     .status();
      !s.ok()) {
    return cli.ConfigError(s.message());
  }
  const long rank = static_cast<long>(rank_flag);
  const std::string socket_path = cli.knob_flag("worker.socket").value_or(config::KnobValue{}).text;

  // SIGINT/SIGTERM stop the daemon from their own thread (common/termination_signals.h).
  std::atomic<worker::Daemon*> running{nullptr};
  TerminationSignals signals([&](int) {
    worker::ipc::UnlinkAllSegments();
    if (worker::Daemon* d = running.load()) d->Stop();
    // Before the daemon runs (still registering) Create returns on its own only after the
    // startup timeout: end now. The socket file of a daemon that never ran is removed here.
    if (running.load() == nullptr) {
      const std::string path =
          worker::DaemonSocketPath(socket_path, config, static_cast<uint32_t>(rank));
      unlink(path.c_str());
      std::fprintf(stderr, "bitpush-worker node %ld: interrupted while starting\n", rank);
      _exit(0);
    }
  });

  // metrics.port (docs/metrics.md): served from before registration to the end.
  StatusOr<std::unique_ptr<config::NodeMetrics>> node_metrics =
      config::NodeMetrics::Start(config, v1::ROLE_WORKER, static_cast<uint32_t>(rank));
  if (!node_metrics.ok()) {
    std::fprintf(stderr, "bitpush-worker node %ld: %s\n", rank,
                 node_metrics.status().ToString().c_str());
    return 1;
  }

  worker::DaemonOptions o;
  o.cluster = config;  // --reduce-threads is in it (a knob flag that sets the knob)
  o.rank = static_cast<uint32_t>(rank);
  o.socket_path = socket_path;
  o.local_size = static_cast<uint32_t>(
      cli.knob_flag("worker.local_size").value_or(config::KnobValue{}).number);
  o.sweep_stale_segments = !cli.flags().has("--no-sweep");
  StatusOr<std::unique_ptr<worker::Daemon>> daemon = worker::Daemon::Create(std::move(o));
  int code = 0;
  if (!daemon.ok()) {
    std::fprintf(stderr, "bitpush-worker node %ld: %s\n", rank, daemon.status().ToString().c_str());
    code = 1;
  } else {
    std::printf("bitpush-worker node %ld: listening at %s\n", rank,
                (*daemon)->socket_path().c_str());
    std::fflush(stdout);
    // systemd (Type=notify, docs/deploy.md): ready once the socket is up.
    if (Status n = NotifyReady("node " + std::to_string(rank) + " listening at " +
                               (*daemon)->socket_path());
        !n.ok()) {
      BP_LOG_WARN("bitpush-worker node {}: {}", rank, n.ToString());
    }
    running.store(daemon->get());
    metrics::Registry::Registration engine_metrics;
    if (*node_metrics) {
      engine_metrics =
          (*node_metrics)->registry().Add([d = daemon->get()](metrics::MetricSet& set) {
            worker::AddEngineMetrics(d->engine(), set);
            worker::AddDaemonMetrics(*d, set);
          });
    }
    if (signals.received()) (*daemon)->Stop();
    const Status s = (*daemon)->Run();
    (void)NotifyStopping();
    signals.Stop();  // no on_signal may still use the daemon once it is destroyed below
    running.store(nullptr);
    if (!s.ok()) {
      std::fprintf(stderr, "bitpush-worker node %ld: %s\n", rank, s.ToString().c_str());
      code = 1;
    } else {
      std::printf("bitpush-worker node %ld: %s\n", rank,
                  signals.received() ? "stopped by a signal" : "clean shutdown");
    }
    engine_metrics.Reset();  // no scrape reads the daemon from here on
    daemon->reset();
  }
  signals.Stop();
  worker::ipc::UnlinkAllSegments();
  return code;
}
