#include "torchpilot/runtime/reports/html_report.h"

#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "html_report_internal.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/flops/flop_records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/reports/run_journal.h"

namespace torchpilot {
namespace html_report_detail {

std::mutex& panels_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::pair<std::string, ReportPanel>>& panels() {
  static std::vector<std::pair<std::string, ReportPanel>> p;
  return p;
}

}  // namespace html_report_detail

using html_report_detail::panels;
using html_report_detail::panels_mutex;

void register_report_panel(std::string name, ReportPanel panel) {
  std::lock_guard<std::mutex> lock(panels_mutex());
  for (auto& p : panels()) {
    if (p.first == name) {
      p.second = std::move(panel);
      return;
    }
  }
  panels().emplace_back(std::move(name), std::move(panel));
}

HtmlReport::HtmlReport(std::string path) : s_(std::make_unique<State>()), path_(std::move(path)) {
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec)) {
    throw ConfigError("<config>", "report.html_path",
                      "the folder '" + dir.string() + "' does not exist");
  }
  const std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  s_->started = buf;
}

HtmlReport::~HtmlReport() = default;

void HtmlReport::on_step(const StepRecord& r, const std::vector<std::string>& phase_names) {
  if (phase_names.size() > s_->phase_names.size()) s_->phase_names = phase_names;
  std::vector<std::pair<std::string, double>> v;
  const double step_ms = detail::ms(r.step_ns());
  v.emplace_back("step", step_ms);
  // Throughput of the step alone; steps of one epoch average to its samples/s over merged points.
  const double step_s = static_cast<double>(r.step_ns()) / 1e9;
  v.emplace_back("samples/s", r.samples > 0 && step_s > 0 ? r.samples / step_s : kNotMeasured);
  v.emplace_back("steps/s", step_s > 0 ? 1 / step_s : kNotMeasured);
  v.emplace_back("data wait", detail::ms(r.data_wait_ns));
  v.emplace_back("data_wait_share", r.step_ns() > 0
                                        ? static_cast<double>(r.data_wait_ns) / r.step_ns()
                                        : kNotMeasured);
  for (size_t i = 0; i < phase_names.size() && i < r.phase_ns.size(); ++i) {
    v.emplace_back("phase:" + phase_names[i], detail::ms(r.phase_ns[i]));
  }
  for (const auto& m : r.metrics) {
    auto& names = s_->metric_names[m.section];
    if (std::find(names.begin(), names.end(), m.name) == names.end()) names.push_back(m.name);
    v.emplace_back(std::string(m.section) + "." + m.name, m.value);
  }
  s_->steps.add(static_cast<double>(r.step), v);
  s_->last_step = r.step;
  dirty_ = true;
}

void HtmlReport::on_late_step(const LateStepRecord& r) {
  const GpuStepRecord* g = r.get<GpuStepRecord>();
  if (g == nullptr) return;
  const GpuStats& s = g->stats;
  s_->gpu.add(static_cast<double>(g->step), {{"counter_utilization", s.counter_utilization},
                                             {"nvml_utilization", s.nvml_utilization},
                                             {"sm_efficiency", s.sm_efficiency},
                                             {"gpu_utilization", s.gpu_utilization},
                                             {"tensor_activity", s.tensor_activity},
                                             {"dram_throughput", s.dram_throughput},
                                             {"achieved_occupancy", s.achieved_occupancy}});
  dirty_ = true;
}

void HtmlReport::on_epoch(const EpochSummary& summary, const std::vector<Advice>& advice) {
  s_->epochs.push_back(summary);
  s_->advice.push_back(advice);
  dirty_ = true;
  write();
}

void HtmlReport::on_trial(const TrialResult& trial, bool kept) {
  s_->trials.emplace_back(trial, kept);
  dirty_ = true;
}

void HtmlReport::on_decision(const TuningDecision& decision) {
  s_->decision = decision;
  dirty_ = true;
}

void HtmlReport::flush() {
  if (dirty_) write();
}

void HtmlReport::write() {
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << html();
    if (!out) throw std::runtime_error("cannot write '" + tmp + "'");
  }
  std::filesystem::rename(tmp, path_);  // a browser never loads half a file
  dirty_ = false;
}

std::shared_ptr<HtmlReport> make_html_report(const std::string& path) {
  return std::make_shared<HtmlReport>(path);
}

}  // namespace torchpilot
