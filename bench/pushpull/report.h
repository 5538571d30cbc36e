// The output of `bitpush-bench pushpull`: the table (text) or, with --json, a JSON array of
// records — one per run of the matrix (compressor x placement x security x transport, in that
// order; peer "bitpush"), then the peer's record when a peer ran. The field names, their order
// and the table's text are a contract (tests/bench/check_bench_json.py,
// bench/pushpull_targets.py, bench/emulated_network.py read them).
//
// The ratios: ratio_to_raw_tcp and ratio_to_raw_tcp_duplex against the run's raw TCP references
// (raw_tcp_reference.h); ratio_to_none = goodput / the none compressor's under the same security,
// transport and placement, when none is the first compressor; security_ratio = goodput / the same
// compressor's under security none; transport_ratio = goodput / the same compressor's over zmq
// (same security); with --peer, ratio_to_<peer> = goodput / the peer's median goodput (null
// when the peer did not run), and the peer's record has ratio_to_bitpush = its goodput /
// bitpush none's (security none). With --link-gbit, bitpush records end with
// line_rate_bound_ms and ratio_to_bound (line_rate.h: the round at line rate / iter_ms). Each
// figure is the run of median goodput of its repetitions (reps, goodput_min_gbps,
// goodput_max_gbps beside it), so the ratios compare medians.
//
// Thread-safety: a plain function writing stdout; the driver's thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/pushpull/cluster_run.h"
#include "bench/pushpull/link.h"
#include "bench/pushpull/options.h"
#include "bench/pushpull/peer.h"
#include "bench/pushpull/raw_tcp_reference.h"
#include "bench/pushpull/repetitions.h"

namespace bitpush::bench::pushpull {

// What a finished run reports. The pointers are to the driver's objects and not null, except
// `peer`.
struct RunReport {
  const Options* opt = nullptr;
  const NetPlan* net = nullptr;  // where the processes listened
  const Link* link = nullptr;    // what they listened across
  uint64_t tensor_bytes = 0;     // per worker, all tensors
  int reps = 0;                  // the passes that ran
  std::string ucx_lanes;         // UcxProbe's (the ucx records' ucx_tls)
  RawTcpFigures raw;
  // Per cell of the run matrix, in order: its median run and the spread of its goodputs.
  std::vector<ClusterResult> results;
  std::vector<Spread> spreads;
  const Peer* peer = nullptr;  // with --peer (whether it ran or not: peer->runs())
  std::string peer_missing;    // why the peer did not run
};

// The table, or the JSON array with --json, on stdout.
void PrintReport(const RunReport& report);

}  // namespace bitpush::bench::pushpull
