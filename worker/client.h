// Client: the C++ API of a bitpush worker — declare tensors, then push_pull them through the
// worker engine (compression with worker error feedback, partitions, priorities, credit) to
// the servers and back. One Client per node; no process-wide state, so two Clients in one
// process (two nodes of the threads-as-nodes harness) work side by side.
//
//   ClientOptions o;  o.cluster = *LoadClusterConfig("cluster.yaml");  o.rank = 0;
//   auto client = Client::Create(o);                  // binds, registers (bounded)
//   auto t = (*client)->Declare("fc1.weight", n, DType::kFloat32, /*priority=*/0, "onebit");
//   PushPullHandle h = (*client)->PushPull(*t, ConstTensorView(grad, n), TensorView(out, n));
//   Status s = h.Wait();                               // never hangs: op_timeout bounds it
//   (*client)->Shutdown(std::chrono::seconds(30));    // Done + wait for the clean shutdown
//
// Result semantics: `output` receives the average over the workers of their `input`s
// (ReduceOp::kAverage, the default: (1/n)·Σ, computed in fp32 on the server), or the sum
// (kSum), passed through the tensor's compressor both ways (paper 001 Algorithms 3 and 4: the
// server's aggregate is compressed again, with the server residual when the cluster's
// error_feedback is server/both). `output` may alias `input`.
//
// Declarations: every worker must declare the same tensors (name, elements, dtype, spec,
// reduce op) in the same order. Declarations are checked across workers (through server 0)
// before the first push of a tensor: a mismatch fails that PushPull (and CommitDeclarations)
// with InvalidArgument naming the first differing tensor and what each worker declared.
// Declaring after the first PushPull is allowed; the new tensors are checked at their first
// PushPull.
//
// Errors: any failure — a server declared dead by the scheduler, a push the server rejected,
// op_timeout — completes the handle with a Status naming the cause (the server, the tensor,
// the partition); later calls return the sticky error when the cluster is gone.
//
// Modes (ClientOptions::mode, one ClientBackend each: client_backend.h): kEmbedded (the default)
// runs the worker engine inside this process — one Client is one worker node of the cluster YAML.
// kDaemon connects to the node's `bitpush-worker` daemon (worker/daemon.h, docs/local-ipc.md) as
// local rank `local_rank` of `local_size` training processes: the daemon sums the node's processes
// locally and runs one engine for the node, so `output` receives the average (or sum) over ALL
// processes of all nodes. Same API; in daemon mode Barrier waits for every process of every node
// (the daemon gathers its processes, then joins the cluster's worker barrier), num_servers() is 0
// (unknown to a training process), rank()/num_workers() are the node's rank and the number of
// nodes, a dead daemon fails every pending and later call with Unavailable naming it, and every
// wait is bounded (startup_timeout for Hello and declarations, the daemon's op_timeout + 2 s for a
// push_pull).
//
// Thread-safety: every method may be called from any thread. One push_pull per tensor may
// be in flight at a time (a second one fails with FailedPrecondition); push_pulls of
// different tensors overlap.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_view.h"
#include "common/transport/transport.h"
#include "config/cluster_config.h"
#include "worker/compression_plan.h"

