// CUPTI output replayed through the pure converters (fixture tests in dynolog's style): activity
// records as CUPTI delivered them -> convert_record, PM samples as the decoder saw them ->
// to_pm_sample, then per-step figures with gpu_step_stats. Two fixtures:
//   - a synthetic one, written here from hand-made CUPTI structs in the capture format (so the
//     writer, the parser and the replay run on every CI machine), with exact expected values;
//   - the one captured on a GPU machine in tests/fixtures/cupti/ by hooks/gpu/cupti_capture.cpp
//     (build-gpu/bench/cupti_capture --out tests/fixtures/cupti); skipped while it is absent.
// Both go through the same consistency checks (check_fixture).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "fakes/cupti_records.h"
#include "fakes/gpu_records.h"
#include "torchpilot/hooks/gpu/cupti_activity_trace.h"
#include "torchpilot/hooks/gpu/cupti_api.h"
#include "torchpilot/hooks/gpu/cupti_fixture.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace detail {
namespace {

using test::spans;

namespace fx = cupti_fixture;

const char* kCaptureCommand = "build-gpu/bench/cupti_capture --out tests/fixtures/cupti";

bool metric_by_name(const std::string& name, PmMetric* out) {
  for (PmMetric m :
       {PmMetric::kCounterUtilization, PmMetric::kSmEfficiency, PmMetric::kTensorActivity,
        PmMetric::kDramThroughput, PmMetric::kAchievedOccupancy, PmMetric::kPcieReadBytes,
        PmMetric::kPcieWriteBytes}) {
    if (name == pm_metric_name(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

struct Replayed {
  GpuEventBatch events;
  size_t converted = 0;
  size_t wait_event_syncs = 0;        // STREAM_WAIT_EVENT: not host-blocking, never converted
  std::vector<std::string> failures;  // other records that did not convert
  size_t pm_discarded = 0;            // the first sample after start, as the sampler does
  std::vector<std::string> unknown_metrics;
};

// The fixture through the converters, with its own TimeBase.
Replayed replay(const fx::Fixture& f) {
  Replayed out;
  const TimeBase tb{f.info.time_base_offset_ns};
  DemangleCache names;
  for (size_t i = 0; i < f.records.size(); ++i) {
    const fx::ReplayRecord& r = f.records[i];
    if (convert_record(r.record(), tb, out.events, &names)) {
      ++out.converted;
    } else if (r.kind() == CUPTI_ACTIVITY_KIND_SYNCHRONIZATION &&
               r.as<CUpti_ActivitySynchronization2>().type ==
                   CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT) {
      ++out.wait_event_syncs;
    } else {
      out.failures.push_back("record " + std::to_string(i) + " (kind " +
                             std::to_string(static_cast<int>(r.kind())) + ")");
    }
  }
  for (const fx::PmLine& s : f.pm) {
    if (s.first) {
      ++out.pm_discarded;
      continue;
    }
    std::vector<PmMetric> metrics;
    std::vector<double> values;
    for (const auto& [name, v] : s.values) {
      PmMetric m;
      if (!metric_by_name(name, &m)) {
        out.unknown_metrics.push_back(name);
        continue;
      }
      metrics.push_back(m);
      values.push_back(v);
    }
    out.events.pm.push_back(to_pm_sample(metrics, values.data(), s.start, s.end, tb));
  }
  return out;
}

bool fraction_or_nan(double v) { return std::isnan(v) || (v >= 0.0 && v <= 1.0); }

// What any fixture of the capture workload must satisfy: every record converts (but
// `expected_failures`), kernels have
// names and positive durations, each traced step has its pageable H2D copy and its .item() D2H
// copy and sync, PM fractions lie in [0, 1], the TimeBase puts records inside the steps, and over
// the traced steps PM SM activity agrees with the trace's kernel busy time within `tolerance`.
void check_fixture(const fx::Fixture& f, double tolerance, size_t expected_failures = 0) {
  const fx::CaptureInfo& info = f.info;
  const Replayed r = replay(f);
  const GpuEventBatch& e = r.events;
  EXPECT_EQ(r.failures.size(), expected_failures)
      << "records that did not convert, first " << r.failures.front();
  EXPECT_TRUE(r.unknown_metrics.empty()) << "unknown metric " << r.unknown_metrics.front();
  EXPECT_EQ(r.converted + r.wait_event_syncs + r.failures.size(), f.records.size());
  ASSERT_FALSE(info.steps.empty());
  ASSERT_GT(info.sm_count, 0);

  // Records.
  ASSERT_FALSE(e.kernels.empty());
  for (const KernelRecord& k : e.kernels) {
    EXPECT_GT(k.end, k.begin) << k.name;
    EXPECT_FALSE(k.name.empty());
    EXPECT_NE(k.name, "<unknown>");
    EXPECT_GT(k.blocks, 0) << k.name;
    EXPECT_GT(k.block_threads, 0) << k.name;
  }
  for (const CopyRecord& c : e.copies) {
    EXPECT_GE(c.end, c.begin);
    EXPECT_GT(c.bytes, 0);
  }
  for (const SyncRecord& s : e.syncs) EXPECT_GE(s.end, s.begin);

  // The TimeBase: the trace's records fall inside the traced steps (with a margin for the last
  // kernels still running at a step's end).
  Nanos traced_begin = 0, traced_end = 0;
  for (const fx::StepSpan& s : info.steps) {
    if (!s.traced) continue;
    if (traced_begin == 0) traced_begin = s.begin;
    traced_end = s.end;
  }
  ASSERT_NE(traced_begin, 0) << "no traced step";
  traced_begin = std::min<Nanos>(traced_begin, info.trace_from);
  for (const KernelRecord& k : e.kernels) {
    EXPECT_GE(k.begin, traced_begin - 1'000'000) << k.name;
    EXPECT_LE(k.end, traced_end + 100'000'000) << k.name;
  }

  // PM samples: ordered, positive length, fractions in [0, 1], SM and GR measured.
  ASSERT_FALSE(e.pm.empty());
  for (size_t i = 0; i < e.pm.size(); ++i) {
    const PmSample& s = e.pm[i];
    EXPECT_GT(s.end, s.begin) << i;
    if (i > 0) {
      EXPECT_GE(s.begin, e.pm[i - 1].begin) << i;
    }
    EXPECT_TRUE(measured(s.sm_efficiency)) << i;
    EXPECT_TRUE(measured(s.counter_utilization)) << i;
    for (double v : {s.counter_utilization, s.sm_efficiency, s.tensor_activity, s.dram_throughput,
                     s.achieved_occupancy}) {
      EXPECT_TRUE(fraction_or_nan(v)) << "sample " << i << ": " << v;
    }
    EXPECT_TRUE(std::isnan(s.pcie_read_bytes) || s.pcie_read_bytes >= 0) << i;
    EXPECT_TRUE(std::isnan(s.pcie_write_bytes) || s.pcie_write_bytes >= 0) << i;
  }
  EXPECT_LT(e.pm.front().begin, info.steps.back().end);
  EXPECT_GT(e.pm.back().end, info.steps.front().begin);

  // Per step.
  double wall = 0, busy = 0, sm = 0, gr = 0;
  int traced_steps = 0, untraced_with_pm = 0;
  for (const fx::StepSpan& s : info.steps) {
    const Interval span{s.begin, s.end};
    const GpuStats g = gpu_step_stats(
        e, spans(span, Interval{}, s.traced, s.traced ? info.trace_from : 0), info.sm_count, 0);
    if (!s.traced) {
      EXPECT_EQ(g.traced_ns, 0);
      if (measured(g.sm_efficiency)) ++untraced_with_pm;
      continue;
    }
    ++traced_steps;
    EXPECT_GT(g.kernels, 0) << "step " << s.step;
    EXPECT_GT(g.gpu_utilization, 0) << "step " << s.step;
    EXPECT_LE(g.gpu_utilization, 1) << "step " << s.step;
    EXPECT_GE(g.host_syncs, 1) << "step " << s.step;
    // The workload's copies: one pageable H2D copy of h2d_pageable_bytes, and .item()'s D2H.
    EXPECT_EQ(g.h2d_bytes, info.h2d_pageable_bytes) << "step " << s.step;
    EXPECT_EQ(g.h2d_pageable_bytes, info.h2d_pageable_bytes) << "step " << s.step;
    int h2d = 0, d2h = 0;
    for (const CopyRecord& c : e.copies) {
      if (c.memset || c.begin < span.begin || c.begin >= span.end) continue;
      if (c.kind == CopyKind::kHostToDevice && c.bytes == info.h2d_pageable_bytes) {
        EXPECT_TRUE(c.pageable) << "step " << s.step;
        ++h2d;
      }
      if (c.kind == CopyKind::kDeviceToHost && c.bytes == info.d2h_item_bytes) ++d2h;
    }
    EXPECT_EQ(h2d, 1) << "step " << s.step;
    EXPECT_GE(d2h, 1) << "step " << s.step;
    if (!measured(g.sm_efficiency) || !measured(g.counter_utilization)) continue;
    const double w = static_cast<double>(g.traced_ns);
    wall += w;
    busy += g.gpu_utilization * w;
    sm += g.sm_efficiency * w;
    gr += g.counter_utilization * w;
  }
  EXPECT_GT(traced_steps, 0);
  if (info.steps.size() > static_cast<size_t>(traced_steps)) {
    EXPECT_GT(untraced_with_pm, 0) << "PM samples cover untraced steps too";
  }
  ASSERT_GT(wall, 0) << "no traced step with PM samples";
  busy /= wall;
  sm /= wall;
  gr /= wall;
  EXPECT_NEAR(sm, busy, tolerance) << "PM SM active vs trace busy over the traced steps";
  EXPECT_NEAR(gr, busy, tolerance) << "PM GR active vs trace busy over the traced steps";
}

// --- The synthetic fixture -------------------------------------------------------------------

constexpr int64_t kOffset = 1'700'000'000'000'000'000;  // CUPTI (CLOCK_REALTIME) - steady
constexpr uint64_t kCupti = static_cast<uint64_t>(kOffset);

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("torchpilot_cupti_replay_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

template <class R>
R zeroed() {
  R r;
  std::memset(&r, 0, sizeof r);
  return r;
}

// The activity.jsonl line of a hand-made record.
template <class R>
std::string line_of(const R& record) {
  return fx::activity_line(*static_cast<const CUpti_Activity*>(static_cast<const void*>(&record)));
}

// One step [1 ms, 11 ms) on the steady clock: a 4 ms kernel, a pageable 4 KiB H2D copy, a 4-byte
// pinned D2H copy, a memset, a stream sync; a kernel CUPTI left without timestamps and a
// cudaStreamWaitEvent (neither converts). PM: the discarded first sample, then 80% SM active for
// the first half of the step and 0% for the second.
std::vector<std::string> synthetic_activity() {
  std::vector<std::string> lines;
  auto k = test::cupti_kernel(kCupti + 2'000'000, kCupti + 6'000'000,
                              "_Z9my_kernelILi4EN2at4HalfEEvPT0_i", 264, 256);
  k.streamId = 7;
  k.pAccessPolicyWindow = reinterpret_cast<CUaccessPolicyWindow*>(0xdead0000);  // cleared
  lines.push_back(line_of(k));
  auto lost = k;
  lost.kind = CUPTI_ACTIVITY_KIND_KERNEL;
  lost.start = lost.end = 0;  // out of device memory for timestamps
  lines.push_back(line_of(lost));
  lines.push_back(line_of(test::cupti_memcpy(
      CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
      CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 4096, kCupti + 1'100'000, kCupti + 1'300'000)));
  lines.push_back(line_of(test::cupti_memcpy(
      CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
      CUPTI_ACTIVITY_MEMORY_KIND_PINNED, 4, kCupti + 6'100'000, kCupti + 6'200'000)));
  auto ms = zeroed<CUpti_ActivityMemset4>();
  ms.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  ms.bytes = 256;
  ms.start = kCupti + 1'500'000;
  ms.end = kCupti + 1'600'000;
  lines.push_back(line_of(ms));
  auto sync = zeroed<CUpti_ActivitySynchronization2>();
  sync.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
  sync.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
  sync.start = kCupti + 6'000'000;
  sync.end = kCupti + 6'300'000;
  lines.push_back(line_of(sync));
  auto wait = sync;
  wait.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT;
  lines.push_back(line_of(wait));
  return lines;
}

fx::PmLine pm_sample(uint64_t start, uint64_t end, double sm_pct, bool first = false) {
  fx::PmLine s;
  s.start = kCupti + start;
  s.end = kCupti + end;
  s.first = first;
  s.values = {{pm_metric_name(PmMetric::kCounterUtilization), sm_pct + 1},
              {pm_metric_name(PmMetric::kSmEfficiency), sm_pct},
              {pm_metric_name(PmMetric::kTensorActivity), std::nan("")},
              {pm_metric_name(PmMetric::kDramThroughput), 104.0},  // above 100: clamped
              {pm_metric_name(PmMetric::kAchievedOccupancy), 40.0},
              {pm_metric_name(PmMetric::kPcieReadBytes), 1000.0},
              {pm_metric_name(PmMetric::kPcieWriteBytes), -5.0}};  // negative: 0
  return s;
}

fx::CaptureInfo synthetic_info() {
  fx::CaptureInfo info;
  info.device = "synthetic";
  info.chip = "GH100";
  info.sm_count = 132;
  info.cupti_version = CUPTI_API_VERSION;
  info.time_base_offset_ns = kOffset;
  info.time_base_offset_after_ns = kOffset;
  info.pm_interval_ms = 5;
  info.pm_metrics = {pm_metric_name(PmMetric::kCounterUtilization),
                     pm_metric_name(PmMetric::kSmEfficiency)};
  info.h2d_pageable_bytes = 4096;
  info.d2h_item_bytes = 4;
  info.steps = {{0, 1'000'000, 11'000'000, true}};
  info.trace_from = 1'000'000;
  info.activity_records = 7;
  info.pm_samples = 3;
  return info;
}

TEST(CuptiReplay, SyntheticFixtureRoundTripsExactly) {
  TempDir dir;
  const std::vector<std::string> activity = synthetic_activity();
  const std::vector<std::string> pm = {fx::pm_line(pm_sample(0, 1'000'000, 99, true)),
                                       fx::pm_line(pm_sample(1'000'000, 6'000'000, 80)),
                                       fx::pm_line(pm_sample(6'000'000, 11'000'000, 0))};
  std::string error;
  ASSERT_TRUE(fx::write_fixture(dir.str(), synthetic_info(), activity, pm, &error)) << error;
  ASSERT_TRUE(fx::fixture_present(dir.str()));

  fx::Fixture f;
  ASSERT_TRUE(fx::read_fixture(dir.str(), &f, &error)) << error;
  EXPECT_EQ(f.info.device, "synthetic");
  EXPECT_EQ(f.info.time_base_offset_ns, kOffset);
  ASSERT_EQ(f.info.steps.size(), 1u);
  EXPECT_EQ(f.info.steps[0].end, 11'000'000);
  ASSERT_EQ(f.records.size(), 7u);
  ASSERT_EQ(f.pm.size(), 3u);
  EXPECT_TRUE(f.pm[0].first);
  EXPECT_EQ(f.records[0].name(), "_Z9my_kernelILi4EN2at4HalfEEvPT0_i");
  EXPECT_EQ(f.records[0].as<CUpti_ActivityKernel10>().pAccessPolicyWindow, nullptr);
  EXPECT_EQ(f.records[2].as<CUpti_ActivityMemcpy6>().bytes, 4096u);

  const Replayed r = replay(f);
  EXPECT_EQ(r.converted, 5u);
  EXPECT_EQ(r.wait_event_syncs, 1u);
  EXPECT_EQ(r.failures, std::vector<std::string>{"record 1 (kind 3)"});  // KERNEL, no timestamps
  EXPECT_EQ(r.pm_discarded, 1u);
  const GpuEventBatch& e = r.events;
  ASSERT_EQ(e.kernels.size(), 1u);
  EXPECT_EQ(e.kernels[0].begin, 2'000'000);
  EXPECT_EQ(e.kernels[0].end, 6'000'000);
  EXPECT_EQ(e.kernels[0].name, "void my_kernel<4, at::Half>(at::Half*, int)");
  EXPECT_EQ(e.kernels[0].blocks, 264);
  EXPECT_EQ(e.kernels[0].block_threads, 256);
  EXPECT_EQ(e.kernels[0].stream, 7u);
  ASSERT_EQ(e.copies.size(), 3u);
  EXPECT_EQ(e.copies[0].kind, CopyKind::kHostToDevice);
  EXPECT_TRUE(e.copies[0].pageable);
  EXPECT_EQ(e.copies[0].bytes, 4096);
  EXPECT_EQ(e.copies[0].begin, 1'100'000);
  EXPECT_EQ(e.copies[0].end, 1'300'000);
  EXPECT_EQ(e.copies[1].kind, CopyKind::kDeviceToHost);
  EXPECT_FALSE(e.copies[1].pageable);
  EXPECT_EQ(e.copies[1].bytes, 4);
  EXPECT_TRUE(e.copies[2].memset);
  EXPECT_EQ(e.copies[2].bytes, 256);
  ASSERT_EQ(e.syncs.size(), 1u);
  EXPECT_EQ(e.syncs[0].begin, 6'000'000);
  EXPECT_EQ(e.syncs[0].end, 6'300'000);
  ASSERT_EQ(e.pm.size(), 2u);
  EXPECT_EQ(e.pm[0].begin, 1'000'000);
  EXPECT_EQ(e.pm[0].end, 6'000'000);
  EXPECT_DOUBLE_EQ(e.pm[0].sm_efficiency, 0.80);
  EXPECT_DOUBLE_EQ(e.pm[0].counter_utilization, 0.81);
  EXPECT_TRUE(std::isnan(e.pm[0].tensor_activity));
  EXPECT_DOUBLE_EQ(e.pm[0].dram_throughput, 1.0);
  EXPECT_DOUBLE_EQ(e.pm[0].achieved_occupancy, 0.40);
  EXPECT_DOUBLE_EQ(e.pm[0].pcie_read_bytes, 1000.0);
  EXPECT_DOUBLE_EQ(e.pm[0].pcie_write_bytes, 0.0);
  EXPECT_DOUBLE_EQ(e.pm[1].sm_efficiency, 0.0);

  const GpuStats g =
      gpu_step_stats(e, spans({1'000'000, 11'000'000}, Interval{}, true, 1'000'000), 132, 0);
  EXPECT_EQ(g.traced_ns, 10'000'000);
  EXPECT_DOUBLE_EQ(g.gpu_utilization, 0.4);  // 4 of 10 ms
  EXPECT_DOUBLE_EQ(g.sm_efficiency, 0.4);    // 80% for 5 ms, 0% for 5 ms
  EXPECT_DOUBLE_EQ(g.counter_utilization, 0.41);
  EXPECT_EQ(g.kernels, 1);
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_EQ(g.host_sync_ns, 300'000);
  EXPECT_EQ(g.h2d_bytes, 4096);
  EXPECT_EQ(g.h2d_pageable_bytes, 4096);
  EXPECT_EQ(g.h2d_pageable_ns, 200'000);

  check_fixture(f, 0.02, 1);  // the kernel without timestamps
}

TEST(CuptiReplay, ParserRejectsWhatItCannotReplay) {
  std::vector<fx::ReplayRecord> records;
  std::string error;
  auto other = zeroed<CUpti_ActivityKernel10>();
  other.kind = CUPTI_ACTIVITY_KIND_DRIVER;  // not captured
  EXPECT_EQ(line_of(other), "");
  EXPECT_FALSE(
      fx::parse_activity_line("{\"kind\": 5, \"hex\": \"00\"}", &records, &error));  // RUNTIME
  EXPECT_NE(error.find("not captured"), std::string::npos) << error;
  // A CONCURRENT_KERNEL record of another layout (other CUPTI headers).
  EXPECT_FALSE(fx::parse_activity_line("{\"kind\": 10, \"hex\": \"0a000000\"}", &records, &error));
  EXPECT_NE(error.find("other CUPTI headers"), std::string::npos) << error;
  EXPECT_FALSE(fx::parse_activity_line("not json", &records, &error));
  EXPECT_TRUE(records.empty());
  fx::PmLine s;
  EXPECT_FALSE(fx::parse_pm_line("{\"start\": 1}", &s, &error));
  ASSERT_TRUE(
      fx::parse_pm_line("{\"start\": 1, \"end\": 2, \"values\": {\"m\": null}}", &s, &error));
  ASSERT_EQ(s.values.size(), 1u);
  EXPECT_TRUE(std::isnan(s.values[0].second));
  EXPECT_FALSE(s.first);
}

// --- The fixture captured on a GPU machine -----------------------------------------------------

TEST(CuptiReplay, CapturedFixture) {
  const std::string dir = std::string(TORCHPILOT_SOURCE_DIR) + "/tests/fixtures/cupti";
  if (!fx::fixture_present(dir)) {
    GTEST_SKIP() << "no captured fixture in " << dir
                 << " (record one on a GPU machine: " << kCaptureCommand << ")";
  }
  fx::Fixture f;
  std::string error;
  ASSERT_TRUE(fx::read_fixture(dir, &f, &error)) << error;
  std::printf("[fixture] %s (%s, %d SMs, CUPTI %u): %zu records, %zu PM samples, %zu steps\n",
              f.info.device.c_str(), f.info.chip.c_str(), f.info.sm_count, f.info.cupti_version,
              f.records.size(), f.pm.size(), f.info.steps.size());
  EXPECT_EQ(f.info.activity_capped, 0) << "the cap cut the trace window short";
  EXPECT_EQ(f.info.activity_dropped, 0);
  // The offset between CUPTI's clock and the steady clock held over the capture.
  EXPECT_LT(std::llabs(f.info.time_base_offset_after_ns - f.info.time_base_offset_ns), 1'000'000);
  // One window of 4 ms PM samples over 8 steps: within 0.1 (the live test, gpu_truth_test.cpp's
  // PmSmActivityAgreesWithTraceBusyTime, holds 0.05 over 16 steps at 2 ms).
  check_fixture(f, 0.1);
}

// The captured kernels by class (kernel_classes.h): each step ran elementwise chains, reductions,
// a softmax and two bf16 matmuls; the classes and idle add up to the traced time.
TEST(CuptiReplay, CapturedKernelsHaveClasses) {
  const std::string dir = std::string(TORCHPILOT_SOURCE_DIR) + "/tests/fixtures/cupti";
  if (!fx::fixture_present(dir)) GTEST_SKIP() << "no captured fixture in " << dir;
  fx::Fixture f;
  std::string error;
  ASSERT_TRUE(fx::read_fixture(dir, &f, &error)) << error;
  const Replayed r = replay(f);
  for (const KernelRecord& k : r.events.kernels) {
    const KernelKind kind = classify_kernel(k.name, k.communication);
    if (k.name.find("nvjet") != std::string::npos) {
      EXPECT_EQ(kind.cls, KernelClass::kTensorGemm) << k.name;
    } else if (k.name.find("SoftMax") != std::string::npos) {
      EXPECT_EQ(kind.cls, KernelClass::kAttention) << k.name;
    } else {
      EXPECT_EQ(kind.cls, KernelClass::kElementwise) << k.name;
    }
  }
  KernelClassStats stats;
  for (const fx::StepSpan& s : f.info.steps) {
    if (!s.traced) continue;
    add_kernel_classes(stats, r.events, spans({s.begin, s.end}, {s.begin, s.begin}, true),
                       f.info.sm_count);
  }
  ASSERT_GT(stats.steps, 0);
  EXPECT_NEAR(stats.busy_ns() + stats.idle_ns, static_cast<double>(stats.traced_ns), 1.0);
  const auto ns = [&](KernelClass c) { return stats.ns[static_cast<size_t>(c)]; };
  EXPECT_GT(ns(KernelClass::kTensorGemm), 0);
  EXPECT_GT(ns(KernelClass::kAttention), 0);
  EXPECT_GT(ns(KernelClass::kElementwise), 0);
  EXPECT_EQ(ns(KernelClass::kSimtGemm) + ns(KernelClass::kOther), 0);
  // Two bf16 8192^2 matmuls (2.2 TFLOP) outlast the step's elementwise work.
  EXPECT_GT(ns(KernelClass::kTensorGemm), ns(KernelClass::kElementwise));
  EXPECT_GT(stats.memcpy_ns, 0);  // the pageable copy and the .item()
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
