// Which rounds a timeline traces (trace.steps; docs/observability.md): `all`, `A-B` (rounds A
// to B, inclusive) or `every N` (rounds divisible by N). A round of a tensor is one step.
//
// Thread-safety: immutable after Parse; Wants is a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace bitpush::trace {

class StepFilter {
 public:
  StepFilter() = default;  // all
  // InvalidArgument naming the text and the forms when it is none of them.
  static StatusOr<StepFilter> Parse(std::string_view text);

  bool Wants(uint64_t round) const {
    switch (kind_) {
      case Kind::kAll: return true;
      case Kind::kRange: return round >= first_ && round <= last_;
      case Kind::kEvery: return round % every_ == 0;
    }
    return true;
  }
  // The canonical text ("all", "3-9", "every 100").
  std::string ToString() const;

 private:
  enum class Kind { kAll, kRange, kEvery };
  Kind kind_ = Kind::kAll;
  uint64_t first_ = 0, last_ = 0, every_ = 1;
};

}  // namespace bitpush::trace
