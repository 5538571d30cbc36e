// The spec half of onebit (compressors/method.h): `onebit[:scaled=true|false]`, biased, so
// "auto" error feedback is both sides.
#include <string>

#include "compressors/method.h"
#include "compressors/spec_params.h"

namespace bitpush::compressors {
namespace {

constexpr ParamDoc kParams[] = {
    {"scaled", "true | false", "true", "false",
     "scale = mean |x| (true, paper 001) or 1 (false: plain sign)"},
};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  BP_ASSIGN_OR_RETURN(bool scaled, ParseBoolParam(m, p, v));  // p is "scaled"
  c->mutable_onebit()->set_scaled(scaled);
  return Status::Ok();
}

Status Canonicalize(const MethodSpec&, v1::CompressorConfig* c) {
  if (!c->onebit().has_scaled()) c->mutable_onebit()->set_scaled(true);
  return Status::Ok();
}

void FormatParams(const v1::CompressorConfig& c, std::string* s) {
  *s += c.onebit().scaled() ? ":scaled=true" : ":scaled=false";
}

v1::ErrorFeedbackPolicy Recommended(const v1::CompressorConfig&) {
  return v1::ERROR_FEEDBACK_BOTH;
}

// No minimum: the scaled sign's error 1 - |x|_1^2 / (n |x|_2^2) is 0 at n = 1 and grows with n
// (docs/compressors.md "Smallest tensors").
ElementMinimum MinElements(const v1::CompressorConfig&) {
  return {0, "its error 1 - |x|_1^2/(n |x|_2^2) is 0 at n = 1 and grows with n"};
}

constexpr MethodSpec OnebitSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_ONEBIT;
  m.name = "onebit";
  m.params_case = v1::CompressorConfig::kOnebit;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.aggregation = AggregationMode::kDecompressSumRecompress;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#onebit-id-4";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.recommended_error_feedback = &Recommended;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kOnebitMethodSpec = OnebitSpec();

}  // namespace bitpush::compressors
