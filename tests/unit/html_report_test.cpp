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
#include "torchpilot/runtime/loader/loader_records.h"
#include "torchpilot/runtime/memory/memory_records.h"

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
  for (const char* id : {"chart-throughput", "chart-step-time", "chart-data-wait", "chart-gpu-util",
                         "chart-tensor-dram", "chart-mfu", "chart-metrics-comm"}) {
    EXPECT_NE(html.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  }
  // The findings lead: before the first chart, the one finding singled out.
  const auto findings = html.find("<section id=\"findings\">");
  ASSERT_NE(findings, std::string::npos);
  EXPECT_LT(findings, html.find("<figure"));
  EXPECT_NE(html.find("class=\"finding top\" data-rank=\"1\" data-id=\"data_starvation\""),
            std::string::npos);
  EXPECT_NE(html.find("data-series=\"throughput\""), std::string::npos);
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
  EXPECT_NE(html.find("<td class=\"l\">baseline; best so far</td>"), std::string::npos);
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

// A GPU-like run fed to the report as a GPU run's sinks would be (no GPU here; the repository
// holds no JSON-lines log of one): 8 epochs of 50 steps, per-step GPU figures, communication,
// a sync probe's figures, MFU, memory and loader sections, and advice that repeats over epochs:
// data starvation until auto-tune decides the loader at step 80, exposed communication in every
// epoch, a straggler from epoch 5, a periodic stall in epoch 1 only.
void make_gpu_like_report(HtmlReport& report) {
  const std::vector<std::string> phases = {"forward", "backward", "optimizer"};
  for (int64_t epoch = 0; epoch < 8; ++epoch) {
    const bool tuned = epoch >= 2;
    for (int64_t i = 0; i < 50; ++i) {
      StepRecord r;
      r.step = epoch * 50 + i;
      r.epoch = epoch;
      r.samples = 256;
      const bool step_tuned = epoch * 50 + i > 80;  // auto-tune decides at step 80
      const Nanos wait = (step_tuned ? 1 : 22) * kMs, work = (40 + (i % 7)) * kMs;
      r.begin_ns = r.step * 100 * kMs;
      r.end_ns = r.begin_ns + wait + work;
      r.data_wait_ns = wait;
      r.phase_ns = {14 * kMs, 22 * kMs, 4 * kMs};
      r.metrics.set("comm", "time_ms", 9.0 + (i % 3));
      r.metrics.set("comm", "exposed_ms", 4.0 + 0.5 * (i % 3));
      r.metrics.set("comm", "bytes", 4.0e8);
      r.metrics.set("sync", "ms", 0.8);
      report.on_step(r, phases);
      GpuStepRecord g;
      g.step = r.step;
      g.epoch = epoch;
      g.stats.counter_utilization = step_tuned ? 0.93 : 0.64;
      g.stats.nvml_utilization = step_tuned ? 0.99 : 0.8;
      g.stats.sm_efficiency = (step_tuned ? 0.55 : 0.38) + 0.01 * (i % 5);
      g.stats.tensor_activity = step_tuned ? 0.31 : 0.21;
      g.stats.dram_throughput = 0.4;
      g.stats.achieved_occupancy = 0.27;
      report.on_late_step(make_late_step(r.step, epoch, g));
    }
    if (epoch == 1) {
      TrialResult base;
      base.setting = {{"loader.prefetch", 2}, {"loader.workers", 2}};
      base.first_step = 20;
      base.last_step = 39;
      base.throughput = 3940;
      base.unit = "samples/s";
      base.data_wait_fraction = 0.33;
      report.on_trial(base, true);
      TrialResult more = base;
      more.setting = {{"loader.prefetch", 2}, {"loader.workers", 6}};
      more.first_step = 43;
      more.last_step = 56;
      more.throughput = 5810;
      more.data_wait_fraction = 0.03;
      report.on_trial(more, true);
      TrialResult deeper = more;
      deeper.setting = {{"loader.prefetch", 4}, {"loader.workers", 6}};
      deeper.first_step = 60;
      deeper.last_step = 76;
      deeper.throughput = 5870;
      deeper.data_wait_fraction = 0.02;
      report.on_trial(deeper, true);
      TuningDecision d;
      d.policy = "loader coordinate search";
      d.baseline = base.setting;
      d.chosen = deeper.setting;
      d.baseline_throughput = base.throughput;
      d.chosen_throughput = deeper.throughput;
      d.unit = "samples/s";
      d.decided_at_step = 80;
      d.reason = "search complete";
      d.trials = {base, more, deeper};
      report.on_decision(d);
    }
    EpochSummary e;
    e.epoch = epoch;
    e.first_step = epoch * 50;
    e.steps = 50;
    e.samples = 50 * 256;
    e.data_wait_fraction = tuned ? 0.02 : 0.34;
    e.samples_per_s = tuned ? 5860 : 3950;
    e.step_p50_ns = (tuned ? 44 : 65) * kMs;
    e.step_p90_ns = (tuned ? 46 : 67) * kMs;
    e.tuned = tuned;
    GpuEpochStats g;
    g.device = "GPU-like fixture";
    g.stats.counter_utilization = tuned ? 0.93 : 0.64;
    g.stats.sm_efficiency = tuned ? 0.57 : 0.40;
    e.sections.set(g);
    FlopEpochStats f;
    f.mfu = tuned ? 0.31 : 0.21;
    f.hfu = f.mfu * 1.3;
    e.sections.set(f);
    MemoryEpochStats m;
    m.capacity_bytes = int64_t{80} << 30;
    m.peak_allocated_bytes = int64_t{52} << 30;
    m.peak_reserved_bytes = int64_t{61} << 30;
    e.sections.set(m);
    LoaderStats l;
    l.name = "tunable";
    l.tunable = true;
    l.settings.workers = tuned ? 6 : 2;
    l.settings.prefetch = tuned ? 4 : 2;
    l.batch_size = 256;
    l.produce_count = 50;
    l.produce_ns = 50 * 120 * kMs;
    e.sections.set(l);
    std::vector<Advice> advice;
    auto add = [&](const std::string& id, Severity sev, double gain, bool estimated,
                   const std::string& finding, const std::string& action, Evidence ev) {
      Advice a;
      a.id = id;
      a.severity = sev;
      a.epoch = epoch;
      a.finding = finding;
      a.cause = "the fixture's cause";
      a.action = action;
      a.expected_gain = gain;
      a.gain_estimated = estimated;
      a.evidence = {std::move(ev)};
      advice.push_back(std::move(a));
    };
    if (!tuned) {
      add("data_starvation", Severity::kHigh, 0.52 - 0.02 * epoch, true,
          "the training thread waited for data 34% of step time",
          "use about 6 workers (mode: autotune picks this during warm-up)",
          {"data_wait_fraction", 0.34, "fraction"});
    }
    add("exposed_communication", Severity::kWarning, 0.12 - 0.005 * epoch, true,
        "4.5 ms of each step's 10 ms of gradient communication is not overlapped with compute",
        "overlap the gradient all-reduce with the backward pass (bucketed DDP hooks)",
        {"exposed_fraction", 0.10 - 0.002 * epoch, "fraction"});
    add("low_mfu", Severity::kInfo, 0, true, "MFU is 31% of the GPU's bf16 peak",
        "see the other findings: MFU follows from them", {"mfu", f.mfu, "fraction"});
    if (epoch >= 5) {
      add("straggler_rank", Severity::kWarning, 0.05 + 0.01 * (epoch - 5), true,
          "rank 3 is a straggler: its data loading", "find why rank 3 is slower",
          {"rank", 3, "rank"});
    }
    if (epoch == 1) {
      add("periodic_stall", Severity::kWarning, 0.04, true, "every 20th step stalls 30 ms",
          "look at what runs every 20 steps", {"period", 20, "steps"});
    }
    if (epoch >= 3) {
      add("pageable_copies", Severity::kWarning, 0.03, false,
          "host-to-device copies from pageable memory take 1.2 ms a step",
          "pin memory (loader pin_memory)", {"pageable_copy_fraction", 0.027, "fraction"});
    }
    report.on_epoch(e, advice);
  }
}

TEST(HtmlReportTest, FindingsLeadRankedByGainDeduplicatedWithTheTunersAnswer) {
  torchpilot_test::TempDir dir;
  HtmlReport report(dir.file("gpu.html"));
  make_gpu_like_report(report);
  const std::string html = report.html();
  // 8 epochs, 33 advice, 6 findings: 4 ranked by gain, 1 answered by tuning, 1 no longer found.
  std::vector<std::string> ranked;
  std::vector<double> gains;
  const std::regex card(
      "data-rank=\"([0-9]+)\" data-id=\"([a-z_]+)\" data-subject=\"([^\"]*)\" "
      "data-gain=\"([0-9.]+)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), card); it != std::sregex_iterator();
       ++it) {
    ranked.push_back((*it)[2].str() + ((*it)[3].str().empty() ? "" : "/" + (*it)[3].str()));
    gains.push_back(std::stod((*it)[4]));
  }
  EXPECT_EQ(ranked, (std::vector<std::string>{"exposed_communication", "straggler_rank/rank 3",
                                              "pageable_copies", "low_mfu"}));
  EXPECT_TRUE(std::is_sorted(gains.rbegin(), gains.rend()));
  EXPECT_NE(
      html.find("<li class=\"finding top\" data-rank=\"1\" data-id=\"exposed_communication\""),
      std::string::npos);
  EXPECT_NE(html.find("epochs 0\xe2\x80\x93"
                      "7: +12% \xe2\x86\x92 +8.5%"),
            std::string::npos);
  EXPECT_NE(html.find("<span class=\"how\">measured</span>"), std::string::npos);  // pageable
  EXPECT_NE(html.find("answered by tuning: kept loader.prefetch=4 loader.workers=6"),
            std::string::npos);
  EXPECT_NE(html.find("<li class=\"finding earlier\" data-id=\"periodic_stall\""),
            std::string::npos);
  // The tuner's chosen row is marked, once.
  const std::regex chosen("<tr class=\"chosen\"><td class=\"l\">([^<]*)</td>");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(html, m, chosen));
  EXPECT_EQ(m[1], "loader.prefetch=4 loader.workers=6");
  EXPECT_EQ(html.find("class=\"chosen\"", static_cast<size_t>(m.position(0) + m.length(0))),
            std::string::npos);
  // Human labels, epoch boundaries; the loader's settings in a table of their own.
  EXPECT_NE(html.find(">SM efficiency (counters)</span>"), std::string::npos);
  EXPECT_EQ(html.find(">counter_utilization</span>"), std::string::npos);
  EXPECT_NE(html.find(">epoch 7</text>"), std::string::npos);
  EXPECT_NE(html.find("<table id=\"loader\">"), std::string::npos);
  // The probe's figures, raw sections and the advice as given are folded, after the rest.
  const auto fold = html.find("<details id=\"internals\">");
  ASSERT_NE(fold, std::string::npos);
  EXPECT_GT(html.find("id=\"chart-metrics-sync\""), fold);
  EXPECT_GT(html.find("<div class=\"advice"), fold);
  EXPECT_GT(html.find("id=\"chart-memory\""), html.find("id=\"chart-metrics-comm\""));
}

