// PartitionScheduler: the order and pace in which a worker's partitions go out — the queue of
// ready partitions, the credit that bounds memory, op deadlines — and the bookkeeping that
// moves a partition back to idle and completes its op. Owned by the Engine (worker/engine.h);
// RoundPipeline (round_pipeline.h) runs the jobs it starts and reports back through the
// *Locked methods. All of its state is guarded by EngineState::mu.
//
// Threads (docs/threading.md, "worker"): one dispatcher thread owns the queue of ready
// partitions, ordered by (priority, tensor index, partition index), and starts one only while
// the uncompressed bytes in flight plus its own stay <= worker.credit_bytes (at least one
// partition is always in flight) and, for a raw (uncompressed) partition, the raw bytes in
// flight at its server plus its own stay <= worker.server_window_bytes (at least one per
// server; a partition whose server is full waits while later ones for other servers go, so
// priority order holds per server). Starting one posts its compress + push job to the
// compression pool (the `StartJob` the Engine wires to RoundPipeline). It also enforces
// worker.op_timeout, sleeping until the next deadline (no polling). Callers' threads queue ops
// (EnqueueLocked, from Engine::PushPull); pool jobs, the endpoint's I/O thread and the
// transport's threads (a push's InputLease) report progress through the *Locked methods.
//
// Credit without deadlock: a partition holds its credit until the server's reply, and the
// server replies only once every worker pushed. If two workers started different partitions
// (their push_pulls arrived at different moments, so priority picked differently), each could
// hold the credit for partitions the other has not pushed and wait forever. Rule: the
// partition first in posting order — (op sequence number, partition), the op sequence being
// the order of this worker's PushPull calls — among those queued or in flight always goes,
// even over the credit. When every worker posts its push_pulls in the same order (the same
// training loop), the globally earliest incomplete partition is therefore always moving on
// every worker, so the cluster always progresses; the credit is exceeded by at most that one
// partition. (Workers posting in different orders can still stall; op_timeout reports it.)
//
// Completion: a failed op (FailOpLocked: a server's OP_ERROR, a failed Send, op_timeout, the
// cluster's failure) gives back its queued and pushed partitions at once; its handle is
// signalled only once no job touches its input/output any more (MaybeFinishLocked), so the
// caller may free them as soon as Wait returns. A tensor whose push_pull failed after it
// started has rounds out of step with the servers: later push_pulls of it fail with that error
// (sticky per tensor, Tensor::error).
//
// Thread-safety: Start and Stop from the Engine's owner thread; every *Locked method with
// EngineState::mu held. Nothing here sends on the transport.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/engine/engine_state.h"

namespace bitpush::worker {

class PartitionScheduler {
 public:
  // Posts the compress + push job of partition `j` of `t` for `round` (mu held); false when
  // the pool no longer takes jobs.
  using StartJob = std::function<bool(Tensor* t, uint32_t j, const std::shared_ptr<OpState>& op,
                                      uint64_t round)>;

  PartitionScheduler(EngineState& state, StartJob start_job);
  PartitionScheduler(const PartitionScheduler&) = delete;
  PartitionScheduler& operator=(const PartitionScheduler&) = delete;

  // Starts the dispatcher thread; Stop wakes and joins it (idempotent).
  void Start();
  void Stop();

  // Caller holds mu. Queues every partition of `t` for `op` (t.op is set to it) with the op's
  // deadline, worker.op_timeout from now.
  void EnqueueLocked(Tensor& t, const std::shared_ptr<OpState>& op);
  // Moves `p` (partition of tensor `t`) to kIdle, returning its credit if it held some, and
  // wakes the dispatcher.
  void SetIdleLocked(Tensor& t, Partition& p);
  // A pool job's end of partition `p` of `t` (its reply decoded): p goes idle, the job ends
  // (JobDoneLocked), and the partitions its credit made room for start on the calling thread
  // (DispatchReadyLocked) instead of waking the dispatcher: one thread handoff less per
  // partition.
  void CompleteLocked(Tensor& t, Partition& p, const std::shared_ptr<OpState>& op);
  // Fails `op` (the op of `t`) with `error`: its queued and pushed partitions go idle, the
  // tensor's error becomes sticky. The handle is signalled by MaybeFinishLocked.
  void FailOpLocked(Tensor& t, const std::shared_ptr<OpState>& op, const Status& error);
  // Fails every op in flight with `error` (in context) and completes those no job holds.
  void FailAllLocked(const Status& error);
  // One of op's active jobs ended.
  void JobDoneLocked(Tensor& t, const std::shared_ptr<OpState>& op);
  // Completes `op` once no job holds it and it failed or every partition is complete.
  void MaybeFinishLocked(Tensor& t, const std::shared_ptr<OpState>& op);
  // ClientStats' bytes_in_flight and partitions_queued.
  void FillStatsLocked(ClientStats* s) const;

 private:
  struct Ready {
    int64_t priority;
    uint32_t tensor;
    uint32_t partition;
    bool operator>(const Ready& o) const {
      if (priority != o.priority) return priority > o.priority;
      if (tensor != o.tensor) return tensor > o.tensor;
      return partition > o.partition;
    }
  };

  // Dispatcher thread: DispatchReadyLocked, then op deadlines, then sleep until woken or the
  // next deadline.
  void DispatchLoop();
  // Starts every queued partition the credit and the server windows allow, in priority order,
  // and the first in posting order (mu held; the dispatcher or a pool job finishing a
  // partition).
  void DispatchReadyLocked();
  // SetIdleLocked without waking the dispatcher.
  void ReleaseLocked(Tensor& t, Partition& p);
  // Takes the credit for queued partition `j` of `t` and posts its compress job.
  void StartLocked(Tensor& t, uint32_t j);
  // The raw bytes in flight at `server` (grown on first use).
  uint64_t& RawBytesAt(uint32_t server);
  // Whether raw partition `p` may start under worker.server_window_bytes (`window`): its
  // server has nothing raw in flight, or room for it.
  bool FitsServerWindowLocked(const Partition& p, uint64_t window);
  Status TimeoutStatusLocked(const Tensor& t, const OpState& op) const;

  EngineState& state_;
  const StartJob start_job_;
  std::thread dispatcher_;
  std::condition_variable dispatch_cv_;  // wakes the dispatcher
  // Guarded by mu.
  std::priority_queue<Ready, std::vector<Ready>, std::greater<Ready>> ready_;
  std::set<std::pair<EngineClock::time_point, uint32_t>> deadlines_;  // (deadline, tensor)
  uint64_t in_flight_bytes_ = 0;
  std::vector<uint64_t> raw_by_server_;  // raw bytes in flight by server (server window)
  uint64_t next_op_seq_ = 0;
  // Partitions queued or in flight, by (op sequence, tensor, partition): the first one always
  // goes (see "Credit without deadlock").
  std::set<std::tuple<uint64_t, uint32_t, uint32_t>> active_;
  bool stop_ = false;
  // DispatchReadyLocked's scratch: raw partitions whose server's window is full, and which
  // servers are full, during one pass.
  std::vector<Ready> waiting_;
  std::vector<bool> full_;
};

}  // namespace bitpush::worker
