#include "config/node_security.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <vector>

#include "common/config/knob.h"
#include "common/node/identity.h"
#include "common/security/keys.h"
#include "fmt/format.h"

namespace bitpush::config {
namespace {

// The host of a tcp:// address ("" for other schemes).
std::string HostOf(const std::string& address) {
  if (address.rfind("tcp://", 0) != 0) return "";
  std::string rest = address.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) rest.resize(colon);
  if (!rest.empty() && rest.front() == '[' && rest.back() == ']')
    rest = rest.substr(1, rest.size() - 2);
  return rest;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

std::vector<std::string> ClusterNodeNames(const ClusterConfig& c) {
  std::vector<std::string> names = {node::kSchedulerPeerId};
  for (uint32_t r = 0; r < c.servers.size(); ++r)
    names.push_back(node::NodePeerId(v1::ROLE_SERVER, r));
  for (uint32_t r = 0; r < c.workers.size(); ++r)
    names.push_back(node::NodePeerId(v1::ROLE_WORKER, r));
  return names;
}

std::string KeysDir(const ClusterConfig& c) {
  if (const char* env = std::getenv("BITPUSH_KEYS_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return c.security.keys_dir;
}

std::string NodeKeyFile(const ClusterConfig& c, const std::string& node) {
  if (const char* env = std::getenv("BITPUSH_KEY_FILE"); env != nullptr && *env != '\0') {
    return env;
  }
  if (!c.security.key_file.empty()) return c.security.key_file;
  if (const char* creds = std::getenv("CREDENTIALS_DIRECTORY"); creds != nullptr && *creds) {
    std::string path = std::string(creds) + "/bitpush.key";
    if (access(path.c_str(), F_OK) == 0) return path;
  }
  if (const std::string dir = KeysDir(c); !dir.empty()) {
    return dir + "/" + security::KeyFileName(node);
  }
  return "";
}

std::string PublicKeysFile(const ClusterConfig& c) {
  if (!c.security.public_keys.empty()) return c.security.public_keys;
  if (const std::string dir = KeysDir(c); !dir.empty()) {
    return dir + "/" + security::kPublicKeysFileName;
  }
  return "";
}

StatusOr<transport::TransportSecurity> NodeTransportSecurity(const ClusterConfig& c,
                                                             const std::string& node) {
  transport::TransportSecurity sec;
  if (c.security.mode == SecurityMode::kNone || c.transport == "inproc") return sec;
  sec.mode = transport::TransportSecurity::Mode::kCurve;
  const std::string key_file = NodeKeyFile(c, node);
  const std::string list_file = PublicKeysFile(c);
  if (key_file.empty() || list_file.empty()) {
    return InvalidArgumentError(fmt::format(
        "security.mode is curve but {} has no {}: set security.keys_dir (the directory `bitpush "
        "keygen --config FILE` writes), or security.key_file and security.public_keys",
        node, key_file.empty() ? "key file" : "public key list"));
  }
  BP_ASSIGN_OR_RETURN(security::CurveKeyPair pair, security::ReadNodeKeyFile(key_file, node));
  BP_ASSIGN_OR_RETURN(auto keys, security::ReadPublicKeys(list_file));
  const std::vector<std::string> names = ClusterNodeNames(c);
  const std::set<std::string> known(names.begin(), names.end());
  std::vector<std::string> missing, foreign;
  for (const std::string& n : names) {
    if (keys.count(n) == 0) missing.push_back(n);
  }
  for (const auto& [n, key] : keys) {
    if (known.count(n) == 0) foreign.push_back(n);
  }
  if (!missing.empty()) {
    return InvalidArgumentError(fmt::format(
        "public key list {} has no key for {} (rerun `bitpush keygen` for this cluster and hand "
        "out the new public_keys)",
        list_file, config::JoinAnd(missing)));
  }
  if (!foreign.empty()) {
    return InvalidArgumentError(
        fmt::format("public key list {} lists {}, which {} no node of this cluster", list_file,
                    config::JoinAnd(foreign), foreign.size() == 1 ? "is" : "are"));
  }
  if (keys[node] != pair.public_key) {
    return InvalidArgumentError(fmt::format(
        "key file {} is not the key that {} lists for {} (a key regenerated without handing "
        "out the new public_keys?)",
        key_file, list_file, node));
  }
  sec.public_key = pair.public_key;
  sec.secret_key = pair.secret_key;
  sec.peer_keys = std::map<transport::PeerId, std::string>(keys.begin(), keys.end());
  return sec;
}

uint64_t LargestLegalMessage(const ClusterConfig& c) {
  const uint64_t pb = c.compression.partition_bytes;
  const uint64_t four = pb > (UINT64_MAX - (1u << 20)) / 4 ? UINT64_MAX : 4 * pb + (1u << 20);
  return std::max<uint64_t>(four, uint64_t{64} << 20);
}

size_t MaxNodeConnections(const ClusterConfig& c) {
  return 4 * (c.num_nodes() + 1) + 32;
}

Status ConfigureNodeEndpoint(const ClusterConfig& c, node::NodeEndpointOptions* options) {
  const node::NodeIdentity& self = options->self;
  const std::string name = self.role == v1::ROLE_SCHEDULER ? std::string(node::kSchedulerPeerId)
                                                           : node::NodePeerId(self.role, self.rank);
  BP_ASSIGN_OR_RETURN(options->security, NodeTransportSecurity(c, name));
  options->max_message_bytes = LargestLegalMessage(c);
  options->max_connections = MaxNodeConnections(c);
  options->backend = c.ControlBackend();
  options->data_listen_address.clear();
  options->data_ucx_config.clear();
  if (c.transport == "ucx" && self.role != v1::ROLE_SCHEDULER) {
    options->data_listen_address = c.DataAddress(self.role, self.rank);
    if (options->data_listen_address.empty()) {
      return InvalidArgumentError(fmt::format(
          "{} has no data address under cluster.transport ucx (its address {} needs to be "
          "tcp://HOST:PORT with PORT + cluster.ucx.port_offset {} at most 65535)",
          name, c.NodeAddress(self.role, self.rank), c.ucx.port_offset));
    }
    if (!c.ucx.tls.empty()) options->data_ucx_config["TLS"] = c.ucx.tls;
    if (!c.ucx.net_devices.empty()) options->data_ucx_config["NET_DEVICES"] = c.ucx.net_devices;
  }
  return Status::Ok();
}

std::string InsecureModeWarning(const ClusterConfig& c) {
  if (c.security.mode != SecurityMode::kNone || c.transport == "inproc") return "";
  std::vector<std::string> addresses = {c.scheduler_address};
  addresses.insert(addresses.end(), c.servers.begin(), c.servers.end());
  addresses.insert(addresses.end(), c.workers.begin(), c.workers.end());
  for (const std::string& a : addresses) {
    const std::string host = HostOf(a);
    if (!host.empty() && !IsLoopbackHost(host)) {
      return fmt::format(
          "security.mode is none and {} is not a loopback address: anyone who reaches the "
          "cluster's ports can act as any node (stop the job, read or forge gradients). Use "
          "security.mode: curve (docs/security.md) unless the network is trusted",
          a);
    }
  }
  return "";
}

}  // namespace bitpush::config
