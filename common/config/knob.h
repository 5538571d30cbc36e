// Knobs: the typed, self-describing settings of a configuration file.
//
// A KnobSpec declares one setting once: its path in the file (`section.key`), its type with
// bounds and unit, its default, the command-line flag and the environment variable that
// override it (if any) and one line of documentation. From that one declaration come the
// parser of the knob's text (errors name the key), its canonical text, its row in the
// reference table of the docs and its command-line flag. Nothing here knows YAML or a
// particular configuration struct: a configuration's table binds each spec to a field
// (config/cluster_knobs.h for the cluster YAML).
//
// Values are held as KnobValue: a number (integers, bytes, milliseconds, seconds as
// milliseconds, `auto` counts with 0 for auto, booleans as 0/1) or a text (enums, strings,
// paths, custom values in canonical form).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace bitpush::config {

enum class KnobType {
  kInteger,     // a non-negative integer in [min, max]; `noun` names what it counts
  kBytes,       // a non-negative integer number of bytes in [min, max]
  kMillis,      // a non-negative integer number of milliseconds in [min, max]
  kSeconds,     // a decimal number of seconds in (0, max], held in milliseconds (at least 1)
  kAutoCount,   // `auto` (held as 0) or an integer in [1, max]
  kEnum,        // one of `values`; `noun` names what a value is ("transport")
  kString,      // text of at least `min` bytes
  kPath,        // a file system path: text of at least `min` bytes
  kBool,        // true | false
  kCustom,      // text put in canonical form by `canonicalize` (a compressor spec, ...)
  kStructured,  // a list or mapping the configuration's own code parses (declared for the
                // docs, the lists of valid keys and the effective config)
};

// A whole decimal unsigned integer ("0", "65535"; no sign, spaces or suffix) into *out:
// false for anything else, an overflow included.
bool ParseUint(std::string_view text, uint64_t* out);

// The value of one knob. Compare with ==.
struct KnobValue {
  uint64_t number = 0;  // numeric types (see the file comment)
  std::string text;     // text types

  static KnobValue Number(uint64_t n) { return KnobValue{n, {}}; }
  static KnobValue Text(std::string t) { return KnobValue{0, std::move(t)}; }
  bool operator==(const KnobValue& o) const { return number == o.number && text == o.text; }
  bool operator!=(const KnobValue& o) const { return !(*this == o); }
};

// The command-line flag of a knob (in one program).
struct KnobFlag {
  std::string name;        // "--reduce-threads"; empty = no flag
  std::string value_name;  // "T", shown in the usage text
  std::string program;     // the program that takes it ("bitpush-worker")
  // true: the flag overrides the knob for this process, like `--set PATH=VALUE`; false: the
  // program reads the checked value itself (the knob's doc says what it does with it).
  bool sets_knob = true;
};

// Canonicalises a kCustom knob's text: the canonical text, or InvalidArgument whose message
// is the problem (without the key).
using Canonicalizer = StatusOr<std::string> (*)(std::string_view text);

struct KnobSpec {
  std::string path;  // "worker.op_timeout_s": the section, a dot, the key
  KnobType type = KnobType::kStructured;
  // Canonical text of the default (what an absent key means). For optional knobs, the unset
  // value; for required ones, unused.
  std::string default_text;
  // kInteger / kBytes / kMillis: the bounds; kSeconds: max seconds; kAutoCount: max count;
  // kString / kPath: min length in bytes.
  uint64_t min = 0;
  uint64_t max = std::numeric_limits<uint64_t>::max();
  std::string noun;                 // see KnobType
  std::vector<std::string> values;  // kEnum, in the order the docs list them
  Canonicalizer canonicalize = nullptr;
  // kCustom / kStructured: the type column of the docs ("compressor spec").
  std::string type_doc;
  // Optional knobs: the zero value (0 or "") means "not set"; it is never written in a file,
  // skips the checks, and reads as `unset_label` (the docs' default column unless
  // `default_doc` is given, and the effective config).
  bool optional = false;
  std::string unset_label;
  std::string default_doc;  // the docs' default column, when it is not the default text
  bool required = false;    // the file must give it (kStructured only)
  bool secret = false;      // never printed: the effective config says <set> / <none>
  bool agreed = false;      // part of config agreement (docs only; the agreement list is code)
  KnobFlag flag;
  std::string env;  // an environment variable that overrides it; "" = none
  std::string doc;  // one line: what it does (bounds and type come from the fields above)
  // kStructured knobs that are lists of mappings: the keys of one entry, declared like knobs
  // (path = the entry key alone) for the docs and the lists of valid keys.
  std::vector<KnobSpec> entry_keys;

