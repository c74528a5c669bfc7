// Gain models (gain_models.h; docs/advice.md, "Gain models").
#include "torchpilot/advisors/core/gain_models.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/runtime/flops/device_peaks.h"
#include "torchpilot/runtime/flops/flop_records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"
#include "torchpilot/runtime/loader/loader_records.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot::gains {
namespace {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }
constexpr size_t C(KernelClass c) { return static_cast<size_t>(c); }

// A fused attention's backward recomputes the scores: 3.5 forward passes of FLOPs where the
// unfused one runs 3 (forward + backward's two).
constexpr double kFusedRecompute = 7.0 / 6.0;
// Of the score-matrix passes the attention detector counts (forward 4: QK^T writes S, softmax
// reads S and writes P, PV reads P; backward 7), the matmuls make 2 of 4 and 4 of 7: at least half.
constexpr double kMatmulScoreTrafficShare = 0.5;
// Per-parameter AdamW in LibTorch runs 9 kernels per parameter (mul_ on the parameter, mul_ and
// add_ on exp_avg, mul_ and addcmul_ on exp_avg_sq, sqrt, div, add_ eps, addcdiv_) moving about
// 92 bytes per fp32 element, of which addcmul_ and addcdiv_ move 32 (4 tensors each); a fused
// AdamW reads parameter, gradient and both moments and writes three: 28 bytes.
constexpr double kAdamKernelsPerParameter = 9;
constexpr double kAdamIdentifiedPerParameter = 2;  // addcmul_, addcdiv_
constexpr double kAdamPerParameterBytes = 92;
constexpr double kAdamIdentifiedBytes = 32;
constexpr double kFusedAdamBytes = 28;
// A host step this much shorter than the median step's own work shows the host's time (below).
constexpr double kHostIssueKnown = 0.9;
// A fused attention's kernels per unfused softmax segment, on average: the forward segment's one
// kernel and the backward's 1-3 (FlashAttention 2's backward runs a preprocess, the main kernel
// and a dQ conversion); forward and backward are separate segments.
constexpr double kFusedKernelsPerSegment = 2;

const KernelClassStats* window(const EpochSummary& s) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (gpu == nullptr || gpu->kernel_classes.steps == 0) return nullptr;
  return &gpu->kernel_classes;
}

double per_step_s(const KernelClassStats& k, double ns) {
  return k.steps > 0 ? ns / 1e9 / static_cast<double>(k.steps) : 0;
}

double positive(double v) { return v > 0 ? v : 0; }

std::string pct0(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100 * f);
  return buf;
}

std::string tflops(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f TFLOP/s", v / 1e12);
  return buf;
}

// FLOPs the GEMM kernels ran per step: the counted matmuls less those of fused attention kernels
// (their time is in the attention class).
double gemm_flops(const FlopEpochStats& f, bool tensor_only) {
  double sum = 0;
  for (int i = 0; i < kMathPrecisions; ++i) {
    if (tensor_only && (i == static_cast<int>(MathPrecision::kFp32) ||
                        i == static_cast<int>(MathPrecision::kOther))) {
      continue;
    }
    sum += positive(f.hardware_flops_by_precision[i]);
  }
  return positive(sum - positive(f.fused_attention_flops_per_step));
}

// The ordinary steps' figures where the step models take them (the epoch had a window and
// enough steps outside it), else null: one predicate for the step, its own work and its wait.
const GpuEpochStats* ordinary_gpu(const EpochSummary& s) {
  const GpuEpochStats* g = s.sections.get<GpuEpochStats>();
  if (g != nullptr && g->traced_steps > 0 && g->ordinary_steps >= kMinOrdinarySteps &&
      g->ordinary_step_p50_ns > 0) {
    return g;
  }
  return nullptr;
}

// Host time per step: what the training thread spends outside the data wait and synchronizing
// calls (the window's host-blocked time per traced step), from the host's step: where the GPU is
// the slower side the steady step is the GPU's, and the host's launches are not that long.
double host_seconds(const EpochSummary& s) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  double sync_s = 0;
  if (gpu != nullptr && gpu->traced_steps > 0) {
    sync_s = static_cast<double>(gpu->stats.host_sync_ns) / 1e9 / gpu->traced_steps;
  }
  return positive(host_step_seconds(s) - mean_wait_seconds(s) - sync_s);
}

