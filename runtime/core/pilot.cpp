// The Pilot's steps and phases (pilot.h). Epochs and intervals: pilot_periods.cpp; collector,
// sink and tuner hosting: pilot_hosting.cpp.
#include "torchpilot/runtime/core/pilot.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "pilot_internal.h"
#include "torchpilot/runtime/core/logging.h"

namespace torchpilot {

// --- scopes ---------------------------------------------------------------------------------

StepScope::StepScope(StepScope&& other) noexcept : pilot_(other.pilot_), step_(other.step_) {
  other.pilot_ = nullptr;
}

void StepScope::end() {
  if (pilot_ != nullptr) {
    Pilot* p = pilot_;
    pilot_ = nullptr;
    // end_epoch() or a newer step() may have closed this step already.
    if (p->owns_open_step(step_)) {
      p->end_step();
      if (p->interval_due_) p->close_interval();
    }
  }
}

void StepScope::set_samples(int64_t samples) {
  if (pilot_ != nullptr && pilot_->owns_open_step(step_)) pilot_->open_step_samples_ = samples;
}

PhaseScope::PhaseScope(PhaseScope&& other) noexcept
    : pilot_(other.pilot_), id_(other.id_), begin_(other.begin_) {
  other.pilot_ = nullptr;
}

void PhaseScope::end() {
  if (pilot_ != nullptr) {
    Pilot* p = pilot_;
    pilot_ = nullptr;
    p->end_phase(id_, begin_);
  }
}

// --- Pilot ----------------------------------------------------------------------------------

namespace {
// A clock the program gave (the clock, the CPU clock): every read goes through the step scopes'
// destructors, where a throw would end the program. One that throws is logged once, and reads
// give its last good time.
class GuardedClock final : public Clock {
 public:
  GuardedClock(std::shared_ptr<Clock> inner, std::shared_ptr<spdlog::logger> logger,
               const char* name)
      : inner_(std::move(inner)), logger_(std::move(logger)), name_(name) {}
  Nanos now_ns() const override {
    if (const auto failed = failure_of([&] { last_ = inner_->now_ns(); })) {
      if (!said_.exchange(true)) {
        logger_->error("{} failed{}; times stand still from here", name_, reason_suffix(*failed));
      }
    }
    return last_;
  }

