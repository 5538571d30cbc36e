// The data plane as real processes: bitpush-scheduler, bitpush-server and bitpush-test-worker
// (bench/pushpull_worker.h) on loopback with short heartbeats (100 ms interval, 1000 ms
// timeout), over each cluster transport: zmq (tcp), and ucx (the control plane on zmq, the data
// plane over UCX) with UCX's TCP transport (`tls: tcp`) and with its shared-memory transports
// (`tls: "sm,self,tcp"`: tcp stays for UCX's connection manager, docs/transport-ucx.md), and
// over ucx (tcp) under security.mode curve (the node's keys on both planes). Checks a
// clean run (every process exits 0 after every iteration completed, with the same results whatever
// the transport) and the crash scenarios: a server SIGKILLed while workers are in the middle of
// rounds → every worker's pending handle fails, naming the server, within heartbeat_timeout + 1 s
// of the kill; a worker SIGKILLed → every other worker's pending handle fails naming it, and every
// process exits non-zero. Every child is killed and reaped whatever happens
// (tests/harness/child_process.h); every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/security/keys.h"
#include "common/tensor_view.h"
#include "config/cluster_config.h"
#include "config/key_mapping.h"
#include "config/node_security.h"
#include "tests/harness/child_process.h"
#include "tests/harness/reference_model.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"
#include "worker/client.h"
#include "worker/partition.h"

#ifndef BITPUSH_SCHEDULER_BIN
#error "BITPUSH_SCHEDULER_BIN must be defined (tests/CMakeLists.txt)"
#endif
#ifndef BITPUSH_SERVER_BIN
#error "BITPUSH_SERVER_BIN must be defined (tests/CMakeLists.txt)"
#endif
#ifndef BITPUSH_TEST_WORKER_BIN
#error "BITPUSH_TEST_WORKER_BIN must be defined (tests/CMakeLists.txt)"
#endif

namespace bitpush::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kHeartbeatIntervalMs = 100;
constexpr int kHeartbeatTimeoutMs = 1000;
// The failure-detection bound: a dead server fails every pending handle within heartbeat_timeout +
// 1 s.
constexpr int kDetectionBoundMs = kHeartbeatTimeoutMs + 1000;
constexpr uint64_t kPartitionBytes = 1 << 20;

size_t CountOccurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

// One cluster transport the tests run over.
struct TransportCase {
  const char* name;
  TestTransport transport;
  const char* ucx_tls;  // kUcx: cluster.ucx.tls
  bool curve = false;   // security.mode curve, a key pair per node (bitpush keygen's files)
};

std::ostream& operator<<(std::ostream& os, const TransportCase& c) {
  return os << c.name;
}

class PushPullProcessTest : public ::testing::TestWithParam<TransportCase> {
 protected:
  void TearDown() override {
    if (HasFailure()) std::cerr << DescribeChildren(children_);
    children_.clear();  // kills and reaps what still runs
  }

  // Writes the cluster YAML (TestClusterConfig, tests/harness/test_cluster.h): every node on a
  // free tcp port of 127.0.0.1, onebit with error feedback on both sides, 1 MiB partitions.
  void WriteConfig(int servers, int workers) {
    TestClusterOptions t;
    t.servers = static_cast<uint32_t>(servers);
    t.workers = static_cast<uint32_t>(workers);
    t.transport = GetParam().transport;
    t.ucx_tls = GetParam().ucx_tls;
    t.heartbeat_interval = milliseconds(kHeartbeatIntervalMs);
    t.heartbeat_timeout = milliseconds(kHeartbeatTimeoutMs);
    t.startup_timeout = milliseconds(10000);
    t.compression.spec = "onebit";
    t.compression.error_feedback = "both";
    t.compression.partition_bytes = kPartitionBytes;
    t.worker.op_timeout = milliseconds(20000);
    config::ClusterConfig c = TestClusterConfig(t);
    if (GetParam().curve) {
      c.security.mode = config::SecurityMode::kCurve;
      c.security.keys_dir = dir_.path() + "/keys";
      StatusOr<std::vector<std::string>> written = security::WriteClusterKeys(
          c.security.keys_dir, config::ClusterNodeNames(c), /*overwrite=*/false);
      ASSERT_TRUE(written.ok()) << written.status().ToString();
    }
    config_ = dir_.path() + "/cluster.yaml";
    ASSERT_TRUE(WriteTestClusterYaml(c, config_).ok());
  }

