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
// cluster runs. Stage times are per timed iteration, averaged over the workers, each summed
// over the partitions (partitions overlap, so they do not add up to iter_ms): compress_ms,
// network_ms (push sent -> reply received, includes the server's work), decompress_ms from
// ClientStats; server_ms = the servers' engine_busy_ns / (warm-up + timed iterations).
// Peak RSS in MiB (ru_maxrss); server_owned_mb = the bytes of the keys a server owns (the
// scheduler's key mapping), rss_target_mb = 4 x that + 64 (issue 4).
//
// Every wait is bounded (--timeout-s per cluster): on a failing process the others get the
// heartbeat bound to exit, then everything left is killed; the failure names the process and
// shows its output's tail; exit status 1.
#include <poll.h>
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
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/pushpull_worker.h"
#include "bench/raw_tcp.h"
#include "compressors/registry.h"
#include "scheduler/cluster_config.h"
#include "scheduler/key_mapping.h"
#include "tests/harness/child_process.h"
#include "worker/partition.h"

namespace bitpush::bench {
namespace {

using testing::Child;
using testing::ProcessClock;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kName[] = "bitpush-bench pushpull";
constexpr double kMiB = 1 << 20;

struct Options {
  bool json = false;
  int workers = 1;
  int servers = 1;
  double mb = 100;
  long long partition_kb = 4000;
  std::vector<std::string> compressors;
  std::string error_feedback = "auto";
  long long min_compress_bytes = 1048576;
  int iters = 10;
  int warmup = 2;
  int tensors = 1;
  int raw_reps = 5;
  int timeout_s = 300;
  bool keep_dir = false;
};

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench pushpull [--json] [--workers 1] [--servers 1] [--mb 100]\n"
      "         [--partition-kb 4000] [--compressor SPEC[,SPEC...]] [--iters 10] [--warmup 2]\n"
      "         [--tensors 1] [--error-feedback auto|none|worker|server|both]\n"
      "         [--min-compress-bytes 1048576] [--raw-reps 5] [--timeout-s 300] [--keep-dir]\n"
      "Runs a real cluster on loopback per compressor (bitpush-scheduler, S bitpush-server,\n"
      "W workers) and times N PushPull+Wait iterations of MB MiB of fp32 per worker (in K equal\n"
      "tensors), in partitions of partition-kb x 1024 bytes. --compressor takes a list (one\n"
      "JSON record each; default none); the flag may repeat. --error-feedback auto = both for\n"
      "the biased compressors (onebit, topk, randomk with unbiased=false), none otherwise.\n"
      "goodput_gbps = fp32 GB/s (1e9 B/s) per worker per direction, vs raw_tcp_gbps: the same\n"
      "bytes streamed one way over one loopback TCP socket in the same run.\n");
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
  switch (c.id()) {
    case v1::COMPRESSOR_ID_ONEBIT:
    case v1::COMPRESSOR_ID_TOPK: return std::string("both");
    case v1::COMPRESSOR_ID_RANDOMK: return std::string(c.randomk().unbiased() ? "none" : "both");
    default: return std::string("none");
  }
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

// A forked peer process serving RawPeer on one loopback connection.
class RawReference {
 public:
  ~RawReference() { Stop(); }