 private:
  std::shared_ptr<Clock> inner_;
  std::shared_ptr<spdlog::logger> logger_;
  const char* name_;
  mutable std::atomic<Nanos> last_{0};
  mutable std::atomic<bool> said_{false};
};
}  // namespace

Pilot::Pilot(Config config, PilotOptions options)
    : config_(std::move(config)),
      enabled_(config_.mode != Mode::kOff),
      clock_(options.clock ? options.clock : default_clock()),
      // Each Pilot's own logger, writing to the shared "torchpilot" logger's sinks: log.level
      // then governs this Pilot's lines only (a second Pilot must not change the first's).
      logger_(options.logger ? options.logger : torchpilot_logger()->clone("torchpilot")) {
  if (options.clock && dynamic_cast<SteadyClock*>(options.clock.get()) == nullptr) {
    clock_ = std::make_shared<GuardedClock>(clock_, logger_, "the clock");
  }
  validate(config_);  // a Config built in code gets the same checks as a file
  // A logger handed in keeps its level.
  if (!options.logger) logger_->set_level(spdlog::level::from_str(config_.log.level));
  if (config_.mode == Mode::kOff) return;
  // Every output's path at once, before any is opened: a refused start leaves no file behind.
  check_output_paths(config_);
  for (ConfigResolver resolve : config_resolvers()) {
    if (const auto failed =
            failure_of([&] { resolve(config_, *logger_, options.default_collectors); })) {
      logger_->warn("a setting could not be resolved{}", reason_suffix(*failed));
    }
  }
  interval_ = IntervalRule(config_);
  if (options.cpu_clock) {
    cpu_clock_ = std::make_shared<GuardedClock>(options.cpu_clock, logger_, "the CPU clock");
  } else if (!options.clock) {
    cpu_clock_ = std::make_shared<ThreadCpuClock>();
  }
  if (const CostMeterFactory make = cost_meter_factory()) cost_ = make(config_);
  // The ring grows as steps come (up to records.step_history); only a default-sized start is
  // reserved, so a large history costs memory only once that many steps have run.
  history_.reserve(std::min<size_t>(static_cast<size_t>(config_.records.step_history), 4096));
  add_default_sinks(std::move(options.sinks));
  logger_->info("mode {}{}", to_string(config_.mode),
                config_.log.json_path.empty() ? "" : ", records to " + config_.log.json_path);
  add_default_collectors(std::move(options.collectors), options.default_collectors);
  if (config_.mode == Mode::kAutotune) {
    const TunerFactory make = tuner_factory();
    if (make != nullptr) tuner_ = make(*this);
    if (!tuner_) {
      logger_->warn("mode autotune, but this build has no tuner: advising only");
      config_.mode = Mode::kAdvise;
    }
  }
}

Pilot::~Pilot() {
  // Destructors must not throw: every call into other code is guarded. Steps not yet reported
  // are the last period's (end_period guards what it calls).
  try {
    end_period(PeriodEnd::kExit);
  } catch (...) {
  }
  for_each_collector("on_close", [](Collector& c) { c.on_close(); });
  for (Collector* c : collectors_) {
    try {
      c->attach(nullptr);
    } catch (...) {
    }
  }
  collectors_.clear();
  collector_hooks_.clear();
  owned_collectors_.clear();  // owned ones stop here (their destructors must not throw)
  flush();
}

StepScope Pilot::step(int64_t samples) {
  if (config_.mode == Mode::kOff) return StepScope(nullptr, 0);
  if (step_open_) {
    // A step scope left open (e.g. moved elsewhere) must not corrupt the next one: close it.
    end_step();
  }
  step_open_ = true;
  open_step_samples_ = samples;
  step_begin_ns_ = clock_->now_ns();
  cost_->step_begins(step_begin_ns_);
  // An epoch's first step: its CPU time from here (the wait before it blocks, mostly).
  if (last_boundary_ns_ < 0 && cpu_clock_) {
    cpu_mark_ = cpu_clock_->now_ns();
    cpu_mark_step_ = next_step_;
  }
  if (!collectors_.empty()) {
    const int64_t n = next_step_;
    const Nanos t = step_begin_ns_;
    for_each_collector_timed("on_step_begin", kHookStepBegin,
                             [&](Collector& o) { o.on_step_begin(n, t); });
    spend_own(t, clock_->now_ns());
  }
  return StepScope(this, next_step_);
}

int Pilot::phase_id(std::string_view name) {
  for (size_t i = 0; i < phase_names_.size(); ++i) {
    if (phase_names_[i] == name) return static_cast<int>(i);
  }
  if (phase_names_.size() >= static_cast<size_t>(kMaxPhases)) return -1;
  phase_names_.emplace_back(name);
  return static_cast<int>(phase_names_.size() - 1);
}

PhaseScope Pilot::phase(std::string_view name) {
  if (config_.mode == Mode::kOff) return PhaseScope(nullptr, -1, 0);
  return phase(phase_id(name));
}

PhaseScope Pilot::phase(int id) {
  if (config_.mode == Mode::kOff || id < 0 || id >= kMaxPhases) return PhaseScope(nullptr, -1, 0);
  if (!collectors_.empty()) {
    static const std::string unnamed = "phase";
    const std::string& name = static_cast<size_t>(id) < phase_names_.size()
                                  ? phase_names_[static_cast<size_t>(id)]
                                  : unnamed;
    const Nanos t = clock_->now_ns();
    for_each_collector("on_phase_begin", kHookPhase,
                       [&](Collector& o) { o.on_phase_begin(id, name); });
    const Nanos begin = clock_->now_ns();
    spend_own(t, begin);
    return PhaseScope(this, id, begin);
  }
  return PhaseScope(this, id, clock_->now_ns());
}

void Pilot::end_phase(int id, Nanos begin) {
  const Nanos now = clock_->now_ns();
  phase_ns_[id] += now - begin;
  if (!collectors_.empty()) {
    for_each_collector("on_phase_end", kHookPhase, [&](Collector& o) { o.on_phase_end(id); });
    spend_own(now, clock_->now_ns());
  }
}

void Pilot::spend_own(Nanos since, Nanos now) {
  const Nanos ns = std::max<Nanos>(0, now - since);
  own_pending_ns_ += ns;
  cost_->spend_step_calls(now, ns);
}

namespace {
// Times the rest of a Pilot call as torchpilot's own, however it returns.
template <typename Fn>
struct AtExit {
  Fn fn;
  ~AtExit() { fn(); }
};
template <typename Fn>
AtExit<Fn> at_exit(Fn fn) {
  return AtExit<Fn>{std::move(fn)};
}
}  // namespace

void Pilot::end_step() {
  const int64_t samples = open_step_samples_;
  const Nanos now = clock_->now_ns();
  // What follows lands in the next step's span: it is that step's own time.
  const auto own = at_exit([this, now] {
    spend_own(now, clock_->now_ns());
    take_now_ = in_step_end_ = false;
  });
  const Nanos wait = pending_wait_ns_.exchange(0, std::memory_order_relaxed);
  StepRecord r;
  r.step = next_step_++;
  r.epoch = epoch_;
  r.step_in_epoch = step_in_epoch_++;
  // The first step of an epoch starts where its batch wait started.
  r.begin_ns = last_boundary_ns_ >= 0 ? last_boundary_ns_ : step_begin_ns_ - wait;
  r.end_ns = now;
  r.data_wait_ns = wait;
  r.samples = samples;
  r.phase_ns = phase_ns_;
  phase_ns_.fill(0);
  r.own_ns = own_pending_ns_;
  own_pending_ns_ = 0;
  // The thread's CPU clock is a system call (0.3 us idle, 5 us at a busy trainer's step end): read
  // at every boundary only when steps are slow (kCpuEveryStepNs), else around one step in
  // kCpuSampleSteps and around the steps at a recurring stall's period (below); the period's CPU
  // time adds up every read.
  step_ewma_ns_ += (r.step_ns() - step_ewma_ns_) / 8;
  if (cpu_clock_ &&
      (step_ewma_ns_ >= kCpuEveryStepNs || cpu_read_next_ || r.step % kCpuSampleSteps == 0 ||
       r.step % kCpuSampleSteps == kCpuSampleSteps - 1)) {
    r.cpu_ns = read_cpu(r.step);
  }
  cpu_read_next_ = false;
  if (r.step_in_epoch == 0) period_begin_ns_ = r.begin_ns;
  interval_due_ = interval_.due(step_in_epoch_, period_begin_ns_, now);
  last_boundary_ns_ = now;
  step_open_ = false;
  in_step_end_ = true;
  // Collectors that act only around a recurring stall are called once an earlier one (the stall
  // tracker) marked the step at its period.
  unsigned end_hooks = kHookStepEnd;
  for_each_collector_timed("on_step_end", end_hooks, [&](Collector& o) {
    o.on_step_end(r);
    if (r.at_period || r.probe_syncs) end_hooks |= kHookPeriodStepEnd;
  });
  // The next step sits at a recurring stall's period: its CPU time from here to its end.
  if (cpu_clock_ && r.at_period && step_ewma_ns_ < kCpuEveryStepNs) {
    (void)read_cpu(r.step);  // marks the next step's start
    cpu_read_next_ = true;
  }

  // The tuner reads each step as it ends, and its trials reach the sinks between steps: while
  // it runs, every step is taken at once. Otherwise short steps wait in a batch (below).
  const bool tuning_now = tuner_ && !tuner_->finished();
  if (tuning_now || take_now_ || r.step_ns() >= kBatchBelowNs || step_ewma_ns_ >= kBatchBelowNs) {
    flush_steps();
    take_steps(&r, 1);
  } else {
    step_batch_.push_back(r);
    if (step_batch_.size() >= kStepBatch) flush_steps();
  }

  if (!tuning_now) return;
  // The tuner calls knob setters and the loader's probe: user code. Whatever it throws stops
  // tuning with one log line; the step goes on.
  ++epoch_tuning_steps_;
  if (const auto failed = failure_of([&] { tuner_->on_step(r); })) stop_tuning(*failed);
}

void Pilot::flush_steps() {
  if (step_batch_.empty()) return;
  // Taken in order; a sink or collector may publish (and so flush) from inside: the batch is
  // moved out first.
  const Nanos t0 = clock_->now_ns();
  std::vector<StepRecord> batch;
  batch.swap(step_batch_);
  take_steps(batch.data(), batch.size());
  batch.clear();
  if (step_batch_.empty()) step_batch_.swap(batch);  // keep the capacity
  flush_ns_ += clock_->now_ns() - t0;
}

void Pilot::take_steps(StepRecord* steps, size_t n) {
  const bool outer = !taking_;
  taking_ = true;
  {
    // Whatever escapes (an allocation), late records are not held from then on.
    const auto done = at_exit([this, outer] {
      if (outer) taking_ = false;
    });
    // One collector at a time over the steps: its code and data stay warm. Within a step call its
    // time is its part of the step calls (two clock reads a batch). Every collector's
    // on_step_record of the batch comes before any on_step_complete of it, so each record is
    // whole when completed.
    for_each_collector("on_step_record", kHookStepRecord, [&](Collector& c) {
      const Nanos t0 = in_step_end_ ? clock_->now_ns() : 0;
      for (size_t i = 0; i < n; ++i) c.on_step_record(steps[i]);
      if (in_step_end_) cost_->step_part(&c, clock_->now_ns() - t0);
    });
    for_each_collector("on_step_complete", kHookStepComplete, [&](Collector& c) {
      const Nanos t0 = in_step_end_ ? clock_->now_ns() : 0;
      for (size_t i = 0; i < n; ++i) c.on_step_complete(steps[i]);
      if (in_step_end_) cost_->step_part(&c, clock_->now_ns() - t0);
    });
    const size_t history = static_cast<size_t>(config_.records.step_history);
    for (size_t i = 0; i < n; ++i) {
      StepRecord& r = steps[i];
      if (history_.size() < history) {
        // Doubling, but never past the ring's size.
        if (history_.size() == history_.capacity()) {
          history_.reserve(std::min(history, std::max<size_t>(1, 2 * history_.capacity())));
        }
        history_.push_back(r);
      } else {
        history_[history_next_] = r;
        history_next_ = (history_next_ + 1) % history_.size();
      }
      accumulator_.add(r);
      for_each_sink("on_step", [&](Sink& s) { s.on_step(r, phase_names_); });
    }
  }
  if (!outer) return;
  // Late records published while the steps were taken: after the steps they follow.
  while (!held_late_.empty()) {
    std::vector<LateStepRecord> held;
    held.swap(held_late_);
    for (const LateStepRecord& late : held) deliver_late(late);
  }
}

Nanos Pilot::read_cpu(int64_t step) {
  const Nanos cpu = cpu_clock_->now_ns();
  Nanos step_cpu = -1;
  if (cpu_mark_ >= 0 && cpu >= cpu_mark_) {
    accumulator_.add_cpu(cpu - cpu_mark_);
    if (cpu_mark_step_ == step) step_cpu = cpu - cpu_mark_;  // read at its start too
  }
  cpu_mark_ = cpu;
  cpu_mark_step_ = step + 1;
  return step_cpu;
}

std::vector<StepRecord> Pilot::recent_steps() {
  flush_steps();
  std::vector<StepRecord> out;
  out.reserve(history_.size());
  for (size_t i = 0; i < history_.size(); ++i) {
    out.push_back(history_[(history_next_ + i) % history_.size()]);
  }
  return out;
}

}  // namespace torchpilot
