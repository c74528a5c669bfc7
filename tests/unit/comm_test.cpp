// Collectives' pure parts: bus-bandwidth factors, the CommMonitor's communication and exposed
// time (fake training-thread times, manual clock), stragglers, the store exchange with its
// timeouts, tuning agreed across ranks (simulated ranks on threads), the watchdog, and the three
// communication advisors.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fakes/string_logger.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/comm/comm_monitor.h"
#include "torchpilot/runtime/comm/comm_records.h"
#include "torchpilot/runtime/comm/rank_exchange.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/loader/loader_policy.h"
#include "torchpilot/runtime/tune/trial_engine.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000000;

TEST(CommRecords, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CommOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CommOp::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CommOp::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CommOp::kReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CommOp::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CommOp::kAllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CommOp::kBarrier, 4), 0.0);
}

TEST(CommRecords, OpNamesOfBackendsAndDispatcher) {
  EXPECT_EQ(comm_op_from_name("gloo:all_reduce"), CommOp::kAllReduce);
  EXPECT_EQ(comm_op_from_name("nccl:all_reduce"), CommOp::kAllReduce);
  EXPECT_EQ(comm_op_from_name("c10d::allreduce_"), CommOp::kAllReduce);
  EXPECT_EQ(comm_op_from_name("nccl:_reduce_scatter_base"), CommOp::kReduceScatter);
  EXPECT_EQ(comm_op_from_name("nccl:all_gather_into_tensor_coalesced"), CommOp::kAllGather);
  EXPECT_EQ(comm_op_from_name("gloo:broadcast"), CommOp::kBroadcast);
  EXPECT_EQ(comm_op_from_name("gloo:reduce"), CommOp::kReduce);
  EXPECT_EQ(comm_op_from_name("gloo:barrier"), CommOp::kBarrier);
  EXPECT_EQ(comm_op_from_name("aten::mm"), CommOp::kOther);
}

// A training thread whose CPU time the test sets.
struct FakeThread {
  std::shared_ptr<std::atomic<Nanos>> cpu = std::make_shared<std::atomic<Nanos>>(0);
  std::shared_ptr<std::atomic<Nanos>> runnable = std::make_shared<std::atomic<Nanos>>(0);
  ThreadTimesProbe probe() const {
    auto c = cpu;
    auto r = runnable;
    return [c, r](ThreadTimes& t) {
      t.on_cpu_ns = c->load();
      t.runnable_ns = r->load();
      return true;
    };
  }
};

StepRecord step_record(int64_t step, Nanos begin, Nanos end) {
  StepRecord r;
  r.step = step;
  r.begin_ns = begin;
  r.end_ns = end;
  return r;
}

TEST(CommMonitor, ExposedIsTheTrainingThreadsBlockedTimeWhileCollectivesRun) {
  auto clock = std::make_shared<ManualClock>(0);
  FakeThread thread;
  CommMonitor monitor({thread.probe(), clock});
  monitor.set_group("gloo", 0, 2);
  monitor.on_step_begin(0, 0);
  // Collective A: 0..10 ms, the thread computes 4 ms of it and waits 6 ms.
  const int64_t a =
      monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 4000000, "Float");
  clock->set(4 * kMs);
  thread.cpu->store(4 * kMs);
  // Collective B overlaps: 4..12 ms; the thread waits throughout.
  const int64_t b =
      monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 2000000, "Float");
  clock->set(10 * kMs);
  monitor.collective_end(a);
  EXPECT_EQ(monitor.outstanding().size(), 1u);
  clock->set(12 * kMs);
  monitor.collective_end(b);
  // The thread runs alone (no collective) from 12 to 20 ms.
  clock->set(20 * kMs);
  thread.cpu->store(12 * kMs);
  StepRecord r = step_record(0, 0, 20 * kMs);
  monitor.on_step_end(r);
  EXPECT_DOUBLE_EQ(r.metrics.get("comm", "time_ms"), 12.0);
  EXPECT_DOUBLE_EQ(r.metrics.get("comm", "exposed_ms"), 8.0);
  EXPECT_DOUBLE_EQ(r.metrics.get("comm", "bytes"), 6e6);
  EpochSummary s;
  monitor.on_epoch_end(s);
  const CommEpochStats* c = s.sections.get<CommEpochStats>();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->stats.collectives, 2);
  EXPECT_EQ(c->stats.bytes, 6000000);
  EXPECT_NEAR(c->stats.overlap(), 1.0 - 8.0 / 12.0, 1e-12);
  EXPECT_NEAR(c->exposed_fraction(), 8.0 / 20.0, 1e-12);
  ASSERT_EQ(c->ops.size(), 1u);
  // algbw: 6 MB over 10 + 8 ms of the collectives' own time; busbw x 2(n-1)/n = x1 for 2 ranks.
  EXPECT_NEAR(c->ops[0].algbw, 6e6 / 18e-3, 1.0);
  EXPECT_NEAR(c->busbw, 6e6 / 18e-3, 1.0);
  EXPECT_NE(s.sections.all().front()->json().find("\"exposed_ms\":8.0"), std::string::npos);
}

TEST(CommMonitor, RunnableButPreemptedIsNotExposed) {
  auto clock = std::make_shared<ManualClock>(0);
  FakeThread thread;
  CommMonitor monitor({thread.probe(), clock});
  monitor.on_step_begin(0, 0);
  const int64_t a = monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 8, "Float");
  clock->set(10 * kMs);
  thread.cpu->store(3 * kMs);
  thread.runnable->store(7 * kMs);  // waited for a CPU, not for the collective
  monitor.collective_end(a);
  StepRecord r = step_record(0, 0, 10 * kMs);
  monitor.on_step_end(r);
  EXPECT_DOUBLE_EQ(r.metrics.get("comm", "exposed_ms"), 0.0);
  EXPECT_DOUBLE_EQ(r.metrics.get("comm", "time_ms"), 10.0);
}

TEST(CommMonitor, ACollectiveAcrossAStepBoundaryIsSplit) {
  auto clock = std::make_shared<ManualClock>(0);
  FakeThread thread;
  CommMonitor monitor({thread.probe(), clock});
  monitor.on_step_begin(0, 0);
  clock->set(6 * kMs);
  thread.cpu->store(6 * kMs);
  const int64_t a = monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 8, "Float");
  clock->set(10 * kMs);
  StepRecord r0 = step_record(0, 0, 10 * kMs);
  monitor.on_step_end(r0);
  monitor.on_step_begin(1, 10 * kMs);
  clock->set(13 * kMs);
  monitor.collective_end(a);
  clock->set(20 * kMs);
  thread.cpu->store(13 * kMs);
  StepRecord r1 = step_record(1, 10 * kMs, 20 * kMs);
  monitor.on_step_end(r1);
  EXPECT_DOUBLE_EQ(r0.metrics.get("comm", "time_ms"), 4.0);
  EXPECT_DOUBLE_EQ(r0.metrics.get("comm", "exposed_ms"), 4.0);
  EXPECT_DOUBLE_EQ(r1.metrics.get("comm", "time_ms"), 3.0);
  EXPECT_DOUBLE_EQ(r1.metrics.get("comm", "exposed_ms"), 3.0);
}

