// The key-to-server mapping every process computes identically (config/key_mapping.h).
#include "config/key_mapping.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/counter_rng.h"

namespace bitpush::config {
namespace {

uint64_t Key(uint64_t tensor, uint64_t partition) {
  return (tensor << 32) | partition;
}

TEST(KeyMapping, IsTheDocumentedFormula) {
  for (uint32_t n : {1u, 2u, 3u, 7u, 16u}) {
    const v1::KeyMapping m = MakeKeyMapping(n, 12345);
    EXPECT_EQ(m.scheme(), v1::KeyMapping::SCHEME_MIX64_STRIPE);
    EXPECT_EQ(m.num_servers(), n);
    EXPECT_EQ(m.seed(), 12345u);
    for (uint64_t t : {0ull, 1ull, 2ull, 77ull, 0xffffffffull}) {
      for (uint64_t p : {0ull, 1ull, 2ull, 5ull, 1000ull, 0xffffffffull}) {
        ASSERT_EQ(ServerForKey(Key(t, p), m), (Mix64(t ^ 12345) % n + p % n) % n)
            << "tensor " << t << " partition " << p;
      }
    }
    // The older scheme is still understood: every key hashed.
    v1::KeyMapping old = m;
    old.set_scheme(v1::KeyMapping::SCHEME_MIX64_MOD);
    for (uint64_t key = 0; key < 1000; ++key) {
      ASSERT_EQ(ServerForKey(key, old), Mix64(key ^ 12345) % n) << "key " << key;
    }
  }
}

// Pinned values: where keys live must not change silently between builds (that would make
// nodes of different builds disagree). Changing the scheme needs a new Scheme value. (Values
// computed independently of this code, from the formula.)
TEST(KeyMapping, PinnedValues) {
  const v1::KeyMapping m = MakeKeyMapping(4);
  EXPECT_EQ(m.seed(), kDefaultKeyMappingSeed);
  std::vector<uint32_t> got;
  for (uint64_t t = 0; t < 3; ++t) {
    for (uint64_t p = 0; p < 4; ++p) got.push_back(ServerForKey(Key(t, p), m));
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{1, 2, 3, 0, 1, 2, 3, 0, 3, 0, 1, 2}));
  got.clear();
  for (uint64_t p = 0; p < 7; ++p) got.push_back(ServerForKey(Key(5, p), MakeKeyMapping(3)));
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2, 0, 1, 2, 0}));
  v1::KeyMapping old = m;
  old.set_scheme(v1::KeyMapping::SCHEME_MIX64_MOD);
  got.clear();
  for (uint64_t key = 0; key < 12; ++key) got.push_back(ServerForKey(key, old));
  EXPECT_EQ(got, (std::vector<uint32_t>{1, 1, 3, 2, 1, 1, 2, 1, 3, 0, 1, 3}));
}

TEST(KeyMapping, DeterministicAcrossInstances) {
  // Two processes build the mapping from the same Assignment: same answers.
  v1::KeyMapping a = MakeKeyMapping(5);
  v1::KeyMapping b;
  ASSERT_TRUE(b.ParseFromString(a.SerializeAsString()));
  for (uint64_t key = 0; key < 10000; key += 7)
    EXPECT_EQ(ServerForKey(key, a), ServerForKey(key, b));
}

TEST(KeyMapping, EveryTensorsPartitionsAreSplitEvenly) {
  // A tensor's partitions go round robin: any tensor of P partitions puts floor(P/n) or
  // ceil(P/n) on each server — exactly, not on average (the 26 partitions of a 100 MiB tensor
  // on 2 servers: 13 and 13).
  for (uint32_t n : {2u, 3u, 8u, 16u}) {
    const v1::KeyMapping m = MakeKeyMapping(n);
    for (uint64_t t = 0; t < 50; ++t) {
      for (uint64_t parts : {1ull, 2ull, 7ull, 26ull, 100ull}) {
        std::vector<uint64_t> count(n, 0);
        for (uint64_t p = 0; p < parts; ++p) ++count[ServerForKey(Key(t, p), m)];
        for (uint32_t s = 0; s < n; ++s) {
          EXPECT_GE(count[s], parts / n) << n << " servers, tensor " << t << ", " << parts;
          EXPECT_LE(count[s], (parts + n - 1) / n) << n << " servers, tensor " << t;
        }
      }
    }
  }
}

TEST(KeyMapping, SmallTensorsSpreadOverTheServers) {
  // One-partition tensors land by the hash of their index: roughly balanced.
  constexpr uint64_t kTensors = 100000;
  for (uint32_t n : {2u, 3u, 8u, 16u}) {
    const v1::KeyMapping m = MakeKeyMapping(n);
    std::vector<uint64_t> count(n, 0);
    for (uint64_t t = 0; t < kTensors; ++t) ++count[ServerForKey(Key(t, 0), m)];
    const double mean = static_cast<double>(kTensors) / n;
    for (uint32_t s = 0; s < n; ++s) {
      // A binomial count's standard deviation is below sqrt(mean) (< 316 here); 5% of the
      // mean is over 9 sigma for n = 16.
      EXPECT_NEAR(static_cast<double>(count[s]), mean, 0.05 * mean)
          << n << " servers, server " << s;
    }
  }
}

TEST(KeyMapping, OneServerOwnsEverything) {
  const v1::KeyMapping m = MakeKeyMapping(1);
  for (uint64_t key : {0ull, 1ull, ~0ull, 0x123456789ull}) EXPECT_EQ(ServerForKey(key, m), 0u);
}

TEST(KeyMapping, Validation) {
  EXPECT_TRUE(ValidateKeyMapping(MakeKeyMapping(3)).ok());
  EXPECT_NE(ValidateKeyMapping(MakeKeyMapping(0)).message().find("num_servers is 0"),
            std::string::npos);
  v1::KeyMapping unknown = MakeKeyMapping(3);
  unknown.set_scheme(v1::KeyMapping::SCHEME_UNSPECIFIED);
  EXPECT_NE(ValidateKeyMapping(unknown).message().find("unknown scheme 0"), std::string::npos);
  unknown.set_scheme(static_cast<v1::KeyMapping::Scheme>(3));
  EXPECT_NE(ValidateKeyMapping(unknown).message().find("unknown scheme 3"), std::string::npos);
  EXPECT_DEATH(ServerForKey(1, unknown), "");  // BP_CHECK logs through spdlog (stdout)
}

}  // namespace
}  // namespace bitpush::config
