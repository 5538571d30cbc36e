// Daemon: the per-node `bitpush-worker` daemon (paper 001 §4.2) — it serves the
// node's `local_size` training processes over a Unix socket (docs/local-ipc.md: Hello,
// declarations, push_pulls with tensors in their shared memory), sums their gradients locally
// (LocalReducer) and runs ONE worker Engine for the node, so compression and networking happen
// once per node. The training processes use worker::Client in daemon mode (client.h).
//
// Result semantics: for ReduceOp::kAverage the daemon reduces with scale 1/local_size (the
// node's average, fp32 sums in local-rank order, one multiply), and the servers average the
// nodes' pushes ((1/W)·Σ in worker-rank order); so every process receives
// C_s((1/W)·Σ_w C_w((1/P)·Σ_p x_{w,p})) — the average over all W×P processes, through the
// configured compressor both ways. When the YAML gives nodes different numbers of processes
// (cluster.workers host entries with `processes:`), the node's sum is scaled by W / (all
// processes) instead, so every process still weighs the same; every node then needs a daemon
// running exactly its configured count. kSum: local scale 1, servers sum.
//
// Life of a round of tensor t: each process hands in LocalPushPull(t, r); the daemon checks it
// (round in step, slices its own and of the tensor's size, segment size) and keeps it; when all
// local_size processes handed in round r, the round goes to the round thread, which reduces the
// inputs from their shared-memory slices into the tensor's node buffer (LocalReducer; GPU hook
// there), and calls Engine::PushPull on it (never on the poll loop: the first push_pull of new
// declarations waits for the cross-node check); the completion thread waits for the handle,
// copies the result into every process's output slice and answers LocalPushPullDone. A round
// not handed in by every process within op_timeout fails for those that did, naming the missing
// ones (and the tensor stays failed: its rounds are out of step).
//
// Failures (docs/local-ipc.md "Failures"): a training process that dies or sends garbage ends
// the node: its segments are unlinked at once, the pending rounds of the others fail with
// Unavailable naming it ("local rank 1 (pid 4711)"), every other process gets LocalGoodbye with
// that reason, the engine is closed (the cluster sees this worker gone) and Run returns the
// error (bitpush-worker exits 1): bitpush has no fault tolerance. The cluster failing (the
// scheduler shut it down, a server died: the engine's sticky error) ends the node the same
// way within half a second, whether or not a push_pull is in flight. Stop() (SIGTERM) ends the same
// way with reason "shutting down", and Run returns OK. A declaration difference does not end the
// node at once: every process that declares that tensor is told, processes may then leave without
// being failures, and Run returns the difference once every local rank joined and left (or
// the gathering bound passed). When every process said
// Goodbye, Run shuts the engine down cleanly (Engine::Shutdown: the cluster's clean end) and
// returns its status.
//
// Error-feedback state (LocalErrorFeedback, local protocol 1.3): the node's worker residual lives
// in this daemon's engine (one per node, after the local reduce), so every local process reads the
// same one. Served on the poll loop (Engine::ErrorFeedbackState / RestoreErrorFeedbackState lock
// the engine's own mutex and copy; the values go through a slice of the requester's shared
// memory, checked like a push_pull's). Refused with FailedPrecondition naming the tensor while the
// requester's own push_pull of it is handed in (gathered, or its round in the engine) — the
// embedded rule "not while a push_pull of it is in flight"; another process having handed in the
// next round is no obstacle, since that round cannot start before the requester hands it in
// (its requests are read in order), so the request sees exactly the residual the round will use.
// Restore: every process of a checkpointed job restores the same checkpoint (all read the same
// node residual), so the daemon applies local rank 0's and checks the others' alike (tensor,
// slice, size) without applying them: the node's residual is deterministic whatever order the
// requests arrive in, and the next round (which needs local rank 0's hand-in, after its restore)
// always uses it. Local protocol 1.5's `state` serves the rest of a checkpoint's job state the
// same way: the servers' residual (a round trip to the servers from the poll loop, bounded by
// op_timeout; restored from local rank 0 only, as bitpush.torch's rank 0 alone restores it) and
// the tensor's rounds (read in the reply; restored from local rank 0 of each node).
//
// Optimizer spans (LocalOptimizerSpan, local protocol 1.4): the node's worker spans are this
// daemon's engine's (trace.dir), so the training processes' optimizer steps come here too. The
// HelloReply says whether the engine traces (`tracing`); a client sends spans only then, one per
// step, no reply. Recorded on the poll loop by Engine::TraceStep (its own mutex, a copy into the
// recorder's ring) as the `optimizer` span of the step just pushed, with the sender's local rank.
// The times are the sender's CLOCK_MONOTONIC, which is this daemon's steady clock (same host), so
// they are taken as they are; a span that does not lie between the sender's Hello and its
// arrival (end before start, negative or absurd values, a sender in another time namespace) is
// dropped and logged once per connection, never an error of the node.
//
// Ownership: the Daemon owns the Listener (its socket path is unlinked on every exit path that
// unwinds; a stale file is replaced at the next start), the connections, the segments it
// opened (mappings only: each process unlinks its own; the daemon unlinks a dead one's), the
// Engine, the LocalReducer and its three threads. No process-wide state except the shm
// clean-up list (shm_segment.h).
//
// CPU split (worker.numa, worker.reduce_threads, worker.compress_threads; paper 001 §4.2.6):
// PlanWorkerCpus gives one network core (the round and completion threads and the engine's
// I/O and dispatcher threads are started pinned to it), reduce cores and compression cores;
// the poll loop runs on the caller's thread, unpinned.
//
// Pieces (one file each, named after what they do): worker/daemon.cc composes them and owns the
// life cycle (Create, Run's poll loop, Stop, FailNode); daemon/session.cc (accepting training
// processes, reading their messages, Hello, their optimizer spans, dropping a connection);
// daemon/declarations.cc (gathering a tensor's declarations, the engine declaration for the node,
// the verdict); daemon/gather.cc (checking and keeping each process's push_pull of a round, handing
// the gathered round on, the gathering bound); daemon/round_executor.cc (the round and completion
// threads); daemon/error_feedback.cc (the node residual's reads and restores); and two pieces
// with their own state and threads: NodeBarrier (daemon/node_barrier.h, the barrier thread)
// and GpuRounds (daemon/gpu_rounds.h, the NCCL group of the node's GPUs). The connection and
// tensor state they share is daemon/daemon_state.h.
//
// Threads (docs/threading.md, "Worker daemon"): the caller of Run is the poll loop (listener,
// every channel, a wake eventfd; it owns the connections and the tensors' gathering state);
// "bp-dround" reduces and starts push_pulls; completion_threads x "bp-ddone" each take the next
// started round (FIFO), wait for its handle and answer; "bp-dbarrier" runs the cluster's worker
// barrier once every local process entered a LocalBarrier, and answers them; plus the Engine's
// and LocalReducer's own threads. Thread-safety: Create/Run from one thread; Stop from any thread
// (also a signal thread).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/cpu_topology.h"
#include "common/status.h"
#include "config/cluster_config.h"
#include "worker/client.h"
#include "worker/daemon/gpu_rounds.h"
#include "worker/daemon/node_barrier.h"
#include "worker/daemon_client.h"
#include "worker/engine.h"
#include "worker/gpu/device_memory.h"
#include "worker/gpu/gpu_reduce.h"
#include "worker/ipc/channel.h"
#include "worker/ipc/shm_segment.h"
#include "worker/local_reduce.h"

