// onebit's deferred error feedback (OnebitResidualState, compressors/onebit/onebit.h): the
// state keeps q with its correction pending and folds the correction into the next round's
// pass. Round after round, on both sides, on every ISA level and at sizes around the 64-element
// sign words, its payloads and its residual equal the two-pass Compressor path
// (CompressWithFeedback / AggregateCompress over a plain fp32 residual) bit for bit: through
// non-finite rounds, residual() reads between rounds, Restore, Reset, fp16 input and fp16
// replies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "common/half.h"
#include "compressors/error_feedback.h"
#include "compressors/onebit/onebit.h"
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

// What the test does to the state before round r (the plain residual gets the same).
enum class Event { kNone, kNonFinite, kRead, kRestore, kReset, kHalfInput };

Event EventAt(uint64_t round) {
  switch (round) {
    case 2: return Event::kNonFinite;
    case 4: return Event::kRead;
    case 6: return Event::kRestore;
    case 8: return Event::kHalfInput;
    case 10: return Event::kReset;
    default: return Event::kNone;
  }
}

TEST(OnebitDeferred, OnebitKeysGetTheDeferredStateOnBothSides) {
  for (ErrorFeedbackSide side : {ErrorFeedbackSide::kWorker, ErrorFeedbackSide::kServer}) {
    auto state = MakeState("onebit", side, 100);
    EXPECT_NE(dynamic_cast<OnebitResidualState*>(state.get()), nullptr);
  }
  EXPECT_EQ(dynamic_cast<OnebitResidualState*>(
                MakeState("topk:ratio=0.01", ErrorFeedbackSide::kWorker, 100).get()),
            nullptr);
}

TEST(OnebitDeferred, WorkerRoundsEqualThePlainResidualBitForBit) {
  for (const std::string spec : {"onebit", "onebit:scaled=false"}) {
    for (IsaLevel isa : SupportedIsaLevels()) {
      for (size_t n : {1, 15, 63, 64, 65, 1000, 4097, 70001}) {
        SCOPED_TRACE(spec + " " + std::string(IsaLevelName(isa)) + " n " + std::to_string(n));
        auto c = MakeCompressor(spec, isa);
        auto state = MakeState(spec, ErrorFeedbackSide::kWorker, n);
        auto* deferred = dynamic_cast<OnebitResidualState*>(state.get());
        ASSERT_NE(deferred, nullptr);
        std::vector<float> plain(n, 0.0f);
        for (uint64_t round = 0; round < 12; ++round) {
          SCOPED_TRACE("round " + std::to_string(round));
          std::vector<float> g = RandomFloats(n, 100 * round + n, 1.0f + 0.1f * round);
          const Event ev = EventAt(round);
          if (ev == Event::kNonFinite) g[n / 2] = std::numeric_limits<float>::infinity();
          if (ev == Event::kRead) ASSERT_TRUE(SameBits(state->residual(), plain));
          if (ev == Event::kRestore) {
            plain = RandomFloats(n, 7 + n, 0.5f);
            ASSERT_TRUE(state->Restore({plain.data(), n}).ok());
          }
          if (ev == Event::kReset) {
            state->Reset();
            std::fill(plain.begin(), plain.end(), 0.0f);
          }
          std::vector<uint16_t> half(n);
          ConstTensorView in(g.data(), n);
          if (ev == Event::kHalfInput) {
            for (size_t i = 0; i < n; ++i) half[i] = FloatToHalf(g[i]);
            in = ConstTensorView(half.data(), n, DType::kFloat16);
          }
          const CompressContext ctx{3, round};
          std::vector<uint8_t> want(c->MaxCompressedBytes(n, in.dtype())), got(want.size());
          auto rw = c->CompressWithFeedback(in, {plain.data(), n}, ctx, {want.data(), want.size()});
          auto rg = state->Compress(*c, in, ctx, {got.data(), got.size()});
          ASSERT_TRUE(rw.ok() && rg.ok());
          ASSERT_EQ(*rw, *rg);
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), *rw));
          // The correction stays pending after a finite fp32 round (the one-pass path ran).
          float scale;
          std::memcpy(&scale, got.data() + kPayloadHeaderBytes, 4);
          if (ev == Event::kNone) EXPECT_TRUE(deferred->deferred());
          if (std::isnan(scale)) EXPECT_FALSE(deferred->deferred());
        }
        ASSERT_TRUE(SameBits(state->residual(), plain));
        EXPECT_FALSE(deferred->deferred());
      }
    }
  }
}

