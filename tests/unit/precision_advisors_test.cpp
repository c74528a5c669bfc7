// Precision and fusion advisors: planted fp32 matmuls, unfused attention and low MFU are found
// with their numbers; healthy runs (bf16, fused attention, MFU above threshold) and CPU runs get
// nothing from the MFU-based advisors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "advice_test_util.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/metrics.h"
#include "torchpilot/runtime/flops/device_peaks.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000 * 1000;
constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

using test::contains;
using test::evidence;

// FLOP figures of an epoch on `device` ("" = CPU): `flops` per step by precision, MFU as given.
FlopEpochStats make_flops(const std::string& device,
                          std::initializer_list<std::pair<MathPrecision, double>> by_precision,
                          double mfu) {
  const DevicePeak peak = resolve_peak(device, 0);
  FlopEpochStats f;
  f.device = device;
  f.counted_steps = 3;
  f.steps_with_count = 100;
  for (const auto& [p, v] : by_precision) {
    f.model_flops_by_precision[P(p)] = v;
    f.hardware_flops_by_precision[P(p)] = v;
    f.model_flops_per_step += v;
  }
  f.hardware_flops_per_step = f.model_flops_per_step;
  for (int i = 0; i < kMathPrecisions; ++i) {
    f.peak_flops_by_precision[i] = peak.flops_per_s[static_cast<size_t>(i)];
    f.datasheet_flops_by_precision[i] = peak.datasheet_flops_per_s[static_cast<size_t>(i)];
  }
  f.dram_bytes_per_s = peak.dram_bytes_per_s;
  PrecisionArray arr{};
  for (int i = 0; i < kMathPrecisions; ++i)
    arr[static_cast<size_t>(i)] = f.model_flops_by_precision[i];
  f.dominant_precision = dominant_precision(arr);
  f.peak_flops_per_s = peak.flops_per_s[P(f.dominant_precision)];
  f.peak_source = peak.any() ? peak.source + " " + to_string(f.dominant_precision) + " dense" : "";
  f.mfu = mfu;
  f.hfu = mfu;
  return f;
}

// An epoch of 100 steps of `step_ms`, waiting `wait_ms` for data, with `flops`.
EpochSummary make_summary(double step_ms, double wait_ms, FlopEpochStats flops) {
  EpochSummary s;
  s.steps = 100;
  s.wall_ns = static_cast<Nanos>(std::llround(100 * step_ms * kMs));
  s.data_wait_ns = static_cast<Nanos>(std::llround(100 * wait_ms * kMs));
  s.data_wait_fraction = fraction(s.data_wait_ns, s.wall_ns);
  s.sections.set<FlopEpochStats>(std::move(flops));
  return s;
}

const AdvisorsConfig kConfig;  // fp32 0.2, unfused attention 0.02, low MFU 0.3
const std::string kH100 = "NVIDIA H100 80GB HBM3";

// ---- fp32 matmuls
// --------------------------------------------------------------------------------

// A window of 10 traced steps (100 ms of kernel-class time) on `device`; the caller sets what
// the classes took.
GpuEpochStats traced_window(const std::string& device) {
  GpuEpochStats g;
  g.device = device;
  g.traced_steps = 10;
  g.kernel_classes.steps = 10;
  g.kernel_classes.traced_ns = 100 * kMs;
  return g;
}

TEST(PrecisionAdvisorTest, PlantedFp32MatmulsAreFound) {
  const double F = 1e12;
  const EpochSummary s = make_summary(
      15, 0,
      make_flops(kH100, {{MathPrecision::kFp32, 0.8 * F}, {MathPrecision::kBf16, 0.2 * F}}, 0.1));
  const auto a = advise_fp32_matmul(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "fp32_matmul");
  EXPECT_NEAR(*evidence(*a, "fp32_flops_share"), 0.8, 1e-12);
  EXPECT_NEAR(*evidence(*a, "fp32_peak"), 67, 1e-9);
  EXPECT_NEAR(*evidence(*a, "bf16_peak"), 989.5, 1e-9);
  // The fp32 work's time at the fp32 datasheet peak over the step time (no wait, no GPU figures:
  // the whole step counts as busy): 0.8 TFLOP at 67 TFLOP/s = 11.9 ms of a 15 ms step.
  const double share = 0.8 / 67 / 0.015;
  EXPECT_NEAR(*evidence(*a, "fp32_time_share_estimate"), share, 1e-12);
  // No window: the fp32 kernels' time is their FLOPs at the fp32 peak (11.9 ms), replaced by the
  // same FLOPs at the calibrated Hopper rate, 80% of 989.5 TFLOP/s (1.01 ms); no casts known.
  const double removed = 0.8 / 67, step = 0.015;
  EXPECT_NEAR(*evidence(*a, "fp32_kernel_time"), removed * 1e3, 1e-9);
  EXPECT_EQ(*evidence(*a, "fp32_kernel_time_measured"), 0.0);
  EXPECT_NEAR(*evidence(*a, "tensor_core_rate"), 989.5 * 0.8, 1e-9);
  EXPECT_NEAR(a->expected_gain, step / (step - removed + 0.8 / (989.5 * 0.8)) - 1, 1e-9);
  EXPECT_NEAR(*evidence(*a, "expected_gain_tf32"),
              step / (step - removed + 0.8 / (494.5 * 0.8)) - 1, 1e-9);
  EXPECT_TRUE(contains(a->action, "calibrated: 80% of the bf16 datasheet peak")) << a->action;
  EXPECT_TRUE(contains(a->action, "estimated")) << a->action;
  EXPECT_TRUE(a->gain_estimated);
  EXPECT_EQ(a->severity, Severity::kHigh) << "fp32 takes most of the step";
  EXPECT_TRUE(contains(a->finding, "80.0%")) << a->finding;
  EXPECT_TRUE(contains(a->finding, kH100)) << a->finding;
  EXPECT_TRUE(contains(a->action, "bf16")) << a->action;
  EXPECT_TRUE(contains(a->action, "flops.allow_tf32: true")) << a->action;
}

