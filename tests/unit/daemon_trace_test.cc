// The timeline's `optimizer` span in daemon mode (docs/observability.md, docs/local-ipc.md
// "LocalOptimizerSpan"): the training process's DaemonClient sends it only to a daemon that
// speaks local protocol 1.4 and said in its HelloReply that it traces; the real Daemon (threads
// of this process over an inproc cluster) records each process's span in its engine's span
// file with the sender's times, its local rank and the round just pushed, drops bad times
// without harm to the node, and refuses the message from a connection that has not said Hello.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/trace/recorder.h"
#include "tests/harness/child_process.h"
#include "tests/harness/test_cluster.h"
#include "worker/client.h"
#include "worker/daemon.h"
#include "worker/daemon_client.h"
#include "worker/ipc/channel.h"
#include "worker/ipc/local_protocol.h"

namespace bitpush::worker {
namespace {

using std::chrono::milliseconds;

constexpr size_t kElements = 1000;

// A fake daemon of local protocol minor `minor` that answers one Hello with `tracing`; the
// DaemonClient's TraceOptimizer then sends a LocalOptimizerSpan (returned) or nothing (nullopt).
std::optional<v1::LocalOptimizerSpan> WhatTheClientSends(const std::string& socket, uint32_t minor,
                                                         bool tracing) {
  auto listener = ipc::Listener::Listen(socket);
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  if (!listener.ok()) return std::nullopt;
  std::unique_ptr<ipc::Channel> daemon_side;
  std::thread fake([&] {
    auto ch = (*listener)->Accept(milliseconds(5000));
    if (!ch.ok()) return;
    auto hello = ipc::ReceiveLocalMessage(**ch, milliseconds(5000));
    if (!hello.ok() || !hello->has_hello()) return;
    v1::LocalMessage m;
    v1::LocalHelloReply* r = m.mutable_hello_reply();
    r->mutable_version()->set_major(ipc::kLocalProtocolMajor);
    r->mutable_version()->set_minor(minor);
    r->set_num_nodes(1);
    r->set_op_timeout_ms(1000);
    r->set_tracing(tracing);
    (void)ipc::SendLocalMessage(**ch, m);
    daemon_side = std::move(ch).value();
  });
  DaemonClientOptions o;
  o.socket_path = socket;
  o.startup_timeout = milliseconds(5000);
  auto client = DaemonClient::Connect(o);
  fake.join();
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  if (!client.ok() || daemon_side == nullptr) return std::nullopt;
  (*client)->TraceOptimizer(1234, 5678);
  auto got = ipc::ReceiveLocalMessage(*daemon_side, milliseconds(300));
  (*client)->Close();
  if (!got.ok()) {
    EXPECT_EQ(got.status().code(), StatusCode::kTimeout) << got.status().ToString();
    return std::nullopt;
  }
  EXPECT_TRUE(got->has_optimizer_span()) << got->DebugString();
  return got->optimizer_span();
}

TEST(DaemonOptimizerSpan, SentOnlyToADaemonOf1_4ThatTraces) {
  ASSERT_EQ(ipc::kLocalMinorOptimizerSpan, ipc::kLocalMinorErrorFeedback + 1);
  ASSERT_GE(ipc::kLocalProtocolMinor, ipc::kLocalMinorOptimizerSpan);
  testing::TempDir dir("bp-dtrace");
  ASSERT_TRUE(dir.ok());
  // An older daemon would take the unknown message for garbage and end the node: nothing, even
  // if it (wrongly) set the field.
  EXPECT_FALSE(WhatTheClientSends(dir.path() + "/a.sock", ipc::kLocalMinorOptimizerSpan - 1, true));
  // A daemon with tracing off: nothing.
  EXPECT_FALSE(WhatTheClientSends(dir.path() + "/b.sock", ipc::kLocalMinorOptimizerSpan, false));
  // A daemon that traces: the times as given.
  const auto sent = WhatTheClientSends(dir.path() + "/c.sock", ipc::kLocalMinorOptimizerSpan, true);
  ASSERT_TRUE(sent);
  EXPECT_EQ(sent->start_ns(), 1234);
  EXPECT_EQ(sent->end_ns(), 5678);
}

// The `optimizer` span lines of the daemon's span file under `dir`.
std::vector<std::string> OptimizerSpanLines(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::string line;
    bool daemon = false;
    std::vector<std::string> spans;
    while (std::getline(in, line)) {
      if (line.find("\"type\":\"process\"") != std::string::npos &&
          line.find("\"process\":\"daemon\"") != std::string::npos) {
        daemon = true;
      }
      if (line.find("\"name\":\"optimizer\"") != std::string::npos) spans.push_back(line);
    }
    if (daemon) out.insert(out.end(), spans.begin(), spans.end());
  }
  return out;
}

// One span line of the daemon: its exact fields but the tid (the poll loop's number).
bool HasSpan(const std::vector<std::string>& lines, int64_t start, int64_t end, uint64_t round,
             uint32_t local_rank) {
  const std::string head =
      "{\"type\":\"span\",\"name\":\"optimizer\",\"ts\":" + std::to_string(start) +
      ",\"dur\":" + std::to_string(end - start) + ",\"tid\":";
  const std::string tail = ",\"key\":0,\"round\":" + std::to_string(round) +
                           ",\"bytes\":0,\"local_rank\":" + std::to_string(local_rank) + "}";
  for (const std::string& l : lines) {
    if (l.rfind(head, 0) == 0 && l.size() > head.size() + tail.size() &&
        l.compare(l.size() - tail.size(), tail.size(), tail) == 0) {
      return true;
    }
  }
  return false;
}

// One node of 2 training processes (daemon-mode Clients of this process) under the real Daemon
// with trace.dir set, 1 server: after each round both report an optimizer step; local rank 1
// also reports bad ones (end before start, negative, extreme, before its Hello, in the
// future), and a connection that never said Hello sends one. The daemon's file holds exactly
// the good spans, each with its sender's times, local rank and round; the node trains on.
TEST(DaemonOptimizerSpan, TheDaemonRecordsEachProcessesStepWithItsTimesAndLocalRank) {
  testing::TempDir dir("bp-dtrace");
  ASSERT_TRUE(dir.ok());
  const std::string timeline = dir.path() + "/timeline";
  testing::TestClusterOptions t;
  t.source = "daemon_trace_test";
  t.servers = 1;
  t.workers = 1;
  t.startup_timeout = milliseconds(10000);
  t.server.engine_threads = 1;
  t.server.numa = config::NumaMode::kOff;
  t.worker.compress_threads = 1;
  t.worker.reduce_threads = 1;
  t.worker.numa = config::NumaMode::kOff;
  t.worker.local_size = 2;
  testing::ThreadClusterOptions o;
  o.config = testing::TestClusterConfig(t);
  o.config.trace.dir = timeline;
  o.start_workers = false;
  std::unique_ptr<Daemon> daemon;
  testing::ThreadCluster* cluster_ptr = nullptr;
  o.custom_node = [&](v1::Role role, uint32_t rank) -> Status {
    if (role != v1::ROLE_WORKER) return InternalError("unexpected custom node");
    DaemonOptions d;
    d.cluster = cluster_ptr->config();
    d.rank = rank;
    d.socket_path = dir.path() + "/node.sock";
    d.local_size = 2;
    d.reduce_threads = 1;
    d.completion_threads = 1;
    d.sweep_stale_segments = false;
    d.inproc_hub = cluster_ptr->hub();
    BP_ASSIGN_OR_RETURN(daemon, Daemon::Create(std::move(d)));
    return Status::Ok();
  };
  testing::ThreadCluster cluster(o);
  cluster_ptr = &cluster;
  const Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  ASSERT_NE(daemon, nullptr);
  Status ran;
  std::thread run([&] { ran = daemon->Run(); });
  // A failed assertion below returns early: the daemon is stopped and joined first.
  struct StopOnExit {
    Daemon* daemon;
    std::thread* run;
    ~StopOnExit() {
      if (run->joinable()) {
        daemon->Stop();
        run->join();
      }
    }
  } stop_on_exit{daemon.get(), &run};

  std::vector<std::unique_ptr<Client>> procs(2);
  std::vector<TensorId> ids(2);
  {
    std::vector<std::thread> joins;
    for (uint32_t p = 0; p < 2; ++p) {
      joins.emplace_back([&, p] {
        ClientOptions c;
        c.cluster = cluster.config();
        c.rank = 0;
        c.mode = ClientMode::kDaemon;
        c.daemon_socket = daemon->socket_path();
        c.local_rank = p;
        c.local_size = 2;
        StatusOr<std::unique_ptr<Client>> made = Client::Create(c);
        ASSERT_TRUE(made.ok()) << made.status().ToString();
        procs[p] = std::move(made).value();
        ids[p] = procs[p]->Declare("g", kElements, DType::kFloat32).value();
        EXPECT_TRUE(procs[p]->CommitDeclarations().ok());
      });
    }
    for (std::thread& j : joins) j.join();
  }
  ASSERT_TRUE(procs[0] && procs[1]);
  std::vector<std::vector<float>> in(2, std::vector<float>(kElements, 1.0f));
  std::vector<std::vector<float>> out(2, std::vector<float>(kElements));
  const auto round = [&] {
    std::vector<PushPullHandle> handles;
    for (uint32_t p = 0; p < 2; ++p) {
      handles.push_back(procs[p]->PushPull(ids[p], ConstTensorView(in[p].data(), kElements),
                                           TensorView(out[p].data(), kElements)));
    }
    for (PushPullHandle& h : handles) {
      const Status s = h.Wait(milliseconds(20000));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  };
  // A step of ~1 ms on this process's steady clock, as the training script measures it.
  const auto step = [] {
    const int64_t start = trace::NowNs();
    std::this_thread::sleep_for(milliseconds(1));
    return std::pair<int64_t, int64_t>(start, trace::NowNs());
  };

  round();
  const auto a = step();
  procs[0]->TraceOptimizer(a.first, a.second);
  const auto b = step();
  procs[1]->TraceOptimizer(b.first, b.second);
  // Bad times from local rank 1: none is recorded, the node goes on.
  const int64_t now = trace::NowNs();
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  procs[1]->TraceOptimizer(b.second, b.first);              // end before start
  procs[1]->TraceOptimizer(kMin, kMax);                     // absurd
  procs[1]->TraceOptimizer(-2, -1);                         // negative
  procs[1]->TraceOptimizer(1, 2);                           // before its Hello
  procs[1]->TraceOptimizer(now + 3'600'000'000'000, kMax);  // in the future
  // A connection that never said Hello: refused (closed) as for any other message.
  {
    auto raw = ipc::Channel::Connect(daemon->socket_path(), milliseconds(2000));
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    v1::LocalMessage m;
    m.mutable_optimizer_span()->set_start_ns(a.first);
    m.mutable_optimizer_span()->set_end_ns(a.second);
    ASSERT_TRUE(ipc::SendLocalMessage(**raw, m).ok());
    const auto answer = ipc::ReceiveLocalMessage(**raw, milliseconds(5000));
    EXPECT_EQ(answer.status().code(), StatusCode::kUnavailable) << answer.status().ToString();
  }
  round();  // the node trains on
  const auto c = step();
  procs[0]->TraceOptimizer(c.first, c.second);

  for (auto& p : procs) {
    const Status s = p->Shutdown(milliseconds(10000));
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  run.join();
  EXPECT_TRUE(ran.ok()) << ran.ToString();
  daemon.reset();  // the engine's recorder wrote its `end`
  cluster.Close();

  const std::vector<std::string> lines = OptimizerSpanLines(timeline);
  EXPECT_EQ(lines.size(), 3u) << ::testing::PrintToString(lines);
  EXPECT_TRUE(HasSpan(lines, a.first, a.second, 0, 0)) << ::testing::PrintToString(lines);
  EXPECT_TRUE(HasSpan(lines, b.first, b.second, 0, 1)) << ::testing::PrintToString(lines);
  EXPECT_TRUE(HasSpan(lines, c.first, c.second, 1, 0)) << ::testing::PrintToString(lines);
}

}  // namespace
}  // namespace bitpush::worker
