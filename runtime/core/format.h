// Number formatting, JSON and small numeric helpers shared by the sinks, the sections' writers and
// the trial engine. Internal to runtime/ and advisors/ (nlohmann-json is a private dependency of
// the core).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/records.h"

namespace torchpilot::detail {

using nlohmann::json;

// One line of JSON; invalid UTF-8 (a Latin-1 path in an error message, say) is replaced rather
// than thrown, which would disable the sink for the rest of the run.
inline std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

inline double ms(Nanos ns) { return static_cast<double>(ns) / 1e6; }

// The median of the values; kNotMeasured when there are none.
inline double median(std::vector<double> v) {
  if (v.empty()) return kNotMeasured;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline std::string fmt_ms(Nanos ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", ms(ns));
  return buf;
}

inline std::string fmt_pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * f);
  return buf;
}

inline std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : "%.3g", v);
  return buf;
}

// NaN (not measured) is written as null.
inline json number(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

inline std::string fmt_opt_pct(double f) { return measured(f) ? fmt_pct(f) : std::string("n/a"); }

// The name of an enumerator, for an enum whose values run 0, 1, 2, ... in the order of `names`;
// `fallback` for a value outside them.
template <typename E, size_t N>
const char* enum_name(E value, const char* const (&names)[N], const char* fallback) {
  const auto i = static_cast<size_t>(value);
  return i < N ? names[i] : fallback;
}

}  // namespace torchpilot::detail
