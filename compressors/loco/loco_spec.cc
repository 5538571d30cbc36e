// The spec half of LoCo (paper 000; compressors/method.h):
// `loco[:scale=S][,error_scale=K][,block=B][,beta=b][,reset=T][,error=int8|fp32]
//       [,pull=loco|fp16|bf16|fp32]`. Without block, scale and error_scale the quantiser is the
// per-block absmax scale over 256 elements; scale or error_scale alone select the fixed scale
// (block=0).
// LoCo is a 4-bit quantiser plus its own error feedback (a moving average of the compression
// error kept in 8 bits and reset every T rounds), so "auto" error feedback keeps it on the
// workers, and on the server too where the server replies LoCo-compressed (pull=loco, the
// two-hop variant). docs/compressors.md "loco" has the algorithm and the decisions.
#include <cmath>

#include "compressors/method.h"
#include "compressors/spec_params.h"

namespace bitpush::compressors {
namespace {

// The largest block the format encodes (a u32 field; 2^24 keeps a block's scale meaningful).
constexpr uint64_t kMaxBlock = uint64_t{1} << 24;
// The block of a spec that names neither block nor a fixed scale: a per-block absmax scale
// fits any gradient's magnitude (a fixed default scale saturates most 4-bit values of typical
// gradients; docs/compressors.md "loco" has the measurements), at 4 bytes per 256 elements.
constexpr uint32_t kDefaultBlock = 256;

constexpr ParamDoc kParams[] = {
    {"scale", "s > 0", "524288", "131072",
     "fixed gradient scale s (block=0): q = clamp(round(h*s), -8, 7); the paper's 2^19 or 2^17; "
     "giving it selects block=0"},
    {"error_scale", "k > 0", "4", "6",
     "the int8 error buffer's scale s_e = k*s (block=0; the paper's 4s or 6s); giving it "
     "selects block=0"},
    {"block", "0 | even B in 2..16777216", "256", "128",
     "0: the fixed scale s; B: a per-block absmax scale over B elements for the 4-bit values "
     "and the int8 error (DeepSpeed's LoCo-Zero++ quantiser); 0 where scale or error_scale is "
     "given"},
    {"beta", "0 < b <= 1", "0.2", "1", "weight of the new error in the error's moving average"},
    {"reset", "integer >= 0", "512", "0", "the error is zeroed every T rounds (T_c); 0: never"},
    {"error", "int8 | fp32", "int8", "fp32",
     "error buffer precision (fp32 with beta=1, reset=0 is classic error feedback)"},
    {"pull", "loco | fp16 | bf16 | fp32", "loco", "fp16",
     "what servers reply: LoCo 4-bit with a server-side LoCo error (two-hop), or 16/32-bit "
     "values (the paper's all-to-all reading)"},
};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  v1::LocoParams* l = c->mutable_loco();
  if (p == "scale" || p == "error_scale" || p == "beta") {
    BP_ASSIGN_OR_RETURN(double d, ParseDoubleParam(m, p, v));
    if (p == "scale") l->set_scale(d);
    if (p == "error_scale") l->set_error_scale(d);
    if (p == "beta") l->set_beta(d);
    return Status::Ok();
  }
  if (p == "block") {
    BP_ASSIGN_OR_RETURN(uint64_t b, ParseUintParam(m, p, v));
    if (b > kMaxBlock) return BadParamValue(m, p, v, "0 or an even integer in [2, 16777216]");
    l->set_block(static_cast<uint32_t>(b));
    return Status::Ok();
  }
  if (p == "reset") {
    BP_ASSIGN_OR_RETURN(uint64_t t, ParseUintParam(m, p, v));
    l->set_reset(t);
    return Status::Ok();
  }
  if (p == "error") {
    if (v == "int8") {
      l->set_error(v1::LOCO_ERROR_PRECISION_INT8);
    } else if (v == "fp32") {
      l->set_error(v1::LOCO_ERROR_PRECISION_FP32);
    } else {
      return BadParamValue(m, p, v, "int8 or fp32");
    }
    return Status::Ok();
  }
  // p is "pull"
  v1::PullFormat f = v1::PULL_FORMAT_UNSPECIFIED;
  BP_RETURN_IF_ERROR(ParsePullFormat(m, p, v, &f));
  l->set_pull(f);
  return Status::Ok();
}

Status Canonicalize(const MethodSpec&, v1::CompressorConfig* c) {
  v1::LocoParams* l = c->mutable_loco();
  // A fixed scale's parameter selects the fixed scale; otherwise the block scale.
  if (!l->has_block()) l->set_block(l->has_scale() || l->has_error_scale() ? 0 : kDefaultBlock);
  if (!l->has_scale()) l->set_scale(524288.0);
  if (!l->has_error_scale()) l->set_error_scale(4.0);
  if (!l->has_beta()) l->set_beta(0.2);
  if (!l->has_reset()) l->set_reset(512);
  if (l->error() == v1::LOCO_ERROR_PRECISION_UNSPECIFIED)
    l->set_error(v1::LOCO_ERROR_PRECISION_INT8);
  if (l->pull() == v1::PULL_FORMAT_UNSPECIFIED) l->set_pull(v1::PULL_FORMAT_METHOD);
  if (!std::isfinite(l->scale()) || !(l->scale() > 0) || l->scale() > 1e30) {
    return InvalidArgumentError("loco: scale=" + FormatSpecDouble(l->scale()) +
                                " is out of range; valid: 0 < s <= 1e30");
  }
  if (!std::isfinite(l->error_scale()) || !(l->error_scale() > 0) ||
      l->scale() * l->error_scale() > 1e30) {
    return InvalidArgumentError("loco: error_scale=" + FormatSpecDouble(l->error_scale()) +
                                " is out of range; valid: k > 0 with k*scale <= 1e30");
  }
  if (l->block() != 0 && (l->block() < 2 || l->block() % 2 != 0 || l->block() > kMaxBlock)) {
    return InvalidArgumentError("loco: block=" + std::to_string(l->block()) +
                                " is out of range; valid: 0 or an even integer in [2, 16777216]");
  }
  if (!std::isfinite(l->beta()) || !(l->beta() > 0) || l->beta() > 1) {
    return InvalidArgumentError("loco: beta=" + FormatSpecDouble(l->beta()) +
                                " is out of range; valid: 0 < beta <= 1");
  }
  if (!v1::LocoErrorPrecision_IsValid(l->error())) {
    return InvalidArgumentError("loco: unknown error precision; valid: int8, fp32");
  }
  if (!v1::PullFormat_IsValid(l->pull())) {
    return InvalidArgumentError("loco: unknown pull format; valid: loco, fp16, bf16, fp32");
  }
  return Status::Ok();
}

void FormatParams(const v1::CompressorConfig& c, std::string* s) {
  const v1::LocoParams& l = c.loco();
  *s += ":scale=" + FormatSpecDouble(l.scale());
  *s += ",error_scale=" + FormatSpecDouble(l.error_scale());
  *s += ",block=" + std::to_string(l.block());
  *s += ",beta=" + FormatSpecDouble(l.beta());
  *s += ",reset=" + std::to_string(l.reset());
  *s += l.error() == v1::LOCO_ERROR_PRECISION_FP32 ? ",error=fp32" : ",error=int8";
  *s += std::string(",pull=") + PullFormatName(l.pull(), "loco");
}

v1::ErrorFeedbackPolicy Recommended(const v1::CompressorConfig& c) {
  return c.loco().pull() == v1::PULL_FORMAT_METHOD ? v1::ERROR_FEEDBACK_BOTH
                                                   : v1::ERROR_FEEDBACK_WORKER;
}

size_t Align(const v1::CompressorConfig& c) {
  return c.loco().block() ? c.loco().block() : 2;
}

// No minimum: a fixed-scale quantiser rounds each element on its own, and a block scale over a
// short tensor fits it as well as over a full block (docs/compressors.md "Smallest tensors").
ElementMinimum MinElements(const v1::CompressorConfig&) {
  return {0, "each element is rounded on its own scale s, or a block's absmax"};
}

constexpr MethodSpec LocoSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_LOCO;
  m.name = "loco";
  m.params_case = v1::CompressorConfig::kLoco;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.aggregation = AggregationMode::kDecompressSumRecompress;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#loco-id-8";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.recommended_error_feedback = &Recommended;
  m.partition_align = &Align;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kLocoMethodSpec = LocoSpec();

}  // namespace bitpush::compressors
