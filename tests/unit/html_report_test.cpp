// The HTML report: what a short run's report holds, and (where Chromium is installed) that a real
// browser renders its charts non-empty and lists the advice; a screenshot is saved.
#include "torchpilot/runtime/reports/html_report.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "fakes/string_logger.h"
#include "temp_dir.h"
#include "torchpilot/runtime/core/interval.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/flops/flop_records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace torchpilot {
namespace {

constexpr Nanos kMs = 1000000;

// Stands in for the GPU monitor, the FLOP counter and a collectives collector: per-step GPU
// records, communication step metrics, epoch sections with MFU.
class FakeFigures final : public Collector {
 public:
  std::string name() const override { return "fake_figures"; }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_step_end(StepRecord& r) override {
    const double phase = static_cast<double>(r.step % 10) / 10;
    r.metrics.set("comm", "communication_ms", 2 + phase);
    r.metrics.set("comm", "exposed_communication_ms", 0.5 * phase);
    GpuStepRecord g;
    g.step = r.step;
    g.epoch = r.epoch;
    g.stats.wall_ns = r.step_ns();
    g.stats.counter_utilization = 0.9;
    g.stats.nvml_utilization = 1.0;
    g.stats.sm_efficiency = 0.4 + 0.2 * phase;
    g.stats.tensor_activity = 0.2;
    g.stats.dram_throughput = 0.3 + 0.1 * phase;
    if (host_ != nullptr) host_->publish(make_late_step(r.step, r.epoch, g));
  }
  void on_epoch_end(EpochSummary& s) override {
    FlopEpochStats f;
    f.mfu = 0.25 + 0.05 * s.epoch;
    f.hfu = f.mfu + 0.01;
    s.sections.set(f);
    GpuEpochStats g;
    g.device = "Fake GPU";
    g.stats.counter_utilization = 0.9;
    g.stats.sm_efficiency = 0.5;
    s.sections.set(g);
  }

 private:
  CollectorHost* host_ = nullptr;
};

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A Pilot's options for a report test: a manual clock, the log into `log`, no default
// collectors, `report` the only sink.
PilotOptions report_options(std::shared_ptr<ManualClock> clock, std::ostringstream& log,
                            std::shared_ptr<Sink> report) {
  PilotOptions o;
  o.logger = test::string_logger("html-test", log);
  o.clock = std::move(clock);
  o.default_collectors = false;
  o.sinks = {std::move(report)};
  return o;
}

// A short run: two epochs of 40 steps, starved of data (plants data_starvation), with an
// auto-tune trial and decision handed to the report.
std::string make_report(const std::string& path) {
  auto clock = std::make_shared<ManualClock>();
  std::ostringstream log;
  auto report = make_html_report(path);
  PilotOptions o = report_options(clock, log, report);
  o.collectors = {std::make_shared<FakeFigures>()};
  Config c;
  c.gpu.enabled = false;
  Pilot pilot(c, o);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int i = 0; i < 40; ++i) {
      const Nanos wait = (i % 4 == 0 ? 6 : 2) * kMs;
      pilot.record_data_wait(wait);
      clock->advance(wait);
      auto s = pilot.step(32);
      {
        auto f = pilot.phase("forward");
        clock->advance(3 * kMs);
      }
      {
        auto b = pilot.phase("backward");
        clock->advance(5 * kMs);
      }
    }
    if (epoch == 0) {
      TrialResult t;
      t.setting = {{"loader.workers", 0}};
      t.throughput = 2000;
      t.unit = "samples/s";
      t.data_wait_fraction = 0.3;
      report->on_trial(t, true);
      TrialResult t2 = t;
      t2.setting = {{"loader.workers", 2}};
      t2.throughput = 3100;
      t2.data_wait_fraction = 0.01;
      report->on_trial(t2, true);
      TuningDecision d;
      d.policy = "loader";
      d.baseline = t.setting;
      d.chosen = t2.setting;
      d.baseline_throughput = 2000;
      d.chosen_throughput = 3100;
      d.unit = "samples/s";
      d.decided_at_step = 30;
      d.reason = "search done";
      d.trials = {t, t2};
      report->on_decision(d);
    }
    pilot.end_epoch();
  }
  return read(path);
}

TEST(HtmlReportTest, AShortRunsReportHoldsEveryChartTheAdviceAndTheTrials) {
  torchpilot_test::TempDir dir;
  const std::string html = make_report(dir.file("report.html"));
  ASSERT_FALSE(html.empty());
  for (const char* id : {"chart-step-time", "chart-data-wait", "chart-gpu-util",
                         "chart-tensor-dram", "chart-mfu", "chart-metrics-comm"}) {
    EXPECT_NE(html.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  }
  EXPECT_NE(html.find("data-series=\"forward\""), std::string::npos);
  EXPECT_NE(html.find("data-series=\"sm_efficiency\""), std::string::npos);
  EXPECT_NE(html.find("data-series=\"exposed_communication_ms\""), std::string::npos);
  EXPECT_NE(html.find("data-id=\"data_starvation\""), std::string::npos);
  EXPECT_NE(html.find("loader.workers=2"), std::string::npos);
  EXPECT_NE(html.find("id=\"decision\""), std::string::npos);
  // Self-contained: nothing loaded from anywhere (the SVG namespace is a name, not a fetch).
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find(" href="), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  // Two epochs in the table, one MFU bar each (and HFU).
  EXPECT_EQ(std::count(html.begin(), html.end(), '\n') > 10, true);
  const std::regex bar("<rect class=\"bar\"");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(html.begin(), html.end(), bar), std::sregex_iterator()),
      4);
}

