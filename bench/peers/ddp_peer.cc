// The PyTorch DDP peer of `bitpush-bench pushpull --peer ddp`: DDP's gradient exchange over
// gloo, run by torch itself (bench/peers/ddp_driver.py, one process per worker rank on loopback)
// with the tensors of the bitpush clusters it is compared with; one process group per pass.
//
// Prepare runs the driver's --check under --peer-python (default /usr/bin/python3, Debian's
// torch): torch, torch.distributed, gloo and the variant's hook import, or the reason why not
// (the driver's exit status 3-6 and its line; then bitpush runs alone). RunOnce starts W ranks,
// each `env MASTER_ADDR=127.0.0.1 MASTER_PORT=P RANK=r WORLD_SIZE=W LOCAL_RANK=r
// LOCAL_WORLD_SIZE=W OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo PYTHON ddp_driver.py ...` (the
// environment torchrun gives its ranks, with P a free port below the ephemeral range and gloo
// on loopback; variables that change torch.distributed's behaviour are removed), waits for all
// of them (bounded by --timeout-s; the first failure kills the rest at once, its output's tail
// in the error) and reads rank 0's result: the rounds' times (each round's slowest rank).
//
// The record: goodput_gbps as bitpush's (tensor bytes per worker x iterations / the slowest
// rank's timed loop / 1e9: per worker and per direction), iter_ms (that loop / iterations),
// round_ms (the median round), local_ms (a DDP round without its exchange), the bytes DDP
// all-reduces per round, and line_rate_bound_ms / ratio_to_bound for a ring all-reduce of them
// at --link-gbit (null: DDP runs on loopback only; options.cc says why).
//
// Owned by the driver (bench_pushpull.cc). Thread-safety: none; the driver's thread.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/pushpull/line_rate.h"
#include "bench/pushpull/peer.h"
#include "common/dtype.h"
#include "tests/harness/child_process.h"

// bench/peers/ddp_driver.py in the source tree (bench/CMakeLists.txt).
#ifndef BITPUSH_PEERS_DIR
#define BITPUSH_PEERS_DIR "bench/peers"
#endif

namespace bitpush::bench::pushpull {
namespace {

using testing::Child;
using testing::ProcessClock;

constexpr double kMiB = 1 << 20;
constexpr char kDefaultPython[] = "/usr/bin/python3";
constexpr char kEnv[] = "/usr/bin/env";
// ddp_driver.py --check's statuses: torch, torch.distributed, gloo, the hook missing.
constexpr int kFirstNotUsable = 3, kLastNotUsable = 6;
// Variables a user's environment may hold that change torch.distributed's or gloo's behaviour
// (debug checks, another gloo transport) or the ranks' identity.
constexpr const char* kClearedVars[] = {"TORCH_DISTRIBUTED_DEBUG",
                                        "GLOO_DEVICE_TRANSPORT",
                                        "TORCH_CPP_LOG_LEVEL",
                                        "GROUP_RANK",
                                        "ROLE_RANK",
                                        "TORCHELASTIC_RUN_ID",
                                        "MKL_NUM_THREADS"};

// One pass: rank 0's result, and what the processes cost.
struct DdpResult {
  double goodput_gbps = 0;     // tensor bytes x iters / the slowest rank's timed loop / 1e9
  double best_iter_gbps = 0;   // tensor bytes / the fastest round / 1e9
  double iter_ms = 0;          // the slowest rank's timed loop / iters
  double round_ms = 0;         // the median round (each round: its slowest rank)
  double local_ms = NAN;       // a DDP round under no_sync (NaN for allreduce)
  double allreduce_bytes = 0;  // all-reduced per worker per round
  double parameters = NAN;     // the DDP module's parameters (NaN for allreduce)
  double bucket_cap_mb = NAN;  // DDP's (NaN for allreduce)
  int warmup = 0;              // the rounds before the timed ones (DDP and PowerSGD need some)
  std::string hook;            // the registered comm hook, "" for none
  std::string torch_version;
  double worker_peak_rss_mb = 0;
  double wall_seconds = 0;  // first rank started -> last exited
};

std::string Tail(const Child& c, int lines) {
  return c.label() + " (" + c.ExitDescription() + "), last lines of its output:\n" +
         testing::TailLines(c.output(), lines);
}

class DdpPeer : public Peer {
 public:
  explicit DdpPeer(const Options& opt)
      : opt_(opt),
        variant_(opt.peer_variant.empty() ? "allreduce" : opt.peer_variant),
        python_(opt.peer_python.empty() ? kDefaultPython : opt.peer_python),
        driver_(std::string(BITPUSH_PEERS_DIR) + "/ddp_driver.py"),
        // bitpush's tensors: K of mb/K MiB of --dtype each (bench/pushpull_worker.cc).
        elements_(static_cast<long long>(
            std::llround(opt.mb / opt.tensors * kMiB / static_cast<double>(DTypeSize(opt.dtype))))),
        tensor_bytes_(static_cast<double>(elements_) * static_cast<double>(DTypeSize(opt.dtype)) *
                      opt.tensors) {}

