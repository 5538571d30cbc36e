// KeyState with a server-side optimizer (KeySpec::optimizer): the server's weights equal the
// same ParamState run in one process on the average gradient, bit for bit, for sgd / adamw /
// lans and pushes of any compressor; workers applying the published pulls hold exactly the
// server's mirror (difference form) or its weights (raw fp32); a restored state continues bit
// for bit; and the refusals name their reason.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/counter_rng.h"
#include "compressors/mirror_pull.h"
#include "compressors/registry.h"
#include "compressors/spec_registry.h"
#include "optimizers/param_state.h"
#include "server/key_state.h"
#include "tests/unit/compressor_test_util.h"
#include "tests/unit/test_util.h"

namespace bitpush::server {
namespace {

using bitpush::testing::Compress;
using bitpush::testing::RandomFloats;
using compressors::Compressor;
using optimizers::UpdateOptions;
using optimizers::UpdateRule;

constexpr size_t kN = 3000;
constexpr uint64_t kKey = 9;

KeySpec Spec(const std::string& push, uint32_t workers, const UpdateOptions& update,
             const std::string& pull, bool difference) {
  KeySpec k;
  k.key = kKey;
  k.elements = kN;
  k.compressor = *compressors::ParseCompressorSpec(push);
  k.num_workers = workers;
  ServerOptimizerSpec o;
  o.update = update;
  o.pull = *compressors::ParseCompressorSpec(pull);
  o.difference = difference;
  k.optimizer = o;
  return k;
}

std::unique_ptr<KeyState> Make(const KeySpec& spec) {
  auto s = KeyState::Create(spec);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

std::unique_ptr<Compressor> Codec(const std::string& spec) {
  return std::move(compressors::CreateCompressor(spec)).value();
}

std::vector<uint32_t> Bits(Span<const float> v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), 4 * v.size());
  return b;
}

UpdateOptions Rule(UpdateRule rule) {
  UpdateOptions o;
  o.rule = rule;
  o.momentum = rule == UpdateRule::kSgd ? 0.9f : 0.0f;
  o.weight_decay = rule == UpdateRule::kAdamW ? 0.01f : 0.0f;
  return o;
}

// W workers push compressed gradients for T rounds with a decaying lr; every worker applies each
// published pull to its copy. Reference: the average of the decoded pushes in rank order (the
// server's arithmetic), then ParamState::Step.
void RunRounds(const std::string& push, uint32_t workers, UpdateRule rule, const std::string& pull,
               bool difference) {
  SCOPED_TRACE(push + " W=" + std::to_string(workers) + " " + optimizers::UpdateRuleName(rule) +
               " pull " + pull + (difference ? " (difference)" : " (raw)"));
  const UpdateOptions update = Rule(rule);
  auto key = Make(Spec(push, workers, update, pull, difference));
  ASSERT_NE(key, nullptr);
  const std::vector<float> w0 = RandomFloats(kN, 77);
  ASSERT_TRUE(key->InstallWeights({w0.data(), kN}).ok());
  auto ref = optimizers::ParamState::Create(update, {w0.data(), kN});
  ASSERT_TRUE(ref.ok());
  auto worker_codec = Codec(push);
  auto pull_codec = Codec(pull);
  compressors::CompressorPullCodec pcodec(pull_codec.get());
  std::vector<std::vector<float>> held(workers, w0);
  for (uint64_t t = 0; t < 6; ++t) {
    const float lr = 0.05f / static_cast<float>(t + 1);
    std::vector<float> avg(kN, 0.0f);
    for (uint32_t w = 0; w < workers; ++w) {
      const std::vector<float> g = RandomFloats(kN, 1000 * t + w);
      const auto p = Compress(*worker_codec, ConstTensorView(g.data(), kN), {kKey, t, w});
      ASSERT_TRUE(worker_codec->DecompressAdd({p.data(), p.size()}, {avg.data(), kN}).ok());
      ASSERT_TRUE(key->Push(w, t, transport::Buffer::Copy(p.data(), p.size()), lr).ok());
    }
    if (workers > 1) {
      const float inv = 1.0f / static_cast<float>(workers);
      for (float& v : avg) v *= inv;
    }
    ASSERT_TRUE(ref->Step(lr, {avg.data(), kN}).ok());
    ASSERT_EQ(Bits(key->weights()), Bits(ref->weights())) << "round " << t;
    for (uint32_t w = 0; w < workers; ++w) {
      auto reply = key->Pull(w, t);
      ASSERT_TRUE(reply.ok()) << reply.status().ToString();
      if (difference) {
        ASSERT_TRUE(compressors::ApplyMirrorPull(pcodec, reply->span(), {held[w].data(), kN}).ok());
      } else {
        ASSERT_TRUE(pull_codec->Decompress(reply->span(), TensorView(held[w].data(), kN)).ok());
      }
      // What the worker holds: the server's mirror (difference) or its decoded weights.
      ASSERT_EQ(Bits({held[w].data(), kN}), Bits(difference ? key->mirror() : key->weights()))
          << "worker " << w << " round " << t;
    }
  }
}

TEST(ServerOptimizer, WeightsEqualTheOneProcessOptimizerOnTheAverageGradient) {
  for (UpdateRule rule : {UpdateRule::kSgd, UpdateRule::kAdamW, UpdateRule::kLans}) {
    RunRounds("none", 3, rule, "sdp4bit:hadamard=off,group=2048", true);  // qWD pulls
  }
  RunRounds("sdp4bit", 2, UpdateRule::kLans, "sdp4bit:hadamard=off,group=2048", true);
  RunRounds("onebit", 4, UpdateRule::kAdamW, "fp16", true);
  RunRounds("topk:ratio=0.1", 2, UpdateRule::kSgd, "topk:ratio=0.1", true);  // biased, difference
  RunRounds("dithering", 1, UpdateRule::kSgd, "none", false);                // raw fp32 weights
}

// Three rounds, save, a new key restored from the blob runs three more: the same weights and
// mirror bits as six rounds on one key.
TEST(ServerOptimizer, RestoredStateContinuesBitForBit) {
  const UpdateOptions update = Rule(UpdateRule::kAdamW);
  const KeySpec spec = Spec("none", 2, update, "sdp4bit:hadamard=off,group=2048", true);
  auto whole = Make(spec);
  auto first = Make(spec);
  // The resumed key starts at round 0; the restore moves it to the checkpoint's round (3).
  auto resumed = Make(spec);
  const std::vector<float> w0 = RandomFloats(kN, 5);
  ASSERT_TRUE(whole->InstallWeights({w0.data(), kN}).ok());
  ASSERT_TRUE(first->InstallWeights({w0.data(), kN}).ok());
  auto codec = Codec("none");
  for (uint64_t t = 0; t < 6; ++t) {
    for (uint32_t w = 0; w < 2; ++w) {
      const std::vector<float> g = RandomFloats(kN, 50 * t + w);
      const auto p = Compress(*codec, ConstTensorView(g.data(), kN));
      const auto buf = [&] { return transport::Buffer::Copy(p.data(), p.size()); };
      ASSERT_TRUE(whole->Push(w, t, buf(), 0.01f).ok());
      if (t < 3) {
        ASSERT_TRUE(first->Push(w, t, buf(), 0.01f).ok());
      } else {
        ASSERT_TRUE(resumed->Push(w, t, buf(), 0.01f).ok());
      }
    }
    for (uint32_t w = 0; w < 2; ++w) {
      ASSERT_TRUE(whole->Pull(w, t).ok());
      if (t < 3) {
        ASSERT_TRUE(first->Pull(w, t).ok());
      } else {
        ASSERT_TRUE(resumed->Pull(w, t).ok());
      }
    }
    if (t == 2) {
      auto saved = first->SaveOptimizerState();
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
      ASSERT_TRUE(resumed->RestoreOptimizerState(*saved).ok());
    }
  }
  EXPECT_EQ(Bits(resumed->weights()), Bits(whole->weights()));
  EXPECT_EQ(Bits(resumed->mirror()), Bits(whole->mirror()));
  EXPECT_EQ(*resumed->SaveOptimizerState(), *whole->SaveOptimizerState());
}

TEST(ServerOptimizer, RefusalsNameTheirReason) {
  const UpdateOptions update = Rule(UpdateRule::kSgd);
  // Raw-weight pulls with a biased compressor; a server residual; an fp16 key; bad options.
  KeySpec raw_onebit = Spec("none", 2, update, "onebit", false);
  EXPECT_NE(KeyState::Create(raw_onebit).status().message().find("Counterexample 4.1"),
            std::string::npos);
  KeySpec residual = Spec("onebit", 2, update, "fp16", true);
  residual.server_residual = true;
  EXPECT_NE(KeyState::Create(residual).status().message().find("no server residual"),
            std::string::npos);
  KeySpec half = Spec("none", 2, update, "fp16", true);
  half.dtype = DType::kFloat16;
  EXPECT_NE(KeyState::Create(half).status().message().find("must be fp32"), std::string::npos);
  UpdateOptions bad_momentum = update;
  bad_momentum.momentum = 2.0f;
  const KeySpec bad = Spec("none", 2, bad_momentum, "fp16", true);
  EXPECT_NE(KeyState::Create(bad).status().message().find("momentum"), std::string::npos);

  auto key = Make(Spec("none", 2, update, "fp16", true));
  auto codec = Codec("none");
  const std::vector<float> g = RandomFloats(kN, 1);
  const auto p = Compress(*codec, ConstTensorView(g.data(), kN));
  const auto buf = [&] { return transport::Buffer::Copy(p.data(), p.size()); };
  // Before the weights, without or with a bad lr.
  EXPECT_NE(key->Push(0, 0, buf(), 0.1f).message().find("before the key's weights"),
            std::string::npos);
  const std::vector<float> w0 = RandomFloats(kN, 2);
  const std::vector<float> short_w(kN - 1, 0.0f);
  EXPECT_NE(key->InstallWeights({short_w.data(), kN - 1}).message().find("2999 weights"),
            std::string::npos);
  ASSERT_TRUE(key->InstallWeights({w0.data(), kN}).ok());
  EXPECT_NE(key->Push(0, 0, buf()).message().find("without a learning rate"), std::string::npos);
  EXPECT_NE(key->Push(0, 0, buf(), -1.0f).message().find("learning rate -1"), std::string::npos);
  // Workers disagreeing on the round's lr.
  ASSERT_TRUE(key->Push(0, 0, buf(), 0.1f).ok());
  EXPECT_NE(key->Push(1, 0, buf(), 0.2f).message().find("same schedule"), std::string::npos);
  // Mid-round: no install, no restore.
  EXPECT_NE(key->InstallWeights({w0.data(), kN}).message().find("round is open"),
            std::string::npos);
  auto saved = key->SaveOptimizerState();
  ASSERT_TRUE(saved.ok());
  EXPECT_NE(key->RestoreOptimizerState(*saved).message().find("round is open"), std::string::npos);
  ASSERT_TRUE(key->Push(1, 0, buf(), 0.1f).ok());
  ASSERT_TRUE(key->Pull(0, 0).ok());
  ASSERT_TRUE(key->Pull(1, 0).ok());
  // A truncated blob changes nothing.
  const std::vector<uint32_t> before = Bits(key->weights());
  EXPECT_FALSE(key->RestoreOptimizerState(saved->substr(0, saved->size() - 4)).ok());
  EXPECT_EQ(Bits(key->weights()), before);
  // A key without a server-side optimizer refuses an lr and weights.
  KeySpec plain;
  plain.key = 1;
  plain.elements = kN;
  plain.compressor = *compressors::ParseCompressorSpec("none");
  plain.num_workers = 1;
  auto k2 = Make(plain);
  EXPECT_NE(k2->Push(0, 0, buf(), 0.1f).message().find("no server-side optimizer"),
            std::string::npos);
  EXPECT_FALSE(k2->InstallWeights({w0.data(), kN}).ok());
}

}  // namespace
}  // namespace bitpush::server
