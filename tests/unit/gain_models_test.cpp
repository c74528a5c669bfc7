// Gain models (gain_models.h) on synthetic epoch summaries, with hand-computed expectations:
// launch-bound at a larger batch, the per-parameter optimizer, and low MFU naming the largest
// fixable share of the traced step. (Precision and fusion: precision_advisors_test.cpp; data
// starvation: advisors_test.cpp.)
#include "torchpilot/advisors/core/gain_models.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "advice_test_util.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/flops/device_peaks.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000 * 1000;
constexpr size_t C(KernelClass c) { return static_cast<size_t>(c); }

using test::contains;
using test::evidence;

// 10 steps of `step_ms` (all traced), `wait_ms` of data wait and `sync_ms` of host sync each,
// `kernels` launches per step, 32 samples per step.
EpochSummary epoch(double step_ms, double wait_ms, double sync_ms, int kernels) {
  EpochSummary s;
  s.steps = 10;
  s.samples = 320;
  s.wall_ns = static_cast<Nanos>(10 * step_ms * kMs);
  s.data_wait_ns = static_cast<Nanos>(10 * wait_ms * kMs);
  s.data_wait_fraction = wait_ms / step_ms;
  GpuEpochStats g;
  g.device = "NVIDIA H100 80GB HBM3";
  g.sm_count = 132;
  g.traced_steps = 10;
  g.stats.traced_ns = s.wall_ns;
  g.stats.kernels = 10 * kernels;
  g.stats.host_sync_ns = static_cast<Nanos>(10 * sync_ms * kMs);
  g.kernel_classes.steps = 10;
  g.kernel_classes.traced_ns = s.wall_ns;
  s.sections.set<GpuEpochStats>(g);
  return s;
}

GpuEpochStats& gpu(EpochSummary& s) { return *s.sections.get<GpuEpochStats>(); }

TEST(GainModels, GainIsOldOverNewStepTime) {
  EXPECT_DOUBLE_EQ(gains::gain(10, 8), 0.25);
  EXPECT_EQ(gains::gain(10, 12), 0);
  EXPECT_EQ(gains::gain(0, 1), 0);
  EXPECT_EQ(gains::gain(1, 0), 0);
}

// Elementwise kernels that ran `busy_ms` of the 10 traced steps (`scaled_ms` at twice the batch),
// the rest of the 100 ms idle, `gaps_ms` of it in launch gaps.
KernelClassStats& elementwise_window(EpochSummary& s, Nanos busy_ms, Nanos scaled_ms,
                                     Nanos gaps_ms) {
  KernelClassStats& k = gpu(s).kernel_classes;
  k.ns[C(KernelClass::kElementwise)] = busy_ms * kMs;
  k.idle_ns = (100 - busy_ms) * kMs;
  k.kernel_sum_ns = busy_ms * kMs;
  k.kernel_sum_scaled_ns = scaled_ms * kMs;
  gpu(s).stats.idle_launch_gap_ns = gaps_ms * kMs;
  return k;
}

TEST(GainModels, LaunchBoundAtTwiceTheBatch) {
  // 10 ms steps: 1 ms data wait, 2 ms host sync, so 7 ms of host time for 1000 launches (7 us
  // each); the kernels run 3 ms, 4.5 ms at twice the batch (half of them fill the GPU).
  EpochSummary s = epoch(10, 1, 2, 1000);
  KernelClassStats& k = elementwise_window(s, 30, 45, 50);
  const auto m = gains::launch_bound_gain(s);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->factor, 2);
  EXPECT_DOUBLE_EQ(m->samples_per_step, 32);
  EXPECT_NEAR(m->host_s, 7e-3, 1e-12);
  EXPECT_NEAR(m->per_launch_s, 7e-6, 1e-12);
  EXPECT_NEAR(m->gpu_busy_scaled_s, 4.5e-3, 1e-12);
  // The step becomes 2 x 1 ms of wait + max(7, 4.5) ms = 9 ms for twice the samples.
  EXPECT_NEAR(m->new_step_s, 9e-3, 1e-12);
  EXPECT_NEAR(m->gain, 20.0 / 9.0 - 1, 1e-9);

  const auto a = advise_launch_bound(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(a->expected_gain, 20.0 / 9.0 - 1, 1e-9);
  EXPECT_NEAR(*evidence(*a, "host_cost_per_launch"), 7, 1e-9);
  EXPECT_TRUE(contains(a->action, "64 samples per step instead of 32")) << a->action;
  EXPECT_TRUE(contains(a->action, "estimated")) << a->action;

  // GPU-bound: 9 ms of kernels that all fill the GPU grow to 18 ms; twice the samples in
  // 2 + 18 ms is no gain.
  k.ns[C(KernelClass::kElementwise)] = 90 * kMs;
  k.kernel_sum_ns = 90 * kMs;
  k.kernel_sum_scaled_ns = 180 * kMs;
  EXPECT_NEAR(gains::launch_bound_gain(s)->gain, 0, 1e-12);
}

