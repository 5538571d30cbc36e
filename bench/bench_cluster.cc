// bitpush-bench cluster: the control plane at scale. For every (transport, nodes) pair one
// threads-as-nodes cluster — the real Scheduler, and every server and worker a thread with its
// own endpoint (inproc, or zmq on 127.0.0.1), servers = max(1, nodes / 8) — measures
// registration time, barrier latency, the scheduler's CPU under heartbeats alone, memory per
// node, the time until every node is told of a node gone silent, and then a push/pull round of
// small tensors through a cluster of the real Servers and worker Clients of the same shape
// (bench/cluster/: control_plane.h, pushpull_round.h; docs/benchmarks.md "Control plane at
// scale").
//
// Each cluster runs in a child process of its own (this binary's hidden `cluster-run` mode), so
// memory, threads and file descriptors are counted from a clean process and a failing cluster
// takes none of the others with it; the driver waits for it, bounded by --timeout-s, and reads
// its figures back from a file.
//
// Thread-safety: both entry points run on main's thread (the child mode starts the cluster's
// threads and joins them).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/cluster/control_plane.h"
#include "bench/cluster/probes.h"
#include "bench/cluster/pushpull_round.h"
#include "bench/cluster/spec.h"
#include "common/logging.h"
#include "fmt/format.h"
#include "tests/harness/child_process.h"

