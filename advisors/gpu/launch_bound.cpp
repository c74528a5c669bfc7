// The launch-bound advisor: the GPU idles between the step's kernels (detailed windows). Pure
// function of an epoch's GPU figures (EpochSummary::gpu); docs/advice.md has the rule.
#include <optional>
#include <string>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/runtime/core/metrics.h"

namespace torchpilot {
namespace {

using detail::gain_from_removing;
using detail::num;
using detail::pct;

// The traced share of time (detailed windows) a GPU figure refers to.
double traced_share(const GpuStats& g, Nanos ns) {
  return g.traced_ns > 0 ? static_cast<double>(ns) / static_cast<double>(g.traced_ns) : 0.0;
}

}  // namespace

std::optional<Advice> advise_launch_bound(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (!gpu || gpu->traced_steps == 0) return std::nullopt;
  const GpuStats& g = gpu->stats;
  const double f = traced_share(g, g.idle_launch_gap_ns);
  if (f <= config.launch_bound.threshold || g.kernels == 0) return std::nullopt;
  const double per_step = static_cast<double>(g.kernels) / gpu->traced_steps;
  const double busy_ns =
      measured(g.gpu_utilization) ? g.gpu_utilization * static_cast<double>(g.traced_ns) : 0.0;
  const double mean_us = busy_ns / static_cast<double>(g.kernels) / 1e3;
  Advice a;
  a.id = "launch_bound";
  a.severity = f > 0.5 ? Severity::kHigh : Severity::kWarning;
  a.finding = "the GPU idled between the step's kernels for " + pct(f) + " of step time (" +
              num(per_step, "%.0f") + " kernels per step, " + num(mean_us, "%.1f") +
              " us each on average)";
  a.evidence = {{"launch_gap_fraction", f, "fraction"},
                {"kernels_per_step", per_step, "kernels"},
                {"mean_kernel_time", mean_us, "us"},
                {"threshold", config.launch_bound.threshold, "fraction"}};
  a.cause =
      "kernels are too short for the host to keep the GPU fed: launch overhead and host "
      "work between launches dominate";
  a.action =
      "give each launch more work (larger batch, with gradient accumulation to keep the "
      "global batch), use fused or batched ops instead of many small ones, or capture the "
      "step in a CUDA graph";
  a.gain_estimated = true;
  // Gain: the step at a larger batch, from the measured per-launch host cost and the kernels'
  // time grown by what they fill of the GPU (gain_models.h); else removing the gaps.
  const std::optional<gains::LaunchBoundGain> model = gains::launch_bound_gain(s);
  if (!model) {
    a.expected_gain = gain_from_removing(f);
    a.action += " (gain shown: removing the gaps)";
    return a;
  }
  const gains::LaunchBoundGain& m = *model;
  const std::string batch =
      m.samples_per_step > 0
          ? num(m.factor, "%.0f") + "x the batch (" + num(m.samples_per_step * m.factor, "%.0f") +
                " samples per step instead of " + num(m.samples_per_step, "%.0f") + ")"
          : num(m.factor, "%.0f") + "x the current batch";
  a.action += "; estimated at " + batch + ": the host issues the same " + num(m.launches, "%.0f") +
              " launches at " + num(m.per_launch_s * 1e6, "%.1f") + " us each (" +
              num(m.host_s * 1e3, "%.3g") + " ms) while the kernels grow from " +
              num(m.gpu_busy_s * 1e3, "%.3g") + " to " + num(m.gpu_busy_scaled_s * 1e3, "%.3g") +
              " ms, so " + detail::step_becomes(m.step_s, m.new_step_s) + " for " +
              num(m.factor, "%.0f") + "x the samples (if the larger batch fits in memory)";
  a.evidence.push_back({"batch_factor", m.factor, "x"});
  a.evidence.push_back({"samples_per_step", m.samples_per_step, "samples"});
  a.evidence.push_back({"host_time_per_step", m.host_s * 1e3, "ms"});
  a.evidence.push_back({"host_cost_per_launch", m.per_launch_s * 1e6, "us"});
  a.evidence.push_back({"gpu_busy_per_step", m.gpu_busy_s * 1e3, "ms"});
  a.evidence.push_back({"gpu_busy_at_larger_batch", m.gpu_busy_scaled_s * 1e3, "ms"});
  a.evidence.push_back({"predicted_step_time_at_larger_batch", m.new_step_s * 1e3, "ms"});
  a.expected_gain = m.gain;
  return a;
}

}  // namespace torchpilot
