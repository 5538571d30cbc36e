// SEPARATE's block kernels (compressors/separate/separate.h has the method and the format):
// the projection p = Xi h and the reconstruction Xi^T q of one block, with the block's
// Gaussian matrix Xi (m rows of d) regenerated row by row from its stream (gaussian.h) and
// never stored whole. Scalar, AVX2 and AVX-512 implementations; every level computes the same
// bits: the SIMD kernels use the generator's registers directly and the scalar ones reproduce
// their operation order.
//
// Row r of block j is the stream RowStream(BlockStream(s, j), r), positions 0..d-1 (so a
// shorter last block draws the leading columns of a full block's rows).
// Projection, per row: 32 fp32 lane sums, lane l adding Xi[r][c] * h[c] (multiply, then add)
// for c = l, l + 32, ... in order; then lanes folded as l + 16, l + 8, l + 4, l + 2, l + 1.
// Reconstruction, per column c: out[c] = q[0] Xi[0][c], then out[c] = out[c] + q[r] Xi[r][c]
// for r = 1..m-1 in order.
//
// Thread-safety: pure functions over the caller's buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/counter_rng.h"
#include "common/cpu_features.h"
#include "compressors/separate/gaussian.h"

namespace bitpush::compressors::separate {

inline uint64_t BlockStream(uint64_t stream, uint64_t block) {
  return CounterRandom64(stream, block);
}
inline uint64_t RowStream(uint64_t block_stream, uint64_t row) {
  return CounterRandom64(block_stream, row);
}

// p[r] = sum_c Xi[r][c] h[c] for r < m (d columns; d < 2^32).
void ProjectBlock(uint64_t block_stream, const float* h, size_t d, size_t m, float* p,
                  IsaLevel isa);

// out[c] = sum_r q[r] Xi[r][c] for c < d (m >= 1 rows).
void ReconstructBlock(uint64_t block_stream, const float* q, size_t d, size_t m, float* out,
                      IsaLevel isa);

// The error state's element loops (every level writes the same h and e; the returned sums of
// squares are telemetry and may differ in the last bits between levels):
// h[i] = g[i] + e[i]; returns sum g[i]^2.
double AddAndSquare(const float* g, const float* e, float* h, size_t d, IsaLevel isa);
// e[i] = a_old e[i] + a_new h[i].
void MovingAverage(float* e, const float* h, size_t d, float a_old, float a_new, IsaLevel isa);
// e[i] = e[i] - a_new ht[i]; returns sum e[i]^2 and clears *finite when some e[i] is not finite.
double SubtractScaled(float* e, const float* ht, size_t d, float a_new, bool* finite, IsaLevel isa);

}  // namespace bitpush::compressors::separate
