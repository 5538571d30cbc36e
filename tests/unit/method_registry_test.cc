// The method registry's kernel side: every method of compressors/methods.inc has both
// descriptor halves, its compressor writes the payload its spec half declares, its
// error-feedback state is what the registry hands out, and servers refuse aggregation modes
// they do not run.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "compressors/registry.h"
#include "server/key_state.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using bitpush::testing::RandomFloats;

std::string MinimalSpec(const MethodSpec& m) {
  if (ParseCompressorSpec(m.name).ok()) return m.name;
  return std::string(m.name) + ":" + m.params[0].name + "=" + m.params[0].example;
}

TEST(MethodRegistry, EveryMethodHasBothHalves) {
  for (const MethodSpec* m : Methods()) {
    const MethodKernels* k = FindMethodKernels(m->id);
    ASSERT_NE(k, nullptr) << m->name;
    EXPECT_EQ(k->spec, m) << m->name << ": the kernel half names another method's spec half";
    EXPECT_NE(k->new_compressor, nullptr) << m->name;
    EXPECT_NE(k->new_error_feedback, nullptr) << m->name;
  }
  EXPECT_EQ(FindMethodKernels(static_cast<v1::CompressorId>(63)), nullptr);
}

TEST(MethodRegistry, CompressorWritesTheDeclaredPayload) {
  const size_t n = 1000;
  const std::vector<float> x = RandomFloats(n, 5);
  for (const MethodSpec* m : Methods()) {
    SCOPED_TRACE(m->name);
    auto c = CreateCompressor(MinimalSpec(*m));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ((*c)->id(), m->id);
    std::vector<uint8_t> out((*c)->MaxCompressedBytes(n, DType::kFloat32));
    auto bytes = (*c)->Compress(ConstTensorView(x.data(), n), {1, 2}, {out.data(), out.size()});
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(out[0], m->payload_format);
    EXPECT_EQ(out[1], static_cast<uint8_t>(m->id));
    if (!m->compresses) {  // the tensor as it is
      ASSERT_EQ(*bytes, kPayloadHeaderBytes + n * sizeof(float));
      EXPECT_EQ(std::memcmp(out.data() + kPayloadHeaderBytes, x.data(), n * sizeof(float)), 0);
    } else {
      EXPECT_LT(*bytes, kPayloadHeaderBytes + n * sizeof(float));
    }
  }
}

