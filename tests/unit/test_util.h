// Helpers shared by the unit tests: ISA levels available here, deterministic random data,
// EXPECT_CONTAINS.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "common/half.h"

// Expects `needle` inside the string `haystack`, printing the haystack when it is not.
#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

namespace bitpush::testing {

inline std::vector<IsaLevel> SupportedIsaLevels() {
  std::vector<IsaLevel> out;
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (IsaSupported(l)) out.push_back(l);
  }
  return out;
}

// Normal(0, sigma) values, deterministic per seed.
inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace bitpush::testing
