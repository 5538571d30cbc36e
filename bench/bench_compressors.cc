// bitpush-bench compressors: single-thread throughput of every compressor operation on fp32
// buffers, each reported as GB/s of fp32 input and as a ratio to memcpy of the same bytes
// measured in the same run.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/aligned_buffer.h"
#include "common/counter_rng.h"
#include "common/cpu_features.h"
#include "common/vector_ops.h"
#include "compressors/compressor.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"

namespace bitpush::bench {
namespace {

using compressors::CompressContext;
using compressors::Compressor;

const char* const kDefaultSpecs[] = {
    "none",
    "fp16",
    "bf16",
    "onebit",
    "onebit:scaled=false",
    "topk:ratio=0.001",
    "topk:ratio=0.01",
    "randomk:ratio=0.03125",
    "randomk:ratio=0.03125,unbiased=true,seed=7",
    "dithering:levels=15,partition=linear,norm=max",
    "dithering:levels=3,partition=natural,norm=max",
    "dithering:levels=63,partition=linear,norm=max",
    "loco",  // the default: block=256
    "loco:scale=524288",
    "sdp4bit",
    "sdp4bit:hadamard=off",
    "separate",
    "separate:block=32",
    "separate:block=64",
    "separate:block=128",
    "separate:block=256",
    "separate:block=512",
    "separate:block=1024",
    "binsgdm",
};

struct Options {
  bool json = false;
  IsaLevel isa = BestIsaLevel();
  std::vector<size_t> sizes_mib = {4, 64};
  double min_seconds = 0.3;
  // --only: a spec runs when one of these is a substring of it; empty runs every spec.
  std::vector<std::string> only;
};

bool Selected(const Options& o, const std::string& spec) {
  if (o.only.empty()) return true;
  for (const std::string& filter : o.only) {
    if (spec.find(filter) != std::string::npos) return true;
  }
  return false;
}

// 0, or 2 after naming the --only filter that selects no spec and the compressors there are: a
// filter that matches nothing would measure memcpy alone and look like a successful run.
int CheckOnly(const Options& o) {
  for (const std::string& filter : o.only) {
    Options one;
    one.only = {filter};
    if (std::any_of(std::begin(kDefaultSpecs), std::end(kDefaultSpecs),
                    [&](const char* spec) { return Selected(one, spec); }))
      continue;
    std::vector<std::string> names;
    for (const char* spec : kDefaultSpecs) {
      std::string name(spec);
      name.resize(name.find(':') == std::string::npos ? name.size() : name.find(':'));
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    std::string list;
    for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
    std::fprintf(stderr,
                 "bitpush-bench compressors: --only '%s' matches no compressor spec (a filter is "
                 "a substring of a spec; the compressors: %s)\n",
                 filter.c_str(), list.c_str());
    return 2;
  }
  return 0;
}

void PrintHelp() {
  std::printf(
      "usage: bitpush-bench compressors [--json] [--isa avx512|avx2|scalar] [--sizes-mib 4,64]\n"
      "                                 [--min-time SECONDS] [--only FILTER[,FILTER...]]\n"
      "Measures memcpy, then compress, compress_ef, decompress, decompress_add and server_round\n"
      "of every compressor on random normal fp32 data, one thread. gbps = fp32 input bytes /\n"
      "best time. server_round: a server's round over 4 pushes of the payload (the fused\n"
      "AggregateCompress where the compressor fuses it, else decompress, add, average,\n"
      "compress; a compressed-domain method's round runs through its server error-feedback\n"
      "state where its recommended policy keeps one), gbps counting the 4 pushes' fp32 bytes.\n"
      "compress_ef runs through the method's worker error-feedback state (binsgdm: its whole\n"
      "worker step). engine_check: what the worker engine adds to a push for its non-finite\n"
      "check: taking the compression's report where its kernels check (check_folded; the cost\n"
      "is then inside compress_ef), else one read pass; check_cost = its time / compress_ef's.\n"
      "--only takes a comma-separated list: a spec runs when one of the filters is a substring\n"
      "of it (--only loco,sdp4bit; --only dithering:levels=3); a filter that matches no spec is\n"
      "refused.\n");
}

int ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bitpush-bench compressors: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") {
      o->json = true;
    } else if (a == "--isa") {
      auto isa = ParseIsaLevel(next("--isa"));
      if (!isa.ok()) {
        std::fprintf(stderr, "bitpush-bench compressors: %s\n", isa.status().message().c_str());
        return 2;
      }
      o->isa = *isa;
    } else if (a == "--sizes-mib") {
      o->sizes_mib.clear();
      std::string list = next("--sizes-mib");
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = list.find(',', pos);
        const std::string item =
            list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        const long v = std::strtol(item.c_str(), nullptr, 10);
        if (v <= 0) {
          std::fprintf(stderr, "bitpush-bench compressors: bad size '%s' in --sizes-mib\n",
                       item.c_str());
          return 2;
        }
        o->sizes_mib.push_back(static_cast<size_t>(v));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (a == "--min-time") {
      o->min_seconds = ParseSeconds("compressors", "--min-time", next("--min-time"));
    } else if (a == "--only") {
      const std::string list = next("--only");
      o->only = SplitSpecList(list);
      if (o->only.empty()) {
        std::fprintf(stderr, "bitpush-bench compressors: --only '%s' names no compressor\n",
                     list.c_str());
        return 2;
      }
    } else if (a == "--help" || a == "-h") {
      PrintHelp();
      std::exit(0);
    } else {
      std::fprintf(stderr, "bitpush-bench compressors: unknown option '%s'\n", a.c_str());
      PrintHelp();
      return 2;
    }
  }
  return CheckOnly(*o);
}

}  // namespace

