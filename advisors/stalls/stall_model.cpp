#include "torchpilot/advisors/stalls/stall_model.h"

#include <algorithm>
#include <cmath>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/runtime/reports/journal_stats.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

bool contains(const std::string& text, const char* word) {
  return detail::lower(text).find(word) != std::string::npos;
}

}  // namespace

StallNature stall_nature(const OutlierStats& o) {
  StallNature n;
  n.data = measured(o.data_wait_share) && o.data_wait_share >= 0.5;
  n.own = measured(o.own_share) && o.own_share >= 0.5;
  n.phased = !o.phase.empty() && measured(o.phase_share) && o.phase_share >= 0.5;
  n.probed = o.probed > 0 && measured(o.sync_share);
  n.copies = n.probed && measured(o.d2h_mb_per_stall) && o.d2h_mb_per_stall >= 1.0;
  if (n.data) {
    n.kind = "data";
  } else if (n.own) {
    n.kind = "own";
  } else {
    if (n.phased) {
      if (contains(o.phase, "checkpoint") || contains(o.phase, "save"))
        n.kind = "checkpoint";
      else if (contains(o.phase, "eval") || contains(o.phase, "valid"))
        n.kind = "eval";
      else if (contains(o.phase, "log") || contains(o.phase, "metric"))
        n.kind = "log";
    }
    // Megabytes going to the host at every stall are state leaving the GPU (a checkpoint's
    // copies; serializing and writing them is the rest of the stall): named even when the
    // copies themselves are a small part. A few small reads name logging only when they are
    // most of the stall.
    if (n.probed && n.kind == "other") {
      if (n.copies && o.sync_share >= 0.05) n.kind = "host_copy";
      if (!n.copies && o.sync_share >= 0.3) n.kind = "log";
    }
  }
  return n;
}

std::optional<StallCost> periodic_stall_cost(const EpochSummary& s) {
  const OutlierStats* o = s.sections.get<OutlierStats>();
  if (o == nullptr || o->period <= 0 || o->periodic_count == 0 || s.wall_ns <= 0) {
    return std::nullopt;
  }
  StallCost c;
  c.period = o->period;
  c.stalls = o->periodic_count;
  c.median_step_s = static_cast<double>(o->median_ns) / 1e9;
  c.host_stall_s = static_cast<double>(o->periodic_excess_ns) / 1e9;
  // In GPU time where the step markers give less: while the host stalls, the GPU runs what was
  // queued before, and only its idle is lost.
  c.gpu_timed = o->periodic_gpu_excess_ns >= 0 && o->gpu_timed > 0;
  c.stall_s = c.gpu_timed
                  ? std::min(c.host_stall_s, static_cast<double>(o->periodic_gpu_excess_ns) / 1e9)
                  : c.host_stall_s;
  c.tail_steps = o->tail_steps;
  c.tail_s = static_cast<double>(o->periodic_tail_excess_ns) / 1e9;
  c.excess_s = c.stall_s + c.tail_s;
  c.per_stall_s = c.excess_s / static_cast<double>(c.stalls);
  c.share = c.excess_s / (static_cast<double>(s.wall_ns) / 1e9);
  c.nature = stall_nature(*o);
  return c;
}

std::optional<CheckpointPlan> checkpoint_plan(const EpochSummary& s, double threshold) {
  const RunJournalStats* j = s.sections.get<RunJournalStats>();
  if (j == nullptr || j->failures == 0 || !measured(j->mtbf_s) || !(j->mtbf_s > 0)) {
    return std::nullopt;
  }
  CheckpointPlan p;
  p.failures = j->failures;
  p.mtbf_s = j->mtbf_s;
  if (const auto c = periodic_stall_cost(s)) {
    const std::string& kind = c->nature.kind;
    if ((kind == "checkpoint" || kind == "host_copy") && c->per_stall_s > 0) {
      p.cost_s = c->per_stall_s;
      p.period_steps = c->period;
      if (c->median_step_s > 0) p.interval_s = static_cast<double>(c->period) * c->median_step_s;
    }
  }
  if (j->checkpoints > 0 && measured(j->checkpoint_interval_s)) {
    p.interval_s = j->checkpoint_interval_s;
  }
  if (measured(p.cost_s)) p.young_s = std::sqrt(2 * p.cost_s * p.mtbf_s);
  p.target_s = measured(p.young_s) ? p.young_s : threshold * p.mtbf_s;
  return p;
}

}  // namespace torchpilot
