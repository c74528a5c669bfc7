// The GPU monitor and GPU advisors on hand-made timelines, through a fake GPU backend (the CUPTI
// backend's own tests are in gpu_backend_test.cpp).
#include "torchpilot/runtime/gpu/gpu_monitor.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <deque>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/cost/cost.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

// The spans of a step whose GPU work ran inside its host span.
inline StepSpans spans(Interval host, Interval wait, bool traced,
                       Nanos trace_from = std::numeric_limits<Nanos>::min()) {
  StepSpans s;
  s.host = host;
  s.data_wait = wait;
  s.traced = traced;
  s.trace_from = trace_from;
  return s;
}

constexpr Nanos kMs = 1000000;

// Hands out whatever the test queued; records what the monitor asked for.
class FakeBackend : public GpuBackend {
 public:
  GpuDeviceInfo info{0, "Fake GPU", "FAKE", 100};
  std::vector<CollectorStatus> statuses{
      {"pm_sampling", true, ""}, {"activity", true, ""}, {"nvml", true, ""}, {"nvtx", true, ""}};
  GpuEventBatch queued;
  bool tracing = false;
  int starts = 0, stops = 0, trace_starts = 0, trace_stops = 0, flushes = 0, releases = 0;
  std::vector<std::string> ranges;  // "+name" / "-"
  int depth = 0;
  // Step markers: off unless a test turns them on; the test resolves them (resolve()) or not.
  bool markers = false;
  std::vector<uint64_t> marker_ids;        // recorded, in order
  std::vector<uint64_t> awaited;           // await_marker() calls
  std::vector<uint64_t> resolved_at_stop;  // markers handed out before each stop_trace()
  std::vector<MarkerRecord> on_await;      // resolved when the monitor awaits (the GPU catches up)
  std::vector<uint64_t> handed_out;

  GpuDeviceInfo device() const override { return info; }
  std::vector<CollectorStatus> status() const override { return statuses; }
  void start() override { ++starts; }
  std::function<void()> on_start_trace;  // e.g. the start's cost on a manual clock
  bool start_trace() override {
    if (on_start_trace) on_start_trace();
    for (const auto& s : statuses) {
      if (s.name == "activity" && !s.active) return false;
    }
    ++trace_starts;
    tracing = true;
    return true;
  }
  void stop_trace() override {
    ++trace_stops;
    tracing = false;
    resolved_at_stop.push_back(handed_out.empty() ? 0 : handed_out.back());
  }
  bool record_marker(uint64_t id) override {
    if (!markers) return false;
    marker_ids.push_back(id);
    return true;
  }
  bool refuse_optional = false;  // as when the last events are kept for step markers
  bool record_optional_marker(uint64_t id) override {
    return !refuse_optional && record_marker(id);
  }
  void await_marker(uint64_t id, Nanos) override {
    awaited.push_back(id);
    for (const MarkerRecord& m : on_await) queued.markers.push_back(m);
    on_await.clear();
  }
  void resolve(uint64_t id, Nanos time) { queued.markers.push_back({id, time}); }
  // slow_release: a release runs (trace_releasing()) until waited for or set done by the test.
  bool slow_release = false, releasing = false;
  int finish_releases = 0;
  void release_trace() override {
    ++releases;
    releasing = slow_release;
  }
  bool trace_releasing() const override { return releasing; }
  void finish_release() override {
    if (releasing) ++finish_releases;
    releasing = false;
  }
  std::function<void()> on_flush;  // e.g. a PM decode's cost on a manual clock
  int flush_requests = 0;
  void flush() override {
    ++flushes;
    if (on_flush) on_flush();
  }
  void request_flush() override { ++flush_requests; }
  void drain(GpuEventBatch& out) override {
    auto move = [](auto& to, auto& from) {
      to.insert(to.end(), from.begin(), from.end());
      from.clear();
    };
    move(out.kernels, queued.kernels);
    move(out.copies, queued.copies);
    move(out.syncs, queued.syncs);
    move(out.pm, queued.pm);
    move(out.nvml, queued.nvml);
    out.pm_final_until = queued.pm_final_until;
    for (const MarkerRecord& m : queued.markers) handed_out.push_back(m.id);
    move(out.markers, queued.markers);
    out.dropped += queued.dropped;
    queued.dropped = 0;
  }
  void stop() override { ++stops; }
  void range_push(const char* name) override {
    ranges.push_back(std::string("+") + name);
    ++depth;
  }
  void range_pop() override {
    ranges.push_back("-");
    --depth;
  }
};

PmSample pm(Nanos b, Nanos e, double sm, double gr = 1.0) {
  PmSample s;
  s.begin = b;
  s.end = e;
  s.sm_efficiency = sm;
  s.counter_utilization = gr;
  s.tensor_activity = 0.0;
  s.dram_throughput = 0.01;
  s.achieved_occupancy = sm / 2;
  s.pcie_read_bytes = 1000;
  return s;
}

KernelRecord kernel(Nanos b, Nanos e, int64_t blocks, std::string name = "k") {
  KernelRecord k;
  k.begin = b;
  k.end = e;
  k.blocks = blocks;
  k.name = std::move(name);
  return k;
}

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
  CopyRecord c;
  c.begin = 1;
  c.end = 2;
  c.bytes = 4096;
  c.kind = CopyKind::kHostToDevice;
  c.pageable = true;
  ev.copies = {c};
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

// --- the monitor inside a Pilot ---------------------------------------------------------------

struct Rig {
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<FakeBackend> backend = std::make_shared<FakeBackend>();
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::ostringstream log;
  std::unique_ptr<Pilot> pilot;

  explicit Rig(Config c = base_config(), bool start = true) {
    if (start) make(std::move(c));
  }
  static Config base_config() {
    Config c;
    c.gpu.trace_first_step = 1000000;  // windows only where a test asks for them
    c.gpu.trace_anomaly_factor = 0;
    c.cost.budget = 1;  // windows open when due; the budget's own tests set one
    return c;
  }
  void make(Config c) {
    PilotOptions o;
    auto logger = std::make_shared<spdlog::logger>(
        "gpu-test", std::make_shared<spdlog::sinks::ostream_sink_st>(log));
    o.logger = logger;
    o.clock = clock;
    o.sinks = {sink};
    if (auto m = make_gpu_monitor(c.gpu, backend, *logger)) o.collectors.push_back(std::move(m));
    pilot = std::make_unique<Pilot>(std::move(c), std::move(o));
  }
  // One step of `ms` ms during which a kernel of `blocks` blocks runs the whole time, sampled.
  void step(Nanos ms, int64_t blocks, double sm) {
    const Nanos b = clock->now_ns();
    auto s = pilot->step(1);
    clock->advance(ms * kMs);
    const Nanos e = clock->now_ns();
    backend->queued.pm.push_back(pm(b, e, sm));
    backend->queued.nvml.push_back({e - 1, 1.0});
    if (backend->tracing) backend->queued.kernels.push_back(kernel(b, e, blocks, "spin_kernel"));
  }
};