TEST(CommMonitor, CountedCollectivesHaveBytesButNoTime) {
  auto clock = std::make_shared<ManualClock>(0);
  CommMonitor monitor({FakeThread().probe(), clock});
  monitor.on_step_begin(0, 0);
  monitor.collective_counted(CommOp::kAllReduce, "nccl:all_reduce", 1024, "BFloat16");
  StepRecord r = step_record(0, 0, kMs);
  monitor.on_step_end(r);
  EXPECT_DOUBLE_EQ(r.metrics.get("comm", "bytes"), 1024);
  EXPECT_DOUBLE_EQ(r.metrics.get("comm", "time_ms"), 0.0);
  EXPECT_EQ(monitor.started(), 1);
}

// A hook that cannot time its collectives on the GPU says so once, in the Pilot's log.
TEST(CommMonitor, GpuTimingUnavailableIsLoggedOnce) {
  std::ostringstream log;
  PilotOptions o;
  o.logger = test::string_logger("comm", log);
  o.clock = std::make_shared<ManualClock>(0);
  auto monitor = std::make_shared<CommMonitor>();
  o.collectors = {monitor};
  Config c;
  c.gpu.enabled = false;
  Pilot pilot(c, std::move(o));
  monitor->gpu_timing_unavailable("getDuration only works if timing was enabled");
  monitor->gpu_timing_unavailable("again");
  const std::string text = log.str();
  EXPECT_NE(text.find("cannot be timed on the GPU (getDuration only works if timing was enabled)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("again"), std::string::npos) << "logged once: " << text;
}

TEST(CommMonitor, GpuTimedSyncsGiveLaunchCountedCollectivesTheirTimeAndExposure) {
  auto clock = std::make_shared<ManualClock>(0);
  CommMonitor monitor({FakeThread().probe(), clock});
  monitor.set_group("nccl", 0, 2);
  monitor.set_link("NVLink, 18 links", 450e9);
  // 4 steps of 10 ms, each one all-reduce of 100 MB counted at launch; the GPU timing of three
  // syncs arrives (a step behind): 2 ms of all-reduce each, 0.5 ms of it exposed.
  for (int s = 0; s < 4; ++s) {
    monitor.on_step_begin(s, s * 10 * kMs);
    monitor.collective_counted(CommOp::kAllReduce, "nccl:all_reduce", 100'000'000, "BFloat16");
    if (s > 0) {
      CommMonitor::GpuTiming t;
      t.collectives = 1;
      t.bytes = 100'000'000;
      t.busy_ns = 2 * kMs;
      t.exposed_ns = kMs / 2;
      monitor.add_gpu_timing(t);
    }
    StepRecord r = step_record(s, s * 10 * kMs, (s + 1) * 10 * kMs);
    monitor.on_step_end(r);
  }
  EpochSummary e;
  monitor.on_epoch_end(e);
  const CommEpochStats* c = e.sections.get<CommEpochStats>();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->gpu_timed_syncs, 3);
  EXPECT_EQ(c->stats.collectives, 4);
  EXPECT_EQ(c->stats.comm_ns, 4 * 2 * kMs);  // per timed sync, for each of the 4 steps
  EXPECT_EQ(c->stats.exposed_ns, 4 * kMs / 2);
  EXPECT_NEAR(c->stats.overlap(), 0.75, 1e-9);
  ASSERT_FALSE(c->ops.empty());
  // 100 MB in 2 ms: 50 GB/s algorithm bandwidth, x 2(n-1)/n = 1 for two ranks.
  EXPECT_NEAR(c->ops.front().algbw, 50e9, 1e6);
  EXPECT_NEAR(c->busbw, 50e9, 1e6);
  EXPECT_NE(c->method.find("GPU time"), std::string::npos) << c->method;
  EXPECT_NE(section_json(*c).find("\"gpu_timed_syncs\":3"), std::string::npos);
}

TEST(CommMonitor, HostTimedCollectivesKeepTheirOwnFigures) {
  auto clock = std::make_shared<ManualClock>(0);
  CommMonitor monitor({FakeThread().probe(), clock});
  monitor.on_step_begin(0, 0);
  const int64_t seq =
      monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 1000, "Float");
  clock->set(3 * kMs);
  monitor.collective_end(seq);
  CommMonitor::GpuTiming t;
  t.collectives = 1;
  t.bytes = 1000;
  t.busy_ns = 9 * kMs;
  monitor.add_gpu_timing(t);
  StepRecord r = step_record(0, 0, 10 * kMs);
  monitor.on_step_end(r);
  EpochSummary e;
  monitor.on_epoch_end(e);
  const CommEpochStats* c = e.sections.get<CommEpochStats>();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->stats.comm_ns, 3 * kMs);
  EXPECT_EQ(c->gpu_timed_syncs, 0);
}

TEST(CommMonitor, RealThreadTimesProbeReadsThisThread) {
  ThreadTimesProbe probe = current_thread_times_probe();
  ASSERT_TRUE(probe);
  ThreadTimes before;
  ASSERT_TRUE(probe(before));
  volatile double x = 0;
  for (int i = 0; i < 2000000; ++i) x = x + std::sqrt(static_cast<double>(i));
  ThreadTimes after;
  ASSERT_TRUE(probe(after));
  EXPECT_GT(after.on_cpu_ns, before.on_cpu_ns);
}

RankSummary rank(int r, double step_ms, double data_ms, double compute_ms, double exposed_ms) {
  RankSummary s;
  s.rank = r;
  s.steps = 10;
  s.step_ns = step_ms * 1e6;
  s.data_wait_ns = data_ms * 1e6;
  s.compute_ns = compute_ms * 1e6;
  s.exposed_ns = exposed_ms * 1e6;
  s.comm_ns = exposed_ms * 1e6;
  return s;
}

