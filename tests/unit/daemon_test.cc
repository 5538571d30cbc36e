// The worker daemon as real processes on loopback: bitpush-scheduler, 2
// bitpush-server, 2 bitpush-worker daemons x 3 bitpush-test-trainer processes each
// (tests/tools/test_trainer.cc: worker::Client in daemon mode). Checks:
//  - pulled results equal the reference BIT FOR BIT (each trainer computes the average over all
//    6 processes through the configured compressor, in the order the system computes it) for
//    `none`, `onebit` with error feedback on both sides, and `topk` with error feedback; every
//    process exits 0, the daemons shut the cluster down cleanly, their sockets are gone;
//  - a SIGKILLed training process: its node's other processes fail naming it (local rank and
//    pid) within a bounded time, its daemon exits 1 naming it, nothing of it is left in
//    /dev/shm;
//  - a SIGKILLed daemon: its training processes fail naming the daemon within a bounded time;
//    SIGTERM to the other daemon: exit 0, socket file removed;
//  - another protocol version and a different declaration are refused naming the difference.
// Every child is killed and reaped whatever happens (tests/harness/child_process.h). The daemons
// run with --no-sweep: under `ctest -j` local_ipc_test may be inspecting the leftovers of a
// process it killed on purpose, which a sweeping daemon would remove under its feet.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_topology.h"
#include "tests/harness/child_process.h"
#include "tests/unit/test_util.h"
#include "worker/gpu/gpu_reduce.h"
#include "worker/ipc/local_protocol.h"

#ifndef BITPUSH_DAEMON_BIN
#error "BITPUSH_DAEMON_BIN must be defined (tests/CMakeLists.txt)"
#endif

namespace bitpush::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kNodes = 2;
constexpr int kLocal = 3;
// A failure must reach the other processes within this bound (the kernel reports a dead peer
// at once; the rest is the daemon's poll loop and the trainers' output).
constexpr int kFailureBoundMs = 3000;

bool PathExists(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0;
}

// /dev/shm entries created by any of `pids` (names bitpush-<uid>-<pid>-<n>).
std::vector<std::string> SegmentsOf(const std::vector<pid_t>& pids) {
  std::vector<std::string> found;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    for (pid_t pid : pids) {
      if (name.rfind("bitpush-" + std::to_string(getuid()) + "-" + std::to_string(pid) + "-", 0) ==
          0) {
        found.push_back(name);
      }
    }
  }
  closedir(d);
  return found;
}

class DaemonTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) std::cerr << DescribeChildren(children_, 30);
    children_.clear();
  }

  void WriteConfig(const std::string& spec, const std::string& error_feedback,
                   double op_timeout_s = 10, const std::string& extra_worker_yaml = "",
                   int local_size = kLocal) {
    std::set<int> used;
    auto address = [&] {
      int p = FreeTcpPort();
      while (p > 0 && !used.insert(p).second) p = FreeTcpPort();
      return "127.0.0.1:" + std::to_string(p);
    };
    std::ostringstream y;
    y << "cluster:\n  scheduler: " << address() << "\n  servers: [" << address() << ", "
      << address() << "]\n  workers: [" << address() << ", " << address() << "]\n"
      << "  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1000\n  startup_timeout_s: 10\n"
      << "compression:\n  spec: " << spec << "\n  error_feedback: " << error_feedback << "\n"
      << "  min_compress_bytes: 4096\n  partition_bytes: 32768\n"
      << "server:\n  engine_threads: 1\n  numa: off\n"
      << "worker:\n  compress_threads: 1\n  op_timeout_s: " << op_timeout_s
      << "\n  local_size: " << local_size << "\n"
      << extra_worker_yaml;
    config_ = dir_.path() + "/cluster.yaml";
    std::ofstream(config_) << y.str();
  }

  std::string Socket(int node) const {
    return dir_.path() + "/node" + std::to_string(node) + ".sock";
  }

  void StartCluster() {
    Add("scheduler", {BITPUSH_SCHEDULER_BIN, "--config", config_}, "scheduler.log");
    for (int s = 0; s < 2; ++s) {
      servers_.push_back(Add("server " + std::to_string(s),
                             {BITPUSH_SERVER_BIN, "--config", config_, "--rank", std::to_string(s)},
                             "server" + std::to_string(s) + ".log"));
    }
    for (int n = 0; n < kNodes; ++n) {
      daemons_.push_back(Add("daemon " + std::to_string(n),
                             {BITPUSH_DAEMON_BIN, "--config", config_, "--rank", std::to_string(n),
                              "--socket", Socket(n), "--no-sweep"},
                             "daemon" + std::to_string(n) + ".log"));
    }
  }

  Child* StartTrainer(int node, int local_rank, int iters, int pause_ms = 0,
                      const std::vector<std::string>& extra = {}, int local_size = kLocal) {
    const std::string label = "trainer " + std::to_string(node) + "." + std::to_string(local_rank);
    std::vector<std::string> argv = {BITPUSH_TEST_TRAINER_BIN,
                                     "--config",
                                     config_,
                                     "--node",
                                     std::to_string(node),
                                     "--local-rank",
                                     std::to_string(local_rank),
                                     "--local-size",
                                     std::to_string(local_size),
                                     "--socket",
                                     Socket(node),
                                     "--iters",
                                     std::to_string(iters),
                                     "--pause-ms",
                                     std::to_string(pause_ms)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Child* c = Add(label, argv,
                   "trainer" + std::to_string(node) + std::to_string(local_rank) + "-" +
                       std::to_string(children_.size()) + ".log");
    trainers_.push_back(c);
    return c;
  }

  Child* Add(const std::string& label, const std::vector<std::string>& argv,
             const std::string& log) {
    children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log));
    EXPECT_TRUE(children_.back()->spawned()) << label;
    return children_.back().get();
  }

  std::vector<pid_t> AllPids() const {
    std::vector<pid_t> pids;
    for (const auto& c : children_) pids.push_back(c->pid());
    return pids;
  }

  TempDir dir_{"bp-daemon"};
  std::string config_;
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<Child*> servers_;
  std::vector<Child*> daemons_;
  std::vector<Child*> trainers_;
};

struct SpecParam {
  const char* spec;
  const char* error_feedback;
};

class DaemonResult : public DaemonTest, public ::testing::WithParamInterface<SpecParam> {};

TEST_P(DaemonResult, EveryProcessPullsTheAverageOfAllSixBitForBit) {
  WriteConfig(GetParam().spec, GetParam().error_feedback);
  StartCluster();
  constexpr int kIters = 4;
  for (int n = 0; n < kNodes; ++n) {
    for (int p = 0; p < kLocal; ++p) StartTrainer(n, p, kIters);
  }
  std::vector<Child*> all;
  for (const auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(25000))) << "the cluster did not finish";
  for (Child* t : trainers_) {
    EXPECT_EQ(t->exit_code(), 0) << t->label() << ":\n" << t->output();
    EXPECT_CONTAINS(t->output(), "iteration " + std::to_string(kIters - 1) + " ok");
  }
  for (const auto& c : children_)
    EXPECT_EQ(c->exit_code(), 0) << c->label() << ":\n" << c->output();
  for (int n = 0; n < kNodes; ++n) EXPECT_FALSE(PathExists(Socket(n))) << Socket(n);
  EXPECT_TRUE(SegmentsOf(AllPids()).empty());
}

INSTANTIATE_TEST_SUITE_P(Specs, DaemonResult,
                         ::testing::Values(SpecParam{"none", "none"}, SpecParam{"onebit", "both"},
                                           SpecParam{"topk:ratio=0.05", "both"}),
                         [](const ::testing::TestParamInfo<SpecParam>& i) {
                           const std::string s = i.param.spec;
                           return s.substr(0, s.find(':'));
                         });

// Polls until `child` printed `text` or exited; the time it was seen.
Clock::time_point WaitFor(Child& child, const std::string& text, milliseconds bound) {
  const Clock::time_point deadline = Clock::now() + bound;
  while (Clock::now() < deadline) {
    if (child.output().find(text) != std::string::npos) return Clock::now();
    std::this_thread::sleep_for(milliseconds(5));
  }
  return Clock::time_point::max();
}

