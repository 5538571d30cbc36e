// ClusterConfig: the `cluster:`, `compression:`, `server:` and `worker:` sections of a cluster
// YAML (docs/config.md), parsed and validated once, with addresses normalised to transport URLs.
//
// Every process of a cluster reads the same YAML: the scheduler to know whom to expect, each
// server and worker to find its own listen address (the entry at its rank), the scheduler's
// address, the cluster token and the settings it must agree on (ConfigFields()). Errors name
// the file, the line and the key ("cluster.yaml:7: cluster.heartbeat_timeout_ms: ...").
//
// Each knob (its YAML key, type, bounds, flag, environment variable and doc line) is declared
// once, in the knob table (config/cluster_knobs.h); the parser, ValidateClusterConfig,
// DescribeClusterConfig, the daemons' command lines and the tables of docs/config.md come from
// it. A knob's default is the initial value of its field below.
//
// Part of bitpush_config (config/), which the scheduler, the servers and the workers each link.
// Thread-safety: plain values and pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/node/identity.h"
#include "common/status.h"
#include "proto/bitpush/v1/control.pb.h"

namespace bitpush::config {

// server.numa / worker.numa: whether threads are pinned to cores (common/cpu_topology.h).
// kAuto pins when the topology can be read and warns otherwise; kOn fails start-up then; kOff
// pins nothing.
enum class NumaMode { kAuto, kOn, kOff };
// "auto", "on", "off" (the YAML spelling).
std::string_view NumaModeName(NumaMode mode);

// security.mode: how nodes prove who they are on the wire (docs/security.md). kNone: they do
// not (trusted networks, benchmarks); kCurve: ZeroMQ CURVE with one key pair per node.
enum class SecurityMode { kNone, kCurve };
// "none", "curve" (the YAML spelling).
std::string_view SecurityModeName(SecurityMode mode);

// The comments below say what a field holds in code; each key's type, bounds and doc line are
// in the knob table (config/cluster_knobs.cc), which checks them.

// The `compression:` section. Every field takes part in config agreement (ConfigFields()).
struct CompressionSettings {
  // compression.spec: compressor spec string (compressors/registry.h), stored canonical
  // (CompressorSpecString), e.g. "onebit:scaled=true".
  std::string spec = "none";
  // compression.error_feedback: none | worker | server | both.
  std::string error_feedback = "none";
  // compression.min_compress_bytes: tensors smaller than this (bytes) are sent uncompressed
  // (4 KiB by default: below it compressing saves no measurable time; docs/config.md,
  // "Compression threshold").
  uint64_t min_compress_bytes = 4096;
  // compression.method_minimum: whether a tensor with fewer elements than its method's minimum
  // (compressors::MinimumElements) is sent uncompressed; false compresses it anyway.
  bool method_minimum = true;
  // compression.partition_bytes: a tensor is cut into partitions (keys) of at most this many
  // bytes (BytePS's 4096000 by default).
  uint64_t partition_bytes = 4096000;
  // compression.raw_partition_bytes: the partition size of tensors that travel uncompressed
  // (spec none, or under min_compress_bytes); 0 = auto, from the tensor's size and the cluster's
  // shape (worker/partition.h PartitionBytesFor; docs/flow-control.md). Never above
  // partition_bytes.
  uint64_t raw_partition_bytes = 0;
  // compression.non_finite: "error" (a non-finite gradient fails the round everywhere) or
  // "skip" (bitpush.torch's optimizers skip that step on every worker).
  std::string non_finite = "error";
  // compression.overrides: per-tensor specs by name pattern (fnmatch: `*`, `?`, `[...]`), in
  // order; the first pattern matching a tensor's name gives its spec (canonical) when the
  // tensor is declared without one of its own. Part of config agreement when non-empty.
  struct Override {
    std::string pattern;
    std::string spec;
  };
  std::vector<Override> overrides;

