// push_pull end to end with threads as nodes: a Scheduler thread, S server::Server objects and
// W worker::Client objects in one process over the inproc transport (one InprocHub per test
// cluster). The pulled results are compared BIT-EXACTLY with a reference computed here from the
// same compressor functions (paper 001 Algorithms 3 and 4):
//   per partition (key = tensor << 32 | j) and round r, with CompressContext{key, r}:
//     push_w    = C_w(x_w)  (CompressWithFeedback with the worker residual when the tensor is
//                            compressed and error_feedback is worker/both)
//     Δ         = (Σ_{w=0..n-1} DecompressAdd(push_w)) · (1/n)   fp32, rank order; no scaling
//                            for the sum op or n = 1
//     aggregate = C_s(Δ)    (with the server residual when error_feedback is server/both)
//     output    = Decompress(aggregate), rounded to the tensor's dtype.
// Also: mixed sizes (0 elements, below/above min_compress_bytes, partial partitions), fp16 and
// bf16 tensors, priorities under a small credit, the sum op, 200 rounds with stable memory,
// declaration checks, validation, op_timeout, a dead server, Close.
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_features.h"
#include "common/transport/factory.h"
#include "common/vector_ops.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_client.h"
#include "server/server.h"
#include "tests/harness/faulty_transport.h"
#include "tests/harness/manual_clock.h"
#include "tests/harness/reference_model.h"
#include "tests/harness/test_cluster.h"
#include "tests/unit/test_util.h"
#include "worker/checkpoint.h"
#include "worker/client.h"
#include "worker/engine.h"
#include "worker/partition.h"

namespace bitpush::worker {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

// ---------------------------------------------------------------------------------------------
// A threads-as-nodes cluster of real Servers and Clients.

struct ClusterOptions {
  uint32_t workers = 1;
  uint32_t servers = 1;
  std::string spec = "none";
  std::string error_feedback = "none";
  std::vector<config::CompressionSettings::Override> overrides;
  uint64_t min_compress_bytes = 2048;
  uint64_t partition_bytes = 4096;
  uint64_t credit_bytes = 64ull << 20;
  uint64_t raw_partition_bytes = 0;  // auto
  uint64_t server_window_bytes = 0;  // auto
  milliseconds op_timeout{20000};
  uint32_t compress_threads = 1;
  // false: the test brings its own server endpoints (FakeServer).
  bool start_servers = true;
  // Long enough that a sanitizer build under a parallel ctest (a whole process stalled for most
  // of a second) is not a failed node; the tests that time a detection use this same value.
  milliseconds heartbeat_timeout{2000};
  // The workers' clock; null = the system clock.
  std::shared_ptr<const bitpush::Clock> worker_clock;
};

// The e2e tests' cluster: testing::ThreadCluster (tests/harness/test_cluster.h) built from
// ClusterOptions.
class TestCluster {
 public:
  explicit TestCluster(const ClusterOptions& o) : options_(o), cluster_(ThreadOptions(o)) {}

  Status Start() { return cluster_.Start(); }
  Status Shutdown() { return cluster_.Shutdown(milliseconds(10000)); }
  void Close() { cluster_.Close(); }

  Client& worker(uint32_t w) { return cluster_.worker(w); }
  const config::ClusterConfig& config() const { return cluster_.config(); }
  const std::shared_ptr<transport::InprocHub>& hub() const { return cluster_.hub(); }
  server::Server& server(uint32_t s) { return cluster_.server(s); }
  const ClusterOptions& options() const { return options_; }

 private:
  static testing::ThreadClusterOptions ThreadOptions(const ClusterOptions& o) {
    testing::TestClusterOptions t;
    t.source = "pushpull_e2e_test";
    t.servers = o.servers;
    t.workers = o.workers;
    t.heartbeat_interval = milliseconds(50);
    t.heartbeat_timeout = o.heartbeat_timeout;
    t.startup_timeout = milliseconds(5000);
    t.compression.spec = o.spec;
    t.compression.error_feedback = o.error_feedback;
    t.compression.overrides = o.overrides;
    t.compression.min_compress_bytes = o.min_compress_bytes;
    // Small tensors exercise every kernel through the engine, below a method's minimum too.
    t.compression.method_minimum = false;
    t.compression.partition_bytes = o.partition_bytes;
    t.server.engine_threads = 1;
    t.server.numa = config::NumaMode::kOff;
    t.worker.compress_threads = o.compress_threads;
    t.worker.credit_bytes = o.credit_bytes;
    t.worker.server_window_bytes = o.server_window_bytes;
    t.compression.raw_partition_bytes = o.raw_partition_bytes;
    t.worker.op_timeout = o.op_timeout;
    testing::ThreadClusterOptions c;
    c.config = testing::TestClusterConfig(t);
    c.start_servers = o.start_servers;
    c.worker_clock = o.worker_clock;
    return c;
  }

  const ClusterOptions options_;
  testing::ThreadCluster cluster_;
};

// Runs fn(w) on one thread per worker and joins them.
void OnEveryWorker(uint32_t workers, const std::function<void(uint32_t)>& fn) {
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < workers; ++w) threads.emplace_back(fn, w);
  for (std::thread& t : threads) t.join();
}

// ---------------------------------------------------------------------------------------------
// The reference: tests/harness/reference_model.h, the same compressor functions applied here.

struct TensorDecl {
  std::string name;
  size_t elements = 0;
  DType dtype = DType::kFloat32;
  std::string spec;  // "" = the cluster's
  int64_t priority = 0;
  ReduceOp op = ReduceOp::kAverage;
};

// The reference tensor of declaration `index` in a cluster of these options.
testing::ReferenceTensor MakeReference(const TensorDecl& d, uint32_t index,
                                       const ClusterOptions& o) {
  testing::ReferenceTensorOptions r;
  r.spec = d.spec.empty() ? o.spec : d.spec;
  r.error_feedback = o.error_feedback;
  r.min_compress_bytes = o.min_compress_bytes;
  r.method_minimum = false;
  r.partition_bytes = o.partition_bytes;
  r.index = index;
  r.elements = d.elements;
  r.dtype = d.dtype;
  r.nodes = o.workers;
  r.average = d.op == ReduceOp::kAverage;
  StatusOr<testing::ReferenceTensor> made = testing::ReferenceTensor::Create(r);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return std::move(made).value();
}

// Deterministic input of worker w, tensor t, round r, as raw bytes of the dtype.
std::vector<uint8_t> MakeInput(const TensorDecl& d, uint32_t w, size_t t, uint64_t r) {
  return testing::ReferenceInput(w + 1, t, r, d.elements, d.dtype);
}

// Declares `decls` on every worker (in order), runs `rounds` push_pulls of all of them on every
// worker at once and checks every output bit-exactly against the reference.
void RunAndCompare(TestCluster& c, const std::vector<TensorDecl>& decls, int rounds,
                   const std::function<void(int)>& after_round = nullptr) {
  const ClusterOptions& o = c.options();
  std::vector<testing::ReferenceTensor> ref;
  for (size_t t = 0; t < decls.size(); ++t) {
    ref.push_back(MakeReference(decls[t], static_cast<uint32_t>(t), o));
  }
  std::vector<std::vector<TensorId>> ids(o.workers);
  for (uint32_t w = 0; w < o.workers; ++w) {
    for (const TensorDecl& d : decls) {
      TensorOptions to;
      to.priority = d.priority;
      to.compression = d.spec;
      to.op = d.op;
      StatusOr<TensorId> id = c.worker(w).Declare(d.name, d.elements, d.dtype, to);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ids[w].push_back(*id);
    }
  }
  // outputs[w][t], reused across rounds.
  std::vector<std::vector<std::vector<uint8_t>>> outputs(o.workers);
  for (uint32_t w = 0; w < o.workers; ++w) {
    for (const TensorDecl& d : decls) outputs[w].emplace_back(d.elements * DTypeSize(d.dtype));
  }
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::vector<std::vector<uint8_t>>> inputs(o.workers);  // [w][t]
    std::vector<std::vector<uint8_t>> expected;
    for (uint32_t w = 0; w < o.workers; ++w) {
      for (size_t t = 0; t < decls.size(); ++t) inputs[w].push_back(MakeInput(decls[t], w, t, r));
    }
    for (size_t t = 0; t < decls.size(); ++t) {
      std::vector<std::vector<uint8_t>> per_worker;
      for (uint32_t w = 0; w < o.workers; ++w) per_worker.push_back(inputs[w][t]);
      StatusOr<std::vector<uint8_t>> want = ref[t].Round(per_worker);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      expected.push_back(std::move(want).value());
    }
    std::vector<std::string> errors(o.workers);
    OnEveryWorker(o.workers, [&](uint32_t w) {
      std::vector<PushPullHandle> handles;
      for (size_t t = 0; t < decls.size(); ++t) {
        const TensorDecl& d = decls[t];
        handles.push_back(c.worker(w).PushPull(
            ids[w][t], ConstTensorView(inputs[w][t].data(), d.elements, d.dtype),
            TensorView(outputs[w][t].data(), d.elements, d.dtype)));
      }
      for (size_t t = 0; t < handles.size(); ++t) {
        const Status s = handles[t].Wait();
        if (!s.ok() && errors[w].empty()) errors[w] = decls[t].name + ": " + s.ToString();
      }
    });
    for (uint32_t w = 0; w < o.workers; ++w) {
      ASSERT_TRUE(errors[w].empty()) << "worker " << w << " round " << r << ": " << errors[w];
      for (size_t t = 0; t < decls.size(); ++t) {
        ASSERT_EQ(outputs[w][t].size(), expected[t].size());
        ASSERT_TRUE(expected[t].empty() ||
                    std::memcmp(outputs[w][t].data(), expected[t].data(), expected[t].size()) == 0)
            << "worker " << w << " tensor '" << decls[t].name << "' (" << decls[t].spec
            << ") round " << r << " differs from the reference";
      }
    }
    if (after_round) after_round(r);
  }
}

