// compressors/mirror_pull.h: weight pulls in difference-against-receiver form. Receivers stay
// bit-identical to the sender's mirror for every compressor; the mirror's error stays bounded
// (qWD) where independently compressed updates drift; the paper's Counterexample 4.1 — raw
// ternary weights stall at (1, −1), the difference form converges; raw-form refusals; a bad
// payload changes nothing.
#include "compressors/mirror_pull.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"

namespace bitpush::compressors {
namespace {

std::unique_ptr<Compressor> Make(const std::string& spec) {
  auto c = CreateCompressor(spec);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status().ToString();
  return std::move(*c);
}

std::vector<float> Normal(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The bit patterns of v (bit-for-bit comparisons).
std::vector<uint32_t> Bits(Span<const float> v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), 4 * v.size());
  return b;
}

// The counterexample's coin flips, the same sequence for both forms.
std::mt19937 Coins(uint32_t seed) {
  return std::mt19937(seed);
}

float MaxAbsDiff(const std::vector<float>& a, Span<const float> b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// A server's master weights take SGD-like steps; three receivers apply every pull. They equal
// the mirror bit for bit after every step, whatever the compressor (biased ones included).
TEST(MirrorPullTest, ReceiversEqualTheMirrorBitForBitForEveryCompressor) {
  const size_t n = 5000;
  for (const std::string spec : {"sdp4bit:hadamard=off,group=2048", "fp16", "onebit",
                                 "topk:ratio=0.05", "dithering", "sdp4bit:bits=8,group=128"}) {
    SCOPED_TRACE(spec);
    auto c = Make(spec);
    CompressorPullCodec codec(c.get());
    std::vector<float> w = Normal(n, 1, 1.0f);
    MirrorPull pull(&codec, {w.data(), n});
    std::vector<std::vector<float>> receivers(3, w);
    std::vector<uint8_t> payload(codec.MaxBytes(n));
    for (uint64_t t = 1; t <= 25; ++t) {
      const std::vector<float> g = Normal(n, 100 + t, 1.0f);
      for (size_t i = 0; i < n; ++i) w[i] -= 0.01f * g[i];
      auto bytes =
          pull.Encode({w.data(), n}, {7, t, kServerStream}, {payload.data(), payload.size()});
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      for (auto& r : receivers) {
        ASSERT_TRUE(ApplyMirrorPull(codec, {payload.data(), *bytes}, {r.data(), n}).ok());
        ASSERT_EQ(Bits({r.data(), n}), Bits(pull.mirror())) << "step " << t;
      }
    }
    // Tracking: the receivers are closer to the weights than if nothing had been pulled.
    const std::vector<float> w0 = Normal(n, 1, 1.0f);
    EXPECT_LT(MaxAbsDiff(w, pull.mirror()), MaxAbsDiff(w, {w0.data(), n}));
  }
}

// qWD (INT4, G = 2048, stochastic rounding once at the sender): the mirror's error never exceeds
// half the largest single update, over 300 steps; adding independently quantised updates
// instead (the receivers' copy without the difference form) drifts several times further.
TEST(MirrorPullTest, QwdErrorStaysBoundedWhereIndependentlyQuantisedUpdatesDrift) {
  const size_t n = 4096;
  auto c = Make("sdp4bit:hadamard=off,group=2048");
  CompressorPullCodec codec(c.get());
  std::vector<float> w = Normal(n, 2, 1.0f);
  std::vector<float> drifted = w;
  MirrorPull pull(&codec, {w.data(), n});
  std::vector<uint8_t> payload(codec.MaxBytes(n));
  float max_update = 0.0f;
  for (uint64_t t = 1; t <= 300; ++t) {
    const std::vector<float> delta = Normal(n, 1000 + t, 1e-3f);
    for (size_t i = 0; i < n; ++i) {
      w[i] += delta[i];
      max_update = std::max(max_update, std::fabs(delta[i]));
    }
    ASSERT_TRUE(
        pull.Encode({w.data(), n}, {3, t, kServerStream}, {payload.data(), payload.size()}).ok());
    ASSERT_LE(MaxAbsDiff(w, pull.mirror()), 0.5f * max_update) << "step " << t;
    // Without the difference form: the update itself, quantised and added.
    auto bytes =
        c->Compress(ConstTensorView(delta.data(), n), {3, t, 5}, {payload.data(), payload.size()});
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(c->DecompressAdd({payload.data(), *bytes}, {drifted.data(), n}).ok());
  }
  EXPECT_GT(MaxAbsDiff(w, {drifted.data(), n}), 3.0f * MaxAbsDiff(w, pull.mirror()));
}

// The nearest ternary quantiser of the paper's Counterexample 4.1: s = max |v|, each value
// rounded to the nearest of {−s, 0, s}. Biased and deterministic. Payload: s (fp32), then one
// int8 code per value.
class TernaryCodec final : public PullCodec {
 public:
  size_t MaxBytes(size_t n) const override { return 4 + n; }
  StatusOr<size_t> Encode(Span<const float> v, const CompressContext&,
                          MutableByteSpan out) override {
    float s = 0.0f;
    for (float x : v) s = std::max(s, std::fabs(x));
    std::memcpy(out.data(), &s, 4);
    for (size_t i = 0; i < v.size(); ++i) {
      out[4 + i] =
          static_cast<uint8_t>(static_cast<int8_t>(s > 0.0f ? std::nearbyint(v[i] / s) : 0.0f));
    }
    return 4 + v.size();
  }
  Status DecodeAdd(ByteSpan payload, Span<float> acc) override {
    if (payload.size() != 4 + acc.size()) return InvalidArgumentError("ternary: bad size");
    float s;
    std::memcpy(&s, payload.data(), 4);
    for (size_t i = 0; i < acc.size(); ++i) {
      acc[i] += static_cast<float>(static_cast<int8_t>(payload[4 + i])) * s;
    }
    return Status::Ok();
  }
};

// f(w) = |w|², the stochastic gradient (4 w1, 0) or (0, 4 w2) with probability 1/2 each,
// w = (1, −1), η = 0.1 < 1/8. Workers compute gradients at the weights they hold.
TEST(MirrorPullTest, CounterexampleRawTernaryWeightsStallWhileTheDifferenceFormConverges) {
  constexpr float kEta = 0.1f;
  TernaryCodec ternary;
  std::vector<uint8_t> payload(ternary.MaxBytes(2));
  auto gradient = [](const float* held, std::mt19937& rng) {
    std::vector<float> g(2, 0.0f);
    const int coord = std::bernoulli_distribution(0.5)(rng) ? 0 : 1;
    g[coord] = 4.0f * held[coord];
    return g;
  };

  // Raw-weight form: the server quantises its weights; workers hold q(w).
  {
    std::mt19937 rng = Coins(1);
    std::vector<float> w = {1.0f, -1.0f};
    std::vector<float> held = w;
    for (int t = 0; t < 200; ++t) {
      const std::vector<float> g = gradient(held.data(), rng);
      for (int i = 0; i < 2; ++i) w[i] = held[i] - kEta * g[i];
      auto bytes = ternary.Encode({w.data(), 2}, {}, {payload.data(), payload.size()});
      ASSERT_TRUE(bytes.ok());
      std::vector<float> q(2, 0.0f);
      ASSERT_TRUE(ternary.DecodeAdd({payload.data(), *bytes}, {q.data(), 2}).ok());
      held = q;
      ASSERT_EQ(held, (std::vector<float>{1.0f, -1.0f})) << "step " << t;  // stuck
    }
  }
  // Difference form: every difference has one nonzero coordinate, which the ternary quantiser
  // represents exactly, so the workers follow plain SGD to the optimum.
  {
    std::mt19937 rng = Coins(1);
    std::vector<float> w = {1.0f, -1.0f};
    MirrorPull pull(&ternary, {w.data(), 2});
    std::vector<float> held = w;
    for (int t = 0; t < 200; ++t) {
      const std::vector<float> g = gradient(held.data(), rng);
      for (int i = 0; i < 2; ++i) w[i] -= kEta * g[i];
      auto bytes = pull.Encode({w.data(), 2}, {}, {payload.data(), payload.size()});
      ASSERT_TRUE(bytes.ok());
      ASSERT_TRUE(ApplyMirrorPull(ternary, {payload.data(), *bytes}, {held.data(), 2}).ok());
      ASSERT_EQ(held, w) << "step " << t;
    }
    EXPECT_LT(std::fabs(held[0]) + std::fabs(held[1]), 1e-6f);
  }
}

TEST(MirrorPullTest, RawWeightPullsAreRefusedForBiasedMethodsOnly) {
  for (const std::string spec :
       {"none", "fp16", "bf16", "dithering", "sdp4bit", "randomk:ratio=0.1,unbiased=true"}) {
    auto cfg = ParseCompressorSpec(spec);
    ASSERT_TRUE(cfg.ok()) << spec;
    EXPECT_TRUE(CheckRawWeightPull(*cfg).ok()) << spec;
  }
  for (const std::string spec : {"onebit", "topk:ratio=0.01", "loco", "randomk:ratio=0.1"}) {
    auto cfg = ParseCompressorSpec(spec);
    ASSERT_TRUE(cfg.ok()) << spec;
    const Status st = CheckRawWeightPull(*cfg);
    EXPECT_FALSE(st.ok()) << spec;
    EXPECT_NE(st.message().find("Counterexample 4.1"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(std::string(spec.substr(0, spec.find(':')))), std::string::npos);
  }
}

TEST(MirrorPullTest, ABadPayloadOrSizeChangesNothing) {
  const size_t n = 256;
  auto c = Make("sdp4bit:hadamard=off,group=128");
  CompressorPullCodec codec(c.get());
  std::vector<float> w = Normal(n, 3, 1.0f);
  MirrorPull pull(&codec, {w.data(), n});
  std::vector<uint8_t> payload(codec.MaxBytes(n));
  for (float& x : w) x += 0.5f;
  auto bytes = pull.Encode({w.data(), n}, {1, 1, kServerStream}, {payload.data(), payload.size()});
  ASSERT_TRUE(bytes.ok());
  std::vector<float> held = Normal(n, 3, 1.0f);
  const std::vector<float> before = held;
  // Truncated payload, then one for another size: refused, weights untouched.
  EXPECT_FALSE(ApplyMirrorPull(codec, {payload.data(), *bytes - 1}, {held.data(), n}).ok());
  EXPECT_FALSE(ApplyMirrorPull(codec, {payload.data(), *bytes}, {held.data(), n - 1}).ok());
  EXPECT_EQ(held, before);
  const std::vector<float> mirror(pull.mirror().begin(), pull.mirror().end());
  const std::vector<float> short_w(n - 1, 0.0f);
  EXPECT_NE(
      pull.Encode({short_w.data(), n - 1}, {1, 2, kServerStream}, {payload.data(), payload.size()})
          .status()
          .message()
          .find("255 elements"),
      std::string::npos);
  EXPECT_FALSE(pull.SetMirror({short_w.data(), n - 1}).ok());
  EXPECT_EQ(std::vector<float>(pull.mirror().begin(), pull.mirror().end()), mirror);
}

}  // namespace
}  // namespace bitpush::compressors