// The GPU path (CUDA tensors through the daemon). Without a usable GPU (or without CUDA in the
// build) the daemon refuses a CUDA tensor at its declaration naming why, and every process
// gets that reason; with GPUs the FP16 cast + NCCL reduce + broadcast path must give the exact
// average within fp16 tolerance (bitpush-test-trainer --gpu 1).
TEST_F(DaemonTest, GpuTensorWithoutAUsableGpuIsRefusedNamingWhy) {
  if (worker::gpu::GpuViability().ok()) GTEST_SKIP() << "a GPU is usable here: see GpuPath*";
  WriteConfig("none", "none");
  StartCluster();
  for (int n = 0; n < kNodes; ++n) {
    for (int p = 0; p < kLocal; ++p) StartTrainer(n, p, 1, 0, {"--gpu", "1"});
  }
  for (Child* t : trainers_) {
    ASSERT_TRUE(WaitAll({t}, Clock::now() + milliseconds(15000))) << t->label();
    EXPECT_EQ(t->exit_code(), 3) << t->output();
    EXPECT_CONTAINS(t->output(), "error: iteration 0: ");
    EXPECT_CONTAINS(t->output(), "'grad.gpu' is on a GPU but this daemon cannot run the GPU path");
    EXPECT_CONTAINS(t->output(), worker::gpu::GpuViability().message());
  }
}

TEST_F(DaemonTest, GpuPathGivesTheAverageOfAllProcessesWithinFp16Tolerance) {
  const Status viable = worker::gpu::GpuViability();
  if (!viable.ok()) GTEST_SKIP() << viable.ToString();
  // One GPU per training process on a node (NCCL): as many local processes as GPUs, up to 3.
  const int local = std::min(kLocal, *worker::gpu::GpuDeviceCount());
  WriteConfig("none", "none", 10, "", local);
  StartCluster();
  for (int n = 0; n < kNodes; ++n) {
    for (int p = 0; p < local; ++p) StartTrainer(n, p, 3, 0, {"--gpu", "1"}, local);
  }
  std::vector<Child*> all;
  for (const auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(60000))) << "the cluster did not finish";
  for (Child* t : trainers_) {
    EXPECT_EQ(t->exit_code(), 0) << t->label() << ":\n" << t->output();
    EXPECT_CONTAINS(t->output(), "iteration 2 ok");
  }
}

TEST_F(DaemonTest, DeclarationsInterleavedWithFirstRoundsAgreeOnEveryNode) {
  // Each process declares a tensor only after posting the previous one's first push_pull (as
  // bitpush.torch does on first use): the daemons must announce the same declarations with
  // the same rounds on both nodes (regression: the poll loop declared in the engine while the
  // round thread's push_pull announced, so one node could announce a tensor a round earlier
  // than the other and the cluster refused it as a declaration difference).
  WriteConfig("onebit", "both");
  StartCluster();
  for (int n = 0; n < kNodes; ++n) {
    for (int p = 0; p < kLocal; ++p) StartTrainer(n, p, 3, 0, {"--late-declare", "1"});
  }
  std::vector<Child*> all;
  for (const auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(25000))) << "the cluster did not finish";
  for (Child* t : trainers_) {
    EXPECT_EQ(t->exit_code(), 0) << t->label() << ":\n" << t->output();
    EXPECT_CONTAINS(t->output(), "iteration 2 ok");
  }
}

// The number after `prefix` on each line of `text` that contains it, in order.
std::vector<long long> NumbersAfter(const std::string& text, const std::string& prefix) {
  std::vector<long long> out;
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
    out.push_back(std::stoll(text.substr(at + prefix.size())));
  }
  return out;
}

TEST_F(DaemonTest, BarrierReleasesNoProcessBeforeEveryProcessOfEveryNodeEnteredIt) {
  WriteConfig("none", "none");
  StartCluster();
  constexpr int kIters = 3;
  for (int n = 0; n < kNodes; ++n) {
    // One late process per node, on a different local rank, enters each barrier 150 ms after
    // its siblings: every barrier must wait for both.
    for (int p = 0; p < kLocal; ++p) {
      StartTrainer(n, p, kIters, 0, {"--barrier", p == n + 1 ? "150" : "0"});
    }
  }
  std::vector<Child*> all;
  for (const auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(25000))) << "the cluster did not finish";
  for (int k = 0; k < kIters; ++k) {
    long long last_entry = 0, first_exit = std::numeric_limits<long long>::max();
    for (Child* t : trainers_) {
      ASSERT_EQ(t->exit_code(), 0) << t->label() << ":\n" << t->output();
      const std::vector<long long> in =
          NumbersAfter(t->output(), "entering barrier " + std::to_string(k) + " at ");
      const std::vector<long long> out =
          NumbersAfter(t->output(), "barrier " + std::to_string(k) + " ok at ");
      ASSERT_EQ(in.size(), 1u) << t->output();
      ASSERT_EQ(out.size(), 1u) << t->output();
      last_entry = std::max(last_entry, in[0]);
      first_exit = std::min(first_exit, out[0]);
    }
    EXPECT_GE(first_exit, last_entry) << "barrier " << k << " released a process early";
  }
}

