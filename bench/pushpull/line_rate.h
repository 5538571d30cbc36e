// The line-rate bound of a round: the time the busiest link of a round needs at the link's
// rate (--link-gbit R Gbit/s each way), so that a record can say how close a round came to it
// (line_rate_bound_ms, ratio_to_bound = line_rate_bound_ms / the measured round: 1 = at line
// rate). Each direction of a link is counted separately (a full-duplex link carries R each way),
// and the bound is that of the busier direction.
//
//   A parameter server round (bitpush): each worker pushes push_bytes and pulls pull_bytes; each
//   server receives its share of all W workers' pushes and sends its share of their pulls.
//   With a link per node, a worker's link carries push_bytes up and pull_bytes down, a server's
//   W x push_bytes / S down and W x pull_bytes / S up: the busiest carries max(push_bytes,
//   W x push_bytes / S) one way or max(pull_bytes, W x pull_bytes / S) the other. Behind
//   `--link-gbit` (bench/pushpull/emulated_link.cc) all S servers sit behind ONE link from the
//   root side, which carries W x push_bytes one way and W x pull_bytes the other.
//   A ring all-reduce (DDP over gloo): each of W workers sends and receives 2 (W - 1) / W of
//   the all-reduced bytes (reduce-scatter, then all-gather), a link per node.
//
// Plain functions; 0 bytes, or no rate (link_gbit <= 0): NaN (no bound).
#pragma once

#include <algorithm>
#include <cmath>

namespace bitpush::bench::pushpull {

// Milliseconds to move `bytes` at `link_gbit` Gbit/s (NaN without a rate).
inline double LineRateMs(double bytes, double link_gbit) {
  if (!(link_gbit > 0) || !(bytes > 0)) return NAN;
  return bytes * 8 / (link_gbit * 1e9) * 1e3;
}

// A parameter server round; `shared_server_link`: all servers behind one link (--link-gbit).
inline double PushPullBoundMs(double push_bytes, double pull_bytes, int workers, int servers,
                              bool shared_server_link, double link_gbit) {
  const double w = workers, s = servers;
  const double up = shared_server_link ? w * push_bytes : std::max(push_bytes, w * push_bytes / s);
  const double down =
      shared_server_link ? w * pull_bytes : std::max(pull_bytes, w * pull_bytes / s);
  return LineRateMs(std::max(up, down), link_gbit);
}

// A ring all-reduce of `allreduce_bytes` per worker over a link per node.
inline double RingAllreduceBoundMs(double allreduce_bytes, int workers, double link_gbit) {
  const double w = workers;
  return LineRateMs(2 * (w - 1) / w * allreduce_bytes, link_gbit);
}

}  // namespace bitpush::bench::pushpull
