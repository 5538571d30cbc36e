#include "bench/pushpull_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/counter_rng.h"
#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/vector_ops.h"
#include "config/cluster_config.h"
#include "optimizers/param_state.h"
#include "worker/client.h"

namespace bitpush::bench {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kUsage[] =
    "usage: %s --config CLUSTER.yaml --rank N [--tensor-mb X] [--tensors K] [--iters N]\n"
    "       [--warmup W] [--pause-ms M] [--linger-ms L] [--compression SPEC]\n"
    "       [--dtype float32|float16|bfloat16] [--placement worker|server]\n"
    "       [--optimizer sgd|adamw|lans]\n"
    "       [--results PATH] [--record PATH] [--quiet] [--no-non-finite-check]\n"
    "       [--shutdown-timeout-ms T] [--log-level trace|debug|info|warn|error]\n"
    "Declares K tensors of X MiB of the dtype (default 1 x 1 MiB of float32), runs W warm-up\n"
    "and N timed (default 10) PushPull+Wait iterations, sleeping M ms before each, then shuts "
    "down.\n"
    "--placement server: the servers run --optimizer (default adamw) on float32 tensors: each\n"
    "iteration pushes the gradient with lr 1e-3 and receives the weights (worker 0's starting\n"
    "weights installed first). --placement worker with --optimizer: this process runs the\n"
    "optimizer on the averaged gradient after each iteration (its state lives here).\n"
    "--record PATH: every tensor's input, then its output after each completed iteration, as\n"
    "raw bytes appended to PATH (for tests that check the results against a reference).\n"
    "--no-non-finite-check: the engine skips its own non-finite pass over a push's input\n"
    "(ClientOptions::check_non_finite; to measure what it costs).\n"
    "Exit: 0 ok, 1 start-up/declare/shutdown failure, 2 usage, 3 a push_pull failed.\n";

struct Options {
  std::string config_path;
  long long rank = -1;
  double tensor_mb = 1;
  long long tensors = 1;
  long long iters = 10;
  long long warmup = 0;
  long long pause_ms = 0;
  long long linger_ms = 0;
  long long shutdown_timeout_ms = -1;
  std::string compression;
  DType dtype = DType::kFloat32;
  std::string results_path;
  std::string record_path;
  std::string log_level = "warn";
  bool quiet = false;
  bool check_non_finite = true;
  std::string placement = "worker";  // "server": the servers run the optimizer
  std::string optimizer;             // "" = none (worker) / adamw (server)
};

constexpr float kLr = 1e-3f;

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}
double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Approximately normal(0, 1) values (Irwin-Hall of four uniforms), deterministic per seed:
// cheap enough for hundreds of MiB, and realistic enough for top-k and scaled 1-bit.
void FillGradient(std::vector<float>* v, uint64_t seed) {
  const uint64_t stream = StreamKey(seed, 0, 0x6772616400000000ull, 0);
  for (size_t i = 0; i < v->size(); ++i) {
    const uint64_t r = CounterRandom64(stream, i);
    const float u = static_cast<float>(r & 0xffff) + static_cast<float>((r >> 16) & 0xffff) +
                    static_cast<float>((r >> 32) & 0xffff) + static_cast<float>(r >> 48);
    (*v)[i] = (u / 65536.0f - 2.0f) * 1.7320508f;  // variance of each uniform: 1/12
  }
}

class Worker {
 public:
  Worker(std::string program, Options opt) : program_(std::move(program)), opt_(std::move(opt)) {
    label_ = "worker " + std::to_string(opt_.rank);
  }

