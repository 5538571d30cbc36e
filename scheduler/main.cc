// bitpush-scheduler: the control-plane daemon of one cluster.
//
//   bitpush-scheduler --config cluster.yaml [--log-level info]
//
// Exit status: 0 clean shutdown (every worker said Done) or stopped by SIGINT/SIGTERM (as
// asked: `systemctl stop` leaves the unit inactive, not failed); 1 a failure (a node missing
// after cluster.startup_timeout_s, a node declared dead, the listen address unusable); 2 a
// usage or config error. See docs/config.md and docs/architecture.md.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/logging.h"
#include "common/sd_notify.h"
#include "common/termination_signals.h"
#include "scheduler/cluster_config.h"
#include "scheduler/scheduler.h"

namespace {

constexpr char kUsage[] =
    "usage: bitpush-scheduler --config CLUSTER.yaml [--log-level trace|debug|info|warn|error]\n"
    "Runs the control plane of the cluster described by CLUSTER.yaml (docs/config.md).\n"
    "Exit status: 0 clean shutdown or stopped by SIGINT/SIGTERM, 1 failure, 2 usage or config "
    "error.\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "bitpush-scheduler: %s\n%s", error.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace bitpush;
  std::string config_path;
  std::string log_level = "info";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) return nullptr;
      (void)flag;
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--config") {
      const char* v = value("--config");
      if (v == nullptr) return Usage("--config needs a path");
      config_path = v;
    } else if (arg == "--log-level") {
      const char* v = value("--log-level");
      if (v == nullptr) return Usage("--log-level needs a level");
      log_level = v;
    } else {
      return Usage("unknown argument '" + arg + "'");
    }
  }
  if (config_path.empty()) return Usage("--config is required");
  if (!SetLogLevel(log_level)) return Usage("unknown log level '" + log_level + "'");

  StatusOr<scheduler::ClusterConfig> config = scheduler::LoadClusterConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "bitpush-scheduler: config error: %s\n",
                 config.status().message().c_str());
    return 2;
  }

  // SIGINT/SIGTERM stop the scheduler from their own thread (common/termination_signals.h).
  std::atomic<scheduler::Scheduler*> running{nullptr};
  TerminationSignals signals([&running](int sig) {
    scheduler::Scheduler* s = running.load();
    BP_LOG_WARN("bitpush-scheduler: received {}; shutting the cluster down", strsignal(sig));
    if (s == nullptr) std::_Exit(0);  // not started yet: nothing to shut down
    s->Stop();
  });

  scheduler::SchedulerOptions options;
  options.cluster = *config;
  StatusOr<std::unique_ptr<scheduler::Scheduler>> sched =
      scheduler::Scheduler::Create(std::move(options));
  if (!sched.ok()) {
    std::fprintf(stderr, "bitpush-scheduler: error: %s\n", sched.status().ToString().c_str());
    return 1;
  }
  running = sched->get();
  // systemd (Type=notify, docs/deploy.md): ready once the endpoint is bound.
  if (Status n = NotifyReady("listening at " + (*sched)->address()); !n.ok()) {
    BP_LOG_WARN("bitpush-scheduler: {}", n.ToString());
  }
  const Status result = (*sched)->Run();
  (void)NotifyStopping();
  signals.Stop();
  running = nullptr;
  sched->reset();
  if (signals.received() && result.code() == StatusCode::kCancelled) {
    // Stopped as asked; the nodes learn it from the scheduler's Shutdown or its silence.
    BP_LOG_INFO("bitpush-scheduler: stopped by a signal");
    return 0;
  }
  if (!result.ok()) {
    std::fprintf(stderr, "bitpush-scheduler: error: %s\n", result.ToString().c_str());
    return 1;
  }
  BP_LOG_INFO("bitpush-scheduler: every worker is done; clean shutdown");
  return 0;
}
