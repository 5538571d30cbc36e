#include "bench/pushpull/cluster_run.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "bench/bench_util.h"
#include "compressors/registry.h"
#include "config/key_mapping.h"
#include "fmt/format.h"
#include "worker/partition.h"

namespace bitpush::bench::pushpull {
namespace {

using testing::Child;
using testing::ProcessClock;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// cluster.ucx.port_offset of the --transport ucx clusters (the YAML's default).
constexpr int kUcxPortOffset = 1000;
constexpr double kMiB = 1 << 20;

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

std::string Fmt(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

}  // namespace

StatusOr<ClusterPrograms> FindClusterPrograms() {
  ClusterPrograms p;
  p.self = SelfExe();
  if (p.self.empty()) return FailedPreconditionError("readlink /proc/self/exe failed");
  p.bin_dir = Dirname(p.self);
  for (const char* b : {"bitpush-scheduler", "bitpush-server"}) {
    if (access((p.bin_dir + "/" + b).c_str(), X_OK) != 0) {
      return FailedPreconditionError(std::string("needs ") + b + " next to bitpush-bench, in " +
                                     p.bin_dir + " (build it: ninja " + b + ")");
    }
  }
  return p;
}

ClusterRun::ClusterRun(const Options& opt, const NetPlan& net, const RunSpec& run,
                       std::string keys_dir, ClusterPrograms programs)
    : opt_(opt),
      net_(net),
      dir_("bp-bench"),
      programs_(std::move(programs)),
      keys_dir_(std::move(keys_dir)) {
  result_.spec = run.spec;
  result_.error_feedback = run.error_feedback;
  result_.security = run.security;
  result_.transport = run.transport;
  result_.placement = run.placement;
  result_.non_finite_check = run.non_finite_check;
  result_.timeline = run.timeline;
  result_.optimizer = OptimizerFor(opt_, result_.placement);
  if (result_.placement == "server") result_.pull = PullFor(opt_, result_.spec);
}

ClusterRun::~ClusterRun() {
  children_.clear();  // kills and reaps what still runs
  if (opt_.keep_dir) dir_.Keep();
}

StatusOr<ClusterResult> ClusterRun::Run() {
  if (!dir_.ok()) return InternalError("cannot create a temp dir under /tmp");
  BP_ASSIGN_OR_RETURN(config::ClusterConfig config, WriteConfig());
  const auto t0 = Clock::now();
  scheduler_ =
      Spawn("scheduler", {programs_.bin_dir + "/bitpush-scheduler", "--config", config_path_});
  for (int s = 0; s < opt_.servers; ++s) {
    const std::string r = std::to_string(s);
    std::vector<std::string> argv = {programs_.bin_dir + "/bitpush-server",
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
    std::vector<std::string> argv = {programs_.self, "pushpull-worker",
                                     "--config",     config_path_,
                                     "--rank",       r,
                                     "--tensor-mb",  tensor_mb,
                                     "--tensors",    std::to_string(opt_.tensors),
                                     "--dtype",      std::string(DTypeName(opt_.dtype)),
                                     "--iters",      std::to_string(opt_.iters),
                                     "--warmup",     std::to_string(opt_.warmup),
                                     "--results",    dir_.path() + "/worker" + r + ".json",
                                     "--placement",  result_.placement,
                                     "--quiet"};
    if (!result_.optimizer.empty()) argv.insert(argv.end() - 1, {"--optimizer", result_.optimizer});
    if (!result_.non_finite_check) argv.push_back("--no-non-finite-check");
    workers_.push_back(Spawn("worker " + r, argv));
  }
  BP_RETURN_IF_ERROR(WaitForAll(config));
  result_.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  BP_RETURN_IF_ERROR(Collect(config));
  return result_;
}

StatusOr<config::ClusterConfig> ClusterRun::WriteConfig() {
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
    << "  partition_bytes: " << opt_.partition_kb * 1024 << "\n";
  if (opt_.raw_partition_kb > 0) {
    y << "  raw_partition_bytes: " << opt_.raw_partition_kb * 1024 << "\n";
  }
  y << "worker:\n"
    << "  op_timeout_s: " << opt_.timeout_s << "\n";
  if (result_.timeline != "off") {
    y << "trace:\n"
      << "  dir: \"" << dir_.path() << "/timeline\"\n"
      << "  steps: \""
      << (result_.timeline == "all" ? std::string("all") : "every " + result_.timeline.substr(2))
      << "\"\n";
  }
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

Child* ClusterRun::Spawn(const std::string& label, const std::vector<std::string>& argv) {
  std::string log = label;
  std::replace(log.begin(), log.end(), ' ', '-');
  children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log + ".log"));
  return children_.back().get();
}

std::string ClusterRun::Describe(const Child& c) const {
  return c.label() + " (" + c.ExitDescription() + "), last lines of its output:\n" +
         testing::TailLines(c.output(), 15);
}

Status ClusterRun::WaitForAll(const config::ClusterConfig& config) {
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
      late +=
          "\n" + c->label() + ", last lines of its output:\n" + testing::TailLines(c->output(), 10);
      c->Kill();
    }
  }
  if (!late.empty()) {
    return TimeoutError("timed out after " + std::to_string(opt_.timeout_s) +
                        " s (--timeout-s); killed:" + late);
  }
  return Status::Ok();
}

