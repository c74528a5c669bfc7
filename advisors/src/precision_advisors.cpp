// Precision and fusion advisors: fp32 matmuls on a tensor-core GPU, unfused attention, low MFU.
// They read EpochSummary::flops (the FLOP counter) and, when present, EpochSummary::gpu.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "advice_text.h"
#include "torchpilot/advisors/advisors.h"

namespace torchpilot {
namespace {

// A bf16 peak at least this many times the fp32 peak: the GPU has tensor cores worth using.
constexpr double kTensorCoreRatio = 4.0;
// The most of a step an estimated saving may claim.
constexpr double kMaxSavedShare = 0.9;
constexpr int kTopKernelsNamed = 3;

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

using detail::lower;
using detail::num;
using detail::pct;

double clamp01(double v) { return std::isnan(v) ? 0.0 : std::min(1.0, std::max(0.0, v)); }

double step_seconds(const EpochSummary& s) {
  return s.steps > 0 ? static_cast<double>(s.wall_ns) / 1e9 / static_cast<double>(s.steps) : 0;
}

// The GPU's busy fraction, best measure first: kernel-interval union of the detailed windows,
// the busy counter, else everything but the data wait.
double busy_fraction(const EpochSummary& s) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  double busy = 1.0 - clamp01(s.data_wait_fraction);
  if (gpu) {
    const GpuStats& g = gpu->stats;
    if (measured(g.gpu_utilization)) {
      busy = std::min(busy, g.gpu_utilization);
    } else if (measured(g.counter_utilization)) {
      busy = std::min(busy, g.counter_utilization);
    }
  }
  return clamp01(busy);
}

// Throughput gain when `share` of the step runs `speedup` times faster (Amdahl).
double amdahl_gain(double share, double speedup) {
  if (!(share > 0) || !(speedup > 1)) return 0;
  return 1.0 / (1.0 - share + share / speedup) - 1.0;
}

std::string device_name(const FlopEpochStats& f) {
  return f.device.empty() ? "this GPU" : f.device;
}

}  // namespace