TEST(HtmlReportTest, NullsShowAsDashesAndTextIsEscaped) {
  torchpilot_test::TempDir dir;
  HtmlReport report(dir.file("r.html"));
  EpochSummary e;
  e.steps = 1;
  GpuEpochStats g;  // every figure not measured
  e.sections.set(g);
  Advice a;
  a.id = "x\"><script>";
  a.finding = "<script>alert(1)</script> & more";
  a.action = "<b>bold</b>";
  a.expected_gain = 0.5;
  a.evidence = {{"<i>", 1, "\"unit\""}};
  report.on_epoch(e, {a});
  const std::string html = report.html();
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("<b>bold"), std::string::npos);
  EXPECT_EQ(html.find("x\"><script>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(html.find(">null<"), std::string::npos);
  EXPECT_EQ(html.find(">n/a<"), std::string::npos);
  EXPECT_NE(html.find("<td>\xe2\x80\x94</td>"), std::string::npos);  // the epoch's GPU busy
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

// Loads `report` in headless Chromium: the DOM after the page's own check ran, and a screenshot
// (1280 px wide, as a user's window) saved as `shot` in the test's working folder (build/tests
// under CTest).
std::string render(const std::string& chromium, torchpilot_test::TempDir& dir,
                   const std::string& report, const std::string& shot_name) {
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" +
      dir.file("profile") + " ";
  const std::string dom = dir.file("dom.html");
  const std::string cmd = "timeout 60 '" + chromium + "'" + flags + "--window-size=1280,2400 " +
                          "--dump-dom 'file://" + report + "' > '" + dom + "' 2>/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string shot = std::filesystem::absolute(shot_name).string();
  std::filesystem::remove(shot);
  const std::string shoot = "timeout 60 '" + chromium + "'" + flags +
                            "--window-size=1280,2400 --screenshot='" + shot + "' 'file://" +
                            report + "' >/dev/null 2>&1";
  EXPECT_EQ(std::system(shoot.c_str()), 0) << shoot;
  EXPECT_TRUE(std::filesystem::exists(shot));
  if (std::filesystem::exists(shot)) EXPECT_GT(std::filesystem::file_size(shot), 10000u);
  std::cout << "screenshot: " << shot << "\n";
  return read(dom);
}

// What the page's check measured in the browser: every chart on show drawn non-empty, the
// findings above every chart, each chart at least 90% of the page's text width.
void expect_rendered_well(const std::string& dom, int min_charts) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      dom, m,
      std::regex("data-charts=\"([0-9]+)\" data-drawn=\"([0-9]+)\" data-folded=\"([0-9]+)\" "
                 "data-narrowest=\"([0-9]+)\" data-findings-first=\"(yes|no)\"")))
      << "the page's check did not run: " << dom.substr(0, 400);
  EXPECT_EQ(m[1], m[2]) << "charts drawn empty";
  EXPECT_GE(std::stoi(m[1]), min_charts);
  EXPECT_GE(std::stoi(m[4]), 90) << "a chart narrower than the page";
  EXPECT_EQ(m[5], "yes") << "a chart above the findings";
  EXPECT_EQ(dom.find("data-rendered=\"no\""), std::string::npos);
  // Legends on show speak words, not field names.
  const std::string shown = dom.substr(0, dom.find("<details id=\"internals\""));
  const std::regex key("<span class=\"key\"><i [^>]*></i>([^<]*)</span>");
  for (auto it = std::sregex_iterator(shown.begin(), shown.end(), key);
       it != std::sregex_iterator(); ++it) {
    EXPECT_EQ((*it)[1].str().find('_'), std::string::npos) << (*it)[1];
  }
  // Step axes: round ticks and the epochs' boundaries.
  const std::regex xtick("class=\"tick xtick\"");
  EXPECT_GE(std::distance(std::sregex_iterator(shown.begin(), shown.end(), xtick),
                          std::sregex_iterator()),
            5);
  EXPECT_NE(shown.find("class=\"epoch-mark\""), std::string::npos);
}

