// Metrics of a running cluster of real processes (docs/metrics.md): bitpush-scheduler,
// bitpush-server, and worker nodes both ways — bitpush-test-worker (an embedded worker Client)
// and a bitpush-worker daemon serving bitpush-test-trainer — on loopback with metrics.port set.
// Each role's /metrics is scraped twice while push_pull rounds run, and the counters that
// describe the rounds (rounds, pushes, bytes raw and compressed, stage time, transport bytes)
// are present and grow; the process's resident memory is reported; every process still exits
// 0. Every wait is bounded and every child is killed and reaped whatever happens.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness/child_process.h"
#include "tests/harness/http_get.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"

#ifndef BITPUSH_SCHEDULER_BIN
#error "BITPUSH_SCHEDULER_BIN must be defined (tests/CMakeLists.txt)"
#endif
#ifndef BITPUSH_SERVER_BIN
#error "BITPUSH_SERVER_BIN must be defined (tests/CMakeLists.txt)"
#endif
#ifndef BITPUSH_TEST_WORKER_BIN
#error "BITPUSH_TEST_WORKER_BIN must be defined (tests/CMakeLists.txt)"
#endif
#ifndef BITPUSH_DAEMON_BIN
#error "BITPUSH_DAEMON_BIN must be defined (tests/CMakeLists.txt)"
#endif
#ifndef BITPUSH_TEST_TRAINER_BIN
#error "BITPUSH_TEST_TRAINER_BIN must be defined (tests/CMakeLists.txt)"
#endif

namespace bitpush::testing {
namespace {

using std::chrono::milliseconds;

// A first port from which `count` consecutive ports bind on 127.0.0.1 now, below the ephemeral
// range and apart from `taken` (the cluster's own ports); -1 when none is found.
int FreeConsecutivePorts(int count, const std::set<int>& taken) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int first = FreeTcpPort();
    if (first <= 0 || first + count > 32768) continue;
    bool ok = true;
    for (int p = first; p < first + count && ok; ++p) {
      if (taken.count(p) != 0) ok = false;
    }
    for (int p = first + 1; p < first + count && ok; ++p) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(p));
      ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      if (fd >= 0) close(fd);
    }
    if (ok) return first;
  }
  return -1;
}

int PortOf(const std::string& url) {
  return std::atoi(url.c_str() + url.rfind(':') + 1);
}

class MetricsProcessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) std::cerr << DescribeChildren(children_);
    children_.clear();  // kills and reaps what still runs
  }

  // S servers, W worker nodes on free tcp ports; onebit with error feedback on both sides (so
  // raw and compressed bytes differ); metrics.port on 1 + S + W free consecutive ports.
  void WriteConfig(int servers, int workers, uint32_t local_size) {
    TestClusterOptions t;
    t.servers = static_cast<uint32_t>(servers);
    t.workers = static_cast<uint32_t>(workers);
    t.transport = TestTransport::kTcp;
    t.heartbeat_interval = milliseconds(100);
    t.heartbeat_timeout = milliseconds(2000);
    t.startup_timeout = milliseconds(15000);
    t.compression.spec = "onebit";
    t.compression.error_feedback = "both";
    t.compression.min_compress_bytes = 0;
    t.compression.partition_bytes = 1 << 18;
    t.worker.op_timeout = milliseconds(20000);
    t.worker.local_size = local_size;
    t.worker.socket = dir_.path() + "/worker-{rank}.sock";
    config_ = TestClusterConfig(t);
    std::set<int> taken = {PortOf(config_.scheduler_address)};
    for (const std::string& a : config_.servers) taken.insert(PortOf(a));
    for (const std::string& a : config_.workers) taken.insert(PortOf(a));
    const int first = FreeConsecutivePorts(1 + servers + workers, taken);
    ASSERT_GT(first, 0) << "no free consecutive ports";
    config_.metrics.port = static_cast<uint32_t>(first);
    path_ = dir_.path() + "/cluster.yaml";
    ASSERT_TRUE(WriteTestClusterYaml(config_, path_).ok());
  }

  Child* Add(const std::string& label, const std::vector<std::string>& argv,
             const std::string& log) {
    children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log));
    EXPECT_TRUE(children_.back()->spawned()) << label;
    return children_.back().get();
  }

  void StartSchedulerAndServers(int servers) {
    Add("scheduler", {BITPUSH_SCHEDULER_BIN, "--config", path_}, "scheduler.log");
    for (int s = 0; s < servers; ++s) {
      const std::string r = std::to_string(s);
      Add("server " + r, {BITPUSH_SERVER_BIN, "--config", path_, "--rank", r},
          "server" + r + ".log");
    }
  }

  int Port(v1::Role role, uint32_t rank) const {
    return static_cast<int>(config_.MetricsPort(role, rank));
  }

  // GET /metrics of (role, rank): 200 and the node's info line, or a test failure.
  std::string Scrape(v1::Role role, uint32_t rank) {
    const HttpAnswer a = HttpGet(Port(role, rank), "/metrics");
    EXPECT_EQ(a.status, 200) << "role " << role << " rank " << rank << " at port "
                             << Port(role, rank);
    EXPECT_GT(SampleValue(a.body, "process_resident_memory_bytes"), 1e5) << a.body;
    return a.body;
  }

  // `series` is present in both scrapes and grew from the first to the second.
  static void ExpectGrew(const std::string& before, const std::string& after,
                         const std::string& series) {
    const double b = SampleValue(before, series);
    const double a = SampleValue(after, series);
    EXPECT_GE(b, 0) << series << " missing:\n" << before;
    EXPECT_GT(a, b) << series << " did not grow:\n" << after;
  }

  TempDir dir_;
  config::ClusterConfig config_;
  std::string path_;
  std::vector<std::unique_ptr<Child>> children_;
};