TEST(GpuMonitorTest, OneSmKernelIsBusyButInefficientInTheAdvisoryLog) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 3;
  c.gpu.trace_steps = 4;
  Rig rig(c);
  ASSERT_NE(rig.pilot->collector<GpuMonitor>(), nullptr);
  for (int i = 0; i < 12; ++i) rig.step(100, 1, 0.01);
  rig.pilot->end_epoch();

  ASSERT_EQ(rig.sink->epochs.size(), 1u);
  const EpochSummary& s = rig.sink->epochs[0];
  ASSERT_TRUE(s.sections.get<GpuEpochStats>());
  EXPECT_EQ(s.sections.get<GpuEpochStats>()->device, "Fake GPU");
  EXPECT_EQ(s.sections.get<GpuEpochStats>()->traced_steps, 4);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.counter_utilization, 1.0, 1e-9);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.sm_efficiency, 0.01, 1e-9);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.gpu_utilization, 1.0, 1e-9);
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->stats.estimated_sm_efficiency, 0.01, 1e-9);
  ASSERT_FALSE(s.sections.get<GpuEpochStats>()->top_kernels.empty());
  EXPECT_EQ(s.sections.get<GpuEpochStats>()->top_kernels[0].name, "spin_kernel");
  EXPECT_NEAR(s.sections.get<GpuEpochStats>()->top_kernels[0].mean_blocks_per_sm, 0.01, 1e-9);

  const auto& advice = rig.sink->advice[0];
  auto it = std::find_if(advice.begin(), advice.end(),
                         [](const Advice& a) { return a.id == "busy_inefficient"; });
  ASSERT_NE(it, advice.end());
  EXPECT_EQ(it->severity, Severity::kHigh);
  EXPECT_NE(it->cause.find("spin_kernel"), std::string::npos) << it->cause;
  // The bound if every SM were busy (100x here) is evidence, not a promised gain.
  EXPECT_EQ(it->expected_gain, 0.0);
  auto bound = std::find_if(it->evidence.begin(), it->evidence.end(), [](const Evidence& e) {
    return e.name == "gain_bound_if_every_sm_busy";
  });
  ASSERT_NE(bound, it->evidence.end());
  EXPECT_NEAR(bound->value, 99.0, 1e-6);
  // Every step's record was published, the traced ones flagged.
  ASSERT_EQ(rig.sink->late<GpuStepRecord>().size(), 12u);
  int traced = 0;
  for (const auto& r : rig.sink->late<GpuStepRecord>()) traced += r.traced ? 1 : 0;
  EXPECT_EQ(traced, 4);
  EXPECT_TRUE(rig.sink->late<GpuStepRecord>()[3].traced);
  EXPECT_FALSE(rig.sink->late<GpuStepRecord>()[2].traced);
  // The log shows nvidia-smi's number next to the truth.
  EXPECT_NE(rig.log.str().find("utilization 100.0% (NVML 100.0%), SM efficiency 1.0%"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, StepsArePublishedOnceSamplesCoverThem) {
  Rig rig;
  auto s = rig.pilot->step(1);
  rig.clock->advance(10 * kMs);
  s.end();
  EXPECT_TRUE(
      rig.sink->late<GpuStepRecord>().empty());  // no PM sample has reached the step's end yet
  rig.backend->queued.pm.push_back(pm(0, 20 * kMs, 0.5));
  auto s2 = rig.pilot->step(1);
  rig.clock->advance(30 * kMs);
  s2.end();
  ASSERT_EQ(rig.sink->late<GpuStepRecord>().size(),
            1u);  // step 0 only; step 1 ends after the sample
  EXPECT_DOUBLE_EQ(rig.sink->late<GpuStepRecord>()[0].stats.sm_efficiency, 0.5);
  rig.pilot->end_epoch();  // the epoch end finishes the rest with what arrived
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 2u);
}

// A step that lies mostly in a sampling gap (PM sampling restarting after a window's release)
// weighs in the epoch's PM means by the part its samples cover, not by its wall time.
TEST(GpuMonitorTest, EpochPmMeansWeighStepsByTheirSampledTime) {
  Rig rig;
  auto s1 = rig.pilot->step(1);
  rig.clock->advance(100 * kMs);
  s1.end();
  auto s2 = rig.pilot->step(1);
  rig.clock->advance(100 * kMs);
  s2.end();
  rig.backend->queued.pm.push_back(pm(0, 100 * kMs, 0.8, 1.0));
  // The second step: sampled only for its last 10 ms, a sample reading idle.
  rig.backend->queued.pm.push_back(pm(190 * kMs, 200 * kMs, 0.0, 0.0));
  rig.pilot->end_epoch();
  const auto& late = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(late.size(), 2u);
  EXPECT_EQ(late[0].stats.pm_covered_ns, 100 * kMs);
  EXPECT_EQ(late[1].stats.pm_covered_ns, 10 * kMs);
  const GpuStats& g = rig.sink->epochs[0].sections.get<GpuEpochStats>()->stats;
  EXPECT_NEAR(g.sm_efficiency, 0.8 * 100 / 110, 1e-9);  // by wall time it would read 0.4
  EXPECT_NEAR(g.counter_utilization, 100.0 / 110, 1e-9);
  EXPECT_EQ(g.pm_covered_ns, 110 * kMs);
}

TEST(GpuMonitorTest, WindowsOpenAtTheFirstStepAgainEachEpochAndOnRequest) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 2;
  c.gpu.trace_steps = 3;
  c.gpu.trace_every_epochs = 1;
  Rig rig(c);
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.backend->trace_stops, 1);
  // The tail flushes nothing on the training thread: the release's forced flush (off the
  // training thread in the real backend) delivers the window's last records.
  EXPECT_EQ(rig.backend->flushes, 0);
  EXPECT_EQ(rig.backend->releases, 1);  // then CUPTI is detached
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 3);
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 2);
  EXPECT_EQ(rig.sink->epochs[1].sections.get<GpuEpochStats>()->traced_steps, 3);

  rig.pilot->request_window(2);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 3);
  EXPECT_EQ(rig.sink->epochs[2].sections.get<GpuEpochStats>()->traced_steps, 2);
  EXPECT_FALSE(rig.backend->tracing);
}

TEST(GpuMonitorTest, StepsDoNotWaitForPmSamplingThatStoppedAfterAWindow) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 1;
  c.gpu.trace_steps = 1;
  Rig rig(c);
  rig.step(10, 200, 1.0);
  rig.step(10, 200, 1.0);  // traced
  rig.backend->statuses[0] = {"pm_sampling", false, "after releasing the trace: failed"};
  auto s = rig.pilot->step(1);  // no PM samples from here on
  rig.clock->advance(10 * kMs);
  s.end();
  auto s2 = rig.pilot->step(1);  // the release happens at this step's end (tail of 2)
  rig.clock->advance(10 * kMs);
  s2.end();
  auto s3 = rig.pilot->step(1);
  rig.clock->advance(10 * kMs);
  s3.end();
  EXPECT_EQ(rig.backend->releases, 1);
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 5u)
      << "every step published without waiting for samples";
}

TEST(GpuMonitorTest, AWindowArmedAtAnEpochsLastStepOpensInTheNext) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 4;  // armed at the end of step 3, the epoch's last
  c.gpu.trace_steps = 2;
  Rig rig(c);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 0) << "nothing to trace in this epoch";
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 0);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.sink->epochs[1].sections.get<GpuEpochStats>()->traced_steps, 2);
}

