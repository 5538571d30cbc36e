// The server's per-key aggregation (Algorithms 3 and 4): the published payload equals a
// reference computed here with the same compressor functions, rounds never overwrite each
// other, bad pushes are refused without harming the round, memory is bounded.
#include "server/key_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "compressors/registry.h"
#include "tests/unit/compressor_test_util.h"
#include "tests/unit/test_util.h"

namespace bitpush::server {
namespace {

using bitpush::testing::Compress;
using bitpush::testing::RandomFloats;
using compressors::Compressor;

std::unique_ptr<KeyState> Make(const std::string& spec, uint32_t workers, bool server_ef,
                               size_t n = 1000) {
  KeySpec k;
  k.key = 42;
  k.elements = n;
  k.compressor = *compressors::ParseCompressorSpec(spec);
  k.server_residual = server_ef;
  k.num_workers = workers;
  auto s = KeyState::Create(k);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

std::unique_ptr<Compressor> Codec(const std::string& spec) {
  return std::move(compressors::CreateCompressor(spec)).value();
}

std::vector<uint8_t> Bytes(const transport::Buffer& b) {
  return std::vector<uint8_t>(b.data(), b.data() + b.size());
}

// Reference of one round: acc = Σ decompress(push_i) in rank order, times 1/n, then
// C(acc) (Algorithm 3) or C(acc + e) with e updated (Algorithm 4).
std::vector<uint8_t> Reference(Compressor& c, const std::vector<std::vector<uint8_t>>& pushes,
                               size_t n, uint64_t round, std::vector<float>* residual) {
  std::vector<float> acc(n, 0.0f);
  for (const auto& p : pushes)
    EXPECT_TRUE(c.DecompressAdd({p.data(), p.size()}, {acc.data(), n}).ok());
  const float inv = 1.0f / static_cast<float>(pushes.size());
  if (pushes.size() > 1) {
    for (float& v : acc) v *= inv;
  }
  std::vector<uint8_t> out(c.MaxCompressedBytes(n, DType::kFloat32));
  const compressors::CompressContext ctx{42, round, kServerStream};  // the server's stream
  StatusOr<size_t> r =
      residual ? c.CompressWithFeedback(ConstTensorView(acc.data(), n), {residual->data(), n}, ctx,
                                        {out.data(), out.size()})
               : c.Compress(ConstTensorView(acc.data(), n), ctx, {out.data(), out.size()});
  EXPECT_TRUE(r.ok());
  out.resize(*r);
  return out;
}

TEST(KeyState, NoneGivesTheExactAverage) {
  auto k = Make("none", 3, false, 257);
  auto codec = Codec("none");
  std::vector<std::vector<float>> g;
  for (uint32_t w = 0; w < 3; ++w) {
    g.push_back(RandomFloats(257, w));
    const auto p = Compress(*codec, ConstTensorView(g[w].data(), 257));
    ASSERT_TRUE(k->Push(w, 0, {p.data(), p.size()}).ok());
  }
  auto pulled = k->Pull(1, 0);
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  std::vector<float> avg(257);
  ASSERT_TRUE(codec->Decompress(pulled->span(), TensorView(avg.data(), 257)).ok());
  for (size_t i = 0; i < 257; ++i) {
    const float want = ((0.0f + g[0][i]) + g[1][i] + g[2][i]) * (1.0f / 3.0f);
    ASSERT_EQ(avg[i], want) << i;
  }
}

TEST(KeyState, NoneRepliesFromItsAccumulatorAndReusesItOnceReleased) {
  // `none` on an fp32 key whose pushes someone else still holds (so none is summed into): the
  // slot's accumulator is the reply's body (no copy into a payload), and a slot reuses its
  // buffer only once nobody holds the last reply.
  auto k = Make("none", 2, false, 1000);
  auto codec = Codec("none");
  const uint8_t* first = nullptr;
  transport::Buffer kept;
  for (uint64_t round = 0; round < 6; ++round) {
    std::vector<transport::Buffer> held;
    std::vector<float> sum(1000, 0.0f);
    for (uint32_t w = 0; w < 2; ++w) {
      const auto g = RandomFloats(1000, 10 * round + w);
      for (size_t i = 0; i < 1000; ++i) sum[i] = w == 0 ? g[i] : sum[i] + g[i];
      const auto p = Compress(*codec, ConstTensorView(g.data(), 1000));
      held.push_back(transport::Buffer::Copy(p.data(), p.size()));
      ASSERT_TRUE(k->Push(w, round, held.back()).ok());  // shared: not adopted
    }
    auto a = k->Pull(0, round);
    auto b = k->Pull(1, round);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->data(), b->data());  // one buffer for everyone
    std::vector<float> got(1000);
    ASSERT_TRUE(codec->Decompress(a->span(), TensorView(got.data(), 1000)).ok());
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(got[i], sum[i] * 0.5f) << i;
    if (round == 0) first = a->data();
    if (round == 2) EXPECT_EQ(a->data(), first) << "round 2 reuses round 0's released buffer";
    if (round == 2) kept = *a;  // held past its round, as by a slow transport
    if (round == 4) EXPECT_NE(a->data(), first) << "a buffer still held is not written into";
  }
  std::vector<float> got(1000);
  ASSERT_TRUE(codec->Decompress(kept.span(), TensorView(got.data(), 1000)).ok());
  const auto g0 = RandomFloats(1000, 20), g1 = RandomFloats(1000, 21);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(got[i], (g0[i] + g1[i]) * 0.5f) << i;
}

TEST(KeyState, NoneSumsIntoRankZerosPushWhenNobodyElseHoldsIt) {
  // A received push that only the key holds becomes the accumulator and the reply (no copy);
  // one that someone else still refers to is never written.
  auto k = Make("none", 3, false, 777);
  auto codec = Codec("none");
  std::vector<std::vector<float>> g;
  std::vector<transport::Buffer> pushes;
  for (uint32_t w = 0; w < 3; ++w) {
    g.push_back(RandomFloats(777, 40 + w));
    const auto p = Compress(*codec, ConstTensorView(g[w].data(), 777));
    pushes.push_back(transport::Buffer::Copy(p.data(), p.size()));
  }
  const uint8_t* rank0 = pushes[0].data();
  // Arrival order 2, 0, 1: rank 0's push is added first (rank order) and adopted.
  ASSERT_TRUE(k->Push(2, 0, std::move(pushes[2])).ok());
  ASSERT_TRUE(k->Push(0, 0, std::move(pushes[0])).ok());
  ASSERT_TRUE(k->Push(1, 0, std::move(pushes[1])).ok());
  auto pulled = k->Pull(0, 0);
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(pulled->data(), rank0) << "the reply is rank 0's push, summed in place";
  std::vector<float> avg(777);
  ASSERT_TRUE(codec->Decompress(pulled->span(), TensorView(avg.data(), 777)).ok());
  for (size_t i = 0; i < 777; ++i) {
    ASSERT_EQ(avg[i], ((0.0f + g[0][i]) + g[1][i] + g[2][i]) * (1.0f / 3.0f)) << i;
  }
  for (uint32_t w = 1; w < 3; ++w) ASSERT_TRUE(k->Pull(w, 0).ok());

  // Round 1: the test keeps a reference to rank 0's push: it must stay as it was.
  std::vector<transport::Buffer> kept;
  for (uint32_t w = 0; w < 3; ++w) {
    const auto p = Compress(*codec, ConstTensorView(g[w].data(), 777));
    kept.push_back(transport::Buffer::Copy(p.data(), p.size()));
    ASSERT_TRUE(k->Push(w, 1, kept.back()).ok());
  }
  auto again = k->Pull(0, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->data(), kept[0].data());
  std::vector<float> untouched(777);
  ASSERT_TRUE(codec->Decompress(kept[0].span(), TensorView(untouched.data(), 777)).ok());
  for (size_t i = 0; i < 777; ++i) ASSERT_EQ(untouched[i], g[0][i]) << i;
  ASSERT_TRUE(codec->Decompress(again->span(), TensorView(avg.data(), 777)).ok());
  for (size_t i = 0; i < 777; ++i) {
    ASSERT_EQ(avg[i], ((0.0f + g[0][i]) + g[1][i] + g[2][i]) * (1.0f / 3.0f)) << i;
  }
}

class KeyStateAlgorithms : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// Every compressor, Algorithms 3 and 4, 3 workers, 20 rounds: the published bytes equal the
// reference bit for bit, and every worker pulls the same bytes.
TEST_P(KeyStateAlgorithms, PublishedPayloadEqualsReference) {
  const std::string spec = std::get<0>(GetParam());
  const bool ef = std::get<1>(GetParam());
  const size_t n = 4097;
  auto k = Make(spec, 3, ef, n);
  auto codec = Codec(spec);
  auto ref_codec = Codec(spec);
  std::vector<float> ref_residual(n, 0.0f);
  for (uint64_t round = 0; round < 20; ++round) {
    std::vector<std::vector<uint8_t>> pushes(3);  // by rank
    // Arrival order differs from rank order (and from round to round); the server adds in
    // rank order, so the result is the same bits whatever the order.
    const uint32_t orders[3][3] = {{2, 0, 1}, {1, 2, 0}, {0, 1, 2}};
    for (uint32_t w : orders[round % 3]) {
      const auto g = RandomFloats(n, 100 * round + w);
      pushes[w] = Compress(*codec, ConstTensorView(g.data(), n), {42, round, w});
      ASSERT_TRUE(k->Push(w, round, {pushes[w].data(), pushes[w].size()}).ok());
    }
    const auto want = Reference(*ref_codec, pushes, n, round, ef ? &ref_residual : nullptr);
    for (uint32_t w = 0; w < 3; ++w) {
      auto pulled = k->Pull(w, round);
      ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
      ASSERT_EQ(Bytes(*pulled), want) << spec << " round " << round << " worker " << w;
    }
  }
  if (ef) {
    ASSERT_EQ(k->server_residual().size(), n);
    EXPECT_EQ(0, std::memcmp(k->server_residual().data(), ref_residual.data(), n * 4));
  }
  EXPECT_EQ(k->stats().rounds_published, 20u);
  EXPECT_EQ(k->stats().pushes_accepted, 60u);
  EXPECT_EQ(k->stats().pushes_rejected, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Compressors, KeyStateAlgorithms,
    ::testing::Combine(::testing::Values("none", "fp16", "onebit", "topk:ratio=0.01",
                                         "randomk:ratio=0.03125,seed=3",
                                         "dithering:levels=15,partition=linear,norm=max"),
                       ::testing::Bool()),
    [](const auto& info) {
      std::string s = std::get<0>(info.param) + (std::get<1>(info.param) ? "_alg4" : "_alg3");
      for (char& c : s) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return s;
    });

// A held push (it arrived before a lower rank's) with a malformed body is refused when its
// turn comes; the round stays open, and the worker's second try completes it.
TEST(KeyState, HeldPushWithABadBodyIsRefusedLateAndCanBeRetried) {
  auto k = Make("topk:k=4", 2, false, 64);
  auto codec = Codec("topk:k=4");
  const auto g0 = RandomFloats(64, 1);
  const auto g1 = RandomFloats(64, 2);
  const auto p0 = Compress(*codec, ConstTensorView(g0.data(), 64), {42, 0});
  const auto p1 = Compress(*codec, ConstTensorView(g1.data(), 64), {42, 0});
  auto bad = p1;
  // The header and the length are fine; the first index (body offset 4) is out of range.
  const uint32_t index = 64;
  std::memcpy(bad.data() + compressors::kPayloadHeaderBytes + 4, &index, 4);
  ASSERT_TRUE(k->Push(1, 0, {bad.data(), bad.size()}).ok());  // held: rank 0 first
  EXPECT_TRUE(k->TakeLateRejections().empty());
  ASSERT_TRUE(k->Push(0, 0, {p0.data(), p0.size()}).ok());
  auto late = k->TakeLateRejections();
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].worker, 1u);
  EXPECT_EQ(late[0].round, 0u);
  EXPECT_EQ(late[0].status.code(), StatusCode::kDataLoss) << late[0].status.ToString();
  EXPECT_NE(late[0].status.message().find("worker 1"), std::string::npos);
  EXPECT_FALSE(k->RoundPublished(0));
  EXPECT_EQ(k->stats().pushes_rejected, 1u);
  ASSERT_TRUE(k->Push(1, 0, {p1.data(), p1.size()}).ok());
  ASSERT_TRUE(k->RoundPublished(0));
  auto codec2 = Codec("topk:k=4");
  std::vector<std::vector<uint8_t>> pushes = {p0, p1};
  const auto want = Reference(*codec2, pushes, 64, 0, nullptr);
  auto pulled = k->Pull(0, 0);
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(Bytes(*pulled), want);
}

TEST(KeyState, FastWorkerNextRoundDoesNotTouchTheRoundASlowWorkerStillPulls) {
  auto k = Make("none", 2, false, 8);
  auto codec = Codec("none");
  auto push = [&](uint32_t w, uint64_t r, float v) {
    const std::vector<float> g(8, v);
    const auto p = Compress(*codec, ConstTensorView(g.data(), 8));
    return k->Push(w, r, {p.data(), p.size()});
  };
  ASSERT_TRUE(push(0, 0, 1.0f).ok());
  ASSERT_TRUE(push(1, 0, 3.0f).ok());
  ASSERT_TRUE(k->Pull(0, 0).ok());  // worker 0 is fast: pulls round 0, pushes round 1
  ASSERT_TRUE(push(0, 1, 100.0f).ok());
  auto slow = k->Pull(1, 0);  // worker 1 still gets round 0's average
  ASSERT_TRUE(slow.ok());
  std::vector<float> v(8);
  ASSERT_TRUE(codec->Decompress(slow->span(), TensorView(v.data(), 8)).ok());
  for (float x : v) EXPECT_EQ(x, 2.0f);
  // Round 0 is released once both pulled it; round 1 is now the oldest held.
  EXPECT_EQ(k->oldest_round(), 1u);
}

TEST(KeyState, RoundWindowIsBounded) {
  auto k = Make("none", 2, false, 4);
  auto codec = Codec("none");
  const std::vector<float> g(4, 1.0f);
  const auto p = Compress(*codec, ConstTensorView(g.data(), 4));
  // Worker 0 runs ahead without anyone pulling: rounds 0 and 1 are held, round 2 is refused.
  ASSERT_TRUE(k->Push(0, 0, {p.data(), p.size()}).ok());
  ASSERT_TRUE(k->Push(0, 1, {p.data(), p.size()}).ok());
  const Status s = k->Push(0, 2, {p.data(), p.size()});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("at most 2 rounds"), std::string::npos) << s.message();
  EXPECT_EQ(k->stats().pushes_rejected, 1u);
  // Once round 0 completes and is pulled by both, round 2 fits.
  ASSERT_TRUE(k->Push(1, 0, {p.data(), p.size()}).ok());
  ASSERT_TRUE(k->Pull(0, 0).ok());
  ASSERT_TRUE(k->Pull(1, 0).ok());
  EXPECT_TRUE(k->Push(0, 2, {p.data(), p.size()}).ok());
}

