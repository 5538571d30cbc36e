#include "worker/engine/failure_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "common/logging.h"

namespace bitpush::worker {

FailurePolicy::FailurePolicy(EngineState& state, PartitionScheduler& scheduler,
                             TensorDeclarations& declarations, StateCalls& state_calls)
    : state_(state),
      scheduler_(scheduler),
      declarations_(declarations),
      state_calls_(state_calls) {}

void FailurePolicy::OnServerLost(uint64_t generation, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.closed || !state_.cluster_error.ok()) return;
    const Status error(why.code(), state_.label + ": " + why.message());
    state_.recovering = error;
    state_.generation = std::max(state_.generation.load(), generation);
    scheduler_.FailAllLocked(error);
  }
  declarations_.WakeWaiters();
  state_calls_.WakeWaiters();
  recover_cv_.notify_all();
}

void FailurePolicy::OnServerRejoined(uint32_t server, uint64_t generation) {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.closed || !state_.cluster_error.ok()) return;
    if (!state_.recovering) {
      // The new process registered before the old one's silence was noticed: no loss came
      // first, so what was in flight to the old process (which will never answer) fails now,
      // as OnServerLost would have failed it.
      scheduler_.FailAllLocked(UnavailableError(
          fmt::format("{}: server {} restarted (generation {}): the job rolled back", state_.label,
                      server, generation)));
    }
    // The job rolls back: every server dropped its keys and declarations of the old
    // generation, so every tensor is declared, announced and (server-side optimizer) given its
    // weights again; rounds start over (a restored optimizer state says where, when pulled).
    state_.generation = std::max(state_.generation.load(), generation);
    for (const auto& tp : state_.tensors) {
      Tensor& t = *tp;
      t.committed = false;
      t.error = Status::Ok();
      t.rounds_done = 0;
      t.weights_ready = false;
      for (Partition& p : t.partitions) p.next_round = 0;
    }
    finished_workers_.clear();
  }
  // The old process's connection is gone for good (the transport refuses sends on it): connect
  // to the new one at the same address before anything is sent there.
  const std::string peer = node::NodePeerId(v1::ROLE_SERVER, server);
  for (const v1::NodeInfo& s : state_.client->assignment().servers()) {
    if (s.rank() != server) continue;
    const std::string& address = s.data_address().empty() ? s.address() : s.data_address();
    state_.endpoint->Disconnect(peer);
    if (Status c = state_.endpoint->Connect(peer, address); !c.ok()) {
      OnClusterError(c.WithContext(fmt::format("{}: reconnecting to the rejoined server {} at {}",
                                               state_.label, server, address)));
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    BP_LOG_WARN(
        "{}: server {} rejoined: the job continues in generation {} (restore its "
        "checkpoint before the next step)",
        state_.label, server, state_.generation.load());
    state_.recovering.reset();
    state_.rolled_back = UnavailableError(fmt::format(
        "{}: server {} rejoined (generation {}): the job rolled back; call WaitForServers "
        "(bitpush.torch.wait_for_servers), restore the checkpoint and go on from it",
        state_.label, server, state_.generation.load()));
  }
  // A declaration or state call waiting on the old generation's servers fails now
  // (StoppedLocked: rolled_back) instead of at its deadline.
  declarations_.WakeWaiters();
  state_calls_.WakeWaiters();
  recover_cv_.notify_all();
}

Status FailurePolicy::WaitForServers(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_.mu);
  // A push_pull can fail on a server's dropped connection before the scheduler's verdict: with
  // no server missing yet, wait up to two heartbeat timeouts for one to be declared.
  if (!state_.recovering && state_.cluster_error.ok() && !state_.closed) {
    const uint64_t before = state_.generation.load();
    recover_cv_.wait_for(lock, std::min(timeout, 2 * state_.cluster.heartbeat_timeout), [&] {
      return state_.recovering.has_value() || state_.generation.load() != before ||
             !state_.cluster_error.ok() || state_.closed;
    });
  }
  const bool back = recover_cv_.wait_for(lock, timeout, [&] {
    return !state_.recovering.has_value() || !state_.cluster_error.ok() || state_.closed;
  });
  if (!state_.cluster_error.ok()) return state_.cluster_error;
  if (state_.closed) return CancelledError(state_.label + ": the client was closed");
  if (!back && state_.recovering) {
    return TimeoutError(fmt::format("{}: the failed server did not rejoin within {} ms: {}",
                                    state_.label, timeout.count(), state_.recovering->message()));
  }
  state_.rolled_back.reset();  // acknowledged: the caller restores the checkpoint now
  return Status::Ok();
}

std::optional<Status> FailurePolicy::FinishedWorkerBlocksLocked(const Tensor& t) const {
  if (t.partitions.empty()) return std::nullopt;  // completes without the servers
  for (const auto& [worker, rounds] : finished_workers_) {
    const uint64_t theirs = t.index < rounds.size() ? rounds[t.index] : 0;
    if (t.rounds_done < theirs) continue;
    return FailedPreconditionError(fmt::format(
        "{}: push_pull of tensor '{}' (its push_pull #{} here) cannot complete: worker {} is "
        "done after {} push_pull{} of it (its training ended). The workers ran different "
        "numbers of steps (uneven data?): give every worker the same number of steps, e.g. "
        "the same number of batches per epoch (drop the last partial batch)",
        state_.label, t.name, t.rounds_done + 1, worker, theirs, theirs == 1 ? "" : "s"));
  }
  return std::nullopt;
}

void FailurePolicy::OnWorkerFinished(uint32_t worker, const std::vector<uint64_t>& rounds) {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (worker == state_.rank) return;
  finished_workers_[worker] = rounds;
  for (const auto& tp : state_.tensors) {
    Tensor& t = *tp;
    if (!t.op || t.op->failed) continue;
    if (std::optional<Status> blocked = FinishedWorkerBlocksLocked(t)) {
      std::shared_ptr<OpState> op = t.op;
      scheduler_.FailOpLocked(t, op, *blocked);
      scheduler_.MaybeFinishLocked(t, op);
    }
  }
}

void FailurePolicy::OnClusterError(const Status& error) {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.cluster_error.ok()) state_.cluster_error = error;
    scheduler_.FailAllLocked(error);
  }
  declarations_.WakeWaiters();
  state_calls_.WakeWaiters();
  recover_cv_.notify_all();
}

void FailurePolicy::OnShutdownVerdict(const Status& verdict) {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    // Shutdown() sent this worker's Done: the end it asked for. After Close nothing waits.
    if (state_.shutting_down || state_.closed) return;
    // An error shutdown is the sticky error already (on_error came first); a clean one reached a
    // worker that is still training: its job ended under it, so everything fails now (sticky,
    // like a cluster error) rather than at op_timeout.
    if (state_.cluster_error.ok()) {
      state_.cluster_error =
          Status(verdict.code(), fmt::format("{}: {} before this worker finished (it "
                                             "sent no Done)",
                                             state_.label, verdict.message()));
    }
    scheduler_.FailAllLocked(state_.cluster_error);
  }
  declarations_.WakeWaiters();
  state_calls_.WakeWaiters();
}

}  // namespace bitpush::worker
