// The per-ISA halves of BinSGDM's kernels (optimizers/binsgdm.h), private to the optimizers
// library: binsgdm.cc holds the scalar loops and the dispatch, binsgdm_avx512.cc the AVX-512
// loops. Both evaluate binsgdm.h's formulas with the same fp32 operations in the same order
// (-ffp-contract=off; separate multiply and add instructions), so all levels give the same bits.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optimizers/binsgdm.h"

namespace bitpush::optimizers::internal {

bool BinsgdmWorkerStepScalar(const BinsgdmHyper& h, uint64_t stream, const float* g, float* m,
                             float* b, float* e, size_t n, uint8_t* bits);
bool BinsgdmBinarizeScalar(uint64_t stream, const float* x, float* e, size_t n, uint8_t* bits);
void BinsgdmServerRoundScalar(const uint8_t* const* pushes, size_t k, size_t n, float scale,
                              float* e, uint64_t stream, uint8_t* bits);

bool BinsgdmWorkerStepAvx512(const BinsgdmHyper& h, uint64_t stream, const float* g, float* m,
                             float* b, float* e, size_t n, uint8_t* bits);
bool BinsgdmBinarizeAvx512(uint64_t stream, const float* x, float* e, size_t n, uint8_t* bits);
void BinsgdmServerRoundAvx512(const uint8_t* const* pushes, size_t k, size_t n, float scale,
                              float* e, uint64_t stream, uint8_t* bits);

}  // namespace bitpush::optimizers::internal
