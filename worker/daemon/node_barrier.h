// NodeBarrier: the worker daemon's barrier — Client::Barrier in daemon mode. The daemon's poll
// loop hands it every LocalBarrier request; once all of the node's `local_size` training
// processes entered barrier n, its thread "bp-dbarrier" runs the cluster's worker barrier once
// for the node (Engine::Barrier, bounded by the scheduler client's barrier timeout) and answers
// each process with LocalBarrierDone. A process may enter barrier n + 1 while n is still being
// gathered for the others; it then waits for the next gathering. A gathering may instead be a
// wait for the servers (Client::WaitForServers in daemon mode, LocalBarrier.wait_for_servers):
// the same collective over the node, whose thread runs the engine's WaitForServers once for
// the node (bounded by the smallest timeout its processes gave). Every process must enter the
// same kind at a given seq; a mix fails the whole gathering, naming both.
//
// Ownership: one per Daemon, which owns it. Thread-safety: Enter and FailWaiting from the
// poll loop only (they own the gathering state); Stop from the owner; the thread touches only
// the queue (its own mutex) and the callbacks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "worker/ipc/channel.h"

namespace bitpush::worker {

struct NodeBarrierOptions {
  std::string label;  // "bitpush-worker node 0", for errors and logs
  // The cluster's worker barrier for the node (Engine::Barrier).
  std::function<Status()> cluster_barrier;
  // The wait for a rejoining server, for the node (Engine::WaitForServers).
  std::function<Status(std::chrono::milliseconds)> wait_for_servers;
  // The node's error (OK while healthy): a barrier after a failure answers it, and a barrier
  // cancelled by the failure answers it instead of "cancelled".
  std::function<Status()> node_error;
};

class NodeBarrier {
 public:
  // Starts the barrier thread.
  explicit NodeBarrier(NodeBarrierOptions options);
  ~NodeBarrier();  // Stop()
  NodeBarrier(const NodeBarrier&) = delete;
  NodeBarrier& operator=(const NodeBarrier&) = delete;

  // Poll loop: the process `who` on `channel` entered barrier `seq` (its barriers in order;
  // the caller checked that): the cluster's barrier, or with `wait_for_servers` the wait for
  // the servers bounded by that timeout. `local_size`: the node's processes (0 = not known
  // yet: nobody passes).
  void Enter(const std::shared_ptr<ipc::Channel>& channel, const std::string& who, uint64_t seq,
             uint32_t local_size,
             std::optional<std::chrono::milliseconds> wait_for_servers = std::nullopt);
  // Poll loop: answers every process still gathering with `error` (except `skip`, the dead
  // one) and forgets them.
  void FailWaiting(const Status& error, const ipc::Channel* skip);
  // Ends the thread once the barriers already gathered are answered (call after the engine
  // closed, so a barrier in progress ends at once). Idempotent.
  void Stop();

  static void SendDone(ipc::Channel& channel, uint64_t seq, const Status& status,
                       const std::string& label);

 private:
  // What a gathering runs: the cluster's barrier (nullopt) or the wait for the servers with
  // this bound; and who entered it first, for the error a mix gets.
  struct Kind {
    std::optional<std::chrono::milliseconds> wait_for_servers;
    std::string first;
  };
  struct Job {
    uint64_t seq = 0;
    std::vector<std::shared_ptr<ipc::Channel>> channels;  // every local process
    std::optional<std::chrono::milliseconds> wait_for_servers;
  };
  void Loop();
  // Poll loop: adds an entrant's kind to a gathering's; false (with *error) on a mix.
  bool Join(Kind& kind, bool empty, const std::string& who,
            std::optional<std::chrono::milliseconds> wait_for_servers, uint64_t seq,
            Status* error) const;

  const NodeBarrierOptions options_;
  // Poll-loop state: the barrier being gathered (seq_) and early entrants of the next.
  uint64_t seq_ = 0;
  std::vector<std::shared_ptr<ipc::Channel>> waiting_;
  std::vector<std::shared_ptr<ipc::Channel>> next_;
  Kind kind_;
  Kind next_kind_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;  // guarded by mu_
  bool stop_ = false;      // guarded by mu_
  std::thread thread_;
};

}  // namespace bitpush::worker
