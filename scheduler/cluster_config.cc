#include "scheduler/cluster_config.h"

#include <fnmatch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "compressors/registry.h"
#include "fmt/format.h"

namespace bitpush::scheduler {

namespace {

constexpr int64_t kMaxHeartbeatIntervalMs = 60000;
constexpr int64_t kMaxHeartbeatTimeoutMs = 3600000;
constexpr double kMaxStartupTimeoutS = 86400;
constexpr uint64_t kMaxLocalSize = 1024;
// sun_path holds 108 bytes including the terminating NUL.
constexpr size_t kMaxSocketPath = 107;
// Host entries of cluster.servers / cluster.workers without `port:` take ports from here on,
// host by host (docs/config.md).
constexpr uint64_t kDefaultServerPort = 9100;
constexpr uint64_t kDefaultWorkerPort = 9200;
constexpr uint64_t kMaxNodesPerEntry = 1024;
constexpr uint64_t kMaxGpusPerNode = 1024;

// ---- rules shared by the YAML parser and ValidateClusterConfig (each returns "" if fine) ----

std::string CheckHeartbeatInterval(int64_t ms) {
  if (ms < 1 || ms > kMaxHeartbeatIntervalMs) {
    return fmt::format("must be 1..{} (milliseconds), got {}", kMaxHeartbeatIntervalMs, ms);
  }
  return "";
}

std::string CheckHeartbeatTimeout(int64_t timeout_ms, int64_t interval_ms) {
  if (timeout_ms < 1 || timeout_ms > kMaxHeartbeatTimeoutMs) {
    return fmt::format("must be 1..{} (milliseconds), got {}", kMaxHeartbeatTimeoutMs, timeout_ms);
  }
  if (timeout_ms < 2 * interval_ms) {
    return fmt::format(
        "must be at least 2 x cluster.heartbeat_interval_ms ({} ms) so one late heartbeat is "
        "not a death, got {}",
        2 * interval_ms, timeout_ms);
  }
  return "";
}

std::string CheckStartupTimeoutMs(int64_t ms) {
  if (ms < 1 || ms > static_cast<int64_t>(kMaxStartupTimeoutS * 1000)) {
    return fmt::format("must be > 0 and <= {} (seconds), got {} ms", kMaxStartupTimeoutS, ms);
  }
  return "";
}

std::string CheckTransport(const std::string& t) {
  if (t != "zmq" && t != "inproc") {
    return fmt::format("unknown transport '{}'; valid: zmq, inproc", t);
  }
  return "";
}

std::string CheckPartitionBytes(uint64_t v) {
  if (v == 0) return "must be > 0 (bytes)";
  return "";
}

bool ParseUint(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && p == end;
}

bool ParseDouble(const std::string& text, double* out) {
  if (text.empty()) return false;
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  in >> *out;
  return !in.fail() && in.peek() == std::char_traits<char>::eof() && std::isfinite(*out);
}

// The host of a normalised address ("tcp://h:1" -> "h", "tcp://[::1]:1" -> "[::1]"); every
// ipc:// and inproc:// address is on this host ("").
std::string HostOf(const std::string& url) {
  if (url.rfind("tcp://", 0) != 0) return "";
  return url.substr(6, url.rfind(':') - 6);
}

// ---- YAML walking ----

// One parse: the source name for messages and the first error met.
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
  // The entries of a mapping, rejecting non-scalar keys, duplicates and unknown names.
  Status Entries(const YAML::Node& map, const YAML::Mark& map_mark, const std::string& prefix,
                 const std::set<std::string>& known, std::map<std::string, Entry>* out);

  Status Scalar(const Entry& e, const std::string& key, std::string* out) const;
  Status Uint(const Entry& e, const std::string& key, uint64_t* out) const;
  Status Address(const YAML::Node& node, const YAML::Mark& fallback, const std::string& key,
                 const std::string& backend, std::string* out) const;