  std::string name() const override { return "ddp"; }

  Status Prepare() override {
    if (access(python_.c_str(), X_OK) != 0) {
      return FailedPreconditionError("no Python at " + python_ + " (--peer-python)");
    }
    if (access(driver_.c_str(), R_OK) != 0) {
      return FailedPreconditionError("no DDP driver at " + driver_ +
                                     " (bench/peers/ddp_driver.py of the source tree)");
    }
    testing::TempDir dir("bp-ddp-check");
    if (!dir.ok()) return InternalError("cannot create a temp dir under /tmp");
    Child check("ddp check", {python_, driver_, "--check", "--variant", variant_},
                dir.path() + "/check.log");
    const auto deadline = ProcessClock::now() + std::chrono::seconds(opt_.timeout_s);
    if (!testing::WaitAll({&check}, deadline)) {
      check.Kill();
      return FailedPreconditionError(python_ + " " + driver_ + " --check did not finish within " +
                                     std::to_string(opt_.timeout_s) + " s (--timeout-s)");
    }
    const std::string said = testing::TailLines(check.output(), 1);
    if (check.exit_code() >= kFirstNotUsable && check.exit_code() <= kLastNotUsable) {
      return FailedPreconditionError(Trimmed(said));
    }
    if (check.exit_code() != 0) {
      return FailedPreconditionError(python_ + " cannot run " + driver_ + ": " + Tail(check, 5));
    }
    torch_ = Trimmed(said);
    return Status::Ok();
  }

  std::string HowTo() const override {
    return "to compare with PyTorch DDP, give " + python_ +
           " torch with torch.distributed and gloo (Debian 12: apt-get install python3-torch, "
           "as deploy/install-deps.sh does) or pass --peer-python PY of one that has them; "
           "bench/peers/README.md";
  }

  std::string NotRunLine(const std::string& reason) const override {
    return "DDP: not run (" + reason + "); see bench/peers/README.md";
  }

  Status RunOnce() override {
    StatusOr<DdpResult> r = RunGroup();
    if (!r.ok()) return r.status().WithContext("DDP (" + variant_ + ", " + python_ + ")");
    runs_.push_back(*r);
    return Status::Ok();
  }

  size_t runs() const override { return runs_.size(); }

  std::string Title() const override {
    return "PyTorch DDP, gloo, " + variant_ + " (" + torch_ + ")";
  }

  PeerSummary Summary() const override {
    const DdpResult& median = runs_[MedianIndex(Goodputs())];
    PeerSummary s;
    s.what = "ddp " + variant_;
    s.goodput_gbps = median.goodput_gbps;
    s.spread = SpreadOf(Goodputs());
    s.iter_ms = median.iter_ms;
    return s;
  }

