// KeyTable: the keys one engine thread owns — each key's KeyState (server/key_state.h) and what
// the data plane keeps beside it — and the requests about them: OP_INIT_KEY creates a key (on
// the engine's pinned thread, so first touch puts its buffers on the thread's NUMA node),
// OP_PUSH adds a worker's push and answers every push whose round is published with the
// round's OP_PULL_REPLY (the same Buffer to every worker, no copy), OP_STATE_READ /
// OP_STATE_WRITE move a key's server residual, optimizer state or weights in and out. Every
// refused request is answered with OP_ERROR (WorkerPeers::SendError).
//
// Owned by its EngineThread and run on that thread alone: no lock on key data, by design.
//
// Thread-safety: not thread-safe (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/trace/recorder.h"
#include "common/transport/message.h"
#include "proto/bitpush/v1/control.pb.h"
#include "server/key_state.h"
#include "server/server_counters.h"
#include "server/worker_peers.h"

namespace bitpush::server {

// One data message for an engine thread: its parsed header, its frames and the worker that sent
// it. A task with op OP_UNSPECIFIED drops every key of the thread (a new data-plane generation).
struct DataTask {
  v1::DataHeader header;
  transport::Message message;
  uint32_t worker = 0;
  int64_t received_ns = 0;  // when the dispatcher took it (steady clock; only when tracing)
};

class KeyTable {
 public:
  // `trace`: the server's timeline (null: off).
  KeyTable(uint32_t rank, WorkerPeers* workers, ServerCounters* counters,
           trace::Recorder* trace = nullptr)
      : rank_(rank), workers_(workers), counters_(counters), trace_(trace) {}
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;

  // OP_INIT_KEY: creates the key, or checks a later worker's declaration against the first.
  void Init(const DataTask& task);
  // OP_PUSH: the push into its key's round; answers the pushes whose round is published.
  void Push(DataTask& task);
  // OP_STATE_READ / OP_STATE_WRITE: the key's server residual out of / into a checkpoint (or,
  // with `optimizer_state` / `weights`, its optimizer state / weights).
  void State(const DataTask& task);
  // Drops every key (a new data-plane generation).
  void Clear() { keys_.clear(); }

 private:
  // The timeline's spans of one accepted push (trace_ set, its round traced): arrival, queue,
  // sum and, when it completed the round, the publication.
  void TracePush(const DataTask& task, int64_t start_ns, size_t bytes, const KeyState& state,
                 uint64_t published_before);
  struct KeyEntry {
    std::unique_ptr<KeyState> state;
    v1::DataHeader init;  // the first OP_INIT_KEY (later ones must match it)
    // Workers whose OP_STATE_READ `weights` waits for the key's weights to be installed (at
    // most one entry per worker).
    std::vector<uint32_t> weight_readers;
    // Pushes accepted whose round is not published yet: (worker, round) to answer.
    std::vector<std::pair<uint32_t, uint64_t>> waiting;
  };

  // OP_STATE_READ / OP_STATE_WRITE with `weights`: a server-side optimizer key's starting
  // weights in, the workers' copy out (a read before the install waits in weight_readers).
  void Weights(KeyEntry& entry, const DataTask& task, v1::DataHeader reply);
  void AnswerWeightReaders(KeyEntry& entry);
  void SendWorkersWeights(KeyEntry& entry, uint32_t worker);
  // Answers the waiting pushes whose round is published.
  void ServeWaiting(KeyEntry& entry);

  const uint32_t rank_;
  WorkerPeers* const workers_;
  ServerCounters* const counters_;
  trace::Recorder* const trace_;
  std::unordered_map<uint64_t, KeyEntry> keys_;
};

}  // namespace bitpush::server
