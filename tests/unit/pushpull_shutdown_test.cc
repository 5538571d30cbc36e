// The scheduler's Shutdown reaching workers in the middle of training, with threads as nodes
// (tests/harness/test_cluster.h): the real Scheduler and Servers, and either embedded worker
// Clients or, per node, the real bitpush-worker Daemon with a daemon-mode Client over its Unix
// socket. Whether the shutdown is clean (every worker slot sent Done — here a forged Done: a test
// endpoint that calls itself worker:N, as anyone reaching the scheduler could) or an error (the
// scheduler stopped), a push_pull pending at that moment and every later one fail within about a
// second, naming the scheduler's shutdown, instead of waiting for worker.op_timeout (2 minutes
// here, so a wait bounded by kFailureBound tells the two apart).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/node/endpoint.h"
#include "common/node/identity.h"
#include "proto/bitpush/v1/control.pb.h"
#include "tests/harness/child_process.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"
#include "worker/client.h"
#include "worker/daemon.h"

namespace bitpush::worker {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// What "at once" means in the assertions: the shutdown reaches the worker in a message, the
// daemon notices its engine's verdict within half a second; op_timeout is 120 s.
constexpr milliseconds kFailureBound{5000};
constexpr milliseconds kOpTimeout{120000};
constexpr size_t kElements = 3000;

enum class Verdict { kClean, kError };

std::string VerdictName(const ::testing::TestParamInfo<Verdict>& info) {
  return info.param == Verdict::kClean ? "CleanFromAForgedDone" : "ErrorFromAStoppedScheduler";
}

testing::TestClusterOptions ClusterOptions() {
  testing::TestClusterOptions t;
  t.source = "pushpull_shutdown_test";
  t.servers = 1;
  t.workers = 2;
  t.heartbeat_interval = milliseconds(50);
  t.heartbeat_timeout = milliseconds(2000);
  t.startup_timeout = milliseconds(10000);
  t.server.engine_threads = 1;
  t.server.numa = config::NumaMode::kOff;
  t.worker.compress_threads = 1;
  t.worker.reduce_threads = 1;
  t.worker.numa = config::NumaMode::kOff;
  t.worker.op_timeout = kOpTimeout;
  return t;
}

// A Done in worker `rank`'s name from an endpoint that is not that worker: the scheduler knows a
// sender by its transport name, so this counts as the worker's Done.
Status ForgeDone(const testing::ThreadCluster& cluster, uint32_t rank) {
  node::NodeEndpointOptions e;
  e.self = node::NodeIdentity{v1::ROLE_WORKER, rank};
  e.listen_address = "inproc://forged-worker-" + std::to_string(rank);
  e.inproc_hub = cluster.hub();
  BP_ASSIGN_OR_RETURN(std::unique_ptr<node::NodeEndpoint> forger, node::NodeEndpoint::Create(e));
  BP_RETURN_IF_ERROR(forger->Connect(node::kSchedulerPeerId, cluster.config().scheduler_address));
  v1::ControlMessage done;
  done.mutable_done();
  const Status sent = forger->SendControl(node::kSchedulerPeerId, done);
  forger->Close();
  return sent;
}

// Ends the job under the workers as `verdict` says.
void EndTheJob(testing::ThreadCluster& cluster, Verdict verdict) {
  if (verdict == Verdict::kClean) {
    for (uint32_t w = 0; w < cluster.config().workers.size(); ++w) {
      const Status forged = ForgeDone(cluster, w);
      ASSERT_TRUE(forged.ok()) << forged.ToString();
    }
  } else {
    cluster.StopScheduler();
  }
}

// The failure names the scheduler's shutdown and, for a clean one, says so.
void ExpectNamesTheShutdown(const Status& s, Verdict verdict) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_CONTAINS(s.message(), "shut the cluster down");
  if (verdict == Verdict::kClean) {
    EXPECT_CONTAINS(s.message(), "clean shutdown: every worker sent Done");
  } else {
    EXPECT_CONTAINS(s.message(), "scheduler interrupted");
  }
}

// Waits at most kFailureBound for `h`; the status it completed with (Timeout from the wait
// itself when it did not complete).
Status WaitBounded(const PushPullHandle& h, milliseconds* waited) {
  const Clock::time_point start = Clock::now();
  const Status s = h.Wait(kFailureBound);
  *waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  return s;
}

void OnEveryWorker(uint32_t workers, const std::function<void(uint32_t)>& fn) {
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < workers; ++w) threads.emplace_back(fn, w);
  for (std::thread& t : threads) t.join();
}

class SchedulerShutdown : public ::testing::TestWithParam<Verdict> {};

