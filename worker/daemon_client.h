// DaemonClient: the training-process side of the node's bitpush-worker daemon — what a
// `Client` in daemon mode (ClientOptions::mode = ClientMode::kDaemon, client.h) runs instead
// of an embedded Engine. It speaks the local protocol of docs/local-ipc.md over one Channel:
// Hello, LocalDeclare per tensor, LocalPushPull per round with the tensor's bytes in a
// shared-memory segment this process creates (one per tensor, created at its first
// push_pull), and turns every answer or failure into the same Status / PushPullHandle the
// embedded client gives.
//
// Data path (simplest correct first): PushPull copies `input` into the tensor's segment, names
// it as both input and output slice, and the reader thread copies the result out into `output`
// when LocalPushPullDone arrives. Training code that computes straight into shared memory is a
// later optimisation (the protocol already allows it).
//
// Bounds: Hello and declaration verdicts wait at most the cluster's startup_timeout; a
// push_pull at most the daemon's op_timeout_ms (HelloReply) + kDaemonWaitMargin, after which it
// fails with Timeout naming the daemon. A dead daemon (end of stream) fails every pending and
// later call at once with Unavailable naming it ("bitpush-worker daemon at PATH (pid N)"); a
// LocalGoodbye with a reason (the node failed, e.g. a sibling process died) makes that reason
// the sticky error of every later call.
//
// Error-feedback state: ErrorFeedbackState / RestoreErrorFeedbackState send LocalErrorFeedback
// with a slice of a per-tensor segment and wait for the daemon's answer (the residual is the
// node's; local rank 0's restore is the one applied: docs/local-ipc.md).
//
// Optimizer spans: TraceOptimizer sends one LocalOptimizerSpan (local protocol 1.4; two varints,
// one sendmsg, no reply) per optimizer step, and only when the daemon's HelloReply said it
// records a timeline (`tracing`). With tracing off in the daemon, or a daemon older than 1.4,
// it is one branch and nothing is sent (an older daemon would take the unknown message for
// garbage and end the node). A tracing daemon gets one frame per step even for steps its
// trace.steps leaves out (it drops those): one small frame next to the step's LocalPushPull per
// tensor, so this process needs to know nothing of the filter. A span that cannot be sent is
// dropped without touching the connection's state: a dead daemon is the next real call's (and
// the reader's) to report.
//
// Ownership: owns the Channel, the segments (unlinked by their destructors and on every exit
// path, shm_segment.h) and one reader thread ("bp-dclient").
// Thread-safety: every public method may be called from any thread (state under mu_; no frame
// is sent with mu_ held, so the reader always drains the daemon's answers). Lock order:
// send_mu_ -> mu_; ef_mu_ -> mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_view.h"
#include "proto/bitpush/v1/local.pb.h"
#include "worker/client.h"
#include "worker/gpu/device_memory.h"
#include "worker/ipc/channel.h"
#include "worker/ipc/shm_segment.h"

namespace bitpush::worker {

// The daemon's default socket path for node `rank`: <dir>/worker-<rank>.sock in the user's
// private socket directory (ipc::DefaultSocketPath: $RUNTIME_DIRECTORY, else
// $XDG_RUNTIME_DIR/bitpush, else /tmp/bitpush-<uid>; worker/ipc/socket_dir.h).
std::string DefaultDaemonSocketPath(uint32_t rank);

// The socket of node `rank`'s daemon: `explicit_path` when set (--socket,
// ClientOptions::daemon_socket), else the YAML's worker.socket ({rank} expanded), else
// DefaultDaemonSocketPath(rank). The daemon and its clients both use this.
std::string DaemonSocketPath(const std::string& explicit_path, const config::ClusterConfig& cluster,
                             uint32_t rank);

// How much longer than the daemon's op_timeout a client waits for a LocalPushPullDone, so the
// daemon's own (more precise) timeout error arrives first.
inline constexpr std::chrono::milliseconds kDaemonWaitMargin{2000};

struct DaemonClientOptions {
  // The daemon's Unix socket.
  std::string socket_path;
  // This process's local rank (0..local_size-1) and the node's number of training processes.
  uint32_t local_rank = 0;
  uint32_t local_size = 1;
  // Bounds Connect + Hello and the wait for declaration verdicts.
  std::chrono::milliseconds startup_timeout{60000};
};

class DaemonClient {
 public:
  // Connects (retrying while the daemon is not up yet), sends Hello and waits for the reply:
  // a refusal is FailedPrecondition "the bitpush-worker daemon refused local rank R: <reason>".
  // Before the Hello, Channel::Connect checks the socket's directory and that the daemon runs
  // as this process's user (FailedPrecondition naming both uids and the path; nothing sent).
  static StatusOr<std::unique_ptr<DaemonClient>> Connect(const DaemonClientOptions& options);

  ~DaemonClient();  // Close()
  DaemonClient(const DaemonClient&) = delete;
  DaemonClient& operator=(const DaemonClient&) = delete;

  StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                             const TensorOptions& options);
  Status CommitDeclarations();
  PushPullHandle PushPull(TensorId tensor, ConstTensorView input, TensorView output);
  // Enters the next barrier: returns once every training process of the node entered it and
  // every node passed the cluster's worker barrier (the daemon's LocalBarrierDone), or with
  // the daemon's error; bounded by the daemon's op_timeout + kDaemonWaitMargin. One barrier at
  // a time per process (concurrent callers take turns).
  Status Barrier();
  // Client::WaitForServers in daemon mode (local protocol 1.6): a node collective like Barrier
  // (LocalBarrier.wait_for_servers) — once every training process of the node entered it, the
  // daemon waits for the servers once for the node (Engine::WaitForServers, bounded by the
  // smallest timeout given) and answers each. Bounded here by op_timeout + kDaemonWaitMargin +
  // `timeout`. Unimplemented when the daemon speaks an older minor version (nothing is sent).
  Status WaitForServers(std::chrono::milliseconds timeout);
  // Client::ErrorFeedbackState / RestoreErrorFeedbackState in daemon mode (LocalErrorFeedback,
  // local protocol 1.3): the values go through a per-tensor segment of elements x 4 bytes
  // (created at the first use). One request at a time per process; bounded by the daemon's
  // op_timeout + kDaemonWaitMargin (then Timeout naming the daemon, sticky like a lost barrier).
  // Unimplemented when the daemon speaks an older minor version.
  StatusOr<std::vector<float>> ErrorFeedbackState(TensorId tensor);
  Status RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved);
  // Client::ServerErrorFeedbackState / RestoreServerErrorFeedbackState and TensorRounds /
  // RestoreTensorRounds in daemon mode: the same exchange with LocalErrorFeedback's `state`
  // (local protocol 1.5; the rounds travel in the messages, no segment). A restore is applied
  // by the daemon from local rank 0 (of the node; the servers' residual only once for the job,
  // by bitpush.torch's rank 0). Unimplemented when the daemon speaks an older minor version.
  StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor);
  Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved);
  StatusOr<uint64_t> TensorRounds(TensorId tensor);
  Status RestoreTensorRounds(TensorId tensor, uint64_t next);
  // Client::TraceOptimizer in daemon mode: the step from start_ns to end_ns (steady clock, the
  // daemon's too) as a LocalOptimizerSpan, when the daemon traces (see the file comment).
  void TraceOptimizer(int64_t start_ns, int64_t end_ns);
  // Whether the daemon records a timeline and takes optimizer spans (HelloReply, minor >= 4).
  bool daemon_traces() const { return daemon_traces_; }
  // Sends LocalGoodbye (refused while a push_pull is pending) and closes.
  Status Shutdown();
  // Fails pending handles with Cancelled, closes the connection, joins the reader. Idempotent.
  void Close();

  uint32_t node_rank() const { return node_rank_; }
  uint32_t num_nodes() const { return num_nodes_; }
  Status status() const;
  ClientStats stats() const;

 private:
  struct Tensor {
    v1::LocalDeclare decl;
    DType dtype = DType::kFloat32;
    size_t bytes = 0;
    std::optional<Status> verdict;  // the daemon's LocalDeclareReply
    ipc::ShmSegment segment;        // created at the first push_pull (host tensors)
    ipc::ShmSegment ef_segment;     // error-feedback values, elements x 4 bytes (first use)
    gpu::DeviceBuffer staging;      // CUDA tensors: the buffer the daemon maps (first push_pull)
    std::string staging_ipc;        // its exported cudaIpcMemHandle_t bytes
    std::string staging_bus_id;     // its GPU's PCI bus id
    uint64_t next_round = 0;
    std::shared_ptr<OpState> op;  // in flight
    uint64_t op_round = 0;
    Status error;  // sticky: a round timed out (rounds out of step)
  };

  explicit DaemonClient(const DaemonClientOptions& options);
  void ReaderLoop();
  void FailAllLocked(const Status& error);
  // After a send to the daemon failed (mu_ held through `lock`): waits at most kLastWordsWait
  // for the reader to read the daemon's last words (its Goodbye), makes the error sticky (that
  // reason, else `sent`), fails every pending op with it and returns it.
  Status SendFailedLocked(std::unique_lock<std::mutex>& lock, const Status& sent);
  // Barrier (nullopt) or WaitForServers (its timeout): one LocalBarrier exchange.
  Status NodeCollective(std::optional<std::chrono::milliseconds> wait_for_servers);
  void OnDone(const v1::LocalPushPullDone& done);
  // One LocalErrorFeedback exchange about `state`: a read fills *read (a residual) or *count
  // (the rounds); a restore sends `saved` (a residual) or `next` (the rounds).
  Status StateRequest(TensorId id, v1::LocalErrorFeedback::State state, bool restore,
                      Span<const float> saved, uint64_t next, std::vector<float>* read,
                      uint64_t* count);
  // CUDA tensors: checks the device pointers, creates the staging buffer and its IPC handle at
  // the first push_pull, copies `input` into it.
  Status StageOnDevice(Tensor& t, const void* input, const void* output);

  const DaemonClientOptions options_;
  std::string daemon_name_;  // "bitpush-worker daemon at PATH (pid N)"
  uint32_t node_rank_ = 0;
  uint32_t num_nodes_ = 0;
  uint32_t daemon_minor_ = 0;   // the daemon's local protocol minor version (HelloReply)
  bool daemon_traces_ = false;  // HelloReply.tracing from a daemon of minor >= 4
  std::chrono::milliseconds op_wait_{0};
  std::unique_ptr<ipc::Channel> channel_;
  std::thread reader_;

  std::mutex send_mu_;  // serialises Declare's frames (indices in order); outside mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;                              // declaration verdicts, errors
  std::vector<std::unique_ptr<Tensor>> tensors_;            // guarded by mu_
  Status error_;                                            // guarded by mu_: sticky
  std::mutex barrier_mu_;                                   // one Barrier at a time
  uint64_t next_barrier_ = 0;                               // guarded by mu_
  std::map<uint64_t, Status> barrier_done_;                 // guarded by mu_: answers not yet taken
  std::mutex ef_mu_;                                        // one error-feedback request at a time
  uint64_t next_ef_ = 0;                                    // guarded by mu_
  std::map<uint64_t, v1::LocalErrorFeedbackDone> ef_done_;  // guarded by mu_: not yet taken
  bool closed_ = false;                                     // guarded by mu_
  ClientStats stats_;                                       // guarded by mu_
};

}  // namespace bitpush::worker
