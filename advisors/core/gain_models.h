// Gain models (docs/advice.md, "Gain models"): what an advice's change would give, from an epoch's
// measured figures. gain = old step time / predicted new step time - 1: the time the change removes
// is measured (kernel classes of the detailed windows, waits, loader counters), the time of what
// replaces it is predicted (a roofline at a calibrated rate). Every such gain is an estimate.
// The advisors (precision, fusion, launch-bound, data starvation, low MFU) and their tests use
// these; each returns nullopt when the figures it needs are missing.
//
// Pure functions of an EpochSummary; nothing here throws.
#pragma once

#include <optional>
#include <string>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot::gains {

// old / new - 1, 0 when either is not positive or new >= old.
double gain(double old_step_s, double new_step_s);

// The epoch's mean step time, seconds (0 without steps).
double step_seconds(const EpochSummary& s);

// The step a gain is stated for, seconds: the median of the epoch's ordinary steps
// (GpuEpochStats::ordinary_step_p50_ns: no window's, no release's, none probed; their median GPU
// span, ordinary_gpu_step_p50_ns, where that is longer and known for kMinOrdinarySteps of them:
// a GPU-bound trainer's host runs ahead after a stall) where it had a window and at least
// kMinOrdinarySteps others, else the median step (EpochSummary::step_p50_ns),
// else the mean. The mean carries the first steps' warm-up, the trace window's own cost and the
// stall at its end: on the H100 planted pairs (bench/planted_pairs.cpp, LibTorch 2.11) the epoch
// mean ran 1.1-2.9x the median, the median 0.96-1.24x the same trainer's step with torchpilot off.
// In a short epoch a window and its release are no minority.
constexpr int64_t kMinOrdinarySteps = 8;
double steady_step_seconds(const EpochSummary& s);
// The host's side of it: the ordinary steps' median host step (no GPU span), else as
// steady_step_seconds. What the host's launches and own work take per step.
double host_step_seconds(const EpochSummary& s);
// The GPU's side: the ordinary steps' median GPU span where steady_step_seconds takes the
// ordinary steps and kMinOrdinarySteps of them have one, else 0 (unknown).
double gpu_step_seconds(const EpochSummary& s);
// The GPU is the slower side: the ordinary steps' GPU lengths in total are kGpuBoundMargin x
// the same steps' host lengths or more, both taken the same way (GpuEpochStats::ordinary_gpu_ns,
// ordinary_gpu_host_ns: a run's mean where steps share markers); else (no totals) its median
// step against the host's median step. A host-bound trainer's GPU spans follow its host steps,
// but a run's mean is no median: a stock loader's bursty waits (2 and 30 ms steps) put the
// host's median step at 0.6x the runs' means on an H200, which read as GPU-bound and sized the
// starvation gain from the GPU.
constexpr double kGpuBoundMargin = 1.2;
bool gpu_bound(const EpochSummary& s);

// The steady step's parts, seconds, over the same steps as steady_step_seconds: the step's own
// work (the median step less its data wait: GpuEpochStats::ordinary_compute_p50_ns, else
// EpochSummary::compute_p50_ns, else the mean step less the mean wait) and the mean data wait per
// step (GpuEpochStats::ordinary_data_wait_ns over the ordinary steps, else the epoch's). A traced
// step runs longer and waits less (the loader had longer to produce): in a short epoch the
// window's steps would size the loader's workers and the wait from the wrong steps.
double own_work_seconds(const EpochSummary& s);
double mean_wait_seconds(const EpochSummary& s);
// The step the data-starvation model and advice state: own work plus the mean wait, or the GPU's
// step where the GPU is the slower side (gpu_bound) and that is longer: it runs queued work
// through the host's waits.
double starvation_step_seconds(const EpochSummary& s);

// A trace window slows the host's launches (CUPTI's per-launch cost): where the host is what the
// GPU waits for (after a sync, the drain lasts until the host launches again), the window's steps
// show GPU idle that the others do not have. The share of a traced step's idle an untraced step
// keeps: (untraced step - busy) / (traced step - busy), in [0, 1], where busy is the window's
// kernel time per step and the untraced step is the median GPU span of ordinary steps (step
// markers), else the median step. 1 without the figures.
struct UntracedIdle {
  double share = 1.0;     // of the traced step's idle
  double traced_s = 0;    // the window's GPU span per step
  double untraced_s = 0;  // the ordinary step
  double busy_s = 0;      // the window's kernel time per step
};
UntracedIdle untraced_idle(const EpochSummary& s);