// Starts a TestCluster or fails the test with the reason.
#define ASSERT_STARTED(cluster)                        \
  do {                                                 \
    const Status started_ = (cluster).Start();         \
    ASSERT_TRUE(started_.ok()) << started_.ToString(); \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Every compressor, W x S, Algorithms 3 and 4.

struct E2eParam {
  uint32_t workers;
  uint32_t servers;
  std::string error_feedback;  // "none" = Algorithm 3, "both" = Algorithm 4
};

class EveryCompressor : public ::testing::TestWithParam<E2eParam> {};

std::vector<std::string> SpecsFor(const std::string& error_feedback) {
  std::vector<std::string> specs = {"none",
                                    "fp16",
                                    "bf16",
                                    "onebit",
                                    "onebit:scaled=false",
                                    "topk:ratio=0.01",
                                    "topk:k=7",
                                    "dithering:levels=15,partition=linear,norm=max",
                                    "dithering:levels=7,partition=natural,norm=l2,seed=3"};
  // random-k: unscaled with error feedback, unbiased (scaled) without.
  specs.push_back(error_feedback == "none" ? "randomk:ratio=0.03125,unbiased=true,seed=7"
                                           : "randomk:ratio=0.03125,seed=7");
  // LoCo: its own error state on the sides the policy names (the server's only where it
  // replies in LoCo's 4 bits), resets every 3 rounds; per-block scales with 16-bit pulls.
  specs.push_back("loco:scale=4,beta=0.5,reset=3");
  specs.push_back("loco:block=64,pull=fp16");
  // SDP4Bit runs without error feedback (the other policies refuse it).
  if (error_feedback == "none") {
    specs.push_back("sdp4bit:seed=5");
    specs.push_back("sdp4bit:bits=8,group=64,hadamard=off,pull=fp32");
  }
  // separate: servers sum projections (compressed domain); its error feedback lives on the
  // workers only (server and both refuse it), reset every 3 rounds.
  if (error_feedback == "none" || error_feedback == "worker") {
    specs.push_back("separate:ratio=4,block=64,reset=3,seed=5");
    specs.push_back("separate:block=100,beta=0.9,ema=printed,reset=0");
  }
  return specs;
}

TEST_P(EveryCompressor, PulledResultIsTheReferenceBitForBit) {
  const E2eParam& p = GetParam();
  ClusterOptions o;
  o.workers = p.workers;
  o.servers = p.servers;
  o.error_feedback = p.error_feedback;
  TestCluster c(o);
  ASSERT_STARTED(c);
  std::vector<TensorDecl> decls;
  for (const std::string& spec : SpecsFor(p.error_feedback)) {
    // 2500 fp32 = 10000 bytes >= min_compress_bytes: 3 partitions (1024, 1024, 452).
    decls.push_back(TensorDecl{"t." + spec, 2500, DType::kFloat32, spec});
    // fp16: 5000 x 2 bytes, 3 partitions (2048, 2048, 904); the server sums in fp32 and
    // replies in fp16 (fused and unfused rounds alike).
    decls.push_back(TensorDecl{"h." + spec, 5000, DType::kFloat16, spec});
  }
  RunAndCompare(c, decls, 4);
  EXPECT_TRUE(c.Shutdown().ok());
  const ClientStats s = c.worker(0).stats();
  EXPECT_EQ(s.ops_completed, 4 * decls.size());
  EXPECT_EQ(s.ops_failed, 0u);
  EXPECT_EQ(s.partitions_pushed, 4 * 3 * decls.size());
}

INSTANTIATE_TEST_SUITE_P(WorkersServersAlgorithms, EveryCompressor,
                         ::testing::Values(E2eParam{1, 1, "none"}, E2eParam{1, 1, "both"},
                                           E2eParam{1, 2, "none"}, E2eParam{1, 2, "both"},
                                           E2eParam{2, 1, "none"}, E2eParam{2, 1, "both"},
                                           E2eParam{2, 2, "none"}, E2eParam{2, 2, "both"},
                                           E2eParam{4, 1, "none"}, E2eParam{4, 1, "both"},
                                           E2eParam{4, 2, "none"}, E2eParam{4, 2, "both"},
                                           // Worker-only and server-only error feedback, once each.
                                           E2eParam{2, 2, "worker"}, E2eParam{2, 2, "server"}),
                         [](const ::testing::TestParamInfo<E2eParam>& info) {
                           return "W" + std::to_string(info.param.workers) + "_S" +
                                  std::to_string(info.param.servers) + "_ef_" +
                                  info.param.error_feedback;
                         });

TEST(PushPullE2e, NoneGivesTheExactAverage) {
  ClusterOptions o;
  o.workers = 4;
  o.servers = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 3000;
  std::vector<std::vector<float>> in(4), out(4, std::vector<float>(n));
  for (uint32_t w = 0; w < 4; ++w) in[w] = testing::RandomFloats(n, 11 + w);
  std::vector<TensorId> ids(4);
  for (uint32_t w = 0; w < 4; ++w) ids[w] = c.worker(w).Declare("g", n, DType::kFloat32).value();
  std::vector<Status> st(4);
  OnEveryWorker(4, [&](uint32_t w) {
    st[w] = c.worker(w)
                .PushPull(ids[w], ConstTensorView(in[w].data(), n), TensorView(out[w].data(), n))
                .Wait();
  });
  for (uint32_t w = 0; w < 4; ++w) {
    ASSERT_TRUE(st[w].ok()) << st[w].ToString();
    for (size_t i = 0; i < n; ++i) {
      const float avg = (((0.0f + in[0][i]) + in[1][i]) + in[2][i] + in[3][i]) * 0.25f;
      ASSERT_EQ(out[w][i], avg) << "worker " << w << " element " << i;
    }
  }
  EXPECT_TRUE(c.Shutdown().ok());
}

// A NaN or inf in one worker's gradient fails that round on every worker, naming the tensor,
// the partition, the round and the worker it came from; the round before it is unaffected.
// onebit sees it in its own sign pass (the scale's sum) and sdp4bit in its group scales; none,
// topk and fp16 through the engine's read pass.
class NonFinite : public ::testing::TestWithParam<std::string> {};

TEST_P(NonFinite, OneWorkersNanFailsTheRoundOnEveryWorkerNamingItsOrigin) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  o.spec = GetParam();
  o.error_feedback = GetParam() == "onebit" ? "both" : "none";
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 3000;  // three partitions (4096-byte partitions: 1024 elements)
  std::vector<std::vector<float>> in(2), out(2, std::vector<float>(n));
  std::vector<TensorId> ids(2);
  for (uint32_t w = 0; w < 2; ++w) {
    in[w] = testing::RandomFloats(n, 31 + w);
    ids[w] = c.worker(w).Declare("layer.weight", n, DType::kFloat32).value();
  }
  std::vector<Status> st(2);
  auto round = [&] {
    OnEveryWorker(2, [&](uint32_t w) {
      st[w] = c.worker(w)
                  .PushPull(ids[w], ConstTensorView(in[w].data(), n), TensorView(out[w].data(), n))
                  .Wait();
    });
  };
  round();  // round 0: finite everywhere
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(st[w].ok()) << st[w].ToString();
  // Round 1: worker 1's gradient, element 1234 of 3000 (partition 1 of 1024-element
  // partitions): a NaN, or for the casts an inf.
  const bool cast = GetParam() == "none" || GetParam() == "fp16";
  in[1][1234] =
      cast ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  round();
  for (uint32_t w = 0; w < 2; ++w) {
    SCOPED_TRACE("worker " + std::to_string(w));
    ASSERT_FALSE(st[w].ok());
    EXPECT_EQ(st[w].code(), StatusCode::kOutOfRange) << st[w].ToString();
    const std::string& m = st[w].message();
    EXPECT_NE(m.find("non-finite values (NaN or inf) in tensor 'layer.weight' partition 1 (key "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(", round 1): worker 1's gradient"), std::string::npos) << m;
    EXPECT_EQ(c.worker(w).stats().non_finite_rounds, 1u);
  }
  EXPECT_EQ(c.worker(1).stats().non_finite_pushes, 1u);
  EXPECT_EQ(c.worker(0).stats().non_finite_pushes, 0u);
  EXPECT_EQ(c.server(0).stats().non_finite_rounds + c.server(1).stats().non_finite_rounds, 1u);
  EXPECT_TRUE(c.Shutdown().ok());
}

INSTANTIATE_TEST_SUITE_P(PushPullE2e, NonFinite,
                         ::testing::Values("none", "onebit", "sdp4bit", "topk:ratio=0.1", "fp16"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param.substr(0, i.param.find(':'));
                         });

// Close while WaitForServers waits (no server missing, so it waits for a verdict up to two
// heartbeat timeouts): the wait ends at once with Cancelled naming the close, not when its
// timeout runs out.
TEST(PushPullE2e, CloseWakesWaitForServersAtOnce) {
  ClusterOptions o;
  o.heartbeat_timeout = milliseconds(15000);
  TestCluster c(o);
  ASSERT_STARTED(c);
  Status waited;
  Clock::time_point returned;
  std::thread waiter([&] {
    waited = c.worker(0).WaitForServers(milliseconds(60000));
    returned = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(300));
  const Clock::time_point closed = Clock::now();
  c.worker(0).Close();
  waiter.join();
  EXPECT_EQ(waited.code(), StatusCode::kCancelled) << waited.ToString();
  EXPECT_CONTAINS(waited.message(), "closed");
  EXPECT_LT(returned - closed, milliseconds(5000));
  c.Close();
}

// SDP4Bit with an identity quantiser: inputs whose Hadamard transform is a vector of integer
// codes in [-7, 7] with a +-7 in every group quantise exactly (scale 1, no fraction to round),
// so the whole path — forward transform, INT4 push, the server's Hadamard-domain sum and
// average, one inverse transform, fp32 reply — equals the exact average, for several worker and
// server counts (the workers' counts are powers of two, so the average is exact too).
TEST(PushPullE2e, Sdp4bitWithExactCodesGivesTheExactAverage) {
  const size_t n = 5 * 1024 + 96;  // several partitions of 1024, a partial last group
  for (uint32_t workers : {1u, 2u, 4u}) {
    for (uint32_t servers : {1u, 2u}) {
      SCOPED_TRACE(::testing::Message() << workers << " workers, " << servers << " servers");
      ClusterOptions o;
      o.workers = workers;
      o.servers = servers;
      o.spec = "sdp4bit:pull=fp32,seed=3";
      TestCluster c(o);
      ASSERT_STARTED(c);
      std::vector<std::vector<float>> in(workers), out(workers, std::vector<float>(n));
      for (uint32_t w = 0; w < workers; ++w) {
        // Codes per element of the transformed vector, +-7 at the start of every group of 128.
        std::vector<float> codes(n);
        for (size_t i = 0; i < n; ++i) {
          codes[i] = i % 128 == 0 ? (w % 2 ? -7.0f : 7.0f)
                                  : static_cast<float>(static_cast<int>((i * 7 + w * 3) % 15) - 7);
        }
        // x = (H32 codes) / 32 per block: exact in fp32 (integer sums, a power-of-two divide).
        in[w].resize(n);
        for (size_t b = 0; b < n; b += 32) {
          for (size_t r = 0; r < 32; ++r) {
            float sum = 0;
            for (size_t k = 0; k < 32; ++k) {
              sum += (__builtin_popcount(static_cast<unsigned>(r & k)) % 2 ? -1.0f : 1.0f) *
                     codes[b + k];
            }
            in[w][b + r] = sum / 32.0f;
          }
        }
      }
      std::vector<TensorId> ids(workers);
      for (uint32_t w = 0; w < workers; ++w) {
        ids[w] = c.worker(w).Declare("g", n, DType::kFloat32).value();
      }
      std::vector<Status> st(workers);
      OnEveryWorker(workers, [&](uint32_t w) {
        st[w] =
            c.worker(w)
                .PushPull(ids[w], ConstTensorView(in[w].data(), n), TensorView(out[w].data(), n))
                .Wait();
      });
      for (uint32_t w = 0; w < workers; ++w) {
        ASSERT_TRUE(st[w].ok()) << st[w].ToString();
        for (size_t i = 0; i < n; ++i) {
          double avg = 0;
          for (uint32_t v = 0; v < workers; ++v) avg += in[v][i];
          avg /= workers;
          ASSERT_EQ(out[w][i], static_cast<float>(avg)) << "worker " << w << " element " << i;
        }
      }
      EXPECT_TRUE(c.Shutdown().ok());
    }
  }
}

TEST(PushPullE2e, LocoTelemetryReachesWorkerAndServerStats) {
  // loco with scale 1: an input of 100 in element 0 saturates the 4-bit code (7) and the int8
  // error (error_scale 1: 93 fits, so 300 is used for the error to clamp at 127); the other
  // elements are 0.25 (code 0, error 0.25 -> int8 0).
  ClusterOptions o;
  o.spec = "loco:scale=1,error_scale=1,beta=1,reset=0";
  o.error_feedback = "both";
  o.min_compress_bytes = 0;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 1000;  // one partition (4096-byte partitions: 1024 elements)
  std::vector<float> x(n, 0.25f), out(n);
  x[0] = 300.0f;
  const TensorId id = c.worker(0).Declare("w", n, DType::kFloat32, 0, "").value();
  ASSERT_TRUE(c.worker(0)
                  .PushPull(id, ConstTensorView(x.data(), n), TensorView(out.data(), n))
                  .Wait()
                  .ok());
  const ClientStats s = c.worker(0).stats();
  EXPECT_EQ(s.quantized_values, n);
  EXPECT_EQ(s.quantized_saturated, 1u);
  EXPECT_EQ(s.error_values, n);
  EXPECT_EQ(s.error_saturated, 1u);
  EXPECT_DOUBLE_EQ(s.error_norm, 127.0);
  // The server replied in LoCo's 4 bits through its own error (two-hop): the aggregate (7 in
  // element 0) quantises without saturating.
  const server::ServerStats ss = c.server(0).stats();
  EXPECT_EQ(ss.quantized_values, n);
  EXPECT_EQ(ss.quantized_saturated, 0u);
  EXPECT_EQ(ss.error_values, n);
  EXPECT_EQ(out[0], 7.0f);
  EXPECT_TRUE(c.Shutdown().ok());
}

TEST(PushPullE2e, LocoSaturationIsWarnedOncePerTensorAtAFixedScaleAndNotAtTheDefault) {
  // Gradient-like values (normal, sigma 1e-3): the fixed scale 2^19 clamps nearly all of
  // them (7 / 2^19 = 1.3e-5); scale 2^10 clamps one in 1000 (below the 5 % threshold); the
  // default (block=256) clamps none. Rank 0 logs one line for 'sat' only, however many rounds.
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  auto logger = spdlog::default_logger();
  const spdlog::level::level_enum level = logger->level();
  logger->set_level(spdlog::level::warn);
  logger->sinks().push_back(sink);
  ClusterOptions o;
  o.error_feedback = "both";
  o.min_compress_bytes = 0;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 1000;
  std::vector<float> x = testing::RandomFloats(n, 31, 1e-3f), few(n, 1e-4f), out(n);
  few[0] = 1.0f;
  uint64_t values = 0, saturated = 0;
  for (const auto& [name, spec] : {std::pair<std::string, std::string>{"sat", "loco:scale=524288"},
                                   {"few", "loco:scale=1024"},
                                   {"default", "loco"}}) {
    const TensorId id = c.worker(0).Declare(name, n, DType::kFloat32, 0, spec).value();
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(c.worker(0)
                      .PushPull(id, ConstTensorView((name == "few" ? few : x).data(), n),
                                TensorView(out.data(), n))
                      .Wait()
                      .ok());
    }
    const ClientStats s = c.worker(0).stats();
    if (name == "default") {
      EXPECT_EQ(s.quantized_values - values, 3 * n);
      EXPECT_EQ(s.quantized_saturated - saturated, 0u);  // the absmax scale never clamps
    }
    values = s.quantized_values;
    saturated = s.quantized_saturated;
  }
  EXPECT_TRUE(c.Shutdown().ok());
  logger->sinks().pop_back();
  logger->set_level(level);
  std::vector<std::string> warned;
  for (const std::string& line : sink->last_formatted()) {
    if (line.find("4-bit values") != std::string::npos) warned.push_back(line);
  }
  ASSERT_EQ(warned.size(), 1u) << (warned.empty() ? "" : warned[0]);
  EXPECT_NE(warned[0].find("worker 0: loco: "), std::string::npos) << warned[0];
  EXPECT_NE(warned[0].find("of tensor 'sat' saturate at scale=2^19"), std::string::npos)
      << warned[0];
  EXPECT_NE(warned[0].find("use loco:block=256"), std::string::npos) << warned[0];
}

TEST(PushPullE2e, PerTensorOverrideByNamePatternPicksTheSpec) {
  // compression.overrides: '*.bias' goes uncompressed (one worker: the exact input comes
  // back), everything else takes the cluster's onebit (signs times a scale: not the input); an
  // explicit spec at Declare wins over the patterns.
  ClusterOptions o;
  o.spec = "onebit";
  o.overrides = {{"*.bias", "none"}};
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 3000;
  const std::vector<float> x = testing::RandomFloats(n, 21);
  auto round = [&](const std::string& name, const std::string& spec) {
    std::vector<float> out(n);
    const TensorId id = c.worker(0).Declare(name, n, DType::kFloat32, 0, spec).value();
    EXPECT_TRUE(c.worker(0)
                    .PushPull(id, ConstTensorView(x.data(), n), TensorView(out.data(), n))
                    .Wait()
                    .ok());
    return out == x;
  };
  EXPECT_TRUE(round("fc.bias", ""));
  EXPECT_FALSE(round("fc.weight", ""));
  EXPECT_FALSE(round("head.bias", "onebit"));
  EXPECT_TRUE(c.Shutdown().ok());
}

TEST(PushPullE2e, ErrorFeedbackStateSavedAndRestoredContinuesBitForBit) {
  // Cluster A runs rounds x1, x2; cluster B starts from A's worker residual after x1 and runs
  // x2: the same output and the same residual after, bit for bit (onebit is deterministic and
  // with error_feedback "worker" the server keeps no state but the round).
  ClusterOptions o;
  o.spec = "onebit";
  o.error_feedback = "worker";
  const size_t n = 3000;  // 3 partitions of 4096 bytes, compressed
  const std::vector<float> x1 = testing::RandomFloats(n, 5), x2 = testing::RandomFloats(n, 6);
  std::vector<float> out_a(n), out_b(n), saved, after_a;
  {
    TestCluster a(o);
    ASSERT_STARTED(a);
    const TensorId id = a.worker(0).Declare("g", n, DType::kFloat32).value();
    const TensorId small = a.worker(0).Declare("bias", 10, DType::kFloat32).value();
    StatusOr<std::vector<float>> zero = a.worker(0).ErrorFeedbackState(id);
    ASSERT_TRUE(zero.ok()) << zero.status().ToString();
    EXPECT_EQ(*zero, std::vector<float>(n, 0.0f));
    ASSERT_TRUE(a.worker(0)
                    .PushPull(id, ConstTensorView(x1.data(), n), TensorView(out_a.data(), n))
                    .Wait()
                    .ok());
    saved = a.worker(0).ErrorFeedbackState(id).value();
    ASSERT_EQ(saved.size(), n);
    size_t nonzero = 0;
    for (float e : saved) nonzero += e != 0.0f;
    EXPECT_GT(nonzero, n / 2);  // x - s·sign(x) is rarely 0
    ASSERT_TRUE(a.worker(0)
                    .PushPull(id, ConstTensorView(x2.data(), n), TensorView(out_a.data(), n))
                    .Wait()
                    .ok());
    after_a = a.worker(0).ErrorFeedbackState(id).value();
    // Below min_compress_bytes: no residual, and none can be restored into it.
    EXPECT_TRUE(a.worker(0).ErrorFeedbackState(small).value().empty());
    EXPECT_TRUE(a.worker(0).RestoreErrorFeedbackState(small, {}).ok());
    EXPECT_CONTAINS(a.worker(0).RestoreErrorFeedbackState(small, saved).ToString(),
                    "it keeps no worker residual");
    EXPECT_CONTAINS(
        a.worker(0).RestoreErrorFeedbackState(id, Span<const float>(saved.data(), 7)).ToString(),
        "7 values given, the tensor has 3000");
    EXPECT_CONTAINS(a.worker(0).ErrorFeedbackState(TensorId{9}).status().ToString(),
                    "no tensor #9");
    EXPECT_TRUE(a.Shutdown().ok());
  }
  {
    TestCluster b(o);
    ASSERT_STARTED(b);
    const TensorId id = b.worker(0).Declare("g", n, DType::kFloat32).value();
    b.worker(0).Declare("bias", 10, DType::kFloat32).value();
    ASSERT_TRUE(b.worker(0).RestoreErrorFeedbackState(id, saved).ok());
    EXPECT_EQ(b.worker(0).ErrorFeedbackState(id).value(), saved);
    ASSERT_TRUE(b.worker(0)
                    .PushPull(id, ConstTensorView(x2.data(), n), TensorView(out_b.data(), n))
                    .Wait()
                    .ok());
    EXPECT_EQ(0, std::memcmp(out_a.data(), out_b.data(), n * sizeof(float)));
    EXPECT_EQ(b.worker(0).ErrorFeedbackState(id).value(), after_a);
    EXPECT_TRUE(b.Shutdown().ok());
  }
}

// ---------------------------------------------------------------------------------------------
// Mixed sizes, dtypes, priorities, credit, sum.

TEST(PushPullE2e, MixedSizesDtypesPrioritiesUnderASmallCredit) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  o.spec = "onebit";
  o.error_feedback = "both";
  o.credit_bytes = 8192;  // two fp32 partitions at most
  o.compress_threads = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const std::vector<TensorDecl> decls = {
      {"empty", 0, DType::kFloat32, "", 0},
      {"tiny.below_threshold", 100, DType::kFloat32, "", 3},        // uncompressed
      {"just_below", 511, DType::kFloat32, "topk:ratio=0.1", 1},    // 2044 bytes < 2048
      {"at_threshold", 512, DType::kFloat32, "topk:ratio=0.1", 1},  // 2048 bytes: compressed
      {"big.partial", 5000, DType::kFloat32, "", 5},  // 5 partitions, last 904 elements
      {"half.onebit", 3001, DType::kFloat16, "", 2},  // fp16: 2048 per partition
      {"half.below", 700, DType::kFloat16, "", 0},    // 1400 bytes: uncompressed fp16
      {"bf16.dither", 4100, DType::kBFloat16, "dithering:levels=3", 4},
      {"half.fp16cast", 2049, DType::kFloat16, "fp16", -1},
      {"later_priority_first", 1500, DType::kFloat32, "randomk:k=100", -5},
  };
  RunAndCompare(c, decls, 5);
  for (uint32_t w = 0; w < 2; ++w) {
    const ClientStats s = c.worker(w).stats();
    // The credit bounds the bytes in flight, exceeded by at most one partition (the first in
    // posting order always goes, so workers never deadlock on credit).
    EXPECT_LE(s.peak_bytes_in_flight, o.credit_bytes + 4096);
    EXPECT_GT(s.peak_bytes_in_flight, 0u);
    EXPECT_GT(s.bytes_pushed, 0u);
    EXPECT_GT(s.bytes_pulled, 0u);
    EXPECT_GT(s.compress_ns, 0u);
    EXPECT_GT(s.network_ns, 0u);
    EXPECT_GT(s.decompress_ns, 0u);
  }
  EXPECT_TRUE(c.Shutdown().ok());
}