TEST(GpuMonitorTest, AWindowsFirstStepIsTracedFromItsScope) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 1;
  c.gpu.trace_steps = 1;
  Rig rig(c);
  rig.step(10, 200, 1.0);
  rig.clock->advance(5 * kMs);  // between the boundary and the scope: not traced
  rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 1);
  EXPECT_EQ(g.stats.traced_ns, 10 * kMs);
  EXPECT_NEAR(g.stats.gpu_utilization, 1.0, 1e-9);
}

TEST(GpuMonitorTest, NoAnomalyWindowDuringAutotune) {
  Config c = Rig::base_config();
  c.mode = Mode::kAutotune;  // no loader: auto-tune waits out its budget of 1000 steps
  c.autotune.warmup_steps = 1000;
  c.autotune.warmup_seconds = 0;
  c.gpu.trace_anomaly_factor = 3;
  Rig rig(c);
  for (int i = 0; i < 70; ++i) rig.step(10, 200, 1.0);
  rig.step(50, 200, 1.0);
  rig.step(10, 200, 1.0);
  EXPECT_FALSE(rig.pilot->tuning_finished());
  EXPECT_EQ(rig.backend->trace_starts, 0);
}

TEST(GpuMonitorTest, StepsStopWaitingForPmSamplesThatStoppedMidEpoch) {
  Rig rig;
  rig.step(10, 200, 1.0);
  rig.backend->statuses[0] = {"pm_sampling", false, "PM sampling stopped: decode failed"};
  for (int i = 0; i < 40; ++i) {
    auto s = rig.pilot->step(1);
    rig.clock->advance(10 * kMs);
  }
  EXPECT_GE(rig.sink->late<GpuStepRecord>().size(), 30u);
}

// gpu.pm_duty < 1: between bursts no PM sample comes, and the backend says up to when the
// samples are all there; steps there are published at once instead of held to the epoch's end.
TEST(GpuMonitorTest, StepsDoNotWaitForPmSamplesWhileSamplingPausesBetweenBursts) {
  Rig rig;
  rig.step(10, 200, 1.0);
  auto unsampled_steps = [&](bool paused) {
    for (int i = 0; i < 20; ++i) {
      if (paused) rig.backend->queued.pm_final_until = rig.clock->now_ns();
      auto s = rig.pilot->step(1);
      rig.clock->advance(10 * kMs);
    }
    return rig.sink->late<GpuStepRecord>().size();
  };
  const size_t held = unsampled_steps(false);  // sampling runs: the steps wait for its samples
  EXPECT_LE(held, 2u);
  EXPECT_GE(unsampled_steps(true), held + 18);
  rig.pilot->end_epoch();
  const auto* g = rig.sink->epochs[0].sections.get<GpuEpochStats>();
  ASSERT_NE(g, nullptr);
  EXPECT_NEAR(g->stats.sm_efficiency, 1.0, 1e-9);  // from the one sampled step alone
}

TEST(GpuMonitorTest, FirstWindowWaitsForAutotune) {
  Config c = Rig::base_config();
  c.mode = Mode::kAutotune;  // no loader: auto-tune waits out its budget, then has nothing to do
  c.autotune.warmup_steps = 4;
  c.autotune.warmup_seconds = 0;
  c.gpu.trace_first_step = 0;
  c.gpu.trace_steps = 2;
  Rig rig(c);
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_TRUE(rig.pilot->tuning_finished());
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 2);
  for (const auto& r : rig.sink->late<GpuStepRecord>()) {
    if (r.traced) EXPECT_GE(r.step, 4) << "traced during the warm-up";
  }
}

TEST(GpuMonitorTest, SlowStepOpensAnAnomalyWindow) {
  Config c = Rig::base_config();
  c.gpu.trace_anomaly_factor = 3;
  c.gpu.trace_steps = 2;
  Rig rig(c);
  for (int i = 0; i < 70; ++i) rig.step(10, 200, 1.0);
  EXPECT_EQ(rig.backend->trace_starts, 0);
  rig.step(50, 200, 1.0);  // 5x the median ...
  rig.step(50, 200, 1.0);  // ... twice in a row: a window is armed ...
  EXPECT_EQ(rig.backend->trace_starts, 0);
  rig.step(10, 200, 1.0);  // ... and opens when the next step begins
  EXPECT_EQ(rig.backend->trace_starts, 1);
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 2);
  // The log says why it fired.
  EXPECT_NE(rig.log.str().find("anomaly trace window: steps 70-71 did 50.00 and 50.00 ms"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, SlowFirstStepsOfEachEpochOpenNoAnomalyWindow) {
  // Issue 15: a stock loader restarts its workers at each epoch: its first steps are slow.
  Config c = Rig::base_config();
  c.gpu.trace_anomaly_factor = 3;
  Rig rig(c);
  for (int epoch = 0; epoch < 6; ++epoch) {
    rig.step(300, 200, 1.0);
    rig.step(200, 200, 1.0);
    for (int i = 0; i < 30; ++i) rig.step(10, 200, 1.0);
    rig.pilot->end_epoch();
  }
  EXPECT_EQ(rig.backend->trace_starts, 0) << rig.log.str();
  const OutlierStats* o = rig.sink->epochs.back().sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->edge_count, 2);
  EXPECT_EQ(o->period, 0);
}

TEST(GpuMonitorTest, ACheckpointEveryNStepsIsAPeriodicStallNotAnAnomaly) {
  // Issue 17: a slow step every 20 steps, in a phase "checkpoint", blocked (little CPU time).
  Config c = Rig::base_config();
  c.gpu.trace_anomaly_factor = 3;
  Rig rig(c, false);
  auto cpu = std::make_shared<ManualClock>();
  {
    PilotOptions o;
    auto logger = std::make_shared<spdlog::logger>(
        "gpu-test", std::make_shared<spdlog::sinks::ostream_sink_st>(rig.log));
    o.logger = logger;
    o.clock = rig.clock;
    o.cpu_clock = cpu;
    o.sinks = {rig.sink};
    if (auto m = make_gpu_monitor(c.gpu, rig.backend, *logger))
      o.collectors.push_back(std::move(m));
    rig.pilot = std::make_unique<Pilot>(c, std::move(o));
  }
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int i = 0; i < 100; ++i) {
      const int64_t step = rig.pilot->steps();
      auto s = rig.pilot->step(1);
      if (step % 20 == 10) {
        auto p = rig.pilot->phase("checkpoint");
        rig.clock->advance(40 * kMs);
        cpu->advance(4 * kMs);
      }
      rig.clock->advance(10 * kMs);
      cpu->advance(9 * kMs);
    }
    rig.pilot->end_epoch();
  }
  EXPECT_EQ(rig.backend->trace_starts, 0) << rig.log.str();
  const EpochSummary& e = rig.sink->epochs.back();
  const OutlierStats* o = e.sections.get<OutlierStats>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->period, 20);
  EXPECT_EQ(o->periodic_count, 5);
  // 5 x 40 ms above the median of a 1,200 ms epoch.
  EXPECT_NEAR(o->periodic_share, 200.0 / 1200.0, 0.01);
  EXPECT_EQ(o->phase, "checkpoint");
  EXPECT_NEAR(o->cpu_share, 0.1, 0.05);
  const auto& advice = rig.sink->advice.back();
  auto it = std::find_if(advice.begin(), advice.end(),
                         [](const Advice& a) { return a.id == "periodic_stall"; });
  ASSERT_NE(it, advice.end());
  EXPECT_NE(it->finding.find("every 20 steps"), std::string::npos) << it->finding;
  EXPECT_NE(it->action.find("checkpoint asynchronously"), std::string::npos) << it->action;
  EXPECT_NEAR(it->expected_gain, 200.0 / 1000.0, 0.01);
  EXPECT_NE(rig.log.str().find("every 20 steps"), std::string::npos);
}