// The least a step can take once the GPU is no longer what bounds it, seconds: the mean data
// wait plus the host's issue time, the shortest step less its data wait (a step the host ran
// ahead in, unblocked), or the host's own time per traced step (step less wait and syncs) where
// that is shorter (a trainer that synchronizes every step). 0 when unknown: an issue time of 90%
// of the median step's own work or more (step less wait) says nothing, as the host may have been
// blocked in every step (a full launch queue) or steps may differ that little.
struct HostFloor {
  double issue_s = 0;  // the host's issue time per step (0: unknown)
  double wait_s = 0;   // the mean data wait per step
  // Where the issue time is known: raises `new_step_s` to the data wait plus the issue time x
  // `launch_factor` (the launches left after the change over those before), sets `bound` when
  // that sets the step, and returns the issue part; 0 otherwise.
  double apply(double launch_factor, double& new_step_s, bool& bound) const {
    if (!(issue_s > 0)) return 0;
    const double floor_s = issue_s * launch_factor;
    bound = wait_s + floor_s >= new_step_s;
    new_step_s = std::max(new_step_s, wait_s + floor_s);
    return floor_s;
  }
};
HostFloor host_floor(const EpochSummary& s) {
  HostFloor h;
  h.wait_s = mean_wait_seconds(s);
  const double own_s = own_work_seconds(s);
  double issue_s = s.compute_min_ns > 0 ? static_cast<double>(s.compute_min_ns) / 1e9 : own_s;
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (gpu != nullptr && gpu->traced_steps > 0 && gpu->stats.host_sync_ns > 0) {
    issue_s = std::min(issue_s, host_seconds(s));
  }
  if (issue_s > 0 && issue_s < kHostIssueKnown * own_s) h.issue_s = issue_s;
  return h;
}

// The GPU's busy share of the step, best measure first: the windows' kernel union, the busy
// counter, else all but the data wait.
double busy_fraction(const EpochSummary& s) {
  double busy = 1.0 - std::clamp(s.data_wait_fraction, 0.0, 1.0);
  if (const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>()) {
    const GpuStats& g = gpu->stats;
    if (measured(g.gpu_utilization)) {
      busy = std::min(busy, g.gpu_utilization);
    } else if (measured(g.counter_utilization)) {
      busy = std::min(busy, g.counter_utilization);
    }
  }
  return std::clamp(busy, 0.0, 1.0);
}

// The phase whose name says optimizer ("optimizer", "optim_step", ...), if any ran.
const PhaseTotal* optimizer_phase(const EpochSummary& s) {
  for (const PhaseTotal& p : s.phases) {
    std::string n = p.name;
    for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (p.ns > 0 && n.find("optim") != std::string::npos) return &p;
  }
  return nullptr;
}

}  // namespace

double gain(double old_step_s, double new_step_s) {
  if (!(old_step_s > 0) || !(new_step_s > 0) || new_step_s >= old_step_s) return 0;
  return old_step_s / new_step_s - 1.0;
}

double step_seconds(const EpochSummary& s) {
  return s.steps > 0 ? static_cast<double>(s.wall_ns) / 1e9 / static_cast<double>(s.steps) : 0;
}

double steady_step_seconds(const EpochSummary& s) {
  // Without a window's steps and those its release slowed, where the epoch had a window and
  // enough other steps: in a short epoch they can be half of it (a planted 40-step epoch: median
  // 16.8 ms, its ordinary steps 14.4 ms, the trainer without torchpilot 13.6 ms).
  // Where the GPU is the slower side their host time is not the step: after a stall (the
  // release, the first steps) the host runs ahead until the launch queue is full again, so the
  // GPU's median span is taken where it is the longer.
  return std::max(host_step_seconds(s), gpu_step_seconds(s));
}

bool gpu_bound(const EpochSummary& s) {
  const double gpu_s = gpu_step_seconds(s);
  if (!(gpu_s > 0)) return false;
  const GpuEpochStats* g = ordinary_gpu(s);
  if (g != nullptr && g->ordinary_gpu_host_ns > 0) {
    return static_cast<double>(g->ordinary_gpu_ns) >=
           kGpuBoundMargin * static_cast<double>(g->ordinary_gpu_host_ns);
  }
  return gpu_s >= kGpuBoundMargin * host_step_seconds(s);
}

