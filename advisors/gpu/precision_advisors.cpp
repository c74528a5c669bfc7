// Precision and fusion advisors: fp32 matmuls on a tensor-core GPU, unfused attention, low MFU.
// They read EpochSummary::flops (the FLOP counter) and, when present, EpochSummary::gpu.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace {

// A bf16 peak at least this many times the fp32 peak: the GPU has tensor cores worth using.
constexpr double kTensorCoreRatio = 4.0;
constexpr int kTopKernelsNamed = 3;

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

using detail::gain_from_removing;
using detail::lower;
using detail::num;
using detail::pct;
using gains::step_seconds;

double clamp01(double v) { return std::isnan(v) ? 0.0 : std::min(1.0, std::max(0.0, v)); }

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

  // Gain: the fp32 GEMM/conv kernels' measured time replaced by their FLOPs at a calibrated
  // tensor-core rate plus autocast's casts (gain_models.h).
  const std::optional<gains::PrecisionGain> model = gains::precision_gain(s);
  if (!model) return std::nullopt;
  const gains::PrecisionGain& m = *model;
  const double fp32_step_share = m.removed_s / m.step_s;
  const double gain_bf16 = m.gain;
  const double gain_tf32 = m.tf32_gain;

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
      "cores: " +
      (m.removed_measured
           ? "its fp32 GEMM/conv kernels took " + num(m.removed_s * 1e3, "%.3g") + " ms of the " +
                 num(m.step_s * 1e3, "%.3g") + " ms step in the trace window (" +
                 pct(fp32_step_share) + ")"
           : "at the fp32 datasheet peak its fp32 work would take an estimated " +
                 pct(fp32_step_share) + " of the step (no trace window measured it)");
  a.action =
      "compute forward and loss in bf16 under autocast (LibTorch 2.4+: "
      "at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16) and "
      "at::autocast::set_autocast_enabled(at::kCUDA, true); 1.x: at::autocast::set_enabled(true)), "
      "keeping fp32 weights and optimizer state; or, with numerics closer to fp32, allow TF32: "
      "flops.allow_tf32: true (opt-in, changes numerics; estimated +" +
      pct(gain_tf32) + ") or at::globalContext().setAllowTF32CuBLAS(true). Estimated: in bf16 " +
      "the same FLOPs take " + num(m.gemm_s * 1e3, "%.3g") + " ms at " + m.rate_source +
      (m.attention_removed_s > 0
           ? ", its fused attention " + num(m.attention_s * 1e3, "%.3g") + " ms instead of " +
                 num(m.attention_removed_s * 1e3, "%.3g") +
                 " ms (its FLOPs at the calibrated fused-attention rate)"
           : std::string()) +
      ", plus " + num(m.cast_s * 1e3, "%.3g") + " ms for the casts autocast adds (" +
      num(m.cast_bytes / 1e6, "%.3g") + " MB per step at DRAM bandwidth)" +
      (m.host_bound ? ", but no step can be shorter than the " + num(m.host_floor_s * 1e3, "%.3g") +
                          " ms the host takes to issue one (its fastest step this epoch" +
                          (s.data_wait_ns > 0 ? ", plus the data wait)" : ")")
                    : std::string()) +
      ": a " + num(m.step_s * 1e3, "%.3g") + " ms step becomes " + num(m.new_step_s * 1e3, "%.3g") +
      " ms";
  a.evidence = {{"fp32_flops_share", share, "fraction"},
                {"fp32_flops_per_step", fp32 / 1e9, "GFLOP"},
                {"fp32_peak", p32 / 1e12, "TFLOP/s"},
                {"bf16_peak", pbf / 1e12, "TFLOP/s"},
                {"fp32_time_share_estimate", fp32_step_share, "fraction"},
                {"expected_gain_tf32", gain_tf32, "fraction"},
                {"threshold", config.precision.fp32_matmul_threshold, "fraction"},
                {"fp32_kernel_time", m.removed_s * 1e3, "ms"},
                {"fp32_kernel_time_measured", m.removed_measured ? 1.0 : 0.0, "bool"},
                {"tensor_core_rate", m.rate / 1e12, "TFLOP/s"},
                {"predicted_tensor_core_time", m.gemm_s * 1e3, "ms"},
                {"autocast_cast_bytes", m.cast_bytes / 1e6, "MB"},
                {"autocast_cast_time", m.cast_s * 1e3, "ms"},
                {"predicted_step_time", m.new_step_s * 1e3, "ms"},
                {"step_time", m.step_s * 1e3, "ms"}};
  if (m.attention_removed_s > 0) {
    a.evidence.push_back({"fp32_attention_kernel_time", m.attention_removed_s * 1e3, "ms"});
    a.evidence.push_back({"predicted_attention_time", m.attention_s * 1e3, "ms"});
  }
  if (ptf > 0) a.evidence.push_back({"tf32_peak", ptf / 1e12, "TFLOP/s"});
  if (m.host_floor_s > 0) a.evidence.push_back({"host_floor_time", m.host_floor_s * 1e3, "ms"});
  a.expected_gain = gain_bf16;
  a.gain_estimated = true;
  return a;
}

