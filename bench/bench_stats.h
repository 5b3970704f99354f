// Statistics the benchmark programs share (no CUDA): the median of a
// sample, as every table in docs/PERF.md reports it.
#pragma once

#include <algorithm>
#include <vector>

namespace kplan::bench {

// The upper median (v[n / 2] after sorting); 0 for an empty sample.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace kplan::bench