// Regression: with the credit held until the reply, two workers that started different
// partitions (their push_pulls arrived at different moments, so priority picked differently)
// each held the credit for partitions the other had not pushed, and stalled until op_timeout.
TEST(PushPullE2e, CreditNeverDeadlocksWhenPrioritiesReverseThePostingOrder) {
  ClusterOptions o;
  o.workers = 4;
  o.servers = 2;
  o.spec = "onebit";
  o.credit_bytes = 4096;  // one partition
  o.compress_threads = 2;
  o.op_timeout = milliseconds(10000);
  TestCluster c(o);
  ASSERT_STARTED(c);
  std::vector<TensorDecl> decls;
  for (int i = 0; i < 8; ++i) {
    decls.push_back({"layer" + std::to_string(i), 3000, DType::kFloat32, "", -i});
  }
  RunAndCompare(c, decls, 10);
  EXPECT_TRUE(c.Shutdown().ok());
}

TEST(PushPullE2e, CreditSmallerThanAPartitionStillMovesOneAtATime) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 1;
  o.credit_bytes = 1;
  o.compress_threads = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  RunAndCompare(c, {{"a", 3000, DType::kFloat32, "onebit"}, {"b", 2000, DType::kFloat32, ""}}, 2);
  EXPECT_EQ(c.worker(0).stats().peak_bytes_in_flight, 4096u);  // one full partition
  EXPECT_TRUE(c.Shutdown().ok());
}