double gpu_step_seconds(const EpochSummary& s) {
  const GpuEpochStats* g = ordinary_gpu(s);
  if (g == nullptr || g->ordinary_gpu_steps < kMinOrdinarySteps) return 0;
  return static_cast<double>(g->ordinary_gpu_step_p50_ns) / 1e9;
}

double host_step_seconds(const EpochSummary& s) {
  if (const GpuEpochStats* g = ordinary_gpu(s)) {
    return static_cast<double>(g->ordinary_step_p50_ns) / 1e9;
  }
  if (s.steps > 0 && s.step_p50_ns > 0) return static_cast<double>(s.step_p50_ns) / 1e9;
  return step_seconds(s);
}

double starvation_step_seconds(const EpochSummary& s) {
  const double host_s = own_work_seconds(s) + mean_wait_seconds(s);
  return gpu_bound(s) ? std::max(host_s, gpu_step_seconds(s)) : host_s;
}

double mean_wait_seconds(const EpochSummary& s) {
  if (const GpuEpochStats* g = ordinary_gpu(s)) {
    return static_cast<double>(g->ordinary_data_wait_ns) / 1e9 /
           static_cast<double>(g->ordinary_steps);
  }
  return s.steps > 0 ? static_cast<double>(s.data_wait_ns) / 1e9 / s.steps : 0;
}

double own_work_seconds(const EpochSummary& s) {
  if (const GpuEpochStats* g = ordinary_gpu(s)) {
    return static_cast<double>(g->ordinary_compute_p50_ns) / 1e9;
  }
  if (s.compute_p50_ns > 0) return static_cast<double>(s.compute_p50_ns) / 1e9;
  return positive(step_seconds(s) - mean_wait_seconds(s));
}

UntracedIdle untraced_idle(const EpochSummary& s) {
  UntracedIdle u;
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (gpu == nullptr || gpu->traced_steps <= 0 || gpu->stats.traced_ns <= 0 ||
      !measured(gpu->stats.gpu_utilization)) {
    return u;
  }
  u.traced_s = static_cast<double>(gpu->stats.traced_ns) / 1e9 / gpu->traced_steps;
  u.busy_s = std::clamp(gpu->stats.gpu_utilization, 0.0, 1.0) * u.traced_s;
  const OutlierStats* o = s.sections.get<OutlierStats>();
  u.untraced_s = o != nullptr && o->gpu_median_ns > 0 ? static_cast<double>(o->gpu_median_ns) / 1e9
                                                      : steady_step_seconds(s);
  const double idle_traced = u.traced_s - u.busy_s;
  if (u.untraced_s > 0 && idle_traced > 0) {
    u.share = std::clamp((u.untraced_s - u.busy_s) / idle_traced, 0.0, 1.0);
  }
  return u;
}

