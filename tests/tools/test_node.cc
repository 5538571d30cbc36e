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
//
//   bitpush-test-node keygen CONFIG DIR
//
// writes the CURVE keys of CONFIG's nodes into DIR as `bitpush keygen` does (for test trees
// built without the Python package, e.g. the sanitizer trees' systemd boot test).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/security/keys.h"
#include "config/daemon_command_line.h"
#include "config/node_security.h"
#include "scheduler/scheduler_client.h"

namespace {

using namespace bitpush;
using std::chrono::milliseconds;

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "keygen") {
    StatusOr<config::ClusterConfig> c = config::LoadClusterConfig(argv[2]);
    StatusOr<std::vector<std::string>> written =
        c.ok() ? security::WriteClusterKeys(argv[3], config::ClusterNodeNames(*c), false)
               : StatusOr<std::vector<std::string>>(c.status());
    if (!written.ok()) {
      std::fprintf(stderr, "bitpush-test-node keygen: %s\n", written.status().ToString().c_str());
      return 2;
    }
    return 0;
  }
  config::DaemonCommandLine cli(
      {"bitpush-test-node",
       "",
       "",
       {{"--role", "server|worker", "the node's role", config::FlagKind::kText, true},
        {"--rank", "N", "the node's rank", config::FlagKind::kCount, true},
        {"--run-ms", "M", "heartbeat this long after the barriers (default 0)",
         config::FlagKind::kCount},
        {"--barriers", "K", "barriers of group all to pass (default 0)", config::FlagKind::kCount},
        {"--shutdown-wait-ms", "W", "bound on the wait for the scheduler's shutdown",
         config::FlagKind::kCount}}});
  if (int exit_code = cli.ParseOrExit(argc, argv); exit_code >= 0) return exit_code;
  const std::string role_name = cli.flags().text("--role");
  StatusOr<v1::Role> role = config::ParseNodeRole(role_name);
  if (!role.ok()) return cli.UsageError(role.status().message());
  const config::ClusterConfig* config = &cli.config();
  const long long rank = static_cast<long long>(cli.flags().count("--rank", 0));
  const long long run_ms = static_cast<long long>(cli.flags().count("--run-ms", 0));
  const long long barriers = static_cast<long long>(cli.flags().count("--barriers", 0));
  long long shutdown_wait_ms =
      cli.flags().has("--shutdown-wait-ms")
          ? static_cast<long long>(cli.flags().count("--shutdown-wait-ms", 0))
          : -1;
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