std::optional<Advice> advise_fp32_matmul(const EpochSummary& s, const AdvisorsConfig& config) {
  const FlopEpochStats* counted = s.sections.get<FlopEpochStats>();
  if (counted == nullptr || s.steps == 0) return std::nullopt;
  const FlopEpochStats& f = *counted;
  if (!(f.model_flops_per_step > 0)) return std::nullopt;
  const double fp32 = f.model_flops_by_precision[P(MathPrecision::kFp32)];
  const double share = fp32 / f.model_flops_per_step;
  if (!(share > config.precision.fp32_matmul_threshold)) return std::nullopt;
  const double* ds = f.datasheet_flops_by_precision;
  const double p32 = ds[P(MathPrecision::kFp32)];
  const double ptf = ds[P(MathPrecision::kTf32)];
  const double pbf = ds[P(MathPrecision::kBf16)];
  // No tensor cores known (CPU, a GPU not in the table): nothing to move the work to.
  if (!(p32 > 0) || !(pbf > 0) || pbf / p32 < kTensorCoreRatio) return std::nullopt;

  // The fp32 work's share of the math time at the datasheet peaks, times the GPU's busy share.
  double ideal = 0;
  for (int i = 0; i < kMathPrecisions; ++i) {
    const double flops = f.model_flops_by_precision[i];
    if (!(flops > 0)) continue;
    ideal += flops / (ds[i] > 0 ? ds[i] : pbf);
  }
  // The fp32 work's share of the step: its time at the fp32 peak over the step time (a floor:
  // it runs no faster than the peak), within the GPU's busy share; without a step time, its share
  // of the ideal math time times the busy share. Capped: other work remains in any step.
  const double fp32_math_share = ideal > 0 ? (fp32 / p32) / ideal : 0;
  const double seconds = step_seconds(s);
  const double busy = busy_fraction(s);
  const double fp32_step_share = std::min(
      kMaxSavedShare, seconds > 0 ? std::min(busy, fp32 / p32 / seconds) : fp32_math_share * busy);
  const double gain_bf16 = amdahl_gain(fp32_step_share, pbf / p32);
  const double gain_tf32 = ptf > 0 ? amdahl_gain(fp32_step_share, ptf / p32) : 0;

  Advice a;
  a.id = "fp32_matmul";
  a.severity = fp32_step_share >= 0.5 ? Severity::kHigh : Severity::kWarning;
  a.finding = pct(share) + " of the counted matmul/convolution FLOPs (" + num(fp32 / 1e9, "%.3g") +
              " GFLOP per step) run in plain fp32 on " + device_name(f) +
              ", whose tensor cores run bf16 at " + num(pbf / p32, "%.0f") + "x" +
              (ptf > 0 ? " and TF32 at " + num(ptf / p32, "%.0f") + "x" : std::string()) +
              " its fp32 peak of " + num(p32 / 1e12, "%.1f") + " TFLOP/s (threshold " +
              pct(config.precision.fp32_matmul_threshold) + ")";
  a.cause =
      "the model computes in fp32 and TF32 is off for its matmuls, so they run on the CUDA "
      "cores; at the datasheet peaks the fp32 work would take an estimated " +
      pct(fp32_step_share) + " of the step";
  a.action =
      "compute forward and loss in bf16 under autocast (LibTorch 2.4+: "
      "at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16) and "
      "at::autocast::set_autocast_enabled(at::kCUDA, true); 1.x: at::autocast::set_enabled(true)), "
      "keeping fp32 weights and optimizer state; or, with numerics closer to fp32, allow TF32: "
      "flops.allow_tf32: true (opt-in, changes numerics; estimated +" +
      pct(gain_tf32) + ") or at::globalContext().setAllowTF32CuBLAS(true)";
  a.evidence = {{"fp32_flops_share", share, "fraction"},
                {"fp32_flops_per_step", fp32 / 1e9, "GFLOP"},
                {"fp32_peak", p32 / 1e12, "TFLOP/s"},
                {"bf16_peak", pbf / 1e12, "TFLOP/s"},
                {"fp32_time_share_estimate", fp32_step_share, "fraction"},
                {"expected_gain_tf32", gain_tf32, "fraction"},
                {"threshold", config.precision.fp32_matmul_threshold, "fraction"}};
  if (ptf > 0) a.evidence.push_back({"tf32_peak", ptf / 1e12, "TFLOP/s"});
  a.expected_gain = gain_bf16;
  a.gain_estimated = true;
  return a;
}

