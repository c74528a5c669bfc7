// The Pilot: torchpilot's in-process runtime. Create one per training process from a Config, mark
// steps and phases with scope objects, end epochs, read the advisory log.
//
//   torchpilot::Pilot pilot(torchpilot::Config::load());
//   for (auto& batch : loader) {                  // a TunableLoader attached to the pilot
//     auto step = pilot.step(batch_size);         // step boundary when `step` goes out of scope
//     { auto p = pilot.phase("forward"); ... }
//   }
//   pilot.end_epoch();                            // summary + advice (attached loaders call it
//   too)
//
// Step time is boundary to boundary: a step runs from the previous step's end to its own end, so
// the wait for its batch (before the scope opens) belongs to it.
//
// Thread-safety: step(), phase(), end_epoch() and the knob registry belong to one training thread.
// record_data_wait() may be called from any thread.
// Failure behaviour: the constructor throws (bad config, JSON file that cannot be opened). After
// that nothing throws: a failing sink is logged once and skipped, advisor errors are logged.
// Cost: a step scope is two clock reads and a ring-buffer write plus the sinks' on_step.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "torchpilot/runtime/advice.h"
#include "torchpilot/runtime/clock.h"
#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/knobs.h"
#include "torchpilot/runtime/metrics.h"
#include "torchpilot/runtime/observer.h"
#include "torchpilot/runtime/records.h"
#include "torchpilot/runtime/sink.h"
#include "torchpilot/runtime/tuning.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

class Pilot;

// Ends a step when destroyed (or at end()). Move-only.
class StepScope {
 public:
  StepScope(StepScope&& other) noexcept;
  StepScope& operator=(StepScope&&) = delete;
  StepScope(const StepScope&) = delete;
  ~StepScope() { end(); }
  void set_samples(int64_t samples);
  void end();

 private:
  friend class Pilot;
  StepScope(Pilot* pilot, int64_t step) : pilot_(pilot), step_(step) {}
  Pilot* pilot_;
  int64_t step_;  // the step this scope opened: if the Pilot closed it already, end() does nothing
};

// Adds its lifetime to a named phase of the current step. Move-only.
class PhaseScope {
 public:
  PhaseScope(PhaseScope&& other) noexcept;
  PhaseScope& operator=(PhaseScope&&) = delete;
  PhaseScope(const PhaseScope&) = delete;
  ~PhaseScope() { end(); }
  void end();

 private:
  friend class Pilot;
  PhaseScope(Pilot* pilot, int id, Nanos begin) : pilot_(pilot), id_(id), begin_(begin) {}
  Pilot* pilot_;
  int id_;
  Nanos begin_;
};

// What a data loader shows the Pilot. One loader is attached at a time: it is measured (waits,
// epoch counters) and, in autotune mode, tuned. The loader detaches itself when destroyed. The
// Pilot calls forget_pilot() when it is destroyed first or when another loader replaces this one;
// the loader must then stop reporting to it.
class LoaderProbe {
 public:
  virtual ~LoaderProbe() = default;
  virtual LoaderStats stats() const = 0;
  virtual void forget_pilot() = 0;
};

class GpuBackend;
class TrialEngine;
class GpuMonitor;

struct PilotOptions {
  std::shared_ptr<spdlog::logger> logger;    // advisory log; default: "torchpilot" on stderr
  std::shared_ptr<Clock> clock;              // default: the steady clock
  std::vector<std::shared_ptr<Sink>> sinks;  // in addition to the log and the JSON-lines file
  // Replaces this build's GPU backend (make_gpu_backend); tests pass a fake. Used when
  // gpu.enabled and the mode is not off.
  std::shared_ptr<GpuBackend> gpu_backend;
};

class Pilot {
 public:
  explicit Pilot(Config config = Config::load(), PilotOptions options = {});
  ~Pilot();
  Pilot(const Pilot&) = delete;
  Pilot& operator=(const Pilot&) = delete;

  Mode mode() const { return config_.mode; }
  const Config& config() const { return config_; }

  // Step and phase scopes. In mode off they do nothing.
  StepScope step(int64_t samples = 0);
  PhaseScope phase(std::string_view name);
  PhaseScope phase(int id);
  // Interns a phase name (kMaxPhases at most; beyond that -1 and the phase is not timed).
  int phase_id(std::string_view name);

