// The server node over the inproc transport, driven by hand-built data messages from "raw"
// workers (SchedulerClients registered as workers that send DataHeaders directly): replies
// equal a reference, bad requests are refused with errors and counters while the server keeps
// serving, declarations are compared across workers, keys are placed by weighted load, engine
// threads are pinned unless server.numa is off.
#include "server/server.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compressors/mirror_pull.h"
#include "compressors/registry.h"
#include "optimizers/param_state.h"
#include "proto/bitpush/v1/control.pb.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_client.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/compressor_test_util.h"
#include "tests/unit/test_util.h"

namespace bitpush::server {
namespace {

using namespace std::chrono_literals;
using bitpush::testing::RandomFloats;
using transport::Buffer;
using transport::Message;
using v1::DataHeader;

struct Received {
  DataHeader header;
  Message message;
};

// A worker that speaks the data protocol by hand.
class RawWorker {
 public:
  ~RawWorker() { Close(); }
  Status Start(const config::ClusterConfig& cluster, uint32_t rank,
               std::shared_ptr<transport::InprocHub> hub) {
    rank_ = rank;
    node::NodeEndpointOptions e;
    e.self = node::NodeIdentity{v1::ROLE_WORKER, rank};
    e.listen_address = cluster.workers[rank];
    e.inproc_hub = std::move(hub);
    BP_ASSIGN_OR_RETURN(endpoint_, node::NodeEndpoint::Create(e));
    scheduler::SchedulerClientOptions o;
    o.cluster = cluster;
    o.role = v1::ROLE_WORKER;
    o.rank = rank;
    BP_ASSIGN_OR_RETURN(client_, scheduler::SchedulerClient::Create(std::move(o), endpoint_.get()));
    auto keep = [this](const node::Sender&, DataHeader& h, Message& m) {
      Received got;
      got.header = h;
      got.message = std::move(m);
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(std::move(got));
      cv_.notify_all();
    };
    for (DataHeader::Op op :
         {DataHeader::OP_PULL_REPLY, DataHeader::OP_ERROR, DataHeader::OP_DECLARE_REPLY}) {
      endpoint_->OnData(op, node::RoleSet::Of(v1::ROLE_SERVER), keep);
    }
    endpoint_->OnUnhandledData(keep);
    endpoint_->Start();
    BP_RETURN_IF_ERROR(client_->Register());
    const v1::Assignment& a = client_->assignment();
    for (int i = 0; i < a.servers_size(); ++i) {
      BP_RETURN_IF_ERROR(endpoint_->Connect(
          node::NodePeerId(v1::ROLE_SERVER, static_cast<uint32_t>(i)), a.servers(i).address()));
    }
    return Status::Ok();
  }

  Status Send(uint32_t server, DataHeader h, std::vector<Buffer> frames = {},
              bool fix_sender = true) {
    if (fix_sender) h.set_sender(rank_);
    return endpoint_->SendData(node::NodePeerId(v1::ROLE_SERVER, server), h, std::move(frames));
  }
  Status SendRaw(uint32_t server, std::string header) {
    Message m;
    m.header = std::move(header);
    return endpoint_->Send(node::NodePeerId(v1::ROLE_SERVER, server), std::move(m));
  }

  // The next data message (bounded).
  std::optional<Received> Next(std::chrono::milliseconds timeout = 5s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !inbox_.empty(); })) return std::nullopt;
    Received r = std::move(inbox_.front());
    inbox_.pop_front();
    return r;
  }

  scheduler::SchedulerClient& client() { return *client_; }
  // The node "exits": its endpoint closes (peers see it gone), then its client.
  void Close() {
    if (endpoint_) endpoint_->Close();
    if (client_) client_->Close();
  }

 private:
  uint32_t rank_ = 0;
  std::unique_ptr<node::NodeEndpoint> endpoint_;
  std::unique_ptr<scheduler::SchedulerClient> client_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Received> inbox_;
};