// 20 ms steps, 2000 launches each; 2000 per-parameter optimizer launches whose kernels ran 1 ms
// per step; the GPU idle 19 ms per step.
EpochSummary per_parameter_optimizer_epoch() {
  EpochSummary s = epoch(20, 0, 0, 2000);
  KernelClassStats& k = gpu(s).kernel_classes;
  k.ns[C(KernelClass::kOptimizer)] = 10 * kMs;
  k.per_parameter_optimizer_launches = 2000;
  k.idle_ns = 190 * kMs;
  return s;
}

TEST(GainModels, PerParameterOptimizerFused) {
  // 20 ms steps, 2000 launches each (10 us of host time per launch); 200 addcmul/addcdiv per step
  // (100 parameters: 900 optimizer kernels) that ran 1 ms.
  EpochSummary s = per_parameter_optimizer_epoch();
  KernelClassStats& k = gpu(s).kernel_classes;
  const auto m = gains::optimizer_gain(s);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->per_parameter_kernels, 900, 1e-9);
  EXPECT_NEAR(m->per_launch_s, 10e-6, 1e-15);
  EXPECT_NEAR(m->kernels_s, 1e-3 * 92 / 32, 1e-12);
  // Issuing 900 launches (9 ms) outlasts their kernels (2.875 ms); fused: 2.875 x 28/92 ms.
  EXPECT_NEAR(m->removed_s, 9e-3, 1e-12);
  EXPECT_NEAR(m->fused_s, 0.875e-3, 1e-12);
  EXPECT_NEAR(m->gain, 20 / (20 - 9 + 0.875) - 1, 1e-9);
  // Already multi-tensor: nothing to gain.
  k.per_parameter_optimizer_launches = 0;
  k.fused_optimizer_ns = 10 * kMs;
  EXPECT_FALSE(gains::optimizer_gain(s).has_value());
}

FlopEpochStats bf16_flops(double mfu) {
  FlopEpochStats f;
  f.device = "NVIDIA H100 80GB HBM3";
  const DevicePeak peak = resolve_peak(f.device, 0);
  f.model_flops_per_step = f.hardware_flops_per_step = 1e12;
  f.model_flops_by_precision[static_cast<size_t>(MathPrecision::kBf16)] = 1e12;
  f.hardware_flops_by_precision[static_cast<size_t>(MathPrecision::kBf16)] = 1e12;
  for (int i = 0; i < kMathPrecisions; ++i) {
    f.datasheet_flops_by_precision[i] = peak.datasheet_flops_per_s[static_cast<size_t>(i)];
    f.peak_flops_by_precision[i] = peak.flops_per_s[static_cast<size_t>(i)];
  }
  f.dram_bytes_per_s = peak.dram_bytes_per_s;
  f.dominant_precision = MathPrecision::kBf16;
  f.peak_flops_per_s = 989.5e12;
  f.mfu = f.hfu = mfu;
  return f;
}

