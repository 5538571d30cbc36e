#include "common/config/flags.h"

#include <algorithm>
#include <charconv>

#include "fmt/format.h"

namespace bitpush::config {

namespace {

constexpr size_t kUsageColumns = 100;

const FlagSpec* Find(const std::vector<FlagSpec>& specs, std::string_view name) {
  for (const FlagSpec& s : specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string Synopsis(const FlagSpec& s) {
  std::string word = s.value_name.empty() ? s.name : s.name + " " + s.value_name;
  if (!s.required) word = "[" + word + "]";
  if (s.kind == FlagKind::kRepeated) word += "...";
  return word;
}

}  // namespace

bool ParsedFlags::has(std::string_view name) const {
  return std::any_of(given_.begin(), given_.end(), [&](const auto& g) { return g.first == name; });
}

std::string ParsedFlags::text(std::string_view name) const {
  std::string out;
  for (const auto& [flag, value] : given_) {
    if (flag == name) out = value;
  }
  return out;
}

std::vector<std::string> ParsedFlags::all(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [flag, value] : given_) {
    if (flag == name) out.push_back(value);
  }
  return out;
}

uint64_t ParsedFlags::count(std::string_view name, uint64_t fallback) const {
  for (auto it = counts_.rbegin(); it != counts_.rend(); ++it) {
    if (it->first == name) return it->second;
  }
  return fallback;
}

std::optional<KnobValue> ParsedFlags::knob(std::string_view name) const {
  for (auto it = knobs_.rbegin(); it != knobs_.rend(); ++it) {
    if (it->first == name) return it->second;
  }
  return std::nullopt;
}

StatusOr<ParsedFlags> ParseFlags(const std::vector<FlagSpec>& specs,
                                 const std::vector<std::string>& args) {
  ParsedFlags out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      out.help_ = true;
      return out;
    }
    const FlagSpec* spec = Find(specs, arg);
    if (spec == nullptr) return InvalidArgumentError(fmt::format("unknown argument '{}'", arg));
    if (spec->kind == FlagKind::kSwitch) {
      out.given_.emplace_back(arg, "");
      continue;
    }
    if (i + 1 >= args.size()) return InvalidArgumentError(arg + " needs a value");
    const std::string& value = args[++i];
    if (spec->kind == FlagKind::kCount) {
      uint64_t n = 0;
      const char* end = value.data() + value.size();
      auto [p, ec] = std::from_chars(value.data(), end, n);
      if (value.empty() || ec != std::errc() || p != end) {
        return InvalidArgumentError(
            fmt::format("{} needs a non-negative integer, got '{}'", arg, value));
      }
      out.counts_.emplace_back(arg, n);
    } else if (spec->kind == FlagKind::kKnob) {
      if (spec->knob == nullptr) return InternalError(arg + " is a knob flag without a knob");
      StatusOr<KnobValue> v = ParseKnobValue(*spec->knob, value);
      if (!v.ok()) return v.status().WithContext(arg);
      out.knobs_.emplace_back(arg, *v);
    }
    out.given_.emplace_back(arg, value);
  }
  std::vector<std::string> missing;
  for (const FlagSpec& s : specs) {
    if (s.required && !out.has(s.name)) missing.push_back(s.name);
  }
  if (!missing.empty()) {
    return InvalidArgumentError(JoinAnd(missing) +
                                (missing.size() == 1 ? " is required" : " are required"));
  }
  return out;
}

std::string UsageText(std::string_view program, const std::vector<FlagSpec>& specs,
                      std::string_view summary, std::string_view footer) {
  std::string out = "usage: " + std::string(program);
  const std::string indent(out.size(), ' ');
  size_t line_start = 0;
  for (const FlagSpec& s : specs) {
    const std::string word = Synopsis(s);
    if (out.size() - line_start + 1 + word.size() > kUsageColumns) {
      out += "\n";
      line_start = out.size();
      out += indent;
    }
    out += " " + word;
  }
  out += "\n";
  if (!summary.empty()) out += std::string(summary) + "\n";
  size_t width = 0;
  for (const FlagSpec& s : specs) {
    width = std::max(width, s.name.size() + 1 + s.value_name.size());
  }
  for (const FlagSpec& s : specs) {
    const std::string left = s.value_name.empty() ? s.name : s.name + " " + s.value_name;
    out += fmt::format("  {:<{}}  {}\n", left, width, s.help);
  }
  if (!footer.empty()) out += std::string(footer) + "\n";
  return out;
}

}  // namespace bitpush::config