// A window measured the fp32 kernels (6 ms per step) and the bf16 GEMMs (1 ms for 0.5 TFLOP:
// 500 TFLOP/s, the rate the fp32 FLOPs are predicted at); autocast's casts from the mm calls.
TEST(PrecisionAdvisorTest, Fp32GainFromMeasuredKernelsAndCasts) {
  const double F = 1e12;
  auto flops = make_flops(kH100, {{MathPrecision::kFp32, F}, {MathPrecision::kBf16, 0.5 * F}}, 0.1);
  flops.top_ops = {{"aten::mm", MathPrecision::kFp32, F, 30}};
  EpochSummary s = make_summary(10, 0, flops);
  GpuEpochStats g = traced_window(kH100);
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kSimtGemm)] = 60 * kMs;
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kTensorGemm)] = 10 * kMs;
  s.sections.set<GpuEpochStats>(g);
  const auto a = advise_fp32_matmul(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(*evidence(*a, "fp32_kernel_time"), 6.0, 1e-9);
  EXPECT_EQ(*evidence(*a, "fp32_kernel_time_measured"), 1.0);
  EXPECT_NEAR(*evidence(*a, "tensor_core_rate"), 500, 1e-9);
  EXPECT_NEAR(*evidence(*a, "predicted_tensor_core_time"), 2.0, 1e-9);
  // 30 calls of 33.3 GFLOP: cube side (16.7e9)^(1/3); 10 forward calls cast 2 operands of side^2
  // elements forward and back at 6 bytes each, at the H100's 3350 GB/s.
  const double side = std::cbrt(F / 30 / 2);
  const double bytes = 10 * 2 * side * side * 6 * 2;
  EXPECT_NEAR(*evidence(*a, "autocast_cast_bytes"), bytes / 1e6, 1e-6);
  const double cast_ms = bytes / 3350e9 * 1e3;
  EXPECT_NEAR(*evidence(*a, "autocast_cast_time"), cast_ms, 1e-9);
  EXPECT_NEAR(a->expected_gain, 10 / (10 - 6 + 2 + cast_ms) - 1, 1e-9);
  EXPECT_TRUE(contains(a->action, "measured: the tensor-core GEMMs of this window ran 500 TFLOP/s"))
      << a->action;
  EXPECT_TRUE(contains(a->cause, "took 6 ms of the 10 ms step")) << a->cause;
}

TEST(PrecisionAdvisorTest, Fp32GainMovesFusedAttentionToBf16Too) {
  // An fp32 model of 1 TFLOP per step, 0.2 of it in fused attention (SDPA in fp32: 2 ms of the
  // window's attention kernels), 6 ms of fp32 GEMM kernels, on a 10 ms median step (the mean
  // carries a stall: 20 ms).
  const double F = 1e12;
  auto flops = make_flops(kH100, {{MathPrecision::kFp32, F}}, 0.1);
  flops.fused_attention_flops_per_step = 0.2 * F;
  EpochSummary s = make_summary(20, 0, flops);
  s.step_p50_ns = 10 * kMs;
  GpuEpochStats g = traced_window(kH100);
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kSimtGemm)] = 60 * kMs;
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kAttention)] = 20 * kMs;
  g.kernel_classes.fused_attention_ns = 20 * kMs;
  s.sections.set<GpuEpochStats>(g);
  const auto a = advise_fp32_matmul(s, kConfig);
  ASSERT_TRUE(a.has_value());
  // GEMMs: 0.8 TFLOP at 80% of 989.5; attention: 0.2 TFLOP at 40% of it instead of 2 ms.
  const double gemm_ms = 0.8 / (989.5 * 0.8) * 1e3, attention_ms = 0.2 / (989.5 * 0.4) * 1e3;
  EXPECT_NEAR(*evidence(*a, "step_time"), 10, 1e-9);
  EXPECT_NEAR(*evidence(*a, "predicted_tensor_core_time"), gemm_ms, 1e-9);
  EXPECT_NEAR(*evidence(*a, "fp32_attention_kernel_time"), 2, 1e-9);
  EXPECT_NEAR(*evidence(*a, "predicted_attention_time"), attention_ms, 1e-9);
  EXPECT_NEAR(a->expected_gain, 10 / (10 - 6 - 2 + gemm_ms + attention_ms) - 1, 1e-9);
  EXPECT_TRUE(contains(a->action, "its fused attention")) << a->action;
  // TF32 moves only the GEMMs.
  EXPECT_NEAR(*evidence(*a, "expected_gain_tf32"),
              10 / (10 - 6 + 0.8 / (989.5 * 0.8 * 494.5 / 989.5) * 1e3) - 1, 1e-9);

  // A bf16-dominant model's fused attention is already on the tensor cores: not moved.
  auto mixed = make_flops(kH100, {{MathPrecision::kFp32, F}, {MathPrecision::kBf16, 2 * F}}, 0.1);
  mixed.fused_attention_flops_per_step = 0.2 * F;
  EpochSummary t = make_summary(10, 0, mixed);
  t.sections.set<GpuEpochStats>(g);
  const auto b = advise_fp32_matmul(t, kConfig);
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(evidence(*b, "fp32_attention_kernel_time").has_value());
}

