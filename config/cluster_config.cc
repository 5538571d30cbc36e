#include "config/cluster_config.h"

#include <fnmatch.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <set>

#include "compressors/spec_registry.h"
#include "config/cluster_knobs.h"
#include "fmt/format.h"

namespace bitpush::config {

namespace {

void AppendHash(uint64_t* h, std::string_view bytes) {
  for (unsigned char ch : bytes) {
    *h ^= ch;
    *h *= 0x100000001B3ull;
  }
}

std::string Quote(const std::string& v) {
  return "'" + v + "'";
}

}  // namespace

std::string WorkerSettings::SocketFor(uint32_t rank) const {
  std::string out = socket;
  const std::string r = std::to_string(rank);
  for (size_t at = out.find("{rank}"); at != std::string::npos; at = out.find("{rank}", at)) {
    out.replace(at, 6, r);
    at += r.size();
  }
  return out;
}

uint32_t ClusterConfig::ProcessesOnNode(uint32_t rank) const {
  if (rank < worker_nodes.size() && worker_nodes[rank].processes != 0) {
    return worker_nodes[rank].processes;
  }
  return worker.local_size;
}

const std::vector<uint32_t>& ClusterConfig::GpusOnNode(uint32_t rank) const {
  static const std::vector<uint32_t> kNone;
  return rank < worker_nodes.size() ? worker_nodes[rank].gpus : kNone;
}

uint32_t ClusterConfig::MetricsPort(v1::Role role, uint32_t rank) const {
  if (metrics.port == 0) return 0;
  switch (role) {
    case v1::ROLE_SCHEDULER: return metrics.port;
    case v1::ROLE_SERVER: return metrics.port + 1 + rank;
    case v1::ROLE_WORKER: return metrics.port + 1 + static_cast<uint32_t>(servers.size()) + rank;
    default: return 0;
  }
}

uint64_t ClusterConfig::TotalProcesses() const {
  uint64_t total = 0;
  for (uint32_t r = 0; r < workers.size(); ++r) {
    const uint32_t p = ProcessesOnNode(r);
    if (p == 0) return 0;
    total += p;
  }
  return total;
}

bool ClusterConfig::ProcessCountsDiffer() const {
  if (TotalProcesses() == 0) return false;
  for (uint32_t r = 1; r < workers.size(); ++r) {
    if (ProcessesOnNode(r) != ProcessesOnNode(0)) return true;
  }
  return false;
}

std::string ClusterConfig::NodeAddress(v1::Role role, uint32_t rank) const {
  const std::vector<std::string>* list = role == v1::ROLE_SERVER   ? &servers
                                         : role == v1::ROLE_WORKER ? &workers
                                                                   : nullptr;
  if (list == nullptr || rank >= list->size()) return "";
  return (*list)[rank];
}

std::string ClusterConfig::DataAddress(v1::Role role, uint32_t rank) const {
  if (transport != "ucx" || role == v1::ROLE_SCHEDULER) return "";
  const std::string control = NodeAddress(role, rank);
  if (control.rfind("tcp://", 0) != 0) return "";
  const size_t colon = control.rfind(':');
  uint64_t port = 0;
  if (!ParseUint(std::string_view(control).substr(colon + 1), &port)) return "";
  port += ucx.port_offset;
  if (port > 65535) return "";
  return fmt::format("ucx://{}:{}", control.substr(6, colon - 6), port);
}

std::string ClusterConfig::ControlBackend() const {
  return transport == "ucx" ? std::string("zmq") : transport;
}

Status ValidateClusterConfig(const ClusterConfig& c) {
  auto bad = [&](const std::string& key, const std::string& problem) {
    return InvalidArgumentError(
        fmt::format("{}{}: {}", c.source.empty() ? "" : c.source + ": ", key, problem));
  };
  // Every scalar knob: its type and bounds, with the parser's messages.
  for (const ClusterKnob& k : ClusterKnobs()) {
    if (k.get == nullptr) continue;
    if (std::string p = config::CheckKnobValue(k.spec, k.get(c)); !p.empty()) {
      return bad(k.spec.path, p);
    }
  }
  std::set<std::string> seen;
  auto check_address = [&](const std::string& key, const std::string& a) -> Status {
    StatusOr<std::string> n = NormalizeAddress(a, c.transport);
    if (!n.ok()) return bad(key, n.status().message());
    if (*n != a) return bad(key, fmt::format("address '{}' is not normalised ({})", a, *n));
    if (!seen.insert(a).second) return bad(key, fmt::format("address {} is used twice", a));
    return Status::Ok();
  };
  BP_RETURN_IF_ERROR(check_address("cluster.scheduler", c.scheduler_address));
  if (c.servers.empty()) return bad("cluster.servers", "needs at least one address");
  if (c.workers.empty()) return bad("cluster.workers", "needs at least one address");
  for (size_t i = 0; i < c.servers.size(); ++i) {
    BP_RETURN_IF_ERROR(check_address(fmt::format("cluster.servers[{}]", i), c.servers[i]));
  }
  for (size_t i = 0; i < c.workers.size(); ++i) {
    BP_RETURN_IF_ERROR(check_address(fmt::format("cluster.workers[{}]", i), c.workers[i]));
  }
  if (c.worker_nodes.size() > c.workers.size()) {
    return bad("cluster.workers", fmt::format("{} worker node settings for {} workers",
                                              c.worker_nodes.size(), c.workers.size()));
  }
  for (size_t i = 0; i < c.worker_nodes.size(); ++i) {
    const WorkerNode& w = c.worker_nodes[i];
    const std::string key = fmt::format("cluster.workers[{}]", i);
    if (std::string p = config::CheckKnobValue(*FindHostEntryKey(false, "processes"),
                                               config::KnobValue::Number(w.processes));
        !p.empty()) {
      return bad(key + ".processes", p);
    }
    if (!w.gpus.empty() && w.processes != w.gpus.size()) {
      return bad(key + ".processes",
                 fmt::format("is {} but gpus gives {} device(s); one GPU per training process",
                             w.processes, w.gpus.size()));
    }
    if (std::set<uint32_t>(w.gpus.begin(), w.gpus.end()).size() != w.gpus.size()) {
      return bad(key + ".gpus", "lists a device twice (one GPU per training process)");
    }
  }
  // The rules between knobs (heartbeat timeout vs interval, the daemon socket vs the workers).
  for (const ClusterKnob& k : ClusterKnobs()) {
    if (k.rule == nullptr) continue;
    if (std::string p = k.rule(c); !p.empty()) return bad(k.spec.path, p);
  }
  // Both parse: the knob checks above passed.
  StatusOr<v1::CompressorConfig> spec = compressors::ParseCompressorSpec(c.compression.spec);
  StatusOr<v1::ErrorFeedbackPolicy> ef =
      compressors::ParseErrorFeedbackPolicy(c.compression.error_feedback);
  if (!spec.ok()) return bad("compression.spec", spec.status().message());
  if (!ef.ok()) return bad("compression.error_feedback", ef.status().message());
  // What the method allows (its descriptor's rule, compressors/spec_registry.h).
  if (Status s = compressors::ValidateErrorFeedback(*spec, *ef); !s.ok()) {
    return bad("compression.error_feedback", s.message());
  }
  if (!c.optimizer.PullDifference()) {
    StatusOr<v1::CompressorConfig> pull = compressors::ParseCompressorSpec(c.optimizer.pull);
    if (!pull.ok()) return bad("optimizer.pull", pull.status().message());
    if (Status s = compressors::CheckRawWeightPull(*pull); !s.ok()) {
      return bad("optimizer.pull_form", s.message());
    }
  }
  return Status::Ok();
}

StatusOr<std::string> NormalizeAddress(std::string_view address, std::string_view backend) {
  const std::string a(address);
  if (a.empty()) return InvalidArgumentError("empty address");
  const size_t scheme_end = a.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : a.substr(0, scheme_end);
  const std::string rest = scheme_end == std::string::npos ? a : a.substr(scheme_end + 3);
  if (backend == "inproc") {
    if (!scheme.empty() && scheme != "inproc") {
      return InvalidArgumentError(fmt::format(
          "address '{}': {}:// needs cluster.transport zmq (the transport is inproc)", a, scheme));
    }
    if (rest.empty()) return InvalidArgumentError(fmt::format("address '{}' has no name", a));
    return "inproc://" + rest;
  }
  if (scheme == "inproc") {
    return InvalidArgumentError(
        fmt::format("address '{}': inproc:// needs cluster.transport inproc", a));
  }
  if (scheme == "ipc") {
    if (rest.empty()) return InvalidArgumentError(fmt::format("address '{}' has no path", a));
    return a;
  }
  if (!scheme.empty() && scheme != "tcp") {
    return InvalidArgumentError(fmt::format(
        "address '{}': unknown scheme '{}'; valid: tcp://, ipc:// or host:port", a, scheme));
  }
  // tcp: HOST:PORT or [V6]:PORT
  size_t colon;
  std::string host;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return InvalidArgumentError(fmt::format("address '{}': expected [IPV6]:PORT", a));
    }
    host = rest.substr(0, close + 1);
    colon = close + 1;
  } else {
    colon = rest.rfind(':');
    if (colon == std::string::npos) {
      return InvalidArgumentError(fmt::format("address '{}': expected host:port", a));
    }
    host = rest.substr(0, colon);
  }
  if (host.empty() || host == "*") {
    return InvalidArgumentError(fmt::format("address '{}': needs a host others can connect to", a));
  }
  uint64_t port = 0;
  if (!ParseUint(std::string_view(rest).substr(colon + 1), &port) || port < 1 || port > 65535) {
    return InvalidArgumentError(
        fmt::format("address '{}': port must be 1..65535 (every node must know it)", a));
  }
  return fmt::format("tcp://{}:{}", host, port);
}

