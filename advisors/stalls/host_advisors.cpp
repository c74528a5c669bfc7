// Host-side losses: host-bound steps (the GPU idles while the training thread works outside data
// waits and syncs) and periodic stalls (slow steps that recur: checkpoints, evaluation, logging).
#include <algorithm>
#include <cmath>
#include <string>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/stalls/stall_model.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/reports/journal_stats.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

using detail::num;
using detail::pct;

// The thread's CPU time over the time it was not waiting for data: below this it was mostly
// blocked (an unmeasured wait), above it busy computing.
constexpr double kBusyCpuShare = 0.5;

double clamp01(double v) { return std::isnan(v) ? 0.0 : std::clamp(v, 0.0, 1.0); }

}  // namespace

std::optional<Advice> advise_host_bound(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (gpu == nullptr || s.steps == 0 || s.wall_ns <= 0) return std::nullopt;
  const GpuStats& g = gpu->stats;
  // The GPU's busy share: the trace's kernel union where traced, else the hardware counter,
  // else NVML (which reads high: a conservative busy share).
  double busy = kNotMeasured;
  std::string busy_source;
  if (measured(g.gpu_utilization) && g.traced_ns > 0) {
    busy = g.gpu_utilization;
    busy_source = "kernel time in trace windows";
  } else if (measured(g.counter_utilization)) {
    busy = g.counter_utilization;
    busy_source = "hardware counter gr__cycles_active";
  } else if (measured(g.nvml_utilization)) {
    busy = g.nvml_utilization;
    busy_source = "NVML utilization.gpu, which reads high";
  }
  if (!measured(busy)) return std::nullopt;
  busy = std::clamp(busy, 0.0, 1.0);
  const double wall = static_cast<double>(s.wall_ns);
  const double wait = clamp01(s.data_wait_fraction);
  const double own = static_cast<double>(s.own_ns) / wall;
  double syncs = 0;
  if (g.traced_ns > 0) {
    syncs = static_cast<double>(g.idle_host_sync_ns + g.idle_pageable_copy_ns) /
            static_cast<double>(g.traced_ns);
  }
  // GPU idle that no measured wait, sync or torchpilot's own time explains: the host was busy
  // elsewhere (or blocked in something unmeasured).
  const double host = std::max(0.0, 1.0 - busy - wait - syncs - own);
  if (host <= config.host_bound.threshold) return std::nullopt;

  const double step_ms = wall / 1e6 / static_cast<double>(s.steps);
  Advice a;
  a.id = "host_bound";
  a.severity = host >= 0.5 ? Severity::kHigh : Severity::kWarning;
  a.finding = "the GPU idles " + pct(host) + " of the step (" + num(host * step_ms, "%.3g") +
              " ms of a " + num(step_ms, "%.3g") +
              " ms step) while the training thread is neither waiting for data nor in a host "
              "sync: host-bound (GPU busy " +
              pct(busy) + " from the " + busy_source + ")";
  a.evidence = {{"host_share", host, "fraction"},
                {"gpu_busy", busy, "fraction"},
                {"data_wait_fraction", wait, "fraction"},
                {"host_sync_idle_share", syncs, "fraction"},
                {"torchpilot_share", own, "fraction"},
                {"step_time", step_ms, "ms"},
                {"threshold", config.host_bound.threshold, "fraction"}};
  // Where it is: inside the phases the trainer marks, or between them.
  Nanos phased = 0;
  for (const PhaseTotal& p : s.phases) phased += p.ns;
  const double phase_share = std::min(1.0, static_cast<double>(phased) / wall);
  std::string where;
  if (!s.phases.empty()) {
    where = pct(phase_share) + " of the step is inside marked phases, " +
            pct(std::max(0.0, 1.0 - phase_share - wait)) + " between them (outside data waits)";
    a.evidence.push_back({"phase_share", phase_share, "fraction"});
  } else {
    where = "no phases are marked (pilot.phase(\"forward\") etc. would say where)";
  }
  // Busy or blocked: the thread's CPU time over its time not waiting for data.
  bool blocked = false, busy_cpu = false;
  if (s.cpu_ns >= 0 && wall - static_cast<double>(s.data_wait_ns) > 0) {
    const double cpu = std::clamp(
        static_cast<double>(s.cpu_ns) / (wall - static_cast<double>(s.data_wait_ns)), 0.0, 1.0);
    a.evidence.push_back({"thread_cpu_share", cpu, "fraction"});
    blocked = cpu < kBusyCpuShare;
    busy_cpu = !blocked;
    where += "; the training thread is on the CPU " + pct(cpu) +
             " of its time outside data waits (" +
             (blocked ? "mostly blocked: a wait torchpilot does not measure"
                      : "mostly busy: host work on the training thread") +
             ")";
  }
  a.cause = where;
  const LoaderStats* loader = s.sections.get<LoaderStats>();
  std::string action;
  if (loader == nullptr) {
    action =
        "no loader is attached: if the loop fetches batches itself, wrap the loader "
        "(for (auto& b : torchpilot::watch(*loader, pilot))) so its wait is measured, or use "
        "torchpilot::TunableLoader to load in workers ahead of the step; ";
  }
  // Without a trace window the idle's cause is not split (host work, host syncs, pageable
  // copies, launch gaps): when one is coming, say so rather than guess.
  const bool window_coming =
      g.traced_ns == 0 && (gpu->next_window == "planned" || gpu->next_window == "deferred");
  if (window_coming) {
    action +=
        "a trace window will tell which of host work, host syncs, pageable copies or "
        "kernel launch gaps idles the GPU (";
    action += gpu->next_window == "deferred"
                  ? std::string("the first waits for room in the cost budget, cost.budget")
              : gpu->next_window_step >= 0
                  ? "planned from step " + std::to_string(gpu->next_window_step)
                  : std::string("planned");
    action += "); the advice then names the cause and its gain";
  } else if (busy_cpu || !blocked) {
    action +=
        "move host work off the training thread: decoding, augmentation and collation into "
        "loader workers (dataset transforms), tensor building on the GPU, Python-like "
        "per-sample loops into batched ops";
  } else {
    action +=
        "find the blocking call (I/O, a lock, a queue) on the training thread and move "
        "it to a background thread";
  }
  a.action = action;
  // The bound: the GPU running back to back, at the speed its kernels ran. How much of the host
  // work can leave the thread is not measured, so no gain is promised.
  if (busy > 0) {
    a.evidence.push_back({"gain_bound_if_gpu_never_idles", 1.0 / busy - 1.0, "fraction"});
    a.action +=
        "; the gain depends on how much of this work can leave the training thread (not "
        "measured): at most +" +
        pct(1.0 / busy - 1.0) + " if the GPU never idled";
  }
  a.expected_gain = 0;
  a.gain_estimated = true;
  return a;
}

