// ClientBackend: what a worker::Client runs on, chosen once by Client::Create from
// ClientOptions::mode — the node's own Engine in this process (embedded mode, client.cc's
// EngineBackend) or the node's bitpush-worker daemon over local IPC (daemon mode, client.cc's
// DaemonBackend over DaemonClient). Client forwards every call to its backend; a third way of
// running a worker (another local transport, say) is a third implementation, not a branch in
// every Client method.
//
// Ownership: the Client owns its backend, the backend its Engine or DaemonClient.
// Thread-safety: as Client's: every method from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/span.h"
#include "common/status.h"
#include "common/tensor_view.h"
#include "worker/client.h"

namespace bitpush::worker {

class ClientBackend {
 public:
  virtual ~ClientBackend() = default;

  virtual StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                                     const TensorOptions& options) = 0;
  virtual Status CommitDeclarations() = 0;
  virtual PushPullHandle PushPull(TensorId tensor, ConstTensorView input, TensorView output) = 0;
  // Server-side optimizer tensors (client.h); the daemon backend refuses them.
  virtual PushPullHandle PushPull(TensorId tensor, ConstTensorView gradient, TensorView weights,
                                  float lr) = 0;
  virtual Status InitServerWeights(TensorId tensor, TensorView weights) = 0;
  virtual Status PullServerWeights(TensorId tensor, TensorView weights) = 0;
  virtual StatusOr<std::vector<std::string>> ServerOptimizerState(TensorId tensor) = 0;
  virtual Status RestoreServerOptimizerState(TensorId tensor,
                                             const std::vector<std::string>& saved) = 0;
  virtual Status WaitForServers(std::chrono::milliseconds timeout) = 0;
  virtual Status Barrier() = 0;
  virtual Status Shutdown(std::chrono::milliseconds timeout) = 0;
  virtual void Close() = 0;

  virtual uint32_t rank() const = 0;
  virtual uint32_t num_workers() const = 0;
  virtual uint32_t num_servers() const = 0;
  virtual Status status() const = 0;
  virtual ClientStats stats() const = 0;

  virtual StatusOr<std::vector<float>> ErrorFeedbackState(TensorId tensor) = 0;
  virtual Status RestoreErrorFeedbackState(TensorId tensor, Span<const float> saved) = 0;
  virtual Status SetErrorFeedbackDecay(TensorId tensor, float decay) = 0;
  virtual StatusOr<std::vector<float>> ServerErrorFeedbackState(TensorId tensor) = 0;
  virtual Status RestoreServerErrorFeedbackState(TensorId tensor, Span<const float> saved) = 0;
  virtual StatusOr<uint64_t> TensorRounds(TensorId tensor) = 0;
  virtual Status RestoreTensorRounds(TensorId tensor, uint64_t next) = 0;
  // The timeline's `optimizer` span (docs/observability.md): recorded by the engine's timeline
  // (embedded) or sent to the node's daemon, whose engine records it (daemon mode); nothing
  // when tracing is off.
  virtual void TraceOptimizer(int64_t /*start_ns*/, int64_t /*end_ns*/) {}
};

}  // namespace bitpush::worker
