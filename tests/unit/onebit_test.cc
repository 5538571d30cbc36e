// Exact math of the scaled 1-bit compressor: sign bits, scale = mean |x|, fused error feedback.
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

std::unique_ptr<Compressor> Make(const char* spec, IsaLevel isa) {
  CompressorOptions o;
  o.isa = isa;
  return std::move(CreateCompressor(spec, o)).value();
}

TEST(Onebit, BitsAndScaleAreExact) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make("onebit", isa);
    const std::vector<float> x = {1.5f, -2.0f, 0.0f, -0.0f, 3.0f, -0.25f, 7.0f, -1.0f, 0.5f};
    std::vector<uint8_t> out(c->MaxCompressedBytes(x.size(), DType::kFloat32));
    auto r = c->Compress(ConstTensorView(x.data(), x.size()), {}, {out.data(), out.size()});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(*r, 16u + 4u + 8u);
    float scale;
    std::memcpy(&scale, out.data() + 16, 4);
    double sum = 0;
    for (float v : x) sum += std::fabs(v);
    EXPECT_EQ(scale, static_cast<float>(sum / x.size()));
    uint64_t word;
    std::memcpy(&word, out.data() + 20, 8);
    // negatives at 1, 5, 7; -0.0 counts as positive
    EXPECT_EQ(word, (1ull << 1) | (1ull << 5) | (1ull << 7)) << IsaLevelName(isa);
    std::vector<float> dec(x.size());
    ASSERT_TRUE(c->Decompress({out.data(), *r}, TensorView(dec.data(), dec.size())).ok());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(dec[i], x[i] < 0 ? -scale : scale) << i;
  }
}

// The sign pass's sum over |x| is the engine's non-finite check: TakeTelemetry reports that
// every value was read (input_checked) and whether one was NaN / inf, scaled or not, with or
// without error feedback, on every ISA level; a second take reports nothing.
TEST(Onebit, TelemetryReportsANonFiniteInputFromTheSignPass) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    for (const char* spec : {"onebit", "onebit:scaled=false"}) {
      for (bool feedback : {false, true}) {
        SCOPED_TRACE(std::string(spec) + (feedback ? " with residual " : " ") +
                     std::string(IsaLevelName(isa)));
        auto c = Make(spec, isa);
        ResidualState residual(300);
        std::vector<float> x = RandomFloats(300, 9);
        std::vector<uint8_t> out(c->MaxCompressedBytes(x.size(), DType::kFloat32));
        for (float bad : {0.0f, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::infinity()}) {
          x[257] = bad;
          const ConstTensorView in(x.data(), x.size());
          const MutableByteSpan dst(out.data(), out.size());
          ASSERT_TRUE(
              (feedback ? residual.Compress(*c, in, {}, dst) : c->Compress(in, {}, dst)).ok());
          SCOPED_TRACE(bad);
          testing::ExpectInputCheck(*c, !std::isfinite(bad));
        }
      }
    }
  }
}

TEST(Onebit, UnscaledIsPlainSign) {
  auto c = Make("onebit:scaled=false", BestIsaLevel());
  const std::vector<float> x = RandomFloats(1000, 4, 5.0f);
  std::vector<uint8_t> out(c->MaxCompressedBytes(x.size(), DType::kFloat32));
  auto r = c->Compress(ConstTensorView(x.data(), x.size()), {}, {out.data(), out.size()});
  ASSERT_TRUE(r.ok());
  std::vector<float> dec(x.size());
  ASSERT_TRUE(c->Decompress({out.data(), *r}, TensorView(dec.data(), dec.size())).ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(dec[i], x[i] < 0 ? -1.0f : 1.0f);
}

TEST(Onebit, FusedErrorFeedbackMatchesDefinition) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make("onebit", isa);
    const size_t n = 4097;
    const std::vector<float> g = RandomFloats(n, 1);
    std::vector<float> e = RandomFloats(n, 2, 0.3f);
    std::vector<float> q(n);
    for (size_t i = 0; i < n; ++i) q[i] = g[i] + e[i];
    // Reference: compress q plainly, e_ref = q - decompress(C(q)).
    std::vector<uint8_t> pq(c->MaxCompressedBytes(n, DType::kFloat32));
    auto rq = c->Compress(ConstTensorView(q.data(), n), {}, {pq.data(), pq.size()});
    ASSERT_TRUE(rq.ok());
    std::vector<float> cq(n);
    ASSERT_TRUE(c->Decompress({pq.data(), *rq}, TensorView(cq.data(), n)).ok());

    ResidualState state(n);
    ASSERT_TRUE(state.Restore({e.data(), n}).ok());
    std::vector<uint8_t> pe(pq.size());
    auto re = state.Compress(*c, ConstTensorView(g.data(), n), {}, {pe.data(), pe.size()});
    ASSERT_TRUE(re.ok());
    EXPECT_EQ(std::vector<uint8_t>(pe.begin(), pe.begin() + *re),
              std::vector<uint8_t>(pq.begin(), pq.begin() + *rq));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(state.residual()[i], q[i] - cq[i]) << i;
  }
}

