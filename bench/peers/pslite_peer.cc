#include "bench/peers/pslite_peer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/pushpull/peer.h"
#include "tests/harness/child_process.h"

namespace bitpush::bench {
namespace {

using testing::Child;
using testing::ProcessClock;

bool Executable(const std::string& path) {
  return access(path.c_str(), X_OK) == 0;
}

std::string FindEnvTool() {
  for (const char* p : {"/usr/bin/env", "/bin/env"}) {
    if (Executable(p)) return p;
  }
  return "";
}

// Runs `script dir` (its progress and errors on stderr; the path it prints on stdout is not
// needed); its exit status.
int RunBuildScript(const std::string& script, const std::string& dir) {
  const std::string command = "'" + script + "' '" + dir + "' >/dev/null";
  const int status = std::system(command.c_str());  // NOLINT(bugprone-command-processor): ours
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Variables a user's environment may hold that would change ps-lite's transport or data path, or
// slow it (PS_VERBOSE >= 2 logs every message).
constexpr const char* kClearedVars[] = {"DMLC_LOCAL",
                                        "DMLC_PS_VAN_TYPE",
                                        "DMLC_PS_WATER_MARK",
                                        "DMLC_USE_KUBERNETES",
                                        "DMLC_INTERFACE",
                                        "DMLC_RANK",
                                        "PS_RESEND",
                                        "PS_RESEND_TIMEOUT",
                                        "PS_DROP_MSG",
                                        "PS_HEARTBEAT_INTERVAL",
                                        "PS_HEARTBEAT_TIMEOUT",
                                        "PS_VERBOSE"};

class PsliteCluster {
 public:
  PsliteCluster(std::string driver, const PsliteShape& shape)
      : driver_(std::move(driver)), shape_(shape), dir_("bp-pslite") {}
  ~PsliteCluster() {
    children_.clear();  // kills and reaps what still runs
    if (shape_.keep_dir) dir_.Keep();
  }

  StatusOr<PsliteResult> Run() {
    if (!dir_.ok()) return InternalError("cannot create a temp dir under /tmp");
    const std::string env = FindEnvTool();
    if (env.empty()) return FailedPreconditionError("no env program in /usr/bin or /bin");
    std::set<int> used;
    auto port = [&]() -> StatusOr<int> {
      for (int attempt = 0; attempt < 100; ++attempt) {
        const int p = testing::FreeTcpPort();
        if (p > 0 && used.insert(p).second) return p;
      }
      return UnavailableError("no free TCP port on 127.0.0.1 below 32768");
    };
    BP_ASSIGN_OR_RETURN(const int root_port, port());
    const std::vector<std::string> sizes = {"--mb",           Fmt(shape_.mb),
                                            "--partition-kb", std::to_string(shape_.partition_kb),
                                            "--iters",        std::to_string(shape_.iters),
                                            "--warmup",       std::to_string(shape_.warmup)};
    auto spawn = [&](const std::string& label, const std::string& role, int node_port,
                     const std::string& results) {
      std::vector<std::string> argv = {env};
      for (const char* var : kClearedVars) argv.insert(argv.end(), {"-u", var});
      argv.insert(argv.end(), {"DMLC_ROLE=" + role, "DMLC_PS_ROOT_URI=127.0.0.1",
                               "DMLC_PS_ROOT_PORT=" + std::to_string(root_port),
                               "DMLC_NUM_SERVER=" + std::to_string(shape_.servers),
                               "DMLC_NUM_WORKER=" + std::to_string(shape_.workers),
                               "DMLC_NODE_HOST=127.0.0.1"});
      if (node_port > 0) argv.push_back("PORT=" + std::to_string(node_port));
      argv.push_back(driver_);
      argv.insert(argv.end(), sizes.begin(), sizes.end());
      if (!results.empty()) argv.insert(argv.end(), {"--results", results});
      std::string log = label;
      std::replace(log.begin(), log.end(), ' ', '-');
      children_.push_back(std::make_unique<Child>(label, argv, dir_.path() + "/" + log + ".log"));
      return children_.back().get();
    };
    const auto t0 = ProcessClock::now();
    scheduler_ = spawn("ps-lite scheduler", "scheduler", 0, "");
    for (int s = 0; s < shape_.servers; ++s) {
      BP_ASSIGN_OR_RETURN(const int p, port());
      servers_.push_back(spawn("ps-lite server " + std::to_string(s), "server", p, ""));
    }
    for (int w = 0; w < shape_.workers; ++w) {
      BP_ASSIGN_OR_RETURN(const int p, port());
      workers_.push_back(spawn("ps-lite worker " + std::to_string(w), "worker", p,
                               dir_.path() + "/worker" + std::to_string(w) + ".json"));
    }
    BP_RETURN_IF_ERROR(WaitForAll());
    PsliteResult r;
    r.wall_seconds = std::chrono::duration<double>(ProcessClock::now() - t0).count();
    BP_RETURN_IF_ERROR(Collect(&r));
    return r;
  }

 private:
  static std::string Fmt(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return buf;
  }

  static std::string Describe(const Child& c, int lines) {
    return c.label() + " (" + c.ExitDescription() + "), last lines of its output:\n" +
           testing::TailLines(c.output(), lines);
  }

  // OK when every process exited 0 within the bound. ps-lite nodes wait for a dead peer
  // forever, so the first failure kills the rest at once.
  Status WaitForAll() {
    const auto deadline = ProcessClock::now() + std::chrono::seconds(shape_.timeout_s);
    Child* failed = nullptr;
    bool running = true;
    while (running && failed == nullptr && ProcessClock::now() < deadline) {
      running = false;
      for (auto& c : children_) {
        if (!c->Poll()) {
          running = true;
        } else if (c->exit_code() != 0 && failed == nullptr) {
          failed = c.get();
        }
      }
      if (running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!running && failed == nullptr) return Status::Ok();
    // A moment for the others to report the same failure in their own words, then kill.
    std::vector<Child*> all;
    all.reserve(children_.size());
    for (auto& c : children_) all.push_back(c.get());
    if (failed != nullptr) testing::WaitAll(all, ProcessClock::now() + std::chrono::seconds(1));
    std::string killed;
    for (Child* c : all) {
      if (!c->exited()) {
        c->Kill();
        killed += (killed.empty() ? "" : ", ") + c->label();
      }
    }
    if (failed == nullptr) {
      std::string late;
      for (Child* c : all) {
        if (killed.find(c->label()) != std::string::npos) late += "\n" + Describe(*c, 10);
      }
      return TimeoutError("ps-lite cluster timed out after " + std::to_string(shape_.timeout_s) +
                          " s (--timeout-s); killed: " + killed + late);
    }
    std::string message = Describe(*failed, 15);
    for (Child* c : all) {
      if (c != failed && c->exit_code() != 0 && killed.find(c->label()) == std::string::npos) {
        message += "\nthen also failed: " + Describe(*c, 3);
      }
    }
    if (!killed.empty()) message += "\n(then killed, still running: " + killed + ")";
    return InternalError(message);
  }

  Status Collect(PsliteResult* r) {
    double slowest = 0, best = INFINITY, bytes = 0;
    for (size_t w = 0; w < workers_.size(); ++w) {
      const std::string path = dir_.path() + "/worker" + std::to_string(w) + ".json";
      const auto m = ReadFlatJson(testing::ReadFile(path));
      if (m.count("status") == 0 || m.at("status") != "OK") {
        return InternalError(workers_[w]->label() + " exited 0 but its results in " + path +
                             " do not say OK: " + testing::ReadFile(path));
      }
      bytes = JsonNumber(m, "tensor_bytes");
      slowest = std::max(slowest, JsonNumber(m, "loop_seconds"));
      best = std::min(best, JsonNumber(m, "best_iter_seconds", INFINITY));
      r->worker_peak_rss_mb = std::max(r->worker_peak_rss_mb, workers_[w]->peak_rss_kib() / 1024.0);
    }
    if (!(slowest > 0) || !(bytes > 0)) return InternalError("ps-lite workers reported no timing");
    r->goodput_gbps = bytes * shape_.iters / slowest / 1e9;
    r->best_iter_gbps = bytes / best / 1e9;
    r->iter_ms = slowest / shape_.iters * 1e3;
    for (Child* s : servers_) {
      r->server_peak_rss_mb = std::max(r->server_peak_rss_mb, s->peak_rss_kib() / 1024.0);
    }
    r->scheduler_peak_rss_mb = scheduler_->peak_rss_kib() / 1024.0;
    return Status::Ok();
  }

  std::string driver_;
  const PsliteShape& shape_;
  testing::TempDir dir_;
  std::vector<std::unique_ptr<Child>> children_;
  Child* scheduler_ = nullptr;
  std::vector<Child*> servers_, workers_;
};

}  // namespace

std::string PsliteHowTo() {
  return "to compare with ps-lite, get a dmlc/ps-lite checkout outside this repository "
         "(https://github.com/dmlc/ps-lite), build our driver in it with "
         "bench/peers/build-pslite-driver.sh PSLITE_DIR and pass --pslite-dir PSLITE_DIR; "
         "step by step in bench/peers/README.md";
}

StatusOr<std::string> FindPsliteDriver(const std::string& pslite_dir,
                                       const std::string& build_script) {
  if (pslite_dir.empty()) return FailedPreconditionError("--peer pslite without --pslite-dir");
  if (pslite_dir.find('\'') != std::string::npos) {
    return InvalidArgumentError("--pslite-dir must not contain a single quote");
  }
  const std::string in_checkout = pslite_dir + "/bitpush-peer/bitpush-pslite-driver";
  const std::string direct = pslite_dir + "/bitpush-pslite-driver";
  const bool checkout = access((pslite_dir + "/include/ps/ps.h").c_str(), R_OK) == 0;
  std::string build_note;
  if (checkout && !build_script.empty() && Executable(build_script)) {
    if (const int rc = RunBuildScript(build_script, pslite_dir); rc != 0) {
      build_note = "; " + build_script + " " + pslite_dir + " failed (exit " + std::to_string(rc) +
                   ", its output is above)";
    }
  }
  for (const std::string& path : {in_checkout, direct}) {
    if (Executable(path)) {
      if (!build_note.empty()) {
        std::fprintf(stderr, "bitpush-bench pushpull: using the existing %s%s\n", path.c_str(),
                     build_note.c_str());
      }
      return path;
    }
  }
  return FailedPreconditionError(
      "no ps-lite driver in " + pslite_dir + " (looked for " + in_checkout + " and " + direct +
      (checkout ? "" : "; it is not a ps-lite checkout either: no include/ps/ps.h") + ")" +
      build_note);
}

StatusOr<PsliteResult> RunPsliteCluster(const std::string& driver, const PsliteShape& shape) {
  PsliteCluster cluster(driver, shape);
  return cluster.Run();
}

namespace {

// bench/peers/build-pslite-driver.sh in the source tree (bench/CMakeLists.txt), if known.
#ifndef BITPUSH_PEERS_DIR
#define BITPUSH_PEERS_DIR ""
#endif

constexpr double kMiB = 1 << 20;

// --peer pslite: one ps-lite cluster of our driver per pass, of bitpush's shape and bytes (one
// key per partition, dense fp32 summed on the servers: compressor none).
class PslitePeer : public pushpull::Peer {
 public:
  PslitePeer(const pushpull::Options& opt, uint64_t tensor_bytes)
      : opt_(opt), tensor_bytes_(tensor_bytes) {}

  std::string name() const override { return "pslite"; }

  Status Prepare() override {
    const std::string peers_dir = BITPUSH_PEERS_DIR;
    StatusOr<std::string> d = FindPsliteDriver(
        opt_.pslite_dir, peers_dir.empty() ? "" : peers_dir + "/build-pslite-driver.sh");
    if (!d.ok()) return d.status();
    driver_ = *d;
    return Status::Ok();
  }

  std::string HowTo() const override { return PsliteHowTo(); }

  std::string NotRunLine(const std::string& reason) const override {
    return "ps-lite: not run (" + reason + "); see bench/peers/README.md";
  }

  Status RunOnce() override {
    PsliteShape shape;
    shape.workers = opt_.workers;
    shape.servers = opt_.servers;
    shape.mb = static_cast<double>(tensor_bytes_) / kMiB;  // bitpush's bytes, all K tensors
    shape.partition_kb = opt_.partition_kb;
    shape.iters = opt_.iters;
    shape.warmup = opt_.warmup;
    shape.timeout_s = opt_.timeout_s;
    shape.keep_dir = opt_.keep_dir;
    StatusOr<PsliteResult> r = RunPsliteCluster(driver_, shape);
    if (!r.ok()) return r.status().WithContext("ps-lite (" + driver_ + ")");
    runs_.push_back(*r);
    return Status::Ok();
  }

  size_t runs() const override { return runs_.size(); }

  std::string Title() const override { return "dmlc/ps-lite (" + driver_ + ")"; }

  pushpull::PeerSummary Summary() const override {
    const PsliteResult& median = runs_[pushpull::MedianIndex(Goodputs())];
    pushpull::PeerSummary s;
    s.goodput_gbps = median.goodput_gbps;
    s.spread = pushpull::SpreadOf(Goodputs());
    s.iter_ms = median.iter_ms;
    s.server_peak_rss_mb = median.server_peak_rss_mb;
    return s;
  }

  JsonRecord Record(const pushpull::PeerComparison& cmp) const override {
    const PsliteResult& pslite = runs_[pushpull::MedianIndex(Goodputs())];
    const pushpull::Spread spread = pushpull::SpreadOf(Goodputs());
    JsonRecord rec;
    rec.Add("peer", "pslite")
        .Add("compressor", "none")
        .Add("error_feedback", "none")
        .Add("security", "none")
        .Add("transport", "zmq")
        .Add("workers", opt_.workers)
        .Add("servers", opt_.servers)
        .Add("mb", static_cast<double>(tensor_bytes_) / kMiB)
        .Add("tensors", 1)
        .Add("partition_kb", static_cast<long long>(opt_.partition_kb))
        .Add("iters", opt_.iters)
        .Add("warmup", opt_.warmup)
        .Add("goodput_gbps", pslite.goodput_gbps)
        .Add("goodput_min_gbps", spread.min)
        .Add("goodput_max_gbps", spread.max)
        .Add("peer_reps", cmp.reps)
        .Add("best_iter_gbps", pslite.best_iter_gbps);
    pushpull::AddRawTcpFields(rec, cmp.raw, pslite.goodput_gbps, opt_.link_gbit);
    rec.Add("ratio_to_bitpush", pslite.goodput_gbps / cmp.bitpush_none_gbps)
        .Add("iter_ms", pslite.iter_ms)
        .Add("server_peak_rss_mb", pslite.server_peak_rss_mb)
        .Add("worker_peak_rss_mb", pslite.worker_peak_rss_mb)
        .Add("scheduler_peak_rss_mb", pslite.scheduler_peak_rss_mb)
        .Add("wall_seconds", pslite.wall_seconds)
        .Add("pslite_driver", driver_);
    return rec;
  }

 private:
  std::vector<double> Goodputs() const {
    std::vector<double> g;
    g.reserve(runs_.size());
    for (const PsliteResult& r : runs_) g.push_back(r.goodput_gbps);
    return g;
  }

  const pushpull::Options& opt_;
  const uint64_t tensor_bytes_;
  std::string driver_;  // found by Prepare
  std::vector<PsliteResult> runs_;
};

}  // namespace

}  // namespace bitpush::bench

namespace bitpush::bench::pushpull {

std::unique_ptr<Peer> MakePslitePeer(const Options& opt, uint64_t tensor_bytes) {
  return std::make_unique<PslitePeer>(opt, tensor_bytes);
}

}  // namespace bitpush::bench::pushpull
