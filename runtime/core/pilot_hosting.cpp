// The Pilot as host (pilot.h): of collectors (collector.h), sinks (sink.h), the tuner (tuning.h)
// and the cost meter (cost_meter.h). Whatever they throw is caught here, logged once with their
// name, and the one that threw is dropped or disabled; the training loop never sees it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <optional>

#include "pilot_internal.h"
#include "torchpilot/runtime/core/logging.h"

namespace torchpilot {

namespace {
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

// --- collectors -----------------------------------------------------------------------------

void Pilot::add_default_collectors(std::vector<std::shared_ptr<Collector>> given, bool all) {
  for (const DefaultCollector& d : default_collectors()) {
    if (!all && !d.always) continue;
    std::unique_ptr<Collector> c;
    if (const auto failed = start([&] { c = d.factory(*this); })) {
      logger_->warn("a default collector failed to start{}", reason_suffix(*failed));
      continue;
    }
    if (!c) continue;
    const bool replaced = std::any_of(
        given.begin(), given.end(), [&](const auto& g) { return g && name_of(*g) == name_of(*c); });
    if (!replaced) add_collector(std::move(c));
  }
  for (auto& c : given) add_collector(std::move(c));
}

void Pilot::insert_collector(Collector* c, bool front) {
  if (std::find(collectors_.begin(), collectors_.end(), c) != collectors_.end()) return;
  if (const auto failed = failure_of([&] { c->attach(this); })) {
    logger_->error("collector '{}' failed to attach and is not used{}", name_of(*c),
                   reason_suffix(*failed));
    (void)failure_of([&] { c->attach(nullptr); });  // it may have kept the host
    return;
  }
  unsigned hooks = kAllStepHooks;  // one whose step_hooks() throws is called at every hook
  (void)failure_of([&] { hooks = c->step_hooks(); });
  collector_hooks_.insert(front ? collector_hooks_.begin() : collector_hooks_.end(), hooks);
  collectors_.insert(front ? collectors_.begin() : collectors_.end(), c);
}

void Pilot::add_collector(Collector* collector) {
  if (collector == nullptr || !enabled_) return;
  insert_collector(collector, false);
}

void Pilot::add_collector(std::shared_ptr<Collector> collector, bool first) {
  if (collector == nullptr || !enabled_) return;
  Collector* c = collector.get();
  owned_collectors_.push_back(std::move(collector));
  insert_collector(c, first);
}

void Pilot::remove_collector(Collector* collector) {
  const auto it = std::find(collectors_.begin(), collectors_.end(), collector);
  if (it != collectors_.end()) {
    collector_hooks_.erase(collector_hooks_.begin() + (it - collectors_.begin()));
    collectors_.erase(it);
  }
  owned_collectors_.erase(std::remove_if(owned_collectors_.begin(), owned_collectors_.end(),
                                         [&](const auto& c) { return c.get() == collector; }),
                          owned_collectors_.end());
}

void Pilot::set_step_hooks(const Collector& who, unsigned hooks) {
  const auto it = std::find(collectors_.begin(), collectors_.end(), &who);
  if (it != collectors_.end())
    collector_hooks_[static_cast<size_t>(it - collectors_.begin())] = hooks;
}

void Pilot::drop_collector(size_t i) {
  Collector* c = collectors_[i];
  collectors_.erase(collectors_.begin() + static_cast<std::ptrdiff_t>(i));
  collector_hooks_.erase(collector_hooks_.begin() + static_cast<std::ptrdiff_t>(i));
  // It must not reach back into this Pilot later (its destructor would, after ours). An owned
  // one lives on, unused, until the Pilot goes.
  try {
    c->attach(nullptr);
  } catch (...) {
  }
}

void Pilot::request_window(int steps) {
  for_each_collector("on_window_request", [&](Collector& c) { c.on_window_request(steps); });
}

void Pilot::checkpoint_saved(int64_t step) {
  for_each_collector("on_checkpoint", [&](Collector& c) { c.on_checkpoint(step); });
}

// --- CollectorHost --------------------------------------------------------------------------

void Pilot::log(LogLevel level, const std::string& message) { log_to(*logger_, level, message); }

bool Pilot::steady_clock() const { return dynamic_cast<SteadyClock*>(clock_.get()) != nullptr; }

bool Pilot::tuning() const { return config_.mode == Mode::kAutotune && !tuning_finished(); }

void Pilot::publish(const LateStepRecord& record) {
  // A step's late record after the step's own: published while steps are being taken (from
  // on_step_record or on_step_complete), it waits for their sinks.
  if (taking_) {
    held_late_.push_back(record);
    return;
  }
  flush_steps();
  deliver_late(record);
}

bool Pilot::late_steps_wanted() const {
  for (unsigned hooks : collector_hooks_) {
    if ((hooks & kHookLateStep) != 0) return true;
  }
  // A sink whose answer throws is taken to want them: its on_late_step, guarded, tells.
  for (size_t i = 0; i < sinks_.size(); ++i) {
    if (sink_failed_[i]) continue;
    bool wants = true;
    (void)failure_of([&] { wants = sinks_[i]->wants_late_steps(); });
    if (wants) return true;
  }
  return false;
}

void Pilot::deliver_late(const LateStepRecord& record) {
  for_each_collector("on_late_step", kHookLateStep, [&](Collector& c) { c.on_late_step(record); });
  for_each_sink("on_late_step", [&](Sink& s) { s.on_late_step(record); });
}

bool Pilot::cost_allows(Nanos estimate_ns) const {
  return cost_->allows(clock_->now_ns(), estimate_ns);
}

void Pilot::cost_deferred(const std::string& what, Nanos estimate_ns) {
  const std::string line = cost_->deferred(clock_->now_ns(), what, estimate_ns);
  if (!line.empty()) logger_->info("{}", line);
}

void Pilot::charge_cost(Nanos ns) { cost_->charge_window(clock_->now_ns(), ns); }

// --- sinks ----------------------------------------------------------------------------------

void Pilot::add_default_sinks(std::vector<std::shared_ptr<Sink>> given) {
  for (const DefaultSink& d : default_sinks()) {
    std::shared_ptr<Sink> sink;
    if (const auto failed = start([&] { sink = d.factory(config_, logger_); })) {
      logger_->warn("sink '{}' failed to start{}", d.name, reason_suffix(*failed));
    }
    if (sink) sinks_.push_back(std::move(sink));
  }
  for (auto& s : given) sinks_.push_back(std::move(s));
  sink_failed_.assign(sinks_.size(), false);
}

void Pilot::add_sink(std::shared_ptr<Sink> sink) {
  flush_steps();  // a sink added gets the steps after it
  sinks_.push_back(std::move(sink));
  sink_failed_.push_back(false);
}

void Pilot::flush() {
  flush_steps();
  for_each_sink("flush", [](Sink& s) { s.flush(); });
}

// --- the tuner ------------------------------------------------------------------------------

void Pilot::knobs_changed() {
  // The tuner may apply its decided setting to the new knobs: user setters, which may throw
  // anything; tuning then stops with one line, and attaching the loader goes on.
  if (!tuner_) return;
  if (const auto failed = failure_of([&] { tuner_->knobs_changed(); })) stop_tuning(*failed);
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

SupplySample Pilot::supply() { return supply_ ? supply_() : SupplySample{}; }

void Pilot::publish_trial(const TrialResult& trial, bool kept) {
  flush_steps();
  for_each_sink("on_trial", [&](Sink& s) { s.on_trial(trial, kept); });
}

void Pilot::publish_decision(const TuningDecision& decision) {
  flush_steps();
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

void Pilot::set_trial_agreement(TrialAgreement agreement) {
  if (tuner_) tuner_->set_agreement(std::move(agreement));
}

const std::optional<TuningDecision>& Pilot::tuning_decision() const {
  static const std::optional<TuningDecision> none;
  return tuner_ ? tuner_->decision() : none;
}

bool Pilot::tuning_finished() const { return tuner_ && tuner_->finished(); }

}  // namespace torchpilot
