// The spec halves of the cast methods (compressors/method.h): none, fp16 and bf16 take no
// parameters, aggregate by decompress-sum-recompress and keep vanilla error feedback. One
// folder holds all three because they are one kernel family (CastCompressor, cast.h) that
// differs only in the stored dtype.
#include "compressors/method.h"

namespace bitpush::compressors {
namespace {

constexpr MethodSpec CastSpec(v1::CompressorId id, const char* name,
                              v1::CompressorConfig::ParamsCase params_case, bool compresses,
                              const char* wire_format) {
  MethodSpec m;
  m.id = id;
  m.name = name;
  m.params_case = params_case;
  m.compresses = compresses;
  m.aggregation = AggregationMode::kDecompressSumRecompress;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = wire_format;
  return m;
}

}  // namespace

// none: the tensor's values as they are, so nothing to compress and nothing to feed back.
const MethodSpec kNoneMethodSpec = CastSpec(
    v1::COMPRESSOR_ID_NONE, "none", v1::CompressorConfig::kNone, false, "wire-format.md#none-id-1");
const MethodSpec kFp16MethodSpec =
    CastSpec(v1::COMPRESSOR_ID_FP16, "fp16", v1::CompressorConfig::kFp16, true,
             "wire-format.md#fp16-id-2-bf16-id-3");
const MethodSpec kBf16MethodSpec =
    CastSpec(v1::COMPRESSOR_ID_BF16, "bf16", v1::CompressorConfig::kBf16, true,
             "wire-format.md#fp16-id-2-bf16-id-3");

}  // namespace bitpush::compressors