TEST(PrecisionAdvisorTest, Fp32GainShrinksWithDataWait) {
  const double F = 1e12;
  const auto flops = make_flops(kH100, {{MathPrecision::kFp32, F}}, 0.1);
  // 1 TFLOP at 67 TFLOP/s = 14.9 ms of a 20 ms step; with 60% of the step waiting for data the
  // GPU is busy 40% of it, and that bounds the share.
  const auto busy = advise_fp32_matmul(make_summary(20, 0, flops), kConfig);
  const auto waiting = advise_fp32_matmul(make_summary(20, 12, flops), kConfig);
  ASSERT_TRUE(busy && waiting);
  EXPECT_NEAR(*evidence(*waiting, "fp32_time_share_estimate"), 0.4, 1e-9);
  EXPECT_LT(waiting->expected_gain, busy->expected_gain);
  EXPECT_EQ(waiting->severity, Severity::kWarning);
}

TEST(PrecisionAdvisorTest, Fp32QuietWhenHealthyOrNoTensorCores) {
  const double F = 1e12;
  // bf16 model: nothing.
  EXPECT_FALSE(advise_fp32_matmul(
      make_summary(100, 0, make_flops(kH100, {{MathPrecision::kBf16, F}}, 0.5)), kConfig));
  // TF32 is not plain fp32.
  EXPECT_FALSE(advise_fp32_matmul(
      make_summary(100, 0, make_flops(kH100, {{MathPrecision::kTf32, F}}, 0.5)), kConfig));
  // At the threshold (20%): nothing; just above: advice.
  EXPECT_FALSE(advise_fp32_matmul(
      make_summary(
          100, 0,
          make_flops(kH100, {{MathPrecision::kFp32, 0.25 * F}, {MathPrecision::kBf16, 1.0 * F}},
                     0.5)),
      kConfig));
  EXPECT_TRUE(advise_fp32_matmul(
      make_summary(
          100, 0,
          make_flops(kH100, {{MathPrecision::kFp32, 0.26 * F}, {MathPrecision::kBf16, 1.0 * F}},
                     0.5)),
      kConfig));
  // CPU, or a GPU not in the table: no tensor-core peak known.
  EXPECT_FALSE(advise_fp32_matmul(
      make_summary(100, 0, make_flops("", {{MathPrecision::kFp32, F}}, kNotMeasured)), kConfig));
  EXPECT_FALSE(advise_fp32_matmul(
      make_summary(100, 0, make_flops("Tesla T4", {{MathPrecision::kFp32, F}}, kNotMeasured)),
      kConfig));
  // No FLOP counter, no steps, no FLOPs.
  EpochSummary none = make_summary(100, 0, make_flops(kH100, {}, 0));
  EXPECT_FALSE(advise_fp32_matmul(none, kConfig));
  none.sections.erase<FlopEpochStats>();
  EXPECT_FALSE(advise_fp32_matmul(none, kConfig));
  EXPECT_FALSE(advise_fp32_matmul(EpochSummary{}, kConfig));
}

// ---- unfused attention
// ------------------------------------------------------------------------------

FlopEpochStats with_unfused(FlopEpochStats f, double unfused, double traffic_bytes,
                            double fallback = 0) {
  f.unfused_attention_flops_per_step = unfused;
  f.unfused_attention_per_step = 12;
  f.unfused_attention_traffic_bytes_per_step = traffic_bytes;
  f.sdpa_math_fallback_per_step = fallback;
  return f;
}

// A window of 10 traced 10 ms steps on an H200: 1 ms of softmax/mask kernels and 5 ms of
// tensor-core GEMMs per step.
GpuEpochStats unfused_window() {
  GpuEpochStats g = traced_window("NVIDIA H200");
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kAttention)] = 10 * kMs;
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kTensorGemm)] = 50 * kMs;
  return g;
}

// An H200 epoch of 10 steps, 1 TFLOP of bf16 each, 0.2 TFLOP of it in unfused attention moving
// `score_bytes` per step, with the window above (adjusted by `window`).
EpochSummary unfused_epoch(double score_bytes,
                           const std::function<void(GpuEpochStats&)>& window = nullptr) {
  const double F = 1e12;
  EpochSummary s =
      make_summary(10, 0,
                   with_unfused(make_flops("NVIDIA H200", {{MathPrecision::kBf16, F}}, 0.4),
                                0.2 * F, score_bytes));
  GpuEpochStats g = unfused_window();
  if (window) window(g);
  s.sections.set<GpuEpochStats>(g);
  return s;
}