// Host syncs removed (host_sync's model, which low_mfu's idle split states too): the window's
// sync idle as an untraced step keeps it (untraced_idle), and at most the host's time blocked in
// the syncs: without them the host still issues every launch and does its own work. The blocked
// time is the larger of the window's and that of the untraced steps the sync probe timed after
// it (GpuEpochStats::sync_probed_*): tracing slows the host's launches, so where the GPU is the
// slower side the window's steps wait less than ordinary ones (a 14 ms step with four item()
// calls: 0.9 ms blocked traced, the fix measured 2.6 ms).
struct HostSyncGain {
  double idle = 0;      // the window's sync idle, share of traced time
  double untraced = 0;  // the same share as an untraced step has it (idle without figures)
  UntracedIdle u;
  double traced_blocked_s = 0;  // the host's time blocked in syncs per traced step
  double probed_blocked_s = 0;  // per ordinary step the probe timed (0: none probed)
  double blocked_s = 0;         // the larger of the two
  double step_s = 0;            // the steady step (steady_step_seconds)
  bool blocked_bound = false;   // blocked_s / step_s is below `untraced` and sets `removed`
  double removed = 0;           // the share of the step removed
  double gain = 0;              // removed / (1 - removed)
  // The window's and the ordinary steps' GPU spans are known: `untraced` is the scaled share.
  bool untraced_known() const { return u.traced_s > 0 && u.untraced_s > 0; }
};
std::optional<HostSyncGain> host_sync_gain(const EpochSummary& s);

// fp32 GEMM/conv kernels moved to the tensor cores (bf16 autocast; TF32 beside it).
struct PrecisionGain {
  double step_s = 0;
  double removed_s = 0;           // the fp32 GEMM/conv kernels' time per step
  bool removed_measured = false;  // from the window's kernel classes (else FLOPs at the fp32 peak)
  double fp32_flops = 0;          // per step (hardware FLOPs: what the kernels ran)
  double rate = 0;                // predicted tensor-core FLOP/s (bf16)
  std::string rate_source;        // the calibration used
  double gemm_s = 0;              // (fp32_flops - attention_flops) / rate
  // Fused attention (scaled_dot_product_attention) in an fp32 model runs fp32 kernels; autocast
  // moves it to bf16 too: its measured time is removed, its FLOPs at the fused-attention rate
  // added.
  double attention_removed_s = 0;
  double attention_flops = 0;
  double attention_s = 0;
  double cast_bytes = 0;  // autocast's casts per step (estimated)
  double cast_s = 0;      // cast_bytes / DRAM bandwidth
  // The fastest the host issued a step (the shortest step less its data wait, or the window's
  // host time less syncs; 0: unknown, when that is 90% of the median step's own work or more):
  // the new step is no shorter than it plus the mean data wait (TF32's either).
  double host_floor_s = 0;
  bool host_bound = false;  // the floor, not the GPU, sets new_step_s
  double new_step_s = 0;    // max(step - removed - attention removed + gemm + attention + cast,
                            //     data wait + host floor)
  double gain = 0;
  double tf32_rate = 0;  // TF32 instead (no casts)
  double tf32_gain = 0;
};
std::optional<PrecisionGain> precision_gain(const EpochSummary& s);

// An unfused attention replaced by a fused kernel (scaled_dot_product_attention).
struct FusionGain {
  double step_s = 0;
  double pieces_s = 0;  // measured kernels of the unfused attention other than its matmuls
                        // (around each softmax up to its GEMMs; else softmax and mask alone)
  double matmul_s = 0;  // its matmuls: measured (the GEMMs bounding the softmax segments), else
                        // max(FLOPs at the window's GEMM rate, score-matrix passes at DRAM rate)
  bool matmul_measured = false;
  bool pieces_around_softmax = false;  // pieces_s from the kernels around each softmax
  double matmul_traffic_s = 0;  // the matmuls' share of the score-matrix traffic / DRAM bandwidth
  double gemm_rate = 0;         // FLOP/s of the window's GEMM kernels (or the calibrated rate)
  bool measured = false;        // from a window (else the score-matrix traffic at DRAM bandwidth)
  double removed_s = 0;         // pieces + matmuls
  double fused_flops = 0;       // the fused kernels' FLOPs (backward recomputes the scores: x 7/6)
  double fused_rate = 0;        // peak x calibrated fused-attention efficiency
  double fused_s = 0;           // fused_flops / fused_rate
  std::string calibration;
  // The host's fastest step (as PrecisionGain's) x launch_factor: the launches left after the
  // fused kernels replace the attention's (2 per softmax segment) over the window's launches
  // (1 without a window).
  double launch_factor = 0;
  double host_floor_s = 0;  // 0: unknown
  bool host_bound = false;  // the floor, not the GPU, sets new_step_s
  double new_step_s = 0;    // max(step - removed + fused, data wait + host floor)
  double gain = 0;
};
std::optional<FusionGain> fusion_gain(const EpochSummary& s);

