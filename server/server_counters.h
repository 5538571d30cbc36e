// ServerCounters: the counters behind Server::stats() (ServerStats, server/server.h). Owned by
// the Server; the dispatcher (on the endpoint's loop), the engine threads and the reply path
// add to them, stats() reads them.
//
// Thread-safety: every field is an atomic; any thread may add or read. Snapshot reads each
// field on its own, so it is not one instant.
#pragma once

#include <atomic>
#include <cstdint>

#include "server/server.h"

namespace bitpush::server {

struct ServerCounters {
  std::atomic<uint64_t> keys{0};
  std::atomic<uint64_t> pushes_accepted{0};
  std::atomic<uint64_t> pushes_rejected{0};
  std::atomic<uint64_t> replies_sent{0};
  std::atomic<uint64_t> rounds_published{0};
  std::atomic<uint64_t> non_finite_rounds{0};
  std::atomic<uint64_t> quantized_values{0};
  std::atomic<uint64_t> quantized_saturated{0};
  std::atomic<uint64_t> error_values{0};
  std::atomic<uint64_t> error_saturated{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> raw_bytes_received{0};
  std::atomic<uint64_t> raw_bytes_sent{0};
  std::atomic<uint64_t> engine_busy_ns{0};
  std::atomic<uint64_t> engine_cpu_ns{0};

  ServerStats Snapshot() const {
    ServerStats s;
    s.keys = keys.load();
    s.pushes_accepted = pushes_accepted.load();
    s.pushes_rejected = pushes_rejected.load();
    s.replies_sent = replies_sent.load();
    s.rounds_published = rounds_published.load();
    s.non_finite_rounds = non_finite_rounds.load();
    s.quantized_values = quantized_values.load();
    s.quantized_saturated = quantized_saturated.load();
    s.error_values = error_values.load();
    s.error_saturated = error_saturated.load();
    s.bytes_received = bytes_received.load();
    s.bytes_sent = bytes_sent.load();
    s.raw_bytes_received = raw_bytes_received.load();
    s.raw_bytes_sent = raw_bytes_sent.load();
    s.engine_busy_ns = engine_busy_ns.load();
    s.engine_cpu_ns = engine_cpu_ns.load();
    return s;
  }
};

}  // namespace bitpush::server
