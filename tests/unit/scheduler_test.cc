// The control plane with threads as nodes (tests/harness): registration and ranks, the key
// mapping, barriers per group, every refusal and its message, missing nodes, node and
// scheduler death, clean shutdown. All over the inproc transport, with short heartbeats.
#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "common/transport/protocol.h"
#include "compressors/registry.h"
#include "config/key_mapping.h"
#include "fmt/format.h"
#include "scheduler/scheduler_client.h"
#include "tests/harness/cluster_harness.h"
#include "tests/harness/manual_clock.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"

namespace bitpush::testing {
namespace {

using scheduler::SchedulerClient;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kJoin{15000};

int64_t MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<milliseconds>(b - a).count();
}

void ExpectAllOk(const ClusterResult& r) {
  EXPECT_TRUE(r.scheduler.finished && r.scheduler.status.ok()) << r.Describe();
  for (const auto& [name, n] : r.nodes) {
    EXPECT_TRUE(n.finished && n.status.ok()) << name << "\n" << r.Describe();
  }
}

// Role bodies that call `record` on every node, then finish cleanly (workers say Done).
void RecordThenFinish(ClusterHarnessOptions& o, std::function<void(SchedulerClient&)> record) {
  o.server_body = [record](SchedulerClient& c) {
    record(c);
    return c.WaitForShutdown(milliseconds(10000));
  };
  o.worker_body = [record](SchedulerClient& c) {
    record(c);
    BP_RETURN_IF_ERROR(c.Done());
    return c.WaitForShutdown(milliseconds(10000));
  };
}

TEST(Scheduler, CleanShutdownWhenEveryWorkerIsDone) {
  ClusterHarnessOptions o;
  o.num_servers = 2;
  o.num_workers = 3;
  // This test is about the clean end, not failure detection: room for a slow start (the first
  // test of the binary, under ThreadSanitizer on two loaded cores, once missed 500 ms).
  o.heartbeat_timeout = milliseconds(3000);
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  const ClusterResult r = h.Join(kJoin);
  ExpectAllOk(r);
  EXPECT_EQ(r.nodes.size(), 5u);
}

TEST(Scheduler, RanksFollowTheYamlNotTheArrivalOrder) {
  ClusterHarnessOptions o;
  o.num_servers = 2;
  o.num_workers = 3;
  // Reverse arrival: worker 2 first, server 0 last.
  o.plan = [](const NodeId& id, NodePlan& p) {
    const int order = id.role == v1::ROLE_WORKER ? 2 - static_cast<int>(id.rank)
                                                 : 3 + 1 - static_cast<int>(id.rank);
    p.start_delay = milliseconds(20 * order);
  };
  std::mutex mu;
  std::map<std::string, v1::Assignment> seen;
  auto record = [&](SchedulerClient& c) {
    std::lock_guard<std::mutex> lock(mu);
    seen[c.self().name()] = c.assignment();
  };
  RecordThenFinish(o, record);
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  ExpectAllOk(h.Join(kJoin));
  ASSERT_EQ(seen.size(), 5u);
  for (const auto& [name, a] : seen) {
    EXPECT_EQ(node::NodePeerId(a.self().role(), a.self().rank()), name);
    EXPECT_EQ(a.self().address(), "inproc://" + name);
    ASSERT_EQ(a.servers_size(), 2);
    ASSERT_EQ(a.workers_size(), 3);
    for (int i = 0; i < a.servers_size(); ++i) {
      EXPECT_EQ(a.servers(i).rank(), static_cast<uint32_t>(i));
      EXPECT_EQ(a.servers(i).address(), h.config().servers[i]);
      EXPECT_EQ(a.servers(i).name(), node::NodePeerId(v1::ROLE_SERVER, i));
    }
    for (int i = 0; i < a.workers_size(); ++i) {
      EXPECT_EQ(a.workers(i).rank(), static_cast<uint32_t>(i));
      EXPECT_EQ(a.workers(i).address(), h.config().workers[i]);
    }
    EXPECT_EQ(a.heartbeat_interval_ms(), 50u);
    EXPECT_EQ(a.heartbeat_timeout_ms(),
              static_cast<uint32_t>(h.config().heartbeat_timeout.count()));
  }
}

TEST(Scheduler, EveryNodeMapsKeysIdentically) {
  ClusterHarnessOptions o;
  o.num_servers = 3;
  o.num_workers = 2;
  std::mutex mu;
  std::map<std::string, std::vector<uint32_t>> owners;
  auto record = [&](SchedulerClient& c) {
    std::vector<uint32_t> v;
    for (uint64_t key = 0; key < 3000; ++key) v.push_back(c.ServerForKey(key));
    EXPECT_EQ(c.assignment().key_mapping().num_servers(), 3u);
    std::lock_guard<std::mutex> lock(mu);
    owners[c.self().name()] = std::move(v);
  };
  RecordThenFinish(o, record);
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  ExpectAllOk(h.Join(kJoin));
  ASSERT_EQ(owners.size(), 5u);
  const std::vector<uint32_t>& ref = owners.begin()->second;
  std::vector<int> per_server(3, 0);
  for (uint32_t s : ref) ++per_server[s];
  for (int n : per_server) EXPECT_NEAR(n, 1000, 150);
  for (const auto& [name, v] : owners) EXPECT_EQ(v, ref) << name;
}

TEST(Scheduler, BarriersPerGroup) {
  ClusterHarnessOptions o;
  o.num_servers = 2;
  o.num_workers = 3;
  std::atomic<int64_t> late_arrival_ns{0};
  std::mutex mu;
  std::vector<std::pair<std::string, int64_t>> passed;  // (who, when) for workers' barrier 0
  auto now_ns = [] { return Clock::now().time_since_epoch().count(); };
  o.worker_body = [&](SchedulerClient& c) {
    // Worker 2 reaches the first workers barrier late: nobody may pass it before then.
    if (c.self().rank() == 2) {
      std::this_thread::sleep_for(milliseconds(150));
      late_arrival_ns = now_ns();
    }
    BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_WORKERS));
    {
      std::lock_guard<std::mutex> lock(mu);
      passed.emplace_back(c.self().name(), now_ns());
    }
    for (int i = 0; i < 3; ++i) BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_WORKERS));
    for (int i = 0; i < 2; ++i) BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_ALL));
    Status wrong = c.Barrier(v1::GROUP_SERVERS);
    if (wrong.code() != StatusCode::kInvalidArgument) return InternalError("joined servers");
    BP_RETURN_IF_ERROR(c.Done());
    return c.WaitForShutdown(milliseconds(10000));
  };
  o.server_body = [&](SchedulerClient& c) {
    // Servers run their own barriers while the workers run theirs.
    for (int i = 0; i < 5; ++i) BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_SERVERS));
    for (int i = 0; i < 2; ++i) BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_ALL));
    Status wrong = c.Barrier(v1::GROUP_WORKERS);
    EXPECT_CONTAINS(wrong.message(), "is not in barrier group workers");
    return c.WaitForShutdown(milliseconds(10000));
  };
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  ExpectAllOk(h.Join(kJoin));
  ASSERT_EQ(passed.size(), 3u);
  for (const auto& [who, when] : passed) {
    EXPECT_GE(when, late_arrival_ns.load()) << who << " passed the barrier before worker 2 came";
  }
}

