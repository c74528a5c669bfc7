// The toy subsystem: a whole feature added from its own folders only (docs/architecture.md,
// "Adding a subsystem"). It counts slow steps (a collector), has settings of its own (a config
// section, keys toy.*), advice about them (advisors.toy.*) and a panel in the HTML report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/records.h"

namespace toy {

// Keys toy.slow_ms and toy.enabled.
struct ToyConfig {
  static constexpr const char* kSectionName = "toy";
  double slow_ms = 50;  // a step slower than this counts as slow
  bool enabled = true;
};

// Keys advisors.toy.threshold: the advice id "toy" equals its section.
struct ToyAdvisorConfig {
  static constexpr const char* kSectionName = "advisors.toy";
  double threshold = 0.25;  // slow steps above this share of the epoch's steps get advice
};

// The epoch summary's "toy" section.
struct ToyStats {
  static constexpr const char* kSectionName = "toy";
  int64_t steps = 0;
  int64_t slow_steps = 0;
};
std::string section_json(const ToyStats& s);
void section_text(const ToyStats& s, const torchpilot::EpochSummary& epoch,
                  std::vector<std::string>& lines);

}  // namespace toy
