// EngineThread: one of the server's engine threads (server.engine_threads) — its task queue, the
// thread that drains it, the core it is pinned to, and the keys it owns (KeyTable). Each key
// sticks to one engine thread, chosen by the dispatcher at the key's OP_INIT_KEY; the
// dispatcher queues the key's messages here and the thread decompresses, aggregates,
// compresses and replies (KeyTable). Its busy time (wall clock and CPU) goes to ServerCounters.
//
// Owned by the Server, which starts the threads before the endpoint and stops and joins them
// after closing it (nothing is queued any more).
//
// Thread-safety: Enqueue, DropKeys, RequestStop, Info and the placement accessors (load, keys)
// from any thread — the queue is guarded by a mutex held only to push or pop, the placement
// counters are atomics; the KeyTable is touched by the engine thread alone (no lock on key
// data). Start and Join from the owning thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/cpu_topology.h"
#include "common/trace/recorder.h"
#include "server/key_table.h"
#include "server/server.h"
#include "server/server_counters.h"
#include "server/worker_peers.h"

namespace bitpush::server {

class EngineThread {
 public:
  // `slot`: the core to pin the thread to (none: not pinned).
  EngineThread(uint32_t rank, std::optional<CpuSlot> slot, WorkerPeers* workers,
               trace::Recorder* trace, ServerCounters* counters);
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

  // Starts the thread (it pins itself first; a failure is logged and it runs unpinned).
  void Start();
  // Queues a data message for this thread's keys.
  void Enqueue(DataTask task);
  // A new data-plane generation: forgets the placement weight and queues the drop of every key.
  void DropKeys();
  // Asks the thread to stop (queued messages are dropped); Join waits for it.
  void RequestStop();
  void Join();

  // Placement (the dispatcher): the weighted bytes and the keys placed here.
  uint64_t load() const { return load_.load(); }
  void AddKey(uint64_t weight) {
    load_ += weight;
    ++keys_;
  }
  EngineThreadInfo Info() const;

 private:
  void Loop();

  const uint32_t rank_;
  ServerCounters* const counters_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DataTask> queue_;  // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  CpuSlot slot_;
  // Set at construction; cleared by the engine thread if pinning fails; Info() reads it from any
  // thread.
  std::atomic<bool> pin_{false};
  std::atomic<uint64_t> keys_{0};
  std::atomic<uint64_t> load_{0};
  // Owned by the engine thread alone.
  KeyTable key_table_;
};

}  // namespace bitpush::server
