#include "bench/bench_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

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
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

void JsonRecord::Key(const std::string& key) {
  if (!body_.empty()) body_ += ", ";
  body_ += "\"" + Escape(key) + "\": ";
}

std::string JsonQuote(const std::string& s) {
  return "\"" + Escape(s) + "\"";
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

JsonRecord& JsonRecord::AddBool(const std::string& key, bool value) {
  Key(key);
  body_ += value ? "true" : "false";
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

namespace {

// Reads a JSON string starting at text[*pos] == '"'; advances past the closing quote.
std::string ReadJsonString(const std::string& text, size_t* pos) {
  std::string out;
  size_t i = *pos + 1;
  for (; i < text.size() && text[i] != '"'; ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      ++i;
      switch (text[i]) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        default: out += text[i]; break;  // \" \\ \/ (\uXXXX: not produced by our writers)
      }
    } else {
      out += text[i];
    }
  }
  *pos = i + 1;
  return out;
}

}  // namespace

std::map<std::string, std::string> ReadFlatJson(const std::string& text) {
  std::map<std::string, std::string> out;
  int array_depth = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '[') {
      ++array_depth;
      ++i;
    } else if (c == ']') {
      --array_depth;
      ++i;
    } else if (c == '"') {
      std::string key = ReadJsonString(text, &i);
      size_t j = i;
      while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
      if (array_depth > 0 || j >= text.size() || text[j] != ':') continue;  // a value, not a key
      ++j;
      while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
      if (j < text.size() && text[j] == '"') {
        out[key] = ReadJsonString(text, &j);
      } else if (j < text.size() && text[j] != '{' && text[j] != '[') {
        const size_t end = text.find_first_of(",}]\n", j);
        std::string value = text.substr(j, end == std::string::npos ? std::string::npos : end - j);
        while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) {
          value.pop_back();
        }
        out[key] = value;
        j = end == std::string::npos ? text.size() : end;
      }
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

double JsonNumber(const std::map<std::string, std::string>& m, const std::string& key,
                  double fallback) {
  auto it = m.find(key);
  if (it == m.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  return end != it->second.c_str() && *end == '\0' ? v : fallback;
}

std::vector<std::string> SplitSpecList(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = list.find(',', pos);
    const std::string piece = list.substr(pos, comma == std::string::npos ? comma : comma - pos);
    if (!out.empty() && piece.find('=') != std::string::npos &&
        piece.find(':') == std::string::npos) {
      out.back() += "," + piece;
    } else if (!piece.empty()) {
      out.push_back(piece);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

void UsageError(const char* subcommand, const std::string& msg) {
  std::fprintf(stderr, "bitpush-bench %s: %s\n", subcommand, msg.c_str());
  std::exit(2);
}

bool ArgCursor::Next() {
  if (++i_ >= argc_) return false;
  flag_ = argv_[i_];
  return true;
}

std::string ArgCursor::Value() {
  if (i_ + 1 >= argc_) UsageError(subcommand_, flag_ + " needs a value");
  return argv_[++i_];
}

void ArgCursor::Help(void (*print_help)()) const {
  print_help();
  std::exit(0);
}

void ArgCursor::Unknown(void (*print_help)()) const {
  print_help();
  UsageError(subcommand_, "unknown option '" + flag_ + "'");
}

size_t ParsePositive(const char* subcommand, const std::string& flag, const std::string& text,
                     size_t max) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v <= 0 || static_cast<unsigned long long>(v) > max) {
    UsageError(subcommand,
               flag + " needs an integer in 1.." + std::to_string(max) + ", got '" + text + "'");
  }
  return static_cast<size_t>(v);
}

double ParseSeconds(const char* subcommand, const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0) || v > 86400) {
    UsageError(subcommand, flag + " needs a number of seconds in (0, 86400], got '" + text + "'");
  }
  return v;
}

}  // namespace bitpush::bench
