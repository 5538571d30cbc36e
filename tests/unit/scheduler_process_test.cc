// The control plane as real processes: build/bin/bitpush-scheduler and bitpush-test-node on
// loopback (the scheduler on tcp://127.0.0.1, nodes on tcp or ipc:// in a temp dir), with
// short heartbeats (100 ms interval, 1000 ms timeout). Checks start order, crash detection
// within heartbeat_timeout + 1 s (measured from the SIGKILL to each survivor's exit), the
// missing-node verdict, exit codes and messages. Every child is killed and reaped by the
// test whatever happens (and dies with the test process: PR_SET_PDEATHSIG); every wait is
// bounded (tests/harness/child_process.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness/child_process.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"

#ifndef BITPUSH_SCHEDULER_BIN
#error "BITPUSH_SCHEDULER_BIN must be defined (tests/CMakeLists.txt)"
#endif
#ifndef BITPUSH_TEST_NODE_BIN
#error "BITPUSH_TEST_NODE_BIN must be defined (tests/CMakeLists.txt)"
#endif

namespace bitpush::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kHeartbeatIntervalMs = 100;
constexpr int kHeartbeatTimeoutMs = 1000;
// The failure-detection bound: a death is reported within heartbeat_timeout + 1 s.
constexpr int kDetectionBoundMs = kHeartbeatTimeoutMs + 1000;

class SchedulerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreeTcpPort();
    ASSERT_GT(port_, 0);
    scheduler_address_ = "tcp://127.0.0.1:" + std::to_string(port_);
  }

  void TearDown() override {
    if (HasFailure()) {
      for (const auto& c : children_) {
        std::cerr << "---- " << c->label() << " (exit " << c->exit_code() << ") ----\n"
                  << c->output();
      }
    }
    children_.clear();  // kills and reaps what still runs
  }

  // Writes the cluster YAML (TestClusterConfig, tests/harness/test_cluster.h); node addresses
  // are ipc:// in the temp dir, or free tcp ports.
  void WriteConfig(int servers, int workers, double startup_timeout_s, bool tcp_nodes = false,
                   int heartbeat_timeout_ms = kHeartbeatTimeoutMs) {
    TestClusterOptions t;
    t.servers = static_cast<uint32_t>(servers);
    t.workers = static_cast<uint32_t>(workers);
    t.transport = tcp_nodes ? TestTransport::kTcp : TestTransport::kIpc;
    t.ipc_dir = dir_.path();
    t.scheduler_address = scheduler_address_;
    t.token = "process-test-token";
    t.heartbeat_interval = milliseconds(kHeartbeatIntervalMs);
    t.heartbeat_timeout = milliseconds(heartbeat_timeout_ms);
    t.startup_timeout = milliseconds(static_cast<int64_t>(startup_timeout_s * 1000));
    t.compression.spec = "onebit";
    t.compression.error_feedback = "both";
    const config::ClusterConfig c = TestClusterConfig(t);
    server_addresses_ = c.servers;
    worker_addresses_ = c.workers;
    config_ = dir_.path() + "/cluster.yaml";
    ASSERT_TRUE(WriteTestClusterYaml(c, config_).ok());
  }

  Child* StartScheduler() {
    return Add("scheduler", {BITPUSH_SCHEDULER_BIN, "--config", config_}, "scheduler.log");
  }

  Child* StartNode(const std::string& role, int rank, int run_ms, int barriers) {
    const std::string label = role + " " + std::to_string(rank);
    return Add(
        label,
        {BITPUSH_TEST_NODE_BIN, "--config", config_, "--role", role, "--rank", std::to_string(rank),
         "--run-ms", std::to_string(run_ms), "--barriers", std::to_string(barriers)},
        role + std::to_string(rank) + ".log");
  }

  Child* Add(const std::string& label, const std::vector<std::string>& argv,
             const std::string& log) {
    children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log));
    EXPECT_TRUE(children_.back()->spawned()) << label;
    return children_.back().get();
  }

  TempDir dir_;
  int port_ = 0;
  std::string scheduler_address_;
  std::string config_;
  std::vector<std::string> server_addresses_;
  std::vector<std::string> worker_addresses_;
  std::vector<std::unique_ptr<Child>> children_;
};

