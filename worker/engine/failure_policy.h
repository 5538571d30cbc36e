// FailurePolicy: what a worker does when the cluster changes under it — the membership events
// of its SchedulerClient (scheduler/scheduler_client.h): the cluster's sticky error (on_error,
// e.g. a server declared dead), the scheduler's Shutdown reaching a worker that did not ask
// for it (on_shutdown), another worker finishing its training (on_worker_finished), a server
// lost and rejoined (on_server_lost / on_server_rejoined, cluster.server_rejoin_timeout_s) —
// and WaitForServers, which waits for a lost server to come back. Owned by the Engine
// (worker/engine.h), which wires the SchedulerClient's callbacks here.
//
// Failures: a server's OP_ERROR, a failed Send, op_timeout (PartitionScheduler,
// RoundPipeline), the cluster's sticky error, the scheduler's Shutdown reaching a worker that
// did not ask for it (clean or not: the verdict becomes the sticky error, so status() reports
// it), Shutdown and Close (Engine) all complete the affected handles with a Status naming the
// cause; never a hang. Here: a cluster error or an unasked-for shutdown fails every pending
// and later call (sticky, EngineState::cluster_error); a lost server fails every pending
// push_pull and every new one with Unavailable until it rejoins (EngineState::recovering); its
// rejoining resets every tensor to "declared, not committed", rounds from 0, for the job to
// restore its checkpoint in the new generation (EngineState::generation), and every new
// push_pull and call fails with Unavailable until WaitForServers returned
// (EngineState::rolled_back: a worker that had nothing in flight while the server was missing
// rolls back with the others). A rejoin that comes without a loss first (the new process
// registered before the old one's silence was noticed) fails what was in flight as a loss
// would, and wakes declarations and state calls waiting on the old process; a finished worker
// fails the push_pulls that can no longer complete (their round is beyond what that worker
// pushed), now and later.
//
// Threads: the SchedulerClient's callbacks run on the endpoint's I/O thread; WaitForServers
// and FinishedWorkerBlocksLocked (from Engine::PushPull) on callers' threads.
//
// Thread-safety: every method may be called from any thread; FinishedWorkerBlocksLocked with
// EngineState::mu held. Reconnecting to a rejoined server happens outside mu.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "common/status.h"
#include "worker/engine/declarations.h"
#include "worker/engine/engine_state.h"
#include "worker/engine/partition_scheduler.h"
#include "worker/engine/state_calls.h"

namespace bitpush::worker {

class FailurePolicy {
 public:
  FailurePolicy(EngineState& state, PartitionScheduler& scheduler, TensorDeclarations& declarations,
                StateCalls& state_calls);
  FailurePolicy(const FailurePolicy&) = delete;
  FailurePolicy& operator=(const FailurePolicy&) = delete;

  // SchedulerClientOptions::on_error: the cluster's sticky error.
  void OnClusterError(const Status& error);
  // SchedulerClientOptions::on_shutdown: a Shutdown this worker did not ask for (no Shutdown()
  // call) fails every pending and later call with the scheduler's verdict (sticky).
  void OnShutdownVerdict(const Status& verdict);
  // SchedulerClientOptions::on_worker_finished: fails the push_pulls that can no longer
  // complete (their round is beyond what that worker pushed), now and later.
  void OnWorkerFinished(uint32_t worker, const std::vector<uint64_t>& rounds);
  // SchedulerClientOptions::on_server_lost / on_server_rejoined.
  void OnServerLost(uint64_t generation, const Status& why);
  void OnServerRejoined(uint32_t server, uint64_t generation);
  // Engine::WaitForServers (client.h): after a server failed, waits (bounded) until it
  // rejoined (OK: restore the job's checkpoint next), or returns the cluster's error / Timeout.
  Status WaitForServers(std::chrono::milliseconds timeout);
  // Wakes a WaitForServers call (to see that the engine was closed).
  void WakeWaiters() { recover_cv_.notify_all(); }
  // Why tensor `t`'s next round (t.rounds_done) cannot complete, if a finished worker did not
  // push it. Caller holds mu.
  std::optional<Status> FinishedWorkerBlocksLocked(const Tensor& t) const;

 private:
  EngineState& state_;
  PartitionScheduler& scheduler_;
  TensorDeclarations& declarations_;
  StateCalls& state_calls_;
  // Other workers that are done: rank -> the push_pulls each completed of each tensor (by
  // index; guarded by mu).
  std::map<uint32_t, std::vector<uint64_t>> finished_workers_;
  std::condition_variable recover_cv_;  // wakes WaitForServers
};

}  // namespace bitpush::worker