TEST(Stragglers, TheSlowRankIsNamedWithItsCauseAndTheOthersWait) {
  // Rank 2 computes 30 ms where the others compute 20 and wait 10 in the all-reduce for it.
  std::vector<RankSummary> ranks = {rank(0, 31, 0.5, 20, 10.5), rank(1, 31, 0.5, 20, 10.5),
                                    rank(2, 31, 0.5, 30, 0.5), rank(3, 31, 0.5, 20.5, 10)};
  auto s = find_stragglers(ranks, 0.1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 2);
  EXPECT_NE(s[0].cause.find("compute"), std::string::npos);
  EXPECT_NEAR(s[0].excess_ns, 10e6, 1e3);
  EXPECT_NEAR(s[0].others_wait_ns, 30e6, 1e3);
  // A data-bound straggler (two ranks).
  auto d = find_stragglers({rank(0, 20, 0, 10, 8), rank(1, 20, 8, 10, 0)}, 0.1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].rank, 1);
  EXPECT_NE(d[0].cause.find("data wait"), std::string::npos);
  // Balanced ranks: none.
  EXPECT_TRUE(find_stragglers({rank(0, 20, 0, 19, 1), rank(1, 20, 0, 19.5, 0.5)}, 0.1).empty());
  // A compute straggler whose SM clock is 20% lower than the others': the clock is the cause.
  std::vector<RankSummary> clocked = ranks;
  for (auto& r : clocked) r.sm_clock_mhz = r.rank == 2 ? 1500 : 1980;
  auto c = find_stragglers(clocked, 0.1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 2);
  EXPECT_NE(c[0].cause.find("lower SM clock (1500 MHz while busy against 1980 MHz"),
            std::string::npos)
      << c[0].cause;
  // Within 5% of the others: not the cause.
  clocked[2].sm_clock_mhz = 1900;
  EXPECT_NE(find_stragglers(clocked, 0.1)[0].cause.find("compute"), std::string::npos);
}

TEST(Stragglers, AStragglerWhoseGpuWaitsForItsHostIsBlamedOnHostWorkNotOnItsKernels) {
  // Two H100 ranks of bench/collectives (commit 287b641), rank 1 with 20 ms of host work per
  // step, overlapped gradient sync: its GPU idles a third of the step, so its epoch SM efficiency
  // (56% against 66%) is low for the idle alone; per busy second its kernels are no slower.
  RankSummary r0 = rank(0, 60.36, 0, 44.35, 16.01), r1 = rank(1, 59.63, 0, 59.54, 0.09);
  r0.gpu_utilization = 0.9931;
  r0.sm_efficiency = 0.6577;
  r1.gpu_utilization = 0.6588;
  r1.sm_efficiency = 0.5627;
  auto s = find_stragglers({r0, r1}, 0.1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_EQ(s[0].cause.rfind("host work (its GPU idle 20.3 ms/step against 0.4", 0), 0u)
      << s[0].cause;
  // The same rank with its GPU as busy as the others' and half their SM efficiency while busy:
  // its kernels are slower.
  r1.gpu_utilization = 0.99;
  r1.sm_efficiency = 0.33;
  s = find_stragglers({r0, r1}, 0.1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].cause.rfind("slower kernels (SM efficiency while busy 33.3% against 66.2%", 0), 0u)
      << s[0].cause;
  // Without GPU figures: compute.
  r1.gpu_utilization = r1.sm_efficiency = kNotMeasured;
  EXPECT_EQ(find_stragglers({r0, r1}, 0.1)[0].cause.rfind("compute", 0), 0u);
}

// Durations of one group's collectives on a rank, in ms.
void add_group(RankSummary& r, int64_t group, std::vector<double> ms) {
  for (size_t i = 0; i < ms.size(); ++i) {
    r.durations.push_back({group, static_cast<int64_t>(i), static_cast<Nanos>(ms[i] * kMs)});
  }
}

