#include "bench/pushpull/options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "compressors/registry.h"
#include "optimizers/param_state.h"

namespace bitpush::bench::pushpull {
namespace {

// --peer ddp's flags: 0, or 2 after saying what is wrong.
int CheckDdpOptions(const Options& o) {
  if (o.peer != "ddp") {
    const char* flag = !o.peer_variant.empty()  ? "--peer-variant"
                       : !o.peer_python.empty() ? "--peer-python"
                                                : nullptr;
    if (flag == nullptr) return 0;
    std::fprintf(stderr, "%s: %s needs --peer ddp\n", kName, flag);
    return 2;
  }
  // DDP's exchange of fp16 or bf16 models is the plain all-reduce of those tensors; the hooks
  // compress fp32 gradients.
  const std::string variant = o.peer_variant.empty() ? "allreduce" : o.peer_variant;
  const bool plain = variant == "allreduce" || variant == "ddp";
  if (o.dtype != DType::kFloat32 && !(plain && o.dtype == DType::kFloat16)) {
    std::fprintf(stderr,
                 "%s: --peer ddp --peer-variant %s compares %s tensors only, not --dtype %s\n",
                 kName, variant.c_str(), plain ? "float32 or float16" : "float32",
                 std::string(DTypeName(o.dtype)).c_str());
    return 2;
  }
  if (o.link_gbit > 0) {
    std::fprintf(stderr,
                 "%s: --peer ddp runs on loopback only, not with --link-gbit: the emulated link "
                 "shapes the servers' link, not the link between workers that DDP's ring "
                 "all-reduce crosses, so the two would not be comparable; links per node are "
                 "bench/emulated_network.py's (bench/peers/README.md)\n",
                 kName);
    return 2;
  }
  return 0;
}

}  // namespace

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench pushpull [--json] [--workers 1] [--servers 1] [--mb 100]\n"
      "         [--partition-kb 4000] [--raw-partition-kb 0] [--compressor SPEC[,SPEC...]]\n"
      "         [--iters 10] [--warmup 2]\n"
      "         [--tensors 1] [--dtype float32|float16|bfloat16]\n"
      "         [--error-feedback auto|none|worker|server|both]\n"
      "         [--min-compress-bytes 1048576] [--raw-reps 5] [--timeout-s 300] [--keep-dir]\n"
      "         [--link-gbit R] [--security none|curve[,...]] [--transport zmq|ucx[,...]]\n"
      "         [--ucx-tls TLS] [--reps 1] [--non-finite-check on|off[,...]]\n"
      "         [--timeline [off,all,1/N]]\n"
      "         [--peer pslite --pslite-dir DIR [--peer-reps 3]]\n"
      "         [--peer ddp [--peer-variant allreduce|ddp|fp16|powersgd] [--peer-python PY]\n"
      "          [--peer-reps 3]]\n"
      "         [--server-side | --placement worker|server[,...]] [--optimizer sgd|adamw|lans]\n"
      "         [--pull SPEC|auto]\n"
      "Runs a real cluster on loopback per compressor (bitpush-scheduler, S bitpush-server,\n"
      "W workers) and times N PushPull+Wait iterations of MB MiB of --dtype (float32) per worker\n"
      "(in K equal tensors), in partitions of partition-kb x 1024 bytes (raw tensors, "
      "--compressor\n"
      "none: compression.raw_partition_bytes, --raw-partition-kb x 1024, 0 = auto: finer, from\n"
      "the tensor and W + S; docs/flow-control.md). --compressor takes a list (one\n"
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
      "--timeline off,all,1/N (without a value: off,all,1/100): each run once per value, with\n"
      "the timeline (docs/observability.md) off, tracing every step, or one step in N\n"
      "(trace.steps \"every N\"); timeline_ratio = goodput traced / the same run's untraced,\n"
      "timeline_spans / timeline_dropped = the spans the workers and servers wrote / dropped.\n"
      "--non-finite-check on,off (default on; the flag may repeat): each run once per value, off\n"
      "= the workers skip the engine's own non-finite pass over a push's input (a compression\n"
      "that checks inside its kernels still does); non_finite_check_ratio = goodput with it /\n"
      "goodput without it, the check's cost (docs/errors.md).\n"
      "--reps R: R passes over all the runs (each compressor, security mode and transport once\n"
      "per pass, in the same order), so that drift of the shared machine hits all; each record\n"
      "is the run of median goodput of its R (goodput_min_gbps, goodput_max_gbps beside it), and\n"
      "the ratios compare medians. With --peer, --peer-reps sets the passes.\n"
      "--peer pslite --pslite-dir DIR: dmlc/ps-lite side by side (our dense driver, built in\n"
      "DIR by bench/peers/build-pslite-driver.sh: bench/peers/README.md), same sizes, R\n"
      "alternations of a ps-lite and the bitpush clusters (--peer-reps, default 3), medians;\n"
      "records get peer and ratio_to_pslite. Without a driver: bitpush alone, exit 0.\n"
      "--peer ddp: PyTorch DDP's gradient exchange side by side (bench/peers/ddp_driver.py under\n"
      "--peer-python, default /usr/bin/python3: W gloo ranks on loopback, the same tensors):\n"
      "--peer-variant allreduce (default; torch.distributed.all_reduce of each tensor), ddp\n"
      "(DistributedDataParallel, default buckets), fp16 (DDP + fp16_compress_hook), powersgd\n"
      "(DDP + powerSGD_hook, rank 4); records get ratio_to_ddp. Without torch and gloo there:\n"
      "bitpush alone, exit 0.\n"
      "--server-side (= --placement server): the servers run the optimizer (--optimizer,\n"
      "default adamw) and the workers pull weights (--pull: auto = SDP4Bit's qWD,\n"
      "sdp4bit:hadamard=off,group=2048, for sdp4bit pushes, raw fp32 otherwise); --placement\n"
      "worker,server runs each compressor both ways (worker: --optimizer, if given, runs in the\n"
      "worker processes on the averaged gradient). Records get placement, optimizer, pull;\n"
      "worker_peak_rss_mb shows where the optimizer state lives.\n");
}

