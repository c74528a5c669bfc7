// Checkpoints too rare for the observed failure rate (docs/advice.md, "checkpoint").
#include <algorithm>
#include <cstdio>

#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/reports/journal_stats.h"

namespace torchpilot {

std::optional<Advice> advise_checkpoint(const EpochSummary& summary, const AdvisorsConfig& config) {
  const RunJournalStats* j = summary.sections.get<RunJournalStats>();
  if (j == nullptr || j->failures == 0 || !measured(j->mtbf_s) || j->wall_s <= 0) return {};
  // Each failure loses on average half an interval; without checkpoints, what was measured.
  const double lost = j->checkpoints > 0 && measured(j->checkpoint_interval_s)
                          ? std::min(1.0, 0.5 * j->checkpoint_interval_s / j->mtbf_s)
                          : std::min(1.0, j->lost_s / j->wall_s);
  const double threshold = config.checkpoint.threshold;
  if (lost <= threshold) return {};
  // Target: half the threshold lost, i.e. an interval of threshold x MTBF.
  const double target_interval = threshold * j->mtbf_s;
  const double target_lost = threshold / 2;
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
  std::snprintf(buf, sizeof buf,
                "checkpoint at least every %.0f s (and report each with "
                "pilot.checkpoint_saved(step))",
                target_interval);
  a.action = buf;
  a.evidence = {{"failures", static_cast<double>(j->failures), "runs"},
                {"mtbf_s", j->mtbf_s, "s"},
                {"checkpoint_interval_s", j->checkpoint_interval_s, "s"},
                {"expected_lost_fraction", lost, "fraction"},
                {"ettr", j->ettr, "fraction"}};
  // The productive share rises from 1 - lost to 1 - target_lost (checkpoint cost not counted).
  a.expected_gain = (1 - target_lost) / std::max(1e-9, 1 - lost) - 1;
  return a;
}

}  // namespace torchpilot
