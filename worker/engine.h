// Engine: the worker engine — everything a worker node does between a training step's
// gradients and their aggregate: tensor declarations and their cross-worker check, the
// partition pipeline (compress with worker error feedback -> push -> pull -> decompress ->
// complete), priorities, the credit that bounds memory, op deadlines and failures
// (docs/data-plane.md, paper 001 Algorithms 3 and 4). The embedded `Client` (client.h) is a
// thin wrapper; the per-node daemon (worker/daemon.h) drives the same engine.
//
// Ownership: the Engine owns the node's NodeEndpoint and SchedulerClient, one
// Tensor record per declaration (each partition's compressor instance, worker residual,
// round counter and reusable payload buffer), the compression pool and the dispatcher.
// Handles (PushPullHandle) share only the OpState: they may outlive the engine.
//
// Threads (docs/threading.md, "worker"):
//  - the endpoint's I/O thread receives every message; the engine's data-plane handlers
//    (OP_PULL_REPLY, OP_ERROR, OP_DECLARE_REPLY from servers) match a reply to the
//    partition's in-flight round and queue the decompress job (never decompressing there);
//  - the compression pool (worker.compress_threads; auto = CPUs this process may use, 1..8)
//    runs compress+push jobs and decompress+complete jobs (the latter first: they return
//    credit);
//  - one dispatcher thread owns the queue of ready partitions, ordered by (priority, tensor
//    index, partition index), and starts one only while the uncompressed bytes in flight plus
//    its own stay <= worker.credit_bytes (at least one partition is always in flight). It also
//    enforces worker.op_timeout, sleeping until the next deadline (no polling);
//
// Credit without deadlock: a partition holds its credit until the server's reply, and the
// server replies only once every worker pushed. If two workers started different partitions
// (their push_pulls arrived at different moments, so priority picked differently), each could
// hold the credit for partitions the other has not pushed and wait forever. Rule: the
// partition first in posting order — (op sequence number, partition), the op sequence being
// the order of this worker's PushPull calls — among those queued or in flight always goes,
// even over the credit. When every worker posts its push_pulls in the same order (the same
// training loop), the globally earliest incomplete partition is therefore always moving on
// every worker, so the cluster always progresses; the credit is exceeded by at most that one
// partition. (Workers posting in different orders can still stall; op_timeout reports it.)
//  - caller threads: Declare, CommitDeclarations (serialised by decl_mu_; waits for server
//    0's verdict), PushPull (never blocks on the network, except for a pending declaration
//    check), Wait on handles.
//
// Partition ownership: a partition's stage (queued, compressing, on the wire, decompressing,
// idle) changes under mu_, and whoever moved it into compressing/decompressing — one pool job
// — owns its compressor, residual and buffers until it moves it out. So the per-partition
// compressor state needs no lock and at most one job touches it at a time.
//
// Failures: a server's OP_ERROR, a failed Send, op_timeout, the cluster's sticky error
// (SchedulerClient::on_error, e.g. a server declared dead), the scheduler's Shutdown reaching a
// worker that did not ask for it (SchedulerClient::on_shutdown, clean or not: the verdict becomes
// the sticky error, so status() reports it), Shutdown and Close all complete
// the affected handles with a Status naming the cause; never a hang. An op's handle is
// signalled only once no job touches its input/output any more, so the caller may free them
// as soon as Wait returns. A tensor whose push_pull failed after it started has rounds out of
// step with the servers: later push_pulls of it fail with that error (sticky per tensor).
//
// Thread-safety: every public method may be called from any thread.
// Locks, outermost first: state_call_mu_ -> declare_mu_ / decl_mu_ -> mu_ -> {TaskPool's lock,
// an OpState's mu}.
// Nothing sends on the transport or calls the SchedulerClient while holding mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/clock.h"
#include "common/cpu_features.h"
#include "common/node/endpoint.h"
#include "common/status.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/mirror_pull.h"
#include "proto/bitpush/v1/control.pb.h"
#include "scheduler/scheduler_client.h"
#include "worker/client.h"
#include "worker/partition.h"
#include "worker/task_pool.h"

