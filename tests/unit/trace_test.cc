// The timeline's pieces (docs/observability.md): trace.steps (StepFilter), the span file a
// Recorder writes (its records, bytes exact where they are deterministic), its bounded ring
// (spans dropped and counted, never waited for), many threads at once, Close, and the
// heartbeat clock exchange between the scheduler and its nodes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/trace/recorder.h"
#include "common/trace/step_filter.h"
#include "config/cluster_config.h"
#include "config/node_trace.h"
#include "scheduler/scheduler_client.h"
#include "tests/harness/cluster_harness.h"
#include "tests/unit/test_util.h"

namespace bitpush::trace {
namespace {

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

size_t Count(const std::vector<std::string>& lines, const std::string& needle) {
  return static_cast<size_t>(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.find(needle) != std::string::npos;
  }));
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/bp-trace-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    const std::string cmd = "rm -rf '" + path_ + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(StepFilter, FormsAndTheirRounds) {
  StatusOr<StepFilter> all = StepFilter::Parse("all");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->Wants(0) && all->Wants(12345));
  EXPECT_EQ(all->ToString(), "all");

  StatusOr<StepFilter> range = StepFilter::Parse("3-5");
  ASSERT_TRUE(range.ok());
  EXPECT_FALSE(range->Wants(2));
  EXPECT_TRUE(range->Wants(3) && range->Wants(4) && range->Wants(5));
  EXPECT_FALSE(range->Wants(6));
  EXPECT_EQ(range->ToString(), "3-5");

  StatusOr<StepFilter> every = StepFilter::Parse("every 100");
  ASSERT_TRUE(every.ok());
  EXPECT_TRUE(every->Wants(0) && every->Wants(100) && every->Wants(300));
  EXPECT_FALSE(every->Wants(1) || every->Wants(99) || every->Wants(101));
  EXPECT_EQ(every->ToString(), "every 100");
}

TEST(StepFilter, BadTextNamesItAndTheForms) {
  for (const char* bad : {"some", "5-3", "every 0", "every", "a-b", "3-", "every x"}) {
    StatusOr<StepFilter> f = StepFilter::Parse(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << f.status().message();
    EXPECT_NE(f.status().message().find("'every N'"), std::string::npos) << f.status().message();
  }
}

TEST(TraceKnobs, TheYamlSectionIsParsedAndCheckedAndOffByDefault) {
  StatusOr<config::ClusterConfig> off = config::ParseClusterConfig(
      "cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n  workers: [127.0.0.1:3]\n",
      "t.yaml");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->trace.dir, "");
  EXPECT_EQ(off->trace.steps, "all");
  unsetenv("BITPUSH_TRACE_DIR");
  StatusOr<std::unique_ptr<Recorder>> none = config::OpenNodeTrace(*off, "worker", 0, "engine");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->get(), nullptr);

  StatusOr<config::ClusterConfig> on = config::ParseClusterConfig(
      "cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n  workers: [127.0.0.1:3]\n"
      "trace:\n  dir: /tmp/x\n  steps: every  7\n  buffer_spans: 2048\n",
      "t.yaml");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_EQ(on->trace.dir, "/tmp/x");
  EXPECT_EQ(on->trace.steps, "every 7");
  EXPECT_EQ(on->trace.buffer_spans, 2048u);

  StatusOr<config::ClusterConfig> bad = config::ParseClusterConfig(
      "cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n  workers: [127.0.0.1:3]\n"
      "trace:\n  steps: sometimes\n",
      "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("trace.steps"), std::string::npos)
      << bad.status().message();
}

TEST(Recorder, OffWithoutADirectory) {
  StatusOr<std::unique_ptr<Recorder>> r = Recorder::Open(RecorderOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->get(), nullptr);
}

