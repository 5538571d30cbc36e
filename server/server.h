// Server: one bitpush server node — the endpoint, the control-plane client, the data-plane
// dispatcher and the engine threads that aggregate and compress the keys it owns
// (docs/data-plane.md, paper 001 Algorithms 3 and 4). `bitpush-server --config cluster.yaml
// --rank N` runs one (server/main.cc); tests run several in one process over inproc.
//
// Threads (docs/threading.md):
//  - the node endpoint's loop (bp-io) receives every message; the server's data handlers only
//    place new keys on an engine thread and queue the message there (the endpoint parsed the
//    DataHeader). They never decompress or compress.
//  - engine threads (server.engine_threads, auto = CPUs - 1): each key sticks to one, chosen
//    at its OP_INIT_KEY as the thread with the least weighted load (a key weighs its bytes,
//    times kCompressedKeyWeight when it is compressed: compressed keys cost decompress-add per
//    push plus a compress per round, paper 001 §4.2.4); the thread owns the key's KeyState
//    outright (no lock on key data), answers pulls and errors with Transport::Send (which is
//    thread-safe). Pinned to cores spread over NUMA nodes unless server.numa is off
//    (common/cpu_topology.h).
//  - server 0 also checks the workers' tensor declarations (on the endpoint's loop; manifests
//    are small).
//
// Parts (one file each under server/): Dispatcher (the data handlers on the endpoint, with
// server 0's DeclarationCheck), EngineThread (one engine thread: its queue, its core, its
// KeyTable of KeyStates), WorkerPeers (the workers' connections, replies and refusals),
// ServerCounters (what stats() reports); Server owns them and their lifecycle.
//
// Thread-safety: Create/Wait/Close from the owning thread; stats() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/node/endpoint.h"
#include "common/status.h"
#include "common/transport/transport.h"
#include "config/cluster_config.h"

namespace bitpush::server {

// Weight multiplier of compressed keys in engine-thread placement.
inline constexpr uint64_t kCompressedKeyWeight = 4;

struct ServerOptions {
  config::ClusterConfig cluster;
  uint32_t rank = 0;
  // inproc backend only: the hub of the in-process cluster.
  std::shared_ptr<transport::InprocHub> inproc_hub;
};

struct ServerStats {
  uint64_t keys = 0;
  uint64_t pushes_accepted = 0;
  // Requests refused (answered with OP_ERROR), messages from workers that are no request
  // (refused unanswered: Dispatcher::Refuse) and data messages from non-workers (dropped).
  uint64_t pushes_rejected = 0;
  uint64_t replies_sent = 0;  // OP_PULL_REPLY messages
  uint64_t rounds_published = 0;
  // Rounds published with non-finite values in them (a worker's flagged push, the aggregate,
  // or the server-side optimizer's weights); their replies fail on every worker.
  uint64_t non_finite_rounds = 0;
  uint64_t bytes_received = 0;  // push payload bytes
  uint64_t bytes_sent = 0;      // reply payload bytes
  // The same payloads uncompressed (element count x dtype size of their data headers).
  uint64_t raw_bytes_received = 0;
  uint64_t raw_bytes_sent = 0;
  uint64_t engine_busy_ns = 0;  // time engine threads spent on key work (wall clock)
  uint64_t engine_cpu_ns = 0;   // the CPU time of that work (excludes time preempted)
  // Quantiser telemetry of the replies (methods that report it: loco's two-hop replies):
  // values quantised and clamped, the server error's values re-quantised and clamped.
  uint64_t quantized_values = 0;
  uint64_t quantized_saturated = 0;
  uint64_t error_values = 0;
  uint64_t error_saturated = 0;
};

struct EngineThreadInfo {
  int cpu = -1;        // pinned core (-1: not pinned)
  int numa_node = -1;  // its NUMA node (-1: unknown)
  uint64_t keys = 0;
  uint64_t load = 0;    // weighted bytes placed on it
  uint64_t queued = 0;  // messages waiting for it when engine_threads() was called
};

class Server {
 public:
  // Binds the endpoint, registers with the scheduler (bounded by cluster.startup_timeout;
  // returns once every node registered and the assignment arrived) and starts the engine.
  static StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);

  ~Server();  // Close()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Waits until the cluster shuts down: OK on a clean shutdown, the cluster's error
  // otherwise, Timeout after `timeout`.
  Status Wait(std::chrono::milliseconds timeout);

  // Stops the engine threads and closes the endpoint. Idempotent.
  void Close();

  uint32_t rank() const;
  ServerStats stats() const;
  std::vector<EngineThreadInfo> engine_threads() const;
  // The endpoint's counters (any thread).
  node::EndpointStats endpoint_stats() const;

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bitpush::server
