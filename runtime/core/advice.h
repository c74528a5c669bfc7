// What advisors say: a finding with the numbers behind it, what to change and what it should gain.
#pragma once

#include <string>
#include <vector>

namespace torchpilot {

enum class Severity { kInfo, kWarning, kHigh };
const char* to_string(Severity severity);

struct Evidence {
  std::string name;  // e.g. "data_wait_fraction"
  double value = 0;
  std::string unit;  // e.g. "fraction", "ms", "workers"
};

struct Advice {
  std::string id;  // stable identifier, e.g. "data_starvation"
  Severity severity = Severity::kInfo;
  int64_t epoch = 0;
  std::string finding;  // what was measured, in words
  std::string cause;    // the likely cause
  std::string action;   // what to change
  std::vector<Evidence> evidence;
  double expected_gain = 0;    // fractional throughput gain, e.g. 0.4 = +40%
  bool gain_estimated = true;  // true unless the gain was measured (e.g. by a tuning trial)
};

}  // namespace torchpilot
