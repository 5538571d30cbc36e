// How `bitpush-bench pushpull` reduces the repetitions of one run (--reps, --peer-reps) to one
// record: the run of median goodput, so that one record's fields belong to one cluster, with
// the spread of the goodputs beside it. Used alike for bitpush's runs and every peer's.
//
// Thread-safety: plain functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace bitpush::bench::pushpull {

// The index of the median of `goodputs` (the lower middle one for an even count). Not empty.
inline size_t MedianIndex(const std::vector<double>& goodputs) {
  std::vector<size_t> order(goodputs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return goodputs[a] < goodputs[b]; });
  return order[(order.size() - 1) / 2];
}

// goodput_min_gbps, goodput_max_gbps (NaN: no runs).
struct Spread {
  double min = NAN, max = NAN;
};

// Not empty.
inline Spread SpreadOf(const std::vector<double>& goodputs) {
  Spread s;
  s.min = *std::min_element(goodputs.begin(), goodputs.end());
  s.max = *std::max_element(goodputs.begin(), goodputs.end());
  return s;
}

}  // namespace bitpush::bench::pushpull