TEST(CollectiveWaits, TheEarlyRankWaitsForTheLastOneAtItsLongestCollective) {
  // Overlapped buckets, rank 1 reaching each step's first bucket 20 ms late: rank 0's first
  // all-reduce runs 25 ms (20 of them waiting), later ones less (NCCL runs them in order, so
  // they start after the first). Rank 0 also exposed only 14 ms: part of its wait hid beside
  // its own backward.
  RankSummary a = rank(0, 50, 0, 36, 14), b = rank(1, 50, 0, 48, 2);
  for (int64_t g = 0; g < 3; ++g) {
    add_group(a, g, {25, 9, 5});
    add_group(b, g, {5, 5, 5});
  }
  add_group(a, 3, {40});  // a group rank 1 has no record of: left out
  std::vector<RankSummary> ranks = {a, b};
  set_collective_waits(ranks);
  EXPECT_NEAR(ranks[0].wait_ns, 20 * kMs, 1e3);
  EXPECT_NEAR(ranks[1].wait_ns, 0, 1e3);
  ASSERT_EQ(ranks[0].wait_for_ns.size(), 1u);  // rank 1 only
  EXPECT_NEAR(ranks[0].wait_for_ns.at(1), 20 * kMs, 1e3);
  EXPECT_TRUE(ranks[1].wait_for_ns.empty());
  EXPECT_TRUE(ranks[0].durations.empty());
  // The straggler's wait on the others: the measured 20 ms, not the 14 ms exposed.
  auto s = find_stragglers(ranks, 0.1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_TRUE(s[0].others_wait_from_durations);
  EXPECT_NEAR(s[0].others_wait_ns, 20 * kMs, 1e3);
  RankEpochStats table;
  table.ranks = ranks;
  table.stragglers = s;
  EXPECT_NE(section_json(table).find("\"others_wait_from\":\"collective durations\""),
            std::string::npos);
  EXPECT_EQ(section_json(table).find("durations\":["), std::string::npos);
}

TEST(CollectiveWaits, EachWaitIsBlamedOnTheRankThatArrivedLast) {
  // Three ranks: in group 0 rank 2 arrives last (rank 0 waits 6 ms, rank 1 4 ms); in group 1
  // rank 1 does (rank 0 waits 2 ms, rank 2 8 ms).
  RankSummary r0 = rank(0, 30, 0, 20, 2), r1 = rank(1, 30, 0, 20, 2), r2 = rank(2, 30, 0, 20, 2);
  add_group(r0, 0, {7});
  add_group(r1, 0, {5});
  add_group(r2, 0, {1});
  add_group(r0, 1, {4});
  add_group(r1, 1, {2});
  add_group(r2, 1, {10});
  std::vector<RankSummary> ranks = {r0, r1, r2};
  set_collective_waits(ranks);
  EXPECT_NEAR(ranks[0].wait_ns, 4 * kMs, 1e3);  // (6 + 2) / 2
  EXPECT_NEAR(ranks[0].wait_for_ns.at(2), 3 * kMs, 1e3);
  EXPECT_NEAR(ranks[0].wait_for_ns.at(1), 1 * kMs, 1e3);
  EXPECT_NEAR(ranks[2].wait_for_ns.at(1), 4 * kMs, 1e3);
  EXPECT_NEAR(ranks[1].wait_for_ns.at(2), 2 * kMs, 1e3);
  // Without common groups (or a single rank): not measured; stragglers fall back to exposed.
  std::vector<RankSummary> apart = {rank(0, 30, 0, 20, 8), rank(1, 30, 0, 28, 0)};
  add_group(apart[0], 0, {9});
  add_group(apart[1], 1, {1});
  set_collective_waits(apart);
  EXPECT_TRUE(std::isnan(apart[0].wait_ns));
  EXPECT_TRUE(apart[0].wait_for_ns.empty());
  auto s = find_stragglers(apart, 0.1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_FALSE(s[0].others_wait_from_durations);
  EXPECT_NEAR(s[0].others_wait_ns, 8 * kMs, 1e3);
}

TEST(CommMonitor, CollectiveDurationsAreKeyedByStepOrByGradientSync) {
  auto clock = std::make_shared<ManualClock>(0);
  CommMonitor monitor({FakeThread().probe(), clock});
  // Host-timed: the step they began in and their place in it.
  for (int s = 0; s < 2; ++s) {
    monitor.on_step_begin(s, s * 10 * kMs);
    clock->set(s * 10 * kMs + kMs);
    const int64_t a = monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 8, "Float");
    const int64_t b = monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 8, "Float");
    clock->set(s * 10 * kMs + 3 * kMs);
    monitor.collective_end(b);
    clock->set(s * 10 * kMs + 4 * kMs);
    monitor.collective_end(a);
    StepRecord r = step_record(s, s * 10 * kMs, (s + 1) * 10 * kMs);
    monitor.on_step_end(r);
  }
  // GPU-timed: the sync's number and the order of its collectives.
  CommMonitor::GpuTiming t;
  t.collectives = 2;
  t.sync = 7;
  t.durations = {5 * kMs, 2 * kMs};
  t.busy_ns = 7 * kMs;
  monitor.add_gpu_timing(t);
  EpochSummary e;
  monitor.on_epoch_end(e);
  const CommEpochStats* c = e.sections.get<CommEpochStats>();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->durations.size(), 6u);
  EXPECT_EQ(c->durations[0].group, 0);
  EXPECT_EQ(c->durations[0].index, 1);  // b ended first
  EXPECT_EQ(c->durations[0].duration_ns, 2 * kMs);
  EXPECT_EQ(c->durations[1].index, 0);
  EXPECT_EQ(c->durations[1].duration_ns, 3 * kMs);
  EXPECT_EQ(c->durations[2].group, 1);
  EXPECT_EQ(c->durations[4].group, gpu_sync_group(7));  // never a step's key
  EXPECT_EQ(c->durations[4].duration_ns, 5 * kMs);
  EXPECT_EQ(c->durations[5].index, 1);
  // They reach rank 0 through the exchange's JSON.
  const RankSummary r = summarize_rank(e, 0);
  RankSummary back;
  ASSERT_TRUE(from_json(to_json(r, /*with_durations=*/true), back));
  ASSERT_EQ(back.durations.size(), 6u);
  EXPECT_EQ(back.durations[4].group, gpu_sync_group(7));
  EXPECT_EQ(back.durations[4].duration_ns, 5 * kMs);
  ASSERT_TRUE(from_json(to_json(r), back));
  EXPECT_TRUE(back.durations.empty());
  // A group the cut would split is left out whole: 200 syncs of 3 all-reduces, 512 kept at most.
  for (int i = 0; i < 200; ++i) {
    CommMonitor::GpuTiming u;
    u.sync = 1000 + i;
    u.durations = {kMs, kMs, kMs};
    monitor.add_gpu_timing(u);
  }
  EpochSummary e1;
  monitor.on_epoch_end(e1);
  const CommEpochStats* c1 = e1.sections.get<CommEpochStats>();
  ASSERT_EQ(c1->durations.size(), 510u);  // 170 whole syncs
  EXPECT_EQ(c1->durations.front().index, 0);
  EXPECT_EQ(c1->durations.front().group, gpu_sync_group(1030));
  // Only an epoch's last ones are kept.
  for (int i = 0; i < 3 * static_cast<int>(kMaxCollectiveDurations); ++i) {
    CommMonitor::GpuTiming u;
    u.sync = i;
    u.durations = {kMs};
    monitor.add_gpu_timing(u);
  }
  EpochSummary e2;
  monitor.on_epoch_end(e2);
  const CommEpochStats* c2 = e2.sections.get<CommEpochStats>();
  ASSERT_EQ(c2->durations.size(), kMaxCollectiveDurations);
  EXPECT_EQ(c2->durations.back().group,
            gpu_sync_group(3 * static_cast<int>(kMaxCollectiveDurations) - 1));
}

TEST(RankSummary, AnAsynchronousRanksStepIsItsGpuSpanNotItsHostStep) {
  // Two ranks of one data-parallel run: the host of rank 1 runs further ahead of its GPU, so its
  // host steps are shorter; on the GPU both take 20 ms, 1 ms of it waiting for communication.
  auto epoch = [](double host_ms) {
    EpochSummary e;
    e.steps = 10;
    e.wall_ns = static_cast<Nanos>(10 * host_ms * kMs);
    CommEpochStats c;
    c.steps = 10;
    c.stats.comm_ns = 10 * 3 * kMs;
    c.stats.exposed_ns = 10 * kMs;
    e.sections.set(c);
    GpuEpochStats g;
    g.steps = 10;
    g.gpu_timed_steps = 10;
    g.stats.wall_ns = 10 * 20 * kMs;
    e.sections.set(g);
    return e;
  };
  const RankSummary a = summarize_rank(epoch(20), 0);
  const RankSummary b = summarize_rank(epoch(12), 1);
  EXPECT_DOUBLE_EQ(a.step_ns, 20.0 * kMs);
  EXPECT_DOUBLE_EQ(b.step_ns, 20.0 * kMs);
  EXPECT_DOUBLE_EQ(b.compute_ns, 19.0 * kMs);
  EXPECT_TRUE(find_stragglers({a, b}, 0.1).empty());
  // Without GPU spans: the host's steps.
  EpochSummary host = epoch(12);
  host.sections.set(GpuEpochStats{});
  EXPECT_DOUBLE_EQ(summarize_rank(host, 1).step_ns, 12.0 * kMs);
}

TEST(RankSummaryJson, RoundTrips) {
  RankSummary r = rank(3, 12.5, 1, 10, 1.5);
  r.sm_efficiency = 0.75;
  RankSummary back;
  ASSERT_TRUE(from_json(to_json(r), back));
  EXPECT_EQ(back.rank, 3);
  EXPECT_DOUBLE_EQ(back.step_ns, r.step_ns);
  EXPECT_DOUBLE_EQ(back.sm_efficiency, 0.75);
  EXPECT_TRUE(std::isnan(back.gpu_utilization));
  EXPECT_FALSE(from_json("{\"rank\":1}", back));
  EXPECT_FALSE(from_json("not json", back));
}

