// bitpush-bench pushpull: compressed push_pull end to end with the real processes on loopback
// (zmq tcp, 127.0.0.1, free ports) or across an emulated link, against a raw TCP stream of the
// same bytes measured in the same run, and optionally side by side with another parameter
// server (a peer) in the same invocation.
//
// This file is the command (its entry points) and the run matrix: per compressor given
// (`--compressor none,onebit`, or the flag repeated), one cluster per optimizer placement
// (--placement), security mode (--security) and transport (--transport), in that nesting, so
// that the runs a ratio compares are adjacent. --reps R: R passes over all the runs (odd passes
// in reverse order, so a run's place in a pass weighs on every run alike); with a
// peer, --peer-reps R alternations of the peer's run and all of bitpush's (the peer first on
// even passes, last on odd ones), so that drift of the shared machine hits all alike. Each
// record is the run of median goodput of its R (bench/pushpull/repetitions.h).
//
// The pieces, in bench/pushpull/ (each header says what it owns):
//   options.h            the command line (Options, ParseOptions, PrintHelp)
//   cluster_run.h        one bitpush cluster: YAML, processes, timings (ClusterRun)
//   link.h               the network between the root side and the servers: loopback (link.cc),
//                        the emulated --link-gbit link (emulated_link.cc); one file per kind
//   raw_tcp_reference.h  the raw TCP references every record carries
//   peer.h               a system run side by side (--peer); one file per peer
//                        (bench/peers/pslite_peer.cc, bench/peers/ddp_peer.cc)
//   line_rate.h          the line-rate bound of a round (--link-gbit)
//   curve_keys.h         --security curve: the nodes' keys
//   ucx_probe.h          --transport ucx: what UCX chooses (ucx_tls)
//   signal_cleanup.h     what an interrupted run removes (the link, the keys)
//   report.h             the table and the JSON records
//
// --security none,curve: under curve the YAML has security.mode curve and keys_dir = a private
// temporary directory holding a key pair per node (curve_keys.h), shared by the curve clusters;
// $BITPUSH_KEYS_DIR, $BITPUSH_KEY_FILE and $CREDENTIALS_DIRECTORY are cleared for the children
// so that those keys are the ones used.
//
// Exit status: 0; 1 when a run fails (the failure names the process and shows its output's
// tail); 2 on a usage error.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/pushpull/cluster_run.h"
#include "bench/pushpull/curve_keys.h"
#include "bench/pushpull/link.h"
#include "bench/pushpull/options.h"
#include "bench/pushpull/peer.h"
#include "bench/pushpull/raw_tcp_reference.h"
#include "bench/pushpull/repetitions.h"
#include "bench/pushpull/report.h"
#include "bench/pushpull/ucx_probe.h"
#include "bench/pushpull_worker.h"
#include "common/security/keys.h"
#include "compressors/registry.h"
#include "config/cluster_config.h"
#include "config/node_security.h"

