#include "bench/pushpull/report.h"

#include <cmath>
#include <cstdio>

#include "bench/pushpull/line_rate.h"
#include "common/dtype.h"

namespace bitpush::bench::pushpull {
namespace {

// The goodput of the run of `spec` under `security` over `transport` with the optimizer's
// `placement` and the engine's non-finite check on or off (NaN when there is none).
double GoodputOf(const std::vector<ClusterResult>& results, const std::string& spec,
                 const std::string& security, const std::string& transport,
                 const std::string& placement, bool non_finite_check = true,
                 const std::string& timeline = "off") {
  for (const ClusterResult& r : results) {
    if (r.spec == spec && r.security == security && r.transport == transport &&
        r.placement == placement && r.non_finite_check == non_finite_check &&
        r.timeline == timeline) {
      return r.goodput_gbps;
    }
  }
  return static_cast<double>(NAN);
}

// ratio_to_none: against the none compressor under the same security and transport, when it
// runs first.
double NoneGoodputFor(const std::vector<ClusterResult>& results, const ClusterResult& r) {
  return results.front().spec == "none"
             ? GoodputOf(results, "none", r.security, r.transport, r.placement)
             : NAN;
}

double SecurityRatio(const std::vector<ClusterResult>& results, const ClusterResult& r) {
  return r.goodput_gbps / GoodputOf(results, r.spec, "none", r.transport, r.placement);
}

double TransportRatio(const std::vector<ClusterResult>& results, const ClusterResult& r) {
  return r.goodput_gbps / GoodputOf(results, r.spec, r.security, "zmq", r.placement);
}

// --non-finite-check on,off: goodput with the engine's check / the same run's without it
// (NaN on an "off" record, or without an "off" run).
double NonFiniteCheckRatio(const std::vector<ClusterResult>& results, const ClusterResult& r) {
  if (!r.non_finite_check) return NAN;
  return r.goodput_gbps / GoodputOf(results, r.spec, r.security, r.transport, r.placement, false);
}

// --timeline: goodput traced / the same run's untraced (NaN on an untraced record, or without
// an untraced run).
double TimelineRatio(const std::vector<ClusterResult>& results, const ClusterResult& r) {
  if (r.timeline == "off") return NAN;
  return r.goodput_gbps / GoodputOf(results, r.spec, r.security, r.transport, r.placement,
                                    r.non_finite_check, "off");
}

// The peer's median goodput (NaN when it did not run).
double PeerGoodput(const RunReport& report) {
  return report.peer == nullptr || report.peer->runs() == 0 ? NAN
                                                            : report.peer->Summary().goodput_gbps;
}

std::vector<JsonRecord> Records(const RunReport& report) {
  const Options& opt = *report.opt;
  const std::vector<ClusterResult>& results = report.results;
  const double peer_gbps = PeerGoodput(report);
  std::vector<JsonRecord> records;
  for (size_t i = 0; i < results.size(); ++i) {
    const ClusterResult& r = results[i];
    JsonRecord rec;
    rec.Add("peer", "bitpush")
        .Add("compressor", r.spec)
        .Add("error_feedback", r.error_feedback)
        .Add("security", r.security)
        .Add("transport", r.transport)
        .Add("placement", r.placement)
        .Add("non_finite_check", r.non_finite_check ? "on" : "off")
        .Add("timeline", r.timeline)
        .Add("timeline_spans", static_cast<long long>(r.timeline_spans))
        .Add("timeline_dropped", static_cast<long long>(r.timeline_dropped))
        .Add("optimizer", r.optimizer)
        .Add("pull", r.pull)
        .Add("ucx_tls", r.transport == "ucx" ? report.ucx_lanes : "")
        .Add("ucx_tls_configured", r.transport == "ucx" ? opt.ucx_tls : "")
        .Add("workers", opt.workers)
        .Add("servers", opt.servers)
        .Add("mb", opt.mb)
        .Add("tensors", opt.tensors)
        .Add("dtype", std::string(DTypeName(opt.dtype)))
        .Add("partition_kb", static_cast<long long>(opt.partition_kb))
        .Add("raw_partition_kb", static_cast<long long>(opt.raw_partition_kb))
        .Add("iters", opt.iters)
        .Add("warmup", opt.warmup)
        .Add("goodput_gbps", r.goodput_gbps)
        .Add("best_iter_gbps", r.best_iter_gbps);
    AddRawTcpFields(rec, report.raw, r.goodput_gbps, opt.link_gbit);
    rec.Add("ratio_to_none", r.goodput_gbps / NoneGoodputFor(results, r))
        .Add("security_ratio", SecurityRatio(results, r))
        .Add("transport_ratio", TransportRatio(results, r))
        .Add("non_finite_check_ratio", NonFiniteCheckRatio(results, r))
        .Add("timeline_ratio", TimelineRatio(results, r))
        .Add("iter_ms", r.iter_ms)
        .Add("compress_ms", r.compress_ms)
        .Add("network_ms", r.network_ms)
        .Add("server_ms", r.server_ms)
        .Add("server_cpu_ms", r.server_cpu_ms)
        .Add("decompress_ms", r.decompress_ms)
        .Add("op_ms", r.op_ms)
        .Add("last_push_ms", r.last_push_ms)
        .Add("first_reply_ms", r.first_reply_ms)
        .Add("push_bytes_per_iter", r.bytes_pushed_per_iter)
        .Add("pull_bytes_per_iter", r.bytes_pulled_per_iter)
        .Add("wire_compression_ratio",
             static_cast<double>(report.tensor_bytes) / r.bytes_pushed_per_iter)
        .Add("server_peak_rss_mb", r.server_peak_rss_mb)
        .Add("worker_peak_rss_mb", r.worker_peak_rss_mb)
        .Add("scheduler_peak_rss_mb", r.scheduler_peak_rss_mb)
        .Add("server_owned_mb", r.server_owned_mb)
        .Add("rss_target_mb", 4 * r.server_owned_mb + 64)
        .Add("server_rss_over_target", r.server_rss_over_target)
        .Add("server_keys", static_cast<long long>(r.server_keys))
        .Add("pushes_rejected", static_cast<long long>(r.pushes_rejected))
        .Add("wall_seconds", r.wall_seconds);
    const Spread& spread = report.spreads[i];
    rec.Add("reps", report.reps)
        .Add("goodput_min_gbps", spread.min)
        .Add("goodput_max_gbps", spread.max);
    if (report.peer != nullptr) {
      rec.Add("peer_reps", report.reps)
          .Add("ratio_to_" + report.peer->name(), r.goodput_gbps / peer_gbps);
    }
    if (opt.link_gbit > 0) {
      // --link-gbit: every server behind the one emulated link (emulated_link.cc).
      const double bound_ms =
          PushPullBoundMs(r.bytes_pushed_per_iter, r.bytes_pulled_per_iter, opt.workers,
                          opt.servers, /*shared_server_link=*/true, opt.link_gbit);
      rec.Add("line_rate_bound_ms", bound_ms).Add("ratio_to_bound", bound_ms / r.iter_ms);
    }
    records.push_back(rec);
  }
  if (report.peer != nullptr && report.peer->runs() > 0) {
    PeerComparison cmp;
    cmp.reps = report.reps;
    cmp.raw = report.raw;
    // Against bitpush's none under security none, the like-for-like run.
    cmp.bitpush_none_gbps = GoodputOf(results, "none", "none", "zmq", "worker");
    records.push_back(report.peer->Record(cmp));
  }
  return records;
}

void PrintTable(const RunReport& report) {
  const Options& opt = *report.opt;
  const RawTcpFigures& raw = report.raw;
  const std::vector<ClusterResult>& results = report.results;
  std::printf(
      "%d worker(s), %d server(s), %g MiB fp32 per worker in %d tensor(s), partitions "
      "of %lld KiB, %d timed iterations; GB/s per worker per direction\n",
      opt.workers, opt.servers, opt.mb, opt.tensors, opt.partition_kb, opt.iters);
  if (const std::string link = report.link->Describe(*report.net); !link.empty()) {
    std::printf("%s\n", link.c_str());
  }
  std::printf("raw TCP reference: %.2f GB/s (best), %.2f GB/s (median)\n", raw.best_gbps,
              raw.median_gbps);
  std::printf("raw TCP both ways at once, per direction: %.2f GB/s (best), %.2f GB/s (median)\n",
              raw.duplex_best_gbps, raw.duplex_median_gbps);
  std::printf("%-28s %-5s %-5s %-4s %8s %8s %8s %8s %8s %9s %9s %9s %9s %9s %9s %10s %9s\n",
              "compressor", "ef", "sec", "tr", "goodput", "x raw", "x duplex", "x sec", "x zmq",
              "iter_ms", "compress", "network", "server", "decomp", "srv_rss", "rss_target",
              "wrk_rss");
  for (const ClusterResult& r : results) {
    std::printf(
        "%-28s %-5s %-5s %-4s %8.3f %8.2f %8.2f %8.2f %8.2f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f "
        "%10.1f %9.1f\n",
        (r.spec + (r.placement == "server" ? " @server" : "") +
         (r.non_finite_check ? "" : " unchecked") +
         (r.timeline == "off" ? "" : " trace " + r.timeline))
            .c_str(),
        r.error_feedback.c_str(), r.security.c_str(), r.transport.c_str(), r.goodput_gbps,
        r.goodput_gbps / raw.best_gbps, r.goodput_gbps / raw.duplex_best_gbps,
        SecurityRatio(results, r), TransportRatio(results, r), r.iter_ms, r.compress_ms,
        r.network_ms, r.server_ms, r.decompress_ms, r.server_peak_rss_mb,
        4 * r.server_owned_mb + 64, r.worker_peak_rss_mb);
  }
  if (report.peer == nullptr) return;
  const Peer& peer = *report.peer;
  if (peer.runs() == 0) {
    std::printf("%s\n", peer.NotRunLine(report.peer_missing).c_str());
    return;
  }
  // Side by side: the peer's median run, then bitpush's.
  const PeerSummary p = peer.Summary();
  const std::string name = peer.name();
  std::printf("\nside by side with %s: median of %d alternations, min-max beside it\n",
              peer.Title().c_str(), report.reps);
  std::printf("%-8s %-28s %-5s %8s %17s %8s %9s %9s %9s\n", "peer", "compressor", "sec", "goodput",
              "min-max", "x raw", "iter_ms", "srv_rss", ("x " + name).c_str());
  std::printf("%-8s %-28s %-5s %8.3f %8.3f-%-8.3f %8.2f %9.1f %9.1f %9.2f\n", name.c_str(),
              p.what.c_str(), "none", p.goodput_gbps, p.spread.min, p.spread.max,
              p.goodput_gbps / raw.best_gbps, p.iter_ms, p.server_peak_rss_mb, 1.0);
  for (size_t i = 0; i < results.size(); ++i) {
    const ClusterResult& r = results[i];
    std::printf("%-8s %-28s %-5s %8.3f %8.3f-%-8.3f %8.2f %9.1f %9.1f %9.2f\n", "bitpush",
                r.spec.c_str(), r.security.c_str(), r.goodput_gbps, report.spreads[i].min,
                report.spreads[i].max, r.goodput_gbps / raw.best_gbps, r.iter_ms,
                r.server_peak_rss_mb, r.goodput_gbps / p.goodput_gbps);
  }
}

}  // namespace

void PrintReport(const RunReport& report) {
  if (report.opt->json) {
    std::fputs(JsonArray(Records(report)).c_str(), stdout);
  } else {
    PrintTable(report);
  }
}

}  // namespace bitpush::bench::pushpull
