// Onebit kernels: the passes over the data that the onebit compressor and its deferred residual
// make, in scalar, AVX2 and AVX-512 versions (dispatched on an explicit IsaLevel). Every level
// produces identical bytes and residuals: the mean |x| is summed in double in 16 lanes
// (element i into lane i mod 16) and the lanes are added in order (compressors/onebit/onebit.h
// has the payload layout and the reasons for each pass).
//
// A sign body is an f32 scale followed by ceil(n/64) little-endian u64 words; bit t of word j
// is set iff element 64j+t is negative. The kernels read and write the words at any alignment.
//
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"

namespace bitpush::compressors {

// The sign words and scale of one onebit body: a push of a fused server round, or a deferred
// residual's pending correction C(q).
struct OnebitSignWords {
  const uint8_t* words;
  float scale;
};

// Pass 1: writes the sign words of q = a (+ decay * b when b != nullptr), stores q into q_out
// when q_out != nullptr, and returns sum |q| (16 lanes, summed in order). With `prev` (deferred
// error feedback, which needs b and q_out), b holds the last round's q whose correction is still
// pending: the residual is e = b - C_prev, computed on the fly, and q = a + decay * e. `decay`
// is the residual's decay (CompressContext::residual_decay), multiplied in fp32 before the add
// (no fused multiply-add): the same values as scaling the materialised residual first; 1 leaves
// every value as it was.
double OnebitSignPass(IsaLevel isa, const float* a, const float* b, size_t n, uint8_t* words,
                      float* q_out = nullptr, const OnebitSignWords* prev = nullptr,
                      float decay = 1.0f);

// Pass 2 (error feedback): e[i] = q[i] - (bit ? -scale : scale), q = a (+ b). Walks the words
// backwards, from the end pass 1 left in cache.
void OnebitResidualPass(IsaLevel isa, const float* a, const float* b, float* e, size_t n,
                        const uint8_t* words, float scale);

// out[i] (+)= bit ? -scale : scale.
void OnebitDecode(IsaLevel isa, const uint8_t* words, size_t n, float scale, float* out, bool add);
// The same into a tensor that is overwritten whole: from 64 Ki elements on, AVX-512 writes it
// with non-temporal stores (its lines need not be read first).
void OnebitDecodeToTensor(IsaLevel isa, const uint8_t* words, size_t n, float scale, float* out);

// The fused server round (OnebitCompressor::AggregateBody): element i of the aggregate of
// `count` pushes is a = v_0 + v_1 + ... (v_w = ±scale_w), times `mult` when it is not 1, and
// q = a (+ e[i]) — the fp32 operations, in order, of decompress, add, average and compress, never
// materialised. Pass 1 packs q's sign words and returns sum |q|; it stores q into q_out when
// q_out != nullptr (deferred error feedback: over e), and with `prev` (needs e) reads the
// residual as e - C_prev. `wbuf` holds `count` words of scratch.
double OnebitAggregateSignPass(IsaLevel isa, const OnebitSignWords* pushes, size_t count, size_t n,
                               float mult, const float* e, float* q_out, uint8_t* words,
                               uint64_t* wbuf, const OnebitSignWords* prev);
// Pass 2 of the fused round: recomputes q = a + e[i] and writes e[i] = q - (±scale).
void OnebitAggregateResidualPass(IsaLevel isa, const OnebitSignWords* pushes, size_t count,
                                 size_t n, float mult, float* e, const uint8_t* words, float scale,
                                 uint64_t* wbuf);

}  // namespace bitpush::compressors
