// The 16-byte header that opens every compressed payload (docs/wire-format.md):
//
//   offset size field
//   0      1    format version (PAYLOAD_FORMAT_V1 = 1)
//   1      1    compressor id (bitpush.v1.CompressorId, frozen)
//   2      1    dtype of the tensor (0 float32, 1 float16, 2 bfloat16)
//   3      1    flags (must be 0 in format 1)
//   4      4    body bytes, little-endian u32 (= payload size - 16)
//   8      8    element count, little-endian u64
//
// ParsePayloadHeader checks every field against the buffer before anything trusts it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/span.h"
#include "common/status.h"
#include "proto/bitpush/v1/compression.pb.h"

namespace bitpush::compressors {

inline constexpr size_t kPayloadHeaderBytes = 16;
inline constexpr uint8_t kPayloadFormatVersion = 1;
// Largest element count a payload may declare (2^40: far above any partition, and small
// enough that n * 8 cannot overflow).
inline constexpr uint64_t kMaxPayloadElements = uint64_t{1} << 40;

struct PayloadHeader {
  uint8_t format_version = kPayloadFormatVersion;
  v1::CompressorId compressor_id = v1::COMPRESSOR_ID_UNSPECIFIED;
  DType dtype = DType::kFloat32;
  uint8_t flags = 0;
  uint32_t body_bytes = 0;
  uint64_t element_count = 0;
};

// Writes the header into out[0..16).
void WritePayloadHeader(const PayloadHeader& header, uint8_t* out);

// Parses and validates the header of `payload`: length >= 16, known version, a known
// compressor id, valid dtype, zero flags, body_bytes == payload.size() - 16, element count
// within kMaxPayloadElements. DataLoss naming the bad field otherwise.
StatusOr<PayloadHeader> ParsePayloadHeader(ByteSpan payload);

}  // namespace bitpush::compressors
