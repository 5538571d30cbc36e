// StateCalls: the tensor state a job saves and restores between rounds, and the server-side
// optimizer's weights — the worker's own error-feedback residuals (read and written here, under
// EngineState::mu), and the calls to the servers: their error-feedback residuals (checkpoints),
// the weights and the optimizer state of a server-side optimizer (OP_STATE_READ /
// OP_STATE_WRITE, one per partition to its server, answered by OP_STATE_REPLY or OP_ERROR,
// bounded by worker.op_timeout). Owned by the Engine (worker/engine.h), which forwards
// Client::ErrorFeedbackState ... RestoreServerOptimizerState (client.h) here.
//
// Threads: callers' threads run the calls, one server call at a time (state_call_mu_, the
// outermost lock); the endpoint's I/O thread delivers the answers (OnStateReply, OnRefused).
// A waiting call is woken by its answers and by whatever stops the engine (WakeWaiters).
//
// Thread-safety: every method may be called from any thread. Locks: state_call_mu_ ->
// TensorDeclarations' decl_mu_ -> EngineState::mu; nothing is sent while holding mu. Every
// call refuses (FailedPrecondition) while a push_pull of the tensor is in flight, so the
// partitions' residuals it reads or writes belong to no pool job.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/client.h"
#include "worker/engine/declarations.h"
#include "worker/engine/engine_state.h"

namespace bitpush::worker {

class StateCalls {
 public:
  StateCalls(EngineState& state, TensorDeclarations& declarations);
  StateCalls(const StateCalls&) = delete;
  StateCalls& operator=(const StateCalls&) = delete;

  // Client::ErrorFeedbackState / RestoreErrorFeedbackState (client.h).
  StatusOr<std::vector<float>> ErrorFeedbackState(TensorId tensor) const;
  Status RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved);
  // Client::SetErrorFeedbackDecay (client.h).
  Status SetErrorFeedbackDecay(TensorId tensor, float decay);
  // Client::ServerErrorFeedbackState / RestoreServerErrorFeedbackState (client.h).
  StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor);
  Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved);
  // Client::InitServerWeights / PullServerWeights / ServerOptimizerState /
  // RestoreServerOptimizerState (client.h).
  Status InitServerWeights(TensorId tensor, TensorView weights);
  Status PullServerWeights(TensorId tensor, TensorView weights);
  StatusOr<std::vector<std::string>> ServerOptimizerState(TensorId tensor);
  Status RestoreServerOptimizerState(TensorId tensor, const std::vector<std::string>& saved);

  // Client::TensorRounds / RestoreTensorRounds (client.h).
  StatusOr<uint64_t> TensorRounds(TensorId tensor) const;
  Status RestoreTensorRounds(TensorId tensor, uint64_t next);

  // The endpoint's handlers (its I/O thread): an OP_STATE_REPLY; an OP_ERROR that refused an
  // OP_STATE_READ / OP_STATE_WRITE.
  void OnStateReply(const std::string& from, const v1::DataHeader& h, const transport::Message& m);
  void OnRefused(const std::string& from, const v1::DataHeader& h);
  // Wakes a call waiting for its answers (to see that the engine stopped).
  void WakeWaiters() { state_cv_.notify_all(); }

 private:
  // One server call per partition key, answered by OP_STATE_REPLY or OP_ERROR (guarded by mu).
  struct StateCall {
    std::string peer;
    std::string what;  // "the server residual", for messages
    bool done = false;
    Status status;
    transport::Buffer frame;  // a read's answer
    uint64_t round = 0;       // a weights read: the round the key continues at
  };
  enum class StateKind : uint8_t { kResidual, kOptimizerState, kWeights, kRounds };

  // One call per partition of `id`: a write sends saved[j] to partition j's server (saved has
  // one entry per partition; moved into the frames, not copied; kRounds sends no frame and
  // `next_round` in the header); a read fills out[j] (the reply's frame) and rounds[j].
  // FailedPrecondition while a push_pull of the tensor is in flight. Only partitions [first, first
  // + count) when given.
  Status ServerStateCall(TensorId id, StateKind kind, bool write, std::vector<std::string> saved,
                         std::vector<transport::Buffer>* out,
                         std::vector<uint64_t>* rounds = nullptr, size_t first = 0,
                         size_t count = SIZE_MAX, uint64_t next_round = 0);
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

  EngineState& state_;
  TensorDeclarations& declarations_;
  std::mutex state_call_mu_;                   // one server call at a time
  std::map<uint64_t, StateCall> state_calls_;  // guarded by mu: the call in flight, by key
  std::condition_variable state_cv_;           // wakes ServerStateCall
};

}  // namespace bitpush::worker
