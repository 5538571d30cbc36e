// A peer of `bitpush-bench pushpull`: another system run side by side with bitpush in the same
// invocation (--peer NAME), the way its own users run it, with the same sizes (workers, servers,
// mb, partition-kb, iters, warmup), so that the records compare like with like.
//
// The driver alternates: each of --peer-reps passes runs the peer once (RunOnce) and every
// bitpush cluster once, the peer first on even passes and last on odd ones, so that drift of the
// shared machine hits both. The peer keeps its runs; the report asks for its median-goodput run
// (Summary, Record: bench/pushpull/repetitions.h) and puts the same raw TCP references into its
// record as into bitpush's. A peer that cannot run here (Prepare fails: no driver, no program)
// is said on stderr with how to get it, and bitpush runs alone (exit 0).
//
// One peer per file, each behind a factory declared here: ps-lite (bench/peers/pslite_peer.cc),
// PyTorch DDP (bench/peers/ddp_peer.cc).
// A new peer is its file, a line in MakePeer (peer.cc) and its name among --peer's values
// (options.cc).
//
// Owned by the driver. Thread-safety: none; the driver's thread.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bench/bench_util.h"
#include "bench/pushpull/options.h"
#include "bench/pushpull/raw_tcp_reference.h"
#include "bench/pushpull/repetitions.h"
#include "common/status.h"

namespace bitpush::bench::pushpull {

// What a peer's record is set against.
struct PeerComparison {
  int reps = 0;  // the passes that ran (the record's peer_reps)
  RawTcpFigures raw;
  // bitpush's none under security none over zmq, optimizer on the workers: the like-for-like
  // run (NaN when it did not run).
  double bitpush_none_gbps = NAN;
};

// What the side-by-side table shows of the peer's median run.
struct PeerSummary {
  std::string what = "none";  // the table's compressor column: what the peer sends
  double goodput_gbps = NAN;
  Spread spread;
  double iter_ms = NAN;
  double server_peak_rss_mb = NAN;
};

class Peer {
 public:
  virtual ~Peer() = default;

  // The records' `peer`, bitpush records' ratio_to_<name>, the tables' name ("pslite").
  virtual std::string name() const = 0;
  // Whether the peer can run here: OK, or why not. Called once, before anything runs; may
  // build what the peer needs.
  virtual Status Prepare() = 0;
  // What to do to make the peer runnable, said on stderr after Prepare's reason.
  virtual std::string HowTo() const = 0;
  // The text output's line when the peer did not run (`reason`: Prepare's message).
  virtual std::string NotRunLine(const std::string& reason) const = 0;

  // Runs the peer once with the benchmark's sizes; an error ends the benchmark.
  virtual Status RunOnce() = 0;
  // The runs completed so far.
  virtual size_t runs() const = 0;

  // The side-by-side table's title: what ran ("dmlc/ps-lite (DRIVER)").
  virtual std::string Title() const = 0;
  // Of the median run; runs() > 0.
  virtual PeerSummary Summary() const = 0;
  // The peer's record (after bitpush's); runs() > 0.
  virtual JsonRecord Record(const PeerComparison& cmp) const = 0;
};

// The peer --peer names; nullptr without --peer. tensor_bytes: bitpush's bytes per worker,
// all tensors (what the peer synchronises).
std::unique_ptr<Peer> MakePeer(const Options& opt, uint64_t tensor_bytes);

// bench/peers/pslite_peer.cc: dmlc/ps-lite through our driver (bench/peers/README.md).
std::unique_ptr<Peer> MakePslitePeer(const Options& opt, uint64_t tensor_bytes);

// bench/peers/ddp_peer.cc: PyTorch DDP's gradient exchange (gloo) through
// bench/peers/ddp_driver.py (bench/peers/README.md).
std::unique_ptr<Peer> MakeDdpPeer(const Options& opt);

}  // namespace bitpush::bench::pushpull
