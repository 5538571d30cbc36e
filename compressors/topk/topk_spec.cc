// The spec half of topk (compressors/method.h): `topk:ratio=R | topk:k=K`, biased, so "auto"
// error feedback is both sides.
#include <string>

#include "compressors/method.h"
#include "compressors/sparse/sparse_spec.h"

namespace bitpush::compressors {
namespace {

constexpr ParamDoc kParams[] = {kSparseRatioParam, kSparseKParam};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  return SetSparseSizeParam(m, p, v, c->mutable_topk());  // p is "ratio" or "k"
}

Status Canonicalize(const MethodSpec& m, v1::CompressorConfig* c) {
  return CheckSparseSize(m, c->topk());
}

void FormatParams(const v1::CompressorConfig& c, std::string* s) {
  AppendSparseSize(c.topk(), s);
}

v1::ErrorFeedbackPolicy Recommended(const v1::CompressorConfig&) {
  return v1::ERROR_FEEDBACK_BOTH;
}

// No minimum: k = max(1, floor(R n)) keeps at least the share R / 2 of any tensor, all of one
// with n <= k (docs/compressors.md "Smallest tensors").
ElementMinimum MinElements(const v1::CompressorConfig&) {
  return {0, "it keeps max(1, floor(R n)) >= R n / 2 elements, every element of n <= k"};
}

constexpr MethodSpec TopkSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_TOPK;
  m.name = "topk";
  m.params_case = v1::CompressorConfig::kTopk;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.aggregation = AggregationMode::kDecompressSumRecompress;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#topk-id-5-and-randomk-id-6-sparse-format";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.recommended_error_feedback = &Recommended;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kTopkMethodSpec = TopkSpec();

}  // namespace bitpush::compressors
