#include "torchpilot/runtime/core/pilot.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <optional>

#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/core/logging.h"

namespace torchpilot {

namespace {
// The attached loader's counters for each epoch: the difference of two snapshots.
class LoaderCollector final : public Collector {
 public:
  explicit LoaderCollector(LoaderProbe* probe) : probe_(probe), at_epoch_start_(probe->stats()) {}
  std::string name() const override { return "loader"; }
  void on_epoch_end(EpochSummary& summary) override {
    LoaderStats now = probe_->stats();
    summary.sections.set(loader_delta(now, at_epoch_start_));
    at_epoch_start_ = std::move(now);
  }

 private:
  LoaderProbe* probe_;
  LoaderStats at_epoch_start_;
};

// Runs a factory: a ConfigError (a bad path in the config) fails the Pilot's construction, as a
// bad config does; anything else is returned as the reason it failed.
template <typename Fn>
std::optional<std::string> start(Fn&& fn) {
  std::exception_ptr config_error;
  auto failed = failure_of([&] {
    try {
      fn();
    } catch (const ConfigError&) {
      config_error = std::current_exception();
    }
  });
  if (config_error) std::rethrow_exception(config_error);
  return failed;
}
}  // namespace

// --- scopes ---------------------------------------------------------------------------------

StepScope::StepScope(StepScope&& other) noexcept : pilot_(other.pilot_), step_(other.step_) {
  other.pilot_ = nullptr;
}

void StepScope::end() {
  if (pilot_ != nullptr) {
    Pilot* p = pilot_;
    pilot_ = nullptr;
    // end_epoch() or a newer step() may have closed this step already.
    if (p->owns_open_step(step_)) p->end_step();
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

Pilot::Pilot(Config config, PilotOptions options)
    : config_(std::move(config)),
      enabled_(config_.mode != Mode::kOff),
      clock_(options.clock ? options.clock : default_clock()),
      // Each Pilot's own logger, writing to the shared "torchpilot" logger's sinks: log.level
      // then governs this Pilot's lines only (a second Pilot must not change the first's).
      logger_(options.logger ? options.logger : torchpilot_logger()->clone("torchpilot")) {
  validate(config_);  // a Config built in code gets the same checks as a file
  // A logger handed in keeps its level.
  if (!options.logger) logger_->set_level(spdlog::level::from_str(config_.log.level));
  if (config_.mode == Mode::kOff) return;
  for (ConfigResolver resolve : config_resolvers()) {
    if (const auto failed =
            failure_of([&] { resolve(config_, *logger_, options.default_collectors); })) {
      logger_->warn("a setting could not be resolved{}", reason_suffix(*failed));
    }
  }
  cpu_clock_ = options.cpu_clock ? options.cpu_clock
               : options.clock   ? nullptr
                                 : std::make_shared<ThreadCpuClock>();
  own_threads_mark_ = own_threads_cpu_ns();
  // The ring grows as steps come (up to records.step_history); only a default-sized start is
  // reserved, so a large history costs memory only once that many steps have run.
  history_.reserve(std::min<size_t>(static_cast<size_t>(config_.records.step_history), 4096));
  for (const DefaultSink& d : default_sinks()) {
    std::shared_ptr<Sink> sink;
    if (const auto failed = start([&] { sink = d.factory(config_, logger_); })) {
      logger_->warn("sink '{}' failed to start{}", d.name, reason_suffix(*failed));
    }
    if (sink) sinks_.push_back(std::move(sink));
  }
  for (auto& s : options.sinks) sinks_.push_back(std::move(s));
  sink_failed_.assign(sinks_.size(), false);
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

void Pilot::add_default_collectors(std::vector<std::shared_ptr<Collector>> given, bool all) {
  for (const DefaultCollector& d : default_collectors()) {
    if (!all && !d.always) continue;
    std::unique_ptr<Collector> c;
    if (const auto failed = start([&] { c = d.factory(*this); })) {
      logger_->warn("a default collector failed to start{}", reason_suffix(*failed));
      continue;
    }
    if (!c) continue;
    const bool replaced = std::any_of(given.begin(), given.end(),
                                      [&](const auto& g) { return g && g->name() == c->name(); });
    if (!replaced) add_collector(std::move(c));
  }
  for (auto& c : given) add_collector(std::move(c));
}

Pilot::~Pilot() {
  // Destructors must not throw: every call into other code is guarded.
  if (loader_ != nullptr) {
    if (const auto failed = failure_of([&] { loader_->forget_pilot(); })) {
      logger_->error("the attached loader failed to let go of the Pilot{}", reason_suffix(*failed));
    }
  }
  for_each_collector("on_close", [](Collector& c) { c.on_close(); });
  for (Collector* c : collectors_) {
    try {
      c->attach(nullptr);
    } catch (...) {
    }
  }
  collectors_.clear();
  loader_collector_.reset();
  owned_collectors_.clear();  // owned ones stop here (their destructors must not throw)
  flush();
}

void Pilot::log(LogLevel level, const std::string& message) { log_to(*logger_, level, message); }

bool Pilot::steady_clock() const { return dynamic_cast<SteadyClock*>(clock_.get()) != nullptr; }

bool Pilot::tuning() const { return config_.mode == Mode::kAutotune && !tuning_finished(); }

void Pilot::insert_collector(Collector* c, bool front) {
  if (std::find(collectors_.begin(), collectors_.end(), c) != collectors_.end()) return;
  if (const auto failed = failure_of([&] { c->attach(this); })) {
    logger_->error("collector '{}' failed to attach and is not used{}", c->name(),
                   reason_suffix(*failed));
    (void)failure_of([&] { c->attach(nullptr); });  // it may have kept the host
    return;
  }
  collectors_.insert(front ? collectors_.begin() : collectors_.end(), c);
}

void Pilot::add_collector(Collector* collector) {
  if (collector == nullptr || !enabled_) return;
  insert_collector(collector, false);
}

void Pilot::add_collector(std::shared_ptr<Collector> collector) {
  if (collector == nullptr || !enabled_) return;
  Collector* c = collector.get();
  owned_collectors_.push_back(std::move(collector));
  insert_collector(c, false);
}

void Pilot::remove_collector(Collector* collector) {
  collectors_.erase(std::remove(collectors_.begin(), collectors_.end(), collector),
                    collectors_.end());
}

void Pilot::request_window(int steps) {
  for_each_collector("on_window_request", [&](Collector& c) { c.on_window_request(steps); });
}

void Pilot::publish(const LateStepRecord& record) {
  for_each_collector("on_late_step", [&](Collector& c) { c.on_late_step(record); });
  for_each_sink("on_late_step", [&](Sink& s) { s.on_late_step(record); });
}

void Pilot::drop_collector(size_t i) {
  Collector* c = collectors_[i];
  collectors_.erase(collectors_.begin() + static_cast<std::ptrdiff_t>(i));
  // It must not reach back into this Pilot later (its destructor would, after ours). An owned
  // one lives on, unused, until the Pilot goes.
  try {
    c->attach(nullptr);
  } catch (...) {
  }
}

template <typename Fn>
void Pilot::for_each_collector_timed(const char* what, Fn&& fn) {
  // Each collector's share of the step calls (CostStats::step_parts): one clock read each, the
  // previous collector's end being the next one's start.
  Nanos t0 = clock_->now_ns();
  for_each_collector(what, [&](Collector& c) {
    fn(c);
    const Nanos t1 = clock_->now_ns();
    const Nanos ns = t1 - t0;
    t0 = t1;
    for (auto& [who, sum] : step_parts_) {
      if (who == &c) {
        sum += ns;
        return;
      }
    }
    step_parts_.emplace_back(&c, ns);
  });
}

template <typename Fn>
void Pilot::for_each_collector(const char* what, Fn&& fn) {
  for (size_t i = 0; i < collectors_.size();) {
    Collector* c = collectors_[i];
    if (const auto failed = failure_of([&] { fn(*c); })) {
      logger_->error("collector '{}' failed in {} and is removed{}", c->name(), what,
                     reason_suffix(*failed));
      drop_collector(i);
    } else {
      ++i;
    }
  }
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
  cost_.start(step_begin_ns_);
  // An epoch's first step: its CPU time from here (the wait before it blocks, mostly).
  if (last_boundary_ns_ < 0 && cpu_clock_) cpu_mark_ = cpu_clock_->now_ns();
  if (!collectors_.empty()) {
    const int64_t n = next_step_;
    const Nanos t = step_begin_ns_;
    for_each_collector_timed("on_step_begin", [&](Collector& o) { o.on_step_begin(n, t); });
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
    for_each_collector("on_phase_begin", [&](Collector& o) { o.on_phase_begin(id, name); });
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
    for_each_collector("on_phase_end", [&](Collector& o) { o.on_phase_end(id); });
    spend_own(now, clock_->now_ns());
  }
}

void Pilot::spend_own(Nanos since, Nanos now) {
  const Nanos ns = std::max<Nanos>(0, now - since);
  own_pending_ns_ += ns;
  epoch_step_calls_ns_ += ns;
  cost_.spend(now, ns);
}

bool Pilot::cost_allows(Nanos estimate_ns) const {
  return cost_.allows(clock_->now_ns(), estimate_ns);
}

void Pilot::cost_deferred(const std::string& what, Nanos estimate_ns) {
  ++epoch_deferred_;
  if (warned_budget_) return;
  warned_budget_ = true;
  const Nanos now = clock_->now_ns();
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "cost budget: %s deferred (about %.1f ms): torchpilot took %.1f ms of the %.1f ms "
      "its budget (%.2g%% of run time, cost.budget) allows over the last %.0f s; optional "
      "work waits until it fits (each epoch's 'torchpilot:' line counts what waited)",
      what.c_str(), static_cast<double>(estimate_ns) / 1e6,
      static_cast<double>(cost_.spent(now)) / 1e6, static_cast<double>(cost_.allowance(now)) / 1e6,
      100 * cost_.budget(), cost_.horizon_s());
  logger_->info("{}", buf);
}

void Pilot::charge_cost(Nanos ns) {
  if (ns <= 0) return;
  epoch_window_ns_ += ns;
  cost_.spend(clock_->now_ns(), ns);
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
  const auto own = at_exit([this, now] { spend_own(now, clock_->now_ns()); });
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
  if (cpu_clock_) {
    const Nanos cpu = cpu_clock_->now_ns();
    r.cpu_ns = cpu_mark_ >= 0 && cpu >= cpu_mark_ ? cpu - cpu_mark_ : -1;
    cpu_mark_ = cpu;
  }
  last_boundary_ns_ = now;
  step_open_ = false;
  for_each_collector_timed("on_step_end", [&](Collector& o) { o.on_step_end(r); });
  for_each_collector("on_step_complete", [&](Collector& o) { o.on_step_complete(r); });

  const size_t history = static_cast<size_t>(config_.records.step_history);
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

  if (!tuner_ || tuner_->finished()) return;
  // The tuner calls knob setters and the loader's probe: user code. Whatever it throws stops
  // tuning with one log line; the step goes on.
  ++epoch_tuning_steps_;
  if (const auto failed = failure_of([&] { tuner_->on_step(r); })) stop_tuning(*failed);
}

void Pilot::stop_tuning(const std::string& reason) {
  logger_->error("autotune stopped after an internal error{}", reason_suffix(reason));
  const std::string why = "internal error" + reason_suffix(reason);
  if (const auto again = failure_of([&] { tuner_->abandon(why); })) {  // applies the best
    logger_->error("autotune could not restore the best setting{}", reason_suffix(*again));
  }
  tuner_.reset();
  config_.mode = Mode::kAdvise;
}

SupplySample Pilot::supply() {
  SupplySample sample;
  if (loader_ != nullptr) {
    const LoaderStats s = loader_->stats();
    sample = {s.produce_count, s.produce_ns, s.settings.workers};
  }
  return sample;
}

void Pilot::publish_trial(const TrialResult& trial, bool kept) {
  for_each_sink("on_trial", [&](Sink& s) { s.on_trial(trial, kept); });
}

void Pilot::publish_decision(const TuningDecision& decision) {
  for_each_sink("on_decision", [&](Sink& s) { s.on_decision(decision); });
}

bool Pilot::autotuning() const {
  return config_.mode == Mode::kAutotune && !(tuner_ && tuner_->finished());
}

bool Pilot::fail_trial(const std::string& reason) {
  if (!tuner_) return false;
  bool failed = false;
  // The tuner calls knob setters (user code): whatever they throw stops tuning, as in end_step.
  if (const auto error = failure_of([&] { failed = tuner_->fail_trial(reason); })) {
    stop_tuning(*error);
    return false;
  }
  return failed;
}

void Pilot::set_memory_probe(MemoryProbe probe) {
  if (tuner_) tuner_->set_memory_probe(std::move(probe));
}

void Pilot::end_epoch() {
  if (config_.mode == Mode::kOff) return;
  if (step_open_) end_step();
  if (accumulator_.empty()) return;
  const Nanos began = clock_->now_ns();
  summary_cut_ns_ = -1;
  // Summarizing runs collectors, advisors and sinks (each guarded on its own); anything else that
  // goes wrong loses this epoch's summary, never the training loop, and the next epoch starts.
  if (const auto failed = failure_of([&] { summarize_epoch(began); })) {
    logger_->error("the summary of epoch {} failed and is skipped{}", epoch_,
                   reason_suffix(*failed));
  }
  accumulator_.clear();
  ++epoch_;
  step_in_epoch_ = 0;
  epoch_tuning_steps_ = 0;
  last_boundary_ns_ = -1;
  pending_wait_ns_.store(0, std::memory_order_relaxed);
  flush();
  // The epoch end's work: its summary counted it up to the sinks; the rest (log and record
  // writing) goes into the next epoch's figure.
  const Nanos done = clock_->now_ns();
  cost_.spend(done, done - began);
  epoch_end_carry_ns_ += done - (summary_cut_ns_ >= 0 ? summary_cut_ns_ : began);
  log_carry_ns_ += done - (summary_cut_ns_ >= 0 ? summary_cut_ns_ : began);
  own_pending_ns_ = 0;  // between epochs: in no step
  cpu_mark_ = -1;
}

CostStats Pilot::epoch_cost(const EpochSummary& summary, Nanos began, Nanos now) {
  CostStats c;
  c.step_calls_ns = epoch_step_calls_ns_;
  c.epoch_end_ns = epoch_end_carry_ns_ + std::max<Nanos>(0, now - began);
  c.window_ns = epoch_window_ns_;
  c.training_thread_ns = c.step_calls_ns + c.epoch_end_ns + c.window_ns;
  c.epoch_ns = summary.wall_ns + std::max<Nanos>(0, now - began);
  c.fraction = fraction(c.training_thread_ns, c.epoch_ns);
  // The budget's view includes this epoch end so far (spent at its end).
  c.horizon_fraction = cost_.horizon_fraction(now);
  c.budget = cost_.budget();
  c.horizon_s = cost_.span_s(now);
  c.deferred = epoch_deferred_;
  const Nanos threads = own_threads_cpu_ns();
  c.own_threads_cpu_ns = std::max<Nanos>(0, threads - own_threads_mark_);
  own_threads_mark_ = threads;
  Nanos collectors_ns = 0;
  for (const auto& [who, ns] : step_parts_) {
    // A collector dropped since is no longer in collectors_: its name is not to be asked.
    const bool live = std::find(collectors_.begin(), collectors_.end(), who) != collectors_.end();
    c.step_parts.emplace_back(live ? who->name() : std::string("removed"), ns);
    collectors_ns += ns;
  }
  c.step_parts.emplace_back("pilot", std::max<Nanos>(0, c.step_calls_ns - collectors_ns));
  std::stable_sort(c.step_parts.begin(), c.step_parts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  step_parts_.clear();
  c.epoch_end_parts = std::move(epoch_end_parts_);
  c.epoch_end_parts.emplace_back("log", log_carry_ns_);
  std::stable_sort(c.epoch_end_parts.begin(), c.epoch_end_parts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  epoch_end_parts_.clear();
  log_carry_ns_ = 0;
  epoch_step_calls_ns_ = 0;
  epoch_window_ns_ = 0;
  epoch_end_carry_ns_ = 0;
  epoch_deferred_ = 0;
  return c;
}

void Pilot::summarize_epoch(Nanos began) {
  epoch_end_parts_.clear();
  Nanos mark = began;
  auto part = [&](std::string name) {  // the time since the previous part
    const Nanos now = clock_->now_ns();
    epoch_end_parts_.emplace_back(std::move(name), std::max<Nanos>(0, now - mark));
    mark = now;
  };
  EpochSummary summary = accumulator_.summarize(epoch_, phase_names_);
  summary.tuning_steps = epoch_tuning_steps_;
  summary.tuned = tuning_finished() && !tuning_decision()->trials.empty();
  part("summary");
  for_each_collector("on_epoch_end", [&](Collector& o) {
    o.on_epoch_end(summary);
    part(o.name());
  });
  for_each_collector("on_epoch_complete", [&](Collector& o) { o.on_epoch_complete(summary); });
  std::vector<Advice> advice;
  std::vector<std::string> advisor_errors;
  if (const auto failed =
          failure_of([&] { advice = run_advisors(summary, config_, &advisor_errors); })) {
    logger_->error("advisors failed for epoch {}{}", epoch_, reason_suffix(*failed));
  }
  for (const auto& e : advisor_errors) logger_->error("advisor failed for epoch {}: {}", epoch_, e);
  for (auto& a : advice) a.epoch = epoch_;
  part("advisors");
  summary_cut_ns_ = clock_->now_ns();
  summary.sections.set(epoch_cost(summary, began, summary_cut_ns_));
  for_each_sink("on_epoch", [&](Sink& s) { s.on_epoch(summary, advice); });
  epoch_summaries_.push_back(std::move(summary));
  last_advice_ = std::move(advice);
}

void Pilot::add_sink(std::shared_ptr<Sink> sink) {
  sinks_.push_back(std::move(sink));
  sink_failed_.push_back(false);
}

void Pilot::checkpoint_saved(int64_t step) {
  for_each_collector("on_checkpoint", [&](Collector& c) { c.on_checkpoint(step); });
}

void Pilot::flush() {
  for_each_sink("flush", [](Sink& s) { s.flush(); });
}

template <typename Fn>
void Pilot::for_each_sink(const char* what, Fn&& fn) {
  for (size_t i = 0; i < sinks_.size(); ++i) {
    if (sink_failed_[i]) continue;
    if (const auto failed = failure_of([&] { fn(*sinks_[i]); })) {
      sink_failed_[i] = true;
      logger_->error("sink '{}' failed in {} and is disabled{}", sinks_[i]->name(), what,
                     reason_suffix(*failed));
    }
  }
}

void Pilot::attach_loader(LoaderProbe* probe, std::vector<Knob> knobs) {
  if (loader_ != nullptr && loader_ != probe) {
    logger_->info("a new loader was attached; the previous one is no longer reported or tuned");
    LoaderProbe* old = loader_;
    detach_loader(old);
    old->forget_pilot();
  }
  loader_ = probe;
  loader_collector_ = std::make_unique<LoaderCollector>(probe);
  insert_collector(loader_collector_.get(), true);  // its section comes first
  for (auto& k : knobs) knobs_.add(std::move(k));
  if (tuner_) tuner_->knobs_changed();
}

void Pilot::detach_loader(LoaderProbe* probe) {
  if (loader_ != probe) return;
  loader_ = nullptr;
  remove_collector(loader_collector_.get());
  loader_collector_.reset();
  knobs_.remove_prefix("loader.");
}

std::vector<StepRecord> Pilot::recent_steps() const {
  std::vector<StepRecord> out;
  out.reserve(history_.size());
  for (size_t i = 0; i < history_.size(); ++i) {
    out.push_back(history_[(history_next_ + i) % history_.size()]);
  }
  return out;
}

const std::optional<TuningDecision>& Pilot::tuning_decision() const {
  static const std::optional<TuningDecision> none;
  return tuner_ ? tuner_->decision() : none;
}

void Pilot::set_trial_agreement(TrialAgreement agreement) {
  if (tuner_) tuner_->set_agreement(std::move(agreement));
}

bool Pilot::tuning_finished() const { return tuner_ && tuner_->finished(); }

}  // namespace torchpilot
