// The low-MFU advisor: the step split into counted FLOPs at peak, data wait, GPU idle and the rest
// (from the FLOP counter alone, or from a trace window's kernels when there is one).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "precision_advisors_internal.h"
#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/advisors/loader/data_starvation.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace {

constexpr int kTopKernelsNamed = 3;

using detail::gain_from_removing;
using detail::num;
using detail::pct;
using gains::step_seconds;
using precision_detail::P;

double clamp01(double v) { return std::isnan(v) ? 0.0 : std::min(1.0, std::max(0.0, v)); }

// Without a trace window: the step split into the counted FLOPs at peak, data wait, GPU idle and
// the rest. `f`: the epoch's FLOPs, MFU measured and under the threshold (advise_low_mfu).
Advice low_mfu_from_flops(const EpochSummary& s, const FlopEpochStats& f, const GpuEpochStats* gpu,
                          const AdvisorsConfig& config) {
  const double step_s = step_seconds(s);
  const double wait = clamp01(s.data_wait_fraction);
  double idle = kNotMeasured;
  if (gpu) {
    const GpuStats& g = gpu->stats;
    if (measured(g.gpu_utilization)) {
      idle = 1.0 - clamp01(g.gpu_utilization);
    } else if (measured(g.counter_utilization)) {
      idle = 1.0 - clamp01(g.counter_utilization);
    }
  }
  // GPU idle that the data wait does not explain (the GPU also idles while the step waits).
  const double idle_other = measured(idle) ? std::max(0.0, idle - wait) : 0.0;
  const double rest = std::max(0.0, 1.0 - f.mfu - wait - idle_other);
  const double fp32_share =
      f.model_flops_by_precision[P(MathPrecision::kFp32)] / f.model_flops_per_step;
  const double unfused_share = f.unfused_attention_flops_per_step / f.model_flops_per_step;

  Advice a;
  a.id = "low_mfu";
  a.severity = f.mfu < config.low_mfu.threshold / 2 ? Severity::kWarning : Severity::kInfo;
  a.finding = "MFU is " + pct(f.mfu) + " (threshold " + pct(config.low_mfu.threshold) + "); of a " +
              num(step_s * 1e3, "%.3g") + " ms step: " + pct(f.mfu) +
              " would be the counted FLOPs at the " + to_string(f.dominant_precision) + " peak (" +
              num(f.peak_flops_per_s / 1e12, "%.4g") + " TFLOP/s, " +
              (f.peak_source.empty() ? std::string("peak") : f.peak_source) + "), " + pct(wait) +
              " waiting for data, " +
              (measured(idle) ? pct(idle_other) + " GPU idle outside the data wait, "
                              : std::string("GPU idle time not measured, ")) +
              pct(rest) + " the rest (" +
              (measured(idle) ? "kernels running below peak: non-matmul work, small or fp32 matmuls"
                              : "GPU idle and kernels running below peak") +
              ")";
  if (fp32_share > 0.01) a.finding += "; " + pct(fp32_share) + " of the FLOPs in fp32";
  a.evidence = {{"mfu", f.mfu, "fraction"},
                {"threshold", config.low_mfu.threshold, "fraction"},
                {"data_wait_fraction", wait, "fraction"},
                {"below_peak_fraction", rest, "fraction"},
                {"fp32_flops_share", fp32_share, "fraction"},
                {"achieved", f.achieved_flops_per_s / 1e12, "TFLOP/s"},
                {"peak", f.peak_flops_per_s / 1e12, "TFLOP/s"}};
  if (measured(f.hfu)) a.evidence.push_back({"hfu", f.hfu, "fraction"});
  if (measured(idle)) a.evidence.push_back({"gpu_idle_outside_data_wait", idle_other, "fraction"});

  a.gain_estimated = true;
  if (wait >= idle_other && wait >= rest) {
    a.cause = "the largest loss is the wait for data";
    a.action =
        "feed the GPU faster (see the data_starvation advice: more loader workers, pinned "
        "memory, deeper prefetch)";
    // data_starvation's number for the same wait (its loader model where it has one).
    const std::optional<Advice> starved = advise_data_starvation(s, config);
    a.expected_gain = starved ? starved->expected_gain : (wait < 1 ? wait / (1 - wait) : 0);
  } else if (idle_other >= rest) {
    a.cause =
        "the largest loss is the GPU idling outside the data wait: host work on the training "
        "thread, launch overhead or the host blocking in synchronizing calls";
    a.action =
        "see the host_bound advice; remove host synchronization from the step (.item(), .cpu(), "
        "printing tensors), raise the micro-batch so kernels are larger, and launch fewer small "
        "ops";
    // Without a trace window the idle is not split by cause: no gain can be sized from it (it
    // would be bounded only by step / GPU busy time).
    a.expected_gain = 0;
    a.action += "; gain not estimated without a trace window";
  } else {
    if (fp32_share > config.low_mfu.fp32_share) {
      a.cause = "most of the step the GPU runs below peak, and " + pct(fp32_share) +
                " of the FLOPs are fp32";
      a.action = "compute in bf16 (see the fp32_matmul advice)";
    } else if (unfused_share > config.low_mfu.unfused_attention_share) {
      a.cause = "most of the step the GPU runs below peak, with unfused attention among the work";
      a.action = "fuse attention (see the unfused_attention advice)";
    } else {
      a.cause =
          "most of the step the GPU runs kernels other than the counted matmuls "
          "(elementwise, normalization, softmax, copies) or matmuls too small to reach the "
          "tensor cores' peak";
      a.action =
          "raise the micro-batch or model width, fuse elementwise work, use "
          "at::scaled_dot_product_attention for attention";
    }
    if (gpu && !gpu->top_kernels.empty() && gpu->stats.traced_ns > 0) {
      std::string names;
      const double traced = static_cast<double>(gpu->stats.traced_ns);
      for (int i = 0; i < kTopKernelsNamed && i < static_cast<int>(gpu->top_kernels.size()); ++i) {
        const KernelSummary& k = gpu->top_kernels[static_cast<size_t>(i)];
        if (!names.empty()) names += ", ";
        names += k.name + " " + pct(static_cast<double>(k.total_ns) / traced);
      }
      a.action += "; the longest kernels (share of traced time): " + names;
    }
    a.expected_gain = 0;  // no single change is sized
  }
  return a;
}

}  // namespace