std::optional<PrecisionGain> precision_gain(const EpochSummary& s) {
  const FlopEpochStats* f = s.sections.get<FlopEpochStats>();
  if (f == nullptr) return std::nullopt;
  PrecisionGain g;
  g.step_s = steady_step_seconds(s);
  g.fp32_flops = positive(f->hardware_flops_by_precision[P(MathPrecision::kFp32)]);
  const double p32 = f->datasheet_flops_by_precision[P(MathPrecision::kFp32)];
  const double pbf = f->datasheet_flops_by_precision[P(MathPrecision::kBf16)];
  const double ptf = f->datasheet_flops_by_precision[P(MathPrecision::kTf32)];
  if (!(g.step_s > 0) || !(g.fp32_flops > 0) || !(p32 > 0) || !(pbf > 0)) return std::nullopt;
  const Calibration cal = calibration(f->device);

  // Removed: the fp32 GEMM/conv kernels the window measured, else the fp32 FLOPs at the fp32
  // peak (a floor), within the step.
  const KernelClassStats* k = window(s);
  if (k != nullptr && k->ns[C(KernelClass::kSimtGemm)] > 0) {
    g.removed_s = per_step_s(*k, k->ns[C(KernelClass::kSimtGemm)]);
    g.removed_measured = true;
  } else {
    g.removed_s = std::min(g.fp32_flops / p32, busy_fraction(s) * g.step_s);
  }
  g.removed_s = std::min(g.removed_s, g.step_s);

  // Rate: the tensor-core GEMMs of the same window when there are any, else the calibration.
  const double tc_s = k != nullptr ? per_step_s(*k, k->ns[C(KernelClass::kTensorGemm)]) : 0;
  const double tc_flops = gemm_flops(*f, true);
  if (tc_s > 0 && tc_flops > 0) {
    g.rate = std::min(pbf, tc_flops / tc_s);
    g.rate_source = "measured: the tensor-core GEMMs of this window ran " + tflops(g.rate);
  } else {
    g.rate = pbf * cal.gemm;
    g.rate_source = "calibrated: " + pct0(cal.gemm) + " of the bf16 datasheet peak, " +
                    tflops(g.rate) + " (" + cal.source + ")";
  }
  // Fused attention kernels of an fp32 model ran in fp32 (SDPA takes the model's dtype); under
  // autocast they run in bf16 at the calibrated fused-attention rate. Their FLOPs are among the
  // fp32 ones, so the GEMM term leaves them out.
  if (k != nullptr && k->fused_attention_ns > 0 && f->fused_attention_flops_per_step > 0 &&
      f->dominant_precision == MathPrecision::kFp32) {
    g.attention_removed_s = std::min(per_step_s(*k, k->fused_attention_ns), g.step_s - g.removed_s);
    g.attention_flops = std::min(f->fused_attention_flops_per_step, g.fp32_flops);
    g.attention_s = g.attention_flops / (pbf * cal.fused_attention);
  }
  g.gemm_s = (g.fp32_flops - g.attention_flops) / g.rate;

  // Autocast casts each fp32 matmul's operands to bf16 in forward and their gradients back in
  // backward (4 + 2 bytes per element, twice). Operand elements per call: those of a cube GEMM of
  // the call's FLOPs (2 s^2 for 2 s^3 FLOPs); a forward call is one of three (two in backward).
  for (const OpFlops& op : f->top_ops) {
    if (op.precision != MathPrecision::kFp32 || !(op.calls_per_step > 0)) continue;
    const double side = std::cbrt(op.flops_per_step / op.calls_per_step / 2);
    g.cast_bytes += op.calls_per_step / 3 * 2 * side * side * 6 * 2;
  }
  g.cast_s = f->dram_bytes_per_s > 0 ? g.cast_bytes / f->dram_bytes_per_s : 0;
  g.new_step_s =
      g.step_s - g.removed_s - g.attention_removed_s + g.gemm_s + g.attention_s + g.cast_s;
  // The host issues the same launches and autocast's casts besides: the new step takes at least
  // the data wait and the host's fastest step so far (TF32 too).
  const HostFloor floor = host_floor(s);
  g.host_floor_s = floor.apply(1.0, g.new_step_s, g.host_bound);
  const double least_s = g.host_floor_s > 0 ? floor.wait_s + g.host_floor_s : 0;
  g.gain = gain(g.step_s, g.new_step_s);
  if (ptf > 0) {
    // TF32 moves the GEMMs only: fp32 attention stays as it is.
    g.tf32_rate = g.rate * ptf / pbf;
    g.tf32_gain =
        gain(g.step_s, std::max(least_s, g.step_s - g.removed_s +
                                             (g.fp32_flops - g.attention_flops) / g.tf32_rate));
  }
  return g;
}