TEST(PrecisionAdvisorTest, PlantedUnfusedAttentionWithMeasuredKernels) {
  const EpochSummary s = unfused_epoch(1e9);
  const auto a = advise_unfused_attention(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "unfused_attention");
  EXPECT_NEAR(*evidence(*a, "unfused_attention_share"), 0.2, 1e-12);
  EXPECT_NEAR(*evidence(*a, "unfused_attentions_per_step"), 12, 1e-12);
  // Removed: 1 ms of softmax/mask kernels per step, and the attention's 0.2 TFLOP at the 200
  // TFLOP/s the window's GEMMs ran (1 TFLOP in 5 ms): 1 ms. Fused: 0.2 TFLOP x 7/6 at 40% of
  // 989.5 TFLOP/s.
  const double fused_ms = 0.2 * 7 / 6 / (989.5 * 0.4) * 1e3;
  EXPECT_NEAR(*evidence(*a, "unfused_kernel_time"), 2.0, 1e-9);
  EXPECT_NEAR(*evidence(*a, "predicted_fused_time"), fused_ms, 1e-9);
  EXPECT_NEAR(*evidence(*a, "estimated_time_saved"), 2.0 - fused_ms, 1e-9);
  EXPECT_NEAR(a->expected_gain, 10 / (10 - 2 + fused_ms) - 1, 1e-9);
  EXPECT_EQ(a->severity, Severity::kWarning);
  EXPECT_TRUE(contains(a->action, "scaled_dot_product_attention")) << a->action;
  EXPECT_TRUE(contains(a->action, "softmax/mask kernels")) << a->action;
  EXPECT_TRUE(contains(a->action, "estimated")) << a->action;
  EXPECT_TRUE(contains(a->finding, "12 attentions")) << a->finding;
}

