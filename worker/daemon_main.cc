// bitpush-worker: the per-node worker daemon (worker/daemon.h, docs/local-ipc.md).
//
//   bitpush-worker --config cluster.yaml --rank N [--socket PATH] [--local-size P]
//                  [--reduce-threads T] [--no-sweep] [--log-level info]
//
// Is worker N of the cluster for the node's P training processes (worker::Client in daemon
// mode), which connect to PATH (default: worker.socket of the YAML, else
// /tmp/bitpush-<uid>-worker-<N>.sock). At start it removes the shared-memory segments of
// crashed processes of this user (SweepStaleSegments); --no-sweep skips that (tests that run
// beside other tests of the same user, which may be inspecting such leftovers). Prints
// "bitpush-worker node N: listening at PATH" on stdout once the socket is up.
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
#include "common/sd_notify.h"
#include "common/termination_signals.h"
#include "scheduler/cluster_config.h"
#include "worker/daemon.h"

namespace {

constexpr char kUsage[] =
    "usage: bitpush-worker --config CLUSTER.yaml --rank N [--socket PATH] [--local-size P]\n"
    "                      [--reduce-threads T] [--no-sweep]\n"
    "                      [--log-level trace|debug|info|warn|error]\n"
    "Runs the worker daemon of node N for its P training processes (docs/local-ipc.md).\n"
    "Exit status: 0 clean end or SIGINT/SIGTERM, 1 failure, 2 usage or config error.\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "bitpush-worker: %s\n%s", error.c_str(), kUsage);
  return 2;
}

bool ParseCount(const std::string& v, long* out) {
  char* end = nullptr;
  *out = std::strtol(v.c_str(), &end, 10);
  return !v.empty() && *end == '\0' && *out >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace bitpush;
  std::string config_path;
  std::string socket_path;
  std::string log_level = "info";
  long rank = -1;
  long local_size = 0;
  long reduce_threads = 0;
  bool sweep = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--no-sweep") {
      sweep = false;
      continue;
    }
    if (arg != "--config" && arg != "--rank" && arg != "--socket" && arg != "--local-size" &&
        arg != "--reduce-threads" && arg != "--log-level") {
      return Usage("unknown argument '" + arg + "'");
    }
    if (i + 1 >= argc) return Usage(arg + " needs a value");
    const std::string v = argv[++i];
    if (arg == "--config") {
      config_path = v;
    } else if (arg == "--socket") {
      socket_path = v;
    } else if (arg == "--log-level") {
      log_level = v;
    } else if (arg == "--rank") {
      if (!ParseCount(v, &rank))
        return Usage("--rank needs a non-negative integer, got '" + v + "'");
    } else if (arg == "--local-size") {
      if (!ParseCount(v, &local_size) || local_size < 1 || local_size > 1024) {
        return Usage("--local-size needs 1..1024, got '" + v + "'");
      }
    } else if (!ParseCount(v, &reduce_threads) || reduce_threads < 1 || reduce_threads > 256) {
      return Usage("--reduce-threads needs 1..256, got '" + v + "'");
    }
  }
  if (config_path.empty()) return Usage("--config is required");
  if (rank < 0) return Usage("--rank is required");
  if (!SetLogLevel(log_level)) return Usage("unknown log level '" + log_level + "'");
  StatusOr<scheduler::ClusterConfig> config = scheduler::LoadClusterConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "bitpush-worker: config error: %s\n", config.status().message().c_str());
    return 2;
  }
  if (static_cast<size_t>(rank) >= config->workers.size()) {
    return Usage("--rank " + std::to_string(rank) + " but " + config_path + " lists " +
                 std::to_string(config->workers.size()) + " worker(s)");
  }

  // SIGINT/SIGTERM stop the daemon from their own thread (common/termination_signals.h).
  std::atomic<worker::Daemon*> running{nullptr};
  TerminationSignals signals([&](int) {
    worker::ipc::UnlinkAllSegments();
    if (worker::Daemon* d = running.load()) d->Stop();
    // Before the daemon runs (still registering) Create returns on its own only after the
    // startup timeout: end now. The socket file of a daemon that never ran is removed here.
    if (running.load() == nullptr) {
      const std::string path =
          worker::DaemonSocketPath(socket_path, *config, static_cast<uint32_t>(rank));
      unlink(path.c_str());
      std::fprintf(stderr, "bitpush-worker node %ld: interrupted while starting\n", rank);
      _exit(0);
    }
  });

  worker::DaemonOptions o;
  o.cluster = *config;
  o.rank = static_cast<uint32_t>(rank);
  o.socket_path = socket_path;
  o.local_size = static_cast<uint32_t>(local_size);
  o.reduce_threads = static_cast<uint32_t>(reduce_threads);
  o.sweep_stale_segments = sweep;
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
    daemon->reset();
  }
  signals.Stop();
  worker::ipc::UnlinkAllSegments();
  return code;
}
