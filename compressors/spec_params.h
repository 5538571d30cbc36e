// Helpers for writing a method's spec half (compressors/method.h): parsing one parameter value
// of a spec string, the shared wording of bad-value messages, and the canonical printing of
// numbers. Every message names the method and the parameter.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "compressors/method.h"

namespace bitpush::compressors {

// "<method>: invalid value '<value>' for parameter '<param>'; expected <expected>".
Status BadParamValue(const MethodSpec& method, std::string_view param, std::string_view value,
                     std::string_view expected);

// true | 1 | yes | on, false | 0 | no | off.
StatusOr<bool> ParseBoolParam(const MethodSpec& method, std::string_view param,
                              std::string_view value);
// A finite number (strtod syntax).
StatusOr<double> ParseDoubleParam(const MethodSpec& method, std::string_view param,
                                  std::string_view value);
// A non-negative decimal integer that fits in 64 bits.
StatusOr<uint64_t> ParseUintParam(const MethodSpec& method, std::string_view param,
                                  std::string_view value);

// The `pull` parameter of methods whose servers reply either in the method's own format or in
// plain values (loco, sdp4bit): `value` is the method's name (PULL_FORMAT_METHOD), fp16,
// bf16 or fp32; anything else is BadParamValue.
Status ParsePullFormat(const MethodSpec& method, std::string_view param, std::string_view value,
                       v1::PullFormat* out);
// The spec value of `format`: `own` for PULL_FORMAT_METHOD, else fp16 / bf16 / fp32.
const char* PullFormatName(v1::PullFormat format, const char* own);

// The shortest "%.*g" form of d that reads back as exactly d (canonical spec strings).
std::string FormatSpecDouble(double d);

}  // namespace bitpush::compressors
