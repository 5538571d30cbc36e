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
// process exits non-zero, also when it dies holding credit at both servers under a tight
// worker.credit_bytes and worker.server_window_bytes. And flow control through a stall: a server
// SIGSTOPped for 3 s mid-run (heartbeat timeout 10 s there; credit and window of one byte, and
// wide) and then SIGCONTinued
// fails nothing, and every worker's every output is the reference model's bit for bit
// (tests/harness/reference_model.h, from the inputs and outputs the workers record).
// Every child is killed and reaped whatever happens (tests/harness/child_process.h); every wait
// is bounded.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
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

// The state letter of process `pid` in /proc/PID/stat ('R', 'S', 'T' stopped, ...); '?' when
// it cannot be read.
char ProcessState(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

// The durations (ms) of bitpush-test-worker's "iteration I ok T ms" lines, in order.
std::vector<double> IterationMs(const std::string& output) {
  std::vector<double> ms;
  const std::string marker = ": iteration ";
  for (size_t pos = output.find(marker); pos != std::string::npos;
       pos = output.find(marker, pos + 1)) {
    const size_t eol = output.find('\n', pos);
    const std::string line = output.substr(pos, eol == std::string::npos ? eol : eol - pos);
    const size_t ok = line.find(" ok ");
    if (ok != std::string::npos) ms.push_back(std::strtod(line.c_str() + ok + 4, nullptr));
  }
  return ms;
}

// The integer at "key" in a flat JSON object (bitpush-test-worker's --results); -1 if absent.
long long JsonInteger(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\":";
  const size_t at = json.find(quoted);
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + quoted.size(), nullptr, 10);
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
  // free tcp port of 127.0.0.1, onebit with error feedback on both sides, 1 MiB partitions;
  // `adjust` may change any of it first.
  void WriteConfig(int servers, int workers,
                   const std::function<void(TestClusterOptions&)>& adjust = nullptr) {
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
    if (adjust) adjust(t);
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

  // `more`: further flags of bitpush-test-worker (bench/pushpull_worker.h).
  Child* StartWorker(int rank, double tensor_mb, int iters, int pause_ms, int linger_ms = 0,
                     const std::vector<std::string>& more = {}) {
    const std::string r = std::to_string(rank);
    std::vector<std::string> argv = {BITPUSH_TEST_WORKER_BIN,
                                     "--config",
                                     config_,
                                     "--rank",
                                     r,
                                     "--tensor-mb",
                                     std::to_string(tensor_mb),
                                     "--iters",
                                     std::to_string(iters),
                                     "--pause-ms",
                                     std::to_string(pause_ms),
                                     "--linger-ms",
                                     std::to_string(linger_ms)};
    argv.insert(argv.end(), more.begin(), more.end());
    return Add("worker " + r, argv, "worker" + r + ".log");
  }

  Child* Add(const std::string& label, const std::vector<std::string>& argv,
             const std::string& log) {
    children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log));
    EXPECT_TRUE(children_.back()->spawned()) << label;
    return children_.back().get();
  }

  // Partitions of tensor `index` (`tensor_mb` MiB of float32, partitions of `partition_bytes`)
  // at each of `servers` servers.
  static std::vector<size_t> PartitionsPerServer(uint32_t index, double tensor_mb, uint32_t servers,
                                                 uint64_t partition_bytes) {
    const size_t elements = static_cast<size_t>(tensor_mb * (1 << 20) / 4);
    StatusOr<std::vector<worker::PartitionRange>> parts =
        worker::PartitionTensor(index, elements, DType::kFloat32, partition_bytes);
    EXPECT_TRUE(parts.ok()) << parts.status().ToString();
    std::vector<size_t> at(servers, 0);
    if (!parts.ok()) return at;
    const v1::KeyMapping mapping = config::MakeKeyMapping(servers);
    for (const worker::PartitionRange& p : *parts) ++at[config::ServerForKey(p.key, mapping)];
    return at;
  }

  // Servers that own at least one partition of the single tensor of `tensor_mb` MiB.
  static std::set<uint32_t> OwnersOfTensor(double tensor_mb, uint32_t servers) {
    const std::vector<size_t> at = PartitionsPerServer(0, tensor_mb, servers, kPartitionBytes);
    std::set<uint32_t> owners;
    for (uint32_t s = 0; s < servers; ++s) {
      if (at[s] > 0) owners.insert(s);
    }
    return owners;
  }

  // When each of `workers` printed its failure line (": error: "), polled every 5 ms until all
  // did or kDetectionBoundMs + 3000 ms after `killed`; time_point::max() for one that did not.
  static std::vector<Clock::time_point> WhenEachFailed(const std::vector<Child*>& workers,
                                                       Clock::time_point killed) {
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
    return failed_at;
  }

  // Checks that worker `w` failed (its failure line appeared at `failed_at`, see
  // WhenEachFailed) within kDetectionBoundMs of `killed`, and sets `line` to its error line
  // ("bitpush-test-worker worker N: error: iteration ..."); `what` names the kill in the
  // printed latency. Fatal (ASSERT_NO_FATAL_FAILURE at the caller) when there is no failure
  // or no such line.
  static void FailureLine(Child& w, Clock::time_point failed_at, Clock::time_point killed,
                          const std::string& what, std::string* line) {
    ASSERT_NE(failed_at, Clock::time_point::max())
        << w.label() << " reported no failure within " << kDetectionBoundMs + 3000
        << " ms of the kill:\n"
        << w.output();
    const int64_t latency = MsBetween(killed, failed_at);
    std::cout << "[latency] " << what << " -> " << w.label() << " failed after " << latency
              << " ms (bound " << kDetectionBoundMs << " ms)\n";
    EXPECT_LE(latency, kDetectionBoundMs) << w.label();
    const std::string out = w.output();
    const size_t error = out.find("bitpush-test-worker " + w.label() + ": error: iteration ");
    ASSERT_NE(error, std::string::npos) << out;
    *line = out.substr(error, out.find('\n', error) - error);
    std::cout << "[error] " << *line << "\n";
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
    const std::vector<Clock::time_point> failed_at = WhenEachFailed(workers, killed);
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
    const std::vector<Clock::time_point> failed_at = WhenEachFailed(survivors, killed);
    for (size_t i = 0; i < survivors.size(); ++i) {
      std::string line;
      ASSERT_NO_FATAL_FAILURE(
          FailureLine(*survivors[i], failed_at[i], killed, "worker 2 SIGKILLed", &line));
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

  // 2 servers, 2 workers, two 1 MiB tensors: t0 raw (compression.overrides), 16 partitions of
  // 64 KiB, and t1 onebit with error feedback, 4 partitions of 256 KiB, each with partitions at
  // both servers; worker.credit_bytes and worker.server_window_bytes as given. Each worker runs
  // 20 iterations 50 ms apart, recording its inputs and outputs (--record). Once every worker
  // completed 3 iterations, server 1 is SIGSTOPped for 3 s, then SIGCONTinued: meanwhile the
  // workers' partitions for it, and the credit they hold, wait there. The heartbeat interval
  // (100 ms) is far below the stall, the heartbeat timeout (10 s) and worker.op_timeout (30 s)
  // far above it, so the stall must fail nothing: every process exits 0; no round completes
  // during the stall and one round of each worker lasts about the stall (it happened mid-run);
  // every output is the reference model's bit for bit; the peak raw bytes in flight at one
  // server stay within the window + one partition, and the peak bytes in flight within the
  // credit + one partition (ClientStats, --results).
  void StallServerMidRun(uint64_t credit_bytes, uint64_t window_bytes) {
    constexpr uint32_t kServers = 2;
    constexpr uint32_t kWorkers = 2;
    constexpr int kTensors = 2;
    constexpr double kTensorMb = 1;
    constexpr size_t kElements = (1 << 20) / 4;
    constexpr size_t kTensorBytes = kElements * 4;
    constexpr uint64_t kRawPartition = 64 << 10;
    constexpr uint64_t kCompressedPartition = 256 << 10;
    constexpr int kIters = 20;
    constexpr int kPauseMs = 50;
    constexpr int kStallMs = 3000;
    constexpr uint32_t kStalled = 1;
    for (uint32_t s = 0; s < kServers; ++s) {
      ASSERT_GT(PartitionsPerServer(0, kTensorMb, kServers, kRawPartition)[s], 1u) << s;
      ASSERT_GT(PartitionsPerServer(1, kTensorMb, kServers, kCompressedPartition)[s], 0u) << s;
    }
    WriteConfig(kServers, kWorkers, [&](TestClusterOptions& t) {
      t.heartbeat_timeout = milliseconds(10000);
      t.worker.op_timeout = milliseconds(30000);
      t.compression.partition_bytes = kCompressedPartition;
      t.compression.raw_partition_bytes = kRawPartition;
      t.compression.overrides.push_back({"t0", "none"});
      t.worker.credit_bytes = credit_bytes;
      t.worker.server_window_bytes = window_bytes;
    });
    StatusOr<config::ClusterConfig> cluster = config::LoadClusterConfig(config_);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    std::vector<Child*> all = {StartScheduler()};
    for (uint32_t s = 0; s < kServers; ++s) all.push_back(StartServer(static_cast<int>(s)));
    std::vector<Child*> workers;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      const std::string r = std::to_string(w);
      workers.push_back(StartWorker(
          static_cast<int>(w), kTensorMb, kIters, kPauseMs, 0,
          {"--tensors", std::to_string(kTensors), "--record", dir_.path() + "/record" + r,
           "--results", dir_.path() + "/results" + r + ".json"}));
      all.push_back(workers.back());
    }
    for (Child* w : workers) {
      ASSERT_TRUE(WaitForOutput(*w, "iteration 2 ok", milliseconds(15000))) << w->label();
    }

    Child* stalled = all[1 + kStalled];
    const Clock::time_point stopped = Clock::now();
    stalled->Signal(SIGSTOP);
    for (const Clock::time_point until = stopped + milliseconds(1000);
         ProcessState(stalled->pid()) != 'T' && Clock::now() < until;) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    ASSERT_EQ(ProcessState(stalled->pid()), 'T') << stalled->label() << " did not stop";
    for (Child* w : workers) {
      ASSERT_FALSE(w->Poll()) << w->label() << " ended before the stall:\n" << w->output();
    }
    // A round already answered by the stalled server may still end; none after that.
    std::this_thread::sleep_for(milliseconds(500));
    std::vector<size_t> rounds_before(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) {
      rounds_before[i] = IterationMs(workers[i]->output()).size();
    }
    std::this_thread::sleep_until(stopped + milliseconds(kStallMs));
    for (size_t i = 0; i < workers.size(); ++i) {
      EXPECT_EQ(IterationMs(workers[i]->output()).size(), rounds_before[i])
          << workers[i]->label() << " completed a round while " << stalled->label()
          << " was stopped";
    }
    const Clock::time_point resumed = Clock::now();
    stalled->Signal(SIGCONT);
    const int64_t stall_ms = MsBetween(stopped, resumed);

    ASSERT_TRUE(WaitAll(all, resumed + milliseconds(20000)));
    for (Child* c : all) EXPECT_EQ(c->exit_code(), 0) << c->label() << ":\n" << c->output();
    for (Child* w : workers) {
      const std::string out = w->output();
      EXPECT_CONTAINS(out, w->label() + ": clean shutdown");
      const std::vector<double> ms = IterationMs(out);
      ASSERT_EQ(ms.size(), static_cast<size_t>(kIters)) << out;
      // The round the stop landed in, or the next one (the stop may land in the 50 ms pause
      // before it), waited for the stalled server.
      const double longest = *std::max_element(ms.begin(), ms.end());
      std::cout << "[stall] " << w->label() << ": longest round " << longest << " ms of a "
                << stall_ms << " ms stall\n";
      EXPECT_GE(longest, static_cast<double>(stall_ms - kPauseMs - 500)) << out;
    }

    // Every output against the reference model (the record: every tensor's input, then every
    // tensor's output after each iteration).
    std::vector<std::string> records;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      records.push_back(ReadFile(dir_.path() + "/record" + std::to_string(w)));
      ASSERT_EQ(records[w].size(), (1 + kIters) * kTensors * kTensorBytes) << "worker " << w;
    }
    auto slice = [&](uint32_t w, int iteration, int t) {  // iteration -1: the input
      const size_t at = ((iteration + 1) * kTensors + t) * kTensorBytes;
      const auto* p = reinterpret_cast<const uint8_t*>(records[w].data()) + at;
      return std::vector<uint8_t>(p, p + kTensorBytes);
    };
    for (int t = 0; t < kTensors; ++t) {
      ReferenceTensorOptions r;
      r.spec = t == 0 ? "none" : cluster->compression.spec;
      r.error_feedback = cluster->compression.error_feedback;
      r.min_compress_bytes = cluster->compression.min_compress_bytes;
      r.partition_bytes = cluster->compression.partition_bytes;
      r.index = static_cast<uint32_t>(t);
      r.elements = kElements;
      r.nodes = kWorkers;
      StatusOr<ReferenceTensor> ref = ReferenceTensor::Create(r);
      ASSERT_TRUE(ref.ok()) << ref.status().ToString();
      ASSERT_EQ(ref->compressed(), t == 1);
      std::vector<std::vector<uint8_t>> inputs(kWorkers);
      for (uint32_t w = 0; w < kWorkers; ++w) inputs[w] = slice(w, -1, t);
      for (int i = 0; i < kIters; ++i) {
        StatusOr<std::vector<uint8_t>> want = ref->Round(inputs);
        ASSERT_TRUE(want.ok()) << want.status().ToString();
        for (uint32_t w = 0; w < kWorkers; ++w) {
          ASSERT_TRUE(slice(w, i, t) == *want)
              << "worker " << w << " tensor t" << t << " iteration " << i
              << " differs from the reference";
        }
      }
    }

    // The flow-control bounds held through the stall (ClientStats peaks since start-up).
    const uint64_t window_bound = std::max(window_bytes, kRawPartition) + kRawPartition;
    const uint64_t credit_bound =
        std::max(credit_bytes, kCompressedPartition) + kCompressedPartition;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      const std::string results = ReadFile(dir_.path() + "/results" + std::to_string(w) + ".json");
      const long long window_peak = JsonInteger(results, "peak_server_window_bytes");
      const long long credit_peak = JsonInteger(results, "peak_bytes_in_flight");
      std::cout << "[peaks] worker " << w << ": raw bytes at one server " << window_peak
                << " (bound " << window_bound << "), bytes in flight " << credit_peak << " (bound "
                << credit_bound << ")\n";
      EXPECT_GE(window_peak, static_cast<long long>(kRawPartition)) << results;
      EXPECT_LE(window_peak, static_cast<long long>(window_bound)) << results;
      EXPECT_GE(credit_peak, static_cast<long long>(kRawPartition)) << results;
      EXPECT_LE(credit_peak, static_cast<long long>(credit_bound)) << results;
    }
  }

  // KillWorkerMidRound with tight flow control and the kill landing while the victim holds
  // credit at both servers: 2 servers, 3 workers, two 1 MiB tensors (t0 raw in 16 partitions of
  // 64 KiB, t1 onebit in 4 of 256 KiB), worker.credit_bytes 256 KiB (4 raw partitions) and
  // worker.server_window_bytes 128 KiB (2 raw partitions at a server). Workers 0 and 1 sleep
  // 600 ms before each iteration, worker 2 not at all: a round ends for the three at once (a
  // server answers a partition once all pushed it), then worker 2 starts the next one at once,
  // pushes its first partitions up to its credit (two at each server) and waits for the
  // others. It is SIGKILLed 100 ms into such a round, while the others still sleep. The
  // others then push into a round that cannot complete: their pending handles fail naming
  // worker 2 within the detection bound, and every process exits (the servers and the
  // scheduler within the bound, non-zero), none waiting forever for the dead worker's pushes.
  void KillWorkerHoldingCredit() {
    constexpr uint32_t kServers = 2;
    constexpr int kWorkers = 3;
    constexpr double kTensorMb = 1;
    constexpr uint64_t kRawPartition = 64 << 10;
    constexpr uint64_t kCompressedPartition = 256 << 10;
    constexpr int kPauseMs = 600;
    constexpr int kIntoRoundMs = 100;
    constexpr int kLingerMs = 1500;
    for (uint32_t s = 0; s < kServers; ++s) {
      ASSERT_GE(PartitionsPerServer(0, kTensorMb, kServers, kRawPartition)[s], 2u) << s;
    }
    WriteConfig(kServers, kWorkers, [&](TestClusterOptions& t) {
      t.compression.partition_bytes = kCompressedPartition;
      t.compression.raw_partition_bytes = kRawPartition;
      t.compression.overrides.push_back({"t0", "none"});
      t.worker.credit_bytes = 4 * kRawPartition;
      t.worker.server_window_bytes = 2 * kRawPartition;
    });
    Child* sched = StartScheduler();
    std::vector<Child*> servers = {StartServer(0), StartServer(1)};
    const std::vector<std::string> more = {"--tensors", "2"};
    std::vector<Child*> workers = {StartWorker(0, kTensorMb, 1000000, kPauseMs, kLingerMs, more),
                                   StartWorker(1, kTensorMb, 1000000, kPauseMs, kLingerMs, more),
                                   StartWorker(2, kTensorMb, 1000000, 0, kLingerMs, more)};
    for (Child* w : workers) {
      ASSERT_TRUE(WaitForOutput(*w, "iteration 1 ok", milliseconds(15000))) << w->label();
    }
    // The victim's next completed round: the moment the three ended a round together.
    Child* dead = workers[2];
    const size_t done = IterationMs(dead->output()).size();
    const std::string next = "iteration " + std::to_string(done) + " ok";
    ASSERT_TRUE(WaitForOutput(*dead, next, milliseconds(kPauseMs + 5000))) << dead->output();
    std::this_thread::sleep_for(milliseconds(kIntoRoundMs));
    const Clock::time_point killed = Clock::now();
    dead->Signal(SIGKILL);
    const size_t victim_rounds = IterationMs(dead->output()).size();

    std::vector<Child*> survivors = {workers[0], workers[1]};
    const std::vector<Clock::time_point> failed_at = WhenEachFailed(survivors, killed);
    for (size_t i = 0; i < survivors.size(); ++i) {
      Child* w = survivors[i];
      std::string line;
      ASSERT_NO_FATAL_FAILURE(
          FailureLine(*w, failed_at[i], killed, "worker 2 SIGKILLed holding credit", &line));
      EXPECT_CONTAINS(line, "worker 2");
      // The round worker 2 had started alone: the survivors completed the same rounds as it.
      EXPECT_CONTAINS(line, "error: iteration " + std::to_string(victim_rounds) + " failed");
      EXPECT_EQ(IterationMs(w->output()).size(), victim_rounds) << w->output();
      // They were still sleeping at the kill: their failing Wait began after it.
      const size_t at = line.find("wait returned after ");
      ASSERT_NE(at, std::string::npos) << line;
      const long waited_ms = std::strtol(line.c_str() + at + 20, nullptr, 10);
      EXPECT_LT(waited_ms, MsBetween(killed, failed_at[i]))
          << w->label() << " was not sleeping at the kill: " << line;
    }
    ASSERT_TRUE(WaitAll(survivors, Clock::now() + milliseconds(kLingerMs + 2000)));
    for (Child* w : survivors) EXPECT_EQ(w->exit_code(), 3) << w->label();
    std::vector<Child*> rest = {sched, servers[0], servers[1]};
    ASSERT_TRUE(WaitAll(rest, killed + milliseconds(kDetectionBoundMs + 3000)));
    for (Child* s : servers) {
      // A server logs each answer it could not send to worker 2: the partitions worker 2 held
      // there, once the others pushed them too (not asserted: the transport need not have seen
      // worker 2 go by then, and a send to it may then seem to succeed).
      std::cout << "[credit] " << s->label() << " could not answer worker 2 "
                << CountOccurrences(s->output(), "cannot answer worker 2") << " times\n";
    }
    for (Child* c : rest) {
      EXPECT_NE(c->exit_code(), 0) << c->label();
      EXPECT_CONTAINS(c->output(), "worker 2");
    }
    EXPECT_CONTAINS(sched->output(), "worker 2 at ");
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

// Flow control under real processes: on one transport of each kind (the engine's credit and
// window do not depend on the lane, and each case takes 5-10 s).
using PushPullFlowControlTest = PushPullProcessTest;

TEST_P(PushPullFlowControlTest, KilledWorkerHoldingCreditFailsTheOthersAndEveryProcessExits) {
  KillWorkerHoldingCredit();
}

// Credit and window of one byte: one partition in flight beyond the first in posting order, one
// raw partition at a server.
TEST_P(PushPullFlowControlTest, StalledServerResumesBitForBitUnderOneByteCredit) {
  StallServerMidRun(1, 1);
}

// Credit and window wide enough for every partition of a round at once.
TEST_P(PushPullFlowControlTest, StalledServerResumesBitForBitUnderWideCredit) {
  StallServerMidRun(uint64_t{64} << 20, uint64_t{64} << 20);
}

INSTANTIATE_TEST_SUITE_P(
    Transports, PushPullProcessTest,
    ::testing::Values(TransportCase{"zmq", TestTransport::kTcp, ""},
                      TransportCase{"ucx_tcp", TestTransport::kUcx, "tcp"},
                      TransportCase{"ucx_shm", TestTransport::kUcx, "sm,self,tcp"},
                      TransportCase{"ucx_tcp_curve", TestTransport::kUcx, "tcp", true}),
    [](const ::testing::TestParamInfo<TransportCase>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(Transports, PushPullFlowControlTest,
                         ::testing::Values(TransportCase{"zmq", TestTransport::kTcp, ""},
                                           TransportCase{"ucx_tcp", TestTransport::kUcx, "tcp"}),
                         [](const ::testing::TestParamInfo<TransportCase>& info) {
                           return info.param.name;
                         });

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
