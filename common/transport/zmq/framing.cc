#include "common/transport/zmq/framing.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "common/little_endian.h"
#include "fmt/format.h"

namespace bitpush::transport::zmq_backend {

void EncodeEnvelope(const std::string& header, uint32_t frame_count, uint8_t* out) {
  std::copy(std::begin(kMagic), std::end(kMagic), out);
  PutU32(out + 4, frame_count);
  PutU32(out + 8, static_cast<uint32_t>(header.size()));
  std::copy(header.begin(), header.end(), out + kEnvelopeFixedBytes);
}

Status ParseEnvelope(const uint8_t* data, size_t size, size_t frame_parts, const uint8_t** header,
                     size_t* header_bytes) {
  if (size < kEnvelopeFixedBytes) {
    return DataLossError(
        fmt::format("envelope of {} bytes, need at least {}", size, kEnvelopeFixedBytes));
  }
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    return DataLossError("envelope does not start with the magic 'BPT1'");
  }
  const uint32_t frames = GetU32(data + 4);
  const uint32_t hbytes = GetU32(data + 8);
  if (hbytes != size - kEnvelopeFixedBytes) {
    return DataLossError(fmt::format("envelope announces a {}-byte header, carries {} bytes",
                                     hbytes, size - kEnvelopeFixedBytes));
  }
  if (frames != frame_parts) {
    return DataLossError(
        fmt::format("envelope announces {} frames, {} parts follow", frames, frame_parts));
  }
  *header = data + kEnvelopeFixedBytes;
  *header_bytes = hbytes;
  return Status::Ok();
}

}  // namespace bitpush::transport::zmq_backend
