#include "torchpilot/runtime/tune/trial_engine.h"

#include <algorithm>
#include <cmath>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/core/metrics.h"

namespace torchpilot {
namespace {

constexpr double kDecline = 0.85;  // finalists: within this of the best (the loader policy's)

}  // namespace

TrialEngine::TrialEngine(KnobRegistry& knobs, std::unique_ptr<TuningPolicy> policy,
                         AutotuneConfig config)
    : knobs_(knobs), policy_(std::move(policy)), config_(std::move(config)) {}

void TrialEngine::on_step(const StepRecord& record) {
  if (finished()) return;
  if (!started_) {
    if (knobs_.knobs().empty()) {
      // A loader may be attached after a few steps: wait for knobs as long as a warm-up lasts.
      last_step_ = record.step;
      if (++steps_without_knobs_ >= std::max(1, config_.warmup_steps)) {
        conclude("no tunable knobs registered");
      }
      return;
    }
    started_ = true;
    first_step_ = record.step;
    first_begin_ns_ = record.begin_ns;
    last_end_ns_ = record.end_ns;
    // The step that just ended ran with the baseline; measurement starts after settling.
    current_ = knobs_.snapshot();
    if (memory_probe) (void)failure_of([&] { memory_probe.reset(); });
    begin_settling();
    TrialResult baseline;
    baseline.setting = current_;
    trials_.push_back(std::move(baseline));
    return;
  }
  last_step_ = record.step;
  last_end_ns_ = record.end_ns;
  samples_reported_ = samples_reported_ || record.samples > 0;
  if (resume_after_step_) {  // the failed step, rerun with the incumbent: not measured
    resume_after_step_ = false;
    next_trial();
    return;
  }
  if (settle_left_ > 0) {
    if (--settle_left_ == 0) begin_window();
    return;
  }
  window_ns_.push_back(record.step_ns());
  window_wait_ns_ += record.data_wait_ns;
  window_samples_.push_back(record.samples);
  window_total_ns_ += record.step_ns();
  // A window needs both enough steps and enough time: a few fast steps are mostly jitter. With
  // ranks agreeing, the count of steps is agreed instead (each rank's time differs).
  if (agreement) {
    if (static_cast<int64_t>(window_ns_.size()) >= window_target_) finish_trial();
  } else if (static_cast<int>(window_ns_.size()) >= config_.measure_steps &&
             window_total_ns_ >= static_cast<Nanos>(config_.min_window_ms * 1e6)) {
    finish_trial();
  }
}

bool TrialEngine::budget_allows_another_trial(const TrialResult* like, int reserved) const {
  const int64_t used_steps = last_step_ - first_step_ + 1;
  const Nanos used_ns =
      agreed_elapsed_ns_ >= 0 ? agreed_elapsed_ns_ : last_end_ns_ - first_begin_ns_;
  // The next trial costs about what the last measured one did: settle + window, in steps and in
  // time (a failed trial has no step time: it would make the next window look endless). A
  // re-measurement costs what its setting's own trial did, settling included.
  Nanos last_step_ns = like != nullptr ? like->mean_step_ns : 0;
  const int extra_settle =
      like != nullptr ? std::max(0, policy_->extra_settle_steps(current_, like->setting)) : 0;
  for (auto it = trials_.rbegin(); it != trials_.rend() && last_step_ns <= 0; ++it) {
    last_step_ns = it->mean_step_ns;
  }
  if (last_step_ns <= 0 && last_step_ > first_step_) {
    last_step_ns = (last_end_ns_ - first_begin_ns_) / (last_step_ - first_step_ + 1);
  }
  const double step_ns = std::max<double>(1.0, static_cast<double>(last_step_ns));
  const double window_steps =
      std::max<double>(config_.measure_steps, config_.min_window_ms * 1e6 / step_ns);
  const double need_steps = config_.settle_steps + extra_settle + window_steps +
                            std::max(0, reserved) * (config_.settle_steps + window_steps);
  const double need_ns = need_steps * step_ns;
  // Whichever budget is larger applies: steps for slow steps, seconds for fast ones.
  return used_steps + need_steps <= config_.warmup_steps ||
         used_ns + need_ns <= config_.warmup_seconds * 1e9;
}

void TrialEngine::begin_settling(int extra) {
  settle_left_ = config_.settle_steps + extra;
  if (settle_left_ == 0) begin_window();
}

void TrialEngine::begin_window() {
  window_target_ = config_.measure_steps;
  round_ = 0;
  window_supply_start_.reset();
  if (supply_probe) window_supply_start_ = supply_probe();
}

bool TrialEngine::better(const TrialResult& candidate, const TrialResult& incumbent) const {
  if (candidate.failed) return false;
  if (incumbent.failed) return true;
  // The required gain grows with how uncertain both window means are, within a cap: bursty
  // arrivals (a worker pool delivering batches in pairs) inflate the error without real noise.
  const double noise = std::hypot(incumbent.relative_error, candidate.relative_error);
  const double margin = std::max(config_.noise_margin, std::min(kMaxNoiseMargin, noise));
  return candidate.throughput > incumbent.throughput * (1.0 + margin);
}

void TrialEngine::finish_trial() {
  TrialResult& t = trials_.back();
  t.first_step = last_step_ - static_cast<int64_t>(window_ns_.size()) + 1;
  t.last_step = last_step_;
  const Nanos total_ns = window_total_ns_;  // summed as the steps came in
  int64_t total_samples = 0;
  for (int64_t n : window_samples_) total_samples += n;
  const auto steps = static_cast<int64_t>(window_ns_.size());
  t.mean_step_ns = total_ns / steps;
  t.relative_error = relative_standard_error(window_ns_);
  t.unit = samples_reported_ ? "samples/s" : "steps/s";
  const double units = samples_reported_ ? static_cast<double>(total_samples) : steps;
  t.throughput = total_ns > 0 ? units * 1e9 / static_cast<double>(total_ns) : 0;
  t.demand = t.throughput;
  // Steps fed from a backlog built under an earlier setting look faster than the setting can
  // sustain. Capacity = parallel producers / mean time per unit, from the window's production;
  // it does not depend on how full the queue was (nor on an epoch's end, when nothing is left
  // to produce and the window has no production to measure).
  if (supply_probe && window_supply_start_) {
    const SupplySample end = supply_probe();
    const int64_t units = end.units - window_supply_start_->units;
    const Nanos busy = end.busy_ns - window_supply_start_->busy_ns;
    if (end.parallelism > 0 && units >= kMinSupplyUnits && busy > 0) {
      const double units_per_s = end.parallelism * static_cast<double>(units) * 1e9 / busy;
      const double units_per_step =
          samples_reported_ ? static_cast<double>(total_samples) / steps : 1.0;
      t.supply_capacity = units_per_s * units_per_step;
      if (t.supply_capacity < t.throughput) {
        t.throughput = t.supply_capacity;
        t.supply_limited = true;
      }
    }
  }
  t.data_wait_fraction = fraction(window_wait_ns_, total_ns);
  read_memory_peak(t);
  if (agreement && !agree_on(t)) return;
  window_ns_.clear();
  window_samples_.clear();
  window_wait_ns_ = 0;
  window_total_ns_ = 0;

  if (t.confirmation) {  // a re-measurement: never kept on its own, decided at the end
    if (on_trial) on_trial(t, false);
    if (t.failed) drop_finalist(t.setting);
    next_trial();
    return;
  }
  const size_t index = trials_.size() - 1;
  bool kept = index == 0;
  if (index > 0 && better(t, trials_[incumbent_])) {
    incumbent_ = index;
    kept = true;
  }
  if (on_trial) on_trial(t, kept);
  next_trial();
}

std::string TrialEngine::budget_reason() const {
  return "warm-up budget reached (" + std::to_string(config_.warmup_steps) + " steps or " +
         std::to_string(static_cast<int>(config_.warmup_seconds)) + " s, whichever is larger)";
}

void TrialEngine::next_trial() {
  if (confirming_) {  // the policy said its last word: only re-measurements remain
    next_confirmation();
    return;
  }
  // The search leaves room for one round of confirmation: a search that spends the whole budget
  // (slow steps) would otherwise end on its luckiest window with nothing to check it.
  const bool confirms = config_.confirm_rounds > 0 && config_.confirm_settings >= 2;
  if (!budget_allows_another_trial(nullptr, confirms ? config_.confirm_settings : 0)) {
    const std::string reason = budget_reason();
    if (!begin_confirmation(reason)) conclude(reason);
    return;
  }
  std::optional<Setting> next = policy_->propose(trials_, incumbent_, knobs_);
  if (!next) {
    if (!begin_confirmation("search complete")) conclude("search complete");
    return;
  }
  start_trial(*next);
}

void TrialEngine::start_trial(const Setting& setting, bool confirmation) {
  TrialResult trial;
  trial.setting = setting;
  trial.confirmation = confirmation;
  local_failure_.clear();
  if (agreement) {
    // Every rank must measure this trial over the same steps: a setter failure here runs the
    // window with the incumbent and fails the trial on all ranks when the windows are combined.
    if (const auto failed = failure_of([&] { knobs_.apply(setting); })) {
      local_failure_ = "applying the setting failed: " + *failed;
      const Setting& back = trials_[safe_trial_excluding(setting)].setting;
      if (const auto again = failure_of([&] { knobs_.apply(back); })) {
        local_failure_ += "; restoring the incumbent failed: " + *again;
      }
    }
    current_ = setting;
    begin_settling();
    trials_.push_back(std::move(trial));
    return;
  }
  // A setter is user code: whatever it throws (std or not) fails the trial, never the step.
  if (const auto failed = failure_of([&] { knobs_.apply(setting); })) {
    trial.failed = true;
    trial.note = "applying the setting failed: " + *failed;
    trials_.push_back(std::move(trial));
    if (on_trial) on_trial(trials_.back(), false);
    if (confirmation) drop_finalist(setting);  // the incumbent moves off it if it was its setting
    if (const auto again = failure_of([&] { knobs_.apply(trials_[incumbent_].setting); })) {
      conclude("restoring the incumbent failed: " + *again);
      return;
    }
    if (confirming_) {
      next_confirmation();
      return;
    }
    std::optional<Setting> next = policy_->propose(trials_, incumbent_, knobs_);
    if (next) {
      start_trial(*next);
    } else if (!begin_confirmation("search complete")) {
      conclude("search complete");
    }
    return;
  }
  const int extra = policy_->extra_settle_steps(current_, setting);
  current_ = setting;
  trials_.push_back(std::move(trial));
  if (memory_probe) (void)failure_of([&] { memory_probe.reset(); });
  begin_settling(std::max(0, extra));
}

void TrialEngine::read_memory_peak(TrialResult& t) {
  if (!memory_probe) return;
  std::optional<MemoryPeak> peak;
  if (failure_of([&] { peak = memory_probe.read(); }) || !peak || peak->capacity_bytes <= 0) return;
  t.peak_memory_bytes = peak->peak_allocated_bytes;
  t.peak_memory_fraction =
      static_cast<double>(peak->peak_allocated_bytes) / static_cast<double>(peak->capacity_bytes);
  if (t.peak_memory_fraction <= config_.memory_headroom) return;
  // Over the headroom: a later step (other shapes, a fragmented cache) could run out where the
  // trial did not. With ranks agreeing, the failure travels in this rank's window.
  const std::string why =
      "peak allocated " + std::to_string(t.peak_memory_bytes >> 20) +
      " MiB = " + std::to_string(static_cast<int>(t.peak_memory_fraction * 100)) +
      "% of the device's memory, above autotune.memory_headroom " +
      std::to_string(static_cast<int>(config_.memory_headroom * 100)) + "%";
  if (agreement) {
    if (local_failure_.empty()) local_failure_ = why;
  } else {
    t.failed = true;
    t.note = why;
  }
}

bool TrialEngine::fail_current_trial(const std::string& reason) {
  // While the failed step reruns with the incumbent, no trial runs: an error there is the step's.
  if (!trial_running() || trials_.empty() || resume_after_step_) return false;
  const size_t index = trials_.size() - 1;
  if (agreement) {
    // Every rank measures the same steps: this rank runs the rest of the window with the
    // incumbent and the trial fails on all ranks when the windows are combined.
    if (local_failure_.empty()) local_failure_ = reason;
    const size_t back = safe_trial_excluding(trials_.back().setting);
    if (index != back) {
      if (const auto failed = failure_of([&] { knobs_.apply(trials_[back].setting); })) {
        local_failure_ += "; restoring the incumbent failed: " + *failed;
      }
    }
    return true;
  }
  TrialResult& t = trials_.back();
  t.failed = true;
  t.note = reason;
  t.first_step = last_step_ + 1;  // the step that failed (it has not ended yet)
  t.last_step = last_step_ + 1;
  window_ns_.clear();
  window_samples_.clear();
  window_wait_ns_ = 0;
  window_total_ns_ = 0;
  settle_left_ = 0;
  if (on_trial) on_trial(t, false);
  if (t.confirmation) drop_finalist(t.setting);  // the incumbent moves off it if it was its setting
  if (index != incumbent_) {
    if (const auto again = failure_of([&] { knobs_.apply(trials_[incumbent_].setting); })) {
      conclude("restoring the incumbent failed: " + *again);
      return true;
    }
    current_ = trials_[incumbent_].setting;
    // The failed step runs again with the incumbent, which fits; the next trial starts after it.
    resume_after_step_ = true;
    return true;
  }
  // The start itself failed: nothing fits to go back to, the next trial (smaller) reruns it.
  next_trial();
  // The failed step ends under the next trial's setting, slowed by the failure: not measured.
  if (!finished() && settle_left_ == 0) settle_left_ = 1;
  return true;
}

bool TrialEngine::agree_on(TrialResult& t) {
  TrialWindow mine;
  mine.trial = static_cast<int64_t>(trials_.size()) - 1;
  mine.round = round_;
  mine.first_step = t.first_step;
  mine.last_step = t.last_step;
  mine.throughput = t.throughput;
  mine.demand = t.demand;
  mine.supply_capacity = t.supply_capacity;
  mine.supply_limited = t.supply_limited;
  mine.mean_step_ns = t.mean_step_ns;
  mine.relative_error = t.relative_error;
  mine.data_wait_fraction = t.data_wait_fraction;
  mine.window_ns = window_total_ns_;
  mine.elapsed_ns = last_end_ns_ - first_begin_ns_;
  mine.peak_memory_fraction = t.peak_memory_fraction;
  mine.peak_memory_bytes = t.peak_memory_bytes;
  mine.failed = !local_failure_.empty();
  mine.note = local_failure_;
  std::optional<TrialWindow> agreed;
  if (const auto failed = failure_of([&] { agreed = agreement(mine); })) agreed.reset();
  if (!agreed) {
    // Some rank did not answer: every rank keeps the settings it started with.
    incumbent_ = 0;
    conclude("a rank missed the tuning exchange: the starting settings are kept");
    return false;
  }
  const auto min_window = static_cast<Nanos>(config_.min_window_ms * 1e6);
  if (agreed->window_ns < min_window && round_ < kMaxRounds) {
    const double step = std::max<double>(1.0, static_cast<double>(agreed->mean_step_ns));
    const auto extra =
        static_cast<int64_t>(std::ceil(static_cast<double>(min_window - agreed->window_ns) / step));
    window_target_ += std::max<int64_t>(1, extra);
    ++round_;
    return false;
  }
  t.throughput = agreed->throughput;
  t.demand = agreed->demand;
  t.supply_capacity = agreed->supply_capacity;
  t.supply_limited = agreed->supply_limited;
  t.mean_step_ns = agreed->mean_step_ns;
  t.relative_error = agreed->relative_error;
  t.data_wait_fraction = agreed->data_wait_fraction;
  t.peak_memory_fraction = agreed->peak_memory_fraction;
  t.peak_memory_bytes = agreed->peak_memory_bytes;
  t.failed = agreed->failed;
  if (agreed->failed) t.note = agreed->note.empty() ? "failed on another rank" : agreed->note;
  agreed_elapsed_ns_ = agreed->elapsed_ns;
  return true;
}

void TrialEngine::conclude(const std::string& reason) {
  TuningDecision d;
  d.policy = policy_ ? policy_->name() : "none";
  d.reason = reason;
  d.decided_at_step = last_step_;
  d.steps_used = started_ ? last_step_ - first_step_ + 1 : 0;
  d.trials = trials_;
  d.unit = samples_reported_ ? "samples/s" : "steps/s";
  if (!trials_.empty()) {
    d.baseline = trials_.front().setting;
    d.baseline_throughput = trials_.front().throughput;
    d.chosen = trials_[incumbent_].setting;
    d.chosen_throughput = chosen_score_.value_or(trials_[incumbent_].throughput);
    if (const auto failed = failure_of([&] { knobs_.apply(d.chosen); })) {
      d.reason += "; applying the chosen setting failed: " + *failed;
      d.chosen = knobs_.snapshot();
    }
  }
  decision_ = std::move(d);
}

double TrialEngine::score_of(const Setting& setting, int rounds) const {
  std::vector<double> measured;
  for (size_t i = 0; i < trials_.size(); ++i) {
    const TrialResult& t = trials_[i];
    if (t.failed || t.setting != setting) continue;
    if (t.confirmation && rounds >= 0) {
      const auto r = confirm_round_.find(i);
      if (r == confirm_round_.end() || r->second >= rounds) continue;
    }
    measured.push_back(t.throughput);
  }
  return measured.empty() ? 0 : detail::median(std::move(measured));
}

size_t TrialEngine::latest_measured(const Setting& setting) const {
  for (size_t i = trials_.size(); i-- > 0;) {
    if (!trials_[i].failed && trials_[i].setting == setting) return i;
  }
  return incumbent_;
}

size_t TrialEngine::safe_trial_excluding(const Setting& setting) const {
  if (trials_[incumbent_].setting != setting) return incumbent_;
  // The incumbent's own setting failed (in a re-measurement): the best other finalist, else the
  // best other setting that never failed.
  std::optional<size_t> best;
  double best_score = 0;
  for (const Setting& s : finalists_) {
    const double score = score_of(s);
    if (s != setting && (!best || score > best_score)) {
      best = latest_measured(s);
      best_score = score;
    }
  }
  if (best) return *best;
  for (size_t i = 0; i < trials_.size(); ++i) {
    const TrialResult& t = trials_[i];
    if (!t.failed && !ever_failed(t.setting) && t.setting != setting &&
        (!best || t.throughput > trials_[*best].throughput)) {
      best = i;
    }
  }
  return best.value_or(incumbent_);
}

bool TrialEngine::ever_failed(const Setting& setting) const {
  return std::any_of(trials_.begin(), trials_.end(),
                     [&](const TrialResult& t) { return t.failed && t.setting == setting; });
}

size_t TrialEngine::confirmations_started() const {
  return static_cast<size_t>(std::count_if(trials_.begin(), trials_.end(),
                                           [](const TrialResult& t) { return t.confirmation; }));
}

bool TrialEngine::begin_confirmation(const std::string& reason) {
  if (config_.confirm_rounds <= 0 || config_.confirm_settings < 2) return false;
  // Distinct settings that never failed (one that ran out of memory once may again), ranked by
  // the median of their measurements; ties keep the earlier one first.
  std::vector<std::pair<double, Setting>> ranked;
  for (const auto& t : trials_) {
    const bool listed = std::any_of(ranked.begin(), ranked.end(),
                                    [&](const auto& r) { return r.second == t.setting; });
    if (!listed && !ever_failed(t.setting)) ranked.emplace_back(score_of(t.setting), t.setting);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  finalists_.clear();
  for (const auto& [score, setting] : ranked) {
    // Settings that clearly lost need no second look.
    if (static_cast<int>(finalists_.size()) >= config_.confirm_settings ||
        score < kDecline * ranked.front().first) {
      break;
    }
    finalists_.push_back(setting);
  }
  if (finalists_.size() < 2) return false;
  // Round r starts at finalist r mod K: slow drift over the rounds favours none of them.
  const size_t k = finalists_.size();
  confirm_queue_.clear();
  for (size_t r = 0; r < static_cast<size_t>(config_.confirm_rounds); ++r) {
    for (size_t i = 0; i < k; ++i) confirm_queue_.push_back(finalists_[(r + i) % k]);
  }
  // Not even one re-measurement fits: the search's own decision stands.
  if (!budget_allows_another_trial(&trials_[latest_measured(confirm_queue_.front())])) {
    return false;
  }
  confirming_ = true;
  confirm_k_ = k;
  confirm_next_ = 0;
  confirm_budget_cut_ = false;
  search_end_reason_ = reason;
  next_confirmation();
  return true;
}

void TrialEngine::next_confirmation() {
  const auto in = [&](const Setting& s) {
    return std::find(finalists_.begin(), finalists_.end(), s) != finalists_.end();
  };
  while (confirm_next_ < confirm_queue_.size() && !in(confirm_queue_[confirm_next_])) {
    ++confirm_next_;  // dropped: its re-measurement failed
  }
  if (confirm_next_ == confirm_queue_.size()) {
    decide_confirmation();
    return;
  }
  const Setting setting = confirm_queue_[confirm_next_];
  if (!budget_allows_another_trial(&trials_[latest_measured(setting)])) {
    confirm_budget_cut_ = true;  // decide with what was measured so far
    decide_confirmation();
    return;
  }
  confirm_round_[trials_.size()] = static_cast<int>(confirm_next_ / confirm_k_);
  ++confirm_next_;
  start_trial(setting, /*confirmation=*/true);
}

void TrialEngine::drop_finalist(const Setting& setting) {
  const auto it = std::find(finalists_.begin(), finalists_.end(), setting);
  if (it == finalists_.end()) return;
  // The incumbent must be a setting that works: the one to go back to after a failure.
  incumbent_ = safe_trial_excluding(setting);
  finalists_.erase(it);
}

void TrialEngine::decide_confirmation() {
  // The finalists were measured alike: the best median wins, without a noise margin. A tie keeps
  // the search's own choice. Cut short by the budget, only whole rounds count: a finalist left
  // out of the last round would compete with its single search figure (often its luckiest)
  // against others' medians; without a whole round the search's choice stands.
  const int rounds = confirm_budget_cut_ ? static_cast<int>(confirm_next_ / confirm_k_) : -1;
  if (rounds == 0) {
    std::string reason = search_end_reason_ + "; the warm-up budget ran out before the top " +
                         std::to_string(confirm_k_) + " settings were all re-measured (" +
                         std::to_string(confirmations_started()) + " of " +
                         std::to_string(confirm_queue_.size()) + "): the search's choice stands";
    conclude(reason);
    return;
  }
  std::optional<Setting> best;
  double best_score = 0;
  for (const Setting& s : finalists_) {
    const double score = score_of(s, rounds);
    if (!best || score > best_score || (score == best_score && s == trials_[incumbent_].setting)) {
      best = s;
      best_score = score;
    }
  }
  std::string reason =
      search_end_reason_ + "; top " + std::to_string(confirm_k_) + " settings re-measured";
  if (confirm_budget_cut_) {
    reason += ", interleaved, until the warm-up budget ran out (" +
              std::to_string(confirmations_started()) + " of " +
              std::to_string(confirm_queue_.size()) + " re-measurements; " +
              std::to_string(rounds) + " whole round" + (rounds == 1 ? "" : "s") + " counted)";
  } else {
    const int all = config_.confirm_rounds;
    reason += all == 1 ? " once" : " " + std::to_string(all) + " times, interleaved";
  }
  if (const size_t dropped = confirm_k_ - finalists_.size(); dropped > 0) {
    reason += "; " + std::to_string(dropped) + " dropped (a re-measurement failed)";
  }
  if (best) {
    incumbent_ = latest_measured(*best);
    chosen_score_ = best_score;
  }
  conclude(reason);
}

}  // namespace torchpilot
