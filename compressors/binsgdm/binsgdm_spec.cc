// The spec half of BinSGDM (paper 004; compressors/method.h):
// `binsgdm[:beta=B][,eps=E][,seed=S]`. Workers keep the optimizer's moments (m, b) and the
// worker residual in their error-feedback state and push the stochastic binarisation of
// m / (b + eps) + e, one bit per element, no scale; servers count the bits in the compressed
// domain, add their residual and re-binarise (Algorithm 1). The worker state is the method
// itself, so only the policies with a worker side (worker, both) are accepted; "auto" picks
// both. docs/compressors.md "binsgdm" has the algorithm and the decisions.
#include <string>

#include "compressors/method.h"
#include "compressors/spec_params.h"
#include "compressors/spec_registry.h"

namespace bitpush::compressors {
namespace {

constexpr double kMinEps = 1.1754943508222875e-38;  // FLT_MIN: eps is used as a normal fp32
constexpr double kMaxEps = 1e30;

constexpr ParamDoc kParams[] = {
    {"beta", "0 < B < 1", "0.95", "0.9",
     "the one EMA factor of both moments, m of g and b of |g| (the paper's 0.95; 0.9 for BERT, "
     "0.99 for LSTMs)"},
    {"eps", "1.2e-38 <= E <= 1e30", "1e-08", "1e-06",
     "added to b: r = m / (b + eps), so a coordinate whose gradients were all 0 pushes Q(0)"},
    {"seed", "integer >= 0", "0", "7",
     "random stream of the binarisation, a function of (seed, worker, key, round); the server "
     "draws from its own"},
};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  v1::BinsgdmParams* q = c->mutable_binsgdm();
  if (p == "seed") {
    BP_ASSIGN_OR_RETURN(uint64_t s, ParseUintParam(m, p, v));
    q->set_seed(s);
    return Status::Ok();
  }
  BP_ASSIGN_OR_RETURN(double d, ParseDoubleParam(m, p, v));
  if (p == "beta") {
    if (!(d > 0.0 && d < 1.0)) return BadParamValue(m, p, v, "a number in (0, 1)");
    q->set_beta(d);
    return Status::Ok();
  }
  // p is "eps"
  if (!(d >= kMinEps && d <= kMaxEps)) {
    return BadParamValue(m, p, v, "a number in [1.2e-38, 1e30] (a normal fp32 > 0)");
  }
  q->set_eps(d);
  return Status::Ok();
}

Status Canonicalize(const MethodSpec&, v1::CompressorConfig* c) {
  v1::BinsgdmParams* q = c->mutable_binsgdm();
  if (!q->has_beta()) q->set_beta(0.95);
  if (!q->has_eps()) q->set_eps(1e-8);
  if (!q->has_seed()) q->set_seed(0);
  if (!(q->beta() > 0.0 && q->beta() < 1.0)) {
    return InvalidArgumentError("binsgdm: beta=" + FormatSpecDouble(q->beta()) +
                                " is out of range; valid: 0 < beta < 1");
  }
  if (!(q->eps() >= kMinEps && q->eps() <= kMaxEps)) {
    return InvalidArgumentError("binsgdm: eps=" + FormatSpecDouble(q->eps()) +
                                " is out of range; valid: 1.2e-38 <= eps <= 1e30 (a normal fp32 "
                                "> 0)");
  }
  return Status::Ok();
}

void FormatParams(const v1::CompressorConfig& c, std::string* s) {
  const v1::BinsgdmParams& q = c.binsgdm();
  *s += ":beta=" + FormatSpecDouble(q.beta());
  *s += ",eps=" + FormatSpecDouble(q.eps());
  *s += ",seed=" + std::to_string(q.seed());
}

Status CheckErrorFeedback(const v1::CompressorConfig& c, v1::ErrorFeedbackPolicy policy) {
  if (policy == v1::ERROR_FEEDBACK_WORKER || policy == v1::ERROR_FEEDBACK_BOTH) {
    return Status::Ok();
  }
  return InvalidArgumentError(
      "'" + std::string(ErrorFeedbackPolicyName(policy)) + "' with '" + CompressorSpecString(c) +
      "' is refused: binsgdm keeps its optimizer moments (m, b) and the worker residual in the "
      "worker's error-feedback state, so it needs one on the worker. Use error_feedback: both "
      "(Algorithm 1: worker and server residuals), or worker (no server residual)");
}

v1::ErrorFeedbackPolicy Recommended(const v1::CompressorConfig&) {
  return v1::ERROR_FEEDBACK_BOTH;
}

// No minimum: every coordinate of m / (b + eps) is binarised on its own, with no statistic over
// the tensor (docs/compressors.md "Smallest tensors").
ElementMinimum MinElements(const v1::CompressorConfig&) {
  return {0, "each coordinate is binarised on its own, with no scale over the tensor"};
}

constexpr MethodSpec BinsgdmSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_BINSGDM;
  m.name = "binsgdm";
  m.params_case = v1::CompressorConfig::kBinsgdm;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.carries_non_finite = false;  // +-1 only: a non-finite element restarts (optimizers/binsgdm.h)
  m.aggregation = AggregationMode::kCompressedDomainSum;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#binsgdm-id-11";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.check_error_feedback = &CheckErrorFeedback;
  m.recommended_error_feedback = &Recommended;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kBinsgdmMethodSpec = BinsgdmSpec();

}  // namespace bitpush::compressors
