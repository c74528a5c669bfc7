// Small helpers the benchmarks share.
#pragma once

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

// The median of `v`; NaN when empty (written as null in the JSON files).
inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Now in UTC, ISO 8601 ("2026-11-26T12:00:00Z"): the results files' "date".
// The next of a process's run folders under `dir` (dir/run1, dir/run2, ...) for
// report.trace_dir: every run's window has the same file name.
inline std::string next_run_folder(const std::string& dir) {
  static int runs = 0;
  return dir + "/run" + std::to_string(++runs);
}

inline std::string utc_date() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

// Writes `j` to `path`, indented; throws when the file cannot be written.
inline void write_json(const std::string& path, const nlohmann::json& j, int indent = 2) {
  std::ofstream out(path);
  out << j.dump(indent) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace bench