// Scheduler thread + S servers + W raw workers over one InprocHub: a testing::ThreadCluster
// (tests/harness/test_cluster.h) whose workers are RawWorkers.
class MiniCluster {
 public:
  MiniCluster(uint32_t servers, uint32_t workers, config::ServerSettings settings = {})
      : workers_(workers) {
    testing::TestClusterOptions t;
    t.source = "server_test";
    t.servers = servers;
    t.workers = workers;
    t.heartbeat_interval = 50ms;
    t.heartbeat_timeout = 1000ms;
    t.startup_timeout = 10000ms;
    t.server = settings;
    testing::ThreadClusterOptions o;
    o.config = testing::TestClusterConfig(t);
    o.start_workers = false;
    o.custom_node = [this](v1::Role role, uint32_t rank) -> Status {
      if (role != v1::ROLE_WORKER) return Status::Ok();
      workers_[rank] = std::make_unique<RawWorker>();
      return workers_[rank]->Start(cluster_->config(), rank, cluster_->hub());
    };
    cluster_ = std::make_unique<testing::ThreadCluster>(std::move(o));
  }

  ~MiniCluster() {
    for (auto& w : workers_) {
      if (w) w->Close();
    }
    cluster_->Close();
  }

  Status Start() { return cluster_->Start(); }

  RawWorker& worker(uint32_t i) { return *workers_[i]; }
  Server& server(uint32_t i) { return cluster_->server(i); }
  uint32_t OwnerOf(uint64_t key) { return workers_[0]->client().ServerForKey(key); }

 private:
  std::vector<std::unique_ptr<RawWorker>> workers_;
  std::unique_ptr<testing::ThreadCluster> cluster_;
};

DataHeader Init(uint64_t key, size_t elements, const std::string& spec, bool server_ef = false) {
  DataHeader h;
  h.set_op(DataHeader::OP_INIT_KEY);
  h.set_key(key);
  h.set_element_count(elements);
  h.set_dtype(static_cast<uint32_t>(DType::kFloat32));
  *h.mutable_compressor_config() = *compressors::ParseCompressorSpec(spec);
  h.set_server_residual(server_ef);
  h.set_tensor("t" + std::to_string(key));
  return h;
}

std::pair<DataHeader, std::vector<Buffer>> Push(uint64_t key, uint64_t round,
                                                const std::vector<uint8_t>& payload,
                                                v1::CompressorId id, size_t elements) {
  DataHeader h;
  h.set_op(DataHeader::OP_PUSH);
  h.set_key(key);
  h.set_round(round);
  h.set_compressor(id);
  h.set_element_count(elements);
  h.set_dtype(static_cast<uint32_t>(DType::kFloat32));
  h.set_byte_count(payload.size());
  return {h, {Buffer::Copy(payload.data(), payload.size())}};
}

std::vector<uint8_t> CompressFloats(const std::string& spec, const std::vector<float>& g,
                                    uint64_t key, uint64_t round) {
  auto c = std::move(compressors::CreateCompressor(spec)).value();
  return bitpush::testing::Compress(*c, ConstTensorView(g.data(), g.size()), {key, round});
}

// Pushes a good round of `none` from every worker of `c` and checks each gets the average.
void ExpectGoodRound(MiniCluster& c, uint32_t workers, uint64_t key, uint64_t round, size_t n) {
  const uint32_t owner = c.OwnerOf(key);
  std::vector<std::vector<float>> g;
  for (uint32_t w = 0; w < workers; ++w) {
    g.push_back(RandomFloats(n, 1000 * round + w));
    auto [h, frames] =
        Push(key, round, CompressFloats("none", g[w], key, round), v1::COMPRESSOR_ID_NONE, n);
    ASSERT_TRUE(c.worker(w).Send(owner, h, frames).ok());
  }
  for (uint32_t w = 0; w < workers; ++w) {
    auto r = c.worker(w).Next();
    ASSERT_TRUE(r.has_value()) << "worker " << w << " got no reply";
    ASSERT_EQ(r->header.op(), DataHeader::OP_PULL_REPLY) << r->header.error();
    EXPECT_EQ(r->header.key(), key);
    EXPECT_EQ(r->header.round(), round);
    ASSERT_EQ(r->message.frames.size(), 1u);
    std::vector<float> out(n);
    auto codec = std::move(compressors::CreateCompressor("none")).value();
    ASSERT_TRUE(codec->Decompress(r->message.frames[0].span(), TensorView(out.data(), n)).ok());
    for (size_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (uint32_t k = 0; k < workers; ++k) sum += g[k][i];
      const float want = workers > 1 ? sum * (1.0f / static_cast<float>(workers)) : sum;
      ASSERT_EQ(out[i], want) << "element " << i;
    }
  }
}