// "Cpus_allowed_list" of every thread of `pid`, by thread name (/proc/PID/task/*/).
std::multimap<std::string, std::string> ThreadCpus(pid_t pid) {
  std::multimap<std::string, std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string comm;
    std::getline(std::ifstream(dir + "/" + e->d_name + "/comm"), comm);
    std::ifstream status(dir + "/" + e->d_name + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        out.emplace(comm, line.substr(line.find_first_not_of(" \t", 18)));
      }
    }
  }
  closedir(d);
  return out;
}

TEST_F(DaemonTest, ThreadsRunOnTheirShareOfTheCpuSplit) {
  // worker.numa on: the network core, then the reduce threads, then the compression threads
  // (common/cpu_topology.h PlanWorkerCpus), over the cores this test (and so its children) may
  // use.
  WriteConfig("none", "none", 10, "  numa: on\n  reduce_threads: 2\n");
  StartCluster();
  StatusOr<std::vector<CpuSlot>> cores = ProcessCores();
  ASSERT_TRUE(cores.ok()) << cores.status().ToString();
  const WorkerCpuPlan plan = PlanWorkerCpus(*cores, 2, 1);
  for (int n = 0; n < kNodes; ++n) {
    Child* d = daemons_[n];
    // The daemon's line, printed once Create returned (every thread started and named).
    ASSERT_NE(WaitFor(*d, "bitpush-worker node " + std::to_string(n) + ": listening at",
                      milliseconds(15000)),
              Clock::time_point::max())
        << d->output();
    EXPECT_CONTAINS(d->output(),
                    "2 reduce thread(s), 1 compression thread(s); " + DescribeWorkerCpuPlan(plan));
    const std::multimap<std::string, std::string> threads = ThreadCpus(d->pid());
    std::map<std::string, int> seen;
    for (const auto& [name, cpus] : threads) {
      std::string want;
      if (name.rfind("bp-dreduce", 0) == 0) {
        want = std::to_string(plan.reduce_cpus[name.back() - '0']);
      } else if (name.rfind("bp-wpool", 0) == 0) {
        want = std::to_string(plan.compress_cpus[0]);
      } else if (name == "bp-dround" || name == "bp-ddone") {
        want = std::to_string(plan.network_cpu);
      } else {
        continue;
      }
      ++seen[name.substr(0, 8)];
      EXPECT_EQ(cpus, want) << "thread " << name << " of " << d->label();
    }
    EXPECT_EQ(seen["bp-dredu"], 2) << d->label();
    EXPECT_EQ(seen["bp-wpool"], 1) << d->label();
    EXPECT_EQ(seen["bp-dround"], 0);
    EXPECT_EQ(seen["bp-droun"], 1) << d->label();
    EXPECT_EQ(seen["bp-ddone"], 4) << d->label();
  }
}