namespace bitpush::bench {
namespace {

using cluster::ClusterFigures;
using cluster::ClusterSpec;

constexpr char kCommand[] = "cluster";
constexpr char kChildMode[] = "cluster-run";
// File descriptors one zmq node takes in this process, both ends of its two control-plane
// connections included (its endpoint's ZeroMQ context, listener, monitors: 20 measured at 128
// and 256 nodes, docs/benchmarks.md), rounded up: the control-plane cluster is not started when
// they cannot fit RLIMIT_NOFILE.
constexpr int64_t kZmqFdsPerNode = 24;

struct Options {
  bool json = false;
  std::vector<uint32_t> nodes = {16, 128};
  std::vector<std::string> transports = {"inproc", "zmq"};
  int base_port = 24000;
  double timeout_s = 600;
  ClusterSpec spec;  // transport, nodes and first_port set per cluster
};

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench cluster [--json] [--nodes 16,128] [--transport inproc,zmq]\n"
      "         [--heartbeat-ms 200] [--heartbeat-timeout-ms 5x] [--barriers 50] [--idle-s 5]\n"
      "         [--pushpull-rounds 5] [--pushpull-floats 1024] [--base-port 24000]\n"
      "         [--timeout-s 600] [--log-level warn]\n"
      "The control plane at scale: one threads-as-nodes cluster per (transport, nodes), the\n"
      "real Scheduler plus nodes/8 servers (at least 1) and the rest workers, each node a thread\n"
      "with its own endpoint (inproc, or zmq: tcp on 127.0.0.1 from --base-port, below the\n"
      "ephemeral range), each cluster in a child process of its own. Measures:\n"
      "  register_s          last node thread's start -> every node registered and assigned\n"
      "  barrier_ms_median/_p99  per GROUP_ALL barrier: last node asking -> last node released\n"
      "  scheduler_cpu_pct   the scheduler thread's CPU over --idle-s of heartbeats only (%% of\n"
      "                      one core); process_cpu_pct: the whole process's (every node's)\n"
      "  rss_per_node_kib    process RSS growth from before the cluster to all registered,\n"
      "                      per node (threads as nodes: per-process overhead is not counted)\n"
      "  kill_named_s        one worker goes silent -> every other node told it failed\n"
      "                      (beside heartbeat_timeout_s)\n"
      "  pushpull_round_ms   median of --pushpull-rounds timed rounds (after a warm-up) of the\n"
      "                      real Servers and worker Clients: every worker pushes and pulls\n"
      "                      --pushpull-floats floats through every server (0 rounds: skipped;\n"
      "                      not run, saying why in pushpull_skipped, when zmq would need more\n"
      "                      file descriptors than RLIMIT_NOFILE allows)\n"
      "One JSON record per cluster with --json. A cluster that fails is reported on stderr with\n"
      "its log's tail, the others still run, and the exit status is 1.\n");
}

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    const size_t comma = list.find(',', pos);
    out.push_back(list.substr(pos, comma == std::string::npos ? comma : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

int ParsePort(const char* subcommand, const std::string& flag, const std::string& text) {
  const size_t port = ParsePositive(subcommand, flag, text, cluster::kHighestPort);
  if (port < static_cast<size_t>(cluster::kLowestPort)) {
    UsageError(subcommand, fmt::format("{} needs a port in {}..{}, got {}", flag,
                                       cluster::kLowestPort, cluster::kHighestPort, port));
  }
  return static_cast<int>(port);
}

void CheckTransport(const char* subcommand, const std::string& t) {
  if (t != "inproc" && t != "zmq") {
    UsageError(subcommand, "--transport takes inproc and zmq, got '" + t + "'");
  }
}

void ParseArgs(int argc, char** argv, Options* o) {
  bool timeout_set = false;
  for (ArgCursor args(kCommand, argc, argv); args.Next();) {
    const std::string& a = args.flag();
    if (a == "--json") {
      o->json = true;
    } else if (a == "--nodes") {
      o->nodes.clear();
      for (const std::string& n : SplitList(args.Value())) {
        o->nodes.push_back(static_cast<uint32_t>(ParsePositive(kCommand, "--nodes", n, 4096)));
      }
    } else if (a == "--transport") {
      o->transports = SplitList(args.Value());
      for (const std::string& t : o->transports) CheckTransport(kCommand, t);
    } else if (a == "--base-port") {
      o->base_port = ParsePort(kCommand, a, args.Value());
    } else if (a == "--timeout-s") {
      o->timeout_s = ParseSeconds(kCommand, a, args.Value());
    } else if (ParseSpecFlag(kCommand, args, &o->spec)) {
      timeout_set = timeout_set || a == "--heartbeat-timeout-ms";
    } else if (args.IsHelp()) {
      args.Help(PrintHelp);
    } else {
      args.Unknown(PrintHelp);
    }
  }
  for (uint32_t n : o->nodes) {
    ClusterSpec s = o->spec;
    s.nodes = n;
    cluster::CheckSpec(kCommand, &s, timeout_set);
    o->spec.heartbeat_timeout = s.heartbeat_timeout;
  }
  int ports = 0;
  for (const std::string& t : o->transports) {
    for (uint32_t n : o->nodes) {
      ClusterSpec s = o->spec;
      s.transport = t;
      s.nodes = n;
      ports += s.PortsNeeded();
    }
  }
  if (o->base_port + ports - 1 > cluster::kHighestPort) {
    UsageError(kCommand, fmt::format("--base-port {}: the zmq clusters need {} ports from it, past "
                                     "{} (the ephemeral range starts at 32768)",
                                     o->base_port, ports, cluster::kHighestPort));
  }
}

std::string SelfPath() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
}

std::string CpuModel() {
  const std::string cpuinfo = testing::ReadFile("/proc/cpuinfo");
  const size_t at = cpuinfo.find("model name");
  if (at == std::string::npos) return "";
  const size_t colon = cpuinfo.find(':', at);
  const size_t end = cpuinfo.find('\n', at);
  if (colon == std::string::npos || colon > end) return "";
  return cpuinfo.substr(colon + 2, end - colon - 2);
}

// Runs one cluster in a child process (bounded by --timeout-s); its figures, or the error with
// the tail of its log.
StatusOr<ClusterFigures> RunOne(const Options& o, const ClusterSpec& spec,
                                const std::string& self) {
  const std::string what = fmt::format("{} nodes over {}", spec.nodes, spec.transport);
  testing::TempDir dir("bp-bench-cluster");
  if (!dir.ok()) return InternalError(what + ": cannot create a temp directory under /tmp");
  const std::string out = dir.path() + "/figures.json";
  std::vector<std::string> argv = {self, kChildMode};
  for (std::string& a : cluster::SpecArgs(spec)) argv.push_back(std::move(a));
  argv.push_back("--out");
  argv.push_back(out);
  testing::Child child(what, argv, dir.path() + "/log");
  if (!child.spawned()) return InternalError(what + ": fork failed");
  const auto deadline =
      testing::ProcessClock::now() + std::chrono::duration_cast<testing::ProcessClock::duration>(
                                         std::chrono::duration<double>(o.timeout_s));
  if (!testing::WaitAll({&child}, deadline)) {
    child.Kill();
    return TimeoutError(fmt::format("{}: still running after {} s (--timeout-s); its log ends:\n{}",
                                    what, o.timeout_s, testing::TailLines(child.output(), 20)));
  }
  if (child.exit_code() != 0) {
    return InternalError(fmt::format("{}: {}; its log ends:\n{}", what, child.ExitDescription(),
                                     testing::TailLines(child.output(), 20)));
  }
  const std::string json = testing::ReadFile(out);
  if (json.empty()) return InternalError(what + ": the run wrote no figures to " + out);
  return cluster::ParseFigures(json);
}

JsonRecord Record(const ClusterSpec& s, const ClusterFigures& f, const std::string& cpu) {
  JsonRecord r;
  r.Add("bench", kCommand)
      .Add("transport", s.transport)
      .Add("nodes", static_cast<size_t>(s.nodes))
      .Add("servers", static_cast<size_t>(s.servers()))
      .Add("workers", static_cast<size_t>(s.workers()))
      .Add("heartbeat_ms", static_cast<long long>(s.heartbeat_interval.count()))
      .Add("heartbeat_timeout_s", static_cast<double>(s.heartbeat_timeout.count()) / 1e3)
      .Add("barriers", static_cast<size_t>(s.barriers))
      .Add("pushpull_floats", static_cast<size_t>(s.pushpull_floats));
  cluster::AddFigures(r, f)
      .Add("cpu", cpu)
      .Add("cores", static_cast<size_t>(std::thread::hardware_concurrency()));
  return r;
}

// The child mode's flags: the spec's, --transport T, --nodes N, --first-port P, --out PATH.
[[noreturn]] void ChildUsage(const std::string& msg) {
  UsageError(kChildMode, msg);
}

}  // namespace