TEST(GpuMonitorTest, BudgetDefersWindowsThatWouldExceedIt) {
  // Issue 15: a window's start costs 100 ms here; steps take 10 ms, epochs 20 steps (0.2 s).
  Config c = Rig::base_config();
  c.cost.budget = 0.01;
  c.gpu.trace_first_step = 5;
  c.gpu.trace_steps = 2;
  c.gpu.trace_every_epochs = 1;
  Rig rig(c, false);
  rig.backend->on_start_trace = [&] { rig.clock->advance(100 * kMs); };
  rig.make(c);
  auto epochs = [&](int n) {
    for (int epoch = 0; epoch < n; ++epoch) {
      for (int i = 0; i < 20; ++i) rig.step(10, 200, 1.0);
      rig.pilot->end_epoch();
    }
  };
  // The first window's estimate (GpuMonitor::kFirstWindowEstimateNs, 50 ms) needs 5 s of run.
  epochs(3);
  EXPECT_EQ(rig.backend->trace_starts, 0) << "a young run has no room for a window";
  const CostStats* first = rig.sink->epochs[0].sections.get<CostStats>();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->deferred, 1);
  EXPECT_LT(first->fraction, 0.01);
  std::string log = rig.log.str();
  EXPECT_NE(log.find("cost budget: the first trace window of 2 steps deferred (about 50.0 ms)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("cost budget:"), log.rfind("cost budget:")) << "one log line";
  epochs(27);  // 6 s
  ASSERT_EQ(rig.backend->trace_starts, 1) << "once 1% of the run has room for 50 ms";
  int opened = -1;
  for (size_t e = 0; e < rig.sink->epochs.size(); ++e) {
    if (rig.sink->epochs[e].sections.get<CostStats>()->step_calls_ns >= 100 * kMs) {
      opened = static_cast<int>(e);
      break;
    }
  }
  EXPECT_GE(opened, 24) << "at about 5 s";
  EXPECT_LE(opened, 26);
  // The repeat's estimate is what the first cost (100 ms): it waits for 1% of the run to hold
  // both (20 s), then runs.
  const CostStats* next =
      rig.sink->epochs[static_cast<size_t>(opened) + 1].sections.get<CostStats>();
  EXPECT_EQ(next->step_calls_ns, 0);
  epochs(110);
  EXPECT_EQ(rig.backend->trace_starts, 2);
  EXPECT_LE(rig.sink->epochs.back().sections.get<CostStats>()->horizon_fraction, 0.0105);
}

TEST(GpuMonitorTest, NvtxRangesAreBalanced) {
  Rig rig;
  {
    auto s = rig.pilot->step(1);
    { auto p = rig.pilot->phase("forward"); }
    auto left_open = rig.pilot->phase("backward");
    rig.clock->advance(kMs);
    s.end();  // the phase scope outlives the step: its range closes with the step
  }
  EXPECT_EQ(rig.backend->depth, 0);
  ASSERT_GE(rig.backend->ranges.size(), 4u);
  EXPECT_EQ(rig.backend->ranges[0], "+step 0");
  EXPECT_EQ(rig.backend->ranges[1], "+forward");
}

TEST(GpuMonitorTest, NoDeviceMeansNoMonitorAndOneLogLine) {
  Rig rig(Rig::base_config(), false);
  rig.backend->info.sm_count = 0;
  rig.backend->statuses = {{"pm_sampling", false, "no GPU driver (libcuda.so.1 not found)"}};
  rig.make(Rig::base_config());
  EXPECT_EQ(rig.pilot->collector<GpuMonitor>(), nullptr);
  EXPECT_NE(rig.log.str().find("GPU collectors off: no GPU driver"), std::string::npos);
  rig.step(10, 1, 0.0);
  rig.pilot->end_epoch();
  EXPECT_FALSE(rig.sink->epochs[0].sections.get<GpuEpochStats>());
}

TEST(GpuDeviceChoiceTest, SetThenLocalRankThenCurrentThenZero) {
  auto choose = [](int configured, const char* local_rank, int visible, int current) {
    const GpuDeviceChoice c = choose_gpu_device(configured, local_rank, visible, current);
    return std::to_string(c.index) + " " + c.source;
  };
  EXPECT_EQ(choose(3, "1", 8, 2), "3 gpu.device");
  EXPECT_EQ(choose(-1, "1", 8, 0), "1 LOCAL_RANK");  // torchrun, one GPU per local rank
  EXPECT_EQ(choose(-1, "1", -1, -1), "0 default");   // no driver to ask: not trusted
  // Each rank sees only its own GPU (CUDA_VISIBLE_DEVICES per rank): LOCAL_RANK is no index.
  EXPECT_EQ(choose(-1, "3", 1, 0), "0 current device");
  EXPECT_EQ(choose(-1, "3", 1, -1), "0 default");
  EXPECT_EQ(choose(-1, nullptr, 4, 2), "2 current device");
  EXPECT_EQ(choose(-1, "", 4, -1), "0 default");
  EXPECT_EQ(choose(-1, "x1", 4, 5), "0 default");  // neither names a visible device
  EXPECT_EQ(choose(-1, "-1", 4, -1), "0 default");
}

namespace {
int probe_visible = -1, probe_current = -1;
void fake_probe(int* visible, int* current) {
  *visible = probe_visible;
  *current = probe_current;
}
// Sets an environment variable for a scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};
}  // namespace

TEST(GpuDeviceChoiceTest, EachRanksPilotObservesItsOwnGpu) {
  const GpuDeviceProbe before = gpu_device_probe();
  register_gpu_device_probe(&fake_probe);
  probe_visible = 2;
  probe_current = 0;
  {
    const ScopedEnv local_rank("LOCAL_RANK", "1");
    Rig rig;  // auto
    EXPECT_EQ(rig.pilot->config().gpu.device, 1);
    EXPECT_NE(rig.log.str().find("observing GPU 1 of 2 (LOCAL_RANK"), std::string::npos)
        << rig.log.str();
    EXPECT_NE(rig.log.str().find("has GPU 0 current, but LOCAL_RANK chose GPU 1"),
              std::string::npos)
        << rig.log.str();
    Config c = Rig::base_config();
    c.gpu.device = 0;  // set: kept
    Rig set(c);
    EXPECT_EQ(set.pilot->config().gpu.device, 0);
  }
  {
    const ScopedEnv local_rank("LOCAL_RANK", nullptr);
    probe_current = 1;  // the trainer chose its GPU before making the Pilot
    Rig rig;
    EXPECT_EQ(rig.pilot->config().gpu.device, 1);
    EXPECT_EQ(rig.log.str().find("current, but"), std::string::npos) << rig.log.str();
    probe_visible = 1;
    probe_current = -1;
    Rig one;  // one GPU, nothing to say
    EXPECT_EQ(one.pilot->config().gpu.device, 0);
    EXPECT_EQ(one.log.str().find("observing GPU"), std::string::npos) << one.log.str();
  }
  register_gpu_device_probe(before);
}

TEST(GpuMonitorTest, WithoutActivityTheCountersStillWork) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 1;
  Rig rig(c, false);
  rig.backend->statuses[1] = {"activity", false, "another CUPTI client is attached"};
  rig.make(c);
  ASSERT_NE(rig.pilot->collector<GpuMonitor>(), nullptr);
  EXPECT_NE(rig.log.str().find("another CUPTI client"), std::string::npos);
  for (int i = 0; i < 5; ++i) rig.step(10, 1, 0.02);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->trace_starts, 0);
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 0);
  EXPECT_NEAR(g.stats.sm_efficiency, 0.02, 1e-9);
  EXPECT_FALSE(measured(g.stats.gpu_utilization));
}

