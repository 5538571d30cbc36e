// Engine: the worker engine — everything a worker node does between a training step's
// gradients and their aggregate: tensor declarations and their cross-worker check, the
// partition pipeline (compress with worker error feedback -> push -> pull -> decompress ->
// complete), priorities, the credit that bounds memory, op deadlines and failures
// (docs/data-plane.md, paper 001 Algorithms 3 and 4). The embedded `Client` (client.h) is a
// thin wrapper; the per-node daemon (worker/daemon.h) drives the same engine.
//
// The Engine owns the node's NodeEndpoint and SchedulerClient and the pieces that do the work,
// each in worker/engine/ with its own header (threads, ownership, failures):
//   EngineState         (engine_state.h)       the tensor table and sticky state, under one
//                                              mutex `mu` the pieces share;
//   TensorDeclarations  (declarations.h)       Declare, CommitDeclarations: the cross-worker
//                                              check at server 0 and the keys' announcement;
//   PartitionScheduler  (partition_scheduler.h) the ready queue by priority, the credit (and
//                                              why it cannot deadlock), op deadlines, the
//                                              dispatcher thread, an op's completion;
//   RoundPipeline       (round_pipeline.h)     the compression pool and one partition's round:
//                                              compress -> push -> reply -> decompress;
//   FailurePolicy       (failure_policy.h)     the SchedulerClient's membership events (cluster
//                                              error, shutdown verdict, worker finished, server
//                                              lost / rejoined) and WaitForServers;
//   StateCalls          (state_calls.h)        error-feedback state for checkpoints, the
//                                              server-side optimizer's weights and state.
// The Engine itself starts and stops them, routes the endpoint's data-plane messages to them,
// admits PushPull calls (the arguments, the tensor's state) and runs Shutdown / Close.
// Handles (PushPullHandle) share only the OpState (worker/engine/op_state.h): they may outlive
// the engine.
//
// Threads (docs/threading.md, "worker"): the endpoint's I/O thread (data-plane handlers and
// the SchedulerClient's callbacks), the compression pool (RoundPipeline), one dispatcher
// thread (PartitionScheduler), callers' threads (Declare, CommitDeclarations, PushPull — which
// never blocks on the network, except for a pending declaration check — the state calls, Wait
// on handles).
//
// Thread-safety: every public method may be called from any thread.
// Locks, outermost first: StateCalls' state_call_mu_ -> TensorDeclarations' declare_mu_ /
// decl_mu_ -> EngineState::mu -> {TaskPool's lock, an OpState's mu}.
// Nothing sends on the transport or calls the SchedulerClient while holding mu.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/node/endpoint.h"
#include "common/status.h"
#include "proto/bitpush/v1/control.pb.h"
#include "scheduler/scheduler_client.h"
#include "worker/client.h"
#include "worker/engine/declarations.h"
#include "worker/engine/engine_state.h"
#include "worker/engine/failure_policy.h"
#include "worker/engine/op_state.h"
#include "worker/engine/partition_scheduler.h"
#include "worker/engine/round_pipeline.h"
#include "worker/engine/state_calls.h"

namespace bitpush::worker {

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
  // The non-finite check of each push's input where the compression reports none of its own
  // (RoundPipeline::CompressAndPush; docs/errors.md). false only for a benchmark measuring
  // what the check costs (bitpush-bench pushpull --non-finite-check off): a NaN then goes on.
  bool check_non_finite = true;
  // The timeline's name for this engine's process within its node (docs/observability.md):
  // "engine" (embedded in a training process) or "daemon" (bitpush-worker).
  std::string trace_process = "engine";
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
  // Client::SetErrorFeedbackDecay (client.h).
  Status SetErrorFeedbackDecay(TensorId tensor, float decay);
  // Client::ServerErrorFeedbackState / RestoreServerErrorFeedbackState (client.h): one
  // OP_STATE_READ / OP_STATE_WRITE per partition to its server, bounded by op_timeout.
  StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor);
  Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved);
  // Client::TensorRounds / RestoreTensorRounds (client.h): the worker's count, and one
  // OP_STATE_WRITE `rounds` per partition to its server.
  // The timeline (docs/observability.md); null when tracing is off.
  trace::Recorder* trace() const { return trace_.get(); }
  // The first key of a declared tensor (a span's key outside the engine); 0 when unknown.
  uint64_t FirstKey(TensorId tensor) const;
  // A span of the step just pushed (the highest round any tensor completed), e.g. the
  // training script's optimizer step; nothing when tracing is off or that round is not traced.
  // `local_rank` >= 0: the daemon's training process it is about (the span's `local_rank`).
  void TraceStep(trace::SpanKind kind, int64_t start_ns, int64_t end_ns, int32_t local_rank = -1);
  StatusOr<uint64_t> TensorRounds(TensorId tensor);
  Status RestoreTensorRounds(TensorId tensor, uint64_t next);
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
  uint32_t compress_threads() const { return pipeline_.threads(); }

 private:
  Engine(EngineOptions& options, v1::ErrorFeedbackPolicy policy);
  Status Start(EngineOptions& options);

  // The endpoint's handlers (its I/O thread): each data-plane message to the piece it is for.
  void RegisterHandlers();
  // An OP_ERROR: a refused declaration, server-state call or push.
  void OnError(const std::string& from, const v1::DataHeader& h);

  const uint32_t rank_;
  uint32_t num_workers_ = 0;  // set by Start
  uint32_t num_servers_ = 0;  // set by Start
  EngineState state_;
  std::unique_ptr<trace::Recorder> trace_;              // state_.trace; null: tracing off
  std::unique_ptr<node::NodeEndpoint> endpoint_;        // state_.endpoint
  std::unique_ptr<scheduler::SchedulerClient> client_;  // state_.client
  TensorDeclarations declarations_;
  PartitionScheduler scheduler_;
  RoundPipeline pipeline_;
  StateCalls state_calls_;
  FailurePolicy failures_;
};

}  // namespace bitpush::worker
