// The cluster YAML's parser: walks the YAML document (yaml-cpp), takes each section's keys and
// scalars from the knob table (cluster_knobs.h) and gives the structured keys (host entries,
// GPUs, per-tensor overrides) their own code, then validates the result
// (ValidateClusterConfig). Errors name the file, line and key. Declared in cluster_config.h
// (LoadClusterConfig, ParseClusterConfig).
// Thread-safety: one Parser per call; nothing shared.
#include <fnmatch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "common/secret_file.h"
#include "compressors/spec_registry.h"
#include "config/cluster_config.h"
#include "config/cluster_knobs.h"
#include "fmt/format.h"

namespace bitpush::config {

namespace {

// Host entries of cluster.servers / cluster.workers without `port:` take ports from here on,
// host by host (docs/config.md).
constexpr uint64_t kDefaultServerPort = 9100;
constexpr uint64_t kDefaultWorkerPort = 9200;
constexpr uint64_t kMaxGpusPerNode = 1024;

// ---- YAML walking ----

// One parse: the source name for messages, the addresses taken so far and the first error met.
// The keys of each section and how each scalar is parsed come from the knob table
// (cluster_knobs.h); the structured keys have their own code here.
class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  StatusOr<ClusterConfig> Parse(std::string_view text);

 private:
  // "SOURCE:LINE: KEY: problem"; line from `node` (or `fallback` when `node` has no mark).
  Status Error(const YAML::Node& node, const YAML::Mark& fallback, const std::string& key,
               const std::string& problem) const {
    // A null value (`key:` with nothing after it) carries the mark of whatever follows it.
    YAML::Mark m = node.IsDefined() && !node.IsNull() ? node.Mark() : fallback;
    if (m.is_null() || m.line < 0) m = fallback;
    if (m.is_null() || m.line < 0) {
      return InvalidArgumentError(fmt::format("{}: {}: {}", source_, key, problem));
    }
    return InvalidArgumentError(fmt::format("{}:{}: {}: {}", source_, m.line + 1, key, problem));
  }

  struct Entry {
    YAML::Mark key_mark;
    YAML::Node value;
  };
  using EntryMap = std::map<std::string, Entry>;
  // The entries of a mapping, rejecting non-scalar keys, duplicates and names not in `known`
  // (listed in that order in the message).
  Status Entries(const YAML::Node& map, const YAML::Mark& map_mark, const std::string& prefix,
                 const std::vector<std::string>& known, EntryMap* out);

  Status Scalar(const Entry& e, const std::string& key, std::string* out) const;
  Status Uint(const Entry& e, const std::string& key, uint64_t* out) const;
  Status Address(const YAML::Node& node, const YAML::Mark& fallback, const std::string& key,
                 const std::string& backend, std::string* out) const;

  // One section: its scalar knobs by their type, then its structured knobs, then the rules
  // of the knobs the file gives.
  Status ParseSection(const std::string& section, const Entry& e, ClusterConfig* c);
  Status ParseStructured(const ClusterKnob& knob, const Entry& e, const EntryMap& section,
                         ClusterConfig* c);
  // cluster.servers / cluster.workers: a list of addresses and host entries, or one host
  // entry (a mapping). Appends to c->servers or c->workers (and c->worker_nodes).
  Status ParseNodes(const Entry& e, bool servers, ClusterConfig* c);
  // One host entry ({host|hosts, count, port[, processes, gpus]}) at `key`.
  Status ParseHostEntry(const YAML::Node& node, const YAML::Mark& fallback, const std::string& key,
                        bool servers, ClusterConfig* c, std::map<std::string, uint64_t>* next_port);
  Status ParseGpus(const Entry& e, const std::string& key, std::vector<uint32_t>* out) const;
  Status ParseOverrides(const Entry& e, ClusterConfig* c);
  Status ParseOptimizerOverrides(const Entry& e, ClusterConfig* c);
  Status ReadTokenFile(const Entry& e, std::string* out) const;