TEST(GainModels, LowMfuNamesTheLargestFixableShare) {
  EpochSummary s = epoch(20, 0, 0, 2000);
  s.sections.set<FlopEpochStats>(bf16_flops(0.1));
  KernelClassStats& k = gpu(s).kernel_classes;
  k.ns[C(KernelClass::kTensorGemm)] = 100 * kMs;
  k.ns[C(KernelClass::kElementwise)] = 50 * kMs;
  k.ns[C(KernelClass::kOptimizer)] = 10 * kMs;
  k.per_parameter_optimizer_launches = 2000;
  k.idle_ns = 40 * kMs;
  gpu(s).stats.idle_launch_gap_ns = 40 * kMs;  // 20% idle in launch gaps: +25%
  s.phases = {{"forward", 50 * kMs}, {"optimizer", 100 * kMs}};
  const auto a = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(*evidence(*a, "share_tensor_gemm"), 0.5, 1e-12);
  EXPECT_NEAR(*evidence(*a, "share_optimizer"), 0.05, 1e-12);
  EXPECT_NEAR(*evidence(*a, "share_idle"), 0.2, 1e-12);
  EXPECT_TRUE(contains(a->finding, "tensor-core GEMM/conv 50.0%")) << a->finding;
  EXPECT_TRUE(contains(a->finding, "host phases: forward 25.0%, optimizer 50.0%")) << a->finding;
  {
    // With the window's phase markers resolved, the phases' GPU shares replace the host's.
    EpochSummary t = s;
    GpuEpochStats& g = gpu(t);
    g.phases_gpu.steps = 10;
    g.phases_gpu.step_gpu_ns = 200 * kMs;
    g.phases_gpu.phases = {{"forward", 10, 60 * kMs, 60 * kMs, 50 * kMs},
                           {"optimizer", 10, 30 * kMs, 10 * kMs, 100 * kMs}};
    const auto p = advise_low_mfu(t, AdvisorsConfig{});
    ASSERT_TRUE(p.has_value());
    EXPECT_TRUE(contains(p->finding, "by phase (GPU time): forward 30.0%, optimizer 15.0%"))
        << p->finding;
    EXPECT_FALSE(contains(p->finding, "host phases")) << p->finding;
  }
  // The optimizer phase measured the update's host time, 10 ms per step (not 900 launches at the
  // step's 10 us each), but the GPU idles only 4 ms of the step: removing 4 ms (+19%) is named,
  // and the launch gaps, the optimizer's own, are not counted again.
  EXPECT_TRUE(contains(a->cause, "per-parameter Adam-style optimizer")) << a->cause;
  EXPECT_TRUE(contains(a->action, "at::_fused_adamw_")) << a->action;
  EXPECT_TRUE(contains(a->action, "per_parameter_optimizer")) << a->action;
  EXPECT_NEAR(a->expected_gain, 20 / (20 - 4 + 0.875) - 1, 1e-9);
  EXPECT_NE(a->severity, Severity::kHigh);
  // The phase's median per step where it ran, not its mean: a trace window's steps and a slow
  // first step inflate the total (here 10 ms a step on average, 3 ms at the median).
  s.phases[1].steps = s.steps;
  s.phases[1].p50_ns = 3 * kMs;
  const auto m = gains::optimizer_gain(s);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->host_s, 0.003, 1e-12);
  EXPECT_NEAR(m->removed_s, 0.003, 1e-12);  // under the 4 ms of idle now
  // In half the steps (gradient accumulation): half the median per step.
  s.phases[1].steps = s.steps / 2;
  EXPECT_NEAR(gains::optimizer_gain(s)->host_s, 0.0015, 1e-12);
  s.phases[1].steps = 0;
  s.phases[1].p50_ns = 0;

  // Without the optimizer, the launch gaps are the largest fixable share.
  k.per_parameter_optimizer_launches = 0;
  k.ns[C(KernelClass::kOptimizer)] = 0;
  const auto b = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(contains(b->cause, "launch gaps")) << b->cause;
  EXPECT_TRUE(contains(b->action, "launch_bound")) << b->action;
  EXPECT_NEAR(b->expected_gain, 0.25, 1e-9);

  // Nothing fixable: no gain claimed.
  gpu(s).stats.idle_launch_gap_ns = 0;
  const auto c = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->expected_gain, 0);
  EXPECT_TRUE(contains(c->cause, "no single fixable share")) << c->cause;
}

