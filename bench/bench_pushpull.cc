// bitpush-bench pushpull: compressed push_pull end to end with the real processes on loopback
// (zmq tcp, 127.0.0.1, free ports), against a raw TCP stream of the same bytes measured in the
// same run.
//
// For each compressor given (`--compressor none,onebit`, or the flag repeated) it writes a
// cluster YAML into a temp dir and starts a whole cluster: bitpush-scheduler and
// bitpush-server (found next to this binary), S servers with --stats-json, and W workers —
// this binary in its hidden `pushpull-worker` mode (bench/pushpull_worker.h), each declaring
// K fp32 tensors of mb/K MiB, running the warm-up and N timed PushPull+Wait iterations and
// writing its timings and ClientStats to a JSON file. The driver waits (bounded) for every
// process, reaps each with wait4() for its peak RSS, and reads the files.
//
// goodput_gbps: fp32 bytes synchronised per second per worker and per direction — the
// tensor bytes x iterations / the timed loop's wall time, in GB/s (1e9 bytes/s, the
// convention of `bitpush-bench transport`), of the slowest worker. raw_tcp_gbps: the same
// bytes (one iteration's worth, in messages of one partition) streamed one way between two
// processes over one loopback TCP socket, each message read whole into a buffer of its size
// (bench/raw_tcp.h); the fastest of --raw-reps repetitions before and as many after the
// cluster runs. raw_tcp_duplex_gbps: the per-direction throughput of the same socket carrying
// the same bytes both ways at once (each end sends one iteration's bytes while it receives the
// other's: bytes of one direction / wall time), measured with the same policy — the fair
// reference for a push_pull, which moves the bytes both ways at once, where both directions
// share the same CPUs (loopback); ratio_to_raw_tcp_duplex = goodput / it.
//
// --security none,curve (or the flag repeated): each compressor's cluster runs once per mode, in
// the order given, in this one invocation. Under curve the YAML has security.mode curve and
// keys_dir = a private temporary directory (mkdtemp, 0700) holding a key pair per node
// (security::WriteClusterKeys), shared by the curve clusters and removed when the benchmark
// exits (also on SIGINT/SIGTERM/SIGHUP); $BITPUSH_KEYS_DIR, $BITPUSH_KEY_FILE and
// $CREDENTIALS_DIRECTORY are cleared for the children so that those keys are the ones used.
// security_ratio = goodput / the goodput of the same compressor under security none.
//
// --transport zmq,ucx (or the flag repeated): each compressor's cluster runs once per transport
// (and security mode), in the order given. ucx = cluster.transport ucx: the control plane stays on
// ZeroMQ and the data plane (worker <-> server) goes over UCX (docs/transport-ucx.md), with
// cluster.ucx.tls = --ucx-tls (default: UCX's choice and the UCX_* environment); each node's data
// port (its port + cluster.ucx.port_offset) is free too. Records carry transport, ucx_tls (the
// transports UCX chose for a worker -> server connection of that configuration, probed on the same
// addresses before the cluster runs: "tcp/lo", "posix/memory cma/memory", ...) and
// ucx_tls_configured; transport_ratio = goodput / the same compressor's under zmq (same security).
//
// --reps R: R passes over all the runs; each record is the run of median goodput of its R
// (reps, goodput_min_gbps, goodput_max_gbps beside it), and the ratios compare those medians.
//
// --link-gbit R: the servers (and the raw TCP peer) run in a network namespace of their own,
// behind a veth pair shaped to R Gbit/s each way (tc tbf), 10.251.X.1 (root namespace:
// scheduler, workers, driver) <-> 10.251.X.2 (servers); the namespace and the veth pair are
// removed on every exit path (also on SIGINT/SIGTERM/SIGHUP). Needs root, ip and tc. Stage times
// are per timed iteration, averaged over the workers, each summed over the partitions (partitions
// overlap, so they do not add up to iter_ms): compress_ms, network_ms (push sent -> reply received,
// includes the server's work), decompress_ms from ClientStats; server_ms = the servers'
// engine_busy_ns / (warm-up + timed iterations), server_cpu_ms the same in the engine threads'
// CPU time (engine_cpu_ns: without the time they were preempted). The pipeline, per push_pull op
// (averaged over ops and workers): op_ms (start -> complete), last_push_ms (start -> last partition
// pushed), first_reply_ms (start -> first reply in); first_reply_ms < last_push_ms shows the
// replies, the server's work and decompression overlapping the compression and sending of later
// partitions. Peak RSS in MiB (ru_maxrss); server_owned_mb = the
// bytes of the keys a server owns (the scheduler's key mapping), rss_target_mb = 4 x that + 64.
//
// Every wait is bounded (--timeout-s per cluster): on a failing process the others get the
// heartbeat bound to exit, then everything left is killed; the failure names the process and
// shows its output's tail; exit status 1.
//
// --peer pslite --pslite-dir DIR: dmlc/ps-lite side by side, in this one invocation. Our dense
// driver for ps-lite (bench/peers/pslite_driver.cc, built into DIR by
// bench/peers/build-pslite-driver.sh, run by bench/peers/pslite_peer.h) runs a ps-lite cluster of
// the same shape and sizes (workers, servers, mb, partition-kb, iters, warmup; one key per
// partition, dense fp32 summed on the servers: compressor none). --peer-reps R alternations: each
// is one ps-lite cluster and one cluster per bitpush run, ps-lite first on even ones and last on
// odd ones, so drift of the shared machine hits both. Every record carries peer ("bitpush" or
// "pslite"); each figure is the run of median goodput of its R runs (goodput_min_gbps,
// goodput_max_gbps beside it); ratio_to_pslite on bitpush records = their median goodput /
// ps-lite's median goodput, ratio_to_bitpush on the ps-lite record = ps-lite's / bitpush none's
// (security none). Without a usable driver it says how to get one (bench/peers/README.md) and runs
// bitpush alone (ratio_to_pslite null). Without --peer, records only gain peer: "bitpush".
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/peers/pslite_peer.h"
#include "bench/pushpull_worker.h"
#include "bench/raw_tcp.h"
#include "common/security/keys.h"
#include "common/transport/transport.h"
#include "common/transport/ucx/info.h"
#include "common/transport/ucx/transport.h"
#include "compressors/registry.h"
#include "config/cluster_config.h"
#include "config/key_mapping.h"
#include "config/node_security.h"
#include "optimizers/param_state.h"
#include "tests/harness/child_process.h"
#include "worker/partition.h"