TEST(Scheduler, StartsLast) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 2;
  o.scheduler_start_delay = milliseconds(300);
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  ExpectAllOk(h.Join(kJoin));
}

TEST(Scheduler, NodesGiveUpOnAMissingSchedulerNamingItsAddress) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 1;
  o.run_scheduler = false;
  o.startup_timeout = milliseconds(300);
  ClusterHarness h(o);
  const Clock::time_point start = Clock::now();
  ASSERT_TRUE(h.Start().ok());
  const ClusterResult r = h.Join(kJoin);
  for (const auto& [name, n] : r.nodes) {
    EXPECT_EQ(n.status.code(), StatusCode::kTimeout) << n.status.ToString();
    EXPECT_CONTAINS(n.status.message(), "no answer from the scheduler at inproc://scheduler after");
    EXPECT_CONTAINS(n.status.message(), "registration attempts over");
    EXPECT_LT(MsBetween(start, n.finished_at), 300 + 1000);
  }
}

TEST(Scheduler, MissingNodeIsNamedWithinTheStartupTimeout) {
  ClusterHarnessOptions o;
  o.num_servers = 2;
  o.num_workers = 2;
  o.startup_timeout = milliseconds(400);
  o.plan = [](const NodeId& id, NodePlan& p) {
    if (id.role == v1::ROLE_SERVER && id.rank == 1) p.launch = false;
    if (id.role == v1::ROLE_WORKER && id.rank == 0) p.launch = false;
  };
  ClusterHarness h(o);
  const Clock::time_point start = Clock::now();
  ASSERT_TRUE(h.Start().ok());
  const ClusterResult r = h.Join(kJoin);
  const Status& s = r.scheduler.status;
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_CONTAINS(s.message(), "2 of 4 nodes did not register within 400 ms");
  EXPECT_CONTAINS(s.message(), "server rank 1 at inproc://server:1");
  EXPECT_CONTAINS(s.message(), "worker rank 0 at inproc://worker:0");
  EXPECT_EQ(s.message().find("server rank 0"), std::string::npos) << s.message();
  EXPECT_GE(MsBetween(start, r.scheduler.finished_at), 400);
  // Shutdown is immediate; acks return at once (well under the 500 ms ack bound).
  EXPECT_LT(MsBetween(start, r.scheduler.finished_at), 400 + 1000);
  // The registered nodes are told why.
  for (const char* n : {"server:0", "worker:1"}) {
    EXPECT_EQ(r.nodes.at(n).status.code(), StatusCode::kRemoteError) << n;
    EXPECT_CONTAINS(r.nodes.at(n).status.message(), "startup timeout");
    EXPECT_CONTAINS(r.nodes.at(n).status.message(), "server rank 1 at inproc://server:1");
  }
}

