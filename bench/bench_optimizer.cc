// bitpush-bench optimizer: throughput of the CLAN/LANS parameter update (optimizers/lans.h) on
// ONE thread for a model of --params parameters made of transformer-like blocks, against the
// same update written in plain torch ops (bench/optimizer_torch_ref.py, torch.set_num_threads(1))
// over the same block shapes, measured in the same run.
//
// params_per_s = params / fastest full step (every block once); speedup_vs_torch = params_per_s /
// torch_params_per_s; met = speedup_vs_torch >= target (3.0). Without torch the reference is
// reported as skipped (torch_skipped names why) and the benchmark still succeeds.
//
// --device cuda: the same model in GPU memory, LansStepCuda per block (each call ends with its
// stream's synchronisation, as the trust ratios need the norms), against the torch ops on the
// same GPU (their .item() norm reads synchronise per block too). Without a usable CUDA device
// it fails naming why.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bitpush/config.h"
#include "common/cpu_features.h"
#include "optimizers/lans.h"

#if BITPUSH_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#ifndef BITPUSH_OPTIMIZER_TORCH_REF
#define BITPUSH_OPTIMIZER_TORCH_REF "bench/optimizer_torch_ref.py"
#endif

namespace bitpush::bench {
namespace {

constexpr double kTarget = 3.0;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();  // JSON null

struct Options {
  bool json = false;
  size_t params = 25000000;
  int steps = 5;
  IsaLevel isa = BestIsaLevel();
  bool torch = true;
  float weight_decay = 0.01f;
  bool cuda = false;                        // --device cuda
  std::string python = "/usr/bin/python3";  // runs the torch reference
};

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench optimizer [--json] [--params N] [--steps S] [--isa auto]\n"
      "                               [--no-torch] [--device cpu|cuda] [--python PATH]\n"
      "One LANS/CLAN step (optimizers/lans.h, weight decay 0.01) over a model of N parameters\n"
      "(default 25000000) made of transformer blocks of hidden size 1024 (QKV, projections,\n"
      "FFN matrices of 1M-4M elements, biases, LayerNorms), on one thread; S timed steps after a\n"
      "warm-up step (default 5), the fastest reported. The same update in plain torch ops\n"
      "(%s, one thread) runs in the same invocation.\n"
      "params_per_s = N / best step time; speedup_vs_torch = params_per_s / torch_params_per_s.\n"
      "--no-torch: skip the torch reference.\n"
      "--device cuda: LansStepCuda on the first GPU against the torch ops on that GPU.\n"
      "--python: the interpreter of the torch reference (default /usr/bin/python3).\n",
      BITPUSH_OPTIMIZER_TORCH_REF);
}

[[noreturn]] void UsageError(const std::string& msg) {
  bench::UsageError("optimizer", msg);
}

size_t ParsePositive(const std::string& flag, const std::string& text, size_t max) {
  return bench::ParsePositive("optimizer", flag, text, max);
}

void ParseArgs(int argc, char** argv, Options* o) {
  for (ArgCursor args("optimizer", argc, argv); args.Next();) {
    const std::string& a = args.flag();
    if (a == "--json") {
      o->json = true;
    } else if (a == "--params") {
      o->params = ParsePositive("--params", args.Value(), size_t{1} << 32);
    } else if (a == "--steps") {
      o->steps = static_cast<int>(ParsePositive("--steps", args.Value(), 100000));
    } else if (a == "--isa") {
      auto isa = ParseIsaLevel(args.Value());
      if (!isa.ok()) UsageError(isa.status().message());
      o->isa = *isa;
    } else if (a == "--no-torch") {
      o->torch = false;
    } else if (a == "--device") {
      const std::string d = args.Value();
      if (d != "cpu" && d != "cuda") UsageError("--device must be cpu or cuda, got '" + d + "'");
      o->cuda = d == "cuda";
    } else if (a == "--python") {
      o->python = args.Value();
      // It reaches a shell command line below: a plain path only.
      if (o->python.empty() ||
          o->python.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789/._-+") != std::string::npos) {
        UsageError("--python must be a plain path (letters, digits, / . _ - +), got '" + o->python +
                   "'");
      }
    } else if (args.IsHelp()) {
      args.Help(PrintHelp);
    } else {
      args.Unknown(PrintHelp);
    }
  }
}

