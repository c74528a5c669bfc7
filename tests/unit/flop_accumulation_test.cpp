// The FLOP tallies, the epoch accumulator and a step record's FLOP fields
// (runtime/flops/flop_accumulation.cpp).
#include "torchpilot/runtime/flops/flop_accumulation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace torchpilot {
namespace {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

TEST(MfuTest, HfuCountsRecomputation) {
  const DevicePeak h200 = resolve_peak("NVIDIA H200", 0);
  FlopTally t;
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.3 * 989.5e12, false);
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.1 * 989.5e12, true);
  const StepFlops s = t.per_step(1);
  EXPECT_NEAR(utilization(s.model_by_precision, h200, 1.0), 0.3, 1e-12);
  EXPECT_NEAR(utilization(s.hardware_by_precision, h200, 1.0), 0.4, 1e-12);
}

// ---- tallies ------------------------------------------------------------------------------------

TEST(FlopTallyTest, PerStepMeansAndTopOps) {
  FlopTally t;
  EXPECT_TRUE(t.empty());
  // Two steps: each runs two bf16 mms of 100, one fp32 conv of 50, one fused attention of 40,
  // and a recomputed mm of 30 (hardware only).
  for (int step = 0; step < 2; ++step) {
    t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 100, false);
    t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 100, false);
    t.add("aten::convolution", OpKind::kConvolution, MathPrecision::kFp32, 50, false);
    t.add("aten::_scaled_dot_product_flash_attention", OpKind::kAttention, MathPrecision::kBf16, 40,
          false);
    t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 30, true);
  }
  t.add_attention({12, 1, 0, 64});
  t.add_unparsed();
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, kNotMeasured, false);  // ignored
  const StepFlops s = t.per_step(2);
  EXPECT_DOUBLE_EQ(s.model_flops, 290);
  EXPECT_DOUBLE_EQ(s.hardware_flops, 320);
  EXPECT_DOUBLE_EQ(s.model_by_precision[P(MathPrecision::kBf16)], 240);
  EXPECT_DOUBLE_EQ(s.model_by_precision[P(MathPrecision::kFp32)], 50);
  EXPECT_DOUBLE_EQ(s.hardware_by_precision[P(MathPrecision::kBf16)], 270);
  EXPECT_DOUBLE_EQ(s.fused_attention_flops, 40);
  EXPECT_DOUBLE_EQ(s.unfused_attention_flops, 6);
  EXPECT_DOUBLE_EQ(s.unfused_attention, 0.5);
  EXPECT_DOUBLE_EQ(s.unfused_attention_traffic_bytes, 32);
  EXPECT_EQ(s.unparsed_calls, 1);
  ASSERT_EQ(s.ops.size(), 3u);
  EXPECT_EQ(s.ops[0].op, "aten::mm");
  EXPECT_DOUBLE_EQ(s.ops[0].flops_per_step, 200);
  EXPECT_DOUBLE_EQ(s.ops[0].calls_per_step, 2);
  EXPECT_EQ(s.ops[1].op, "aten::convolution");
  EXPECT_EQ(s.ops[1].precision, MathPrecision::kFp32);
  EXPECT_EQ(s.ops[2].op, "aten::_scaled_dot_product_flash_attention");
  t.clear();
  EXPECT_TRUE(t.empty());
  EXPECT_DOUBLE_EQ(t.per_step(1).model_flops, 0);
}

StepFlops count_of(double bf16, double fp32 = 0) {
  FlopTally t;
  if (bf16 > 0) t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, bf16, false);
  if (fp32 > 0) t.add("aten::addmm", OpKind::kMatmul, MathPrecision::kFp32, fp32, false);
  return t.per_step(1);
}

// ---- epoch accumulator --------------------------------------------------------------------------