namespace bitpush::worker {

struct DaemonOptions {
  // The cluster (the node's copy of the YAML). The daemon is worker `rank` in it.
  config::ClusterConfig cluster;
  uint32_t rank = 0;
  // The Unix socket to listen on; "" = cluster.worker.socket, or when that is empty
  // DefaultDaemonSocketPath(rank) (<private dir>/worker-<rank>.sock, daemon_client.h).
  std::string socket_path;
  // Training processes to serve; 0 = cluster.worker.local_size, and when that is 0 too, the
  // first accepted Hello decides.
  uint32_t local_size = 0;
  // LocalReducer threads; 0 = cluster.worker.reduce_threads (whose auto is
  // DefaultReduceThreads of the daemon's cores). The compression pool is
  // cluster.worker.compress_threads, whose auto in the daemon is DefaultCompressThreads: the
  // cores left after the network core and the reduce threads (common/cpu_topology.h).
  uint32_t reduce_threads = 0;
  // Completion threads (>= 1): rounds in the engine whose answers can be sent independently;
  // with more rounds in flight, a slow one delays the answers of those queued behind it.
  uint32_t completion_threads = 4;
  // Bound on gathering a round (first hand-in -> last); 0 = cluster.worker.op_timeout.
  std::chrono::milliseconds gather_timeout{0};
  // Remove leftover segments of crashed processes of this user at start (SweepStaleSegments).
  bool sweep_stale_segments = true;
  // inproc backend only.
  std::shared_ptr<transport::InprocHub> inproc_hub;
};

// What the daemon counted. Read with Daemon::stats() from any thread.
struct DaemonStats {
  // Connections to the socket refused because the peer runs as another user (SO_PEERCRED;
  // docs/local-ipc.md). Each is logged, at most one message per kRefusalLogInterval.
  uint64_t refused_connections = 0;
};

// The least time between two log messages about refused connections (DaemonStats).
inline constexpr std::chrono::seconds kRefusalLogInterval{5};

class Daemon {
 public:
  // Sweeps stale segments, listens on the socket (a live daemon there is FailedPrecondition),
  // creates the engine (registers with the scheduler: bounded by startup_timeout) and the
  // reducer.
  static StatusOr<std::unique_ptr<Daemon>> Create(DaemonOptions options);

  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until the node ends (see the file comment); returns OK after a clean end or Stop,
  // otherwise the error that ended the node.
  Status Run();

