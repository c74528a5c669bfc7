// What torchpilot itself costs the run, and the budget it keeps (docs/metrics.md, "Cost").
//
// The Pilot times its own calls on the training thread (step and phase boundaries with every
// collector's callbacks, window starts and stops, the epoch's end with its waits, advisors and
// sinks) on its clock, and collectors charge what they cost outside those calls (a trace window's
// slower launches). CostBudget keeps that time over a sliding horizon against cost.budget of the
// run time; optional work (trace windows after the first) asks it first and is deferred when it
// would go over. torchpilot's own threads (PM decode, NVML, marker resolver, trace release)
// register here; their CPU time is reported beside the budget, not in it: it runs on other cores.
//
// Thread-safety: CostBudget and CostStats belong to the training thread. The own-thread registry
// may be used from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

// Spent time against cost.budget x the run time, over the last cost.horizon_s seconds (from the
// first step; shorter at the start, so a young run cannot spend a horizon's allowance at once).
class CostBudget {
 public:
  static constexpr int kBuckets = 64;  // the horizon in this many slices

  explicit CostBudget(const CostConfig& config);
  // The run starts (first step); before that nothing is allowed that costs anything.
  void start(Nanos now);
  bool started() const { return start_ns_ >= 0; }
  void spend(Nanos now, Nanos ns);
  // Spent over the horizon (up to `now`).
  Nanos spent(Nanos now) const;
  // What the budget allows over the horizon at `now`: budget x min(run time, horizon).
  Nanos allowance(Nanos now) const;
  // Would spending `estimate` more now keep the horizon within the budget?
  bool allows(Nanos now, Nanos estimate) const;
  // spent / min(run time, horizon); 0 before the start.
  double horizon_fraction(Nanos now) const;
  double budget() const { return config_.budget; }
  double horizon_s() const { return config_.horizon_s; }
  // The span the budget is counted over at `now`: min(run time, horizon), in seconds.
  double span_s(Nanos now) const;

 private:
  struct Bucket {
    int64_t index = -1;  // slice number since the start
    Nanos ns = 0;
  };
  int64_t slice(Nanos now) const;
  CostConfig config_;
  Nanos slice_ns_ = 1;
  Nanos start_ns_ = -1;
  std::vector<Bucket> buckets_;
};

// The epoch summary's "cost" section: what torchpilot cost in this epoch.
struct CostStats {
  static constexpr const char* kSectionName = "cost";
  Nanos step_calls_ns = 0;        // training thread inside step/phase calls (collectors included)
  Nanos epoch_end_ns = 0;         // the epoch's end (collectors, waits, advisors) and the previous
                                  // epoch end's log and record writing
  Nanos window_ns = 0;            // trace windows' slowdown of the trainer's own work (charged)
  Nanos training_thread_ns = 0;   // the three above
  Nanos epoch_ns = 0;             // the epoch's step time plus its end's work
  double fraction = 0;            // training_thread_ns / epoch_ns
  double horizon_fraction = 0;    // over the budget's horizon, at the epoch's end
  double budget = 0;              // cost.budget
  double horizon_s = 0;           // cost.horizon_s (shorter while the run is younger)
  int64_t deferred = 0;           // optional work deferred or skipped for the budget this epoch
  Nanos own_threads_cpu_ns = -1;  // CPU time of torchpilot's threads this epoch (-1: unknown)
  // Where epoch_end_ns went: each collector by name ("gpu": its wait for the GPU and flush),
  // "summary", "advisors", "log" (the previous epoch end's sinks), largest first.
  std::vector<std::pair<std::string, Nanos>> epoch_end_parts;
  // Where step_calls_ns went: each collector's step-boundary calls by name, "pilot" the rest
  // (the Pilot's own bookkeeping and the sinks' per-step calls), largest first.
  std::vector<std::pair<std::string, Nanos>> step_parts;
};
std::string section_json(const CostStats& cost);
void section_text(const CostStats& cost, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

// Registers the calling thread as one of torchpilot's own until the thread exits (its CPU time
// then moves to a retired total). Idempotent per thread.
void register_own_thread();
// CPU time of every own thread since the process started (live ones read now, exited ones kept).
Nanos own_threads_cpu_ns();

}  // namespace torchpilot