TEST(KeyState, BadPushesAreRefusedAndTheRoundSurvives) {
  auto k = Make("onebit", 2, true, 100);
  auto codec = Codec("onebit");
  const auto g0 = RandomFloats(100, 1), g1 = RandomFloats(100, 2);
  const auto p0 = Compress(*codec, ConstTensorView(g0.data(), 100), {42, 0});
  const auto p1 = Compress(*codec, ConstTensorView(g1.data(), 100), {42, 0});
  ASSERT_TRUE(k->Push(0, 0, {p0.data(), p0.size()}).ok());

  auto expect = [&](Status s, StatusCode code, const char* needle) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect(k->Push(0, 0, {p0.data(), p0.size()}), StatusCode::kInvalidArgument, "second push");
  expect(k->Push(5, 0, {p1.data(), p1.size()}), StatusCode::kInvalidArgument, "worker 5");
  const auto other = Compress(*Codec("topk:ratio=0.1"), ConstTensorView(g1.data(), 100));
  expect(k->Push(1, 0, {other.data(), other.size()}), StatusCode::kInvalidArgument, "uses onebit");
  const auto g_short = RandomFloats(99, 3);
  const auto short_p = Compress(*codec, ConstTensorView(g_short.data(), 99));
  expect(k->Push(1, 0, {short_p.data(), short_p.size()}), StatusCode::kInvalidArgument,
         "99 elements");
  auto truncated = p1;
  truncated.resize(truncated.size() - 3);
  expect(k->Push(1, 0, {truncated.data(), truncated.size()}), StatusCode::kDataLoss, "key 42");
  auto bad_bits = p1;
  bad_bits.back() = 0xFF;  // sign bits past element 99
  expect(k->Push(1, 0, {bad_bits.data(), bad_bits.size()}), StatusCode::kDataLoss, "onebit");
  expect(k->Push(1, 1, {p1.data(), p1.size()}), StatusCode::kFailedPrecondition, "before round 0");
  EXPECT_EQ(k->stats().pushes_rejected, 7u);

  // The real push still completes the round, and the result is untouched by the bad ones.
  ASSERT_TRUE(k->Push(1, 0, {p1.data(), p1.size()}).ok());
  std::vector<float> ref_e(100, 0.0f);
  const auto want = Reference(*Codec("onebit"), {p0, p1}, 100, 0, &ref_e);
  auto pulled = k->Pull(0, 0);
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(Bytes(*pulled), want);
}