namespace bitpush::bench {
namespace {

using testing::Child;
using testing::ProcessClock;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kName[] = "bitpush-bench pushpull";
// cluster.ucx.port_offset of the --transport ucx clusters (the YAML's default).
constexpr int kUcxPortOffset = 1000;
constexpr double kMiB = 1 << 20;

struct Options {
  bool json = false;
  int workers = 1;
  int servers = 1;
  double mb = 100;
  long long partition_kb = 4000;
  std::vector<std::string> compressors;
  std::vector<std::string> securities;  // "none", "curve"; each compressor runs under each
  std::vector<std::string> transports;  // "zmq", "ucx"; each compressor runs over each
  std::string ucx_tls;                  // cluster.ucx.tls of the ucx clusters ("": UCX's choice)
  std::string error_feedback = "auto";
  long long min_compress_bytes = 1048576;
  int iters = 10;
  int warmup = 2;
  int tensors = 1;
  DType dtype = DType::kFloat32;  // of the workers' tensors
  int raw_reps = 5;
  int timeout_s = 300;
  bool keep_dir = false;
  double link_gbit = 0;    // 0: loopback; > 0: servers behind an emulated link of R Gbit/s
  std::string peer;        // "": bitpush only; "pslite": dmlc/ps-lite side by side
  std::string pslite_dir;  // the ps-lite checkout holding our driver (bench/peers/README.md)
  int peer_reps = 3;       // alternations of ps-lite and bitpush clusters (medians reported)
  int reps = 1;            // without --peer: passes over all the runs (medians reported)
  // "worker", "server" (--server-side, --placement): where the optimizer runs; each compressor
  // runs once per placement.
  std::vector<std::string> placements;
  std::string optimizer;      // the optimizer's rule ("": adamw on the servers, none on workers)
  std::string pull = "auto";  // server placement: the weights' pull spec (auto: qWD for sdp4bit)
};

// The optimizer.pull of a server-placement run of push compressor `spec`: --pull, or with
// `auto` SDP4Bit's qWD for sdp4bit pushes and raw fp32 weights otherwise (canonical).
std::string PullFor(const Options& opt, const std::string& spec) {
  std::string pull = opt.pull;
  if (pull == "auto") {
    pull = spec.rfind("sdp4bit", 0) == 0 ? "sdp4bit:hadamard=off,group=2048" : "none";
  }
  StatusOr<v1::CompressorConfig> c = compressors::ParseCompressorSpec(pull);
  return c.ok() ? compressors::CompressorSpecString(*c) : pull;
}

// The optimizer rule a run of `placement` uses ("" = none).
std::string OptimizerFor(const Options& opt, const std::string& placement) {
  if (!opt.optimizer.empty()) return opt.optimizer;
  return placement == "server" ? "adamw" : "";
}

// bench/peers/build-pslite-driver.sh in the source tree (bench/CMakeLists.txt), if known.
#ifndef BITPUSH_PEERS_DIR
#define BITPUSH_PEERS_DIR ""
#endif

// Where the processes listen: loopback, or the two ends of the emulated link.
struct NetPlan {
  std::string root_ip = "127.0.0.1";    // scheduler, workers, the driver's raw TCP end
  std::string server_ip = "127.0.0.1";  // servers, the raw TCP peer
  std::string netns;                    // non-empty: the servers' network namespace (ip netns name)
  std::string ip_tool;                  // path of `ip` (runs the servers: ip netns exec NS ...)
  // cluster.ucx.net_devices: the devices the cluster's addresses are on and the RDMA ports
  // (UCX would otherwise add lanes through every other interface it finds); UCX_NET_DEVICES in
  // the environment wins.
  std::string ucx_net_devices = transport::ucx_backend::LoopbackNetDevices();
};

// What --transport ucx passes as UCX's NET_DEVICES: `net`'s, unless UCX_NET_DEVICES is set.
std::string UcxNetDevices(const NetPlan& net) {
  return std::getenv("UCX_NET_DEVICES") != nullptr ? "" : net.ucx_net_devices;
}

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench pushpull [--json] [--workers 1] [--servers 1] [--mb 100]\n"
      "         [--partition-kb 4000] [--compressor SPEC[,SPEC...]] [--iters 10] [--warmup 2]\n"
      "         [--tensors 1] [--dtype float32|float16|bfloat16]\n"
      "         [--error-feedback auto|none|worker|server|both]\n"
      "         [--min-compress-bytes 1048576] [--raw-reps 5] [--timeout-s 300] [--keep-dir]\n"
      "         [--link-gbit R] [--security none|curve[,...]] [--transport zmq|ucx[,...]]\n"
      "         [--ucx-tls TLS] [--reps 1]\n"
      "         [--peer pslite --pslite-dir DIR [--peer-reps 3]]\n"
      "         [--server-side | --placement worker|server[,...]] [--optimizer sgd|adamw|lans]\n"
      "         [--pull SPEC|auto]\n"
      "Runs a real cluster on loopback per compressor (bitpush-scheduler, S bitpush-server,\n"
      "W workers) and times N PushPull+Wait iterations of MB MiB of --dtype (float32) per worker\n"
      "(in K equal tensors), in partitions of partition-kb x 1024 bytes. --compressor takes a list "
      "(one\n"
      "JSON record each; default none); the flag may repeat. --error-feedback auto = both for\n"
      "the biased compressors (onebit, topk, randomk with unbiased=false), none otherwise.\n"
      "goodput_gbps = tensor GB/s (1e9 B/s) per worker per direction, vs raw_tcp_gbps: the same\n"
      "bytes streamed one way over one loopback TCP socket in the same run, and\n"
      "raw_tcp_duplex_gbps: per direction, the same bytes sent both ways at once.\n"
      "--link-gbit R (root, needs ip and tc): the servers run in a network namespace behind a\n"
      "veth pair shaped to R Gbit/s each way (tc tbf); the raw TCP references cross it too.\n"
      "--security takes a list (default none; the flag may repeat): each compressor runs once\n"
      "per mode; curve = ZeroMQ CURVE with a key pair per node, generated into a private\n"
      "temporary directory removed at exit. security_ratio = goodput / the same compressor's\n"
      "goodput under none.\n"
      "--transport takes a list (default zmq; the flag may repeat): each compressor runs once per\n"
      "transport; ucx = the data plane over UCX (cluster.transport ucx), with cluster.ucx.tls =\n"
      "--ucx-tls (e.g. tcp, or sm,self,tcp for shared memory; default: UCX's choice).\n"
      "transport_ratio = goodput / the same compressor's goodput over zmq.\n"
      "--reps R: R passes over all the runs (each compressor, security mode and transport once\n"
      "per pass, in the same order), so that drift of the shared machine hits all; each record\n"
      "is the run of median goodput of its R (goodput_min_gbps, goodput_max_gbps beside it), and\n"
      "the ratios compare medians. With --peer, --peer-reps sets the passes.\n"
      "--peer pslite --pslite-dir DIR: dmlc/ps-lite side by side (our dense driver, built in\n"
      "DIR by bench/peers/build-pslite-driver.sh: bench/peers/README.md), same sizes, R\n"
      "alternations of a ps-lite and the bitpush clusters (--peer-reps, default 3), medians;\n"
      "records get peer and ratio_to_pslite. Without a driver: bitpush alone, exit 0.\n"
      "--server-side (= --placement server): the servers run the optimizer (--optimizer,\n"
      "default adamw) and the workers pull weights (--pull: auto = SDP4Bit's qWD,\n"
      "sdp4bit:hadamard=off,group=2048, for sdp4bit pushes, raw fp32 otherwise); --placement\n"
      "worker,server runs each compressor both ways (worker: --optimizer, if given, runs in the\n"
      "worker processes on the averaged gradient). Records get placement, optimizer, pull;\n"
      "worker_peak_rss_mb shows where the optimizer state lives.\n");
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}

