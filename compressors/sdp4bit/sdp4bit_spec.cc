// The spec half of SDP4Bit's gradient path, TLq-HS (paper 002; compressors/method.h):
// `sdp4bit[:bits=4|8][,group=G][,hadamard=on|off][,seed=S][,pull=sdp4bit|fp16|bf16|fp32]`.
// A group-wise symmetric quantiser with stochastic rounding (unbiased), after a 32x32 Hadamard
// transform of each 32-element block; the server sums the pushes in the Hadamard domain and
// applies one inverse transform per key. No error feedback, as in the paper: every policy but
// none is refused. docs/compressors.md "sdp4bit" has the algorithm and the decisions.
#include <string>

#include "compressors/method.h"
#include "compressors/spec_params.h"
#include "compressors/spec_registry.h"

namespace bitpush::compressors {
namespace {

constexpr uint64_t kMaxGroup = uint64_t{1} << 20;
constexpr uint32_t kHadamard = 32;

constexpr ParamDoc kParams[] = {
    {"bits", "4 | 8", "4", "8", "code width: INT4 (codes -7..7) or INT8 (codes -127..127)"},
    {"group", "G in 2..1048576, even; a multiple of 32 with hadamard=on", "128", "256",
     "elements per fp32 scale (absmax / (2^(bits-1) - 1))"},
    {"hadamard", "on | off", "on", "off",
     "32x32 Hadamard transform of each 32-element block, fused into (de)quantisation"},
    {"seed", "integer >= 0", "0", "7",
     "random stream of the stochastic rounding, a function of (seed, worker, key, round)"},
    {"pull", "sdp4bit | fp16 | bf16 | fp32", "sdp4bit", "fp16",
     "what servers reply: the aggregate quantised the same way (from the server's own stream), "
     "or 16/32-bit values"},
};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  v1::Sdp4bitParams* q = c->mutable_sdp4bit();
  if (p == "bits" || p == "group" || p == "seed") {
    BP_ASSIGN_OR_RETURN(uint64_t n, ParseUintParam(m, p, v));
    if (p == "seed") {
      q->set_seed(n);
      return Status::Ok();
    }
    if (n > kMaxGroup) {
      return BadParamValue(m, p, v, p == "bits" ? "4 or 8" : "an even integer in [2, 1048576]");
    }
    if (p == "bits") q->set_bits(static_cast<uint32_t>(n));
    if (p == "group") q->set_group(static_cast<uint32_t>(n));
    return Status::Ok();
  }
  if (p == "hadamard") {
    BP_ASSIGN_OR_RETURN(bool on, ParseBoolParam(m, p, v));
    q->set_hadamard(on);
    return Status::Ok();
  }
  // p is "pull"
  v1::PullFormat f = v1::PULL_FORMAT_UNSPECIFIED;
  BP_RETURN_IF_ERROR(ParsePullFormat(m, p, v, &f));
  q->set_pull(f);
  return Status::Ok();
}

Status Canonicalize(const MethodSpec&, v1::CompressorConfig* c) {
  v1::Sdp4bitParams* q = c->mutable_sdp4bit();
  if (!q->has_bits()) q->set_bits(4);
  if (!q->has_group()) q->set_group(128);
  if (!q->has_hadamard()) q->set_hadamard(true);
  if (!q->has_seed()) q->set_seed(0);
  if (q->pull() == v1::PULL_FORMAT_UNSPECIFIED) q->set_pull(v1::PULL_FORMAT_METHOD);
  if (q->bits() != 4 && q->bits() != 8) {
    return InvalidArgumentError("sdp4bit: bits=" + std::to_string(q->bits()) +
                                " is out of range; valid: 4, 8");
  }
  if (q->group() < 2 || q->group() % 2 != 0 || q->group() > kMaxGroup) {
    return InvalidArgumentError("sdp4bit: group=" + std::to_string(q->group()) +
                                " is out of range; valid: an even integer in [2, 1048576]");
  }
  if (q->hadamard() && q->group() % kHadamard != 0) {
    return InvalidArgumentError("sdp4bit: group=" + std::to_string(q->group()) +
                                " is not a multiple of 32, the Hadamard block; use a multiple of "
                                "32 or hadamard=off");
  }
  if (!v1::PullFormat_IsValid(q->pull())) {
    return InvalidArgumentError("sdp4bit: unknown pull format; valid: sdp4bit, fp16, bf16, fp32");
  }
  return Status::Ok();
}

void FormatParams(const v1::CompressorConfig& c, std::string* s) {
  const v1::Sdp4bitParams& q = c.sdp4bit();
  *s += ":bits=" + std::to_string(q.bits());
  *s += ",group=" + std::to_string(q.group());
  *s += q.hadamard() ? ",hadamard=on" : ",hadamard=off";
  *s += ",seed=" + std::to_string(q.seed());
  *s += std::string(",pull=") + PullFormatName(q.pull(), "sdp4bit");
}

Status CheckErrorFeedback(const v1::CompressorConfig& c, v1::ErrorFeedbackPolicy policy) {
  if (policy == v1::ERROR_FEEDBACK_NONE) return Status::Ok();
  return InvalidArgumentError(
      "'" + std::string(ErrorFeedbackPolicyName(policy)) + "' with '" + CompressorSpecString(c) +
      "' is refused: SDP4Bit's gradient path is unbiased (stochastic rounding) and runs without "
      "error feedback, as in the paper. Use error_feedback: none");
}

size_t Align(const v1::CompressorConfig& c) {
  return c.sdp4bit().group();
}

// No minimum: a tensor shorter than a 32-element Hadamard block is zero-padded to one, which
// costs bytes (min_compress_bytes' business), not accuracy (docs/compressors.md "Smallest
// tensors").
ElementMinimum MinElements(const v1::CompressorConfig&) {
  return {0, "zero-padding to a 32-element block costs bytes, not accuracy"};
}

constexpr MethodSpec Sdp4bitSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_SDP4BIT;
  m.name = "sdp4bit";
  m.params_case = v1::CompressorConfig::kSdp4Bit;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.aggregation = AggregationMode::kDecompressSumRecompress;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#sdp4bit-id-9";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.check_error_feedback = &CheckErrorFeedback;
  m.partition_align = &Align;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kSdp4bitMethodSpec = Sdp4bitSpec();

}  // namespace bitpush::compressors