TEST(Recorder, WritesEveryRecordOfTheSpanFileFormat) {
  TempDir dir;
  RecorderOptions o;
  o.dir = dir.path() + "/a/b";  // created
  o.role = "server";
  o.process = "server";
  StatusOr<std::unique_ptr<Recorder>> opened = Recorder::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Recorder& r = **opened;
  const std::string prefix = o.dir + "/server-" + std::to_string(getpid()) + "-";
  EXPECT_EQ(r.path().rfind(prefix, 0), 0u) << r.path();
  EXPECT_EQ(r.path().substr(r.path().size() - 6), ".jsonl");

  r.SetRank(3);
  r.Tensor("fc.\"w\"", {7, 8, 9});
  r.Clock(100, 250, 260, 420);
  r.Span(SpanKind::kSum, 1000, 1500, 8, 4, 64, /*worker=*/1);
  r.Span(SpanKind::kReplySent, 1600, 1600, 8, 4, 32, 1);
  r.Span(SpanKind::kCompress, 2000, 2100, 9, 5, 16, -1, /*server=*/2);
  r.Span(SpanKind::kOptimizer, 2200, 2900, 0, 5, 0, -1, -1, /*local_rank=*/3);
  EXPECT_EQ(r.recorded(), 4u);
  r.Close();
  r.Close();                              // idempotent
  r.Span(SpanKind::kSum, 1, 2, 3, 4, 5);  // after Close: ignored
  EXPECT_EQ(r.recorded(), 4u);

  const std::vector<std::string> lines = Lines(r.path());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::vector<std::string> want = {
      "{\"type\":\"process\",\"role\":\"server\",\"rank\":3,\"node\":\"server 3\",\"process\":"
      "\"server\",\"pid\":" +
          std::to_string(getpid()) + ",\"host\":\"" + host + "\",\"steps\":\"all\",\"version\":1}",
      "{\"type\":\"tensor\",\"name\":\"fc.\\\"w\\\"\",\"keys\":[7,8,9]}",
      "{\"type\":\"clock\",\"t0\":100,\"t1\":250,\"t2\":260,\"t3\":420}",
      "{\"type\":\"thread\",\"tid\":0,\"name\":\"" +
          [] {
            char name[32] = {};
            pthread_getname_np(pthread_self(), name, sizeof(name));
            return std::string(name);
          }() +
          "\"}",
      "{\"type\":\"span\",\"name\":\"sum\",\"ts\":1000,\"dur\":500,\"tid\":0,\"key\":8,"
      "\"round\":4,\"bytes\":64,\"worker\":1}",
      "{\"type\":\"span\",\"name\":\"reply_sent\",\"ts\":1600,\"dur\":0,\"tid\":0,\"key\":8,"
      "\"round\":4,\"bytes\":32,\"worker\":1}",
      "{\"type\":\"span\",\"name\":\"compress\",\"ts\":2000,\"dur\":100,\"tid\":0,\"key\":9,"
      "\"round\":5,\"bytes\":16,\"server\":2}",
      "{\"type\":\"span\",\"name\":\"optimizer\",\"ts\":2200,\"dur\":700,\"tid\":0,\"key\":0,"
      "\"round\":5,\"bytes\":0,\"local_rank\":3}",
      "{\"type\":\"end\",\"spans\":4,\"dropped\":0}",
  };
  EXPECT_EQ(lines, want);
}

TEST(Recorder, AFullRingDropsAndCountsNeverWaits) {
  TempDir dir;
  RecorderOptions o;
  o.dir = dir.path();
  o.role = "worker";
  o.buffer_spans = 4;
  StatusOr<std::unique_ptr<Recorder>> opened = Recorder::Open(o);
  ASSERT_TRUE(opened.ok());
  Recorder& r = **opened;
  constexpr int kSpans = 20000;
  for (int i = 0; i < kSpans; ++i) r.Span(SpanKind::kPush, i, i + 1, 1, 0, 8);
  const uint64_t recorded = r.recorded();
  const uint64_t dropped = r.dropped();
  EXPECT_EQ(recorded + dropped, static_cast<uint64_t>(kSpans));
  // The writer empties the ring every 100 ms: a tight loop of 20000 outruns it.
  EXPECT_GT(dropped, 0u);
  EXPECT_GE(recorded, 4u);
  r.Close();
  const std::vector<std::string> lines = Lines(r.path());
  EXPECT_EQ(Count(lines, "\"type\":\"span\""), recorded);
  EXPECT_EQ(lines.back(), "{\"type\":\"end\",\"spans\":" + std::to_string(recorded) +
                              ",\"dropped\":" + std::to_string(dropped) + "}");
  // The `dropped` records are cumulative: the last one before `end` says them all.
  const auto last_dropped = std::find_if(lines.rbegin() + 1, lines.rend(), [](const auto& l) {
    return l.find("\"type\":\"dropped\"") != std::string::npos;
  });
  ASSERT_NE(last_dropped, lines.rend());
  EXPECT_EQ(*last_dropped, "{\"type\":\"dropped\",\"count\":" + std::to_string(dropped) + "}");
}