// Worker pushes for one server round (plain worker error feedback).
std::vector<std::vector<uint8_t>> Pushes(Compressor& c, size_t workers, size_t n, uint64_t round,
                                         std::vector<std::vector<float>>* worker_e,
                                         bool non_finite) {
  std::vector<std::vector<uint8_t>> pushes;
  for (size_t w = 0; w < workers; ++w) {
    std::vector<float> g = RandomFloats(n, 1000 * round + w);
    if (non_finite && w == workers - 1) g[0] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint8_t> out(c.MaxCompressedBytes(n, DType::kFloat32));
    auto r = c.CompressWithFeedback(ConstTensorView(g.data(), n), {(*worker_e)[w].data(), n},
                                    {7, round, static_cast<uint32_t>(w)}, {out.data(), out.size()});
    EXPECT_TRUE(r.ok());
    out.resize(r.ok() ? *r : 0);
    pushes.push_back(std::move(out));
  }
  return pushes;
}

TEST(OnebitDeferred, ServerRoundsEqualThePlainResidualBitForBit) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t workers : {1, 3}) {
      for (size_t n : {1, 63, 64, 65, 4097, 70001}) {
        for (bool fp16_reply : {false, true}) {
          SCOPED_TRACE(std::string(IsaLevelName(isa)) + " workers " + std::to_string(workers) +
                       " n " + std::to_string(n) + (fp16_reply ? " fp16 reply" : ""));
          auto worker_codec = MakeCompressor("onebit", isa);
          auto c = MakeCompressor("onebit", isa);
          auto state = MakeState("onebit", ErrorFeedbackSide::kServer, n);
          ASSERT_TRUE(state->FusesServerRound(*c));
          std::vector<float> plain(n, 0.0f);
          std::vector<std::vector<float>> worker_e(workers, std::vector<float>(n, 0.0f));
          const float scale = workers > 1 ? 1.0f / static_cast<float>(workers) : 1.0f;
          for (uint64_t round = 0; round < 12; ++round) {
            SCOPED_TRACE("round " + std::to_string(round));
            const Event ev = EventAt(round);
            const auto pushes =
                Pushes(*worker_codec, workers, n, round, &worker_e, ev == Event::kNonFinite);
            std::vector<ByteSpan> spans;
            spans.reserve(pushes.size());
            for (const auto& p : pushes) spans.emplace_back(p.data(), p.size());
            if (ev == Event::kRead) ASSERT_TRUE(SameBits(state->residual(), plain));
            if (ev == Event::kRestore) {
              plain = RandomFloats(n, 9 + n, 0.5f);
              ASSERT_TRUE(state->Restore({plain.data(), n}).ok());
            }
            if (ev == Event::kReset) {
              state->Reset();
              std::fill(plain.begin(), plain.end(), 0.0f);
            }
            CompressContext ctx{7, round, kServerStream};
            if (fp16_reply) ctx.store_as = DType::kFloat16;
            std::vector<uint8_t> want(c->MaxCompressedBytes(n, DType::kFloat32)), got(want.size());
            auto rw = c->AggregateCompress(spans, n, scale, plain.data(), ctx,
                                           {want.data(), want.size()});
            auto rg = state->AggregateCompress(*c, spans, scale, ctx, {got.data(), got.size()});
            ASSERT_TRUE(rw.ok() && rg.ok());
            ASSERT_EQ(*rw, *rg);
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), *rw));
          }
          ASSERT_TRUE(SameBits(state->residual(), plain));
        }
      }
    }
  }
}

TEST(OnebitDeferred, RestoreChecksSizeAndKeepsTheState) {
  OnebitResidualState s(4);
  auto c = MakeCompressor("onebit", BestIsaLevel());
  const std::vector<float> g = {1.0f, -3.0f, 0.5f, 2.0f};
  std::vector<uint8_t> out(c->MaxCompressedBytes(4, DType::kFloat32));
  ASSERT_TRUE(s.Compress(*c, ConstTensorView(g.data(), 4), {}, {out.data(), out.size()}).ok());
  std::vector<float> wrong(3);
  EXPECT_EQ(s.Restore({wrong.data(), 3}).code(), StatusCode::kInvalidArgument);
  // scale = mean |g| = 1.625: e = g - (±1.625)
  const std::vector<float> want = {1.0f - 1.625f, -3.0f + 1.625f, 0.5f - 1.625f, 2.0f - 1.625f};
  EXPECT_TRUE(SameBits(s.residual(), want));
}

}  // namespace
}  // namespace bitpush::compressors
