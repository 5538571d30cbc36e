// One cluster of `bitpush-bench cluster`: what the driver asks for (ClusterSpec) and what the
// cluster answers (ClusterFigures).
//
// The driver (bench/bench_cluster.cc) runs every (transport, nodes) cluster in a child process
// of its own, this binary in the hidden `cluster-run` mode, so that each cluster's memory,
// threads and file descriptors are measured from a clean process and a cluster that fails
// takes none of the others with it. The spec travels as flags (SpecArgs / ParseSpecFlag), the
// figures come back as a flat JSON file (FiguresJson / ParseFigures).
//
// A cluster is threads as nodes: the real Scheduler on one thread, and every server and worker
// on threads of their own with their own endpoints, over the inproc transport (one InprocHub)
// or over ZeroMQ on 127.0.0.1 (one endpoint and ZeroMQ context per node, as each daemon has).
//
// Owned by the driver and the child mode. Thread-safety: plain values and pure functions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/status.h"
#include "config/cluster_config.h"

namespace bitpush::bench::cluster {

// The port range a zmq cluster may use: below Linux's ephemeral range (32768-60999), so that no
// outgoing connection of the kernel collides with a node's listening port.
inline constexpr int kLowestPort = 1024;
inline constexpr int kHighestPort = 32767;

struct ClusterSpec {
  // "inproc" or "zmq" (tcp on 127.0.0.1).
  std::string transport = "inproc";
  // Servers + workers (the scheduler is not counted). Servers: max(1, nodes / 8).
  uint32_t nodes = 16;
  // zmq: the scheduler of the control-plane cluster listens at first_port, its nodes at the
  // following ports; the push/pull cluster takes the next nodes + 1 ports (PortsNeeded).
  int first_port = 24000;
  std::chrono::milliseconds heartbeat_interval{200};
  std::chrono::milliseconds heartbeat_timeout{1000};
  // GROUP_ALL barriers timed after registration.
  uint32_t barriers = 50;
  // Seconds of heartbeats only over which the scheduler's CPU is measured.
  double idle_s = 5;
  // Timed push/pull rounds after one warm-up round; 0 = no push/pull cluster.
  uint32_t pushpull_rounds = 5;
  // Floats each worker pushes to each server in a round.
  uint32_t pushpull_floats = 1024;
  // spdlog level of the run (the failure verdicts that the killed node causes are logged only at
  // info or below).
  std::string log_level = "warn";

  uint32_t servers() const { return std::max<uint32_t>(1, nodes / 8); }
  uint32_t workers() const { return nodes - servers(); }
  // zmq: the ports a run uses from first_port (the control-plane cluster's and the push/pull
  // cluster's); 0 for inproc.
  int PortsNeeded() const { return transport == "zmq" ? 2 * static_cast<int>(nodes + 1) : 0; }
};

// The cluster config of `spec` (transport, addresses from `first_port` under zmq, heartbeat
// timing; startup_timeout 60 s, which bounds registration).
config::ClusterConfig MakeClusterConfig(const ClusterSpec& spec, int first_port);

// The spec as flags of `cluster-run`, and the parser of one such flag (false: not a spec flag).
// `subcommand` names the command in usage errors.
std::vector<std::string> SpecArgs(const ClusterSpec& spec);
bool ParseSpecFlag(const char* subcommand, ArgCursor& args, ClusterSpec* spec);
// Usage errors for a spec whose flags parsed but do not fit together; the heartbeat timeout
// defaults to 5 x the interval unless `timeout_set`.
void CheckSpec(const char* subcommand, ClusterSpec* spec, bool timeout_set);

// What one cluster measured (docs/benchmarks.md, "Control plane at scale"). NaN: not measured.
struct ClusterFigures {
  // From the last node thread's start to every node registered and assigned; and from the
  // first node thread's start.
  double register_s = NAN;
  double register_total_s = NAN;
  // Per barrier: from the last node asking for it to the last node released.
  double barrier_ms_median = NAN;
  double barrier_ms_p99 = NAN;
  double barrier_ms_max = NAN;
  // The median barrier's two parts: the last node asking -> the first node released (request,
  // scheduler, one release), and the first -> the last node released (the fan-out).
  double barrier_first_release_ms_median = NAN;
  double barrier_fanout_ms_median = NAN;
  // The scheduler thread's CPU time over the idle window, in % of one core; the whole
  // process's (every node's heartbeats too).
  double scheduler_cpu_pct = NAN;
  // The threads the scheduler's endpoint started (zmq: its transport's I/O thread and ZeroMQ's
  // I/O and reaper threads; none for inproc): with scheduler_cpu_pct, what a bitpush-scheduler
  // process would use.
  double scheduler_io_cpu_pct = NAN;
  double process_cpu_pct = NAN;
  double idle_s = NAN;
  // Process RSS growth from before the cluster to after registration, per node.
  double rss_per_node_kib = NAN;
  // Threads and open file descriptors of the process once every node registered.
  int64_t threads = 0;
  int64_t fds = 0;
  // What they are made of: file descriptors per endpoint (the scheduler's, just bound) and per
  // connection (both ends in this process; each node has two: to the scheduler and back).
  double fds_per_endpoint = NAN;
  double fds_per_connection = NAN;
  // From making `killed` silent to the last other node told it failed.
  double kill_named_s = NAN;
  std::string killed;
  // The push/pull cluster (real Servers and worker Clients): the median and slowest timed
  // round, and the warm-up round (which carries the declarations); "" or why it was not run.
  double pushpull_round_ms = NAN;
  double pushpull_round_ms_max = NAN;
  double pushpull_first_round_ms = NAN;
  int64_t pushpull_rounds = 0;
  std::string pushpull_skipped;
};

// Adds every figure to `record` (the child's file and the public record share it); the figures
// as one flat JSON object, and back (a file the child wrote).
JsonRecord& AddFigures(JsonRecord& record, const ClusterFigures& figures);
std::string FiguresJson(const ClusterFigures& figures);
ClusterFigures ParseFigures(const std::string& json);

// The nearest-rank percentile `p` (0 < p <= 100) of `values` (NaN when empty).
double Percentile(std::vector<double> values, double p);

}  // namespace bitpush::bench::cluster
