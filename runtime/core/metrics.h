// Pure metric functions over records (docs/metrics.md defines each number). No I/O, no clocks.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

// part / whole, 0 when whole <= 0; clamped to [0, 1].
double fraction(Nanos part, Nanos whole);

// Median of a sample (copies it). 0 for an empty sample.
Nanos median(std::vector<Nanos> values);

// Standard error of the sample mean over the mean (stddev / sqrt(n) / mean): how well a window's
// mean is known. 0 for fewer than 2 values or a zero mean.
double relative_standard_error(const std::vector<Nanos>& values);

// Fixed-memory histogram of durations with ~4% wide log buckets, 1 µs .. ~21 h, for percentiles
// over an epoch of any length.
class DurationHistogram {
 public:
  void add(Nanos value);
  // Upper edge of the bucket holding the q-quantile (q in [0, 1]); 0 when empty.
  Nanos quantile(double q) const;
  int64_t count() const { return count_; }
  void clear();

 private:
  static constexpr int kBuckets = 640;
  std::array<int64_t, kBuckets> buckets_{};
  int64_t count_ = 0;
};

// Streams step records into an epoch summary; memory does not grow with the number of steps.
class EpochAccumulator {
 public:
  void add(const StepRecord& record);
  // The training thread's CPU time over the period, in the pieces it was read in (the Pilot reads
  // its CPU clock at some steps only: StepRecord::cpu_ns is partial). None: cpu_ns -1.
  void add_cpu(Nanos ns) { cpu_ns_ = std::max<Nanos>(0, cpu_ns_) + ns; }
  bool empty() const { return steps_ == 0; }
  // Summary of what was added; phase names by id come from the caller.
  EpochSummary summarize(int64_t epoch, const std::vector<std::string>& phase_names) const;
  void clear();

 private:
  int64_t steps_ = 0;
  int64_t first_step_ = 0;
  int64_t samples_ = 0;
  Nanos wall_ns_ = 0;
  Nanos data_wait_ns_ = 0;
  Nanos own_ns_ = 0;
  Nanos cpu_ns_ = -1;
  std::array<Nanos, kMaxPhases> phase_ns_{};
  std::array<DurationHistogram, kMaxPhases> phase_times_;  // in the steps each phase ran
  DurationHistogram step_times_;
  DurationHistogram compute_times_;  // step - data wait
  Nanos compute_min_ns_ = 0;         // their shortest (0: no step yet)
};

}  // namespace torchpilot