// The server window: raw partitions in flight at one server stay within
// worker.server_window_bytes (exceeded by at most the one partition that always goes), with
// priorities that differ per tensor and with one priority for all; every result bit for bit.
TEST(PushPullE2e, ServerWindowBoundsRawBytesAtEachServer) {
  for (const bool priorities : {true, false}) {
    for (const uint64_t window : {uint64_t{1}, uint64_t{3 * 4096}, uint64_t{64} << 20}) {
      SCOPED_TRACE("priorities " + std::to_string(priorities) + ", window " +
                   std::to_string(window));
      ClusterOptions o;
      o.workers = 3;
      o.servers = 2;
      o.server_window_bytes = window;
      o.compress_threads = 2;
      TestCluster c(o);
      ASSERT_STARTED(c);
      std::vector<TensorDecl> decls;
      for (int i = 0; i < 4; ++i) {  // 12 raw partitions of 4096 bytes each, a compressed one
        decls.push_back(
            {"raw" + std::to_string(i), 3 * 1024, DType::kFloat32, "", priorities ? -i : 0});
      }
      decls.push_back({"onebit", 8 * 1024, DType::kFloat32, "onebit", priorities ? 1 : 0});
      RunAndCompare(c, decls, 4);
      for (uint32_t w = 0; w < o.workers; ++w) {
        const ClientStats s = c.worker(w).stats();
        EXPECT_GE(s.peak_server_window_bytes, 4096u);
        EXPECT_LE(s.peak_server_window_bytes, std::max<uint64_t>(window, 4096) + 4096);
        if (window == 1) EXPECT_LE(s.peak_server_window_bytes, 2 * 4096u);
      }
      EXPECT_TRUE(c.Shutdown().ok());
    }
  }
}