TEST(RankExchange, AllGatherAcrossThreadsAndTimeoutAbortsTheFamily) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::optional<std::vector<std::string>>> got(3);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        RankExchange ex(store, r, 3, 5000 * kMs);
        got[r] = ex.all_gather("t", "t/0", "v" + std::to_string(r), nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[r]);
    EXPECT_EQ(*got[r], (std::vector<std::string>{"v0", "v1", "v2"}));
  }
  // Rank 2 never posts "t/1": ranks 0 and 1 time out (bounded), naming it.
  RankExchange r0(store, 0, 3, 100 * kMs);
  std::vector<int> missing;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(r0.all_gather("t", "t/1", "x", &missing));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(missing, (std::vector<int>{1, 2}));
  // Rank 1 and 2 arrive late: the family is aborted, so they stop too, though all values would
  // now be there.
  RankExchange r1(store, 1, 3, 100 * kMs);
  r1.post("t/1", "y");
  RankExchange r2(store, 2, 3, 100 * kMs);
  EXPECT_FALSE(r2.all_gather("t", "t/1", "z", nullptr));
}

TrialWindow window(int64_t trial, double throughput, Nanos mean, bool failed = false) {
  TrialWindow w;
  w.trial = trial;
  w.first_step = 10;
  w.last_step = 19;
  w.throughput = throughput;
  w.mean_step_ns = mean;
  w.window_ns = 10 * mean;
  w.elapsed_ns = 20 * mean;
  w.failed = failed;
  return w;
}

TEST(TrialAgreement, TheSlowestRankGoverns) {
  auto c = combine_trial_windows({window(1, 100, 10), window(1, 80, 12), window(1, 90, 11)});
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->throughput, 80);
  EXPECT_EQ(c->mean_step_ns, 12);
  EXPECT_FALSE(c->failed);
  auto f = combine_trial_windows({window(1, 100, 10), window(1, 80, 12, true)});
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->failed);
  TrialWindow other = window(1, 100, 10);
  other.last_step = 20;
  EXPECT_FALSE(combine_trial_windows({window(1, 100, 10), other}));
  TrialWindow back;
  ASSERT_TRUE(from_json(to_json(*c), back));
  EXPECT_DOUBLE_EQ(back.throughput, 80);
}

// A rank whose step time is a function of its workers knob; rank `slow` needs more workers.
struct SimRank {
  int rank = 0;
  double batch_ms = 40;
  double compute_ms = 10;
  int64_t workers = 0;
  int64_t prefetch = 2;
  KnobRegistry knobs;
  SimRank() {
    knobs.add({"loader.workers",
               {0, 1, 2, 3, 4, 5, 6, 7, 8},
               [this] { return workers; },
               [this](int64_t v) { workers = v; }});
    knobs.add({"loader.prefetch",
               {1, 2, 4, 8},
               [this] { return prefetch; },
               [this](int64_t v) { prefetch = v; }});
  }
  Nanos step_ns() const {
    double ms = std::max(compute_ms, batch_ms / std::max<int64_t>(1, workers));
    if (workers == 0) ms += batch_ms;
    return static_cast<Nanos>(ms * 1e6);
  }
};

AutotuneConfig sim_autotune() {
  AutotuneConfig c;
  c.settle_steps = 2;
  c.measure_steps = 5;
  c.min_window_ms = 120;  // longer than 5 fast steps: windows are extended by agreed rounds
  c.warmup_steps = 400;
  c.warmup_seconds = 0;
  c.max_workers = 8;
  return c;
}

struct RankRun {
  std::optional<TuningDecision> decision;
  std::vector<Nanos> steps_ns;
};

RankRun run_rank(SimRank& sim, std::shared_ptr<KeyValueStore> store, int world, int64_t max_steps,
                 Nanos timeout, int64_t stop_at = -1) {
  auto exchange = std::make_shared<RankExchange>(store, sim.rank, world, timeout);
  TrialEngine engine(sim.knobs, make_loader_policy(sim_autotune()), sim_autotune());
  engine.agreement = make_trial_agreement(exchange, nullptr);
  RankRun out;
  Nanos now = 0;
  for (int64_t s = 0; s < max_steps && !engine.finished(); ++s) {
    if (s == stop_at) return out;  // this rank "dies"
    StepRecord r;
    r.step = s;
    r.begin_ns = now;
    now += sim.step_ns();
    r.end_ns = now;
    r.samples = 32;
    engine.on_step(r);
  }
  out.decision = engine.decision();
  return out;
}

TEST(TrialAgreement, RanksDecideTheSameAtTheSameStepAndTheSlowestGoverns) {
  auto store = std::make_shared<InMemoryStore>();
  SimRank a, b;
  a.rank = 0;
  b.rank = 1;
  b.batch_ms = 80;  // rank 1 needs twice the workers
  RankRun ra, rb;
  std::thread ta([&] { ra = run_rank(a, store, 2, 2000, 10000 * kMs); });
  std::thread tb([&] { rb = run_rank(b, store, 2, 2000, 10000 * kMs); });
  ta.join();
  tb.join();
  ASSERT_TRUE(ra.decision && rb.decision);
  EXPECT_EQ(ra.decision->decided_at_step, rb.decision->decided_at_step);
  EXPECT_EQ(ra.decision->chosen, rb.decision->chosen);
  EXPECT_EQ(a.workers, b.workers);
  // Rank 1 governs: at least 8 workers hide its 80 ms batches behind 10 ms of compute.
  EXPECT_GE(b.workers, 8);
  ASSERT_EQ(ra.decision->trials.size(), rb.decision->trials.size());
  for (size_t i = 0; i < ra.decision->trials.size(); ++i) {
    EXPECT_DOUBLE_EQ(ra.decision->trials[i].throughput, rb.decision->trials[i].throughput);
    EXPECT_EQ(ra.decision->trials[i].last_step, rb.decision->trials[i].last_step);
    EXPECT_EQ(ra.decision->trials[i].confirmation, rb.decision->trials[i].confirmation);
  }
  // The finalists were re-measured on both ranks over the same steps, and both picked the same.
  const auto confirmations = [](const TuningDecision& d) {
    return std::count_if(d.trials.begin(), d.trials.end(),
                         [](const TrialResult& t) { return t.confirmation; });
  };
  EXPECT_GT(confirmations(*ra.decision), 0) << ra.decision->reason;
  EXPECT_EQ(ra.decision->reason, rb.decision->reason);
  EXPECT_EQ(ra.decision->chosen, rb.decision->chosen);
}

TEST(TrialAgreement, ARankMissingTheExchangeLeavesEveryoneWithTheStartingSettings) {
  auto store = std::make_shared<InMemoryStore>();
  SimRank a, b;
  a.rank = 0;
  b.rank = 1;
  RankRun ra, rb;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread ta([&] { ra = run_rank(a, store, 2, 2000, 200 * kMs); });
  std::thread tb([&] { rb = run_rank(b, store, 2, 2000, 200 * kMs, /*stop_at=*/40); });
  ta.join();
  tb.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  ASSERT_TRUE(ra.decision);
  EXPECT_NE(ra.decision->reason.find("missed the tuning exchange"), std::string::npos);
  EXPECT_EQ(a.workers, 0);  // the starting setting
  EXPECT_EQ(ra.decision->chosen, ra.decision->baseline);
}