  // The spec a tensor named `name` gets when declared without one: the first matching
  // override's, else `spec`.
  const std::string& SpecForTensor(const std::string& name) const;
};

// The `optimizer:` section: where the optimizer runs (docs/optimizer.md "Server-side
// optimizer"). Every field takes part in config agreement when the placement is not the
// default (ConfigFields()). The rule and its hyper-parameters come from the training code
// (bitpush.torch's optimizer, or worker::ServerOptimizerOptions).
struct OptimizerSettings {
  // optimizer.placement: "worker" (every worker updates its own copy; the default) or
  // "server" (servers hold the fp32 master weights and the optimizer state, workers push
  // gradients and pull weights).
  std::string placement = "worker";
  // optimizer.pull: how weights travel back to the workers, a compressor spec (canonical).
  // SDP4Bit's qWD is `sdp4bit:hadamard=off,group=2048`.
  std::string pull = "none";
  // optimizer.pull_form: "auto" (raw weights for `none`, the difference against the workers'
  // copy otherwise), "difference" or "raw" (refused for biased compressors).
  std::string pull_form = "auto";
  // optimizer.overrides: per-tensor placement by name pattern (fnmatch), in order; the first
  // pattern matching a tensor's name gives its placement. Agreed when non-empty.
  struct Override {
    std::string pattern;
    std::string placement;  // "worker" | "server"
  };
  std::vector<Override> overrides;

  bool server() const { return placement == "server"; }
  // The placement of tensor `name`: the first matching override's, else `placement`.
  const std::string& PlacementFor(const std::string& name) const;
  // Whether `pull` travels as the difference against the workers' copy under pull_form.
  bool PullDifference() const;
};

// The `server:` section: how each bitpush-server runs its engine. Local tuning: not part of
// config agreement (servers on different machines may differ).
struct ServerSettings {
  // server.engine_threads: threads that aggregate and compress (each key sticks to one).
  // 0 = auto: the CPUs this process may use minus one for the I/O thread, at least 1, at
  // most 8.
  uint32_t engine_threads = 0;
  // server.numa: auto and on pin each engine thread to one core (spread over NUMA nodes,
  // memory bound to the thread's node).
  NumaMode numa = NumaMode::kAuto;
};

// The `worker:` section: how each worker's engine runs. Local tuning, not agreed.
struct WorkerSettings {
  // worker.compress_threads: the (de)compression pool. 0 = auto: the CPUs this process may
  // use, at least 1, at most 8.
  uint32_t compress_threads = 0;
  // worker.reduce_threads: the bitpush-worker daemon's local-reduce threads. 0 = auto:
  // max(1, cores / 4), at most 8 (common/cpu_topology.h DefaultReduceThreads). In the daemon,
  // compress_threads' auto is the cores left after one network core and the reduce threads.
  uint32_t reduce_threads = 0;
  // worker.numa: the bitpush-worker daemon pins its threads to the CPU split of
  // PlanWorkerCpus (network core, reduce cores, compress cores) unless kOff.
  NumaMode numa = NumaMode::kAuto;
  // worker.credit_bytes: uncompressed bytes of partitions in flight (compressing, on the
  // wire, at the server, decompressing) at once; at least one partition always goes.
  uint64_t credit_bytes = 64ull << 20;
  // worker.server_window_bytes: bytes of raw (uncompressed) partitions this worker has in
  // flight at any one server; 0 = auto (kAutoServerWindowBytes, and room for 4 partitions at
  // least: worker/engine/partition_scheduler.cc). Bounds how far a worker runs
  // ahead of the others at a server (docs/flow-control.md).
  uint64_t server_window_bytes = 0;
  static constexpr uint64_t kAutoServerWindowBytes = uint64_t{16} << 20;
  uint64_t ServerWindowBytes() const {
    return server_window_bytes != 0 ? server_window_bytes : kAutoServerWindowBytes;
  }
  // worker.op_timeout_s: a push_pull not complete after this long fails with Timeout naming
  // the partitions and servers it waited for.
  std::chrono::milliseconds op_timeout{300000};
  // worker.local_size: training processes on this node served by its bitpush-worker daemon
  // (worker/daemon.h). 0 = not set: the daemon takes it from the first accepted Hello
  // (--local-size overrides).
  uint32_t local_size = 0;
  // worker.socket: the Unix socket path of the node's bitpush-worker daemon; `{rank}` in it
  // becomes the node's rank (SocketFor), needed when one host runs several worker nodes. "" = the
  // default DefaultDaemonSocketPath(rank) (worker/daemon_client.h: worker-<rank>.sock in the
  // user's private socket directory); --socket overrides. At most 107 bytes after expansion
  // (sun_path).
  std::string socket;

