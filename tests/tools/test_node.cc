// bitpush-test-node: a minimal server or worker process — the control plane only. Used by the
// multi-process tests (tests/unit/scheduler_process_test.cc) and handy to smoke-test a
// cluster YAML with the real bitpush-scheduler:
//
//   bitpush-test-node --config cluster.yaml --role server|worker --rank N
//                     [--run-ms M] [--barriers K] [--shutdown-wait-ms W] [--log-level L]
//
// It registers, passes K barriers of group "all", keeps heartbeating for M ms (default 0),
// then (workers) sends Done and waits, at most W ms (default: M + 2 x startup timeout +
// 2 x heartbeat timeout), for the scheduler's shutdown. Exit status 0 on a clean shutdown;
// 1 with "bitpush-test-node ROLE RANK: error: ..." on stderr otherwise; 2 for a usage or
// config error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "scheduler/cluster_config.h"
#include "scheduler/scheduler_client.h"

namespace {

using namespace bitpush;
using std::chrono::milliseconds;

constexpr char kUsage[] =
    "usage: bitpush-test-node --config CLUSTER.yaml --role server|worker --rank N\n"
    "                         [--run-ms M] [--barriers K] [--shutdown-wait-ms W]\n"
    "                         [--log-level trace|debug|info|warn|error]\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "bitpush-test-node: %s\n%s", error.c_str(), kUsage);
  return 2;
}

bool ParseInt(const char* text, long long* out) {
  char* end = nullptr;
  *out = std::strtoll(text, &end, 10);
  return end != text && *end == '\0' && *out >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, role_name, log_level = "info";
  long long rank = -1, run_ms = 0, barriers = 0, shutdown_wait_ms = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) return Usage(arg + " needs a value (or is unknown)");
    const char* v = argv[++i];
    if (arg == "--config") {
      config_path = v;
    } else if (arg == "--role") {
      role_name = v;
    } else if (arg == "--log-level") {
      log_level = v;
    } else if (arg == "--rank" || arg == "--run-ms" || arg == "--barriers" ||
               arg == "--shutdown-wait-ms") {
      long long n = 0;
      if (!ParseInt(v, &n)) return Usage(arg + " needs a non-negative integer, got '" + v + "'");
      (arg == "--rank"       ? rank
       : arg == "--run-ms"   ? run_ms
       : arg == "--barriers" ? barriers
                             : shutdown_wait_ms) = n;
    } else {
      return Usage("unknown argument '" + arg + "'");
    }
  }
  if (config_path.empty() || role_name.empty() || rank < 0) {
    return Usage("--config, --role and --rank are required");
  }
  if (!SetLogLevel(log_level)) return Usage("unknown log level '" + log_level + "'");
  StatusOr<v1::Role> role = scheduler::ParseNodeRole(role_name);
  if (!role.ok()) return Usage(role.status().message());
  StatusOr<scheduler::ClusterConfig> config = scheduler::LoadClusterConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "bitpush-test-node: config error: %s\n",
                 config.status().message().c_str());
    return 2;
  }
  const std::string label = role_name + " " + std::to_string(rank);
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "bitpush-test-node %s: error: %s\n", label.c_str(), s.ToString().c_str());
    return 1;
  };
  if (shutdown_wait_ms < 0) {
    shutdown_wait_ms =
        run_ms + 2 * (config->startup_timeout.count() + config->heartbeat_timeout.count());
  }

  scheduler::SchedulerClientOptions options;
  options.cluster = *config;
  options.role = *role;
  options.rank = static_cast<uint32_t>(rank);
  options.capabilities = {"transport:" + config->transport};
  StatusOr<std::unique_ptr<scheduler::SchedulerClient>> made =
      scheduler::SchedulerClient::Create(std::move(options));
  if (!made.ok()) return fail(made.status());
  scheduler::SchedulerClient& client = **made;

  if (Status s = client.Register(); !s.ok()) return fail(s);
  for (long long b = 0; b < barriers; ++b) {
    if (Status s = client.Barrier(v1::GROUP_ALL); !s.ok()) return fail(s);
  }
  // Run: heartbeats flow on the client's thread; any failure ends the wait early.
  (void)client.WaitForShutdown(milliseconds(run_ms));
  if (Status s = client.status(); !s.ok()) return fail(s);
  if (*role == v1::ROLE_WORKER && !client.shut_down()) {
    if (Status s = client.Done(); !s.ok()) return fail(s);
  }
  if (Status s = client.WaitForShutdown(milliseconds(shutdown_wait_ms)); !s.ok()) return fail(s);
  BP_LOG_INFO("bitpush-test-node {}: clean shutdown", label);
  return 0;
}