TEST(HtmlReportTest, ChromiumShowsTheRankedFindingsFirstAndDrawsEveryChart) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    GTEST_SKIP() << "Chromium not installed (Debian package chromium; scripts/setup.sh installs "
                    "it; TORCHPILOT_CHROMIUM names another binary)";
  }
  torchpilot_test::TempDir dir;
  // A short run through a Pilot.
  const std::string cpu = dir.file("report.html");
  make_report(cpu);
  const std::string dom = render(chromium, dir, cpu, "html_report_screenshot.png");
  expect_rendered_well(dom, 7);
  EXPECT_NE(dom.find("data-id=\"data_starvation\""), std::string::npos);

  // The GPU-like run: its findings in the DOM, in rank order, each once.
  const std::string gpu = dir.file("gpu.html");
  {
    HtmlReport report(gpu);
    make_gpu_like_report(report);
  }
  const std::string gdom = render(chromium, dir, gpu, "html_report_gpu_like.png");
  expect_rendered_well(gdom, 7);
  const auto section = gdom.find("<section id=\"findings\">");
  ASSERT_NE(section, std::string::npos);
  EXPECT_LT(section, gdom.find("<h2>", gdom.find("</section>", section)));
  const std::regex card(
      "<li class=\"finding( top)?\" data-rank=\"([0-9]+)\" data-id=\"([a-z_]+)\" "
      "data-subject=\"([^\"]*)\" data-gain=\"([0-9.]+)\"");
  std::vector<std::string> seen;
  double previous = 1e9;
  int rank = 0;
  for (auto it = std::sregex_iterator(gdom.begin(), gdom.end(), card); it != std::sregex_iterator();
       ++it) {
    const std::string key = (*it)[3].str() + "/" + (*it)[4].str();
    EXPECT_EQ(std::count(seen.begin(), seen.end(), key), 0) << key << " twice";
    seen.push_back(key);
    EXPECT_EQ(std::stoi((*it)[2]), ++rank);
    EXPECT_EQ((*it)[1].matched, rank == 1) << "only the first is singled out";
    EXPECT_LE(std::stod((*it)[5]), previous) << key << " out of order";
    previous = std::stod((*it)[5]);
  }
  EXPECT_EQ(rank, 4);
}

}  // namespace
}  // namespace torchpilot