TEST(MethodRegistry, ErrorFeedbackStateIsTheVanillaResidual) {
  const size_t n = 777;
  for (const MethodSpec* m : Methods()) {
    SCOPED_TRACE(m->name);
    // loco keeps its own state (a moving average in int8, reset periodically); with beta = 1,
    // no reset and an fp32 error it is the vanilla residual, which this checks.
    // separate keeps a moving average of the residual against the global reconstruction; with
    // beta = 0 (stable convention: e <- 0 e + 1 (h - h~)) and no reset, one worker's round
    // through it is the vanilla residual too.
    const std::string spec = m->id == v1::COMPRESSOR_ID_LOCO ? "loco:beta=1,reset=0,error=fp32"
                             : m->id == v1::COMPRESSOR_ID_SEPARATE
                                 ? "separate:beta=0,reset=0,ema=stable"
                                 : MinimalSpec(*m);
    const v1::CompressorConfig config = *ParseCompressorSpec(spec);
    auto c = CreateCompressor(config);
    ASSERT_TRUE(c.ok());
    for (ErrorFeedbackSide side : {ErrorFeedbackSide::kWorker, ErrorFeedbackSide::kServer}) {
      auto state = CreateErrorFeedback(config, side, n);
      if (!state.ok()) {  // a side the method keeps no state on refuses its policy
        EXPECT_EQ(state.status().code(), StatusCode::kInvalidArgument);
        EXPECT_FALSE(ValidateErrorFeedback(config, side == ErrorFeedbackSide::kWorker
                                                       ? v1::ERROR_FEEDBACK_WORKER
                                                       : v1::ERROR_FEEDBACK_SERVER)
                         .ok())
            << state.status().ToString();
        continue;
      }
      ASSERT_EQ((*state)->size(), n);
      ASSERT_EQ((*state)->residual().size(), (*state)->state_size());
      for (float v : (*state)->residual()) ASSERT_EQ(v, 0.0f);
      if ((*state)->state_size() != n) {
        // A state that keeps more than a residual per element is the method's own algorithm
        // (binsgdm's worker state: the moments m, b and the residual e), not vanilla error
        // feedback: it must start at zero and write the method's payload.
        const std::vector<float> x = RandomFloats(n, 10);
        std::vector<uint8_t> got((*c)->MaxCompressedBytes(n, DType::kFloat32));
        auto g =
            (*state)->Compress(**c, ConstTensorView(x.data(), n), {3, 0}, {got.data(), got.size()});
        ASSERT_TRUE(g.ok()) << g.status().ToString();
        EXPECT_TRUE((*c)->ValidatePayload({got.data(), *g}, n).ok());
        continue;
      }
      EXPECT_EQ((*state)->FusesServerRound(**c), (*c)->FusesServerRound(true));
      // Two rounds through the state are the compressor's own error-feedback step.
      std::vector<float> e(n, 0.0f);
      for (uint64_t round = 0; round < 2; ++round) {
        const std::vector<float> x = RandomFloats(n, 10 + round);
        std::vector<uint8_t> got((*c)->MaxCompressedBytes(n, DType::kFloat32));
        std::vector<uint8_t> want(got.size());
        auto g = (*state)->Compress(**c, ConstTensorView(x.data(), n), {3, round},
                                    {got.data(), got.size()});
        auto w = (*c)->CompressWithFeedback(ConstTensorView(x.data(), n), {e.data(), n}, {3, round},
                                            {want.data(), want.size()});
        ASSERT_TRUE(g.ok() && w.ok());
        ASSERT_EQ(*g, *w);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), *g), 0);
        if (m->aggregation == AggregationMode::kCompressedDomainSum) {
          // The state's round ends at the server's reply (separate: the residual against the
          // global reconstruction): one worker's round, its push summed at scale 1, decoded.
          const ByteSpan push(got.data(), *g);
          std::vector<uint8_t> reply((*c)->MaxCompressedBytes(n, DType::kFloat32));
          auto r = (*c)->AggregateCompress(Span<const ByteSpan>(&push, 1), n, 1.0f, nullptr,
                                           {3, round, kServerStream}, {reply.data(), reply.size()});
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          std::vector<float> out(n);
          const Status s = (*state)->DecompressReply(**c, ByteSpan(reply.data(), *r), {3, round},
                                                     TensorView(out.data(), n));
          ASSERT_TRUE(s.ok()) << s.ToString();
        }
        EXPECT_EQ(std::memcmp((*state)->residual().data(), e.data(), n * sizeof(float)), 0);
      }
    }
  }
  v1::CompressorConfig bad;
  bad.set_id(v1::COMPRESSOR_ID_TOPK);  // no size
  EXPECT_EQ(CreateErrorFeedback(bad, ErrorFeedbackSide::kWorker, 4).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MethodRegistry, ServersRunEveryAggregationModeAndRefuseServerOptimizersInTheCompressedDomain) {
  server::KeySpec plain;
  server::KeySpec with_optimizer;
  with_optimizer.optimizer = server::ServerOptimizerSpec{};
  for (const MethodSpec* m : Methods()) {
    EXPECT_TRUE(server::CheckAggregationMode(*m, plain).ok()) << m->name;
    const Status s = server::CheckAggregationMode(*m, with_optimizer);
    if (m->aggregation == AggregationMode::kCompressedDomainSum) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << m->name;
      EXPECT_CONTAINS(s.message(), "servers never see its gradients");
    } else {
      EXPECT_TRUE(s.ok()) << m->name << ": " << s.message();
    }
  }
  MethodSpec unknown = *FindMethod(v1::COMPRESSOR_ID_ONEBIT);
  unknown.aggregation = static_cast<AggregationMode>(7);
  const Status s = server::CheckAggregationMode(unknown, plain);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_CONTAINS(s.message(), "onebit declares aggregation mode 7");
}

}  // namespace
}  // namespace bitpush::compressors
