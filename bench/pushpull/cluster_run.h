// One bitpush cluster of `bitpush-bench pushpull`: real processes on the run's link, timed.
//
// ClusterRun writes a cluster YAML into a temp dir (free ports on the link's two sides; the
// compressor, error feedback, security mode, transport and optimizer placement of its RunSpec)
// and starts a whole cluster: bitpush-scheduler and bitpush-server (found next to this binary;
// the servers inside the link's network namespace when it has one), S servers with
// --stats-json, and W workers — this binary in its hidden `pushpull-worker` mode
// (bench/pushpull_worker.h), each declaring K tensors of mb/K MiB, running the warm-up and N
// timed PushPull+Wait iterations and writing its timings and ClientStats to a JSON file. It waits
// (bounded) for every process, reaps each with wait4() for its peak RSS, and reads the files into
// a ClusterResult:
//   goodput_gbps: tensor bytes synchronised per second per worker and per direction — the
//     tensor bytes x iterations / the timed loop's wall time, in GB/s (1e9 bytes/s, the
//     convention of `bitpush-bench transport`), of the slowest worker;
//   stage times, per timed iteration, averaged over the workers, each summed over the partitions
//     (partitions overlap, so they do not add up to iter_ms): compress_ms, network_ms (push sent
//     -> reply received, includes the server's work), decompress_ms from ClientStats; server_ms =
//     the servers' engine_busy_ns / (warm-up + timed iterations), server_cpu_ms the same in the
//     engine threads' CPU time (engine_cpu_ns: without the time they were preempted);
//   the pipeline, per push_pull op (averaged over ops and workers): op_ms (start -> complete),
//     last_push_ms (start -> last partition pushed), first_reply_ms (start -> first reply in);
//     first_reply_ms < last_push_ms shows the replies, the server's work and decompression
//     overlapping the compression and sending of later partitions;
//   peak RSS in MiB (ru_maxrss); server_owned_mb = the bytes of the keys a server owns (the
//     scheduler's key mapping), rss_target_mb = 4 x that + 64.
//
// Every wait is bounded (--timeout-s per cluster): on a failing process the others get the
// heartbeat bound to exit, then everything left is killed; the error names the process and shows
// its output's tail.
//
// A ClusterRun is owned by the driver for one run; its destructor kills and reaps what still
// runs and removes the temp dir (unless --keep-dir). Thread-safety: none; the driver's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/pushpull/link.h"
#include "bench/pushpull/options.h"
#include "common/status.h"
#include "config/cluster_config.h"
#include "tests/harness/child_process.h"

namespace bitpush::bench::pushpull {

// The programs of a cluster: bitpush-scheduler and bitpush-server in bin_dir, the workers this
// binary (self).
struct ClusterPrograms {
  std::string self;
  std::string bin_dir;
};

// This binary and the daemons next to it; FailedPrecondition saying what is missing.
StatusOr<ClusterPrograms> FindClusterPrograms();

// One cell of the run matrix: what one cluster runs.
struct RunSpec {
  std::string spec;              // the compressor spec
  std::string error_feedback;    // the policy (resolved: never "auto")
  std::string security;          // "none", "curve"
  std::string transport;         // "zmq", "ucx"
  std::string placement;         // the optimizer's: "worker", "server"
  bool non_finite_check = true;  // false: the workers run --no-non-finite-check
  std::string timeline = "off";  // "off", "all", "1/N" (Options::timelines)
};

struct ClusterResult {
  std::string spec;
  std::string placement = "worker";
  bool non_finite_check = true;
  std::string timeline = "off";
  // Timeline on: the spans the workers and servers wrote, and dropped (their files' `end`).
  uint64_t timeline_spans = 0, timeline_dropped = 0;
  std::string optimizer;  // "" = none
  std::string pull;       // server placement
  std::string error_feedback;
  std::string security;
  std::string transport;
  double goodput_gbps = 0;
  double best_iter_gbps = 0;
  double iter_ms = 0;
  double compress_ms = 0, network_ms = 0, decompress_ms = 0, server_ms = 0, server_cpu_ms = 0;
  double last_push_ms = 0, first_reply_ms = 0, op_ms = 0;  // per push_pull, averaged
  double bytes_pushed_per_iter = 0, bytes_pulled_per_iter = 0;
  double server_peak_rss_mb = 0, worker_peak_rss_mb = 0, scheduler_peak_rss_mb = 0;
  double server_owned_mb = 0, server_rss_over_target = 0;
  double wall_seconds = 0;
  uint64_t server_keys = 0, pushes_rejected = 0;
};

class ClusterRun {
 public:
  // keys_dir: the nodes' keys when run.security is "curve".
  ClusterRun(const Options& opt, const NetPlan& net, const RunSpec& run, std::string keys_dir,
             ClusterPrograms programs);
  ClusterRun(const ClusterRun&) = delete;
  ClusterRun& operator=(const ClusterRun&) = delete;
  ~ClusterRun();

  StatusOr<ClusterResult> Run();

 private:
  StatusOr<config::ClusterConfig> WriteConfig();
  testing::Child* Spawn(const std::string& label, const std::vector<std::string>& argv);
  std::string Describe(const testing::Child& c) const;
  // Until every process exited: OK when all exited 0. The first failing process ends the
  // run: the others get the heartbeat bound to notice, then are killed.
  Status WaitForAll(const config::ClusterConfig& config);
  Status Collect(const config::ClusterConfig& config);
  // --timeline: the span files' totals into result_ (one file per worker and server).
  Status CountTimeline();

  const Options& opt_;
  const NetPlan& net_;
  testing::TempDir dir_;
  ClusterPrograms programs_;
  std::string keys_dir_;
  std::string config_path_;
  std::vector<std::unique_ptr<testing::Child>> children_;
  testing::Child* scheduler_ = nullptr;
  std::vector<testing::Child*> servers_, workers_;
  ClusterResult result_;
};

}  // namespace bitpush::bench::pushpull
