// Checkpoints too rare for the observed failure rate (docs/advice.md, "checkpoint").
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/stalls/stall_model.h"
#include "torchpilot/runtime/reports/journal_stats.h"

namespace torchpilot {

using detail::num;

std::optional<Advice> advise_checkpoint(const EpochSummary& summary, const AdvisorsConfig& config) {
  const RunJournalStats* j = summary.sections.get<RunJournalStats>();
  if (j == nullptr || j->failures == 0 || !measured(j->mtbf_s) || j->wall_s <= 0) return {};
  const double threshold = config.checkpoint.threshold;
  // The interval to advise and a checkpoint's cost are the ones periodic_stall states too
  // (stall_model.h): Young's interval where a checkpoint's stall gives the cost.
  const std::optional<CheckpointPlan> plan = checkpoint_plan(summary, threshold);
  if (!plan) return {};
  // Each failure loses on average half an interval; without checkpoints, what was measured.
  const double lost = j->checkpoints > 0 && measured(j->checkpoint_interval_s)
                          ? std::min(1.0, 0.5 * j->checkpoint_interval_s / j->mtbf_s)
                          : std::min(1.0, j->lost_s / j->wall_s);
  if (lost <= threshold) return {};
  const bool young = measured(plan->young_s);
  // Checkpoints already at least as frequent as Young's interval: more would cost more in
  // checkpoints than they save in redone work.
  if (young && measured(plan->interval_s) && plan->young_s >= plan->interval_s) return {};
  const double target_interval = plan->target_s;
  // Lost at the target: half an interval per failure, plus the checkpoints' own cost where known.
  const double cost_share = [&](double interval_s) {
    return young && interval_s > 0 ? plan->cost_s / interval_s : 0.0;
  }(target_interval);
  const double target_lost = std::min(1.0, 0.5 * target_interval / j->mtbf_s + cost_share);
  const double lost_now =
      std::min(1.0, lost + (young && measured(plan->interval_s) && plan->interval_s > 0
                                ? plan->cost_s / plan->interval_s
                                : 0.0));
  Advice a;
  a.id = "checkpoint";
  a.severity = lost > 4 * threshold ? Severity::kHigh : Severity::kWarning;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "%lld failures in %.0f s (one every %.0f s); checkpoints every %s: about %.1f%% "
      "of wall time is lost redoing work (ETTR %.1f%%)",
      static_cast<long long>(j->failures), j->wall_s, j->mtbf_s,
      j->checkpoints > 0
          ? (std::to_string(static_cast<long long>(j->checkpoint_interval_s)) + " s").c_str()
          : "never",
      100 * lost, 100 * (measured(j->ettr) ? j->ettr : 0));
  a.finding = buf;
  a.cause = "the checkpoint interval is long against the mean time between failures";
  a.evidence = {{"failures", static_cast<double>(j->failures), "runs"},
                {"mtbf_s", j->mtbf_s, "s"},
                {"checkpoint_interval_s", j->checkpoint_interval_s, "s"},
                {"expected_lost_fraction", lost, "fraction"},
                {"ettr", j->ettr, "fraction"}};
  if (young) {
    // The checkpoint's stall: its period and cost as periodic_stall gives them.
    a.evidence.push_back({"stall_period", static_cast<double>(plan->period_steps), "steps"});
    a.evidence.push_back({"checkpoint_cost", plan->cost_s * 1e3, "ms"});
    a.evidence.push_back({"young_interval", plan->young_s, "s"});
    a.action = "checkpoint about every " + num(target_interval, "%.3g") +
               " s: Young's interval sqrt(2 x cost x MTBF) from the checkpoint's stall (every " +
               std::to_string(plan->period_steps) + " steps, " + num(plan->cost_s * 1e3, "%.3g") +
               " ms each) and the MTBF (and report each with pilot.checkpoint_saved(step))";
  } else {
    a.evidence.push_back({"target_interval", target_interval, "s"});
    std::snprintf(buf, sizeof buf,
                  "checkpoint at least every %.0f s (and report each with "
                  "pilot.checkpoint_saved(step))",
                  target_interval);
    a.action = buf;
  }
  // The productive share rises from 1 - lost to 1 - target_lost (a checkpoint's cost counted
  // where its stall measured it).
  a.expected_gain = std::max(0.0, (1 - target_lost) / std::max(1e-9, 1 - lost_now) - 1);
  return a;
}

}  // namespace torchpilot