  Status Start() {
    int port = 0;
    std::string error;
    const int listener = ListenLoopback(&port, &error);
    if (listener < 0) return UnavailableError(error);
    pid_ = fork();
    if (pid_ < 0) {
      close(listener);
      return InternalError(std::string("fork: ") + std::strerror(errno));
    }
    if (pid_ == 0) {
      close(listener);
      const int fd = ConnectLoopback(port, &error);
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

  // Streams `total` bytes in messages of `message` bytes `reps` times; keeps the fastest
  // (unless `warmup`: then only the side effects count: page faults, TCP window growth).
  Status Measure(uint64_t total, uint64_t message, int reps, bool warmup = false) {
    message = std::max<uint64_t>(1, std::min(message, total));
    if (src_.size() != message) {
      src_.resize(message);
      for (size_t i = 0; i < message; ++i) src_[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
    }
    const uint64_t count = (total + message - 1) / message;
    for (int rep = 0; rep < reps; ++rep) {
      const double s = RawStream(fd_, kRawStream, src_, count);
      if (std::isnan(s)) return UnavailableError("raw TCP stream: the peer went away");
      const double gbps = static_cast<double>(count * message) / s / 1e9;
      if (warmup) continue;
      best_gbps_ = std::max(best_gbps_, gbps);
      all_.push_back(gbps);
    }
    return Status::Ok();
  }

  double BestGbps() const { return best_gbps_; }
  double MedianGbps() const {
    std::vector<double> v = all_;
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v[v.size() / 2];
  }

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
  pid_t pid_ = -1;
  int fd_ = -1;
  std::vector<uint8_t> src_;
  double best_gbps_ = 0;
  std::vector<double> all_;
};

// ---- one cluster ----------------------------------------------------------------------------

struct ClusterResult {
  std::string spec;
  std::string error_feedback;
  double goodput_gbps = 0;
  double best_iter_gbps = 0;
  double iter_ms = 0;
  double compress_ms = 0, network_ms = 0, decompress_ms = 0, server_ms = 0;
  double bytes_pushed_per_iter = 0, bytes_pulled_per_iter = 0;
  double server_peak_rss_mb = 0, worker_peak_rss_mb = 0, scheduler_peak_rss_mb = 0;
  double server_owned_mb = 0, server_rss_over_target = 0;
  double wall_seconds = 0;
  uint64_t server_keys = 0, pushes_rejected = 0;
};

class ClusterRun {
 public:
  ClusterRun(const Options& opt, std::string spec, std::string ef, std::string bin_dir)
      : opt_(opt), dir_("bp-bench"), bin_dir_(std::move(bin_dir)) {
    result_.spec = std::move(spec);
    result_.error_feedback = std::move(ef);
  }
  ~ClusterRun() {
    children_.clear();  // kills and reaps what still runs
    if (opt_.keep_dir) dir_.Keep();
  }

  StatusOr<ClusterResult> Run() {
    if (!dir_.ok()) return InternalError("cannot create a temp dir under /tmp");
    BP_ASSIGN_OR_RETURN(scheduler::ClusterConfig config, WriteConfig());
    const std::string self = SelfExe();
    const auto t0 = Clock::now();
    scheduler_ = Spawn("scheduler", {bin_dir_ + "/bitpush-scheduler", "--config", config_path_});
    for (int s = 0; s < opt_.servers; ++s) {
      const std::string r = std::to_string(s);
      servers_.push_back(
          Spawn("server " + r,
                {bin_dir_ + "/bitpush-server", "--config", config_path_, "--rank", r,
                 "--stats-json", dir_.path() + "/server" + r + ".json", "--log-level", "warn"}));
    }
    const std::string tensor_mb = Fmt(opt_.mb / opt_.tensors, "%.17g");
    for (int w = 0; w < opt_.workers; ++w) {
      const std::string r = std::to_string(w);
      workers_.push_back(
          Spawn("worker " + r,
                {self, "pushpull-worker", "--config", config_path_, "--rank", r, "--tensor-mb",
                 tensor_mb, "--tensors", std::to_string(opt_.tensors), "--iters",
                 std::to_string(opt_.iters), "--warmup", std::to_string(opt_.warmup), "--results",
                 dir_.path() + "/worker" + r + ".json", "--quiet"}));
    }
    BP_RETURN_IF_ERROR(WaitForAll(config));
    result_.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    BP_RETURN_IF_ERROR(Collect(config));
    return result_;
  }

 private:
  StatusOr<scheduler::ClusterConfig> WriteConfig() {
    std::set<int> used;
    auto port = [&]() -> StatusOr<std::string> {
      for (int attempt = 0; attempt < 100; ++attempt) {
        const int p = testing::FreeTcpPort();
        if (p > 0 && used.insert(p).second) return "127.0.0.1:" + std::to_string(p);
      }
      return UnavailableError("no free TCP port on 127.0.0.1");
    };
    auto list = [&](int n) -> StatusOr<std::string> {
      std::string s = "[";
      for (int i = 0; i < n; ++i) {
        BP_ASSIGN_OR_RETURN(std::string a, port());
        s += (i ? ", " : "") + a;
      }
      return s + "]";
    };
    BP_ASSIGN_OR_RETURN(std::string scheduler, port());
    BP_ASSIGN_OR_RETURN(std::string servers, list(opt_.servers));
    BP_ASSIGN_OR_RETURN(std::string workers, list(opt_.workers));
    std::ostringstream y;
    y << "cluster:\n"
      << "  scheduler: " << scheduler << "\n"
      << "  servers: " << servers << "\n"
      << "  workers: " << workers << "\n"
      << "  heartbeat_interval_ms: 500\n"
      << "  heartbeat_timeout_ms: 5000\n"
      << "  startup_timeout_s: 30\n"
      << "compression:\n"
      << "  spec: \"" << result_.spec << "\"\n"
      << "  error_feedback: " << result_.error_feedback << "\n"
      << "  min_compress_bytes: " << opt_.min_compress_bytes << "\n"
      << "  partition_bytes: " << opt_.partition_kb * 1024 << "\n"
      << "worker:\n"
      << "  op_timeout_s: " << opt_.timeout_s << "\n";
    const std::string yaml = y.str();
    config_path_ = dir_.path() + "/cluster.yaml";
    std::ofstream(config_path_) << yaml;
    StatusOr<scheduler::ClusterConfig> c = scheduler::ParseClusterConfig(yaml, config_path_);
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
  Status WaitForAll(const scheduler::ClusterConfig& config) {
    std::vector<Child*> all;
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

  Status Collect(const scheduler::ClusterConfig& config) {
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
      r.bytes_pushed_per_iter += JsonNumber(m, "bytes_pushed") / iters / opt_.workers;
      r.bytes_pulled_per_iter += JsonNumber(m, "bytes_pulled") / iters / opt_.workers;
      r.worker_peak_rss_mb = std::max(r.worker_peak_rss_mb, w->peak_rss_kib() / 1024.0);
    }
    r.goodput_gbps = tensor_bytes * iters / slowest_loop / 1e9;
    r.best_iter_gbps = tensor_bytes / best_iter / 1e9;
    r.iter_ms = slowest_loop / iters * 1e3;

    // What each server owns: the partitions of tensors 0..K-1 under the scheduler's mapping.
    std::vector<double> owned(opt_.servers, 0);
    const v1::KeyMapping mapping = scheduler::MakeKeyMapping(opt_.servers);
    const size_t elements = static_cast<size_t>(tensor_bytes / opt_.tensors / 4);
    for (int t = 0; t < opt_.tensors; ++t) {
      BP_ASSIGN_OR_RETURN(std::vector<worker::PartitionRange> parts,
                          worker::PartitionTensor(t, elements, DType::kFloat32,
                                                  config.compression.partition_bytes));
      for (const worker::PartitionRange& p : parts) {
        owned[scheduler::ServerForKey(p.key, mapping)] += p.elements * 4.0;
      }
    }
    double busy_ns = 0;
    for (int s = 0; s < opt_.servers; ++s) {
      Child* c = servers_[s];
      const auto m =
          ReadFlatJson(testing::ReadFile(dir_.path() + "/server" + std::to_string(s) + ".json"));
      if (m.empty()) return InternalError(c->label() + " wrote no --stats-json file");
      busy_ns += JsonNumber(m, "engine_busy_ns");
      r.server_keys += static_cast<uint64_t>(JsonNumber(m, "keys"));
      r.pushes_rejected += static_cast<uint64_t>(JsonNumber(m, "pushes_rejected"));
      const double rss = c->peak_rss_kib() / 1024.0;
      r.server_peak_rss_mb = std::max(r.server_peak_rss_mb, rss);
      r.server_owned_mb = std::max(r.server_owned_mb, owned[s] / kMiB);
      r.server_rss_over_target =
          std::max(r.server_rss_over_target, rss / (4 * owned[s] / kMiB + 64));
    }
    r.server_ms = busy_ns / (opt_.warmup + iters) / 1e6;
    r.scheduler_peak_rss_mb = scheduler_->peak_rss_kib() / 1024.0;
    return Status::Ok();
  }

  const Options& opt_;
  testing::TempDir dir_;
  std::string bin_dir_;
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
  std::vector<std::pair<std::string, std::string>> runs;  // spec, error_feedback
  for (const std::string& spec : opt.compressors) {
    StatusOr<std::string> ef = ErrorFeedbackFor(spec, opt.error_feedback);
    if (!ef.ok()) return Fail("--compressor '" + spec + "': " + ef.status().message());
    // The config validator's verdict before anything starts (e.g. unbiased random-k with
    // error feedback is refused): a usage error.
    const std::string yaml =
        "cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n"
        "  workers: [127.0.0.1:3]\ncompression:\n  spec: \"" +
        spec + "\"\n  error_feedback: " + *ef + "\n";
    if (StatusOr<scheduler::ClusterConfig> c = scheduler::ParseClusterConfig(yaml, "--compressor");
        !c.ok()) {
      std::fprintf(stderr, "%s: %s\n", kName, c.status().message().c_str());
      return 2;
    }
    runs.emplace_back(spec, *ef);
  }

  const uint64_t tensor_bytes =
      static_cast<uint64_t>(std::llround(opt.mb / opt.tensors * kMiB / 4)) * 4 * opt.tensors;
  const uint64_t message = static_cast<uint64_t>(opt.partition_kb) * 1024;
  RawReference raw;
  if (Status s = raw.Start(); !s.ok()) return Fail(s.ToString());
  // One warm-up stream (page faults, TCP window growth), then the measured repetitions.
  if (Status s = raw.Measure(tensor_bytes, message, 1, /*warmup=*/true); !s.ok()) {
    return Fail(s.ToString());
  }
  if (Status s = raw.Measure(tensor_bytes, message, opt.raw_reps); !s.ok()) {
    return Fail(s.ToString());
  }

  std::vector<ClusterResult> results;
  for (const auto& [spec, ef] : runs) {
    ClusterRun run(opt, spec, ef, bin_dir);
    StatusOr<ClusterResult> r = run.Run();
    if (!r.ok()) return Fail(spec + ": " + r.status().ToString());
    results.push_back(*r);
  }
  if (Status s = raw.Measure(tensor_bytes, message, opt.raw_reps); !s.ok()) {
    return Fail(s.ToString());
  }
  raw.Stop();
  const double raw_gbps = raw.BestGbps();

  std::vector<JsonRecord> records;
  if (!opt.json) {
    std::printf(
        "%d worker(s), %d server(s), %g MiB fp32 per worker in %d tensor(s), partitions "
        "of %lld KiB, %d timed iterations; GB/s per worker per direction\n",
        opt.workers, opt.servers, opt.mb, opt.tensors, opt.partition_kb, opt.iters);
    std::printf("raw TCP reference: %.2f GB/s (best), %.2f GB/s (median)\n", raw_gbps,
                raw.MedianGbps());
    std::printf("%-28s %-5s %8s %8s %9s %9s %9s %9s %9s %9s %10s\n", "compressor", "ef", "goodput",
                "x raw", "iter_ms", "compress", "network", "server", "decomp", "srv_rss",
                "rss_target");
  }
  for (const ClusterResult& r : results) {
    const double none_gbps = results.front().spec == "none" ? results.front().goodput_gbps : NAN;
    JsonRecord rec;
    rec.Add("compressor", r.spec)
        .Add("error_feedback", r.error_feedback)
        .Add("workers", opt.workers)
        .Add("servers", opt.servers)
        .Add("mb", opt.mb)
        .Add("tensors", opt.tensors)
        .Add("partition_kb", static_cast<long long>(opt.partition_kb))
        .Add("iters", opt.iters)
        .Add("warmup", opt.warmup)
        .Add("goodput_gbps", r.goodput_gbps)
        .Add("best_iter_gbps", r.best_iter_gbps)
        .Add("raw_tcp_gbps", raw_gbps)
        .Add("raw_tcp_median_gbps", raw.MedianGbps())
        .Add("ratio_to_raw_tcp", r.goodput_gbps / raw_gbps)
        .Add("ratio_to_none", r.goodput_gbps / none_gbps)
        .Add("iter_ms", r.iter_ms)
        .Add("compress_ms", r.compress_ms)
        .Add("network_ms", r.network_ms)
        .Add("server_ms", r.server_ms)
        .Add("decompress_ms", r.decompress_ms)
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
    records.push_back(rec);
    if (!opt.json) {
      std::printf("%-28s %-5s %8.3f %8.2f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f\n",
                  r.spec.c_str(), r.error_feedback.c_str(), r.goodput_gbps,
                  r.goodput_gbps / raw_gbps, r.iter_ms, r.compress_ms, r.network_ms, r.server_ms,
                  r.decompress_ms, r.server_peak_rss_mb, 4 * r.server_owned_mb + 64);
    }
  }
  if (opt.json) std::fputs(JsonArray(records).c_str(), stdout);
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
    } else if (a == "--raw-reps") {
      o->raw_reps = static_cast<int>(integer(1));
    } else if (a == "--timeout-s") {
      o->timeout_s = static_cast<int>(integer(1));
    } else if (a == "--help" || a == "-h") {
      PrintHelp();
      std::exit(0);
    } else {
      std::fprintf(stderr, "%s: unknown option '%s'\n", kName, a.c_str());
      PrintHelp();
      return 2;
    }
  }
  if (o->compressors.empty()) o->compressors.push_back("none");
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

}  // namespace bitpush::bench
