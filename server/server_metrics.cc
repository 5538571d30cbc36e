#include "server/server_metrics.h"

#include <string>
#include <vector>

#include "common/node/endpoint_metrics.h"

namespace bitpush::server {

void AddServerMetrics(const Server& server, metrics::MetricSet& set) {
  const ServerStats s = server.stats();
  set.Counter("bitpush_server_rounds_published_total",
              "Rounds aggregated and published, over all keys.", s.rounds_published);
  constexpr char kPushes[] = "bitpush_server_pushes_total";
  constexpr char kPushesHelp[] =
      "Pushes from workers by result: accepted, or rejected (answered with OP_ERROR, or dropped "
      "for being no request of a worker or coming from a non-worker).";
  set.Counter(kPushes, kPushesHelp, s.pushes_accepted, {{"result", "accepted"}});
  set.Counter(kPushes, kPushesHelp, s.pushes_rejected, {{"result", "rejected"}});
  constexpr char kQuant[] = "bitpush_server_quantized_values_total";
  constexpr char kQuantHelp[] =
      "Values quantised for replies by methods that report it (loco with pull=loco), and of "
      "those clamped to the code range (saturated), for the replied values (quantizer=reply) "
      "and the server error re-quantised (quantizer=error).";
  set.Counter(kQuant, kQuantHelp, s.quantized_values, {{"quantizer", "reply"}, {"result", "all"}});
  set.Counter(kQuant, kQuantHelp, s.quantized_saturated,
              {{"quantizer", "reply"}, {"result", "saturated"}});
  set.Counter(kQuant, kQuantHelp, s.error_values, {{"quantizer", "error"}, {"result", "all"}});
  set.Counter(kQuant, kQuantHelp, s.error_saturated,
              {{"quantizer", "error"}, {"result", "saturated"}});
  set.Counter("bitpush_server_non_finite_rounds_total",
              "Rounds published with a NaN or inf in them (a worker's flagged push, the "
              "aggregate, or the server-side optimizer's weights); every worker fails them.",
              s.non_finite_rounds);
  set.Counter("bitpush_server_replies_sent_total", "Aggregates sent to workers (OP_PULL_REPLY).",
              s.replies_sent);
  constexpr char kBytes[] = "bitpush_server_payload_bytes_total";
  constexpr char kBytesHelp[] =
      "Payload bytes of pushes received (in) and aggregates sent (out), as sent (compressed) "
      "and uncompressed (raw: elements x dtype size).";
  set.Counter(kBytes, kBytesHelp, s.bytes_received,
              {{"direction", "in"}, {"encoding", "compressed"}});
  set.Counter(kBytes, kBytesHelp, s.raw_bytes_received, {{"direction", "in"}, {"encoding", "raw"}});
  set.Counter(kBytes, kBytesHelp, s.bytes_sent, {{"direction", "out"}, {"encoding", "compressed"}});
  set.Counter(kBytes, kBytesHelp, s.raw_bytes_sent, {{"direction", "out"}, {"encoding", "raw"}});
  set.Counter("bitpush_server_engine_busy_seconds_total",
              "Time the engine threads spent on key work (decompress-add, compress), summed over "
              "threads.",
              static_cast<double>(s.engine_busy_ns) / 1e9);
  set.Gauge("bitpush_server_keys", "Keys (partitions) this server owns.", s.keys);
  const std::vector<EngineThreadInfo> threads = server.engine_threads();
  for (size_t i = 0; i < threads.size(); ++i) {
    const std::string thread = std::to_string(i);
    set.Gauge("bitpush_server_engine_queue_depth",
              "Messages waiting for each engine thread at the time of the scrape.",
              threads[i].queued, {{"thread", thread}});
  }
  for (size_t i = 0; i < threads.size(); ++i) {
    set.Gauge("bitpush_server_engine_keys", "Keys placed on each engine thread.", threads[i].keys,
              {{"thread", std::to_string(i)}});
  }
  node::AddEndpointMetrics(server.endpoint_stats(), set);
}

}  // namespace bitpush::server