int RunClusterBench(int argc, char** argv) {
  Options o;
  ParseArgs(argc, argv, &o);
  const std::string self = SelfPath();
  if (self.empty()) {
    std::fprintf(stderr, "bitpush-bench cluster: readlink /proc/self/exe failed\n");
    return 1;
  }
  const std::string cpu = CpuModel();
  if (!o.json) {
    std::printf("cpu: %s, %u cores shared by every node; heartbeat %lld ms, timeout %lld ms\n",
                cpu.c_str(), std::thread::hardware_concurrency(),
                static_cast<long long>(o.spec.heartbeat_interval.count()),
                static_cast<long long>(o.spec.heartbeat_timeout.count()));
    // sch_cpu: the scheduler's Run thread; sch_io: the threads of its endpoint (zmq).
    std::printf("%-6s %5s %4s %4s %9s %8s %8s %7s %7s %9s %8s %7s %11s\n", "trans", "nodes", "S",
                "W", "register", "bar_med", "bar_p99", "sch_cpu", "sch_io", "rss/node", "kill",
                "fds", "pushpull");
    std::printf("%-6s %5s %4s %4s %9s %8s %8s %7s %7s %9s %8s %7s %11s\n", "", "", "", "", "s",
                "ms", "ms", "%", "%", "KiB", "s", "", "ms");
  }
  std::vector<JsonRecord> records;
  int port = o.base_port;
  bool failed = false;
  for (const std::string& transport : o.transports) {
    for (uint32_t nodes : o.nodes) {
      ClusterSpec spec = o.spec;
      spec.transport = transport;
      spec.nodes = nodes;
      spec.first_port = port;
      port += spec.PortsNeeded();
      StatusOr<ClusterFigures> f = RunOne(o, spec, self);
      if (!f.ok()) {
        std::fprintf(stderr, "bitpush-bench cluster: %s\n", f.status().message().c_str());
        failed = true;
        continue;
      }
      records.push_back(Record(spec, *f, cpu));
      if (!o.json) {
        const std::string pushpull = f->pushpull_skipped.empty()
                                         ? fmt::format("{:.2f}", f->pushpull_round_ms)
                                         : std::string("skipped");
        std::printf("%-6s %5u %4u %4u %9.3f %8.2f %8.2f %7.2f %7.2f %9.0f %8.3f %7lld %11s\n",
                    transport.c_str(), nodes, spec.servers(), spec.workers(), f->register_s,
                    f->barrier_ms_median, f->barrier_ms_p99, f->scheduler_cpu_pct,
                    f->scheduler_io_cpu_pct, f->rss_per_node_kib, f->kill_named_s,
                    static_cast<long long>(f->fds), pushpull.c_str());
        if (!f->pushpull_skipped.empty()) {
          std::printf("       push/pull %s\n", f->pushpull_skipped.c_str());
        }
        std::fflush(stdout);
      }
    }
  }
  if (o.json) std::fputs(JsonArray(records).c_str(), stdout);
  return failed ? 1 : 0;
}