TEST(GainModels, LowMfuPointsAtFp32GemmsWithTheirGain) {
  EpochSummary s = epoch(10, 0, 0, 100);
  FlopEpochStats f = bf16_flops(0.05);
  f.model_flops_by_precision[static_cast<size_t>(MathPrecision::kBf16)] = 0;
  f.hardware_flops_by_precision[static_cast<size_t>(MathPrecision::kBf16)] = 0;
  f.model_flops_by_precision[static_cast<size_t>(MathPrecision::kFp32)] = 0.4e12;
  f.hardware_flops_by_precision[static_cast<size_t>(MathPrecision::kFp32)] = 0.4e12;
  f.dominant_precision = MathPrecision::kFp32;
  s.sections.set<FlopEpochStats>(f);
  KernelClassStats& k = gpu(s).kernel_classes;
  k.ns[C(KernelClass::kSimtGemm)] = 80 * kMs;  // 8 ms of a 10 ms step
  k.ns[C(KernelClass::kElementwise)] = 20 * kMs;
  const auto a = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "non-tensor (fp32) GEMM/conv kernels take 80.0%")) << a->cause;
  // 0.4 TFLOP at 80% of 989.5 TFLOP/s replaces 8 ms (no casts known: no ops listed).
  EXPECT_NEAR(a->expected_gain, 10 / (10 - 8 + 0.4 / (989.5 * 0.8) * 1e3) - 1, 1e-9);
}

TEST(GainModels, SteadyStepIsTheMedianStep) {
  // The mean step (10 ms) carries a stall; the median step is 6 ms.
  EpochSummary s = epoch(10, 0, 0, 100);
  EXPECT_NEAR(gains::steady_step_seconds(s), 10e-3, 1e-12);  // no median: the mean
  s.step_p50_ns = 6 * kMs;
  EXPECT_NEAR(gains::steady_step_seconds(s), 6e-3, 1e-12);
  // Launch-bound: 6 ms of host time for 100 launches (60 us each), 1 ms of kernels growing to 2.
  KernelClassStats& k = gpu(s).kernel_classes;
  k.ns[C(KernelClass::kElementwise)] = 10 * kMs;
  k.kernel_sum_ns = 10 * kMs;
  k.kernel_sum_scaled_ns = 20 * kMs;
  const auto m = gains::launch_bound_gain(s);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->step_s, 6e-3, 1e-12);
  EXPECT_NEAR(m->per_launch_s, 60e-6, 1e-12);
  EXPECT_NEAR(m->gain, 1.0, 1e-9);  // host-bound: twice the samples in the same 6 ms
}

// A window's steps and those its release slowed are left out of the step a gain starts from where
// the epoch had enough others (a short epoch's window can be half of it).
TEST(GainModels, SteadyStepIsTheOrdinaryStepsMedianWhereAWindowRan) {
  EpochSummary s = epoch(10, 0, 0, 100);
  s.step_p50_ns = 8 * kMs;
  GpuEpochStats& g = gpu(s);
  g.ordinary_steps = 20;
  g.ordinary_step_p50_ns = 6 * kMs;
  EXPECT_NEAR(gains::steady_step_seconds(s), 6e-3, 1e-12);
  g.ordinary_steps = gains::kMinOrdinarySteps - 1;  // too few: the epoch's median
  EXPECT_NEAR(gains::steady_step_seconds(s), 8e-3, 1e-12);
  g.ordinary_steps = 20;
  g.traced_steps = 0;  // no window: the epoch's median (the same steps)
  EXPECT_NEAR(gains::steady_step_seconds(s), 8e-3, 1e-12);
}

