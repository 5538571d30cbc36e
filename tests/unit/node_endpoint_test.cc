// The node endpoint (common/node/endpoint.h), the node identity (common/node/identity.h) and
// the transport factory (common/transport/factory.h): dispatch by plane and message type, the
// sender as the transport reports it, role checks, malformed and unhandled messages, held
// planes, timers on an injected clock, transport failure and Close.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/node/authorization.h"
#include "common/node/endpoint.h"
#include "common/node/identity.h"
#include "common/transport/factory.h"
#include "tests/harness/faulty_transport.h"
#include "tests/harness/manual_clock.h"

namespace bitpush::node {
namespace {

using std::chrono::milliseconds;
using transport::Message;
using v1::ControlMessage;
using v1::DataHeader;

std::unique_ptr<NodeEndpoint> Make(const std::shared_ptr<transport::InprocHub>& hub,
                                   NodeIdentity self,
                                   std::shared_ptr<const Clock> clock = nullptr) {
  NodeEndpointOptions o;
  o.self = self;
  o.listen_address =
      "inproc://" + (self.role == v1::ROLE_SCHEDULER ? std::string(kSchedulerPeerId)
                                                     : NodePeerId(self.role, self.rank));
  o.inproc_hub = hub;
  o.clock = std::move(clock);
  StatusOr<std::unique_ptr<NodeEndpoint>> e = NodeEndpoint::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// A raw transport endpoint with any name (a foreign or misbehaving peer).
std::unique_ptr<transport::Transport> Raw(const std::shared_ptr<transport::InprocHub>& hub,
                                          const std::string& name) {
  transport::TransportOptions o;
  o.name = name;
  o.listen_address = "inproc://" + name;
  o.inproc_hub = hub;
  return transport::CreateTransport(o).value();
}

// An inproc transport named `name` listening at `address`, wrapped for fault injection by `sw`.
std::unique_ptr<transport::Transport> FaultyInproc(const std::shared_ptr<transport::InprocHub>& hub,
                                                   const std::string& name,
                                                   const std::string& address,
                                                   std::shared_ptr<testing::FaultSwitch> sw) {
  transport::TransportOptions o;
  o.name = name;
  o.listen_address = address;
  o.inproc_hub = hub;
  return std::make_unique<testing::FaultyTransport>(
      std::shared_ptr<transport::Transport>(transport::CreateTransport(o).value()), std::move(sw));
}

Message DataMessage(DataHeader::Op op, uint32_t claimed_sender = 0) {
  DataHeader h;
  h.set_op(op);
  h.set_sender(claimed_sender);
  h.set_key(42);
  Message m;
  h.SerializeToString(&m.header);
  return m;
}

Message ControlOf(ControlMessage::BodyCase kind) {
  ControlMessage c;
  if (kind == ControlMessage::kHeartbeat) c.mutable_heartbeat()->set_seq(1);
  if (kind == ControlMessage::kDone) c.mutable_done();
  Message m;
  c.SerializeToString(&m.header);
  return m;
}

// Polls `e` until `done()` or a 5 s bound; true if done.
template <typename F>
bool PollUntil(NodeEndpoint& e, F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    EXPECT_TRUE(e.Poll(milliseconds(10)).ok());
  }
  return true;
}

TEST(NodeIdentity, ParsesCanonicalPeerIdsOnly) {
  EXPECT_EQ(ParseNodePeerId("scheduler"), (NodeIdentity{v1::ROLE_SCHEDULER, 0}));
  EXPECT_EQ(ParseNodePeerId("server:0"), (NodeIdentity{v1::ROLE_SERVER, 0}));
  EXPECT_EQ(ParseNodePeerId("worker:4294967295"), (NodeIdentity{v1::ROLE_WORKER, 4294967295u}));
  for (const char* bad :
       {"", "worker:", "worker:07", "worker:4294967296", "worker:-1", "worker: 1", "worker:1x",
        "Worker:1", "refused:worker:1#9", "mallory", "scheduler:0", "server:00"}) {
    EXPECT_FALSE(ParseNodePeerId(bad).has_value()) << bad;
  }
  EXPECT_EQ(NodePeerId(v1::ROLE_WORKER, 12), "worker:12");
  EXPECT_EQ(RoleName(v1::ROLE_SERVER), "server");
}

TEST(NodeIdentity, RoleSets) {
  const RoleSet workers = RoleSet::Of(v1::ROLE_WORKER);
  EXPECT_TRUE(workers.Contains(v1::ROLE_WORKER));
  EXPECT_FALSE(workers.Contains(v1::ROLE_SERVER));
  EXPECT_FALSE(workers.Contains(v1::ROLE_UNSPECIFIED));
  EXPECT_TRUE(RoleSet::AnyNode().Contains(v1::ROLE_SCHEDULER));
  EXPECT_FALSE(RoleSet::AnyNode().Contains(v1::ROLE_UNSPECIFIED));
  EXPECT_TRUE(RoleSet::AnyPeer().Contains(v1::ROLE_UNSPECIFIED));
}

TEST(TransportFactory, PicksTheBackendFromTheScheme) {
  EXPECT_EQ((*transport::BackendForAddress("tcp://127.0.0.1:9100"))->name, "zmq");
  EXPECT_EQ((*transport::BackendForAddress("ipc:///tmp/x.sock"))->name, "zmq");
  EXPECT_EQ((*transport::BackendForAddress("inproc://server:0"))->name, "inproc");
  EXPECT_EQ((*transport::BackendForAddress("ucx://127.0.0.1:9100"))->name, "ucx");
  const auto unknown = transport::BackendForAddress("rdma://node7");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(),
            "address 'rdma://node7' has no transport scheme bitpush knows; valid: inproc://, "
            "tcp://, ipc://, ucx://");
  EXPECT_EQ(transport::FindTransportBackend("rdma").status().message(),
            "unknown transport backend 'rdma'; valid: inproc, zmq, ucx");
}

TEST(TransportFactory, ABackendThatDisagreesWithTheSchemeIsRefused) {
  transport::TransportOptions o;
  o.name = "a";
  o.listen_address = "inproc://a";
  o.inproc_hub = transport::NewInprocHub();
  o.backend = "zmq";
  const auto t = transport::CreateTransport(o);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(),
            "endpoint 'a': listen address 'inproc://a' is a inproc address, but the transport "
            "backend is zmq");
  o.backend = "";  // from the scheme
  EXPECT_TRUE(transport::CreateTransport(o).ok());
  o.listen_address = "carrier://a";
  EXPECT_EQ(transport::CreateTransport(o).status().message(),
            "endpoint 'a': address 'carrier://a' has no transport scheme bitpush knows; valid: "
            "inproc://, tcp://, ipc://, ucx://");
}