  JsonRecord Record(const PeerComparison& cmp) const override {
    const DdpResult& ddp = runs_[MedianIndex(Goodputs())];
    const Spread spread = SpreadOf(Goodputs());
    const double bound_ms = RingAllreduceBoundMs(ddp.allreduce_bytes, opt_.workers, opt_.link_gbit);
    JsonRecord rec;
    rec.Add("peer", "ddp")
        .Add("backend", "gloo")
        .Add("variant", variant_)
        .Add("hook", ddp.hook)
        .Add("dtype", std::string(DTypeName(opt_.dtype)))
        .Add("workers", opt_.workers)
        .Add("mb", opt_.mb)
        .Add("tensors", opt_.tensors)
        .Add("iters", opt_.iters)
        .Add("warmup", ddp.warmup)
        .Add("goodput_gbps", ddp.goodput_gbps)
        .Add("goodput_min_gbps", spread.min)
        .Add("goodput_max_gbps", spread.max)
        .Add("peer_reps", cmp.reps)
        .Add("best_iter_gbps", ddp.best_iter_gbps);
    AddRawTcpFields(rec, cmp.raw, ddp.goodput_gbps, opt_.link_gbit);
    rec.Add("ratio_to_bitpush", ddp.goodput_gbps / cmp.bitpush_none_gbps)
        .Add("iter_ms", ddp.iter_ms)
        .Add("round_ms", ddp.round_ms)
        .Add("local_ms", ddp.local_ms)
        .Add("allreduce_bytes_per_iter", ddp.allreduce_bytes)
        .Add("wire_compression_ratio", tensor_bytes_ / ddp.allreduce_bytes)
        .Add("line_rate_bound_ms", bound_ms)
        .Add("ratio_to_bound", bound_ms / ddp.iter_ms)
        .Add("bucket_cap_mb", ddp.bucket_cap_mb)
        .Add("parameters", ddp.parameters)
        .Add("worker_peak_rss_mb", ddp.worker_peak_rss_mb)
        .Add("wall_seconds", ddp.wall_seconds)
        .Add("torch_version", ddp.torch_version)
        .Add("python", python_);
    return rec;
  }

 private:
  static std::string Trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }

  std::vector<double> Goodputs() const {
    std::vector<double> g;
    g.reserve(runs_.size());
    for (const DdpResult& r : runs_) g.push_back(r.goodput_gbps);
    return g;
  }