// The fixed step cannot be shorter than the host takes to issue one: an fp32 model at 32 ms a
// step (2 TFLOP: 29.9 ms at the fp32 peak) whose bf16 form is predicted at 4.7 ms, on a host
// whose fastest step took 8 ms (it ran ahead of the GPU, unblocked, in the epoch's first steps).
TEST(PrecisionAdvisorTest, Fp32GainStopsAtTheHostsFastestStep) {
  const double F = 1e12;
  EpochSummary s = make_summary(32, 0, make_flops(kH100, {{MathPrecision::kFp32, 2 * F}}, 0.5));
  const double unbounded = advise_fp32_matmul(s, kConfig)->expected_gain;
  const double predicted = 0.032 - 2 / 67.0 + 2 / (989.5 * 0.8);
  EXPECT_NEAR(unbounded, 0.032 / predicted - 1, 1e-9);
  s.compute_min_ns = 8 * kMs;
  auto a = advise_fp32_matmul(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_NEAR(a->expected_gain, 32.0 / 8.0 - 1, 1e-9);
  EXPECT_NEAR(*evidence(*a, "host_floor_time"), 8, 1e-9);
  EXPECT_NEAR(*evidence(*a, "predicted_step_time"), 8, 1e-9);
  EXPECT_TRUE(contains(a->action, "8 ms the host takes to issue one")) << a->action;
  // TF32 stops at the same floor: 2 TFLOP at 396 TFLOP/s would make a 7.1 ms step.
  EXPECT_NEAR(*evidence(*a, "expected_gain_tf32"), 32.0 / 8.0 - 1, 1e-9);
  // A fastest step of 90% of the median or more (29 of 32 ms) says nothing: the host may have
  // been blocked in every step (a full launch queue). No floor, the GPU-side prediction stands.
  s.compute_min_ns = 29 * kMs;
  a = advise_fp32_matmul(s, kConfig);
  EXPECT_NEAR(a->expected_gain, unbounded, 1e-9);
  EXPECT_FALSE(evidence(*a, "host_floor_time").has_value());
  // A trainer that synchronizes every step: no step is short, but the window's host time (step
  // less its syncs: 32 - 26 = 6 ms) is the host's own.
  GpuEpochStats g;
  g.device = kH100;
  g.traced_steps = 10;
  g.stats.host_sync_ns = 10 * 26 * kMs;
  s.sections.set<GpuEpochStats>(g);
  a = advise_fp32_matmul(s, kConfig);
  EXPECT_NEAR(a->expected_gain, 32.0 / 6.0 - 1, 1e-9);
  EXPECT_NEAR(*evidence(*a, "host_floor_time"), 6, 1e-9);
}

// With a data wait the floor is judged against the step's own work and the wait is added back:
// 32 ms steps of which 12 wait for data (20 ms of own work). A shortest own step of 19 ms is 95%
// of it: unknown, no floor (it is no sign of a host running ahead, though 19 < 0.9 x 32). One of
// 8 ms is: the new step takes at least 12 + 8 ms.
TEST(PrecisionAdvisorTest, Fp32HostFloorKeepsTheDataWait) {
  const double F = 1e12;
  EpochSummary s = make_summary(32, 12, make_flops(kH100, {{MathPrecision::kFp32, 2 * F}}, 0.5));
  s.compute_p50_ns = 20 * kMs;
  const double unbounded = advise_fp32_matmul(s, kConfig)->expected_gain;
  s.compute_min_ns = 19 * kMs;
  auto a = advise_fp32_matmul(s, kConfig);
  EXPECT_NEAR(a->expected_gain, unbounded, 1e-9);
  EXPECT_FALSE(evidence(*a, "host_floor_time").has_value());
  s.compute_min_ns = 8 * kMs;
  a = advise_fp32_matmul(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_LT(a->expected_gain, unbounded);
  EXPECT_NEAR(a->expected_gain, 32.0 / 20.0 - 1, 1e-9);
  EXPECT_NEAR(*evidence(*a, "predicted_step_time"), 20, 1e-9);
  EXPECT_TRUE(contains(a->action, "plus the data wait")) << a->action;
}

// The fusion's floor is the host's fastest step less the launches the fused kernels save: 1,000
// launches a step, 300 of them the attention's segments around 24 softmaxes, replaced by 48
// fused kernels: 748 of 1,000.
TEST(PrecisionAdvisorTest, UnfusedAttentionGainStopsAtTheHostsFastestStepLessSavedLaunches) {
  EpochSummary s = unfused_epoch(1e9, [](GpuEpochStats& g) {
    g.stats.kernels = 10 * 1000;
    g.kernel_classes.unfused_attention_softmaxes = 240;
    g.kernel_classes.unfused_attention_launches = 3000;
    g.kernel_classes.unfused_attention_pieces_ns = 30 * kMs;
    g.kernel_classes.unfused_attention_gemm_ns = 20 * kMs;
  });
  const double fused_ms = 0.2 * 7 / 6 / (989.5 * 0.4) * 1e3;
  EXPECT_NEAR(advise_unfused_attention(s, kConfig)->expected_gain, 10 / (10 - 5 + fused_ms) - 1,
              1e-9);
  s.compute_min_ns = static_cast<Nanos>(8.5 * kMs);
  const auto a = advise_unfused_attention(s, kConfig);
  ASSERT_TRUE(a.has_value());
  const double floor_ms = 8.5 * 0.748;
  EXPECT_NEAR(*evidence(*a, "host_floor_launch_factor"), 0.748, 1e-9);
  EXPECT_NEAR(*evidence(*a, "host_floor_time"), floor_ms, 1e-9);
  EXPECT_NEAR(a->expected_gain, 10 / floor_ms - 1, 1e-9);
  EXPECT_NEAR(*evidence(*a, "estimated_time_saved"), 10 - floor_ms, 1e-9);
  EXPECT_TRUE(contains(a->action, "ms the host takes to issue one")) << a->action;
}

TEST(PrecisionAdvisorTest, UnfusedAttentionMatmulsAtLeastTheirScoreTraffic) {
  // As above, with 19.2 GB of score-matrix traffic per step: the attention matmuls' half of it
  // at the H200's 4.8 TB/s (2 ms) outlasts their FLOPs at the window's GEMM rate (1 ms).
  const EpochSummary s = unfused_epoch(19.2e9);
  const auto a = advise_unfused_attention(s, kConfig);
  ASSERT_TRUE(a.has_value());
  const double fused_ms = 0.2 * 7 / 6 / (989.5 * 0.4) * 1e3;
  EXPECT_NEAR(*evidence(*a, "attention_matmul_time"), 2.0, 1e-9);
  EXPECT_NEAR(*evidence(*a, "unfused_kernel_time"), 3.0, 1e-9);
  EXPECT_NEAR(a->expected_gain, 10 / (10 - 3 + fused_ms) - 1, 1e-9);
  EXPECT_TRUE(contains(a->action, "score-matrix traffic")) << a->action;
}

TEST(PrecisionAdvisorTest, UnfusedAttentionFromTheKernelsAroundEachSoftmax) {
  // The window found the softmax segments: 3 ms of pieces and 2 ms of bounding GEMMs per step
  // replace the softmax/mask class time and the matmuls' FLOP model.
  const EpochSummary s = unfused_epoch(1e9, [](GpuEpochStats& g) {
    g.kernel_classes.unfused_attention_softmaxes = 240;
    g.kernel_classes.unfused_attention_pieces_ns = 30 * kMs;
    g.kernel_classes.unfused_attention_gemm_ns = 20 * kMs;
  });
  const auto a = advise_unfused_attention(s, kConfig);
  ASSERT_TRUE(a.has_value());
  const double fused_ms = 0.2 * 7 / 6 / (989.5 * 0.4) * 1e3;
  EXPECT_NEAR(*evidence(*a, "attention_matmul_time"), 2.0, 1e-9);
  EXPECT_EQ(*evidence(*a, "attention_matmul_time_measured"), 1.0);
  EXPECT_NEAR(*evidence(*a, "unfused_kernel_time"), 5.0, 1e-9);
  EXPECT_NEAR(a->expected_gain, 10 / (10 - 5 + fused_ms) - 1, 1e-9);
  EXPECT_TRUE(contains(a->action, "around each softmax")) << a->action;
  EXPECT_TRUE(contains(a->action, "GEMMs that bound")) << a->action;
}

TEST(PrecisionAdvisorTest, UnfusedAttentionEstimatedFromTrafficWithoutTrace) {
  const double F = 1e12;
  // 4.8 GB of score-matrix traffic per step at the H200's 4.8 TB/s (1 ms) and the 0.3 TFLOP of
  // matmuls at 80% of the bf16 peak; a fused kernel runs 0.35 TFLOP at 40% of it.
  const EpochSummary s = make_summary(
      4, 0,
      with_unfused(make_flops("NVIDIA H200", {{MathPrecision::kBf16, F}}, 0.4), 0.3 * F, 4.8e9));
  const auto a = advise_unfused_attention(s, kConfig);
  ASSERT_TRUE(a.has_value());
  const double removed = 1.0 + 0.3 / (989.5 * 0.8) * 1e3, fused = 0.35 / (989.5 * 0.4) * 1e3;
  EXPECT_EQ(*evidence(*a, "unfused_kernel_time_measured"), 0.0);
  EXPECT_NEAR(*evidence(*a, "estimated_time_saved"), removed - fused, 1e-9);
  EXPECT_NEAR(a->expected_gain, 4 / (4 - removed + fused) - 1, 1e-9);
  EXPECT_EQ(a->severity, Severity::kWarning);
  EXPECT_TRUE(contains(a->action, "4800 GB/s")) << a->action;
  EXPECT_TRUE(contains(a->action, "no trace window")) << a->action;
}

TEST(PrecisionAdvisorTest, UnfusedAttentionOnCpuIsInfoWithoutGain) {
  const EpochSummary s = make_summary(
      50, 0, with_unfused(make_flops("", {{MathPrecision::kFp32, 1e9}}, kNotMeasured), 5e8, 1e6));
  const auto a = advise_unfused_attention(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->severity, Severity::kInfo);
  EXPECT_EQ(a->expected_gain, 0);
  EXPECT_FALSE(evidence(*a, "estimated_time_saved").has_value());
}

TEST(PrecisionAdvisorTest, SdpaMathFallbackGetsItsOwnAction) {
  const EpochSummary s = make_summary(
      10, 0, with_unfused(make_flops(kH100, {{MathPrecision::kFp32, 1e12}}, 0.05), 5e11, 1e9, 12));
  const auto a = advise_unfused_attention(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "math path")) << a->cause;
  EXPECT_TRUE(contains(a->action, "bf16 or fp16")) << a->action;
  EXPECT_NEAR(*evidence(*a, "sdpa_math_fallback_per_step"), 12, 1e-12);
}

TEST(PrecisionAdvisorTest, FusedOrSmallAttentionIsQuiet) {
  const double F = 1e12;
  FlopEpochStats fused = make_flops(kH100, {{MathPrecision::kBf16, F}}, 0.5);
  fused.fused_attention_flops_per_step = 0.3 * F;
  EXPECT_FALSE(advise_unfused_attention(make_summary(10, 0, fused), kConfig));
  // 2% exactly: at the threshold.
  EXPECT_FALSE(advise_unfused_attention(
      make_summary(
          10, 0, with_unfused(make_flops(kH100, {{MathPrecision::kBf16, F}}, 0.5), 0.02 * F, 1e6)),
      kConfig));
  EXPECT_FALSE(advise_unfused_attention(EpochSummary{}, kConfig));
}

// ---- low MFU
// -------------------------------------------------------------------------------------------

// ---- biases added outside their GEMMs
// ------------------------------------------------------------------

// A 28 ms GPU-bound step (the GPT example on the H200 with torch::nn::Linear): 48 broadcast adds
// of 3.95 ms after GEMMs of 3.32 ms, 727 launches a step, 10 traced steps.
EpochSummary bias_epoch(double step_ms) {
  EpochSummary s;
  s.steps = 100;
  s.wall_ns = static_cast<Nanos>(std::llround(100 * step_ms * kMs));
  GpuEpochStats g;
  g.device = kH100;
  g.traced_steps = 10;
  g.stats.kernels = 7270;
  g.kernel_classes.steps = 10;
  g.kernel_classes.unfused_bias_adds = 480;
  g.kernel_classes.unfused_bias_add_ns = 39.5 * kMs;
  g.kernel_classes.unfused_bias_gemm_ns = 33.2 * kMs;
  s.sections.set<GpuEpochStats>(g);
  return s;
}

TEST(PrecisionAdvisorTest, UnfusedLinearBiasGainRemovesTheAddsLessTheEpilogue) {
  EpochSummary s = bias_epoch(28);
  const auto a = advise_unfused_linear_bias(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "unfused_linear_bias");
  // 3.95 ms of adds leave; the epilogue costs 3% of the GEMMs' 3.32 ms.
  const double new_ms = 28 - (3.95 - 0.03 * 3.32);
  EXPECT_NEAR(*evidence(*a, "predicted_step_time"), new_ms, 1e-9);
  EXPECT_NEAR(a->expected_gain, 28 / new_ms - 1, 1e-9);
  EXPECT_TRUE(a->gain_estimated);
  EXPECT_EQ(a->severity, Severity::kHigh);  // +15.9%
  EXPECT_NEAR(*evidence(*a, "unfused_bias_adds_per_step"), 48, 1e-9);
  EXPECT_NEAR(*evidence(*a, "unfused_bias_share"), 3.95 / 28, 1e-9);
  EXPECT_TRUE(contains(a->action, "torch::linear(x, weight, bias)")) << a->action;
  EXPECT_TRUE(contains(a->cause, "torch::nn::Linear")) << a->cause;
  EXPECT_TRUE(contains(a->finding, "48 GEMMs per step")) << a->finding;
  EXPECT_FALSE(evidence(*a, "host_floor_time").has_value());

  // A host that issues a step in 20 ms at best: under the GPU's 24.2 ms, which still sets the step.
  s.compute_min_ns = 20 * kMs;
  const auto gpu_bound = advise_unfused_linear_bias(s, kConfig);
  ASSERT_TRUE(gpu_bound.has_value());
  EXPECT_NEAR(gpu_bound->expected_gain, 28 / new_ms - 1, 1e-9);
  EXPECT_NEAR(*evidence(*gpu_bound, "host_floor_time"), 20, 1e-9);

  // A 20 ms step whose host issues one in 17.5 ms at best, above the 16.15 ms the GPU would take.
  // No launches are saved (under autocast at::linear casts each bias in a kernel of its own).
  EpochSummary h = bias_epoch(20);
  h.compute_p50_ns = 20 * kMs;
  h.compute_min_ns = static_cast<Nanos>(17.5 * kMs);
  const auto host = advise_unfused_linear_bias(h, kConfig);
  ASSERT_TRUE(host.has_value());
  EXPECT_NEAR(*evidence(*host, "host_floor_time"), 17.5, 1e-9);
  EXPECT_NEAR(host->expected_gain, 20 / 17.5 - 1, 1e-9);
  EXPECT_TRUE(contains(host->action, "ms the host takes to issue one")) << host->action;
}

// low_mfu over the same window names the adds as its largest fixable share.
TEST(PrecisionAdvisorTest, LowMfuNamesBiasesAddedOutsideTheirGemms) {
  EpochSummary s = bias_epoch(28);
  GpuEpochStats g = *s.sections.get<GpuEpochStats>();
  g.kernel_classes.traced_ns = 10 * 28 * kMs;
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kTensorGemm)] = 10 * 10 * kMs;
  g.kernel_classes.ns[static_cast<size_t>(KernelClass::kElementwise)] = 10 * 18 * kMs;
  g.stats.traced_ns = 10 * 28 * kMs;
  s.sections.set<GpuEpochStats>(g);
  s.sections.set<FlopEpochStats>(make_flops(kH100, {{MathPrecision::kBf16, 8e12}}, 0.29));
  const auto a = advise_low_mfu(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "biases added outside their GEMMs (48 broadcast add kernels"))
      << a->cause;
  EXPECT_TRUE(contains(a->action, "torch::linear")) << a->action;
  EXPECT_NEAR(a->expected_gain, advise_unfused_linear_bias(s, kConfig)->expected_gain, 1e-9);
}