namespace bitpush::worker {

using EngineClock = std::chrono::steady_clock;

// The shared state of one push_pull, referenced by the engine and by every copy of its
// handle.
struct OpState {
  // Set at creation, then read-only.
  std::string tensor;  // name, for messages
  uint32_t tensor_index = 0;
  ConstTensorView input;
  TensorView output;
  // Server-side optimizer tensors: the round's learning rate, sent with every push.
  std::optional<float> lr;
  EngineClock::time_point deadline;
  EngineClock::time_point started = EngineClock::now();

  // Progress: guarded by the engine's mu_.
  size_t remaining = 0;  // partitions not yet complete
  // Pool jobs that may touch input/output, and pushes whose frames borrow the input (`none`:
  // sent from the input itself) until the transport lets go of them: the op completes, even
  // when it failed, only once none is left.
  uint32_t active_jobs = 0;
  bool failed = false;
  bool finished = false;                  // completion signalled (or about to be)
  EngineClock::time_point last_push{};    // the latest partition push sent
  EngineClock::time_point first_reply{};  // the first reply received (epoch: none yet)
  Status error;
  // Compressed payload bytes this op sent to and received from the servers (the daemon reports
  // them to its processes with the round's result).
  std::atomic<uint64_t> bytes_pushed{0};
  std::atomic<uint64_t> bytes_pulled{0};

  // Completion: guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  // Completes the op now (for ops that never reach the engine's queues).
  void Complete(Status s);
};

struct EngineOptions {
  config::ClusterConfig cluster;
  uint32_t rank = 0;
  std::shared_ptr<transport::InprocHub> inproc_hub;
  // CPUs for the compression pool's threads (thread i on compress_cpus[i % size]); empty: not
  // pinned. The worker daemon fills it from its CPU split (common/cpu_topology.h).
  std::vector<int> compress_cpus;
  // Tests: an endpoint to use instead of binding one (e.g. a FaultyTransport); its name must
  // be the worker's PeerId.
  std::unique_ptr<transport::Transport> transport;
  // Tests: registration back-off (SchedulerClientOptions); defaults are the client's.
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{2000};
  // The clock of op deadlines, the declaration wait and the control plane's timers; null =
  // SystemClock(). Tests pass a clock they advance by hand.
  std::shared_ptr<const Clock> clock;
};

class Engine {
 public:
  // Validates the options, starts the pool and the dispatcher, binds the endpoint, registers
  // (bounded by cluster.startup_timeout) and connects to every server.
  static StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options);

  ~Engine();  // Close()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                             const TensorOptions& options);
  Status CommitDeclarations();
  // `lr` is given exactly for tensors whose optimizer runs on the servers (client.h).
  PushPullHandle PushPull(TensorId tensor, ConstTensorView input, TensorView output,
                          std::optional<float> lr = std::nullopt);
  Status Barrier();
  Status Shutdown(std::chrono::milliseconds timeout);
  void Close();