TEST(Server, PushesAreAggregatedAndEveryWorkerGetsTheSameReply) {
  MiniCluster c(2, 3);
  ASSERT_TRUE(c.Start().ok());
  for (uint64_t key : {7ull, 8ull, 9ull}) {
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_TRUE(c.worker(w).Send(c.OwnerOf(key), Init(key, 100, "none")).ok());
    }
  }
  for (uint64_t round = 0; round < 3; ++round) {
    for (uint64_t key : {7ull, 8ull, 9ull}) ExpectGoodRound(c, 3, key, round, 100);
  }
  const ServerStats s = c.server(0).stats();
  const ServerStats t = c.server(1).stats();
  EXPECT_EQ(s.keys + t.keys, 3u);
  EXPECT_EQ(s.pushes_accepted + t.pushes_accepted, 27u);
  EXPECT_EQ(s.replies_sent + t.replies_sent, 27u);
  EXPECT_EQ(s.rounds_published + t.rounds_published, 9u);
  EXPECT_EQ(s.pushes_rejected + t.pushes_rejected, 0u);
}

// Algorithm 4 on the server: the reply equals the reference C(avg + ẽ) with ẽ carried over
// rounds, for a biased compressor.
TEST(Server, ServerResidualFollowsAlgorithm4) {
  MiniCluster c(1, 2);
  ASSERT_TRUE(c.Start().ok());
  const size_t n = 300;
  const std::string spec = "topk:ratio=0.05";
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(c.worker(w).Send(0, Init(5, n, spec, true)).ok());
  auto codec = std::move(compressors::CreateCompressor(spec)).value();
  std::vector<float> residual(n, 0.0f);
  for (uint64_t round = 0; round < 5; ++round) {
    std::vector<float> acc(n, 0.0f);
    for (uint32_t w = 0; w < 2; ++w) {
      const auto p = CompressFloats(spec, RandomFloats(n, 10 * round + w), 5, round);
      ASSERT_TRUE(codec->DecompressAdd({p.data(), p.size()}, {acc.data(), n}).ok());
      auto [h, frames] = Push(5, round, p, v1::COMPRESSOR_ID_TOPK, n);
      ASSERT_TRUE(c.worker(w).Send(0, h, frames).ok());
    }
    for (float& v : acc) v *= 0.5f;
    std::vector<uint8_t> want(codec->MaxCompressedBytes(n, DType::kFloat32));
    auto bytes = codec->CompressWithFeedback(ConstTensorView(acc.data(), n), {residual.data(), n},
                                             {5, round}, {want.data(), want.size()});
    ASSERT_TRUE(bytes.ok());
    want.resize(*bytes);
    for (uint32_t w = 0; w < 2; ++w) {
      auto r = c.worker(w).Next();
      ASSERT_TRUE(r.has_value());
      ASSERT_EQ(r->header.op(), DataHeader::OP_PULL_REPLY) << r->header.error();
      const Buffer& f = r->message.frames.at(0);
      ASSERT_EQ(std::vector<uint8_t>(f.data(), f.data() + f.size()), want) << "round " << round;
    }
  }
}