  const std::string source_;
  // Addresses are unique across the cluster (one listener per address): address -> the key
  // that took it.
  std::map<std::string, std::string> owner_;
};

Status Parser::Entries(const YAML::Node& map, const YAML::Mark& map_mark, const std::string& prefix,
                       const std::vector<std::string>& known, EntryMap* out) {
  const std::string where = prefix.empty() ? "top level" : prefix;
  if (!map.IsMap()) {
    return Error(map, map_mark, where,
                 map.IsNull() ? "is empty; expected a mapping" : "expected a mapping");
  }
  std::string valid;
  for (const std::string& k : known) valid += (valid.empty() ? "" : ", ") + k;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node k = it->first;  // a copy: `it->` is a proxy temporary
    if (!k.IsScalar()) return Error(k, map_mark, where, "keys must be plain names");
    const std::string& name = k.Scalar();
    std::string full = prefix;
    if (!full.empty()) full += ".";
    full += name;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return Error(k, map_mark, full,
                   fmt::format("unknown key; valid keys of {}: {}", where, valid));
    }
    if (out->count(name) != 0) {
      return Error(
          k, map_mark, full,
          fmt::format("duplicate key (first at line {})", out->at(name).key_mark.line + 1));
    }
    // emplace, not assignment: assigning to a YAML::Node writes through to the node it refers to.
    out->emplace(name, Entry{k.Mark(), it->second});
  }
  return Status::Ok();
}

Status Parser::Scalar(const Entry& e, const std::string& key, std::string* out) const {
  if (!e.value.IsScalar()) {
    return Error(e.value, e.key_mark, key,
                 e.value.IsNull() ? "has no value" : "expected a single value");
  }
  *out = e.value.Scalar();
  return Status::Ok();
}

Status Parser::Uint(const Entry& e, const std::string& key, uint64_t* out) const {
  std::string text;
  BP_RETURN_IF_ERROR(Scalar(e, key, &text));
  if (!ParseUint(text, out)) {
    return Error(e.value, e.key_mark, key,
                 fmt::format("expected a non-negative integer, got '{}'", text));
  }
  return Status::Ok();
}

Status Parser::Address(const YAML::Node& node, const YAML::Mark& fallback, const std::string& key,
                       const std::string& backend, std::string* out) const {
  if (!node.IsScalar()) return Error(node, fallback, key, "expected an address (host:port or URL)");
  StatusOr<std::string> a = NormalizeAddress(node.Scalar(), backend);
  if (!a.ok()) return Error(node, fallback, key, a.status().message());
  *out = *a;
  return Status::Ok();
}

Status Parser::ReadTokenFile(const Entry& e, std::string* out) const {
  std::string path;
  BP_RETURN_IF_ERROR(Scalar(e, "cluster.token_file", &path));
  if (path.empty()) return Error(e.value, e.key_mark, "cluster.token_file", "is empty");
  if (path[0] != '/') {
    const size_t slash = source_.rfind('/');
    if (slash != std::string::npos) path = source_.substr(0, slash + 1) + path;
  }
  // Only the owner may access it (common/secret_file.h): a token others can read is no secret.
  StatusOr<std::string> read = ReadSecretFile(path, "the token file");
  if (!read.ok()) return Error(e.value, e.key_mark, "cluster.token_file", read.status().message());
  std::string token = std::move(read).value();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) {
    return Error(e.value, e.key_mark, "cluster.token_file", path + " holds an empty token");
  }
  *out = std::move(token);
  return Status::Ok();
}