TEST(PrecisionAdvisorTest, UnfusedLinearBiasQuietBelowThresholdOrWithoutAWindow) {
  // 0.5 ms of adds in a 28 ms step: 1.8%, under the 2% threshold.
  EpochSummary s = bias_epoch(28);
  GpuEpochStats g = *s.sections.get<GpuEpochStats>();
  g.kernel_classes.unfused_bias_add_ns = 5 * kMs;
  s.sections.set<GpuEpochStats>(g);
  EXPECT_FALSE(advise_unfused_linear_bias(s, kConfig).has_value());
  AdvisorsConfig low = kConfig;
  low.unfused_linear_bias.threshold = 0.01;
  EXPECT_TRUE(advise_unfused_linear_bias(s, low).has_value());
  // No window, or a window that found none.
  g.kernel_classes = KernelClassStats{};
  s.sections.set<GpuEpochStats>(g);
  EXPECT_FALSE(advise_unfused_linear_bias(s, kConfig).has_value());
  EpochSummary bare;
  bare.steps = 100;
  bare.wall_ns = 100 * 28 * kMs;
  EXPECT_FALSE(advise_unfused_linear_bias(bare, kConfig).has_value());
}

TEST(PrecisionAdvisorTest, LowMfuBreakdownNamesTheDataWait) {
  const EpochSummary s =
      make_summary(100, 60, make_flops(kH100, {{MathPrecision::kBf16, 1e13}}, 0.1));
  const auto a = advise_low_mfu(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "low_mfu");
  EXPECT_EQ(a->severity, Severity::kWarning) << "MFU below half the threshold";
  EXPECT_NEAR(*evidence(*a, "mfu"), 0.1, 1e-12);
  EXPECT_NEAR(*evidence(*a, "data_wait_fraction"), 0.6, 1e-12);
  EXPECT_NEAR(*evidence(*a, "below_peak_fraction"), 0.3, 1e-12);
  EXPECT_TRUE(contains(a->finding, "MFU is 10.0%")) << a->finding;
  EXPECT_TRUE(contains(a->finding, "GPU idle time not measured")) << a->finding;
  EXPECT_TRUE(contains(a->finding, "table: NVIDIA H100 SXM bf16 dense")) << a->finding;
  EXPECT_TRUE(contains(a->cause, "wait for data")) << a->cause;
  EXPECT_NEAR(a->expected_gain, 0.6 / 0.4, 1e-9);
}