// Every kind of bad request gets an OP_ERROR naming the problem, is counted, and the server
// goes on serving a good round of the same key afterwards.
TEST(Server, BadPushesAreRefusedAndCountedAndTheServerKeepsServing) {
  MiniCluster c(1, 2);
  ASSERT_TRUE(c.Start().ok());
  const size_t n = 64;
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(c.worker(w).Send(0, Init(1, n, "none")).ok());
  RawWorker& bad = c.worker(1);
  const auto good = CompressFloats("none", RandomFloats(n, 1), 1, 0);

  auto expect_error = [&](StatusCode code, const std::string& needle,
                          DataHeader::Op refused = DataHeader::OP_PUSH) {
    auto r = bad.Next();
    ASSERT_TRUE(r.has_value()) << "no answer; expected an error with '" << needle << "'";
    ASSERT_EQ(r->header.op(), DataHeader::OP_ERROR);
    EXPECT_EQ(r->header.refused_op(), refused);
    EXPECT_EQ(r->header.error_code(), static_cast<uint32_t>(code)) << r->header.error();
    EXPECT_NE(r->header.error().find(needle), std::string::npos) << r->header.error();
  };
  uint64_t refusals = 0;

  {  // unknown key
    auto [h, f] = Push(99, 0, good, v1::COMPRESSOR_ID_NONE, n);
    ASSERT_TRUE(bad.Send(0, h, f).ok());
    expect_error(StatusCode::kNotFound, "key 99 is unknown");
    ++refusals;
  }
  {  // wrong size: a payload of another element count
    const auto small = CompressFloats("none", RandomFloats(n - 1, 2), 1, 0);
    auto [h, f] = Push(1, 0, small, v1::COMPRESSOR_ID_NONE, n);
    ASSERT_TRUE(bad.Send(0, h, f).ok());
    expect_error(StatusCode::kInvalidArgument, "63 elements");
    ++refusals;
  }
  {  // header says another element count
    auto [h, f] = Push(1, 0, good, v1::COMPRESSOR_ID_NONE, n + 5);
    ASSERT_TRUE(bad.Send(0, h, f).ok());
    expect_error(StatusCode::kInvalidArgument, "69 elements");
    ++refusals;
  }
  {  // wrong compressor id (header) and wrong compressor payload
    auto [h, f] = Push(1, 0, good, v1::COMPRESSOR_ID_ONEBIT, n);
    ASSERT_TRUE(bad.Send(0, h, f).ok());
    expect_error(StatusCode::kInvalidArgument, "onebit");
    ++refusals;
    const auto onebit = CompressFloats("onebit", RandomFloats(n, 3), 1, 0);
    auto [h2, f2] = Push(1, 0, onebit, v1::COMPRESSOR_ID_NONE, n);
    ASSERT_TRUE(bad.Send(0, h2, f2).ok());
    expect_error(StatusCode::kInvalidArgument, "onebit");
    ++refusals;
  }
  {  // truncated payload: the frame is shorter than the header announces
    auto [h, f] = Push(1, 0, good, v1::COMPRESSOR_ID_NONE, n);
    h.set_byte_count(good.size() + 8);
    ASSERT_TRUE(bad.Send(0, h, f).ok());
    expect_error(StatusCode::kDataLoss, "announces one frame");
    ++refusals;
  }
  {  // a good push, then the same round again: duplicate
    auto [h, f] = Push(1, 0, good, v1::COMPRESSOR_ID_NONE, n);
    ASSERT_TRUE(bad.Send(0, h, f).ok());
    ASSERT_TRUE(bad.Send(0, h, f).ok());
    expect_error(StatusCode::kInvalidArgument, "second push from worker 1 in round 0");
    ++refusals;
  }
  EXPECT_EQ(c.server(0).stats().pushes_rejected, refusals);
  // Worker 0 completes round 0: both get the reply (worker 1's good push was kept).
  {
    auto [h, f] = Push(1, 0, good, v1::COMPRESSOR_ID_NONE, n);
    ASSERT_TRUE(c.worker(0).Send(0, h, f).ok());
    for (uint32_t w = 0; w < 2; ++w) {
      auto r = c.worker(w).Next();
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->header.op(), DataHeader::OP_PULL_REPLY) << r->header.error();
    }
  }
  ExpectGoodRound(c, 2, 1, 1, n);  // and keeps serving
  EXPECT_EQ(c.server(0).stats().pushes_rejected, refusals);
}

