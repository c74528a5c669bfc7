// GPU metric math on hand-made kernel timelines with known answers.
#include "torchpilot/runtime/gpu/gpu_metrics.h"

#include <gtest/gtest.h>

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000000;
constexpr int kSms = 132;  // H100 / H200

TEST(IntervalMath, UnionMergesOverlapsAndClipsToTheWindow) {
  const Interval window{0, 100};
  EXPECT_EQ(union_length({}, window), 0);
  EXPECT_EQ(union_length({{10, 20}, {15, 30}, {40, 50}}, window), 30);  // [10,30) + [40,50)
  EXPECT_EQ(union_length({{-50, 10}, {90, 500}}, window), 20);          // clipped at both ends
  EXPECT_EQ(union_length({{20, 10}, {30, 30}}, window), 0);             // empty intervals
  EXPECT_EQ(union_length({{0, 50}, {50, 100}}, window), 100);           // touching
  EXPECT_EQ(union_length({{10, 90}, {20, 30}}, window), 80);            // nested
}

TEST(IntervalMath, IntersectionOfTwoUnions) {
  const Interval window{0, 100};
  EXPECT_EQ(intersection_length({{0, 10}}, {{5, 20}}, window), 5);
  EXPECT_EQ(intersection_length({{0, 10}, {20, 30}}, {{5, 25}}, window), 10);  // 5 + 5
  EXPECT_EQ(intersection_length({{0, 10}, {5, 15}}, {{0, 100}}, window), 15);  // a overlaps itself
  EXPECT_EQ(intersection_length({{0, 10}}, {{10, 20}}, window), 0);            // touching only
  EXPECT_EQ(intersection_length({{90, 200}}, {{95, 300}}, window), 5);         // clipped
}

// The classic: one block on one SM, running all the time. nvidia-smi says 100%.
TEST(GpuWindowMetrics, OneBlockKernelIsBusyButNearlyIdle) {
  const auto m = gpu_window_metrics({{0, 1000 * kMs, 1, false}}, {0, 1000 * kMs}, kSms);
  EXPECT_DOUBLE_EQ(m.gpu_utilization, 1.0);
  EXPECT_NEAR(m.estimated_sm_efficiency, 1.0 / kSms, 1e-12);  // 0.76%
  EXPECT_EQ(m.comm_ns, 0);
  EXPECT_EQ(m.comm_overlap, 0.0);
}

TEST(GpuWindowMetrics, OverlappingKernelsAddUpAndClampAtOne) {
  // [0,10): 66 blocks (0.5). [5,15): 100 blocks (~0.758) -> [5,10) sums past 1: clamped.
  // [15,20): idle. Window 20.
  const std::vector<KernelEvent> k = {{0, 10, 66, false}, {5, 15, 100, false}};
  const auto m = gpu_window_metrics(k, {0, 20}, kSms);
  EXPECT_DOUBLE_EQ(m.gpu_utilization, 15.0 / 20.0);
  const double expected = (5 * 0.5 + 5 * 1.0 + 5 * (100.0 / kSms)) / 20.0;
  EXPECT_NEAR(m.estimated_sm_efficiency, expected, 1e-12);
}

TEST(GpuWindowMetrics, LargeGridsCountAsAFullGpu) {
  const auto m = gpu_window_metrics({{0, 10, 100000, false}}, {0, 40}, kSms);
  EXPECT_DOUBLE_EQ(m.gpu_utilization, 0.25);
  EXPECT_DOUBLE_EQ(m.estimated_sm_efficiency, 0.25);
}

TEST(GpuWindowMetrics, KernelsOutsideTheWindowAreClipped) {
  const std::vector<KernelEvent> k = {
      {-10, 5, kSms, false}, {95, 130, kSms, false}, {200, 300, kSms, false}};
  const auto m = gpu_window_metrics(k, {0, 100}, kSms);
  EXPECT_DOUBLE_EQ(m.gpu_utilization, 0.10);
  EXPECT_DOUBLE_EQ(m.estimated_sm_efficiency, 0.10);
}

TEST(GpuWindowMetrics, CommunicationOverlapAndExposedTime) {
  // All-reduce [0,10) and [30,40); compute [5,35).
  const std::vector<KernelEvent> k = {{0, 10, 8, true}, {30, 40, 8, true}, {5, 35, kSms, false}};
  const auto m = gpu_window_metrics(k, {0, 50}, kSms);
  EXPECT_EQ(m.comm_ns, 20);
  EXPECT_EQ(m.comm_overlapped_ns, 10);
  EXPECT_EQ(m.exposed_comm_ns, 10);
  EXPECT_DOUBLE_EQ(m.comm_overlap, 0.5);
  EXPECT_DOUBLE_EQ(m.gpu_utilization, 40.0 / 50.0);
}

