// Small timing and output helpers shared by bitpush-bench subcommands.
//
// Timing policy: every measurement runs the operation repeatedly for at least `min_seconds`
// (and at least `min_reps` times) and reports the fastest repetition. The machine is shared
// and noisy; the fastest run is the most repeatable statistic, and every figure that matters is
// a ratio against memcpy measured the same way in the same run.
//
// Thread-safety: single-threaded helpers.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace bitpush::bench {

struct Timing {
  double best_seconds = 0;
  double median_seconds = 0;
  int reps = 0;
};

// Runs fn once to warm up, then repeatedly; returns best and median per-call seconds.
Timing TimeIt(const std::function<void()>& fn, double min_seconds, int min_reps);

// `s` as a JSON string literal, quotes included (control characters escaped).
std::string JsonQuote(const std::string& s);

// Minimal JSON value writer for flat records.
class JsonRecord {
 public:
  JsonRecord& Add(const std::string& key, const std::string& value);
  JsonRecord& Add(const std::string& key, const char* value) {
    return Add(key, std::string(value));
  }
  JsonRecord& Add(const std::string& key, double value);
  JsonRecord& Add(const std::string& key, long long value);
  JsonRecord& Add(const std::string& key, size_t value) {
    return Add(key, static_cast<long long>(value));
  }
  JsonRecord& Add(const std::string& key, int value) {
    return Add(key, static_cast<long long>(value));
  }
  // true / false (a named method: a bool would otherwise convert to a number).
  JsonRecord& AddBool(const std::string& key, bool value);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void Key(const std::string& key);
  std::string body_;
};

std::string JsonArray(const std::vector<JsonRecord>& records);

// Reads the "key": value pairs of a JSON object written by JsonRecord (or any JSON object whose
// values of interest are numbers and strings): string values unescaped, numbers, true/false
// and null as their text. Nested objects are flattened (their keys are read too, the last one
// wins); arrays' elements are skipped. Lenient: meant for files our own programs wrote.
std::map<std::string, std::string> ReadFlatJson(const std::string& text);

// The number at `key` in a ReadFlatJson map; `fallback` if absent or not a number.
double JsonNumber(const std::map<std::string, std::string>& m, const std::string& key,
                  double fallback = 0);

// Command-line helpers of the subcommands: "bitpush-bench <subcommand>: <msg>" on stderr, exit 2;
// and an integer flag value in 1..max (otherwise that usage error, naming the flag).
[[noreturn]] void UsageError(const char* subcommand, const std::string& msg);
size_t ParsePositive(const char* subcommand, const std::string& flag, const std::string& text,
                     size_t max);
// A number of seconds > 0 (a decimal fraction: "0.2"), or the usage error naming the flag.
double ParseSeconds(const char* subcommand, const std::string& flag, const std::string& text);

// A comma-separated list of compressor specs, split where a new spec starts:
// "none,randomk:ratio=0.01,unbiased=false,onebit" -> none | randomk:ratio=0.01,unbiased=false |
// onebit (a piece with '=' but no ':' is a parameter of the spec before it). Empty pieces are
// dropped.
std::vector<std::string> SplitSpecList(const std::string& list);

// Walks a subcommand's arguments (argv[1..]) flag by flag:
//   for (ArgCursor args("localreduce", argc, argv); args.Next();) {
//     if (args.flag() == "--mb") mb = ParsePositive(..., args.Value(), ...); ...
// Value() takes the argument after the flag, or exits with the usage error "<flag> needs a
// value"; Help(print) prints the help and exits 0 for --help / -h; Unknown(print) prints it and
// exits with the usage error "unknown option '<flag>'".
class ArgCursor {
 public:
  ArgCursor(const char* subcommand, int argc, char** argv)
      : subcommand_(subcommand), argc_(argc), argv_(argv) {}
  bool Next();
  const std::string& flag() const { return flag_; }
  std::string Value();
  bool IsHelp() const { return flag_ == "--help" || flag_ == "-h"; }
  [[noreturn]] void Help(void (*print_help)()) const;
  [[noreturn]] void Unknown(void (*print_help)()) const;

 private:
  const char* subcommand_;
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string flag_;
};

}  // namespace bitpush::bench
