// Writes the seed corpus of fuzz_ucx_wire: valid Active Messages of the ucx backend, made by its
// encoders (common/transport/ucx/wire.h): an AM header followed by its data.
// usage: fuzz_make_ucx_seeds <corpus-dir>   (creates <dir>/seed_*)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/transport/ucx/wire.h"

namespace {

using namespace bitpush::transport::ucx_backend;  // NOLINT

std::string Am(const AmHeader& h, const std::string& data) {
  uint8_t header[kAmHeaderBytes];
  EncodeAmHeader(h, header);
  return std::string(reinterpret_cast<const char*>(header), kAmHeaderBytes) + data;
}

// A kData message: its header and data laid out as the sender lays them out.
std::string Data(uint64_t seq, const std::string& msg_header,
                 const std::vector<std::string>& frames) {
  std::vector<uint64_t> sizes;
  uint64_t largest = msg_header.size();
  for (const std::string& f : frames) {
    sizes.push_back(f.size());
    largest = std::max<uint64_t>(largest, f.size());
  }
  const DataLayout l = ComputeLayout(msg_header.size(), sizes).value();
  std::string data(l.total, '\0');
  std::copy(msg_header.begin(), msg_header.end(), data.begin());
  for (size_t i = 0; i < frames.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      data[l.sizes_offset + 8 * i + b] = static_cast<char>(sizes[i] >> (8 * b));
    }
    std::copy(frames[i].begin(), frames[i].end(),
              data.begin() + static_cast<std::ptrdiff_t>(l.frame_offsets[i]));
  }
  AmHeader h;
  h.type = AmType::kData;
  h.seq = seq;
  h.header_bytes = static_cast<uint32_t>(msg_header.size());
  h.frame_count = static_cast<uint32_t>(frames.size());
  h.largest_part = largest;
  return Am(h, data);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  AmHeader hello;
  hello.type = AmType::kHello;
  AmHeader credit;
  credit.type = AmType::kCredit;
  credit.seq = 1024;
  const std::vector<std::string> seeds = {
      Am(hello, EncodeHello({"worker:0", ""})),
      Am(hello, EncodeHello({"server:12", std::string(32, '\x5a')})),
      Am(credit, ""),
      Data(0, "push", {}),
      Data(1, "pull:7", {std::string(5, 'a')}),
      Data(2, "", {std::string(13, 'b'), std::string(1, 'c'), ""}),
      Data(3, "push:key=3", {std::string(4096, 'd'), std::string(9, 'e')}),
  };
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream(dir / ("seed_" + std::to_string(i)), std::ios::binary)
        .write(seeds[i].data(), static_cast<std::streamsize>(seeds[i].size()));
  }
  return 0;
}