// What a process holding worker 1's key can send that is no request of a worker: a control
// message (it parses as a DataHeader of op OP_UNSPECIFIED naming worker 0), a header that does
// not parse, an op the server does not serve, a push whose header names worker 0. Each is
// refused and counted, and none is answered: an answer goes to worker 1's own address, and the
// real worker 1 (which never sent them) took it for an error of a push it never made. Replies
// to one peer arrive in order, so worker 1's first message after them being the round's exact
// aggregate shows that nothing was sent to it before.
TEST(Server, MessagesThatAreNoRequestAreRefusedCountedAndNeverAnswered) {
  MiniCluster c(1, 2);
  ASSERT_TRUE(c.Start().ok());
  const size_t n = 64;
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(c.worker(w).Send(0, Init(1, n, "none")).ok());
  RawWorker& holder = c.worker(1);
  v1::ControlMessage done;
  done.mutable_done();
  v1::ControlMessage shutdown;
  shutdown.mutable_shutdown()->set_error("forged");
  ASSERT_TRUE(holder.SendRaw(0, done.SerializeAsString()).ok());
  ASSERT_TRUE(holder.SendRaw(0, shutdown.SerializeAsString()).ok());
  ASSERT_TRUE(holder.SendRaw(0, std::string("\xff\xff\xff\xff not protobuf", 18)).ok());
  DataHeader pull;
  pull.set_op(DataHeader::OP_PULL);
  pull.set_key(1);
  ASSERT_TRUE(holder.Send(0, pull).ok());
  auto [h, f] =
      Push(1, 0, CompressFloats("none", RandomFloats(n, 1), 1, 0), v1::COMPRESSOR_ID_NONE, n);
  h.set_sender(0);
  ASSERT_TRUE(holder.Send(0, h, f, /*fix_sender=*/false).ok());

  ExpectGoodRound(c, 2, 1, 0, n);  // each worker's next message is round 0's aggregate
  EXPECT_EQ(c.server(0).stats().pushes_rejected, 5u);
  EXPECT_EQ(c.server(0).endpoint_stats().malformed, 1u);
  ExpectGoodRound(c, 2, 1, 1, n);
}

// A key declared to a server that does not own it under the scheduler's mapping is refused;
// its owner accepts it.
TEST(Server, KeysAreAcceptedOnlyByTheirOwner) {
  MiniCluster c(2, 1);
  ASSERT_TRUE(c.Start().ok());
  uint64_t key = 1000;
  while (c.OwnerOf(key) != 1) ++key;
  ASSERT_TRUE(c.worker(0).Send(0, Init(key, 16, "none")).ok());
  auto r = c.worker(0).Next();
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->header.op(), DataHeader::OP_ERROR);
  EXPECT_EQ(r->header.refused_op(), DataHeader::OP_INIT_KEY);
  EXPECT_NE(r->header.error().find(fmt::format(
                "key {} belongs to server 1 under the cluster's key mapping, but worker 0 "
                "declared it to server 0",
                key)),
            std::string::npos)
      << r->header.error();
  EXPECT_EQ(c.server(0).stats().keys, 0u);
  ASSERT_TRUE(c.worker(0).Send(1, Init(key, 16, "none")).ok());
  ExpectGoodRound(c, 1, key, 0, 16);
  EXPECT_EQ(c.server(1).stats().keys, 1u);
}

TEST(Server, DeclarationsAreComparedAcrossWorkers) {
  MiniCluster c(2, 2);
  ASSERT_TRUE(c.Start().ok());
  auto manifest = [](std::vector<std::pair<std::string, uint64_t>> tensors) {
    v1::TensorManifest m;
    uint32_t i = 0;
    for (auto& [name, n] : tensors) {
      v1::TensorDeclaration* t = m.add_tensors();
      t->set_index(i++);
      t->set_name(name);
      t->set_elements(n);
      t->set_compression("none");
    }
    std::string bytes = m.SerializeAsString();
    return std::vector<Buffer>{Buffer::Take(std::move(bytes))};
  };
  DataHeader h;
  h.set_op(DataHeader::OP_DECLARE);
  h.set_round(0);
  ASSERT_TRUE(c.worker(0).Send(0, h, manifest({{"a", 10}, {"b", 20}})).ok());
  ASSERT_TRUE(c.worker(1).Send(0, h, manifest({{"a", 10}, {"b", 20}})).ok());
  for (uint32_t w = 0; w < 2; ++w) {
    auto r = c.worker(w).Next();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->header.op(), DataHeader::OP_DECLARE_REPLY) << r->header.error();
    EXPECT_EQ(r->header.round(), 0u);
  }
  h.set_round(1);
  ASSERT_TRUE(c.worker(0).Send(0, h, manifest({{"c", 5}, {"d", 7}, {"e", 1}})).ok());
  ASSERT_TRUE(c.worker(1).Send(0, h, manifest({{"c", 5}, {"d", 8}})).ok());
  for (uint32_t w = 0; w < 2; ++w) {
    auto r = c.worker(w).Next();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.op(), DataHeader::OP_ERROR);
    EXPECT_EQ(r->header.refused_op(), DataHeader::OP_DECLARE);
    EXPECT_EQ(r->header.error_code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
    EXPECT_NE(r->header.error().find("tensor #1: worker 0 declared 'd' (7 x float32, none, "
                                     "average) but worker 1 declared 'd' (8 x float32"),
              std::string::npos)
        << r->header.error();
  }
  // Declarations go to server 0 only.
  ASSERT_TRUE(c.worker(0).Send(1, h, manifest({{"x", 1}})).ok());
  auto r = c.worker(0).Next();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->header.op(), DataHeader::OP_ERROR);
  EXPECT_NE(r->header.error().find("go to server 0"), std::string::npos) << r->header.error();
}