std::optional<Advice> advise_periodic_stall(const EpochSummary& s, const AdvisorsConfig& config) {
  const OutlierStats* o = s.sections.get<OutlierStats>();
  // Its figures (period, cost, nature) and the checkpoint interval are the ones the checkpoint
  // advisor states too (stall_model.h).
  const std::optional<StallCost> c = periodic_stall_cost(s);
  if (o == nullptr || !c) return std::nullopt;
  if (c->share <= config.periodic_stall.threshold) return std::nullopt;
  const double excess_ms = c->host_stall_s * 1e3;
  const double each_ms = excess_ms / static_cast<double>(c->stalls);
  const double median_ms = c->median_step_s * 1e3;
  Advice a;
  a.id = "periodic_stall";
  a.severity = c->share >= 0.1 ? Severity::kHigh : Severity::kWarning;
  a.finding = "every " + std::to_string(c->period) + " steps a step takes about " +
              num(each_ms + median_ms, "%.3g") + " ms against the median " +
              num(median_ms, "%.3g") + " ms: " + std::to_string(c->stalls) +
              " such steps this epoch, " + pct(o->periodic_share) +
              " of the epoch's time above the median";
  if (c->tail_steps > 0) {
    a.finding += ", and the " + std::to_string(c->tail_steps) + " steps after each " +
                 pct(c->tail_s / (static_cast<double>(s.wall_ns) / 1e9)) +
                 " more above the steps far from the stalls";
  }
  a.evidence = {{"period", static_cast<double>(c->period), "steps"},
                {"periodic_count", static_cast<double>(c->stalls), "steps"},
                {"periodic_share", o->periodic_share, "fraction"},
                {"excess_per_stall", each_ms, "ms"},
                {"median_step", median_ms, "ms"},
                {"threshold", config.periodic_stall.threshold, "fraction"}};
  if (c->tail_steps > 0 || o->tail_baseline_ns >= 0) {
    a.evidence.push_back({"tail_steps", static_cast<double>(c->tail_steps), "steps"});
    a.evidence.push_back(
        {"tail_excess_per_stall", c->tail_s * 1e3 / static_cast<double>(c->stalls), "ms"});
  }
  // The cause, from what the steps carry.
  const StallNature& n = c->nature;
  std::string cause;
  if (measured(o->data_wait_share))
    a.evidence.push_back({"data_wait_share", o->data_wait_share, "fraction"});
  if (measured(o->phase_share)) a.evidence.push_back({"phase_share", o->phase_share, "fraction"});
  if (measured(o->cpu_share)) a.evidence.push_back({"thread_cpu_share", o->cpu_share, "fraction"});
  if (n.probed) {
    a.evidence.push_back({"sync_share", o->sync_share, "fraction"});
    if (measured(o->d2h_mb_per_stall))
      a.evidence.push_back({"d2h_mb_per_stall", o->d2h_mb_per_stall, "MB"});
    if (measured(o->syncs_per_stall))
      a.evidence.push_back({"syncs_per_stall", o->syncs_per_stall, "ops"});
  }
  if (n.data) {
    cause = pct(o->data_wait_share) +
            " of the extra time is a wait for data (the loader stalls "
            "periodically: a shard or file boundary, a worker restart)";
  } else if (n.own) {
    cause = "most of the extra time is torchpilot's own (its windows or epoch work)";
  } else {
    if (n.phased) {
      cause = pct(o->phase_share) + " of the extra time is in the phase '" + o->phase + "'";
    } else {
      cause = "the extra time is outside the marked phases";
    }
    // The sync probe: ops that wait for the GPU or copy to the host in the probed stalls.
    if (n.probed) {
      cause += "; " + pct(o->sync_share) + " of it waits for the GPU or copies to the host";
      if (n.copies) {
        cause += " (" + num(o->d2h_mb_per_stall, "%.4g") +
                 " MB device-to-host per stall: state copied to the host, as a checkpoint does)";
      } else if (measured(o->syncs_per_stall) && o->syncs_per_stall > 0) {
        cause += " (" + num(o->syncs_per_stall, "%.3g") +
                 " reads per stall: item(), .cpu() of small tensors, as logging does)";
      }
    }
    if (measured(o->cpu_share)) {
      cause += o->cpu_share >= 0.5
                   ? "; the training thread is busy on the CPU " + pct(o->cpu_share) +
                         " of it (serializing, computing metrics, evaluating on the host)"
                   : "; the training thread is on the CPU only " + pct(o->cpu_share) +
                         " of it: mostly blocked (writing files, waiting for the GPU to "
                         "synchronize or copy to the host)";
    }
  }
  a.cause = cause;
  const std::string& kind = n.kind;
  const std::string checkpoint =
      "checkpoint asynchronously: copy the state to pinned host memory on a side stream, then "
      "write it from a background thread; or checkpoint less often, within what a failure may "
      "cost";
  const std::string eval =
      "evaluate less often or on fewer batches, asynchronously where it can be";
  const std::string log =
      "log and reduce metrics without synchronizing every time: accumulate on the GPU and read "
      "back every N steps, or copy non_blocking into pinned memory";
  // With failures in the run journal: Young's interval, sqrt(2 x checkpoint cost x MTBF), the
  // interval that loses the least to checkpoints and failures together; the checkpoint advisor
  // states the same one (stall_model.h).
  std::string interval;
  const auto plan = checkpoint_plan(s, config.checkpoint.threshold);
  if ((kind == "checkpoint" || kind == "host_copy") && plan && measured(plan->young_s) &&
      c->median_step_s > 0) {
    const double young_s = plan->young_s;
    const double now_s = static_cast<double>(c->period) * c->median_step_s;
    // Held within range before the cast (a journal's times are bounded, a step's may be tiny).
    const auto young_steps =
        static_cast<long long>(std::clamp(std::round(young_s / c->median_step_s), 1.0, 1e15));
    a.evidence.push_back({"mtbf", plan->mtbf_s, "s"});
    a.evidence.push_back({"young_interval", young_s, "s"});
    interval =
        " (the run journal's " + std::to_string(plan->failures) + " failure(s), MTBF " +
        num(plan->mtbf_s, "%.3g") + " s, and " + num(plan->cost_s * 1e3, "%.3g") +
        " ms per stall give Young's interval sqrt(2 x cost x MTBF) = " + num(young_s, "%.3g") +
        " s, about every " + std::to_string(young_steps) + " steps against every " +
        std::to_string(c->period) + " now" + (young_s > now_s ? ")" : ": no less often)");
  }
  if (kind == "checkpoint") {
    a.action = checkpoint + interval;
  } else if (kind == "eval") {
    a.action = eval;
  } else if (kind == "log") {
    a.action = log;
  } else if (kind == "host_copy") {
    a.action = "if this is a checkpoint: " + checkpoint + interval +
               "; if it reads results back: copy them non_blocking into pinned memory and read "
               "them a step later";
  } else if (kind == "data") {
    a.action = "prefetch deeper or spread the loader's periodic work (see data_starvation)";
  } else if (kind == "own") {
    a.action = "lower torchpilot's cost (gpu.trace_every_epochs 0, cost.budget)";
  } else {
    a.action =
        "mark the periodic work with pilot.phase(\"checkpoint\") or similar to name it; "
        "if it is a checkpoint: " +
        checkpoint + "; if evaluation or logging: " + log;
  }
  // Removing the stalls' time above the median, at most, plus the slower steps after them; in
  // GPU time where the step markers give it: while the host stalls, the GPU runs what was
  // queued before, and only its idle is lost.
  const double wall_s = static_cast<double>(s.wall_ns) / 1e9;
  const double rest = wall_s - c->excess_s;
  a.expected_gain = rest > 0 ? c->excess_s / rest : 0;
  a.gain_estimated = true;
  const double n_stalls = static_cast<double>(c->stalls);
  std::string removed;
  if (c->gpu_timed) {
    a.evidence.push_back({"gpu_excess_per_stall", c->stall_s * 1e3 / n_stalls, "ms"});
    removed = "the GPU's idle in the stalls removed: " + num(c->stall_s * 1e3 / n_stalls, "%.3g") +
              " ms per stall above its median step, of the " + num(each_ms, "%.3g") +
              " ms the host stalls; the GPU ran queued work meanwhile";
  } else {
    removed = "the stalls' time above the median step removed";
  }
  if (c->tail_steps > 0) {
    removed += ", and the " + std::to_string(c->tail_steps) + " steps after each, " +
               num(c->tail_s * 1e3 / n_stalls, "%.3g") + " ms above the steps far from the " +
               "stalls (" + num(static_cast<double>(o->tail_baseline_ns) / 1e6, "%.3g") +
               " ms), back to those";
  }
  a.action += "; estimated +" + pct(a.expected_gain) + " throughput at most (" + removed + ")";
  return a;
}

}  // namespace torchpilot
