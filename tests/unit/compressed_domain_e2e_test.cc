// The compressed-domain aggregation mode through real Clients and Servers (a threads-as-nodes
// cluster, several keys over two servers): for separate (projection sums, the workers'
// moving-average error with the residual taken against the reconstruction of the average) and
// binsgdm (popcount of sign bits, the servers' error, re-binarisation; the workers' moments and
// error), every worker's output after every round is, bit for bit, what one process computes by
// running the method's pieces by hand: each worker's state compresses its gradient, the server
// round (Compressor::AggregateCompress, through the server residual where the key keeps one)
// combines the payloads in rank order, each worker's state decodes the reply. The servers never
// decode a push (a push they cannot combine is refused by name), and a server-side optimizer
// key of such a method is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/counter_rng.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "optimizers/binsgdm.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"
#include "worker/client.h"
#include "worker/partition.h"

namespace bitpush::worker {
namespace {

using bitpush::testing::RandomFloats;
using compressors::CompressContext;
using compressors::ErrorFeedbackSide;
using std::chrono::milliseconds;

constexpr size_t kPartitionFloats = 1024;  // partition_bytes 4096

std::unique_ptr<testing::ThreadCluster> MakeCluster(uint32_t workers, const std::string& spec,
                                                    const std::string& error_feedback) {
  testing::TestClusterOptions t;
  t.source = "compressed_domain_e2e_test";
  t.servers = 2;
  t.workers = workers;
  t.compression.spec = spec;
  t.compression.error_feedback = error_feedback;
  t.compression.min_compress_bytes = 1024;
  // The 777-element tensor is below separate's minimum at CR 16; it is compressed on purpose
  // (short last blocks through the engine).
  t.compression.method_minimum = false;
  t.compression.partition_bytes = kPartitionFloats * sizeof(float);
  t.server.engine_threads = 1;
  t.server.numa = config::NumaMode::kOff;
  t.worker.compress_threads = 1;
  t.worker.op_timeout = milliseconds(20000);
  testing::ThreadClusterOptions c;
  c.config = testing::TestClusterConfig(t);
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

// The method's pieces for one key, run by hand: one worker state per worker, the server's
// residual where the policy keeps one.
struct KeyReference {
  uint64_t key = 0;
  size_t elements = 0;
  std::unique_ptr<compressors::Compressor> compressor;
  std::vector<std::unique_ptr<compressors::ErrorFeedback>> workers;
  std::unique_ptr<compressors::ErrorFeedback> server;

  // One round: grads[w] is worker w's gradient of this key; out[w] receives what worker w
  // decodes.
  void Round(uint64_t round, const std::vector<const float*>& grads,
             const std::vector<float*>& out) {
    const uint32_t n = static_cast<uint32_t>(workers.size());
    std::vector<std::vector<uint8_t>> payloads(n);
    std::vector<ByteSpan> spans;
    for (uint32_t w = 0; w < n; ++w) {
      payloads[w].resize(compressor->MaxCompressedBytes(elements, DType::kFloat32));
      const CompressContext ctx{key, round, w};
      StatusOr<size_t> bytes =
          workers[w] ? workers[w]->Compress(*compressor, ConstTensorView(grads[w], elements), ctx,
                                            {payloads[w].data(), payloads[w].size()})
                     : compressor->Compress(ConstTensorView(grads[w], elements), ctx,
                                            {payloads[w].data(), payloads[w].size()});
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      payloads[w].resize(*bytes);
      spans.emplace_back(payloads[w].data(), payloads[w].size());
    }
    for (const ByteSpan& s : spans) {
      ASSERT_TRUE(compressor->ValidatePayload(s, elements).ok());
    }
    std::vector<uint8_t> reply(compressor->MaxCompressedBytes(elements, DType::kFloat32));
    const float scale = 1.0f / static_cast<float>(n);
    const CompressContext sctx{key, round, kServerStream};
    StatusOr<size_t> bytes =
        server ? server->AggregateCompress(*compressor, spans, scale, sctx,
                                           {reply.data(), reply.size()})
               : compressor->AggregateCompress(spans, elements, scale, nullptr, sctx,
                                               {reply.data(), reply.size()});
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    const ByteSpan r(reply.data(), *bytes);
    for (uint32_t w = 0; w < n; ++w) {
      const CompressContext ctx{key, round, w};
      const Status s = workers[w] ? workers[w]->DecompressReply(*compressor, r, ctx,
                                                                TensorView(out[w], elements))
                                  : compressor->Decompress(r, TensorView(out[w], elements));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
};

// Runs `rounds` push_pulls of two tensors on every worker and compares every output with the
// by-hand reference, bit for bit.
void ExpectDistributedEqualsPieces(const std::string& spec, const std::string& policy,
                                   uint32_t workers, uint64_t rounds) {
  SCOPED_TRACE(spec + " error_feedback " + policy);
  const v1::CompressorConfig config = *compressors::ParseCompressorSpec(spec);
  const v1::ErrorFeedbackPolicy ef = *compressors::ParseErrorFeedbackPolicy(policy);
  auto c = MakeCluster(workers, spec, policy);
  {
    const Status started = c->Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  // Tensor 0: 2600 elements (partitions 1024, 1024, 552 — a short last block); tensor 1: 777.
  const std::vector<size_t> sizes = {2600, 777};
  std::vector<std::vector<TensorId>> ids(workers);
  for (uint32_t w = 0; w < workers; ++w) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      auto id = c->worker(w).Declare("t" + std::to_string(t), sizes[t], DType::kFloat32);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ids[w].push_back(*id);
    }
  }
  std::vector<std::vector<KeyReference>> refs(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) {
    const size_t align = compressors::PartitionAlign(config);
    auto parts = PartitionTensor(static_cast<uint32_t>(t), sizes[t], DType::kFloat32,
                                 kPartitionFloats * sizeof(float), align);
    ASSERT_TRUE(parts.ok());
    for (const PartitionRange& p : *parts) {
      KeyReference k;
      k.key = p.key;
      k.elements = p.elements;
      k.compressor = std::move(compressors::CreateCompressor(config)).value();
      for (uint32_t w = 0; w < workers; ++w) {
        k.workers.push_back(compressors::WorkerKeepsResidual(ef)
                                ? std::move(compressors::CreateErrorFeedback(
                                                config, ErrorFeedbackSide::kWorker, p.elements))
                                      .value()
                                : nullptr);
      }
      if (compressors::ServerKeepsResidual(ef)) {
        k.server = std::move(compressors::CreateErrorFeedback(config, ErrorFeedbackSide::kServer,
                                                              p.elements))
                       .value();
      }
      refs[t].push_back(std::move(k));
    }
  }
  for (uint64_t round = 0; round < rounds; ++round) {
    // grads[t][w], outputs[t][w]; the reference's expected[t][w].
    std::vector<std::vector<std::vector<float>>> grads(sizes.size()), outs(sizes.size()),
        expected(sizes.size());
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (uint32_t w = 0; w < workers; ++w) {
        std::vector<float> g = RandomFloats(sizes[t], 9000 + 100 * round + 10 * t + w);
        // A common direction under the noise, so the signs and projections carry signal.
        for (size_t i = 0; i < g.size(); ++i) g[i] += (i % 3 == 0 ? 0.5f : -0.25f);
        grads[t].push_back(std::move(g));
        outs[t].emplace_back(sizes[t], -7.0f);
        expected[t].emplace_back(sizes[t], -9.0f);
      }
      size_t at = 0;
      for (KeyReference& k : refs[t]) {
        std::vector<const float*> g;
        std::vector<float*> o;
        for (uint32_t w = 0; w < workers; ++w) {
          g.push_back(grads[t][w].data() + at);
          o.push_back(expected[t][w].data() + at);
        }
        k.Round(round, g, o);
        at += k.elements;
      }
    }
    OnEveryWorker(workers, [&](uint32_t w) {
      std::vector<PushPullHandle> handles;
      for (size_t t = 0; t < sizes.size(); ++t) {
        handles.push_back(c->worker(w).PushPull(ids[w][t],
                                                ConstTensorView(grads[t][w].data(), sizes[t]),
                                                TensorView(outs[t][w].data(), sizes[t])));
      }
      for (PushPullHandle& h : handles) {
        const Status s = h.Wait();
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
    });
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (uint32_t w = 0; w < workers; ++w) {
        ASSERT_EQ(Bits(outs[t][w].data(), sizes[t]), Bits(expected[t][w].data(), sizes[t]))
            << "tensor " << t << " worker " << w << " round " << round;
      }
    }
  }
  // The servers never decoded a push: every push was accepted and combined as it came.
  EXPECT_TRUE(c->Shutdown().ok());
}

TEST(CompressedDomainE2e, SeparateEveryWorkerDecodesWhatThePiecesGiveBitForBit) {
  // The stable convention with resets inside the run, and the printed one.
  ExpectDistributedEqualsPieces("separate:ratio=16,block=256,reset=3", "worker", 3, 7);
  ExpectDistributedEqualsPieces("separate:ratio=4,block=64,ema=printed,beta=0.1", "worker", 2, 4);
  ExpectDistributedEqualsPieces("separate:ratio=8,block=128", "none", 2, 3);
}

TEST(CompressedDomainE2e, BinsgdmEveryWorkerDecodesWhatThePiecesGiveBitForBit) {
  ExpectDistributedEqualsPieces("binsgdm", "both", 3, 6);
  ExpectDistributedEqualsPieces("binsgdm:beta=0.9,seed=5", "worker", 2, 4);
}

// Paper 004's Algorithm 1 in one process (optimizers::BinsgdmReference, written apart from the
// kernels) against the distributed run: 3 workers, a tensor of three keys over two servers,
// every worker applying x <- x * float(1 - lr * wd) - lr * u to the signs it pulls, with a
// decaying lr: every worker's x equals the reference's bit for bit after every round.
TEST(CompressedDomainE2e, BinsgdmDistributedEqualsTheSingleProcessAlgorithm1) {
  const uint32_t workers = 3;
  const size_t n = 2600;
  auto c = MakeCluster(workers, "binsgdm:beta=0.9,eps=1e-08,seed=11", "both");
  ASSERT_TRUE(c->Start().ok());
  std::vector<TensorId> ids;
  for (uint32_t w = 0; w < workers; ++w) {
    auto id = c->worker(w).Declare("x", n, DType::kFloat32);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(*id);
  }
  optimizers::BinsgdmReference::Options ro;
  ro.beta = 0.9;
  ro.eps = 1e-8;
  ro.seed = 11;
  ro.workers = workers;
  optimizers::BinsgdmReference ref(ro);
  const std::vector<float> x0 = RandomFloats(n, 5);
  std::vector<float> xref = x0;
  std::vector<std::vector<float>> x(workers, x0);
  const double wd = 0.01;
  auto parts = PartitionTensor(0, n, DType::kFloat32, kPartitionFloats * sizeof(float));
  ASSERT_TRUE(parts.ok());
  for (uint64_t round = 0; round < 6; ++round) {
    const float lr = 0.05f / static_cast<float>(round + 1);
    std::vector<std::vector<float>> grads;
    for (uint32_t w = 0; w < workers; ++w) {
      std::vector<float> g = RandomFloats(n, 300 + 10 * round + w);
      for (size_t i = 0; i < n; ++i) g[i] += 0.2f * (x[w][i] - 0.1f);  // depends on x
      grads.push_back(std::move(g));
    }
    for (const PartitionRange& p : *parts) {
      std::vector<const float*> g;
      for (uint32_t w = 0; w < workers; ++w) g.push_back(grads[w].data() + p.offset);
      ASSERT_TRUE(ref.Step(p.key, round, g, p.elements, xref.data() + p.offset, lr, wd).ok());
    }
    OnEveryWorker(workers, [&](uint32_t w) {
      std::vector<float> u(n);
      const Status s =
          c->worker(w)
              .PushPull(ids[w], ConstTensorView(grads[w].data(), n), TensorView(u.data(), n))
              .Wait();
      EXPECT_TRUE(s.ok()) << s.ToString();
      const float mult = static_cast<float>(1.0 - static_cast<double>(lr) * wd);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_TRUE(u[i] == 1.0f || u[i] == -1.0f) << i;
        const float scaled = x[w][i] * mult;
        const float step = lr * u[i];
        x[w][i] = scaled - step;
      }
    });
    for (uint32_t w = 0; w < workers; ++w) {
      ASSERT_EQ(Bits(x[w].data(), n), Bits(xref.data(), n)) << "worker " << w << " round " << round;
    }
  }
  EXPECT_TRUE(c->Shutdown().ok());
}

TEST(CompressedDomainE2e, ServerSideOptimizerKeysOfACompressedDomainMethodAreRefused) {
  testing::TestClusterOptions t;
  t.source = "compressed_domain_e2e_test";
  t.compression.spec = "binsgdm";
  t.compression.error_feedback = "both";
  t.compression.min_compress_bytes = 1024;
  t.compression.partition_bytes = kPartitionFloats * sizeof(float);
  t.worker.op_timeout = milliseconds(5000);
  testing::ThreadClusterOptions o;
  o.config = testing::TestClusterConfig(t);
  o.config.optimizer.placement = "server";
  testing::ThreadCluster c(std::move(o));
  ASSERT_TRUE(c.Start().ok());
  TensorOptions to;
  to.server_optimizer = ServerOptimizerOptions{};
  to.server_optimizer->rule = "sgd";
  auto id = c.worker(0).Declare("w", 4096, DType::kFloat32, to);
  Status s = id.status();
  if (s.ok()) {
    std::vector<float> w(4096, 0.5f);
    s = c.worker(0).InitServerWeights(*id, TensorView(w.data(), w.size()));
  }
  EXPECT_FALSE(s.ok());
  EXPECT_CONTAINS(s.ToString(), "servers never see its gradients");
  c.Close();
}

}  // namespace
}  // namespace bitpush::worker