Status Parser::ParseSection(const std::string& section, const Entry& e, ClusterConfig* c) {
  // Knobs whose key has a dot ("ucx.tls") sit in a mapping of their own (`ucx: {tls: tcp}`):
  // the section lists the group once, and the group's entries join `m` by their dotted key.
  std::map<std::string, std::vector<std::string>> groups;
  std::vector<std::string> keys;
  for (const std::string& k : SectionKeys(section)) {
    const size_t dot = k.find('.');
    if (dot == std::string::npos) {
      keys.push_back(k);
    } else {
      std::vector<std::string>& sub = groups[k.substr(0, dot)];
      if (sub.empty()) keys.push_back(k.substr(0, dot));
      sub.push_back(k.substr(dot + 1));
    }
  }
  std::sort(keys.begin(), keys.end());
  EntryMap m;
  BP_RETURN_IF_ERROR(Entries(e.value, e.key_mark, section, keys, &m));
  for (const auto& [group, sub_keys] : groups) {
    auto it = m.find(group);
    if (it == m.end()) continue;
    EntryMap sub;
    BP_RETURN_IF_ERROR(Entries(it->second.value, it->second.key_mark,
                               fmt::format("{}.{}", section, group), sub_keys, &sub));
    m.erase(it);
    for (auto& [k, entry] : sub) m.emplace(fmt::format("{}.{}", group, k), std::move(entry));
  }
  std::vector<const ClusterKnob*> knobs;
  for (const ClusterKnob& k : ClusterKnobs()) {
    if (k.spec.section() == section) knobs.push_back(&k);
  }
  for (const ClusterKnob* k : knobs) {
    if (k->spec.required && m.count(k->spec.key()) == 0) {
      return Error(e.value, e.key_mark, k->spec.path, "is required");
    }
  }
  // Scalars first: the structured keys may depend on them (addresses on cluster.transport).
  for (const ClusterKnob* k : knobs) {
    auto it = m.find(k->spec.key());
    if (it == m.end() || k->spec.structured()) continue;
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, k->spec.path, &text));
    StatusOr<config::KnobValue> v = config::ParseKnobValue(k->spec, text);
    if (!v.ok()) {
      return Error(it->second.value, it->second.key_mark, k->spec.path, v.status().message());
    }
    k->set(c, *v);
  }
  for (const ClusterKnob* k : knobs) {
    auto it = m.find(k->spec.key());
    if (it != m.end() && k->spec.structured()) {
      BP_RETURN_IF_ERROR(ParseStructured(*k, it->second, m, c));
    }
  }
  for (const ClusterKnob* k : knobs) {
    auto it = m.find(k->spec.key());
    if (k->rule == nullptr || it == m.end()) continue;
    if (std::string p = k->rule(*c); !p.empty()) {
      return Error(it->second.value, it->second.key_mark, k->spec.path, p);
    }
  }
  // The default cluster.heartbeat_timeout_ms may be too short for the interval the file gives:
  // name the key the file has.
  if (auto it = m.find("heartbeat_interval_ms");
      section == "cluster" && it != m.end() && m.count("heartbeat_timeout_ms") == 0) {
    const ClusterKnob* timeout = FindClusterKnob("cluster.heartbeat_timeout_ms");
    if (std::string p = timeout->rule(*c); !p.empty()) {
      return Error(it->second.value, it->second.key_mark, "cluster.heartbeat_interval_ms",
                   fmt::format("is too long for the default {} ({}): {}", timeout->spec.path,
                               timeout->spec.default_text, p));
    }
  }
  return Status::Ok();
}

Status Parser::ParseStructured(const ClusterKnob& knob, const Entry& e, const EntryMap& section,
                               ClusterConfig* c) {
  const std::string& path = knob.spec.path;
  if (path == "cluster.scheduler") {
    BP_RETURN_IF_ERROR(Address(e.value, e.key_mark, path, c->transport, &c->scheduler_address));
    owner_[c->scheduler_address] = path;
    return Status::Ok();
  }
  if (path == "cluster.token_file") {
    if (section.count("token") != 0) {
      return Error(e.value, e.key_mark, path,
                   "set either cluster.token or cluster.token_file, not both");
    }
    return ReadTokenFile(e, &c->token);
  }
  if (path == "cluster.servers" || path == "cluster.workers") {
    return ParseNodes(e, path == "cluster.servers", c);
  }
  if (path == "compression.overrides") return ParseOverrides(e, c);
  if (path == "optimizer.overrides") return ParseOptimizerOverrides(e, c);
  return InternalError(path + " is declared structured but the parser has no code for it");
}

Status Parser::ParseNodes(const Entry& e, bool servers, ClusterConfig* c) {
  const std::string key = servers ? "cluster.servers" : "cluster.workers";
  std::map<std::string, uint64_t> next_port;  // host -> its next default port
  if (e.value.IsMap()) {
    BP_RETURN_IF_ERROR(ParseHostEntry(e.value, e.key_mark, key, servers, c, &next_port));
  } else if (e.value.IsSequence()) {
    if (e.value.size() == 0) {
      return Error(e.value, e.key_mark, key, "needs at least one address or host");
    }
    for (size_t i = 0; i < e.value.size(); ++i) {
      const YAML::Node item = e.value[i];
      const std::string item_key = fmt::format("{}[{}]", key, i);
      if (item.IsMap()) {
        BP_RETURN_IF_ERROR(ParseHostEntry(item, e.key_mark, item_key, servers, c, &next_port));
        continue;
      }
      std::string addr;
      BP_RETURN_IF_ERROR(Address(item, e.key_mark, item_key, c->transport, &addr));
      if (auto o = owner_.find(addr); o != owner_.end()) {
        return Error(item, e.key_mark, item_key,
                     fmt::format("address {} is already used by {}", addr, o->second));
      }
      owner_[addr] = item_key;
      if (servers) {
        c->servers.push_back(addr);
      } else {
        c->workers.push_back(addr);
        c->worker_nodes.emplace_back();
      }
    }
  } else {
    return Error(e.value, e.key_mark, key,
                 servers ? "expected a list of addresses ([host:port, ...]) or hosts "
                           "({hosts: [a, b], count: 2})"
                         : "expected a list of addresses ([host:port, ...]) or hosts "
                           "({hosts: [a, b], processes: 8})");
  }
  return Status::Ok();
}

