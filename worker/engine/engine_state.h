// EngineState: the worker engine's shared state — the tensor table (one Tensor record per
// declaration: each partition's compressor instance, worker residual, round counter and
// reusable payload buffer), the cluster's sticky verdicts, the data plane's generation and the
// counters — with the one mutex, `mu`, that guards it. The Engine (worker/engine.h) owns it;
// its pieces share it by reference:
//   TensorDeclarations (declarations.h)  appends tensors; commits them (`committed`, `error`);
//   PartitionScheduler (partition_scheduler.h)  the stages and credit of queued partitions,
//                        an op's completion (`op`, `rounds_done`, `error` when an op fails);
//   RoundPipeline (round_pipeline.h)      what a pool job or a data-plane reply does to the
//                        partition it holds (compressor, residual, payload, telemetry);
//   FailurePolicy (failure_policy.h)      `cluster_error`, `recovering`, `generation`, and the
//                        reset of every tensor when a server rejoins;
//   StateCalls (state_calls.h)            reads and writes residuals and weights between rounds
//                        (`weights_ready`, `rounds_done` / `next_round` after a weights read);
//   Engine                                `closed`, `shutting_down`, PushPull's `op`.
// Every field below says who writes it and what guards it.
//
// Partition ownership: a partition's stage (queued, compressing, on the wire, decompressing,
// idle) changes under mu, and whoever moved it into compressing/decompressing — one pool job
// — owns its compressor, residual and buffers until it moves it out. So the per-partition
// compressor state needs no lock and at most one job touches it at a time. A Tensor's name,
// sizes, config and partitions' keys, owners and compressors (the objects, not their state)
// are immutable after Declare, and Tensor records are never removed: a Tensor* taken under mu
// stays valid for the engine's life.
//
// Thread-safety: the fields marked "immutable" may be read from any thread without mu; every
// other field only under mu (the atomics excepted). Lock order: see worker/engine.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/cpu_features.h"
#include "common/node/endpoint.h"
#include "common/status.h"
#include "common/trace/recorder.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/mirror_pull.h"
#include "proto/bitpush/v1/control.pb.h"
#include "scheduler/scheduler_client.h"
#include "worker/client.h"
#include "worker/engine/op_state.h"
#include "worker/partition.h"

namespace bitpush::worker {

// Server 0's peer id: it checks every worker's declarations.
inline constexpr char kServer0[] = "server:0";

enum class Stage : uint8_t { kIdle, kQueued, kCompressing, kOnWire, kDecompressing };

struct Partition {
  // Immutable after Declare.
  PartitionRange range;
  uint32_t server = 0;
  std::string peer;    // "server:N"
  uint64_t bytes = 0;  // uncompressed bytes (what the credit counts)
  // Owned by the job that holds the partition (stage kCompressing / kDecompressing); between
  // rounds (stage kIdle, no op in flight) by StateCalls under mu.
  std::unique_ptr<compressors::Compressor> compressor;
  std::unique_ptr<compressors::ErrorFeedback> residual;  // worker error feedback
  // Server-side optimizer: the weights' pull compressor (decodes the replies).
  std::unique_ptr<compressors::Compressor> pull;
  std::unique_ptr<compressors::CompressorPullCodec> pull_codec;
  std::shared_ptr<std::vector<uint8_t>> payload;  // reused when nobody else refers to it
  // Guarded by mu.
  Stage stage = Stage::kIdle;         // PartitionScheduler and RoundPipeline
  uint64_t next_round = 0;            // the round of the next push (PartitionScheduler; reset by
                                      // FailurePolicy and StateCalls between rounds)
  uint64_t round = 0;                 // the round in flight (stage kOnWire / kDecompressing)
  uint64_t seq = 0;                   // the posting sequence number of its op (queued or in flight)
  EngineClock::time_point pushed_at;  // RoundPipeline
  double error_sq = 0;     // the error state's squared norm as last reported (RoundPipeline)
  double gradient_sq = 0;  // the gradient's squared norm as last reported (RoundPipeline)
};

struct Tensor {
  // Immutable after Declare (TensorDeclarations).
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
  // Guarded by mu.
  bool weights_ready = false;   // server-side optimizer: this worker's copy came from the servers
  bool committed = false;       // declaration checked and keys announced
  Status error;                 // sticky: failed declaration, or a push_pull failed mid-way
  std::shared_ptr<OpState> op;  // the push_pull in flight
  uint64_t rounds_done = 0;     // push_pulls completed OK (the round number of the next one)
  float ef_decay = 1.0f;        // the worker residual's decay (StateCalls::SetErrorFeedbackDecay)
  bool saturation_warned = false;  // RoundPipeline logged this tensor's saturation
};

struct EngineState {
  EngineState(uint32_t rank, const config::ClusterConfig& cluster, v1::ErrorFeedbackPolicy policy,
              const std::shared_ptr<const Clock>& clock);

  // Immutable.
  const std::string label;  // "worker 0"
  const uint32_t rank;
  const config::ClusterConfig cluster;
  const v1::ErrorFeedbackPolicy policy;
  const IsaLevel isa;
  const std::shared_ptr<const Clock> clock;
  // EngineOptions::check_non_finite; set by the Engine's constructor, then read-only.
  bool check_non_finite = true;
  // Owned by the Engine; set by Engine::Start before the endpoint starts, then read-only.
  node::NodeEndpoint* endpoint = nullptr;
  scheduler::SchedulerClient* client = nullptr;
  // The timeline (common/trace/recorder.h; thread-safe); null when tracing is off.
  trace::Recorder* trace = nullptr;

  mutable std::mutex mu;
  // Tensors: appended under mu (TensorDeclarations::Declare), never removed; unique_ptr so
  // references stay valid.
  std::vector<std::unique_ptr<Tensor>> tensors;
  std::map<std::string, uint32_t> names;
  ClientStats stats;           // every piece adds to it under mu
  Status cluster_error;        // sticky (FailurePolicy)
  bool shutting_down = false;  // Engine::Shutdown
  bool closed = false;         // Engine::Close
  // A server failed and may rejoin: why (every new push_pull fails with it). FailurePolicy.
  std::optional<Status> recovering;
  // A server rejoined and the job rolled back, and WaitForServers has not returned since:
  // every new push_pull and call fails with it (Unavailable), so a worker that missed the
  // failure window (nothing in flight while the server was missing) still restores the
  // checkpoint with the others instead of going on alone. FailurePolicy.
  std::optional<Status> rolled_back;
  // The data plane's generation, stamped on every message to a server (written under mu by
  // FailurePolicy; read anywhere).
  std::atomic<uint64_t> generation{0};

  // The error new push_pulls and calls get (cluster error, closed, shutting down, a server
  // being replaced), if any. Caller holds mu.
  std::optional<Status> StoppedLocked() const;
  // The tensor and partition a data-plane key names (key = tensor index << 32 | partition), or
  // null. Caller holds mu.
  Tensor* FindTensorLocked(uint64_t key, uint32_t* partition);
};

// Helpers the pieces share.
uint64_t Ns(EngineClock::duration d);
// The Status a server's OP_ERROR carries (its code when it is a valid one).
Status RemoteStatus(uint32_t code, std::string message);
// "server 3" for peer "server:3" (other peers as they are).
std::string ServerLabel(const std::string& peer);

}  // namespace bitpush::worker
