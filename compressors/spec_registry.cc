#include "compressors/spec_registry.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <string>

namespace bitpush::compressors {
namespace {

constexpr const MethodSpec* kMethods[] = {
#define BITPUSH_METHOD(Name) &k##Name##MethodSpec,
#include "compressors/methods.inc"
#undef BITPUSH_METHOD
};

std::string ValidNames() {
  std::string s;
  for (const MethodSpec* m : kMethods) {
    if (!s.empty()) s += ", ";
    s += m->name;
  }
  return s;
}

std::string ValidParams(const MethodSpec& m) {
  if (m.params.empty()) return "(none: this compressor takes no parameters)";
  std::string s;
  for (const ParamDoc& p : m.params) {
    if (!s.empty()) s += ", ";
    s += p.name;
  }
  return s;
}

bool IsParam(const MethodSpec& m, std::string_view name) {
  for (const ParamDoc& p : m.params) {
    if (name == p.name) return true;
  }
  return false;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Status UnknownParam(const MethodSpec& m, std::string_view param) {
  return InvalidArgumentError(std::string(m.name) + ": unknown parameter '" + std::string(param) +
                              "'; valid parameters: " + ValidParams(m));
}

// Makes the params oneof hold the method's member: an empty oneof, or one of another method,
// becomes the method's (empty) member, the way mutable_<member>() does.
Status SelectParams(const MethodSpec& m, v1::CompressorConfig* c) {
  if (c->params_case() != m.params_case) {
    const google::protobuf::FieldDescriptor* field =
        v1::CompressorConfig::descriptor()->FindFieldByNumber(m.params_case);
    if (field != nullptr && field->message_type() != nullptr) {
      c->GetReflection()->MutableMessage(c, field);
    }
  }
  if (c->params_case() != m.params_case) {
    return InvalidArgumentError(std::string(m.name) +
                                ": config carries parameters of another compressor");
  }
  return Status::Ok();
}

}  // namespace

std::string_view AggregationModeName(AggregationMode mode) {
  switch (mode) {
    case AggregationMode::kDecompressSumRecompress: return "decompress-sum-recompress";
    case AggregationMode::kCompressedDomainSum: return "compressed-domain-sum";
  }
  return "unknown";
}

Span<const MethodSpec* const> Methods() {
  return Span<const MethodSpec* const>(kMethods, sizeof(kMethods) / sizeof(kMethods[0]));
}

const MethodSpec* FindMethod(v1::CompressorId id) {
  for (const MethodSpec* m : kMethods) {
    if (id == m->id) return m;
  }
  return nullptr;
}

const MethodSpec* FindMethod(std::string_view name) {
  for (const MethodSpec* m : kMethods) {
    if (name == m->name) return m;
  }
  return nullptr;
}

StatusOr<v1::CompressorConfig> CanonicalizeCompressorConfig(const v1::CompressorConfig& in) {
  const MethodSpec* m = FindMethod(in.id());
  if (m == nullptr) {
    return InvalidArgumentError("unknown compressor id " + std::to_string(in.id()) +
                                "; valid compressors: " + ValidNames());
  }
  v1::CompressorConfig c = in;
  BP_RETURN_IF_ERROR(SelectParams(*m, &c));
  if (m->canonicalize != nullptr) BP_RETURN_IF_ERROR(m->canonicalize(*m, &c));
  return c;
}

StatusOr<v1::CompressorConfig> ParseCompressorSpec(std::string_view spec) {
  spec = Trim(spec);
  const size_t colon = spec.find(':');
  const std::string_view name = Trim(spec.substr(0, colon));
  const MethodSpec* m = FindMethod(name);
  if (m == nullptr) {
    return InvalidArgumentError("unknown compressor '" + std::string(name) +
                                "'; valid compressors: " + ValidNames());
  }
  v1::CompressorConfig c;
  c.set_id(m->id);
  BP_RETURN_IF_ERROR(SelectParams(*m, &c));
  if (colon != std::string_view::npos) {
    std::string_view rest = spec.substr(colon + 1);
    std::vector<std::string> seen;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view item = Trim(rest.substr(0, comma));
      const size_t eq = item.find('=');
      if (item.empty() || eq == std::string_view::npos) {
        return InvalidArgumentError(std::string(m->name) + ": malformed parameter '" +
                                    std::string(item) + "' in spec '" + std::string(spec) +
                                    "'; expected param=value");
      }
      const std::string_view p = Trim(item.substr(0, eq));
      const std::string_view v = Trim(item.substr(eq + 1));
      for (const std::string& s : seen) {
        if (s == p) {
          return InvalidArgumentError(std::string(m->name) + ": parameter '" + std::string(p) +
                                      "' given twice");
        }
      }
      seen.emplace_back(p);
      if (!IsParam(*m, p) || m->set_param == nullptr) return UnknownParam(*m, p);
      BP_RETURN_IF_ERROR(m->set_param(*m, p, v, &c));
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  return CanonicalizeCompressorConfig(c);
}

std::string CompressorSpecString(const v1::CompressorConfig& c) {
  const MethodSpec* m = FindMethod(c.id());
  if (m == nullptr) return "invalid";
  std::string s = m->name;
  if (m->format_params != nullptr) m->format_params(c, &s);
  return s;
}

std::vector<std::string> CompressorNames() {
  std::vector<std::string> names;
  for (const MethodSpec* m : kMethods) names.emplace_back(m->name);
  return names;
}

std::string_view CompressorName(v1::CompressorId id) {
  const MethodSpec* m = FindMethod(id);
  return m ? m->name : "";
}

bool MethodCompresses(v1::CompressorId id) {
  const MethodSpec* m = FindMethod(id);
  return m == nullptr || m->compresses;
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

Status ValidateErrorFeedback(const v1::CompressorConfig& config, v1::ErrorFeedbackPolicy policy) {
  const MethodSpec* m = FindMethod(config.id());
  if (m == nullptr) {
    return InvalidArgumentError("unknown compressor id " + std::to_string(config.id()) +
                                "; valid compressors: " + ValidNames());
  }
  if (ErrorFeedbackPolicyName(policy) == "unspecified") {
    return InvalidArgumentError("unknown error-feedback policy " + std::to_string(policy) +
                                "; valid: none, worker, server, both");
  }
  return m->check_error_feedback ? m->check_error_feedback(config, policy) : Status::Ok();
}

v1::ErrorFeedbackPolicy RecommendedErrorFeedback(const v1::CompressorConfig& config) {
  const MethodSpec* m = FindMethod(config.id());
  if (m == nullptr || m->recommended_error_feedback == nullptr) return v1::ERROR_FEEDBACK_NONE;
  return m->recommended_error_feedback(config);
}

size_t PartitionAlign(const v1::CompressorConfig& config) {
  const MethodSpec* m = FindMethod(config.id());
  if (m == nullptr || m->partition_align == nullptr) return 1;
  const size_t a = m->partition_align(config);
  return a == 0 ? 1 : a;
}

ElementMinimum MinimumElements(const v1::CompressorConfig& config) {
  const MethodSpec* m = FindMethod(config.id());
  if (m == nullptr || m->min_elements == nullptr) return {};
  return m->min_elements(config);
}

Status CheckRawWeightPull(const v1::CompressorConfig& config) {
  if (!MethodCompresses(config.id()) ||
      RecommendedErrorFeedback(config) == v1::ERROR_FEEDBACK_NONE) {
    return Status::Ok();
  }
  return InvalidArgumentError(
      "weight pulls with '" + CompressorSpecString(config) +
      "' as raw weights: the method is biased, and biased compression of the weights themselves "
      "can stall training (SDP4Bit's Counterexample 4.1); pull the difference against the "
      "workers' copy instead (the mirror form)");
}

}  // namespace bitpush::compressors
