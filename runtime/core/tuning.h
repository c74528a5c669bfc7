// Auto-tune's vocabulary: what a trial measured, what the search decided, and the policy that
// proposes settings. Plain values shared by the trial engine, the policies, advisors and sinks
// (none of which needs the engine itself).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/knobs.h"
#include "torchpilot/runtime/core/logging.h"
#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

struct TrialResult {
  Setting setting;
  int64_t first_step = 0;  // first measured step
  int64_t last_step = 0;
  Nanos mean_step_ns = 0;         // mean of the measured steps (bursty arrivals make medians lie)
  double relative_error = 0;      // standard error of that mean, relative
  double throughput = 0;          // samples / time over the window (steps/s without samples)
  std::string unit;               // "samples/s" or "steps/s"
  double data_wait_fraction = 0;  // data wait / time over the window
  // What the producer (the loader's workers) can sustain in the same unit, measured in the window:
  // parallelism / mean production time per unit; 0 when not measurable. A window whose steps are
  // fed from a backlog built under an earlier setting looks faster than the setting can sustain,
  // so the throughput is capped at this capacity.
  double supply_capacity = 0;
  bool supply_limited = false;  // the cap applied
  double demand = 0;            // the window's throughput before the cap
  // The most device memory tensors held at once while the setting ran (its settle steps and its
  // window), from the allocator's own peak, as a share of the device's capacity; -1 when unknown
  // (the CPU, no memory probe, the allocator's statistics unavailable). A trial above
  // autotune.memory_headroom fails.
  double peak_memory_fraction = -1;
  int64_t peak_memory_bytes = -1;
  bool failed = false;
  std::string note;  // why it failed
  // A re-measurement of a finalist after the search (the trial engine's confirmation), not a new
  // setting: it never becomes the incumbent on its own.
  bool confirmation = false;
};

struct TuningDecision {
  std::string policy;
  Setting baseline;  // what the run started with
  Setting chosen;    // what it runs with now
  double baseline_throughput = 0;
  double chosen_throughput = 0;
  std::string unit;  // "samples/s" or "steps/s"
  int64_t decided_at_step = 0;
  int64_t steps_used = 0;           // steps from the first trial step to the decision
  std::string reason;               // why the search ended
  std::vector<TrialResult> trials;  // trials[0] is the baseline
};

// A trial's measured window as the ranks of a data-parallel run exchange it: every rank runs the
// same trials over the same steps, and all take the same decision from the combined windows.
struct TrialWindow {
  int64_t trial = 0;  // index in the trial list (0: the baseline)
  int64_t round = 0;  // 0, then 1, 2, ... when the window was extended to reach min_window_ms
  int64_t first_step = 0;
  int64_t last_step = 0;
  double throughput = 0;
  double demand = 0;
  double supply_capacity = 0;
  bool supply_limited = false;
  Nanos mean_step_ns = 0;
  double relative_error = 0;
  double data_wait_fraction = 0;
  Nanos window_ns = 0;   // the window's summed step time
  Nanos elapsed_ns = 0;  // from the first trial step to the window's end (the time budget)
  double peak_memory_fraction = -1;  // -1: unknown; combined: the largest of the ranks'
  int64_t peak_memory_bytes = -1;
  bool failed = false;
  std::string note;
};
// Given this rank's window, the combination of every rank's (the same on every rank), or nullopt
// when some rank did not answer in time: the search then ends with the starting settings.
using TrialAgreement = std::function<std::optional<TrialWindow>(const TrialWindow& mine)>;

// The device memory a trial used, as a hook reads it from the allocator (hooks/: the CUDA caching
// allocator's peak of allocated bytes). reset() starts a trial's peak; read() gives the peak since
// then, or nullopt when the figures are missing (the trial is then judged by throughput alone).
struct MemoryPeak {
  int64_t peak_allocated_bytes = 0;
  int64_t capacity_bytes = 0;
};
struct MemoryProbe {
  std::function<void()> reset;
  std::function<std::optional<MemoryPeak>()> read;
  explicit operator bool() const { return reset && read; }
};

class TuningPolicy {
 public:
  virtual ~TuningPolicy() = default;
  virtual std::string name() const = 0;
  // The next setting to try, given every trial so far (trials[0] is the baseline) and which one is
  // the incumbent; nullopt ends the search.
  virtual std::optional<Setting> propose(const std::vector<TrialResult>& trials, size_t incumbent,
                                         const KnobRegistry& knobs) = 0;
  // Steps to settle after changing `from` to `to`, beyond the configured settle steps: a change
  // whose first steps pay a one-off cost (e.g. new pinned buffers) would otherwise be measured
  // with it.
  virtual int extra_settle_steps(const Setting& /*from*/, const Setting& /*to*/) const { return 0; }
};

// What producing the run's batches took so far (the attached loader's counters): the tuner
// bounds a setting's throughput by it.
struct SupplySample {
  int64_t units = 0;    // work units produced (one per step)
  Nanos busy_ns = 0;    // producing time summed over producers
  int parallelism = 0;  // producers running in parallel (0: the training thread produces)
};

// What a tuner may use of the Pilot that drives it.
class TunerHost {
 public:
  virtual ~TunerHost() = default;
  virtual const Config& config() const = 0;
  virtual KnobRegistry& knobs() = 0;
  virtual void log(LogLevel level, const std::string& message) = 0;
  virtual SupplySample supply() = 0;
  // Sent to every sink (on_trial, on_decision).
  virtual void publish_trial(const TrialResult& trial, bool kept) = 0;
  virtual void publish_decision(const TuningDecision& decision) = 0;
};

// The run's auto-tuning in mode autotune (the tune subsystem implements it and registers a
// factory; the Pilot forwards its tuning calls here). Training thread only; anything it throws
// stops tuning (the Pilot then calls abandon() and goes on in mode advise).
class Tuner {
 public:
  virtual ~Tuner() = default;
  // A step ended and the sinks have it.
  virtual void on_step(const StepRecord& record) = 0;
  virtual bool finished() const = 0;
  virtual const std::optional<TuningDecision>& decision() const = 0;
  // Stops the search, the best setting so far applied.
  virtual void abandon(const std::string& reason) = 0;
  // The running trial's setting failed in a step; false when no trial is running.
  virtual bool fail_trial(const std::string& reason) = 0;
  virtual void set_memory_probe(MemoryProbe probe) = 0;
  virtual void set_agreement(TrialAgreement agreement) = 0;
  // The knobs changed (another loader was attached): a search in progress starts afresh; a
  // decided setting is applied to the new knobs.
  virtual void knobs_changed() = 0;
};
using TunerFactory = std::unique_ptr<Tuner> (*)(TunerHost& host);
// Thread-safe; called at static initialization by the tune subsystem (the last one registered
// wins).
void register_tuner(TunerFactory factory);
TunerFactory tuner_factory();

}  // namespace torchpilot