// Where the GPU is the slower side, the host runs ahead after a stall until the launch queue is
// full: the ordinary steps' GPU span is their length where it is the longer and known for enough
// of them.
TEST(GainModels, SteadyStepIsTheOrdinaryStepsGpuSpanWhereThatIsLonger) {
  EpochSummary s = epoch(10, 0, 0, 100);
  s.step_p50_ns = 30 * kMs;
  GpuEpochStats& g = gpu(s);
  g.ordinary_steps = 20;
  g.ordinary_step_p50_ns = 6 * kMs;
  g.ordinary_gpu_steps = 20;
  g.ordinary_gpu_step_p50_ns = 32 * kMs;
  EXPECT_NEAR(gains::steady_step_seconds(s), 32e-3, 1e-12);
  // The host's side stays the host's: its launches and own work take 6 ms of the 32.
  EXPECT_NEAR(gains::host_step_seconds(s), 6e-3, 1e-12);
  EXPECT_NEAR(gains::gpu_step_seconds(s), 32e-3, 1e-12);
  g.ordinary_gpu_steps = gains::kMinOrdinarySteps - 1;  // too few spans known: the host's
  EXPECT_NEAR(gains::steady_step_seconds(s), 6e-3, 1e-12);
  g.ordinary_gpu_steps = 20;
  g.ordinary_gpu_step_p50_ns = 5 * kMs;  // a host-bound step: the host's
  EXPECT_NEAR(gains::steady_step_seconds(s), 6e-3, 1e-12);
}

// A 40-step epoch of 9 ms steps (7 ms of own work, 1 ms of wait) with a window, whose 20
// ordinary steps took 6 ms (4 of own work, 2 waiting), and a loader that produces a batch in
// 1 ms of CPU time.
EpochSummary ordinary_epoch() {
  EpochSummary s = epoch(9, 0, 0, 100);
  s.steps = 40;
  s.wall_ns = 40 * 9 * kMs;
  s.step_p50_ns = 9 * kMs;
  s.compute_p50_ns = 7 * kMs;
  s.data_wait_ns = 40 * kMs;
  GpuEpochStats& g = gpu(s);
  g.ordinary_steps = 20;
  g.ordinary_step_p50_ns = 6 * kMs;
  g.ordinary_compute_p50_ns = 4 * kMs;
  g.ordinary_data_wait_ns = 20 * 2 * kMs;
  LoaderStats l;
  l.produce_count = 40;
  l.produce_ns = 40 * kMs;
  l.produce_cpu_ns = 40 * kMs;
  l.max_workers = 16;
  s.sections.set<LoaderStats>(l);
  return s;
}

// The step's own work and its data wait come from the same steps as the steady step: a window's
// steps run longer and wait less (the loader had longer), and would size the workers from both.
TEST(GainModels, OwnWorkAndWaitAreTheOrdinaryStepsWhereAWindowRan) {
  EpochSummary s = ordinary_epoch();
  GpuEpochStats& g = gpu(s);
  EXPECT_NEAR(gains::own_work_seconds(s), 4e-3, 1e-12);
  EXPECT_NEAR(gains::mean_wait_seconds(s), 2e-3, 1e-12);
  // The loader's model: a 6 ms steady step (4 of own work, 2 waiting) whose workers could
  // deliver a batch every 1 ms becomes a 4 ms one.
  auto m = gains::starvation_gain(s, 4);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->compute_s, 4e-3, 1e-12);
  EXPECT_NEAR(m->step_s, 6e-3, 1e-12);
  EXPECT_NEAR(m->gain, 0.5, 1e-9);
  // Without the ordinary steps' own work (too few, or no window): the epoch's figures.
  g.ordinary_steps = gains::kMinOrdinarySteps - 1;
  EXPECT_NEAR(gains::own_work_seconds(s), 7e-3, 1e-12);
  EXPECT_NEAR(gains::mean_wait_seconds(s), 1e-3, 1e-12);
  g.ordinary_steps = 20;
  g.traced_steps = 0;
  EXPECT_NEAR(gains::own_work_seconds(s), 7e-3, 1e-12);
}

