// Precision and fusion advisors: fp32 matmuls on a tensor-core GPU, unfused attention, unfused
// linear bias, per-parameter optimizer steps (the low-MFU advisor: mfu_advisor.cpp).
// They read EpochSummary::flops (the FLOP counter) and, when present, EpochSummary::gpu.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "precision_advisors_internal.h"
#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/advisors/core/gain_models.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace {

// A bf16 peak at least this many times the fp32 peak: the GPU has tensor cores worth using.
constexpr double kTensorCoreRatio = 4.0;

using detail::lower;
using detail::num;
using detail::pct;
using detail::share_of_step;
using detail::step_becomes;
using gains::step_seconds;
using precision_detail::P;

std::string device_name(const FlopEpochStats& f) {
  return f.device.empty() ? "this GPU" : f.device;
}

// The end of an advice sized by a gain model (gain_models.h): the step before and after the change
// and the advisor's threshold as evidence, and the model's gain as the (estimated) expected gain.
template <typename Gain>
void add_model_gain(Advice& a, const Gain& m, double threshold) {
  a.evidence.push_back({"step_time", m.step_s * 1e3, "ms"});
  a.evidence.push_back({"predicted_step_time", m.new_step_s * 1e3, "ms"});
  a.evidence.push_back({"threshold", threshold, "fraction"});
  a.expected_gain = m.gain;
  a.gain_estimated = true;
}

}  // namespace

std::optional<Advice> advise_fp32_matmul(const EpochSummary& s, const AdvisorsConfig& config) {
  const FlopEpochStats* counted = s.sections.get<FlopEpochStats>();
  if (counted == nullptr || s.steps == 0) return std::nullopt;
  const FlopEpochStats& f = *counted;
  if (!(f.model_flops_per_step > 0)) return std::nullopt;
  const double fp32 = f.model_flops_by_precision[P(MathPrecision::kFp32)];
  const double share = fp32 / f.model_flops_per_step;
  if (!(share > config.fp32_matmul.threshold)) return std::nullopt;
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
              pct(config.fp32_matmul.threshold) + ")";
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
      ": " + step_becomes(m.step_s, m.new_step_s);
  a.evidence = {{"fp32_flops_share", share, "fraction"},
                {"fp32_flops_per_step", fp32 / 1e9, "GFLOP"},
                {"fp32_peak", p32 / 1e12, "TFLOP/s"},
                {"bf16_peak", pbf / 1e12, "TFLOP/s"},
                {"fp32_time_share_estimate", fp32_step_share, "fraction"},
                {"expected_gain_tf32", gain_tf32, "fraction"},
                {"threshold", config.fp32_matmul.threshold, "fraction"},
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
  if (!(share > config.unfused_attention.threshold)) return std::nullopt;

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
              pct(config.unfused_attention.threshold) + ")";
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
        ": " + step_becomes(step_s, model->new_step_s);
  } else {
    a.action += "; the time it saves is not estimated here (no GPU trace, no device bandwidth)";
  }
  a.evidence = {{"unfused_attention_share", share, "fraction"},
                {"unfused_attention_flops_per_step", unfused / 1e9, "GFLOP"},
                {"unfused_attentions_per_step", static_cast<double>(n), "attentions"},
                {"score_matrix_traffic_per_step", traffic / 1e6, "MB"},
                {"step_time", step_s * 1e3, "ms"},
                {"threshold", config.unfused_attention.threshold, "fraction"}};
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
  if (!(share > config.unfused_linear_bias.threshold)) return std::nullopt;
  Advice a;
  a.id = "unfused_linear_bias";
  a.severity = m.gain >= 0.1 ? Severity::kHigh : Severity::kWarning;
  a.finding = num(m.adds, "%.0f") + " GEMMs per step are each followed by a separate broadcast " +
              "add kernel (a bias added outside the GEMM): the adds take " +
              share_of_step(m.add_s, m.step_s, share, config.unfused_linear_bias.threshold);
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
      ": " + step_becomes(m.step_s, m.new_step_s);
  a.evidence = {{"unfused_bias_share", share, "fraction"},
                {"unfused_bias_adds_per_step", m.adds, "kernels"},
                {"unfused_bias_add_time", m.add_s * 1e3, "ms"},
                {"unfused_bias_gemm_time", m.gemm_s * 1e3, "ms"},
                {"predicted_epilogue_time", m.epilogue_s * 1e3, "ms"}};
  add_model_gain(a, m, config.unfused_linear_bias.threshold);
  if (m.host_floor_s > 0) a.evidence.push_back({"host_floor_time", m.host_floor_s * 1e3, "ms"});
  return a;
}

std::optional<Advice> advise_per_parameter_optimizer(const EpochSummary& s,
                                                     const AdvisorsConfig& config) {
  if (s.steps == 0) return std::nullopt;
  const std::optional<gains::OptimizerGain> model = gains::optimizer_gain(s);
  if (!model) return std::nullopt;
  const gains::OptimizerGain& m = *model;
  const double share = m.removed_s / m.step_s;
  if (!(share > config.per_parameter_optimizer.threshold)) return std::nullopt;
  Advice a;
  a.id = "per_parameter_optimizer";
  a.severity = share >= 0.25 ? Severity::kHigh : Severity::kWarning;
  a.finding = "the optimizer updates each parameter in its own kernels (per-parameter " +
              std::string("addcmul_/addcdiv_ in the trace window: about ") +
              num(m.per_parameter_kernels, "%.0f") + " launches per step); the update takes " +
              share_of_step(m.removed_s, m.step_s, share, config.per_parameter_optimizer.threshold);
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
      num(m.fused_s * 1e3, "%.3g") + " ms of kernels fused, so " +
      step_becomes(m.step_s, m.new_step_s);
  a.evidence = {{"optimizer_share", share, "fraction"},
                {"per_parameter_kernels_per_step", m.per_parameter_kernels, "kernels"},
                {"optimizer_host_time", m.host_s * 1e3, "ms"},
                {"optimizer_host_time_from_phase", m.host_from_phase ? 1.0 : 0.0, "bool"},
                {"host_cost_per_launch", m.per_launch_s * 1e6, "us"},
                {"optimizer_kernel_time", m.kernels_s * 1e3, "ms"},
                {"predicted_fused_time", m.fused_s * 1e3, "ms"}};
  add_model_gain(a, m, config.per_parameter_optimizer.threshold);
  return a;
}

}  // namespace torchpilot
