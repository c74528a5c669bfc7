// Chrome/Perfetto trace files of detailed windows: the format (trace_event_check.h) and what a
// window written by a Pilot over a fake GPU backend holds.
#include "torchpilot/runtime/reports/trace_events.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "fakes/gpu_monitor_rig.h"
#include "temp_dir.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "trace_event_check.h"

namespace torchpilot {
namespace {

using nlohmann::json;
constexpr Nanos kMs = 1000000;

using test::FakeBackend;

KernelRecord kernel(Nanos b, Nanos e, uint32_t stream, std::string name) {
  KernelRecord k;
  k.begin = b;
  k.end = e;
  k.blocks = 1;
  k.stream = stream;
  k.name = std::move(name);
  return k;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::vector<json> events_named(const json& trace, const std::string& ph, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == ph && (name.empty() || e["name"] == name)) out.push_back(e);
  }
  return out;
}

TEST(TraceEventCheckTest, FindsCrossingSlicesAndMissingFields) {
  json bad = {{"traceEvents",
               {{{"ph", "X"}, {"name", "a"}, {"pid", 1}, {"tid", 1}, {"ts", 0}, {"dur", 10}},
                {{"ph", "X"}, {"name", "b"}, {"pid", 1}, {"tid", 1}, {"ts", 5}, {"dur", 10}},
                {{"ph", "X"}, {"name", "c"}, {"pid", 1}, {"ts", 5}},
                {{"ph", "C"}, {"name", "k"}, {"pid", 1}, {"ts", 5}, {"args", {{"k", "x"}}}}}}};
  const auto problems = torchpilot_test::trace_event_problems(bad);
  EXPECT_EQ(problems.size(), 4u);  // c: no tid, no dur; C: not a number; b crosses a
  json good = {{"traceEvents",
                {{{"ph", "X"}, {"name", "a"}, {"pid", 1}, {"tid", 1}, {"ts", 0}, {"dur", 10}},
                 {{"ph", "X"}, {"name", "b"}, {"pid", 1}, {"tid", 1}, {"ts", 5}, {"dur", 5}}}}};
  EXPECT_TRUE(torchpilot_test::trace_event_problems(good).empty());
}

TEST(TraceEventsTest, OverlappingSlicesOfATrackGoToLanesThatNest) {
  GpuWindowRecord w;
  w.epoch = 2;
  w.device = "Fake GPU";
  w.steps.push_back({7, {1000, 9000}, {1000, 2000}, false, {}});
  w.phases.push_back({"forward", {2000, 5000}});
  w.phases.push_back({"backward", {5000, 8500}});
  w.steps.back().gpu_timed = true;
  w.steps.back().gpu = {2000, 9500};
  w.gpu_phases.push_back({"forward", {2000, 6000}});
  // Crossing kernels on one stream (CUPTI clocks can do that around a boundary): two lanes.
  w.kernels = {kernel(2000, 4000, 7, "a"), kernel(3000, 6000, 7, "b"), kernel(4500, 5000, 9, "c")};
  PmSample p;
  p.begin = 1000;
  p.end = 3000;
  p.sm_efficiency = 0.25;
  w.pm = {p};
  Advice a;
  a.id = "launch_bound";
  a.finding = "gaps";
  a.expected_gain = 0.5;
  const json t = json::parse(window_trace_json(w, {a}));
  const auto problems = torchpilot_test::trace_event_problems(t);
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_EQ(window_trace_file_name("20250314T093000Z-4242", w),
            "20250314T093000Z-4242_window_e2_s7-7.json");
  std::set<std::string> threads;
  for (const auto& e : events_named(t, "M", "thread_name")) threads.insert(e["args"]["name"]);
  EXPECT_TRUE(threads.count("stream 7"));
  EXPECT_TRUE(threads.count("stream 7 (lane 2)"));
  EXPECT_TRUE(threads.count("stream 9"));
  EXPECT_TRUE(threads.count("steps and phases"));
  EXPECT_TRUE(threads.count("data wait"));
  // Times from the window's start, in microseconds.
  const auto step = events_named(t, "X", "step 7");
  ASSERT_EQ(step.size(), 2u);  // the host's and the GPU's
  EXPECT_DOUBLE_EQ(step[0]["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(step[0]["dur"].get<double>(), 8.0);
  // The phase on the GPU: nested in the GPU step, on its track.
  const auto forward = events_named(t, "X", "forward");
  ASSERT_EQ(forward.size(), 2u);
  const auto gpu_step = events_named(t, "X", "step 7");
  ASSERT_EQ(gpu_step.size(), 2u);
  EXPECT_EQ(forward[1]["pid"], gpu_step[1]["pid"]);
  EXPECT_EQ(forward[1]["tid"], gpu_step[1]["tid"]);
  EXPECT_DOUBLE_EQ(forward[1]["dur"].get<double>(), 4.0);
  const auto sm = events_named(t, "C", "sm_efficiency");
  ASSERT_EQ(sm.size(), 1u);
  EXPECT_DOUBLE_EQ(sm[0]["args"]["sm_efficiency"].get<double>(), 0.25);
  EXPECT_TRUE(events_named(t, "C", "tensor_activity").empty());  // not measured: no point
  const auto advice = events_named(t, "i", "ADVICE launch_bound");
  ASSERT_EQ(advice.size(), 1u);
  EXPECT_DOUBLE_EQ(advice[0]["args"]["expected_gain"].get<double>(), 0.5);
  EXPECT_EQ(t["otherData"]["steady_clock_origin_ns"], 1000);
}

// A restarted job writes the same windows (epoch and steps) into the same folder: the earlier
// run's files stay, each run's files carry its own run id.
TEST(TraceEventsTest, ARestartNeverReplacesAnEarlierRunsTraceFiles) {
  torchpilot_test::TempDir dir;
  GpuWindowRecord w;
  w.steps.push_back({3, {1000, 9000}, {}, false, {}});
  auto run = [&](const std::string& kernel_name) {
    w.kernels = {kernel(2000, 4000, 7, kernel_name)};
    auto sink = make_trace_sink(dir.file("traces"));
    sink->on_late_step(make_late_step(3, 0, w));
    sink->on_epoch(EpochSummary{}, {});
  };
  run("first_run_kernel");
  run("second_run_kernel");
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("traces"))) {
    files.push_back(e.path().string());
  }
  ASSERT_EQ(files.size(), 2u);
  std::set<std::string> kernels;
  for (const auto& f : files) {
    for (const auto& k : events_named(read_json(f), "X", "")) kernels.insert(k["name"]);
  }
  EXPECT_TRUE(kernels.count("first_run_kernel"));
  EXPECT_TRUE(kernels.count("second_run_kernel"));
}

TEST(TraceEventsTest, APilotWritesEachWindowWithItsStepsRecordsAndAdvice) {
  torchpilot_test::TempDir dir;
  Config c = test::Rig::window_config(3, 4);  // the window opens when due (a short fake run)
  c.gpu.step_markers = false;
  c.report.trace_dir = dir.file("traces");
  test::Rig rig(c);
  const auto& clock = rig.clock;
  const auto& backend = rig.backend;
  const auto& sink = rig.sink;
  const std::ostringstream& log = rig.log;
  {
    Pilot& pilot = *rig.pilot;
    for (int i = 0; i < 10; ++i) {
      pilot.record_data_wait(1 * kMs);
      clock->advance(1 * kMs);  // the wait for the batch, before the scope
      const Nanos b = clock->now_ns();
      auto s = pilot.step(1);
      {
        auto f = pilot.phase("forward");
        clock->advance(4 * kMs);
      }
      {
        auto bw = pilot.phase("backward");
        clock->advance(4 * kMs);
      }
      const Nanos e = clock->now_ns();
      PmSample p;
      p.begin = b - kMs;
      p.end = e;
      p.sm_efficiency = 0.01;
      p.counter_utilization = 1.0;
      backend->queued.pm.push_back(p);
      if (backend->tracing) {
        // One SM busy the whole step on stream 7 (plants busy_inefficient), a copy, a sync.
        backend->queued.kernels.push_back(kernel(b, e, 7, "spin_kernel"));
        backend->queued.kernels.push_back(kernel(b, b + kMs, 13, "side_kernel"));
        backend->queued.copies.push_back(
            test::copy_record(b, b + kMs / 2, 4096, CopyKind::kHostToDevice, true));
        SyncRecord sy;
        sy.begin = e - kMs;
        sy.end = e - kMs / 2;
        sy.api = SyncApi::kStreamSynchronize;
        sy.thread = SyncThread::kTrainer;
        backend->queued.syncs.push_back(sy);
      }
    }
    pilot.end_epoch();
    rig.pilot.reset();
  }
  ASSERT_EQ(sink->late<GpuWindowRecord>().size(), 1u);
  std::string path;  // "<run>_window_e0_s3-6.json", the only file
  for (const auto& e : std::filesystem::directory_iterator(dir.file("traces"))) {
    EXPECT_TRUE(path.empty()) << "a second file: " << e.path();
    path = e.path().string();
  }
  ASSERT_FALSE(path.empty()) << log.str();
  static const std::regex kName(R"(\d{8}T\d{6}Z-\d+(-\d+)?_window_e0_s3-6\.json)");
  EXPECT_TRUE(std::regex_match(std::filesystem::path(path).filename().string(), kName)) << path;
  const json t = read_json(path);
  const auto problems = torchpilot_test::trace_event_problems(t);
  EXPECT_TRUE(problems.empty()) << problems.front();

  for (int s = 3; s <= 6; ++s)
    EXPECT_EQ(events_named(t, "X", "step " + std::to_string(s)).size(), 1u);
  EXPECT_TRUE(events_named(t, "X", "step 2").empty());
  EXPECT_EQ(events_named(t, "X", "forward").size(), 4u);
  EXPECT_EQ(events_named(t, "X", "backward").size(), 4u);
  EXPECT_EQ(events_named(t, "X", "data wait").size(), 4u);
  EXPECT_EQ(events_named(t, "X", "spin_kernel").size(), 4u);
  EXPECT_EQ(events_named(t, "X", "side_kernel").size(), 4u);
  EXPECT_EQ(events_named(t, "X", "HtoD (pageable)").size(), 4u);
  EXPECT_EQ(events_named(t, "X", "cudaStreamSynchronize").size(), 4u);
  EXPECT_EQ(events_named(t, "C", "sm_efficiency").size(), 4u);
  // Each phase lies inside its step on the same track.
  const auto steps = events_named(t, "X", "step 4");
  const auto fwd = events_named(t, "X", "forward");
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(fwd[1]["tid"], steps[0]["tid"]);
  EXPECT_GE(fwd[1]["ts"].get<double>(), steps[0]["ts"].get<double>());
  // The epoch's advice, as instant events.
  EXPECT_EQ(events_named(t, "i", "ADVICE busy_inefficient").size(), 1u) << log.str();
}

TEST(TraceEventsTest, NoTraceDirNoWindowRecords) {
  Config c;
  c.gpu.trace_first_step = 1;
  c.cost.budget = 1;  // the window opens when due (a short fake run)
  c.gpu.trace_steps = 2;
  test::Rig rig(c);
  const auto& clock = rig.clock;
  Pilot& pilot = *rig.pilot;
  for (int i = 0; i < 5; ++i) {
    auto s = pilot.step(1);
    clock->advance(kMs);
  }
  pilot.end_epoch();
  EXPECT_TRUE(rig.sink->late<GpuWindowRecord>().empty());
  EXPECT_FALSE(rig.sink->late_steps.empty());
}

// A run that observes no GPU has no trace windows: the trace folder stays empty, and the log
// says why, once.
TEST(TraceEventsTest, ARunWithoutAGpuSaysWhyTheTraceFolderStaysEmpty) {
  torchpilot_test::TempDir dir;
  Config c;
  c.mode = Mode::kAdvise;
  c.gpu.enabled = false;
  c.report.trace_dir = dir.file("traces");
  std::ostringstream log;
  PilotOptions o;
  o.logger = std::make_shared<spdlog::logger>(
      "trace_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  {
    Pilot pilot(c, o);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int i = 0; i < 3; ++i) auto s = pilot.step(1);
      pilot.end_epoch();
    }
  }
  const std::string text = log.str();
  const std::string line = "report.trace_dir";
  const size_t at = text.find(line);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.find(line, at + 1), std::string::npos) << "said once: " << text;
  EXPECT_NE(text.find("no GPU", at), std::string::npos) << text;
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("traces")));
}

}  // namespace
}  // namespace torchpilot