  // One process group of W ranks, start to exit; rank 0's result.
  StatusOr<DdpResult> RunGroup() const {
    testing::TempDir dir("bp-ddp");
    if (!dir.ok()) return InternalError("cannot create a temp dir under /tmp");
    if (opt_.keep_dir) dir.Keep();
    if (access(kEnv, X_OK) != 0) return FailedPreconditionError(std::string("no ") + kEnv);
    const int port = testing::FreeTcpPort();
    if (port <= 0) return UnavailableError("no free TCP port on 127.0.0.1 below 32768");
    const std::string results = dir.path() + "/result.json";
    std::vector<std::unique_ptr<Child>> ranks;
    const auto t0 = ProcessClock::now();
    for (int r = 0; r < opt_.workers; ++r) {
      std::vector<std::string> argv = {kEnv};
      for (const char* var : kClearedVars) argv.insert(argv.end(), {"-u", var});
      const std::string w = std::to_string(opt_.workers), rank = std::to_string(r);
      argv.insert(argv.end(), {"MASTER_ADDR=127.0.0.1",
                               "MASTER_PORT=" + std::to_string(port),
                               "RANK=" + rank,
                               "WORLD_SIZE=" + w,
                               "LOCAL_RANK=" + rank,
                               "LOCAL_WORLD_SIZE=" + w,
                               "OMP_NUM_THREADS=1",
                               "GLOO_SOCKET_IFNAME=lo",
                               python_,
                               driver_,
                               "--variant",
                               variant_,
                               "--elements",
                               std::to_string(elements_),
                               "--tensors",
                               std::to_string(opt_.tensors),
                               "--dtype",
                               std::string(DTypeName(opt_.dtype)),
                               "--iters",
                               std::to_string(opt_.iters),
                               "--warmup",
                               std::to_string(opt_.warmup),
                               "--timeout-s",
                               std::to_string(opt_.timeout_s),
                               "--results",
                               results});
      ranks.push_back(
          std::make_unique<Child>("DDP rank " + rank, argv, dir.path() + "/rank" + rank + ".log"));
    }
    BP_RETURN_IF_ERROR(WaitForAll(ranks));
    DdpResult out;
    out.wall_seconds = std::chrono::duration<double>(ProcessClock::now() - t0).count();
    for (const auto& c : ranks) {
      out.worker_peak_rss_mb =
          std::max(out.worker_peak_rss_mb, static_cast<double>(c->peak_rss_kib()) / 1024.0);
    }
    const std::string text = testing::ReadFile(results);
    const auto m = ReadFlatJson(text);
    if (m.count("status") == 0 || m.at("status") != "OK") {
      return InternalError("DDP rank 0 exited 0 but its results in " + results +
                           " do not say OK: " + text);
    }
    const double loop = JsonNumber(m, "loop_seconds");
    const double best = JsonNumber(m, "best_iter_seconds");
    if (!(loop > 0) || !(best > 0)) return InternalError("DDP rank 0 reported no timing: " + text);
    out.goodput_gbps = tensor_bytes_ * opt_.iters / loop / 1e9;
    out.best_iter_gbps = tensor_bytes_ / best / 1e9;
    out.iter_ms = loop / opt_.iters * 1e3;
    out.round_ms = JsonNumber(m, "round_ms");
    out.local_ms = JsonNumber(m, "local_ms", NAN);
    out.allreduce_bytes = JsonNumber(m, "allreduce_bytes_per_iter");
    out.parameters = JsonNumber(m, "parameters", NAN);
    out.bucket_cap_mb = JsonNumber(m, "bucket_cap_mb", NAN);
    out.warmup = static_cast<int>(JsonNumber(m, "warmup"));
    out.hook = m.count("hook") != 0 ? m.at("hook") : "";
    out.torch_version = m.count("torch_version") != 0 ? m.at("torch_version") : "";
    return out;
  }

  // OK when every rank exited 0 within --timeout-s. A rank whose peer died waits in a
  // collective until gloo's timeout, so the first failure kills the rest at once.
  Status WaitForAll(const std::vector<std::unique_ptr<Child>>& ranks) const {
    const auto deadline = ProcessClock::now() + std::chrono::seconds(opt_.timeout_s);
    for (;;) {
      bool running = false;
      for (const auto& c : ranks) {
        if (!c->Poll()) {
          running = true;
        } else if (c->exit_code() != 0) {
          std::string message = Tail(*c, 15);
          for (const auto& other : ranks) {
            if (other.get() != c.get() && !other->Poll()) {
              other->Kill();
              message += "\n(then killed: " + other->label() + ")";
            }
          }
          return InternalError(message);
        }
      }
      if (!running) return Status::Ok();
      if (ProcessClock::now() >= deadline) {
        std::string message = "DDP ranks timed out after " + std::to_string(opt_.timeout_s) +
                              " s (--timeout-s); killed:";
        for (const auto& c : ranks) {
          if (!c->exited()) {
            c->Kill();
            message += "\n" + Tail(*c, 10);
          }
        }
        return TimeoutError(message);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  const Options& opt_;
  const std::string variant_;
  const std::string python_;
  const std::string driver_;
  const long long elements_;   // per tensor
  const double tensor_bytes_;  // per worker, all tensors
  std::string torch_;          // the check's line: "torch VERSION with gloo at PYTHON"
  std::vector<DdpResult> runs_;
};

}  // namespace

std::unique_ptr<Peer> MakeDdpPeer(const Options& opt) {
  return std::make_unique<DdpPeer>(opt);
}

}  // namespace bitpush::bench::pushpull
