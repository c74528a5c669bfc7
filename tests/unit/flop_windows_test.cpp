// The FLOP window planner: when to count, and which count applies to a step
// (runtime/flops/flop_windows.cpp).
#include "torchpilot/runtime/flops/flop_windows.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace torchpilot {
namespace {

StepFlops count_of(double bf16, double fp32 = 0) {
  FlopTally t;
  if (bf16 > 0) t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, bf16, false);
  if (fp32 > 0) t.add("aten::addmm", OpKind::kMatmul, MathPrecision::kFp32, fp32, false);
  return t.per_step(1);
}

// ---- window planner -----------------------------------------------------------------------------

struct PlannerRun {
  FlopWindowPlanner planner;
  int64_t counted = 0;
  explicit PlannerRun(FlopConfig c) : planner(c) {}
  // Runs one step of `samples`; a counted step "counts" `flops` bf16 FLOPs.
  const StepFlops* step(int64_t samples, double flops) {
    const bool count = planner.begin_step();
    StepFlops own = count_of(flops);
    if (count) ++counted;
    return planner.end_step(samples, count ? &own : nullptr);
  }
};

FlopConfig window_config(int skip, int count, int every = 0) {
  FlopConfig c;
  c.skip_steps = skip;
  c.count_steps = count;
  c.recount_every_steps = every;
  return c;
}

TEST(FlopWindowPlannerTest, SkipThenCountThenReuse) {
  PlannerRun r(window_config(2, 3));
  EXPECT_FALSE(r.planner.counting());
  EXPECT_EQ(r.step(32, 100), nullptr);  // skipped
  EXPECT_EQ(r.step(32, 100), nullptr);  // skipped
  EXPECT_TRUE(r.planner.counting()) << "the window opens with the next step";
  EXPECT_EQ(r.counted, 0);
  // Counted steps get their own count.
  const StepFlops* a = r.step(32, 90);
  ASSERT_NE(a, nullptr);
  EXPECT_DOUBLE_EQ(a->model_flops, 90);
  EXPECT_DOUBLE_EQ(r.step(32, 100)->model_flops, 100);
  EXPECT_DOUBLE_EQ(r.step(32, 110)->model_flops, 110);
  EXPECT_EQ(r.counted, 3);
  EXPECT_FALSE(r.planner.counting());
  EXPECT_EQ(r.planner.windows(), 1);
  // Later steps: the window's mean, without counting.
  for (int i = 0; i < 20; ++i) {
    const StepFlops* s = r.step(32, 999);
    ASSERT_NE(s, nullptr);
    EXPECT_DOUBLE_EQ(s->model_flops, 100);
  }
  EXPECT_EQ(r.counted, 3);
}

TEST(FlopWindowPlannerTest, NewSampleCountIsCountedOnceAndRemembered) {
  PlannerRun r(window_config(0, 2));
  r.step(32, 100);
  r.step(32, 100);
  EXPECT_EQ(r.planner.windows(), 1);
  // The batch size changes: that step has no count, the next ones are counted.
  EXPECT_EQ(r.step(16, 50), nullptr);
  EXPECT_TRUE(r.planner.counting());
  EXPECT_DOUBLE_EQ(r.step(16, 50)->model_flops, 50);
  EXPECT_DOUBLE_EQ(r.step(16, 50)->model_flops, 50);
  EXPECT_EQ(r.planner.windows(), 2);
  EXPECT_EQ(r.counted, 4);
  // Back to 32 and again 16: both remembered, nothing counted.
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 100);
  EXPECT_DOUBLE_EQ(r.step(16, 0)->model_flops, 50);
  EXPECT_EQ(r.counted, 4);
}

TEST(FlopWindowPlannerTest, PartialLastBatchDoesNotRecountTheFullOne) {
  PlannerRun r(window_config(0, 3));
  for (int i = 0; i < 3; ++i) r.step(32, 100);
  // The epoch's last batch of 20 samples has no count; the next step (32) is counted, but since
  // 32 is known the window closes after that one step.
  EXPECT_EQ(r.step(20, 60), nullptr);
  EXPECT_DOUBLE_EQ(r.step(32, 101)->model_flops, 101);
  EXPECT_FALSE(r.planner.counting());
  EXPECT_EQ(r.counted, 4);
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 100) << "the remembered window mean";
}

TEST(FlopWindowPlannerTest, WindowRestartsWhenSamplesChangeInside) {
  PlannerRun r(window_config(0, 3));
  r.step(32, 100);
  r.step(16, 50);  // the window restarts with this step
  EXPECT_TRUE(r.planner.counting());
  r.step(16, 50);
  r.step(16, 50);
  EXPECT_FALSE(r.planner.counting());
  EXPECT_DOUBLE_EQ(r.planner.count_for(16)->model_flops, 50);
  EXPECT_EQ(r.planner.count_for(32), nullptr);
}

TEST(FlopWindowPlannerTest, RecountEveryNStepsAndOnRequest) {
  PlannerRun r(window_config(0, 1, 5));
  r.step(32, 100);
  EXPECT_EQ(r.counted, 1);
  for (int i = 0; i < 5; ++i) r.step(32, 0);
  EXPECT_TRUE(r.planner.counting()) << "5 steps since the window";
  EXPECT_DOUBLE_EQ(r.step(32, 120)->model_flops, 120);
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 120) << "the new count replaces the old";
  EXPECT_EQ(r.counted, 2);
  r.planner.recount();
  EXPECT_TRUE(r.planner.counting());
  EXPECT_EQ(r.planner.count_for(32), nullptr);
  EXPECT_DOUBLE_EQ(r.step(32, 130)->model_flops, 130);
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 130);
  EXPECT_EQ(r.counted, 3);
}

TEST(FlopWindowPlannerTest, RemembersAtMostEightSampleCounts) {
  PlannerRun r(window_config(0, 1));
  for (int64_t s = 1; s <= 10; ++s) {
    r.step(s, 0);                       // unknown: the next step counts
    r.step(s, static_cast<double>(s));  // counted
  }
  EXPECT_EQ(r.planner.count_for(1), nullptr);
  EXPECT_EQ(r.planner.count_for(2), nullptr);
  EXPECT_NE(r.planner.count_for(3), nullptr);
  EXPECT_DOUBLE_EQ(r.planner.count_for(10)->model_flops, 10);
}

}  // namespace
}  // namespace torchpilot