TEST(GpuMonitorTest, ThrowingObserverIsRemovedAndTrainingGoesOn) {
  struct Bad : Collector {
    std::string name() const override { return "bad"; }
    void on_step_end(StepRecord&) override { throw std::runtime_error("boom"); }
    void attach(CollectorHost* host) override { forgotten = host == nullptr; }
    bool forgotten = false;
  } bad;
  Rig rig;
  rig.pilot->add_collector(&bad);
  rig.step(10, 1, 0.5);
  rig.step(10, 1, 0.5);
  EXPECT_NE(rig.log.str().find("collector 'bad' failed in on_step_end and is removed: boom"),
            std::string::npos);
  EXPECT_EQ(rig.sink->steps.size(), 2u);
  EXPECT_TRUE(bad.forgotten) << "a dropped collector must not reach back into the Pilot later";
}

// --- GPU time of a step (step markers) ---------------------------------------------------------

// A trainer that queues its steps ahead: the host spends 1 ms per step, the GPU 10 ms, and
// reaches the boundary after step j - 1 at 10 j ms (boundary 0: the first step's start).
struct AsyncRig : Rig {
  explicit AsyncRig(Config c) : Rig(c, false) {
    backend->markers = true;
    make(std::move(c));
  }
  void host_steps(int n) {
    for (int i = 0; i < n; ++i) {
      auto s = pilot->step(1);
      clock->advance(kMs);
    }
  }
  static Nanos boundary(int64_t j) { return 10 * kMs * j; }
  // A detailed window over steps 1-3.
  static Config window_1_to_3() {
    Config c = Rig::base_config();
    c.gpu.trace_first_step = 1;
    c.gpu.trace_steps = 3;
    return c;
  }
  // The GPU runs steps [from, to): step k has k + 1 kernels and SM efficiency 0.05 (k + 1).
  void gpu_runs(int64_t from, int64_t to) {
    for (int64_t k = from; k < to; ++k) {
      const Nanos b = boundary(k);
      for (int64_t i = 0; i <= k; ++i) {
        backend->queued.kernels.push_back(
            kernel(b + kMs + i * kMs / 2, b + kMs + i * kMs / 2 + 100, 200, "step_kernel"));
      }
      backend->queued.pm.push_back(pm(b, boundary(k + 1), 0.05 * static_cast<double>(k + 1)));
      // Marker ids: the first step's start, then every step's end.
      backend->resolve(backend->marker_ids.at(static_cast<size_t>(k + 1)), boundary(k + 1));
      if (k == 0) backend->resolve(backend->marker_ids.at(0), boundary(0));
    }
  }
};

TEST(GpuMonitorTest, KernelsAndSamplesThatRanAfterTheHostSpanLandOnTheirStep) {
  AsyncRig rig(AsyncRig::window_1_to_3());
  rig.host_steps(8);  // the host is at 8 ms; the GPU has not reached step 0's end
  EXPECT_EQ(rig.backend->marker_ids.size(), 9u) << "one marker per boundary";
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.backend->trace_stops, 0) << "the window's kernels have not run yet";
  EXPECT_TRUE(rig.sink->late<GpuStepRecord>().empty()) << "no step's GPU span is known";

  rig.gpu_runs(0, 8);  // the GPU catches up
  rig.host_steps(1);   // step 8: its end drains the markers and stops the trace
  EXPECT_EQ(rig.backend->trace_stops, 1);
  ASSERT_EQ(rig.backend->resolved_at_stop.size(), 1u);
  EXPECT_GE(rig.backend->resolved_at_stop[0], rig.backend->marker_ids[4])
      << "stopped before the GPU reached the window's last step's end";
  rig.host_steps(1);  // step 9: the tail's end, the trace is released
  EXPECT_EQ(rig.backend->releases, 1);
  rig.gpu_runs(8, 10);
  rig.pilot->end_epoch();

  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(steps.size(), 10u);
  for (const GpuStepRecord& r : steps) {
    SCOPED_TRACE("step " + std::to_string(r.step));
    EXPECT_TRUE(r.gpu_timed);
    EXPECT_EQ(r.gpu_begin_ns, AsyncRig::boundary(r.step));
    EXPECT_EQ(r.gpu_end_ns, AsyncRig::boundary(r.step + 1));
    EXPECT_EQ(r.stats.wall_ns, 10 * kMs);
    EXPECT_NEAR(r.stats.sm_efficiency, 0.05 * static_cast<double>(r.step + 1), 1e-9);
    EXPECT_EQ(r.traced, r.step >= 1 && r.step <= 3);
    if (r.traced) EXPECT_EQ(r.stats.kernels, r.step + 1);
  }
  EXPECT_EQ(steps[9].gpu_lag_ns, AsyncRig::boundary(10) - 10 * kMs);
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.gpu_timed_steps, 10);
  EXPECT_EQ(g.marker_timeouts, 0);
  EXPECT_EQ(g.stats.kernels, 2 + 3 + 4);
  EXPECT_EQ(g.traced_steps, 3);
}

