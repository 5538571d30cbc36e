#include "bench/bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace bitpush::bench {

Timing TimeIt(const std::function<void()>& fn, double min_seconds, int min_reps) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up: page faults, caches, lazy scratch allocation
  std::vector<double> times;
  const auto start = Clock::now();
  while (static_cast<int>(times.size()) < min_reps ||
         std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
    const auto t0 = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  Timing t;
  t.best_seconds = times.front();
  t.median_seconds = times[times.size() / 2];
  t.reps = static_cast<int>(times.size());
  return t;
}

namespace {
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
}  // namespace

void JsonRecord::Key(const std::string& key) {
  if (!body_.empty()) body_ += ", ";
  body_ += "\"" + Escape(key) + "\": ";
}

JsonRecord& JsonRecord::Add(const std::string& key, const std::string& value) {
  Key(key);
  body_ += "\"" + Escape(value) + "\"";
  return *this;
}

JsonRecord& JsonRecord::Add(const std::string& key, double value) {
  Key(key);
  if (!std::isfinite(value)) {
    body_ += "null";
  } else {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", value);
    body_ += buf;
  }
  return *this;
}

JsonRecord& JsonRecord::Add(const std::string& key, long long value) {
  Key(key);
  body_ += std::to_string(value);
  return *this;
}

std::string JsonArray(const std::vector<JsonRecord>& records) {
  std::string out = "[\n";
  for (size_t i = 0; i < records.size(); ++i) {
    out += "  " + records[i].str();
    out += i + 1 < records.size() ? ",\n" : "\n";
  }
  out += "]\n";
  return out;
}

}  // namespace bitpush::bench