std::optional<FusionGain> fusion_gain(const EpochSummary& s) {
  const FlopEpochStats* f = s.sections.get<FlopEpochStats>();
  if (f == nullptr || !(f->unfused_attention_flops_per_step > 0)) return std::nullopt;
  FusionGain g;
  g.step_s = steady_step_seconds(s);
  if (!(g.step_s > 0)) return std::nullopt;
  const Calibration cal = calibration(f->device);
  const MathPrecision precision = f->dominant_precision;
  const double peak = f->datasheet_flops_by_precision[P(precision)];

  const KernelClassStats* k = window(s);
  if (k != nullptr) {
    g.measured = true;
    // The kernels around each unfused softmax up to the GEMMs that bound it (scale, mask, casts,
    // dropout; forward and backward) when the window found them, else the softmax and mask
    // kernels alone.
    g.pieces_around_softmax = k->unfused_attention_softmaxes > 0;
    g.pieces_s =
        g.pieces_around_softmax
            ? per_step_s(*k, k->unfused_attention_pieces_ns)
            : per_step_s(*k, positive(k->ns[C(KernelClass::kAttention)] - k->fused_attention_ns));
    // Its matmuls run among the other GEMMs: their FLOPs at the rate the window's GEMMs ran.
    const double gemm_s =
        per_step_s(*k, k->ns[C(KernelClass::kTensorGemm)] + k->ns[C(KernelClass::kSimtGemm)]);
    const double flops = gemm_flops(*f, false);
    if (gemm_s > 0 && flops > 0) {
      g.gemm_rate = flops / gemm_s;
    } else if (peak > 0) {
      g.gemm_rate = peak * cal.gemm;
    }
    g.matmul_s = g.gemm_rate > 0 ? f->unfused_attention_flops_per_step / g.gemm_rate : 0;
    // The attention matmuls write and read the score matrix (QK^T writes S, PV reads P; in
    // backward 4 of the 7 passes): with a short head dimension they run at DRAM speed, not at
    // the rate of the model's large GEMMs.
    if (f->dram_bytes_per_s > 0) {
      g.matmul_traffic_s = kMatmulScoreTrafficShare * f->unfused_attention_traffic_bytes_per_step /
                           f->dram_bytes_per_s;
      g.matmul_s = std::max(g.matmul_s, g.matmul_traffic_s);
    }
    // Measured: the GEMMs that bound the softmax segments (QK^T, PV and their gradients).
    if (k->unfused_attention_gemm_ns > 0) {
      g.matmul_measured = true;
      g.matmul_s = per_step_s(*k, k->unfused_attention_gemm_ns);
    }
    g.removed_s = g.pieces_s + g.matmul_s;
  } else if (f->dram_bytes_per_s > 0 && f->unfused_attention_traffic_bytes_per_step > 0 &&
             peak > 0) {
    // No window: the score matrices' traffic at DRAM bandwidth and the matmuls at the calibrated
    // GEMM rate.
    g.pieces_s = f->unfused_attention_traffic_bytes_per_step / f->dram_bytes_per_s;
    g.gemm_rate = peak * cal.gemm;
    g.matmul_s = f->unfused_attention_flops_per_step / g.gemm_rate;
    g.removed_s = g.pieces_s + g.matmul_s;
  } else {
    return std::nullopt;
  }
  g.removed_s = std::min(g.removed_s, g.step_s);
  g.fused_flops = f->unfused_attention_flops_per_step * kFusedRecompute;
  if (peak > 0) {
    g.fused_rate = peak * cal.fused_attention;
    g.fused_s = g.fused_flops / g.fused_rate;
    g.calibration = pct0(cal.fused_attention) + " of the " + to_string(precision) +
                    " datasheet peak, " + tflops(g.fused_rate) + " (" + cal.source + ")";
  }
  g.new_step_s = g.step_s - g.removed_s + g.fused_s;
  // The data wait and the host's fastest step less the launches the fused kernels save (host
  // time taken as proportional to launches; without a window nothing is counted as saved): the
  // new step takes at least that.
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  const HostFloor floor = host_floor(s);
  if (floor.issue_s > 0) {
    g.launch_factor = 1;
    if (k != nullptr && gpu != nullptr && gpu->traced_steps > 0 && gpu->stats.kernels > 0 &&
        k->unfused_attention_launches > 0) {
      const double launches = static_cast<double>(gpu->stats.kernels) / gpu->traced_steps;
      const double removed = static_cast<double>(k->unfused_attention_launches) / k->steps;
      const double added =
          kFusedKernelsPerSegment * static_cast<double>(k->unfused_attention_softmaxes) / k->steps;
      g.launch_factor = std::clamp((launches - removed + added) / launches, 0.0, 1.0);
    }
  }
  g.host_floor_s = floor.apply(g.launch_factor, g.new_step_s, g.host_bound);
  g.gain = gain(g.step_s, g.new_step_s);
  return g;
}