  Child* StartScheduler() {
    return Add("scheduler", {BITPUSH_SCHEDULER_BIN, "--config", config_}, "scheduler.log");
  }

  Child* StartServer(int rank) {
    const std::string r = std::to_string(rank);
    return Add("server " + r, {BITPUSH_SERVER_BIN, "--config", config_, "--rank", r},
               "server" + r + ".log");
  }

  Child* StartWorker(int rank, double tensor_mb, int iters, int pause_ms, int linger_ms = 0) {
    const std::string r = std::to_string(rank);
    return Add("worker " + r,
               {BITPUSH_TEST_WORKER_BIN, "--config", config_, "--rank", r, "--tensor-mb",
                std::to_string(tensor_mb), "--iters", std::to_string(iters), "--pause-ms",
                std::to_string(pause_ms), "--linger-ms", std::to_string(linger_ms)},
               "worker" + r + ".log");
  }

  Child* Add(const std::string& label, const std::vector<std::string>& argv,
             const std::string& log) {
    children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log));
    EXPECT_TRUE(children_.back()->spawned()) << label;
    return children_.back().get();
  }

  // Servers that own at least one partition of the single tensor of `tensor_mb` MiB.
  static std::set<uint32_t> OwnersOfTensor(double tensor_mb, uint32_t servers) {
    const size_t elements = static_cast<size_t>(tensor_mb * (1 << 20) / 4);
    StatusOr<std::vector<worker::PartitionRange>> parts =
        worker::PartitionTensor(0, elements, DType::kFloat32, kPartitionBytes);
    std::set<uint32_t> owners;
    const v1::KeyMapping mapping = config::MakeKeyMapping(servers);
    for (const worker::PartitionRange& p : *parts) {
      owners.insert(config::ServerForKey(p.key, mapping));
    }
    return owners;
  }

  // 2 servers, 3 workers looping over an 8 MiB tensor; worker 2 sleeps 50 ms before each
  // iteration, so workers 0 and 1 always have a round pushed and waiting for it at both
  // servers: they are mid-round when `victim` is SIGKILLed (once everyone completed a few
  // iterations); worker 2's next push goes to a dead server. A worker reports its failure at
  // once (the time it appears in its output is what the bound is checked against) and then
  // lingers, still registered, before exiting (--linger-ms): a worker that exited right away
  // could be the node the scheduler declares dead first, and the others would name it.
  void KillServerMidRound(int victim) {
    constexpr double kTensorMb = 8;
    constexpr int kLingerMs = 1500;
    ASSERT_EQ(OwnersOfTensor(kTensorMb, 2).count(victim), 1u)
        << "server " << victim << " owns no partition: the test would not be mid-round";
    WriteConfig(2, 3);
    Child* sched = StartScheduler();
    std::vector<Child*> servers = {StartServer(0), StartServer(1)};
    std::vector<Child*> workers = {StartWorker(0, kTensorMb, 1000000, 0, kLingerMs),
                                   StartWorker(1, kTensorMb, 1000000, 0, kLingerMs),
                                   StartWorker(2, kTensorMb, 1000000, 50, kLingerMs)};
    for (Child* w : workers) {
      ASSERT_TRUE(WaitForOutput(*w, "iteration 3 ok", milliseconds(15000))) << w->label();
    }

    Child* dead = servers[victim];
    const Clock::time_point killed = Clock::now();
    dead->Signal(SIGKILL);
    // When each worker's failure line appears (polled every 5 ms).
    std::vector<Clock::time_point> failed_at(workers.size(), Clock::time_point::max());
    const Clock::time_point deadline = killed + milliseconds(kDetectionBoundMs + 3000);
    for (size_t left = workers.size(); left > 0 && Clock::now() < deadline;) {
      for (size_t i = 0; i < workers.size(); ++i) {
        if (failed_at[i] == Clock::time_point::max() &&
            workers[i]->output().find(": error: ") != std::string::npos) {
          failed_at[i] = Clock::now();
          --left;
        }
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    const std::string name = "server " + std::to_string(victim);
    for (size_t i = 0; i < workers.size(); ++i) {
      Child* w = workers[i];
      ASSERT_NE(failed_at[i], Clock::time_point::max())
          << w->label() << " reported no failure within " << kDetectionBoundMs + 3000
          << " ms of the kill:\n"
          << w->output();
      const int64_t latency = MsBetween(killed, failed_at[i]);
      std::cout << "[latency] " << name << " SIGKILLed -> " << w->label() << " failed after "
                << latency << " ms (bound " << kDetectionBoundMs << " ms)\n";
      EXPECT_LE(latency, kDetectionBoundMs) << w->label();
      const std::string out = w->output();
      const size_t error = out.find("bitpush-test-worker " + w->label() + ": error: iteration ");
      ASSERT_NE(error, std::string::npos) << out;
      const std::string line = out.substr(error, out.find('\n', error) - error);
      std::cout << "[error] " << line << "\n";
      EXPECT_CONTAINS(line, " after the last success: ");
      EXPECT_CONTAINS(line, name);
      if (i + 1 < workers.size()) {
        // Workers 0 and 1 were waiting when the server died: their failing Wait began before
        // the kill (it lasted about as long as kill -> failure line). The slack covers the
        // time between a worker printing its line and this loop seeing it, which on a loaded
        // 2-core machine (a sanitizer build beside it) reached 133 ms.
        const size_t at = line.find("wait returned after ");
        ASSERT_NE(at, std::string::npos) << line;
        const long waited_ms = std::strtol(line.c_str() + at + 20, nullptr, 10);
        EXPECT_GE(waited_ms + 500, latency) << w->label() << " was not mid-round: " << line;
      }
    }
    // Then every process ends, none cleanly: the workers after lingering, the scheduler and
    // the other server on the scheduler's verdict.
    ASSERT_TRUE(WaitAll(workers, Clock::now() + milliseconds(kLingerMs + 2000)));
    for (Child* w : workers) EXPECT_EQ(w->exit_code(), 3) << w->label();
    std::vector<Child*> rest = {sched, servers[1 - victim]};
    ASSERT_TRUE(WaitAll(rest, killed + milliseconds(kDetectionBoundMs + 3000)));
    for (Child* c : rest) EXPECT_NE(c->exit_code(), 0) << c->label();
    EXPECT_CONTAINS(sched->output(), name + " at ");
    ASSERT_TRUE(WaitAll({dead}, Clock::now() + milliseconds(1000)));
    EXPECT_EQ(dead->exit_code(), 128 + SIGKILL);
  }

  // 1 server, 3 workers looping over a 2 MiB tensor; worker 2 sleeps 50 ms before each
  // iteration, so workers 0 and 1 are waiting for rounds that need worker 2's push when it is
  // SIGKILLed: their pending handles fail naming it, within the bound, and every process ends
  // non-zero (the scheduler's verdict names the worker to every node).
  void KillWorkerMidRound() {
    constexpr double kTensorMb = 2;
    constexpr int kLingerMs = 1500;
    WriteConfig(1, 3);
    Child* sched = StartScheduler();
    Child* server = StartServer(0);
    std::vector<Child*> workers = {StartWorker(0, kTensorMb, 1000000, 0, kLingerMs),
                                   StartWorker(1, kTensorMb, 1000000, 0, kLingerMs),
                                   StartWorker(2, kTensorMb, 1000000, 50, kLingerMs)};
    for (Child* w : workers) {
      ASSERT_TRUE(WaitForOutput(*w, "iteration 3 ok", milliseconds(15000))) << w->label();
    }
    Child* dead = workers[2];
    const Clock::time_point killed = Clock::now();
    dead->Signal(SIGKILL);
    std::vector<Child*> survivors = {workers[0], workers[1]};
    std::vector<Clock::time_point> failed_at(survivors.size(), Clock::time_point::max());
    const Clock::time_point deadline = killed + milliseconds(kDetectionBoundMs + 3000);
    for (size_t left = survivors.size(); left > 0 && Clock::now() < deadline;) {
      for (size_t i = 0; i < survivors.size(); ++i) {
        if (failed_at[i] == Clock::time_point::max() &&
            survivors[i]->output().find(": error: ") != std::string::npos) {
          failed_at[i] = Clock::now();
          --left;
        }
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    for (size_t i = 0; i < survivors.size(); ++i) {
      Child* w = survivors[i];
      ASSERT_NE(failed_at[i], Clock::time_point::max())
          << w->label() << " reported no failure within " << kDetectionBoundMs + 3000
          << " ms of the kill:\n"
          << w->output();
      const int64_t latency = MsBetween(killed, failed_at[i]);
      std::cout << "[latency] worker 2 SIGKILLed -> " << w->label() << " failed after " << latency
                << " ms (bound " << kDetectionBoundMs << " ms)\n";
      EXPECT_LE(latency, kDetectionBoundMs) << w->label();
      const std::string out = w->output();
      const size_t error = out.find("bitpush-test-worker " + w->label() + ": error: iteration ");
      ASSERT_NE(error, std::string::npos) << out;
      const std::string line = out.substr(error, out.find('\n', error) - error);
      std::cout << "[error] " << line << "\n";
      EXPECT_CONTAINS(line, "worker 2");
    }
    ASSERT_TRUE(WaitAll(survivors, Clock::now() + milliseconds(kLingerMs + 2000)));
    for (Child* w : survivors) EXPECT_EQ(w->exit_code(), 3) << w->label();
    std::vector<Child*> rest = {sched, server};
    ASSERT_TRUE(WaitAll(rest, killed + milliseconds(kDetectionBoundMs + 3000)));
    for (Child* c : rest) EXPECT_NE(c->exit_code(), 0) << c->label();
    EXPECT_CONTAINS(sched->output(), "worker 2 at ");
    EXPECT_CONTAINS(server->output(), "worker 2");
    ASSERT_TRUE(WaitAll({dead}, Clock::now() + milliseconds(1000)));
    EXPECT_EQ(dead->exit_code(), 128 + SIGKILL);
  }

  TempDir dir_;
  std::string config_;
  std::vector<std::unique_ptr<Child>> children_;
};

TEST_P(PushPullProcessTest, CleanRunEveryProcessExitsZero) {
  WriteConfig(2, 2);
  std::vector<Child*> all = {StartScheduler(), StartServer(0), StartServer(1)};
  for (int w = 0; w < 2; ++w) all.push_back(StartWorker(w, 3, 5, 0));
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(20000)));
  for (Child* c : all) EXPECT_EQ(c->exit_code(), 0) << c->label() << ":\n" << c->output();
  for (size_t w = 3; w < all.size(); ++w) {
    const std::string out = all[w]->output();
    EXPECT_EQ(CountOccurrences(out, all[w]->label() + ": iteration "), 5u) << out;
    EXPECT_CONTAINS(out, "iteration 4 ok");
    EXPECT_CONTAINS(out, all[w]->label() + ": clean shutdown");
  }
}

// Scheduler and servers as processes, the two workers as Clients of this process (each with its
// own endpoint and transports, as in a process of their own): every round's output equals the
// reference model's (tests/harness/reference_model.h) bit for bit, over every transport.
TEST_P(PushPullProcessTest, ResultsMatchTheReferenceBitForBit) {
  constexpr uint32_t kWorkers = 2;
  constexpr size_t kElements = 3 * (1 << 20) / 4 + 1000;  // 4 partitions, the last partial
  constexpr int kRounds = 4;
  WriteConfig(2, kWorkers);
  StatusOr<config::ClusterConfig> cluster = config::LoadClusterConfig(config_);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  std::vector<Child*> nodes = {StartScheduler(), StartServer(0), StartServer(1)};

  // Create blocks until every node registered: the workers start side by side.
  std::vector<std::unique_ptr<worker::Client>> clients(kWorkers);
  std::vector<Status> started(kWorkers);
  std::vector<std::thread> starters;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    starters.emplace_back([&, w] {
      worker::ClientOptions o;
      o.cluster = *cluster;
      o.rank = w;
      StatusOr<std::unique_ptr<worker::Client>> c = worker::Client::Create(std::move(o));
      started[w] = c.status();
      if (c.ok()) clients[w] = std::move(c).value();
    });
  }
  for (std::thread& t : starters) t.join();
  for (uint32_t w = 0; w < kWorkers; ++w) ASSERT_TRUE(started[w].ok()) << started[w].ToString();

  ReferenceTensorOptions r;
  r.spec = cluster->compression.spec;
  r.error_feedback = cluster->compression.error_feedback;
  r.min_compress_bytes = cluster->compression.min_compress_bytes;
  r.partition_bytes = cluster->compression.partition_bytes;
  r.elements = kElements;
  r.nodes = kWorkers;
  StatusOr<ReferenceTensor> ref = ReferenceTensor::Create(r);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  ASSERT_TRUE(ref->compressed());
  ASSERT_EQ(ref->partitions(), 4u);

  std::vector<worker::TensorId> ids;
  for (auto& c : clients) {
    StatusOr<worker::TensorId> id = c->Declare("grad", kElements, DType::kFloat32, 0, "");
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(*id);
  }
  // The declaration check waits for every worker's declarations: commit side by side.
  std::vector<Status> committed(kWorkers);
  std::vector<std::thread> committers;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    committers.emplace_back([&, w] { committed[w] = clients[w]->CommitDeclarations(); });
  }
  for (std::thread& t : committers) t.join();
  for (uint32_t w = 0; w < kWorkers; ++w) ASSERT_TRUE(committed[w].ok()) << committed[w].ToString();
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<uint8_t>> inputs(kWorkers);
    std::vector<std::vector<float>> outputs(kWorkers, std::vector<float>(kElements, -1.0f));
    std::vector<worker::PushPullHandle> handles;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      inputs[w] =
          ReferenceInput(w + 1, 0, static_cast<uint64_t>(round), kElements, DType::kFloat32);
      handles.push_back(clients[w]->PushPull(
          ids[w], ConstTensorView(inputs[w].data(), kElements, DType::kFloat32),
          TensorView(outputs[w].data(), kElements, DType::kFloat32)));
    }
    // Every handle completes (bounded by op_timeout) before its buffers may go.
    std::vector<Status> done;
    for (uint32_t w = 0; w < kWorkers; ++w) done.push_back(handles[w].Wait());
    for (uint32_t w = 0; w < kWorkers; ++w) {
      ASSERT_TRUE(done[w].ok()) << "worker " << w << " round " << round << ": "
                                << done[w].ToString();
    }
    StatusOr<std::vector<uint8_t>> want = ref->Round(inputs);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_EQ(want->size(), kElements * sizeof(float));
    for (uint32_t w = 0; w < kWorkers; ++w) {
      EXPECT_EQ(std::memcmp(outputs[w].data(), want->data(), want->size()), 0)
          << "worker " << w << " round " << round << " differs from the reference";
    }
  }
  // A clean end: Done from both workers, then every process exits 0.
  std::vector<std::thread> stoppers;
  std::vector<Status> stopped(kWorkers);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    stoppers.emplace_back([&, w] { stopped[w] = clients[w]->Shutdown(milliseconds(10000)); });
  }
  for (std::thread& t : stoppers) t.join();
  for (uint32_t w = 0; w < kWorkers; ++w) EXPECT_TRUE(stopped[w].ok()) << stopped[w].ToString();
  ASSERT_TRUE(WaitAll(nodes, Clock::now() + milliseconds(10000)));
  for (Child* c : nodes) EXPECT_EQ(c->exit_code(), 0) << c->label() << ":\n" << c->output();
}