Status ClusterRun::CountTimeline() {
  const std::string dir = dir_.path() + "/timeline";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return InternalError("the timeline run wrote no span files into " + dir);
  // The number after `"key":` in the `end` record ({"type":"end","spans":N,"dropped":M}).
  const auto field = [](const std::string& record, const char* key, uint64_t* out) {
    const size_t at = record.find(key);
    if (at == std::string::npos) return false;
    const char* begin = record.c_str() + at + std::strlen(key);
    char* end = nullptr;
    errno = 0;
    *out = std::strtoull(begin, &end, 10);
    return end != begin && errno == 0;
  };
  int files = 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 6 || name.substr(name.size() - 6) != ".jsonl") continue;
    ++files;
    std::string path = dir;
    path += "/";
    path += name;
    const std::string text = testing::ReadFile(path);
    const size_t at = text.rfind("{\"type\":\"end\"");
    uint64_t spans = 0, dropped = 0;
    if (at == std::string::npos || !field(text.substr(at), "\"spans\":", &spans) ||
        !field(text.substr(at), "\"dropped\":", &dropped)) {
      closedir(d);
      return InternalError("span file " + path + " has no end record");
    }
    result_.timeline_spans += spans;
    result_.timeline_dropped += dropped;
  }
  closedir(d);
  if (files != opt_.workers + opt_.servers) {
    return InternalError(fmt::format("{} holds {} span files, not one per worker and server ({})",
                                     dir, files, opt_.workers + opt_.servers));
  }
  return Status::Ok();
}

Status ClusterRun::Collect(const config::ClusterConfig& config) {
  ClusterResult& r = result_;
  if (r.timeline != "off") BP_RETURN_IF_ERROR(CountTimeline());
  const double iters = opt_.iters;
  double slowest_loop = 0, best_iter = INFINITY, tensor_bytes = 0;
  for (Child* const& w : workers_) {
    const std::string path = dir_.path() + "/worker" + std::to_string(&w - &workers_[0]) + ".json";
    const auto m = ReadFlatJson(testing::ReadFile(path));
    if (m.count("status") == 0 || m.at("status") != "OK") {
      return InternalError(w->label() + " exited 0 but its results in " + path + " do not say OK");
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
  const bool spec_compressed = config.compression.spec != "none";
  for (int t = 0; t < opt_.tensors; ++t) {
    // The engine's cut (worker/partition.h); a raw tensor's may be finer than partition_bytes.
    const bool compressed =
        spec_compressed &&
        worker::AboveCompressThreshold(elements, opt_.dtype, config.compression.min_compress_bytes);
    const uint64_t partition_bytes =
        worker::PartitionBytesFor(static_cast<uint64_t>(elements) * DTypeSize(opt_.dtype),
                                  compressed, worker::PartitionSizingOf(config));
    BP_ASSIGN_OR_RETURN(std::vector<worker::PartitionRange> parts,
                        worker::PartitionTensor(t, elements, opt_.dtype, partition_bytes));
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
    r.server_rss_over_target = std::max(r.server_rss_over_target, rss / (4 * owned[s] / kMiB + 64));
  }
  r.server_ms = busy_ns / (opt_.warmup + iters) / 1e6;
  r.server_cpu_ms = cpu_ns / (opt_.warmup + iters) / 1e6;
  r.scheduler_peak_rss_mb = scheduler_->peak_rss_kib() / 1024.0;
  return Status::Ok();
}

}  // namespace bitpush::bench::pushpull
