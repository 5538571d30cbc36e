// The spec half of randomk (compressors/method.h):
// `randomk:ratio=R|k=K[,unbiased=true|false][,seed=S]`. Unscaled random-k is biased and runs
// with error feedback; unbiased (n/k-scaled) random-k refuses error feedback, whose residual
// would grow without bound.
#include "compressors/method.h"
#include "compressors/sparse/sparse_spec.h"
#include "compressors/spec_registry.h"

namespace bitpush::compressors {
namespace {

constexpr ParamDoc kParams[] = {
    kSparseRatioParam,
    kSparseKParam,
    {"unbiased", "true | false", "false", "true",
     "scale kept values by n/k (unbiased, for error_feedback: none)"},
    {"seed", "integer >= 0", "0", "7",
     "random stream; the indices are a function of (seed, worker, key, round): reproducible, "
     "independent across workers"},
};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  v1::RandomkParams* r = c->mutable_randomk();
  if (p == "unbiased") {
    BP_ASSIGN_OR_RETURN(bool b, ParseBoolParam(m, p, v));
    r->set_unbiased(b);
    return Status::Ok();
  }
  if (p == "seed") {
    BP_ASSIGN_OR_RETURN(uint64_t s, ParseUintParam(m, p, v));
    r->set_seed(s);
    return Status::Ok();
  }
  return SetSparseSizeParam(m, p, v, r);  // "ratio" or "k"
}

Status Canonicalize(const MethodSpec& m, v1::CompressorConfig* c) {
  BP_RETURN_IF_ERROR(CheckSparseSize(m, c->randomk()));
  v1::RandomkParams* r = c->mutable_randomk();
  if (!r->has_unbiased()) r->set_unbiased(false);
  if (!r->has_seed()) r->set_seed(0);
  return Status::Ok();
}

void FormatParams(const v1::CompressorConfig& c, std::string* s) {
  const v1::RandomkParams& r = c.randomk();
  AppendSparseSize(r, s);
  *s += r.unbiased() ? ",unbiased=true" : ",unbiased=false";
  *s += ",seed=" + std::to_string(r.seed());
}

Status CheckErrorFeedback(const v1::CompressorConfig& c, v1::ErrorFeedbackPolicy policy) {
  if (!c.randomk().unbiased() || policy == v1::ERROR_FEEDBACK_NONE) return Status::Ok();
  // Scaled random-k under error feedback: a kept element's residual becomes -(n/k - 1) q,
  // so residuals grow without bound (to inf within ~100 rounds at k/n = 1/32).
  return InvalidArgumentError(
      "'" + std::string(ErrorFeedbackPolicyName(policy)) + "' with '" + CompressorSpecString(c) +
      "' is refused: unbiased random-k is meant for error_feedback: none (Algorithm 3); its "
      "residual would grow without bound. Use error_feedback: none, or unbiased=false with "
      "error feedback");
}

v1::ErrorFeedbackPolicy Recommended(const v1::CompressorConfig& c) {
  return c.randomk().unbiased() ? v1::ERROR_FEEDBACK_NONE : v1::ERROR_FEEDBACK_BOTH;
}

// No minimum: k = max(1, floor(R n)) keeps at least the share R / 2 of any tensor (so unbiased
// random-k's variance n/k - 1 stays below 2/R), all of one with n <= k (docs/compressors.md
// "Smallest tensors").
ElementMinimum MinElements(const v1::CompressorConfig&) {
  return {0, "it keeps max(1, floor(R n)) >= R n / 2 elements, every element of n <= k"};
}

constexpr MethodSpec RandomkSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_RANDOMK;
  m.name = "randomk";
  m.params_case = v1::CompressorConfig::kRandomk;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.aggregation = AggregationMode::kDecompressSumRecompress;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#topk-id-5-and-randomk-id-6-sparse-format";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.check_error_feedback = &CheckErrorFeedback;
  m.recommended_error_feedback = &Recommended;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kRandomkMethodSpec = RandomkSpec();

}  // namespace bitpush::compressors