Status Parser::ParseGpus(const Entry& e, const std::string& key, std::vector<uint32_t>* out) const {
  if (e.value.IsScalar()) {
    uint64_t n = 0;
    if (!ParseUint(e.value.Scalar(), &n) || n < 1 || n > kMaxGpusPerNode) {
      return Error(e.value, e.key_mark, key,
                   fmt::format("expected a number of GPUs (1..{}) or a list of device indices, "
                               "got '{}'",
                               kMaxGpusPerNode, e.value.Scalar()));
    }
    for (uint32_t i = 0; i < n; ++i) out->push_back(i);
    return Status::Ok();
  }
  if (!e.value.IsSequence() || e.value.size() == 0 || e.value.size() > kMaxGpusPerNode) {
    return Error(e.value, e.key_mark, key,
                 fmt::format("expected a number of GPUs or a list of 1..{} device indices",
                             kMaxGpusPerNode));
  }
  std::set<uint64_t> seen;
  for (size_t i = 0; i < e.value.size(); ++i) {
    const YAML::Node d = e.value[i];
    uint64_t v = 0;
    if (!d.IsScalar() || !ParseUint(d.Scalar(), &v) || v > 65535) {
      return Error(d, e.key_mark, fmt::format("{}[{}]", key, i),
                   "expected a CUDA device index (0, 1, ...)");
    }
    if (!seen.insert(v).second) {
      return Error(d, e.key_mark, fmt::format("{}[{}]", key, i),
                   fmt::format("device {} is listed twice (one GPU per training process)", v));
    }
    out->push_back(static_cast<uint32_t>(v));
  }
  return Status::Ok();
}