// A cluster whose worker 1 the test drives by hand; the other nodes run the default bodies.
class RefusalTest : public ::testing::Test {
 protected:
  void StartCluster(const std::string& token = "") {
    ClusterHarnessOptions o;
    o.num_servers = 1;
    o.num_workers = 2;
    o.token = token;
    o.compression.spec = "onebit:scaled=true";
    o.compression.error_feedback = "both";
    o.plan = [](const NodeId& id, NodePlan& p) {
      if (id.role == v1::ROLE_WORKER && id.rank == 1) p.launch = false;
    };
    harness_ = std::make_unique<ClusterHarness>(o);
    ASSERT_TRUE(harness_->Start().ok());
  }

  // Registers a worker 1 built from `change`d options; returns Register's status.
  Status RegisterWorker1(const std::function<void(scheduler::SchedulerClientOptions&)>& change) {
    scheduler::SchedulerClientOptions o = harness_->ClientOptions(v1::ROLE_WORKER, 1);
    change(o);
    StatusOr<std::unique_ptr<SchedulerClient>> c = SchedulerClient::Create(o);
    if (!c.ok()) return c.status();
    Status s = (*c)->Register();
    EXPECT_EQ((*c)->status(), s);  // sticky
    return s;
  }

  // The real worker 1 joins; the cluster then finishes cleanly.
  void FinishCluster() {
    StatusOr<std::unique_ptr<SchedulerClient>> c =
        SchedulerClient::Create(harness_->ClientOptions(v1::ROLE_WORKER, 1));
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Register().ok()) << (*c)->status().ToString();
    ASSERT_TRUE((*c)->Done().ok());
    EXPECT_TRUE((*c)->WaitForShutdown(milliseconds(5000)).ok());
    (*c)->Close();
    ExpectAllOk(harness_->Join(kJoin));
  }

  std::unique_ptr<ClusterHarness> harness_;
};

TEST_F(RefusalTest, ProtocolVersionMismatchNamesBothVersions) {
  StartCluster();
  const Status s = RegisterWorker1([](auto& o) {
    o.protocol_major = kProtocolMajor + 1;
    o.protocol_minor = 0;
  });
  EXPECT_EQ(s.code(), StatusCode::kRemoteError);
  EXPECT_CONTAINS(s.message(), fmt::format("protocol version mismatch: this node speaks {}.0, the "
                                           "scheduler speaks {}.{}",
                                           kProtocolMajor + 1, kProtocolMajor, kProtocolMinor));
  EXPECT_CONTAINS(s.message(), "the scheduler at inproc://scheduler");
  EXPECT_CONTAINS(s.message(), "refused worker 1");
  FinishCluster();  // a refused node does not count; the slot stays open
}

TEST_F(RefusalTest, MinorVersionDifferenceIsAccepted) {
  StartCluster();
  scheduler::SchedulerClientOptions o = harness_->ClientOptions(v1::ROLE_WORKER, 1);
  o.protocol_minor = kProtocolMinor + 7;
  StatusOr<std::unique_ptr<SchedulerClient>> c = SchedulerClient::Create(o);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register().ok()) << (*c)->status().ToString();
  ASSERT_TRUE((*c)->Done().ok());
  EXPECT_TRUE((*c)->WaitForShutdown(milliseconds(5000)).ok());
  (*c)->Close();
  ExpectAllOk(harness_->Join(kJoin));
}