TEST(NodeEndpoint, DispatchesDataByOpWithTheSenderTheTransportReports) {
  auto hub = transport::NewInprocHub();
  auto server = Make(hub, {v1::ROLE_SERVER, 0});
  auto worker = Make(hub, {v1::ROLE_WORKER, 3});
  std::vector<std::string> seen;
  server->OnData(
      DataHeader::OP_PUSH, RoleSet::Of(v1::ROLE_WORKER),
      [&](const Sender& from, DataHeader& h, Message&) {
        ASSERT_TRUE(from.node.has_value());
        seen.push_back(fmt::format("push from {} {} (claims {})", RoleName(from.node->role),
                                   from.node->rank, h.sender()));
      });
  server->OnData(
      DataHeader::OP_INIT_KEY, RoleSet::Of(v1::ROLE_WORKER),
      [&](const Sender& from, DataHeader&, Message&) { seen.push_back("init from " + from.peer); });
  ASSERT_TRUE(worker->Connect("server:0", server->address()).ok());
  // The header claims worker 7; the transport says worker 3, and that is what counts.
  ASSERT_TRUE(worker->Send("server:0", DataMessage(DataHeader::OP_PUSH, 7)).ok());
  ASSERT_TRUE(worker->Send("server:0", DataMessage(DataHeader::OP_INIT_KEY)).ok());
  ASSERT_TRUE(PollUntil(*server, [&] { return seen.size() == 2; }));
  EXPECT_EQ(seen[0], "push from worker 3 (claims 7)");
  EXPECT_EQ(seen[1], "init from worker:3");
  EXPECT_EQ(server->stats().dispatched, 2u);
}

