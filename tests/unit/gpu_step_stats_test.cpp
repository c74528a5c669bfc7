// A step's GPU figures from hand-made timelines (KernelIndex, gpu_step_stats) and the GPU advisors
// on planted summaries.
#include "torchpilot/runtime/gpu/gpu_step_stats.h"

#include <gtest/gtest.h>

#include <vector>

#include "fakes/gpu_records.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

namespace torchpilot {
namespace {

using test::kernel;
using test::pm;
using test::spans;

constexpr Nanos kMs = 1000000;

TEST(KernelIndexTest, OverlappingHoldsEveryKernelInTheSpanAndFewOthers) {
  // In start order, as the monitor holds them; one long kernel starts well before the span.
  const std::vector<KernelRecord> ks = {kernel(0, 5, 1),   kernel(10, 60, 1), kernel(20, 25, 1),
                                        kernel(30, 35, 1), kernel(70, 75, 1), kernel(80, 85, 1)};
  const KernelIndex index(ks);
  std::vector<Nanos> begins;
  for (const KernelRecord& k : index.overlapping({55, 72})) begins.push_back(k.begin);
  // The long kernel [10, 60) overlaps; [20, 25) and [30, 35) lie within the longest kernel's reach
  // and come along (callers clip); [0, 5) and [80, 85) do not.
  EXPECT_EQ(begins, (std::vector<Nanos>{10, 20, 30, 70}));
  begins.clear();
  for (const KernelRecord& k : index.starting_in({20, 71})) begins.push_back(k.begin);
  EXPECT_EQ(begins, (std::vector<Nanos>{20, 30, 70}));
  // The busy union: [0, 5), [10, 60), [70, 75), [80, 85).
  EXPECT_EQ(index.at_or_after(6, -1), 10);
  EXPECT_EQ(index.at_or_after(40, -1), 40);
  EXPECT_EQ(index.at_or_after(90, -1), -1);
  EXPECT_EQ(index.last_end_before(65), 60);
  std::vector<Interval> gaps;
  index.gaps_after(55, 12, 100, gaps);
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_EQ(gaps[0].begin, 60);
  EXPECT_EQ(gaps[0].end, 70);
  EXPECT_EQ(gaps[1].begin, 75);
  EXPECT_EQ(gaps[1].end, 77);

  // Not in start order (a hand-made list): every kernel is a candidate, the answers are the same.
  const std::vector<KernelRecord> unordered = {ks[4], ks[0], ks[5], ks[2], ks[1], ks[3]};
  const KernelIndex any(unordered);
  EXPECT_EQ(any.overlapping({55, 72}).size(), unordered.size());
  EXPECT_EQ(any.at_or_after(6, -1), 10);
  EXPECT_EQ(any.last_end_before(65), 60);
  // A record without duration out of place breaks the order as much as any other.
  std::vector<KernelRecord> with_empty = ks;
  with_empty.insert(with_empty.begin() + 3, kernel(90, 90, 1));
  EXPECT_EQ(KernelIndex(with_empty).overlapping({55, 72}).size(), with_empty.size());
}

TEST(GpuStepStatsTest, PmSamplesAreTimeWeightedOverTheStep) {
  GpuEventBatch ev;
  ev.pm = {pm(0, 10, 0.2), pm(10, 20, 0.6)};
  const GpuStats g = gpu_step_stats(ev, spans({5, 15}, {5, 5}, false), 100, 100);
  EXPECT_DOUBLE_EQ(g.sm_efficiency, 0.4);
  EXPECT_DOUBLE_EQ(g.counter_utilization, 1.0);
  EXPECT_DOUBLE_EQ(g.achieved_occupancy, 0.2);
  EXPECT_DOUBLE_EQ(g.pcie_read_bytes, 1000.0);  // half of each 1000-byte sample
  EXPECT_FALSE(measured(g.pcie_write_bytes));
  EXPECT_FALSE(measured(g.gpu_utilization));  // not traced
  EXPECT_EQ(g.traced_ns, 0);
}

TEST(GpuStepStatsTest, NvmlReadingsInsideTheStepOrTheNextOne) {
  GpuEventBatch ev;
  ev.nvml = {{3, 0.5}, {7, 1.0}, {30, 0.2}};
  EXPECT_DOUBLE_EQ(gpu_step_stats(ev, spans({0, 10}, {0, 0}, false), 100, 100).nvml_utilization,
                   0.75);
  // No reading inside: the first one within an interval after the step.
  EXPECT_DOUBLE_EQ(gpu_step_stats(ev, spans({20, 25}, {20, 20}, false), 100, 10).nvml_utilization,
                   0.2);
  EXPECT_FALSE(
      measured(gpu_step_stats(ev, spans({40, 50}, {40, 40}, false), 100, 5).nvml_utilization));
}

TEST(GpuStepStatsTest, NvmlClockAndItsLimitsByTheSameRule) {
  GpuEventBatch ev;
  // Readings of a busy GPU only (utilization.gpu >= 50%): an idle one lowers its clock.
  UtilSample a{3, 0.5, 1980.0, 0}, b{7, 1.0, 1500.0, 1}, idle{8, 0.1, 345.0, 0};
  UtilSample c{30, 0.6, 1700.0, 1}, old{50, 0.4};
  ev.nvml = {a, b, idle, c, old};
  const GpuStats s = gpu_step_stats(ev, spans({0, 10}, {0, 0}, false), 100, 100);
  EXPECT_NEAR(s.nvml_utilization, 1.6 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(s.sm_clock_mhz, 1740.0);
  EXPECT_DOUBLE_EQ(s.clock_limited, 0.5);
  // The reading after the step when none is inside it.
  EXPECT_DOUBLE_EQ(gpu_step_stats(ev, spans({20, 25}, {20, 20}, false), 100, 10).sm_clock_mhz,
                   1700.0);
  // A driver without the clock calls: utilization only.
  const GpuStats d = gpu_step_stats(ev, spans({45, 55}, {45, 45}, false), 100, 5);
  EXPECT_DOUBLE_EQ(d.nvml_utilization, 0.4);
  EXPECT_FALSE(measured(d.sm_clock_mhz));
  EXPECT_FALSE(measured(d.clock_limited));
}

TEST(GpuStepStatsTest, TracedStepSplitsIdleTimeByCause) {
  // Step [0, 10]: data wait [0, 1]; kernels [2, 4] and [6, 8] (50 blocks on 100 SMs); a
  // synchronize [8, 9]; a pageable H2D copy at 1.
  GpuEventBatch ev;
  ev.kernels = {kernel(2, 4, 50), kernel(6, 8, 50)};
  ev.syncs = {{8, 9}};
  ev.copies = {test::copy_record(1, 2, 4096, CopyKind::kHostToDevice, true)};
  const GpuStats g = gpu_step_stats(ev, spans({0, 10}, {0, 1}, true), 100, 100);
  EXPECT_EQ(g.traced_ns, 10);
  EXPECT_DOUBLE_EQ(g.gpu_utilization, 0.4);
  EXPECT_DOUBLE_EQ(g.estimated_sm_efficiency, 0.2);
  EXPECT_EQ(g.kernels, 2);
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_EQ(g.host_sync_ns, 1);
  EXPECT_EQ(g.h2d_bytes, 4096);
  EXPECT_EQ(g.h2d_pageable_bytes, 4096);
  EXPECT_EQ(g.idle_data_wait_ns, 1);      // [0, 1]
  EXPECT_EQ(g.idle_host_sync_ns, 2);      // [8, 10]: the GPU went idle while the host synchronized
  EXPECT_EQ(g.idle_pageable_copy_ns, 1);  // [1, 2]: the copy, before the first kernel
  EXPECT_EQ(g.idle_launch_gap_ns, 2);     // [4, 6], between kernels
  EXPECT_EQ(g.idle_other_ns, 0);
  EXPECT_EQ(g.idle_data_wait_ns + g.idle_host_sync_ns + g.idle_pageable_copy_ns +
                g.idle_launch_gap_ns + g.idle_other_ns,
            g.traced_ns - 4);
}

TEST(GpuStepStatsTest, KernelsAreClippedToTheStep) {
  GpuEventBatch ev;
  ev.kernels = {kernel(-5, 5, 200), kernel(8, 20, 1)};
  const GpuStats g = gpu_step_stats(ev, spans({0, 10}, {0, 0}, true), 100, 100);
  EXPECT_DOUBLE_EQ(g.gpu_utilization, 0.7);
  EXPECT_DOUBLE_EQ(g.estimated_sm_efficiency, (5 * 1.0 + 2 * 0.01) / 10);
  EXPECT_EQ(g.kernels, 1);  // the first started in the previous step
}

TEST(GpuStepStatsTest, GpuFiguresAndSyncsByGpuSpan) {
  // The host ran the step in [0, 10]; the GPU ran it in [20, 40] (queued ahead).
  GpuEventBatch ev;
  ev.pm = {pm(0, 20, 0.1), pm(20, 40, 0.9)};
  ev.kernels = {kernel(5, 15, 100), kernel(22, 30, 100), kernel(32, 38, 100)};
  ev.syncs = {{2, 4}, {25, 26}};
  StepSpans sp = spans({0, 10}, {0, 0}, true);
  sp.gpu = {20, 40};
  sp.gpu_timed = true;
  const GpuStats g = gpu_step_stats(ev, sp, 100, 100);
  EXPECT_EQ(g.wall_ns, 20);
  EXPECT_DOUBLE_EQ(g.sm_efficiency, 0.9);
  EXPECT_EQ(g.kernels, 2);  // by start time in the GPU span; the first was the previous step's
  EXPECT_DOUBLE_EQ(g.gpu_utilization, 14.0 / 20);
  // A sync counts in the step whose span holds the end of its wait (the GPU caught up with the
  // host then): [25, 26], not [2, 4], which ended in the previous step's GPU time.
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_EQ(g.host_sync_ns, 1);
}

// --- GPU advisors on planted summaries --------------------------------------------------------

EpochSummary traced_summary() {
  EpochSummary s = test::traced_gpu_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.counter_utilization = 0.95;
  e.stats.sm_efficiency = 0.9;
  e.stats.gpu_utilization = 0.95;
  e.stats.idle_other_ns = 50 * kMs;
  return s;
}

TEST(GpuAdvisorsTest, HealthyRunGetsNoGpuAdvice) {
  const EpochSummary s = traced_summary();
  const AdvisorsConfig c;
  EXPECT_FALSE(advise_busy_inefficient(s, c));
  EXPECT_FALSE(advise_host_sync(s, c));
  EXPECT_FALSE(advise_pageable_copies(s, c));
  EXPECT_FALSE(advise_launch_bound(s, c));
  EpochSummary cpu;  // no GPU section at all
  cpu.steps = 3;
  EXPECT_FALSE(advise_busy_inefficient(cpu, c));
  EXPECT_FALSE(advise_host_sync(cpu, c));
}

TEST(GpuAdvisorsTest, HostSyncStallIsFound) {
  EpochSummary s = traced_summary();
  s.sections.get<GpuEpochStats>()->stats.host_sync_ns = 200 * kMs;
  s.sections.get<GpuEpochStats>()->stats.idle_host_sync_ns = 150 * kMs;
  s.sections.get<GpuEpochStats>()->stats.host_syncs = 10;
  const auto a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 0.15 / 0.85, 1e-9);
  EXPECT_NE(a->finding.find("1.0 per step"), std::string::npos) << a->finding;
  // A host blocked while the GPU stays busy (a sync on a long kernel) costs nothing: no advice.
  s.sections.get<GpuEpochStats>()->stats.host_sync_ns = 990 * kMs;
  s.sections.get<GpuEpochStats>()->stats.idle_host_sync_ns = 1 * kMs;
  EXPECT_FALSE(advise_host_sync(s, AdvisorsConfig{}));
}

TEST(GpuAdvisorsTest, PageableCopiesAreFound) {
  EpochSummary s = traced_summary();
  s.sections.get<GpuEpochStats>()->stats.h2d_bytes = 100000000;
  s.sections.get<GpuEpochStats>()->stats.h2d_pageable_bytes = 100000000;
  s.sections.get<GpuEpochStats>()->stats.h2d_pageable_ns = 100 * kMs;
  s.sections.get<GpuEpochStats>()->stats.idle_pageable_copy_ns = 100 * kMs;
  const auto a = advise_pageable_copies(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NE(a->action.find("pin"), std::string::npos);
  s.sections.get<GpuEpochStats>()->stats.idle_pageable_copy_ns =
      1 * kMs;  // 0.1% of the time: below the threshold
  EXPECT_FALSE(advise_pageable_copies(s, AdvisorsConfig{}));
}

TEST(GpuAdvisorsTest, LaunchBoundStepsAreFound) {
  EpochSummary s = traced_summary();
  s.sections.get<GpuEpochStats>()->stats.gpu_utilization = 0.4;
  s.sections.get<GpuEpochStats>()->stats.idle_launch_gap_ns = 500 * kMs;
  const auto a = advise_launch_bound(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 1.0, 1e-9);
  EXPECT_NE(a->finding.find("100 kernels per step"), std::string::npos) << a->finding;
}

TEST(GpuAdvisorsTest, BusyInefficientUsesTheEstimateWithoutCounters) {
  EpochSummary s = traced_summary();
  s.sections.get<GpuEpochStats>()->stats.sm_efficiency = kNotMeasured;
  s.sections.get<GpuEpochStats>()->stats.counter_utilization = kNotMeasured;
  s.sections.get<GpuEpochStats>()->stats.estimated_sm_efficiency = 0.2;
  s.sections.get<GpuEpochStats>()->top_kernels = {
      {"softmax_warp_forward", 100, 600 * kMs, 0.1, 0.1}};
  const auto a = advise_busy_inefficient(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NE(a->finding.find("estimated"), std::string::npos);
  EXPECT_NE(a->cause.find("softmax_warp_forward"), std::string::npos);
  EXPECT_NE(a->action.find("scaled_dot_product_attention"), std::string::npos);
}

// The monitor keeps its PM samples in order of begin and says so: a step's samples are then
// found by binary search, with the same figures as a pass over all of them.
TEST(GpuStepStats, SamplesInOrderGiveTheSameFiguresByBinarySearch) {
  GpuEventBatch ev;
  for (int i = 0; i < 50; ++i) {  // 2-unit samples with gaps every 7th
    if (i % 7 == 3) continue;
    ev.pm.push_back(pm(2 * i, 2 * i + 2, 0.01 * i, 0.5 + 0.005 * i));
  }
  for (const Interval host : {Interval{0, 5}, Interval{3, 4}, Interval{5, 31}, Interval{13, 14},
                              Interval{90, 120}, Interval{-10, 1}, Interval{150, 160}}) {
    SCOPED_TRACE(std::to_string(host.begin) + "-" + std::to_string(host.end));
    ev.pm_by_begin = false;
    const GpuStats all = gpu_step_stats(ev, spans(host, {host.begin, host.begin}, false), 100, 100);
    ev.pm_by_begin = true;
    const GpuStats searched =
        gpu_step_stats(ev, spans(host, {host.begin, host.begin}, false), 100, 100);
    EXPECT_EQ(all.pm_covered_ns, searched.pm_covered_ns);
    if (measured(all.sm_efficiency)) {
      EXPECT_DOUBLE_EQ(all.sm_efficiency, searched.sm_efficiency);
      EXPECT_DOUBLE_EQ(all.counter_utilization, searched.counter_utilization);
    } else {
      EXPECT_FALSE(measured(searched.sm_efficiency));
    }
  }
}

}  // namespace
}  // namespace torchpilot