TEST_F(RefusalTest, WrongOrMissingTokenNeverPrintsIt) {
  StartCluster("s3cret-token");
  Status s = RegisterWorker1([](auto& o) { o.cluster.token = "guessed"; });
  EXPECT_EQ(s.code(), StatusCode::kRemoteError);
  EXPECT_CONTAINS(s.message(), "cluster token mismatch");
  EXPECT_EQ(s.message().find("s3cret"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("guessed"), std::string::npos) << s.message();
  s = RegisterWorker1([](auto& o) { o.cluster.token = ""; });
  EXPECT_CONTAINS(s.message(), "cluster token mismatch (the node sends no token");
  FinishCluster();
}

TEST_F(RefusalTest, TokenWhereTheSchedulerHasNone) {
  StartCluster();
  const Status s = RegisterWorker1([](auto& o) { o.cluster.token = "extra"; });
  EXPECT_CONTAINS(s.message(),
                  "cluster token mismatch (the node sends a token, the scheduler "
                  "has none");
  FinishCluster();
}

TEST_F(RefusalTest, ConfigDifferenceNamesEveryField) {
  StartCluster();
  const std::string topk =
      compressors::CompressorSpecString(*compressors::ParseCompressorSpec("topk:ratio=0.01"));
  const Status s = RegisterWorker1([&](auto& o) {
    o.cluster.compression.spec = topk;
    o.cluster.compression.min_compress_bytes = 1;
  });
  EXPECT_EQ(s.code(), StatusCode::kRemoteError);
  EXPECT_CONTAINS(s.message(), "config differs from the scheduler's: compression.spec is '" + topk +
                                   "' here but 'onebit:scaled=true' on the scheduler; "
                                   "compression.min_compress_bytes is '1' here but "
                                   "'4096' on the scheduler");
  EXPECT_EQ(s.message().find("partition_bytes"), std::string::npos) << s.message();
  FinishCluster();
}

TEST_F(RefusalTest, WrongAddressForTheRank) {
  StartCluster();
  // Worker 1's own YAML lists another address for rank 1.
  const Status s = RegisterWorker1([](auto& o) { o.cluster.workers[1] = "inproc://elsewhere"; });
  EXPECT_CONTAINS(s.message(),
                  "unknown node: worker 1 registers from inproc://elsewhere but the "
                  "cluster YAML has inproc://worker:1 at that rank");
  FinishCluster();
}

TEST_F(RefusalTest, RankOutsideTheCluster) {
  StartCluster();
  // A node whose YAML has three workers joins a cluster of two.
  const Status s = RegisterWorker1([](auto& o) {
    o.cluster.workers.push_back("inproc://worker:2");
    o.rank = 2;
  });
  EXPECT_CONTAINS(s.message(),
                  "unknown node: worker rank 2 at inproc://worker:2 is not in the "
                  "cluster (cluster.workers has 2 entries)");
  FinishCluster();
}

// A node endpoint driven message by message, to test the protocol's edges.
class RawNode {
 public:
  RawNode(const ClusterHarness& h, const std::string& name, const std::string& address) {
    transport::TransportOptions t;
    t.backend = "inproc";
    t.name = name;
    t.listen_address = address;
    t.inproc_hub = h.hub();
    auto made = transport::CreateTransport(t);
    BP_CHECK_OK(made.status());
    transport_ = std::move(made).value();
    BP_CHECK_OK(transport_->Connect(node::kSchedulerPeerId, h.config().scheduler_address));
  }

  void Send(const v1::ControlMessage& m) { SendRaw(m.SerializeAsString()); }

  // Sends `header` as is; retries (bounded) while the scheduler's endpoint does not exist yet.
  void SendRaw(const std::string& header) {
    const Clock::time_point deadline = Clock::now() + milliseconds(2000);
    for (;;) {
      transport::Message msg;
      msg.header = header;
      Status s = transport_->Send(node::kSchedulerPeerId, std::move(msg));
      if (s.ok()) return;
      ASSERT_LT(Clock::now(), deadline) << s.ToString();
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

  // The next control message of kind `want` from the scheduler (others skipped).
  std::optional<v1::ControlMessage> Next(v1::ControlMessage::BodyCase want,
                                         milliseconds timeout = milliseconds(2000)) {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      auto r = transport_->Receive(
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now()) + milliseconds(1));
      if (!r.ok()) return std::nullopt;
      if (!r->is_message()) continue;
      v1::ControlMessage m;
      if (m.ParseFromString(r->message().header) && m.body_case() == want) return m;
    }
    return std::nullopt;
  }

  void Close() { transport_->Close(); }

 private:
  std::unique_ptr<transport::Transport> transport_;
};

v1::ControlMessage Request(const ClusterHarness& h, uint32_t rank, uint64_t incarnation,
                           const std::string& host, uint32_t pid) {
  v1::ControlMessage m;
  v1::RegisterRequest* r = m.mutable_register_request();
  r->mutable_version()->set_major(kProtocolMajor);
  r->mutable_version()->set_minor(kProtocolMinor);
  r->set_role(v1::ROLE_WORKER);
  r->set_rank(rank);
  r->set_address(h.config().workers[rank]);
  const auto fields = config::ConfigFields(h.config());
  for (const auto& f : fields) *r->add_config_fields() = f;
  r->set_config_hash(config::ConfigHash(fields));
  r->set_host(host);
  r->set_pid(pid);
  r->set_incarnation(incarnation);
  return m;
}

TEST(Scheduler, RetryIsIdempotentDuplicateIsRefused) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 2;
  o.heartbeat_timeout = milliseconds(1000);  // room for the raw exchange below
  o.plan = [](const NodeId& id, NodePlan& p) {
    if (id.role == v1::ROLE_WORKER && id.rank == 1) p.launch = false;
  };
  o.worker_body = [](SchedulerClient& c) { return c.WaitForShutdown(milliseconds(10000)); };
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  {
    RawNode first(h, "worker:1", "inproc://worker:1");
    first.Send(Request(h, 1, /*incarnation=*/111, "host-a", 4242));
    ASSERT_TRUE(first.Next(v1::ControlMessage::kRegisterAccepted).has_value());
    ASSERT_TRUE(first.Next(v1::ControlMessage::kAssignment).has_value());
    // The same incarnation again (a retry whose answer was lost): answered again, no refusal.
    first.Send(Request(h, 1, 111, "host-a", 4242));
    ASSERT_TRUE(first.Next(v1::ControlMessage::kRegisterAccepted).has_value());
    auto again = first.Next(v1::ControlMessage::kAssignment);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->assignment().self().rank(), 1u);
    first.Close();  // the process "dies" and is restarted at once at the same address
  }
  RawNode second(h, "worker:1", "inproc://worker:1");
  second.Send(Request(h, 1, /*incarnation=*/222, "host-b", 99));
  auto refused = second.Next(v1::ControlMessage::kRegisterRefused);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->register_refused().error(),
            "duplicate registration for worker 1 at inproc://worker:1 (already registered by "
            "host-a:4242)");
  EXPECT_EQ(refused->register_refused().scheduler_version().major(), kProtocolMajor);
  second.Close();
  // The first incarnation is silent: declared dead, the cluster fails naming it.
  const ClusterResult r = h.Join(kJoin);
  EXPECT_EQ(r.scheduler.status.code(), StatusCode::kUnavailable) << r.Describe();
  EXPECT_CONTAINS(r.scheduler.status.message(), "worker 1 at inproc://worker:1 failed");
}

