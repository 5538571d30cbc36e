// Placeholder: the real implementation follows shortly.
#include "compressors/factories.h"

namespace bitpush::compressors {
std::unique_ptr<Compressor> NewRandomkCompressor(const v1::RandomkParams&, IsaLevel) {
  return nullptr;
}
}  // namespace bitpush::compressors