  // Asks Run to end (fails pending rounds with `reason`, Goodbye to every process). Any thread;
  // only atomics and a write(2) to an eventfd, so a signal thread may call it.
  void Stop();

  const std::string& socket_path() const { return socket_path_; }
  DaemonStats stats() const;
  // The CPU split in use (empty CPU lists when not pinned: worker.numa off, or auto without a
  // readable topology) and the resolved thread counts.
  const WorkerCpuPlan& cpu_plan() const { return cpu_plan_; }
  uint32_t reduce_threads() const { return reduce_threads_; }
  uint32_t compress_threads() const { return compress_threads_; }
  // The node's engine (its stats for metrics: any thread).
  const Engine& engine() const { return *engine_; }

 private:
  struct Conn;
  struct Slot {
    std::shared_ptr<ipc::Channel> channel;
    std::shared_ptr<ipc::ShmSegment> in;
    uint64_t in_offset = 0;
    std::shared_ptr<ipc::ShmSegment> out;
    uint64_t out_offset = 0;
    // CUDA tensors: the process's staging buffer, mapped by its IPC handle (input and output).
    std::shared_ptr<gpu::IpcMapping> gpu;
    std::string who;
  };
  struct TensorState;
  struct RoundJob {
    TensorState* tensor = nullptr;
    uint64_t round = 0;
    std::vector<Slot> slots;  // by local rank
    PushPullHandle handle;
    Status error;          // set when the round failed before the engine
    bool declare = false;  // not a round: declare `tensor` in the engine (DeclareForNode)
  };

  explicit Daemon(DaemonOptions options);