namespace bitpush::worker {

class ClientBackend;
struct OpState;

enum class ReduceOp { kAverage, kSum };

// A tensor whose optimizer runs on the servers (TensorOptions::server_optimizer; paper 002's
// server-side mode, docs/optimizer.md "Server-side optimizer"). The servers own its fp32 master
// weights and optimizer state; a push_pull sends the gradient with the round's learning rate,
// each server updates its weights after the round's average, and every worker's copy of the
// weights (the push_pull's output) receives the new weights: as C(w − w̃) added to the copy
// (the difference form, which keeps every worker's copy bit-identical to the server's mirror
// w̃), or as C(w) replacing it (the raw form, for unbiased or lossless C). Before the first
// push_pull, Client::InitServerWeights installs worker 0's weights on the servers and gives
// every worker the same copy.
struct ServerOptimizerOptions {
  // "sgd", "adamw" or "lans" (optimizers/param_state.h: torch.optim's definitions; lans is
  // CLAN's update on the averaged gradient).
  std::string rule = "sgd";
  float weight_decay = 0.0f;
  float momentum = 0.0f;  // sgd
  bool nesterov = false;  // sgd
  float beta1 = 0.9f;     // adamw, lans
  float beta2 = 0.999f;   // adamw, lans
  float eps = 1e-8f;      // adamw, lans
  // How the weights come back: a compressor spec; "" = the cluster's optimizer.pull.
  std::string pull;
  // "difference", "raw", or "" = the cluster's optimizer.pull_form ("auto": raw for `none`,
  // difference otherwise). Raw is refused for biased compressors.
  std::string pull_form;
};

struct TensorOptions {
  // Scheduling priority: lower goes first (use the layer index: front layers are needed
  // first by the next forward pass). Ties: declaration order, then partition order.
  int64_t priority = 0;
  // Compressor spec (compressors/registry.h); "" = the cluster's compression.spec. Tensors
  // below compression.min_compress_bytes go uncompressed whatever the spec.
  std::string compression;
  ReduceOp op = ReduceOp::kAverage;
  // The tensor's input and output are CUDA device pointers (fp32 only). Daemon mode only: the
  // daemon reduces the node's GPUs with the FP16 cast + NCCL path (worker/gpu/,
  // docs/local-ipc.md "GPU tensors"); embedded mode refuses it (copy to host memory instead).
  bool cuda = false;
  // Set: the tensor's optimizer runs on the servers (see ServerOptimizerOptions): fp32 only,
  // embedded mode only. Its push_pulls take a learning rate.
  std::optional<ServerOptimizerOptions> server_optimizer;
};

// A declared tensor.
struct TensorId {
  uint32_t index = 0;
};

// The completion of one push_pull. Copyable (copies share the operation).
class PushPullHandle {
 public:
  PushPullHandle() = default;
  explicit PushPullHandle(std::shared_ptr<OpState> op) : op_(std::move(op)) {}

  // Blocks until the operation completed (bounded by the client's op_timeout) and returns its
  // status. A default-constructed handle returns FailedPrecondition.
  Status Wait() const;
  // As Wait, but returns Timeout "push_pull of tensor 'x' not complete after N ms" after
  // `timeout` without failing the operation.
  Status Wait(std::chrono::milliseconds timeout) const;
  bool Ready() const;
  // The compressed payload bytes the operation sent to and received from the servers (final
  // once it completed; 0 for a default-constructed handle or a daemon-mode operation).
  uint64_t bytes_pushed() const;
  uint64_t bytes_pulled() const;

 private:
  std::shared_ptr<OpState> op_;
};

enum class ClientMode {
  kEmbedded,  // this process is the worker node (its own engine); the default
  kDaemon,    // one of the node's training processes, served by its bitpush-worker daemon
};

struct ClientOptions {
  // The cluster (the worker's copy of the YAML): addresses, compression, worker settings. In
  // daemon mode only startup_timeout and worker.socket are used.
  config::ClusterConfig cluster;
  // This worker's rank (index in cluster.workers): in daemon mode, the node whose daemon to
  // use (for the default socket path).
  uint32_t rank = 0;
  // inproc backend only: the hub of the in-process cluster.
  std::shared_ptr<transport::InprocHub> inproc_hub;