// Keys go to the engine thread with the least weighted load; a compressed key weighs
// kCompressedKeyWeight times its bytes.
TEST(Server, KeysArePlacedByWeightedLoad) {
  config::ServerSettings settings;
  settings.engine_threads = 2;
  settings.numa = config::NumaMode::kOff;
  MiniCluster c(1, 1, settings);
  ASSERT_TRUE(c.Start().ok());
  RawWorker& w = c.worker(0);
  ASSERT_TRUE(w.Send(0, Init(1, 1000, "onebit")).ok());  // thread 0: 4000 * 4
  for (uint64_t key = 2; key <= 5; ++key) {              // 4000 each: all on thread 1
    ASSERT_TRUE(w.Send(0, Init(key, 1000, "none")).ok());
  }
  ASSERT_TRUE(w.Send(0, Init(6, 1000, "none")).ok());  // 16000 vs 16000: thread 0
  // Placement happens on the I/O thread as messages arrive; a reply proves they all did.
  auto [h, f] =
      Push(6, 0, CompressFloats("none", RandomFloats(1000, 1), 6, 0), v1::COMPRESSOR_ID_NONE, 1000);
  ASSERT_TRUE(w.Send(0, h, f).ok());
  ASSERT_TRUE(w.Next().has_value());
  const auto threads = c.server(0).engine_threads();
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0].keys, 2u);
  EXPECT_EQ(threads[0].load, 4000u * kCompressedKeyWeight + 4000u);
  EXPECT_EQ(threads[1].keys, 4u);
  EXPECT_EQ(threads[1].load, 16000u);
  EXPECT_EQ(threads[0].cpu, -1);  // numa: off pins nothing
}

TEST(Server, EngineThreadsArePinnedByDefault) {
  config::ServerSettings settings;
  settings.engine_threads = 2;
  MiniCluster c(1, 1, settings);
  ASSERT_TRUE(c.Start().ok());
  const auto threads = c.server(0).engine_threads();
  ASSERT_EQ(threads.size(), 2u);
  for (const auto& t : threads) EXPECT_GE(t.cpu, 0);
}