TEST(RankCollector, RankZeroGathersTheTableAndNamesTheStraggler) {
  auto store = std::make_shared<InMemoryStore>();
  auto e0 = std::make_shared<RankExchange>(store, 0, 2, 2000 * kMs);
  auto e1 = std::make_shared<RankExchange>(store, 1, 2, 2000 * kMs);
  // Rank 0 waits (up to 2 s) for this epoch's table: rank 1 has posted, it comes at once.
  RankCollector c0(e0, 0.1, 2000 * kMs), c1(e1, 0.1);
  auto summary = [](Nanos wait_per_step, Nanos exposed_per_step) {
    EpochSummary s;
    s.epoch = 0;
    s.steps = 10;
    s.wall_ns = 10 * 30 * kMs;
    s.data_wait_ns = 10 * wait_per_step;
    CommEpochStats c;
    c.steps = 10;
    c.stats.comm_ns = 10 * (exposed_per_step + kMs);
    c.stats.exposed_ns = 10 * exposed_per_step;
    s.sections.set(c);
    return s;
  };
  EpochSummary s1 = summary(12 * kMs, 0);  // rank 1 waits for data 12 ms per step
  c1.on_epoch_end(s1);
  EXPECT_EQ(s1.sections.get<RankEpochStats>(), nullptr);  // only rank 0 keeps the table
  EpochSummary s0 = summary(0, 12 * kMs);  // rank 0 waits for rank 1 in the all-reduce
  c0.on_epoch_end(s0);
  const RankEpochStats* r = s0.sections.get<RankEpochStats>();
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->ranks.size(), 2u);
  ASSERT_EQ(r->stragglers.size(), 1u);
  EXPECT_EQ(r->stragglers[0].rank, 1);
  EXPECT_NE(r->stragglers[0].cause.find("data wait"), std::string::npos);
  EXPECT_NEAR(r->stragglers[0].others_wait_ns, 12e6, 1e3);
  EXPECT_EQ(store->size(), 0u);  // rank 0 read the epoch's summaries once and deleted them
  AdvisorsConfig config;
  auto advice = advise_straggler_rank(s0, config);
  ASSERT_TRUE(advice);
  EXPECT_NE(advice->finding.find("rank 1"), std::string::npos);
  EXPECT_GT(advice->expected_gain, 0.5);  // 12 of 30 ms: 1 / (1 - 0.4) - 1
}

TEST(RankCollector, AMissingRankIsReportedAfterTheTimeout) {
  auto store = std::make_shared<InMemoryStore>();
  auto e0 = std::make_shared<RankExchange>(store, 0, 3, 100 * kMs);
  RankCollector c0(e0, 0.1);  // never waits: the table comes with a later epoch
  EpochSummary s;
  s.steps = 5;
  s.wall_ns = 5 * kMs;
  const auto t0 = std::chrono::steady_clock::now();
  c0.on_epoch_end(s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50))
      << "rank 0's training thread does not wait for the missing ranks";
  EXPECT_EQ(s.sections.get<RankEpochStats>(), nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 100 ms timeout
  EpochSummary next = s;
  next.epoch = 1;
  c0.on_epoch_end(next);
  const RankEpochStats* r = next.sections.get<RankEpochStats>();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->epoch, 0);
  EXPECT_EQ(r->missing, (std::vector<int>{1, 2}));
  EXPECT_GE(r->ready_ms, 100);
  std::vector<std::string> lines;
  section_text(*r, next, lines);
  bool said = false;
  for (const auto& l : lines) said = said || l.find("did not report epoch 0") != std::string::npos;
  EXPECT_TRUE(said);
}

