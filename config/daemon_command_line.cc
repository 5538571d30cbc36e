#include "config/daemon_command_line.h"

#include <cstdio>

#include "common/logging.h"
#include "config/cluster_knobs.h"
#include "fmt/format.h"

namespace bitpush::config {

namespace {

constexpr char kSet[] = "--set";
constexpr char kLogLevel[] = "--log-level";
constexpr char kDefaultLogLevel[] = "info";

}  // namespace

DaemonCommandLine::DaemonCommandLine(DaemonCommandLineSpec spec) : spec_(std::move(spec)) {
  all_.push_back({"--config", "CLUSTER.yaml", "the cluster YAML (docs/config.md)",
                  config::FlagKind::kText, /*required=*/true});
  all_.insert(all_.end(), spec_.flags.begin(), spec_.flags.end());
  for (const ClusterKnob& k : ClusterKnobs()) {
    const config::KnobFlag& f = k.spec.flag;
    if (f.name.empty() || f.program != spec_.program) continue;
    const std::string help =
        f.sets_knob ? fmt::format("sets {} (docs/config.md)", k.spec.path)
                    : fmt::format("this daemon's own {} (docs/config.md)", k.spec.path);
    all_.push_back({f.name, f.value_name, help, config::FlagKind::kKnob, false, &k.spec});
  }
  all_.push_back({kSet, "KEY=VALUE",
                  "sets a knob of the YAML, e.g. --set worker.op_timeout_s=30 (docs/config.md)",
                  config::FlagKind::kRepeated});
  all_.push_back({kLogLevel, "LEVEL",
                  fmt::format("trace, debug, info, warn or error (default {})", kDefaultLogLevel)});
}

DaemonCommandLine::Outcome DaemonCommandLine::Parse(const std::vector<std::string>& args) {
  StatusOr<config::ParsedFlags> parsed = config::ParseFlags(all_, args);
  if (!parsed.ok()) {
    error_ = parsed.status().message();
    return Outcome::kUsageError;
  }
  flags_ = *std::move(parsed);
  if (flags_.help()) return Outcome::kHelp;

  config_path_ = flags_.text("--config");
  StatusOr<ClusterConfig> loaded = LoadClusterConfig(config_path_);
  if (!loaded.ok()) {
    error_ = loaded.status().message();
    return Outcome::kConfigError;
  }
  config_ = *std::move(loaded);

  // Overrides in command-line order: the last one of a knob wins.
  bool overridden = false;
  for (const auto& [flag, value] : flags_.given()) {
    if (flag == kSet) {
      const size_t eq = value.find('=');
      if (eq == std::string::npos || eq == 0) {
        error_ =
            fmt::format("--set needs KEY=VALUE (e.g. worker.op_timeout_s=30), got '{}'", value);
        return Outcome::kUsageError;
      }
      if (Status s = SetClusterKnob(&config_, value.substr(0, eq), value.substr(eq + 1)); !s.ok()) {
        error_ = s.WithContext(kSet).message();
        return Outcome::kUsageError;
      }
      overridden = true;
      continue;
    }
    for (const config::FlagSpec& f : all_) {
      if (f.name != flag || f.kind != config::FlagKind::kKnob || !f.knob->flag.sets_knob) continue;
      const ClusterKnob* k = FindClusterKnob(f.knob->path);
      k->set(&config_, *config::ParseKnobValue(k->spec, value));  // checked by ParseFlags
      overridden = true;
    }
  }
  if (overridden) {
    if (Status s = ValidateClusterConfig(config_); !s.ok()) {
      error_ = s.message() + " (after the command-line overrides)";
      return Outcome::kConfigError;
    }
  }
  return Outcome::kRun;
}

int DaemonCommandLine::ParseOrExit(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  switch (Parse(args)) {
    case Outcome::kHelp: std::fputs(Usage().c_str(), stdout); return 0;
    case Outcome::kUsageError: return UsageError(error_);
    case Outcome::kConfigError: return ConfigError(error_);
    case Outcome::kRun: break;
  }
  const std::string level = flags_.has(kLogLevel) ? flags_.text(kLogLevel) : kDefaultLogLevel;
  if (!SetLogLevel(level)) return UsageError("unknown log level '" + level + "'");
  return -1;
}

int DaemonCommandLine::ConfigError(const std::string& problem) const {
  std::fprintf(stderr, "%s: config error: %s\n", spec_.program.c_str(), problem.c_str());
  return 2;
}

int DaemonCommandLine::UsageError(const std::string& problem) const {
  std::fprintf(stderr, "%s: %s\n%s", spec_.program.c_str(), problem.c_str(), Usage().c_str());
  return 2;
}

std::string DaemonCommandLine::Usage() const {
  return config::UsageText(spec_.program, all_, spec_.summary, spec_.footer);
}

std::optional<config::KnobValue> DaemonCommandLine::knob_flag(std::string_view path) const {
  for (const config::FlagSpec& f : all_) {
    if (f.kind == config::FlagKind::kKnob && f.knob->path == path) return flags_.knob(f.name);
  }
  return std::nullopt;
}

}  // namespace bitpush::config
