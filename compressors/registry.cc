#include "compressors/registry.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compressors/factories.h"

namespace bitpush::compressors {
namespace {

struct Entry {
  v1::CompressorId id;
  const char* name;
  const char* params;  // comma-separated list of valid parameter names, for messages
};

constexpr Entry kEntries[] = {
    {v1::COMPRESSOR_ID_NONE, "none", ""},
    {v1::COMPRESSOR_ID_FP16, "fp16", ""},
    {v1::COMPRESSOR_ID_BF16, "bf16", ""},
    {v1::COMPRESSOR_ID_ONEBIT, "onebit", "scaled"},
    {v1::COMPRESSOR_ID_TOPK, "topk", "ratio, k"},
    {v1::COMPRESSOR_ID_RANDOMK, "randomk", "ratio, k, unbiased, seed"},
    {v1::COMPRESSOR_ID_DITHERING, "dithering", "levels, partition, norm, seed"},
};

constexpr uint32_t kMaxLinearLevels = 255;
constexpr uint32_t kMaxNaturalLevels = 31;

const Entry* FindByName(std::string_view name) {
  for (const Entry& e : kEntries) {
    if (name == e.name) return &e;
  }
  return nullptr;
}
const Entry* FindById(v1::CompressorId id) {
  for (const Entry& e : kEntries) {
    if (id == e.id) return &e;
  }
  return nullptr;
}

std::string ValidNames() {
  std::string s;
  for (const Entry& e : kEntries) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Status BadValue(const Entry& e, std::string_view param, std::string_view value,
                std::string_view expected) {
  return InvalidArgumentError(std::string(e.name) + ": invalid value '" + std::string(value) +
                              "' for parameter '" + std::string(param) + "'; expected " +
                              std::string(expected));
}

StatusOr<bool> ParseBool(const Entry& e, std::string_view p, std::string_view v) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return BadValue(e, p, v, "true or false");
}

StatusOr<double> ParseDouble(const Entry& e, std::string_view p, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(d)) {
    return BadValue(e, p, v, "a finite number");
  }
  return d;
}

StatusOr<uint64_t> ParseUint(const Entry& e, std::string_view p, std::string_view v) {
  const std::string s(v);
  if (s.empty() || s[0] == '-' || s[0] == '+') return BadValue(e, p, v, "a non-negative integer");
  char* end = nullptr;
  errno = 0;
  const unsigned long long u = std::strtoull(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size() || errno != 0) {
    return BadValue(e, p, v, "a non-negative integer");
  }
  return static_cast<uint64_t>(u);
}

Status UnknownParam(const Entry& e, std::string_view param) {
  std::string valid = *e.params ? e.params : "(none: this compressor takes no parameters)";
  return InvalidArgumentError(std::string(e.name) + ": unknown parameter '" + std::string(param) +
                              "'; valid parameters: " + valid);
}

// Sets one parameter on `config`, whose id is e.id.
Status SetParam(const Entry& e, std::string_view p, std::string_view v,
                v1::CompressorConfig* config) {
  switch (e.id) {
    case v1::COMPRESSOR_ID_ONEBIT:
      if (p == "scaled") {
        BP_ASSIGN_OR_RETURN(bool b, ParseBool(e, p, v));
        config->mutable_onebit()->set_scaled(b);
        return Status::Ok();
      }
      break;
    case v1::COMPRESSOR_ID_TOPK:
    case v1::COMPRESSOR_ID_RANDOMK: {
      const bool topk = e.id == v1::COMPRESSOR_ID_TOPK;
      if (p == "ratio") {
        BP_ASSIGN_OR_RETURN(double d, ParseDouble(e, p, v));
        if (topk)
          config->mutable_topk()->set_ratio(d);
        else
          config->mutable_randomk()->set_ratio(d);
        return Status::Ok();
      }
      if (p == "k") {
        BP_ASSIGN_OR_RETURN(uint64_t k, ParseUint(e, p, v));
        if (topk)
          config->mutable_topk()->set_k(k);
        else
          config->mutable_randomk()->set_k(k);
        return Status::Ok();
      }
      if (!topk && p == "unbiased") {
        BP_ASSIGN_OR_RETURN(bool b, ParseBool(e, p, v));
        config->mutable_randomk()->set_unbiased(b);
        return Status::Ok();
      }
      if (!topk && p == "seed") {
        BP_ASSIGN_OR_RETURN(uint64_t s, ParseUint(e, p, v));
        config->mutable_randomk()->set_seed(s);
        return Status::Ok();
      }
      break;
    }
    case v1::COMPRESSOR_ID_DITHERING: {
      v1::DitheringParams* d = config->mutable_dithering();
      if (p == "levels") {
        BP_ASSIGN_OR_RETURN(uint64_t s, ParseUint(e, p, v));
        if (s > 0xFFFFFFFFull) return BadValue(e, p, v, "an integer in [1, 255]");
        d->set_levels(static_cast<uint32_t>(s));
        return Status::Ok();
      }
      if (p == "partition") {
        if (v == "linear")
          d->set_partition(v1::DITHERING_PARTITION_LINEAR);
        else if (v == "natural")
          d->set_partition(v1::DITHERING_PARTITION_NATURAL);
        else
          return BadValue(e, p, v, "linear or natural");
        return Status::Ok();
      }
      if (p == "norm") {
        if (v == "max")
          d->set_norm(v1::DITHERING_NORM_MAX);
        else if (v == "l2")
          d->set_norm(v1::DITHERING_NORM_L2);
        else
          return BadValue(e, p, v, "max or l2");
        return Status::Ok();
      }
      if (p == "seed") {
        BP_ASSIGN_OR_RETURN(uint64_t s, ParseUint(e, p, v));
        d->set_seed(s);
        return Status::Ok();
      }
      break;
    }
    default: break;
  }
  return UnknownParam(e, p);
}

// Makes sure the params oneof matches the id (an empty oneof is filled in).
Status CheckParamsCase(const Entry& e, v1::CompressorConfig* c) {
  using PC = v1::CompressorConfig::ParamsCase;
  PC want = PC::PARAMS_NOT_SET;
  switch (e.id) {
    case v1::COMPRESSOR_ID_NONE:
      want = PC::kNone;
      if (!c->has_none()) c->mutable_none();
      break;
    case v1::COMPRESSOR_ID_FP16:
      want = PC::kFp16;
      if (!c->has_fp16()) c->mutable_fp16();
      break;
    case v1::COMPRESSOR_ID_BF16:
      want = PC::kBf16;
      if (!c->has_bf16()) c->mutable_bf16();
      break;
    case v1::COMPRESSOR_ID_ONEBIT:
      want = PC::kOnebit;
      if (!c->has_onebit()) c->mutable_onebit();
      break;
    case v1::COMPRESSOR_ID_TOPK:
      want = PC::kTopk;
      if (!c->has_topk()) c->mutable_topk();
      break;
    case v1::COMPRESSOR_ID_RANDOMK:
      want = PC::kRandomk;
      if (!c->has_randomk()) c->mutable_randomk();
      break;
    case v1::COMPRESSOR_ID_DITHERING:
      want = PC::kDithering;
      if (!c->has_dithering()) c->mutable_dithering();
      break;
    default: break;
  }
  if (c->params_case() != want) {
    return InvalidArgumentError(std::string(e.name) +
                                ": config carries parameters of another compressor");
  }
  return Status::Ok();
}

template <typename P>
Status CheckSize(const Entry& e, const P& p) {
  switch (p.size_case()) {
    case P::kRatio:
      if (!(p.ratio() > 0.0 && p.ratio() <= 1.0)) {
        return InvalidArgumentError(std::string(e.name) + ": ratio=" + std::to_string(p.ratio()) +
                                    " is out of range; valid: 0 < ratio <= 1");
      }
      return Status::Ok();
    case P::kK:
      if (p.k() < 1) {
        return InvalidArgumentError(std::string(e.name) + ": k=0 is out of range; valid: k >= 1");
      }
      return Status::Ok();
    default:
      return InvalidArgumentError(std::string(e.name) +
                                  ": needs the number of kept elements: ratio=R (0 < R <= 1) "
                                  "or k=K (K >= 1)");
  }
}

std::string FormatDouble(double d) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

}  // namespace

