// Placeholder: real implementation follows.
#include "compressors/factories.h"

namespace bitpush::compressors {

std::unique_ptr<Compressor> NewDitheringCompressor(const v1::DitheringParams& params,
                                                   IsaLevel isa) {
  return nullptr;
}

}  // namespace bitpush::compressors