std::optional<BiasGain> bias_gain(const EpochSummary& s) {
  const KernelClassStats* k = window(s);
  if (k == nullptr || k->unfused_bias_adds == 0) return std::nullopt;
  BiasGain g;
  g.step_s = steady_step_seconds(s);
  if (!(g.step_s > 0)) return std::nullopt;
  g.adds = static_cast<double>(k->unfused_bias_adds) / static_cast<double>(k->steps);
  g.add_s = per_step_s(*k, k->unfused_bias_add_ns);
  g.gemm_s = per_step_s(*k, k->unfused_bias_gemm_ns);
  g.epilogue_s = g.gemm_s * kBiasEpilogueCost;
  g.removed_s = std::clamp(g.add_s - g.epilogue_s, 0.0, g.step_s);
  g.new_step_s = g.step_s - g.removed_s;
  // The host's fastest step bounds it, as in the fusion model, but with no launches saved: under
  // autocast at::linear casts each bias to bf16 in a kernel of its own, where the add was.
  g.host_floor_s = host_floor(s).apply(1.0, g.new_step_s, g.host_bound);
  g.gain = gain(g.step_s, g.new_step_s);
  return g;
}

std::optional<LaunchBoundGain> launch_bound_gain(const EpochSummary& s) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  const KernelClassStats* k = window(s);
  if (gpu == nullptr || k == nullptr || gpu->traced_steps == 0 || gpu->stats.kernels == 0 ||
      !(k->kernel_sum_ns > 0)) {
    return std::nullopt;
  }
  LaunchBoundGain g;
  g.factor = kLaunchBoundBatchFactor;
  g.step_s = steady_step_seconds(s);
  if (!(g.step_s > 0)) return std::nullopt;
  g.samples_per_step = s.samples > 0 ? static_cast<double>(s.samples) / s.steps : 0;
  g.launches = static_cast<double>(gpu->stats.kernels) / gpu->traced_steps;
  g.host_s = host_seconds(s);
  g.per_launch_s = g.host_s / g.launches;
  g.gpu_busy_s = per_step_s(*k, k->busy_ns());
  g.gpu_busy_scaled_s = g.gpu_busy_s * k->kernel_sum_scaled_ns / k->kernel_sum_ns;
  g.wait_s = mean_wait_seconds(s);
  // The host issues the same launches; the GPU runs the grown kernels meanwhile.
  g.new_step_s = g.factor * g.wait_s + std::max(g.host_s, g.gpu_busy_scaled_s);
  g.gain = gain(g.factor * g.step_s, g.new_step_s);
  return g;
}

std::optional<HostSyncGain> host_sync_gain(const EpochSummary& s) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  if (gpu == nullptr || gpu->traced_steps == 0) return std::nullopt;
  const GpuStats& st = gpu->stats;
  HostSyncGain g;
  const double traced = static_cast<double>(std::max<Nanos>(1, st.traced_ns));
  g.idle = static_cast<double>(st.idle_host_sync_ns) / traced;
  g.untraced = g.idle;
  g.u = untraced_idle(s);
  if (g.untraced_known()) {
    g.untraced = std::clamp(g.idle * g.u.traced_s * g.u.share / g.u.untraced_s, 0.0, 1.0);
  }
  g.removed = g.untraced;
  g.step_s = steady_step_seconds(s);
  g.traced_blocked_s = static_cast<double>(st.host_sync_ns) / 1e9 / gpu->traced_steps;
  if (gpu->sync_probed_steps > 0) {
    g.probed_blocked_s = static_cast<double>(gpu->sync_probed_ns) / 1e9 / gpu->sync_probed_steps;
  }
  g.blocked_s = std::max(g.traced_blocked_s, g.probed_blocked_s);
  if (g.step_s > 0 && g.blocked_s > 0 && g.blocked_s / g.step_s < g.removed) {
    g.blocked_bound = true;
    g.removed = g.blocked_s / g.step_s;
  }
  g.gain = detail::gain_from_removing(g.removed);
  return g;
}