TEST(HtmlReportTest, IntervalsAndTheLastStepsAtExitAreMarked) {
  torchpilot_test::TempDir dir;
  const std::string path = dir.file("intervals.html");
  {
    auto clock = std::make_shared<ManualClock>();
    std::ostringstream log;
    PilotOptions o = report_options(clock, log, make_html_report(path));
    Config c;
    c.gpu.enabled = false;
    c.section<IntervalConfig>().seconds = 1;
    c.section<IntervalConfig>().min_steps = 5;
    Pilot pilot(c, o);
    for (int i = 0; i < 13; ++i) {  // 100 ms steps, no epoch end: one interval, 3 steps at exit
      auto s = pilot.step(8);
      clock->advance(100 * kMs);
    }
  }
  const std::string html = read(path);
  EXPECT_NE(html.find("<td>0 (interval)</td>"), std::string::npos) << html.substr(0, 4000);
  EXPECT_NE(html.find("<td>1 (at exit)</td>"), std::string::npos);
}

TEST(HtmlReportTest, LongRunsKeepBoundedSeries) {
  torchpilot_test::TempDir dir;
  HtmlReport report(dir.file("r.html"));
  StepRecord r;
  for (int64_t i = 0; i < 10000; ++i) {
    r.step = i;
    r.begin_ns = i * kMs;
    r.end_ns = (i + 1) * kMs;
    report.on_step(r, {});
  }
  const std::string html = report.html();
  // Points of the step-time line: at most kMaxPoints (merged pairs past that).
  const auto at = html.find("data-series=\"step\" points=\"");
  ASSERT_NE(at, std::string::npos);
  const auto end = html.find('"', at + 27);
  const std::string points = html.substr(at + 27, end - at - 27);
  const auto n = std::count(points.begin(), points.end(), ',');
  EXPECT_GT(n, 1000);
  EXPECT_LE(n, static_cast<long>(HtmlReport::kMaxPoints));
}

TEST(HtmlReportTest, ReMeasurementsAreMarkedInTheTrialTable) {
  torchpilot_test::TempDir dir;
  HtmlReport report(dir.file("r.html"));
  TrialResult t;
  t.setting = {{"loader.workers", 4}};
  t.throughput = 3000;
  t.unit = "samples/s";
  report.on_trial(t, true);
  t.confirmation = true;
  report.on_trial(t, false);
  t.failed = true;
  t.note = "out of memory";
  report.on_trial(t, false);
  const std::string html = report.html();
  EXPECT_NE(html.find("<td class=\"l\">best so far</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"l\">re-measurement</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"l\">re-measurement failed: out of memory</td>"),
            std::string::npos);
}

TEST(HtmlReportTest, TheConfigKeyWritesTheReportAtExitAndRefusesAMissingFolder) {
  torchpilot_test::TempDir dir;
  Config c;
  c.gpu.enabled = false;
  c.report.html_path = dir.file("run.html");
  {
    PilotOptions o;
    o.default_collectors = false;
    Pilot pilot(c, o);
    auto s = pilot.step(1);
  }  // no epoch ended: written at the Pilot's exit
  EXPECT_NE(read(dir.file("run.html")).find("torchpilot report"), std::string::npos);
  c.report.html_path = dir.file("missing/run.html");
  EXPECT_THROW(Pilot(c, PilotOptions{}), ConfigError);
}

// The browser: Chromium renders the report; the page's own check counts the charts with
// non-empty geometry (getBBox) into #render-check.
std::string find_chromium() {
  if (const char* env = std::getenv("TORCHPILOT_CHROMIUM")) return env;
  for (const char* p :
       {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return {};
}

TEST(HtmlReportTest, ChromiumRendersEveryChartAndListsTheAdvice) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    GTEST_SKIP() << "Chromium not installed (Debian package chromium; scripts/setup.sh installs "
                    "it; TORCHPILOT_CHROMIUM names another binary)";
  }
  torchpilot_test::TempDir dir;
  const std::string report = dir.file("report.html");
  make_report(report);
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" +
      dir.file("profile") + " ";
  const std::string dom = dir.file("dom.html");
  const std::string cmd = "'" + chromium + "'" + flags + "--dump-dom 'file://" + report + "' > '" +
                          dom + "' 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string text = read(dom);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(text, m, std::regex("data-charts=\"([0-9]+)\" data-drawn=\"([0-9]+)\"")))
      << "the page's check did not run: " << text.substr(0, 400);
  EXPECT_EQ(m[1], m[2]) << "charts drawn empty";
  EXPECT_GE(std::stoi(m[1]), 6);
  EXPECT_EQ(text.find("data-rendered=\"no\""), std::string::npos);
  EXPECT_NE(text.find("data-id=\"data_starvation\""), std::string::npos);
  // A screenshot for people: in the test's working folder (build/tests under CTest).
  const std::string shot = std::filesystem::absolute("html_report_screenshot.png").string();
  std::filesystem::remove(shot);
  const std::string shoot = "'" + chromium + "'" + flags +
                            "--window-size=1200,2400 --screenshot='" + shot + "' 'file://" +
                            report + "' >/dev/null 2>&1";
  ASSERT_EQ(std::system(shoot.c_str()), 0) << shoot;
  ASSERT_TRUE(std::filesystem::exists(shot));
  EXPECT_GT(std::filesystem::file_size(shot), 10000u);
  std::cout << "screenshot: " << shot << "\n";
}

}  // namespace
}  // namespace torchpilot
