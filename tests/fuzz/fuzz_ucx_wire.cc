// libFuzzer target: the ucx backend's wire decoding (common/transport/ucx/wire.h). An input is
// what one Active Message delivers: its 32-byte AM header followed by its data. The header goes
// through ParseAmHeader; the data through ParseHello, and, under a kData header, through
// MaxDataBytes and ParseData. Beyond "no out-of-bounds access, no undefined behaviour"
// (ASan/UBSan watch), what parses must re-encode to the same bytes, a parsed message's parts
// must lie inside its data, and MaxDataBytes must bound (or saturate at SIZE_MAX) the largest
// data such a header allows; a violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/transport/ucx/wire.h"

namespace {

using namespace bitpush::transport::ucx_backend;  // NOLINT

constexpr uint64_t kMaxPart = uint64_t{1} << 20;

void Check(bool ok) {
  if (!ok) std::abort();
}

// The exact bound MaxDataBytes computes, in 128 bits.
size_t ExactMaxDataBytes(const AmHeader& h) {
  using U128 = unsigned __int128;
  const U128 n = h.frame_count;
  const U128 total = U128{h.header_bytes} + n * 8 + n * (U128{h.largest_part} + 63);
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  return total > kMax ? kMax : static_cast<size_t>(total);
}

void FuzzHello(const std::vector<uint8_t>& bytes) {
  auto hello = ParseHello(bytes.data(), bytes.size());
  if (!hello.ok()) return;
  Check(!hello->name.empty() && hello->name.size() <= 255 && hello->name[0] != '\0');
  const std::string again = EncodeHello(*hello);
  Check(again.size() == bytes.size() && std::memcmp(again.data(), bytes.data(), bytes.size()) == 0);
}

void FuzzData(const AmHeader& h, const std::vector<uint8_t>& data) {
  const size_t max = MaxDataBytes(h);
  const size_t exact = ExactMaxDataBytes(h);
  Check(max == exact || max == std::numeric_limits<size_t>::max());
  auto parsed = ParseData(h, data.data(), data.size(), kMaxPart);
  if (!parsed.ok()) return;
  Check(data.size() <= max);
  Check(parsed->header == data.data() && parsed->header_bytes == h.header_bytes);
  Check(parsed->frames.size() == h.frame_count && parsed->frame_sizes.size() == h.frame_count);
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < parsed->frames.size(); ++i) {
    const uint8_t* f = parsed->frames[i];
    Check(f >= data.data() && parsed->frame_sizes[i] <= h.largest_part &&
          static_cast<size_t>(f - data.data()) + parsed->frame_sizes[i] <= data.size());
    sizes.push_back(parsed->frame_sizes[i]);
  }
  auto layout = ComputeLayout(h.header_bytes, sizes);
  Check(layout.ok() && layout->total == data.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  // Exact-size copies so ASan sees reads past the end.
  if (size < kAmHeaderBytes) {
    const std::vector<uint8_t> bytes(input, input + size);
    Check(!ParseAmHeader(bytes.data(), bytes.size()).ok());
    FuzzHello(bytes);
    return 0;
  }
  {
    // The whole input as one AM header: only a kFrame header may be longer than 32 bytes, and
    // then by exactly its message header.
    const std::vector<uint8_t> whole(input, input + size);
    auto f = ParseAmHeader(whole.data(), whole.size());
    Check(!f.ok() || size == kAmHeaderBytes ||
          (f->type == AmType::kFrame && f->frame_count == 1 &&
           f->header_bytes == size - kAmHeaderBytes && f->header_bytes <= kMaxFrameMessageHeader));
  }
  const std::vector<uint8_t> header(input, input + kAmHeaderBytes);
  const std::vector<uint8_t> data(input + kAmHeaderBytes, input + size);
  auto h = ParseAmHeader(header.data(), header.size());
  if (h.ok()) {
    uint8_t again[kAmHeaderBytes];
    EncodeAmHeader(*h, again);
    Check(std::memcmp(again, header.data(), kAmHeaderBytes) == 0);
  }
  if (!h.ok() || h->type == AmType::kHello) FuzzHello(data);
  if (!h.ok() || h->type == AmType::kData) {
    AmHeader as_data = h.ok() ? *h : AmHeader{};
    if (!h.ok()) {  // still exercise the data parser with the fields as they lie
      std::memcpy(&as_data.seq, header.data() + 8, 8);
      std::memcpy(&as_data.header_bytes, header.data() + 16, 4);
      std::memcpy(&as_data.frame_count, header.data() + 20, 4);
      std::memcpy(&as_data.largest_part, header.data() + 24, 8);
    }
    FuzzData(as_data, data);
  }
  return 0;
}