  // `socket` with every "{rank}" replaced by `rank`; "" when socket is not set.
  std::string SocketFor(uint32_t rank) const;
};

// The `metrics:` section: Prometheus text over HTTP from every process of the cluster
// (docs/metrics.md). Local: not part of config agreement.
struct MetricsSettings {
  // metrics.port: the scheduler's metrics port; server r listens at port + 1 + r and worker
  // node n at port + 1 + (number of servers) + n, each on its own host. 0 = off (no thread, no
  // socket).
  uint32_t port = 0;
  // metrics.bind_address: the IPv4 or IPv6 literal every metrics listener binds.
  std::string bind_address = "127.0.0.1";
};

// The `trace:` section: the timeline's span files (docs/observability.md). Local: each
// process's own; off by default.
struct TraceSettings {
  // trace.dir: where every traced component writes its span file; "" = off (no thread, no
  // file, no cost). `bitpush launch --timeline DIR` sets it for every process it starts.
  std::string dir;
  // trace.steps: the rounds traced: "all", "A-B" or "every N" (common/trace/step_filter.h).
  std::string steps = "all";
  // trace.buffer_spans: each component's ring of spans waiting to be written.
  uint32_t buffer_spans = 65536;
};

// The `launch:` section: read by `bitpush launch` only (python/bitpush/launch.py); the
// daemons parse it and ignore it.
struct LaunchSettings {
  // launch.max_restarts: how many times `bitpush launch` starts the job again after one of its
  // processes died (docs/launch.md, "Restarts"); 0 = never.
  uint32_t max_restarts = 0;
};

// The `security:` section (docs/security.md). Local: each node reads its own key; a node whose
// mode differs from its peers' fails their security handshake, naming the mode.
struct SecuritySettings {
  // security.mode.
  SecurityMode mode = SecurityMode::kNone;
  // security.keys_dir: the directory `bitpush keygen` writes (one key file per node and
  // `public_keys`); a relative path in a file is relative to the file's directory. "" = none.
  std::string keys_dir;
  // security.key_file: this node's key file. "" = $BITPUSH_KEY_FILE, else
  // $CREDENTIALS_DIRECTORY/bitpush.key when systemd passes one, else keys_dir/<node>.key.
  std::string key_file;
  // security.public_keys: the cluster's public keys. "" = keys_dir/public_keys.
  std::string public_keys;
};

// `cluster.ucx:` the data plane of `cluster.transport: ucx` (docs/transport-ucx.md). Each server
// and worker listens for worker <-> server messages at ucx://<its host>:<its port + port_offset>;
// tls and net_devices go to UCX as its TLS and NET_DEVICES settings (TransportOptions::ucx_config),
// over what the UCX_* environment says. Local: not part of config agreement. Unused with the
// other transports.
struct UcxSettings {
  // cluster.ucx.port_offset: a node's data port is its control port plus this.
  uint32_t port_offset = 1000;
  // cluster.ucx.tls: UCX's transports ("tcp", "sm,self,tcp", ...). "" = UCX's choice /
  // UCX_TLS.
  std::string tls;
  // cluster.ucx.net_devices: UCX's network devices ("eth0", "mlx5_0:1"). "" = UCX's choice /
  // UCX_NET_DEVICES.
  std::string net_devices;
};

// One worker node (machine) of `cluster.workers`: what the launcher and the node's
// bitpush-worker daemon need beyond its address. Written in the host form of the YAML
// (`{host: gpu0, processes: 8, gpus: 8}`); the address form leaves both unset.
struct WorkerNode {
  // Training processes on this node. 0 = not set: worker.local_size, else the daemon's first
  // Hello (ClusterConfig::ProcessesOnNode).
  uint32_t processes = 0;
  // CUDA device indices of the node's training processes, one per process in local-rank order
  // (local rank r uses gpus[r]). Empty = CPU processes. Distinct; when set, processes equals
  // its length.
  std::vector<uint32_t> gpus;
};

// The `cluster:` section plus the compression settings: everything the control plane needs.
struct ClusterConfig {
  // Where the config came from (a file path, or a name given to ParseClusterConfig); used in
  // messages only.
  std::string source;
  // cluster.scheduler: the scheduler's listen address as a transport URL (tcp://HOST:PORT,
  // ipc://PATH or inproc://NAME). Required.
  std::string scheduler_address;
  // cluster.transport: transport backend, "zmq" (default), "ucx" (the control plane on zmq at
  // the YAML addresses, the data plane on UCX at DataAddress()) or "inproc" (in-process
  // clusters).
  std::string transport = "zmq";
  // cluster.token / cluster.token_file: shared secret every node must present. Empty = none.
  // Never printed.
  std::string token;
  // cluster.servers / cluster.workers: listen addresses (normalised URLs); rank = index.
  // At least one of each.
  // The YAML also takes hosts with counts (`{host: ps0, count: 2, port: 9100}` or
  // `{hosts: [ps0, ps1], count: 2}`, docs/config.md), expanded here in order: entry by entry,
  // and within an entry port by port.
  std::vector<std::string> servers;
  std::vector<std::string> workers;
  // Per worker node (same index as `workers`), from the host form; shorter than `workers`
  // (e.g. empty in configs built in code) means the remaining nodes set nothing.
  std::vector<WorkerNode> worker_nodes;
  // cluster.heartbeat_interval_ms: how often the scheduler and each node send heartbeats.
  std::chrono::milliseconds heartbeat_interval{1000};
  // cluster.heartbeat_timeout_ms: silence after which a peer is declared dead (at least
  // 2 x heartbeat_interval).
  std::chrono::milliseconds heartbeat_timeout{5000};
  // cluster.startup_timeout_s: how long the scheduler waits for every node to register, and
  // how long a node retries an unanswering scheduler (the YAML accepts fractions: 0.5).
  std::chrono::milliseconds startup_timeout{60000};
  // cluster.server_rejoin_timeout_s: 0 = off (a dead server ends the job); otherwise how long
  // the scheduler waits for a dead server to register again, the job rolling back to its
  // checkpoint meanwhile (NodeFailed.rejoin_deadline_ms, NodeRejoined).
  std::chrono::milliseconds server_rejoin_timeout{0};
  // cluster.ucx (transport ucx only).
  UcxSettings ucx;
  // The `compression:` section.
  CompressionSettings compression;
  // The `optimizer:` section.
  OptimizerSettings optimizer;
  // The `server:` and `worker:` sections (local tuning).
  ServerSettings server;
  WorkerSettings worker;
  // The `metrics:` section.
  MetricsSettings metrics;
  // The `security:` section.
  SecuritySettings security;
  // The `trace:` section.
  TraceSettings trace;
  // The `launch:` section.
  LaunchSettings launch;

