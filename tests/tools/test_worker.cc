// bitpush-test-worker: a minimal worker process for the multi-process tests
// (tests/unit/pushpull_process_test.cc) and for smoke-testing a cluster YAML with real
// servers:
//
//   bitpush-test-worker --config cluster.yaml --rank N --tensor-mb X --iters K [--pause-ms M]
//                       [--tensors T] [--warmup W] [--results PATH] [--quiet] ...
//
// It is the same program as the workers of `bitpush-bench pushpull` (bench/pushpull_worker.h
// documents the flags, the output lines and the exit codes: 3 when a push_pull fails, with the
// Status and how long the failing Wait took after the last success); this entry point only
// exists so tests do not depend on the benchmark binary.
#include "bench/pushpull_worker.h"

int main(int argc, char** argv) {
  return bitpush::bench::RunPushPullWorker("bitpush-test-worker", argc, argv);
}
