// The raw TCP references of `bitpush-bench pushpull`, measured in the same run as the clusters
// and written into every record (the bitpush records and every peer's):
//   raw_tcp_gbps: the same bytes (one iteration's worth) streamed one way between two processes
//     over one TCP socket, in messages of one partition, each message read whole into a buffer
//     of its size (bench/raw_tcp.h);
//   raw_tcp_duplex_gbps: the per-direction throughput of the same socket carrying the same bytes
//     both ways at once (each end sends one iteration's bytes while it receives the other's:
//     bytes of one direction / wall time) — the fair reference for a push_pull, which moves the
//     bytes both ways at once, where both directions share the same CPUs (loopback).
// Each is the fastest of --raw-reps repetitions before and as many after the cluster runs (the
// median beside it). The socket crosses the run's link: the peer process joins the servers'
// network namespace when there is one and connects to the root side.
//
// Owned by the driver; started once before the clusters, stopped after them. Thread-safety:
// none; the driver's thread (RawDuplex runs a reader thread of its own inside one call).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/pushpull/link.h"
#include "bench/raw_tcp.h"
#include "common/status.h"

namespace bitpush::bench::pushpull {

// The figures of the references, GB/s (1e9 B/s).
struct RawTcpFigures {
  double best_gbps = 0;           // raw_tcp_gbps
  double median_gbps = 0;         // raw_tcp_median_gbps
  double duplex_best_gbps = 0;    // raw_tcp_duplex_gbps
  double duplex_median_gbps = 0;  // raw_tcp_duplex_median_gbps
};

// Adds the references and `goodput_gbps` against them to a record (raw_tcp_gbps,
// raw_tcp_median_gbps, ratio_to_raw_tcp, raw_tcp_duplex_gbps, raw_tcp_duplex_median_gbps,
// ratio_to_raw_tcp_duplex), then the link they crossed (link_gbit).
void AddRawTcpFields(JsonRecord& rec, const RawTcpFigures& raw, double goodput_gbps,
                     double link_gbit);

// A forked peer process serving RawPeer on one TCP connection: loopback, or across the
// emulated link (the peer joins the servers' namespace and connects to the root end).
class RawTcpReference {
 public:
  RawTcpReference() = default;
  RawTcpReference(const RawTcpReference&) = delete;
  RawTcpReference& operator=(const RawTcpReference&) = delete;
  ~RawTcpReference() { Stop(); }

  Status Start(const NetPlan& net);

  // Streams `total` bytes in messages of `message` bytes `reps` times, one way (kRawStream)
  // or both ways at once (kRawDuplex: `total` bytes each way; the throughput is one
  // direction's bytes / the exchange's wall time); keeps the fastest (unless `warmup`: then
  // only the side effects count: page faults, TCP window growth).
  Status Measure(uint64_t total, uint64_t message, int reps, bool warmup = false,
                 RawMode mode = kRawStream);
  // Both references, each with one warm-up first when `warmup`.
  Status MeasureBoth(uint64_t total, uint64_t message, int reps, bool warmup);

  RawTcpFigures Figures() const;

  void Stop();

 private:
  struct Series {
    double best = 0;
    std::vector<double> all;
    double Median() const;
  };
  pid_t pid_ = -1;
  int fd_ = -1;
  std::vector<uint8_t> src_, scratch_;
  Series stream_, duplex_;
};

}  // namespace bitpush::bench::pushpull