// The destructor stops a gather that waits for ranks that never report: the program's exit is
// not held for the exchange timeout.
TEST(RankCollector, AGatherWaitingForAbsentRanksDoesNotHoldTheExit) {
  auto store = std::make_shared<InMemoryStore>();
  auto e0 = std::make_shared<RankExchange>(store, 0, 4, 60000 * kMs);
  const auto t0 = std::chrono::steady_clock::now();
  {
    RankCollector c0(e0, 0.1);
    EpochSummary s;
    s.steps = 5;
    s.wall_ns = 5 * kMs;
    c0.on_epoch_end(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// A hundred ranks' table keeps 32 rows (the straggler among them, the slowest first) and the step
// times' distribution of all: the log and the JSON stay small at a thousand ranks.
TEST(RankCollector, AHundredRanksTableKeepsTheSlowestRowsAndTheDistribution) {
  auto store = std::make_shared<InMemoryStore>();
  constexpr int kRanks = 100;
  for (int r = 1; r < kRanks; ++r) {
    RankExchange e(store, r, kRanks, 2000 * kMs);
    RankSummary s;
    s.rank = r;
    s.steps = 10;
    s.step_ns = (r == 37 ? 60.0 : 30.0 + r * 0.01) * kMs;  // rank 37 straggles
    s.compute_ns = s.step_ns;
    ASSERT_TRUE(e.post("epoch/0", to_json(s)));
  }
  RankCollector c0(std::make_shared<RankExchange>(store, 0, kRanks, 2000 * kMs), 0.1, 2000 * kMs);
  EpochSummary s0;
  s0.steps = 10;
  s0.wall_ns = 10 * 30 * kMs;
  c0.on_epoch_end(s0);
  const RankEpochStats* r = s0.sections.get<RankEpochStats>();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->ranks_reported, kRanks);
  EXPECT_EQ(r->ranks.size(), RankEpochStats::kMaxRankRows);
  EXPECT_EQ(r->ranks_omitted, kRanks - static_cast<int64_t>(RankEpochStats::kMaxRankRows));
  ASSERT_FALSE(r->stragglers.empty());
  EXPECT_EQ(r->stragglers[0].rank, 37);
  bool kept = false;
  for (const RankSummary& x : r->ranks) kept = kept || x.rank == 37;
  EXPECT_TRUE(kept) << "the straggler's row is kept";
  EXPECT_NEAR(r->step_ns_max, 60.0 * kMs, 1);
  std::vector<std::string> lines;
  section_text(*r, s0, lines);
  EXPECT_LT(lines.size(), 40u);
}

// A store that goes away (the TCPStore server's process died): the first call fails the
// exchange for good; rank 0's gatherer and the watchdog both use it, and one line says so; no
// epoch end waits, nothing throws, the Pilot goes on and ends.
class DeadStore : public KeyValueStore {
 public:
  void set(const std::string&, const std::string&) override { fail(); }
  bool check(const std::vector<std::string>&) override { fail(); }
  std::string get(const std::string&) override { fail(); }
  std::atomic<int> calls{0};

 private:
  [[noreturn]] void fail() {
    ++calls;
    throw std::runtime_error("Connection reset by peer");
  }
};

TEST(RankCollector, AStoreThatGoesAwayIsOneLineAndTrainingGoesOn) {
  std::ostringstream log;
  PilotOptions o;
  o.logger = test::string_logger("dead-store", log);
  o.default_collectors = false;
  auto store = std::make_shared<DeadStore>();
  auto exchange = std::make_shared<RankExchange>(store, 0, 4, 60000 * kMs);
  auto monitor = std::make_shared<CommMonitor>();
  o.collectors = {monitor, std::make_shared<RankCollector>(exchange, 0.1)};
  Config c;
  c.gpu.enabled = false;
  const auto t0 = std::chrono::steady_clock::now();
  {
    Pilot pilot(c, o);
    // The watchdog polls every 10 ms and publishes each new collective.
    CommWatchdog dog(exchange, monitor.get(), 40 * kMs,
                     [&](const std::string& m) { pilot.log(LogLevel::kWarn, m); });
    for (int epoch = 0; epoch < 4; ++epoch) {
      for (int i = 0; i < 3; ++i) {
        auto s = pilot.step(1);
        monitor->collective_end(monitor->collective_begin(CommOp::kAllReduce, "x", 64, "Float"));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_NO_THROW(pilot.end_epoch());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  const std::string text = log.str();
  const std::string line = "rank 0: the store failed (Connection reset by peer)";
  const size_t at = text.find(line);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.find("store failed", at + line.size()), std::string::npos) << "one line: " << text;
  EXPECT_EQ(store->calls.load(), 1) << "the dead store is called once, not once per use";
}

TEST(RankExchange, AFailedStoreIsNotCalledAgainAndItsLineIsTakenOnce) {
  auto store = std::make_shared<DeadStore>();
  RankExchange ex(store, 3, 4, 1000 * kMs);
  EXPECT_FALSE(ex.take_failure_line());  // nothing failed yet
  std::string error;
  EXPECT_FALSE(ex.post("a", "1", &error));
  EXPECT_EQ(error, "Connection reset by peer");
  EXPECT_TRUE(ex.failed());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(ex.peek("a", 0, &error));
  EXPECT_NE(error.find("failed earlier"), std::string::npos) << error;
  EXPECT_TRUE(ex.aborted("tune"));
  EXPECT_FALSE(ex.all_gather("tune", "t/0", "x", nullptr));
  const auto got = ex.gather("b", 60000 * kMs);  // would wait a minute for a live store
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_FALSE(got[0]);
  ex.forget("b");
  EXPECT_EQ(store->calls.load(), 1);
  const auto line = ex.take_failure_line();
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("rank 3: the store failed (Connection reset by peer)"), std::string::npos)
      << *line;
  EXPECT_FALSE(ex.take_failure_line());
}

TEST(RankExchange, RankRangesStayShort) {
  EXPECT_EQ(rank_ranges({}), "none");
  EXPECT_EQ(rank_ranges({9, 1, 2, 3, 5, 2}), "1-3, 5, 9");
  std::vector<int> even;
  for (int r = 0; r < 1024; r += 2) even.push_back(r);
  EXPECT_EQ(rank_ranges(even, 3), "0, 2, 4 and 509 more");
}

TEST(CommWatchdog, AnOutstandingCollectiveIsLoggedOnceWithWhoReachedIt) {
  auto store = std::make_shared<InMemoryStore>();
  auto clock = std::make_shared<ManualClock>(0);
  CommMonitor monitor({FakeThread().probe(), clock});
  // Rank 1's last collective is seq 3 (running), rank 2's seq 1 (completed); rank 3 never
  // reported.
  RankExchange(store, 1, 4, kMs)
      .post("coll/last",
            R"({"seq":3,"op":"all_reduce","bytes":4096,"dtype":"Float","done":false})");
  RankExchange(store, 2, 4, kMs)
      .post("coll/last", R"({"seq":1,"op":"all_reduce","bytes":64,"dtype":"Float","done":true})");
  monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 64, "Float");
  const int64_t seq =
      monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 4096, "Float");
  ASSERT_EQ(seq, 2);
  std::vector<std::string> logged;
  std::mutex mu;
  auto exchange = std::make_shared<RankExchange>(store, 0, 4, kMs);
  CommWatchdog dog(exchange, &monitor, 1000 * kMs, [&](const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    logged.push_back(m);
  });
  dog.poll();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(logged.empty());  // not outstanding long enough
  }
  clock->set(1500 * kMs);
  dog.poll();
  dog.poll();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(logged.size(), 2u);  // seq 1 and seq 2, once each
  const std::string& m = logged[1];
  EXPECT_NE(m.find("seq 2 (4096 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("reached by ranks 0-1"), std::string::npos) << m;
  EXPECT_NE(m.find("not reached by rank 2"), std::string::npos) << m;
  EXPECT_NE(m.find("no report from rank 3 (not started, or stopped)"), std::string::npos) << m;
  // Each rank's last collective, as NCCL's flight recorder gives it: the one behind first.
  EXPECT_NE(m.find("last collective entered: rank 2 all_reduce seq 1 (64 bytes, Float, "
                   "completed); rank 0 all_reduce seq 2 (4096 bytes, Float, running); rank 1 "
                   "all_reduce seq 3 (4096 bytes, Float, running)"),
            std::string::npos)
      << m;
  const auto mine = RankExchange(store, 3, 4, kMs).peek("coll/last", 0);
  ASSERT_TRUE(mine);
  EXPECT_NE(mine->find("\"seq\":2"), std::string::npos) << *mine;
}

// A thousand ranks, one behind and 24 silent: the hang report names them in a short line.
TEST(CommWatchdog, AThousandRanksHangReportNamesTheOneBehindInAShortLine) {
  constexpr int kRanks = 1024;
  auto store = std::make_shared<InMemoryStore>();
  for (int r = 1; r < 1000; ++r) {
    RankExchange(store, r, kRanks, kMs)
        .post("coll/last",
              r == 517 ? R"({"seq":4,"op":"all_reduce","bytes":64,"dtype":"Float","done":true})"
                       : R"({"seq":5,"op":"all_reduce","bytes":64,"dtype":"Float","done":false})");
  }
  auto clock = std::make_shared<ManualClock>(0);
  CommMonitor monitor({FakeThread().probe(), clock});
  for (int i = 0; i < 4; ++i) {
    monitor.collective_end(monitor.collective_begin(CommOp::kAllReduce, "x", 64, "Float"));
  }
  ASSERT_EQ(monitor.collective_begin(CommOp::kAllReduce, "x", 64, "Float"), 5);
  std::vector<std::string> logged;
  std::mutex mu;
  CommWatchdog dog(std::make_shared<RankExchange>(store, 0, kRanks, kMs), &monitor, 1000 * kMs,
                   [&](const std::string& m) {
                     std::lock_guard<std::mutex> lock(mu);
                     logged.push_back(m);
                   });
  clock->set(2000 * kMs);
  dog.poll();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(logged.size(), 1u);
  const std::string& m = logged[0];
  EXPECT_NE(m.find("reached by ranks 0-516, 518-999;"), std::string::npos) << m;
  EXPECT_NE(m.find("not reached by rank 517;"), std::string::npos) << m;
  EXPECT_NE(m.find("no report from ranks 1000-1023 (not started, or stopped);"), std::string::npos)
      << m;
  EXPECT_NE(m.find("last collective entered: rank 517 all_reduce seq 4 (64 bytes, Float, "
                   "completed); ranks 0-516, 518-999 all_reduce seq 5"),
            std::string::npos)
      << m;
  EXPECT_LT(m.size(), 500u) << m;
}

// Every rank waiting in a hang reports it; only every 128th of 1,024 reads the others' entries
// (the store would otherwise take a million reads): rank 5 names those ranks and reads none.
class CountingStore : public InMemoryStore {
 public:
  bool check(const std::vector<std::string>& keys) override {
    ++checks;
    return InMemoryStore::check(keys);
  }
  std::atomic<int> checks{0};
};

TEST(CommWatchdog, AtAThousandRanksOnlyEightRanksReadEveryRanksEntry) {
  auto store = std::make_shared<CountingStore>();
  auto clock = std::make_shared<ManualClock>(0);
  CommMonitor monitor({FakeThread().probe(), clock});
  monitor.collective_begin(CommOp::kAllReduce, "x", 64, "Float");
  std::vector<std::string> logged;
  std::mutex mu;
  CommWatchdog dog(std::make_shared<RankExchange>(store, 5, 1024, kMs), &monitor, 1000 * kMs,
                   [&](const std::string& m) {
                     std::lock_guard<std::mutex> lock(mu);
                     logged.push_back(m);
                   });
  clock->set(2000 * kMs);
  dog.poll();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("seq 1 (64 bytes, Float) outstanding for 2 s on rank 5; every rank's "
                           "last collective: in the reports of ranks 0, 128, 256, 384, 512, 640, "
                           "768, 896"),
            std::string::npos)
      << logged[0];
  EXPECT_EQ(store->checks.load(), 0);
}

CommEpochStats comm_epoch(Nanos step_ns, Nanos comm_ns, Nanos exposed_ns, int64_t mean_bytes) {
  CommEpochStats c;
  c.world_size = 2;
  c.steps = 10;
  c.step_wall_ns = 10 * step_ns;
  c.stats.comm_ns = 10 * comm_ns;
  c.stats.exposed_ns = 10 * exposed_ns;
  c.stats.collectives = 40;
  c.stats.bytes = 40 * mean_bytes;
  c.stats.busy_ns = c.stats.comm_ns;
  CommOpStats o;
  o.op = CommOp::kAllReduce;
  o.count = 40;
  o.bytes = 40 * mean_bytes;
  o.busy_ns = c.stats.comm_ns;
  o.algbw = static_cast<double>(o.bytes) / (o.busy_ns / 1e9);
  o.busbw = o.algbw;
  c.ops.push_back(o);
  c.busbw = o.busbw;
  return c;
}

TEST(CommAdvisors, ExposedCommunicationSpeaksWithAGainAndStaysQuietWhenOverlapped) {
  AdvisorsConfig config;
  EpochSummary s;
  s.steps = 10;
  // No overlap: 10 of a 30 ms step exposed; overlapped, the collectives still cost the compute
  // beside them 70% of their time: the step is max(30 - 10 x 0.3, 10) = 27 ms.
  s.sections.set(comm_epoch(30 * kMs, 10 * kMs, 10 * kMs, 64 << 20));
  auto a = advise_exposed_communication(s, config);
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 30.0 / 27.0 - 1, 1e-9);
  EXPECT_NE(a->action.find("GradSync"), std::string::npos);
  // Without interference: max(20, 10) = 20 ms.
  config.exposed_communication.interference = 0;
  a = advise_exposed_communication(s, config);
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 0.5, 1e-9);
  config.exposed_communication.interference = 0.7;
  EpochSummary quiet;
  quiet.steps = 10;
  quiet.sections.set(comm_epoch(30 * kMs, 10 * kMs, kMs / 2, 64 << 20));
  EXPECT_FALSE(advise_exposed_communication(quiet, config));
  EXPECT_FALSE(advise_exposed_communication(EpochSummary{}, config));
  // Rank 0 waits 10 ms for a straggler (rank 1): straggler_rank's finding, not this one.
  EpochSummary waiting = s;
  RankEpochStats ranks;
  Straggler slow;
  slow.rank = 1;
  slow.excess_ns = 10 * kMs;
  ranks.stragglers.push_back(slow);
  waiting.sections.set(ranks);
  EXPECT_FALSE(advise_exposed_communication(waiting, config));
}