// Where the GPU is the slower side (its ordinary steps' span 32 ms, the host's 4 ms of own work
// and 2 ms of wait), the GPU runs queued work through the waits: faster loading removes only the
// GPU's idle in them (5% of its traced span), not the whole wait.
TEST(GainModels, StarvationOfAGpuBoundStepRemovesOnlyTheGpusIdleInTheWaits) {
  EpochSummary s = ordinary_epoch();
  GpuEpochStats& g = gpu(s);
  g.ordinary_gpu_steps = 20;
  g.ordinary_gpu_step_p50_ns = 32 * kMs;
  g.stats.idle_data_wait_ns = g.stats.traced_ns / 20;
  auto m = gains::starvation_gain(s, 4);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->step_s, 32e-3, 1e-12);
  EXPECT_NEAR(m->gpu_s, 32e-3 - 1.6e-3, 1e-12);
  EXPECT_NEAR(m->new_step_s, m->gpu_s, 1e-12);
  EXPECT_NEAR(m->gain, 32.0 / 30.4 - 1, 1e-9);
  EXPECT_TRUE(gains::gpu_bound(s));
  // A host-bound trainer with bursty waits: its GPU spans follow its host steps (median 7 ms
  // both), above own work plus the mean wait (6 ms); the GPU is not the slower side.
  g.ordinary_step_p50_ns = 7 * kMs;
  g.ordinary_gpu_step_p50_ns = 7 * kMs;
  EXPECT_FALSE(gains::gpu_bound(s));
  m = gains::starvation_gain(s, 4);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->step_s, 6e-3, 1e-12);
  EXPECT_EQ(m->gpu_s, 0);
  // Without a window's idle split: the whole wait, at most.
  g.traced_steps = 0;
  g.stats.traced_ns = 0;
  EXPECT_EQ(gains::gpu_step_seconds(s), 0) << "no window: the epoch's own figures";
}

// Steps that share markers have their run's mean GPU span: the host's side is compared over the
// same steps, the same way. A stock loader's bursty waits (2 and 30 ms steps, as H200's
// stock_loader_io ran) put the host's median step at 10.5 ms where the runs' means read 16.8 ms
// on both sides: host-bound.
TEST(GainModels, GpuBoundComparesTheGpuSpansWithTheSameStepsHostLengths) {
  EpochSummary s = ordinary_epoch();
  GpuEpochStats& g = gpu(s);
  g.ordinary_step_p50_ns = Nanos{10'500'000};
  g.ordinary_gpu_steps = 20;
  g.ordinary_gpu_step_p50_ns = Nanos{16'800'000};
  EXPECT_TRUE(gains::gpu_bound(s)) << "against the host's median step (no like-for-like length)";
  g.ordinary_gpu_ns = 20 * Nanos{16'800'000};
  g.ordinary_gpu_host_ns = 20 * Nanos{16'400'000};
  EXPECT_FALSE(gains::gpu_bound(s));
  const auto m = gains::starvation_gain(s, 4);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->step_s, 6e-3, 1e-12) << "own work plus the mean wait, not the GPU's span";
  EXPECT_EQ(m->gpu_s, 0);
  // A GPU-bound trainer whose host ran ahead: its runs' host means are short too.
  g.ordinary_gpu_host_ns = 20 * 7 * kMs;
  EXPECT_TRUE(gains::gpu_bound(s));
  // The same steps, not two medians: a few long GPU spans (a backlog after bursts) move the
  // GPU's median above 1.2x the host's without the totals doing so.
  g.ordinary_gpu_ns = 20 * Nanos{17'000'000};
  g.ordinary_gpu_host_ns = 20 * Nanos{16'000'000};
  g.ordinary_gpu_step_p50_ns = Nanos{23'850'000};
  EXPECT_FALSE(gains::gpu_bound(s));
}