TEST(FlopEpochAccumulatorTest, SummarizesKnownSteps) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  FlopEpochAccumulator acc;
  const StepFlops c = count_of(0.25 * 989.5e12);  // a quarter second at the bf16 peak
  acc.add_step(nullptr, 1.0, false);              // before any count
  acc.add_step(&c, 2.0, true);                    // counted (slower: callbacks on)
  acc.add_step(&c, 1.0, false);
  acc.add_step(&c, 1.0, false);
  const FlopEpochStats f = acc.summarize(h100);
  EXPECT_EQ(f.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(f.counted_steps, 1);
  EXPECT_EQ(f.steps_with_count, 3);
  EXPECT_DOUBLE_EQ(f.model_flops_per_step, 0.25 * 989.5e12);
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kBf16)], 0.25 * 989.5e12);
  EXPECT_DOUBLE_EQ(f.achieved_flops_per_s, 3 * 0.25 * 989.5e12 / 4.0);
  EXPECT_DOUBLE_EQ(f.mfu, 0.25) << "from the uncounted steps";
  EXPECT_DOUBLE_EQ(f.hfu, 0.25);
  EXPECT_EQ(f.dominant_precision, MathPrecision::kBf16);
  EXPECT_DOUBLE_EQ(f.peak_flops_per_s, 989.5e12);
  EXPECT_EQ(f.peak_source, "table: NVIDIA H100 SXM bf16 dense");
  EXPECT_DOUBLE_EQ(f.datasheet_flops_by_precision[P(MathPrecision::kFp32)], 67e12);
  EXPECT_DOUBLE_EQ(f.dram_bytes_per_s, 3350e9);
  ASSERT_EQ(f.top_ops.size(), 1u);
  EXPECT_EQ(f.top_ops[0].op, "aten::mm");

  // Only counted steps: MFU from them.
  FlopEpochAccumulator only;
  only.add_step(&c, 0.5, true);
  EXPECT_DOUBLE_EQ(only.summarize(h100).mfu, 0.5);
  // No peak: NaN, the FLOPs still there.
  const FlopEpochStats cpu = acc.summarize(resolve_peak("", 0));
  EXPECT_TRUE(std::isnan(cpu.mfu));
  EXPECT_TRUE(std::isnan(cpu.hfu));
  EXPECT_TRUE(std::isnan(cpu.peak_flops_per_s));
  EXPECT_TRUE(cpu.peak_source.empty());
  EXPECT_DOUBLE_EQ(cpu.model_flops_per_step, 0.25 * 989.5e12);
  // Config peak.
  EXPECT_EQ(acc.summarize(resolve_peak("NVIDIA H100 80GB HBM3", 1000)).peak_source, "config");
  // Nothing known.
  FlopEpochAccumulator empty;
  empty.add_step(nullptr, 1.0, false);
  const FlopEpochStats e = empty.summarize(h100);
  EXPECT_EQ(e.steps_with_count, 0);
  EXPECT_TRUE(std::isnan(e.mfu));
  EXPECT_EQ(e.model_flops_per_step, 0);
  acc.clear();
  EXPECT_EQ(acc.summarize(h100).steps_with_count, 0);
}

TEST(FlopEpochAccumulatorTest, StepsRepeatingACachedCountAddUpAsOneByOne) {
  // Between counting windows every step has the planner's cached count (an id): the accumulator
  // adds such a run at once. Its sums must be those of adding the steps one by one.
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  StepFlops a = count_of(0.25 * 989.5e12);
  a.id = 7;
  StepFlops b = count_of(0.125 * 989.5e12);
  b.id = 8;
  const StepFlops uncached = count_of(0.5 * 989.5e12);  // id 0: never in a run
  FlopEpochAccumulator runs;
  runs.add_step(&a, 2.0, true);
  for (int i = 0; i < 5; ++i) runs.add_step(&a, 1.0, false);
  for (int i = 0; i < 3; ++i) runs.add_step(&b, 0.5, false);
  runs.add_step(&uncached, 2.0, false);
  runs.add_step(&a, 1.0, false);
  const FlopEpochStats f = runs.summarize(h100);
  EXPECT_EQ(f.counted_steps, 1);
  EXPECT_EQ(f.steps_with_count, 11);
  const double model =
      6 * 0.25 * 989.5e12 + 3 * 0.125 * 989.5e12 + 0.5 * 989.5e12 + 0.25 * 989.5e12;
  EXPECT_DOUBLE_EQ(f.model_flops_per_step, model / 11);
  // The uncounted steps' MFU: their FLOPs over their time at the peak.
  const double steady = model - 0.25 * 989.5e12;
  EXPECT_NEAR(f.mfu, steady / (5 + 1.5 + 2 + 1) / 989.5e12, 1e-12);
  ASSERT_EQ(f.top_ops.size(), 1u);
  EXPECT_NEAR(f.top_ops[0].flops_per_step, model / 11, 1e-3 * model / 11);
  // A second summary without new steps is the same (nothing added twice).
  EXPECT_DOUBLE_EQ(runs.summarize(h100).model_flops_per_step, model / 11);
}

TEST(FlopEpochAccumulatorTest, TopOpsAreCappedAndOrdered) {
  FlopTally t;
  for (int i = 0; i < 15; ++i) {
    t.add("op" + std::to_string(i), OpKind::kMatmul, MathPrecision::kBf16, 100.0 + i, false);
  }
  const StepFlops s = t.per_step(1);
  FlopEpochAccumulator acc;
  acc.add_step(&s, 1.0, false);
  const FlopEpochStats f = acc.summarize(resolve_peak("", 0));
  ASSERT_EQ(f.top_ops.size(), FlopEpochAccumulator::kTopOps);
  EXPECT_EQ(f.top_ops[0].op, "op14");
  EXPECT_EQ(f.top_ops[9].op, "op5");
}

TEST(FillStepFlopsTest, RecordFields) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  StepRecord r;
  r.begin_ns = 0;
  r.end_ns = 1'000'000'000;
  FlopTally t;
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.25 * 989.5e12, false);
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.25 * 989.5e12, true);
  const StepFlops c = t.per_step(1);
  fill_step_flops(r, &c, h100);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), 0.25 * 989.5e12);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "hardware_flops"), 0.5 * 989.5e12);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "mfu"), 0.25);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "hfu"), 0.5);
  fill_step_flops(r, nullptr, h100);
  EXPECT_TRUE(std::isnan(r.metrics.get("flops", "model_flops")));
  EXPECT_TRUE(std::isnan(r.metrics.get("flops", "mfu")));
  fill_step_flops(r, &c, resolve_peak("", 0));
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), 0.25 * 989.5e12);
  EXPECT_TRUE(std::isnan(r.metrics.get("flops", "mfu"))) << "no peak on CPU";
}

}  // namespace
}  // namespace torchpilot
