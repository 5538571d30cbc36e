// WorkerPeers: one server's side of its workers — how many there are (from the assignment),
// the connections to them, and how it answers them: data replies and OP_ERROR refusals (each
// refusal counted in ServerStats::pushes_rejected and logged at most once per interval per
// peer, so a peer that sends garbage in a loop cannot grow the log).
//
// Owned by the Server. Create's thread attaches the endpoint and connects (before the data
// plane is released); afterwards the endpoint's loop (the dispatcher) and the engine threads
// answer workers through it at once.
//
// Thread-safety: Attach and Connect from the owning thread, before the data plane is released;
// count() is read-only after that; Send, SendError and MayLog from any thread
// (Transport::Send is thread-safe; the log limiter has its own mutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/log_limiter.h"
#include "common/node/endpoint.h"
#include "common/status.h"
#include "common/transport/message.h"
#include "proto/bitpush/v1/control.pb.h"
#include "server/server_counters.h"

namespace bitpush::server {

class WorkerPeers {
 public:
  WorkerPeers(uint32_t rank, ServerCounters* counters) : rank_(rank), counters_(counters) {}
  WorkerPeers(const WorkerPeers&) = delete;
  WorkerPeers& operator=(const WorkerPeers&) = delete;

  // The endpoint the replies go out on (before its loop starts).
  void Attach(node::NodeEndpoint* endpoint) { endpoint_ = endpoint; }
  // Takes the workers of the assignment and connects to each (its data address when it has
  // one: transport ucx).
  Status Connect(const v1::Assignment& assignment);

  // Workers of the cluster (0 until Connect).
  uint32_t count() const { return count_.load(std::memory_order_acquire); }

  // Sends `header` (its sender set to this server) and `frames` to `worker`; a failure is
  // logged (the worker misses that message).
  void Send(uint32_t worker, v1::DataHeader header, std::vector<transport::Buffer> frames);
  // Refuses `worker`'s `refused` request about `key` / `round` with OP_ERROR carrying `status`.
  void SendError(uint32_t worker, v1::DataHeader::Op refused, uint64_t key, uint64_t round,
                 const Status& status);
  // True when a line about `key` may be logged; *suffix then says how many were suppressed.
  bool MayLog(const std::string& key, std::string* suffix);

 private:
  const uint32_t rank_;
  ServerCounters* const counters_;
  node::NodeEndpoint* endpoint_ = nullptr;
  // Set by Connect (Create's thread) before the data plane is released; read by the endpoint's
  // handlers, which may already run for refused messages.
  std::atomic<uint32_t> count_{0};
  std::mutex log_mu_;
  LogLimiter log_limiter_;  // guarded by log_mu_
};

}  // namespace bitpush::server