std::optional<StarvationGain> starvation_gain(const EpochSummary& s, int workers) {
  const LoaderStats* l = s.sections.get<LoaderStats>();
  if (l == nullptr || l->produce_count == 0 || s.steps == 0) return std::nullopt;
  StarvationGain g;
  // The step's own work: the median step less its wait (robust to warm-up and a trace window's
  // stall, which are not waits), plus the mean wait: waits that come in bursts count in full.
  const double wait_s = mean_wait_seconds(s);
  g.compute_s = own_work_seconds(s);
  g.step_s = starvation_step_seconds(s);
  // Where that is the GPU's, it runs queued work through the host's waits: only its own idle in
  // them goes (the window's share of its span idle in data waits; the whole wait without a
  // window).
  if (g.step_s > g.compute_s + wait_s) {
    double idle_s = wait_s;
    const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
    if (gpu != nullptr && gpu->traced_steps > 0 && gpu->stats.traced_ns > 0) {
      idle_s = std::min(wait_s, static_cast<double>(gpu->stats.idle_data_wait_ns) /
                                    static_cast<double>(gpu->stats.traced_ns) * g.step_s);
    }
    g.gpu_s = g.step_s - idle_s;
  }
  g.batch_s = static_cast<double>(l->produce_ns) / 1e9 / l->produce_count;
  g.batch_cpu_s =
      static_cast<double>(std::min(l->produce_cpu_ns, l->produce_ns)) / 1e9 / l->produce_count;
  g.usable_workers = std::max(1, l->max_workers - 1);
  // The gain is for the workers the advice names, not for every core (an I/O-bound loader's
  // workers deliver their time per batch / their count, whatever the cores could do).
  g.workers = std::max({1, workers, static_cast<int>(l->settings.workers)});
  g.delivery_s = std::max(g.batch_cpu_s / g.usable_workers, g.batch_s / g.workers);
  g.new_step_s = std::max({g.compute_s, g.delivery_s, g.gpu_s});
  g.gain = gain(g.step_s, g.new_step_s);
  return g;
}

std::optional<OptimizerGain> optimizer_gain(const EpochSummary& s) {
  const GpuEpochStats* gpu = s.sections.get<GpuEpochStats>();
  const KernelClassStats* k = window(s);
  if (k == nullptr || k->per_parameter_optimizer_launches == 0) return std::nullopt;
  OptimizerGain g;
  g.step_s = steady_step_seconds(s);
  if (!(g.step_s > 0)) return std::nullopt;
  const double identified_s =
      per_step_s(*k, positive(k->ns[C(KernelClass::kOptimizer)] - k->fused_optimizer_ns));
  g.per_parameter_kernels = static_cast<double>(k->per_parameter_optimizer_launches) / k->steps /
                            kAdamIdentifiedPerParameter * kAdamKernelsPerParameter;
  g.kernels_s = identified_s * kAdamPerParameterBytes / kAdamIdentifiedBytes;
  if (gpu != nullptr && gpu->traced_steps > 0 && gpu->stats.kernels > 0) {
    g.per_launch_s =
        host_seconds(s) / (static_cast<double>(gpu->stats.kernels) / gpu->traced_steps);
  }
  g.host_s = g.per_parameter_kernels * g.per_launch_s;
  // A phase the trainer named for its optimizer measures the update's host time directly. The
  // step's mean cost per launch overstates it: a forward or backward op pays autograd and
  // dispatch work an in-place optimizer op does not (H100, LibTorch 2.11, the planted GPT with
  // per-parameter AdamW: 19 us per launch over the step, 12 us per launch the fused update saved).
  // Its median over the steps it ran in (as the step's own median): a trace window's steps pay
  // CUPTI's cost on every launch, and an optimizer phase is almost all launches.
  if (const PhaseTotal* p = optimizer_phase(s)) {
    g.host_s = p->p50_ns > 0 && p->steps > 0
                   ? static_cast<double>(p->p50_ns) / 1e9 * static_cast<double>(p->steps) / s.steps
                   : static_cast<double>(p->ns) / 1e9 / s.steps;
    g.host_from_phase = true;
    g.phase = p->name;
  }
  // The per-parameter update takes the longer of issuing its launches and running its kernels;
  // host time shortens the step only while the GPU waits for it (the window's idle share).
  const double idle_s =
      k->traced_ns > 0 ? g.step_s * k->idle_ns / static_cast<double>(k->traced_ns) : g.step_s;
  g.removed_s = std::min(g.step_s, std::max(std::min(g.host_s, idle_s), g.kernels_s));
  g.fused_s = g.kernels_s * kFusedAdamBytes / kAdamPerParameterBytes;
  g.new_step_s = g.step_s - g.removed_s + g.fused_s;
  g.gain = gain(g.step_s, g.new_step_s);
  return g;
}

}  // namespace torchpilot::gains