  Status ParseCluster(const Entry& section, ClusterConfig* c);
  // cluster.servers / cluster.workers: a list of addresses and host entries, or one host
  // entry (a mapping). Appends to c->servers or c->workers (and c->worker_nodes); `owner`
  // maps each address to the key that took it.
  Status ParseNodes(const Entry& e, bool servers, ClusterConfig* c,
                    std::map<std::string, std::string>* owner);
  // One host entry ({host|hosts, count, port[, processes, gpus]}) at `key`.
  Status ParseHostEntry(const YAML::Node& node, const YAML::Mark& fallback, const std::string& key,
                        bool servers, ClusterConfig* c, std::map<std::string, uint64_t>* next_port,
                        std::map<std::string, std::string>* owner);
  Status ParseGpus(const Entry& e, const std::string& key, std::vector<uint32_t>* out) const;
  Status ParseCompression(const Entry& section, ClusterConfig* c);
  Status ParseServer(const Entry& section, ClusterConfig* c);
  Status ParseWorker(const Entry& section, ClusterConfig* c);
  // "auto" -> 0, else an integer in [1, max].
  Status AutoCount(const Entry& e, const std::string& key, uint32_t max, uint32_t* out) const;
  Status ReadTokenFile(const Entry& e, std::string* out) const;