TEST(NodeEndpoint, RefusedMalformedAndUnhandledMessagesGoToTheirHandlers) {
  auto hub = transport::NewInprocHub();
  auto server = Make(hub, {v1::ROLE_SERVER, 0});
  auto other_server = Make(hub, {v1::ROLE_SERVER, 1});
  auto mallory = Raw(hub, "mallory");
  auto worker = Make(hub, {v1::ROLE_WORKER, 0});
  int pushes = 0;
  std::vector<std::string> rejected;
  std::vector<std::string> unhandled;
  server->OnData(DataHeader::OP_PUSH, RoleSet::Of(v1::ROLE_WORKER),
                 [&](const Sender&, DataHeader&, Message&) { ++pushes; });
  server->OnRejected(Plane::kData, [&](const Sender& from, const Message&,
                                       NodeEndpoint::Rejection why, std::string_view what) {
    rejected.push_back(fmt::format(
        "{} {} from {} ({})", why == NodeEndpoint::Rejection::kMalformed ? "malformed" : "refused",
        what, from.peer, from.node ? "a node" : "no node"));
  });
  server->OnUnhandledData([&](const Sender& from, DataHeader& h, Message&) {
    unhandled.push_back(fmt::format("{} from {}", DataHeader::Op_Name(h.op()), from.peer));
  });
  for (transport::Transport* t : {static_cast<transport::Transport*>(mallory.get())}) {
    ASSERT_TRUE(t->Connect("server:0", server->address()).ok());
  }
  ASSERT_TRUE(other_server->Connect("server:0", server->address()).ok());
  ASSERT_TRUE(worker->Connect("server:0", server->address()).ok());

  ASSERT_TRUE(other_server->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  ASSERT_TRUE(mallory->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  Message garbage;
  garbage.header = std::string("\xff\xff\xff", 3);
  ASSERT_TRUE(worker->Send("server:0", std::move(garbage)).ok());
  ASSERT_TRUE(worker->Send("server:0", DataMessage(DataHeader::OP_PULL_REPLY)).ok());
  ASSERT_TRUE(PollUntil(*server, [&] { return rejected.size() + unhandled.size() == 4; }));
  EXPECT_EQ(pushes, 0);
  // Per-sender order holds; between senders it does not, so compare as sets.
  std::sort(rejected.begin(), rejected.end());
  EXPECT_EQ(rejected,
            (std::vector<std::string>{"malformed data message from worker:0 (a node)",
                                      "refused data message OP_PUSH from mallory (no node)",
                                      "refused data message OP_PUSH from server:1 (a node)"}));
  EXPECT_EQ(unhandled, (std::vector<std::string>{"OP_PULL_REPLY from worker:0"}));
  const EndpointStats s = server->stats();
  EXPECT_EQ(s.refused, 2u);
  EXPECT_EQ(s.malformed, 1u);
  EXPECT_EQ(s.unhandled, 1u);
  EXPECT_EQ(s.dispatched, 0u);
}

TEST(NodeEndpoint, TheAuthorizationTableDecidesWhoMaySendWhat) {
  // Done only from workers, Shutdown only from the scheduler: a server's Done and a worker's
  // Shutdown are refused before any handler sees them.
  auto hub = transport::NewInprocHub();
  auto scheduler = Make(hub, {v1::ROLE_SCHEDULER, 0});
  auto server = Make(hub, {v1::ROLE_SERVER, 0});
  auto worker = Make(hub, {v1::ROLE_WORKER, 0});
  std::vector<std::string> done_from, shutdown_from;
  scheduler->OnControl(ControlMessage::kDone, [&](const Sender& from, const ControlMessage&) {
    done_from.push_back(from.peer);
  });
  server->OnControl(ControlMessage::kShutdown, [&](const Sender& from, const ControlMessage&) {
    shutdown_from.push_back(from.peer);
  });
  ASSERT_TRUE(server->Connect(kSchedulerPeerId, scheduler->address()).ok());
  ASSERT_TRUE(worker->Connect(kSchedulerPeerId, scheduler->address()).ok());
  ASSERT_TRUE(worker->Connect("server:0", server->address()).ok());
  ASSERT_TRUE(scheduler->Connect("server:0", server->address()).ok());
  ASSERT_TRUE(server->Send(kSchedulerPeerId, ControlOf(ControlMessage::kDone)).ok());
  ASSERT_TRUE(worker->Send(kSchedulerPeerId, ControlOf(ControlMessage::kDone)).ok());
  ControlMessage shutdown;
  shutdown.mutable_shutdown();
  Message m;
  shutdown.SerializeToString(&m.header);
  ASSERT_TRUE(worker->Send("server:0", m).ok());
  ASSERT_TRUE(scheduler->Send("server:0", m).ok());
  ASSERT_TRUE(
      PollUntil(*scheduler, [&] { return scheduler->stats().refused + done_from.size() == 2; }));
  // Between two nodes without the scheduler everything is data plane: the worker's "Shutdown"
  // is not even a control message there, and never reaches the Shutdown handler.
  auto server_seen = [&] {
    const EndpointStats st = server->stats();
    return st.refused + st.malformed + st.unhandled + shutdown_from.size();
  };
  ASSERT_TRUE(PollUntil(*server, [&] { return server_seen() == 2; }));
  EXPECT_EQ(done_from, std::vector<std::string>{"worker:0"});
  EXPECT_EQ(shutdown_from, std::vector<std::string>{"scheduler"});
  EXPECT_EQ(scheduler->stats().refused, 1u);
  // Every rule names a receiver, and each (receiver, message) has one rule.
  std::set<std::tuple<int, bool, int>> seen;
  for (const MessageRule& r : MessageRules()) {
    EXPECT_TRUE(seen.emplace(r.receiver, r.control, r.type).second) << r.name;
    EXPECT_FALSE(r.checks.empty()) << r.name;
  }
  EXPECT_EQ(FindControlRule(v1::ROLE_WORKER, ControlMessage::kDone), nullptr);
}

TEST(NodeEndpoint, RefusalsReachTheHandlerAtMostOncePerIntervalPerSenderButAreAllCounted) {
  auto hub = transport::NewInprocHub();
  auto server = Make(hub, {v1::ROLE_SERVER, 0});
  auto mallory = Raw(hub, "mallory");
  int reported = 0;
  server->OnData(DataHeader::OP_PUSH, [&](const Sender&, DataHeader&, Message&) {});
  server->OnRejected(Plane::kData, [&](const Sender&, const Message&, NodeEndpoint::Rejection,
                                       std::string_view) { ++reported; });
  ASSERT_TRUE(mallory->Connect("server:0", server->address()).ok());
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(mallory->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  }
  ASSERT_TRUE(PollUntil(*server, [&] { return server->stats().refused == 200; }));
  EXPECT_EQ(reported, 1);
}

TEST(NodeEndpoint, ThePlaneIsControlExactlyWhenTheSchedulerIsAtAnEnd) {
  auto hub = transport::NewInprocHub();
  auto scheduler = Make(hub, {v1::ROLE_SCHEDULER, 0});
  auto worker = Make(hub, {v1::ROLE_WORKER, 0});
  auto server = Make(hub, {v1::ROLE_SERVER, 0});
  std::vector<std::string> worker_got;
  std::vector<std::string> scheduler_got;
  worker->OnControl(ControlMessage::kHeartbeat, RoleSet::Of(v1::ROLE_SCHEDULER),
                    [&](const Sender& from, const ControlMessage&) {
                      worker_got.push_back("heartbeat from " + from.peer);
                    });
  worker->OnData(DataHeader::OP_PULL_REPLY, RoleSet::Of(v1::ROLE_SERVER),
                 [&](const Sender& from, DataHeader&, Message&) {
                   worker_got.push_back("reply from " + from.peer);
                 });
  scheduler->OnControl(ControlMessage::kDone, RoleSet::Of(v1::ROLE_WORKER),
                       [&](const Sender& from, const ControlMessage&) {
                         scheduler_got.push_back("done from " + from.peer);
                       });
  ASSERT_TRUE(scheduler->Connect("worker:0", worker->address()).ok());
  ASSERT_TRUE(server->Connect("worker:0", worker->address()).ok());
  ASSERT_TRUE(worker->Connect("scheduler", scheduler->address()).ok());
  ASSERT_TRUE(scheduler
                  ->SendControl("worker:0",
                                [] {
                                  ControlMessage c;
                                  c.mutable_heartbeat()->set_seq(1);
                                  return c;
                                }())
                  .ok());
  DataHeader reply;
  reply.set_op(DataHeader::OP_PULL_REPLY);
  ASSERT_TRUE(server->SendData("worker:0", reply).ok());
  ASSERT_TRUE(worker->Send("scheduler", ControlOf(ControlMessage::kDone)).ok());
  ASSERT_TRUE(PollUntil(*worker, [&] { return worker_got.size() == 2; }));
  ASSERT_TRUE(PollUntil(*scheduler, [&] { return scheduler_got.size() == 1; }));
  std::sort(worker_got.begin(), worker_got.end());
  EXPECT_EQ(worker_got,
            (std::vector<std::string>{"heartbeat from scheduler", "reply from server:0"}));
  EXPECT_EQ(scheduler_got, (std::vector<std::string>{"done from worker:0"}));
}

TEST(NodeEndpoint, AHeldPlaneIsDispatchedInOrderOnRelease) {
  auto hub = transport::NewInprocHub();
  auto server = Make(hub, {v1::ROLE_SERVER, 0});
  auto worker = Make(hub, {v1::ROLE_WORKER, 0});
  auto scheduler = Make(hub, {v1::ROLE_SCHEDULER, 0});
  std::vector<uint64_t> keys;
  int heartbeats = 0;
  server->OnData(DataHeader::OP_PUSH, RoleSet::Of(v1::ROLE_WORKER),
                 [&](const Sender&, DataHeader& h, Message&) { keys.push_back(h.key()); });
  server->OnControl(ControlMessage::kHeartbeat, RoleSet::Of(v1::ROLE_SCHEDULER),
                    [&](const Sender&, const ControlMessage&) { ++heartbeats; });
  server->HoldPlane(Plane::kData);
  ASSERT_TRUE(worker->Connect("server:0", server->address()).ok());
  ASSERT_TRUE(scheduler->Connect("server:0", server->address()).ok());
  for (uint64_t k = 0; k < 5; ++k) {
    DataHeader h;
    h.set_op(DataHeader::OP_PUSH);
    h.set_key(k);
    ASSERT_TRUE(worker->SendData("server:0", h).ok());
  }
  ASSERT_TRUE(scheduler->Send("server:0", ControlOf(ControlMessage::kHeartbeat)).ok());
  // Six messages arrive; only the control one is dispatched while data is held.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(server->Poll(milliseconds(2000)).ok());
  EXPECT_EQ(heartbeats, 1);
  EXPECT_TRUE(keys.empty());
  server->ReleasePlane(Plane::kData);
  EXPECT_EQ(keys, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  // Later data goes straight through.
  DataHeader h;
  h.set_op(DataHeader::OP_PUSH);
  h.set_key(5);
  ASSERT_TRUE(worker->SendData("server:0", h).ok());
  ASSERT_TRUE(PollUntil(*server, [&] { return keys.size() == 6; }));
  EXPECT_EQ(keys.back(), 5u);
}

TEST(NodeEndpoint, TimersRunOnTheLoopByTheInjectedClock) {
  auto hub = transport::NewInprocHub();
  auto clock = std::make_shared<testing::ManualClock>();
  auto e = Make(hub, {v1::ROLE_WORKER, 0}, clock);
  std::mutex mu;
  std::condition_variable cv;
  // A timer runs before every wait of the loop and does its work when due, like the control
  // plane's heartbeats.
  Clock::time_point due = clock->Now();
  std::vector<Clock::time_point> fired;
  e->AddTimer([&](Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu);
    if (now >= due) {
      fired.push_back(now);
      due = now + std::chrono::seconds(10);
      cv.notify_all();
    }
    return due;
  });
  const Clock::time_point t0 = clock->Now();
  e->Start();
  auto wait_fired = [&](size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(5), [&] { return fired.size() >= n; });
  };
  ASSERT_TRUE(wait_fired(1));
  // Nothing is due for ten seconds of the manual clock, however long we wait in real time.
  std::this_thread::sleep_for(milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(fired.size(), 1u);
  }
  clock->Advance(std::chrono::seconds(10));
  ASSERT_TRUE(wait_fired(2));
  e->Close();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(fired.size(), 2u);
  EXPECT_EQ(fired[0], t0);
  EXPECT_EQ(fired[1], t0 + std::chrono::seconds(10));
}

TEST(NodeEndpoint, ATransportFailureReachesTheFailureHandlersOnce) {
  auto hub = transport::NewInprocHub();
  auto sw = std::make_shared<testing::FaultSwitch>();
  auto faulty = FaultyInproc(hub, "worker:0", "inproc://worker:0", sw);
  NodeEndpointOptions o;
  o.self = {v1::ROLE_WORKER, 0};
  o.listen_address = "inproc://worker:0";
  auto e = NodeEndpoint::Create(o, std::move(faulty)).value();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Status> failures;
  e->OnFailure([&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(s);
    cv.notify_all();
  });
  e->Start();
  sw->Crash();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return !failures.empty(); }));
  EXPECT_EQ(failures[0].code(), StatusCode::kCancelled);
  EXPECT_EQ(failures[0].message().rfind("worker 0: endpoint failed", 0), 0u)
      << failures[0].ToString();
  lock.unlock();
  e->Close();
  EXPECT_EQ(failures.size(), 1u);
}