TEST_F(DaemonTest, KilledTrainingProcessFailsItsSiblingsNamingItAndLeavesNoSegments) {
  WriteConfig("onebit", "both");
  StartCluster();
  for (int n = 0; n < kNodes; ++n) {
    // Local rank 2 of each node pauses before every round: ranks 0 and 1 are usually waiting
    // in a gathered round when the victim dies.
    for (int p = 0; p < kLocal; ++p) StartTrainer(n, p, 100000, p == 2 ? 30 : 0);
  }
  for (Child* t : trainers_) {
    ASSERT_NE(WaitFor(*t, "iteration 2 ok", milliseconds(15000)), Clock::time_point::max())
        << t->label();
  }
  Child* victim = trainers_[1];  // node 0, local rank 1
  const std::string name = "local rank 1 (pid " + std::to_string(victim->pid()) + ")";
  const Clock::time_point killed = Clock::now();
  victim->Kill();
  for (int p : {0, 2}) {
    Child* t = trainers_[p];
    const Clock::time_point seen = WaitFor(*t, ": error: ", milliseconds(kFailureBoundMs + 2000));
    ASSERT_NE(seen, Clock::time_point::max()) << t->label() << ":\n" << t->output();
    EXPECT_LE(MsBetween(killed, seen), kFailureBoundMs) << t->label();
    std::cout << "[latency] trainer 0.1 SIGKILLed -> " << t->label() << " failed after "
              << MsBetween(killed, seen) << " ms\n";
    EXPECT_CONTAINS(t->output(), name);
    EXPECT_TRUE(WaitAll({t}, Clock::now() + milliseconds(5000)));
    EXPECT_EQ(t->exit_code(), 3) << t->output();
  }
  ASSERT_TRUE(WaitAll({daemons_[0]}, Clock::now() + milliseconds(10000))) << daemons_[0]->output();
  EXPECT_EQ(daemons_[0]->exit_code(), 1);
  EXPECT_CONTAINS(daemons_[0]->output(), name);
  EXPECT_FALSE(PathExists(Socket(0)));
  // Node 1 learns from the cluster (worker 0 gone): its processes fail too, bounded.
  for (int p = 0; p < kLocal; ++p) {
    EXPECT_TRUE(WaitAll({trainers_[kLocal + p]}, Clock::now() + milliseconds(10000)))
        << trainers_[kLocal + p]->label();
  }
  EXPECT_TRUE(SegmentsOf({victim->pid(), trainers_[0]->pid(), trainers_[2]->pid()}).empty());
}

TEST_F(DaemonTest, KilledDaemonFailsItsProcessesAndSigtermEndsTheOtherCleanly) {
  WriteConfig("none", "none");
  StartCluster();
  for (int n = 0; n < kNodes; ++n) {
    for (int p = 0; p < kLocal; ++p) StartTrainer(n, p, 100000, p == 2 ? 30 : 0);
  }
  for (Child* t : trainers_) {
    ASSERT_NE(WaitFor(*t, "iteration 2 ok", milliseconds(15000)), Clock::time_point::max())
        << t->label();
  }
  const Clock::time_point killed = Clock::now();
  daemons_[0]->Kill();
  for (int p = 0; p < kLocal; ++p) {
    Child* t = trainers_[p];
    const Clock::time_point seen = WaitFor(*t, ": error: ", milliseconds(kFailureBoundMs + 2000));
    ASSERT_NE(seen, Clock::time_point::max()) << t->label() << ":\n" << t->output();
    EXPECT_LE(MsBetween(killed, seen), kFailureBoundMs) << t->label();
    std::cout << "[latency] daemon 0 SIGKILLed -> " << t->label() << " failed after "
              << MsBetween(killed, seen) << " ms\n";
    EXPECT_CONTAINS(t->output(), "bitpush-worker daemon at " + Socket(0));
  }
  // SIGTERM: the other daemon ends its processes, removes its socket, exits 0.
  daemons_[1]->Signal(SIGTERM);
  ASSERT_TRUE(WaitAll({daemons_[1]}, Clock::now() + milliseconds(10000))) << daemons_[1]->output();
  EXPECT_EQ(daemons_[1]->exit_code(), 0) << daemons_[1]->output();
  EXPECT_FALSE(PathExists(Socket(1)));
  for (int p = 0; p < kLocal; ++p) {
    EXPECT_TRUE(WaitAll({trainers_[kLocal + p]}, Clock::now() + milliseconds(10000)));
    EXPECT_NE(trainers_[kLocal + p]->exit_code(), 0);
  }
  std::vector<pid_t> pids;
  for (Child* t : trainers_) pids.push_back(t->pid());
  EXPECT_TRUE(SegmentsOf(pids).empty());
}