  uint32_t rank() const { return rank_; }
  uint32_t num_workers() const { return num_workers_; }
  uint32_t num_servers() const { return num_servers_; }
  Status status() const;
  ClientStats stats() const;
  // The endpoint's counters (any thread).
  node::EndpointStats endpoint_stats() const;
  // Client::ErrorFeedbackState / RestoreErrorFeedbackState (client.h).
  StatusOr<std::vector<float>> ErrorFeedbackState(TensorId tensor) const;
  Status RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved);
  // Client::ServerErrorFeedbackState / RestoreServerErrorFeedbackState (client.h): one
  // OP_STATE_READ / OP_STATE_WRITE per partition to its server, bounded by op_timeout.
  StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor);
  Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved);
  // Client::InitServerWeights / PullServerWeights / ServerOptimizerState /
  // RestoreServerOptimizerState (client.h): OP_STATE_WRITE / OP_STATE_READ with `weights` or
  // `optimizer_state`, one per partition, bounded by op_timeout.
  Status InitServerWeights(TensorId tensor, TensorView weights);
  Status PullServerWeights(TensorId tensor, TensorView weights);
  StatusOr<std::vector<std::string>> ServerOptimizerState(TensorId tensor);
  Status RestoreServerOptimizerState(TensorId tensor, const std::vector<std::string>& saved);
  // cluster.server_rejoin_timeout_s: after a server failed, waits (bounded) until it rejoined
  // (OK: restore the job's checkpoint next), or returns the cluster's error / Timeout.
  Status WaitForServers(std::chrono::milliseconds timeout);
  uint32_t compress_threads() const { return pool_ ? pool_->size() : 0; }

 private:
  enum class Stage : uint8_t { kIdle, kQueued, kCompressing, kOnWire, kDecompressing };

  struct Partition {
    PartitionRange range;
    uint32_t server = 0;
    std::string peer;  // "server:N"
    // Owned by the job that holds the partition (stage kCompressing / kDecompressing).
    std::unique_ptr<compressors::Compressor> compressor;
    std::unique_ptr<compressors::ErrorFeedback> residual;  // worker error feedback
    // Server-side optimizer: the weights' pull compressor (decodes the replies).
    std::unique_ptr<compressors::Compressor> pull;
    std::unique_ptr<compressors::CompressorPullCodec> pull_codec;
    std::shared_ptr<std::vector<uint8_t>> payload;  // reused when nobody else refers to it
    // Guarded by mu_.
    Stage stage = Stage::kIdle;
    uint64_t next_round = 0;  // the round of the next push
    uint64_t round = 0;       // the round in flight (stage kOnWire / kDecompressing)
    uint64_t seq = 0;         // the posting sequence number of its op (queued or in flight)
    EngineClock::time_point pushed_at;
    uint64_t bytes = 0;      // uncompressed bytes (what the credit counts)
    double error_sq = 0;     // the error state's squared norm as last reported (telemetry)
    double gradient_sq = 0;  // the gradient's squared norm as last reported (telemetry)
  };

  struct Tensor {
    uint32_t index = 0;
    std::string name;
    size_t elements = 0;
    DType dtype = DType::kFloat32;
    TensorOptions options;
    v1::CompressorConfig config;  // canonical; "none" when the tensor goes uncompressed
    std::string spec;             // CompressorSpecString(config)
    bool compressed = false;
    std::vector<Partition> partitions;
    // Set: the servers own the weights and run this optimizer (as announced; canonical pull).
    std::optional<v1::ServerOptimizer> server_optimizer;
    // Guarded by mu_.
    bool weights_ready = false;   // server-side optimizer: this worker's copy came from the servers
    bool committed = false;       // declaration checked and keys announced
    Status error;                 // sticky: failed declaration, or a push_pull failed mid-way
    std::shared_ptr<OpState> op;  // the push_pull in flight
    uint64_t rounds_done = 0;     // push_pulls completed OK (the round number of the next one)
  };

  struct Ready {
    int64_t priority;
    uint32_t tensor;
    uint32_t partition;
    bool operator>(const Ready& o) const {
      if (priority != o.priority) return priority > o.priority;
      if (tensor != o.tensor) return tensor > o.tensor;
      return partition > o.partition;
    }
  };

  Engine(EngineOptions& options, v1::ErrorFeedbackPolicy policy);
  Status Start(EngineOptions& options);

  // The endpoint's handlers (its I/O thread).
  void RegisterHandlers();
  void OnSendFailed(const std::string& peer, const Status& why);
  void OnReply(const std::string& from, const v1::DataHeader& h, transport::Message& msg);
  void OnError(const std::string& from, const v1::DataHeader& h);
  void OnDeclareVerdict(uint64_t epoch, Status verdict);
  void OnClusterError(const Status& error);
  // SchedulerClientOptions::on_shutdown: a Shutdown this worker did not ask for (no Shutdown()
  // call) fails every pending and later call with the scheduler's verdict (sticky).
  void OnShutdownVerdict(const Status& verdict);
  // SchedulerClientOptions::on_worker_finished: fails the push_pulls that can no longer
  // complete (their round is beyond what that worker pushed), now and later.
  void OnWorkerFinished(uint32_t worker, const std::vector<uint64_t>& rounds);
  // SchedulerClientOptions::on_server_lost / on_server_rejoined (cluster.server_rejoin_timeout_s):
  // a lost server fails every pending push_pull and every new one with Unavailable until it
  // rejoins; its rejoining resets every tensor to "declared, not committed", rounds from 0, for
  // the job to restore its checkpoint in the new generation.
  void OnServerLost(uint64_t generation, const Status& why);
  void OnServerRejoined(uint32_t server, uint64_t generation);
  // Why tensor `t`'s next round (t.rounds_done) cannot complete, if a finished worker did not
  // push it.
  std::optional<Status> FinishedWorkerBlocksLocked(const Tensor& t) const;

  // A pool job's first step: if its op already failed, give the partition back and end the
  // job (true).
  bool DropJobIfFailed(Tensor& t, Partition& p, const std::shared_ptr<OpState>& op);
  // Pool jobs. `t` stays valid (tensors are never removed); the job owns partition `j`.
  void CompressAndPush(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op, uint64_t round);
  // The owner of a push frame that borrows op's input: one of op's active jobs (the caller
  // counted it, under mu_), done when the transport drops the frame's last reference, on
  // whichever thread that is (Send's caller when the transport copies or refuses the frames,
  // its I/O thread after the send). That thread takes mu_, so the engine never lets a Message
  // go, nor calls the transport, while holding mu_; the transport lets every frame go by the
  // end of Close (and, ucx, within send_complete_timeout of the send).
  std::shared_ptr<const void> InputLease(Tensor* t, const std::shared_ptr<OpState>& op);
  void DecompressAndComplete(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                             const transport::Buffer& payload);

  // Dispatcher thread.
  void DispatchLoop();
  Status TimeoutStatusLocked(const Tensor& t, const OpState& op) const;

  // Declarations: sends the manifest of `tensors` for `epoch` to server 0 and waits.
  Status CheckDeclarations(uint64_t epoch, const std::vector<uint32_t>& tensors);
  Status AnnounceKeys(const std::vector<uint32_t>& tensors);

  // Helpers (caller holds mu_).
  void FailOpLocked(Tensor& t, const std::shared_ptr<OpState>& op, const Status& error);
  // The server-state calls (one at a time: state_call_mu_, outermost): one per partition key,
  // answered by OP_STATE_REPLY or OP_ERROR (guarded by mu_).
  struct StateCall {
    std::string peer;
    std::string what;  // "the server residual", for messages
    bool done = false;
    Status status;
    transport::Buffer frame;  // a read's answer
    uint64_t round = 0;       // a weights read: the round the key continues at
  };
  enum class StateKind : uint8_t { kResidual, kOptimizerState, kWeights };
  // One call per partition of `id`: a write sends saved[j] to partition j's server (saved has
  // one entry per partition; moved into the frames, not copied); a read fills out[j] (the
  // reply's frame) and rounds[j]. FailedPrecondition while a push_pull of the tensor is in
  // flight.
  // Only partitions [first, first + count) when given.
  Status ServerStateCall(TensorId id, StateKind kind, bool write, std::vector<std::string> saved,
                         std::vector<transport::Buffer>* out,
                         std::vector<uint64_t>* rounds = nullptr, size_t first = 0,
                         size_t count = SIZE_MAX);
  // Server-side optimizer weights: the call's arguments checked; the partition batches they
  // travel in (bounded bytes each: the worker's transient copies stay small); the workers' copy
  // read into `weights` batch by batch (on error `weights` may be partly overwritten and the
  // tensor stays not ready).
  Status CheckServerWeightsCall(TensorId id, const TensorView& weights, const char* what);
  static std::vector<std::pair<size_t, size_t>> WeightBatches(const Tensor& t);
  // The values of t's worker error-feedback state (ErrorFeedback::state_size over its
  // partitions; 0 where it keeps none).
  static size_t StateValues(const Tensor& t);
  Status ReadServerWeights(TensorId id, TensorView weights, const char* what);
  void OnStateReply(const std::string& from, const v1::DataHeader& h, const transport::Message& m);
  std::mutex state_call_mu_;
  std::map<uint64_t, StateCall> state_calls_;
  std::condition_variable state_cv_;
  // Other workers that are done: rank -> the push_pulls each completed of each tensor (by
  // index; guarded by mu_).
  std::map<uint32_t, std::vector<uint64_t>> finished_workers_;
  // Moves `p` (partition of tensor `t`) to kIdle, returning its credit if it held some.
  void SetIdleLocked(Tensor& t, Partition& p);
  // Takes the credit for queued partition `j` of `t` and posts its compress job.
  void StartLocked(Tensor& t, uint32_t j);
  void JobDoneLocked(Tensor& t, const std::shared_ptr<OpState>& op);
  void MaybeFinishLocked(Tensor& t, const std::shared_ptr<OpState>& op);
  void FailAllLocked(const Status& error);
  // The error new push_pulls get (cluster error, shutdown, closed), if any.
  std::optional<Status> StoppedLocked() const;
  Tensor* FindTensorLocked(uint64_t key, uint32_t* partition);

  std::string label_;  // "worker 0"
  uint32_t rank_ = 0;
  uint32_t num_workers_ = 0;
  uint32_t num_servers_ = 0;
  config::ClusterConfig cluster_;
  v1::ErrorFeedbackPolicy policy_;
  IsaLevel isa_;
  std::shared_ptr<const Clock> clock_;
  std::unique_ptr<node::NodeEndpoint> endpoint_;
  std::unique_ptr<scheduler::SchedulerClient> client_;
  std::unique_ptr<TaskPool> pool_;
  std::thread dispatcher_;

  std::mutex declare_mu_;          // serialises Declare (tensor indices are assigned in order)
  std::mutex decl_mu_;             // serialises CommitDeclarations
  uint64_t next_epoch_ = 0;        // guarded by decl_mu_
  uint64_t epoch_generation_ = 0;  // guarded by decl_mu_: the generation next_epoch_ counts in

  mutable std::mutex mu_;
  std::condition_variable dispatch_cv_;  // wakes the dispatcher
  std::condition_variable decl_cv_;      // wakes CheckDeclarations
  // Tensors: appended under mu_, never removed; unique_ptr so references stay valid.
  std::vector<std::unique_ptr<Tensor>> tensors_;                               // guarded by mu_
  std::map<std::string, uint32_t> names_;                                      // guarded by mu_
  std::priority_queue<Ready, std::vector<Ready>, std::greater<Ready>> ready_;  // guarded by mu_
  std::set<std::pair<EngineClock::time_point, uint32_t>> deadlines_;           // (deadline, tensor)
  uint64_t in_flight_bytes_ = 0;                                               // guarded by mu_
  uint64_t next_op_seq_ = 0;                                                   // guarded by mu_
  // Partitions queued or in flight, by (op sequence, tensor, partition): the first one always
  // goes (see "Credit without deadlock"). Guarded by mu_.
  std::set<std::tuple<uint64_t, uint32_t, uint32_t>> active_;
  std::optional<uint64_t> pending_epoch_;  // guarded by mu_: declaration awaited
  std::optional<Status> declare_verdict_;  // guarded by mu_
  Status cluster_error_;                   // guarded by mu_: sticky
  bool shutting_down_ = false;             // guarded by mu_
  bool closed_ = false;                    // guarded by mu_
  bool stop_dispatcher_ = false;           // guarded by mu_
  // A server failed and may rejoin: why (every new push_pull fails with it). Guarded by mu_.
  std::optional<Status> recovering_;
  std::condition_variable recover_cv_;  // WaitForServers
  // The data plane's generation, stamped on every message to a server (written under mu_).
  std::atomic<uint64_t> generation_{0};
  ClientStats stats_;       // guarded by mu_
  double error_sq_ = 0;     // sum of Partition::error_sq; guarded by mu_
  double gradient_sq_ = 0;  // sum of Partition::gradient_sq; guarded by mu_
};

}  // namespace bitpush::worker
