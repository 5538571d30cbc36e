#include "common/transport/ucx/wire.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/little_endian.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

// a + b, or false when it overflows size_t.
bool Add(size_t a, uint64_t b, size_t* out) {
  if (b > std::numeric_limits<size_t>::max() - a) return false;
  *out = a + static_cast<size_t>(b);
  return true;
}

bool AlignUp(size_t offset, size_t alignment, size_t* out) {
  const size_t rem = offset % alignment;
  return Add(offset, rem == 0 ? 0 : alignment - rem, out);
}

}  // namespace

void EncodeAmHeader(const AmHeader& h, uint8_t out[kAmHeaderBytes]) {
  std::memset(out, 0, kAmHeaderBytes);
  PutU32(out, kMagic);
  out[4] = static_cast<uint8_t>(h.type);
  out[5] = h.prefix_bytes;
  PutU64(out + 8, h.seq);
  PutU32(out + 16, h.header_bytes);
  PutU32(out + 20, h.frame_count);
  PutU64(out + 24, h.largest_part);
}

StatusOr<AmHeader> ParseAmHeader(const void* bytes, size_t size) {
  if (bytes == nullptr || size < kAmHeaderBytes) {
    return DataLossError(fmt::format("AM header of {} bytes, expected {}", size, kAmHeaderBytes));
  }
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (GetU32(p) != kMagic) return DataLossError("AM header without the BPU1 magic");
  if (p[6] != 0 || p[7] != 0) return DataLossError("AM header reserved bytes not 0");
  AmHeader h;
  const uint8_t type = p[4];
  if (type != static_cast<uint8_t>(AmType::kHello) && type != static_cast<uint8_t>(AmType::kData) &&
      type != static_cast<uint8_t>(AmType::kCredit) &&
      type != static_cast<uint8_t>(AmType::kFrame)) {
    return DataLossError(fmt::format("AM header of unknown type {}", type));
  }
  h.type = static_cast<AmType>(type);
  h.seq = GetU64(p + 8);
  h.header_bytes = GetU32(p + 16);
  h.frame_count = GetU32(p + 20);
  h.largest_part = GetU64(p + 24);
  h.prefix_bytes = p[5];
  if (h.type != AmType::kFrame) {
    if (h.prefix_bytes != 0) return DataLossError("AM header reserved bytes not 0");
    if (size != kAmHeaderBytes) {
      return DataLossError(fmt::format("AM header of {} bytes, expected {}", size, kAmHeaderBytes));
    }
    return h;
  }
  if (h.frame_count != 1 || h.header_bytes > kMaxFrameMessageHeader ||
      h.prefix_bytes > kMaxFramePrefix ||
      size - kAmHeaderBytes != uint64_t{h.header_bytes} + h.prefix_bytes) {
    return DataLossError(fmt::format(
        "frame AM header of {} bytes announcing a {}-byte message header, a {}-byte frame prefix "
        "and {} frames",
        size, h.header_bytes, h.prefix_bytes, h.frame_count));
  }
  return h;
}

std::string EncodeHello(const HelloPayload& hello) {
  std::string out(4 + 1 + hello.name.size() + 4 + hello.token.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  PutU32(p, kHelloVersion);
  p[4] = static_cast<uint8_t>(hello.name.size());
  std::copy(hello.name.begin(), hello.name.end(), p + 5);
  PutU32(p + 5 + hello.name.size(), static_cast<uint32_t>(hello.token.size()));
  std::copy(hello.token.begin(), hello.token.end(), p + 9 + hello.name.size());
  return out;
}

StatusOr<HelloPayload> ParseHello(const void* bytes, size_t size) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (p == nullptr || size < 9) return DataLossError(fmt::format("HELLO of {} bytes", size));
  if (GetU32(p) != kHelloVersion) {
    return DataLossError(
        fmt::format("HELLO version {}, this endpoint speaks {}", GetU32(p), kHelloVersion));
  }
  const size_t name_bytes = p[4];
  if (name_bytes == 0 || size < 9 + name_bytes) {
    return DataLossError(fmt::format("HELLO of {} bytes with a {}-byte name", size, name_bytes));
  }
  HelloPayload hello;
  hello.name.assign(reinterpret_cast<const char*>(p + 5), name_bytes);
  if (hello.name[0] == '\0') return DataLossError("HELLO with a name starting with NUL");
  const uint32_t token_bytes = GetU32(p + 5 + name_bytes);
  if (size != 9 + name_bytes + token_bytes) {
    return DataLossError(fmt::format("HELLO of {} bytes, its fields say {}", size,
                                     9 + name_bytes + uint64_t{token_bytes}));
  }
  hello.token.assign(reinterpret_cast<const char*>(p + 9 + name_bytes), token_bytes);
  return hello;
}

