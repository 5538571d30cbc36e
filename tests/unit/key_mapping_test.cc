// The key-to-server mapping every process computes identically (scheduler/key_mapping.h).
#include "scheduler/key_mapping.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/counter_rng.h"

namespace bitpush::scheduler {
namespace {

TEST(KeyMapping, IsTheDocumentedFormula) {
  for (uint32_t n : {1u, 2u, 3u, 7u, 16u}) {
    const v1::KeyMapping m = MakeKeyMapping(n, 12345);
    EXPECT_EQ(m.scheme(), v1::KeyMapping::SCHEME_MIX64_MOD);
    EXPECT_EQ(m.num_servers(), n);
    EXPECT_EQ(m.seed(), 12345u);
    for (uint64_t key = 0; key < 1000; ++key) {
      ASSERT_EQ(ServerForKey(key, m), Mix64(key ^ 12345) % n) << "key " << key;
    }
  }
}

// Pinned values: where keys live must not change silently between builds (that would make
// nodes of different builds disagree). Changing the scheme needs a new Scheme value.
TEST(KeyMapping, PinnedValues) {
  const v1::KeyMapping m = MakeKeyMapping(4);
  EXPECT_EQ(m.seed(), kDefaultKeyMappingSeed);
  std::vector<uint32_t> got;
  for (uint64_t key = 0; key < 12; ++key) got.push_back(ServerForKey(key, m));
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

TEST(KeyMapping, RoughlyBalancedForConsecutiveKeys) {
  // Consecutive keys are the partitions of one tensor: they must spread evenly.
  constexpr uint64_t kKeys = 100000;
  for (uint32_t n : {2u, 3u, 8u, 16u}) {
    const v1::KeyMapping m = MakeKeyMapping(n);
    std::vector<uint64_t> count(n, 0);
    for (uint64_t key = 0; key < kKeys; ++key) ++count[ServerForKey(key, m)];
    const double mean = static_cast<double>(kKeys) / n;
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
  EXPECT_DEATH(ServerForKey(1, unknown), "");  // BP_CHECK logs through spdlog (stdout)
}

}  // namespace
}  // namespace bitpush::scheduler
