// The HTML report (docs/reports.md, "HTML report"): one self-contained file per run (inline SVG
// and CSS, one inline script that checks the charts rendered; no network), rewritten at each
// epoch's end and at flush() (the Pilot's exit). Built from what the sinks receive: steps, the
// GPU monitor's late step records, epoch summaries with their sections and advice, auto-tune
// trials and the decision. It leads with the run's findings (findings.h: the advice deduplicated
// across epochs and ranked by gain), then the charts.
//
// Memory is bounded: per-step series keep at most kMaxPoints points; past that, neighbouring
// points are merged (means over twice as many steps).
//
// Communication: a collector's step times in section "comm" (metrics named *_ms, e.g.
// comm.time_ms, comm.exposed_ms) are drawn in the "Communication" chart; other collectors' step
// metrics in one chart per section, and epoch sections this file does not chart as tables of
// their JSON fields, both folded under "Internals". Panels of code elsewhere:
// register_report_panel.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {

// What a report panel sees: the epochs with their advice, trials and the decision so far.
struct ReportView {
  const std::vector<EpochSummary>* epochs = nullptr;
  const std::vector<std::vector<Advice>>* advice = nullptr;  // per epoch
};

// A panel: returns an HTML fragment (a <section>), or "" to show nothing. Thread-safe to call.
using ReportPanel = std::function<std::string(const ReportView&)>;
void register_report_panel(std::string name, ReportPanel panel);

// The report as HTML text (the sink writes this to its path).
class HtmlReport : public Sink {
 public:
  static constexpr size_t kMaxPoints = 2048;
  explicit HtmlReport(std::string path);
  ~HtmlReport() override;
  std::string name() const override { return "html_report"; }
  void on_step(const StepRecord& record, const std::vector<std::string>& phase_names) override;
  void on_epoch(const EpochSummary& summary, const std::vector<Advice>& advice) override;
  void on_trial(const TrialResult& trial, bool kept) override;
  void on_decision(const TuningDecision& decision) override;
  void on_late_step(const LateStepRecord& record) override;
  void flush() override;

  std::string html() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::string path_;
  bool dirty_ = false;
  void write();
};

// Opens nothing at construction; throws ConfigError (report.html_path) if the folder is missing.
std::shared_ptr<HtmlReport> make_html_report(const std::string& path);

}  // namespace torchpilot