TEST(CommAdvisors, LowBusBandwidthForSmallMessagesOrAFarFromPeakLink) {
  AdvisorsConfig config;
  EpochSummary small;
  small.steps = 10;
  small.sections.set(comm_epoch(30 * kMs, 10 * kMs, 10 * kMs, 4096));
  auto a = advise_low_bus_bandwidth(small, config);
  ASSERT_TRUE(a);
  EXPECT_NE(a->cause.find("small"), std::string::npos);
  EXPECT_NE(a->action.find("bucket_mb"), std::string::npos) << "4 all-reduces a step";
  // One all-reduce a step (the whole gradient): no bucket advice, all-reduce less often.
  CommEpochStats one = comm_epoch(30 * kMs, 10 * kMs, 10 * kMs, 4096);
  one.ops[0].count = 10;
  one.ops[0].bytes = 10 * 4096;
  EpochSummary whole;
  whole.steps = 10;
  whole.sections.set(one);
  auto w = advise_low_bus_bandwidth(whole, config);
  ASSERT_TRUE(w);
  EXPECT_NE(w->cause.find("the whole gradient is one all-reduce of 4.1 kB a step"),
            std::string::npos)
      << w->cause;
  EXPECT_EQ(w->action.find("bucket_mb"), std::string::npos) << w->action;
  // Waiting for a straggler is in the collectives' time: no bandwidth finding.
  RankEpochStats ranks;
  Straggler slow;
  slow.rank = 1;
  ranks.stragglers.push_back(slow);
  small.sections.set(ranks);
  EXPECT_FALSE(advise_low_bus_bandwidth(small, config));
  EpochSummary big;
  big.steps = 10;
  CommEpochStats c = comm_epoch(30 * kMs, 10 * kMs, 10 * kMs, 64 << 20);
  EXPECT_FALSE(advise_low_bus_bandwidth(
      [&] {
        EpochSummary e = big;
        e.sections.set(c);
        return e;
      }(),
      config));
  c.link_peak = 100 * c.busbw;  // far below the link's peak
  c.link = "NVLink";
  big.sections.set(c);
  auto b = advise_low_bus_bandwidth(big, config);
  ASSERT_TRUE(b);
  EXPECT_NE(b->cause.find("PCIe"), std::string::npos);
  EXPECT_GT(b->expected_gain, 0);
}

}  // namespace
}  // namespace torchpilot
