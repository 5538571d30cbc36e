// The push_pull worker program: one bitpush worker process that declares fp32 tensors and
// loops PushPull + Wait through worker::Client against a real cluster. One program with two
// entry points:
//   - `bitpush-bench pushpull-worker ...` (hidden): the workers `bitpush-bench pushpull` starts;
//   - `bitpush-test-worker ...` (tests/tools/test_worker.cc): the worker of the multi-process
//     tests (tests/unit/pushpull_process_test.cc).
//
//   --config CLUSTER.yaml --rank N [--tensor-mb X] [--tensors K] [--iters N] [--warmup W]
//   [--pause-ms M] [--linger-ms L] [--compression SPEC] [--results PATH] [--record PATH] [--quiet]
//   [--shutdown-timeout-ms T] [--log-level L]
//
// It declares K tensors of X MiB of float32 each ("t0", "t1", ..., priority = index), checks
// the declarations, runs W warm-up iterations, waits for every worker (Client::Barrier), runs
// N timed iterations (each: sleep M ms, PushPull of every tensor, Wait of every handle), then
// Client::Shutdown. It prints "worker R: iteration I ok T ms" per completed iteration (unless
// --quiet) and writes its results as one flat JSON object to --results (timings, the
// ClientStats of the timed loop, status). --record PATH writes every tensor's input (raw bytes,
// tensor after tensor) and then, after each completed iteration (warm-up ones too), every
// tensor's output the same way: a test reads the inputs back and compares each output with
// its reference model bit for bit (tests/unit/pushpull_process_test.cc).
//
// Exit status: 0 clean; 2 usage or config error; 1 start-up, declaration or shutdown failure;
// 3 a push_pull failed: it prints "PROGRAM worker R: error: iteration I failed: wait returned
// after A ms, B ms after the last success: STATUS" at once, then (with --linger-ms) stays
// alive and registered L ms before exiting — so that in a crash test the scheduler's verdict
// names the crashed node, not a worker that exited because of it first.
//
// Thread-safety: a whole program; call once per process.
#pragma once

namespace bitpush::bench {

// `program` names the binary in messages ("bitpush-test-worker"); argv[0] is skipped.
int RunPushPullWorker(const char* program, int argc, char** argv);

}  // namespace bitpush::bench
