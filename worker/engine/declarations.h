// TensorDeclarations: a worker's tensor table as it grows — Declare builds a Tensor record
// (its compression plan, partitions, each partition's compressor, worker residual and, for a
// server-side optimizer, the weights' pull compressor) — and the commit of new declarations:
// the cross-worker check at server 0 (OP_DECLARE, answered by OP_DECLARE_REPLY or OP_ERROR)
// and the announcement of every key to its server (OP_INIT_KEY). Owned by the Engine
// (worker/engine.h); PushPull and StateCalls commit a tensor on its first use.
//
// Threads: callers' threads run Declare (serialised by declare_mu_, which keeps tensor indices
// in call order) and Commit (serialised by decl_mu_; it sends, then waits for server 0's
// verdict, bounded by cluster.startup_timeout); the endpoint's I/O thread delivers the verdict
// (OnReply / OnRefused). The waiting Commit is woken by the verdict and by whatever stops the
// engine (WakeWaiters).
//
// Thread-safety: every method may be called from any thread. Locks: declare_mu_ / decl_mu_ ->
// EngineState::mu; nothing is sent while holding mu.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/client.h"
#include "worker/engine/engine_state.h"

namespace bitpush::worker {

class TensorDeclarations {
 public:
  explicit TensorDeclarations(EngineState& state);
  TensorDeclarations(const TensorDeclarations&) = delete;
  TensorDeclarations& operator=(const TensorDeclarations&) = delete;

  // Engine::Declare / CommitDeclarations (client.h).
  StatusOr<TensorId> Declare(const std::string& name, size_t elements, DType dtype,
                             const TensorOptions& options);
  Status Commit();

  // The endpoint's handlers (its I/O thread): server `from`'s OP_DECLARE_REPLY for `epoch`;
  // an OP_ERROR, which this takes (true) when it refused the pending declaration.
  void OnReply(const std::string& from, uint64_t epoch);
  bool OnRefused(const std::string& from, const v1::DataHeader& h);
  // Wakes a Commit waiting for its verdict (to see that the engine stopped).
  void WakeWaiters() { decl_cv_.notify_all(); }

 private:
  // Sends the manifest of `tensors` for `epoch` to server 0 and waits.
  Status CheckDeclarations(uint64_t epoch, const std::vector<uint32_t>& tensors);
  Status AnnounceKeys(const std::vector<uint32_t>& tensors);
  void OnVerdict(uint64_t epoch, Status verdict);

  EngineState& state_;
  std::mutex declare_mu_;            // serialises Declare (tensor indices are assigned in order)
  std::mutex decl_mu_;               // serialises Commit
  uint64_t next_epoch_ = 0;          // guarded by decl_mu_
  uint64_t epoch_generation_ = 0;    // guarded by decl_mu_: the generation next_epoch_ counts in
  std::condition_variable decl_cv_;  // wakes CheckDeclarations
  std::optional<uint64_t> pending_epoch_;  // guarded by mu: declaration awaited
  std::optional<Status> declare_verdict_;  // guarded by mu
};

}  // namespace bitpush::worker