  // Number of nodes the scheduler waits for.
  size_t num_nodes() const { return servers.size() + workers.size(); }
  // Training processes on worker node `rank`: its `processes`, else worker.local_size; 0 when
  // neither is set (the daemon then takes the first Hello's count).
  uint32_t ProcessesOnNode(uint32_t rank) const;
  // The GPUs of worker node `rank` (empty: CPU processes or not set).
  const std::vector<uint32_t>& GpusOnNode(uint32_t rank) const;
  // Training processes of the whole cluster when every node's count is known, else 0.
  uint64_t TotalProcesses() const;
  // True when every node's count is known and they are not all equal. Averages then weight
  // each process equally (bitpush-worker scales its node's sum by workers/TotalProcesses()),
  // which needs a daemon on every node; the counts join config agreement
  // (cluster.training_processes).
  bool ProcessCountsDiffer() const;
  // The listen address of (role, rank); "" if there is no such entry.
  std::string NodeAddress(v1::Role role, uint32_t rank) const;
  // The data-plane address of server or worker (role, rank) under transport ucx:
  // ucx://HOST:(its port + ucx.port_offset) on the host of NodeAddress(role, rank). "" for
  // other transports, the scheduler, a rank not in the cluster, an address without a port
  // (ipc://) or a data port above 65535 (ValidateClusterConfig refuses the last two).
  std::string DataAddress(v1::Role role, uint32_t rank) const;
  // The backend of the control plane (the YAML addresses): zmq under transport ucx, else
  // `transport`.
  std::string ControlBackend() const;
  // The metrics port of (role, rank) by the rule of MetricsSettings::port (ROLE_SCHEDULER
  // ignores the rank); 0 when metrics are off.
  uint32_t MetricsPort(v1::Role role, uint32_t rank) const;
};

// Reads and parses the file at `path`. Errors are InvalidArgument "PATH:LINE: KEY: problem"
// (NotFound if the file cannot be read).
StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path);