TEST_P(SchedulerShutdown, FailsPendingAndLaterPushPullsOfEmbeddedWorkersAtOnceNamingIt) {
  testing::ThreadClusterOptions o;
  o.config = testing::TestClusterConfig(ClusterOptions());
  testing::ThreadCluster cluster(o);
  const Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  std::vector<float> in(kElements, 1.0f), out(kElements);
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t w) {
    ids[w] = cluster.worker(w).Declare("g", kElements, DType::kFloat32).value();
    EXPECT_TRUE(cluster.worker(w).CommitDeclarations().ok());
  });
  const ConstTensorView input(in.data(), kElements);
  const TensorView output(out.data(), kElements);
  // Worker 0's push_pull waits for worker 1's push, which never comes.
  PushPullHandle pending = cluster.worker(0).PushPull(ids[0], input, output);
  EXPECT_EQ(pending.Wait(milliseconds(50)).code(), StatusCode::kTimeout);

  EndTheJob(cluster, GetParam());
  milliseconds waited{};
  const Status s = WaitBounded(pending, &waited);
  ExpectNamesTheShutdown(s, GetParam());
  EXPECT_CONTAINS(s.message(), "tensor 'g'");
  std::cout << "[latency] shutdown -> pending push_pull failed after " << waited.count()
            << " ms: " << s.ToString() << "\n";

  // Later calls on either worker fail too, at once, with the same reason.
  for (uint32_t w = 0; w < 2; ++w) {
    const Status later = WaitBounded(cluster.worker(w).PushPull(ids[w], input, output), &waited);
    ExpectNamesTheShutdown(later, GetParam());
    ExpectNamesTheShutdown(cluster.worker(w).status(), GetParam());
  }
}

// Daemon mode: one bitpush-worker Daemon per node (as threads of this process, over the inproc
// cluster) serving one daemon-mode Client each. The daemon passes the shutdown on to its
// training process instead of leaving it waiting.
TEST_P(SchedulerShutdown, FailsPendingAndLaterPushPullsOfDaemonModeProcessesAtOnceNamingIt) {
  testing::TempDir dir("bp-shutdown");
  ASSERT_TRUE(dir.ok());
  std::vector<std::unique_ptr<Daemon>> daemons(2);
  testing::ThreadClusterOptions o;
  o.config = testing::TestClusterConfig(ClusterOptions());
  o.config.worker.local_size = 1;
  o.start_workers = false;
  testing::ThreadCluster* cluster_ptr = nullptr;
  o.custom_node = [&](v1::Role role, uint32_t rank) -> Status {
    if (role != v1::ROLE_WORKER) return InternalError("unexpected custom node");
    DaemonOptions d;
    d.cluster = cluster_ptr->config();
    d.rank = rank;
    d.socket_path = dir.path() + "/node" + std::to_string(rank) + ".sock";
    d.local_size = 1;
    d.reduce_threads = 1;
    d.completion_threads = 1;
    d.sweep_stale_segments = false;
    d.inproc_hub = cluster_ptr->hub();
    BP_ASSIGN_OR_RETURN(daemons[rank], Daemon::Create(std::move(d)));
    return Status::Ok();
  };
  testing::ThreadCluster cluster(o);
  cluster_ptr = &cluster;
  const Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  std::vector<Status> ran(2);
  std::atomic<int> running{2};
  std::vector<std::thread> runs;
  for (uint32_t n = 0; n < 2; ++n) {
    runs.emplace_back([&, n] {
      ran[n] = daemons[n]->Run();
      --running;
    });
  }

  std::vector<std::unique_ptr<Client>> procs(2);
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t n) {
    ClientOptions c;
    c.cluster = cluster.config();
    c.rank = n;
    c.mode = ClientMode::kDaemon;
    c.daemon_socket = daemons[n]->socket_path();
    c.local_rank = 0;
    c.local_size = 1;
    StatusOr<std::unique_ptr<Client>> made = Client::Create(c);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    procs[n] = std::move(made).value();
    ids[n] = procs[n]->Declare("g", kElements, DType::kFloat32).value();
    EXPECT_TRUE(procs[n]->CommitDeclarations().ok());
  });
  std::vector<float> in(kElements, 1.0f), out(kElements);
  const ConstTensorView input(in.data(), kElements);
  const TensorView output(out.data(), kElements);
  if (procs[0] && procs[1]) {
    // Node 0's round is in its engine, waiting for node 1's push, which never comes.
    PushPullHandle pending = procs[0]->PushPull(ids[0], input, output);
    EXPECT_EQ(pending.Wait(milliseconds(50)).code(), StatusCode::kTimeout);

    EndTheJob(cluster, GetParam());
    milliseconds waited{};
    const Status s = WaitBounded(pending, &waited);
    ExpectNamesTheShutdown(s, GetParam());
    std::cout << "[latency] shutdown -> daemon-mode pending push_pull failed after "
              << waited.count() << " ms: " << s.ToString() << "\n";
    for (uint32_t n = 0; n < 2; ++n) {
      const Status later = WaitBounded(procs[n]->PushPull(ids[n], input, output), &waited);
      ExpectNamesTheShutdown(later, GetParam());
    }
  }
  for (auto& p : procs) {
    if (p) p->Close();
  }
  // Each daemon ends the node by itself (no Stop needed), returning the verdict.
  const Clock::time_point bound = Clock::now() + kFailureBound;
  while (running.load() > 0 && Clock::now() < bound) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(running.load(), 0) << "a daemon still runs " << kFailureBound.count()
                               << " ms after the job ended";
  for (uint32_t n = 0; n < 2; ++n) daemons[n]->Stop();  // no-op for an ended daemon
  for (uint32_t n = 0; n < 2; ++n) {
    runs[n].join();
    ExpectNamesTheShutdown(ran[n], GetParam());
  }
  cluster.Close();
}

INSTANTIATE_TEST_SUITE_P(Verdicts, SchedulerShutdown,
                         ::testing::Values(Verdict::kClean, Verdict::kError), VerdictName);

}  // namespace
}  // namespace bitpush::worker