std::optional<Advice> advise_low_mfu(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  const FlopEpochStats* flops = s.sections.get<FlopEpochStats>();
  if (!flops || s.steps == 0) return std::nullopt;
  const FlopEpochStats& f = *flops;
  if (!measured(f.mfu) || !(f.model_flops_per_step > 0)) return std::nullopt;
  if (f.mfu >= config.low_mfu.threshold) return std::nullopt;
  if (gpu == nullptr || gpu->kernel_classes.steps == 0 || gpu->kernel_classes.traced_ns <= 0) {
    return low_mfu_from_flops(s, f, gpu, config);
  }

  // Where the step goes: the traced steps' GPU time by kernel class, and idle by cause.
  const KernelClassStats& k = gpu->kernel_classes;
  const double traced = static_cast<double>(k.traced_ns);
  std::string split;
  Advice a;
  a.id = "low_mfu";
  a.severity = f.mfu < config.low_mfu.threshold / 2 ? Severity::kWarning : Severity::kInfo;
  a.evidence = {{"mfu", f.mfu, "fraction"},
                {"threshold", config.low_mfu.threshold, "fraction"},
                {"traced_step_time", k.per_step_ms(traced), "ms"}};
  for (int i = 0; i < kKernelClasses; ++i) {
    const auto c = static_cast<KernelClass>(i);
    const double share = k.ns[static_cast<size_t>(i)] / traced;
    a.evidence.push_back({std::string("share_") + to_string(c), share, "fraction"});
    if (share >= 0.005) split += std::string(label(c)) + " " + pct(share) + ", ";
  }
  const double idle = k.idle_ns / traced;
  a.evidence.push_back({"share_idle", idle, "fraction"});
  a.finding = "MFU is " + pct(f.mfu) + " (threshold " + pct(config.low_mfu.threshold) +
              "); the traced step's GPU time (" + num(k.per_step_ms(traced), "%.3g") +
              " ms) goes to " + split + "idle " + pct(idle);
  if (const GpuPhaseTimes& ph = gpu->phases_gpu; ph.steps > 0 && ph.step_gpu_ns > 0) {
    // By the GPU's time where the window's phase markers resolved: the host may run ahead.
    std::string phases;
    const double t = static_cast<double>(ph.step_gpu_ns);
    for (const GpuPhaseStats& p : ph.phases) {
      if (!phases.empty()) phases += ", ";
      phases += p.name + " " + pct(static_cast<double>(p.gpu_ns) / t);
    }
    a.finding += "; by phase (GPU time): " + phases;
  } else if (!s.phases.empty() && s.wall_ns > 0) {
    std::string phases;
    for (const PhaseTotal& p : s.phases) {
      if (!phases.empty()) phases += ", ";
      phases += p.name + " " + pct(static_cast<double>(p.ns) / static_cast<double>(s.wall_ns));
    }
    a.finding += "; host phases: " + phases;
  }

  // The fixable shares, each with its action and estimated gain; the largest gain is named.
  struct Candidate {
    double share = 0, gain = 0;
    std::string what, action;
  };
  std::vector<Candidate> candidates;
  const double simt = k.ns[static_cast<size_t>(KernelClass::kSimtGemm)] / traced;
  if (simt > 0) {
    if (const auto m = gains::precision_gain(s)) {
      candidates.push_back(
          {simt, m->gain, "non-tensor (fp32) GEMM/conv kernels take " + pct(simt) + " of it",
           "compute in bf16 under autocast, or allow TF32 (see the fp32_matmul advice; estimated "
           "at " +
               m->rate_source + ")"});
    }
  }
  const double pieces =
      std::max(0.0, k.ns[static_cast<size_t>(KernelClass::kAttention)] - k.fused_attention_ns) /
      traced;
  if (pieces > 0 || f.unfused_attention_flops_per_step > 0) {
    if (const auto m = gains::fusion_gain(s)) {
      candidates.push_back(
          {m->removed_s / std::max(m->step_s, 1e-12), m->gain,
           "an unfused attention (softmax/mask kernels and its matmuls) takes an estimated " +
               num(m->removed_s * 1e3, "%.3g") + " ms of the step",
           "use at::scaled_dot_product_attention (see the unfused_attention advice)"});
    }
  }
  if (const auto m = gains::bias_gain(s)) {
    candidates.push_back(
        {m->add_s / std::max(m->step_s, 1e-12), m->gain,
         "biases added outside their GEMMs (" + num(m->adds, "%.0f") +
             " broadcast add kernels per step) take " + num(m->add_s * 1e3, "%.3g") +
             " ms of the step",
         "call torch::linear(x, weight, bias) instead of the Linear module's forward (see the "
         "unfused_linear_bias advice)"});
  }
  // The per-parameter optimizer's launches are among the launch gaps of a host-bound step: the
  // share it removes is not counted again as launch gaps (one cause per idle second).
  double optimizer_share = 0;
  if (const auto m = gains::optimizer_gain(s)) {
    optimizer_share = m->removed_s / std::max(m->step_s, 1e-12);
    candidates.push_back(
        {optimizer_share, m->gain,
         "a per-parameter Adam-style optimizer (addcmul/addcdiv per parameter, about " +
             num(m->per_parameter_kernels, "%.0f") + " kernels per step) takes an estimated " +
             num(m->removed_s * 1e3, "%.3g") + " ms of the step",
         "update all parameters in a fused or multi-tensor optimizer (see the "
         "per_parameter_optimizer advice: at::_fused_adamw_ or the _foreach_* ops)"});
  }
  {
    const GpuStats& g = gpu->stats;
    const double t = static_cast<double>(std::max<Nanos>(1, g.traced_ns));
    // Removing all of an idle cause is no promise: where the cause's advice has a gain model,
    // its estimate is the gain stated here, the same number that advice states (launch gaps: the
    // step at a larger batch; data wait: what the cores and the advised workers deliver; host
    // syncs: at most the host's time blocked in them).
    const double no_bound = std::numeric_limits<double>::infinity();
    double launch_bound = no_bound, starvation = no_bound, host_sync = no_bound;
    if (const auto m = gains::launch_bound_gain(s)) launch_bound = m->gain;
    if (const auto m = gains::host_sync_gain(s)) host_sync = m->gain;
    if (const auto m = advised_starvation_gain(s)) starvation = m->gain;
    // `bound`: the cause advisor's own gain (infinite: none). Stated as it is, unless the share
    // here is not that advisor's quantity (the launch gaps less the optimizer's): then a bound.
    const struct {
      double share;
      double bound;
      bool same_quantity;
      std::string what;
      const char* action;
    } causes[] = {
        {static_cast<double>(g.idle_data_wait_ns) / t, starvation, true, "waiting for data",
         "see the data_starvation advice"},
        {static_cast<double>(g.idle_host_sync_ns) / t, host_sync, true,
         "after host synchronizations", "see the host_sync advice: read values back every N steps"},
        {std::max(0.0, static_cast<double>(g.idle_launch_gap_ns) / t - optimizer_share),
         launch_bound, !(optimizer_share > 0),
         std::string("in launch gaps between kernels") +
             (optimizer_share > 0 ? " besides the optimizer's" : ""),
         "see the launch_bound advice: fewer, larger launches (larger batch, fused ops, CUDA "
         "graphs)"},
        {static_cast<double>(g.idle_other_ns) / t, 0.0, true,
         "before the first or after the last kernel of the step",
         "move host work out of the step or overlap it with GPU work (see the host_bound "
         "advice; gain not estimated: how much host work can leave the training thread is not "
         "measured)"},
    };
    // Whatever the model, no gain above the GPU running back to back at the speed its kernels
    // ran: step time / GPU busy time.
    const double busy = measured(g.gpu_utilization) ? clamp01(g.gpu_utilization) : 0.0;
    const double physical = busy > 0 ? 1.0 / busy - 1.0 : no_bound;
    for (const auto& c : causes) {
      if (c.share <= 0) continue;
      const double removal = std::min(gain_from_removing(c.share), physical);
      const double stated = !std::isfinite(c.bound) ? removal
                            : c.same_quantity       ? c.bound
                                                    : std::min(removal, c.bound);
      candidates.push_back(
          {c.share, stated, "the GPU idles " + pct(c.share) + " of it " + c.what, c.action});
    }
  }
  const auto best =
      std::max_element(candidates.begin(), candidates.end(),
                       [](const Candidate& x, const Candidate& y) { return x.gain < y.gain; });
  a.gain_estimated = true;
  // An unsized cause (host work outside the kernels) is named when it is the largest share.
  const auto largest =
      std::max_element(candidates.begin(), candidates.end(),
                       [](const Candidate& x, const Candidate& y) { return x.share < y.share; });
  const bool sized = best != candidates.end() && best->gain > 0;
  if (largest != candidates.end() && !(largest->gain > 0) &&
      (!sized || largest->share > 2 * best->share)) {
    a.cause = "the largest share: " + largest->what;
    a.action = largest->action;
    a.expected_gain = 0;
    a.evidence.push_back({"fixable_share", largest->share, "fraction"});
    return a;
  }
  if (best == candidates.end() || !(best->gain > 0)) {
    a.cause =
        "no single fixable share stands out: the GPU runs its kernels below peak (small "
        "matmuls, elementwise and normalization work)";
    a.action =
        "raise the micro-batch or model width, fuse elementwise work (torch.compile-style "
        "fusion is not available in LibTorch: fused ops where they exist)";
    a.expected_gain = 0;
    return a;
  }
  a.cause = "the largest fixable share: " + best->what;
  a.action = best->action + "; estimated +" + pct(best->gain);
  a.expected_gain = best->gain;
  a.evidence.push_back({"fixable_share", best->share, "fraction"});
  return a;
}

}  // namespace torchpilot
