#include "compressors/payload.h"

#include <cstring>
#include <string>

#include "common/little_endian.h"

namespace bitpush::compressors {

void WritePayloadHeader(const PayloadHeader& h, uint8_t* out) {
  out[0] = h.format_version;
  out[1] = static_cast<uint8_t>(h.compressor_id);
  out[2] = static_cast<uint8_t>(h.dtype);
  out[3] = h.flags;
  PutU32(out + 4, h.body_bytes);
  PutU64(out + 8, h.element_count);
}

StatusOr<PayloadHeader> ParsePayloadHeader(ByteSpan payload) {
  if (payload.size() < kPayloadHeaderBytes) {
    return DataLossError("payload of " + std::to_string(payload.size()) +
                         " bytes is shorter than the 16-byte header");
  }
  const uint8_t* p = payload.data();
  PayloadHeader h;
  h.format_version = p[0];
  if (h.format_version != kPayloadFormatVersion) {
    return DataLossError("payload format version " + std::to_string(p[0]) +
                         " is not supported (this build reads version " +
                         std::to_string(kPayloadFormatVersion) + ")");
  }
  if (p[1] == v1::COMPRESSOR_ID_UNSPECIFIED || !v1::CompressorId_IsValid(p[1])) {
    return DataLossError("payload names unknown compressor id " + std::to_string(p[1]));
  }
  h.compressor_id = static_cast<v1::CompressorId>(p[1]);
  if (!IsValidDType(p[2])) {
    return DataLossError("payload names unknown dtype " + std::to_string(p[2]));
  }
  h.dtype = static_cast<DType>(p[2]);
  h.flags = p[3];
  if (h.flags != 0) {
    return DataLossError("payload flags byte is " + std::to_string(h.flags) +
                         "; format 1 requires 0");
  }
  h.body_bytes = GetU32(p + 4);
  if (static_cast<uint64_t>(h.body_bytes) != payload.size() - kPayloadHeaderBytes) {
    return DataLossError("payload header declares a " + std::to_string(h.body_bytes) +
                         "-byte body but " + std::to_string(payload.size() - kPayloadHeaderBytes) +
                         " bytes follow the header");
  }
  h.element_count = GetU64(p + 8);
  if (h.element_count > kMaxPayloadElements) {
    return DataLossError("payload declares " + std::to_string(h.element_count) +
                         " elements, above the limit of 2^40");
  }
  return h;
}

}  // namespace bitpush::compressors
