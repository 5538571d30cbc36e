// libFuzzer target: arbitrary spec strings must parse to a valid config or to an
// InvalidArgument error; a parsed config's canonical string must parse to the same config.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "compressors/spec_registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  auto c = bitpush::compressors::ParseCompressorSpec(spec);
  if (!c.ok()) {
    if (c.status().code() != bitpush::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string canon = bitpush::compressors::CompressorSpecString(*c);
  auto again = bitpush::compressors::ParseCompressorSpec(canon);
  if (!again.ok() || bitpush::compressors::CompressorSpecString(*again) != canon) std::abort();
  return 0;
}