StatusOr<v1::CompressorConfig> CanonicalizeCompressorConfig(const v1::CompressorConfig& in) {
  const Entry* e = FindById(in.id());
  if (e == nullptr) {
    return InvalidArgumentError("unknown compressor id " + std::to_string(in.id()) +
                                "; valid compressors: " + ValidNames());
  }
  v1::CompressorConfig c = in;
  BP_RETURN_IF_ERROR(CheckParamsCase(*e, &c));
  switch (e->id) {
    case v1::COMPRESSOR_ID_ONEBIT:
      if (!c.onebit().has_scaled()) c.mutable_onebit()->set_scaled(true);
      break;
    case v1::COMPRESSOR_ID_TOPK: BP_RETURN_IF_ERROR(CheckSize(*e, c.topk())); break;
    case v1::COMPRESSOR_ID_RANDOMK: {
      BP_RETURN_IF_ERROR(CheckSize(*e, c.randomk()));
      v1::RandomkParams* r = c.mutable_randomk();
      if (!r->has_unbiased()) r->set_unbiased(false);
      if (!r->has_seed()) r->set_seed(0);
      break;
    }
    case v1::COMPRESSOR_ID_DITHERING: {
      v1::DitheringParams* d = c.mutable_dithering();
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
      break;
    }
    default: break;
  }
  return c;
}