int RunClusterRunMode(int argc, char** argv) {
  ClusterSpec spec;
  std::string out;
  for (ArgCursor args(kChildMode, argc, argv); args.Next();) {
    const std::string& a = args.flag();
    if (a == "--transport") {
      spec.transport = args.Value();
      CheckTransport(kChildMode, spec.transport);
    } else if (a == "--nodes") {
      spec.nodes = static_cast<uint32_t>(ParsePositive(kChildMode, a, args.Value(), 4096));
    } else if (a == "--first-port") {
      spec.first_port = ParsePort(kChildMode, a, args.Value());
    } else if (a == "--out") {
      out = args.Value();
    } else if (!ParseSpecFlag(kChildMode, args, &spec)) {
      ChildUsage("unknown option '" + a + "'");
    }
  }
  if (out.empty()) ChildUsage("--out is required");
  cluster::CheckSpec(kChildMode, &spec, /*timeout_set=*/true);
  SetLogLevel(spec.log_level);
  const std::string what = fmt::format("{} nodes over {}", spec.nodes, spec.transport);
  auto fail = [&what](const Status& s) {
    std::fprintf(stderr, "bitpush-bench cluster-run: %s: %s\n", what.c_str(), s.ToString().c_str());
    return 1;
  };
  StatusOr<int64_t> fd_limit = cluster::RaiseFdLimit();
  if (!fd_limit.ok()) return fail(fd_limit.status());
  if (spec.transport == "zmq") {
    const int64_t need = kZmqFdsPerNode * spec.nodes + cluster::OpenFds();
    if (need > *fd_limit) {
      return fail(InvalidArgumentError(
          fmt::format("about {} file descriptors needed ({} per zmq node), RLIMIT_NOFILE is {} "
                      "even after raising the soft limit to the hard one (raise the hard limit: "
                      "ulimit -Hn, or limits.conf)",
                      need, kZmqFdsPerNode, *fd_limit)));
    }
    for (int p = spec.first_port; p < spec.first_port + spec.PortsNeeded(); ++p) {
      if (!cluster::LoopbackPortFree(p)) {
        return fail(UnavailableError(
            fmt::format("port {} of 127.0.0.1 is taken (the run needs {}..{}); choose another "
                        "--base-port",
                        p, spec.first_port, spec.first_port + spec.PortsNeeded() - 1)));
      }
    }
  }
  ClusterFigures figures;
  if (Status s = cluster::RunControlPlane(spec, &figures); !s.ok()) return fail(s);
  if (Status s = cluster::RunPushPullRounds(spec, *fd_limit, &figures); !s.ok()) return fail(s);
  FILE* f = std::fopen(out.c_str(), "w");
  if (f == nullptr) return fail(InternalError("cannot write " + out));
  const std::string json = cluster::FiguresJson(figures) + "\n";
  const bool written = std::fputs(json.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !written) return fail(InternalError("cannot write " + out));
  return 0;
}

}  // namespace bitpush::bench
