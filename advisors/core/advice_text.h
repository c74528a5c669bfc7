// Helpers the advisors share to phrase findings and estimate gains. Internal to advisors/.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>

namespace torchpilot::detail {

// `v` printed with a printf format for one double.
inline std::string num(double v, const char* format = "%.1f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// A fraction as a percentage with one decimal: 0.123 -> "12.3%".
inline std::string pct(double fraction) { return num(100 * fraction) + "%"; }

// A gain model's step before and after the change (seconds): "a 12.3 ms step becomes 10.1 ms".
inline std::string step_becomes(double step_s, double new_step_s) {
  return "a " + num(step_s * 1e3, "%.3g") + " ms step becomes " + num(new_step_s * 1e3, "%.3g") +
         " ms";
}

// The part of the step a change removes (seconds), its share and the advisor's threshold:
// "1.23 ms of a 12.3 ms step (10.0%; threshold 5.0%)".
inline std::string share_of_step(double part_s, double step_s, double share, double threshold) {
  return num(part_s * 1e3, "%.3g") + " ms of a " + num(step_s * 1e3, "%.3g") + " ms step (" +
         pct(share) + "; threshold " + pct(threshold) + ")";
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Throughput gain from removing `fraction` of the step time (a step of 1 becomes 1 - fraction),
// with the fraction capped at 0.99.
inline double gain_from_removing(double fraction) {
  fraction = std::clamp(fraction, 0.0, 0.99);
  return fraction / (1.0 - fraction);
}

}  // namespace torchpilot::detail
