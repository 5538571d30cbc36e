// The knob table of the cluster YAML: every key of the `cluster:`, `compression:`, `server:`
// and `worker:` sections declared once (common/config/knob.h: type, bounds, flag, environment
// variable, doc line) and bound to its field of ClusterConfig (config/cluster_config.h),
// whose initial value is the knob's default.
//
// Everything that lists or checks knobs reads this table: the YAML parser (scalar keys are
// parsed by their type; the structured ones — addresses, host entries, overrides, the token
// file — by its own code, the table giving their valid keys), ValidateClusterConfig,
// DescribeClusterConfig, the daemons' command lines (config/daemon_command_line.h), the
// tables of docs/config.md (bitpush-config-docs) and Python (`bitpush._C.knobs()`).
//
// Adding a knob: its field in cluster_config.h, one entry in ClusterKnobs() (cluster_knobs.cc),
// `make config-docs`; the code that uses the value.
//
// Thread-safety: the table is immutable after its first use (a function-local constant);
// everything here may be called from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/config/doc_blocks.h"
#include "common/config/knob.h"
#include "config/cluster_config.h"

namespace bitpush::config {

struct ClusterKnob {
  config::KnobSpec spec;
  // The field behind a scalar knob (null for structured knobs, which have their own code).
  config::KnobValue (*get)(const ClusterConfig&) = nullptr;
  void (*set)(ClusterConfig*, const config::KnobValue&) = nullptr;
  // A check that involves other knobs (the problem, "" when fine), run by the parser when the
  // key is in the file and by ValidateClusterConfig always.
  std::string (*rule)(const ClusterConfig&) = nullptr;
};

// The sections of the YAML, in order: cluster, compression, server, worker.
const std::vector<std::string>& ClusterSections();

// Every knob, section by section in the order of ClusterSections(), within a section in the
// order of the docs and of DescribeClusterConfig.
const std::vector<ClusterKnob>& ClusterKnobs();

// The knob at `path` ("worker.op_timeout_s"), or null.
const ClusterKnob* FindClusterKnob(std::string_view path);

// The keys of `section`, sorted (for "valid keys of SECTION: ..." messages).
std::vector<std::string> SectionKeys(std::string_view section);

// The keys of one host entry of cluster.servers or cluster.workers ({host: gpu0, gpus: 8}).
std::vector<std::string> HostEntryKeys(bool servers);
// The spec of one of those keys ("count", "processes"), or null: the parser takes its bounds.
const config::KnobSpec* FindHostEntryKey(bool servers, std::string_view key);

// Sets a scalar knob of `config` from its text (a command-line override): InvalidArgument
// "PATH: problem" when the knob is unknown, structured, or the text is not a valid value.
// The config is not re-validated here (rules between knobs: ValidateClusterConfig).
Status SetClusterKnob(ClusterConfig* config, std::string_view path, std::string_view text);

// The blocks of docs/config.md generated from the table (common/config/doc_blocks.h, tag
// "knobs"): one reference table per section, the keys of a host entry, and the command-line
// flags and environment variables.
config::DocBlocks ClusterKnobDocBlocks();
inline constexpr char kKnobDocTag[] = "knobs";

}  // namespace bitpush::config
