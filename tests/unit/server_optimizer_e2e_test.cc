// The server-side optimizer through real Clients and Servers (a threads-as-nodes cluster):
// InitServerWeights gives every worker worker 0's weights; push_pulls with a learning rate leave
// every worker holding exactly what the one-process optimizer computes on the average gradient
// (raw fp32 pulls: sgd, adamw, lans per partition), or, with qWD pulls, the servers' mirror bit
// for bit on every worker after every step; a job restored from the servers' optimizer state
// continues bit for bit (its rounds, and so the random streams, continue); misuse is refused
// by name.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/little_endian.h"
#include "compressors/spec_registry.h"
#include "optimizers/param_state.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"
#include "worker/client.h"

namespace bitpush::worker {
namespace {

using bitpush::testing::RandomFloats;
using std::chrono::milliseconds;

constexpr size_t kPartitionFloats = 1024;  // partition_bytes 4096

struct Options {
  uint32_t workers = 2;
  uint32_t servers = 2;
  std::string spec = "none";
  std::string pull = "none";
};

std::unique_ptr<testing::ThreadCluster> MakeCluster(const Options& o) {
  testing::TestClusterOptions t;
  t.source = "server_optimizer_e2e_test";
  t.servers = o.servers;
  t.workers = o.workers;
  t.compression.spec = o.spec;
  t.compression.min_compress_bytes = 1024;
  t.compression.partition_bytes = kPartitionFloats * sizeof(float);
  t.server.engine_threads = 1;
  t.server.numa = config::NumaMode::kOff;
  t.worker.compress_threads = 1;
  t.worker.op_timeout = milliseconds(20000);
  testing::ThreadClusterOptions c;
  c.config = testing::TestClusterConfig(t);
  c.config.optimizer.placement = "server";
  c.config.optimizer.pull =
      compressors::CompressorSpecString(*compressors::ParseCompressorSpec(o.pull));
  return std::make_unique<testing::ThreadCluster>(std::move(c));
}

void OnEveryWorker(uint32_t workers, const std::function<void(uint32_t)>& fn) {
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < workers; ++w) threads.emplace_back(fn, w);
  for (std::thread& t : threads) t.join();
}

std::vector<uint32_t> Bits(const float* v, size_t n) {
  std::vector<uint32_t> b(n);
  std::memcpy(b.data(), v, 4 * n);
  return b;
}

ServerOptimizerOptions Rule(const std::string& rule) {
  ServerOptimizerOptions o;
  o.rule = rule;
  o.momentum = rule == "sgd" ? 0.9f : 0.0f;
  o.weight_decay = rule == "sgd" ? 0.0f : 0.01f;
  o.eps = rule == "lans" ? 1e-6f : 1e-8f;
  return o;
}

optimizers::UpdateOptions UpdateFor(const ServerOptimizerOptions& o) {
  return *optimizers::MakeUpdateOptions(o.rule, o.weight_decay, o.momentum, o.nesterov, o.beta1,
                                        o.beta2, o.eps);
}

// Worker w's gradient of round t.
std::vector<float> Grad(size_t n, uint64_t t, uint32_t w) {
  return RandomFloats(n, 7000 + 100 * t + w);
}

float Lr(uint64_t t) {
  return 0.02f / static_cast<float>(t + 1);
}

// Raw fp32 pulls of uncompressed pushes: after every round each worker holds, bit for bit, the
// one-process optimizer's weights on the average gradient (the servers' arithmetic: the pushes
// summed in rank order, times 1/n), one optimizer state per partition (LANS's trust ratio is
// per partition: docs/optimizer.md).
TEST(ServerOptimizerE2e, EveryWorkerHoldsTheOneProcessOptimizersWeights) {
  for (const std::string rule : {"sgd", "adamw", "lans"}) {
    SCOPED_TRACE(rule);
    Options o;
    o.workers = 3;
    auto c = MakeCluster(o);
    {
      const Status started = c->Start();
      ASSERT_TRUE(started.ok()) << started.ToString();
    }
    const size_t n = 2500;  // partitions of 1024, 1024, 452 elements over two servers
    const ServerOptimizerOptions opt = Rule(rule);
    // Worker 0's starting weights win; the others start from garbage.
    const std::vector<float> w0 = RandomFloats(n, 1);
    std::vector<std::vector<float>> weights(o.workers);
    std::vector<TensorId> ids(o.workers);
    for (uint32_t w = 0; w < o.workers; ++w) {
      weights[w] = w == 0 ? w0 : RandomFloats(n, 50 + w);
      TensorOptions to;
      to.server_optimizer = opt;
      auto id = c->worker(w).Declare("layer.weight", n, DType::kFloat32, to);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ids[w] = *id;
    }
    OnEveryWorker(o.workers, [&](uint32_t w) {
      const Status s = c->worker(w).InitServerWeights(ids[w], TensorView(weights[w].data(), n));
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    for (uint32_t w = 0; w < o.workers; ++w) ASSERT_EQ(weights[w], w0) << "worker " << w;
    std::vector<optimizers::ParamState> ref;
    for (size_t at = 0; at < n; at += kPartitionFloats) {
      const size_t len = std::min(kPartitionFloats, n - at);
      ref.push_back(*optimizers::ParamState::Create(UpdateFor(opt), {w0.data() + at, len}));
    }
    for (uint64_t t = 0; t < 5; ++t) {
      std::vector<float> avg(n, 0.0f);
      std::vector<std::vector<float>> grads(o.workers);
      for (uint32_t w = 0; w < o.workers; ++w) {
        grads[w] = Grad(n, t, w);
        for (size_t i = 0; i < n; ++i) avg[i] = avg[i] + grads[w][i];
      }
      const float inv = 1.0f / static_cast<float>(o.workers);
      for (float& v : avg) v *= inv;
      for (size_t j = 0; j < ref.size(); ++j) {
        const size_t at = j * kPartitionFloats;
        ASSERT_TRUE(ref[j].Step(Lr(t), {avg.data() + at, ref[j].size()}).ok());
      }
      OnEveryWorker(o.workers, [&](uint32_t w) {
        const Status s = c->worker(w)
                             .PushPull(ids[w], ConstTensorView(grads[w].data(), n),
                                       TensorView(weights[w].data(), n), Lr(t))
                             .Wait();
        EXPECT_TRUE(s.ok()) << s.ToString();
      });
      for (uint32_t w = 0; w < o.workers; ++w) {
        for (size_t j = 0; j < ref.size(); ++j) {
          const size_t at = j * kPartitionFloats;
          ASSERT_EQ(Bits(weights[w].data() + at, ref[j].size()),
                    Bits(ref[j].weights().data(), ref[j].size()))
              << "worker " << w << " round " << t << " partition " << j;
        }
      }
    }
    EXPECT_TRUE(c->Shutdown().ok());
  }
}

// The weights of key `j` in a ServerOptimizerState blob (u64 length, ParamState's 24-byte
// header, then the weights).
std::vector<float> MasterWeights(const std::string& blob, size_t len) {
  std::vector<float> w(len);
  for (size_t i = 0; i < len; ++i) {
    w[i] = GetF32(reinterpret_cast<const uint8_t*>(blob.data()) + 8 + 24 + 4 * i);
  }
  return w;
}

// Runs rounds [from, to) of TLq-HS pushes and qWD pulls on every worker; after each, every
// worker's weights are identical, and equal the servers' mirror (PullServerWeights) bit for bit.
void QwdRounds(testing::ThreadCluster& c, uint32_t workers, const std::vector<TensorId>& ids,
               std::vector<std::vector<float>>& weights, uint64_t from, uint64_t to) {
  const size_t n = weights[0].size();
  for (uint64_t t = from; t < to; ++t) {
    OnEveryWorker(workers, [&](uint32_t w) {
      const std::vector<float> g = Grad(n, t, w);
      const Status s = c.worker(w)
                           .PushPull(ids[w], ConstTensorView(g.data(), n),
                                     TensorView(weights[w].data(), n), Lr(t))
                           .Wait();
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    for (uint32_t w = 1; w < workers; ++w) {
      ASSERT_EQ(Bits(weights[w].data(), n), Bits(weights[0].data(), n)) << "round " << t;
    }
    std::vector<float> mirror(n);
    ASSERT_TRUE(c.worker(1).PullServerWeights(ids[1], TensorView(mirror.data(), n)).ok());
    ASSERT_EQ(Bits(mirror.data(), n), Bits(weights[0].data(), n)) << "round " << t;
  }
}

TEST(ServerOptimizerE2e, QwdKeepsEveryReplicaEqualToTheMirrorAndCloseToTheMaster) {
  Options o;
  o.workers = 3;
  o.spec = "sdp4bit";
  o.pull = "sdp4bit:hadamard=off,group=2048";
  auto c = MakeCluster(o);
  {
    const Status started = c->Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  const size_t n = 3000;
  const std::vector<float> w0 = RandomFloats(n, 2);
  std::vector<std::vector<float>> weights(o.workers, w0);
  std::vector<TensorId> ids(o.workers);
  for (uint32_t w = 0; w < o.workers; ++w) {
    TensorOptions to;
    to.server_optimizer = Rule("adamw");
    ids[w] = c->worker(w).Declare("fc.weight", n, DType::kFloat32, to).value();
  }
  OnEveryWorker(o.workers, [&](uint32_t w) {
    EXPECT_TRUE(c->worker(w).InitServerWeights(ids[w], TensorView(weights[w].data(), n)).ok());
  });
  QwdRounds(*c, o.workers, ids, weights, 0, 6);
  // The replicas trail the master weights by what one INT4 difference step loses: AdamW moves
  // each weight by about lr <= 0.02 a round, quantised with 15 levels over the group's range.
  auto state = c->worker(0).ServerOptimizerState(ids[0]);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(state->size(), 3u);
  for (size_t j = 0; j < state->size(); ++j) {
    const size_t len = std::min(kPartitionFloats, n - j * kPartitionFloats);
    const std::vector<float> master = MasterWeights((*state)[j], len);
    for (size_t i = 0; i < len; ++i) {
      ASSERT_NEAR(weights[0][j * kPartitionFloats + i], master[i], 6e-3) << j << " " << i;
    }
  }
  EXPECT_TRUE(c->Shutdown().ok());
}

// A job killed after round 3 and restarted from the checkpoint (the servers' optimizer state,
// restored by one worker, the weights pulled by every worker) continues bit for bit: TLq-HS
// pushes and qWD pulls are random in (key, round), so the rounds must continue too.
TEST(ServerOptimizerE2e, RestoredJobContinuesBitForBit) {
  Options o;
  o.spec = "sdp4bit";
  o.pull = "sdp4bit:hadamard=off,group=2048";
  const size_t n = 2100;
  const std::vector<float> w0 = RandomFloats(n, 3);
  auto declare = [&](testing::ThreadCluster& c) {
    std::vector<TensorId> ids(o.workers);
    for (uint32_t w = 0; w < o.workers; ++w) {
      TensorOptions to;
      to.server_optimizer = Rule("lans");
      ids[w] = c.worker(w).Declare("fc.weight", n, DType::kFloat32, to).value();
    }
    return ids;
  };
  std::vector<std::string> saved;
  std::vector<float> at_save;
  std::vector<std::vector<float>> uninterrupted(o.workers, w0);
  {
    auto c = MakeCluster(o);
    {
      const Status started = c->Start();
      ASSERT_TRUE(started.ok()) << started.ToString();
    }
    const std::vector<TensorId> ids = declare(*c);
    OnEveryWorker(o.workers, [&](uint32_t w) {
      EXPECT_TRUE(
          c->worker(w).InitServerWeights(ids[w], TensorView(uninterrupted[w].data(), n)).ok());
    });
    QwdRounds(*c, o.workers, ids, uninterrupted, 0, 3);
    saved = c->worker(0).ServerOptimizerState(ids[0]).value();
    at_save = uninterrupted[0];
    QwdRounds(*c, o.workers, ids, uninterrupted, 3, 6);
    EXPECT_TRUE(c->Shutdown().ok());
  }
  auto c = MakeCluster(o);
  {
    const Status started = c->Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  const std::vector<TensorId> ids = declare(*c);
  // A fresh start (any weights), then the checkpoint's state replaces it.
  std::vector<std::vector<float>> weights(o.workers, RandomFloats(n, 99));
  OnEveryWorker(o.workers, [&](uint32_t w) {
    EXPECT_TRUE(c->worker(w).InitServerWeights(ids[w], TensorView(weights[w].data(), n)).ok());
  });
  // Refused: the wrong number of parts, a truncated blob (nothing changes).
  EXPECT_CONTAINS(c->worker(0).RestoreServerOptimizerState(ids[0], {saved[0]}).ToString(),
                  "1 saved part(s) given, the tensor has 3 partition(s)");
  std::vector<std::string> truncated = saved;
  truncated[1].pop_back();
  EXPECT_CONTAINS(c->worker(0).RestoreServerOptimizerState(ids[0], truncated).ToString(),
                  "refused the server-side optimizer state of key");
  ASSERT_TRUE(c->worker(0).RestoreServerOptimizerState(ids[0], saved).ok());
  OnEveryWorker(o.workers, [&](uint32_t w) {
    EXPECT_TRUE(c->worker(w).PullServerWeights(ids[w], TensorView(weights[w].data(), n)).ok());
  });
  for (uint32_t w = 0; w < o.workers; ++w) {
    ASSERT_EQ(Bits(weights[w].data(), n), Bits(at_save.data(), n)) << "worker " << w;
  }
  QwdRounds(*c, o.workers, ids, weights, 3, 6);
  for (uint32_t w = 0; w < o.workers; ++w) {
    EXPECT_EQ(Bits(weights[w].data(), n), Bits(uninterrupted[w].data(), n)) << "worker " << w;
  }
  EXPECT_TRUE(c->Shutdown().ok());
}

TEST(ServerOptimizerE2e, MisuseIsRefusedByName) {
  Options o;
  o.workers = 1;
  o.servers = 1;
  auto c = MakeCluster(o);
  {
    const Status started = c->Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  Client& w = c->worker(0);
  const size_t n = 100;
  std::vector<float> g(n, 1.0f), x(n, 0.5f);
  TensorOptions to;
  to.server_optimizer = Rule("sgd");
  // Bad declarations.
  TensorOptions half = to;
  EXPECT_CONTAINS(w.Declare("h", n, DType::kFloat16, half).status().ToString(), "must be float32");
  TensorOptions raw_onebit = to;
  raw_onebit.server_optimizer->pull = "onebit";
  raw_onebit.server_optimizer->pull_form = "raw";
  EXPECT_CONTAINS(w.Declare("r", n, DType::kFloat32, raw_onebit).status().ToString(),
                  "Counterexample 4.1");
  TensorOptions bad_rule = to;
  bad_rule.server_optimizer->rule = "adagrad";
  EXPECT_CONTAINS(w.Declare("b", n, DType::kFloat32, bad_rule).status().ToString(), "adagrad");
  const TensorId id = w.Declare("w", n, DType::kFloat32, to).value();
  const TensorId plain = w.Declare("plain", n, DType::kFloat32).value();
  // Before the weights came from the servers; without an lr; an lr on a plain tensor.
  EXPECT_CONTAINS(
      w.PushPull(id, ConstTensorView(g.data(), n), TensorView(x.data(), n), 0.1f).Wait().ToString(),
      "InitServerWeights");
  ASSERT_TRUE(w.InitServerWeights(id, TensorView(x.data(), n)).ok());
  EXPECT_CONTAINS(
      w.PushPull(id, ConstTensorView(g.data(), n), TensorView(x.data(), n)).Wait().ToString(),
      "push_pull it with a learning rate");
  EXPECT_CONTAINS(w.PushPull(plain, ConstTensorView(g.data(), n), TensorView(g.data(), n), 0.1f)
                      .Wait()
                      .ToString(),
                  "does not run on the servers");
  EXPECT_CONTAINS(
      w.PushPull(id, ConstTensorView(x.data(), n), TensorView(x.data(), n), 0.1f).Wait().ToString(),
      "the same memory");
  EXPECT_CONTAINS(w.PushPull(id, ConstTensorView(g.data(), n), TensorView(x.data(), n), -1.0f)
                      .Wait()
                      .ToString(),
                  "learning rate -1");
  // Installed once.
  EXPECT_CONTAINS(w.InitServerWeights(id, TensorView(x.data(), n)).ToString(), "already installed");
  EXPECT_CONTAINS(w.PullServerWeights(plain, TensorView(x.data(), n)).ToString(),
                  "does not run on the servers");
  // Still works after the refusals: sgd with momentum, lr 0.1, gradient 1, weights 0.5.
  ASSERT_TRUE(
      w.PushPull(id, ConstTensorView(g.data(), n), TensorView(x.data(), n), 0.1f).Wait().ok());
  for (float v : x) ASSERT_EQ(v, 0.5f - 0.1f);
  EXPECT_TRUE(c->Shutdown().ok());
}

}  // namespace
}  // namespace bitpush::worker