  int Run() {
    StatusOr<config::ClusterConfig> config = config::LoadClusterConfig(opt_.config_path);
    if (!config.ok()) {
      std::fprintf(stderr, "%s: config error: %s\n", program_.c_str(),
                   config.status().message().c_str());
      return 2;
    }
    if (opt_.rank >= static_cast<long long>(config->workers.size())) {
      std::fprintf(stderr, "%s: --rank %lld but the cluster has %zu workers\n", program_.c_str(),
                   opt_.rank, config->workers.size());
      return 2;
    }
    const milliseconds shutdown_timeout =
        opt_.shutdown_timeout_ms >= 0 ? milliseconds(opt_.shutdown_timeout_ms)
                                      : 2 * (config->startup_timeout + config->heartbeat_timeout);

    const auto t_start = Clock::now();
    worker::ClientOptions co;
    co.cluster = *config;
    co.rank = static_cast<uint32_t>(opt_.rank);
    co.check_non_finite = opt_.check_non_finite;
    StatusOr<std::unique_ptr<worker::Client>> made = worker::Client::Create(std::move(co));
    if (!made.ok()) return Fail(1, "start-up", made.status());
    client_ = std::move(made).value();
    record_.Add("startup_seconds", Seconds(Clock::now() - t_start));

    const size_t esz = DTypeSize(opt_.dtype);
    const size_t elements = static_cast<size_t>(
        std::llround(opt_.tensor_mb * static_cast<double>(1 << 20) / static_cast<double>(esz)));
    elements_ = elements;
    inputs_.resize(static_cast<size_t>(opt_.tensors));
    outputs_.resize(inputs_.size());
    const bool server = opt_.placement == "server";
    if ((server || !opt_.optimizer.empty()) && opt_.dtype != DType::kFloat32) {
      std::fprintf(stderr, "%s: an optimizer updates float32 tensors, not %s\n", program_.c_str(),
                   std::string(DTypeName(opt_.dtype)).c_str());
      return 2;
    }
    for (size_t i = 0; i < inputs_.size(); ++i) {
      worker::TensorOptions to;
      to.priority = static_cast<int64_t>(i);
      to.compression = opt_.compression;
      if (server) {
        to.server_optimizer.emplace();
        to.server_optimizer->rule = opt_.optimizer.empty() ? "adamw" : opt_.optimizer;
      }
      StatusOr<worker::TensorId> id =
          client_->Declare("t" + std::to_string(i), elements, opt_.dtype, to);
      if (!id.ok()) return Fail(1, "declare", id.status());
      ids_.push_back(*id);
      std::vector<float> gradient(elements);
      FillGradient(&gradient, static_cast<uint64_t>(opt_.rank) * 1000 + i);
      inputs_[i].resize(elements * esz);
      outputs_[i].assign(elements * esz, 0);
      ConvertFromFloat(gradient.data(), TensorView(inputs_[i].data(), elements, opt_.dtype),
                       BestIsaLevel());
    }
    if (!opt_.record_path.empty()) {
      record_file_.open(opt_.record_path, std::ios::binary | std::ios::trunc);
      if (!record_file_) {
        std::fprintf(stderr, "%s: --record: cannot write '%s'\n", program_.c_str(),
                     opt_.record_path.c_str());
        return 2;
      }
      if (!Record(inputs_)) return 1;
    }
    const auto t_commit = Clock::now();
    if (Status s = client_->CommitDeclarations(); !s.ok()) return Fail(1, "declare", s);
    record_.Add("commit_seconds", Seconds(Clock::now() - t_commit));
    for (size_t i = 0; i < ids_.size(); ++i) {
      // The starting weights: a small multiple of the first gradient (worker 0's win).
      auto* w = reinterpret_cast<float*>(outputs_[i].data());
      const auto* g = reinterpret_cast<const float*>(inputs_[i].data());
      if (server || !opt_.optimizer.empty()) {
        for (size_t k = 0; k < elements; ++k) w[k] = 0.01f * g[k];
      }
      if (server) {
        if (Status s = client_->InitServerWeights(ids_[i], TensorView(w, elements)); !s.ok()) {
          return Fail(1, "InitServerWeights", s);
        }
      } else if (!opt_.optimizer.empty()) {
        optimizers::UpdateOptions u;
        StatusOr<optimizers::UpdateRule> rule = optimizers::ParseUpdateRule(opt_.optimizer);
        if (!rule.ok()) return Fail(2, "--optimizer", rule.status());
        u.rule = *rule;
        StatusOr<optimizers::ParamState> ps = optimizers::ParamState::Create(u, {w, elements});
        if (!ps.ok()) return Fail(1, "optimizer", ps.status());
        params_.push_back(std::move(ps).value());
      }
    }
    last_success_ = Clock::now();

    for (long long i = 0; i < opt_.warmup; ++i) {
      if (int rc = Iteration("warm-up iteration", i)) return rc;
    }
    if (Status s = client_->Barrier(); !s.ok()) return Fail(1, "barrier", s);
    const worker::ClientStats before = client_->stats();
    std::vector<double> iter_seconds;
    const auto t_loop = Clock::now();
    for (long long i = 0; i < opt_.iters; ++i) {
      const auto t0 = Clock::now();
      if (int rc = Iteration("iteration", i)) return rc;
      iter_seconds.push_back(Seconds(Clock::now() - t0));
    }
    const double loop_seconds = Seconds(Clock::now() - t_loop);
    const worker::ClientStats after = client_->stats();

    const auto t_shutdown = Clock::now();
    const Status shutdown = client_->Shutdown(shutdown_timeout);
    record_.Add("shutdown_seconds", Seconds(Clock::now() - t_shutdown));

    std::sort(iter_seconds.begin(), iter_seconds.end());
    const double pause_seconds = static_cast<double>(opt_.pause_ms * opt_.iters) / 1000.0;
    record_.Add("tensor_bytes", elements * esz)
        .Add("placement", opt_.placement)
        .Add("optimizer",
             opt_.optimizer.empty() && opt_.placement == "server" ? "adamw" : opt_.optimizer)
        .Add("iters", static_cast<long long>(iter_seconds.size()))
        .Add("loop_seconds", loop_seconds)
        .Add("pause_seconds", pause_seconds)
        .Add("best_iter_seconds", iter_seconds.empty() ? NAN : iter_seconds.front())
        .Add("median_iter_seconds",
             iter_seconds.empty() ? NAN : iter_seconds[iter_seconds.size() / 2])
        .Add("ops_completed", static_cast<long long>(after.ops_completed - before.ops_completed))
        .Add("ops_failed", static_cast<long long>(after.ops_failed - before.ops_failed))
        .Add("partitions_pushed",
             static_cast<long long>(after.partitions_pushed - before.partitions_pushed))
        .Add("bytes_pushed", static_cast<long long>(after.bytes_pushed - before.bytes_pushed))
        .Add("bytes_pulled", static_cast<long long>(after.bytes_pulled - before.bytes_pulled))
        .Add("compress_ns", static_cast<long long>(after.compress_ns - before.compress_ns))
        .Add("network_ns", static_cast<long long>(after.network_ns - before.network_ns))
        .Add("decompress_ns", static_cast<long long>(after.decompress_ns - before.decompress_ns))
        .Add("last_push_ns", static_cast<long long>(after.last_push_ns - before.last_push_ns))
        .Add("first_reply_ns", static_cast<long long>(after.first_reply_ns - before.first_reply_ns))
        .Add("op_ns", static_cast<long long>(after.op_ns - before.op_ns))
        .Add("peak_bytes_in_flight", static_cast<long long>(after.peak_bytes_in_flight))
        .Add("peak_server_window_bytes", static_cast<long long>(after.peak_server_window_bytes));
    if (!shutdown.ok()) return Fail(1, "shutdown", shutdown);
    record_.Add("status", "OK");
    WriteResults();
    if (!opt_.quiet) Print("%s: clean shutdown\n", label_.c_str());
    return 0;
  }