TEST_F(MetricsProcessTest, EveryRoleServesGrowingCountersDuringARun) {
  constexpr int kServers = 2;
  constexpr int kWorkers = 2;
  WriteConfig(kServers, kWorkers, 0);
  StartSchedulerAndServers(kServers);
  std::vector<Child*> workers;
  for (int w = 0; w < kWorkers; ++w) {
    const std::string r = std::to_string(w);
    workers.push_back(Add("worker " + r,
                          {BITPUSH_TEST_WORKER_BIN, "--config", path_, "--rank", r, "--tensor-mb",
                           "1", "--iters", "60", "--pause-ms", "40"},
                          "worker" + r + ".log"));
  }
  for (Child* w : workers) {
    ASSERT_TRUE(WaitForOutput(*w, "iteration 3 ok", milliseconds(20000))) << w->label();
  }
  std::vector<std::string> first;
  first.push_back(Scrape(v1::ROLE_SCHEDULER, 0));
  for (uint32_t s = 0; s < kServers; ++s) first.push_back(Scrape(v1::ROLE_SERVER, s));
  for (uint32_t w = 0; w < kWorkers; ++w) first.push_back(Scrape(v1::ROLE_WORKER, w));
  for (Child* w : workers) {
    ASSERT_TRUE(WaitForOutput(*w, "iteration 20 ok", milliseconds(20000))) << w->label();
  }
  std::vector<std::string> second;
  second.push_back(Scrape(v1::ROLE_SCHEDULER, 0));
  for (uint32_t s = 0; s < kServers; ++s) second.push_back(Scrape(v1::ROLE_SERVER, s));
  for (uint32_t w = 0; w < kWorkers; ++w) second.push_back(Scrape(v1::ROLE_WORKER, w));
  // A path other than /metrics is not served.
  EXPECT_EQ(HttpGet(Port(v1::ROLE_SERVER, 0), "/").status, 404);
  std::cout << "[scrape] server 0, second scrape:\n" << second[1];

  // Scheduler: the nodes, heartbeats, its endpoint's traffic.
  EXPECT_EQ(SampleValue(second[0], "bitpush_node_info{role=\"scheduler\"}"), 1);
  EXPECT_EQ(SampleValue(second[0], "bitpush_scheduler_nodes{state=\"registered\"}"),
            kServers + kWorkers);
  EXPECT_EQ(SampleValue(second[0], "bitpush_scheduler_nodes{state=\"dead\"}"), 0);
  ExpectGrew(first[0], second[0], "bitpush_scheduler_heartbeat_rounds_total");
  ExpectGrew(first[0], second[0], "bitpush_transport_messages_total{direction=\"received\"}");
  // Servers: rounds, pushes, bytes in and out both ways, engine time.
  for (uint32_t s = 0; s < kServers; ++s) {
    const std::string& b = first[1 + s];
    const std::string& a = second[1 + s];
    EXPECT_EQ(
        SampleValue(a, "bitpush_node_info{role=\"server\",rank=\"" + std::to_string(s) + "\"}"), 1);
    ExpectGrew(b, a, "bitpush_server_rounds_published_total");
    ExpectGrew(b, a, "bitpush_server_pushes_total{result=\"accepted\"}");
    ExpectGrew(b, a,
               "bitpush_server_payload_bytes_total{direction=\"in\",encoding=\"compressed\"}");
    ExpectGrew(b, a, "bitpush_server_payload_bytes_total{direction=\"in\",encoding=\"raw\"}");
    ExpectGrew(b, a,
               "bitpush_server_payload_bytes_total{direction=\"out\",encoding=\"compressed\"}");
    ExpectGrew(b, a, "bitpush_transport_bytes_total{direction=\"received\"}");
    EXPECT_EQ(SampleValue(a, "bitpush_server_pushes_total{result=\"rejected\"}"), 0);
    EXPECT_GE(SampleValue(a, "bitpush_server_engine_queue_depth{thread=\"0\"}"), 0);
    // onebit: about 32x fewer bytes than raw fp32.
    EXPECT_GT(
        SampleValue(a, "bitpush_server_payload_bytes_total{direction=\"in\",encoding=\"raw\"}"),
        10 *
            SampleValue(
                a, "bitpush_server_payload_bytes_total{direction=\"in\",encoding=\"compressed\"}"));
  }
  // Workers (embedded): push_pulls, bytes, stage time.
  for (uint32_t w = 0; w < kWorkers; ++w) {
    const std::string& b = first[1 + kServers + w];
    const std::string& a = second[1 + kServers + w];
    ExpectGrew(b, a, "bitpush_worker_push_pulls_total{result=\"completed\"}");
    ExpectGrew(b, a, "bitpush_worker_partitions_pushed_total");
    ExpectGrew(b, a,
               "bitpush_worker_payload_bytes_total{direction=\"push\",encoding=\"compressed\"}");
    ExpectGrew(b, a, "bitpush_worker_payload_bytes_total{direction=\"push\",encoding=\"raw\"}");
    ExpectGrew(b, a, "bitpush_worker_payload_bytes_total{direction=\"pull\",encoding=\"raw\"}");
    ExpectGrew(b, a, "bitpush_worker_stage_seconds_total{stage=\"compress\"}");
    ExpectGrew(b, a, "bitpush_worker_stage_seconds_total{stage=\"network\"}");
    EXPECT_EQ(SampleValue(a, "bitpush_worker_push_pulls_total{result=\"failed\"}"), 0);
    EXPECT_EQ(SampleValue(a, "bitpush_endpoint_messages_refused_total{reason=\"sender_role\"}"), 0);
  }
  std::vector<Child*> all;
  for (auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, ProcessClock::now() + milliseconds(30000)));
  for (Child* c : all) EXPECT_EQ(c->exit_code(), 0) << c->label();
}

