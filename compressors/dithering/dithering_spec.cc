// The spec half of dithering (compressors/method.h):
// `dithering[:levels=S][,partition=linear|natural][,norm=max|l2][,seed=S]`. Unbiased, so
// "auto" error feedback is none.
#include <string>

#include "compressors/method.h"
#include "compressors/spec_params.h"

namespace bitpush::compressors {
namespace {

// The largest level counts the body format encodes (docs/dithering.md): 8-bit codes for linear
// levels, 5-bit codes for natural ones.
constexpr uint32_t kMaxLinearLevels = 255;
constexpr uint32_t kMaxNaturalLevels = 31;

constexpr ParamDoc kParams[] = {
    {"levels", "s in 1..255 (linear), 1..31 (natural)", "15", "3", "number of levels s"},
    {"partition", "linear | natural", "linear", "natural",
     "levels {0, 1/s, ..., 1} (linear) or {0, 2^(1-s), ..., 1/2, 1} (natural)"},
    {"norm", "max | l2", "max", "l2", "scale = max |x| or ||x||_2"},
    {"seed", "integer >= 0", "0", "7",
     "random stream of the rounding, a function of (seed, worker, key, round) as for randomk"},
};

Status SetParam(const MethodSpec& m, std::string_view p, std::string_view v,
                v1::CompressorConfig* c) {
  v1::DitheringParams* d = c->mutable_dithering();
  if (p == "levels") {
    BP_ASSIGN_OR_RETURN(uint64_t s, ParseUintParam(m, p, v));
    if (s > 0xFFFFFFFFull) return BadParamValue(m, p, v, "an integer in [1, 255]");
    d->set_levels(static_cast<uint32_t>(s));
    return Status::Ok();
  }
  if (p == "partition") {
    if (v == "linear")
      d->set_partition(v1::DITHERING_PARTITION_LINEAR);
    else if (v == "natural")
      d->set_partition(v1::DITHERING_PARTITION_NATURAL);
    else
      return BadParamValue(m, p, v, "linear or natural");
    return Status::Ok();
  }
  if (p == "norm") {
    if (v == "max")
      d->set_norm(v1::DITHERING_NORM_MAX);
    else if (v == "l2")
      d->set_norm(v1::DITHERING_NORM_L2);
    else
      return BadParamValue(m, p, v, "max or l2");
    return Status::Ok();
  }
  BP_ASSIGN_OR_RETURN(uint64_t s, ParseUintParam(m, p, v));  // p is "seed"
  d->set_seed(s);
  return Status::Ok();
}

Status Canonicalize(const MethodSpec&, v1::CompressorConfig* c) {
  v1::DitheringParams* d = c->mutable_dithering();
  if (d->partition() == v1::DITHERING_PARTITION_UNSPECIFIED) {
    d->set_partition(v1::DITHERING_PARTITION_LINEAR);
  }
  if (d->norm() == v1::DITHERING_NORM_UNSPECIFIED) d->set_norm(v1::DITHERING_NORM_MAX);
  if (!v1::DitheringPartition_IsValid(d->partition())) {
    return InvalidArgumentError("dithering: unknown partition; valid: linear, natural");
  }
  if (!v1::DitheringNorm_IsValid(d->norm())) {
    return InvalidArgumentError("dithering: unknown norm; valid: max, l2");
  }
  if (!d->has_levels()) d->set_levels(15);
  const bool natural = d->partition() == v1::DITHERING_PARTITION_NATURAL;
  const uint32_t max_levels = natural ? kMaxNaturalLevels : kMaxLinearLevels;
  if (d->levels() < 1 || d->levels() > max_levels) {
    return InvalidArgumentError(
        "dithering: levels=" + std::to_string(d->levels()) +
        " is out of range; valid for partition=" + (natural ? "natural" : "linear") + ": 1.." +
        std::to_string(max_levels));
  }
  if (!d->has_seed()) d->set_seed(0);
  return Status::Ok();
}

void FormatParams(const v1::CompressorConfig& c, std::string* s) {
  const v1::DitheringParams& d = c.dithering();
  *s += ":levels=" + std::to_string(d.levels());
  *s +=
      d.partition() == v1::DITHERING_PARTITION_NATURAL ? ",partition=natural" : ",partition=linear";
  *s += d.norm() == v1::DITHERING_NORM_L2 ? ",norm=l2" : ",norm=max";
  *s += ",seed=" + std::to_string(d.seed());
}

// No minimum: with one scale per tensor, the rounding error relative to the tensor shrinks with
// n (docs/compressors.md "Smallest tensors").
ElementMinimum MinElements(const v1::CompressorConfig&) {
  return {0, "one scale per tensor: its relative error shrinks with n (0 at n = 1)"};
}

constexpr MethodSpec DitheringSpec() {
  MethodSpec m;
  m.id = v1::COMPRESSOR_ID_DITHERING;
  m.name = "dithering";
  m.params_case = v1::CompressorConfig::kDithering;
  m.params = Span<const ParamDoc>(kParams, std::size(kParams));
  m.compresses = true;
  m.aggregation = AggregationMode::kDecompressSumRecompress;
  m.payload_format = kPayloadFormatVersion;
  m.wire_format = "wire-format.md#dithering-id-7";
  m.set_param = &SetParam;
  m.canonicalize = &Canonicalize;
  m.format_params = &FormatParams;
  m.min_elements = &MinElements;
  return m;
}

}  // namespace

const MethodSpec kDitheringMethodSpec = DitheringSpec();

}  // namespace bitpush::compressors