size_t FrameAlignment(uint64_t frame_size) {
  return frame_size >= 4096 ? 64 : 8;
}

StatusOr<DataLayout> ComputeLayout(uint64_t header_bytes,
                                   const std::vector<uint64_t>& frame_sizes) {
  DataLayout l;
  size_t offset = 0;
  bool ok = Add(0, header_bytes, &l.sizes_offset);
  ok = ok && frame_sizes.size() <= std::numeric_limits<size_t>::max() / 8 &&
       Add(l.sizes_offset, uint64_t{8} * frame_sizes.size(), &offset);
  l.frame_offsets.reserve(frame_sizes.size());
  for (size_t i = 0; ok && i < frame_sizes.size(); ++i) {
    ok = AlignUp(offset, FrameAlignment(frame_sizes[i]), &offset);
    l.frame_offsets.push_back(offset);
    ok = ok && Add(offset, frame_sizes[i], &offset);
  }
  if (!ok) return InvalidArgumentError("the message's parts do not fit in memory");
  l.total = offset;
  return l;
}

size_t MaxDataBytes(const AmHeader& h) {
  // header + per frame: its u64 size, at most largest_part bytes, at most 63 bytes of padding.
  // Every step checks for overflow: n * (largest_part + 71) can exceed 64 bits even where
  // largest_part alone is below SIZE_MAX / (n + 1).
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  constexpr uint64_t kPerFrameExtra = 8 + 63;
  const uint64_t n = h.frame_count;
  if (h.largest_part > kMax - kPerFrameExtra) return n == 0 ? h.header_bytes : kMax;
  const uint64_t per_frame = h.largest_part + kPerFrameExtra;
  if (n != 0 && per_frame > kMax / n) return kMax;
  size_t total = 0;
  if (!Add(h.header_bytes, n * per_frame, &total)) return kMax;
  return total;
}

StatusOr<ParsedData> ParseData(const AmHeader& h, const uint8_t* data, size_t size,
                               uint64_t max_part) {
  if (h.header_bytes > max_part || h.largest_part > max_part) {
    return DataLossError(fmt::format("a part of {} bytes, above the limit of {}",
                                     std::max<uint64_t>(h.header_bytes, h.largest_part), max_part));
  }
  const uint64_t sizes_end = uint64_t{h.header_bytes} + uint64_t{8} * h.frame_count;
  if (size < sizes_end) {
    return DataLossError(
        fmt::format("{} bytes of data, shorter than the header and the sizes of "
                    "{} frames",
                    size, h.frame_count));
  }
  std::vector<uint64_t> sizes(h.frame_count);
  for (uint32_t i = 0; i < h.frame_count; ++i) {
    sizes[i] = GetU64(data + h.header_bytes + 8 * size_t{i});
    if (sizes[i] > h.largest_part) {
      return DataLossError(fmt::format("frame {} of {} bytes, the AM header announced at most {}",
                                       i, sizes[i], h.largest_part));
    }
  }
  StatusOr<DataLayout> layout = ComputeLayout(h.header_bytes, sizes);
  if (!layout.ok() || layout->total != size) {
    return DataLossError(fmt::format("{} bytes of data, the sizes of its parts say {}", size,
                                     layout.ok() ? layout->total : 0));
  }
  for (uint32_t i = 0; i < h.frame_count; ++i) {
    const size_t start = i == 0 ? sizes_end : layout->frame_offsets[i - 1] + sizes[i - 1];
    for (size_t k = start; k < layout->frame_offsets[i]; ++k) {
      if (data[k] != 0) return DataLossError("padding bytes that are not 0");
    }
  }
  ParsedData out;
  out.header = data;
  out.header_bytes = h.header_bytes;
  out.frames.reserve(h.frame_count);
  out.frame_sizes.reserve(h.frame_count);
  for (uint32_t i = 0; i < h.frame_count; ++i) {
    out.frames.push_back(data + layout->frame_offsets[i]);
    out.frame_sizes.push_back(sizes[i]);
  }
  return out;
}

}  // namespace bitpush::transport::ucx_backend