TEST(GainModels, OptimizerHostTimeFromItsPhase) {
  // As PerParameterOptimizerFused, with a phase "optimizer" of 4 ms per step: the update's host
  // time is the phase's, not 900 launches at the step's 10 us each.
  EpochSummary s = per_parameter_optimizer_epoch();
  KernelClassStats& k = gpu(s).kernel_classes;
  s.phases = {{"forward", 60 * kMs}, {"Optimizer_step", 40 * kMs}};
  auto m = gains::optimizer_gain(s);
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(m->host_from_phase);
  EXPECT_EQ(m->phase, "Optimizer_step");
  EXPECT_NEAR(m->host_s, 4e-3, 1e-12);
  EXPECT_NEAR(m->removed_s, 4e-3, 1e-12);
  EXPECT_NEAR(m->gain, 20 / (20 - 4 + 0.875) - 1, 1e-9);

  // The advice of its own: above advisors.per_parameter_optimizer.threshold of the step (4 of 20
  // ms).
  AdvisorsConfig config;
  const auto a = advise_per_parameter_optimizer(s, config);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "per_parameter_optimizer");
  EXPECT_NEAR(a->expected_gain, m->gain, 1e-12);
  EXPECT_TRUE(a->gain_estimated);
  EXPECT_NEAR(*evidence(*a, "optimizer_share"), 0.2, 1e-12);
  EXPECT_EQ(*evidence(*a, "optimizer_host_time_from_phase"), 1.0);
  EXPECT_TRUE(contains(a->cause, "phase Optimizer_step took 4 ms")) << a->cause;
  EXPECT_TRUE(contains(a->action, "at::_fused_adamw_")) << a->action;
  EXPECT_TRUE(contains(a->action, "becomes 16.9 ms")) << a->action;
  config.per_parameter_optimizer.threshold = 0.2;  // at the threshold: quiet
  EXPECT_FALSE(advise_per_parameter_optimizer(s, config).has_value());
  // A GPU-bound step (idle 10% of it: 2 ms) hides the rest of the host time: 2.875 ms of
  // kernels are what the update removes.
  k.idle_ns = 20 * kMs;
  m = gains::optimizer_gain(s);
  EXPECT_NEAR(m->removed_s, 1e-3 * 92 / 32, 1e-12);
  // No per-parameter kernels: quiet.
  k.per_parameter_optimizer_launches = 0;
  EXPECT_FALSE(advise_per_parameter_optimizer(s, AdvisorsConfig{}).has_value());
}

TEST(GainModels, LowMfuIdleGainsAreBoundedByTheirModels) {
  // A host-bound 10 ms step with 90% launch gaps: removing them all would be +900%, the
  // launch-bound model says +100% (twice the batch in the same host time).
  EpochSummary s = epoch(10, 0, 0, 1000);
  s.sections.set<FlopEpochStats>(bf16_flops(0.01));
  KernelClassStats& k = elementwise_window(s, 10, 20, 90);
  const auto a = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "launch gaps")) << a->cause;
  EXPECT_NEAR(a->expected_gain, 1.0, 1e-9);

  // A per-parameter optimizer whose phase takes 5 ms of the step: its launches are among the
  // gaps, which keep 40% (+67%, within the +100% bound) besides it; the optimizer's +97% is named.
  k.ns[C(KernelClass::kOptimizer)] = 1 * kMs;
  k.ns[C(KernelClass::kElementwise)] = 9 * kMs;
  k.per_parameter_optimizer_launches = 200;
  s.phases = {{"optimizer", 50 * kMs}};
  const auto b = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(contains(b->cause, "per-parameter Adam-style optimizer")) << b->cause;
  const double fused_ms = 0.1 * 92 / 32 * 28 / 92;
  EXPECT_NEAR(b->expected_gain, 10 / (10 - 5 + fused_ms) - 1, 1e-9);
}

}  // namespace
}  // namespace torchpilot