TEST(PushPullE2e, SumReduceOp) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  o.error_feedback = "both";
  TestCluster c(o);
  ASSERT_STARTED(c);
  TensorDecl none{"sum.none", 2100, DType::kFloat32, "none"};
  none.op = ReduceOp::kSum;
  TensorDecl onebit{"sum.onebit", 2100, DType::kFloat32, "onebit"};
  onebit.op = ReduceOp::kSum;
  RunAndCompare(c, {none, onebit}, 3);
  EXPECT_TRUE(c.Shutdown().ok());
}

// 200 rounds; resident memory must not grow after warm-up (ASan's quarantine keeps freed
// memory resident, so there only the results are checked).
TEST(PushPullE2e, TwoHundredRoundsMemoryStable) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  o.spec = "onebit";
  o.error_feedback = "both";
  o.compress_threads = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  auto rss_bytes = [] {
    std::ifstream f("/proc/self/statm");
    uint64_t size = 0, resident = 0;
    f >> size >> resident;
    return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  };
  uint64_t warm = 0, peak = 0;
  RunAndCompare(c,
                {{"w1", 6000, DType::kFloat32, "", 1},
                 {"w2", 3000, DType::kFloat32, "topk:ratio=0.05", 0},
                 {"b", 300, DType::kFloat32, "", 2}},
                200, [&](int r) {
                  if (r == 20) warm = rss_bytes();
                  if (r > 20) peak = std::max(peak, rss_bytes());
                });
  if (!kAsan) {
    EXPECT_LE(peak, warm + (4u << 20)) << "RSS grew from " << warm << " to " << peak;
  }
  EXPECT_EQ(c.worker(0).stats().ops_completed, 600u);
  EXPECT_TRUE(c.Shutdown().ok());
}

// ---------------------------------------------------------------------------------------------
// Declarations and validation.

TEST(PushPullE2e, DeclarationMismatchNamesTheFirstDifferingTensor) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  std::vector<float> buf(100);
  std::vector<Status> st(2);
  OnEveryWorker(2, [&](uint32_t w) {
    Client& cl = c.worker(w);
    TensorId a = cl.Declare("layer0", 100, DType::kFloat32).value();
    (void)cl.Declare(w == 0 ? "fc.weight" : "fc.bias", w == 0 ? 4096 : 10, DType::kFloat32).value();
    (void)cl.Declare("layer2", 100, DType::kFloat32).value();
    std::vector<float> out(100);
    st[w] = cl.PushPull(a, ConstTensorView(buf.data(), 100), TensorView(out.data(), 100)).Wait();
  });
  for (uint32_t w = 0; w < 2; ++w) {
    EXPECT_EQ(st[w].code(), StatusCode::kInvalidArgument) << st[w].ToString();
    EXPECT_CONTAINS(st[w].message(), "tensor #1");
    EXPECT_CONTAINS(st[w].message(), "fc.weight");
    EXPECT_CONTAINS(st[w].message(), "fc.bias");
    // Sticky for those tensors.
    std::vector<float> out(100);
    const Status again =
        c.worker(w)
            .PushPull(TensorId{0}, ConstTensorView(buf.data(), 100), TensorView(out.data(), 100))
            .Wait();
    EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(c.Shutdown().ok());
}