 private:
  // One round over every tensor; on failure prints the error and returns 3.
  int Iteration(const char* what, long long i) {
    if (opt_.pause_ms > 0) std::this_thread::sleep_for(milliseconds(opt_.pause_ms));
    const auto t0 = Clock::now();
    std::vector<worker::PushPullHandle> handles;
    handles.reserve(ids_.size());
    const bool server = opt_.placement == "server";
    for (size_t t = 0; t < ids_.size(); ++t) {
      const ConstTensorView in(inputs_[t].data(), elements_, opt_.dtype);
      const TensorView out(outputs_[t].data(), elements_, opt_.dtype);
      handles.push_back(server ? client_->PushPull(ids_[t], in, out, kLr)
                               : client_->PushPull(ids_[t], in, out));
    }
    Status first;
    for (size_t t = 0; t < handles.size(); ++t) {
      Status s = handles[t].Wait();
      // Worker-side training: this process's optimizer on the averaged gradient.
      if (s.ok() && t < params_.size()) {
        s = params_[t].Step(kLr, {reinterpret_cast<const float*>(outputs_[t].data()), elements_});
      }
      if (first.ok() && !s.ok()) first = s;
    }
    const auto t1 = Clock::now();
    if (!first.ok()) {
      record_.Add("failed_wait_ms", Ms(t1 - t0))
          .Add("ms_after_last_success", Ms(t1 - last_success_));
      char context[160];
      std::snprintf(context, sizeof(context),
                    "%s %lld failed: wait returned after %.0f ms, %.0f ms after the last success",
                    what, i, Ms(t1 - t0), Ms(t1 - last_success_));
      const int rc = Fail(3, context, first);
      // Stay registered (heartbeating) a while, so the scheduler's verdict is about what
      // failed, not about this worker exiting because of it.
      if (opt_.linger_ms > 0) std::this_thread::sleep_for(milliseconds(opt_.linger_ms));
      return rc;
    }
    last_success_ = t1;
    if (!Record(outputs_)) return 1;
    if (!opt_.quiet) Print("%s: %s %lld ok %.2f ms\n", label_.c_str(), what, i, Ms(t1 - t0));
    return 0;
  }

  template <typename... Args>
  void Print(const char* format, Args... args) {
    std::printf(format, args...);
    std::fflush(stdout);
  }

  int Fail(int rc, const std::string& context, const Status& s) {
    std::fprintf(stderr, "%s %s: error: %s: %s\n", program_.c_str(), label_.c_str(),
                 context.c_str(), s.ToString().c_str());
    std::fflush(stderr);
    record_.Add("status", context + ": " + s.ToString());
    WriteResults();
    return rc;
  }

