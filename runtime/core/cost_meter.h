// The kernel times its own calls on the training thread (step and phase boundaries with every
// collector's callbacks, the epoch's end); a cost meter keeps that time against a budget and
// writes the epoch's figure. The cost subsystem registers the meter (runtime/cost/cost.h: the
// budget, the "cost" section); without one, nothing is limited and no figure is written.
//
// Thread-safety: the Pilot calls its meter on the training thread only.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

class Collector;

class CostMeter {
 public:
  virtual ~CostMeter() = default;
  // A step begins at `now` (the first call starts the run's budget).
  virtual void step_begins(Nanos /*now*/) {}
  // The Pilot's calls at step and phase boundaries took `ns`, ending at `now`.
  virtual void spend_step_calls(Nanos /*now*/, Nanos /*ns*/) {}
  // Of those, `who`'s step-boundary callbacks took `ns`.
  virtual void step_part(const Collector* /*who*/, Nanos /*ns*/) {}
  // A collector's cost outside its callbacks (CollectorHost::charge_cost).
  virtual void charge_window(Nanos /*now*/, Nanos /*ns*/) {}
  // CollectorHost::cost_allows.
  virtual bool allows(Nanos /*now*/, Nanos /*estimate_ns*/) const { return true; }
  // Optional work was deferred; returns a line for the log (empty: nothing to say).
  virtual std::string deferred(Nanos /*now*/, const std::string& /*what*/, Nanos /*estimate_ns*/) {
    return {};
  }
  // torchpilot's time on the training thread in the open epoch so far.
  virtual Nanos epoch_cost_ns() const { return 0; }
  // The epoch's end, after the advisors: adds the meter's section to `summary`. `parts` are the
  // end's parts so far (collectors by name, "summary", "advisors"), `live` the collectors still
  // attached (a part of one dropped since is named "removed").
  virtual void summarize(EpochSummary& /*summary*/, Nanos /*began*/, Nanos /*now*/,
                         std::vector<std::pair<std::string, Nanos>> /*parts*/,
                         const std::vector<Collector*>& /*live*/) {}
  // The epoch's end finished at `done`; what ran after `cut` (sinks, flush) counts next epoch.
  virtual void epoch_end_finished(Nanos /*began*/, Nanos /*cut*/, Nanos /*done*/) {}
};

using CostMeterFactory = std::unique_ptr<CostMeter> (*)(const Config& config);
// The cost subsystem registers its meter at static initialization (the last one wins).
void register_cost_meter(CostMeterFactory factory);
CostMeterFactory cost_meter_factory();

}  // namespace torchpilot
