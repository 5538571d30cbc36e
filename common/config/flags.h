// Command lines of the bitpush programs: each flag declared once (name, value, one line of
// help), parsed with the same messages in every program, and the usage text generated from
// the same declarations. A flag may take its value as a knob (common/config/knob.h): the
// value is then checked by the knob's type, with the knob's messages.
//
// Parsing rules: flags are separate words (`--rank 3`); `--help`/`-h` asks for the usage;
// an unknown word is "unknown argument 'X'"; a flag without its value is "X needs a value";
// missing required flags are named together ("--config and --rank are required").
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/config/knob.h"
#include "common/status.h"

namespace bitpush::config {

enum class FlagKind {
  kSwitch,    // no value (`--no-sweep`)
  kText,      // one value; the last one given counts
  kCount,     // a non-negative integer
  kRepeated,  // a value each time it is given (`--set A=1 --set B=2`), kept in order
  kKnob,      // a value checked as `knob`'s type
};

struct FlagSpec {
  std::string name;        // "--rank"
  std::string value_name;  // "N" in the usage text; empty for switches
  std::string help;        // one line for the usage text
  FlagKind kind = FlagKind::kText;
  bool required = false;
  const KnobSpec* knob = nullptr;  // kKnob: must outlive the parse
};

// The words of a command line, checked against the specs.
class ParsedFlags {
 public:
  // `--help` or `-h` was given (nothing else is checked then).
  bool help() const { return help_; }
  bool has(std::string_view name) const;
  // The (last) value of a text flag; "" when absent.
  std::string text(std::string_view name) const;
  // Every value of a repeated flag, in order.
  std::vector<std::string> all(std::string_view name) const;
  // A count flag's value, or `fallback` when absent.
  uint64_t count(std::string_view name, uint64_t fallback) const;
  // A knob flag's value, if given.
  std::optional<KnobValue> knob(std::string_view name) const;
  // Every (flag, raw value) in command-line order; switches have "".
  const std::vector<std::pair<std::string, std::string>>& given() const { return given_; }

 private:
  friend StatusOr<ParsedFlags> ParseFlags(const std::vector<FlagSpec>& specs,
                                          const std::vector<std::string>& args);
  bool help_ = false;
  std::vector<std::pair<std::string, std::string>> given_;
  std::vector<std::pair<std::string, uint64_t>> counts_;
  std::vector<std::pair<std::string, KnobValue>> knobs_;
};

// Parses `args` (argv without the program name). InvalidArgument with the message a usage
// error prints ("unknown argument '--x'", "--rank needs a non-negative integer, got 'x'",
// "--local-size: expected 1..1024 training processes, got 0", "--config is required").
StatusOr<ParsedFlags> ParseFlags(const std::vector<FlagSpec>& specs,
                                 const std::vector<std::string>& args);

// "usage: PROGRAM --config CLUSTER.yaml --rank N [--socket PATH] ...", wrapped at 100
// columns (continuation lines aligned after the program name), then `summary`, one line per
// flag with its help, and `footer`. Ends with a newline.
std::string UsageText(std::string_view program, const std::vector<FlagSpec>& specs,
                      std::string_view summary, std::string_view footer);

}  // namespace bitpush::config