int ParseOptions(int argc, char** argv, Options* o) {
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
      const std::vector<std::string> names = SplitSpecList(v);
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
    } else if (a == "--raw-partition-kb") {
      o->raw_partition_kb = integer(0);
    } else if (a == "--compressor") {
      const char* v = next();
      const std::vector<std::string> specs = SplitSpecList(v);
      if (specs.empty()) bad(v);
      o->compressors.insert(o->compressors.end(), specs.begin(), specs.end());
    } else if (a == "--security") {
      add_choices({"none", "curve"}, &o->securities);
    } else if (a == "--transport") {
      add_choices({"zmq", "ucx"}, &o->transports);
    } else if (a == "--non-finite-check") {
      add_choices({"on", "off"}, &o->non_finite_checks);
    } else if (a == "--timeline") {
      // Its value is optional: without one, off, every step and one step in 100.
      const bool has_value = i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0;
      const std::vector<std::string> modes =
          has_value ? SplitSpecList(argv[++i]) : std::vector<std::string>{"off", "all", "1/100"};
      if (modes.empty()) bad(argv[i]);
      for (const std::string& m : modes) {
        // "1/N", N >= 1.
        char* end = nullptr;
        const bool sampled = m.rfind("1/", 0) == 0 && m.size() > 2 &&
                             std::strtoull(m.c_str() + 2, &end, 10) >= 1 && *end == '\0';
        if (m != "off" && m != "all" && !sampled) bad(m.c_str());
        if (std::find(o->timelines.begin(), o->timelines.end(), m) == o->timelines.end()) {
          o->timelines.push_back(m);
        }
      }
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
      if (v != "pslite" && v != "ddp") bad(v.c_str());
      o->peer = v;
    } else if (a == "--pslite-dir") {
      o->pslite_dir = next();
    } else if (a == "--peer-variant") {
      const std::string v = next();
      if (v != "allreduce" && v != "ddp" && v != "fp16" && v != "powersgd") bad(v.c_str());
      o->peer_variant = v;
    } else if (a == "--peer-python") {
      o->peer_python = next();
      if (o->peer_python.empty()) bad("");
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
  if (o->peer == "pslite" && o->dtype != DType::kFloat32) {
    std::fprintf(stderr, "%s: --peer pslite compares float32 tensors only, not --dtype %s\n", kName,
                 std::string(DTypeName(o->dtype)).c_str());
    return 2;
  }
  if (o->peer == "pslite" && o->link_gbit > 0) {
    std::fprintf(stderr, "%s: --peer pslite runs on loopback only, not with --link-gbit\n", kName);
    return 2;
  }
  if (o->peer != "pslite" && !o->pslite_dir.empty()) {
    std::fprintf(stderr, "%s: --pslite-dir needs --peer pslite\n", kName);
    return 2;
  }
  if (int rc = CheckDdpOptions(*o)) return rc;
  if (o->compressors.empty()) o->compressors.push_back("none");
  if (o->securities.empty()) o->securities.push_back("none");
  if (o->transports.empty()) o->transports.push_back("zmq");
  if (o->non_finite_checks.empty()) o->non_finite_checks.push_back("on");
  if (o->timelines.empty()) o->timelines.push_back("off");
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
  if (o->peer == "pslite" && o->transports != std::vector<std::string>{"zmq"}) {
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

}  // namespace bitpush::bench::pushpull