// One transformer layer of hidden size 1024 (BERT-Large), repeated until `params` are reached;
// the last block is cut to fit. bench/optimizer_torch_ref.py's block_sizes is the same list.
std::vector<size_t> BlockSizes(size_t params) {
  static const size_t kLayer[] = {3 * 1024 * 1024, 3 * 1024, 1024 * 1024, 1024, 1024, 1024,
                                  4096 * 1024,     4096,     1024 * 4096, 1024, 1024, 1024};
  std::vector<size_t> sizes;
  size_t left = params;
  for (size_t i = 0; left > 0; ++i) {
    const size_t s = std::min(kLayer[i % (sizeof(kLayer) / sizeof(kLayer[0]))], left);
    sizes.push_back(s);
    left -= s;
  }
  return sizes;
}

struct TorchResult {
  double params_per_s = 0;
  double seconds = 0;
  std::string version;
  std::string skipped;  // empty: it ran
};

TorchResult RunTorchReference(const Options& o) {
  TorchResult r;
  if (!o.torch) {
    r.skipped = "disabled by --no-torch";
    return r;
  }
  const std::string cmd = o.python + " " + BITPUSH_OPTIMIZER_TORCH_REF + " --params " +
                          std::to_string(o.params) + " --steps " + std::to_string(o.steps) +
                          " --threads 1 --device " + (o.cuda ? "cuda" : "cpu");
  // A fixed program with numbers as arguments and a checked plain path (ParseArgs): no other
  // user text reaches the shell.
  FILE* p = popen(cmd.c_str(), "r");  // NOLINT(bugprone-command-processor)
  if (p == nullptr) {
    r.skipped = "could not start: " + cmd;
    return r;
  }
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  const int rc = pclose(p);
  const size_t brace = out.rfind('{');
  const auto fields = ReadFlatJson(brace == std::string::npos ? "" : out.substr(brace));
  if (auto it = fields.find("skipped"); it != fields.end()) {
    r.skipped = it->second;
  } else if (rc != 0 || JsonNumber(fields, "params_per_s") <= 0) {
    r.skipped = "reference failed (exit status " + std::to_string(rc) + "): " + cmd;
  } else {
    r.params_per_s = JsonNumber(fields, "params_per_s");
    r.seconds = JsonNumber(fields, "seconds");
    r.version = fields.count("torch_version") ? fields.at("torch_version") : "";
  }
  return r;
}

}  // namespace

int RunOptimizerBench(int argc, char** argv) {
  Options opt;
  ParseArgs(argc, argv, &opt);
  const Status isa_ok = CheckIsaSupported(opt.isa);
  if (!isa_ok.ok()) UsageError(isa_ok.message());

  const std::vector<size_t> sizes = BlockSizes(opt.params);
  struct Block {
    std::vector<float> x, m, v, g;
  };
  std::vector<Block> blocks(sizes.size());
  std::mt19937_64 rng(1);  // NOLINT(bugprone-random-generator-seed): same data every run
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t b = 0; b < sizes.size(); ++b) {
    blocks[b].x.resize(sizes[b]);
    blocks[b].g.resize(sizes[b]);
    blocks[b].m.assign(sizes[b], 0.0f);
    blocks[b].v.assign(sizes[b], 0.0f);
    for (float& x : blocks[b].x) x = dist(rng);
    for (float& g : blocks[b].g) g = dist(rng);
  }
  optimizers::LansOptions lo;
  lo.weight_decay = opt.weight_decay;
  uint64_t step = 0;
  Status failure;
  std::function<void()> one_step = [&] {
    ++step;
    for (Block& b : blocks) {
      Status s =
          optimizers::LansStepWithIsa(opt.isa, lo, 1e-3f, step, Span<float>(b.x), Span<float>(b.m),
                                      Span<float>(b.v), Span<const float>(b.g));
      if (!s.ok()) failure = s;
    }
  };