TEST(PrecisionAdvisorTest, LowMfuBreakdownNamesGpuIdle) {
  EpochSummary s = make_summary(100, 5, make_flops(kH100, {{MathPrecision::kBf16, 1e13}}, 0.2));
  GpuEpochStats g;
  g.stats.gpu_utilization = 0.45;  // idle 55%, 50% of it outside the data wait
  s.sections.set<GpuEpochStats>(g);
  const auto a = advise_low_mfu(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->severity, Severity::kInfo) << "MFU above half the threshold";
  EXPECT_NEAR(*evidence(*a, "gpu_idle_outside_data_wait"), 0.5, 1e-9);
  EXPECT_NEAR(*evidence(*a, "below_peak_fraction"), 0.25, 1e-9);
  EXPECT_TRUE(contains(a->cause, "idling outside the data wait")) << a->cause;
  // Without a trace the idle is not split by cause: no gain is sized from it (issue 15).
  EXPECT_EQ(a->expected_gain, 0.0);
  EXPECT_TRUE(contains(a->action, "host_bound")) << a->action;
}

TEST(PrecisionAdvisorTest, LowMfuBelowPeakNamesKernelsOrPrecision) {
  EpochSummary s = make_summary(100, 0, make_flops(kH100, {{MathPrecision::kBf16, 1e13}}, 0.2));
  GpuEpochStats g;
  g.stats.gpu_utilization = 0.95;
  g.stats.traced_ns = 100 * kMs;
  g.top_kernels = {{"elementwise_kernel", 1000, 40 * kMs, 2, 1},
                   {"layer_norm_kernel", 100, 20 * kMs, 2, 1}};
  s.sections.set<GpuEpochStats>(g);
  auto a = advise_low_mfu(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->cause, "other than the counted matmuls")) << a->cause;
  EXPECT_TRUE(contains(a->action, "elementwise_kernel 40.0%")) << a->action;
  EXPECT_EQ(a->expected_gain, 0);
  // Mostly fp32: points at precision.
  s.sections.set<FlopEpochStats>(make_flops(kH100, {{MathPrecision::kFp32, 1e12}}, 0.1));
  a = advise_low_mfu(s, kConfig);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(contains(a->action, "fp32_matmul")) << a->action;
}