  // "worker" and "op_timeout_s" of "worker.op_timeout_s".
  std::string section() const;
  std::string key() const;
  bool structured() const { return type == KnobType::kStructured; }
  // True for the value that means "not set" (optional knobs only).
  bool IsUnset(const KnobValue& v) const { return optional && v.number == 0 && v.text.empty(); }

  // Declaration helpers, so a table reads as one line per property. Each returns *this.
  KnobSpec& Integer(uint64_t lo, uint64_t hi, std::string what);
  KnobSpec& Bytes(uint64_t lo, uint64_t hi = std::numeric_limits<uint64_t>::max());
  KnobSpec& Millis(uint64_t lo, uint64_t hi);
  KnobSpec& Seconds(uint64_t max_seconds);
  KnobSpec& AutoCount(uint64_t hi);
  KnobSpec& Enum(std::vector<std::string> allowed, std::string what = "value");
  KnobSpec& String(uint64_t min_bytes = 0);
  KnobSpec& Path(uint64_t min_bytes = 0);
  KnobSpec& Bool();
  KnobSpec& Custom(Canonicalizer fn, std::string type_text);
  KnobSpec& Structured(std::string type_text);
  KnobSpec& Default(std::string text);
  KnobSpec& Optional(std::string label, std::string docs_default = "");
  KnobSpec& Required();
  KnobSpec& Secret();
  KnobSpec& Agreed();
  KnobSpec& Flag(std::string name, std::string value_name, std::string program,
                 bool sets_knob = true);
  KnobSpec& Env(std::string name);
  KnobSpec& Doc(std::string line);
  KnobSpec& EntryKeys(std::vector<KnobSpec> keys);
};

// A knob named `path` (built with the helpers above).
KnobSpec Knob(std::string path);

// Parses `text` as the knob's value. InvalidArgument whose message is the problem alone
// ("must be 1..60000 (milliseconds), got 0"): the caller names the key and where it was
// written. kStructured knobs cannot be parsed from one text (InvalidArgument).
StatusOr<KnobValue> ParseKnobValue(const KnobSpec& spec, std::string_view text);

// The same, with the message naming the key: "worker.op_timeout_s: expected ...".
StatusOr<KnobValue> ParseKnob(const KnobSpec& spec, std::string_view text);

// The canonical text of a value: what ParseKnobValue accepts and gives back unchanged
// ("300", "2.5", "auto", "onebit:scaled=true").
std::string FormatKnobValue(const KnobSpec& spec, const KnobValue& value);

// The problem with a value set in code ("" when it is fine): the message the parser gives for
// its canonical text, or "'X' is not canonical ('Y')" when parsing changes it. Unset optional
// values are fine.
std::string CheckKnobValue(const KnobSpec& spec, const KnobValue& value);

// The value shown in an effective-config listing: <set>/<none> for secrets, the unset label,
// else the canonical text.
std::string DescribeKnobValue(const KnobSpec& spec, const KnobValue& value);

// The docs' type column ("integer, ms, 1..60000", "`auto` \| 1..256") and the full row
// "| `key` | type | default | doc |" of a reference table (markdown: `doc` is written with
// `|` escaped). A flag that sets the knob is named after the doc line; flags the program reads
// itself and environment variables are for the doc line to explain.
std::string KnobTypeDoc(const KnobSpec& spec);
std::string KnobDocRow(const KnobSpec& spec);
// The header of such a table (two lines, no trailing newline).
std::string KnobDocHeader(std::string_view first_column = "key");

// "a, b and c" (Oxford-less English list), for messages.
std::string JoinAnd(const std::vector<std::string>& items);

}  // namespace bitpush::config