TEST_F(RefusalTest, DataAddressWhereTheYamlGivesNone) {
  StartCluster();
  RawNode raw(*harness_, "worker:1", "inproc://worker:1");
  v1::ControlMessage m = Request(*harness_, 1, 7, "host-x", 1);
  m.mutable_register_request()->set_data_address("ucx://127.0.0.1:10201");
  raw.Send(m);
  auto refused = raw.Next(v1::ControlMessage::kRegisterRefused);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->register_refused().error(),
            "unknown node: worker 1 registers a data address ucx://127.0.0.1:10201 but the "
            "cluster YAML gives it none (cluster.transport is inproc)");
  raw.Close();
  FinishCluster();
}

// cluster.transport ucx: the scheduler (the control plane, zmq on loopback) refuses a node whose
// data address is not its YAML port + cluster.ucx.port_offset, and hands every node's data
// address out in the Assignment.
TEST(Scheduler, UcxDataAddressIsCheckedAndAssigned) {
  TestClusterOptions t;
  t.servers = 1;
  t.workers = 1;
  t.transport = TestTransport::kUcx;
  t.heartbeat_timeout = milliseconds(5000);
  scheduler::SchedulerOptions so;
  so.cluster = TestClusterConfig(t);
  so.shutdown_ack_timeout = milliseconds(200);  // the raw nodes never ack
  const config::ClusterConfig& c = so.cluster;
  StatusOr<std::unique_ptr<scheduler::Scheduler>> sched = scheduler::Scheduler::Create(so);
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  Status run_status;
  std::thread runner([&] { run_status = (*sched)->Run(); });

  // A node's control-plane endpoint: zmq at its YAML address, no security.
  auto raw = [&](v1::Role role) {
    transport::TransportOptions o;
    o.name = node::NodePeerId(role, 0);
    o.listen_address = c.NodeAddress(role, 0);
    StatusOr<std::unique_ptr<transport::Transport>> made = transport::CreateTransport(o);
    BP_CHECK_OK(made.status());
    BP_CHECK_OK((*made)->Connect(node::kSchedulerPeerId, c.scheduler_address));
    return std::move(made).value();
  };
  auto request = [&](v1::Role role, const std::string& data_address) {
    v1::ControlMessage m;
    v1::RegisterRequest* r = m.mutable_register_request();
    r->mutable_version()->set_major(kProtocolMajor);
    r->mutable_version()->set_minor(kProtocolMinor);
    r->set_role(role);
    r->set_rank(0);
    r->set_address(c.NodeAddress(role, 0));
    r->set_data_address(data_address);
    const auto fields = config::ConfigFields(c);
    for (const auto& f : fields) *r->add_config_fields() = f;
    r->set_config_hash(config::ConfigHash(fields));
    r->set_incarnation(role == v1::ROLE_SERVER ? 1 : 2);
    transport::Message msg;
    msg.header = m.SerializeAsString();
    return msg;
  };
  // The next control message of kind `want` (others skipped), within 5 s.
  auto next = [](transport::Transport& tr, v1::ControlMessage::BodyCase want) {
    const Clock::time_point deadline = Clock::now() + milliseconds(5000);
    while (Clock::now() < deadline) {
      auto r = tr.Receive(milliseconds(100));
      if (!r.ok() || !r->is_message()) continue;
      v1::ControlMessage m;
      if (m.ParseFromString(r->message().header) && m.body_case() == want) {
        return std::optional<v1::ControlMessage>(m);
      }
    }
    return std::optional<v1::ControlMessage>();
  };
  const std::string server_data = c.DataAddress(v1::ROLE_SERVER, 0);
  const std::string worker_data = c.DataAddress(v1::ROLE_WORKER, 0);
  ASSERT_EQ(server_data,
            "ucx://127.0.0.1:" + std::to_string(std::stoi(c.servers[0].substr(16)) + 1000));

  std::unique_ptr<transport::Transport> worker = raw(v1::ROLE_WORKER);
  // No data address, then one at another port: both refused, naming the expected one.
  ASSERT_TRUE(worker->Send(node::kSchedulerPeerId, request(v1::ROLE_WORKER, "")).ok());
  auto refused = next(*worker, v1::ControlMessage::kRegisterRefused);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->register_refused().error(),
            fmt::format("unknown node: worker 0 registers its data plane at no address but the "
                        "cluster YAML implies {} (its address {} + cluster.ucx.port_offset 1000)",
                        worker_data, c.workers[0]));
  const std::string wrong = "ucx://127.0.0.1:1";
  ASSERT_TRUE(worker->Send(node::kSchedulerPeerId, request(v1::ROLE_WORKER, wrong)).ok());
  refused = next(*worker, v1::ControlMessage::kRegisterRefused);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->register_refused().error(),
            fmt::format("unknown node: worker 0 registers its data plane at {} but the cluster "
                        "YAML implies {} (its address {} + cluster.ucx.port_offset 1000)",
                        wrong, worker_data, c.workers[0]));
  EXPECT_EQ((*sched)->stats().registrations_refused, 2u);
  EXPECT_EQ((*sched)->stats().nodes_registered, 0u);

  // The right ones are accepted, and the Assignment carries both data addresses.
  ASSERT_TRUE(worker->Send(node::kSchedulerPeerId, request(v1::ROLE_WORKER, worker_data)).ok());
  ASSERT_TRUE(next(*worker, v1::ControlMessage::kRegisterAccepted).has_value());
  std::unique_ptr<transport::Transport> server = raw(v1::ROLE_SERVER);
  ASSERT_TRUE(server->Send(node::kSchedulerPeerId, request(v1::ROLE_SERVER, server_data)).ok());
  for (transport::Transport* tr : {worker.get(), server.get()}) {
    auto a = next(*tr, v1::ControlMessage::kAssignment);
    ASSERT_TRUE(a.has_value()) << tr->name();
    ASSERT_EQ(a->assignment().servers_size(), 1);
    ASSERT_EQ(a->assignment().workers_size(), 1);
    EXPECT_EQ(a->assignment().servers(0).address(), c.servers[0]);
    EXPECT_EQ(a->assignment().servers(0).data_address(), server_data);
    EXPECT_EQ(a->assignment().workers(0).address(), c.workers[0]);
    EXPECT_EQ(a->assignment().workers(0).data_address(), worker_data);
  }
  EXPECT_EQ((*sched)->stats().nodes_registered, 2u);
  (*sched)->Stop();
  runner.join();
  EXPECT_FALSE(run_status.ok());  // interrupted
  worker->Close();
  server->Close();
}