TEST(GpuMonitorTest, PhasesOfTracedStepsGetGpuSpansFromTheirMarkers) {
  Config c = AsyncRig::window_1_to_3();
  c.gpu.trace_steps = 2;  // steps 1 and 2
  AsyncRig rig(c);
  // The host runs each step in 1 ms; the GPU runs step k in [10k, 10k + 10) ms: forward 3 ms,
  // backward 5 ms (in step 2 a nested "clip" takes its last 2), optimizer 1 ms, then 1 ms outside
  // any phase. Each marker recorded is given the GPU time it will resolve at.
  std::vector<std::pair<uint64_t, Nanos>> plan;
  size_t seen = 0;
  auto mark = [&](Nanos gpu_ms) {
    for (; seen < rig.backend->marker_ids.size(); ++seen) {
      plan.emplace_back(rig.backend->marker_ids[seen], gpu_ms * kMs);
    }
  };
  std::vector<size_t> markers_per_step;
  for (int64_t k = 0; k < 6; ++k) {
    const size_t before = rig.backend->marker_ids.size();
    const Nanos g = 10 * k;
    {
      auto s = rig.pilot->step(1);
      mark(g);  // an epoch's first step records its own start
      {
        auto f = rig.pilot->phase("forward");
        mark(g);
        rig.clock->advance(kMs / 4);
      }
      mark(g + 3);
      {
        auto b = rig.pilot->phase("backward");
        mark(g + 3);
        rig.clock->advance(kMs / 4);
        if (k == 2) {
          auto clip = rig.pilot->phase("clip");
          mark(g + 6);
          rig.clock->advance(kMs / 8);
        }
        mark(g + 8);
      }
      mark(g + 8);
      {
        auto o = rig.pilot->phase("optimizer");
        mark(g + 8);
        rig.clock->advance(kMs / 4);
      }
      mark(g + 9);
      rig.clock->advance(kMs / 8);
    }
    mark(g + 10);
    markers_per_step.push_back(rig.backend->marker_ids.size() - before);
    // Kernels: forward busy 2 of its 3 ms, backward all 5, the optimizer none.
    if (k == 1 || k == 2) {
      rig.backend->queued.kernels.push_back(kernel(g * kMs, (g + 2) * kMs, 200, "fwd"));
      rig.backend->queued.kernels.push_back(kernel((g + 3) * kMs, (g + 8) * kMs, 200, "bwd"));
    }
    rig.backend->queued.pm.push_back(pm(g * kMs, (g + 10) * kMs, 0.5));
  }
  // Phase markers only in the traced steps: two per phase there, none elsewhere.
  EXPECT_EQ(markers_per_step, (std::vector<size_t>{2, 7, 9, 1, 1, 1}));
  for (const auto& [id, t] : plan) rig.backend->resolve(id, t);
  rig.pilot->end_epoch();

  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 2);
  EXPECT_EQ(g.phases_gpu.steps, 2);
  EXPECT_EQ(g.phases_gpu.step_gpu_ns, 20 * kMs);
  EXPECT_EQ(g.phases_gpu.covered_ns, 18 * kMs) << "the nested clip counts once";
  ASSERT_EQ(g.phases_gpu.phases.size(), 4u);
  const auto phase = [&](const std::string& name) {
    for (const GpuPhaseStats& p : g.phases_gpu.phases) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no phase " << name;
    return GpuPhaseStats{};
  };
  EXPECT_EQ(g.phases_gpu.phases[0].name, "forward") << "in order of first appearance";
  EXPECT_EQ(phase("forward").count, 2);
  EXPECT_EQ(phase("forward").gpu_ns, 6 * kMs);
  EXPECT_EQ(phase("forward").busy_ns, 4 * kMs);
  EXPECT_EQ(phase("forward").host_ns, kMs / 2) << "the host ran ahead: 0.25 ms a step";
  EXPECT_EQ(phase("backward").gpu_ns, 10 * kMs);
  EXPECT_EQ(phase("backward").busy_ns, 10 * kMs);
  EXPECT_EQ(phase("optimizer").gpu_ns, 2 * kMs);
  EXPECT_EQ(phase("optimizer").busy_ns, 0);
  EXPECT_EQ(phase("clip").count, 1);
  EXPECT_EQ(phase("clip").gpu_ns, 2 * kMs);

  // The section's JSON and the log say the same.
  EXPECT_EQ(nlohmann::json::parse(section_json(g))["device_index"], 0);  // the fake's
  EXPECT_NE(rig.log.str().find("  GPU 0 Fake GPU: utilization"), std::string::npos);
  const auto j = nlohmann::json::parse(section_json(g))["phases_gpu"];
  EXPECT_EQ(j["steps"], 2);
  EXPECT_DOUBLE_EQ(j["step_gpu_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["outside_phases_ms"].get<double>(), 1.0);
  EXPECT_EQ(j["phases"][1]["name"], "backward");
  EXPECT_DOUBLE_EQ(j["phases"][1]["gpu_ms_per_step"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(j["phases"][0]["kernel_busy"].get<double>(), 2.0 / 3);
  EXPECT_NE(rig.log.str().find("GPU time by phase (2 traced steps, 10 ms per step): forward 3 ms "
                               "(30.0%, kernels busy 66.7%, host 0.25 ms)"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, AStepWithAPhaseMarkerMissingIsLeftOutOfThePhaseFigures) {
  Config c = AsyncRig::window_1_to_3();  // steps 1-3 traced
  AsyncRig rig(c);
  rig.host_steps(1);
  // Step 1: backward's end marker is recorded but never resolves (a driver error drops it).
  // Step 2: the backend keeps its last events for step markers: backward's begin is refused.
  // Step 3: every marker resolves.
  std::vector<uint64_t> unresolved;
  for (int k = 1; k <= 3; ++k) {
    auto s = rig.pilot->step(1);
    { auto f = rig.pilot->phase("forward"); }
    rig.backend->refuse_optional = k == 2;
    { auto b = rig.pilot->phase("backward"); }
    rig.backend->refuse_optional = false;
    if (k == 1) unresolved.push_back(rig.backend->marker_ids.back());
  }
  rig.host_steps(3);
  // Step markers are never refused: only the optional ones were.
  EXPECT_EQ(rig.backend->marker_ids.size(), 2u + 5u + 3u + 5u + 3u);
  for (size_t i = 0; i < rig.backend->marker_ids.size(); ++i) {
    const uint64_t id = rig.backend->marker_ids[i];
    if (id != unresolved[0]) rig.backend->resolve(id, static_cast<Nanos>(i) * kMs);
  }
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.traced_steps, 3);
  EXPECT_EQ(g.phases_gpu.steps, 1) << "only step 3 has every phase's span";
  EXPECT_EQ(g.phases_gpu.incomplete_steps, 2);
  ASSERT_EQ(g.phases_gpu.phases.size(), 2u);
  EXPECT_EQ(g.phases_gpu.phases[0].count, 1);
  EXPECT_EQ(g.phases_gpu.phases[1].count, 1);
  EXPECT_NE(rig.log.str().find("2 traced steps left out (a phase marker missing)"),
            std::string::npos)
      << rig.log.str();
}

TEST(GpuMonitorTest, NestedPhasesOfOneNamePairAndTooManyLeaveTheStepOut) {
  Config c = AsyncRig::window_1_to_3();
  c.gpu.trace_steps = 2;  // steps 1-2
  AsyncRig rig(c);
  rig.host_steps(1);
  {
    auto s = rig.pilot->step(1);  // step 1: "block" inside "block"
    const size_t before = rig.backend->marker_ids.size();
    auto outer = rig.pilot->phase("block");
    rig.backend->refuse_optional = true;  // the inner begin is refused ...
    { auto inner = rig.pilot->phase("block"); }
    rig.backend->refuse_optional = false;
    EXPECT_EQ(rig.backend->marker_ids.size(), before + 1) << "... and its end is not the outer's";
    outer.end();
    EXPECT_EQ(rig.backend->marker_ids.size(), before + 2);
  }
  {
    auto s = rig.pilot->step(1);  // step 2: more phases than markers are kept for
    for (int i = 0; i < 70; ++i) auto p = rig.pilot->phase("micro");
  }
  rig.host_steps(3);
  // Step 1: outer begin, outer end (the inner got neither), step end. Step 2: 64 phases' pairs.
  EXPECT_EQ(rig.backend->marker_ids.size(), 2u + 3u + (128u + 1u) + 3u);
  for (size_t i = 0; i < rig.backend->marker_ids.size(); ++i) {
    rig.backend->resolve(rig.backend->marker_ids[i], static_cast<Nanos>(i) * kMs);
  }
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.phases_gpu.steps, 0);
  EXPECT_EQ(g.phases_gpu.incomplete_steps, 2);
  EXPECT_TRUE(g.phases_gpu.phases.empty());
}

TEST(GpuMonitorTest, KernelsDeliveredOutOfOrderLandOnTheirSteps) {
  // CUPTI hands records over buffer by buffer and stream by stream: a drain may bring kernels that
  // started before ones already held. The monitor keeps its kernels in start order (its per-step
  // index relies on it); none may be lost or counted twice.
  AsyncRig rig(AsyncRig::window_1_to_3());
  rig.host_steps(8);
  rig.gpu_runs(0, 8);
  std::vector<KernelRecord> later, earlier;
  for (KernelRecord& k : rig.backend->queued.kernels) {
    (k.begin >= AsyncRig::boundary(2) ? later : earlier).push_back(std::move(k));
  }
  std::reverse(later.begin(), later.end());
  std::reverse(earlier.begin(), earlier.end());
  rig.backend->queued.kernels = later;  // steps 2-7 first, last to first
  rig.host_steps(1);
  rig.backend->queued.kernels = earlier;  // then steps 0-1
  rig.host_steps(1);
  rig.gpu_runs(8, 10);
  rig.pilot->end_epoch();

  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(steps.size(), 10u);
  for (const GpuStepRecord& r : steps) {
    SCOPED_TRACE("step " + std::to_string(r.step));
    EXPECT_EQ(r.traced, r.step >= 1 && r.step <= 3);
    if (!r.traced) continue;
    EXPECT_EQ(r.stats.kernels, r.step + 1);
    // Each kernel runs 100 ns: the step's busy share is its kernels' time, once each.
    EXPECT_NEAR(r.stats.gpu_utilization, static_cast<double>((r.step + 1) * 100) / (10 * kMs),
                1e-12);
  }
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->stats.kernels, 2 + 3 + 4);
}

TEST(GpuMonitorTest, EpochEndWaitsForTheGpuToReachTheLastBoundary) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 2;  // steps 2-4 traced; the epoch ends with the window
  c.gpu.trace_steps = 10;
  AsyncRig rig(c);
  rig.host_steps(5);
  EXPECT_EQ(rig.backend->trace_stops, 0);
  // The GPU reaches the last boundary while the epoch's end waits for it.
  rig.gpu_runs(0, 4);
  const size_t last = rig.backend->marker_ids.size() - 1;
  rig.backend->on_await.push_back({rig.backend->marker_ids[last], AsyncRig::boundary(5)});
  for (int i = 0; i <= 4; ++i) {
    rig.backend->queued.kernels.push_back(kernel(AsyncRig::boundary(4) + kMs + i * 10,
                                                 AsyncRig::boundary(4) + kMs + i * 10 + 5, 200));
  }
  rig.backend->queued.pm.push_back(pm(AsyncRig::boundary(4), AsyncRig::boundary(5), 0.25));
  rig.pilot->end_epoch();
  ASSERT_EQ(rig.backend->awaited.size(), 1u);
  EXPECT_EQ(rig.backend->awaited[0], rig.backend->marker_ids[last]);
  EXPECT_EQ(rig.backend->trace_stops, 1);
  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_TRUE(steps[4].gpu_timed);
  EXPECT_TRUE(steps[4].traced);
  EXPECT_EQ(steps[4].stats.kernels, 5) << "the last traced step's kernels ran after its host span";
  EXPECT_NEAR(steps[4].stats.sm_efficiency, 0.25, 1e-9);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->marker_timeouts, 0);
  // The next epoch's first step records its own start marker.
  const size_t before = rig.backend->marker_ids.size();
  rig.host_steps(1);
  EXPECT_EQ(rig.backend->marker_ids.size(), before + 2);
}

