// The spec side of the `size` parameter that topk and randomk share (ratio=R | k=K, exactly
// one): parsing, range checks and canonical printing, for their MethodSpecs
// (compressors/method.h). Kernel-free: part of bitpush_compressor_specs.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "compressors/method.h"
#include "compressors/spec_params.h"

namespace bitpush::compressors {

// The two ParamDocs of the size parameter, first in topk's and randomk's parameter lists.
inline constexpr ParamDoc kSparseRatioParam{
    "ratio", "0 < R <= 1", "", "0.001",
    "keep k = max(1, floor(R * n)) elements (give ratio or k, not both)"};
inline constexpr ParamDoc kSparseKParam{"k", "integer K >= 1", "", "1000",
                                        "keep k = min(K, n) elements (give ratio or k, not both)"};

// Sets `param`, "ratio" or "k", on `size` (v1::TopkParams or v1::RandomkParams).
template <typename Params>
Status SetSparseSizeParam(const MethodSpec& method, std::string_view param, std::string_view value,
                          Params* size) {
  if ((param == "k" && size->size_case() == Params::kRatio) ||
      (param == "ratio" && size->size_case() == Params::kK)) {
    return InvalidArgumentError(std::string(method.name) + ": give ratio or k, not both");
  }
  if (param == "ratio") {
    BP_ASSIGN_OR_RETURN(double d, ParseDoubleParam(method, param, value));
    size->set_ratio(d);
  } else {
    BP_ASSIGN_OR_RETURN(uint64_t k, ParseUintParam(method, param, value));
    size->set_k(k);
  }
  return Status::Ok();
}

// The size must be set and in range.
template <typename Params>
Status CheckSparseSize(const MethodSpec& method, const Params& p) {
  switch (p.size_case()) {
    case Params::kRatio:
      if (!(p.ratio() > 0.0 && p.ratio() <= 1.0)) {
        return InvalidArgumentError(std::string(method.name) +
                                    ": ratio=" + std::to_string(p.ratio()) +
                                    " is out of range; valid: 0 < ratio <= 1");
      }
      return Status::Ok();
    case Params::kK:
      if (p.k() < 1) {
        return InvalidArgumentError(std::string(method.name) +
                                    ": k=0 is out of range; valid: k >= 1");
      }
      return Status::Ok();
    default:
      return InvalidArgumentError(std::string(method.name) +
                                  ": needs the number of kept elements: ratio=R (0 < R <= 1) "
                                  "or k=K (K >= 1)");
  }
}

// ":ratio=R" or ":k=K".
template <typename Params>
void AppendSparseSize(const Params& p, std::string* spec) {
  *spec += p.has_ratio() ? ":ratio=" + FormatSpecDouble(p.ratio()) : ":k=" + std::to_string(p.k());
}

}  // namespace bitpush::compressors