std::vector<v1::ConfigField> ConfigFields(const ClusterConfig& c) {
  std::vector<v1::ConfigField> out;
  auto add = [&](const char* name, const std::string& value) {
    v1::ConfigField f;
    f.set_name(name);
    f.set_value(value);
    out.push_back(std::move(f));
  };
  add("compression.spec", c.compression.spec);
  add("compression.error_feedback", c.compression.error_feedback);
  add("compression.min_compress_bytes", std::to_string(c.compression.min_compress_bytes));
  add("compression.partition_bytes", std::to_string(c.compression.partition_bytes));
  if (c.compression.raw_partition_bytes != 0) {
    // Only when set, so configs without it keep their hash.
    add("compression.raw_partition_bytes", std::to_string(c.compression.raw_partition_bytes));
  }
  if (c.compression.non_finite != "error") {
    // Only when set, so configs without it keep their hash.
    add("compression.non_finite", c.compression.non_finite);
  }
  if (!c.compression.method_minimum) {
    // Only when off, so configs that keep the default keep their hash.
    add("compression.method_minimum", "false");
  }
  if (!c.compression.overrides.empty()) {
    // Only when set, so configs without overrides keep their hash.
    std::string v;
    for (const auto& o : c.compression.overrides) {
      v += (v.empty() ? "" : ";") + o.pattern + "=" + o.spec;
    }
    add("compression.overrides", v);
  }
  if (c.optimizer.placement != "worker" || !c.optimizer.overrides.empty()) {
    // Only then, so jobs with the optimizer on the workers keep their hash.
    add("optimizer.placement", c.optimizer.placement);
    add("optimizer.pull", c.optimizer.pull);
    add("optimizer.pull_form", c.optimizer.pull_form);
    std::string v;
    for (const auto& o : c.optimizer.overrides) {
      v += (v.empty() ? "" : ";") + o.pattern + "=" + o.placement;
    }
    if (!v.empty()) add("optimizer.overrides", v);
  }
  if (c.ProcessCountsDiffer()) {
    // Only then do the counts change results (docs/config.md): the averaging weights.
    std::string v;
    for (uint32_t r = 0; r < c.workers.size(); ++r) {
      v += (r ? "," : "") + std::to_string(c.ProcessesOnNode(r));
    }
    add("cluster.training_processes", v);
  }
  return out;
}

