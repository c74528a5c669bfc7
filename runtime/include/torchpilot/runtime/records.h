// Vendor-neutral records: what a step, an epoch and a data loader look like to the rest of
// torchpilot. Hooks fill them; metrics, advisors and sinks read them. Plain values.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torchpilot/runtime/clock.h"
#include "torchpilot/runtime/flop_records.h"
#include "torchpilot/runtime/gpu_records.h"

namespace torchpilot {

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
  // FLOPs of the step (FLOP counter attached; NaN otherwise): counted in counting windows, the
  // cached count of the same shapes elsewhere. MFU/HFU need a known peak.
  double model_flops = kNotMeasured;
  double hardware_flops = kNotMeasured;
  double mfu = kNotMeasured;
  double hfu = kNotMeasured;
  Nanos step_ns() const { return end_ns - begin_ns; }
};

// Knob values of a data loader at one moment.
struct LoaderSettings {
  int workers = 0;               // worker threads; 0 = the training thread loads
  int prefetch = 2;              // batches in flight per worker (at least 1 when workers = 0)
  bool pin_memory = false;       // batches copied to page-locked memory by the workers
  bool device_prefetch = false;  // batches copied to the GPU on a side stream ahead of use
};

// Cumulative counters of a data loader; epoch figures are differences of two snapshots.
struct LoaderStats {
  std::string name;  // "tunable" or "watched"
  bool tunable = false;
  LoaderSettings settings;
  int max_workers = 0;  // CPUs this process may use
  bool pin_memory_available = false;
  bool device_prefetch_available = false;
  int64_t batches = 0;        // batches handed to the training loop
  int64_t produce_count = 0;  // batches produced (by workers or inline)
  Nanos produce_ns = 0;       // wall time spent producing them, summed over threads
  Nanos produce_cpu_ns = 0;   // CPU time of the producing threads meanwhile (I/O waits not)
  int64_t blocked_count = 0;  // next() calls that had to wait
  Nanos wait_ns = 0;          // total time next() blocked
};

struct PhaseTotal {
  std::string name;
  Nanos ns = 0;
};

struct EpochSummary {
  int64_t epoch = 0;
  int64_t steps = 0;
  int64_t first_step = 0;
  int64_t samples = 0;
  Nanos wall_ns = 0;  // sum of step times
  Nanos data_wait_ns = 0;
  double data_wait_fraction = 0;  // data_wait_ns / wall_ns
  Nanos step_p50_ns = 0;
  Nanos step_p90_ns = 0;
  double steps_per_s = 0;
  double samples_per_s = 0;  // 0 when samples are not reported
  std::vector<PhaseTotal> phases;
  int64_t tuning_steps = 0;  // steps of this epoch run under auto-tune trials (mixed settings)
  bool tuned = false;        // auto-tune has decided the knob settings (before this epoch ended)
  std::optional<LoaderStats> loader;    // this epoch's loader counters (differences)
  std::optional<GpuEpochStats> gpu;     // GPU collectors' figures (GPU present and enabled)
  std::optional<FlopEpochStats> flops;  // FLOP counter's figures (counter attached)
};

}  // namespace torchpilot