TEST_F(SchedulerProcessTest, SchedulerStartedLastStillFormsTheCluster) {
  WriteConfig(2, 2, /*startup_timeout_s=*/10, /*tcp_nodes=*/true);
  std::vector<Child*> all;
  for (int i = 0; i < 2; ++i) all.push_back(StartNode("server", i, 300, 2));
  for (int i = 0; i < 2; ++i) all.push_back(StartNode("worker", i, 300, 2));
  std::this_thread::sleep_for(milliseconds(700));  // the nodes retry meanwhile
  all.push_back(StartScheduler());
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(20000)));
  for (Child* c : all) {
    EXPECT_EQ(c->exit_code(), 0) << c->label() << ":\n" << c->output();
  }
  EXPECT_CONTAINS(all.back()->output(), "every worker is done");
}

TEST_F(SchedulerProcessTest, KilledServerIsReportedToEveryOtherNode) {
  WriteConfig(2, 2, 10);
  Child* sched = StartScheduler();
  std::vector<Child*> nodes;
  for (int i = 0; i < 2; ++i) nodes.push_back(StartNode("server", i, 60000, 1));
  for (int i = 0; i < 2; ++i) nodes.push_back(StartNode("worker", i, 60000, 1));
  ASSERT_TRUE(WaitForOutput(*sched, "sending assignments", milliseconds(10000)));
  for (Child* n : nodes) ASSERT_TRUE(WaitForOutput(*n, "assigned:", milliseconds(5000)));
  std::this_thread::sleep_for(milliseconds(300));  // a few heartbeats of steady state

  Child* victim = nodes[0];
  const Clock::time_point killed = Clock::now();
  victim->Signal(SIGKILL);
  std::vector<Child*> survivors = {sched, nodes[1], nodes[2], nodes[3]};
  ASSERT_TRUE(WaitAll(survivors, killed + milliseconds(kDetectionBoundMs + 3000)));
  ASSERT_TRUE(WaitAll({victim}, Clock::now() + milliseconds(1000)));
  EXPECT_EQ(victim->exit_code(), 128 + SIGKILL);

  const std::string dead = "server 0 at " + server_addresses_[0] + " failed";
  for (Child* c : {nodes[1], nodes[2], nodes[3]}) {
    const int64_t latency = MsBetween(killed, c->exited_at());
    std::cout << "[latency] server 0 SIGKILLed -> " << c->label() << " exited after " << latency
              << " ms (bound " << kDetectionBoundMs << " ms)\n";
    EXPECT_NE(c->exit_code(), 0) << c->label();
    EXPECT_LE(latency, kDetectionBoundMs) << c->label();
    const std::string out = c->output();
    EXPECT_CONTAINS(out, "bitpush-test-node " + c->label() + ": error:");
    EXPECT_CONTAINS(out, dead);
  }
  std::cout << "[latency] server 0 SIGKILLed -> scheduler exited after "
            << MsBetween(killed, sched->exited_at()) << " ms\n";
  EXPECT_EQ(sched->exit_code(), 1);
  EXPECT_CONTAINS(sched->output(), dead);
}