const std::string& OptimizerSettings::PlacementFor(const std::string& name) const {
  for (const Override& o : overrides) {
    if (fnmatch(o.pattern.c_str(), name.c_str(), 0) == 0) return o.placement;
  }
  return placement;
}

bool OptimizerSettings::PullDifference() const {
  if (pull_form == "difference") return true;
  if (pull_form == "raw") return false;
  return pull != "none";
}

const std::string& CompressionSettings::SpecForTensor(const std::string& name) const {
  for (const Override& o : overrides) {
    if (fnmatch(o.pattern.c_str(), name.c_str(), 0) == 0) return o.spec;
  }
  return spec;
}

uint64_t ConfigHash(const std::vector<v1::ConfigField>& fields) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const v1::ConfigField& f : fields) {
    AppendHash(&h, f.name());
    AppendHash(&h, "=");
    AppendHash(&h, f.value());
    AppendHash(&h, "\n");
  }
  return h;
}

std::string DescribeConfigDifference(const std::vector<v1::ConfigField>& here,
                                     const std::vector<v1::ConfigField>& scheduler) {
  std::map<std::string, std::string> mine;
  for (const v1::ConfigField& f : here) mine[f.name()] = f.value();
  std::vector<std::string> diffs;
  std::set<std::string> known;
  for (const v1::ConfigField& f : scheduler) {
    known.insert(f.name());
    auto it = mine.find(f.name());
    if (it == mine.end()) {
      diffs.push_back(
          fmt::format("{} is not set here but {} on the scheduler", f.name(), Quote(f.value())));
    } else if (it->second != f.value()) {
      diffs.push_back(fmt::format("{} is {} here but {} on the scheduler", f.name(),
                                  Quote(it->second), Quote(f.value())));
    }
  }
  for (const v1::ConfigField& f : here) {
    if (known.count(f.name()) == 0) {
      diffs.push_back(
          fmt::format("{} is {} here but unknown to the scheduler", f.name(), Quote(f.value())));
    }
  }
  if (diffs.empty()) return "";
  std::string out = "config differs from the scheduler's: ";
  for (size_t i = 0; i < diffs.size(); ++i) out += (i ? "; " : "") + diffs[i];
  return out;
}