std::optional<Advice> advise_unfused_attention(const EpochSummary& s,
                                               const AdvisorsConfig& config) {
  const FlopEpochStats* flops = s.sections.get<FlopEpochStats>();
  if (!flops || s.steps == 0) return std::nullopt;
  const FlopEpochStats& f = *flops;
  if (!(f.model_flops_per_step > 0)) return std::nullopt;
  const double unfused = f.unfused_attention_flops_per_step;
  const double share = unfused / f.model_flops_per_step;
  if (!(share > config.attention.unfused_threshold)) return std::nullopt;

  const double traffic = f.unfused_attention_traffic_bytes_per_step;
  // Gain: the measured kernels of the unfused attention against a fused kernel's predicted time
  // (gain_models.h); without a window, the score-matrix traffic at DRAM bandwidth.
  const std::optional<gains::FusionGain> model = gains::fusion_gain(s);
  const double step_s = model ? model->step_s : step_seconds(s);
  const double saved_s = model ? model->step_s - model->new_step_s : kNotMeasured;
  const double gain = model ? model->gain : 0.0;
  std::string how;
  if (model && model->measured) {
    how = std::string(model->pieces_around_softmax
                          ? "the window's kernels around each softmax up to its matmuls (scale, "
                            "mask, softmax, casts; forward and backward: "
                          : "the window's softmax/mask kernels (") +
          num(model->pieces_s * 1e3, "%.3g") + " ms) and its attention matmuls (" +
          num(model->matmul_s * 1e3, "%.3g") + " ms";
    if (model->matmul_measured) {
      how += ", measured: the GEMMs that bound the softmax kernels)";
    } else {
      how += ": the longer of their FLOPs at the " + num(model->gemm_rate / 1e12, "%.0f") +
             " TFLOP/s the window's GEMMs ran and their half of the score-matrix traffic at DRAM "
             "bandwidth, " +
             num(model->matmul_traffic_s * 1e3, "%.3g") + " ms)";
    }
  } else if (model) {
    how = "no trace window: the score matrices' estimated traffic at " +
          num(f.dram_bytes_per_s / 1e9, "%.0f") + " GB/s (" + num(model->pieces_s * 1e3, "%.3g") +
          " ms) and the matmuls' FLOPs at " + num(model->gemm_rate / 1e12, "%.0f") + " TFLOP/s (" +
          num(model->matmul_s * 1e3, "%.3g") + " ms)";
  }

  Advice a;
  a.id = "unfused_attention";
  a.severity = !model || !(model->fused_rate > 0) ? Severity::kInfo
               : gain >= 0.25                     ? Severity::kHigh
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
  if (model && model->fused_rate > 0) {
    a.action +=
        "; estimated: the unfused form takes " + num(model->removed_s * 1e3, "%.3g") +
        " ms per step (" + how + "), a fused kernel " + num(model->fused_s * 1e3, "%.3g") +
        " ms (its FLOPs with the backward's recomputation at " + model->calibration + ")" +
        (model->host_bound
             ? ", but no step can be shorter than the " + num(model->host_floor_s * 1e3, "%.3g") +
                   " ms the host takes to issue one (its fastest step this epoch, less the " +
                   "launches the fused kernels save" +
                   (s.data_wait_ns > 0 ? "; plus the data wait)" : ")")
             : std::string()) +
        ": a " + num(step_s * 1e3, "%.3g") + " ms step becomes " +
        num(model->new_step_s * 1e3, "%.3g") + " ms";
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
  if (model && model->fused_rate > 0) {
    a.evidence.push_back({"estimated_time_saved", saved_s * 1e3, "ms"});
    a.evidence.push_back({"unfused_kernel_time", model->removed_s * 1e3, "ms"});
    a.evidence.push_back({"unfused_kernel_time_measured", model->measured ? 1.0 : 0.0, "bool"});
    a.evidence.push_back({"predicted_fused_time", model->fused_s * 1e3, "ms"});
    a.evidence.push_back({"attention_matmul_time", model->matmul_s * 1e3, "ms"});
    a.evidence.push_back(
        {"attention_matmul_time_measured", model->matmul_measured ? 1.0 : 0.0, "bool"});
    a.evidence.push_back({"fused_attention_rate", model->fused_rate / 1e12, "TFLOP/s"});
    if (model->host_floor_s > 0) {
      a.evidence.push_back({"host_floor_time", model->host_floor_s * 1e3, "ms"});
      a.evidence.push_back({"host_floor_launch_factor", model->launch_factor, "fraction"});
    }
  }
  a.expected_gain = gain;
  a.gain_estimated = true;
  return a;
}

std::optional<Advice> advise_unfused_linear_bias(const EpochSummary& s,
                                                 const AdvisorsConfig& config) {
  if (s.steps == 0) return std::nullopt;
  const std::optional<gains::BiasGain> model = gains::bias_gain(s);
  if (!model) return std::nullopt;
  const gains::BiasGain& m = *model;
  const double share = m.add_s / m.step_s;
  if (!(share > config.linear_bias.threshold)) return std::nullopt;
  Advice a;
  a.id = "unfused_linear_bias";
  a.severity = m.gain >= 0.1 ? Severity::kHigh : Severity::kWarning;
  a.finding = num(m.adds, "%.0f") + " GEMMs per step are each followed by a separate broadcast " +
              "add kernel (a bias added outside the GEMM): the adds take " +
              num(m.add_s * 1e3, "%.3g") + " ms of a " + num(m.step_s * 1e3, "%.3g") +
              " ms step (" + pct(share) + "; threshold " + pct(config.linear_bias.threshold) + ")";
  a.cause =
      "LibTorch's C++ frontend (torch::nn::Linear, torch::nn::functional::linear) computes a "
      "linear layer on an input of more than 2 dimensions as matmul, then `output += bias`: the "
      "bias takes its own pass over the output, in ATen's generic strided kernel (under autocast "
      "a mixed-precision one: a bf16 or fp16 output, an fp32 bias), where at::linear (what "
      "Python's F.linear calls) adds it in the GEMM's epilogue";
  a.action =
      "call torch::linear(x, weight, bias) (at::linear) on a contiguous input in the forward "
      "instead of the module's forward, e.g. torch::linear(x, fc->weight, fc->bias) (for other "
      "inputs, flatten them to 2-D first); estimated: the adds' " +
      num(m.add_s * 1e3, "%.3g") + " ms leave, the epilogue adds about " +
      num(m.epilogue_s * 1e3, "%.3g") + " ms to the GEMMs (" + pct(gains::kBiasEpilogueCost) +
      " of their " + num(m.gemm_s * 1e3, "%.3g") + " ms)" +
      (m.host_bound ? ", but no step can be shorter than the " + num(m.host_floor_s * 1e3, "%.3g") +
                          " ms the host takes to issue one (its fastest step this epoch" +
                          (s.data_wait_ns > 0 ? "; plus the data wait)" : ")")
                    : std::string()) +
      ": a " + num(m.step_s * 1e3, "%.3g") + " ms step becomes " + num(m.new_step_s * 1e3, "%.3g") +
      " ms";
  a.evidence = {{"unfused_bias_share", share, "fraction"},
                {"unfused_bias_adds_per_step", m.adds, "kernels"},
                {"unfused_bias_add_time", m.add_s * 1e3, "ms"},
                {"unfused_bias_gemm_time", m.gemm_s * 1e3, "ms"},
                {"predicted_epilogue_time", m.epilogue_s * 1e3, "ms"},
                {"step_time", m.step_s * 1e3, "ms"},
                {"predicted_step_time", m.new_step_s * 1e3, "ms"},
                {"threshold", config.linear_bias.threshold, "fraction"}};
  if (m.host_floor_s > 0) a.evidence.push_back({"host_floor_time", m.host_floor_s * 1e3, "ms"});
  a.expected_gain = m.gain;
  a.gain_estimated = true;
  return a;
}

std::optional<Advice> advise_per_parameter_optimizer(const EpochSummary& s,
                                                     const AdvisorsConfig& config) {
  if (s.steps == 0) return std::nullopt;
  const std::optional<gains::OptimizerGain> model = gains::optimizer_gain(s);
  if (!model) return std::nullopt;
  const gains::OptimizerGain& m = *model;
  const double share = m.removed_s / m.step_s;
  if (!(share > config.optimizer.threshold)) return std::nullopt;
  Advice a;
  a.id = "per_parameter_optimizer";
  a.severity = share >= 0.25 ? Severity::kHigh : Severity::kWarning;
  a.finding = "the optimizer updates each parameter in its own kernels (per-parameter " +
              std::string("addcmul_/addcdiv_ in the trace window: about ") +
              num(m.per_parameter_kernels, "%.0f") + " launches per step); the update takes " +
              num(m.removed_s * 1e3, "%.3g") + " ms of a " + num(m.step_s * 1e3, "%.3g") +
              " ms step (" + pct(share) + "; threshold " + pct(config.optimizer.threshold) + ")";
  a.cause =
      m.host_s >= m.kernels_s
          ? "the host issues 9 small kernels per parameter (" +
                (m.host_from_phase
                     ? "phase " + m.phase + " took " + num(m.host_s * 1e3, "%.3g") + " ms per step"
                     : num(m.per_parameter_kernels, "%.0f") + " launches at " +
                           num(m.per_launch_s * 1e6, "%.1f") +
                           " us each, the step's cost per launch") +
                ") while the GPU waits for them"
          : "the per-parameter kernels move about 92 bytes per parameter element where a fused "
            "update moves 28 (" +
                num(m.kernels_s * 1e3, "%.3g") + " ms of kernels per step)";
  a.action =
      "update all parameters in one fused or multi-tensor call: at::_fused_adamw_ (LibTorch 2.x) "
      "over the parameter, gradient and moment lists, or the foreach (_foreach_*) ops; estimated: "
      "the update takes " +
      num(m.fused_s * 1e3, "%.3g") + " ms of kernels fused, so a " + num(m.step_s * 1e3, "%.3g") +
      " ms step becomes " + num(m.new_step_s * 1e3, "%.3g") + " ms";
  a.evidence = {{"optimizer_share", share, "fraction"},
                {"per_parameter_kernels_per_step", m.per_parameter_kernels, "kernels"},
                {"optimizer_host_time", m.host_s * 1e3, "ms"},
                {"optimizer_host_time_from_phase", m.host_from_phase ? 1.0 : 0.0, "bool"},
                {"host_cost_per_launch", m.per_launch_s * 1e6, "us"},
                {"optimizer_kernel_time", m.kernels_s * 1e3, "ms"},
                {"predicted_fused_time", m.fused_s * 1e3, "ms"},
                {"step_time", m.step_s * 1e3, "ms"},
                {"predicted_step_time", m.new_step_s * 1e3, "ms"},
                {"threshold", config.optimizer.threshold, "fraction"}};
  a.expected_gain = m.gain;
  a.gain_estimated = true;
  return a;
}

namespace {

// Without a trace window: the step split into the counted FLOPs at peak, data wait, GPU idle and
// the rest.
std::optional<Advice> low_mfu_from_flops(const EpochSummary& s, const AdvisorsConfig& config) {
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

}  // namespace

std::optional<Advice> advise_low_mfu(const EpochSummary& s, const AdvisorsConfig& config) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  const FlopEpochStats* flops = s.sections.get<FlopEpochStats>();
  if (!flops || s.steps == 0) return std::nullopt;
  const FlopEpochStats& f = *flops;
  if (!measured(f.mfu) || !(f.model_flops_per_step > 0)) return std::nullopt;
  if (f.mfu >= config.low_mfu.threshold) return std::nullopt;
  if (gpu == nullptr || gpu->kernel_classes.steps == 0 || gpu->kernel_classes.traced_ns <= 0) {
    return low_mfu_from_flops(s, config);
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
    // its estimate bounds the gain stated here (launch gaps: the step at a larger batch; data
    // wait: what the cores can deliver).
    const double no_bound = std::numeric_limits<double>::infinity();
    double launch_bound = no_bound, starvation = no_bound;
    if (const auto m = gains::launch_bound_gain(s)) launch_bound = m->gain;
    if (const auto m = gains::starvation_gain(s)) starvation = m->gain;
    const struct {
      double share;
      double bound;
      std::string what;
      const char* action;
    } causes[] = {
        {static_cast<double>(g.idle_data_wait_ns) / t, starvation, "waiting for data",
         "see the data_starvation advice"},
        {static_cast<double>(g.idle_host_sync_ns) / t, no_bound, "after host synchronizations",
         "see the host_sync advice: read values back every N steps"},
        {std::max(0.0, static_cast<double>(g.idle_launch_gap_ns) / t - optimizer_share),
         launch_bound,
         std::string("in launch gaps between kernels") +
             (optimizer_share > 0 ? " besides the optimizer's" : ""),
         "see the launch_bound advice: fewer, larger launches (larger batch, fused ops, CUDA "
         "graphs)"},
        {static_cast<double>(g.idle_other_ns) / t, 0.0,
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
      candidates.push_back({c.share, std::min({gain_from_removing(c.share), c.bound, physical}),
                            "the GPU idles " + pct(c.share) + " of it " + c.what, c.action});
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
