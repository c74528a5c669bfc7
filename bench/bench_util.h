// Small helpers the benchmarks share.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace bench {

// The median of `v`; NaN when empty (written as null in the JSON files).
inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace bench
