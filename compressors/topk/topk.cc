// Placeholder: the real implementation follows shortly.
#include "compressors/factories.h"

namespace bitpush::compressors {
std::unique_ptr<Compressor> NewTopkCompressor(const v1::TopkParams&, IsaLevel) { return nullptr; }
}  // namespace bitpush::compressors