namespace bitpush::bench {
namespace pushpull {
namespace {

constexpr double kMiB = 1 << 20;

int Fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}

// auto: error feedback where the compressor is biased (paper 001: both).
StatusOr<std::string> ErrorFeedbackFor(const std::string& spec, const std::string& requested) {
  BP_ASSIGN_OR_RETURN(v1::CompressorConfig c, compressors::ParseCompressorSpec(spec));
  if (requested != "auto") return requested;
  return std::string(
      compressors::ErrorFeedbackPolicyName(compressors::RecommendedErrorFeedback(c)));
}

// The run matrix into *runs: 0, or the exit status of an error (said on stderr).
int PlanRuns(const Options& opt, std::vector<RunSpec>* runs) {
  // Per compressor, one per security mode and transport (adjacent: fair ratios).
  for (const std::string& spec : opt.compressors) {
    StatusOr<std::string> ef = ErrorFeedbackFor(spec, opt.error_feedback);
    if (!ef.ok()) return Fail("--compressor '" + spec + "': " + ef.status().message());
    // The config validator's verdict before anything starts (e.g. unbiased random-k with
    // error feedback is refused): a usage error.
    const std::string yaml =
        "cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n"
        "  workers: [127.0.0.1:3]\ncompression:\n  spec: \"" +
        spec + "\"\n  error_feedback: " + *ef + "\n";
    if (StatusOr<config::ClusterConfig> c = config::ParseClusterConfig(yaml, "--compressor");
        !c.ok()) {
      std::fprintf(stderr, "%s: %s\n", kName, c.status().message().c_str());
      return 2;
    }
    for (const std::string& placement : opt.placements) {
      for (const std::string& security : opt.securities) {
        for (const std::string& transport : opt.transports) {
          for (const std::string& check : opt.non_finite_checks) {
            for (const std::string& timeline : opt.timelines) {
              runs->push_back({spec, *ef, security, transport, placement, check == "on", timeline});
            }
          }
        }
      }
    }
  }
  return 0;
}

int RunDriver(const Options& opt) {
  StatusOr<ClusterPrograms> programs = FindClusterPrograms();
  if (!programs.ok()) return Fail(programs.status().message());
  std::vector<RunSpec> runs;
  if (int rc = PlanRuns(opt, &runs)) return rc;
  // The keys of the curve clusters are the ones in their YAML, whatever this environment says.
  for (const char* var : {"BITPUSH_KEYS_DIR", "BITPUSH_KEY_FILE", "CREDENTIALS_DIRECTORY"}) {
    unsetenv(var);
  }
  CurveKeys keys;
  if (std::find(opt.securities.begin(), opt.securities.end(), "curve") != opt.securities.end()) {
    if (Status s = keys.Create(opt.servers, opt.workers); !s.ok()) return Fail(s.ToString());
  }

  const uint64_t tensor_bytes =
      static_cast<uint64_t>(std::llround(opt.mb / opt.tensors * kMiB / 4)) * 4 * opt.tensors;
  const uint64_t message = static_cast<uint64_t>(opt.partition_kb) * 1024;

  // --peer: the peer, or why it cannot run (then bitpush runs alone).
  std::unique_ptr<Peer> peer = MakePeer(opt, tensor_bytes);
  bool peer_runs = false;
  std::string peer_missing;
  if (peer != nullptr) {
    if (Status s = peer->Prepare(); s.ok()) {
      peer_runs = true;
    } else {
      peer_missing = s.message();
      std::fprintf(stderr, "%s: --peer %s: %s\n%s: %s\n%s: running bitpush alone\n", kName,
                   peer->name().c_str(), peer_missing.c_str(), kName, peer->HowTo().c_str(), kName);
    }
  }

  NetPlan net;
  // Declared before everything that runs across it: removed last.
  const std::unique_ptr<Link> link = MakeLink(opt);
  if (Status s = link->Create(&net); !s.ok()) return Fail(s.ToString());
  UcxProbe ucx_probe;
  if (std::find(opt.transports.begin(), opt.transports.end(), "ucx") != opt.transports.end()) {
    if (Status s = ucx_probe.Run(opt.ucx_tls, net); !s.ok()) {
      return Fail("--transport ucx: " + s.ToString());
    }
  }
  RawTcpReference raw;
  if (Status s = raw.Start(net); !s.ok()) return Fail(s.ToString());
  // Per reference (one way, both ways) one warm-up (page faults, TCP window growth), then the
  // measured repetitions; as many again after the clusters.
  if (Status s = raw.MeasureBoth(tensor_bytes, message, opt.raw_reps, /*warmup=*/true); !s.ok()) {
    return Fail(s.ToString());
  }

  // With a peer: R alternations of one peer run and the bitpush runs; otherwise --reps passes
  // over the bitpush runs.
  const int reps = peer_runs ? opt.peer_reps : opt.reps;
  std::vector<std::vector<ClusterResult>> runs_of(runs.size());  // per RunSpec, one per rep
  for (int rep = 0; rep < reps; ++rep) {
    const bool peer_first = rep % 2 == 0;
    if (peer_runs && peer_first) {
      if (Status s = peer->RunOnce(); !s.ok()) return Fail(s.ToString());
    }
    for (size_t k = 0; k < runs.size(); ++k) {
      // Odd passes run the matrix backwards: a run's place in a pass (after which cluster,
      // how long since the last start) costs some runs a few percent, and this cancels it.
      const size_t i = rep % 2 == 0 ? k : runs.size() - 1 - k;
      const RunSpec& spec = runs[i];
      ClusterRun run(opt, net, spec, keys.Dir(), *programs);
      StatusOr<ClusterResult> r = run.Run();
      if (!r.ok()) {
        return Fail(spec.spec + " (security " + spec.security + ", transport " + spec.transport +
                    ", optimizer on the " + spec.placement + "s): " + r.status().ToString());
      }
      runs_of[i].push_back(*r);
    }
    if (peer_runs && !peer_first) {
      if (Status s = peer->RunOnce(); !s.ok()) return Fail(s.ToString());
    }
  }
  keys.Remove();

  RunReport report;
  report.opt = &opt;
  report.net = &net;
  report.link = link.get();
  report.tensor_bytes = tensor_bytes;
  report.reps = reps;
  report.ucx_lanes = ucx_probe.lanes;
  report.peer = peer.get();
  report.peer_missing = peer_missing;
  // Each run's figures are those of its median-goodput repetition, so that one record's fields
  // belong to one cluster.
  for (const std::vector<ClusterResult>& all : runs_of) {
    std::vector<double> g;
    g.reserve(all.size());
    for (const ClusterResult& r : all) g.push_back(r.goodput_gbps);
    report.results.push_back(all[MedianIndex(g)]);
    report.spreads.push_back(SpreadOf(g));
  }
  if (Status s = raw.MeasureBoth(tensor_bytes, message, opt.raw_reps, /*warmup=*/false); !s.ok()) {
    return Fail(s.ToString());
  }
  raw.Stop();
  link->Remove();
  report.raw = raw.Figures();
  PrintReport(report);
  return 0;
}

}  // namespace
}  // namespace pushpull

int RunPushPullBench(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a peer that dies shows up as a failed write, not a signal
  pushpull::Options opt;
  if (int rc = pushpull::ParseOptions(argc, argv, &opt)) return rc;
  return pushpull::RunDriver(opt);
}

int RunPushPullWorkerMode(int argc, char** argv) {
  return RunPushPullWorker("bitpush-bench pushpull-worker", argc, argv);
}

// `bitpush-bench pushpull-keygen CLUSTER.yaml DIR` (hidden; bench/emulated_network.py
// --security curve): a key pair per node of the YAML's cluster and its public_keys, written into
// DIR (created 0700 if missing; existing key files are kept). Exit 0, 1 on an error, 2 usage.
int RunPushPullKeygenMode(int argc, char** argv) {
  constexpr char kProgram[] = "bitpush-bench pushpull-keygen";
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CLUSTER.yaml DIR\n", kProgram);
    return 2;
  }
  StatusOr<config::ClusterConfig> c = config::LoadClusterConfig(argv[1]);
  if (!c.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, c.status().message().c_str());
    return 2;
  }
  StatusOr<std::vector<std::string>> written =
      security::WriteClusterKeys(argv[2], config::ClusterNodeNames(*c), /*overwrite=*/false);
  if (!written.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, written.status().ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace bitpush::bench