TEST(PushPullE2e, DeclareAndPushPullValidation) {
  ClusterOptions o;
  TestCluster c(o);
  ASSERT_STARTED(c);
  Client& cl = c.worker(0);
  EXPECT_EQ(cl.rank(), 0u);
  EXPECT_EQ(cl.num_workers(), 1u);
  EXPECT_EQ(cl.num_servers(), 1u);
  EXPECT_EQ(cl.Declare("", 10, DType::kFloat32).status().code(), StatusCode::kInvalidArgument);
  const TensorId t = cl.Declare("x", 10, DType::kFloat32).value();
  const Status dup = cl.Declare("x", 10, DType::kFloat32).status();
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(dup.message(), "already declared");
  const Status bad = cl.Declare("y", 10, DType::kFloat32, 0, "onebit:scaled=maybe").status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(bad.message(), "'y'");

  std::vector<float> in(10, 1.0f), out(10);
  std::vector<uint16_t> half(10);
  Status s = cl.PushPull(t, ConstTensorView(in.data(), 9), TensorView(out.data(), 10)).Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "input has 9 elements");
  s = cl.PushPull(t, ConstTensorView(in.data(), 10), TensorView(half.data(), 10, DType::kFloat16))
          .Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "output has 10 elements of float16");
  s = cl.PushPull(TensorId{99}, ConstTensorView(in.data(), 10), TensorView(out.data(), 10)).Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PushPullHandle().Wait().code(), StatusCode::kFailedPrecondition);

  // 0 elements: OK at once; then a real one works.
  const TensorId z = cl.Declare("zero", 0, DType::kFloat32).value();
  EXPECT_TRUE(cl.PushPull(z, ConstTensorView(nullptr, 0), TensorView(nullptr, 0)).Wait().ok());
  EXPECT_TRUE(cl.CommitDeclarations().ok());
  EXPECT_TRUE(
      cl.PushPull(t, ConstTensorView(in.data(), 10), TensorView(out.data(), 10)).Wait().ok());
  EXPECT_EQ(out, in);  // one worker: the average is the input
  // Declaring after the first push_pull works (a new epoch).
  const TensorId late = cl.Declare("late", 2000, DType::kFloat32, 0, "fp16").value();
  std::vector<float> lin(2000, 0.5f), lout(2000);
  EXPECT_TRUE(cl.PushPull(late, ConstTensorView(lin.data(), 2000), TensorView(lout.data(), 2000))
                  .Wait()
                  .ok());
  EXPECT_EQ(lout, lin);
  EXPECT_TRUE(c.Shutdown().ok());
  // After shutdown: Cancelled.
  EXPECT_EQ(
      cl.PushPull(t, ConstTensorView(in.data(), 10), TensorView(out.data(), 10)).Wait().code(),
      StatusCode::kCancelled);
}

TEST(PushPullE2e, SecondPushPullOfATensorInFlightIsRefused) {
  ClusterOptions o;
  o.workers = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 1000;
  std::vector<std::vector<float>> in(2, std::vector<float>(n, 2.0f)), out(2, std::vector<float>(n));
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t w) {
    ids[w] = c.worker(w).Declare("g", n, DType::kFloat32).value();
    EXPECT_TRUE(c.worker(w).CommitDeclarations().ok());
  });
  // Worker 0 alone: its push_pull waits for worker 1's push.
  PushPullHandle first =
      c.worker(0).PushPull(ids[0], ConstTensorView(in[0].data(), n), TensorView(out[0].data(), n));
  const Status second =
      c.worker(0)
          .PushPull(ids[0], ConstTensorView(in[0].data(), n), TensorView(out[0].data(), n))
          .Wait();
  EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition) << second.ToString();
  EXPECT_CONTAINS(second.message(), "already in flight");
  EXPECT_FALSE(first.Ready());
  EXPECT_EQ(first.Wait(milliseconds(20)).code(), StatusCode::kTimeout);
  EXPECT_TRUE(c.worker(1)
                  .PushPull(ids[1], ConstTensorView(in[1].data(), n), TensorView(out[1].data(), n))
                  .Wait()
                  .ok());
  EXPECT_TRUE(first.Wait().ok());
  EXPECT_EQ(out[0], in[0]);
  EXPECT_TRUE(c.Shutdown().ok());
}

// ---------------------------------------------------------------------------------------------
// Failures: never a hang, always the cause.

TEST(PushPullE2e, OpTimeoutNamesTheTensorPartitionsAndServers) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  o.op_timeout = milliseconds(300);
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 5000;  // 5 partitions over both servers
  std::vector<float> in(n, 1.0f), out(n);
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t w) {
    ids[w] = c.worker(w).Declare("stuck", n, DType::kFloat32).value();
    EXPECT_TRUE(c.worker(w).CommitDeclarations().ok());
  });
  const Clock::time_point start = Clock::now();
  const Status s =
      c.worker(0).PushPull(ids[0], ConstTensorView(in.data(), n), TensorView(out.data(), n)).Wait();
  const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_CONTAINS(s.message(), "tensor 'stuck'");
  EXPECT_CONTAINS(s.message(), "5 of 5 partitions");
  EXPECT_CONTAINS(s.message(), "server(s) 0, 1");
  EXPECT_CONTAINS(s.message(), "pushed round 0, no reply");
  EXPECT_GE(ms, 300);
  EXPECT_LT(ms, 300 + 1000);
  // The tensor is out of step now: later push_pulls fail with the same error.
  EXPECT_EQ(c.worker(0)
                .PushPull(ids[0], ConstTensorView(in.data(), n), TensorView(out.data(), n))
                .Wait()
                .code(),
            StatusCode::kTimeout);
  EXPECT_EQ(c.worker(0).stats().ops_failed, 2u);
}

// A `none` push is sent from the input itself (its frames borrow the input), so an op completes,
// even after it failed, only once the transport has let go of them: when Wait returns the
// caller may reuse the input. Here the worker's transport holds every push (FaultSwitch
// holding); the op times out but stays pending until the held pushes are dropped.
TEST(PushPullE2e, AnOpCompletesOnlyOnceTheTransportLetGoOfItsInput) {
  ClusterOptions co;
  co.op_timeout = milliseconds(300);
  testing::TestClusterOptions t;
  t.source = "pushpull_e2e_test";
  t.servers = 1;
  t.workers = 1;
  t.heartbeat_interval = milliseconds(50);
  t.heartbeat_timeout = co.heartbeat_timeout;
  t.startup_timeout = milliseconds(5000);
  t.compression.spec = "none";
  t.compression.partition_bytes = 4096;
  t.server.engine_threads = 1;
  t.server.numa = config::NumaMode::kOff;
  t.worker.compress_threads = 1;
  t.worker.op_timeout = co.op_timeout;
  testing::ThreadClusterOptions o;
  o.config = testing::TestClusterConfig(t);
  o.start_workers = false;
  auto faults = std::make_shared<testing::FaultSwitch>();
  std::unique_ptr<Engine> engine;
  testing::ThreadCluster* cluster_ptr = nullptr;
  o.custom_node = [&](v1::Role role, uint32_t rank) -> Status {
    if (role != v1::ROLE_WORKER) return InternalError("unexpected custom node");
    EngineOptions e;
    e.cluster = cluster_ptr->config();
    e.rank = rank;
    e.inproc_hub = cluster_ptr->hub();
    transport::TransportOptions to;
    to.name = node::NodePeerId(v1::ROLE_WORKER, rank);
    to.listen_address = e.cluster.NodeAddress(v1::ROLE_WORKER, rank);
    to.inproc_hub = cluster_ptr->hub();
    BP_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> inner,
                        transport::CreateTransport(to));
    e.transport = std::make_unique<testing::FaultyTransport>(
        std::shared_ptr<transport::Transport>(std::move(inner)), faults);
    BP_ASSIGN_OR_RETURN(engine, Engine::Create(std::move(e)));
    return Status::Ok();
  };
  testing::ThreadCluster cluster(o);
  cluster_ptr = &cluster;
  const Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  ASSERT_TRUE(engine);
  const size_t n = 3000;  // 3 partitions of 4096 bytes
  std::vector<float> in(n, 1.5f), out(n);
  StatusOr<TensorId> id = engine->Declare("held", n, DType::kFloat32, TensorOptions());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(engine->CommitDeclarations().ok());
  // A round through the real transport first: `none` pushes from the input give the exact sum.
  ASSERT_TRUE(
      engine->PushPull(*id, ConstTensorView(in.data(), n), TensorView(out.data(), n)).Wait().ok());
  EXPECT_EQ(out, in);

  faults->SetHolding(true);
  PushPullHandle h =
      engine->PushPull(*id, ConstTensorView(in.data(), n), TensorView(out.data(), n));
  EXPECT_EQ(h.Wait(milliseconds(1000)).code(), StatusCode::kTimeout);
  EXPECT_FALSE(h.Ready()) << "completed while the transport still held frames of its input";
  EXPECT_GE(faults->held(), 3u);  // the 3 pushes, and control messages (one transport here)
  faults->ReleaseHeld();
  const Status s = h.Wait(milliseconds(5000));
  ASSERT_TRUE(h.Ready()) << "still pending after the transport let go";
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_CONTAINS(s.message(), "tensor 'held'");
  engine->Close();
}