// A key whose optimizer runs on the server, over the wire: OP_INIT_KEY carries the optimizer and
// the starting weights, each push its lr, replies are qWD differences that the workers apply;
// the weights equal one-process ParamState on the average gradient, the optimizer state reads
// and writes back through OP_STATE_READ / OP_STATE_WRITE, and bad declarations are refused.
TEST(Server, ServerSideOptimizerOverTheWire) {
  MiniCluster c(1, 2);
  ASSERT_TRUE(c.Start().ok());
  const size_t n = 500;
  const uint64_t key = 11;
  v1::ServerOptimizer opt;
  opt.set_rule("adamw");
  opt.set_weight_decay(0.01f);
  opt.set_beta1(0.9f);
  opt.set_beta2(0.999f);
  opt.set_eps(1e-8f);
  *opt.mutable_pull() = *compressors::ParseCompressorSpec("sdp4bit:hadamard=off,group=2048");
  opt.set_difference(true);
  const std::vector<float> w0 = RandomFloats(n, 3);
  auto init = [&] {
    DataHeader h = Init(key, n, "none");
    *h.mutable_server_optimizer() = opt;
    return h;
  };
  auto weights_op = [&](DataHeader::Op op) {
    DataHeader h;
    h.set_op(op);
    h.set_key(key);
    h.set_weights(true);
    return h;
  };
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(c.worker(w).Send(0, init()).ok());
  {  // A worker declaring another optimizer than the first is refused.
    DataHeader h = init();
    h.mutable_server_optimizer()->set_rule("sgd");
    ASSERT_TRUE(c.worker(1).Send(0, h).ok());
    auto r = c.worker(1).Next();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.op(), DataHeader::OP_ERROR);
    EXPECT_NE(r->header.error().find("another worker declared"), std::string::npos);
  }
  // Worker 1 asks for the weights before any are installed: the answer waits for worker 0's
  // install (a wrong-sized one is refused and installs nothing), then both read w0.
  ASSERT_TRUE(c.worker(1).Send(0, weights_op(DataHeader::OP_STATE_READ)).ok());
  ASSERT_TRUE(c.worker(0)
                  .Send(0, weights_op(DataHeader::OP_STATE_WRITE),
                        {Buffer::Copy(w0.data(), (n - 1) * sizeof(float))})
                  .ok());
  {
    auto r = c.worker(0).Next();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.op(), DataHeader::OP_ERROR);
    EXPECT_NE(r->header.error().find("starting weights"), std::string::npos) << r->header.error();
  }
  ASSERT_TRUE(c.worker(0)
                  .Send(0, weights_op(DataHeader::OP_STATE_WRITE),
                        {Buffer::Copy(w0.data(), n * sizeof(float))})
                  .ok());
  {
    auto done = c.worker(0).Next();
    ASSERT_TRUE(done.has_value());
    ASSERT_EQ(done->header.op(), DataHeader::OP_STATE_REPLY) << done->header.error();
    auto r = c.worker(1).Next();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.op(), DataHeader::OP_STATE_REPLY) << r->header.error();
    ASSERT_TRUE(r->header.weights());
    ASSERT_EQ(r->message.frames.size(), 1u);
    ASSERT_EQ(r->message.frames[0].size(), n * sizeof(float));
    EXPECT_EQ(0, std::memcmp(r->message.frames[0].data(), w0.data(), n * sizeof(float)));
  }
  {  // Installed once: a second install is refused, naming why.
    ASSERT_TRUE(c.worker(1)
                    .Send(0, weights_op(DataHeader::OP_STATE_WRITE),
                          {Buffer::Copy(w0.data(), n * sizeof(float))})
                    .ok());
    auto r = c.worker(1).Next();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.op(), DataHeader::OP_ERROR);
    EXPECT_NE(r->header.error().find("already installed"), std::string::npos) << r->header.error();
  }
  optimizers::UpdateOptions update;
  update.rule = optimizers::UpdateRule::kAdamW;
  update.weight_decay = 0.01f;
  auto ref = optimizers::ParamState::Create(update, {w0.data(), n});
  ASSERT_TRUE(ref.ok());
  auto pull = std::move(compressors::CreateCompressor("sdp4bit:hadamard=off,group=2048")).value();
  compressors::CompressorPullCodec codec(pull.get());
  std::vector<std::vector<float>> held(2, w0);
  for (uint64_t round = 0; round < 4; ++round) {
    const float lr = 0.01f / static_cast<float>(round + 1);
    std::vector<float> avg(n, 0.0f);
    for (uint32_t w = 0; w < 2; ++w) {
      const std::vector<float> g = RandomFloats(n, 100 * round + w);
      for (size_t i = 0; i < n; ++i) avg[i] += g[i];
      auto [h, frames] =
          Push(key, round, CompressFloats("none", g, key, round), v1::COMPRESSOR_ID_NONE, n);
      h.set_lr(lr);
      ASSERT_TRUE(c.worker(w).Send(0, h, frames).ok());
    }
    for (float& v : avg) v *= 0.5f;
    ASSERT_TRUE(ref->Step(lr, {avg.data(), n}).ok());
    for (uint32_t w = 0; w < 2; ++w) {
      auto r = c.worker(w).Next();
      ASSERT_TRUE(r.has_value());
      ASSERT_EQ(r->header.op(), DataHeader::OP_PULL_REPLY) << r->header.error();
      ASSERT_TRUE(
          compressors::ApplyMirrorPull(codec, r->message.frames[0].span(), {held[w].data(), n})
              .ok());
    }
    ASSERT_EQ(held[0], held[1]);
    // The workers track the server's weights within qWD's error: one INT4 step of the
    // difference (AdamW moves each weight by about lr <= 0.01 a round: 0.01 / 7 plus what the
    // last round carried).
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(held[0][i], ref->weights()[i], 3e-3) << i;
  }
  {  // The workers' copy read back is the copy every worker holds, bit for bit.
    ASSERT_TRUE(c.worker(1).Send(0, weights_op(DataHeader::OP_STATE_READ)).ok());
    auto r = c.worker(1).Next();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.op(), DataHeader::OP_STATE_REPLY) << r->header.error();
    ASSERT_EQ(r->message.frames.size(), 1u);
    ASSERT_EQ(r->message.frames[0].size(), n * sizeof(float));
    EXPECT_EQ(0, std::memcmp(r->message.frames[0].data(), held[1].data(), n * sizeof(float)));
  }
  // A push without its lr is refused naming it.
  {
    auto [h, frames] =
        Push(key, 4, CompressFloats("none", RandomFloats(n, 9), key, 4), v1::COMPRESSOR_ID_NONE, n);
    ASSERT_TRUE(c.worker(0).Send(0, h, frames).ok());
    auto r = c.worker(0).Next();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.op(), DataHeader::OP_ERROR);
    EXPECT_NE(r->header.error().find("without a learning rate"), std::string::npos);
  }
  // The optimizer state: read it, write it back (between rounds), read the same bytes again.
  DataHeader read;
  read.set_op(DataHeader::OP_STATE_READ);
  read.set_key(key);
  read.set_optimizer_state(true);
  ASSERT_TRUE(c.worker(0).Send(0, read).ok());
  auto saved = c.worker(0).Next();
  ASSERT_TRUE(saved.has_value());
  ASSERT_EQ(saved->header.op(), DataHeader::OP_STATE_REPLY) << saved->header.error();
  ASSERT_EQ(saved->message.frames.size(), 1u);
  const std::vector<uint8_t> blob(
      saved->message.frames[0].data(),
      saved->message.frames[0].data() + saved->message.frames[0].size());
  // ParamState's 24-byte header after the 8-byte length, then weights and two moments, then
  // the mirror: the server's weights are the reference's, bit for bit.
  ASSERT_EQ(blob.size(), 8 + 24 + 3 * 4 * n + 4 * n);
  EXPECT_EQ(0, std::memcmp(blob.data() + 8 + 24, ref->weights().data(), 4 * n));
  DataHeader write = read;
  write.set_op(DataHeader::OP_STATE_WRITE);
  ASSERT_TRUE(c.worker(0).Send(0, write, {Buffer::Copy(blob.data(), blob.size())}).ok());
  auto written = c.worker(0).Next();
  ASSERT_TRUE(written.has_value());
  ASSERT_EQ(written->header.op(), DataHeader::OP_STATE_REPLY) << written->header.error();
  ASSERT_TRUE(c.worker(0).Send(0, write, {Buffer::Copy(blob.data(), blob.size() - 1)}).ok());
  auto bad = c.worker(0).Next();
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->header.op(), DataHeader::OP_ERROR);
  ASSERT_TRUE(c.worker(0).Send(0, read).ok());
  auto again = c.worker(0).Next();
  ASSERT_TRUE(again.has_value());
  ASSERT_EQ(again->message.frames.size(), 1u);
  EXPECT_EQ(std::vector<uint8_t>(again->message.frames[0].data(),
                                 again->message.frames[0].data() + again->message.frames[0].size()),
            blob);
}

}  // namespace
}  // namespace bitpush::server
