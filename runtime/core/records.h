// Vendor-neutral records: what a step and an epoch look like to the rest of torchpilot. The Pilot
// fills the core fields; collectors add their figures as named step metrics and epoch sections
// (section.h). Metrics, advisors and sinks read them. Plain values.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/section.h"

namespace torchpilot {

// A figure that was not measured (JSON: null).
constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();
inline bool measured(double v) { return !std::isnan(v); }

// Named per-step figures that collectors add to a step record (e.g. flops.mfu), without heap
// allocation: names are string literals (static storage), at most kCapacity per step; more are
// dropped. JSON: {"<section>": {"<name>": value}}.
class StepMetrics {
 public:
  static constexpr int kCapacity = 16;
  struct Metric {
    const char* section;
    const char* name;
    double value;
  };
  // Slots past size() are never read, so neither built nor copied: a record is made and kept at
  // every step, and its untouched slots would be 6 of its 10 cache lines.
  StepMetrics() {}  // NOLINT(modernize-use-equals-default): items_ stays unwritten
  StepMetrics(const StepMetrics& other) : size_(other.size_) {
    std::copy_n(other.items_.data(), size_, items_.data());
  }
  StepMetrics& operator=(const StepMetrics& other) {
    size_ = other.size_;
    std::copy_n(other.items_.data(), size_, items_.data());
    return *this;
  }
  void set(const char* section, const char* name, double value) {
    for (int i = 0; i < size_; ++i) {
      // Callers pass the same literals every step: pointers first, text only when they differ.
      if ((items_[i].section == section && items_[i].name == name) ||
          (std::string_view(items_[i].section) == section &&
           std::string_view(items_[i].name) == name)) {
        items_[i].value = value;
        return;
      }
    }
    if (size_ < kCapacity) items_[size_++] = {section, name, value};
  }
  // NaN when absent.
  double get(std::string_view section, std::string_view name) const {
    for (int i = 0; i < size_; ++i) {
      if (section == items_[i].section && name == items_[i].name) return items_[i].value;
    }
    return kNotMeasured;
  }
  const Metric* begin() const { return items_.data(); }
  const Metric* end() const { return items_.data() + size_; }
  int size() const { return size_; }

 private:
  std::array<Metric, kCapacity> items_;
  int size_ = 0;
};

// Phases are interned to small ids (0..kMaxPhases-1) so a step record has no heap allocation.
constexpr int kMaxPhases = 16;

struct StepRecord {
  int64_t step = 0;  // global step number, from 0
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;  // from 0
  Nanos begin_ns = 0;         // previous step boundary (or the first wait of the epoch)
  Nanos end_ns = 0;           // this step's boundary
  Nanos data_wait_ns = 0;     // training thread blocked on the next batch, within [begin, end]
  int64_t samples = 0;        // samples in the step's batch, 0 if not reported
  std::array<Nanos, kMaxPhases> phase_ns{};  // time in each phase, by phase id
  Nanos own_ns = 0;        // torchpilot's own time on the training thread within [begin, end]
  Nanos cpu_ns = -1;       // the training thread's CPU time within the step (-1: not measured)
  bool at_period = false;  // the step sits at a recurring stall's period (step_outliers.h)
  // A collector asks the sync probe to time the next step's host syncs (item(), copies to the
  // host): set at a stall's period, or by the GPU monitor for ordinary steps after a window.
  bool probe_syncs = false;
  StepMetrics metrics;  // collectors' figures (the FLOP counter's flops.mfu, ...)
  Nanos step_ns() const { return end_ns - begin_ns; }
};

struct PhaseTotal {
  std::string name;
  Nanos ns = 0;
  // The steps in which it ran, and the median of its time in those: robust to a slow first step
  // and to a trace window's steps (CUPTI makes each launch dearer), which the total is not.
  int64_t steps = 0;
  Nanos p50_ns = 0;
};

// What closed a reporting period (to torchpilot an epoch is one; docs/records.md): the trainer
// (Pilot::end_epoch(), or a watched or tunable loader's pass ending), the Pilot itself after
// interval.* without an epoch end (interval.h), or the Pilot's destruction with steps pending.
enum class PeriodEnd { kEpoch, kInterval, kExit };
const char* to_string(PeriodEnd end);  // "epoch", "interval", "exit"

struct EpochSummary {
  int64_t epoch = 0;  // the period's number: epochs and intervals count on one sequence
  PeriodEnd closed_by = PeriodEnd::kEpoch;
  int64_t steps = 0;
  int64_t first_step = 0;
  int64_t samples = 0;
  Nanos wall_ns = 0;  // sum of step times
  Nanos data_wait_ns = 0;
  double data_wait_fraction = 0;  // data_wait_ns / wall_ns
  Nanos step_p50_ns = 0;
  Nanos step_p90_ns = 0;
  // Median of (step time - data wait) over the steps: the step's own work, robust to the first
  // steps' warm-up and to a trace window's cost (gain models: docs/advice.md).
  Nanos compute_p50_ns = 0;
  // The shortest (step time - data wait): the fastest the host issued a step (a step the host ran
  // ahead in, unblocked), a floor under any step a GPU-side change predicts (gain models).
  Nanos compute_min_ns = 0;
  double steps_per_s = 0;
  double samples_per_s = 0;  // 0 when samples are not reported
  Nanos own_ns = 0;          // torchpilot's own time on the training thread inside the steps
  Nanos cpu_ns = -1;         // the training thread's CPU time over the steps (-1: not measured)
  std::vector<PhaseTotal> phases;
  int64_t tuning_steps = 0;  // steps of this epoch run under auto-tune trials (mixed settings)
  bool tuned = false;        // auto-tune has decided the knob settings (before this epoch ended)
  // Collectors' parts, in collector order: the loader's counters for the epoch (LoaderStats),
  // the GPU figures (GpuEpochStats), the FLOP counts (FlopEpochStats), ... Read with
  // sections.get<T>().
  Sections sections;
};

}  // namespace torchpilot