TEST_F(DaemonTest, StoppedSchedulerEndsIdleDaemonsNamingIt) {
  // Every process asleep before its first round: no push_pull in flight to fail. The scheduler
  // stopped by SIGTERM shuts the cluster down; each daemon notices it by itself (not at the
  // next push_pull, which under systemd might never come), tells its processes and exits 1.
  WriteConfig("none", "none");
  StartCluster();
  for (int n = 0; n < kNodes; ++n) {
    for (int p = 0; p < kLocal; ++p) StartTrainer(n, p, 100, /*pause_ms=*/60000);
  }
  for (Child* d : daemons_) {  // every process connected (and now asleep before round 0)
    ASSERT_NE(WaitFor(*d, "joined (3 of 3)", milliseconds(15000)), Clock::time_point::max())
        << d->label() << ":\n"
        << d->output();
  }
  Child* scheduler = children_[0].get();
  const Clock::time_point stopped = Clock::now();
  scheduler->Signal(SIGTERM);
  ASSERT_TRUE(WaitAll(daemons_, stopped + milliseconds(kFailureBoundMs)));
  for (Child* d : daemons_) {
    EXPECT_EQ(d->exit_code(), 1) << d->output();
    EXPECT_CONTAINS(d->output(), "the cluster failed");
    EXPECT_CONTAINS(d->output(), "scheduler interrupted");
    std::cout << "[latency] scheduler stopped -> " << d->label() << " ended after "
              << MsBetween(stopped, Clock::now()) << " ms (at most)\n";
  }
  EXPECT_TRUE(WaitAll({scheduler}, Clock::now() + milliseconds(kFailureBoundMs)));
  EXPECT_EQ(scheduler->exit_code(), 0) << scheduler->output();  // stopped as asked
  for (int n = 0; n < kNodes; ++n) EXPECT_FALSE(PathExists(Socket(n)));
  // The trainers sleep through it (their next push_pull would fail); the fixture kills them.
}

TEST_F(DaemonTest, HungDaemonFailsItsProcessesWithTimeoutNamingIt) {
  // op_timeout 1 s: a daemon-mode push_pull waits at most 1 s + 2 s (kDaemonWaitMargin).
  WriteConfig("none", "none", 1);
  StartCluster();
  for (int p = 0; p < kLocal; ++p) StartTrainer(0, p, 100000);
  for (int p = 0; p < kLocal; ++p) StartTrainer(1, p, 100000);
  for (Child* t : trainers_) {
    ASSERT_NE(WaitFor(*t, "iteration 2 ok", milliseconds(15000)), Clock::time_point::max())
        << t->label();
  }
  const Clock::time_point stopped = Clock::now();
  daemons_[0]->Signal(SIGSTOP);
  for (int p = 0; p < kLocal; ++p) {
    Child* t = trainers_[p];
    const Clock::time_point seen = WaitFor(*t, ": error: ", milliseconds(8000));
    ASSERT_NE(seen, Clock::time_point::max()) << t->label() << ":\n" << t->output();
    EXPECT_LE(MsBetween(stopped, seen), 3000 + 1500) << t->label();
    EXPECT_CONTAINS(t->output(), "Timeout");
    EXPECT_CONTAINS(t->output(), "no answer from the bitpush-worker daemon at " + Socket(0));
  }
  daemons_[0]->Signal(SIGCONT);
}

TEST_F(DaemonTest, AnotherProtocolVersionAndADifferentDeclarationAreRefusedNamingTheDifference) {
  WriteConfig("none", "none");
  StartCluster();
  Child* old = StartTrainer(0, 0, 1, 0, {"--hello-major", "2"});
  ASSERT_TRUE(WaitAll({old}, Clock::now() + milliseconds(15000)));
  EXPECT_EQ(old->exit_code(), 5) << old->output();
  const std::string minor = std::to_string(worker::ipc::kLocalProtocolMinor);
  EXPECT_CONTAINS(old->output(), "speaks 2." + minor + ", this bitpush-worker speaks 1." + minor);
  // Node 0: local rank 2 declares grad.big with one more element.
  std::vector<Child*> node0 = {StartTrainer(0, 0, 1), StartTrainer(0, 1, 1),
                               StartTrainer(0, 2, 1, 0, {"--elements-delta", "1"})};
  ASSERT_TRUE(WaitAll(node0, Clock::now() + milliseconds(15000)));
  for (Child* t : node0) {
    EXPECT_EQ(t->exit_code(), 3) << t->output();
    EXPECT_CONTAINS(t->output(), "tensor #0 differs in elements");
    EXPECT_CONTAINS(t->output(), "30000 x float32");
    EXPECT_CONTAINS(t->output(), "30001 x float32");
  }
}

