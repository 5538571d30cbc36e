// The bitpush framing inside one ZeroMQ multipart message (zmq backend).
//
// On the wire (after the routing-id part that the receiving ROUTER socket prepends):
//
//   part 0  envelope: "BPT1" | u32 frame_count | u32 header_bytes | header   (little-endian)
//   part 1..frame_count    the payload frames, one ZeroMQ part each (zero-copy on both ends)
//
// A message whose envelope is shorter than 12 bytes, has another magic, announces a header
// length other than what follows, or announces a frame count other than the number of parts
// that follow is malformed: the receiver drops it whole and counts it. So is a message from a
// peer without a name (ZeroMQ gives such peers a routing id starting with a NUL byte, which no
// endpoint name can).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace bitpush::transport::zmq_backend {

inline constexpr char kMagic[4] = {'B', 'P', 'T', '1'};
inline constexpr size_t kEnvelopeFixedBytes = 12;

// Writes the envelope for a message with `header` and `frame_count` frames into `out`
// (kEnvelopeFixedBytes + header.size() bytes).
void EncodeEnvelope(const std::string& header, uint32_t frame_count, uint8_t* out);

// Checks an envelope of `size` bytes received with `frame_parts` parts after it. On success
// sets `header` / `header_bytes` to the header inside `data`.
Status ParseEnvelope(const uint8_t* data, size_t size, size_t frame_parts, const uint8_t** header,
                     size_t* header_bytes);

}  // namespace bitpush::transport::zmq_backend
