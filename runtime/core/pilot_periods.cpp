// The Pilot's reporting periods (pilot.h): epochs the trainer ends, intervals the Pilot closes
// when it does not (interval.h), and the last period at the Pilot's destruction.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "pilot_internal.h"
#include "torchpilot/runtime/core/advisor_registry.h"
#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/config_section.h"
#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/interval.h"

namespace torchpilot {

const char* to_string(PeriodEnd end) {
  static const char* const kNames[] = {"epoch", "interval", "exit"};  // PeriodEnd's order
  return detail::enum_name(end, kNames, "epoch");
}

}  // namespace torchpilot

// The kernel's own section; the anchor keeps it in programs that never make a Pilot (the analyzer
// reads the same config files).
TORCHPILOT_REGISTRATION(interval) {
  using torchpilot::config_key;
  using torchpilot::IntervalConfig;
  torchpilot::register_config_section<IntervalConfig>(
      {config_key<IntervalConfig, &IntervalConfig::seconds>("seconds", 0.0, 86400.0 * 365),
       config_key<IntervalConfig, &IntervalConfig::min_steps>("min_steps", 1, int64_t{1} << 40),
       config_key<IntervalConfig, &IntervalConfig::steps>("steps", 0, int64_t{1} << 40)});
}

namespace torchpilot {

IntervalRule::IntervalRule(const Config& config) {
  const IntervalConfig& c = config.section<IntervalConfig>();
  seconds_ns_ = static_cast<Nanos>(c.seconds * 1e9);
  min_steps_ = c.min_steps;
  steps_ = c.steps;
}

int64_t IntervalRule::proposal(int64_t steps, Nanos elapsed_ns) const {
  if (elapsed_ns <= 0) return min_steps_;
  const double n = std::ceil(static_cast<double>(seconds_ns_) * static_cast<double>(steps) /
                             static_cast<double>(elapsed_ns));
  return std::max<int64_t>(min_steps_, static_cast<int64_t>(std::min(n, 1e15)));
}

void IntervalRule::agreed(std::optional<int64_t> steps) {
  agreed_steps_ = steps && *steps > 0 ? *steps : -1;
}

void Pilot::set_interval_agreement(IntervalAgreement agreement) {
  interval_.set_agreement(std::move(agreement));
}

void Pilot::end_epoch() { end_period(PeriodEnd::kEpoch); }

void Pilot::close_interval() {
  interval_due_ = false;
  if (interval_.ask_ranks()) {
    // Every rank is at this step (the period's interval.min_steps-th): they agree on one length in
    // steps, each proposing what its own pace gives for interval.seconds.
    const Nanos t0 = clock_->now_ns();
    const int64_t steps = step_in_epoch_;
    const int64_t mine = interval_.proposal(steps, last_boundary_ns_ - period_begin_ns_);
    std::optional<int64_t> agreed;
    if (const auto failed = failure_of([&] { agreed = interval_.agreement()(mine); })) {
      logger_->warn("interval agreement failed{}", reason_suffix(*failed));
    }
    interval_.agreed(agreed);
    if (agreed) {
      logger_->info(
          "ranks agreed on intervals of {} steps (about {:g} s, interval.seconds) when "
          "no epoch ends",
          interval_.agreed_steps(), interval_.seconds());
    } else {
      logger_->warn(
          "the ranks did not agree on an interval length: no intervals by time "
          "(interval.steps still applies); end epochs with pilot.end_epoch()");
    }
    spend_own(t0, clock_->now_ns());
    if (!interval_.due(steps, period_begin_ns_, last_boundary_ns_)) return;
  }
  if (!interval_said_) {
    interval_said_ = true;
    std::string when;
    if (interval_.seconds() > 0)
      when = fmt::format("{:g} s (interval.seconds)", interval_.seconds());
    if (interval_.steps() > 0) {
      when += (when.empty() ? "" : " or ") + std::to_string(interval_.steps()) +
              " steps (interval.steps)";
    }
    logger_->info(
        "no epoch end after {}: torchpilot reports by interval until one comes; end epochs "
        "with pilot.end_epoch() (a watched or tunable loader ends one when its loop ends)",
        when);
  }
  end_period(PeriodEnd::kInterval);
}

void Pilot::end_period(PeriodEnd end) {
  if (config_.mode == Mode::kOff) return;
  if (step_open_) end_step();
  interval_due_ = false;
  if (accumulator_.empty() && step_batch_.empty()) return;
  if (cpu_clock_ && cpu_mark_ >= 0) (void)read_cpu(next_step_);  // up to its last step's end
  const Nanos began = clock_->now_ns();
  summary_cut_ns_ = -1;
  // Summarizing runs collectors, advisors and sinks (each guarded on its own); anything else that
  // goes wrong loses this period's summary, never the training loop, and the next one starts.
  if (const auto failed = failure_of([&] { summarize_epoch(began, end); })) {
    logger_->error("the summary of {} {} failed and is skipped{}", to_string(end), epoch_,
                   reason_suffix(*failed));
  }
  accumulator_.clear();
  step_batch_.clear();  // taken by the summary, or lost with it
  ++epoch_;
  step_in_epoch_ = 0;
  epoch_tuning_steps_ = 0;
  last_boundary_ns_ = -1;
  pending_wait_ns_.store(0, std::memory_order_relaxed);
  flush();
  // The epoch end's work: its summary counted it up to the sinks; the rest (log and record
  // writing) goes into the next epoch's figure.
  cost_->epoch_end_finished(began, summary_cut_ns_, clock_->now_ns());
  own_pending_ns_ = 0;  // between epochs: in no step
  cpu_mark_ = -1;
}

void Pilot::summarize_epoch(Nanos began, PeriodEnd end) {
  std::vector<std::pair<std::string, Nanos>> parts;  // where the epoch end's time went
  Nanos mark = began;
  auto part = [&](std::string name) {  // the time since the previous part
    const Nanos now = clock_->now_ns();
    parts.emplace_back(std::move(name), std::max<Nanos>(0, now - mark));
    mark = now;
  };
  // The period's steps still in a batch (short steps) are taken first: the epoch end's time.
  if (!step_batch_.empty()) {
    flush_steps();
    part("steps");
  }
  EpochSummary summary = accumulator_.summarize(epoch_, phase_names_);
  summary.closed_by = end;
  summary.tuning_steps = epoch_tuning_steps_;
  summary.tuned = tuning_finished() && !tuning_decision()->trials.empty();
  part("summary");
  for_each_collector("on_epoch_end", [&](Collector& o) {
    o.on_epoch_end(summary);
    part(name_of(o));
  });
  for_each_collector("on_epoch_complete", [&](Collector& o) { o.on_epoch_complete(summary); });
  std::vector<Advice> advice;
  std::vector<std::string> advisor_errors;
  if (const auto failed = failure_of(
          [&] { advice = run_registered_advisors(summary, config_, &advisor_errors); })) {
    logger_->error("advisors failed for epoch {}{}", epoch_, reason_suffix(*failed));
  }
  for (const auto& e : advisor_errors) logger_->error("advisor failed for epoch {}: {}", epoch_, e);
  for (auto& a : advice) a.epoch = epoch_;
  part("advisors");
  summary_cut_ns_ = clock_->now_ns();
  cost_->summarize(summary, began, summary_cut_ns_, std::move(parts), collectors_);
  for_each_sink("on_epoch", [&](Sink& s) { s.on_epoch(summary, advice); });
  epoch_summaries_.push_back(std::move(summary));
  last_advice_ = std::move(advice);
}

}  // namespace torchpilot
