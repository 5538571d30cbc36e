// The worker residual's decay inside the compression (CompressContext::residual_decay, CLAN's
// error_feedback_decay): compressing x through a state with decay γ gives, round after round,
// the payloads and residual of scaling the residual by γ in fp32 first and compressing with
// γ = 1, bit for bit — fused into onebit's sign pass (its deferred state and its two-pass path,
// every ISA level, sizes around the 64-element words, fp16 input), and as a scaling pass before
// the other methods' compression. A decay outside [0, 1] is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/half.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "tests/unit/compressor_test_util.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using testing::MakeCompressor;
using testing::MakeState;
using testing::RandomFloats;
using testing::SameBits;
using testing::SupportedIsaLevels;

// Rounds of `spec` through its worker state with decay `gamma`, against a plain fp32 residual
// scaled by gamma before each CompressWithFeedback with decay 1. Round 3 pushes fp16, round 5
// restores a residual into both.
void ExpectDecayEqualsScalingFirst(const std::string& spec, IsaLevel isa, size_t n, float gamma) {
  SCOPED_TRACE(spec + " " + std::string(IsaLevelName(isa)) + " n " + std::to_string(n) + " gamma " +
               std::to_string(gamma));
  auto c = MakeCompressor(spec, isa);
  auto ref = MakeCompressor(spec, isa);
  auto state = MakeState(spec, ErrorFeedbackSide::kWorker, n);
  ASSERT_TRUE(state->AppliesResidualDecay());
  std::vector<float> plain(n, 0.0f);
  for (uint64_t round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<float> g = RandomFloats(n, 31 * round + n, 1.0f + 0.2f * round);
    std::vector<uint16_t> half(n);
    ConstTensorView in(g.data(), n);
    if (round == 3) {
      for (size_t i = 0; i < n; ++i) half[i] = FloatToHalf(g[i]);
      in = ConstTensorView(half.data(), n, DType::kFloat16);
    }
    if (round == 5) {
      plain = RandomFloats(n, 5 + n, 0.3f);
      ASSERT_TRUE(state->Restore({plain.data(), n}).ok());
    }
    CompressContext decayed{3, round};
    decayed.residual_decay = gamma;
    const CompressContext whole{3, round};
    for (float& e : plain) e = e * gamma;
    std::vector<uint8_t> want(c->MaxCompressedBytes(n, in.dtype())), got(want.size());
    auto rw = ref->CompressWithFeedback(in, {plain.data(), n}, whole, {want.data(), want.size()});
    auto rg = state->Compress(*c, in, decayed, {got.data(), got.size()});
    ASSERT_TRUE(rw.ok() && rg.ok());
    ASSERT_EQ(*rw, *rg);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), *rw));
    if (round == 6) {
      ASSERT_TRUE(SameBits(state->residual(), plain));
    }
  }
  ASSERT_TRUE(SameBits(state->residual(), plain));
}

TEST(ResidualDecay, OnebitFusesTheDecayWithTheValuesOfScalingFirst) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t n : {1, 63, 65, 4097, 70001}) {
      for (float gamma : {0.2f, 0.5f, 0.0f, 1.0f}) {
        ExpectDecayEqualsScalingFirst("onebit", isa, n, gamma);
      }
    }
  }
}

TEST(ResidualDecay, OtherMethodsScaleTheResidualBeforeCompressing) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (const std::string spec : {"topk:ratio=0.1", "randomk:ratio=0.25", "dithering"}) {
      ExpectDecayEqualsScalingFirst(spec, isa, 4097, 0.2f);
    }
  }
}

TEST(ResidualDecay, TheOnebitTwoPassPathAppliesItToo) {
  // The compressor alone (no deferred state): q = g + γe, e <- q - C(q).
  for (IsaLevel isa : SupportedIsaLevels()) {
    const size_t n = 1000;
    auto c = MakeCompressor("onebit", isa);
    std::vector<float> e = RandomFloats(n, 11, 0.5f), scaled = e;
    for (float& v : scaled) v = v * 0.3f;
    const std::vector<float> g = RandomFloats(n, 12);
    CompressContext decayed{1, 0};
    decayed.residual_decay = 0.3f;
    std::vector<uint8_t> want(c->MaxCompressedBytes(n, DType::kFloat32)), got(want.size());
    auto rw = c->CompressWithFeedback(ConstTensorView(g.data(), n), {scaled.data(), n},
                                      CompressContext{1, 0}, {want.data(), want.size()});
    auto rg = c->CompressWithFeedback(ConstTensorView(g.data(), n), {e.data(), n}, decayed,
                                      {got.data(), got.size()});
    ASSERT_TRUE(rw.ok() && rg.ok());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), *rw));
    EXPECT_TRUE(SameBits({e.data(), n}, scaled));
  }
}

TEST(ResidualDecay, OutsideZeroOneIsRefused) {
  auto c = MakeCompressor("onebit", IsaLevel::kScalar);
  std::vector<float> g(8, 1.0f), e(8, 0.5f);
  std::vector<uint8_t> out(c->MaxCompressedBytes(8, DType::kFloat32));
  for (float bad : {1.5f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    CompressContext ctx{1, 0};
    ctx.residual_decay = bad;
    auto r = c->CompressWithFeedback(ConstTensorView(g.data(), 8), {e.data(), 8}, ctx,
                                     {out.data(), out.size()});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("residual decay"), std::string::npos)
        << r.status().message();
    EXPECT_EQ(e, std::vector<float>(8, 0.5f));  // nothing touched
  }
}

TEST(ResidualDecay, MethodsWithTheirOwnErrorStateTakeNone) {
  for (const std::string spec : {"loco", "separate"}) {
    SCOPED_TRACE(spec);
    EXPECT_FALSE(MakeState(spec, ErrorFeedbackSide::kWorker, 1000)->AppliesResidualDecay());
  }
}

}  // namespace
}  // namespace bitpush::compressors
