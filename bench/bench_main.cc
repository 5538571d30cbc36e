// bitpush-bench: benchmarks of bitpush components. Usage:
//   bitpush-bench <benchmark> [options]      (bitpush-bench --help lists them)
// Each benchmark prints a table, or with --json a JSON array of records on stdout.
#include <cstdio>
#include <cstring>
#include <string>

#include "common/process_memory.h"

namespace bitpush::bench {
int RunCompressorsBench(int argc, char** argv);
int RunTransportBench(int argc, char** argv);
int RunLocalReduceBench(int argc, char** argv);
int RunGpuReduceBench(int argc, char** argv);
int RunOptimizerBench(int argc, char** argv);
int RunPushPullBench(int argc, char** argv);
int RunPushPullWorkerMode(int argc, char** argv);
int RunPushPullKeygenMode(int argc, char** argv);
int RunTrainBench(int argc, char** argv);
int RunClusterBench(int argc, char** argv);
int RunClusterRunMode(int argc, char** argv);
}  // namespace bitpush::bench

namespace {

struct Command {
  const char* name;
  const char* help;  // nullptr: a hidden mode (a child process of a benchmark)
  int (*run)(int argc, char** argv);
};

const Command kCommands[] = {
    {"compressors",
     "compress / compress_ef / decompress / decompress_add throughput of every compressor "
     "vs memcpy (one thread)",
     bitpush::bench::RunCompressorsBench},
    {"transport",
     "zmq (and ucx) transport between two processes on loopback (throughput by message size, "
     "round-trip latency) vs a plain TCP stream and memcpy; --list: what UCX finds here",
     bitpush::bench::RunTransportBench},
    {"pushpull",
     "compressed push_pull end to end: scheduler, servers and workers as real processes on "
     "loopback (goodput per worker, stage times, peak RSS) vs a raw TCP stream",
     bitpush::bench::RunPushPullBench},
    {"cluster",
     "the control plane at scale: threads-as-nodes clusters of N nodes over inproc and zmq "
     "loopback (registration, barrier latency, scheduler CPU, memory per node, time to name a "
     "killed node, a push/pull round of small tensors)",
     bitpush::bench::RunClusterBench},
    {"train",
     "training steps of a model layout (bench/layouts/: resnet50, vgg16, bert-base, gpt2-small) "
     "on loopback, bitpush vs torch DDP (fp32, fp16 hook, PowerSGD hook); bench/train_bench.py",
     bitpush::bench::RunTrainBench},
    {"localreduce",
     "intra-node reduce of P processes' tensors in POSIX shared memory (the worker daemon's "
     "SIMD sum) vs memcpy",
     bitpush::bench::RunLocalReduceBench},
    {"gpureduce",
     "the GPU intra-node reduce (fp16 cast, NCCL reduce to pinned host memory, and back) vs a "
     "CUDA copy of the fp32 gradient; skipped, naming why, without a usable GPU",
     bitpush::bench::RunGpuReduceBench},
    {"optimizer",
     "one LANS/CLAN update step (optimizers/lans.h) of a 25M-parameter transformer-like model "
     "on one thread vs the same update in plain torch ops",
     bitpush::bench::RunOptimizerBench},
    {"pushpull-worker", nullptr, bitpush::bench::RunPushPullWorkerMode},
    {"pushpull-keygen", nullptr, bitpush::bench::RunPushPullKeygenMode},
    {"cluster-run", nullptr, bitpush::bench::RunClusterRunMode},
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: bitpush-bench <benchmark> [options]   (<benchmark> --help for "
               "options)\n\nbenchmarks:\n");
  for (const Command& c : kCommands) {
    if (c.help != nullptr) std::fprintf(out, "  %-14s %s\n", c.name, c.help);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // As the daemons (the pushpull workers stand for the node daemon; common/process_memory.h).
  bitpush::KeepLargeBuffersInProcess();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "bitpush-bench: unknown benchmark '%s'\n", argv[1]);
  Usage(stderr);
  return 2;
}