TEST(NodeEndpoint, CloseEndsTheLoopWithoutCallingTheFailureHandlers) {
  auto hub = transport::NewInprocHub();
  auto e = Make(hub, {v1::ROLE_SERVER, 2});
  std::atomic<int> failures{0};
  e->OnFailure([&](const Status&) { ++failures; });
  e->Start();
  const auto start = std::chrono::steady_clock::now();
  e->Close();  // the loop was blocked in Receive for up to idle_wait
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
  EXPECT_EQ(failures.load(), 0);
  e->Close();  // idempotent
  EXPECT_EQ(e->Poll(milliseconds(1)).code(), StatusCode::kCancelled);
}

// A node of `hub` with a data transport listening at `data` (as under cluster.transport ucx).
std::unique_ptr<NodeEndpoint> MakeWithData(const std::shared_ptr<transport::InprocHub>& hub,
                                           NodeIdentity self, const std::string& data) {
  NodeEndpointOptions o;
  o.self = self;
  o.listen_address = "inproc://" + NodePeerId(self.role, self.rank);
  o.data_listen_address = data;
  o.inproc_hub = hub;
  return NodeEndpoint::Create(o).value();
}

// A server with a data transport (as under cluster.transport ucx; inproc here): the workers'
// data arrives there and is dispatched to the same handlers as the main transport's, the
// scheduler's control messages use the main transport, and a control-plane message that
// arrives on the data transport, or a data-plane one on the main transport, is refused and
// counted, never dispatched.
TEST(NodeEndpoint, ADataTransportCarriesTheDataPlaneAndRefusesControlOnIt) {
  auto hub = transport::NewInprocHub();
  auto server = MakeWithData(hub, {v1::ROLE_SERVER, 0}, "inproc://server:0/data");
  auto worker = MakeWithData(hub, {v1::ROLE_WORKER, 1}, "inproc://worker:1/data");
  auto scheduler = Make(hub, {v1::ROLE_SCHEDULER, 0});
  EXPECT_EQ(server->address(), "inproc://server:0");
  EXPECT_EQ(server->data_address(), "inproc://server:0/data");
  EXPECT_EQ(scheduler->data_address(), "");

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> seen;
  auto record = [&](std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(std::move(what));
    cv.notify_all();
  };
  server->OnData(
      DataHeader::OP_PUSH, RoleSet::Of(v1::ROLE_WORKER),
      [&](const Sender& from, DataHeader&, Message&) { record("push from " + from.peer); });
  server->OnControl(
      ControlMessage::kHeartbeat, RoleSet::Of(v1::ROLE_SCHEDULER),
      [&](const Sender& from, const ControlMessage&) { record("heartbeat from " + from.peer); });
  server->Start();
  auto wait_for = [&](size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(5), [&] { return seen.size() >= n; });
  };

  // Worker -> server goes on the data transports (the worker's and the server's).
  ASSERT_TRUE(worker->Connect("server:0", server->data_address()).ok());
  ASSERT_TRUE(worker->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  ASSERT_TRUE(wait_for(1));
  // Scheduler -> server on the main one.
  ASSERT_TRUE(scheduler->Connect("server:0", server->address()).ok());
  ASSERT_TRUE(scheduler->Send("server:0", ControlOf(ControlMessage::kHeartbeat)).ok());
  ASSERT_TRUE(wait_for(2));

  // A peer named "scheduler" on the data transport: refused, counted, not dispatched.
  transport::TransportOptions t;
  t.name = std::string(kSchedulerPeerId);
  t.listen_address = "inproc://impostor";
  t.inproc_hub = hub;
  auto impostor = transport::CreateTransport(t).value();
  ASSERT_TRUE(impostor->Connect("server:0", server->data_address()).ok());
  ASSERT_TRUE(impostor->Send("server:0", ControlOf(ControlMessage::kHeartbeat)).ok());
  // A worker's push after it: the inproc data transport has one mailbox, received in the order
  // Send put them there, so once the push is dispatched the heartbeat was handled.
  ASSERT_TRUE(worker->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  ASSERT_TRUE(wait_for(3));

  // A worker's push on the server's main transport: refused, counted, not dispatched; the
  // scheduler's heartbeat after it (same mailbox) shows it was handled.
  transport::TransportOptions w;
  w.name = "worker:1";
  w.listen_address = "inproc://worker:1/plain";
  w.inproc_hub = hub;
  auto plain = transport::CreateTransport(w).value();
  ASSERT_TRUE(plain->Connect("server:0", server->address()).ok());
  ASSERT_TRUE(plain->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  ASSERT_TRUE(scheduler->Send("server:0", ControlOf(ControlMessage::kHeartbeat)).ok());
  ASSERT_TRUE(wait_for(4));
  const EndpointStats st = server->stats();
  EXPECT_EQ(st.refused, 2u);
  EXPECT_EQ(st.dispatched, 4u);
  EXPECT_EQ(st.data_transport.messages_received, 3u);  // two pushes, the impostor's heartbeat
  EXPECT_EQ(st.transport.messages_received, 3u);       // the scheduler's heartbeats, the stray push
  server->Close();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"push from worker:1", "heartbeat from scheduler",
                                            "push from worker:1", "heartbeat from scheduler"}));
}