TEST(Scheduler, AnUnregisteredPeerIsIgnored) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 1;
  o.scheduler_start_delay = milliseconds(0);
  o.plan = [](const NodeId& id, NodePlan& p) { p.start_delay = milliseconds(100); };
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  {
    // A stranger sends a barrier and Done without registering: dropped, the cluster unharmed.
    RawNode stranger(h, "worker:0", "inproc://stranger");
    v1::ControlMessage m;
    m.mutable_done();
    stranger.Send(m);
    m.mutable_barrier_request()->set_group(v1::GROUP_ALL);
    stranger.Send(m);
    stranger.SendRaw("\xff\xff not a protobuf");
    EXPECT_FALSE(stranger.Next(v1::ControlMessage::kBarrierRelease, milliseconds(50)).has_value());
  }
  ExpectAllOk(h.Join(kJoin));
}

// A node that stops being heard (hung process, lost network): the scheduler declares it dead
// and every other node hears who, within heartbeat_timeout + 1 s (the failure-detection bound).
void ExpectNodeDeathReported(bool crash) {
  ClusterHarnessOptions o;
  o.num_servers = 2;
  o.num_workers = 2;
  o.heartbeat_interval = milliseconds(50);
  o.heartbeat_timeout = milliseconds(400);
  std::atomic<int64_t> fault_ns{0};
  ClusterHarness* hp = nullptr;
  o.server_body = [&](SchedulerClient& c) {
    BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_ALL));
    if (c.self().rank() == 1) {
      fault_ns = Clock::now().time_since_epoch().count();
      if (crash) {
        hp->faults("server:1").Crash();
      } else {
        hp->faults("server:1").SetSilent(true);
      }
    }
    return c.WaitForShutdown(milliseconds(10000));
  };
  o.worker_body = [](SchedulerClient& c) {
    BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_ALL));
    return c.WaitForShutdown(milliseconds(10000));  // never Done: the run goes on
  };
  ClusterHarness h(o);
  hp = &h;
  ASSERT_TRUE(h.Start().ok());
  const ClusterResult r = h.Join(kJoin);
  const Clock::time_point fault{Clock::duration(fault_ns.load())};
  for (const char* n : {"server:0", "worker:0", "worker:1"}) {
    const NodeResult& nr = r.nodes.at(n);
    EXPECT_EQ(nr.status.code(), StatusCode::kUnavailable) << n << ": " << nr.status.ToString();
    EXPECT_CONTAINS(nr.status.message(), "server 1 at inproc://server:1 failed: no heartbeat for");
    const int64_t latency = MsBetween(fault, nr.finished_at);
    EXPECT_GE(latency, 400 / 2) << n;  // not declared long before the timeout
    EXPECT_LE(latency, 400 + 1000) << n;
  }
  EXPECT_EQ(r.scheduler.status.code(), StatusCode::kUnavailable);
  EXPECT_CONTAINS(r.scheduler.status.message(), "server 1 at inproc://server:1 failed");
  // The dead node itself ends too (bounded): it stops hearing the scheduler.
  EXPECT_FALSE(r.nodes.at("server:1").status.ok());
}

