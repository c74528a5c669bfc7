// Step-time outliers and the stalls that recur (docs/metrics.md, "Outliers"): a step slower than
// outliers.factor x the median of recent steps is an outlier; outliers at an epoch's first steps
// are edge outliers (a loader restarting); the others, when they come every N steps, are a
// periodic stall (a checkpoint, an evaluation, logging that synchronizes). Where their excess
// time went is read from what every step carries: data wait, torchpilot's own time, the phases
// the trainer marks, and the training thread's CPU time (busy computing vs blocked).
//
// The Pilot runs one tracker: add() at each step end (before collectors see the step: the record
// says whether it sits at a known period), summarize() at each epoch end (the "outliers"
// section). Pure: no clocks, no I/O. Thread-safety: training thread only.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

// Its settings: keys outliers.*, registered by the stalls subsystem (stall_collector.cpp).
struct OutliersConfig {
  static constexpr const char* kSectionName = "outliers";
  double factor = 3.0;  // a step slower than this x the median of recent steps is an outlier
};

// The epoch summary's "outliers" section.
struct OutlierStats {
  static constexpr const char* kSectionName = "outliers";
  double factor = 0;        // outliers.factor
  Nanos median_ns = 0;      // the recent median the steps were judged against (at epoch end)
  int64_t count = 0;        // outliers this epoch
  int64_t edge_count = 0;   // ... of them at the epoch's first steps
  Nanos time_ns = 0;        // their step time
  Nanos excess_ns = 0;      // their time above the median
  double share = 0;         // time_ns / the epoch's step time
  double excess_share = 0;  // excess_ns / the epoch's step time
  // Recurrence, over this and earlier epochs (global step numbers).
  int64_t period = 0;            // every this many steps (0: none found)
  int64_t periodic_count = 0;    // outliers of this epoch at the period
  Nanos periodic_excess_ns = 0;  // their time above the median
  double periodic_share = 0;     // periodic_excess_ns / the epoch's step time
  // Where the periodic outliers' excess went (the others' when there is no period), against the
  // epoch's other steps: kNotMeasured where unknown.
  double data_wait_share = kNotMeasured;  // share of the excess that was data wait
  double own_share = kNotMeasured;        // ... torchpilot's own time
  std::string phase;                      // the marked phase that took most of it
  double phase_share = kNotMeasured;      // ... its share of the excess
  double cpu_share = kNotMeasured;  // the training thread's CPU time over the excess' wall time
  // The sync probe (hooks' torch_sync_probe.cpp) times the ops that wait for the GPU or copy to
  // the host in the steps around each periodic stall once a period is known.
  int64_t probed = 0;                // analysed outliers that were probed
  double sync_share = kNotMeasured;  // share of their excess in such ops (above ordinary steps)
  double syncs_per_stall = kNotMeasured;   // such ops per probed stall
  double d2h_mb_per_stall = kNotMeasured;  // MB copied device-to-host per probed stall
  // GPU time (step markers): the periodic outliers' GPU spans above the median GPU span of
  // ordinary steps, scaled to all of them from those with a span (the GPU's idle the stalls
  // caused: a host stall the queued work covered costs the GPU nothing). -1: no GPU spans.
  int64_t gpu_timed = 0;     // periodic outliers with a GPU span
  Nanos gpu_median_ns = -1;  // median GPU span of ordinary steps
  Nanos periodic_gpu_excess_ns = -1;
  // The stalls' cost does not stay in the stalled step (a save leaves the allocator, the page
  // cache and the GPU queue to recover): the steps after each periodic stall, by their distance
  // from it, against the steps far from any stall (more than kTailSteps or half the period
  // after one). The tail is the run of distances, from 1, whose mean step exceeds that baseline
  // by more than kTailMargin; its excess over the baseline, per stall, times the stalls.
  int64_t tail_steps = 0;             // the tail's length (0: none, or not measurable)
  Nanos tail_baseline_ns = -1;        // mean step far from the stalls (-1: too few steps)
  Nanos periodic_tail_excess_ns = 0;  // the tails' time above it, this epoch's stalls
  std::vector<int64_t> steps;         // the first outliers' step numbers (at most kListed)
  static constexpr size_t kListed = 16;
};
std::string section_json(const OutlierStats& outliers);
void section_text(const OutlierStats& outliers, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

class StallTracker {
 public:
  static constexpr size_t kHistory = 64;         // recent step times the median is over
  static constexpr size_t kMinHistory = 8;       // no judgement before this many steps
  static constexpr size_t kRefreshSteps = 8;     // the median is recomputed every this many steps
  static constexpr int64_t kEdgeSteps = 2;       // an epoch's first steps are its edge
  static constexpr size_t kRecentOutliers = 16;  // outlier starts kept for the period
  // The shortest period: slow steps every few steps are the step's own rhythm (a stock loader's
  // workers delivering in turn, gradient accumulation), not a stall that recurs; and the steps at
  // a period (one either side) get the sync probe, step markers and CPU-clock reads, which at a
  // period of 4 would be three steps in four. A period found where the recent slow steps' median
  // gap is under it too is such a rhythm (gaps that alternate, 8, 9, 8, ..., fill every 17).
  static constexpr int64_t kMinPeriod = 16;
  static constexpr size_t kMaxEpochOutliers = 4096;
  static constexpr int64_t kTailSteps = 64;    // the longest tail measured after a stall
  static constexpr double kTailMargin = 0.05;  // a tail step is this much above the baseline
  static constexpr int64_t kMinFarSteps = 8;   // steps far from stalls the baseline needs

  explicit StallTracker(double factor);

  // Judges a finished step (its time less torchpilot's own). Returns true for an outlier.
  bool add(const StepRecord& record);
  // The same step after the collectors added their metrics: the sync probe's figures (sync.*).
  void add_probe(const StepRecord& record);
  // A step's GPU span (the GPU monitor's late record, from its step markers), as it comes.
  void add_gpu_span(int64_t step, Nanos gpu_ns);
  // The spans are taken only while a period is known: a period found again starts afresh rather
  // than from spans of epochs ago.
  void clear_gpu_spans() {
    gpu_recent_.clear();
    gpu_next_ = 0;
  }
  // The step sits at the recurring period (one step either side): a slow step there is known.
  bool at_period(int64_t step) const;
  int64_t period() const { return period_; }
  Nanos median() const { return median_ns_; }
  // The epoch's section; clears the epoch's outliers and sums (the period and median stay).
  OutlierStats summarize(const EpochSummary& epoch, const std::vector<std::string>& phase_names);

 private:
  struct Step {
    int64_t step = 0, step_in_epoch = 0;
    Nanos step_ns = 0, data_wait_ns = 0, own_ns = 0, cpu_ns = -1;
    std::array<Nanos, kMaxPhases> phase_ns{};
    Nanos sync_ns = -1;  // the sync probe's figures (-1: not probed)
    Nanos gpu_ns = -1;   // its GPU span (-1: not known yet)
    double syncs = 0, d2h_bytes = 0;
  };
  void note_outlier_start(int64_t step);
  void note_tail(const StepRecord& r, Nanos ns, bool outlier);

  double factor_;
  std::vector<Nanos> recent_;
  size_t recent_next_ = 0;
  size_t since_refresh_ = 0;
  Nanos median_ns_ = 0;
  int64_t last_outlier_ = -2;        // the latest outlier's step (runs of outliers are one event)
  std::deque<int64_t> starts_;       // recent events' first steps (not at an epoch's edge)
  std::deque<int64_t> edge_starts_;  // recent events at an epoch's edge
  int64_t period_ = 0;
  int64_t anchor_ = 0;  // a step at the period
  // This epoch.
  std::vector<Step> outliers_;
  int64_t count_ = 0;
  Step sums_;  // every step's sums (step_ns, data wait, own, cpu, phases)
  int64_t steps_ = 0;
  int64_t cpu_steps_ = 0;  // steps whose CPU time was measured
  // Probed ordinary steps this epoch (the baseline the stalls' sync time is compared with).
  bool after_period_ = false;  // the last step was at the period
  int64_t probed_steps_ = 0;
  Nanos probed_sync_ns_ = 0;
  // The steps after periodic stalls (tail) and far from them (baseline), this epoch.
  int64_t since_stall_ = -1;  // steps since the latest periodic stall (-1: none yet)
  std::array<Nanos, kTailSteps + 1> after_ns_{};
  std::array<int64_t, kTailSteps + 1> after_count_{};
  Nanos far_ns_ = 0;
  int64_t far_count_ = 0;
  // Recent ordinary steps' GPU spans (a ring): their median is the GPU's ordinary step.
  std::vector<Nanos> gpu_recent_;
  size_t gpu_next_ = 0;
};

}  // namespace torchpilot