TEST(Recorder, ManyThreadsEachGetATidAndEverySpanIsWritten) {
  TempDir dir;
  RecorderOptions o;
  o.dir = dir.path();
  o.role = "worker";
  StatusOr<std::unique_ptr<Recorder>> opened = Recorder::Open(o);
  ASSERT_TRUE(opened.ok());
  Recorder& r = **opened;
  constexpr int kThreads = 4, kEach = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < kEach; ++i) {
        r.Span(SpanKind::kCompress, i, i + 1, static_cast<uint64_t>(t), static_cast<uint64_t>(i),
               0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  r.Close();
  const std::vector<std::string> lines = Lines(r.path());
  EXPECT_EQ(Count(lines, "\"type\":\"span\""), static_cast<size_t>(kThreads * kEach));
  EXPECT_EQ(Count(lines, "\"type\":\"thread\""), static_cast<size_t>(kThreads));
  // Each writing thread's spans carry one tid, and each key (thread) keeps its rounds in order.
  for (int t = 0; t < kThreads; ++t) {
    std::set<std::string> tids;
    int64_t last_round = -1;
    const std::string key = "\"key\":" + std::to_string(t) + ",";
    for (const std::string& l : lines) {
      if (l.find(key) == std::string::npos) continue;
      tids.insert(l.substr(l.find("\"tid\":"), 8));
      const int64_t round = std::stoll(l.substr(l.find("\"round\":") + 8));
      EXPECT_EQ(round, last_round + 1);
      last_round = round;
    }
    EXPECT_EQ(tids.size(), 1u);
    EXPECT_EQ(last_round, kEach - 1);
  }
}

TEST(Recorder, AnUnwritableDirectoryIsNamed) {
  RecorderOptions o;
  o.dir = "/proc/bitpush-trace";
  o.role = "worker";
  StatusOr<std::unique_ptr<Recorder>> r = Recorder::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trace.dir"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("/proc/bitpush-trace"), std::string::npos)
      << r.status().message();
}

// Each scheduler heartbeat echoes the node's latest: t0 (node sent) <= t1 (scheduler heard)
// <= t2 (scheduler sent) <= t3 (node heard), all one steady clock in one process.
TEST(ClockExchange, EveryNodeGetsOrderedSamplesFromTheSchedulersHeartbeats) {
  testing::ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 2;
  o.heartbeat_interval = std::chrono::milliseconds(20);
  std::mutex mu;
  std::map<std::string, std::vector<std::array<int64_t, 4>>> samples;
  o.plan = [&](const testing::NodeId& id, testing::NodePlan& p) {
    const std::string name = id.name();
    p.client.on_clock_sample = [&, name](int64_t t0, int64_t t1, int64_t t2, int64_t t3) {
      std::lock_guard<std::mutex> lock(mu);
      samples[name].push_back({t0, t1, t2, t3});
    };
  };
  const auto wait_for_samples = [&](scheduler::SchedulerClient&) {
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (samples.size() == 3 && std::all_of(samples.begin(), samples.end(), [](const auto& s) {
              return s.second.size() >= 3;
            })) {
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  o.server_body = [&](scheduler::SchedulerClient& c) {
    wait_for_samples(c);
    return c.WaitForShutdown(std::chrono::milliseconds(10000));
  };
  o.worker_body = [&](scheduler::SchedulerClient& c) {
    wait_for_samples(c);
    BP_RETURN_IF_ERROR(c.Done());
    return c.WaitForShutdown(std::chrono::milliseconds(10000));
  };
  testing::ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  const testing::ClusterResult r = h.Join(std::chrono::milliseconds(15000));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(samples.size(), 3u) << r.Describe();
  for (const auto& [name, list] : samples) {
    ASSERT_GE(list.size(), 3u) << name;
    for (const auto& s : list) {
      EXPECT_LE(s[0], s[1]) << name;
      EXPECT_LE(s[1], s[2]) << name;
      EXPECT_LE(s[2], s[3]) << name;
    }
  }
}

}  // namespace
}  // namespace bitpush::trace