namespace torchpilot {
namespace {

// One quantity, one number: where low_mfu names an idle cause that has an advisor of its own, it
// states that advisor's gain (issue 40: no two advisors with different numbers for one quantity).
TEST(SharedQuantitiesTest, HostSyncIdleHasOneGain) {
  // 40% of the traced step idle after syncs, the host blocked in them 2% of it.
  EpochSummary s = epoch(10, 0, 0.2, 100);
  s.sections.set<FlopEpochStats>(bf16_flops(0.01));
  elementwise_window(s, 50, 50, 0);
  gpu(s).stats.idle_host_sync_ns = 40 * kMs;
  gpu(s).stats.host_syncs = 10;
  const auto sync = advise_host_sync(s, AdvisorsConfig{});
  const auto mfu = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(sync.has_value());
  ASSERT_TRUE(mfu.has_value());
  EXPECT_TRUE(contains(mfu->cause, "after host synchronizations")) << mfu->cause;
  EXPECT_NEAR(sync->expected_gain, 0.02 / 0.98, 1e-9);
  EXPECT_DOUBLE_EQ(mfu->expected_gain, sync->expected_gain);
}

// A TunableLoader with one worker that took 16 ms a batch, all on the CPU, on `cpus` CPUs.
LoaderStats one_worker_tunable_loader(int cpus) {
  LoaderStats l;
  l.name = "tunable";
  l.tunable = true;
  l.settings.workers = 1;
  l.max_workers = cpus;
  l.batches = l.produce_count = 10;
  l.produce_ns = l.produce_cpu_ns = 160 * kMs;
  return l;
}

TEST(SharedQuantitiesTest, DataWaitHasOneGain) {
  // 6 ms of each 10 ms step waiting for a loader with one worker that takes 16 ms a batch
  // (4 needed): data_starvation's model, which low_mfu states for the same wait.
  EpochSummary s = epoch(10, 6, 0, 100);
  s.compute_p50_ns = 4 * kMs;
  s.sections.set<FlopEpochStats>(bf16_flops(0.01));
  elementwise_window(s, 30, 30, 0);
  gpu(s).stats.idle_data_wait_ns = 60 * kMs;
  s.sections.set<LoaderStats>(one_worker_tunable_loader(16));
  const auto wait = advise_data_starvation(s, AdvisorsConfig{});
  const auto mfu = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(wait.has_value());
  ASSERT_TRUE(mfu.has_value());
  EXPECT_TRUE(contains(mfu->cause, "waiting for data")) << mfu->cause;
  EXPECT_NEAR(wait->expected_gain, 10.0 / 4 - 1, 1e-9);
  EXPECT_DOUBLE_EQ(mfu->expected_gain, wait->expected_gain);
}

// Without a window too: low_mfu's "the largest loss is the wait for data" states
// data_starvation's gain (its loader model), not wait / (1 - wait) of the epoch.
TEST(SharedQuantitiesTest, DataWaitHasOneGainWithoutAWindow) {
  EpochSummary s;
  s.steps = 10;
  s.samples = 320;
  s.wall_ns = 100 * kMs;
  s.data_wait_ns = 60 * kMs;
  s.data_wait_fraction = 0.6;
  s.step_p50_ns = 10 * kMs;
  s.compute_p50_ns = 4 * kMs;
  s.sections.set<FlopEpochStats>(bf16_flops(0.01));
  // Two usable cores: a batch every 8 ms at best.
  s.sections.set<LoaderStats>(one_worker_tunable_loader(3));
  const auto wait = advise_data_starvation(s, AdvisorsConfig{});
  const auto mfu = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(wait.has_value());
  ASSERT_TRUE(mfu.has_value());
  EXPECT_TRUE(contains(mfu->cause, "wait for data")) << mfu->cause;
  EXPECT_NEAR(wait->expected_gain, 10.0 / 8 - 1, 1e-9);
  EXPECT_DOUBLE_EQ(mfu->expected_gain, wait->expected_gain);
}

TEST(SharedQuantitiesTest, LaunchGapsHaveOneGain) {
  // 90% launch gaps in a host-bound step: launch_bound's model (twice the batch), not +900%.
  EpochSummary s = epoch(10, 0, 0, 1000);
  s.sections.set<FlopEpochStats>(bf16_flops(0.01));
  elementwise_window(s, 10, 20, 90);
  const auto gaps = advise_launch_bound(s, AdvisorsConfig{});
  const auto mfu = advise_low_mfu(s, AdvisorsConfig{});
  ASSERT_TRUE(gaps.has_value());
  ASSERT_TRUE(mfu.has_value());
  EXPECT_TRUE(contains(mfu->cause, "launch gaps")) << mfu->cause;
  EXPECT_DOUBLE_EQ(mfu->expected_gain, gaps->expected_gain);
}

}  // namespace
}  // namespace torchpilot