TEST(PrecisionAdvisorTest, LowMfuQuietWhenHealthyOrUnmeasured) {
  EXPECT_FALSE(advise_low_mfu(
      make_summary(100, 0, make_flops(kH100, {{MathPrecision::kBf16, 1e13}}, 0.45)), kConfig));
  EXPECT_FALSE(advise_low_mfu(
      make_summary(100, 0, make_flops(kH100, {{MathPrecision::kBf16, 1e13}}, 0.3)), kConfig))
      << "at the threshold";
  EXPECT_FALSE(advise_low_mfu(
      make_summary(100, 0, make_flops("", {{MathPrecision::kFp32, 1e9}}, kNotMeasured)), kConfig))
      << "CPU: no MFU";
  EXPECT_FALSE(advise_low_mfu(make_summary(100, 0, make_flops(kH100, {}, 0.0)), kConfig))
      << "nothing counted";
  EXPECT_FALSE(advise_low_mfu(EpochSummary{}, kConfig));
}

// ---- all together
// --------------------------------------------------------------------------------------

TEST(PrecisionAdvisorTest, HealthyRunGetsNoPrecisionAdviceAndNothingHigh) {
  Config config;
  FlopEpochStats f = make_flops(kH100, {{MathPrecision::kBf16, 1e13}}, 0.45);
  f.fused_attention_flops_per_step = 3e12;
  const std::vector<Advice> advice = run_advisors(make_summary(100, 1, f), config);
  for (const Advice& a : advice) {
    EXPECT_NE(a.id, "fp32_matmul");
    EXPECT_NE(a.id, "unfused_attention");
    EXPECT_NE(a.id, "low_mfu");
    EXPECT_NE(a.severity, Severity::kHigh) << a.id;
  }
  // CPU run with fp32 and no peak: nothing from the precision/MFU advisors.
  const std::vector<Advice> cpu = run_advisors(
      make_summary(100, 1, make_flops("", {{MathPrecision::kFp32, 1e9}}, kNotMeasured)), config);
  for (const Advice& a : cpu) {
    EXPECT_NE(a.id, "fp32_matmul");
    EXPECT_NE(a.id, "low_mfu");
  }
}

TEST(PrecisionAdvisorTest, RunAdvisorsIncludesPlantedOnes) {
  Config config;
  const double F = 1e12;
  const EpochSummary s = make_summary(
      10, 0, with_unfused(make_flops(kH100, {{MathPrecision::kFp32, F}}, 0.05), 0.2 * F, 1e9));
  const std::vector<Advice> advice = run_advisors(s, config);
  bool fp32 = false, unfused = false, low = false;
  for (const Advice& a : advice) {
    fp32 |= a.id == "fp32_matmul";
    unfused |= a.id == "unfused_attention";
    low |= a.id == "low_mfu";
  }
  EXPECT_TRUE(fp32);
  EXPECT_TRUE(unfused);
  EXPECT_TRUE(low);
}

}  // namespace
}  // namespace torchpilot