// Biases added outside their GEMMs (a GEMM, then a broadcast add) moved into the GEMMs' epilogue
// (at::linear instead of LibTorch's C++ torch::nn::Linear on inputs of more than 2 dimensions).
struct BiasGain {
  double step_s = 0;
  double adds = 0;          // broadcast adds after GEMMs per step (the window's)
  double add_s = 0;         // their kernel time per step
  double gemm_s = 0;        // the GEMMs before them, per step
  double epilogue_s = 0;    // gemm_s x kBiasEpilogueCost: what the epilogue adds to those GEMMs
  double removed_s = 0;     // add_s - epilogue_s
  double host_floor_s = 0;  // the host's fastest step (0: unknown); no launches are saved (under
                            // autocast at::linear casts each bias in a kernel of its own)
  bool host_bound = false;  // the floor, not the GPU, sets new_step_s
  double new_step_s = 0;    // max(step - removed, data wait + host floor)
  double gain = 0;
};
// What the epilogue adds to the GEMMs, a margin over what was measured on the H200 (LibTorch
// 2.11, the GPT example's 48 linears a step): cuBLASLt's GEMMs with the bias epilogue ran 3.401 ms
// a step against 3.326 ms without, +2.3%.
constexpr double kBiasEpilogueCost = 0.03;
std::optional<BiasGain> bias_gain(const EpochSummary& s);

// A launch-bound step run at kLaunchBoundBatchFactor x the batch: the host issues the same
// launches at the same measured cost each, the kernels grow by what they fill of the GPU.
struct LaunchBoundGain {
  double factor = 0;            // batch factor (kLaunchBoundBatchFactor)
  double samples_per_step = 0;  // the current batch (0: not reported)
  double step_s = 0;
  double launches = 0;           // kernels per step
  double host_s = 0;             // host time per step: step - data wait - host blocked in syncs
  double per_launch_s = 0;       // host_s / launches
  double gpu_busy_s = 0;         // kernel union per step
  double gpu_busy_scaled_s = 0;  // ... at factor x the batch
  double wait_s = 0;             // data wait per step (grows with the batch)
  double new_step_s = 0;         // factor x wait + max(host, scaled busy)
  double gain = 0;               // samples/s: factor x step / new step - 1
};
std::optional<LaunchBoundGain> launch_bound_gain(const EpochSummary& s);

// Data starvation: the loader with every usable core producing (the machine's cores less the
// training thread's).
struct StarvationGain {
  // compute + the mean data wait per step, or the steady step where the GPU's is longer
  double step_s = 0;
  double compute_s = 0;    // median of (step - data wait), else the mean
  double batch_s = 0;      // one worker's time to produce one batch
  double batch_cpu_s = 0;  // CPU time to produce one batch (at most batch_s)
  int usable_workers = 0;  // cores - 1 (at least 1)
  int workers = 0;         // the count it is for, at least the current
  double delivery_s = 0;   // max(batch_cpu / usable, batch / workers): a batch every delivery_s
  // Where the GPU is the slower side: its step less its idle in the data waits (0 otherwise)
  double gpu_s = 0;
  double new_step_s = 0;  // max(compute, delivery, gpu)
  double gain = 0;
};
// `workers`: the count the gain is for (at least the loader's own, and 1): the advice's
// (advisors/loader/data_starvation.h, which also the other advisors ask).
std::optional<StarvationGain> starvation_gain(const EpochSummary& s, int workers);

// Per-parameter Adam/AdamW (addcmul/addcdiv kernels per parameter) replaced by a fused one
// (at::_fused_adamw_, or the foreach/multi-tensor path).
struct OptimizerGain {
  double step_s = 0;
  double per_parameter_kernels = 0;  // estimated launches per step (9 per parameter)
  double kernels_s = 0;              // their GPU time per step (estimated from addcmul/addcdiv)
  double per_launch_s = 0;           // measured host cost per launch
  double host_s = 0;                 // host time of the update per step (phase or launches)
  bool host_from_phase = false;      // host_s is the optimizer phase's measured time
  std::string phase;                 // that phase's name
  double removed_s = 0;              // max(min(host_s, the step's GPU idle), kernel time)
  double fused_s = 0;                // kernel time x 28/92 (bytes a fused update moves)
  double new_step_s = 0;
  double gain = 0;
};
std::optional<OptimizerGain> optimizer_gain(const EpochSummary& s);

}  // namespace torchpilot::gains
