// Top-k filter kernels: the one full pass over the data that topk makes, in scalar, AVX2 and
// AVX-512 versions (dispatched on an explicit IsaLevel). All levels produce identical output:
// the test is integer math on the float bits.
//
// Selection key: TopkKey(x) = bits(x) & 0x7FFFFFFF. As an unsigned integer it orders finite
// values and infinities exactly by |x|, puts every NaN above +inf, and maps -0.0 and 0.0 to 0.
//
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"
#include "common/half.h"

namespace bitpush::compressors {

inline uint32_t TopkKey(float x) {
  return FloatBits(x) & 0x7FFFFFFFu;
}

// Extra entries past the real output that a filter kernel may scribble on (full-vector
// stores of partially used lanes).
inline constexpr size_t kTopkFilterSlack = 16;

// Appends every i in [begin, end) with TopkKey(x[i]) >= t, ascending, to out_index, and its
// key to out_key; returns how many. Each output needs room for (end - begin) +
// kTopkFilterSlack entries. end < 2^32.
size_t TopkFilter(const float* x, size_t begin, size_t end, uint32_t t, uint32_t* out_index,
                  uint32_t* out_key, IsaLevel isa);

// The fused error-feedback pass: for i in [begin, end), q = g[i] + e[i] is stored into e[i]
// and (i, TopkKey(q)) is appended if TopkKey(q) >= t. Same contract as TopkFilter otherwise.
size_t TopkAddFilter(const float* g, float* e, size_t begin, size_t end, uint32_t t,
                     uint32_t* out_index, uint32_t* out_key, IsaLevel isa);

}  // namespace bitpush::compressors
