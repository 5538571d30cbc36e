#include "common/metrics/registry.h"

#include <cmath>

#include "common/logging.h"
#include "fmt/format.h"

namespace bitpush::metrics {

namespace {

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kSummary: return "summary";
  }
  return "untyped";
}

bool NameChar(char c, bool first, bool colon) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (alpha || (colon && c == ':')) return true;
  return !first && c >= '0' && c <= '9';
}

// HELP text escapes backslash and newline; label values also the double quote.
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

bool ValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0, /*colon=*/true)) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view name) {
  if (name.empty() || name.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0, /*colon=*/false)) return false;
  }
  return true;
}

std::string FormatValue(uint64_t value) {
  return std::to_string(value);
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

MetricSet::Family& MetricSet::FamilyFor(std::string_view name, std::string_view help,
                                        MetricType type) {
  if (auto it = index_.find(name); it != index_.end()) {
    Family& f = families_[it->second];
    BP_CHECK(f.type == type && f.help == help, "metric {} added as {} '{}' and as {} '{}'", name,
             TypeName(f.type), f.help, TypeName(type), help);
    return f;
  }
  BP_CHECK(ValidMetricName(name), "'{}' is not a valid metric name", name);
  index_.emplace(std::string(name), families_.size());
  families_.push_back(Family{std::string(name), std::string(help), type, {}});
  return families_.back();
}

void MetricSet::AddSample(std::string_view name, std::string_view help, MetricType type,
                          std::string_view suffix, const Labels& labels, const std::string& value) {
  Family& f = FamilyFor(name, help, type);
  std::string line = f.name;
  line += suffix;
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      BP_CHECK(ValidLabelName(labels[i].first), "metric {}: '{}' is not a valid label name", name,
               labels[i].first);
      if (i > 0) line += ',';
      line += labels[i].first;
      line += "=\"";
      line += Escape(labels[i].second, /*quote=*/true);
      line += '"';
    }
    line += '}';
  }
  line += ' ';
  line += value;
  f.lines.push_back(std::move(line));
}

void MetricSet::Counter(std::string_view name, std::string_view help, uint64_t value,
                        const Labels& labels) {
  AddSample(name, help, MetricType::kCounter, "", labels, FormatValue(value));
}

void MetricSet::Counter(std::string_view name, std::string_view help, double value,
                        const Labels& labels) {
  AddSample(name, help, MetricType::kCounter, "", labels, FormatValue(value));
}

void MetricSet::Gauge(std::string_view name, std::string_view help, uint64_t value,
                      const Labels& labels) {
  AddSample(name, help, MetricType::kGauge, "", labels, FormatValue(value));
}

void MetricSet::Gauge(std::string_view name, std::string_view help, double value,
                      const Labels& labels) {
  AddSample(name, help, MetricType::kGauge, "", labels, FormatValue(value));
}

void MetricSet::Summary(std::string_view name, std::string_view help, uint64_t count, double sum,
                        const Labels& labels) {
  AddSample(name, help, MetricType::kSummary, "_sum", labels, FormatValue(sum));
  AddSample(name, help, MetricType::kSummary, "_count", labels, FormatValue(count));
}

std::string MetricSet::Render() const {
  std::string out;
  for (const Family& f : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, Escape(f.help, /*quote=*/false),
                       f.name, TypeName(f.type));
    for (const std::string& line : f.lines) {
      out += line;
      out += '\n';
    }
  }
  return out;
}

Registry::Registration& Registry::Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    Reset();
    registry_ = std::exchange(o.registry_, nullptr);
    id_ = o.id_;
  }
  return *this;
}

void Registry::Registration::Reset() {
  if (registry_ != nullptr) std::exchange(registry_, nullptr)->Remove(id_);
}

Registry::Registration Registry::Add(Collector collector) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  collectors_.emplace(id, std::move(collector));
  return Registration(this, id);
}

void Registry::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.erase(id);
}

std::string Registry::Render() const {
  MetricSet set;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, collect] : collectors_) collect(set);
  return set.Render();
}

}  // namespace bitpush::metrics
