// The dmlc/ps-lite peer of `bitpush-bench pushpull --peer pslite`: finds (or builds) our
// ps-lite driver in a ps-lite checkout and runs one ps-lite cluster of it as real processes on
// loopback, with the sizes of the bitpush clusters it is compared with.
//
// The driver (bench/peers/pslite_driver.cc) is not part of this build: it needs ps-lite, which
// lives outside the repository; bench/peers/build-pslite-driver.sh compiles it into
// PSLITE_DIR/bitpush-peer/ (bench/peers/README.md). This file is the launcher side only and
// links nothing of ps-lite.
//
// Processes: a scheduler, S servers and W workers, each `env DMLC_ROLE=... driver ...` with
// DMLC_PS_ROOT_URI=127.0.0.1, DMLC_PS_ROOT_PORT and each node's PORT free ports below the
// ephemeral range (testing::FreeTcpPort), DMLC_NODE_HOST=127.0.0.1, DMLC_NUM_SERVER,
// DMLC_NUM_WORKER; variables that would change ps-lite's data path or slow it (DMLC_LOCAL,
// DMLC_PS_VAN_TYPE, DMLC_PS_WATER_MARK, PS_RESEND, PS_DROP_MSG, PS_VERBOSE, ...) are removed.
// Every wait is bounded by timeout_s; ps-lite has no failure detection of its own here, so when
// one process fails the others are killed at once, and the error names each process and how it
// ended.
//
// pslite_peer.cc also holds the ps-lite Peer of `bitpush-bench pushpull` (bench/pushpull/peer.h,
// MakePslitePeer): it finds the driver once (FindPsliteDriver, rebuilding it with the script in
// the source tree), runs one cluster per pass (RunPsliteCluster) with the bitpush clusters'
// shape and bytes, and writes the ps-lite record of its median run.
//
// Thread-safety: none; call from one thread (the children's death signal follows it).
#pragma once

#include <string>

#include "common/status.h"

namespace bitpush::bench {

// The shape of one ps-lite cluster: the same meaning as the pushpull flags of the same names.
struct PsliteShape {
  int workers = 1;
  int servers = 1;
  double mb = 100;                // MiB of fp32 per worker
  long long partition_kb = 4000;  // one ps-lite key per partition of partition_kb x 1024 bytes
  int iters = 10;
  int warmup = 2;
  int timeout_s = 300;    // the whole cluster, start to exit
  bool keep_dir = false;  // keep the temp dir (logs, results) for a post-mortem
};

struct PsliteResult {
  double goodput_gbps = 0;    // tensor bytes x iters / the slowest worker's timed loop / 1e9
  double best_iter_gbps = 0;  // tensor bytes / the fastest iteration of any worker / 1e9
  double iter_ms = 0;         // the slowest worker's timed loop / iters
  double server_peak_rss_mb = 0, worker_peak_rss_mb = 0, scheduler_peak_rss_mb = 0;
  double wall_seconds = 0;  // first process started -> last exited
};

// Where to look, said to a user whose --pslite-dir is missing or unusable.
std::string PsliteHowTo();

// The driver for `pslite_dir`: DIR/bitpush-peer/bitpush-pslite-driver or DIR/bitpush-pslite-
// driver. When DIR is a ps-lite checkout and `build_script` exists, runs it first (it rebuilds
// only what is stale; its messages go to stderr). FailedPrecondition with the reason when there
// is no usable driver.
StatusOr<std::string> FindPsliteDriver(const std::string& pslite_dir,
                                       const std::string& build_script);

// Runs one cluster of `driver` and reads the workers' results.
StatusOr<PsliteResult> RunPsliteCluster(const std::string& driver, const PsliteShape& shape);

}  // namespace bitpush::bench