TEST_F(MetricsProcessTest, TheWorkerDaemonServesItsNodesMetrics) {
  WriteConfig(1, 1, 1);
  StartSchedulerAndServers(1);
  const std::string socket = config_.worker.SocketFor(0);
  Add("daemon 0",
      {BITPUSH_DAEMON_BIN, "--config", path_, "--rank", "0", "--socket", socket, "--no-sweep"},
      "daemon0.log");
  // Served from before the daemon registered.
  const int port = Port(v1::ROLE_WORKER, 0);
  HttpAnswer early;
  for (int i = 0; i < 100 && early.status != 200; ++i) {
    early = HttpGet(port, "/metrics");
    if (early.status != 200) std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_EQ(early.status, 200);
  Child* trainer =
      Add("trainer 0.0",
          {BITPUSH_TEST_TRAINER_BIN, "--config", path_, "--node", "0", "--local-rank", "0",
           "--local-size", "1", "--socket", socket, "--iters", "40", "--pause-ms", "40"},
          "trainer.log");
  ASSERT_TRUE(WaitForOutput(*trainer, "iteration 3 ok", milliseconds(20000)));
  const std::string b = Scrape(v1::ROLE_WORKER, 0);
  ASSERT_TRUE(WaitForOutput(*trainer, "iteration 15 ok", milliseconds(20000)));
  const std::string a = Scrape(v1::ROLE_WORKER, 0);
  EXPECT_EQ(SampleValue(a, "bitpush_node_info{role=\"worker\",rank=\"0\"}"), 1);
  ExpectGrew(b, a, "bitpush_worker_push_pulls_total{result=\"completed\"}");
  ExpectGrew(b, a,
             "bitpush_worker_payload_bytes_total{direction=\"push\",encoding=\"compressed\"}");
  ExpectGrew(b, a,
             "bitpush_worker_payload_bytes_total{direction=\"pull\",encoding=\"compressed\"}");
  ExpectGrew(b, a, "bitpush_transport_bytes_total{direction=\"sent\"}");
  std::vector<Child*> all;
  for (auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, ProcessClock::now() + milliseconds(30000)));
  for (Child* c : all) EXPECT_EQ(c->exit_code(), 0) << c->label();
}

}  // namespace
}  // namespace bitpush::testing