// A held data plane on a node with a data transport (a server between registering and its
// assignment, under cluster.transport ucx): a worker's message that arrived on the data
// transport meanwhile is dispatched at the release, not refused as if it had come on the main
// transport.
TEST(NodeEndpoint, HeldDataPlaneMessagesOfTheDataTransportAreDispatchedAtRelease) {
  auto hub = transport::NewInprocHub();
  auto server = MakeWithData(hub, {v1::ROLE_SERVER, 0}, "inproc://server:0/data");
  auto worker = MakeWithData(hub, {v1::ROLE_WORKER, 2}, "inproc://worker:2/data");
  std::atomic<int> pushes{0};
  server->OnData(DataHeader::OP_PUSH, RoleSet::Of(v1::ROLE_WORKER),
                 [&](const Sender&, DataHeader&, Message&) { ++pushes; });
  server->HoldPlane(Plane::kData);
  server->Start();
  ASSERT_TRUE(worker->Connect("server:0", server->data_address()).ok());
  ASSERT_TRUE(worker->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server->stats().data_transport.messages_received < 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(server->stats().data_transport.messages_received, 1u);
  EXPECT_EQ(pushes.load(), 0);  // held
  server->ReleasePlane(Plane::kData);
  EXPECT_EQ(pushes.load(), 1);
  EXPECT_EQ(server->stats().refused, 0u);
  server->Close();
}

// The data transport fails alone (its process-level cause: UCX's worker failed): the failure
// handlers hear it once, naming the data transport and its address, while the main transport
// still carries the control plane (the node can still tell the scheduler it stops).
TEST(NodeEndpoint, ADataTransportFailingAloneIsReportedOnceAndControlStillFlows) {
  auto hub = transport::NewInprocHub();
  auto sw = std::make_shared<testing::FaultSwitch>();
  auto data = FaultyInproc(hub, "server:0", "inproc://server:0/data", sw);
  NodeEndpointOptions o;
  o.self = {v1::ROLE_SERVER, 0};
  o.listen_address = "inproc://server:0";
  o.inproc_hub = hub;
  o.idle_wait = milliseconds(100);
  auto server = NodeEndpoint::Create(o, nullptr, std::move(data)).value();
  EXPECT_EQ(server->data_address(), "inproc://server:0/data");

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> seen;
  std::vector<Status> failures;
  server->OnData(DataHeader::OP_PUSH, RoleSet::Of(v1::ROLE_WORKER),
                 [&](const Sender& from, DataHeader&, Message&) {
                   std::lock_guard<std::mutex> lock(mu);
                   seen.push_back("push from " + from.peer);
                   cv.notify_all();
                 });
  server->OnControl(ControlMessage::kHeartbeat, RoleSet::Of(v1::ROLE_SCHEDULER),
                    [&](const Sender& from, const ControlMessage&) {
                      std::lock_guard<std::mutex> lock(mu);
                      seen.push_back("heartbeat from " + from.peer);
                      cv.notify_all();
                    });
  server->OnFailure([&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(s);
    cv.notify_all();
  });
  server->Start();

  NodeEndpointOptions w;
  w.self = {v1::ROLE_WORKER, 1};
  w.listen_address = "inproc://worker:1";
  w.data_listen_address = "inproc://worker:1/data";
  w.inproc_hub = hub;
  auto worker = NodeEndpoint::Create(w).value();
  ASSERT_TRUE(worker->Connect("server:0", server->data_address()).ok());
  ASSERT_TRUE(worker->Send("server:0", DataMessage(DataHeader::OP_PUSH)).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return seen.size() == 1; }));
  }

  sw->Crash();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return !failures.empty(); }));
    EXPECT_NE(failures[0].message().find("server 0: the data transport at inproc://server:0/data "
                                         "failed"),
              std::string::npos)
        << failures[0].ToString();
  }
  auto scheduler = Make(hub, {v1::ROLE_SCHEDULER, 0});
  ASSERT_TRUE(scheduler->Connect("server:0", server->address()).ok());
  ASSERT_TRUE(scheduler->Send("server:0", ControlOf(ControlMessage::kHeartbeat)).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return seen.size() == 2; }));
  }
  server->Close();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(failures.size(), 1u);
  EXPECT_EQ(seen, (std::vector<std::string>{"push from worker:1", "heartbeat from scheduler"}));
}