std::optional<Advice> advise_unfused_attention(const EpochSummary& s,
                                               const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  const FlopEpochStats* flops = s.sections.get<FlopEpochStats>();
  if (!flops || s.steps == 0) return std::nullopt;
  const FlopEpochStats& f = *flops;
  if (!(f.model_flops_per_step > 0)) return std::nullopt;
  const double unfused = f.unfused_attention_flops_per_step;
  const double share = unfused / f.model_flops_per_step;
  if (!(share > config.attention.unfused_threshold)) return std::nullopt;

  const double step_s = step_seconds(s);
  const double traffic = f.unfused_attention_traffic_bytes_per_step;
  double saved_s = kNotMeasured;
  std::string how;
  if (gpu && gpu->traced_steps > 0) {
    Nanos softmax_ns = 0;
    for (const KernelSummary& k : gpu->top_kernels) {
      // Attention's softmax, not the loss's log_softmax (cross-entropy).
      const std::string name = lower(k.name);
      if (name.find("softmax") != std::string::npos &&
          name.find("log_softmax") == std::string::npos &&
          name.find("logsoftmax") == std::string::npos) {
        softmax_ns += k.total_ns;
      }
    }
    if (softmax_ns > 0) {
      saved_s = static_cast<double>(softmax_ns) / 1e9 / static_cast<double>(gpu->traced_steps);
      how = "the traced softmax kernels' time";
    }
  }
  if (std::isnan(saved_s) && f.dram_bytes_per_s > 0 && traffic > 0) {
    saved_s = traffic / f.dram_bytes_per_s;
    how = "the score matrices' estimated traffic at " + num(f.dram_bytes_per_s / 1e9, "%.0f") +
          " GB/s";
  }
  double gain = 0;
  if (saved_s > 0 && step_s > 0) {
    const double saved = std::min(saved_s, kMaxSavedShare * step_s);
    gain = step_s / (step_s - saved) - 1.0;
  }

  Advice a;
  a.id = "unfused_attention";
  a.severity = std::isnan(saved_s) ? Severity::kInfo
               : gain >= 0.25      ? Severity::kHigh
                                   : Severity::kWarning;
  const int64_t n = f.unfused_attention_per_step;
  a.finding = std::to_string(n) + (n == 1 ? " attention" : " attentions") +
              " per step run as matmul + softmax + matmul: " + pct(share) + " of model FLOPs (" +
              num(unfused / 1e9, "%.3g") + " GFLOP per step, forward and backward) and about " +
              num(traffic / 1e6, "%.3g") + " MB of score-matrix traffic per step (threshold " +
              pct(config.attention.unfused_threshold) + ")";
  const bool fallback = f.sdpa_math_fallback_per_step > 0;
  if (fallback) {
    a.cause =
        "at::scaled_dot_product_attention fell back to its math path, which materializes "
        "the score matrix and runs softmax as a separate memory-bound kernel";
    a.action =
        "give it inputs a fused kernel accepts: q, k, v in bf16 or fp16 on the GPU, head "
        "dimension a multiple of 8 (at most 256), is_causal instead of an explicit causal "
        "mask, no attention-weight output";
  } else {
    a.cause =
        "attention is written out as matmul, softmax, matmul: the [L x L] score matrix is "
        "written to and read back from memory, and softmax runs as a separate "
        "memory-bound kernel";
    a.action =
        "replace it with at::scaled_dot_product_attention(q, k, v, mask, dropout_p, "
        "is_causal) (LibTorch 2.0+), which runs a fused flash or memory-efficient kernel";
  }
  if (saved_s > 0) {
    a.action += "; saves about " + num(saved_s * 1e3, "%.3g") + " ms of a " +
                num(step_s * 1e3, "%.3g") + " ms step (estimated from " + how + ")";
  } else {
    a.action += "; the time it saves is not estimated here (no GPU trace, no device bandwidth)";
  }
  a.evidence = {{"unfused_attention_share", share, "fraction"},
                {"unfused_attention_flops_per_step", unfused / 1e9, "GFLOP"},
                {"unfused_attentions_per_step", static_cast<double>(n), "attentions"},
                {"score_matrix_traffic_per_step", traffic / 1e6, "MB"},
                {"step_time", step_s * 1e3, "ms"},
                {"threshold", config.attention.unfused_threshold, "fraction"}};
  if (fallback) {
    a.evidence.push_back({"sdpa_math_fallback_per_step", f.sdpa_math_fallback_per_step, "calls"});
  }
  if (saved_s > 0) a.evidence.push_back({"estimated_time_saved", saved_s * 1e3, "ms"});
  a.expected_gain = gain;
  a.gain_estimated = true;
  return a;
}

std::optional<Advice> advise_low_mfu(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  const FlopEpochStats* flops = s.sections.get<FlopEpochStats>();
  if (!flops || s.steps == 0) return std::nullopt;
  const FlopEpochStats& f = *flops;
  if (!measured(f.mfu) || !(f.model_flops_per_step > 0)) return std::nullopt;
  if (f.mfu >= config.low_mfu.threshold) return std::nullopt;

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
    a.expected_gain = wait < 1 ? wait / (1 - wait) : 0;
  } else if (idle_other >= rest) {
    a.cause =
        "the largest loss is the GPU idling between kernels: launch overhead or the host "
        "blocking in synchronizing calls";
    a.action =
        "remove host synchronization from the step (.item(), .cpu(), printing tensors), "
        "raise the micro-batch so kernels are larger, and launch fewer small ops";
    a.expected_gain = idle_other < 1 ? idle_other / (1 - idle_other) : 0;
  } else {
    if (fp32_share > config.precision.fp32_matmul_threshold) {
      a.cause = "most of the step the GPU runs below peak, and " + pct(fp32_share) +
                " of the FLOPs are fp32";
      a.action = "compute in bf16 (see the fp32_matmul advice)";
    } else if (unfused_share > config.attention.unfused_threshold) {
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

}  // namespace torchpilot