#if BITPUSH_HAVE_CUDA
  // --device cuda: every block's four arrays copied to the first GPU once.
  std::vector<float*> device_arrays;
  struct DeviceFree {
    std::vector<float*>* arrays;
    ~DeviceFree() {
      for (float* p : *arrays) cudaFree(p);
    }
  } device_free{&device_arrays};
  if (opt.cuda) {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
      std::fprintf(stderr, "bitpush-bench optimizer: --device cuda: no usable CUDA device: %s\n",
                   e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount() == 0");
      return 1;
    }
    for (Block& b : blocks) {
      for (std::vector<float>* a : {&b.x, &b.m, &b.v, &b.g}) {
        float* p = nullptr;
        const size_t bytes = a->size() * sizeof(float);
        if (cudaMalloc(&p, bytes) != cudaSuccess ||
            cudaMemcpy(p, a->data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
          std::fprintf(stderr, "bitpush-bench optimizer: cannot place %zu bytes on the GPU\n",
                       bytes);
          return 1;
        }
        device_arrays.push_back(p);
      }
    }
    one_step = [&] {
      ++step;
      for (size_t i = 0; i < blocks.size(); ++i) {
        float* const* a = &device_arrays[4 * i];
        Status s = optimizers::LansStepCuda(lo, 1e-3f, step, a[0], a[1], a[2], a[3],
                                            blocks[i].x.size(), nullptr);
        if (!s.ok()) failure = s;
      }
    };
  }
#else
  if (opt.cuda) {
    std::fprintf(stderr, "bitpush-bench optimizer: --device cuda: built without CUDA\n");
    return 1;
  }
#endif
  // TimeIt's warm-up call is the untimed first step; then exactly --steps timed steps.
  const Timing t = TimeIt(one_step, 0.0, opt.steps);
  if (!failure.ok()) {
    std::fprintf(stderr, "bitpush-bench optimizer: %s\n", failure.ToString().c_str());
    return 1;
  }
  const double params_per_s = static_cast<double>(opt.params) / t.best_seconds;
  const TorchResult torch = RunTorchReference(opt);
  const bool have_torch = torch.skipped.empty();
  const double speedup = have_torch ? params_per_s / torch.params_per_s : kNaN;
  const bool met = have_torch && speedup >= kTarget;
  const std::string isa_name = opt.cuda ? "cuda" : std::string(IsaLevelName(opt.isa));

  JsonRecord rec;
  rec.Add("name", "optimizer")
      .Add("params", opt.params)
      .Add("blocks", sizes.size())
      .Add("steps", t.reps)
      .Add("threads", 1)
      .Add("kernel", isa_name)
      .Add("device", opt.cuda ? "cuda" : "cpu")
      .Add("weight_decay", static_cast<double>(opt.weight_decay))
      .Add("seconds", t.best_seconds)
      .Add("median_seconds", t.median_seconds)
      .Add("params_per_s", params_per_s)
      .Add("gbps", params_per_s * 44 / 1e9)  // bytes moved: pass 1 24 B, pass 2 20 B per param
      .Add("torch_params_per_s", have_torch ? torch.params_per_s : kNaN)
      .Add("torch_seconds", have_torch ? torch.seconds : kNaN)
      .Add("torch_version", torch.version)
      .Add("torch_skipped", torch.skipped)
      .Add("speedup_vs_torch", speedup)
      .Add("target", kTarget)
      .Add("met", met ? 1 : 0);
  if (opt.json) {
    std::fputs(JsonArray({rec}).c_str(), stdout);
  } else {
    std::printf("LANS step, %zu params in %zu blocks, %s, kernel %s\n", opt.params, sizes.size(),
                opt.cuda ? "first GPU" : "one thread", isa_name.c_str());
    std::printf("bitpush  %10.3f ms  %8.1f M params/s\n", t.best_seconds * 1e3, params_per_s / 1e6);
    if (have_torch) {
      std::printf("torch    %10.3f ms  %8.1f M params/s  (torch %s)\n", torch.seconds * 1e3,
                  torch.params_per_s / 1e6, torch.version.c_str());
      std::printf("speedup  %.2fx (target %.1fx: %s)\n", speedup, kTarget, met ? "met" : "NOT met");
    } else {
      std::printf("torch reference skipped: %s\n", torch.skipped.c_str());
    }
  }
  return 0;
}

}  // namespace bitpush::bench
