#include "common/trace/step_filter.h"

#include <charconv>

#include "fmt/format.h"

namespace bitpush::trace {

namespace {

bool ParseU64(std::string_view s, uint64_t* out) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

StatusOr<StepFilter> StepFilter::Parse(std::string_view text) {
  StepFilter f;
  const auto bad = [&](const char* why) {
    return InvalidArgumentError(fmt::format(
        "trace.steps '{}': {}; expected 'all', 'A-B' (rounds A to B) or 'every N'", text, why));
  };
  if (text == "all" || text.empty()) return f;
  if (text.substr(0, 6) == "every ") {
    if (!ParseU64(text.substr(6), &f.every_) || f.every_ == 0) return bad("N must be at least 1");
    f.kind_ = Kind::kEvery;
    return f;
  }
  const size_t dash = text.find('-');
  if (dash == std::string_view::npos) return bad("not one of the forms");
  if (!ParseU64(text.substr(0, dash), &f.first_) || !ParseU64(text.substr(dash + 1), &f.last_)) {
    return bad("A and B must be round numbers");
  }
  if (f.last_ < f.first_) return bad("B is before A");
  f.kind_ = Kind::kRange;
  return f;
}

std::string StepFilter::ToString() const {
  switch (kind_) {
    case Kind::kAll: return "all";
    case Kind::kRange: return fmt::format("{}-{}", first_, last_);
    case Kind::kEvery: return fmt::format("every {}", every_);
  }
  return "all";
}

}  // namespace bitpush::trace