TEST_P(PushPullProcessTest, KilledServerOneFailsEveryWorkersPendingHandle) {
  KillServerMidRound(1);
}

TEST_P(PushPullProcessTest, KilledServerZeroFailsEveryWorkersPendingHandle) {
  KillServerMidRound(0);
}

TEST_P(PushPullProcessTest, KilledWorkerFailsTheOtherWorkersPendingHandles) {
  KillWorkerMidRound();
}

INSTANTIATE_TEST_SUITE_P(
    Transports, PushPullProcessTest,
    ::testing::Values(TransportCase{"zmq", TestTransport::kTcp, ""},
                      TransportCase{"ucx_tcp", TestTransport::kUcx, "tcp"},
                      TransportCase{"ucx_shm", TestTransport::kUcx, "sm,self,tcp"},
                      TransportCase{"ucx_tcp_curve", TestTransport::kUcx, "tcp", true}),
    [](const ::testing::TestParamInfo<TransportCase>& info) { return info.param.name; });

using PushPullUsageTest = PushPullProcessTest;

TEST_P(PushPullUsageTest, UsageErrorsExitTwo) {
  Child* none = Add("no args", {BITPUSH_TEST_WORKER_BIN}, "noargs.log");
  Child* bogus = Add("bogus", {BITPUSH_TEST_WORKER_BIN, "--bogus", "1"}, "bogus.log");
  ASSERT_TRUE(WaitAll({none, bogus}, Clock::now() + milliseconds(5000)));
  EXPECT_EQ(none->exit_code(), 2);
  EXPECT_CONTAINS(none->output(), "--config and --rank are required");
  EXPECT_EQ(bogus->exit_code(), 2);
  EXPECT_CONTAINS(bogus->output(), "unknown argument '--bogus'");
}

INSTANTIATE_TEST_SUITE_P(Zmq, PushPullUsageTest,
                         ::testing::Values(TransportCase{"zmq", TestTransport::kTcp, ""}),
                         [](const ::testing::TestParamInfo<TransportCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace bitpush::testing