  const std::string source_;
};

Status Parser::Entries(const YAML::Node& map, const YAML::Mark& map_mark, const std::string& prefix,
                       const std::set<std::string>& known, std::map<std::string, Entry>* out) {
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
    if (known.count(name) == 0) {
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
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(e.value, e.key_mark, "cluster.token_file", "cannot read " + path);
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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

Status Parser::ParseCluster(const Entry& section, ClusterConfig* c) {
  std::map<std::string, Entry> m;
  BP_RETURN_IF_ERROR(Entries(section.value, section.key_mark, "cluster",
                             {"scheduler", "transport", "token", "token_file", "servers", "workers",
                              "heartbeat_interval_ms", "heartbeat_timeout_ms", "startup_timeout_s"},
                             &m));
  for (const char* required : {"scheduler", "servers", "workers"}) {
    if (m.count(required) == 0) {
      return Error(section.value, section.key_mark, std::string("cluster.") + required,
                   "is required");
    }
  }
  if (auto it = m.find("transport"); it != m.end()) {
    BP_RETURN_IF_ERROR(Scalar(it->second, "cluster.transport", &c->transport));
    if (std::string p = CheckTransport(c->transport); !p.empty()) {
      return Error(it->second.value, it->second.key_mark, "cluster.transport", p);
    }
  }
  if (m.count("token") && m.count("token_file")) {
    return Error(m["token_file"].value, m["token_file"].key_mark, "cluster.token_file",
                 "set either cluster.token or cluster.token_file, not both");
  }
  if (auto it = m.find("token"); it != m.end()) {
    BP_RETURN_IF_ERROR(Scalar(it->second, "cluster.token", &c->token));
    if (c->token.empty()) {
      return Error(it->second.value, it->second.key_mark, "cluster.token", "is empty");
    }
  }
  if (auto it = m.find("token_file"); it != m.end()) {
    BP_RETURN_IF_ERROR(ReadTokenFile(it->second, &c->token));
  }

  // Addresses: normalised, and unique across the cluster (one listener per address).
  std::map<std::string, std::string> owner;  // address -> key that uses it
  const Entry& sched = m["scheduler"];
  BP_RETURN_IF_ERROR(Address(sched.value, sched.key_mark, "cluster.scheduler", c->transport,
                             &c->scheduler_address));
  owner[c->scheduler_address] = "cluster.scheduler";
  BP_RETURN_IF_ERROR(ParseNodes(m["servers"], /*servers=*/true, c, &owner));
  BP_RETURN_IF_ERROR(ParseNodes(m["workers"], /*servers=*/false, c, &owner));

  uint64_t interval = c->heartbeat_interval.count();
  if (auto it = m.find("heartbeat_interval_ms"); it != m.end()) {
    BP_RETURN_IF_ERROR(Uint(it->second, "cluster.heartbeat_interval_ms", &interval));
    if (std::string p =
            CheckHeartbeatInterval(static_cast<int64_t>(std::min<uint64_t>(interval, INT64_MAX)));
        !p.empty()) {
      return Error(it->second.value, it->second.key_mark, "cluster.heartbeat_interval_ms", p);
    }
    c->heartbeat_interval = std::chrono::milliseconds(interval);
  }
  if (auto it = m.find("heartbeat_timeout_ms"); it != m.end()) {
    uint64_t timeout = 0;
    BP_RETURN_IF_ERROR(Uint(it->second, "cluster.heartbeat_timeout_ms", &timeout));
    if (std::string p = CheckHeartbeatTimeout(
            static_cast<int64_t>(std::min<uint64_t>(timeout, INT64_MAX)), interval);
        !p.empty()) {
      return Error(it->second.value, it->second.key_mark, "cluster.heartbeat_timeout_ms", p);
    }
    c->heartbeat_timeout = std::chrono::milliseconds(timeout);
  } else if (std::string p = CheckHeartbeatTimeout(c->heartbeat_timeout.count(), interval);
             !p.empty()) {
    return Error(m["heartbeat_interval_ms"].value, m["heartbeat_interval_ms"].key_mark,
                 "cluster.heartbeat_interval_ms",
                 fmt::format("is too long for the default cluster.heartbeat_timeout_ms ({}): {}",
                             c->heartbeat_timeout.count(), p));
  }
  if (auto it = m.find("startup_timeout_s"); it != m.end()) {
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, "cluster.startup_timeout_s", &text));
    double seconds = 0;
    if (!ParseDouble(text, &seconds) || seconds <= 0 || seconds > kMaxStartupTimeoutS) {
      return Error(it->second.value, it->second.key_mark, "cluster.startup_timeout_s",
                   fmt::format("expected a number of seconds > 0 and <= {}, got '{}'",
                               kMaxStartupTimeoutS, text));
    }
    c->startup_timeout =
        std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
  }
  return Status::Ok();
}

Status Parser::ParseNodes(const Entry& e, bool servers, ClusterConfig* c,
                          std::map<std::string, std::string>* owner) {
  const std::string key = servers ? "cluster.servers" : "cluster.workers";
  std::map<std::string, uint64_t> next_port;  // host -> its next default port
  if (e.value.IsMap()) {
    BP_RETURN_IF_ERROR(ParseHostEntry(e.value, e.key_mark, key, servers, c, &next_port, owner));
  } else if (e.value.IsSequence()) {
    if (e.value.size() == 0) {
      return Error(e.value, e.key_mark, key, "needs at least one address or host");
    }
    for (size_t i = 0; i < e.value.size(); ++i) {
      const YAML::Node item = e.value[i];
      const std::string item_key = fmt::format("{}[{}]", key, i);
      if (item.IsMap()) {
        BP_RETURN_IF_ERROR(
            ParseHostEntry(item, e.key_mark, item_key, servers, c, &next_port, owner));
        continue;
      }
      std::string addr;
      BP_RETURN_IF_ERROR(Address(item, e.key_mark, item_key, c->transport, &addr));
      if (auto o = owner->find(addr); o != owner->end()) {
        return Error(item, e.key_mark, item_key,
                     fmt::format("address {} is already used by {}", addr, o->second));
      }
      (*owner)[addr] = item_key;
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
                              std::map<std::string, uint64_t>* next_port,
                              std::map<std::string, std::string>* owner) {
  std::map<std::string, Entry> m;
  std::set<std::string> known = {"host", "hosts", "count", "port"};
  if (!servers) known.insert({"processes", "gpus"});
  const YAML::Mark mark = node.Mark().is_null() ? fallback : node.Mark();
  BP_RETURN_IF_ERROR(Entries(node, mark, key, known, &m));
  if (c->transport != "zmq") {
    return Error(node, mark, key,
                 fmt::format("host entries need cluster.transport zmq (the transport is {}); "
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
    if (count < 1 || count > kMaxNodesPerEntry) {
      return Error(it->second.value, it->second.key_mark, key + ".count",
                   fmt::format("expected 1..{} {} per host, got {}", kMaxNodesPerEntry,
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
    uint64_t p = 0;
    BP_RETURN_IF_ERROR(Uint(it->second, key + ".processes", &p));
    if (p < 1 || p > kMaxLocalSize) {
      return Error(it->second.value, it->second.key_mark, key + ".processes",
                   fmt::format("expected 1..{} training processes, got {}", kMaxLocalSize, p));
    }
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
      if (auto o = owner->find(*addr); o != owner->end()) {
        return Error(host_node, mark, node_key,
                     fmt::format("address {} is already used by {}", *addr, o->second));
      }
      (*owner)[*addr] = node_key;
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

Status Parser::ParseCompression(const Entry& section, ClusterConfig* c) {
  std::map<std::string, Entry> m;
  BP_RETURN_IF_ERROR(Entries(
      section.value, section.key_mark, "compression",
      {"spec", "error_feedback", "min_compress_bytes", "partition_bytes", "overrides"}, &m));
  CompressionSettings& s = c->compression;
  if (auto it = m.find("overrides"); it != m.end()) {
    const YAML::Node& list = it->second.value;
    if (!list.IsSequence()) {
      return Error(list, it->second.key_mark, "compression.overrides",
                   "expected a list of {pattern: NAME-PATTERN, spec: SPEC}");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string key = fmt::format("compression.overrides[{}]", i);
      std::map<std::string, Entry> o;
      BP_RETURN_IF_ERROR(Entries(list[i], list[i].Mark(), key, {"pattern", "spec"}, &o));
      CompressionSettings::Override ov;
      for (const char* field : {"pattern", "spec"}) {
        auto f = o.find(field);
        if (f == o.end()) {
          return Error(list[i], it->second.key_mark, key, fmt::format("needs '{}'", field));
        }
      }
      BP_RETURN_IF_ERROR(Scalar(o.at("pattern"), key + ".pattern", &ov.pattern));
      if (ov.pattern.empty()) {
        return Error(o.at("pattern").value, o.at("pattern").key_mark, key + ".pattern",
                     "must not be empty");
      }
      std::string text;
      BP_RETURN_IF_ERROR(Scalar(o.at("spec"), key + ".spec", &text));
      StatusOr<v1::CompressorConfig> cfg = compressors::ParseCompressorSpec(text);
      if (!cfg.ok()) {
        return Error(o.at("spec").value, o.at("spec").key_mark, key + ".spec",
                     cfg.status().message());
      }
      ov.spec = compressors::CompressorSpecString(*cfg);
      s.overrides.push_back(std::move(ov));
    }
  }
  if (auto it = m.find("spec"); it != m.end()) {
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, "compression.spec", &text));
    StatusOr<v1::CompressorConfig> cfg = compressors::ParseCompressorSpec(text);
    if (!cfg.ok()) {
      return Error(it->second.value, it->second.key_mark, "compression.spec",
                   cfg.status().message());
    }
    s.spec = compressors::CompressorSpecString(*cfg);
  }
  if (auto it = m.find("error_feedback"); it != m.end()) {
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, "compression.error_feedback", &text));
    StatusOr<v1::ErrorFeedbackPolicy> p = compressors::ParseErrorFeedbackPolicy(text);
    if (!p.ok()) {
      return Error(it->second.value, it->second.key_mark, "compression.error_feedback",
                   p.status().message());
    }
    s.error_feedback = std::string(compressors::ErrorFeedbackPolicyName(*p));
  }
  if (auto it = m.find("min_compress_bytes"); it != m.end()) {
    BP_RETURN_IF_ERROR(Uint(it->second, "compression.min_compress_bytes", &s.min_compress_bytes));
  }
  if (auto it = m.find("partition_bytes"); it != m.end()) {
    BP_RETURN_IF_ERROR(Uint(it->second, "compression.partition_bytes", &s.partition_bytes));
    if (std::string p = CheckPartitionBytes(s.partition_bytes); !p.empty()) {
      return Error(it->second.value, it->second.key_mark, "compression.partition_bytes", p);
    }
  }
  return Status::Ok();
}

Status Parser::AutoCount(const Entry& e, const std::string& key, uint32_t max,
                         uint32_t* out) const {
  std::string text;
  BP_RETURN_IF_ERROR(Scalar(e, key, &text));
  if (text == "auto") {
    *out = 0;
    return Status::Ok();
  }
  uint64_t v = 0;
  if (!ParseUint(text, &v) || v < 1 || v > max) {
    return Error(e.value, e.key_mark, key,
                 fmt::format("expected 'auto' or an integer from 1 to {}, got '{}'", max, text));
  }
  *out = static_cast<uint32_t>(v);
  return Status::Ok();
}

Status Parser::ParseServer(const Entry& section, ClusterConfig* c) {
  std::map<std::string, Entry> m;
  BP_RETURN_IF_ERROR(
      Entries(section.value, section.key_mark, "server", {"engine_threads", "numa"}, &m));
  if (auto it = m.find("engine_threads"); it != m.end()) {
    BP_RETURN_IF_ERROR(
        AutoCount(it->second, "server.engine_threads", 256, &c->server.engine_threads));
  }
  if (auto it = m.find("numa"); it != m.end()) {
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, "server.numa", &text));
    if (text != "auto" && text != "on" && text != "off") {
      return Error(it->second.value, it->second.key_mark, "server.numa",
                   fmt::format("unknown value '{}'; valid: auto, on, off", text));
    }
    c->server.numa = text;
  }
  return Status::Ok();
}

Status Parser::ParseWorker(const Entry& section, ClusterConfig* c) {
  std::map<std::string, Entry> m;
  BP_RETURN_IF_ERROR(Entries(section.value, section.key_mark, "worker",
                             {"compress_threads", "credit_bytes", "local_size", "numa",
                              "op_timeout_s", "reduce_threads", "socket"},
                             &m));
  WorkerSettings& w = c->worker;
  if (auto it = m.find("reduce_threads"); it != m.end()) {
    BP_RETURN_IF_ERROR(AutoCount(it->second, "worker.reduce_threads", 256, &w.reduce_threads));
  }
  if (auto it = m.find("numa"); it != m.end()) {
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, "worker.numa", &text));
    if (text != "auto" && text != "on" && text != "off") {
      return Error(it->second.value, it->second.key_mark, "worker.numa",
                   fmt::format("unknown value '{}'; valid: auto, on, off", text));
    }
    w.numa = text;
  }
  if (auto it = m.find("compress_threads"); it != m.end()) {
    BP_RETURN_IF_ERROR(AutoCount(it->second, "worker.compress_threads", 256, &w.compress_threads));
  }
  if (auto it = m.find("credit_bytes"); it != m.end()) {
    BP_RETURN_IF_ERROR(Uint(it->second, "worker.credit_bytes", &w.credit_bytes));
    if (w.credit_bytes == 0) {
      return Error(it->second.value, it->second.key_mark, "worker.credit_bytes", "must be > 0");
    }
  }
  if (auto it = m.find("op_timeout_s"); it != m.end()) {
    std::string text;
    BP_RETURN_IF_ERROR(Scalar(it->second, "worker.op_timeout_s", &text));
    double seconds = 0;
    if (!ParseDouble(text, &seconds) || seconds <= 0 || seconds > kMaxStartupTimeoutS) {
      return Error(it->second.value, it->second.key_mark, "worker.op_timeout_s",
                   fmt::format("expected a number of seconds > 0 and <= {}, got '{}'",
                               kMaxStartupTimeoutS, text));
    }
    w.op_timeout = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
  }
  if (auto it = m.find("local_size"); it != m.end()) {
    uint64_t v = 0;
    BP_RETURN_IF_ERROR(Uint(it->second, "worker.local_size", &v));
    if (v < 1 || v > kMaxLocalSize) {
      return Error(it->second.value, it->second.key_mark, "worker.local_size",
                   fmt::format("expected 1..{} training processes, got {}", kMaxLocalSize, v));
    }
    w.local_size = static_cast<uint32_t>(v);
  }
  if (auto it = m.find("socket"); it != m.end()) {
    BP_RETURN_IF_ERROR(Scalar(it->second, "worker.socket", &w.socket));
    const std::string longest =
        w.SocketFor(static_cast<uint32_t>(std::max<size_t>(c->workers.size(), 1) - 1));
    if (w.socket.empty() || longest.size() > kMaxSocketPath) {
      return Error(
          it->second.value, it->second.key_mark, "worker.socket",
          fmt::format("expected a path of 1..{} bytes, got '{}'", kMaxSocketPath, longest));
    }
    if (w.socket.find("{rank}") == std::string::npos) {
      // Worker nodes on one host would all listen at this path.
      std::map<std::string, size_t> first_on_host;
      for (size_t r = 0; r < c->workers.size(); ++r) {
        const auto [at, fresh] = first_on_host.emplace(HostOf(c->workers[r]), r);
        if (!fresh) {
          return Error(it->second.value, it->second.key_mark, "worker.socket",
                       fmt::format("workers {} and {} run on the same host, so their "
                                   "bitpush-worker daemons would share '{}'; put {{rank}} in "
                                   "the path (e.g. /run/bitpush/worker-{{rank}}.sock)",
                                   at->second, r, w.socket));
        }
      }
    }
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
    std::map<std::string, Entry> top;
    BP_RETURN_IF_ERROR(
        Entries(root, root.Mark(), "", {"cluster", "compression", "server", "worker"}, &top));
    auto cl = top.find("cluster");
    if (cl == top.end()) {
      return Error(root, root.Mark(), "cluster", "is required (the cluster section)");
    }
    BP_RETURN_IF_ERROR(ParseCluster(cl->second, &c));
    if (auto co = top.find("compression"); co != top.end()) {
      BP_RETURN_IF_ERROR(ParseCompression(co->second, &c));
    }
    if (auto se = top.find("server"); se != top.end()) {
      BP_RETURN_IF_ERROR(ParseServer(se->second, &c));
    }
    if (auto wo = top.find("worker"); wo != top.end()) {
      BP_RETURN_IF_ERROR(ParseWorker(wo->second, &c));
    }
  } catch (const YAML::Exception& e) {
    // Not expected (the walk checks node types before access); never let it escape.
    return InvalidArgumentError(fmt::format("{}:{}: {}", source_, e.mark.line + 1, e.msg));
  }
  BP_RETURN_IF_ERROR(ValidateClusterConfig(c));
  return c;
}

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

StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("cannot read cluster config {}", path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseClusterConfig(text, path);
}

StatusOr<ClusterConfig> ParseClusterConfig(std::string_view yaml_text, const std::string& source) {
  return Parser(source).Parse(yaml_text);
}

Status ValidateClusterConfig(const ClusterConfig& c) {
  auto bad = [&](const std::string& key, const std::string& problem) {
    return InvalidArgumentError(
        fmt::format("{}{}: {}", c.source.empty() ? "" : c.source + ": ", key, problem));
  };
  if (std::string p = CheckTransport(c.transport); !p.empty()) return bad("cluster.transport", p);
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
    if (w.processes > kMaxLocalSize) {
      return bad(key + ".processes", fmt::format("expected 1..{} training processes, got {}",
                                                 kMaxLocalSize, w.processes));
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
  if (std::string p = CheckHeartbeatInterval(c.heartbeat_interval.count()); !p.empty()) {
    return bad("cluster.heartbeat_interval_ms", p);
  }
  if (std::string p =
          CheckHeartbeatTimeout(c.heartbeat_timeout.count(), c.heartbeat_interval.count());
      !p.empty()) {
    return bad("cluster.heartbeat_timeout_ms", p);
  }
  if (std::string p = CheckStartupTimeoutMs(c.startup_timeout.count()); !p.empty()) {
    return bad("cluster.startup_timeout_s", p);
  }
  StatusOr<v1::CompressorConfig> spec = compressors::ParseCompressorSpec(c.compression.spec);
  if (!spec.ok()) return bad("compression.spec", spec.status().message());
  if (compressors::CompressorSpecString(*spec) != c.compression.spec) {
    return bad("compression.spec", fmt::format("'{}' is not canonical ('{}')", c.compression.spec,
                                               compressors::CompressorSpecString(*spec)));
  }
  StatusOr<v1::ErrorFeedbackPolicy> ef =
      compressors::ParseErrorFeedbackPolicy(c.compression.error_feedback);
  if (!ef.ok()) return bad("compression.error_feedback", ef.status().message());
  if (spec->id() == v1::COMPRESSOR_ID_RANDOMK && spec->randomk().unbiased() &&
      *ef != v1::ERROR_FEEDBACK_NONE) {
    // Scaled random-k under error feedback: a kept element's residual becomes -(n/k - 1) q,
    // so residuals grow without bound (to inf within ~100 rounds at k/n = 1/32).
    return bad("compression.error_feedback",
               fmt::format("'{}' with '{}' is refused: unbiased random-k is meant for "
                           "error_feedback: none (Algorithm 3); its residual would grow without "
                           "bound. Use error_feedback: none, or unbiased=false with error feedback",
                           c.compression.error_feedback, c.compression.spec));
  }
  if (std::string p = CheckPartitionBytes(c.compression.partition_bytes); !p.empty()) {
    return bad("compression.partition_bytes", p);
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
  if (!c.compression.overrides.empty()) {
    // Only when set, so configs without overrides keep their hash.
    std::string v;
    for (const auto& o : c.compression.overrides) {
      v += (v.empty() ? "" : ";") + o.pattern + "=" + o.spec;
    }
    add("compression.overrides", v);
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
  std::string overrides = "[]";
  if (!c.compression.overrides.empty()) {
    overrides.clear();
    for (const auto& o : c.compression.overrides) {
      overrides += fmt::format("\n    - {{pattern: '{}', spec: '{}'}}", o.pattern, o.spec);
    }
  }
  // Per worker node, when the host form set something: "\n    - tcp://gpu0:9200: 8 processes, gpus
  // [0, 1]".
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
  const int64_t startup_ms = c.startup_timeout.count();
  const std::string startup = startup_ms % 1000 == 0
                                  ? std::to_string(startup_ms / 1000)
                                  : fmt::format("{:.3f}", static_cast<double>(startup_ms) / 1000);
  return fmt::format(
      "cluster:                # from {}\n"
      "  scheduler: {}\n"
      "  transport: {}\n"
      "  token: {}\n"
      "  servers: {}\n"
      "  workers: {}{}\n"
      "  heartbeat_interval_ms: {}\n"
      "  heartbeat_timeout_ms: {}\n"
      "  startup_timeout_s: {}\n"
      "compression:            # config hash {:016x}\n"
      "  spec: {}\n"
      "  error_feedback: {}\n"
      "  min_compress_bytes: {}\n"
      "  partition_bytes: {}\n"
      "  overrides: {}\n"
      "server:\n"
      "  engine_threads: {}\n"
      "  numa: {}\n"
      "worker:\n"
      "  compress_threads: {}\n"
      "  reduce_threads: {}\n"
      "  numa: {}\n"
      "  credit_bytes: {}\n"
      "  op_timeout_s: {:.3f}\n"
      "  local_size: {}\n"
      "  socket: {}",
      c.source.empty() ? "code" : c.source, c.scheduler_address, c.transport,
      c.token.empty() ? "<none>" : "<set>", list(c.servers), list(c.workers), nodes,
      c.heartbeat_interval.count(), c.heartbeat_timeout.count(), startup,
      ConfigHash(ConfigFields(c)), c.compression.spec, c.compression.error_feedback,
      c.compression.min_compress_bytes, c.compression.partition_bytes, overrides,
      c.server.engine_threads == 0 ? "auto" : std::to_string(c.server.engine_threads),
      c.server.numa,
      c.worker.compress_threads == 0 ? "auto" : std::to_string(c.worker.compress_threads),
      c.worker.reduce_threads == 0 ? "auto" : std::to_string(c.worker.reduce_threads),
      c.worker.numa, c.worker.credit_bytes, static_cast<double>(c.worker.op_timeout.count()) / 1000,
      c.worker.local_size == 0 ? "auto" : std::to_string(c.worker.local_size),
      c.worker.socket.empty() ? "default" : c.worker.socket);
}

std::string_view RoleName(v1::Role role) {
  switch (role) {
    case v1::ROLE_SCHEDULER: return "scheduler";
    case v1::ROLE_SERVER: return "server";
    case v1::ROLE_WORKER: return "worker";
    default: return "unknown";
  }
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

std::string NodePeerId(v1::Role role, uint32_t rank) {
  return fmt::format("{}:{}", RoleName(role), rank);
}

}  // namespace bitpush::scheduler