int RunCompressorsBench(int argc, char** argv) {
  Options opt;
  if (int rc = ParseArgs(argc, argv, &opt)) return rc;
  const Status isa_ok = CheckIsaSupported(opt.isa);
  if (!isa_ok.ok()) {
    std::fprintf(stderr, "bitpush-bench compressors: %s\n", isa_ok.message().c_str());
    return 2;
  }
  const std::string isa_name(IsaLevelName(opt.isa));
  std::vector<JsonRecord> records;
  if (!opt.json) {
    std::printf("isa=%s  one thread  gbps = GB/s of fp32 input (best of repeated runs)\n",
                isa_name.c_str());
    std::printf("%-48s %-15s %6s %9s %8s %9s\n", "compressor", "op", "MiB", "GB/s", "x memcpy",
                "ratio");
  }

  for (size_t mib : opt.sizes_mib) {
    const size_t bytes = mib << 20;
    const size_t n = bytes / 4;
    AlignedBuffer<float> grad(n), out(n), acc(n), copy_dst(n);
    std::mt19937_64 rng(1234);  // NOLINT(bugprone-random-generator-seed): same data every run
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) grad[i] = dist(rng);
    acc.zero();
    // Repetitions scale with size so every measurement lasts about min_seconds.
    const int min_reps = 5;

    const Timing mem = TimeIt([&] { std::memcpy(copy_dst.data(), grad.data(), bytes); },
                              opt.min_seconds, min_reps);
    const double memcpy_gbps = bytes / mem.best_seconds / 1e9;
    records.push_back(JsonRecord()
                          .Add("name", "memcpy")
                          .Add("spec", "memcpy")
                          .Add("op", "memcpy")
                          .Add("isa", isa_name)
                          .Add("bytes", bytes)
                          .Add("seconds", mem.best_seconds)
                          .Add("median_seconds", mem.median_seconds)
                          .Add("gbps", memcpy_gbps)
                          .Add("elements_per_s", static_cast<double>(n) / mem.best_seconds)
                          .Add("ratio_to_memcpy", 1.0)
                          .Add("compression_ratio", 1.0));
    if (!opt.json) {
      std::printf("%-48s %-15s %6zu %9.2f %8.2f %9s\n", "memcpy", "memcpy", mib, memcpy_gbps, 1.0,
                  "1");
    }

    for (const char* spec : kDefaultSpecs) {
      if (!Selected(opt, spec)) continue;
      compressors::CompressorOptions copts;
      copts.isa = opt.isa;
      auto created = compressors::CreateCompressor(spec, copts);
      if (!created.ok()) {
        std::fprintf(stderr, "bitpush-bench compressors: %s: %s\n", spec,
                     created.status().ToString().c_str());
        return 1;
      }
      std::unique_ptr<Compressor> c = std::move(created).value();
      const auto config = compressors::ParseCompressorSpec(spec);
      const std::string name(compressors::CompressorName(config->id()));
      std::vector<uint8_t> payload(c->MaxCompressedBytes(n, DType::kFloat32));
      CompressContext ctx;
      ctx.key = 1;
      size_t payload_bytes = 0;
      Status failure;

      auto compress = [&] {
        ++ctx.round;
        auto r =
            c->Compress(ConstTensorView(grad.data(), n), ctx, {payload.data(), payload.size()});
        if (!r.ok())
          failure = r.status();
        else
          payload_bytes = *r;
      };
      // compress_ef runs through the method's worker error-feedback state, as the engine does
      // (onebit's defers its correction into the next round's pass: compressors/onebit).
      auto state =
          compressors::CreateErrorFeedback(*config, compressors::ErrorFeedbackSide::kWorker, n);
      if (!state.ok()) {
        std::fprintf(stderr, "bitpush-bench compressors: %s: %s\n", spec,
                     state.status().ToString().c_str());
        return 1;
      }
      std::unique_ptr<compressors::ErrorFeedback> ef = std::move(state).value();
      auto compress_ef = [&] {
        ++ctx.round;
        auto r = ef->Compress(*c, ConstTensorView(grad.data(), n), ctx,
                              {payload.data(), payload.size()});
        if (!r.ok())
          failure = r.status();
        else
          payload_bytes = *r;
      };
      // engine_check: what the worker engine adds to a push for its non-finite check
      // (RoundPipeline::CompressAndPush). Where the compression checked inside its own pass
      // (CompressorTelemetry::input_checked, seen after one compress_ef: "check_folded"), only
      // taking the report: that check's cost is inside compress_ef. Else one FirstNonFinite
      // pass over the input. Its record's check_cost = its time / compress_ef's. (Timed on its
      // own: compress_ef's state evolves round after round, so a second compress_ef would not
      // run the same work.)
      bool check_folded = false;
      auto engine_check = [&] {
        compressors::CompressorTelemetry telemetry;
        c->TakeTelemetry(&telemetry);
        ef->TakeTelemetry(&telemetry);
        if (!check_folded && FirstNonFinite(ConstTensorView(grad.data(), n), opt.isa) != n) {
          failure = InternalError("non-finite check: finite input flagged");
        }
      };
      auto decompress = [&] {
        Status s = c->Decompress({payload.data(), payload_bytes}, TensorView(out.data(), n));
        if (!s.ok()) failure = s;
      };
      auto decompress_add = [&] {
        Status s = c->DecompressAdd({payload.data(), payload_bytes}, acc.span());
        if (!s.ok()) failure = s;
      };

      // server_round: what a server does with kServerPushes pushes of this payload (one per
      // worker) — KeyState's round without a server residual: the fused AggregateCompress where
      // the compressor fuses it (onebit, topk, sdp4bit: the Hadamard-domain sum and its one
      // inverse transform), else decompress-to-float, decompress-add, average and compress. A
      // compressed-domain method (binsgdm) runs the round its servers run by default: through
      // the method's server error-feedback state where its recommended policy keeps one
      // (binsgdm: the bit counts, the server residual and the re-binarisation).
      // Its gbps counts every push's fp32 bytes (kServerPushes x the tensor).
      constexpr size_t kServerPushes = 4;
      std::unique_ptr<compressors::ErrorFeedback> server_ef;
      if (compressors::FindMethod(config->id())->aggregation ==
              compressors::AggregationMode::kCompressedDomainSum &&
          compressors::ServerKeepsResidual(compressors::RecommendedErrorFeedback(*config))) {
        auto made =
            compressors::CreateErrorFeedback(*config, compressors::ErrorFeedbackSide::kServer, n);
        if (!made.ok()) {
          std::fprintf(stderr, "bitpush-bench compressors: %s: %s\n", spec,
                       made.status().ToString().c_str());
          return 1;
        }
        server_ef = std::move(made).value();
      }
      std::vector<uint8_t> reply(c->MaxCompressedBytes(n, DType::kFloat32));
      CompressContext sctx;
      sctx.key = 1;
      sctx.worker = kServerStream;
      auto server_round = [&] {
        const float scale = 1.0f / static_cast<float>(kServerPushes);
        const ByteSpan push(payload.data(), payload_bytes);
        Status s;
        if (server_ef != nullptr) {
          const ByteSpan pushes[kServerPushes] = {push, push, push, push};
          auto r = server_ef->AggregateCompress(*c, Span<const ByteSpan>(pushes, kServerPushes),
                                                scale, sctx, {reply.data(), reply.size()});
          if (!r.ok()) s = r.status();
        } else if (c->FusesServerRound(false)) {
          const ByteSpan pushes[kServerPushes] = {push, push, push, push};
          auto r = c->AggregateCompress(Span<const ByteSpan>(pushes, kServerPushes), n, scale,
                                        nullptr, sctx, {reply.data(), reply.size()});
          if (!r.ok()) s = r.status();
        } else {
          s = c->DecompressToFloat(push, acc.span());
          for (size_t w = 1; w < kServerPushes && s.ok(); ++w)
            s = c->DecompressAdd(push, acc.span());
          float* a = acc.data();
          for (size_t i = 0; s.ok() && i < n; ++i) a[i] *= scale;
          if (s.ok()) {
            auto r =
                c->Compress(ConstTensorView(acc.data(), n), sctx, {reply.data(), reply.size()});
            if (!r.ok()) s = r.status();
          }
        }
        if (!s.ok()) failure = s;
      };

      struct Op {
        const char* name;
        std::function<void()> fn;
        size_t pushes = 1;  // tensors of input per call
      };
      // decompress* run on the payload left by the last plain compress.
      const Op ops[] = {{"compress_ef", compress_ef},
                        {"compress", compress},
                        {"decompress", decompress},
                        {"decompress_add", decompress_add},
                        {"server_round", server_round, kServerPushes},
                        {"engine_check", engine_check}};
      double ef_seconds = 0;
      for (const Op& op : ops) {
        const Timing t = TimeIt(op.fn, opt.min_seconds, min_reps);
        if (std::strcmp(op.name, "compress_ef") == 0) {
          ef_seconds = t.best_seconds;
          compressors::CompressorTelemetry telemetry;  // did the last compress_ef check?
          c->TakeTelemetry(&telemetry);
          ef->TakeTelemetry(&telemetry);
          check_folded = telemetry.input_checked && !telemetry.input_non_finite;
        }
        if (!failure.ok()) {
          std::fprintf(stderr, "bitpush-bench compressors: %s %s failed: %s\n", spec, op.name,
                       failure.ToString().c_str());
          return 1;
        }
        const double gbps = static_cast<double>(op.pushes) * bytes / t.best_seconds / 1e9;
        const double ratio =
            static_cast<double>(bytes) / static_cast<double>(payload_bytes ? payload_bytes : 1);
        JsonRecord record;
        record.Add("name", name)
            .Add("spec", spec)
            .Add("op", op.name)
            .Add("isa", isa_name)
            .Add("bytes", bytes)
            .Add("seconds", t.best_seconds)
            .Add("median_seconds", t.median_seconds)
            .Add("gbps", gbps)
            .Add("elements_per_s",
                 static_cast<double>(op.pushes) * static_cast<double>(n) / t.best_seconds)
            .Add("ratio_to_memcpy", gbps / memcpy_gbps)
            .Add("compression_ratio", ratio)
            .Add("payload_bytes", payload_bytes);
        const bool checked = std::strcmp(op.name, "engine_check") == 0;
        if (checked) {
          record.Add("check_cost", t.best_seconds / ef_seconds)
              .AddBool("check_folded", check_folded);
        }
        records.push_back(std::move(record));
        if (!opt.json) {
          std::printf("%-48s %-19s %6zu %9.2f %8.2f %9.1f", spec, op.name, mib, gbps,
                      gbps / memcpy_gbps, ratio);
          if (checked) {
            std::printf("  %s, +%.2f%% of compress_ef", check_folded ? "folded" : "own pass",
                        t.best_seconds / ef_seconds * 100);
          }
          std::printf("\n");
        }
      }
    }
  }
  if (opt.json) std::fputs(JsonArray(records).c_str(), stdout);
  return 0;
}

}  // namespace bitpush::bench
