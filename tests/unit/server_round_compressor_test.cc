// The server's fused round (Compressor::AggregateCompress): for every compressor that fuses it,
// on every ISA level, with 1..5 pushes, with and without a residual, averaged or summed, the
// payload and the residual equal the unfused sequence — DecompressToFloat of push 0,
// DecompressAdd of the others, the scaling loop, then CompressWithFeedback / Compress — bit for
// bit, round after round. ValidatePayload accepts exactly what DecompressAdd accepts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "tests/unit/compressor_test_util.h"
#include "tests/unit/test_util.h"

namespace bitpush::compressors {
namespace {

using testing::RandomFloats;
using testing::SupportedIsaLevels;

std::unique_ptr<Compressor> Make(const std::string& spec, IsaLevel isa = BestIsaLevel()) {
  CompressorOptions o;
  o.isa = isa;
  return std::move(CreateCompressor(spec, o)).value();
}

std::vector<ByteSpan> Spans(const std::vector<std::vector<uint8_t>>& pushes) {
  std::vector<ByteSpan> out;
  for (const auto& p : pushes) out.emplace_back(p.data(), p.size());
  return out;
}

// The unfused server round (what KeyState did before the fused path, and still does for the
// other compressors).
std::vector<uint8_t> Unfused(Compressor& c, const std::vector<std::vector<uint8_t>>& pushes,
                             size_t n, float scale, std::vector<float>* residual,
                             const CompressContext& ctx) {
  std::vector<float> acc(n);
  for (size_t w = 0; w < pushes.size(); ++w) {
    const ByteSpan p(pushes[w].data(), pushes[w].size());
    const Status s =
        w == 0 ? c.DecompressToFloat(p, {acc.data(), n}) : c.DecompressAdd(p, {acc.data(), n});
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  if (scale != 1.0f) {
    for (float& v : acc) v *= scale;
  }
  std::vector<uint8_t> out(c.MaxCompressedBytes(n, DType::kFloat32));
  StatusOr<size_t> r =
      residual ? c.CompressWithFeedback(ConstTensorView(acc.data(), n),
                                        {residual->data(), residual->size()}, ctx,
                                        {out.data(), out.size()})
               : c.Compress(ConstTensorView(acc.data(), n), ctx, {out.data(), out.size()});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  out.resize(r.ok() ? *r : 0);
  return out;
}

std::vector<uint8_t> Fused(Compressor& c, const std::vector<std::vector<uint8_t>>& pushes, size_t n,
                           float scale, std::vector<float>* residual, const CompressContext& ctx) {
  for (const auto& p : pushes) {
    const Status v = c.ValidatePayload({p.data(), p.size()}, n);
    EXPECT_TRUE(v.ok()) << v.ToString();
  }
  const std::vector<ByteSpan> spans = Spans(pushes);
  std::vector<uint8_t> out(c.MaxCompressedBytes(n, DType::kFloat32));
  StatusOr<size_t> r = c.AggregateCompress(spans, n, scale, residual ? residual->data() : nullptr,
                                           ctx, {out.data(), out.size()});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  out.resize(r.ok() ? *r : 0);
  return out;
}

// Worker pushes of `spec` for one round: compressed with worker-side error feedback, like the
// engine does, in `dtype`.
std::vector<std::vector<uint8_t>> Pushes(Compressor& c, size_t workers, size_t n, uint64_t round,
                                         DType dtype, std::vector<std::vector<float>>* worker_e) {
  std::vector<std::vector<uint8_t>> pushes;
  for (size_t w = 0; w < workers; ++w) {
    std::vector<float> g = RandomFloats(n, 1000 * round + w);
    std::vector<uint16_t> half(n);
    ConstTensorView in(g.data(), n);
    if (dtype != DType::kFloat32) {
      for (size_t i = 0; i < n; ++i) {
        half[i] = dtype == DType::kFloat16 ? FloatToHalf(g[i]) : FloatToBf16(g[i]);
      }
      in = ConstTensorView(half.data(), n, dtype);
    }
    pushes.push_back(testing::CompressEf(c, in, (*worker_e)[w], {7, round}));
  }
  return pushes;
}

struct Case {
  std::string spec;
  bool residual;
};

class ServerRound : public ::testing::TestWithParam<Case> {};

TEST_P(ServerRound, FusedEqualsUnfusedBitForBit) {
  const Case& c = GetParam();
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t workers : {1, 2, 3, 5}) {
      for (size_t n : {1, 63, 64, 1000, 4097, 70001}) {
        for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
          if (dtype != DType::kFloat32 && (workers != 2 || n != 4097)) continue;
          for (bool average : {true, false}) {
            SCOPED_TRACE(c.spec + " isa " + std::string(IsaLevelName(isa)) + " workers " +
                         std::to_string(workers) + " n " + std::to_string(n) + " " +
                         std::string(DTypeName(dtype)) + (average ? " average" : " sum"));
            auto worker_codec = Make(c.spec, isa);
            auto fused = Make(c.spec, isa);
            auto unfused = Make(c.spec, isa);
            ASSERT_TRUE(fused->FusesServerRound(c.residual));
            const float scale = average && workers > 1 ? 1.0f / static_cast<float>(workers) : 1.0f;
            std::vector<std::vector<float>> worker_e(workers, std::vector<float>(n, 0.0f));
            std::vector<float> e_fused(n, 0.0f), e_unfused(n, 0.0f);
            for (uint64_t round = 0; round < 4; ++round) {
              const auto pushes = Pushes(*worker_codec, workers, n, round, dtype, &worker_e);
              const CompressContext ctx{7, round};
              const auto want =
                  Unfused(*unfused, pushes, n, scale, c.residual ? &e_unfused : nullptr, ctx);
              const auto got =
                  Fused(*fused, pushes, n, scale, c.residual ? &e_fused : nullptr, ctx);
              ASSERT_EQ(got, want) << "round " << round;
              ASSERT_EQ(0, std::memcmp(e_fused.data(), e_unfused.data(), n * 4))
                  << "round " << round;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compressors, ServerRound,
                         ::testing::Values(Case{"onebit", true}, Case{"onebit", false},
                                           Case{"onebit:scaled=false", true},
                                           Case{"onebit:scaled=false", false},
                                           Case{"topk:ratio=0.01", true}, Case{"topk:k=3", true},
                                           Case{"topk:ratio=1", true}),
                         [](const auto& info) {
                           std::string s = info.param.spec + (info.param.residual ? "_ef" : "");
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// Pushes that overlap, repeat values, hold exact ties, zeros of both signs and non-finite
// values: the sparse merge keeps the rank order of the additions and the tie rule.
TEST(ServerRound, TopkMergeOfOverlappingPushesWithTiesAndNonFinite) {
  const size_t n = 5000;
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (size_t workers : {2, 3}) {
      for (int variant = 0; variant < 3; ++variant) {
        SCOPED_TRACE(std::string(IsaLevelName(isa)) + " workers " + std::to_string(workers) +
                     " variant " + std::to_string(variant));
        auto worker_codec = Make("topk:k=40", isa);
        auto fused = Make("topk:k=40", isa);
        auto unfused = Make("topk:k=40", isa);
        std::vector<float> e_fused(n, 0.0f), e_unfused(n, 0.0f);
        for (uint64_t round = 0; round < 3; ++round) {
          std::vector<std::vector<uint8_t>> pushes;
          for (size_t w = 0; w < workers; ++w) {
            std::vector<float> g(n, 0.0f);
            // Every worker's top values sit on shared indices (overlap) with equal magnitudes
            // (ties), a few on its own.
            for (size_t j = 0; j < 30; ++j) g[j * 97] = (j % 2 ? -1.0f : 1.0f) * (2.0f + j % 3);
            for (size_t j = 0; j < 10; ++j) g[n - 1 - j * 13 - w] = 2.5f + static_cast<float>(w);
            g[5] = -0.0f;
            if (variant == 1) g[17 + w] = std::numeric_limits<float>::infinity();
            if (variant == 2) g[200] = std::numeric_limits<float>::quiet_NaN();
            pushes.push_back(
                testing::Compress(*worker_codec, ConstTensorView(g.data(), n), {7, round}));
          }
          const CompressContext ctx{7, round};
          const float scale = 1.0f / static_cast<float>(workers);
          const auto want = Unfused(*unfused, pushes, n, scale, &e_unfused, ctx);
          const auto got = Fused(*fused, pushes, n, scale, &e_fused, ctx);
          ASSERT_EQ(got, want) << "round " << round;
          ASSERT_EQ(0, std::memcmp(e_fused.data(), e_unfused.data(), n * 4)) << "round " << round;
        }
      }
    }
  }
}

// A NaN scale (a worker saw a non-finite gradient) poisons the aggregate: the published scale
// is NaN and the server residual restarts from zero, as on the unfused path.
TEST(ServerRound, OnebitNonFinitePushResetsTheResidual) {
  const size_t n = 300;
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto worker_codec = Make("onebit", isa);
    auto fused = Make("onebit", isa);
    auto unfused = Make("onebit", isa);
    std::vector<float> e_fused = RandomFloats(n, 5), e_unfused = e_fused;
    std::vector<float> g0 = RandomFloats(n, 1), g1 = RandomFloats(n, 2);
    g1[10] = std::numeric_limits<float>::infinity();
    std::vector<std::vector<uint8_t>> pushes = {
        testing::Compress(*worker_codec, ConstTensorView(g0.data(), n)),
        testing::Compress(*worker_codec, ConstTensorView(g1.data(), n))};
    const auto want = Unfused(*unfused, pushes, n, 0.5f, &e_unfused, {});
    const auto got = Fused(*fused, pushes, n, 0.5f, &e_fused, {});
    ASSERT_EQ(got, want) << IsaLevelName(isa);
    float scale;
    std::memcpy(&scale, got.data() + kPayloadHeaderBytes, 4);
    EXPECT_TRUE(std::isnan(scale));
    EXPECT_EQ(e_fused, std::vector<float>(n, 0.0f));
  }
}

// ValidatePayload refuses exactly what DecompressAdd refuses, with the same status.
TEST(ServerRound, ValidatePayloadMatchesDecompressAdd) {
  const size_t n = 130;
  for (const char* spec : {"onebit", "onebit:scaled=false", "topk:k=5"}) {
    auto c = Make(spec);
    const std::vector<float> x = RandomFloats(n, 3);
    const auto good = testing::Compress(*c, ConstTensorView(x.data(), n));
    std::vector<std::vector<uint8_t>> cases = {good};
    auto truncated = good;
    truncated.pop_back();
    cases.push_back(truncated);
    for (size_t byte = kPayloadHeaderBytes; byte < good.size(); byte += 3) {
      auto bad = good;
      bad[byte] ^= 0x81;
      cases.push_back(bad);
    }
    for (const auto& p : cases) {
      std::vector<float> acc(n, 0.0f);
      const Status decoded = c->DecompressAdd({p.data(), p.size()}, {acc.data(), n});
      const Status validated = c->ValidatePayload({p.data(), p.size()}, n);
      EXPECT_EQ(validated.code(), decoded.code()) << spec << ": " << decoded.ToString();
      EXPECT_EQ(validated.message(), decoded.message()) << spec;
    }
    EXPECT_FALSE(c->ValidatePayload({good.data(), good.size()}, n + 1).ok()) << spec;
  }
}

TEST(ServerRound, CompressorsThatDoNotFuseSaySo) {
  for (const char* spec : {"none", "fp16", "bf16", "randomk:ratio=0.1", "dithering"}) {
    auto c = Make(spec);
    EXPECT_FALSE(c->FusesServerRound(true)) << spec;
    EXPECT_FALSE(c->FusesServerRound(false)) << spec;
    std::vector<float> e(8, 0.0f);
    std::vector<uint8_t> out(c->MaxCompressedBytes(8, DType::kFloat32));
    std::vector<uint8_t> push = out;
    const std::vector<ByteSpan> pushes = {ByteSpan(push.data(), push.size())};
    EXPECT_EQ(c->AggregateCompress(pushes, 8, 1.0f, e.data(), {}, {out.data(), out.size()})
                  .status()
                  .code(),
              StatusCode::kFailedPrecondition)
        << spec;
  }
  auto topk = Make("topk:k=2");
  EXPECT_TRUE(topk->FusesServerRound(true));
  EXPECT_FALSE(topk->FusesServerRound(false));  // Algorithm 3 takes the unfused path
}

}  // namespace
}  // namespace bitpush::compressors