TEST(GpuMonitorTest, MarkersThatNeverResolveFallBackToHostSpansAndHoldNothingForever) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 1;
  c.gpu.trace_steps = 1;
  Rig rig(c, false);
  rig.backend->markers = true;  // recorded, never resolved
  rig.make(c);
  for (int i = 0; i < 5; ++i) rig.step(100, 200, 0.5);
  EXPECT_TRUE(rig.sink->late<GpuStepRecord>().empty()) << "held while the markers may come";
  EXPECT_EQ(rig.backend->trace_stops, 0) << "the window waits for the GPU, boundedly";
  for (int i = 0; i < 25; ++i) rig.step(100, 200, 0.5);  // 3 s of host time
  EXPECT_EQ(rig.backend->trace_stops, 1);
  EXPECT_EQ(rig.backend->releases, 1);
  const auto steps = rig.sink->late<GpuStepRecord>();
  ASSERT_GE(steps.size(), 5u);
  for (const GpuStepRecord& r : steps) {
    EXPECT_FALSE(r.gpu_timed);
    EXPECT_EQ(r.stats.wall_ns, 100 * kMs) << "the host span";
    EXPECT_NEAR(r.stats.sm_efficiency, 0.5, 1e-9);
  }
  rig.pilot->end_epoch();
  // The epoch end waits boundedly (half its budget share, at most 1 s): steps whose markers may
  // still come (under 2 s old) go to the next epoch; none is held forever.
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(rig.backend->awaited.size(), 1u) << "the epoch end waited once, boundedly";
  EXPECT_EQ(g.gpu_timed_steps, 0);
  EXPECT_EQ(g.traced_steps, 1);
  EXPECT_EQ(g.steps + g.carried_steps, 30);
  EXPECT_EQ(g.marker_timeouts, g.steps);
  EXPECT_GT(g.carried_steps, 0);
  EXPECT_EQ(static_cast<int64_t>(rig.sink->late<GpuStepRecord>().size()), g.steps);
  EXPECT_NE(rig.log.str().find("still running go to the next epoch"), std::string::npos)
      << rig.log.str();
  // The run's end publishes them all, with their host spans.
  rig.pilot.reset();
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 30u);
}