TEST(KeyState, PullsBeforeCompletionNameTheMissingWorkers) {
  auto k = Make("fp16", 3, false, 10);
  auto codec = Codec("fp16");
  const auto g = RandomFloats(10, 1);
  const auto p = Compress(*codec, ConstTensorView(g.data(), 10));
  auto early = k->Pull(0, 0);
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(k->Push(1, 0, {p.data(), p.size()}).ok());
  early = k->Pull(0, 0);
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(early.status().message().find("workers 0, 2"), std::string::npos)
      << early.status().message();
  ASSERT_TRUE(k->Push(0, 0, {p.data(), p.size()}).ok());
  ASSERT_TRUE(k->Push(2, 0, {p.data(), p.size()}).ok());
  ASSERT_TRUE(k->Pull(0, 0).ok());
  EXPECT_EQ(k->Pull(0, 0).status().code(), StatusCode::kInvalidArgument);  // second pull
}

TEST(KeyState, ServerResidualTelescopesAndSlotsAreReused) {
  const size_t n = 2048;
  auto k = Make("topk:ratio=0.01", 2, true, n);
  auto codec = Codec("topk:ratio=0.01");
  std::vector<double> sum_avg(n, 0.0), sum_pub(n, 0.0);
  for (uint64_t round = 0; round < 200; ++round) {
    std::vector<float> dec_sum(n, 0.0f);
    for (uint32_t w = 0; w < 2; ++w) {
      const auto g = RandomFloats(n, 7 * round + w);
      const auto p = Compress(*codec, ConstTensorView(g.data(), n));
      ASSERT_TRUE(codec->DecompressAdd({p.data(), p.size()}, {dec_sum.data(), n}).ok());
      ASSERT_TRUE(k->Push(w, round, {p.data(), p.size()}).ok());
    }
    for (size_t i = 0; i < n; ++i) sum_avg[i] += dec_sum[i] * 0.5f;
    auto a = k->Pull(0, round);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(k->Pull(1, round).ok());
    std::vector<float> pub(n, 0.0f);
    ASSERT_TRUE(codec->DecompressAdd(a->span(), {pub.data(), n}).ok());
    for (size_t i = 0; i < n; ++i) sum_pub[i] += pub[i];
  }
  // Nothing is lost, only delayed: Σ published + ẽ = Σ averages.
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sum_pub[i] + k->server_residual()[i], sum_avg[i], 1e-3) << i;
  }
  EXPECT_EQ(k->oldest_round(), 200u);
}

