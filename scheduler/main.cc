// bitpush-scheduler: the control-plane daemon of one cluster.
//
//   bitpush-scheduler --config cluster.yaml [--set KEY=VALUE]... [--log-level info]
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
#include "config/daemon_command_line.h"
#include "config/node_metrics.h"
#include "config/node_security.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_metrics.h"

namespace {

constexpr char kSummary[] =
    "Runs the control plane of the cluster described by CLUSTER.yaml (docs/config.md).";
constexpr char kExitStatus[] =
    "Exit status: 0 clean shutdown or stopped by SIGINT/SIGTERM, 1 failure, 2 usage or config "
    "error.";

}  // namespace

int main(int argc, char** argv) {
  using namespace bitpush;
  config::DaemonCommandLine cli({"bitpush-scheduler", kSummary, kExitStatus, {}});
  if (int exit_code = cli.ParseOrExit(argc, argv); exit_code >= 0) return exit_code;
  // Keys are configuration: a missing or unsafe key file is a config error (exit 2).
  if (Status s = config::NodeTransportSecurity(cli.config(), node::kSchedulerPeerId).status();
      !s.ok()) {
    return cli.ConfigError(s.message());
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
  options.cluster = cli.config();
  StatusOr<std::unique_ptr<scheduler::Scheduler>> sched =
      scheduler::Scheduler::Create(std::move(options));
  if (!sched.ok()) {
    std::fprintf(stderr, "bitpush-scheduler: error: %s\n", sched.status().ToString().c_str());
    return 1;
  }
  running = sched->get();
  // metrics.port (docs/metrics.md).
  StatusOr<std::unique_ptr<config::NodeMetrics>> node_metrics =
      config::NodeMetrics::Start(cli.config(), v1::ROLE_SCHEDULER, 0);
  if (!node_metrics.ok()) {
    std::fprintf(stderr, "bitpush-scheduler: error: %s\n",
                 node_metrics.status().ToString().c_str());
    return 1;
  }
  metrics::Registry::Registration scheduler_metrics;
  if (*node_metrics) {
    scheduler_metrics =
        (*node_metrics)->registry().Add([s = sched->get()](metrics::MetricSet& set) {
          scheduler::AddSchedulerMetrics(*s, set);
        });
  }
  // systemd (Type=notify, docs/deploy.md): ready once the endpoint is bound.
  if (Status n = NotifyReady("listening at " + (*sched)->address()); !n.ok()) {
    BP_LOG_WARN("bitpush-scheduler: {}", n.ToString());
  }
  const Status result = (*sched)->Run();
  (void)NotifyStopping();
  signals.Stop();
  running = nullptr;
  scheduler_metrics.Reset();  // no scrape reads the scheduler from here on
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