TEST(NodeEndpoint, AnInjectedDataTransportMustCarryTheNodesName) {
  auto hub = transport::NewInprocHub();
  transport::TransportOptions t;
  t.name = "server:1";
  t.listen_address = "inproc://elsewhere/data";
  t.inproc_hub = hub;
  NodeEndpointOptions o;
  o.self = {v1::ROLE_SERVER, 0};
  o.listen_address = "inproc://server:0";
  o.inproc_hub = hub;
  StatusOr<std::unique_ptr<NodeEndpoint>> e =
      NodeEndpoint::Create(o, nullptr, transport::CreateTransport(t).value());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("'server:1'"), std::string::npos) << e.status().ToString();
}

TEST(NodeEndpoint, TheSchedulerHasNoDataTransport) {
  NodeEndpointOptions o;
  o.self = {v1::ROLE_SCHEDULER, 0};
  o.listen_address = "inproc://scheduler";
  o.data_listen_address = "inproc://scheduler/data";
  o.inproc_hub = transport::NewInprocHub();
  const auto e = NodeEndpoint::Create(o);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(),
            "NodeEndpointOptions::data_listen_address: the scheduler has no data plane");
}

TEST(NodeEndpoint, AnInjectedTransportMustCarryTheNodesName) {
  auto hub = transport::NewInprocHub();
  NodeEndpointOptions o;
  o.self = {v1::ROLE_WORKER, 1};
  const auto e = NodeEndpoint::Create(o, Raw(hub, "worker:2"));
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(),
            "the injected transport is named 'worker:2', but this node's PeerId is 'worker:1'");
}

}  // namespace
}  // namespace bitpush::node