TEST(KeyState, AResidualRestoredBetweenRoundsContinuesTheRunExactly) {
  // Checkpoint restore (OP_STATE_WRITE): a key restored with another key's residual after
  // round 0 publishes round 1 exactly as that key does; a round is open from its first push
  // until every worker pulled it.
  const size_t n = 512;
  auto a = Make("onebit", 2, true, n);
  auto b = Make("onebit", 2, true, n);
  auto codec = Codec("onebit");
  // The gradients of training step `step`, pushed as round `round`.
  auto push_round = [&](KeyState& k, uint64_t round, uint64_t step) {
    for (uint32_t w = 0; w < 2; ++w) {
      const auto g = RandomFloats(n, 11 * step + w);
      const auto p = Compress(*codec, ConstTensorView(g.data(), n));
      EXPECT_TRUE(k.Push(w, round, {p.data(), p.size()}).ok());
      if (w == 0) EXPECT_TRUE(k.RoundOpen());
    }
  };
  EXPECT_FALSE(a->RoundOpen());
  push_round(*a, 0, 0);
  ASSERT_TRUE(a->Pull(0, 0).ok());
  EXPECT_TRUE(a->RoundOpen());  // worker 1 has not pulled yet
  ASSERT_TRUE(a->Pull(1, 0).ok());
  EXPECT_FALSE(a->RoundOpen());
  const std::vector<float> saved(a->server_residual().begin(), a->server_residual().end());
  ASSERT_TRUE(b->RestoreServerResidual(saved).ok());
  push_round(*a, 1, 1);
  // b starts its own round numbering at 0, as a new cluster does.
  push_round(*b, 0, 1);
  auto pa = a->Pull(0, 1);
  auto pb = b->Pull(0, 0);
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(Bytes(*pa), Bytes(*pb));
  EXPECT_EQ(0, std::memcmp(a->server_residual().data(), b->server_residual().data(), n * 4));
  EXPECT_FALSE(b->RestoreServerResidual(std::vector<float>(n - 1)).ok());  // size must match
}

}  // namespace
}  // namespace bitpush::server
