#include "compressors/spec_params.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace bitpush::compressors {

Status BadParamValue(const MethodSpec& method, std::string_view param, std::string_view value,
                     std::string_view expected) {
  return InvalidArgumentError(std::string(method.name) + ": invalid value '" + std::string(value) +
                              "' for parameter '" + std::string(param) + "'; expected " +
                              std::string(expected));
}

StatusOr<bool> ParseBoolParam(const MethodSpec& method, std::string_view param,
                              std::string_view value) {
  if (value == "true" || value == "1" || value == "yes" || value == "on") return true;
  if (value == "false" || value == "0" || value == "no" || value == "off") return false;
  return BadParamValue(method, param, value, "true or false");
}

StatusOr<double> ParseDoubleParam(const MethodSpec& method, std::string_view param,
                                  std::string_view value) {
  const std::string s(value);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(d)) {
    return BadParamValue(method, param, value, "a finite number");
  }
  return d;
}

StatusOr<uint64_t> ParseUintParam(const MethodSpec& method, std::string_view param,
                                  std::string_view value) {
  const std::string s(value);
  if (s.empty() || s[0] == '-' || s[0] == '+') {
    return BadParamValue(method, param, value, "a non-negative integer");
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long u = std::strtoull(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size() || errno != 0) {
    return BadParamValue(method, param, value, "a non-negative integer");
  }
  return static_cast<uint64_t>(u);
}

std::string FormatSpecDouble(double d) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

Status ParsePullFormat(const MethodSpec& method, std::string_view param, std::string_view value,
                       v1::PullFormat* out) {
  if (value == method.name) {
    *out = v1::PULL_FORMAT_METHOD;
  } else if (value == "fp16") {
    *out = v1::PULL_FORMAT_FP16;
  } else if (value == "bf16") {
    *out = v1::PULL_FORMAT_BF16;
  } else if (value == "fp32") {
    *out = v1::PULL_FORMAT_FP32;
  } else {
    return BadParamValue(method, param, value, std::string(method.name) + ", fp16, bf16 or fp32");
  }
  return Status::Ok();
}

const char* PullFormatName(v1::PullFormat format, const char* own) {
  switch (format) {
    case v1::PULL_FORMAT_FP16: return "fp16";
    case v1::PULL_FORMAT_BF16: return "bf16";
    case v1::PULL_FORMAT_FP32: return "fp32";
    default: return own;
  }
}

}  // namespace bitpush::compressors
