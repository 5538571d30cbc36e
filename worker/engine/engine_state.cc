#include "worker/engine/engine_state.h"

#include <fmt/format.h>

#include <utility>

namespace bitpush::worker {

EngineState::EngineState(uint32_t rank, const config::ClusterConfig& cluster,
                         v1::ErrorFeedbackPolicy policy, const std::shared_ptr<const Clock>& clock)
    : label(fmt::format("worker {}", rank)),
      rank(rank),
      cluster(cluster),
      policy(policy),
      isa(BestIsaLevel()),
      clock(clock ? clock : SystemClock()) {}

std::optional<Status> EngineState::StoppedLocked() const {
  if (!cluster_error.ok()) return cluster_error;
  if (closed) return CancelledError(label + ": the client was closed");
  if (shutting_down) return CancelledError(label + ": the client is shutting down");
  if (recovering) return recovering;
  if (rolled_back) return rolled_back;
  return std::nullopt;
}

Tensor* EngineState::FindTensorLocked(uint64_t key, uint32_t* partition) {
  const uint64_t index = key >> 32;
  if (index >= tensors.size()) return nullptr;
  Tensor* t = tensors[index].get();
  const uint64_t j = key & 0xffffffffu;
  if (j >= t->partitions.size()) return nullptr;
  *partition = static_cast<uint32_t>(j);
  return t;
}

uint64_t Ns(EngineClock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

Status RemoteStatus(uint32_t code, std::string message) {
  if (code == 0 || code > static_cast<uint32_t>(StatusCode::kUnimplemented)) {
    return RemoteError(std::move(message));
  }
  return Status(static_cast<StatusCode>(code), std::move(message));
}

std::string ServerLabel(const std::string& peer) {
  return peer.rfind("server:", 0) == 0 ? "server " + peer.substr(7) : peer;
}

}  // namespace bitpush::worker