// Error-feedback state in daemon mode (LocalErrorFeedback, local protocol 1.3), 2 nodes x 2
// processes, onebit with worker error feedback: every process reads its node's residual after
// every round through Client::ErrorFeedbackState and it equals the reference's BIT FOR BIT; after
// round 1 every process restores (local rank 0: half the residual; local rank 1: 1000.0
// everywhere) and the later rounds and residuals still match a reference that halved every
// node's residual — exactly local rank 0's restore took effect. Restores of the wrong size are
// InvalidArgument, and a read while the process's own push_pull is pending is FailedPrecondition.
TEST_F(DaemonTest, ErrorFeedbackStateIsTheNodesResidualAndLocalRankZerosRestoreIsApplied) {
  WriteConfig("onebit", "worker", 10, "", 2);
  StartCluster();
  constexpr int kIters = 4;
  for (int n = 0; n < kNodes; ++n) {
    for (int p = 0; p < 2; ++p) {
      StartTrainer(n, p, kIters, 0, {"--ef-check", "1", "--ef-restore-at", "1"}, 2);
    }
  }
  std::vector<Child*> all;
  for (const auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(25000))) << "the cluster did not finish";
  for (Child* t : trainers_) {
    EXPECT_EQ(t->exit_code(), 0) << t->label() << ":\n" << t->output();
    EXPECT_CONTAINS(t->output(), "restored after iteration 1");
    EXPECT_CONTAINS(t->output(), "residual of grad.big ok (30000 values)");
    EXPECT_CONTAINS(t->output(), "residual of grad.half ok (3000 values)");
    EXPECT_CONTAINS(t->output(), "residual of grad.small ok (0 values)");
    EXPECT_CONTAINS(t->output(), "iteration " + std::to_string(kIters - 1) + " ok");
  }
  for (const auto& c : children_)
    EXPECT_EQ(c->exit_code(), 0) << c->label() << ":\n" << c->output();
  EXPECT_TRUE(SegmentsOf(AllPids()).empty());
}

// The daemon checks a LocalErrorFeedback like a push_pull and refuses, naming the problem, and
// keeps serving: node 0's local rank 0 is a raw-protocol probe (bitpush-test-trainer --ef-probe)
// that sends an unknown tensor, a wrong-sized slice, another process's segment, a slice outside
// its segment, a lying segment size, too many / too few values, values for a tensor that keeps
// none, and polls the residual during each round: refused while its own hand-in waits for local
// rank 1 (which pauses 400 ms) and while the round is in the engine (node 1 pauses 1000 ms), read
// bit for bit once the round ended. Every process's results stay exact.
TEST_F(DaemonTest, ErrorFeedbackRequestsAreCheckedLikePushPullsAndRefusedWhileInFlight) {
  WriteConfig("onebit", "both", 10, "", 2);
  StartCluster();
  constexpr int kIters = 2;
  Child* probe = StartTrainer(0, 0, kIters, 0, {"--ef-probe", "1"}, 2);
  StartTrainer(0, 1, kIters, 400, {}, 2);
  StartTrainer(1, 0, kIters, 1000, {}, 2);
  StartTrainer(1, 1, kIters, 1000, {}, 2);
  std::vector<Child*> all;
  for (const auto& c : children_) all.push_back(c.get());
  ASSERT_TRUE(WaitAll(all, Clock::now() + milliseconds(25000))) << "the cluster did not finish";
  for (Child* t : trainers_) {
    EXPECT_EQ(t->exit_code(), 0) << t->label() << ":\n" << t->output();
    EXPECT_CONTAINS(t->output(), "iteration " + std::to_string(kIters - 1) + " ok");
  }
  const std::string out = probe->output();
  for (const char* check : {"lying segment size", "unknown tensor", "wrong size", "foreign segment",
                            "outside its segment", "too many values", "too few values",
                            "keeps none", "refused while gathering", "refused while in the engine",
                            "read grad.big after round 1", "read grad.half after round 1"}) {
    EXPECT_CONTAINS(out, std::string("check ") + check + " ok");
  }
  EXPECT_CONTAINS(out, "grad.big' asked by local rank 0 (pid " + std::to_string(probe->pid()));
  for (const auto& c : children_)
    EXPECT_EQ(c->exit_code(), 0) << c->label() << ":\n" << c->output();
}

}  // namespace
}  // namespace bitpush::testing
