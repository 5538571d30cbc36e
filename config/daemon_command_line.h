// The command line of a bitpush daemon (bitpush-scheduler, bitpush-server, bitpush-worker and
// the test node): `--config CLUSTER.yaml`, the program's own flags, the knob flags that the
// knob table (config/cluster_knobs.h) gives this program, `--set KEY=VALUE` (any scalar
// knob) and `--log-level`. The usage text comes from the same declarations; the YAML is
// loaded, the knob overrides applied in command-line order and the result validated
// (ValidateClusterConfig), so a daemon sees one checked ClusterConfig.
//
// Conventions every daemon shares: `--help` prints the usage on stdout (exit 0); a usage error
// prints "PROGRAM: problem" and the usage on stderr (exit 2); a config error prints
// "PROGRAM: config error: problem" (exit 2).
//
// Thread-safety: an object belongs to main(). Parse touches no process state; ParseOrExit also
// prints and sets the log level.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/flags.h"
#include "config/cluster_config.h"

namespace bitpush::config {

struct DaemonCommandLineSpec {
  std::string program;  // "bitpush-worker"; also selects the knob flags of the table
  std::string summary;  // the lines after the synopsis (no trailing newline)
  std::string footer;   // the lines after the flag list, e.g. "Exit status: ..."
  // The program's own flags, listed after --config (its knob flags, --set and --log-level
  // follow).
  std::vector<config::FlagSpec> flags;
};

class DaemonCommandLine {
 public:
  enum class Outcome { kRun, kHelp, kUsageError, kConfigError };

  explicit DaemonCommandLine(DaemonCommandLineSpec spec);

  // Parses `args` (argv without the program name), loads the YAML, applies the overrides and
  // validates. On kUsageError / kConfigError, error() says why.
  Outcome Parse(const std::vector<std::string>& args);

  // For main(): Parse, then print as the conventions above say and set the log level. Returns
  // -1 when the daemon should run, else its exit status (0 after --help, 2 after an error).
  int ParseOrExit(int argc, char** argv);

  // Prints "PROGRAM: problem" and the usage on stderr; returns 2 (for checks main() makes
  // after parsing, e.g. a rank beyond the YAML's list).
  int UsageError(const std::string& problem) const;
  // Prints "PROGRAM: config error: problem" on stderr; returns 2 (for config checks main()
  // makes once it knows its node, e.g. its CURVE key files).
  int ConfigError(const std::string& problem) const;

  std::string Usage() const;
  const std::string& error() const { return error_; }
  // Valid after Parse returned kRun.
  const ClusterConfig& config() const { return config_; }
  const std::string& config_path() const { return config_path_; }
  const config::ParsedFlags& flags() const { return flags_; }
  // The value of a knob flag the program reads itself (KnobFlag::sets_knob false), by the
  // knob's path ("worker.socket"), if it was given.
  std::optional<config::KnobValue> knob_flag(std::string_view path) const;

 private:
  DaemonCommandLineSpec spec_;
  std::vector<config::FlagSpec> all_;  // every flag, in usage order
  config::ParsedFlags flags_;
  std::string config_path_;
  ClusterConfig config_;
  std::string error_;
};

}  // namespace bitpush::config
