#include "torchpilot/runtime/pilot.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "torchpilot/advisors/advisors.h"
#include "torchpilot/runtime/gpu_backend.h"
#include "torchpilot/runtime/loader_policy.h"
#include "torchpilot/runtime/trial_engine.h"
#include "torchpilot/runtime/gpu_monitor.h"
#include "torchpilot/runtime/logging.h"

namespace torchpilot {

std::shared_ptr<spdlog::logger> torchpilot_logger() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto logger = spdlog::get("torchpilot");
  if (!logger) {
    logger = std::make_shared<spdlog::logger>(
        "torchpilot", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    logger->set_pattern("[%H:%M:%S.%e] [torchpilot] [%^%l%$] %v");
    spdlog::register_logger(logger);
  }
  return logger;
}

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
      logger_(options.logger ? options.logger : torchpilot_logger()) {
  validate(config_);  // a Config built in code gets the same checks as a file
  // log.level governs torchpilot's own logger; a logger handed in keeps its level.
  if (!options.logger) logger_->set_level(spdlog::level::from_str(config_.log_level));
  if (config_.mode == Mode::kOff) return;
  history_.reserve(static_cast<size_t>(config_.step_history));
  sinks_.push_back(make_log_sink(logger_));
  if (!config_.json_path.empty()) sinks_.push_back(make_json_lines_sink(config_.json_path));
  for (auto& s : options.sinks) sinks_.push_back(std::move(s));
  sink_failed_.assign(sinks_.size(), false);
  logger_->info("mode {}{}", to_string(config_.mode),
                config_.json_path.empty() ? "" : ", records to " + config_.json_path);
  if (!config_.gpu.enabled) return;
  // GPU events carry steady-clock times: with another clock (a test's, a simulation's) they
  // cannot be placed in steps, unless the caller brings a backend that speaks that clock.
  if (!options.gpu_backend && dynamic_cast<SteadyClock*>(clock_.get()) == nullptr) {
    logger_->info(
        "GPU collectors off: the Pilot runs on a custom clock, GPU events use the "
        "steady clock");
    return;
  }
  start_gpu(std::move(options.gpu_backend));
}

void Pilot::start_gpu(std::shared_ptr<GpuBackend> backend) {
  try {
    if (!backend) backend = make_gpu_backend(config_.gpu, *logger_);
    const GpuDeviceInfo device = backend->device();
    if (device.sm_count <= 0) {
      std::string why;
      for (const auto& s : backend->status()) {
        if (!s.active && !s.reason.empty()) {
          why = s.reason;
          break;
        }
      }
      logger_->info("GPU collectors off: {}", why.empty() ? "no GPU" : why);
      return;
    }
    gpu_monitor_ = std::make_unique<GpuMonitor>(
        config_.gpu, std::move(backend), [this](const GpuStepRecord& r) { publish(r); },
        [this]() { return config_.mode != Mode::kAutotune || tuning_finished(); });
    for (const auto& s : gpu_monitor_->status()) {
      if (s.active) continue;
      logger_->info("GPU collector {} off: {}", s.name, s.reason);
    }
    logger_->info("GPU {} ({} SMs) observed", device.name, device.sm_count);
    observers_.insert(observers_.begin(), gpu_monitor_.get());
  } catch (const std::exception& e) {
    gpu_monitor_.reset();
    logger_->warn("GPU collectors off: {}", e.what());
  }
}

Pilot::~Pilot() {
  if (loader_ != nullptr) loader_->forget_pilot();
  for (StepObserver* o : observers_) {
    if (o != gpu_monitor_.get()) o->forget_pilot();
  }
  observers_.clear();
  flush();
}

void Pilot::log(LogLevel level, const std::string& message) {
  switch (level) {
    case LogLevel::kDebug:
      logger_->debug("{}", message);
      break;
    case LogLevel::kInfo:
      logger_->info("{}", message);
      break;
    case LogLevel::kWarn:
      logger_->warn("{}", message);
      break;
    case LogLevel::kError:
      logger_->error("{}", message);
      break;
  }
}

void Pilot::add_observer(StepObserver* observer) {
  if (observer == nullptr || !enabled_) return;
  if (std::find(observers_.begin(), observers_.end(), observer) == observers_.end()) {
    observers_.push_back(observer);
  }
}

void Pilot::remove_observer(StepObserver* observer) {
  observers_.erase(std::remove(observers_.begin(), observers_.end(), observer), observers_.end());
}

void Pilot::publish(const GpuStepRecord& record) {
  for_each_sink("on_gpu_step", [&](Sink& s) { s.on_gpu_step(record); });
}

void Pilot::drop_observer(size_t i) {
  StepObserver* o = observers_[i];
  observers_.erase(observers_.begin() + static_cast<std::ptrdiff_t>(i));
  // It must not reach back into this Pilot later (its destructor would, after ours).
  if (o != gpu_monitor_.get()) {
    try {
      o->forget_pilot();
    } catch (...) {
    }
  }
}

namespace {

// Runs `fn`; what it threw, as text ("" for a non-standard exception), or nothing.
template <typename Fn>
std::optional<std::string> failure_of(Fn&& fn) {
  try {
    fn();
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  } catch (...) {
    return std::string();
  }
}

std::string reason_suffix(const std::string& reason) {
  return reason.empty() ? std::string() : ": " + reason;
}

}  // namespace

template <typename Fn>
void Pilot::for_each_observer(const char* what, Fn&& fn) {
  for (size_t i = 0; i < observers_.size();) {
    StepObserver* o = observers_[i];
    if (const auto failed = failure_of([&] { fn(*o); })) {
      logger_->error("observer '{}' failed in {} and is removed{}", o->name(), what,
                     reason_suffix(*failed));
      drop_observer(i);
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
  if (!observers_.empty()) {
    const int64_t n = next_step_;
    const Nanos t = step_begin_ns_;
    for_each_observer("on_step_begin", [&](StepObserver& o) { o.on_step_begin(n, t); });
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
  if (!observers_.empty()) {
    static const std::string unnamed = "phase";
    const std::string& name = static_cast<size_t>(id) < phase_names_.size()
                                  ? phase_names_[static_cast<size_t>(id)]
                                  : unnamed;
    for_each_observer("on_phase_begin", [&](StepObserver& o) { o.on_phase_begin(id, name); });
  }
  return PhaseScope(this, id, clock_->now_ns());
}

void Pilot::end_phase(int id, Nanos begin) {
  phase_ns_[id] += clock_->now_ns() - begin;
  if (!observers_.empty()) {
    for_each_observer("on_phase_end", [&](StepObserver& o) { o.on_phase_end(id); });
  }
}

void Pilot::end_step() {
  const int64_t samples = open_step_samples_;
  const Nanos now = clock_->now_ns();
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
  last_boundary_ns_ = now;
  step_open_ = false;

  if (history_.size() < static_cast<size_t>(config_.step_history)) {
    history_.push_back(r);
  } else {
    history_[history_next_] = r;
    history_next_ = (history_next_ + 1) % history_.size();
  }
  for_each_observer("on_step_end", [&](StepObserver& o) { o.on_step_end(r); });
  accumulator_.add(r);
  for_each_sink("on_step", [&](Sink& s) { s.on_step(r, phase_names_); });

  if (config_.mode != Mode::kAutotune || (engine_ && engine_->finished())) return;
  if (!engine_) {
    engine_ = std::make_unique<TrialEngine>(knobs_, make_loader_policy(config_.autotune),
                                            config_.autotune);
    engine_->on_trial = [this](const TrialResult& t, bool kept) {
      for_each_sink("on_trial", [&](Sink& s) { s.on_trial(t, kept); });
    };
    engine_->supply_probe = [this]() {
      TrialEngine::SupplySample sample;
      if (loader_ != nullptr) {
        const LoaderStats s = loader_->stats();
        sample = {s.produce_count, s.produce_ns, s.settings.workers};
      }
      return sample;
    };
  }
  ++epoch_tuning_steps_;
  try {
    engine_->on_step(r);
  } catch (const std::exception& e) {
    logger_->error("autotune stopped after an internal error: {}", e.what());
    try {
      engine_->abandon(std::string("internal error: ") + e.what());  // applies the best so far
    } catch (const std::exception& again) {
      logger_->error("autotune could not restore the best setting: {}", again.what());
    }
    engine_.reset();
    config_.mode = Mode::kAdvise;
    return;
  }
  if (engine_->finished()) {
    const TuningDecision& d = *engine_->decision();
    if (d.trials.empty() && !warned_nothing_to_tune_) {
      warned_nothing_to_tune_ = true;
      logger_->warn("autotune: nothing to tune ({}); attach a torchpilot::TunableLoader", d.reason);
      return;
    }
    for_each_sink("on_decision", [&](Sink& s) { s.on_decision(d); });
  }
}

void Pilot::end_epoch() {
  if (config_.mode == Mode::kOff) return;
  if (step_open_) end_step();
  if (accumulator_.empty()) return;
  EpochSummary summary = accumulator_.summarize(epoch_, phase_names_);
  summary.tuning_steps = epoch_tuning_steps_;
  summary.tuned = engine_ && engine_->finished() && !engine_->decision()->trials.empty();
  epoch_tuning_steps_ = 0;
  if (loader_ != nullptr) {
    LoaderStats now = loader_->stats();
    summary.loader = loader_delta(now, loader_at_epoch_start_);
    loader_at_epoch_start_ = now;
  }
  for_each_observer("on_epoch_end", [&](StepObserver& o) { o.on_epoch_end(summary); });
  std::vector<Advice> advice;
  try {
    advice = run_advisors(summary, config_);
  } catch (const std::exception& e) {
    logger_->error("advisors failed for epoch {}: {}", epoch_, e.what());
  }
  for (auto& a : advice) a.epoch = epoch_;
  for_each_sink("on_epoch", [&](Sink& s) { s.on_epoch(summary, advice); });
  epoch_summaries_.push_back(std::move(summary));
  last_advice_ = std::move(advice);
  accumulator_.clear();
  ++epoch_;
  step_in_epoch_ = 0;
  last_boundary_ns_ = -1;
  pending_wait_ns_.store(0, std::memory_order_relaxed);
  flush();
}

void Pilot::add_sink(std::shared_ptr<Sink> sink) {
  sinks_.push_back(std::move(sink));
  sink_failed_.push_back(false);
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
  loader_at_epoch_start_ = probe->stats();
  for (auto& k : knobs) knobs_.add(std::move(k));
  if (!engine_) return;
  if (!engine_->finished()) {
    engine_.reset();  // a search over another loader's knobs means nothing now: start afresh
  } else if (engine_->decision() && !engine_->decision()->trials.empty()) {
    // Tuning is over: the new loader gets the decided setting.
    try {
      knobs_.apply(engine_->decision()->chosen);
    } catch (const std::exception& e) {
      logger_->warn("could not apply the tuned loader setting to the new loader: {}", e.what());
    }
  }
}

void Pilot::detach_loader(LoaderProbe* probe) {
  if (loader_ != probe) return;
  loader_ = nullptr;
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
  return engine_ ? engine_->decision() : none;
}

bool Pilot::tuning_finished() const { return engine_ && engine_->finished(); }

}  // namespace torchpilot