TEST_F(SchedulerProcessTest, KilledSchedulerMakesEveryNodeExitNonZero) {
  WriteConfig(1, 2, 10);
  Child* sched = StartScheduler();
  std::vector<Child*> nodes;
  nodes.push_back(StartNode("server", 0, 60000, 1));
  for (int i = 0; i < 2; ++i) nodes.push_back(StartNode("worker", i, 60000, 1));
  ASSERT_TRUE(WaitForOutput(*sched, "sending assignments", milliseconds(10000)));
  for (Child* n : nodes) ASSERT_TRUE(WaitForOutput(*n, "assigned:", milliseconds(5000)));
  std::this_thread::sleep_for(milliseconds(300));

  const Clock::time_point killed = Clock::now();
  sched->Signal(SIGKILL);
  ASSERT_TRUE(WaitAll(nodes, killed + milliseconds(kDetectionBoundMs + 3000)));
  for (Child* c : nodes) {
    const int64_t latency = MsBetween(killed, c->exited_at());
    std::cout << "[latency] scheduler SIGKILLed -> " << c->label() << " exited after " << latency
              << " ms (bound " << kDetectionBoundMs << " ms)\n";
    EXPECT_NE(c->exit_code(), 0) << c->label();
    EXPECT_LE(latency, kDetectionBoundMs) << c->label();
    EXPECT_CONTAINS(c->output(), "scheduler at " + scheduler_address_ + " silent for");
  }
}

TEST_F(SchedulerProcessTest, MissingNodeMakesTheSchedulerExitNamingIt) {
  WriteConfig(2, 2, /*startup_timeout_s=*/2);
  Child* sched = StartScheduler();
  std::vector<Child*> all = {sched};
  all.push_back(StartNode("server", 0, 0, 0));
  all.push_back(StartNode("server", 1, 0, 0));
  all.push_back(StartNode("worker", 0, 0, 0));  // worker 1 never starts
  const Clock::time_point start = Clock::now();
  // Bound: the startup timeout plus at most one heartbeat timeout waiting for shutdown acks.
  ASSERT_TRUE(WaitAll(all, start + milliseconds(2000 + kHeartbeatTimeoutMs + 2000)));
  const int64_t took = MsBetween(start, sched->exited_at());
  std::cout << "[latency] missing worker 1 -> scheduler exited after " << took
            << " ms (startup timeout 2000 ms)\n";
  EXPECT_EQ(sched->exit_code(), 1);
  EXPECT_GE(took, 2000 - 200);
  EXPECT_LE(took, 2000 + kHeartbeatTimeoutMs + 500);
  const std::string out = sched->output();
  EXPECT_CONTAINS(out,
                  "bitpush-scheduler: error: Timeout: startup timeout: 1 of 4 nodes did not "
                  "register within 2000 ms: worker rank 1 at " +
                      worker_addresses_[1]);
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_EQ(all[i]->exit_code(), 1) << all[i]->label();
    EXPECT_CONTAINS(all[i]->output(), "worker rank 1 at " + worker_addresses_[1]);
  }
}

TEST_F(SchedulerProcessTest, NodeGivesUpOnASchedulerThatNeverStarts) {
  WriteConfig(1, 1, /*startup_timeout_s=*/1);
  Child* node = StartNode("worker", 0, 0, 0);
  ASSERT_TRUE(WaitAll({node}, Clock::now() + milliseconds(5000)));
  EXPECT_EQ(node->exit_code(), 1);
  EXPECT_CONTAINS(node->output(), "no answer from the scheduler at " + scheduler_address_);
}

TEST_F(SchedulerProcessTest, SigtermInterruptsTheCluster) {
  WriteConfig(1, 1, 10);
  Child* sched = StartScheduler();
  Child* server = StartNode("server", 0, 60000, 0);
  Child* worker = StartNode("worker", 0, 60000, 0);
  ASSERT_TRUE(WaitForOutput(*sched, "sending assignments", milliseconds(10000)));
  sched->Signal(SIGTERM);
  ASSERT_TRUE(WaitAll({sched, server, worker}, Clock::now() + milliseconds(5000)));
  EXPECT_EQ(sched->exit_code(), 0);  // stopped as asked (systemctl stop: inactive, not failed)
  EXPECT_CONTAINS(sched->output(), "scheduler interrupted");
  EXPECT_CONTAINS(sched->output(), "bitpush-scheduler: stopped by a signal");
  for (Child* c : {server, worker}) {
    EXPECT_EQ(c->exit_code(), 1) << c->label();
    EXPECT_CONTAINS(c->output(), "shut the cluster down: scheduler interrupted");
  }
}