Status Parser::ParseHostEntry(const YAML::Node& node, const YAML::Mark& fallback,
                              const std::string& key, bool servers, ClusterConfig* c,
                              std::map<std::string, uint64_t>* next_port) {
  std::map<std::string, Entry> m;
  const YAML::Mark mark = node.Mark().is_null() ? fallback : node.Mark();
  BP_RETURN_IF_ERROR(Entries(node, mark, key, HostEntryKeys(servers), &m));
  if (c->transport == "inproc") {
    return Error(
        node, mark, key,
        fmt::format("host entries need cluster.transport zmq or ucx (the transport is {}); "
                    "list {} addresses instead",
                    c->transport, servers ? "server" : "worker"));
  }
  if (m.count("host") == m.count("hosts")) {
    return Error(node, mark, key,
                 "needs either host: NAME or hosts: [NAME, ...] (one of them, not both)");
  }
  // (name, key naming it) in order.
  std::vector<std::pair<std::string, std::pair<YAML::Node, std::string>>> hosts;
  if (auto it = m.find("host"); it != m.end()) {
    std::string h;
    BP_RETURN_IF_ERROR(Scalar(it->second, key + ".host", &h));
    hosts.push_back({h, {it->second.value, key + ".host"}});
  } else {
    const Entry& hs = m["hosts"];
    if (!hs.value.IsSequence() || hs.value.size() == 0) {
      return Error(hs.value, hs.key_mark, key + ".hosts", "expected a list of host names");
    }
    for (size_t i = 0; i < hs.value.size(); ++i) {
      const YAML::Node h = hs.value[i];
      const std::string hk = fmt::format("{}.hosts[{}]", key, i);
      if (!h.IsScalar()) return Error(h, hs.key_mark, hk, "expected a host name");
      hosts.push_back({h.Scalar(), {h, hk}});
    }
  }
  uint64_t count = 1;
  if (auto it = m.find("count"); it != m.end()) {
    BP_RETURN_IF_ERROR(Uint(it->second, key + ".count", &count));
    const config::KnobSpec& spec = *FindHostEntryKey(servers, "count");
    if (count < spec.min || count > spec.max) {
      return Error(it->second.value, it->second.key_mark, key + ".count",
                   fmt::format("expected {}..{} {} per host, got {}", spec.min, spec.max,
                               servers ? "servers" : "worker nodes", count));
    }
  }
  uint64_t port = 0;  // 0: the host's next default port
  if (auto it = m.find("port"); it != m.end()) {
    BP_RETURN_IF_ERROR(Uint(it->second, key + ".port", &port));
    if (port < 1 || port + count - 1 > 65535) {
      return Error(it->second.value, it->second.key_mark, key + ".port",
                   count == 1 ? fmt::format("must be 1..65535, got {}", port)
                              : fmt::format("must be 1..{} so the {} ports from it fit, got {}",
                                            65536 - count, count, port));
    }
  }
  WorkerNode w;
  if (auto it = m.find("gpus"); it != m.end()) {
    BP_RETURN_IF_ERROR(ParseGpus(it->second, key + ".gpus", &w.gpus));
  }
  if (auto it = m.find("processes"); it != m.end()) {
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, key + ".processes", &text));
    StatusOr<config::KnobValue> v =
        config::ParseKnobValue(*FindHostEntryKey(servers, "processes"), text);
    if (!v.ok()) {
      return Error(it->second.value, it->second.key_mark, key + ".processes", v.status().message());
    }
    const uint64_t p = v->number;
    if (!w.gpus.empty() && p != w.gpus.size()) {
      return Error(it->second.value, it->second.key_mark, key + ".processes",
                   fmt::format("is {} but gpus gives {} device(s); one GPU per training process", p,
                               w.gpus.size()));
    }
    w.processes = static_cast<uint32_t>(p);
  } else if (!w.gpus.empty()) {
    w.processes = static_cast<uint32_t>(w.gpus.size());
  }

  for (const auto& [name, where] : hosts) {
    const auto& [host_node, host_key] = where;
    if (name.empty() || name == "*" || name.find_first_of("/[] \t") != std::string::npos) {
      return Error(host_node, mark, host_key,
                   fmt::format("'{}' is not a host name or IP address", name));
    }
    // An IPv6 literal goes in brackets in the address.
    const std::string host = name.find(':') != std::string::npos ? "[" + name + "]" : name;
    uint64_t& next = (*next_port)[name];
    if (next == 0) next = servers ? kDefaultServerPort : kDefaultWorkerPort;
    const uint64_t first = port != 0 ? port : next;
    if (first + count - 1 > 65535) {
      return Error(host_node, mark, host_key,
                   fmt::format("the default ports of host {} run past 65535; give port:", name));
    }
    for (uint64_t j = 0; j < count; ++j) {
      const std::string node_key =
          count == 1 ? host_key : fmt::format("{} (#{} of {})", host_key, j + 1, count);
      StatusOr<std::string> addr =
          NormalizeAddress(fmt::format("{}:{}", host, first + j), c->transport);
      if (!addr.ok()) return Error(host_node, mark, host_key, addr.status().message());
      if (auto o = owner_.find(*addr); o != owner_.end()) {
        return Error(host_node, mark, node_key,
                     fmt::format("address {} is already used by {}", *addr, o->second));
      }
      owner_[*addr] = node_key;
      if (servers) {
        c->servers.push_back(*addr);
      } else {
        c->workers.push_back(*addr);
        c->worker_nodes.push_back(w);
      }
    }
    next = std::max(next, first + count);
  }
  return Status::Ok();
}

Status Parser::ParseOverrides(const Entry& e, ClusterConfig* c) {
  std::vector<std::string> entry_keys;
  for (const config::KnobSpec& k : FindClusterKnob("compression.overrides")->spec.entry_keys) {
    entry_keys.push_back(k.path);
  }
  const config::KnobSpec& spec_knob = FindClusterKnob("compression.spec")->spec;
  const YAML::Node& list = e.value;
  if (!list.IsSequence()) {
    return Error(list, e.key_mark, "compression.overrides",
                 "expected a list of {pattern: NAME-PATTERN, spec: SPEC}");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string key = fmt::format("compression.overrides[{}]", i);
    EntryMap o;
    BP_RETURN_IF_ERROR(Entries(list[i], list[i].Mark(), key, entry_keys, &o));
    CompressionSettings::Override ov;
    for (const char* field : {"pattern", "spec"}) {
      auto f = o.find(field);
      if (f == o.end()) {
        return Error(list[i], e.key_mark, key, fmt::format("needs '{}'", field));
      }
    }
    BP_RETURN_IF_ERROR(Scalar(o.at("pattern"), key + ".pattern", &ov.pattern));
    if (ov.pattern.empty()) {
      return Error(o.at("pattern").value, o.at("pattern").key_mark, key + ".pattern",
                   "must not be empty");
    }
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(o.at("spec"), key + ".spec", &text));
    // Canonical like compression.spec, by the same knob type.
    StatusOr<config::KnobValue> spec = config::ParseKnobValue(spec_knob, text);
    if (!spec.ok()) {
      return Error(o.at("spec").value, o.at("spec").key_mark, key + ".spec",
                   spec.status().message());
    }
    ov.spec = spec->text;
    c->compression.overrides.push_back(std::move(ov));
  }
  return Status::Ok();
}