// "none,randomk:ratio=0.01,unbiased=false,onebit" -> none | randomk:ratio=...,unbiased=false |
// onebit: a piece with '=' but no ':' is a parameter of the spec before it.
std::vector<std::string> SplitSpecs(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = list.find(',', pos);
    const std::string piece = list.substr(pos, comma == std::string::npos ? comma : comma - pos);
    if (!out.empty() && piece.find('=') != std::string::npos &&
        piece.find(':') == std::string::npos) {
      out.back() += "," + piece;
    } else if (!piece.empty()) {
      out.push_back(piece);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// auto: error feedback where the compressor is biased (paper 001: both).
StatusOr<std::string> ErrorFeedbackFor(const std::string& spec, const std::string& requested) {
  BP_ASSIGN_OR_RETURN(v1::CompressorConfig c, compressors::ParseCompressorSpec(spec));
  if (requested != "auto") return requested;
  return std::string(
      compressors::ErrorFeedbackPolicyName(compressors::RecommendedErrorFeedback(c)));
}

std::string SelfExe() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  exe[n] = '\0';
  return exe;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string Fmt(double v, const char* format = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// ---- the raw TCP reference ------------------------------------------------------------------

// A forked peer process serving RawPeer on one TCP connection: loopback, or across the
// emulated link (the peer joins the servers' namespace and connects to the root end).
class RawReference {
 public:
  ~RawReference() { Stop(); }

  Status Start(const NetPlan& net) {
    int port = 0;
    std::string error;
    const int listener = ListenTcp(net.root_ip, &port, &error);
    if (listener < 0) return UnavailableError(error);
    pid_ = fork();
    if (pid_ < 0) {
      close(listener);
      return InternalError(std::string("fork: ") + std::strerror(errno));
    }
    if (pid_ == 0) {
      close(listener);
      if (!net.netns.empty()) {
        const std::string path = "/var/run/netns/" + net.netns;
        const int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
          std::fprintf(stderr, "%s: raw TCP peer: cannot enter %s: %s\n", kName, path.c_str(),
                       std::strerror(errno));
          _exit(1);
        }
        close(ns);
      }
      const int fd = ConnectTcp(net.root_ip, port, &error);
      if (fd >= 0) RawPeer(fd);
      _exit(fd >= 0 ? 0 : 1);
    }
    pollfd p{listener, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) {
      close(listener);
      return TimeoutError("the raw TCP peer did not connect within 10 s");
    }
    fd_ = accept(listener, nullptr, nullptr);
    close(listener);
    if (fd_ < 0) return UnavailableError(std::string("accept: ") + std::strerror(errno));
    SetNoDelay(fd_);
    return Status::Ok();
  }

  // Streams `total` bytes in messages of `message` bytes `reps` times, one way (kRawStream)
  // or both ways at once (kRawDuplex: `total` bytes each way; the throughput is one
  // direction's bytes / the exchange's wall time); keeps the fastest (unless `warmup`: then
  // only the side effects count: page faults, TCP window growth).
  Status Measure(uint64_t total, uint64_t message, int reps, bool warmup = false,
                 RawMode mode = kRawStream) {
    message = std::max<uint64_t>(1, std::min(message, total));
    if (src_.size() != message) {
      src_.resize(message);
      for (size_t i = 0; i < message; ++i) src_[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
    }
    const uint64_t count = (total + message - 1) / message;
    Series& series = mode == kRawDuplex ? duplex_ : stream_;
    for (int rep = 0; rep < reps; ++rep) {
      const double s = mode == kRawDuplex ? RawDuplex(fd_, src_, count, &scratch_)
                                          : RawStream(fd_, kRawStream, src_, count);
      if (std::isnan(s)) {
        return UnavailableError(
            std::string(mode == kRawDuplex ? "raw TCP duplex exchange" : "raw TCP stream") +
            ": the peer went away");
      }
      const double gbps = static_cast<double>(count * message) / s / 1e9;
      if (warmup) continue;
      series.best = std::max(series.best, gbps);
      series.all.push_back(gbps);
    }
    return Status::Ok();
  }
  // Both references, each with one warm-up first when `warmup`.
  Status MeasureBoth(uint64_t total, uint64_t message, int reps, bool warmup) {
    for (RawMode mode : {kRawStream, kRawDuplex}) {
      if (warmup) BP_RETURN_IF_ERROR(Measure(total, message, 1, /*warmup=*/true, mode));
      BP_RETURN_IF_ERROR(Measure(total, message, reps, /*warmup=*/false, mode));
    }
    return Status::Ok();
  }

  double BestGbps() const { return stream_.best; }
  double MedianGbps() const { return stream_.Median(); }
  double DuplexBestGbps() const { return duplex_.best; }
  double DuplexMedianGbps() const { return duplex_.Median(); }

  void Stop() {
    if (fd_ >= 0) {
      const RawHeader quit{kRawQuit, 0, 0};
      (void)WriteAll(fd_, &quit, sizeof(quit));
      close(fd_);
      fd_ = -1;
    }
    if (pid_ > 0) {
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (waitpid(pid_, nullptr, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, nullptr, 0);
          break;
        }
        std::this_thread::sleep_for(milliseconds(5));
      }
      pid_ = -1;
    }
  }

 private:
  struct Series {
    double best = 0;
    std::vector<double> all;
    double Median() const {
      std::vector<double> v = all;
      std::sort(v.begin(), v.end());
      return v.empty() ? NAN : v[v.size() / 2];
    }
  };
  pid_t pid_ = -1;
  int fd_ = -1;
  std::vector<uint8_t> src_, scratch_;
  Series stream_, duplex_;
};

// ---- clean-up on a signal: the emulated link, the keys directory ----------------------------

// For the signal handler: what to remove if the run is interrupted (async-signal-safe: fork,
// execv, waitpid only). Empty: nothing of that kind to remove.
char g_ip_tool[512];
char g_netns[64];
char g_veth[32];
char g_rm_tool[512];
char g_keys_dir[512];

void RunOnSignal(const char* const* argv) {
  const pid_t p = fork();
  if (p == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  if (p > 0) waitpid(p, nullptr, 0);
}

void CleanUpOnSignal(int sig) {
  if (g_keys_dir[0] != '\0') {
    const char* const argv[] = {g_rm_tool, "-rf", g_keys_dir, nullptr};
    RunOnSignal(argv);
  }
  if (g_netns[0] != '\0') {
    const char* const link[] = {g_ip_tool, "link", "del", g_veth, nullptr};
    const char* const netns[] = {g_ip_tool, "netns", "del", g_netns, nullptr};
    RunOnSignal(link);
    RunOnSignal(netns);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void CleanUpOnSignals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, CleanUpOnSignal);
}

// ---- --link-gbit: the emulated link ---------------------------------------------------------

std::string FindTool(const std::string& name) {
  std::string path = getenv("PATH") != nullptr ? getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t colon = path.find(':', pos);
    const std::string dir = path.substr(pos, colon == std::string::npos ? colon : colon - pos);
    if (dir.empty()) {
      if (colon == std::string::npos) break;
      pos = colon + 1;
      continue;
    }
    std::string candidate = dir;
    candidate += "/";
    candidate += name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return "";
}

// Runs a command line of our own making (no user text in it); its exit status, output in *out.
int Shell(const std::string& command, std::string* out = nullptr) {
  FILE* f = popen((command + " 2>&1").c_str(), "r");  // NOLINT(bugprone-command-processor)
  if (f == nullptr) return -1;
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), f) != nullptr) text += buf;
  const int status = pclose(f);
  if (out != nullptr) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A network namespace bp-bench-<pid> and a veth pair bpb<pid>a (root namespace, 10.251.X.1/30)
// <-> bpb<pid>b (in the namespace, 10.251.X.2/30), each end's egress shaped by tc tbf to
// R Gbit/s, so each direction of the link carries R Gbit/s. Removed by Remove() / the
// destructor, and by a signal handler if the run is interrupted.
class EmulatedLink {
 public:
  ~EmulatedLink() { Remove(); }

  Status Create(double gbit, NetPlan* net) {
    if (geteuid() != 0) {
      return FailedPreconditionError("--link-gbit needs root (network namespaces, veth, tc)");
    }
    ip_ = FindTool("ip");
    tc_ = FindTool("tc");
    if (ip_.empty() || tc_.empty()) {
      return FailedPreconditionError(std::string("--link-gbit needs the iproute2 tools: ") +
                                     (ip_.empty() ? "ip " : "") + (tc_.empty() ? "tc " : "") +
                                     "not found in PATH, /usr/sbin or /sbin");
    }
    RemoveStale();
    const long pid = static_cast<long>(getpid());
    netns_ = "bp-bench-" + std::to_string(pid);
    veth_root_ = "bpb" + std::to_string(pid) + "a";
    veth_ns_ = "bpb" + std::to_string(pid) + "b";
    // A /30 in 10.251.0.0/16 that no interface here has yet.
    std::string addrs;
    Shell(ip_ + " -4 -o addr show", &addrs);
    int x = static_cast<int>(pid % 254) + 1;
    for (int tries = 0; addrs.find("10.251." + std::to_string(x) + ".") != std::string::npos;
         x = x % 254 + 1) {
      if (++tries > 254) return UnavailableError("no free 10.251.X.0/30 subnet for --link-gbit");
    }
    const std::string prefix = "10.251." + std::to_string(x) + ".";
    net->root_ip = prefix + "1";
    net->server_ip = prefix + "2";
    net->netns = netns_;
    net->ip_tool = ip_;
    // Each end sees its own veth.
    net->ucx_net_devices = veth_root_ + "," + veth_ns_ +
                           transport::ucx_backend::LoopbackNetDevices().substr(2);  // ",mlx5_0:1"

    std::snprintf(g_ip_tool, sizeof(g_ip_tool), "%s", ip_.c_str());
    std::snprintf(g_netns, sizeof(g_netns), "%s", netns_.c_str());
    std::snprintf(g_veth, sizeof(g_veth), "%s", veth_root_.c_str());
    CleanUpOnSignals();
    created_ = true;

    // tbf: rate R, a bucket of 1 ms at that rate (at least 256 KiB: GSO packets of 64 KiB
    // pass whole), queueing up to 10 ms before dropping.
    const double bytes_per_s = gbit * 1e9 / 8;
    const long long burst = std::max<long long>(256 << 10, std::llround(bytes_per_s / 1000));
    const std::string tbf = " root tbf rate " + Fmt(gbit * 1000, "%.6g") + "mbit burst " +
                            std::to_string(burst) + " latency 10ms";
    const std::string in_ns = ip_ + " netns exec " + netns_ + " ";
    const std::vector<std::string> steps = {
        ip_ + " netns add " + netns_,
        ip_ + " link add " + veth_root_ + " type veth peer name " + veth_ns_,
        ip_ + " link set " + veth_ns_ + " netns " + netns_,
        ip_ + " addr add " + net->root_ip + "/30 dev " + veth_root_,
        ip_ + " link set " + veth_root_ + " up",
        in_ns + ip_ + " addr add " + net->server_ip + "/30 dev " + veth_ns_,
        in_ns + ip_ + " link set " + veth_ns_ + " up",
        in_ns + ip_ + " link set lo up",
        tc_ + " qdisc add dev " + veth_root_ + tbf,
        in_ns + tc_ + " qdisc add dev " + veth_ns_ + tbf,
    };
    for (const std::string& step : steps) {
      std::string out;
      if (Shell(step, &out) != 0) {
        return InternalError(fmt::format("--link-gbit: '{}' failed: {}", step, out));
      }
    }
    return Status::Ok();
  }

  void Remove() {
    if (!created_) return;
    Shell(ip_ + " link del " + veth_root_);  // both ends of the pair
    Shell(ip_ + " netns del " + netns_);
    g_netns[0] = '\0';
    created_ = false;
  }

 private:
  // Namespaces bp-bench-<pid> left by a run that was SIGKILLed (its pid no longer exists).
  void RemoveStale() {
    std::string list;
    if (Shell(ip_ + " netns list", &list) != 0) return;
    std::istringstream lines(list);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("bp-bench-", 0) != 0) continue;
      const std::string digits = line.substr(9, line.find_first_not_of("0123456789", 9) - 9);
      if (digits.empty()) continue;
      const long pid = std::stol(digits);
      if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
      Shell(ip_ + " link del bpb" + digits + "a");
      Shell(ip_ + " netns del bp-bench-" + digits);
    }
  }

  bool created_ = false;
  std::string ip_, tc_, netns_, veth_root_, veth_ns_;
};