TEST(Onebit, RejectsBadBodies) {
  auto c = Make("onebit", BestIsaLevel());
  const std::vector<float> x = RandomFloats(10, 3);
  std::vector<uint8_t> out(c->MaxCompressedBytes(10, DType::kFloat32));
  auto r = c->Compress(ConstTensorView(x.data(), 10), {}, {out.data(), out.size()});
  ASSERT_TRUE(r.ok());
  out.resize(*r);
  std::vector<float> acc(10);
  auto bad = out;
  bad[20 + 1] |= 0x80;  // bit 15: past element 9
  EXPECT_EQ(c->DecompressAdd({bad.data(), bad.size()}, {acc.data(), 10}).code(),
            StatusCode::kDataLoss);
  bad = out;
  const float neg = -1.0f;
  std::memcpy(bad.data() + 16, &neg, 4);
  EXPECT_NE(c->DecompressAdd({bad.data(), bad.size()}, {acc.data(), 10}).message().find("negative"),
            std::string::npos);
  for (float v : acc) EXPECT_EQ(v, 0.0f);
}

TEST(ResidualState, RestoreChecksSize) {
  ResidualState s(4);
  std::vector<float> wrong(3);
  EXPECT_EQ(s.Restore({wrong.data(), 3}).code(), StatusCode::kInvalidArgument);
  for (float v : s.residual()) EXPECT_EQ(v, 0.0f);
}

// Decompress into a large fp32 tensor takes the non-temporal path (AVX-512, from 64 Ki
// elements): at every alignment of the output, and with sign words straddling its vectors, the
// values equal DecompressToFloat's and nothing outside the tensor is written.
TEST(Onebit, StreamingDecompressMatchesAtEveryAlignment) {
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make("onebit", isa);
    for (size_t n : {size_t{65536}, size_t{65536 + 37}, size_t{200003}}) {
      const std::vector<float> x = RandomFloats(n, n);
      std::vector<uint8_t> payload(c->MaxCompressedBytes(n, DType::kFloat32));
      auto bytes = c->Compress(ConstTensorView(x.data(), n), {}, {payload.data(), payload.size()});
      ASSERT_TRUE(bytes.ok());
      payload.resize(*bytes);
      std::vector<float> want(n);
      ASSERT_TRUE(c->DecompressToFloat({payload.data(), payload.size()}, {want.data(), n}).ok());
      for (size_t offset = 0; offset < 17; ++offset) {
        std::vector<float> buf(n + 40, 7.0f);
        float* out = buf.data() + offset;
        ASSERT_TRUE(c->Decompress({payload.data(), payload.size()}, TensorView(out, n)).ok());
        ASSERT_EQ(0, std::memcmp(out, want.data(), n * 4))
            << IsaLevelName(isa) << " n " << n << " offset " << offset;
        for (size_t i = 0; i < offset; ++i) ASSERT_EQ(buf[i], 7.0f);
        for (size_t i = offset + n; i < buf.size(); ++i) ASSERT_EQ(buf[i], 7.0f);
      }
    }
  }
}

// The SIMD pass 1 runs whole 64-element words with plain loads and only the last, partial word
// masked: around every word boundary the payload and the residual equal the scalar level's.
TEST(Onebit, FullWordsAndPartialLastWordMatchScalar) {
  auto scalar = Make("onebit", IsaLevel::kScalar);
  for (IsaLevel isa : SupportedIsaLevels()) {
    auto c = Make("onebit", isa);
    for (size_t n : {size_t{15}, size_t{16}, size_t{63}, size_t{64}, size_t{65}, size_t{127},
                     size_t{128}, size_t{129}, size_t{191}, size_t{1000}}) {
      const std::vector<float> g = RandomFloats(n, 10 + n);
      const std::vector<float> e0 = RandomFloats(n, 20 + n, 0.3f);
      std::vector<uint8_t> want(scalar->MaxCompressedBytes(n, DType::kFloat32)), got(want.size());
      auto rw = scalar->Compress(ConstTensorView(g.data(), n), {}, {want.data(), want.size()});
      auto rg = c->Compress(ConstTensorView(g.data(), n), {}, {got.data(), got.size()});
      ASSERT_TRUE(rw.ok() && rg.ok());
      ASSERT_EQ(want, got) << IsaLevelName(isa) << " compress n " << n;
      std::vector<float> ew = e0, eg = e0;
      rw = scalar->CompressWithFeedback(ConstTensorView(g.data(), n), {ew.data(), n}, {},
                                        {want.data(), want.size()});
      rg = c->CompressWithFeedback(ConstTensorView(g.data(), n), {eg.data(), n}, {},
                                   {got.data(), got.size()});
      ASSERT_TRUE(rw.ok() && rg.ok());
      ASSERT_EQ(want, got) << IsaLevelName(isa) << " compress_ef n " << n;
      ASSERT_EQ(0, std::memcmp(ew.data(), eg.data(), n * 4)) << IsaLevelName(isa) << " n " << n;
    }
  }
}

}  // namespace
}  // namespace bitpush::compressors
