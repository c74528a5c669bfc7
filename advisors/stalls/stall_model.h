// The figures periodic_stall and checkpoint both state, computed once so that the two never give
// different numbers for the same quantity in one epoch (docs/advice.md, "Shared figures"): what a
// recurring stall is and costs (its period, its time above the ordinary step, the slower steps
// after it), and the checkpoint interval that balances a checkpoint's cost against the work a
// failure loses (Young's interval).
// Pure functions of an EpochSummary; nothing here throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

struct OutlierStats;

// What the periodic stall is, from what its steps carry (the outliers section's shares).
struct StallNature {
  // checkpoint | host_copy | eval | log | data | own | other
  std::string kind = "other";
  bool data = false;    // most of the excess waits for data
  bool own = false;     // most of it is torchpilot's own time
  bool phased = false;  // most of it is in one marked phase (OutlierStats::phase)
  bool probed = false;  // the sync probe measured the stalls
  bool copies = false;  // ... and they copy >= 1 MB device-to-host each
};
StallNature stall_nature(const OutlierStats& o);

struct StallCost {
  int64_t period = 0;  // steps (the outliers section's, from this and earlier epochs)
  int64_t stalls = 0;  // this epoch's periodic stalls
  double median_step_s = 0;
  double host_stall_s = 0;  // the stalled steps' time above the median step
  bool gpu_timed = false;   // the step markers gave the stalls' GPU time
  double stall_s = 0;       // host_stall_s, at most the GPU's excess where gpu_timed
  int64_t tail_steps = 0;   // steps after each stall slower than the steps far from stalls
  double tail_s = 0;        // their time above those steps, all stalls
  double excess_s = 0;      // stall_s + tail_s: the time removing the stalls would give back
  double per_stall_s = 0;   // excess_s / stalls: one stall's cost
  double share = 0;         // excess_s / the epoch's wall time
  StallNature nature;
};
// nullopt without a period or a periodic stall this epoch.
std::optional<StallCost> periodic_stall_cost(const EpochSummary& s);

struct CheckpointPlan {
  int64_t failures = 0;
  double mtbf_s = 0;
  // One checkpoint's cost: the per-stall cost of a periodic stall that is a checkpoint (a
  // checkpoint-named phase, or megabytes copied to the host); kNotMeasured otherwise.
  double cost_s = kNotMeasured;
  int64_t period_steps = 0;  // that stall's period (0: no such stall)
  // Between checkpoints now: the journal's checkpoint interval, else that period x the median
  // step; kNotMeasured without either.
  double interval_s = kNotMeasured;
  double young_s = kNotMeasured;  // Young's interval sqrt(2 x cost x MTBF), where the cost is known
  // The interval to advise: Young's where the cost is known, else threshold x MTBF (half the
  // threshold lost to failures; the cost unknown).
  double target_s = 0;
};
// nullopt without failures in the run journal (no MTBF).
std::optional<CheckpointPlan> checkpoint_plan(const EpochSummary& s, double threshold);

}  // namespace torchpilot
