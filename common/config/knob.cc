#include "common/config/knob.h"

#include <charconv>
#include <cmath>
#include <locale>
#include <sstream>

#include "fmt/format.h"

namespace bitpush::config {

namespace {

constexpr uint64_t kNoMax = std::numeric_limits<uint64_t>::max();

bool ParseDouble(std::string_view text, double* out) {
  if (text.empty()) return false;
  std::istringstream in{std::string(text)};
  in.imbue(std::locale::classic());
  in >> *out;
  return !in.fail() && in.peek() == std::char_traits<char>::eof() && std::isfinite(*out);
}

std::string UnitOf(KnobType t) {
  switch (t) {
    case KnobType::kBytes: return "bytes";
    case KnobType::kMillis: return "milliseconds";
    default: return "";
  }
}

// The range problem of an integer knob ("" when `v` is inside).
std::string IntegerRangeProblem(const KnobSpec& s, uint64_t v) {
  if (v >= s.min && v <= s.max) return "";
  if (!s.noun.empty()) return fmt::format("expected {}..{} {}, got {}", s.min, s.max, s.noun, v);
  const std::string unit = UnitOf(s.type);
  const std::string paren = unit.empty() ? "" : " (" + unit + ")";
  if (s.max == kNoMax) {
    if (s.min == 1) return fmt::format("must be > 0{}", paren);
    return fmt::format("must be at least {}{}, got {}", s.min, paren, v);
  }
  return fmt::format("must be {}..{}{}, got {}", s.min, s.max, paren, v);
}

std::string FormatSeconds(uint64_t ms) {
  if (ms % 1000 == 0) return std::to_string(ms / 1000);
  std::string s = fmt::format("{}.{:03d}", ms / 1000, ms % 1000);
  while (s.back() == '0') s.pop_back();
  return s;
}

std::string Backticked(const std::string& s) {
  return "`" + s + "`";
}

}  // namespace

bool ParseUint(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  const char* begin = text.data();  // NOLINT(bugprone-suspicious-stringview-data-usage): bounded
  auto [p, ec] = std::from_chars(begin, begin + text.size(), *out);
  return ec == std::errc() && p == begin + text.size();
}

std::string KnobSpec::section() const {
  const size_t dot = path.find('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string KnobSpec::key() const {
  const size_t dot = path.find('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

KnobSpec Knob(std::string path) {
  KnobSpec s;
  s.path = std::move(path);
  return s;
}

KnobSpec& KnobSpec::Integer(uint64_t lo, uint64_t hi, std::string what) {
  type = KnobType::kInteger;
  min = lo;
  max = hi;
  noun = std::move(what);
  return *this;
}

KnobSpec& KnobSpec::Bytes(uint64_t lo, uint64_t hi) {
  type = KnobType::kBytes;
  min = lo;
  max = hi;
  return *this;
}

KnobSpec& KnobSpec::Millis(uint64_t lo, uint64_t hi) {
  type = KnobType::kMillis;
  min = lo;
  max = hi;
  return *this;
}

KnobSpec& KnobSpec::Seconds(uint64_t max_seconds) {
  type = KnobType::kSeconds;
  max = max_seconds;
  return *this;
}

KnobSpec& KnobSpec::AutoCount(uint64_t hi) {
  type = KnobType::kAutoCount;
  min = 1;
  max = hi;
  default_text = "auto";
  return *this;
}

KnobSpec& KnobSpec::Enum(std::vector<std::string> allowed, std::string what) {
  type = KnobType::kEnum;
  values = std::move(allowed);
  noun = std::move(what);
  return *this;
}

KnobSpec& KnobSpec::String(uint64_t min_bytes) {
  type = KnobType::kString;
  min = min_bytes;
  return *this;
}

KnobSpec& KnobSpec::Path(uint64_t min_bytes) {
  type = KnobType::kPath;
  min = min_bytes;
  return *this;
}

KnobSpec& KnobSpec::Bool() {
  type = KnobType::kBool;
  return *this;
}

KnobSpec& KnobSpec::Custom(Canonicalizer fn, std::string type_text) {
  type = KnobType::kCustom;
  canonicalize = fn;
  type_doc = std::move(type_text);
  return *this;
}

KnobSpec& KnobSpec::Structured(std::string type_text) {
  type = KnobType::kStructured;
  type_doc = std::move(type_text);
  return *this;
}

KnobSpec& KnobSpec::Default(std::string text) {
  default_text = std::move(text);
  return *this;
}

KnobSpec& KnobSpec::Optional(std::string label, std::string docs_default) {
  optional = true;
  unset_label = std::move(label);
  default_doc = std::move(docs_default);
  return *this;
}

KnobSpec& KnobSpec::Required() {
  required = true;
  return *this;
}

KnobSpec& KnobSpec::Secret() {
  secret = true;
  return *this;
}

KnobSpec& KnobSpec::Agreed() {
  agreed = true;
  return *this;
}

KnobSpec& KnobSpec::Flag(std::string name, std::string value_name, std::string program,
                         bool sets_knob) {
  flag = KnobFlag{std::move(name), std::move(value_name), std::move(program), sets_knob};
  return *this;
}

KnobSpec& KnobSpec::Env(std::string name) {
  env = std::move(name);
  return *this;
}

KnobSpec& KnobSpec::Doc(std::string line) {
  doc = std::move(line);
  return *this;
}

KnobSpec& KnobSpec::EntryKeys(std::vector<KnobSpec> keys) {
  entry_keys = std::move(keys);
  return *this;
}

StatusOr<KnobValue> ParseKnobValue(const KnobSpec& s, std::string_view text) {
  const std::string t(text);
  switch (s.type) {
    case KnobType::kInteger:
    case KnobType::kBytes:
    case KnobType::kMillis: {
      uint64_t v = 0;
      if (!ParseUint(text, &v)) {
        return InvalidArgumentError(fmt::format("expected a non-negative integer, got '{}'", t));
      }
      if (std::string p = IntegerRangeProblem(s, v); !p.empty()) return InvalidArgumentError(p);
      return KnobValue::Number(v);
    }
    case KnobType::kSeconds: {
      double seconds = 0;
      if (!ParseDouble(text, &seconds) || seconds <= 0 || seconds > static_cast<double>(s.max)) {
        return InvalidArgumentError(
            fmt::format("expected a number of seconds > 0 and <= {}, got '{}'", s.max, t));
      }
      return KnobValue::Number(
          static_cast<uint64_t>(std::max<int64_t>(1, std::llround(seconds * 1000))));
    }
    case KnobType::kAutoCount: {
      if (text == "auto") return KnobValue::Number(0);
      uint64_t v = 0;
      if (!ParseUint(text, &v) || v < 1 || v > s.max) {
        return InvalidArgumentError(
            fmt::format("expected 'auto' or an integer from 1 to {}, got '{}'", s.max, t));
      }
      return KnobValue::Number(v);
    }
    case KnobType::kEnum: {
      for (const std::string& v : s.values) {
        if (v == text) return KnobValue::Text(t);
      }
      std::string valid;
      for (const std::string& v : s.values) valid += (valid.empty() ? "" : ", ") + v;
      return InvalidArgumentError(
          fmt::format("unknown {} '{}'; valid: {}", s.noun.empty() ? "value" : s.noun, t, valid));
    }
    case KnobType::kString:
    case KnobType::kPath:
      if (text.size() < s.min) {
        if (s.min == 1) return InvalidArgumentError("is empty");
        return InvalidArgumentError(
            fmt::format("must be at least {} bytes long, got '{}'", s.min, t));
      }
      return KnobValue::Text(t);
    case KnobType::kBool:
      if (text == "true") return KnobValue::Number(1);
      if (text == "false") return KnobValue::Number(0);
      return InvalidArgumentError(fmt::format("expected true or false, got '{}'", t));
    case KnobType::kCustom: {
      if (s.canonicalize == nullptr) return InternalError(s.path + " has no canonicalizer");
      StatusOr<std::string> c = s.canonicalize(text);
      if (!c.ok()) return InvalidArgumentError(c.status().message());
      return KnobValue::Text(*c);
    }
    case KnobType::kStructured: break;
  }
  return InvalidArgumentError(fmt::format("is {}; it cannot be given as one value",
                                          s.type_doc.empty() ? "structured" : s.type_doc));
}

StatusOr<KnobValue> ParseKnob(const KnobSpec& spec, std::string_view text) {
  StatusOr<KnobValue> v = ParseKnobValue(spec, text);
  if (!v.ok()) return v.status().WithContext(spec.path);
  return v;
}

std::string FormatKnobValue(const KnobSpec& s, const KnobValue& v) {
  switch (s.type) {
    case KnobType::kInteger:
    case KnobType::kBytes:
    case KnobType::kMillis: return std::to_string(v.number);
    case KnobType::kSeconds: return FormatSeconds(v.number);
    case KnobType::kAutoCount: return v.number == 0 ? "auto" : std::to_string(v.number);
    case KnobType::kBool:
      return v.number == 0 ? "false" : v.number == 1 ? "true" : std::to_string(v.number);
    case KnobType::kEnum:
    case KnobType::kString:
    case KnobType::kPath:
    case KnobType::kCustom:
    case KnobType::kStructured: return v.text;
  }
  return v.text;
}

std::string CheckKnobValue(const KnobSpec& s, const KnobValue& v) {
  if (s.structured() || s.IsUnset(v)) return "";
  const std::string text = FormatKnobValue(s, v);
  StatusOr<KnobValue> parsed = ParseKnobValue(s, text);
  if (!parsed.ok()) return parsed.status().message();
  if (*parsed != v) {
    return fmt::format("'{}' is not canonical ('{}')", text, FormatKnobValue(s, *parsed));
  }
  return "";
}

std::string DescribeKnobValue(const KnobSpec& s, const KnobValue& v) {
  if (s.secret) return v.text.empty() && v.number == 0 ? "<none>" : "<set>";
  if (s.IsUnset(v)) return s.unset_label;
  return FormatKnobValue(s, v);
}

std::string KnobTypeDoc(const KnobSpec& s) {
  auto bounds = [&s](const std::string& unit) {
    if (s.min == 0 && s.max == kNoMax) return unit;
    const std::string sep = unit.empty() ? "" : ", ";
    if (s.max == kNoMax) {
      return unit + sep + (s.min == 1 ? "> 0" : fmt::format("≥ {}", s.min));
    }
    return unit + sep + fmt::format("{}..{}", s.min, s.max);
  };
  switch (s.type) {
    case KnobType::kInteger: return "integer, " + bounds("");
    case KnobType::kBytes: return "integer, " + bounds("bytes");
    case KnobType::kMillis: return "integer, " + bounds("ms");
    case KnobType::kSeconds: return fmt::format("number, s, > 0, ≤ {} (fractions allowed)", s.max);
    case KnobType::kAutoCount: return fmt::format("`auto` \\| 1..{}", s.max);
    case KnobType::kEnum: {
      std::string out;
      for (const std::string& v : s.values) out += (out.empty() ? "" : " \\| ") + Backticked(v);
      return out;
    }
    case KnobType::kString: return s.min == 1 ? "string, non-empty" : "string";
    case KnobType::kPath: return s.min == 1 ? "path, non-empty" : "path";
    case KnobType::kBool: return "`true` \\| `false`";
    case KnobType::kCustom:
    case KnobType::kStructured: return s.type_doc;
  }
  return s.type_doc;
}

std::string KnobDocRow(const KnobSpec& s) {
  std::string def;
  if (s.required) {
    def = "required";
  } else if (!s.default_doc.empty()) {
    def = s.default_doc;
  } else if (s.optional) {
    def = s.unset_label;
  } else {
    def = Backticked(s.default_text);
  }
  std::string doc = s.doc;
  if (!s.flag.name.empty() && s.flag.sets_knob) {
    doc += fmt::format(" `{} {} {}` sets it.", s.flag.program, s.flag.name, s.flag.value_name);
  }
  return fmt::format("| `{}` | {} | {} | {} |", s.key(), KnobTypeDoc(s), def, doc);
}

std::string KnobDocHeader(std::string_view first_column) {
  return fmt::format("| {} | type | default | meaning |\n|---|---|---|---|", first_column);
}

std::string JoinAnd(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? " and " : ", ";
    out += items[i];
  }
  return out;
}

}  // namespace bitpush::config