  // Embedded (default) or daemon mode (see the file comment).
  ClientMode mode = ClientMode::kEmbedded;
  // Daemon mode: the daemon's Unix socket; "" = cluster.worker.socket, or when that is empty
  // DefaultDaemonSocketPath(rank) (<private dir>/worker-<rank>.sock, daemon_client.h).
  std::string daemon_socket;
  // Daemon mode: this process's local rank (0..local_size-1, unique on the node) and the
  // number of training processes on the node (every one must say the same; the daemon refuses
  // a mismatch).
  uint32_t local_rank = 0;
  uint32_t local_size = 1;
  // Embedded mode: the clock of op deadlines, the declaration wait and the control plane's
  // timers (EngineOptions::clock); null = the system clock. Tests pass a clock they advance.
  std::shared_ptr<const Clock> clock;
  // Embedded mode: EngineOptions::check_non_finite (a benchmark's switch; default on).
  bool check_non_finite = true;
};

struct ClientStats {
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
  uint64_t partitions_pushed = 0;
  // Compressed payload bytes sent to / received from the servers. Daemon mode: the node's
  // bytes of the rounds this process took part in (its daemon reports them with each result).
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;
  // The same partitions uncompressed (elements x the tensor's dtype size): pushed, and pulled
  // (replies decoded into the output). Embedded mode only (0 in daemon mode).
  uint64_t raw_bytes_pushed = 0;
  uint64_t raw_bytes_pulled = 0;
  // Cumulative time in each stage, over all partitions (ns; stages overlap across partitions).
  uint64_t compress_ns = 0;
  uint64_t network_ns = 0;  // push sent -> reply received (includes the server's time)
  uint64_t decompress_ns = 0;
  // The pipeline, per completed push_pull (ns, summed over ops; embedded engine only): from the
  // op's start to its last partition's push sent, to its first reply received, and to its
  // completion. first_reply_ns < last_push_ns says replies — the server's work, the way back
  // and decompression — overlapped the compression and sending of later partitions.
  uint64_t last_push_ns = 0;
  uint64_t first_reply_ns = 0;
  uint64_t op_ns = 0;
  // Quantiser telemetry (methods that report it: loco; embedded mode only): values quantised
  // for pushes and how many were clamped to the code range; the error state's values
  // re-quantised (loco's int8 error) and how many were clamped; and the L2 norm of every
  // partition's error state as last pushed; with the L2 norm of the gradients those pushes
  // compressed (methods that report it: separate), the ratio ||e|| / ||g||.
  uint64_t quantized_values = 0;
  uint64_t quantized_saturated = 0;
  uint64_t error_values = 0;
  uint64_t error_saturated = 0;
  double error_norm = 0;
  double gradient_norm = 0;
  // Partitions this worker pushed with a NaN / inf in their input, and rounds that failed
  // because some worker's or server's values were non-finite (docs/errors.md, "Non-finite
  // values"; embedded engine only).
  uint64_t non_finite_pushes = 0;
  uint64_t non_finite_rounds = 0;
  // Peak uncompressed bytes in flight (bounded by credit_bytes, or one partition).
  uint64_t peak_bytes_in_flight = 0;
  // Peak raw (uncompressed) bytes in flight at any one server (bounded by
  // worker.server_window_bytes, or one partition; embedded engine only).
  uint64_t peak_server_window_bytes = 0;
  // At the moment stats() was taken: uncompressed bytes in flight, partitions queued for the
  // credit (embedded engine only; 0 in daemon mode).
  uint64_t bytes_in_flight = 0;
  uint64_t partitions_queued = 0;
};

class Client {
 public:
  // Binds the worker's endpoint, registers with the scheduler and waits for the assignment
  // (bounded by cluster.startup_timeout), starts the engine threads.
  static StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);

