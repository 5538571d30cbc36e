#include "config/cluster_knobs.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "common/trace/step_filter.h"
#include "compressors/spec_registry.h"
#include "config/knob_rules.h"
#include "fmt/format.h"

namespace bitpush::config {

namespace {

using config::Knob;
using config::KnobSpec;
using config::KnobValue;

// A partition is one transport message (its uncompressed bytes for `none`); the zmq transport
// refuses message parts above 4 GiB, and a bigger partition only delays the pipeline.
constexpr uint64_t kMaxPartitionBytes = uint64_t{1} << 30;
// Byte counts no machine holds in memory: a value above is a typo (a missing unit, 1e15).
constexpr uint64_t kMaxMemoryBytes = uint64_t{1} << 40;

// ---- binding a knob to its field ----

KnobValue ToValue(bool v) {
  return KnobValue::Number(v ? 1 : 0);
}
KnobValue ToValue(uint32_t v) {
  return KnobValue::Number(v);
}
KnobValue ToValue(uint64_t v) {
  return KnobValue::Number(v);
}
KnobValue ToValue(std::chrono::milliseconds v) {
  return KnobValue::Number(static_cast<uint64_t>(std::max<int64_t>(0, v.count())));
}
KnobValue ToValue(const std::string& v) {
  return KnobValue::Text(v);
}
KnobValue ToValue(NumaMode v) {
  return KnobValue::Text(std::string(NumaModeName(v)));
}
KnobValue ToValue(SecurityMode v) {
  return KnobValue::Text(std::string(SecurityModeName(v)));
}

// The values come from ParseKnobValue, so they are inside the knob's bounds.
void FromValue(const KnobValue& v, bool* f) {
  *f = v.number != 0;
}
void FromValue(const KnobValue& v, uint32_t* f) {
  *f = static_cast<uint32_t>(v.number);
}
void FromValue(const KnobValue& v, uint64_t* f) {
  *f = v.number;
}
void FromValue(const KnobValue& v, std::chrono::milliseconds* f) {
  *f = std::chrono::milliseconds(static_cast<int64_t>(std::min<uint64_t>(v.number, INT64_MAX)));
}
void FromValue(const KnobValue& v, std::string* f) {
  *f = v.text;
}
void FromValue(const KnobValue& v, SecurityMode* f) {
  *f =
      v.text == SecurityModeName(SecurityMode::kCurve) ? SecurityMode::kCurve : SecurityMode::kNone;
}
void FromValue(const KnobValue& v, NumaMode* f) {
  for (NumaMode m : {NumaMode::kAuto, NumaMode::kOn, NumaMode::kOff}) {
    if (NumaModeName(m) == v.text) *f = m;
  }
}

struct Binding {
  KnobValue (*get)(const ClusterConfig&);
  void (*set)(ClusterConfig*, const KnobValue&);
};

// A field of ClusterConfig itself (cluster: keys).
template <auto kField>
Binding Top() {
  return {[](const ClusterConfig& c) { return ToValue(c.*kField); },
          [](ClusterConfig* c, const KnobValue& v) { FromValue(v, &(c->*kField)); }};
}

// A field of one of ClusterConfig's section structs.
template <auto kSection, auto kField>
Binding In() {
  return {[](const ClusterConfig& c) { return ToValue((c.*kSection).*kField); },
          [](ClusterConfig* c, const KnobValue& v) { FromValue(v, &((c->*kSection).*kField)); }};
}

ClusterKnob Scalar(KnobSpec spec, Binding b, std::string (*rule)(const ClusterConfig&) = nullptr) {
  return ClusterKnob{std::move(spec), b.get, b.set, rule};
}

ClusterKnob Structured(KnobSpec spec) {
  return ClusterKnob{std::move(spec), nullptr, nullptr};
}

// ---- custom value types ----

StatusOr<std::string> CanonicalCompressorSpec(std::string_view text) {
  BP_ASSIGN_OR_RETURN(v1::CompressorConfig config, compressors::ParseCompressorSpec(text));
  return compressors::CompressorSpecString(config);
}

StatusOr<std::string> CanonicalErrorFeedback(std::string_view text) {
  BP_ASSIGN_OR_RETURN(v1::ErrorFeedbackPolicy policy, compressors::ParseErrorFeedbackPolicy(text));
  return std::string(compressors::ErrorFeedbackPolicyName(policy));
}

StatusOr<std::string> CanonicalBindAddress(std::string_view text) {
  const std::string t(text);
  in6_addr v6{};
  in_addr v4{};
  if (inet_pton(AF_INET, t.c_str(), &v4) == 1 || inet_pton(AF_INET6, t.c_str(), &v6) == 1) {
    return t;
  }
  return InvalidArgumentError(
      fmt::format("expected an IPv4 or IPv6 address (127.0.0.1, 0.0.0.0, ::1, ::), got '{}'", t));
}

StatusOr<std::string> CanonicalTraceSteps(std::string_view text) {
  BP_ASSIGN_OR_RETURN(trace::StepFilter f, trace::StepFilter::Parse(text));
  return f.ToString();
}

// ---- the keys of list entries ----

std::vector<KnobSpec> HostEntrySpecs(bool servers) {
  std::vector<KnobSpec> keys = {
      Knob("host")
          .Structured("host name or IP")
          .Optional("", "—")
          .Doc("The machine. Exactly one of `host` and `hosts`. An IPv6 literal is written bare "
               "(`\"::1\"`) and bracketed in the address."),
      Knob("hosts")
          .Structured("list of hosts")
          .Optional("", "—")
          .Doc("The same entry on each of these machines, in order."),
      Knob("count")
          .Integer(1, 1024, "")
          .Default("1")
          .Doc("Servers (or worker nodes) on each host, at consecutive ports. Several worker nodes "
               "on one host make sense for testing (`local.yaml`); on real machines a node is a "
               "machine."),
      Knob("port")
          .Integer(1, 65535, "")
          .Optional("", "the host's next free default")
          .Doc("The first port on each host; the entry's nodes listen at `port`, `port`+1, ... "
               "Without it, a host's server ports are taken from 9100 upwards and its worker "
               "ports from 9200 upwards, continuing after any earlier entry on that host."),
  };
  if (servers) return keys;
  keys.push_back(
      Knob("processes")
          .Integer(1, 1024, "training processes")
          .Optional("", "`len(gpus)`, else `worker.local_size`")
          .Doc("*workers only.* Training processes on each node. More than one: the launcher "
               "starts the node's `bitpush-worker` daemon, which sums them "
               "(docs/local-ipc.md)."));
  keys.push_back(
      Knob("gpus")
          .Structured("integer N, or a list of device indices")
          .Optional("", "none (CPU)")
          .Doc("*workers only.* The CUDA devices of each node's training processes, by local "
               "rank: `gpus: 4` = `[0, 1, 2, 3]`; a list gives the order (`[3, 2, 1, 0]`: local "
               "rank 0 uses device 3). Distinct; one GPU per training process, so `processes`, "
               "when also given, must equal the number of devices. The launcher passes each "
               "process its device (`BITPUSH_GPU`), and `bitpush.torch.init()` makes it torch's "
               "current device."));
  return keys;
}

std::vector<ClusterKnob> BuildTable() {
  std::vector<ClusterKnob> t = {
      // ---- cluster: ----
      Structured(Knob("cluster.scheduler")
                     .Structured("address")
                     .Required()
                     .Doc("Where the scheduler listens; every node connects here.")),
      Scalar(Knob("cluster.transport")
                 .Enum({"zmq", "ucx", "inproc"}, "transport")
                 .Doc("The transport backend. `zmq`: ZeroMQ over TCP (or `ipc://` Unix sockets) "
                      "for everything. `ucx`: the control plane (scheduler ↔ nodes) stays on "
                      "ZeroMQ at the YAML's `tcp://` addresses, and each server and worker also "
                      "listens for the data plane (worker ↔ server) at `ucx://` on its host, at "
                      "its port + `cluster.ucx.port_offset` (UCX: RDMA, shared memory or TCP, "
                      "docs/transport-ucx.md; under `security.mode: curve` the node's keys "
                      "authenticate both planes, and the ucx plane is not encrypted, "
                      "docs/security.md). `inproc` only makes sense for clusters inside one "
                      "process (tests, embedded use); host entries need `zmq` or `ucx`."),
             Top<&ClusterConfig::transport>(), &TransportRule),
      Scalar(Knob("cluster.token")
                 .String(1)
                 .Optional("none")
                 .Secret()
                 .Doc("Shared secret. When the scheduler's YAML sets it, every node must present "
                      "the same token or its registration is refused (\"cluster token "
                      "mismatch\"); a node that presents a token to a scheduler without one is "
                      "refused too. Never printed."),
             Top<&ClusterConfig::token>()),
      Structured(Knob("cluster.token_file")
                     .Structured("path")
                     .Optional("none")
                     .Doc("Reads the token from a file instead (trailing whitespace and newline "
                          "stripped; the file must hold a non-empty token). A relative path is "
                          "relative to the YAML file's directory. Set `token` or `token_file`, "
                          "not both. The file must be its owner's alone: any group or other "
                          "permission bit (mode & 077) is refused, naming the file and its mode "
                          "(`chmod 600 FILE`, owned by the user the node runs as).")),
      Structured(Knob("cluster.servers")
                     .Structured("addresses or hosts")
                     .Required()
                     .EntryKeys(HostEntrySpecs(/*servers=*/true))
                     .Doc("The servers, in rank order (see \"Servers and workers\" below). At "
                          "least one.")),
      Structured(Knob("cluster.workers")
                     .Structured("addresses or hosts")
                     .Required()
                     .EntryKeys(HostEntrySpecs(/*servers=*/false))
                     .Doc("The worker nodes — one per training machine — in rank order, with "
                          "their training processes and GPUs. At least one.")),
      Scalar(Knob("cluster.heartbeat_interval_ms")
                 .Millis(1, 60000)
                 .Doc("How often the scheduler sends a heartbeat to every node and every node to "
                      "the scheduler."),
             Top<&ClusterConfig::heartbeat_interval>()),
      Scalar(Knob("cluster.heartbeat_timeout_ms")
                 .Millis(1, 3600000)
                 .Doc("Silence after which a peer is declared dead (the scheduler about a node, "
                      "a node about the scheduler). At least 2 × `heartbeat_interval_ms`."),
             Top<&ClusterConfig::heartbeat_timeout>(), &HeartbeatTimeoutRule),
      Scalar(Knob("cluster.startup_timeout_s")
                 .Seconds(86400)
                 .Doc("How long the scheduler waits for every node to register (then it exits "
                      "naming each missing node), and how long a node keeps retrying a "
                      "scheduler that does not answer."),
             Top<&ClusterConfig::startup_timeout>()),
      Scalar(Knob("cluster.server_rejoin_timeout_s")
                 .Seconds(86400)
                 .Optional("off", "off")
                 .Doc("A server that dies does not end the job: the scheduler waits this long "
                      "for it to register again (a restarted process), every node drops the "
                      "job's data-plane state, and the workers' push_pulls fail with "
                      "Unavailable until it is back; then the job resumes from its last "
                      "checkpoint (docs/training.md, \"A server restarted alone\"). Off: a dead "
                      "server ends the job."),
             Top<&ClusterConfig::server_rejoin_timeout>()),
      Scalar(Knob("cluster.ucx.port_offset")
                 .Integer(1, 65534, "")
                 .Doc("`transport: ucx`: each server and worker listens for the data plane at "
                      "`ucx://<its host>:<its port + port_offset>`. Every data port must be ≤ "
                      "65535 and no other node's port (control, data or metrics) on the same "
                      "host; the error names both nodes."),
             In<&ClusterConfig::ucx, &UcxSettings::port_offset>(), &DataPortRule),
      Scalar(Knob("cluster.ucx.tls")
                 .String(1)
                 .Optional("default", "UCX's choice (`UCX_TLS`)")
                 .Doc("`transport: ucx`: the UCX transports of the data plane, as `UCX_TLS` "
                      "spells them: `tcp`, `sm,self,tcp` (shared memory on one host; UCX 1.13 "
                      "needs `tcp` for its connection manager), `rc,ud,sm,self,tcp` "
                      "(InfiniBand). Unset: `UCX_TLS` from the environment, else UCX's choice."),
             In<&ClusterConfig::ucx, &UcxSettings::tls>()),
      Scalar(Knob("cluster.ucx.net_devices")
                 .String(1)
                 .Optional("default", "UCX's choice (`UCX_NET_DEVICES`)")
                 .Doc("`transport: ucx`: the network devices UCX may use, as `UCX_NET_DEVICES` "
                      "spells them (`eth0`, `mlx5_0:1`). Unset: `UCX_NET_DEVICES` from the "
                      "environment, else every device."),
             In<&ClusterConfig::ucx, &UcxSettings::net_devices>()),

      // ---- compression: (every key takes part in config agreement) ----
      Scalar(Knob("compression.spec")
                 .Custom(&CanonicalCompressorSpec, "compressor spec")
                 .Agreed()
                 .Doc("The compressor (`docs/compressors.md`): `none`, `fp16`, `bf16`, "
                      "`onebit[:scaled=...]`, `topk:ratio=R\\|k=K`, `randomk:...`, "
                      "`dithering:...`. Stored canonical (`onebit` → `onebit:scaled=true`), so "
                      "equivalent spellings agree."),
             In<&ClusterConfig::compression, &CompressionSettings::spec>()),
      Scalar(Knob("compression.error_feedback")
                 .Custom(&CanonicalErrorFeedback, "`none` \\| `worker` \\| `server` \\| `both`")
                 .Agreed()
                 .Doc("Where error-feedback residuals are kept (paper 001: `both`). A method "
                      "refuses the policies that do not suit it: `randomk:...,unbiased=true` "
                      "(its residual would grow without bound) and `sdp4bit` take only `none`; "
                      "`separate` `none` or `worker` (its servers only sum projections); "
                      "`binsgdm` `worker` or `both` (its worker state holds the optimizer's "
                      "moments)."),
             In<&ClusterConfig::compression, &CompressionSettings::error_feedback>()),
      Scalar(Knob("compression.min_compress_bytes")
                 .Bytes(0, kMaxMemoryBytes)
                 .Agreed()
                 .Doc("Tensors smaller than this are sent uncompressed (the default is measured: "
                      "\"Compression threshold\" below). A method's own minimum of elements "
                      "applies as well (`method_minimum`)."),
             In<&ClusterConfig::compression, &CompressionSettings::min_compress_bytes>()),
      Scalar(Knob("compression.method_minimum")
                 .Bool()
                 .Agreed()
                 .Doc("`true`: a tensor with fewer elements than its method's minimum (the "
                      "smallest tensor the method compresses within its stated error; "
                      "`docs/compressors.md` \"Smallest tensors\": `separate` 64 × CR, the "
                      "others none) is sent uncompressed, and the `compression:` line names it. "
                      "`false` compresses it anyway. `min_compress_bytes: 0` does not lift "
                      "the minimum."),
             In<&ClusterConfig::compression, &CompressionSettings::method_minimum>()),
      Scalar(Knob("compression.partition_bytes")
                 .Bytes(1, kMaxPartitionBytes)
                 .Agreed()
                 .Doc("Tensors are cut into partitions (keys) of at most this size. At most 1 "
                      "GiB: a partition travels as one transport message. A compressed "
                      "partition is the compression unit (one onebit scale, one top-k): for "
                      "CLAN + onebit on layers wider than 65536 elements, 262144 "
                      "(docs/training.md, \"Wide layers\")."),
             In<&ClusterConfig::compression, &CompressionSettings::partition_bytes>()),
      Scalar(Knob("compression.raw_partition_bytes")
                 .Bytes(1, kMaxPartitionBytes)
                 .Optional("auto", "auto")
                 .Agreed()
                 .Doc("Partition size of tensors that travel uncompressed (spec `none`, or under "
                      "`min_compress_bytes`), at most `partition_bytes`. `auto` cuts a raw "
                      "tensor into tensor bytes / (48 × (W + S)), at least 256 KiB: a server "
                      "replies to a partition once every worker pushed all of it, so smaller "
                      "partitions keep both directions of every link busy (docs/flow-control.md)."),
             In<&ClusterConfig::compression, &CompressionSettings::raw_partition_bytes>()),
      Scalar(Knob("compression.non_finite")
                 .Enum({"error", "skip"})
                 .Agreed()
                 .Doc("What a NaN or inf in a gradient does (docs/errors.md, \"Non-finite "
                      "values\"). `error`: the round fails on every worker with `BitpushError` "
                      "naming the tensor, the worker or server it came from and the round. "
                      "`skip`: bitpush.torch's optimizers check the step's gradients before "
                      "pushing them and, when any worker's has one, every worker skips that "
                      "step's update (nothing pushed, no state changed) and counts it, as loss "
                      "scalers do."),
             In<&ClusterConfig::compression, &CompressionSettings::non_finite>()),
      Structured(
          Knob("compression.overrides")
              .Structured("list of `{pattern, spec}`")
              .Optional("none")
              .Agreed()
              .EntryKeys({Knob("pattern").Structured("name pattern"),
                          Knob("spec").Structured("compressor spec")})
              .Doc("Per-tensor compressor by tensor name: the first `pattern` (shell-style "
                   "`fnmatch`: `*`, `?`, `[...]`) matching a tensor's name gives its `spec` "
                   "(canonicalised like `spec`), when the tensor is declared without a spec of "
                   "its own (an explicit spec — `TensorOptions::compression`, Python's "
                   "`compression=` — wins). Unmatched tensors take `spec`. Errors name the "
                   "entry: `compression.overrides[1].spec: unknown compressor 'twobit'`. "
                   "Example: `overrides: [{pattern: '*.bias', spec: none}, {pattern: 'embed*', "
                   "spec: 'topk:ratio=0.01'}]`.")),

      // ---- optimizer: (agreed when placement is server) ----
      Scalar(Knob("optimizer.placement")
                 .Enum({"worker", "server"})
                 .Agreed()
                 .Doc("Where the optimizer runs. `worker`: every worker updates its own copy of "
                      "the weights with the averaged gradients. `server`: the servers hold the "
                      "fp32 master weights and the optimizer state of their keys and update "
                      "them after each round; workers push gradients and pull weights "
                      "(`bitpush.torch.DistributedOptimizer` switches to "
                      "`bitpush.torch.ServerOptimizer`, docs/optimizer.md)."),
             In<&ClusterConfig::optimizer, &OptimizerSettings::placement>()),
      Scalar(Knob("optimizer.pull")
                 .Custom(&CanonicalCompressorSpec, "compressor spec")
                 .Agreed()
                 .Doc("`placement: server`: how the weights travel back to the workers, a "
                      "compressor spec like `compression.spec`. SDP4Bit's qWD (INT4, G = 2048, "
                      "stochastic rounding once at the server) is "
                      "`sdp4bit:hadamard=off,group=2048`."),
             In<&ClusterConfig::optimizer, &OptimizerSettings::pull>()),
      Scalar(Knob("optimizer.pull_form")
                 .Enum({"auto", "difference", "raw"})
                 .Agreed()
                 .Doc("`placement: server`: `difference` sends C(w − w̃) against the workers' "
                      "copy w̃, which the server mirrors (every replica stays bit-identical; "
                      "any compressor works); `raw` sends C(w), refused for biased compressors "
                      "(SDP4Bit's Counterexample 4.1); `auto` is `raw` for `pull: none`, "
                      "`difference` otherwise."),
             In<&ClusterConfig::optimizer, &OptimizerSettings::pull_form>()),
      Structured(
          Knob("optimizer.overrides")
              .Structured("list of `{pattern, placement}`")
              .Optional("none")
              .Agreed()
              .EntryKeys({Knob("pattern").Structured("name pattern"),
                          Knob("placement").Structured("`worker` \\| `server`")})
              .Doc("Per-tensor placement by parameter name: the first `pattern` (`fnmatch`, as "
                   "in `compression.overrides`) matching a parameter's name gives its "
                   "`placement`; unmatched ones take `placement`. "
                   "`bitpush.torch.DistributedOptimizer` then runs the server-placed parameters' "
                   "rule on the servers and the others' in the worker (a mix: "
                   "docs/optimizer.md). Example: `overrides: [{pattern: '*.bias', placement: "
                   "worker}]`.")),

      // ---- server: (local tuning, not agreed) ----
      Scalar(Knob("server.engine_threads")
                 .AutoCount(256)
                 .Doc("Threads that aggregate and compress; each key sticks to one, placed by "
                      "weighted load (a compressed key weighs 4× its bytes). `auto` = CPUs in "
                      "the process's affinity mask − 1 (the I/O thread), clamped to 1..8."),
             In<&ClusterConfig::server, &ServerSettings::engine_threads>()),
      Scalar(Knob("server.numa")
                 .Enum({"auto", "on", "off"})
                 .Doc("`auto`/`on`: pin each engine thread to its own core (hwloc topology, the "
                      "process's affinity mask honoured, NUMA nodes taken in turn, offset by "
                      "rank × threads so co-located servers use different cores); key buffers "
                      "are first-touched by their pinned thread, so they live on its node. `on` "
                      "fails start-up when the topology cannot be read; `auto` then runs "
                      "unpinned with a warning; `off` pins nothing."),
             In<&ClusterConfig::server, &ServerSettings::numa>()),

      // ---- worker: (local tuning, not agreed) ----
      Scalar(Knob("worker.compress_threads")
                 .AutoCount(256)
                 .Doc("The (de)compression pool. `auto` = CPUs in the process's affinity mask, "
                      "clamped to 1..8; in the `bitpush-worker` daemon, the cores left after the "
                      "network core and the reduce threads, `max(1, C - 1 - reduce_threads)`, "
                      "at most 8."),
             In<&ClusterConfig::worker, &WorkerSettings::compress_threads>()),
      Scalar(Knob("worker.reduce_threads")
                 .AutoCount(256)
                 .Flag("--reduce-threads", "T", "bitpush-worker")
                 .Doc("`bitpush-worker`: threads summing the training processes' tensors "
                      "(`worker/local_reduce.h`). `auto` = `max(1, C / 4)`, at most 8, with C "
                      "the cores in the daemon's affinity mask."),
             In<&ClusterConfig::worker, &WorkerSettings::reduce_threads>()),
      Scalar(Knob("worker.numa")
                 .Enum({"auto", "on", "off"})
                 .Doc("`bitpush-worker`: pin the daemon's threads to its CPU split — one network "
                      "core (I/O, dispatcher, round and completion threads), then one core per "
                      "reduce thread, then one per compression thread, in core order node by "
                      "node (`common/cpu_topology.h`, docs/threading.md). `on` fails start-up "
                      "when the topology cannot be read; `auto` then runs unpinned with a "
                      "warning; `off` pins nothing."),
             In<&ClusterConfig::worker, &WorkerSettings::numa>()),
      Scalar(Knob("worker.credit_bytes")
                 .Bytes(1, kMaxMemoryBytes)
                 .Doc("Uncompressed bytes of partitions in flight at once (compressing, on the "
                      "wire, at the server, decompressing); one partition always goes."),
             In<&ClusterConfig::worker, &WorkerSettings::credit_bytes>()),
      Scalar(Knob("worker.server_window_bytes")
                 .Bytes(1, kMaxMemoryBytes)
                 .Optional("auto", "auto (16 MiB, at least 4 partitions)")
                 .Doc("Bytes of raw (uncompressed) partitions this worker has in flight at any "
                      "one server: a worker that runs ahead of the others at a server waits "
                      "there and sends to the servers where it is behind, so every server "
                      "answers partitions at line rate (docs/flow-control.md). One partition "
                      "per server always goes."),
             In<&ClusterConfig::worker, &WorkerSettings::server_window_bytes>()),
      Scalar(Knob("worker.op_timeout_s")
                 .Seconds(86400)
                 .Doc("A push_pull not complete after this long fails with Timeout naming what "
                      "it waited for."),
             In<&ClusterConfig::worker, &WorkerSettings::op_timeout>()),
      Scalar(Knob("worker.local_size")
                 .Integer(1, 1024, "training processes")
                 .Optional("auto", "unset")
                 .Flag("--local-size", "P", "bitpush-worker", /*sets_knob=*/false)
                 .Doc("Training processes of the worker nodes whose `cluster.workers` entry sets "
                      "no `processes`/`gpus` (the node daemon, `worker/daemon.h`, serves this "
                      "many). Unset: the first accepted Hello decides. `bitpush-worker "
                      "--local-size P` gives one daemon its count, over its node's (refused "
                      "when the nodes' counts differ and P is not the node's)."),
             In<&ClusterConfig::worker, &WorkerSettings::local_size>()),
      Scalar(Knob("worker.socket")
                 .Path(1)
                 .Optional("default",
                           "`worker-<rank>.sock` in the user's private socket directory "
                           "(`$RUNTIME_DIRECTORY`, else `$XDG_RUNTIME_DIR/bitpush`, else "
                           "`/tmp/bitpush-<uid>`; docs/local-ipc.md)")
                 .Flag("--socket", "PATH", "bitpush-worker", /*sets_knob=*/false)
                 .Env("BITPUSH_DAEMON_SOCKET")
                 .Doc("The Unix socket of the node's `bitpush-worker`, where daemon-mode clients "
                      "connect (`ClientOptions::daemon_socket`). `{rank}` is replaced by the "
                      "node's rank, and is required when two worker nodes share a host (they "
                      "would listen at the same path otherwise). At most 107 bytes after "
                      "expansion. `bitpush-worker --socket PATH` (the daemon) and "
                      "`BITPUSH_DAEMON_SOCKET` (a training process) give one process the path "
                      "as is (no `{rank}`)."),
             In<&ClusterConfig::worker, &WorkerSettings::socket>(), &WorkerSocketRule),

      // ---- metrics: (local, not agreed) ----
      Scalar(Knob("metrics.port")
                 .Integer(0, 65535, "")
                 .Optional("off", "`0` (off)")
                 .Doc("Prometheus metrics over HTTP (`GET /metrics`, docs/metrics.md). The "
                      "scheduler listens at `port`, server r at `port` + 1 + r, worker node n "
                      "at `port` + 1 + (number of servers) + n, each on its own host (the "
                      "`bitpush-worker` daemon, or the training process when the node runs "
                      "without one). `0`: no metrics (no thread, no socket). Every one of those "
                      "ports must be ≤ 65535 and none a cluster address's port on the same "
                      "host; pick them below 32768, as the cluster's."),
             In<&ClusterConfig::metrics, &MetricsSettings::port>(), &MetricsPortRule),
      Scalar(Knob("metrics.bind_address")
                 .Custom(&CanonicalBindAddress, "IPv4 or IPv6 address")
                 .Doc("The address the metrics listeners bind on every host: `127.0.0.1` "
                      "(this machine only), `0.0.0.0` or `::` (every interface, for a "
                      "Prometheus server elsewhere; the metrics carry no secret, but anyone who "
                      "reaches the port can read them)."),
             In<&ClusterConfig::metrics, &MetricsSettings::bind_address>()),

      // ---- security: (local; docs/security.md) ----
      Scalar(Knob("security.mode")
                 .Enum({"none", "curve"})
                 .Doc("`curve`: every connection is authenticated with ZeroMQ CURVE, one key "
                      "pair per node (`bitpush keygen`), and every message is encrypted "
                      "(AES-256-GCM lanes keyed through CURVE); a node is admitted only "
                      "with a key `public_keys` lists, and a message counts as sent by the node "
                      "that key belongs to. `none`: no proof of identity, for trusted networks "
                      "and benchmarks (the scheduler warns once when an address is not "
                      "loopback). Every node of a cluster needs the same mode."),
             In<&ClusterConfig::security, &SecuritySettings::mode>()),
      Scalar(Knob("security.keys_dir")
                 .Path(1)
                 .Optional("none")
                 .Env("BITPUSH_KEYS_DIR")
                 .Doc("The directory `bitpush keygen` writes: one key file per node "
                      "(`scheduler.key`, `server-0.key`, `worker-0.key`, mode 0600) and "
                      "`public_keys`. A relative path is relative to the YAML file's "
                      "directory. A node needs its own key file and `public_keys` only. "
                      "`BITPUSH_KEYS_DIR` overrides it (`bitpush launch` sets it to the keys it "
                      "generates for a single-host cluster that has none)."),
             In<&ClusterConfig::security, &SecuritySettings::keys_dir>()),
      Scalar(Knob("security.key_file")
                 .Path(1)
                 .Optional("default",
                           "`$BITPUSH_KEY_FILE`, else "
                           "`$CREDENTIALS_DIRECTORY/bitpush.key` under systemd, else "
                           "`keys_dir/<node>.key`")
                 .Env("BITPUSH_KEY_FILE")
                 .Doc("This node's key file, for a YAML that one node reads alone (set it with "
                      "`--set security.key_file=PATH` on a daemon, or `BITPUSH_KEY_FILE`). "
                      "Refused when its group or others may access it."),
             In<&ClusterConfig::security, &SecuritySettings::key_file>()),
      Scalar(Knob("security.public_keys")
                 .Path(1)
                 .Optional("default", "`keys_dir/public_keys`")
                 .Doc("The cluster's public keys, one `name key` line per node."),
             In<&ClusterConfig::security, &SecuritySettings::public_keys>()),

      // ---- trace: (local; docs/observability.md) ----
      Scalar(Knob("trace.dir")
                 .Path(1)
                 .Optional("off")
                 .Env("BITPUSH_TRACE_DIR")
                 .Doc("The timeline: every worker engine, server and worker daemon writes its "
                      "spans (which thread did what to which tensor partition in which round) "
                      "into a file of its own here, `<role>-<pid>-<n>.jsonl`; `bitpush trace "
                      "merge DIR` joins them into one Chrome trace (docs/observability.md). "
                      "`bitpush launch --timeline DIR` sets it for every process it starts "
                      "(through `BITPUSH_TRACE_DIR`). Unset: no thread, no file, no cost."),
             In<&ClusterConfig::trace, &TraceSettings::dir>()),
      Scalar(Knob("trace.steps")
                 .Custom(&CanonicalTraceSteps, "`all` \\| `A-B` \\| `every N`")
                 .Doc("The rounds traced (a round of a tensor is one training step): `all`, "
                      "`A-B` (rounds A to B) or `every N` (rounds divisible by N, e.g. `every "
                      "100`: one step in a hundred)."),
             In<&ClusterConfig::trace, &TraceSettings::steps>()),
      Scalar(Knob("trace.buffer_spans")
                 .Integer(1024, 16777216, "spans")
                 .Doc("Each traced component's ring of spans waiting for its writer thread "
                      "(which empties it every 100 ms; about 64 bytes a span). When it is full, "
                      "new spans are dropped and counted in the file, never waited for."),
             In<&ClusterConfig::trace, &TraceSettings::buffer_spans>()),

      // ---- launch: (read by `bitpush launch`; docs/launch.md) ----
      Scalar(Knob("launch.max_restarts")
                 .Integer(0, 1000, "restarts")
                 .Doc("`bitpush launch --max-restarts N` overrides it. When a process of the job "
                      "dies (scheduler, server, worker daemon or "
                      "training process), `bitpush launch` stops the others and starts the "
                      "cluster and the training command again, up to this many times, with "
                      "`BITPUSH_RESTART_COUNT` in the training processes' environment; a "
                      "server alone is started again in place when "
                      "`cluster.server_rejoin_timeout_s` is set. The script resumes from its "
                      "checkpoint (`bitpush.torch.Checkpointer`; docs/launch.md, "
                      "\"Restarts\"). `0`: the first death ends the job."),
             In<&ClusterConfig::launch, &LaunchSettings::max_restarts>()),
  };
  // A knob's default is its field's initial value: declared once, in cluster_config.h.
  const ClusterConfig defaults;
  for (ClusterKnob& k : t) {
    if (k.get != nullptr) k.spec.default_text = FormatKnobValue(k.spec, k.get(defaults));
  }
  return t;
}

std::string SectionTable(const std::string& section) {
  std::string out = config::KnobDocHeader();
  for (const ClusterKnob& k : ClusterKnobs()) {
    if (k.spec.section() == section) out += "\n" + config::KnobDocRow(k.spec);
  }
  return out;
}

std::string FlagsTable() {
  std::string out =
      "| knob | command-line flag | what the flag does | environment variable |\n"
      "|---|---|---|---|";
  for (const ClusterKnob& k : ClusterKnobs()) {
    const config::KnobFlag& f = k.spec.flag;
    if (f.name.empty() && k.spec.env.empty()) continue;
    const std::string flag =
        f.name.empty() ? "" : fmt::format("`{} {}` (`{}`)", f.name, f.value_name, f.program);
    const std::string what = f.name.empty() ? ""
                             : f.sets_knob  ? "sets the knob"
                                            : "the program's own value (see the knob)";
    const std::string env = k.spec.env.empty() ? "" : "`" + k.spec.env + "`";
    out += fmt::format("\n| `{}` | {} | {} | {} |", k.spec.path, flag, what, env);
  }
  return out;
}

}  // namespace

const std::vector<std::string>& ClusterSections() {
  static const std::vector<std::string> kSections = {"cluster",  "compression", "optimizer",
                                                     "server",   "worker",      "metrics",
                                                     "security", "trace",       "launch"};
  return kSections;
}

const std::vector<ClusterKnob>& ClusterKnobs() {
  static const std::vector<ClusterKnob> kTable = BuildTable();
  return kTable;
}

const ClusterKnob* FindClusterKnob(std::string_view path) {
  for (const ClusterKnob& k : ClusterKnobs()) {
    if (k.spec.path == path) return &k;
  }
  return nullptr;
}

std::vector<std::string> SectionKeys(std::string_view section) {
  std::vector<std::string> keys;
  for (const ClusterKnob& k : ClusterKnobs()) {
    if (k.spec.section() == section) keys.push_back(k.spec.key());
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<std::string> HostEntryKeys(bool servers) {
  std::vector<std::string> keys;
  const ClusterKnob* k = FindClusterKnob(servers ? "cluster.servers" : "cluster.workers");
  keys.reserve(k->spec.entry_keys.size());
  for (const KnobSpec& e : k->spec.entry_keys) keys.push_back(e.path);
  std::sort(keys.begin(), keys.end());
  return keys;
}

const KnobSpec* FindHostEntryKey(bool servers, std::string_view key) {
  const ClusterKnob* k = FindClusterKnob(servers ? "cluster.servers" : "cluster.workers");
  for (const KnobSpec& e : k->spec.entry_keys) {
    if (e.path == key) return &e;
  }
  return nullptr;
}

Status SetClusterKnob(ClusterConfig* config, std::string_view path, std::string_view text) {
  const ClusterKnob* k = FindClusterKnob(path);
  if (k == nullptr) {
    std::string valid;
    for (const ClusterKnob& o : ClusterKnobs()) {
      if (o.set != nullptr) valid += (valid.empty() ? "" : ", ") + o.spec.path;
    }
    return InvalidArgumentError(fmt::format("{}: unknown knob; valid: {}", path, valid));
  }
  if (k->set == nullptr) {
    return InvalidArgumentError(fmt::format(
        "{}: takes {}, which only the YAML can give (docs/config.md)", path, k->spec.type_doc));
  }
  BP_ASSIGN_OR_RETURN(KnobValue v, config::ParseKnob(k->spec, text));
  k->set(config, v);
  return Status::Ok();
}

config::DocBlocks ClusterKnobDocBlocks() {
  config::DocBlocks blocks;
  for (const std::string& s : ClusterSections()) blocks.emplace_back(s, SectionTable(s));
  std::string hosts = config::KnobDocHeader("key of a host entry");
  for (const KnobSpec& e : FindClusterKnob("cluster.workers")->spec.entry_keys) {
    hosts += "\n" + config::KnobDocRow(e);
  }
  blocks.emplace_back("host-entry", hosts);
  blocks.emplace_back("flags", FlagsTable());
  return blocks;
}

}  // namespace bitpush::config
