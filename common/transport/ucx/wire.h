// The ucx backend's wire format (docs/transport-ucx.md): what one UCP Active Message carries.
//
// Every Active Message of a bitpush endpoint uses one AM id (kAmId) and a fixed 32-byte AM
// header (AmHeader, little-endian):
//
//   u32 magic "BPU1" | u8 type | u8 prefix_bytes (kFrame; 0 otherwise) | u8[2] reserved (0) |
//   u64 seq | u32 header_bytes | u32 frame_count | u64 largest_part
//
//  - kHello (client -> listener, the first message on every connection): seq, header_bytes,
//    frame_count, largest_part are 0; the data is the HelloPayload (version, the sender's
//    endpoint name, an authentication token: empty under TransportSecurity kNone, 32 bytes under
//    kCurve, hello_auth.h).
//  - kCredit (listener -> client): `seq` more messages may be sent on this connection. The first
//    one (the grant after a valid HELLO) also says the connection is established.
//  - kData (client -> listener): one bitpush Message. `seq` numbers the messages of the
//    connection from 0; the data is laid out by DataLayout: the message header, one u64 size per
//    frame, then each frame at an aligned offset (zero padding in between), so the receiver can
//    receive the whole message into one block and hand out its frames without copying.
//    `largest_part` (the largest of header and frames) lets a receiver refuse a message above
//    max_message_bytes before receiving its bytes.
//  - kFrame (client -> listener): one bitpush Message of exactly one frame, split: the AM header
//    is the 32 bytes above followed by the message header (`header_bytes` of them, at most
//    kMaxFrameMessageHeader), and the data is the frame alone (`frame_count` 1). The sender
//    hands UCX the caller's frame as one contiguous buffer (UCX 1.13 sends a non-contiguous
//    rendezvous through bounce buffers) and the receiver receives it straight into its block.
//    Senders use it for one-frame messages whose frame is kPackBelowBytes (16 KiB) or more.
//    A frame glued from a few leading bytes and one large part (a payload header in front of
//    the sender's data) has those bytes (`prefix_bytes`, at most kMaxFramePrefix) after the
//    message header in the AM header and the large part as the data: the frame is the prefix
//    followed by the data, and the data still moves contiguous.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace bitpush::transport::ucx_backend {

inline constexpr unsigned kAmId = 0x42;
inline constexpr uint32_t kMagic = 0x31555042;  // "BPU1" read as little-endian u32
inline constexpr size_t kAmHeaderBytes = 32;
inline constexpr uint32_t kHelloVersion = 1;

enum class AmType : uint8_t { kHello = 1, kData = 2, kCredit = 3, kFrame = 4 };

// The largest message header a kFrame AM header carries (UCX packs the AM header into the
// rendezvous request, which must fit one bcopy fragment: 8 KiB over tcp and shared memory).
inline constexpr size_t kMaxFrameMessageHeader = 1024;
// The most leading frame bytes a kFrame AM header carries after the message header.
inline constexpr size_t kMaxFramePrefix = 64;

struct AmHeader {
  AmType type = AmType::kData;
  uint64_t seq = 0;
  uint32_t header_bytes = 0;
  uint32_t frame_count = 0;
  uint64_t largest_part = 0;
  uint8_t prefix_bytes = 0;  // kFrame: the frame's leading bytes in the AM header
};

void EncodeAmHeader(const AmHeader& h, uint8_t out[kAmHeaderBytes]);
// DataLoss when `bytes` is not an AmHeader (size, magic, type, reserved bytes). A kFrame header
// is followed by its message header and its frame's prefix: `size` is kAmHeaderBytes +
// header_bytes + prefix_bytes, frame_count 1, header_bytes at most kMaxFrameMessageHeader and
// prefix_bytes at most kMaxFramePrefix; every other type is exactly kAmHeaderBytes, with
// prefix_bytes 0.
StatusOr<AmHeader> ParseAmHeader(const void* bytes, size_t size);

struct HelloPayload {
  std::string name;  // the sender's endpoint name (1..255 bytes, not starting with NUL)
  // kNone: empty. kCurve: token(name -> the receiver's key owner), kHelloTokenBytes
  // (hello_auth.h). Parsed as any length; the listener judges it.
  std::string token;
};

// u32 version | u8 name length | name | u32 token length | token
std::string EncodeHello(const HelloPayload& hello);
StatusOr<HelloPayload> ParseHello(const void* bytes, size_t size);

// Where the parts of a kData message lie in its data.
struct DataLayout {
  size_t sizes_offset = 0;            // the u64 frame sizes follow the header
  std::vector<size_t> frame_offsets;  // one per frame
  size_t total = 0;                   // the data's length
};

// Frames of 4 KiB or more start at a multiple of 64 bytes, smaller ones at a multiple of 8.
size_t FrameAlignment(uint64_t frame_size);
// The layout of a message with these sizes; InvalidArgument when it does not fit in size_t.
StatusOr<DataLayout> ComputeLayout(uint64_t header_bytes, const std::vector<uint64_t>& frame_sizes);
// The largest data a kData message with this AM header can have (saturates at SIZE_MAX).
size_t MaxDataBytes(const AmHeader& h);

// The parts of a received kData message (pointers into `data`).
struct ParsedData {
  const uint8_t* header = nullptr;
  size_t header_bytes = 0;
  std::vector<const uint8_t*> frames;
  std::vector<size_t> frame_sizes;
};
// DataLoss when `data` is not laid out as `h` announces, or a part exceeds `max_part`.
StatusOr<ParsedData> ParseData(const AmHeader& h, const uint8_t* data, size_t size,
                               uint64_t max_part);

}  // namespace bitpush::transport::ucx_backend