Status Parser::ParseOptimizerOverrides(const Entry& e, ClusterConfig* c) {
  std::vector<std::string> entry_keys;
  for (const config::KnobSpec& k : FindClusterKnob("optimizer.overrides")->spec.entry_keys) {
    entry_keys.push_back(k.path);
  }
  const YAML::Node& list = e.value;
  if (!list.IsSequence()) {
    return Error(list, e.key_mark, "optimizer.overrides",
                 "expected a list of {pattern: NAME-PATTERN, placement: worker|server}");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string key = fmt::format("optimizer.overrides[{}]", i);
    EntryMap o;
    BP_RETURN_IF_ERROR(Entries(list[i], list[i].Mark(), key, entry_keys, &o));
    for (const char* field : {"pattern", "placement"}) {
      if (o.find(field) == o.end()) {
        return Error(list[i], e.key_mark, key, fmt::format("needs '{}'", field));
      }
    }
    OptimizerSettings::Override ov;
    BP_RETURN_IF_ERROR(Scalar(o.at("pattern"), key + ".pattern", &ov.pattern));
    if (ov.pattern.empty()) {
      return Error(o.at("pattern").value, o.at("pattern").key_mark, key + ".pattern",
                   "must not be empty");
    }
    BP_RETURN_IF_ERROR(Scalar(o.at("placement"), key + ".placement", &ov.placement));
    if (ov.placement != "worker" && ov.placement != "server") {
      return Error(o.at("placement").value, o.at("placement").key_mark, key + ".placement",
                   fmt::format("'{}': expected worker or server", ov.placement));
    }
    c->optimizer.overrides.push_back(std::move(ov));
  }
  return Status::Ok();
}

StatusOr<ClusterConfig> Parser::Parse(std::string_view text) {
  ClusterConfig c;
  c.source = source_;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return InvalidArgumentError(fmt::format("{}: YAML syntax error: {}", source_, e.msg));
    }
    return InvalidArgumentError(fmt::format("{}:{}:{}: YAML syntax error: {}", source_,
                                            e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  try {
    if (!root.IsDefined() || root.IsNull()) {
      return InvalidArgumentError(
          fmt::format("{}: empty config: the cluster section is required", source_));
    }
    std::vector<std::string> sections = ClusterSections();
    std::sort(sections.begin(), sections.end());
    EntryMap top;
    BP_RETURN_IF_ERROR(Entries(root, root.Mark(), "", sections, &top));
    if (top.count("cluster") == 0) {
      return Error(root, root.Mark(), "cluster", "is required (the cluster section)");
    }
    for (const std::string& section : ClusterSections()) {
      if (auto it = top.find(section); it != top.end()) {
        BP_RETURN_IF_ERROR(ParseSection(section, it->second, &c));
      }
    }
  } catch (const YAML::Exception& e) {
    // Not expected (the walk checks node types before access); never let it escape.
    return InvalidArgumentError(fmt::format("{}:{}: {}", source_, e.mark.line + 1, e.msg));
  }
  // Paths in the security section are relative to the file, like cluster.token_file.
  for (std::string* path : {&c.security.keys_dir, &c.security.key_file, &c.security.public_keys}) {
    if (!path->empty() && (*path)[0] != '/') {
      const size_t slash = source_.rfind('/');
      if (slash != std::string::npos) *path = source_.substr(0, slash + 1) + *path;
    }
  }
  BP_RETURN_IF_ERROR(ValidateClusterConfig(c));
  return c;
}

}  // namespace

StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("cannot read cluster config {}", path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseClusterConfig(text, path);
}

StatusOr<ClusterConfig> ParseClusterConfig(std::string_view yaml_text, const std::string& source) {
  return Parser(source).Parse(yaml_text);
}

}  // namespace bitpush::config