TEST(GpuWindowMetrics, QueuedComputeKernelsHideCommunicationAcrossTheirSwitchGapsButAWaitDoesNot) {
  constexpr Nanos kUs = 1000;
  // Backward: compute kernels of 100 us, 2 us apart (queued), with an all-reduce beside them;
  // then the stream waits 50 us for the last all-reduce before the optimizer's kernel.
  std::vector<KernelEvent> k;
  for (Nanos t = 0; t < 10 * 102 * kUs; t += 102 * kUs)
    k.push_back({t, t + 100 * kUs, kSms, false});
  k.push_back({50 * kUs, 950 * kUs, 8, true});                  // within backward: hidden
  const Nanos end = 9 * 102 * kUs + 100 * kUs;                  // backward's last kernel ends
  k.push_back({end, end + 50 * kUs, 8, true});                  // the wait: exposed
  k.push_back({end + 50 * kUs, end + 150 * kUs, kSms, false});  // optimizer
  const auto m = gpu_window_metrics(k, {0, end + 200 * kUs}, kSms);
  EXPECT_EQ(m.comm_ns, 950 * kUs);
  EXPECT_EQ(m.exposed_comm_ns, 50 * kUs);
  // A gap of kComputeGapBridgeNs or more is not bridged.
  const std::vector<KernelEvent> apart = {{0, 100 * kUs, kSms, false},
                                          {110 * kUs, 200 * kUs, kSms, false},
                                          {50 * kUs, 150 * kUs, 8, true}};
  EXPECT_EQ(gpu_window_metrics(apart, {0, 300 * kUs}, kSms).exposed_comm_ns, 10 * kUs);
  // A short wait: the compute stream resumes 1 us after a collective that ends in its 5 us gap
  // (that 1 us is the stream's resume: not communication's).
  const std::vector<KernelEvent> waited = {{0, 100 * kUs, kSms, false},
                                           {105 * kUs, 200 * kUs, kSms, false},
                                           {90 * kUs, 104 * kUs, 8, true}};
  EXPECT_EQ(gpu_window_metrics(waited, {0, 300 * kUs}, kSms).exposed_comm_ns, 4 * kUs);
}

TEST(GpuWindowMetrics, IdleGapsBeforeACollectiveAreCommunicationAndCopiesAreWork) {
  constexpr Nanos kUs = 1000;
  // All-reduces after backward (no overlap), as on an H100 pair: compute ends at 100 us, the
  // first all-reduce starts 10 us later, the next ones 10 us apart, the optimizer's kernel 7 us
  // after the last. Before each all-reduce the gap is its launch's: 10 + 3 x 100 + 2 x 10 us.
  std::vector<KernelEvent> k = {{0, 100 * kUs, kSms, false},
                                {110 * kUs, 210 * kUs, 8, true},
                                {220 * kUs, 320 * kUs, 8, true},
                                {330 * kUs, 430 * kUs, 8, true},
                                {437 * kUs, 500 * kUs, kSms, false}};
  const auto m = gpu_window_metrics(k, {0, 600 * kUs}, kSms);
  EXPECT_EQ(m.exposed_comm_ns, 330 * kUs);
  EXPECT_EQ(m.comm_ns, 330 * kUs);
  EXPECT_DOUBLE_EQ(m.comm_overlap, 0.0);
  EXPECT_DOUBLE_EQ(m.gpu_utilization, (100 + 300 + 63) / 600.0);  // kernels only, as before
  // An idle gap of kCommGapBridgeNs or more is not communication's (the host was late), nor is
  // one between two compute kernels.
  k[1] = {100 * kUs + kCommGapBridgeNs, 210 * kUs, 8, true};
  k.push_back({520 * kUs, 530 * kUs, kSms, false});
  EXPECT_EQ(gpu_window_metrics(k, {0, 600 * kUs}, kSms).exposed_comm_ns,
            330 * kUs - kCommGapBridgeNs);
  // A copy (the bucket's, before its all-reduce) is work: the all-reduce's part beside it is
  // hidden. Without the copy, the 5 us idle before the all-reduce is its launch.
  const std::vector<KernelEvent> beside = {{0, 100 * kUs, kSms, false},
                                           {105 * kUs, 200 * kUs, 8, true}};
  EXPECT_EQ(gpu_window_metrics(beside, {0, 300 * kUs}, kSms).exposed_comm_ns, 100 * kUs);
  EXPECT_EQ(
      gpu_window_metrics(beside, {0, 300 * kUs}, kSms, {{100 * kUs, 150 * kUs}}).exposed_comm_ns,
      50 * kUs);
  // A short copy: the 3 us idle between its end and the all-reduce's start is the launch's.
  EXPECT_EQ(
      gpu_window_metrics(beside, {0, 300 * kUs}, kSms, {{100 * kUs, 102 * kUs}}).exposed_comm_ns,
      98 * kUs);
  // A collective starting in a compute switch gap (6 us, bridged): that idle is the switch's, not
  // the launch's; communication is the kernel alone.
  const std::vector<KernelEvent> in_switch = {{0, 100 * kUs, kSms, false},
                                              {106 * kUs, 200 * kUs, kSms, false},
                                              {104 * kUs, 300 * kUs, 8, true}};
  const auto s = gpu_window_metrics(in_switch, {0, 400 * kUs}, kSms);
  EXPECT_EQ(s.comm_ns, 196 * kUs);
  EXPECT_EQ(s.exposed_comm_ns, 100 * kUs);
}

TEST(GpuWindowMetrics, EmptyInputsAreZero) {
  EXPECT_EQ(gpu_window_metrics({}, {0, 100}, kSms).gpu_utilization, 0.0);
  EXPECT_EQ(gpu_window_metrics({{0, 10, 1, false}}, {10, 10}, kSms).window_ns, 0);
  EXPECT_EQ(gpu_window_metrics({{0, 10, 1, false}}, {0, 10}, 0).gpu_utilization, 0.0);
}

}  // namespace
}  // namespace torchpilot
