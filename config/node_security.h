// What a node's transports take from the cluster config (docs/security.md): its security
// (security.mode, its key pair, the cluster's public keys, each bound to one node) and the
// bounds on what any peer can make it hold (the largest legal message, the connections at
// once). The scheduler, each server and each worker engine build their endpoint with
// ConfigureNodeEndpoint, so the rules live here once.
//
// Pure functions over the config and the key files; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/node/endpoint.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "config/cluster_config.h"

namespace bitpush::config {

// security.keys_dir, overridden by $BITPUSH_KEYS_DIR ("" when neither is set).
std::string KeysDir(const ClusterConfig& c);
// The names of the cluster's nodes: "scheduler", "server:0".., "worker:0"...
std::vector<std::string> ClusterNodeNames(const ClusterConfig& c);
// The path of `node`'s key file: security.key_file (or $BITPUSH_KEY_FILE, which overrides it),
// else $CREDENTIALS_DIRECTORY/bitpush.key when systemd passed credentials and that file
// exists, else keys_dir/<KeyFileName(node)>. "" when none is configured.
std::string NodeKeyFile(const ClusterConfig& c, const std::string& node);
// security.public_keys, else keys_dir/public_keys ("" when neither is set).
std::string PublicKeysFile(const ClusterConfig& c);

// The transport security of `node` ("scheduler", "server:0", "worker:1"). Under kCurve: reads
// and checks its key file and the public keys; the list must name every node of the cluster
// and nothing else, and list this node's public key. Errors name the file and the fix.
StatusOr<transport::TransportSecurity> NodeTransportSecurity(const ClusterConfig& c,
                                                             const std::string& node);

// The largest message part a node accepts: four partitions (a partition of 16-bit values
// becomes twice its bytes as an fp32 residual, and at most twice again as index/value pairs)
// plus 1 MiB of headers, and never less than 64 MiB (control messages, declarations of large
// models).
uint64_t LargestLegalMessage(const ClusterConfig& c);
// Connections a node accepts at once: four per node of the cluster (under curve a CURVE
// connection and a sealed lane, and a reconnecting node may briefly hold an old and a new
// pair) plus 32.
size_t MaxNodeConnections(const ClusterConfig& c);

// Sets options->security, max_message_bytes and max_connections for the node options->self,
// the backend of its main (control-plane) transport (ClusterConfig::ControlBackend), and under
// cluster.transport ucx a server's or worker's data transport: data_listen_address
// (ClusterConfig::DataAddress) and data_ucx_config (cluster.ucx.tls / net_devices as TLS /
// NET_DEVICES).
Status ConfigureNodeEndpoint(const ClusterConfig& c, node::NodeEndpointOptions* options);

// The scheduler's warning for security.mode none when an address of the cluster is not
// loopback ("" otherwise).
std::string InsecureModeWarning(const ClusterConfig& c);

}  // namespace bitpush::config
