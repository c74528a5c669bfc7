// The run's findings, as the HTML report leads with them (docs/reports.md, "What to fix first"):
// the advice of every epoch deduplicated (by advice id, and the subject where an advice names
// one) and ranked by expected gain, each with its trend over the epochs that gave it and whether
// auto-tune has since answered it. A pure function of the records, so it is tested without a
// browser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {

// One epoch's figures of a finding.
struct FindingPoint {
  int64_t epoch = 0;
  double gain = 0;    // Advice::expected_gain (0: not estimated)
  double figure = 0;  // its first evidence value (the measured figure the finding is about)
};

struct Finding {
  std::string id;
  std::string subject;  // what it is about where the advice names one (e.g. "rank 3"), else ""
  Advice latest;        // its latest epoch's advice: finding, cause, action, gain
  std::vector<FindingPoint> trend;  // one per epoch that gave it, in epoch order
  // The auto-tune decision's setting of the knobs this advice is about ("loader.workers=4
  // loader.prefetch=2"), "" when the tuner decided none of them.
  std::string tuned_setting;
};

struct Findings {
  // Given in the run's last epoch and not answered: by expected gain, largest first (ties: the
  // higher severity, then id and subject). ranked[0] is what to fix first.
  std::vector<Finding> ranked;
  // Auto-tune decided the advice's knobs and no epoch that began after the decision gave it.
  std::vector<Finding> answered;
  // Neither: given in earlier epochs only, the most recently given first.
  std::vector<Finding> earlier;
};

// `advice[i]` is the advice of `epochs[i]`; `decision` is null before auto-tune decided.
Findings rank_findings(const std::vector<EpochSummary>& epochs,
                       const std::vector<std::vector<Advice>>& advice,
                       const TuningDecision* decision);

}  // namespace torchpilot