// Issue 15: an epoch's end waits for the GPU (and decodes PM samples on the training thread) only
// within its budget share; a short epoch's steps whose figures are not final go to the next.
TEST(GpuMonitorTest, AShortEpochsEndDoesNotWaitItsUnfinishedStepsCountInTheNext) {
  Config c = Rig::base_config();
  c.cost.budget = 0.01;
  Rig rig(c);
  rig.backend->on_flush = [&] { rig.clock->advance(5 * kMs); };  // a 5 ms decode
  for (int i = 0; i < 10; ++i) rig.step(10, 100, 0.5);
  rig.pilot->end_epoch();  // 100 ms: 0.5 ms allowed; the first flush's cost is not known yet
  const auto& g0 = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(rig.backend->flushes, 1);
  EXPECT_EQ(g0.steps, 10);
  EXPECT_EQ(g0.carried_steps, 0);
  EXPECT_EQ(g0.epoch_end_wait_ns, 5 * kMs);
  const CostStats& c0 = *rig.sink->epochs[0].sections.get<CostStats>();
  ASSERT_FALSE(c0.epoch_end_parts.empty());
  EXPECT_EQ(c0.epoch_end_parts[0], std::make_pair(std::string("gpu"), 5 * kMs));

  for (int i = 0; i < 9; ++i) rig.step(10, 100, 0.5);
  const Nanos b = rig.clock->now_ns();
  {
    auto s = rig.pilot->step(1);
    rig.clock->advance(10 * kMs);
  }                        // no sample covers it yet
  rig.pilot->end_epoch();  // a 5 ms flush does not fit in 0.5 ms: the decode thread is asked
  const auto& g1 = *rig.sink->epochs[1].sections.get<GpuEpochStats>();
  EXPECT_EQ(rig.backend->flushes, 1);
  EXPECT_EQ(rig.backend->flush_requests, 1);
  EXPECT_EQ(g1.epoch_end_wait_ns, 0);
  EXPECT_EQ(g1.steps, 9);
  EXPECT_EQ(g1.carried_steps, 1);
  EXPECT_NE(rig.log.str().find("(over 9 steps, 0 of them from earlier epochs; 1 still running go "
                               "to the next epoch)"),
            std::string::npos)
      << rig.log.str();

  rig.backend->queued.pm.push_back(pm(b, b + 10 * kMs, 0.5));  // the decode thread delivers
  for (int i = 0; i < 10; ++i) rig.step(10, 100, 0.5);
  rig.pilot->end_epoch();
  const auto& g2 = *rig.sink->epochs[2].sections.get<GpuEpochStats>();
  EXPECT_EQ(g2.earlier_steps, 1);
  EXPECT_EQ(g2.steps, 11);
  const auto late = rig.sink->late<GpuStepRecord>();
  ASSERT_EQ(late.size(), 30u);
  EXPECT_EQ(late[19].epoch, 1);
  EXPECT_NEAR(late[19].stats.sm_efficiency, 0.5, 1e-9);
}

// An epoch's end waits for a window's release (0.1-0.4 s) only for the run's first window;
// a later window's steps wait for their records and count in the next epoch.
TEST(GpuMonitorTest, AnEpochEndWaitsOnlyForTheFirstWindowsRelease) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 2;
  c.gpu.trace_steps = 3;
  c.gpu.trace_every_epochs = 1;
  Rig rig(c);
  rig.backend->slow_release = true;
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  EXPECT_EQ(rig.backend->finish_releases, 1);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->traced_steps, 3);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->carried_steps, 0);

  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();  // the second window's release still runs: not waited for
  EXPECT_EQ(rig.backend->releases, 2);
  EXPECT_EQ(rig.backend->finish_releases, 1);
  const auto& g1 = *rig.sink->epochs[1].sections.get<GpuEpochStats>();
  EXPECT_EQ(g1.traced_steps, 0);
  EXPECT_EQ(g1.steps, 2) << "the steps before the window";
  EXPECT_EQ(g1.carried_steps, 8) << "the window's and those after it (steps finish in order)";

  rig.backend->releasing = false;  // done
  for (int i = 0; i < 10; ++i) rig.step(10, 200, 1.0);
  rig.pilot->end_epoch();
  const auto& g2 = *rig.sink->epochs[2].sections.get<GpuEpochStats>();
  EXPECT_EQ(g2.earlier_steps, 8);
  EXPECT_GE(g2.traced_steps, 3);
}

// With the default budget the first window's release (0.4 s) is waited for only when the budget
// has room for it; otherwise its figures come with a later epoch.
TEST(GpuMonitorTest, TheFirstWindowsReleaseIsWaitedForOnlyWithRoomInTheBudget) {
  Config c = Rig::base_config();
  c.cost.budget = 0.01;
  c.gpu.trace_first_step = 5;
  c.gpu.trace_steps = 2;
  Rig rig(c);
  rig.backend->slow_release = true;
  auto epoch = [&] {
    for (int i = 0; i < 20; ++i) rig.step(10, 200, 1.0);
    rig.pilot->end_epoch();
  };
  for (int e = 0; e < 30; ++e) epoch();  // the window opens at about 5 s
  EXPECT_EQ(rig.backend->trace_starts, 1);
  EXPECT_EQ(rig.backend->releases, 1);
  EXPECT_EQ(rig.backend->finish_releases, 0) << "0.4 s does not fit in 1% of 6 s";
  int64_t traced = 0;
  for (const auto& s : rig.sink->epochs) traced += s.sections.get<GpuEpochStats>()->traced_steps;
  EXPECT_EQ(traced, 0) << "not final while the release runs";
  rig.backend->releasing = false;  // done
  epoch();
  traced = 0;
  for (const auto& s : rig.sink->epochs) traced += s.sections.get<GpuEpochStats>()->traced_steps;
  EXPECT_EQ(traced, 2);
}

TEST(GpuMonitorTest, WithoutMarkersStepsUseTheirHostSpanAtOnce) {
  Config c = Rig::base_config();
  c.gpu.trace_first_step = 1;
  c.gpu.trace_steps = 1;
  Rig rig(c);  // the fake records no markers (as the unavailable backend)
  for (int i = 0; i < 4; ++i) rig.step(10, 200, 0.5);
  EXPECT_EQ(rig.backend->trace_stops, 1);
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 4u);
  rig.pilot->end_epoch();
  const auto& g = *rig.sink->epochs[0].sections.get<GpuEpochStats>();
  EXPECT_EQ(g.gpu_timed_steps, 0);
  EXPECT_EQ(g.marker_timeouts, 0);
  EXPECT_TRUE(rig.backend->awaited.empty());
  EXPECT_FALSE(rig.sink->late<GpuStepRecord>()[0].gpu_timed);
}

TEST(GpuMonitorTest, StepMarkersOffInTheConfigurationAreNeverRecorded) {
  Config c = Rig::base_config();
  c.gpu.step_markers = false;
  Rig rig(c, false);
  rig.backend->markers = true;
  rig.make(c);
  for (int i = 0; i < 3; ++i) rig.step(10, 200, 0.5);
  rig.pilot->end_epoch();
  EXPECT_TRUE(rig.backend->marker_ids.empty());
  EXPECT_EQ(rig.sink->late<GpuStepRecord>().size(), 3u);
  EXPECT_EQ(rig.sink->epochs[0].sections.get<GpuEpochStats>()->gpu_timed_steps, 0);
}

// --- GPU advisors on planted summaries --------------------------------------------------------

EpochSummary traced_summary() {
  EpochSummary s;
  s.steps = 10;
  s.wall_ns = 1000 * kMs;
  GpuEpochStats e;
  e.device = "Fake GPU";
  e.sm_count = 132;
  e.traced_steps = 10;
  e.stats.wall_ns = s.wall_ns;
  e.stats.traced_ns = s.wall_ns;
  e.stats.counter_utilization = 0.95;
  e.stats.sm_efficiency = 0.9;
  e.stats.gpu_utilization = 0.95;
  e.stats.kernels = 1000;
  e.stats.idle_other_ns = 50 * kMs;
  s.sections.set<GpuEpochStats>(e);
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

}  // namespace
}  // namespace torchpilot