  ~Client();  // Close()
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Declares a tensor. InvalidArgument for an empty or duplicate name, a bad spec, or a
  // tensor too large to partition.
  StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                             const TensorOptions& options = {});
  StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                             int64_t priority, const std::string& compression);

  // Checks the declarations made since the last check against every other worker's and
  // announces the keys to their servers. Called by PushPull as needed; exposed for callers
  // that want the check early. Bounded by cluster.startup_timeout.
  Status CommitDeclarations();

  // Starts a push_pull of `tensor`: `input` and `output` must have the tensor's element
  // count and dtype (otherwise the handle completes at once with InvalidArgument). `input` is
  // read and `output` written until the handle completes; they must stay alive until then.
  PushPullHandle PushPull(TensorId tensor, ConstTensorView input, TensorView output);
  // The push_pull of a tensor whose optimizer runs on the servers: `gradient` goes to the
  // servers with the round's learning rate `lr` (finite, >= 0, the same on every worker), and
  // `weights` — this worker's copy, which must not alias the gradient — receives the updated
  // weights. FailedPrecondition before InitServerWeights / PullServerWeights.
  PushPullHandle PushPull(TensorId tensor, ConstTensorView gradient, TensorView weights, float lr);

  // Server-side optimizer tensors, collective (every worker calls it, before the tensor's first
  // push_pull): worker 0's `weights` become the servers' master weights and every worker's
  // `weights` (worker 0's included) is overwritten with the servers' copy, so all start
  // bit-identical. Waits (op_timeout) for worker 0's install. Commits declarations if needed.
  Status InitServerWeights(TensorId tensor, TensorView weights);
  // Overwrites `weights` with the servers' copy (what every worker holds after the last round),
  // e.g. after RestoreServerOptimizerState.
  Status PullServerWeights(TensorId tensor, TensorView weights);
  // The tensor's server-side optimizer state (master weights, moments, step, the workers'
  // copy), one blob per partition in order, for checkpoints; Restore puts saved blobs back
  // (refused while a round is open, or for blobs of another rule or size). One worker reads and
  // restores for the cluster; then every worker calls PullServerWeights.
  StatusOr<std::vector<std::string>> ServerOptimizerState(TensorId tensor);
  Status RestoreServerOptimizerState(TensorId tensor, const std::vector<std::string>& saved);

  // cluster.server_rejoin_timeout_s (docs/training.md, "A server restarted alone"): a server
  // that died does not end the job; every push_pull fails with Unavailable naming it until a
  // new process of it registered again. WaitForServers blocks (bounded) until then: OK means
  // every server dropped the job's data-plane state and every tensor is declared but not yet
  // committed, its rounds at 0 — restore the job's checkpoint (LoadCheckpoint, and for tensors
  // whose optimizer runs on the servers RestoreServerOptimizerState + PullServerWeights) and go
  // on. From the rejoin until WaitForServers returns, every push_pull and call fails with
  // Unavailable ("the job rolled back"), also on a worker that had nothing in flight while the
  // server was missing, so every worker restores the checkpoint, none goes on alone. When no server
  // is missing yet (a push_pull met the dropped connection before the scheduler's verdict) it first
  // waits up to 2 x heartbeat_timeout for one, then returns OK if none came; the cluster's error if
  // it ended (the server did not come back in time). Daemon mode: a node collective (every
  // training process of the node calls it; the node's bitpush-worker waits once for all).
  Status WaitForServers(std::chrono::milliseconds timeout);

  // Waits for every worker (the scheduler's worker barrier); in daemon mode for every training
  // process of every node.
  Status Barrier();

  // Tells the scheduler this worker is done and waits (bounded) for the clean shutdown of
  // the cluster. Pending handles fail with Cancelled.
  Status Shutdown(std::chrono::milliseconds timeout);

  // Fails pending handles with Cancelled, stops the engine and closes the endpoint.
  // Idempotent.
  void Close();

  uint32_t rank() const;
  uint32_t num_workers() const;
  uint32_t num_servers() const;
  // This process's copy of the cluster's compression settings.
  const config::CompressionSettings& compression() const { return compression_; }
  // The cluster's sticky error (OK while healthy).
  Status status() const;
  ClientStats stats() const;

  // The worker error-feedback residual of `tensor` (paper 001 Algorithm 4's e_i: its partitions'
  // residuals in element order, fp32, one value per element; a method whose state keeps more,
  // partition by partition: binsgdm's m, b and e), for checkpoints; empty when the
  // tensor keeps none (below min_compress_bytes, "none", or compression.error_feedback keeps no
  // worker residual). Restore puts a saved one back (the size must match; empty for a tensor
  // that keeps none). FailedPrecondition while a push_pull of the tensor is in flight.
  // Daemon mode: the residual is the node's, kept by its daemon after the local reduce, so every
  // local process reads the same values (through shared memory, local protocol 1.3; bounded by
  // the daemon's op_timeout + 2 s, errors name the daemon); a restore is applied from local rank
  // 0 and checked but not applied from the others (every process restores the same checkpoint:
  // docs/local-ipc.md "Error-feedback state"); a daemon older than 1.3 is Unimplemented.
  StatusOr<std::vector<float>> ErrorFeedbackState(TensorId tensor) const;
  Status RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved);

  // The worker residual's decay γ of `tensor` (CLAN's error_feedback_decay), from its next
  // push_pull on: each compression forms q = x + γe instead of x + e, fused into onebit's sign
  // pass and a scaling pass before the others' (CompressContext::residual_decay). The residual
  // that ErrorFeedbackState reads is the undecayed one, as it was before the decay was
  // applied by reading, scaling and restoring it. γ in [0, 1] (InvalidArgument otherwise);
  // FailedPrecondition for a tensor that keeps no worker residual; Unimplemented for a method
  // with its own kind of error state (loco, separate, binsgdm) and in daemon mode.
  Status SetErrorFeedbackDecay(TensorId tensor, float decay);

  // The server residual ẽ of `tensor` (compression.error_feedback server/both: paper 001
  // Algorithm 4's server side), its partitions' in element order, read from the servers that
  // own them (OP_STATE_READ; docs/data-plane.md); empty when the tensor keeps none. Restore
  // writes a saved one back (OP_STATE_WRITE), before the tensor's first push_pull of the run
  // (the servers refuse it while a round of a key is open). One worker reads and restores for
  // the cluster (every worker sees the same servers). Bounded by op_timeout; the declaration is
  // committed first if needed. FailedPrecondition while a push_pull of the tensor is in flight.
  // Daemon mode: relayed by the node's bitpush-worker (local protocol 1.5), which restores only
  // local rank 0's (bitpush.torch restores from its rank 0 alone).
  StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor);
  Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved);

  // The push_pulls of `tensor` completed in this run (the round its next push_pull is), for
  // checkpoints; and the restore that moves the tensor to round `next` on this worker and on
  // the servers of its partitions (OP_STATE_WRITE `rounds`), so compressors that draw random
  // numbers per (key, round) (randomk, dithering, sdp4bit's TLq-HS) continue the saved run's
  // streams. Before the tensor's first push_pull of the run; every worker calls it with the
  // same `next`, and none may push the tensor before every worker's call returned (a
  // barrier: LoadCheckpoint and bitpush.torch.load_checkpoint end with one). FailedPrecondition
  // while a push_pull of the tensor is in flight or a round of it is open at a server;
  // InvalidArgument for a tensor whose optimizer runs on the servers (its rounds come with
  // RestoreServerOptimizerState). Daemon mode: the node's bitpush-worker numbers the rounds and
  // relays both (local protocol 1.5), applying local rank 0's restore for the node.
  StatusOr<uint64_t> TensorRounds(TensorId tensor);
  Status RestoreTensorRounds(TensorId tensor, uint64_t next);
  // The training script's optimizer step from start_ns to end_ns (steady clock: Python's
  // time.monotonic_ns()), as the timeline's `optimizer` span of the step just pushed
  // (docs/observability.md); nothing when tracing is off. In daemon mode it goes to the node's
  // daemon (LocalOptimizerSpan, fire-and-forget), which records it with this process's local
  // rank, and only when that daemon traces (its Hello reply says so).
  void TraceOptimizer(int64_t start_ns, int64_t end_ns);

  // One line, beginning "compression: ", saying how many of `tensors` (and how many bytes)
  // travel compressed, by spec, and which go raw and why (spec "none", or below
  // compression.min_compress_bytes): worker/compression_plan.h. The decision is the engine's
  // rule applied to this process's copy of the cluster config (in daemon mode the node's
  // daemon applies it to its copy, which config agreement keeps equal). NotFound for a tensor
  // that was never declared.
  StatusOr<std::string> DescribeCompression(const std::vector<TensorId>& tensors) const;
  // The decisions behind it, one per tensor (what each travels with, and why).
  StatusOr<std::vector<TensorCompression>> CompressionOf(
      const std::vector<TensorId>& tensors) const;

 private:
  Client(std::unique_ptr<ClientBackend> backend, config::CompressionSettings compression);
  // The node's engine (embedded) or its daemon connection (daemon mode): client_backend.h.
  const std::unique_ptr<ClientBackend> backend_;
  const config::CompressionSettings compression_;
  mutable std::mutex declared_mu_;
  std::vector<TensorCompression> declared_;  // by TensorId::index; guarded by declared_mu_
};

}  // namespace bitpush::worker