TEST(Scheduler, SilentNodeIsDeclaredDeadAndEveryoneIsTold) {
  ExpectNodeDeathReported(/*crash=*/false);
}

TEST(Scheduler, CrashedNodeIsDeclaredDeadAndEveryoneIsTold) {
  ExpectNodeDeathReported(/*crash=*/true);
}

// The same rule on a clock the test moves: however slow the machine, no verdict while the
// silent node's last heartbeat is less than heartbeat_timeout old on the cluster's clock, and
// the verdict once it is older. The clock moves one heartbeat interval at a time, with real
// time between the steps for the live nodes' heartbeats to arrive.
TEST(Scheduler, SilenceVerdictFollowsTheClusterClockNotTheMachine) {
  auto clock = std::make_shared<ManualClock>();
  ClusterHarnessOptions o;
  o.num_servers = 2;
  o.num_workers = 1;
  o.heartbeat_interval = milliseconds(50);
  o.heartbeat_timeout = milliseconds(400);
  o.clock = clock;
  std::atomic<bool> silent{false};
  std::atomic<int> ended{0};
  ClusterHarness* hp = nullptr;
  o.server_body = [&](SchedulerClient& c) {
    BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_ALL));
    if (c.self().rank() == 1) {
      hp->faults("server:1").SetSilent(true);
      silent = true;
    }
    const Status s = c.WaitForShutdown(milliseconds(10000));
    ++ended;
    return s;
  };
  o.worker_body = [&](SchedulerClient& c) {
    BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_ALL));
    const Status s = c.WaitForShutdown(milliseconds(10000));
    ++ended;
    return s;
  };
  ClusterHarness h(o);
  hp = &h;
  ASSERT_TRUE(h.Start().ok());
  const Clock::time_point real_deadline = Clock::now() + kJoin;
  // Registration and the first barrier: the clock follows real time, at most (registration
  // back-off and heartbeats run on it).
  while (!silent && Clock::now() < real_deadline) {
    clock->Advance(milliseconds(1));
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_TRUE(silent) << "the cluster never passed its first barrier";
  // server:1 was last heard at most one interval before it fell silent: 6 intervals (300 ms)
  // later on the cluster's clock it is still within the 400 ms timeout.
  for (int step = 0; step < 6; ++step) {
    clock->Advance(milliseconds(50));
    std::this_thread::sleep_for(milliseconds(20));
    ASSERT_EQ(ended.load(), 0) << "a verdict after " << (step + 1) * 50
                               << " ms of the cluster's clock, before heartbeat_timeout";
  }
  // Past the timeout (and one check interval): the scheduler declares it dead and says so; the
  // silent node ends too once it stops hearing the scheduler (on the same clock).
  while (ended.load() < 3 && Clock::now() < real_deadline) {
    clock->Advance(milliseconds(50));
    std::this_thread::sleep_for(milliseconds(20));
  }
  const ClusterResult r = h.Join(kJoin);
  for (const char* n : {"server:0", "worker:0"}) {
    const NodeResult& nr = r.nodes.at(n);
    EXPECT_EQ(nr.status.code(), StatusCode::kUnavailable) << n << ": " << nr.status.ToString();
    EXPECT_CONTAINS(nr.status.message(), "server 1 at inproc://server:1 failed: no heartbeat for");
  }
  EXPECT_EQ(r.scheduler.status.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(r.nodes.at("server:1").status.ok());
  EXPECT_NE(r.nodes.at("server:1").status.code(), StatusCode::kTimeout)
      << "the silent node did not end by itself: " << r.nodes.at("server:1").status.ToString();
}

void ExpectSchedulerDeathDetected(bool crash) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 2;
  o.heartbeat_interval = milliseconds(50);
  o.heartbeat_timeout = milliseconds(400);
  std::atomic<int64_t> fault_ns{0};
  ClusterHarness* hp = nullptr;
  std::once_flag once;
  auto body = [&](SchedulerClient& c) {
    BP_RETURN_IF_ERROR(c.Barrier(v1::GROUP_ALL));
    std::call_once(once, [&] {
      fault_ns = Clock::now().time_since_epoch().count();
      if (crash) {
        hp->faults("scheduler").Crash();
      } else {
        hp->faults("scheduler").SetSilent(true);
      }
    });
    return c.WaitForShutdown(milliseconds(10000));
  };
  o.server_body = body;
  o.worker_body = body;
  ClusterHarness h(o);
  hp = &h;
  ASSERT_TRUE(h.Start().ok());
  const ClusterResult r = h.Join(kJoin);
  const Clock::time_point fault{Clock::duration(fault_ns.load())};
  for (const auto& [n, nr] : r.nodes) {
    EXPECT_EQ(nr.status.code(), StatusCode::kUnavailable) << n << ": " << nr.status.ToString();
    EXPECT_CONTAINS(nr.status.message(), "scheduler at inproc://scheduler silent for");
    const int64_t latency = MsBetween(fault, nr.finished_at);
    EXPECT_GE(latency, 400 / 2) << n;  // not declared long before the timeout
    EXPECT_LE(latency, 400 + 1000) << n;
  }
  EXPECT_FALSE(r.scheduler.status.ok());
}