// ---- --transport ucx: what UCX chooses --------------------------------------------------------

// The transports UCX chooses for a worker -> server connection of the ucx clusters' configuration
// (cluster.ucx.tls = --ucx-tls, the UCX_* environment): two ucx endpoints on the workers' and the
// servers' address, one message each way, then the lanes of the worker's endpoint ("tcp/lo",
// "posix/memory,cma/memory,tcp/lo"; info.h LaneTransports). Under --link-gbit both ends are in the
// root namespace (the probe crosses loopback, not the link).
struct UcxProbe {
  std::string lanes;

  Status Run(const std::string& tls, const NetPlan& net) {
    auto endpoint = [&](const std::string& name) {
      transport::TransportOptions o;
      o.name = name;
      const int port = testing::FreeTcpPort();
      o.listen_address = "ucx://" + net.root_ip + ":" + std::to_string(port);
      if (!tls.empty()) o.ucx_config["TLS"] = tls;
      if (const std::string d = UcxNetDevices(net); !d.empty()) o.ucx_config["NET_DEVICES"] = d;
      return transport::CreateTransport(o);
    };
    BP_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> server, endpoint("server:0"));
    BP_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> worker, endpoint("worker:0"));
    BP_RETURN_IF_ERROR(worker->Connect("server:0", server->address()));
    BP_RETURN_IF_ERROR(server->Connect("worker:0", worker->address()));
    constexpr std::chrono::milliseconds kWait{10000};
    for (transport::Transport* from : {worker.get(), server.get()}) {
      transport::Transport* to = from == worker.get() ? server.get() : worker.get();
      transport::Message probe;
      probe.header = "probe";
      BP_RETURN_IF_ERROR(from->Send(to->name(), std::move(probe)));
      for (;;) {  // events (connected) come first; each Receive is bounded
        BP_ASSIGN_OR_RETURN(transport::Received r, to->Receive(kWait));
        if (r.is_message()) break;
        if (r.event().kind != transport::TransportEvent::Kind::kPeerConnected) {
          return r.event().status.WithContext("the ucx probe");
        }
      }
    }
    BP_ASSIGN_OR_RETURN(std::string info, transport::ucx_backend::DescribePeerEndpoint(
                                              worker.get(), "server:0", kWait));
    lanes = transport::ucx_backend::LaneTransports(transport::ucx_backend::ParseEpLanes(info));
    worker->Close();
    server->Close();
    return Status::Ok();
  }
};

// ---- --security curve: the nodes' keys ------------------------------------------------------

// A key pair per node of the benchmark's clusters (scheduler, server:0.., worker:0..) and the
// public_keys listing them (security::WriteClusterKeys), in a private temporary directory
// (mkdtemp: mode 0700) that Remove() / the destructor delete, and the signal handler if the run
// is interrupted. Every curve cluster of the run uses them: node names do not depend on the
// addresses.
class BenchKeys {
 public:
  ~BenchKeys() { Remove(); }

  Status Create(int servers, int workers) {
    std::string dir = "/tmp/bp-bench-keys-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) {
      return InternalError(std::string("cannot create the keys directory under /tmp: ") +
                           std::strerror(errno));
    }
    dir_ = dir;
    const std::string rm = FindTool("rm");
    if (!rm.empty() && dir_.size() < sizeof(g_keys_dir) && rm.size() < sizeof(g_rm_tool)) {
      std::snprintf(g_rm_tool, sizeof(g_rm_tool), "%s", rm.c_str());
      std::snprintf(g_keys_dir, sizeof(g_keys_dir), "%s", dir_.c_str());
      CleanUpOnSignals();
    }
    config::ClusterConfig shape;
    shape.servers.resize(static_cast<size_t>(servers));
    shape.workers.resize(static_cast<size_t>(workers));
    StatusOr<std::vector<std::string>> written =
        security::WriteClusterKeys(dir_, config::ClusterNodeNames(shape), /*overwrite=*/false);
    if (!written.ok()) return written.status().WithContext("--security curve");
    return Status::Ok();
  }

  const std::string& Dir() const { return dir_; }

  void Remove() {
    if (dir_.empty()) return;
    g_keys_dir[0] = '\0';
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    dir_.clear();
  }

 private:
  std::string dir_;
};

// ---- one cluster ----------------------------------------------------------------------------

struct ClusterResult {
  std::string spec;
  std::string placement = "worker";
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
  // keys_dir: the nodes' keys when security is "curve".
  ClusterRun(const Options& opt, const NetPlan& net, std::string spec, std::string ef,
             std::string security, std::string transport, std::string placement,
             std::string keys_dir, std::string bin_dir)
      : opt_(opt),
        net_(net),
        dir_("bp-bench"),
        bin_dir_(std::move(bin_dir)),
        keys_dir_(std::move(keys_dir)) {
    result_.spec = std::move(spec);
    result_.error_feedback = std::move(ef);
    result_.security = std::move(security);
    result_.transport = std::move(transport);
    result_.placement = std::move(placement);
    result_.optimizer = OptimizerFor(opt_, result_.placement);
    if (result_.placement == "server") result_.pull = PullFor(opt_, result_.spec);
  }
  ~ClusterRun() {
    children_.clear();  // kills and reaps what still runs
    if (opt_.keep_dir) dir_.Keep();
  }

  StatusOr<ClusterResult> Run() {
    if (!dir_.ok()) return InternalError("cannot create a temp dir under /tmp");
    BP_ASSIGN_OR_RETURN(config::ClusterConfig config, WriteConfig());
    const std::string self = SelfExe();
    const auto t0 = Clock::now();
    scheduler_ = Spawn("scheduler", {bin_dir_ + "/bitpush-scheduler", "--config", config_path_});
    for (int s = 0; s < opt_.servers; ++s) {
      const std::string r = std::to_string(s);
      std::vector<std::string> argv = {bin_dir_ + "/bitpush-server",
                                       "--config",
                                       config_path_,
                                       "--rank",
                                       r,
                                       "--stats-json",
                                       dir_.path() + "/server" + r + ".json",
                                       "--log-level",
                                       "warn"};
      if (!net_.netns.empty()) {
        argv.insert(argv.begin(), {net_.ip_tool, "netns", "exec", net_.netns});
      }
      servers_.push_back(Spawn("server " + r, argv));
    }
    const std::string tensor_mb = Fmt(opt_.mb / opt_.tensors, "%.17g");
    for (int w = 0; w < opt_.workers; ++w) {
      const std::string r = std::to_string(w);
      std::vector<std::string> argv = {self,          "pushpull-worker",
                                       "--config",    config_path_,
                                       "--rank",      r,
                                       "--tensor-mb", tensor_mb,
                                       "--tensors",   std::to_string(opt_.tensors),
                                       "--dtype",     std::string(DTypeName(opt_.dtype)),
                                       "--iters",     std::to_string(opt_.iters),
                                       "--warmup",    std::to_string(opt_.warmup),
                                       "--results",   dir_.path() + "/worker" + r + ".json",
                                       "--placement", result_.placement,
                                       "--quiet"};
      if (!result_.optimizer.empty())
        argv.insert(argv.end() - 1, {"--optimizer", result_.optimizer});
      workers_.push_back(Spawn("worker " + r, argv));
    }
    BP_RETURN_IF_ERROR(WaitForAll(config));
    result_.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    BP_RETURN_IF_ERROR(Collect(config));
    return result_;
  }

