// Reporting intervals: the Pilot reports per epoch, and a trainer that never ends one (a
// step-bounded or streaming loop, no loader, an endless dataset) would get no report. When the
// trainer has not ended an epoch for interval.seconds (or interval.steps steps), the Pilot closes
// the period itself as an "interval": everything an epoch's end runs (collectors, advisors,
// sinks, the journal, the trace-window schedule) runs alike, and its records say which it was
// (EpochSummary::closed_by). docs/configuration.md, "Epochs and intervals".
//
// Thread-safety: the Pilot's training thread. Cost: a few comparisons a step.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "torchpilot/runtime/core/clock.h"

namespace torchpilot {

struct IntervalConfig {
  static constexpr const char* kSectionName = "interval";
  // Close an interval once the current period has run this long without an epoch end (0: never
  // by time) ...
  double seconds = 60;
  // ... and has at least this many steps (a trace window fits in it; slow steps wait for them).
  int64_t min_steps = 50;
  // Or once it has this many steps, however long they took (0: never by count).
  int64_t steps = 0;
};

struct Config;

// Ranks of a data-parallel run must close intervals at the same steps (rank 0 gathers every rank's
// summary at each period's end), which their own clocks would not give: given this rank's proposed
// interval length in steps, the length every rank uses, or nullopt when the ranks could not agree
// (rank_exchange.h's make_interval_agreement).
using IntervalAgreement = std::function<std::optional<int64_t>(int64_t proposed_steps)>;

// The rule, read once from a Config.
class IntervalRule {
 public:
  IntervalRule() = default;
  explicit IntervalRule(const Config& config);
  // Does a period of `steps` steps that began at `begin_ns` end at `now_ns`, or is it time to ask
  // the ranks' agreement (then agree() before anything else)?
  bool due(int64_t steps, Nanos begin_ns, Nanos now_ns) const {
    if (steps_ > 0 && steps >= steps_) return true;
    if (agreed_steps_ != 0) return agreed_steps_ > 0 && steps >= agreed_steps_;
    if (seconds_ns_ <= 0 || steps < min_steps_) return false;
    return ask_ranks() || now_ns - begin_ns >= seconds_ns_;
  }
  // An agreement waits to be asked: this rank's proposal from the period's pace so far.
  bool ask_ranks() const { return agreement_ != nullptr && agreed_steps_ == 0; }
  int64_t proposal(int64_t steps, Nanos elapsed_ns) const;
  // The ranks' answer: the length in steps (nullopt: no intervals by time from here).
  void agreed(std::optional<int64_t> steps);
  void set_agreement(IntervalAgreement agreement) {
    agreement_ = std::move(agreement);
    agreed_steps_ = 0;
  }
  const IntervalAgreement& agreement() const { return agreement_; }
  double seconds() const { return static_cast<double>(seconds_ns_) / 1e9; }
  int64_t steps() const { return steps_; }
  int64_t agreed_steps() const { return agreed_steps_; }

 private:
  Nanos seconds_ns_ = 0;
  int64_t min_steps_ = 0;
  int64_t steps_ = 0;
  IntervalAgreement agreement_;
  // 0: not asked (or no agreement); > 0: intervals of this many steps; -1: the ranks could not
  // agree, no intervals by time.
  int64_t agreed_steps_ = 0;
};

}  // namespace torchpilot
