#include "worker/engine_metrics.h"

#include "common/node/endpoint_metrics.h"

namespace bitpush::worker {

void AddEngineMetrics(const Engine& engine, metrics::MetricSet& set) {
  const ClientStats s = engine.stats();
  constexpr char kOps[] = "bitpush_worker_push_pulls_total";
  constexpr char kOpsHelp[] =
      "push_pull operations (one tensor, one round) by result: completed or failed.";
  set.Counter(kOps, kOpsHelp, s.ops_completed, {{"result", "completed"}});
  set.Counter(kOps, kOpsHelp, s.ops_failed, {{"result", "failed"}});
  set.Counter("bitpush_worker_partitions_pushed_total", "Partitions (keys) pushed to servers.",
              s.partitions_pushed);
  constexpr char kBytes[] = "bitpush_worker_payload_bytes_total";
  constexpr char kBytesHelp[] =
      "Payload bytes pushed to and pulled from servers, as sent (compressed) and uncompressed "
      "(raw: elements x the tensor's dtype size).";
  set.Counter(kBytes, kBytesHelp, s.bytes_pushed,
              {{"direction", "push"}, {"encoding", "compressed"}});
  set.Counter(kBytes, kBytesHelp, s.raw_bytes_pushed, {{"direction", "push"}, {"encoding", "raw"}});
  set.Counter(kBytes, kBytesHelp, s.bytes_pulled,
              {{"direction", "pull"}, {"encoding", "compressed"}});
  set.Counter(kBytes, kBytesHelp, s.raw_bytes_pulled, {{"direction", "pull"}, {"encoding", "raw"}});
  constexpr char kStage[] = "bitpush_worker_stage_seconds_total";
  constexpr char kStageHelp[] =
      "Time spent in each stage of a partition, summed over partitions (stages of different "
      "partitions overlap): compress, network (push sent to reply received, the server's time "
      "included), decompress.";
  set.Counter(kStage, kStageHelp, static_cast<double>(s.compress_ns) / 1e9,
              {{"stage", "compress"}});
  set.Counter(kStage, kStageHelp, static_cast<double>(s.network_ns) / 1e9, {{"stage", "network"}});
  set.Counter(kStage, kStageHelp, static_cast<double>(s.decompress_ns) / 1e9,
              {{"stage", "decompress"}});
  constexpr char kQuant[] = "bitpush_worker_quantized_values_total";
  constexpr char kQuantHelp[] =
      "Values quantised for pushes by methods that report it (loco), and of those clamped to "
      "the code range (saturated), for the pushed values (quantizer=push) and the error state "
      "re-quantised (quantizer=error, loco's int8 error).";
  set.Counter(kQuant, kQuantHelp, s.quantized_values, {{"quantizer", "push"}, {"result", "all"}});
  set.Counter(kQuant, kQuantHelp, s.quantized_saturated,
              {{"quantizer", "push"}, {"result", "saturated"}});
  set.Counter(kQuant, kQuantHelp, s.error_values, {{"quantizer", "error"}, {"result", "all"}});
  set.Counter(kQuant, kQuantHelp, s.error_saturated,
              {{"quantizer", "error"}, {"result", "saturated"}});
  constexpr char kNonFinite[] = "bitpush_worker_non_finite_total";
  constexpr char kNonFiniteHelp[] =
      "Partitions this worker pushed with a NaN or inf in their input (where=push), and rounds "
      "that failed because some worker's or server's values were non-finite (where=round).";
  set.Counter(kNonFinite, kNonFiniteHelp, s.non_finite_pushes, {{"where", "push"}});
  set.Counter(kNonFinite, kNonFiniteHelp, s.non_finite_rounds, {{"where", "round"}});
  set.Gauge("bitpush_worker_error_feedback_norm",
            "L2 norm of the worker error state of every partition as last pushed (methods that "
            "report it: loco, separate).",
            s.error_norm);
  set.Gauge("bitpush_worker_error_feedback_gradient_norm",
            "L2 norm of the gradients of every partition as last pushed, beside the error state's "
            "(methods that report it: separate): error_norm / gradient_norm is ||e|| / ||g||.",
            s.gradient_norm);
  set.Gauge("bitpush_worker_bytes_in_flight",
            "Uncompressed bytes of partitions holding credit at the time of the scrape.",
            s.bytes_in_flight);
  set.Gauge("bitpush_worker_peak_bytes_in_flight",
            "The most uncompressed bytes of partitions in flight at once so far.",
            s.peak_bytes_in_flight);
  set.Gauge("bitpush_worker_partitions_queued",
            "Partitions waiting for credit at the time of the scrape.", s.partitions_queued);
  node::AddEndpointMetrics(engine.endpoint_stats(), set);
}

}  // namespace bitpush::worker