std::string DescribeClusterConfig(const ClusterConfig& c) {
  auto list = [](const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s + "]";
  };
  // The value of a structured knob; nullopt: not shown.
  auto structured = [&](const std::string& path) -> std::optional<std::string> {
    if (path == "cluster.scheduler") return c.scheduler_address;
    if (path == "cluster.servers") return list(c.servers);
    if (path == "cluster.workers") {
      // Per worker node, when the host form set something:
      // "\n    - tcp://gpu0:9200: 8 processes, gpus [0, 1]".
      std::string nodes;
      bool any_node_set = false;
      for (uint32_t r = 0; r < c.workers.size(); ++r) {
        any_node_set |= r < c.worker_nodes.size() &&
                        (c.worker_nodes[r].processes != 0 || !c.worker_nodes[r].gpus.empty());
      }
      if (any_node_set) {
        nodes = "\n  training_processes:    # per worker node";
        for (uint32_t r = 0; r < c.workers.size(); ++r) {
          const uint32_t p = c.ProcessesOnNode(r);
          const std::vector<uint32_t>& g = c.GpusOnNode(r);
          std::string gpus;
          for (size_t i = 0; i < g.size(); ++i) gpus += (i ? ", " : "") + std::to_string(g[i]);
          nodes += fmt::format("\n    - {}: {} processes, {}", c.workers[r],
                               p == 0 ? std::string("auto") : std::to_string(p),
                               g.empty() ? std::string("cpu") : "gpus [" + gpus + "]");
        }
      }
      return list(c.workers) + nodes;
    }
    if (path == "optimizer.overrides") {
      if (c.optimizer.overrides.empty()) return std::string("[]");
      std::string out;
      for (const auto& o : c.optimizer.overrides) {
        out += fmt::format("\n    - {{pattern: '{}', placement: {}}}", o.pattern, o.placement);
      }
      return out;
    }
    if (path == "compression.overrides") {
      if (c.compression.overrides.empty()) return std::string("[]");
      std::string out;
      for (const auto& o : c.compression.overrides) {
        out += fmt::format("\n    - {{pattern: '{}', spec: '{}'}}", o.pattern, o.spec);
      }
      return out;
    }
    return std::nullopt;  // cluster.token_file: read into the token
  };
  std::string out;
  for (const std::string& section : ClusterSections()) {
    if (!out.empty()) out += "\n";
    if (section == "cluster") {
      out += fmt::format("{:<24}# from {}", "cluster:", c.source.empty() ? "code" : c.source);
    } else if (section == "compression") {
      out +=
          fmt::format("{:<24}# config hash {:016x}", "compression:", ConfigHash(ConfigFields(c)));
    } else {
      out += section + ":";
    }
    std::string group;  // the mapping of dotted keys ("ucx" of "ucx.tls") being written
    for (const ClusterKnob& k : ClusterKnobs()) {
      if (k.spec.section() != section) continue;
      const std::optional<std::string> value =
          k.get != nullptr ? config::DescribeKnobValue(k.spec, k.get(c)) : structured(k.spec.path);
      if (!value) continue;
      const std::string key = k.spec.key();
      const size_t dot = key.find('.');
      if (dot == std::string::npos) {
        group.clear();
        out += fmt::format("\n  {}: {}", key, *value);
        continue;
      }
      if (key.compare(0, dot, group) != 0 || group.size() != dot) {
        group = key.substr(0, dot);
        out += fmt::format("\n  {}:", group);
      }
      out += fmt::format("\n    {}: {}", key.substr(dot + 1), *value);
    }
    if (section == "cluster" && c.transport == "ucx") {
      // Derived, not a knob: where each server's and worker's data plane listens.
      auto data = [&](v1::Role role, size_t n) {
        std::vector<std::string> v;
        v.reserve(n);
        for (uint32_t r = 0; r < n; ++r) v.push_back(c.DataAddress(role, r));
        return list(v);
      };
      out += fmt::format("\n  {:<22}# port + ucx.port_offset", "data_plane:");
      out += fmt::format("\n    servers: {}", data(v1::ROLE_SERVER, c.servers.size()));
      out += fmt::format("\n    workers: {}", data(v1::ROLE_WORKER, c.workers.size()));
    }
  }
  return out;
}

std::string_view SecurityModeName(SecurityMode mode) {
  return mode == SecurityMode::kCurve ? "curve" : "none";
}

std::string_view NumaModeName(NumaMode mode) {
  switch (mode) {
    case NumaMode::kAuto: return "auto";
    case NumaMode::kOn: return "on";
    case NumaMode::kOff: return "off";
  }
  return "invalid";
}

std::string_view GroupName(v1::Group g) {
  switch (g) {
    case v1::GROUP_WORKERS: return "workers";
    case v1::GROUP_SERVERS: return "servers";
    case v1::GROUP_ALL: return "all";
    default: return "unknown";
  }
}

StatusOr<v1::Role> ParseNodeRole(std::string_view name) {
  if (name == "server") return v1::ROLE_SERVER;
  if (name == "worker") return v1::ROLE_WORKER;
  return InvalidArgumentError(fmt::format("unknown role '{}'; valid: server, worker", name));
}

}  // namespace bitpush::config