  // Appends every tensor's bytes to --record's file (if any) and flushes it; false (after
  // printing why) when the write fails.
  bool Record(const std::vector<std::vector<uint8_t>>& tensors) {
    if (!record_file_.is_open()) return true;
    for (const std::vector<uint8_t>& t : tensors) {
      record_file_.write(reinterpret_cast<const char*>(t.data()),
                         static_cast<std::streamsize>(t.size()));
    }
    record_file_.flush();
    if (record_file_) return true;
    std::fprintf(stderr, "%s %s: error: --record: writing '%s' failed\n", program_.c_str(),
                 label_.c_str(), opt_.record_path.c_str());
    return false;
  }

  void WriteResults() {
    if (opt_.results_path.empty()) return;
    record_.Add("rank", static_cast<long long>(opt_.rank));
    std::ofstream out(opt_.results_path);
    out << record_.str() << "\n";
  }

  std::string program_;
  Options opt_;
  std::string label_;
  std::unique_ptr<worker::Client> client_;
  std::vector<worker::TensorId> ids_;
  std::vector<std::vector<uint8_t>> inputs_, outputs_;  // raw bytes of the dtype
  // --placement worker --optimizer: the optimizer state of each tensor, here.
  std::vector<optimizers::ParamState> params_;
  size_t elements_ = 0;  // per tensor
  Clock::time_point last_success_;
  JsonRecord record_;
  std::ofstream record_file_;  // --record
};

bool ParseInt(const char* text, long long* out) {
  char* end = nullptr;
  *out = std::strtoll(text, &end, 10);
  return end != text && *end == '\0' && *out >= 0;
}

}  // namespace

int RunPushPullWorker(const char* program, int argc, char** argv) {
  auto usage = [&](const std::string& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.c_str());
    std::fprintf(stderr, kUsage, program);
    return 2;
  };
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(kUsage, program);
      return 0;
    }
    if (arg == "--quiet") {
      opt.quiet = true;
      continue;
    }
    if (arg == "--no-non-finite-check") {
      opt.check_non_finite = false;
      continue;
    }
    if (i + 1 >= argc) return usage(arg + " needs a value (or is unknown)");
    const char* v = argv[++i];
    long long n = 0;
    if (arg == "--config") {
      opt.config_path = v;
    } else if (arg == "--compression") {
      opt.compression = v;
    } else if (arg == "--dtype") {
      StatusOr<DType> d = ParseDType(v);
      if (!d.ok()) return usage("--dtype: " + d.status().message());
      opt.dtype = *d;
    } else if (arg == "--placement") {
      opt.placement = v;
      if (opt.placement != "worker" && opt.placement != "server") {
        return usage("--placement takes worker or server, got '" + opt.placement + "'");
      }
    } else if (arg == "--optimizer") {
      opt.optimizer = v;
      if (!optimizers::ParseUpdateRule(opt.optimizer).ok()) {
        return usage("--optimizer takes sgd, adamw or lans, got '" + opt.optimizer + "'");
      }
    } else if (arg == "--results") {
      opt.results_path = v;
    } else if (arg == "--record") {
      opt.record_path = v;
    } else if (arg == "--log-level") {
      opt.log_level = v;
    } else if (arg == "--tensor-mb") {
      char* end = nullptr;
      opt.tensor_mb = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(opt.tensor_mb >= 0)) {
        return usage("--tensor-mb needs a number >= 0, got '" + std::string(v) + "'");
      }
    } else if (arg == "--rank" || arg == "--tensors" || arg == "--iters" || arg == "--warmup" ||
               arg == "--pause-ms" || arg == "--linger-ms" || arg == "--shutdown-timeout-ms") {
      if (!ParseInt(v, &n)) return usage(arg + " needs a non-negative integer, got '" + v + "'");
      (arg == "--rank"        ? opt.rank
       : arg == "--tensors"   ? opt.tensors
       : arg == "--iters"     ? opt.iters
       : arg == "--warmup"    ? opt.warmup
       : arg == "--pause-ms"  ? opt.pause_ms
       : arg == "--linger-ms" ? opt.linger_ms
                              : opt.shutdown_timeout_ms) = n;
    } else {
      return usage("unknown argument '" + arg + "'");
    }
  }
  if (opt.config_path.empty() || opt.rank < 0) return usage("--config and --rank are required");
  if (opt.tensors < 1) return usage("--tensors must be at least 1");
  if (!SetLogLevel(opt.log_level)) return usage("unknown log level '" + opt.log_level + "'");
  return Worker(program, std::move(opt)).Run();
}

}  // namespace bitpush::bench