StatusOr<v1::CompressorConfig> ParseCompressorSpec(std::string_view spec) {
  spec = Trim(spec);
  const size_t colon = spec.find(':');
  const std::string_view name = Trim(spec.substr(0, colon));
  const Entry* e = FindByName(name);
  if (e == nullptr) {
    return InvalidArgumentError("unknown compressor '" + std::string(name) +
                                "'; valid compressors: " + ValidNames());
  }
  v1::CompressorConfig c;
  c.set_id(e->id);
  BP_RETURN_IF_ERROR(CheckParamsCase(*e, &c));
  if (colon != std::string_view::npos) {
    std::string_view rest = spec.substr(colon + 1);
    std::vector<std::string> seen;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view item = Trim(rest.substr(0, comma));
      const size_t eq = item.find('=');
      if (item.empty() || eq == std::string_view::npos) {
        return InvalidArgumentError(std::string(e->name) + ": malformed parameter '" +
                                    std::string(item) + "' in spec '" + std::string(spec) +
                                    "'; expected param=value");
      }
      const std::string_view p = Trim(item.substr(0, eq));
      const std::string_view v = Trim(item.substr(eq + 1));
      for (const std::string& s : seen) {
        if (s == p) {
          return InvalidArgumentError(std::string(e->name) + ": parameter '" + std::string(p) +
                                      "' given twice");
        }
      }
      seen.emplace_back(p);
      if ((e->id == v1::COMPRESSOR_ID_TOPK || e->id == v1::COMPRESSOR_ID_RANDOMK) &&
          ((p == "k" && std::find(seen.begin(), seen.end(), "ratio") != seen.end()) ||
           (p == "ratio" && std::find(seen.begin(), seen.end(), "k") != seen.end()))) {
        return InvalidArgumentError(std::string(e->name) + ": give ratio or k, not both");
      }
      BP_RETURN_IF_ERROR(SetParam(*e, p, v, &c));
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  return CanonicalizeCompressorConfig(c);
}

std::string CompressorSpecString(const v1::CompressorConfig& c) {
  const Entry* e = FindById(c.id());
  if (e == nullptr) return "invalid";
  std::string s = e->name;
  switch (c.id()) {
    case v1::COMPRESSOR_ID_ONEBIT:
      s += c.onebit().scaled() ? ":scaled=true" : ":scaled=false";
      break;
    case v1::COMPRESSOR_ID_TOPK:
      s += c.topk().has_ratio() ? ":ratio=" + FormatDouble(c.topk().ratio())
                                : ":k=" + std::to_string(c.topk().k());
      break;
    case v1::COMPRESSOR_ID_RANDOMK: {
      const v1::RandomkParams& r = c.randomk();
      s += r.has_ratio() ? ":ratio=" + FormatDouble(r.ratio()) : ":k=" + std::to_string(r.k());
      s += r.unbiased() ? ",unbiased=true" : ",unbiased=false";
      s += ",seed=" + std::to_string(r.seed());
      break;
    }
    case v1::COMPRESSOR_ID_DITHERING: {
      const v1::DitheringParams& d = c.dithering();
      s += ":levels=" + std::to_string(d.levels());
      s += d.partition() == v1::DITHERING_PARTITION_NATURAL ? ",partition=natural"
                                                            : ",partition=linear";
      s += d.norm() == v1::DITHERING_NORM_L2 ? ",norm=l2" : ",norm=max";
      s += ",seed=" + std::to_string(d.seed());
      break;
    }
    default: break;
  }
  return s;
}

StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const v1::CompressorConfig& config,
                                                       const CompressorOptions& options) {
  BP_RETURN_IF_ERROR(CheckIsaSupported(options.isa));
  BP_ASSIGN_OR_RETURN(const v1::CompressorConfig c, CanonicalizeCompressorConfig(config));
  const IsaLevel isa = options.isa;
  std::unique_ptr<Compressor> made;
  switch (c.id()) {
    case v1::COMPRESSOR_ID_NONE: made = NewNoneCompressor(isa); break;
    case v1::COMPRESSOR_ID_FP16: made = NewFp16Compressor(isa); break;
    case v1::COMPRESSOR_ID_BF16: made = NewBf16Compressor(isa); break;
    case v1::COMPRESSOR_ID_ONEBIT: made = NewOnebitCompressor(c.onebit(), isa); break;
    case v1::COMPRESSOR_ID_TOPK: made = NewTopkCompressor(c.topk(), isa); break;
    case v1::COMPRESSOR_ID_RANDOMK: made = NewRandomkCompressor(c.randomk(), isa); break;
    case v1::COMPRESSOR_ID_DITHERING: made = NewDitheringCompressor(c.dithering(), isa); break;
    default: break;
  }
  if (made == nullptr) {
    return InternalError("compressor " + CompressorSpecString(c) + " has no factory");
  }
  return made;
}