// The launcher stopping a cluster after one process died: every node is gone when the scheduler
// is told to stop, and its teardown says once that the Shutdown reached none of them instead of
// warning per node ("cannot send Shutdown to ...: peer ... disconnected"), which buried the
// cause in the log. (Heartbeat timeout 10 s: the scheduler sees the nodes disconnect, not die.)
TEST_F(SchedulerProcessTest, ATeardownAfterTheNodesWentAwayNamesThemOnceWithoutWarnings) {
  WriteConfig(1, 2, 10, /*tcp_nodes=*/true, /*heartbeat_timeout_ms=*/10000);
  Child* sched = StartScheduler();
  std::vector<Child*> nodes = {StartNode("server", 0, 60000, 0), StartNode("worker", 0, 60000, 0),
                               StartNode("worker", 1, 60000, 0)};
  ASSERT_TRUE(WaitForOutput(*sched, "sending assignments", milliseconds(10000)));
  for (Child* n : nodes) ASSERT_TRUE(WaitForOutput(*n, "assigned:", milliseconds(5000)));
  nodes[2]->Signal(SIGKILL);  // the process that died; the launcher then stops the others
  nodes[1]->Signal(SIGKILL);
  nodes[0]->Signal(SIGKILL);
  ASSERT_TRUE(WaitAll(nodes, Clock::now() + milliseconds(5000)));
  for (const char* peer : {"server:0", "worker:0", "worker:1"}) {
    ASSERT_TRUE(WaitForOutput(*sched, std::string("transport event: ") + peer + " disconnected",
                              milliseconds(5000)))
        << peer;
  }
  sched->Signal(SIGTERM);
  ASSERT_TRUE(WaitAll({sched}, Clock::now() + milliseconds(5000)));
  EXPECT_EQ(sched->exit_code(), 0);
  const std::string out = sched->output();
  EXPECT_EQ(out.find("cannot send Shutdown"), std::string::npos) << out;
  EXPECT_EQ(out.find("[warning] scheduler: cannot"), std::string::npos) << out;
  EXPECT_CONTAINS(out,
                  "Shutdown not sent to 3 node(s) no longer reachable: worker:0, worker:1, "
                  "server:0 (the first: ");
  EXPECT_CONTAINS(out, "peer 'worker:0' at " + worker_addresses_[0] + " disconnected)");
}

TEST_F(SchedulerProcessTest, ConfigAndUsageErrorsExitTwo) {
  config_ = dir_.path() + "/bad.yaml";
  std::ofstream(config_) << "cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n"
                            "  workers: [127.0.0.1:3]\n  heartbeat_interval: 5\n";
  Child* bad = StartScheduler();
  Child* usage = Add("usage", {BITPUSH_SCHEDULER_BIN, "--bogus"}, "usage.log");
  Child* node = Add("node usage", {BITPUSH_TEST_NODE_BIN, "--config", config_}, "node.log");
  ASSERT_TRUE(WaitAll({bad, usage, node}, Clock::now() + milliseconds(5000)));
  EXPECT_EQ(bad->exit_code(), 2);
  EXPECT_CONTAINS(bad->output(), "bad.yaml:5: cluster.heartbeat_interval: unknown key");
  EXPECT_EQ(usage->exit_code(), 2);
  EXPECT_CONTAINS(usage->output(), "unknown argument '--bogus'");
  EXPECT_EQ(node->exit_code(), 2);
  EXPECT_CONTAINS(node->output(), "--role and --rank are required");
}

}  // namespace
}  // namespace bitpush::testing
