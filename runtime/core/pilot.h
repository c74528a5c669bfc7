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
// An epoch is a reporting period: the trainer ends it (end_epoch(), or an attached loader's loop
// ending); when it does not for interval.seconds, the Pilot closes an "interval" itself.
//
// Thread-safety: step(), phase(), end_epoch() and the knob registry belong to one training thread.
// record_data_wait() may be called from any thread.
// Failure behaviour: the constructor throws (bad config, JSON file that cannot be opened). After
// that nothing throws: a failing sink is logged once and skipped, advisor errors are logged.
// Cost: a step scope is a few clock reads (its own cost is timed too: cost_meter.h), a read of the
// thread's CPU clock and a ring-buffer write plus the sinks' on_step. What torchpilot costs the
// training thread is the epoch summary's "cost" section, kept under cost.budget.
//
// The Pilot is the kernel: steps, phases and epochs, fanned out to what subsystems registered
// (collectors, sinks, advisors, the tuner, the cost meter, config resolvers). It knows none of
// them; pilot_hosting.cpp holds the collector, sink and tuner hosting.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "torchpilot/runtime/core/advice.h"
#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/cost_meter.h"
#include "torchpilot/runtime/core/interval.h"
#include "torchpilot/runtime/core/knobs.h"
#include "torchpilot/runtime/core/logging.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/core/records.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/core/tuning.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

class Pilot;

// Ends a step when destroyed (or at end()). Move-only. [[nodiscard]]: `pilot.step(n);` alone would
// end the step at once, a mistake the compiler now names.
class [[nodiscard]] StepScope {
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
class [[nodiscard]] PhaseScope {
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

struct PilotOptions {
  std::shared_ptr<spdlog::logger> logger;  // advisory log; default: "torchpilot" on stderr
  std::shared_ptr<Clock> clock;            // default: the steady clock
  // The training thread's CPU time (StepRecord::cpu_ns); default: ThreadCpuClock when `clock` is
  // the default one, else none (a test's manual clock has no CPU time to go with it). A given
  // clock or CPU clock that throws is logged once; its reads then give its last good time.
  std::shared_ptr<Clock> cpu_clock;
  std::vector<std::shared_ptr<Sink>> sinks;  // in addition to the log and the JSON-lines file
  // Collectors the Pilot owns, added after the default ones (tests pass a GpuMonitor over a fake
  // backend here). A default collector whose name one of these has is not created.
  std::vector<std::shared_ptr<Collector>> collectors;
  // Create the collectors registered with register_default_collector (the GPU monitor when
  // torchpilot::torchpilot is linked); off, only those registered as `always` (the stall tracker,
  // the run journal) are made.
  bool default_collectors = true;
};

class Pilot : private CollectorHost, private TunerHost {
 public:
  explicit Pilot(Config config = Config::load(), PilotOptions options = {});
  ~Pilot();
  Pilot(const Pilot&) = delete;
  Pilot& operator=(const Pilot&) = delete;

  Mode mode() const { return config_.mode; }
  const Config& config() const override { return config_; }

  // Step and phase scopes. In mode off they do nothing.
  StepScope step(int64_t samples = 0);
  PhaseScope phase(std::string_view name);
  PhaseScope phase(int id);
  // Interns a phase name (kMaxPhases at most; beyond that -1 and the phase is not timed).
  int phase_id(std::string_view name);

  // Closes the epoch: summary, advice, sinks. Does nothing if no step ran since the last call.
  // A trainer that ends none gets intervals instead (interval.h); the destructor closes the last.
  void end_epoch();

  void add_sink(std::shared_ptr<Sink> sink);
  void flush();
  // The trainer saved a checkpoint at `step` (its own step count): every collector hears it (the
  // run journal records it: report.journal_path; docs/reports.md, "ETTR").
  void checkpoint_saved(int64_t step);