// Parses YAML text; `source` names it in messages (and is the directory base for a relative
// cluster.token_file: relative paths resolve against dirname(source)). The token file is read
// with ReadSecretFile (common/secret_file.h): one its group or others may access is refused.
StatusOr<ClusterConfig> ParseClusterConfig(std::string_view yaml_text, const std::string& source);

// Checks the invariants of a config built in code (the harness and tests build them without
// YAML): the same rules the parser applies, with messages naming the field.
Status ValidateClusterConfig(const ClusterConfig& config);

// "host:port" -> "tcp://host:port"; URLs with a scheme are checked and kept. With the inproc
// backend a bare NAME becomes inproc://NAME. InvalidArgument naming the problem otherwise.
StatusOr<std::string> NormalizeAddress(std::string_view address, std::string_view backend);

// The settings every node must share with the scheduler, as (name, canonical value) in a
// fixed order: compression.spec, compression.error_feedback, compression.min_compress_bytes,
// compression.partition_bytes, then only when set: compression.raw_partition_bytes,
// compression.non_finite, compression.method_minimum (false), compression.overrides,
// cluster.training_processes (when ProcessCountsDiffer()).
std::vector<v1::ConfigField> ConfigFields(const ClusterConfig& config);

// FNV-1a (64 bit) over "name=value\n" for each field, in order.
uint64_t ConfigHash(const std::vector<v1::ConfigField>& fields);

// Compares a node's fields ("here") with the scheduler's (the reference). Returns "" when
// they agree, else "config differs from the scheduler's: compression.spec is 'x' here but
// 'y' on the scheduler; ..." naming every differing, missing or unknown field.
std::string DescribeConfigDifference(const std::vector<v1::ConfigField>& here,
                                     const std::vector<v1::ConfigField>& scheduler);

// The effective config as YAML-like text for the start-up log (the token shows as "<set>").
std::string DescribeClusterConfig(const ClusterConfig& config);

// "workers", "servers", "all" ("unknown" otherwise).
std::string_view GroupName(v1::Group group);
// "server" -> ROLE_SERVER, "worker" -> ROLE_WORKER; InvalidArgument otherwise.
StatusOr<v1::Role> ParseNodeRole(std::string_view name);
// A node's name on the wire (RoleName, NodePeerId, kSchedulerPeerId) is common/node/identity.h.

}  // namespace bitpush::config