StatusOr<std::unique_ptr<Compressor>> CreateCompressor(std::string_view spec,
                                                       const CompressorOptions& options) {
  BP_ASSIGN_OR_RETURN(const v1::CompressorConfig c, ParseCompressorSpec(spec));
  return CreateCompressor(c, options);
}

std::vector<std::string> CompressorNames() {
  std::vector<std::string> names;
  for (const Entry& e : kEntries) names.emplace_back(e.name);
  return names;
}

std::string_view CompressorName(v1::CompressorId id) {
  const Entry* e = FindById(id);
  return e ? e->name : "";
}

StatusOr<v1::ErrorFeedbackPolicy> ParseErrorFeedbackPolicy(std::string_view name) {
  if (name == "none") return v1::ERROR_FEEDBACK_NONE;
  if (name == "worker") return v1::ERROR_FEEDBACK_WORKER;
  if (name == "server") return v1::ERROR_FEEDBACK_SERVER;
  if (name == "both") return v1::ERROR_FEEDBACK_BOTH;
  return InvalidArgumentError("unknown error-feedback policy '" + std::string(name) +
                              "'; valid: none, worker, server, both");
}

std::string_view ErrorFeedbackPolicyName(v1::ErrorFeedbackPolicy policy) {
  switch (policy) {
    case v1::ERROR_FEEDBACK_NONE: return "none";
    case v1::ERROR_FEEDBACK_WORKER: return "worker";
    case v1::ERROR_FEEDBACK_SERVER: return "server";
    case v1::ERROR_FEEDBACK_BOTH: return "both";
    default: return "unspecified";
  }
}

}  // namespace bitpush::compressors