  // --- for hooks -------------------------------------------------------------------------------
  void record_data_wait(Nanos ns) {
    if (enabled_) pending_wait_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  // Data loaders attach with attach_loader (runtime/loader/loader_probe.h).
  KnobRegistry& knobs() override { return knobs_; }
  // Knobs were added or removed (a loader attached): the tuner plans with the new set.
  void knobs_changed();
  // What feeds the training loop (the attached loader's production), for the tuner's capacity
  // bound (TunerHost::supply); null: nothing known.
  void set_supply(std::function<SupplySample()> supply) { supply_ = std::move(supply); }
  // Auto-tune trials may still run: mode autotune and no decision yet (a hook that can recover
  // from a failed setting recovers only then).
  bool autotuning() const;
  // The running trial's setting failed in a step (an out-of-memory error:
  // hooks/memory/accumulation.h): the trial fails and the incumbent's setting is applied before
  // this returns (the trial engine's fail_current_trial). False when no trial is running (nothing
  // changed). Never throws.
  bool fail_trial(const std::string& reason);
  // The device memory each trial uses (tuning.h, MemoryProbe); a hook that knows the allocator
  // sets it (hooks/memory/accumulation.h). Trials above autotune.memory_headroom then fail.
  void set_memory_probe(MemoryProbe probe);
  // Ranks of a data-parallel run tune together (rank_exchange.h's make_trial_agreement); set it
  // before the first step. Null: this process decides alone.
  void set_trial_agreement(TrialAgreement agreement);
  // Ranks of a data-parallel run close intervals at the same steps (interval.h; rank_exchange.h's
  // make_interval_agreement); set it before the first step. Null: this process's own clock.
  void set_interval_agreement(IntervalAgreement agreement);
  // Collectors (collector.h) see every step and epoch. A collector added by pointer (the FLOP
  // counter adds itself) is not owned: it removes itself before it is destroyed, and the Pilot
  // detaches the ones left (attach(nullptr)) when it is destroyed. In mode off nothing is added.
  // An owned one is destroyed by remove_collector (never from inside a collector's callback).
  // `first`: called before the others (the loader's section comes first).
  void add_collector(Collector* collector);
  void add_collector(std::shared_ptr<Collector> collector, bool first = false);
  void remove_collector(Collector* collector);
  // The first collector of type T (e.g. GpuMonitor), or null.
  template <typename T>
  T* collector() const {
    for (Collector* c : collectors_) {
      if (auto* t = dynamic_cast<T*>(c)) return t;
    }
    return nullptr;
  }
  // Asks every collector for a detailed window of `steps` steps from the next step (the GPU
  // monitor traces kernels, copies and syncs).
  void request_window(int steps);
  Clock& clock() override { return *clock_; }
  const std::shared_ptr<Clock>& shared_clock() const { return clock_; }
  spdlog::logger& logger() override { return *logger_; }
  // The advisory log without spdlog's headers: LibTorch translation units must not include them
  // (the PyTorch wheel ships its own fmt, which shadows the one spdlog was built with).
  using LogLevel = torchpilot::LogLevel;
  void log(LogLevel level, const std::string& message) override;

  // --- results, for programs and tests -----------------------------------------------------------
  int64_t steps() const { return next_step_; }
  // A step scope is open (its number is steps()).
  bool step_open() const { return step_open_; }
  int64_t epoch() const { return epoch_; }
  // The last `records.step_history` steps, oldest first (the steps waiting in a batch are taken
  // first).
  std::vector<StepRecord> recent_steps();
  const std::vector<EpochSummary>& epoch_summaries() const { return epoch_summaries_; }
  const std::vector<Advice>& last_advice() const { return last_advice_; }
  const std::optional<TuningDecision>& tuning_decision() const;
  bool tuning_finished() const;

 private:
  friend class StepScope;
  friend class PhaseScope;
  void end_step();
  void end_period(PeriodEnd end);
  void close_interval();
  void summarize_epoch(Nanos began, PeriodEnd end);
  // CollectorHost
  bool steady_clock() const override;
  bool tuning() const override;
  void publish(const LateStepRecord& record) override;
  bool late_steps_wanted() const override;
  bool cost_allows(Nanos estimate_ns) const override;
  void cost_deferred(const std::string& what, Nanos estimate_ns) override;
  void charge_cost(Nanos ns) override;
  void take_step_now() override { take_now_ = true; }
  void set_step_hooks(const Collector& who, unsigned hooks) override;
  const std::vector<std::string>& phase_names() const override { return phase_names_; }
  Nanos epoch_cost_ns() const override { return cost_->epoch_cost_ns(); }
  // Time spent in torchpilot's own calls on the training thread, from `since` to now.
  void spend_own(Nanos since, Nanos now);
  void add_default_sinks(std::vector<std::shared_ptr<Sink>> given);
  void add_default_collectors(std::vector<std::shared_ptr<Collector>> given, bool all);
  void insert_collector(Collector* collector, bool front);
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
  IntervalRule interval_;
  Nanos period_begin_ns_ = 0;  // the current period's first step began here
  bool interval_due_ = false;  // the step just ended closes an interval (checked by StepScope)
  bool interval_said_ = false;
  // Steps shorter than kBatchBelowNs reach on_step_complete, the history, the epoch's figures and
  // the sinks in batches of kStepBatch (or sooner: a late record, a period's end, the tuner): one
  // pass over that code for many steps, where a pass at every step would find it evicted by the
  // trainer's work each time.
  static constexpr size_t kStepBatch = 32;
  static constexpr Nanos kBatchBelowNs = 5000000;
  std::vector<StepRecord> step_batch_;
  Nanos flush_ns_ = 0;        // time in flush_steps (the Pilot's part, wherever it is called from)
  bool take_now_ = false;     // a collector asked for the ending step at once (take_step_now)
  bool in_step_end_ = false;  // in end_step: on_step_record's and on_step_complete's time is
                              // their collector's part
  bool taking_ = false;       // in take_steps: late records wait for the steps' sinks
  std::vector<LateStepRecord> held_late_;
  void flush_steps();
  // on_step_record, then on_step_complete (each collector by collector over the batch), then
  // history, epoch figures and sinks (step by step); late records published meanwhile come after.
  void take_steps(StepRecord* steps, size_t n);
  void deliver_late(const LateStepRecord& record);
  std::vector<StepRecord> history_;  // ring buffer
  size_t history_next_ = 0;
  EpochAccumulator accumulator_;
  std::vector<EpochSummary> epoch_summaries_;
  std::vector<Advice> last_advice_;

  std::vector<Collector*> collectors_;     // in calling order
  std::vector<unsigned> collector_hooks_;  // each one's step hooks, in the same order
  std::vector<std::shared_ptr<Collector>> owned_collectors_;
  // Every collector, or (with StepHook bits) those that take one of those callbacks now. `hook`
  // is read before each collector: on_step_end's grows once a collector marked the step at_period
  // or probe_syncs.
  static constexpr unsigned kEveryCollector = ~0u;
  template <typename Fn>
  void for_each_collector(const char* what, Fn&& fn) {
    for_each_collector(what, kEveryCollector, std::forward<Fn>(fn));
  }
  template <typename Fn>
  void for_each_collector(const char* what, const unsigned& hook, Fn&& fn);
  template <typename Fn>
  void for_each_collector_timed(const char* what, const unsigned& hook, Fn&& fn);
  // Each collector's step time: at every step of the first kPartExactSteps, then one call in 8.
  static constexpr int64_t kPartExactSteps = 64, kPartSampleSteps = 8;
  uint64_t part_sample_rng_ = 0x9E3779B97F4A7C15ull;
  void drop_collector(size_t index);

  // What torchpilot costs (cost_meter.h).
  std::shared_ptr<Clock> cpu_clock_;  // null: not measured
  Nanos cpu_mark_ = -1;               // CPU time at the latest read ...
  int64_t cpu_mark_step_ = -1;        // ... at the start of this step
  bool cpu_read_next_ = false;        // read at the next boundary (a stall's end)
  Nanos step_ewma_ns_ = 0;            // recent step time
  static constexpr Nanos kCpuEveryStepNs = 5000000;
  static constexpr int64_t kCpuSampleSteps = 16;
  // Reads the thread's CPU clock at the end of `step`: the time since the previous read goes to
  // the period; returned as the step's when that read was at its start (else -1).
  Nanos read_cpu(int64_t step);
  std::unique_ptr<CostMeter> cost_ = std::make_unique<CostMeter>();  // the registered one, if any
  Nanos own_pending_ns_ = 0;   // own time since the last step boundary (the next record's own_ns)
  Nanos summary_cut_ns_ = -1;  // when this epoch end's cost was written into its summary

  KnobRegistry knobs_;
  std::function<SupplySample()> supply_;
  std::unique_ptr<Tuner> tuner_;  // mode autotune: the tune subsystem's (core/tuning.h)
  // Tuning stopped on an internal error: the best setting so far stays, mode advise from here.
  void stop_tuning(const std::string& why);
  // TunerHost
  SupplySample supply() override;
  void publish_trial(const TrialResult& trial, bool kept) override;
  void publish_decision(const TuningDecision& decision) override;
};

}  // namespace torchpilot
