// Constructors of the concrete compressors, one per directory under compressors/.
// Callers use the registry (compressors/registry.h), which validates the config and fills
// every optional parameter with its default before calling these; a factory may therefore
// read every field of its params directly.
//
// Thread-safety: the factories are thread-safe; see compressor.h for instances.
#pragma once

#include <memory>

#include "common/cpu_features.h"
#include "compressors/compressor.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

std::unique_ptr<Compressor> NewNoneCompressor(IsaLevel isa);
std::unique_ptr<Compressor> NewFp16Compressor(IsaLevel isa);
std::unique_ptr<Compressor> NewBf16Compressor(IsaLevel isa);
std::unique_ptr<Compressor> NewOnebitCompressor(const v1::OnebitParams& params, IsaLevel isa);
std::unique_ptr<Compressor> NewTopkCompressor(const v1::TopkParams& params, IsaLevel isa);
std::unique_ptr<Compressor> NewRandomkCompressor(const v1::RandomkParams& params, IsaLevel isa);
std::unique_ptr<Compressor> NewDitheringCompressor(const v1::DitheringParams& params, IsaLevel isa);

}  // namespace bitpush::compressors