  // Closes the epoch: summary, advice, sinks. Does nothing if no step ran since the last call.
  void end_epoch();

  void add_sink(std::shared_ptr<Sink> sink);
  void flush();

  // --- for hooks -------------------------------------------------------------------------------
  void record_data_wait(Nanos ns) {
    if (enabled_) pending_wait_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  // The loader's knobs join the registry (autotune tunes them); its stats go into epoch summaries.
  void attach_loader(LoaderProbe* probe, std::vector<Knob> knobs);
  void detach_loader(LoaderProbe* probe);
  KnobRegistry& knobs() { return knobs_; }
  // Observers (the FLOP counter; the GPU monitor is added by the Pilot itself) see every step
  // and epoch. An observer removes itself before it is destroyed; the Pilot calls forget_pilot()
  // on the ones left when it is destroyed.
  void add_observer(StepObserver* observer);
  void remove_observer(StepObserver* observer);
  // Per-step GPU figures, published late (after the step's samples arrived) to the sinks.
  void publish(const GpuStepRecord& record);
  // The GPU monitor, or null (mode off, gpu.enabled false, no GPU).
  GpuMonitor* gpu() { return gpu_monitor_.get(); }
  Clock& clock() { return *clock_; }
  const std::shared_ptr<Clock>& shared_clock() const { return clock_; }
  spdlog::logger& logger() { return *logger_; }
  // The advisory log without spdlog's headers: LibTorch translation units must not include them
  // (the PyTorch wheel ships its own fmt, which shadows the one spdlog was built with).
  enum class LogLevel { kDebug, kInfo, kWarn, kError };
  void log(LogLevel level, const std::string& message);

  // --- results, for programs and tests -----------------------------------------------------------
  int64_t steps() const { return next_step_; }
  int64_t epoch() const { return epoch_; }
  // The last `records.step_history` steps, oldest first.
  std::vector<StepRecord> recent_steps() const;
  const std::vector<EpochSummary>& epoch_summaries() const { return epoch_summaries_; }
  const std::vector<Advice>& last_advice() const { return last_advice_; }
  const std::optional<TuningDecision>& tuning_decision() const;
  bool tuning_finished() const;

 private:
  friend class StepScope;
  friend class PhaseScope;
  void end_step();
  void start_gpu(std::shared_ptr<GpuBackend> backend);
  bool owns_open_step(int64_t step) const { return step_open_ && next_step_ == step; }
  void end_phase(int id, Nanos begin);
  template <typename Fn>
  void for_each_sink(const char* what, Fn&& fn);

  Config config_;
  const bool enabled_;  // mode != off, fixed at construction (read from any thread)
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<spdlog::logger> logger_;
  std::vector<std::shared_ptr<Sink>> sinks_;
  std::vector<bool> sink_failed_;

  // Current step state (training thread).
  std::atomic<Nanos> pending_wait_ns_{0};
  bool step_open_ = false;
  int64_t open_step_samples_ = 0;
  Nanos step_begin_ns_ = 0;
  Nanos last_boundary_ns_ = -1;  // -1: no step yet in this epoch
  std::array<Nanos, kMaxPhases> phase_ns_{};
  std::vector<std::string> phase_names_;

  int64_t next_step_ = 0;
  int64_t epoch_ = 0;
  int64_t step_in_epoch_ = 0;
  int64_t epoch_tuning_steps_ = 0;
  std::vector<StepRecord> history_;  // ring buffer
  size_t history_next_ = 0;
  EpochAccumulator accumulator_;
  std::vector<EpochSummary> epoch_summaries_;
  std::vector<Advice> last_advice_;

  std::vector<StepObserver*> observers_;
  std::unique_ptr<GpuMonitor> gpu_monitor_;
  template <typename Fn>
  void for_each_observer(const char* what, Fn&& fn);
  void drop_observer(size_t index);

  KnobRegistry knobs_;
  LoaderProbe* loader_ = nullptr;
  LoaderStats loader_at_epoch_start_;
  std::unique_ptr<TrialEngine> engine_;
  bool warned_nothing_to_tune_ = false;
};

}  // namespace torchpilot
