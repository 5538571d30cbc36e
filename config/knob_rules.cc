#include "config/knob_rules.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/node/identity.h"
#include "fmt/format.h"

namespace bitpush::config {

// sun_path holds 108 bytes including the terminating NUL.
constexpr size_t kMaxSocketPath = 107;

std::string HeartbeatTimeoutRule(const ClusterConfig& c) {
  const int64_t timeout = c.heartbeat_timeout.count();
  const int64_t interval = c.heartbeat_interval.count();
  if (timeout >= 2 * interval) return "";
  return fmt::format(
      "must be at least 2 x cluster.heartbeat_interval_ms ({} ms) so one late heartbeat is not "
      "a death, got {}",
      2 * interval, timeout);
}

// The host of a normalised address ("tcp://h:1" -> "h", "tcp://[::1]:1" -> "[::1]"); every
// ipc:// and inproc:// address is on this host ("").
namespace {

std::string HostOf(const std::string& url) {
  if (url.rfind("tcp://", 0) != 0) return "";
  return url.substr(6, url.rfind(':') - 6);
}

}  // namespace

std::string WorkerSocketRule(const ClusterConfig& c) {
  const WorkerSettings& w = c.worker;
  if (w.socket.empty()) return "";  // the default path
  const std::string longest =
      w.SocketFor(static_cast<uint32_t>(std::max<size_t>(c.workers.size(), 1) - 1));
  if (longest.size() > kMaxSocketPath) {
    return fmt::format("expected a path of 1..{} bytes, got '{}'", kMaxSocketPath, longest);
  }
  if (w.socket.find("{rank}") != std::string::npos) return "";
  // Worker nodes on one host would all listen at this path.
  std::map<std::string, size_t> first_on_host;
  for (size_t r = 0; r < c.workers.size(); ++r) {
    const auto [at, fresh] = first_on_host.emplace(HostOf(c.workers[r]), r);
    if (!fresh) {
      return fmt::format(
          "workers {} and {} run on the same host, so their bitpush-worker daemons would share "
          "'{}'; put {{rank}} in the path (e.g. /run/bitpush/worker-{{rank}}.sock)",
          at->second, r, w.socket);
    }
  }
  return "";
}

namespace {

// The port of a normalised tcp:// address; 0 for other schemes.

uint32_t PortOf(const std::string& url) {
  if (url.rfind("tcp://", 0) != 0) return 0;
  return static_cast<uint32_t>(std::strtoul(url.c_str() + url.rfind(':') + 1, nullptr, 10));
}

}  // namespace

// Every node's metrics port fits below 65536 and is no cluster listen port of its host.
std::string MetricsPortRule(const ClusterConfig& c) {
  if (c.metrics.port == 0) return "";
  const uint64_t nodes = 1 + c.servers.size() + c.workers.size();
  if (c.metrics.port + nodes - 1 > 65535) {
    return fmt::format(
        "must be at most {} so the {} metrics ports from it (scheduler, {} server(s), {} "
        "worker(s)) fit, got {}",
        65536 - nodes, nodes, c.servers.size(), c.workers.size(), c.metrics.port);
  }
  struct Node {
    std::string name;
    std::string address;
    uint32_t metrics_port;
  };
  std::vector<Node> all = {
      {"the scheduler", c.scheduler_address, c.MetricsPort(v1::ROLE_SCHEDULER, 0)}};
  for (uint32_t r = 0; r < c.servers.size(); ++r) {
    all.push_back({fmt::format("server {}", r), c.servers[r], c.MetricsPort(v1::ROLE_SERVER, r)});
  }
  for (uint32_t r = 0; r < c.workers.size(); ++r) {
    all.push_back({fmt::format("worker {}", r), c.workers[r], c.MetricsPort(v1::ROLE_WORKER, r)});
  }
  for (const Node& n : all) {
    for (const Node& other : all) {
      if (PortOf(other.address) == n.metrics_port && HostOf(other.address) == HostOf(n.address) &&
          !HostOf(n.address).empty()) {
        return fmt::format(
            "{}'s metrics port {} (metrics.port {} + its offset, docs/metrics.md) is the port "
            "of {} at {}; pick metrics ports apart from the cluster's",
            n.name, n.metrics_port, c.metrics.port, other.name, other.address);
      }
    }
  }
  return "";
}

// Under transport ucx: every server and worker has a tcp:// address (its data address is on its
// host).
std::string TransportRule(const ClusterConfig& c) {
  if (c.transport != "ucx") return "";
  for (v1::Role role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    const std::vector<std::string>& list = role == v1::ROLE_SERVER ? c.servers : c.workers;
    for (uint32_t r = 0; r < list.size(); ++r) {
      if (list[r].rfind("tcp://", 0) != 0) {
        return fmt::format(
            "ucx needs a tcp:// address (host:port) for every server and worker: {} {}'s data "
            "plane listens on its host at its port + cluster.ucx.port_offset, but its address "
            "is {}",
            node::RoleName(role), r, list[r]);
      }
    }
  }
  return "";
}

// Under transport ucx: every data port (a server's or worker's port + cluster.ucx.port_offset)
// is at most 65535 and no other node's control, data or metrics port on the same host.
std::string DataPortRule(const ClusterConfig& c) {
  if (c.transport != "ucx") return "";
  struct Port {
    std::string what;  // "server 0's data port 10100 (...)", "worker 1 at tcp://h:9201"
    std::string host;
    uint64_t port;
  };
  std::vector<Port> data, taken;
  taken.push_back({"the scheduler at " + c.scheduler_address, HostOf(c.scheduler_address),
                   PortOf(c.scheduler_address)});
  if (c.metrics.port != 0) {
    taken.push_back({"the scheduler's metrics port", HostOf(c.scheduler_address),
                     c.MetricsPort(v1::ROLE_SCHEDULER, 0)});
  }
  for (v1::Role role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    const std::vector<std::string>& list = role == v1::ROLE_SERVER ? c.servers : c.workers;
    for (uint32_t r = 0; r < list.size(); ++r) {
      const std::string node = fmt::format("{} {}", bitpush::node::RoleName(role), r);
      const uint64_t port = PortOf(list[r]);
      if (port == 0) continue;  // not tcp: TransportRule names it
      const uint64_t data_port = port + c.ucx.port_offset;
      if (data_port > 65535) {
        return fmt::format(
            "{}'s data port {} (its port {} + cluster.ucx.port_offset {}) is above 65535; lower "
            "cluster.ucx.port_offset or the node's port",
            node, data_port, port, c.ucx.port_offset);
      }
      data.push_back({fmt::format("{}'s data port {} (its port {} + cluster.ucx.port_offset {})",
                                  node, data_port, port, c.ucx.port_offset),
                      HostOf(list[r]), data_port});
      taken.push_back({fmt::format("{} at {}", node, list[r]), HostOf(list[r]), port});
      if (c.metrics.port != 0) {
        taken.push_back(
            {fmt::format("{}'s metrics port", node), HostOf(list[r]), c.MetricsPort(role, r)});
      }
    }
  }
  for (const Port& d : data) {
    for (const Port& t : taken) {
      // A node's own control port is never its data port (the offset is at least 1).
      if (t.port == d.port && t.host == d.host) {
        return fmt::format(
            "{} collides with {} on the same host; pick a cluster.ucx.port_offset that keeps "
            "the data ports apart from the cluster's ports",
            d.what, t.what);
      }
    }
  }
  return "";
}

}  // namespace bitpush::config