  // Poll loop (Run's thread).
  void AcceptOne();
  void ReadFrom(Conn& c);
  Status Handle(Conn& c, const v1::LocalMessage& m);
  void OnHello(Conn& c, const v1::LocalHello& h);
  void OnDeclare(Conn& c, const v1::LocalDeclare& d);
  void OnPushPull(Conn& c, const v1::LocalPushPull& p);
  // Reads or restores the node's worker residual of a tensor through the sender's shared memory
  // (LocalErrorFeedback; see "Error-feedback state" above).
  void OnErrorFeedback(Conn& c, const v1::LocalErrorFeedback& e);
  // Records the sender's optimizer step in the engine's timeline (see "Optimizer spans" above).
  void OnOptimizerSpan(Conn& c, const v1::LocalOptimizerSpan& s);
  // The mapped segment of a slice `c` named, after ValidateSlice (`expected_bytes`, `what`),
  // Open on first use (exact size) and CheckSize: shared by push_pulls and error-feedback
  // requests.
  StatusOr<std::shared_ptr<ipc::ShmSegment>> MapSlice(Conn& c, const v1::ShmSlice& s,
                                                      uint64_t expected_bytes,
                                                      std::string_view what);
  // Whether the engine may touch tensor `t`'s residual now: a round dispatched to the round
  // thread and not yet ended (its Done about to go out) is the engine's.
  bool RoundInEngine(const TensorState& t);
  // Round thread: the engine declaration of a tensor every local process declared alike (its
  // verdict, engine id, node buffer). Poll loop: the verdict to the processes.
  void DeclareForNode(TensorState& t);
  void FinishDeclaration(TensorState& t);
  void MaybeDispatch(TensorState& t);
  void CheckGatherDeadlines();
  void FailNode(const Status& error, const Conn* dead);
  // Ok while the cluster is up; else why the node can never serve again ("<label>: the
  // cluster failed: <the engine's status>"), the node's cause even when a training process
  // leaves because of it before the run loop noticed.
  Status ClusterFailure() const;
  void DropConn(Conn& c);
  void SendDone(ipc::Channel& ch, uint32_t tensor, uint64_t round, const Status& s,
                uint64_t bytes_pushed = 0, uint64_t bytes_pulled = 0);
  std::chrono::milliseconds NextPollTimeout() const;

  // Round and completion threads.
  void RoundLoop();
  // The GPU path of a CUDA tensor's round (GpuRounds): the node's sum before the push (round
  // thread), the result back to every process's GPU after the pull (completion thread).
  Status GpuReduce(RoundJob& job);
  Status GpuBroadcast(RoundJob& job);
  void DoneLoop();

  DaemonOptions options_;
  std::string socket_path_;
  std::string label_;  // "bitpush-worker node 0"
  uint32_t local_size_ = 0;
  // kAverage's factor on the node's sum when the nodes run different numbers of processes
  // (workers / all processes, ClusterConfig::ProcessCountsDiffer); 0 = 1/local_size_.
  float average_scale_ = 0.0f;
  std::chrono::milliseconds gather_timeout_{0};
  WorkerCpuPlan cpu_plan_;
  uint32_t reduce_threads_ = 0;
  uint32_t compress_threads_ = 0;
  std::unique_ptr<ipc::Listener> listener_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<LocalReducer> reducer_;
  int wake_fd_ = -1;
  std::atomic<bool> stop_requested_{false};

  // Refused connections (DaemonStats): counted on the poll loop, read by any thread.
  std::atomic<uint64_t> refused_connections_{0};
  std::chrono::steady_clock::time_point last_refusal_log_{};  // poll loop

  // Poll-loop state.
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<std::unique_ptr<TensorState>> tensors_;
  uint32_t goodbyes_ = 0;
  // The first declaration difference: the node cannot run; processes may leave without
  // ending it (each was or will be told the difference), and the last one's departure ends Run.
  Status decl_error_;
  std::chrono::steady_clock::time_point decl_error_deadline_;
  std::set<uint32_t> joined_;  // local ranks that ever joined
  bool ended_ = false;
  Status end_status_;

  // Shared with the round / completion threads.
  std::mutex mu_;
  std::condition_variable round_cv_;
  std::condition_variable done_cv_;
  std::deque<std::unique_ptr<RoundJob>> round_queue_;  // guarded by mu_
  std::deque<std::unique_ptr<RoundJob>> done_queue_;   // guarded by mu_
  std::vector<TensorState*> finished_;                 // guarded by mu_: rounds answered
  std::vector<TensorState*> declared_;                 // guarded by mu_: engine declarations done
  Status node_error_;                                  // guarded by mu_
  bool stop_threads_ = false;                          // guarded by mu_: round thread
  bool stop_done_ = false;                             // guarded by mu_: completion thread
  std::thread round_thread_;
  // Barriers: gathered on the poll loop, the cluster's barrier on its own thread.
  std::unique_ptr<NodeBarrier> barrier_;
  // The GPU path (CUDA tensors): gpu_rounds.h.
  std::unique_ptr<GpuRounds> gpu_;
  std::vector<std::thread> done_threads_;
};

}  // namespace bitpush::worker
