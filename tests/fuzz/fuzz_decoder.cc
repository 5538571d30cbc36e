// libFuzzer target: feeds arbitrary bytes to one compressor's decoder (BITPUSH_FUZZ_SPEC),
// through both Decompress and DecompressAdd, at every ISA level. The expected element count
// is taken from the header when it is small, so the fuzzer reaches the body checks; a
// decoder must return an error Status for anything malformed and never read or write out of
// bounds (ASan/UBSan watch).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/cpu_features.h"
#include "compressors/registry.h"

namespace {

using bitpush::IsaLevel;
using namespace bitpush::compressors;  // NOLINT

std::vector<std::unique_ptr<Compressor>>& Decoders() {
  static auto* decoders = [] {
    auto* v = new std::vector<std::unique_ptr<Compressor>>;
    for (IsaLevel isa : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
      if (!bitpush::IsaSupported(isa)) continue;
      CompressorOptions o;
      o.isa = isa;
      v->push_back(std::move(CreateCompressor(BITPUSH_FUZZ_SPEC, o)).value());
    }
    return v;
  }();
  return *decoders;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t n = 100;
  uint8_t dtype = 0;
  if (size >= kPayloadHeaderBytes) {
    uint64_t count;
    std::memcpy(&count, data + 8, 8);
    if (count <= (1u << 16)) n = count;
    dtype = data[2] < 3 ? data[2] : 0;
  }
  // An exact-size copy so ASan sees reads past the end.
  std::vector<uint8_t> payload(data, data + size);
  std::vector<float> acc(n, 1.0f);
  std::vector<float> out_f(n);
  std::vector<uint16_t> out_h(n);
  for (auto& c : Decoders()) {
    (void)c->DecompressAdd({payload.data(), payload.size()}, {acc.data(), acc.size()});
    if (dtype == 0) {
      (void)c->Decompress({payload.data(), payload.size()}, bitpush::TensorView(out_f.data(), n));
    } else {
      (void)c->Decompress({payload.data(), payload.size()},
                          bitpush::TensorView(out_h.data(), n, static_cast<bitpush::DType>(dtype)));
    }
  }
  return 0;
}