 private:
  StatusOr<config::ClusterConfig> WriteConfig() {
    std::set<int> used;
    // Ports free on loopback; the servers' namespace (if any) is fresh: all free there. Over
    // ucx a server's or worker's data port (its port + kUcxPortOffset) is free too.
    const bool ucx = result_.transport == "ucx";
    auto port = [&](const std::string& ip, bool data_port) -> StatusOr<std::string> {
      const int offset = data_port && ucx ? kUcxPortOffset : 0;
      for (int attempt = 0; attempt < 100; ++attempt) {
        const int p = testing::FreeTcpPort(offset);
        if (p <= 0 || used.count(p) != 0 || (offset > 0 && used.count(p + offset) != 0)) continue;
        used.insert(p);
        if (offset > 0) used.insert(p + offset);
        return ip + ":" + std::to_string(p);
      }
      return UnavailableError("no free TCP port on 127.0.0.1");
    };
    auto list = [&](int n, const std::string& ip) -> StatusOr<std::string> {
      std::string s = "[";
      for (int i = 0; i < n; ++i) {
        BP_ASSIGN_OR_RETURN(std::string a, port(ip, /*data_port=*/true));
        s += (i ? ", " : "") + a;
      }
      return s + "]";
    };
    BP_ASSIGN_OR_RETURN(std::string scheduler, port(net_.root_ip, /*data_port=*/false));
    BP_ASSIGN_OR_RETURN(std::string servers, list(opt_.servers, net_.server_ip));
    BP_ASSIGN_OR_RETURN(std::string workers, list(opt_.workers, net_.root_ip));
    std::ostringstream y;
    y << "cluster:\n"
      << "  scheduler: " << scheduler << "\n"
      << "  servers: " << servers << "\n"
      << "  workers: " << workers << "\n"
      << "  heartbeat_interval_ms: 500\n"
      << "  heartbeat_timeout_ms: 5000\n"
      << "  startup_timeout_s: 30\n";
    if (ucx) {
      y << "  transport: ucx\n"
        << "  ucx:\n"
        << "    port_offset: " << kUcxPortOffset << "\n";
      if (!opt_.ucx_tls.empty()) y << "    tls: \"" << opt_.ucx_tls << "\"\n";
      if (const std::string d = UcxNetDevices(net_); !d.empty()) {
        y << "    net_devices: \"" << d << "\"\n";
      }
    }
    y << "compression:\n"
      << "  spec: \"" << result_.spec << "\"\n"
      << "  error_feedback: " << result_.error_feedback << "\n"
      << "  min_compress_bytes: " << opt_.min_compress_bytes << "\n"
      << "  partition_bytes: " << opt_.partition_kb * 1024 << "\n"
      << "worker:\n"
      << "  op_timeout_s: " << opt_.timeout_s << "\n";
    if (result_.placement == "server") {
      y << "optimizer:\n"
        << "  placement: server\n"
        << "  pull: \"" << result_.pull << "\"\n";
    }
    if (result_.security == "curve") {
      y << "security:\n"
        << "  mode: curve\n"
        << "  keys_dir: \"" << keys_dir_ << "\"\n";
    }
    const std::string yaml = y.str();
    config_path_ = dir_.path() + "/cluster.yaml";
    std::ofstream(config_path_) << yaml;
    StatusOr<config::ClusterConfig> c = config::ParseClusterConfig(yaml, config_path_);
    if (!c.ok()) return c.status().WithContext("the generated cluster YAML");
    return c;
  }

