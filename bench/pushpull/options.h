// The command line of `bitpush-bench pushpull`: its Options, parsed and checked once by
// ParseOptions, and PrintHelp. Every other piece of the benchmark reads the Options it is given
// and never the command line.
//
// Thread-safety: plain data; ParseOptions and PrintHelp are called once, from main's thread.
#pragma once

#include <string>
#include <vector>

#include "common/dtype.h"

namespace bitpush::bench::pushpull {

// The prefix of every message of the benchmark ("bitpush-bench pushpull: ...").
constexpr char kName[] = "bitpush-bench pushpull";

struct Options {
  bool json = false;
  int workers = 1;
  int servers = 1;
  double mb = 100;
  long long partition_kb = 4000;
  long long raw_partition_kb = 0;  // compression.raw_partition_bytes / 1024; 0 = auto
  std::vector<std::string> compressors;
  std::vector<std::string> securities;  // "none", "curve"; each compressor runs under each
  std::vector<std::string> transports;  // "zmq", "ucx"; each compressor runs over each
  // "on", "off": each run with the workers' engine non-finite check on / off (innermost).
  std::vector<std::string> non_finite_checks;
  // --timeline: "off", "all", "1/N": each run without the timeline, with every step traced, and
  // with one step in N traced (trace.steps "every N"); innermost. Empty: off only.
  std::vector<std::string> timelines;
  std::string ucx_tls;  // cluster.ucx.tls of the ucx clusters ("": UCX's choice)
  std::string error_feedback = "auto";
  long long min_compress_bytes = 1048576;
  int iters = 10;
  int warmup = 2;
  int tensors = 1;
  DType dtype = DType::kFloat32;  // of the workers' tensors
  int raw_reps = 5;
  int timeout_s = 300;
  bool keep_dir = false;
  double link_gbit = 0;    // 0: loopback; > 0: servers behind an emulated link of R Gbit/s
  std::string peer;        // "": bitpush only; "pslite": dmlc/ps-lite; "ddp": PyTorch DDP
  std::string pslite_dir;  // the ps-lite checkout holding our driver (bench/peers/README.md)
  // --peer ddp: what a DDP round runs (allreduce, ddp, fp16, powersgd; bench/peers/ddp_driver.py)
  // and the Python that has torch with gloo.
  std::string peer_variant;  // "" = allreduce
  std::string peer_python;   // "" = /usr/bin/python3
  int peer_reps = 3;         // alternations of the peer's and bitpush's clusters (medians reported)
  int reps = 1;              // without --peer: passes over all the runs (medians reported)
  // "worker", "server" (--server-side, --placement): where the optimizer runs; each compressor
  // runs once per placement.
  std::vector<std::string> placements;
  std::string optimizer;      // the optimizer's rule ("": adamw on the servers, none on workers)
  std::string pull = "auto";  // server placement: the weights' pull spec (auto: qWD for sdp4bit)
};

void PrintHelp();

// Parses argv[1..] into *o and fills the defaults of the lists. 0, or the exit status of a usage
// error (2; the message is on stderr). --help prints the help and exits 0.
int ParseOptions(int argc, char** argv, Options* o);

}  // namespace bitpush::bench::pushpull
