// The spec half of SEPARATE (paper 003; compressors/method.h):
// `separate[:ratio=CR][,block=B][,beta=b][,reset=T][,ema=stable|printed][,seed=S]`.
// A common Gaussian random projection of each block of B elements onto ceil(B / CR)
// directions drawn from a stream shared by every worker; servers sum the projection vectors
// (compressed-domain aggregation) and keep no error feedback; the workers keep the paper's
// moving-average error, reset every T rounds. docs/separate.md has the algorithm and the
// decisions.
#include <cmath>
#include <cstdio>
#include <string>

#include "compressors/method.h"
#include "compressors/spec_params.h"
#include "compressors/spec_registry.h"

namespace bitpush::compressors {
namespace {

constexpr uint64_t kMaxBlock = uint64_t{1} << 24;

constexpr ParamDoc kParams[] = {
    {"ratio", "CR >= 1", "16", "4",
     "compression ratio: m = ceil(B / CR) projections per block of B elements"},
    {"block", "B in 1..16777216", "32", "256",
     "elements per projection block (a block-diagonal projection; m*B Gaussians per block per "
     "pass)"},
    {"beta", "0 <= b <= 1", "0.95", "0.9", "error moving-average coefficient (see ema)"},
    {"reset", "integer >= 0", "128", "512", "the error is zeroed every T rounds; 0: never"},
    {"ema", "stable | printed", "stable", "printed",
     "stable: e <- b e + (1-b)(h - h~) (mean-square stable for b > (CR-1)/(CR+1)); printed: "
     "e <- (1-b) e + b (h - h~), the paper's Algorithm 1 as printed"},
    {"seed", "integer >= 0", "0", "3407",
     "the common random stream: Xi = f(seed, key, block, round), the same on every worker"},
};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  v1::SeparateParams* s = c->mutable_separate();
  if (p == "ratio" || p == "beta") {
    BP_ASSIGN_OR_RETURN(double d, ParseDoubleParam(m, p, v));
    if (p == "ratio") s->set_ratio(d);
    if (p == "beta") s->set_beta(d);
    return Status::Ok();
  }
  if (p == "block" || p == "reset" || p == "seed") {
    BP_ASSIGN_OR_RETURN(uint64_t n, ParseUintParam(m, p, v));
    if (p == "block") {
      if (n < 1 || n > kMaxBlock) return BadParamValue(m, p, v, "an integer in [1, 16777216]");
      s->set_block(static_cast<uint32_t>(n));
    }
    if (p == "reset") s->set_reset(n);
    if (p == "seed") s->set_seed(n);
    return Status::Ok();
  }
  // p is "ema"
  if (v == "stable") {
    s->set_ema(v1::SEPARATE_EMA_STABLE);
  } else if (v == "printed") {
    s->set_ema(v1::SEPARATE_EMA_PRINTED);
  } else {
    return BadParamValue(m, p, v, "stable or printed");
  }
  return Status::Ok();
}

Status Canonicalize(const MethodSpec&, v1::CompressorConfig* c) {
  v1::SeparateParams* s = c->mutable_separate();
  if (!s->has_ratio()) s->set_ratio(16.0);
  if (!s->has_block()) s->set_block(32);
  if (!s->has_beta()) s->set_beta(0.95);
  if (!s->has_reset()) s->set_reset(128);
  if (s->ema() == v1::SEPARATE_EMA_UNSPECIFIED) s->set_ema(v1::SEPARATE_EMA_STABLE);
  if (!s->has_seed()) s->set_seed(0);
  if (!std::isfinite(s->ratio()) || !(s->ratio() >= 1)) {
    return InvalidArgumentError("separate: ratio=" + FormatSpecDouble(s->ratio()) +
                                " is out of range; valid: a finite CR >= 1");
  }
  if (s->block() < 1 || s->block() > kMaxBlock) {
    return InvalidArgumentError("separate: block=" + std::to_string(s->block()) +
                                " is out of range; valid: an integer in [1, 16777216]");
  }
  if (!std::isfinite(s->beta()) || !(s->beta() >= 0) || s->beta() > 1) {
    return InvalidArgumentError("separate: beta=" + FormatSpecDouble(s->beta()) +
                                " is out of range; valid: 0 <= beta <= 1");
  }
  if (s->ema() != v1::SEPARATE_EMA_STABLE && s->ema() != v1::SEPARATE_EMA_PRINTED) {
    return InvalidArgumentError("separate: unknown ema convention; valid: stable, printed");
  }
  return Status::Ok();
}

void FormatParams(const v1::CompressorConfig& c, std::string* out) {
  const v1::SeparateParams& s = c.separate();
  *out += ":ratio=" + FormatSpecDouble(s.ratio());
  *out += ",block=" + std::to_string(s.block());
  *out += ",beta=" + FormatSpecDouble(s.beta());
  *out += ",reset=" + std::to_string(s.reset());
  *out += s.ema() == v1::SEPARATE_EMA_PRINTED ? ",ema=printed" : ",ema=stable";
  *out += ",seed=" + std::to_string(s.seed());
}

Status CheckErrorFeedback(const v1::CompressorConfig& c, v1::ErrorFeedbackPolicy policy) {
  if (policy == v1::ERROR_FEEDBACK_NONE || policy == v1::ERROR_FEEDBACK_WORKER) {
    return Status::Ok();
  }
  return InvalidArgumentError(
      "'" + std::string(ErrorFeedbackPolicyName(policy)) + "' with '" + CompressorSpecString(c) +
      "' is refused: separate's servers only sum projection vectors and keep no error "
      "feedback; its moving-average error lives on the workers. Use error_feedback: worker");
}

v1::ErrorFeedbackPolicy Recommended(const v1::CompressorConfig&) {
  return v1::ERROR_FEEDBACK_WORKER;
}

size_t Align(const v1::CompressorConfig& c) {
  return c.separate().block();
}

// Projection noise is about CR times the gradient's energy per step, in every block whatever
// the tensor's size (docs/separate.md); what a small tensor lacks is dimensions to spread it
// over: on a tensor of few elements with a dense Hessian (biases, a first convolution) SGD
// diverged at the defaults, while 64 x CR elements and more trained as uncompressed
// (docs/compressors.md "Smallest tensors").
ElementMinimum MinElements(const v1::CompressorConfig& c) {
  const v1::SeparateParams& s = c.separate();
  const uint64_t m = static_cast<uint64_t>(std::ceil(static_cast<double>(s.block()) / s.ratio()));
  char noise[32];
  std::snprintf(noise, sizeof noise, "%.4g", (s.block() + 1.0) / static_cast<double>(m));
  return {static_cast<size_t>(std::ceil(64.0 * s.ratio())),
          std::string("projection noise (B+1)/m = ") + noise +
              "x the gradient's energy; SGD diverged on smaller tensors"};
}

constexpr MethodSpec SeparateSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_SEPARATE;
  m.name = "separate";
  m.params_case = v1::CompressorConfig::kSeparate;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.aggregation = AggregationMode::kCompressedDomainSum;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#separate-id-10";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.check_error_feedback = &CheckErrorFeedback;
  m.recommended_error_feedback = &Recommended;
  m.partition_align = &Align;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kSeparateMethodSpec = SeparateSpec();

}  // namespace bitpush::compressors