// The same rule on a clock the test moves: the op fails when its deadline passes on the
// worker's clock, not before, however long it sits in real time.
TEST(PushPullE2e, OpTimeoutFollowsTheWorkersClock) {
  auto clock = std::make_shared<testing::ManualClock>();
  ClusterOptions o;
  o.workers = 2;
  o.servers = 1;
  o.op_timeout = milliseconds(300);
  // The workers' heartbeats follow their clock too: the scheduler must not mind the pauses.
  o.heartbeat_timeout = milliseconds(60000);
  o.worker_clock = clock;
  TestCluster c(o);
  // Registration and declarations with the clock following real time.
  std::atomic<bool> ticking{true};
  std::thread ticker([&] {
    while (ticking) {
      clock->Advance(milliseconds(1));
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  const Status started = c.Start();
  const size_t n = 3000;
  std::vector<float> in(n, 1.0f), out(n);
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t w) {
    ids[w] = c.worker(w).Declare("late", n, DType::kFloat32).value();
    EXPECT_TRUE(c.worker(w).CommitDeclarations().ok());
  });
  ticking = false;
  ticker.join();
  ASSERT_TRUE(started.ok()) << started.ToString();
  // Worker 1 never pushes: worker 0's round cannot complete.
  PushPullHandle h =
      c.worker(0).PushPull(ids[0], ConstTensorView(in.data(), n), TensorView(out.data(), n));
  EXPECT_EQ(h.Wait(milliseconds(400)).code(), StatusCode::kTimeout);  // only Wait's own bound
  EXPECT_FALSE(h.Ready()) << "failed after 400 ms of real time with the clock standing still";
  clock->Advance(milliseconds(250));
  EXPECT_EQ(h.Wait(milliseconds(100)).code(), StatusCode::kTimeout);
  EXPECT_FALSE(h.Ready()) << "failed 250 ms into a 300 ms op_timeout";
  clock->Advance(milliseconds(100));
  const Status s = h.Wait(milliseconds(10000));
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_CONTAINS(s.message(), "tensor 'late'");
  EXPECT_CONTAINS(s.message(), "pushed round 0, no reply");
}

// ---------------------------------------------------------------------------------------------
// Checkpoints (worker/checkpoint.h): a job of N rounds saved, every node gone, a new cluster
// resumed for M rounds gives the outputs of an uninterrupted N + M run, bit for bit.

// Runs rounds [first, first + count) of `decls` (inputs MakeInput(.., r)) on every worker of
// `c`; returns the last round's outputs [w][t]. With `checkpoint`, loads it first / saves it
// after (every worker, collectively).
std::vector<std::vector<std::vector<uint8_t>>> RunRounds(TestCluster& c,
                                                         const std::vector<TensorDecl>& decls,
                                                         int first, int count,
                                                         const std::string& load,
                                                         const std::string& save) {
  const uint32_t workers = c.options().workers;
  std::vector<std::vector<std::vector<uint8_t>>> outputs(workers);
  OnEveryWorker(workers, [&](uint32_t w) {
    std::vector<TensorId> ids;
    for (const TensorDecl& d : decls) {
      StatusOr<TensorId> id = c.worker(w).Declare(d.name, d.elements, d.dtype, TensorOptions{});
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ids.push_back(*id);
    }
    if (!load.empty()) {
      const Status s = LoadCheckpoint(c.worker(w), ids, load);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    for (const TensorDecl& d : decls) outputs[w].emplace_back(d.elements * DTypeSize(d.dtype));
    for (int r = first; r < first + count; ++r) {
      for (size_t t = 0; t < decls.size(); ++t) {
        const std::vector<uint8_t> in = MakeInput(decls[t], w, t, static_cast<uint64_t>(r));
        const Status s =
            c.worker(w)
                .PushPull(ids[t], ConstTensorView(in.data(), decls[t].elements, decls[t].dtype),
                          TensorView(outputs[w][t].data(), decls[t].elements, decls[t].dtype))
                .Wait();
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
    }
    if (!save.empty()) {
      const Status s = SaveCheckpoint(c.worker(w), ids, save);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  });
  return outputs;
}

class Resume : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Resume, AResumedJobMatchesTheUninterruptedRunBitForBit) {
  const auto& [spec, ef] = GetParam();
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  o.spec = spec;
  o.error_feedback = ef;
  o.min_compress_bytes = 0;
  o.partition_bytes = 1024;  // several partitions, on both servers
  const std::vector<TensorDecl> decls = {{"w", 700, DType::kFloat32, ""},
                                         {"b", 33, DType::kFloat32, ""}};
  const int before = 3, after = 2;
  char dir[] = "/tmp/bitpush-ckpt-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/job";

  TestCluster whole(o);
  ASSERT_TRUE(whole.Start().ok());
  const auto reference = RunRounds(whole, decls, 0, before + after, "", "");
  ASSERT_TRUE(whole.Shutdown().ok());

  {
    TestCluster first(o);
    ASSERT_TRUE(first.Start().ok());
    RunRounds(first, decls, 0, before, "", path);
    ASSERT_TRUE(first.Shutdown().ok());
  }
  TestCluster resumed(o);
  ASSERT_TRUE(resumed.Start().ok());
  const auto outputs = RunRounds(resumed, decls, before, after, path, "");
  ASSERT_TRUE(resumed.Shutdown().ok());
  EXPECT_EQ(outputs, reference);

  // A job with another compressor is refused naming the tensor and both specs.
  o.spec = spec == "onebit" ? "topk:ratio=0.5" : "onebit";
  TestCluster other(o);
  ASSERT_TRUE(other.Start().ok());
  OnEveryWorker(2, [&](uint32_t w) {
    StatusOr<TensorId> id = other.worker(w).Declare("w", 700, DType::kFloat32, TensorOptions{});
    ASSERT_TRUE(id.ok());
    StatusOr<TensorId> id2 = other.worker(w).Declare("b", 33, DType::kFloat32, TensorOptions{});
    ASSERT_TRUE(id2.ok());
    const Status s = LoadCheckpoint(other.worker(w), {*id, *id2}, path);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("does not fit this job: the compressor of tensor #0 ('w')"),
              std::string::npos)
        << s.ToString();
  });
  other.Close();
  for (uint32_t w = 0; w < 2; ++w) std::remove(CheckpointNodePath(path, w).c_str());
  rmdir(dir);
}

INSTANTIATE_TEST_SUITE_P(PushPullE2e, Resume,
                         ::testing::Combine(::testing::Values("onebit", "topk:ratio=0.1",
                                                              "loco:scale=8,beta=0.5,reset=0",
                                                              "loco:block=16,reset=0",
                                                              // Counts rounds: resets at 0, 2, 4.
                                                              "loco:scale=8,beta=0.5,reset=2",
                                                              // A random stream per round.
                                                              "randomk:ratio=0.25"),
                                            ::testing::Values("none", "worker", "both")),
                         [](const ::testing::TestParamInfo<Resume::ParamType>& info) {
                           std::string name =
                               std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// The unbiased methods with a random stream per round, which run without error feedback.
INSTANTIATE_TEST_SUITE_P(PushPullE2eUnbiased, Resume,
                         ::testing::Combine(::testing::Values("sdp4bit", "dithering:levels=63",
                                                              "separate", "separate:reset=2"),
                                            ::testing::Values("none")),
                         [](const ::testing::TestParamInfo<Resume::ParamType>& info) {
                           std::string name =
                               std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// RestoreTensorRounds moves a tensor's rounds only between rounds: a round one worker opened at
// its server refuses it, naming the key; the round then completes as usual, and a restore once
// every round closed moves both workers (TensorRounds reads it back).
TEST(PushPullE2e, RestoreTensorRoundsIsRefusedWhileARoundIsOpen) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 1;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 64;
  std::vector<float> in(n, 1.0f), out0(n), out1(n);
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t w) {
    ids[w] = c.worker(w).Declare("g", n, DType::kFloat32).value();
    EXPECT_TRUE(c.worker(w).CommitDeclarations().ok());
  });
  PushPullHandle h =
      c.worker(0).PushPull(ids[0], ConstTensorView(in.data(), n), TensorView(out0.data(), n));
  EXPECT_EQ(h.Wait(milliseconds(50)).code(), StatusCode::kTimeout);  // waits for worker 1
  const Status refused = c.worker(1).RestoreTensorRounds(ids[1], 7);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_CONTAINS(refused.message(), "a round is open");
  EXPECT_CONTAINS(refused.message(), "server 0");
  ASSERT_TRUE(c.worker(1)
                  .PushPull(ids[1], ConstTensorView(in.data(), n), TensorView(out1.data(), n))
                  .Wait()
                  .ok());
  ASSERT_TRUE(h.Wait().ok());
  EXPECT_EQ(c.worker(1).TensorRounds(ids[1]).value(), 1u);
  OnEveryWorker(2, [&](uint32_t w) {
    const Status s = c.worker(w).RestoreTensorRounds(ids[w], 7);
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  OnEveryWorker(2, [&](uint32_t w) {
    EXPECT_EQ(c.worker(w).TensorRounds(ids[w]).value(), 7u);
    std::vector<float> out(n);
    const Status s = c.worker(w)
                         .PushPull(ids[w], ConstTensorView(in.data(), n), TensorView(out.data(), n))
                         .Wait();
    EXPECT_TRUE(s.ok()) << s.ToString();  // the server expects round 7 from both
    EXPECT_EQ(out, in);
    EXPECT_EQ(c.worker(w).TensorRounds(ids[w]).value(), 8u);
  });
}

TEST(PushPullE2e, DeadServerFailsPendingHandlesNamingIt) {
  ClusterOptions o;
  o.workers = 2;
  o.servers = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 5000;
  std::vector<float> in(n, 1.0f), out(n);
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t w) {
    ids[w] = c.worker(w).Declare("g", n, DType::kFloat32).value();
    EXPECT_TRUE(c.worker(w).CommitDeclarations().ok());
  });
  PushPullHandle h =
      c.worker(0).PushPull(ids[0], ConstTensorView(in.data(), n), TensorView(out.data(), n));
  EXPECT_EQ(h.Wait(milliseconds(50)).code(), StatusCode::kTimeout);  // waits for worker 1
  const Clock::time_point killed = Clock::now();
  c.server(1).Close();
  const Status s = h.Wait();
  const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - killed).count();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_CONTAINS(s.message(), "server 1");
  EXPECT_CONTAINS(s.message(), "tensor 'g'");
  EXPECT_LT(ms, o.heartbeat_timeout.count() + 1000);
  // Sticky: later calls fail with the cluster's error.
  EXPECT_EQ(c.worker(0)
                .PushPull(ids[0], ConstTensorView(in.data(), n), TensorView(out.data(), n))
                .Wait()
                .code(),
            StatusCode::kUnavailable);
  EXPECT_FALSE(c.worker(0).status().ok());
}

TEST(PushPullE2e, CloseFailsPendingHandlesWithCancelled) {
  ClusterOptions o;
  o.workers = 2;
  TestCluster c(o);
  ASSERT_STARTED(c);
  const size_t n = 3000;
  std::vector<float> in(n, 1.0f), out(n);
  std::vector<TensorId> ids(2);
  OnEveryWorker(2, [&](uint32_t w) {
    ids[w] = c.worker(w).Declare("g", n, DType::kFloat32, 0, "onebit").value();
    EXPECT_TRUE(c.worker(w).CommitDeclarations().ok());
  });
  PushPullHandle h =
      c.worker(0).PushPull(ids[0], ConstTensorView(in.data(), n), TensorView(out.data(), n));
  c.worker(0).Close();
  const Status s = h.Wait();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_CONTAINS(s.message(), "closed");
  c.worker(0).Close();  // idempotent
}

// A server endpoint that misbehaves on purpose: it accepts the declarations and keys like a
// server, but answers every push as `mode` says — to check what the worker makes of refusals
// and bad replies.
class FakeServer {
 public:
  enum class Mode { kRefuse, kEmptyReply, kGarbageReply };

  FakeServer(const TestCluster& c, Mode mode) : mode_(mode) {
    node::NodeEndpointOptions e;
    e.self = node::NodeIdentity{v1::ROLE_SERVER, 0};
    e.listen_address = c.config().servers[0];
    e.inproc_hub = c.hub();
    endpoint_ = node::NodeEndpoint::Create(e).value();
    scheduler::SchedulerClientOptions o;
    o.cluster = c.config();
    o.role = v1::ROLE_SERVER;
    o.rank = 0;
    client_ = scheduler::SchedulerClient::Create(o, endpoint_.get()).value();
    for (v1::DataHeader::Op op :
         {v1::DataHeader::OP_DECLARE, v1::DataHeader::OP_PUSH, v1::DataHeader::OP_INIT_KEY}) {
      endpoint_->OnData(op, node::RoleSet::Of(v1::ROLE_WORKER),
                        [this](const node::Sender& from, v1::DataHeader& h, transport::Message&) {
                          OnMessage(from.peer, h);
                        });
    }
    endpoint_->Start();
  }
  ~FakeServer() {
    endpoint_->Close();
    client_->Close();
  }

  // Registers (blocks until every node registered) and connects to the workers.
  Status Register() {
    BP_RETURN_IF_ERROR(client_->Register());
    for (const v1::NodeInfo& w : client_->assignment().workers()) {
      BP_RETURN_IF_ERROR(
          endpoint_->Connect(node::NodePeerId(v1::ROLE_WORKER, w.rank()), w.address()));
    }
    return Status::Ok();
  }

 private:
  void OnMessage(const std::string& from, const v1::DataHeader& in) {
    v1::DataHeader out;
    out.set_key(in.key());
    out.set_round(in.round());
    transport::Message msg;
    if (in.op() == v1::DataHeader::OP_DECLARE) {
      out.set_op(v1::DataHeader::OP_DECLARE_REPLY);
    } else if (in.op() == v1::DataHeader::OP_PUSH) {
      switch (mode_) {
        case Mode::kRefuse:
          out.set_op(v1::DataHeader::OP_ERROR);
          out.set_error("bad push");
          out.set_error_code(static_cast<uint32_t>(StatusCode::kInvalidArgument));
          out.set_refused_op(v1::DataHeader::OP_PUSH);
          break;
        case Mode::kEmptyReply: out.set_op(v1::DataHeader::OP_PULL_REPLY); break;
        case Mode::kGarbageReply:
          out.set_op(v1::DataHeader::OP_PULL_REPLY);
          msg.frames.push_back(transport::Buffer::Take(std::string("not a payload")));
          break;
      }
    } else {
      return;  // OP_INIT_KEY: accepted silently
    }
    out.SerializeToString(&msg.header);
    (void)endpoint_->Send(from, std::move(msg));
  }

  const Mode mode_;
  std::unique_ptr<node::NodeEndpoint> endpoint_;
  std::unique_ptr<scheduler::SchedulerClient> client_;
};

class BadServer : public ::testing::TestWithParam<FakeServer::Mode> {};

TEST_P(BadServer, RefusalsAndBadRepliesFailTheHandleNamingServerTensorAndPartition) {
  ClusterOptions o;
  o.start_servers = false;
  TestCluster c(o);
  FakeServer fake(c, GetParam());
  Status registered;
  std::thread server([&] { registered = fake.Register(); });
  const Status started = c.Start();
  server.join();
  ASSERT_TRUE(started.ok()) << started.ToString();
  ASSERT_TRUE(registered.ok()) << registered.ToString();

  const size_t n = 3000;
  std::vector<float> in(n, 1.0f), out(n);
  const TensorId id = c.worker(0).Declare("g", n, DType::kFloat32, 0, "onebit").value();
  const Status s =
      c.worker(0).PushPull(id, ConstTensorView(in.data(), n), TensorView(out.data(), n)).Wait();
  switch (GetParam()) {
    case FakeServer::Mode::kRefuse:
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_CONTAINS(s.message(),
                      "server 0 refused key 0 (tensor 'g' partition 0, round 0): bad push");
      break;
    case FakeServer::Mode::kEmptyReply:
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      EXPECT_CONTAINS(s.message(), "without a payload");
      EXPECT_CONTAINS(s.message(), "tensor 'g'");
      break;
    case FakeServer::Mode::kGarbageReply:
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      EXPECT_CONTAINS(s.message(), "from server 0");
      EXPECT_CONTAINS(s.message(), "tensor 'g'");
      break;
  }
  EXPECT_EQ(c.worker(0).stats().ops_failed, 1u);
}

INSTANTIATE_TEST_SUITE_P(Modes, BadServer,
                         ::testing::Values(FakeServer::Mode::kRefuse, FakeServer::Mode::kEmptyReply,
                                           FakeServer::Mode::kGarbageReply));

}  // namespace
}  // namespace bitpush::worker