TEST(Scheduler, SilentSchedulerIsDetectedByEveryNode) {
  ExpectSchedulerDeathDetected(/*crash=*/false);
}

TEST(Scheduler, CrashedSchedulerIsDetectedByEveryNode) {
  ExpectSchedulerDeathDetected(/*crash=*/true);
}

TEST(Scheduler, StopShutsTheClusterDownWithAnError) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 1;
  std::atomic<int> registered{0};
  ClusterHarness* hp = nullptr;
  auto body = [&](SchedulerClient& c) {
    if (++registered == 2) hp->StopScheduler();
    return c.WaitForShutdown(milliseconds(10000));
  };
  o.server_body = body;
  o.worker_body = body;
  ClusterHarness h(o);
  hp = &h;
  ASSERT_TRUE(h.Start().ok());
  const ClusterResult r = h.Join(kJoin);
  EXPECT_EQ(r.scheduler.status.code(), StatusCode::kCancelled);
  EXPECT_CONTAINS(r.scheduler.status.message(), "scheduler interrupted");
  for (const auto& [n, nr] : r.nodes) {
    EXPECT_EQ(nr.status.code(), StatusCode::kRemoteError) << nr.status.ToString();
    EXPECT_CONTAINS(nr.status.message(), "shut the cluster down: scheduler interrupted");
  }
}

TEST(SchedulerClient, ErrorsAreStickyAndReported) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 1;
  o.run_scheduler = false;
  o.startup_timeout = milliseconds(100);
  o.plan = [](const NodeId&, NodePlan& p) { p.launch = false; };
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  scheduler::SchedulerClientOptions co = h.ClientOptions(v1::ROLE_WORKER, 0);
  std::atomic<int> reported{0};
  co.on_error = [&](const Status& s) {
    ++reported;
    EXPECT_EQ(s.code(), StatusCode::kTimeout);
  };
  auto c = SchedulerClient::Create(co);
  ASSERT_TRUE(c.ok());
  const Status first = (*c)->Register();
  EXPECT_EQ(first.code(), StatusCode::kTimeout);
  EXPECT_EQ((*c)->Register(), first);
  EXPECT_EQ((*c)->Barrier(v1::GROUP_ALL), first);
  EXPECT_EQ((*c)->Done(), first);
  EXPECT_EQ((*c)->WaitForShutdown(milliseconds(10)), first);
  EXPECT_EQ(reported.load(), 1);
  (void)h.Join(kJoin);
}

TEST(SchedulerClient, OptionErrors) {
  ClusterHarnessOptions o;
  o.run_scheduler = false;
  o.plan = [](const NodeId&, NodePlan& p) { p.launch = false; };
  ClusterHarness h(o);
  scheduler::SchedulerClientOptions co = h.ClientOptions(v1::ROLE_SERVER, 5);
  auto c = SchedulerClient::Create(co);
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "server rank 5 is not in the cluster");
  co = h.ClientOptions(v1::ROLE_SCHEDULER, 0);
  EXPECT_FALSE(SchedulerClient::Create(co).ok());
}

TEST(SchedulerClient, CallsBeforeRegisterAndAfterShutdown) {
  ClusterHarnessOptions o;
  o.num_servers = 1;
  o.num_workers = 1;
  o.plan = [](const NodeId& id, NodePlan& p) {
    if (id.role == v1::ROLE_WORKER) p.launch = false;
  };
  ClusterHarness h(o);
  ASSERT_TRUE(h.Start().ok());
  auto c = SchedulerClient::Create(h.ClientOptions(v1::ROLE_WORKER, 0));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Barrier(v1::GROUP_ALL).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*c)->Done().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*c)->Register().ok());
  EXPECT_TRUE((*c)->Register().ok());  // idempotent
  ASSERT_TRUE((*c)->Done().ok());
  ASSERT_TRUE((*c)->Done().ok());  // idempotent
  ASSERT_TRUE((*c)->WaitForShutdown(milliseconds(5000)).ok());
  EXPECT_EQ((*c)->Barrier(v1::GROUP_ALL).code(), StatusCode::kCancelled);
  ExpectAllOk(h.Join(kJoin));
}

TEST(Scheduler, CreateRejectsBadOptions) {
  scheduler::SchedulerOptions so;
  so.cluster.scheduler_address = "inproc://s";
  so.cluster.transport = "inproc";
  auto s = scheduler::Scheduler::Create(so);
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.status().message(), "cluster.servers: needs at least one address");
  // A scheduler address already in use.
  auto hub = transport::NewInprocHub();
  so.cluster.servers = {"inproc://a"};
  so.cluster.workers = {"inproc://b"};
  so.inproc_hub = hub;
  auto first = scheduler::Scheduler::Create(so);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = scheduler::Scheduler::Create(so);
  ASSERT_FALSE(second.ok());
  EXPECT_CONTAINS(second.status().message(), "scheduler: cannot listen at inproc://s");
}

}  // namespace
}  // namespace bitpush::testing