  Child* Spawn(const std::string& label, const std::vector<std::string>& argv) {
    std::string log = label;
    std::replace(log.begin(), log.end(), ' ', '-');
    children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log + ".log"));
    return children_.back().get();
  }

  std::string Describe(const Child& c) const {
    return c.label() + " (" + c.ExitDescription() + "), last lines of its output:\n" +
           testing::TailLines(c.output(), 15);
  }

  // Until every process exited: OK when all exited 0. The first failing process ends the
  // run: the others get the heartbeat bound to notice, then are killed.
  Status WaitForAll(const config::ClusterConfig& config) {
    std::vector<Child*> all;
    all.reserve(children_.size());
    for (auto& c : children_) all.push_back(c.get());
    const auto deadline = ProcessClock::now() + std::chrono::seconds(opt_.timeout_s);
    Child* failed = nullptr;
    while (true) {
      bool running = false;
      for (Child* c : all) {
        if (!c->Poll()) {
          running = true;
        } else if (c->exit_code() != 0 && failed == nullptr) {
          failed = c;
        }
      }
      if (!running || failed != nullptr || ProcessClock::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (failed != nullptr) {
      const auto grace = config.heartbeat_timeout + std::chrono::seconds(2);
      testing::WaitAll(all, ProcessClock::now() + grace);
      std::string killed;
      for (Child* c : all) {
        if (!c->exited()) {
          c->Kill();
          killed += (killed.empty() ? "" : ", ") + c->label();
        }
      }
      std::string message = Describe(*failed);
      std::string others;
      for (Child* c : all) {
        if (c != failed && c->exit_code() != 0 && killed.find(c->label()) == std::string::npos) {
          others += "\n" + c->label() + " (" + c->ExitDescription() + "), last lines:\n" +
                    testing::TailLines(c->output(), 3);
        }
      }
      if (!others.empty()) message += "\nthen also failed:" + others;
      if (!killed.empty()) message += "\n(then killed, still running: " + killed + ")";
      return InternalError(message);
    }
    std::string late;
    for (Child* c : all) {
      if (!c->exited()) {
        late += "\n" + c->label() + ", last lines of its output:\n" +
                testing::TailLines(c->output(), 10);
        c->Kill();
      }
    }
    if (!late.empty()) {
      return TimeoutError("timed out after " + std::to_string(opt_.timeout_s) +
                          " s (--timeout-s); killed:" + late);
    }
    return Status::Ok();
  }

  Status Collect(const config::ClusterConfig& config) {
    ClusterResult& r = result_;
    const double iters = opt_.iters;
    double slowest_loop = 0, best_iter = INFINITY, tensor_bytes = 0;
    for (Child* const& w : workers_) {
      const std::string path =
          dir_.path() + "/worker" + std::to_string(&w - &workers_[0]) + ".json";
      const auto m = ReadFlatJson(testing::ReadFile(path));
      if (m.count("status") == 0 || m.at("status") != "OK") {
        return InternalError(w->label() + " exited 0 but its results in " + path +
                             " do not say OK");
      }
      tensor_bytes = JsonNumber(m, "tensor_bytes") * opt_.tensors;
      slowest_loop = std::max(slowest_loop, JsonNumber(m, "loop_seconds"));
      best_iter = std::min(best_iter, JsonNumber(m, "best_iter_seconds", INFINITY));
      r.compress_ms += JsonNumber(m, "compress_ns") / iters / 1e6 / opt_.workers;
      r.network_ms += JsonNumber(m, "network_ns") / iters / 1e6 / opt_.workers;
      r.decompress_ms += JsonNumber(m, "decompress_ns") / iters / 1e6 / opt_.workers;
      const double ops = iters * static_cast<double>(opt_.tensors) * opt_.workers;
      r.last_push_ms += JsonNumber(m, "last_push_ns") / ops / 1e6;
      r.first_reply_ms += JsonNumber(m, "first_reply_ns") / ops / 1e6;
      r.op_ms += JsonNumber(m, "op_ns") / ops / 1e6;
      r.bytes_pushed_per_iter += JsonNumber(m, "bytes_pushed") / iters / opt_.workers;
      r.bytes_pulled_per_iter += JsonNumber(m, "bytes_pulled") / iters / opt_.workers;
      r.worker_peak_rss_mb = std::max(r.worker_peak_rss_mb, w->peak_rss_kib() / 1024.0);
    }
    r.goodput_gbps = tensor_bytes * iters / slowest_loop / 1e9;
    r.best_iter_gbps = tensor_bytes / best_iter / 1e9;
    r.iter_ms = slowest_loop / iters * 1e3;

    // What each server owns: the partitions of tensors 0..K-1 under the scheduler's mapping.
    std::vector<double> owned(opt_.servers, 0);
    const v1::KeyMapping mapping = config::MakeKeyMapping(opt_.servers);
    const double esz = static_cast<double>(DTypeSize(opt_.dtype));
    const size_t elements = static_cast<size_t>(tensor_bytes / opt_.tensors / esz);
    for (int t = 0; t < opt_.tensors; ++t) {
      BP_ASSIGN_OR_RETURN(
          std::vector<worker::PartitionRange> parts,
          worker::PartitionTensor(t, elements, opt_.dtype, config.compression.partition_bytes));
      for (const worker::PartitionRange& p : parts) {
        owned[config::ServerForKey(p.key, mapping)] += static_cast<double>(p.elements) * esz;
      }
    }
    double busy_ns = 0, cpu_ns = 0;
    for (int s = 0; s < opt_.servers; ++s) {
      Child* c = servers_[s];
      const auto m =
          ReadFlatJson(testing::ReadFile(dir_.path() + "/server" + std::to_string(s) + ".json"));
      if (m.empty()) return InternalError(c->label() + " wrote no --stats-json file");
      busy_ns += JsonNumber(m, "engine_busy_ns");
      cpu_ns += JsonNumber(m, "engine_cpu_ns");
      r.server_keys += static_cast<uint64_t>(JsonNumber(m, "keys"));
      r.pushes_rejected += static_cast<uint64_t>(JsonNumber(m, "pushes_rejected"));
      const double rss = c->peak_rss_kib() / 1024.0;
      r.server_peak_rss_mb = std::max(r.server_peak_rss_mb, rss);
      r.server_owned_mb = std::max(r.server_owned_mb, owned[s] / kMiB);
      r.server_rss_over_target =
          std::max(r.server_rss_over_target, rss / (4 * owned[s] / kMiB + 64));
    }
    r.server_ms = busy_ns / (opt_.warmup + iters) / 1e6;
    r.server_cpu_ms = cpu_ns / (opt_.warmup + iters) / 1e6;
    r.scheduler_peak_rss_mb = scheduler_->peak_rss_kib() / 1024.0;
    return Status::Ok();
  }

  const Options& opt_;
  const NetPlan& net_;
  testing::TempDir dir_;
  std::string bin_dir_;
  std::string keys_dir_;
  std::string config_path_;
  std::vector<std::unique_ptr<Child>> children_;
  Child* scheduler_ = nullptr;
  std::vector<Child*> servers_, workers_;
  ClusterResult result_;
};

// ---- driver ---------------------------------------------------------------------------------

int RunDriver(const Options& opt) {
  const std::string self = SelfExe();
  if (self.empty()) return Fail("readlink /proc/self/exe failed");
  const std::string bin_dir = Dirname(self);
  for (const char* b : {"bitpush-scheduler", "bitpush-server"}) {
    if (access((bin_dir + "/" + b).c_str(), X_OK) != 0) {
      return Fail(std::string("needs ") + b + " next to bitpush-bench, in " + bin_dir +
                  " (build it: ninja " + b + ")");
    }
  }
  struct RunSpec {
    std::string spec, error_feedback, security, transport, placement;
  };
  // Per compressor, one per security mode and transport (adjacent: fair ratios).
  std::vector<RunSpec> runs;
  for (const std::string& spec : opt.compressors) {
    StatusOr<std::string> ef = ErrorFeedbackFor(spec, opt.error_feedback);
    if (!ef.ok()) return Fail("--compressor '" + spec + "': " + ef.status().message());
    // The config validator's verdict before anything starts (e.g. unbiased random-k with
    // error feedback is refused): a usage error.
    const std::string yaml =
        "cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n"
        "  workers: [127.0.0.1:3]\ncompression:\n  spec: \"" +
        spec + "\"\n  error_feedback: " + *ef + "\n";
    if (StatusOr<config::ClusterConfig> c = config::ParseClusterConfig(yaml, "--compressor");
        !c.ok()) {
      std::fprintf(stderr, "%s: %s\n", kName, c.status().message().c_str());
      return 2;
    }
    for (const std::string& placement : opt.placements) {
      for (const std::string& security : opt.securities) {
        for (const std::string& transport : opt.transports) {
          runs.push_back({spec, *ef, security, transport, placement});
        }
      }
    }
  }
  // The keys of the curve clusters are the ones in their YAML, whatever this environment says.
  for (const char* var : {"BITPUSH_KEYS_DIR", "BITPUSH_KEY_FILE", "CREDENTIALS_DIRECTORY"}) {
    unsetenv(var);
  }
  BenchKeys keys;
  if (std::find(opt.securities.begin(), opt.securities.end(), "curve") != opt.securities.end()) {
    if (Status s = keys.Create(opt.servers, opt.workers); !s.ok()) return Fail(s.ToString());
  }

  // --peer pslite: the ps-lite driver, or why there is none (then bitpush runs alone).
  std::string pslite_driver;
  std::string pslite_missing;
  if (opt.peer == "pslite") {
    const std::string peers_dir = BITPUSH_PEERS_DIR;
    StatusOr<std::string> d = FindPsliteDriver(
        opt.pslite_dir, peers_dir.empty() ? "" : peers_dir + "/build-pslite-driver.sh");
    if (d.ok()) {
      pslite_driver = *d;
    } else {
      pslite_missing = d.status().message();
      std::fprintf(stderr, "%s: --peer pslite: %s\n%s: %s\n%s: running bitpush alone\n", kName,
                   pslite_missing.c_str(), kName, PsliteHowTo().c_str(), kName);
    }
  }

  const uint64_t tensor_bytes =
      static_cast<uint64_t>(std::llround(opt.mb / opt.tensors * kMiB / 4)) * 4 * opt.tensors;
  const uint64_t message = static_cast<uint64_t>(opt.partition_kb) * 1024;
  NetPlan net;
  EmulatedLink link;  // declared before everything that runs across it: removed last
  if (opt.link_gbit > 0) {
    if (Status s = link.Create(opt.link_gbit, &net); !s.ok()) return Fail(s.ToString());
  }
  UcxProbe ucx_probe;
  if (std::find(opt.transports.begin(), opt.transports.end(), "ucx") != opt.transports.end()) {
    if (Status s = ucx_probe.Run(opt.ucx_tls, net); !s.ok()) {
      return Fail("--transport ucx: " + s.ToString());
    }
  }
  RawReference raw;
  if (Status s = raw.Start(net); !s.ok()) return Fail(s.ToString());
  // Per reference (one way, both ways) one warm-up (page faults, TCP window growth), then the
  // measured repetitions; as many again after the clusters.
  if (Status s = raw.MeasureBoth(tensor_bytes, message, opt.raw_reps, /*warmup=*/true); !s.ok()) {
    return Fail(s.ToString());
  }

  // --peer pslite: R alternations of one ps-lite cluster and the bitpush runs; otherwise --reps
  // passes over the bitpush runs.
  const int reps = pslite_driver.empty() ? opt.reps : opt.peer_reps;
  std::vector<std::vector<ClusterResult>> runs_of(runs.size());  // per RunSpec, one per rep
  std::vector<PsliteResult> pslite_runs;
  auto run_pslite = [&]() -> Status {
    PsliteShape shape;
    shape.workers = opt.workers;
    shape.servers = opt.servers;
    shape.mb = static_cast<double>(tensor_bytes) / kMiB;  // bitpush's bytes, all K tensors
    shape.partition_kb = opt.partition_kb;
    shape.iters = opt.iters;
    shape.warmup = opt.warmup;
    shape.timeout_s = opt.timeout_s;
    shape.keep_dir = opt.keep_dir;
    StatusOr<PsliteResult> r = RunPsliteCluster(pslite_driver, shape);
    if (!r.ok()) return r.status().WithContext("ps-lite (" + pslite_driver + ")");
    pslite_runs.push_back(*r);
    return Status::Ok();
  };
  for (int rep = 0; rep < reps; ++rep) {
    const bool pslite_first = rep % 2 == 0;
    if (!pslite_driver.empty() && pslite_first) {
      if (Status s = run_pslite(); !s.ok()) return Fail(s.ToString());
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      const RunSpec& spec = runs[i];
      ClusterRun run(opt, net, spec.spec, spec.error_feedback, spec.security, spec.transport,
                     spec.placement, keys.Dir(), bin_dir);
      StatusOr<ClusterResult> r = run.Run();
      if (!r.ok()) {
        return Fail(spec.spec + " (security " + spec.security + ", transport " + spec.transport +
                    ", optimizer on the " + spec.placement + "s): " + r.status().ToString());
      }
      runs_of[i].push_back(*r);
    }
    if (!pslite_driver.empty() && !pslite_first) {
      if (Status s = run_pslite(); !s.ok()) return Fail(s.ToString());
    }
  }
  keys.Remove();
  // Each run's figures are those of its median-goodput repetition (the lower middle one for an
  // even count), so that one record's fields belong to one cluster.
  auto median_index = [](const std::vector<double>& goodputs) {
    std::vector<size_t> order(goodputs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return goodputs[a] < goodputs[b]; });
    return order[(order.size() - 1) / 2];
  };
  struct Spread {
    double min = NAN, max = NAN;
  };
  auto spread_of = [](const std::vector<double>& goodputs) {
    Spread s;
    s.min = *std::min_element(goodputs.begin(), goodputs.end());
    s.max = *std::max_element(goodputs.begin(), goodputs.end());
    return s;
  };
  std::vector<ClusterResult> results;
  std::vector<Spread> spreads;
  for (const std::vector<ClusterResult>& all : runs_of) {
    std::vector<double> g;
    g.reserve(all.size());
    for (const ClusterResult& r : all) g.push_back(r.goodput_gbps);
    results.push_back(all[median_index(g)]);
    spreads.push_back(spread_of(g));
  }
  PsliteResult pslite;
  Spread pslite_spread;
  if (!pslite_runs.empty()) {
    std::vector<double> g;
    g.reserve(pslite_runs.size());
    for (const PsliteResult& r : pslite_runs) g.push_back(r.goodput_gbps);
    pslite = pslite_runs[median_index(g)];
    pslite_spread = spread_of(g);
  }
  const double pslite_gbps = pslite_runs.empty() ? NAN : pslite.goodput_gbps;
  if (Status s = raw.MeasureBoth(tensor_bytes, message, opt.raw_reps, /*warmup=*/false); !s.ok()) {
    return Fail(s.ToString());
  }
  raw.Stop();
  link.Remove();
  const double raw_gbps = raw.BestGbps();
  const double duplex_gbps = raw.DuplexBestGbps();

  std::vector<JsonRecord> records;
  const std::string ucx_lanes = ucx_probe.lanes;
  if (!opt.json) {
    std::printf(
        "%d worker(s), %d server(s), %g MiB fp32 per worker in %d tensor(s), partitions "
        "of %lld KiB, %d timed iterations; GB/s per worker per direction\n",
        opt.workers, opt.servers, opt.mb, opt.tensors, opt.partition_kb, opt.iters);
    if (opt.link_gbit > 0) {
      std::printf("servers behind an emulated link of %g Gbit/s each way (%s <-> %s)\n",
                  opt.link_gbit, net.root_ip.c_str(), net.server_ip.c_str());
    }
    std::printf("raw TCP reference: %.2f GB/s (best), %.2f GB/s (median)\n", raw_gbps,
                raw.MedianGbps());
    std::printf("raw TCP both ways at once, per direction: %.2f GB/s (best), %.2f GB/s (median)\n",
                duplex_gbps, raw.DuplexMedianGbps());
    std::printf("%-28s %-5s %-5s %-4s %8s %8s %8s %8s %8s %9s %9s %9s %9s %9s %9s %10s %9s\n",
                "compressor", "ef", "sec", "tr", "goodput", "x raw", "x duplex", "x sec", "x zmq",
                "iter_ms", "compress", "network", "server", "decomp", "srv_rss", "rss_target",
                "wrk_rss");
  }
  // The goodput of the run of `spec` under `security` over `transport` with the optimizer's
  // `placement` (NaN when there is none).
  auto goodput_of = [&](const std::string& spec, const std::string& security,
                        const std::string& transport, const std::string& placement) {
    for (const ClusterResult& r : results) {
      if (r.spec == spec && r.security == security && r.transport == transport &&
          r.placement == placement) {
        return r.goodput_gbps;
      }
    }
    return static_cast<double>(NAN);
  };
  // The raw TCP references of the run and `goodput` against them (every record has them).
  auto add_raw_tcp = [&](JsonRecord& rec, double goodput) {
    rec.Add("raw_tcp_gbps", raw_gbps)
        .Add("raw_tcp_median_gbps", raw.MedianGbps())
        .Add("ratio_to_raw_tcp", goodput / raw_gbps)
        .Add("raw_tcp_duplex_gbps", duplex_gbps)
        .Add("raw_tcp_duplex_median_gbps", raw.DuplexMedianGbps())
        .Add("ratio_to_raw_tcp_duplex", goodput / duplex_gbps)
        .Add("link_gbit", opt.link_gbit);
  };
  for (const ClusterResult& r : results) {
    // ratio_to_none: against the none compressor under the same security and transport, when it
    // runs first.
    const double none_gbps = results.front().spec == "none"
                                 ? goodput_of("none", r.security, r.transport, r.placement)
                                 : NAN;
    const double security_ratio =
        r.goodput_gbps / goodput_of(r.spec, "none", r.transport, r.placement);
    const double transport_ratio =
        r.goodput_gbps / goodput_of(r.spec, r.security, "zmq", r.placement);
    JsonRecord rec;
    rec.Add("peer", "bitpush")
        .Add("compressor", r.spec)
        .Add("error_feedback", r.error_feedback)
        .Add("security", r.security)
        .Add("transport", r.transport)
        .Add("placement", r.placement)
        .Add("optimizer", r.optimizer)
        .Add("pull", r.pull)
        .Add("ucx_tls", r.transport == "ucx" ? ucx_lanes : "")
        .Add("ucx_tls_configured", r.transport == "ucx" ? opt.ucx_tls : "")
        .Add("workers", opt.workers)
        .Add("servers", opt.servers)
        .Add("mb", opt.mb)
        .Add("tensors", opt.tensors)
        .Add("dtype", std::string(DTypeName(opt.dtype)))
        .Add("partition_kb", static_cast<long long>(opt.partition_kb))
        .Add("iters", opt.iters)
        .Add("warmup", opt.warmup)
        .Add("goodput_gbps", r.goodput_gbps)
        .Add("best_iter_gbps", r.best_iter_gbps);
    add_raw_tcp(rec, r.goodput_gbps);
    rec.Add("ratio_to_none", r.goodput_gbps / none_gbps)
        .Add("security_ratio", security_ratio)
        .Add("transport_ratio", transport_ratio)
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
        .Add("wire_compression_ratio", static_cast<double>(tensor_bytes) / r.bytes_pushed_per_iter)
        .Add("server_peak_rss_mb", r.server_peak_rss_mb)
        .Add("worker_peak_rss_mb", r.worker_peak_rss_mb)
        .Add("scheduler_peak_rss_mb", r.scheduler_peak_rss_mb)
        .Add("server_owned_mb", r.server_owned_mb)
        .Add("rss_target_mb", 4 * r.server_owned_mb + 64)
        .Add("server_rss_over_target", r.server_rss_over_target)
        .Add("server_keys", static_cast<long long>(r.server_keys))
        .Add("pushes_rejected", static_cast<long long>(r.pushes_rejected))
        .Add("wall_seconds", r.wall_seconds);
    const Spread& spread = spreads[&r - &results[0]];
    rec.Add("reps", reps).Add("goodput_min_gbps", spread.min).Add("goodput_max_gbps", spread.max);
    if (!opt.peer.empty()) {
      rec.Add("peer_reps", reps).Add("ratio_to_pslite", r.goodput_gbps / pslite_gbps);
    }
    records.push_back(rec);
    if (!opt.json) {
      std::printf(
          "%-28s %-5s %-5s %-4s %8.3f %8.2f %8.2f %8.2f %8.2f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f "
          "%10.1f %9.1f\n",
          (r.spec + (r.placement == "server" ? " @server" : "")).c_str(), r.error_feedback.c_str(),
          r.security.c_str(), r.transport.c_str(), r.goodput_gbps, r.goodput_gbps / raw_gbps,
          r.goodput_gbps / duplex_gbps, security_ratio, transport_ratio, r.iter_ms, r.compress_ms,
          r.network_ms, r.server_ms, r.decompress_ms, r.server_peak_rss_mb,
          4 * r.server_owned_mb + 64, r.worker_peak_rss_mb);
    }
  }
  if (!pslite_runs.empty()) {
    // Against bitpush's none under security none, the like-for-like run.
    const double bitpush_none = goodput_of("none", "none", "zmq", "worker");
    JsonRecord rec;
    rec.Add("peer", "pslite")
        .Add("compressor", "none")
        .Add("error_feedback", "none")
        .Add("security", "none")
        .Add("transport", "zmq")
        .Add("workers", opt.workers)
        .Add("servers", opt.servers)
        .Add("mb", static_cast<double>(tensor_bytes) / kMiB)
        .Add("tensors", 1)
        .Add("partition_kb", static_cast<long long>(opt.partition_kb))
        .Add("iters", opt.iters)
        .Add("warmup", opt.warmup)
        .Add("goodput_gbps", pslite.goodput_gbps)
        .Add("goodput_min_gbps", pslite_spread.min)
        .Add("goodput_max_gbps", pslite_spread.max)
        .Add("peer_reps", reps)
        .Add("best_iter_gbps", pslite.best_iter_gbps);
    add_raw_tcp(rec, pslite.goodput_gbps);
    rec.Add("ratio_to_bitpush", pslite.goodput_gbps / bitpush_none)
        .Add("iter_ms", pslite.iter_ms)
        .Add("server_peak_rss_mb", pslite.server_peak_rss_mb)
        .Add("worker_peak_rss_mb", pslite.worker_peak_rss_mb)
        .Add("scheduler_peak_rss_mb", pslite.scheduler_peak_rss_mb)
        .Add("wall_seconds", pslite.wall_seconds)
        .Add("pslite_driver", pslite_driver);
    records.push_back(rec);
  }
  if (opt.json) {
    std::fputs(JsonArray(records).c_str(), stdout);
  } else if (!opt.peer.empty() && pslite_runs.empty()) {
    std::printf("ps-lite: not run (%s); see bench/peers/README.md\n", pslite_missing.c_str());
  } else if (!pslite_runs.empty()) {
    std::printf(
        "\nside by side with dmlc/ps-lite (%s): median of %d alternations, min-max beside it\n",
        pslite_driver.c_str(), reps);
    std::printf("%-8s %-28s %-5s %8s %17s %8s %9s %9s %9s\n", "peer", "compressor", "sec",
                "goodput", "min-max", "x raw", "iter_ms", "srv_rss", "x pslite");
    std::printf("%-8s %-28s %-5s %8.3f %8.3f-%-8.3f %8.2f %9.1f %9.1f %9.2f\n", "pslite", "none",
                "none", pslite.goodput_gbps, pslite_spread.min, pslite_spread.max,
                pslite.goodput_gbps / raw_gbps, pslite.iter_ms, pslite.server_peak_rss_mb, 1.0);
    for (size_t i = 0; i < results.size(); ++i) {
      const ClusterResult& r = results[i];
      std::printf("%-8s %-28s %-5s %8.3f %8.3f-%-8.3f %8.2f %9.1f %9.1f %9.2f\n", "bitpush",
                  r.spec.c_str(), r.security.c_str(), r.goodput_gbps, spreads[i].min,
                  spreads[i].max, r.goodput_gbps / raw_gbps, r.iter_ms, r.server_peak_rss_mb,
                  r.goodput_gbps / pslite_gbps);
    }
  }
  return 0;
}

int ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", kName, a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto bad = [&](const char* v) {
      std::fprintf(stderr, "%s: bad value '%s' for %s\n", kName, v, a.c_str());
      std::exit(2);
    };
    // A comma-separated list of `allowed` names, added to `*out` once each, in order.
    auto add_choices = [&](std::initializer_list<const char*> allowed,
                           std::vector<std::string>* out) {
      const char* v = next();
      const std::vector<std::string> names = SplitSpecs(v);
      if (names.empty()) bad(v);
      for (const std::string& n : names) {
        if (std::find(allowed.begin(), allowed.end(), n) == allowed.end()) bad(v);
        if (std::find(out->begin(), out->end(), n) == out->end()) out->push_back(n);
      }
    };
    auto integer = [&](long long min) {
      const char* v = next();
      char* end = nullptr;
      const long long x = std::strtoll(v, &end, 10);
      if (end == v || *end != '\0' || x < min) bad(v);
      return x;
    };
    if (a == "--json") {
      o->json = true;
    } else if (a == "--keep-dir") {
      o->keep_dir = true;
    } else if (a == "--workers") {
      o->workers = static_cast<int>(integer(1));
    } else if (a == "--servers") {
      o->servers = static_cast<int>(integer(1));
    } else if (a == "--mb") {
      const char* v = next();
      char* end = nullptr;
      o->mb = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(o->mb > 0)) bad(v);
    } else if (a == "--partition-kb") {
      o->partition_kb = integer(1);
    } else if (a == "--compressor") {
      const char* v = next();
      const std::vector<std::string> specs = SplitSpecs(v);
      if (specs.empty()) bad(v);
      o->compressors.insert(o->compressors.end(), specs.begin(), specs.end());
    } else if (a == "--security") {
      add_choices({"none", "curve"}, &o->securities);
    } else if (a == "--transport") {
      add_choices({"zmq", "ucx"}, &o->transports);
    } else if (a == "--ucx-tls") {
      o->ucx_tls = next();
      if (o->ucx_tls.empty() || o->ucx_tls.find_first_of("\"\n\\") != std::string::npos) {
        bad(o->ucx_tls.c_str());
      }
    } else if (a == "--error-feedback") {
      const std::string v = next();
      if (v != "auto" && !compressors::ParseErrorFeedbackPolicy(v).ok()) bad(v.c_str());
      o->error_feedback = v;
    } else if (a == "--min-compress-bytes") {
      o->min_compress_bytes = integer(0);
    } else if (a == "--iters") {
      o->iters = static_cast<int>(integer(1));
    } else if (a == "--warmup") {
      o->warmup = static_cast<int>(integer(0));
    } else if (a == "--tensors") {
      o->tensors = static_cast<int>(integer(1));
    } else if (a == "--dtype") {
      const char* v = next();
      StatusOr<DType> d = ParseDType(v);
      if (!d.ok()) bad(v);
      o->dtype = *d;
    } else if (a == "--raw-reps") {
      o->raw_reps = static_cast<int>(integer(1));
    } else if (a == "--timeout-s") {
      o->timeout_s = static_cast<int>(integer(1));
    } else if (a == "--link-gbit") {
      const char* v = next();
      char* end = nullptr;
      o->link_gbit = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(o->link_gbit >= 0) || o->link_gbit > 1e4) bad(v);
    } else if (a == "--peer") {
      const std::string v = next();
      if (v != "pslite") bad(v.c_str());
      o->peer = v;
    } else if (a == "--pslite-dir") {
      o->pslite_dir = next();
    } else if (a == "--peer-reps") {
      o->peer_reps = static_cast<int>(integer(1));
    } else if (a == "--server-side") {
      if (std::find(o->placements.begin(), o->placements.end(), "server") == o->placements.end()) {
        o->placements.push_back("server");
      }
    } else if (a == "--placement") {
      add_choices({"worker", "server"}, &o->placements);
    } else if (a == "--optimizer") {
      o->optimizer = next();
      if (!optimizers::ParseUpdateRule(o->optimizer).ok()) bad(o->optimizer.c_str());
    } else if (a == "--pull") {
      o->pull = next();
      if (o->pull != "auto" && !compressors::ParseCompressorSpec(o->pull).ok())
        bad(o->pull.c_str());
    } else if (a == "--reps") {
      o->reps = static_cast<int>(integer(1));
    } else if (a == "--help" || a == "-h") {
      PrintHelp();
      std::exit(0);
    } else {
      std::fprintf(stderr, "%s: unknown option '%s'\n", kName, a.c_str());
      PrintHelp();
      return 2;
    }
  }
  if (!o->peer.empty() && o->dtype != DType::kFloat32) {
    std::fprintf(stderr, "%s: --peer pslite compares float32 tensors only, not --dtype %s\n", kName,
                 std::string(DTypeName(o->dtype)).c_str());
    return 2;
  }
  if (!o->peer.empty() && o->link_gbit > 0) {
    std::fprintf(stderr, "%s: --peer pslite runs on loopback only, not with --link-gbit\n", kName);
    return 2;
  }
  if (o->peer.empty() && !o->pslite_dir.empty()) {
    std::fprintf(stderr, "%s: --pslite-dir needs --peer pslite\n", kName);
    return 2;
  }
  if (o->compressors.empty()) o->compressors.push_back("none");
  if (o->securities.empty()) o->securities.push_back("none");
  if (o->transports.empty()) o->transports.push_back("zmq");
  if (o->placements.empty()) o->placements.push_back("worker");
  if (o->dtype != DType::kFloat32 &&
      (!o->optimizer.empty() ||
       std::find(o->placements.begin(), o->placements.end(), "server") != o->placements.end())) {
    std::fprintf(stderr, "%s: an optimizer (--optimizer, --server-side) updates float32 tensors\n",
                 kName);
    return 2;
  }
  if (!o->ucx_tls.empty() &&
      std::find(o->transports.begin(), o->transports.end(), "ucx") == o->transports.end()) {
    std::fprintf(stderr, "%s: --ucx-tls needs --transport ucx\n", kName);
    return 2;
  }
  if (!o->peer.empty() && o->transports != std::vector<std::string>{"zmq"}) {
    std::fprintf(stderr, "%s: --peer pslite compares over zmq only, not --transport ucx\n", kName);
    return 2;
  }
  for (const std::string& spec : o->compressors) {
    StatusOr<v1::CompressorConfig> c = compressors::ParseCompressorSpec(spec);
    if (!c.ok()) {
      std::fprintf(stderr, "%s: --compressor '%s': %s\n", kName, spec.c_str(),
                   c.status().message().c_str());
      return 2;
    }
  }
  return 0;
}

}  // namespace

int RunPushPullBench(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a peer that dies shows up as a failed write, not a signal
  Options opt;
  if (int rc = ParseArgs(argc, argv, &opt)) return rc;
  return RunDriver(opt);
}

int RunPushPullWorkerMode(int argc, char** argv) {
  return RunPushPullWorker("bitpush-bench pushpull-worker", argc, argv);
}

// `bitpush-bench pushpull-keygen CLUSTER.yaml DIR` (hidden; bench/emulated_network.py
// --security curve): a key pair per node of the YAML's cluster and its public_keys, written into
// DIR (created 0700 if missing; existing key files are kept). Exit 0, 1 on an error, 2 usage.
int RunPushPullKeygenMode(int argc, char** argv) {
  constexpr char kProgram[] = "bitpush-bench pushpull-keygen";
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CLUSTER.yaml DIR\n", kProgram);
    return 2;
  }
  StatusOr<config::ClusterConfig> c = config::LoadClusterConfig(argv[1]);
  if (!c.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, c.status().message().c_str());
    return 2;
  }
  StatusOr<std::vector<std::string>> written =
      security::WriteClusterKeys(argv[2], config::ClusterNodeNames(*c), /*overwrite=*/false);
  if (!written.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, written.status().ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace bitpush::bench
