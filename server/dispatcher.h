// Dispatcher: the server's data-plane handlers on the node endpoint. For each worker message
// (the endpoint parsed its DataHeader) it checks the sender — a worker of the cluster, the
// header naming the same worker, the current data-plane generation — places a new key (at its
// OP_INIT_KEY) on the engine thread with the least weighted load (a key weighs its bytes, times
// kCompressedKeyWeight when compressed: paper 001 §4.2.4) and queues the message to the key's
// thread. It never decompresses or compresses. Server 0's declaration check runs here too.
// A worker's request that breaks a rule (an unknown key, a second push in a round...) is
// answered with OP_ERROR (WorkerPeers); a message that is no request at all (a malformed
// header, an op the server does not serve, a sender field naming another worker) is refused:
// counted, logged, and not answered.
//
// The data-plane generation (cluster.server_rejoin_timeout_s): a server that died and rejoined
// starts the next one, and every key and declaration of an older one is dropped — the
// placements and declaration epochs here, the keys on their engine threads.
//
// Owned by the Server; its handlers (and the scheduler client's server-lost / rejoined
// callbacks) run on the endpoint's loop, or on Create's thread while it releases the data
// messages that arrived before the assignment.
//
// Thread-safety: not thread-safe; the endpoint runs one handler at a time (bp-io, bp-io-data
// under transport ucx and ReleasePlane share one dispatch lock), so the placement map, the
// generation and the declaration epochs need no lock of their own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/node/endpoint.h"
#include "common/status.h"
#include "common/trace/recorder.h"
#include "proto/bitpush/v1/control.pb.h"
#include "scheduler/scheduler_client.h"
#include "server/declaration_check.h"
#include "server/engine_thread.h"
#include "server/server_counters.h"
#include "server/worker_peers.h"

namespace bitpush::server {

class Dispatcher {
 public:
  // `engines` are the server's engine threads (outliving the dispatcher); `client` places keys
  // on servers (ServerForKey, after Register).
  // `trace`: the server's timeline (null: off): pushes are stamped when they arrive.
  Dispatcher(uint32_t rank, const scheduler::SchedulerClient* client,
             const std::vector<std::unique_ptr<EngineThread>>& engines, WorkerPeers* workers,
             ServerCounters* counters, trace::Recorder* trace = nullptr);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Registers the data-plane handlers (before the endpoint starts).
  void Register(node::NodeEndpoint* endpoint);

  // The scheduler client's news: another server died and may rejoin (the job rolls back to its
  // checkpoint, so this server drops its keys), or it rejoined.
  void OnServerLost(uint64_t generation, const Status& why);
  void OnServerRejoined(uint32_t server, uint64_t generation);

 private:
  // The rank of `sender` if it is a worker of the cluster; otherwise counts and logs the drop.
  std::optional<uint32_t> WorkerOf(const node::Sender& sender);
  // WorkerOf, plus the header's sender field must name the same worker (refused otherwise).
  std::optional<uint32_t> CheckedWorker(const node::Sender& sender, const v1::DataHeader& header);
  // Counts and logs (rate-limited) a message from `worker` that is no request a worker makes
  // (`what`: a header that does not parse, an op this server does not serve, a sender field
  // naming another worker), and answers nothing: replies go to the worker's own address, and
  // whoever sent it with that worker's key need not be that worker, which has no request the
  // answer could match.
  void Refuse(uint32_t worker, const std::string& what);
  void PlaceInit(uint32_t worker, v1::DataHeader& header, transport::Message& message);
  void QueuePush(uint32_t worker, v1::DataHeader& header, transport::Message& message);
  // Drops the job's data-plane state (every key, on its engine thread; the placements and
  // declaration epochs here) and moves to `generation`.
  void ResetGeneration(uint64_t generation, const std::string& why);

  const uint32_t rank_;
  const scheduler::SchedulerClient* const client_;
  const std::vector<std::unique_ptr<EngineThread>>& engines_;
  WorkerPeers* const workers_;
  ServerCounters* const counters_;
  trace::Recorder* const trace_;
  std::unordered_map<uint64_t, uint32_t> placement_;  // key -> engine thread
  DeclarationCheck declarations_;
  uint64_t generation_ = 0;
};

}  // namespace bitpush::server
