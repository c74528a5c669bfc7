// The HTML report's state and panel registry, shared by html_report.cpp (the state it gathers)
// and html_report_page.cpp (the page rendered from it).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/reports/html_report.h"

namespace torchpilot {
namespace html_report_detail {

// Panels registered by other parts of the library (register_report_panel), under their mutex.
std::mutex& panels_mutex();
std::vector<std::pair<std::string, ReportPanel>>& panels();

// Named columns over an increasing x; past kMaxPoints points, neighbours are merged (means).
class Series {
 public:
  void add(double x, const std::vector<std::pair<std::string, double>>& values) {
    open_.x += x;
    ++open_.n;
    for (const auto& [name, v] : values) {
      const size_t c = column(name);
      if (open_.sum.size() <= c) open_.sum.resize(c + 1, 0), open_.cnt.resize(c + 1, 0);
      if (measured(v)) {
        open_.sum[c] += v;
        ++open_.cnt[c];
      }
    }
    if (static_cast<size_t>(open_.n) < stride_) return;
    points_.push_back(std::move(open_));
    open_ = {};
    if (points_.size() >= HtmlReport::kMaxPoints) merge();
  }
  const std::vector<std::string>& names() const { return names_; }
  bool empty() const { return points_.empty() && open_.n == 0; }
  std::vector<double> xs() const {
    std::vector<double> out;
    for (const Point* p : all()) out.push_back(p->x / p->n);
    return out;
  }
  std::vector<double> ys(const std::string& name) const {
    std::vector<double> out;
    const auto it = std::find(names_.begin(), names_.end(), name);
    const size_t c = static_cast<size_t>(it - names_.begin());
    for (const Point* p : all()) {
      const bool has = it != names_.end() && c < p->cnt.size() && p->cnt[c] > 0;
      out.push_back(has ? p->sum[c] / p->cnt[c] : kNotMeasured);
    }
    return out;
  }
  bool any(const std::string& name) const {
    for (double v : ys(name)) {
      if (measured(v)) return true;
    }
    return false;
  }

 private:
  struct Point {
    double x = 0;
    int n = 0;
    std::vector<double> sum;
    std::vector<int> cnt;
  };
  size_t column(const std::string& name) {
    const auto it = std::find(names_.begin(), names_.end(), name);
    if (it != names_.end()) return static_cast<size_t>(it - names_.begin());
    names_.push_back(name);
    return names_.size() - 1;
  }
  void merge() {
    std::vector<Point> merged;
    for (size_t i = 0; i + 1 < points_.size(); i += 2) {
      Point p = points_[i];
      const Point& q = points_[i + 1];
      p.x += q.x;
      p.n += q.n;
      p.sum.resize(std::max(p.sum.size(), q.sum.size()), 0);
      p.cnt.resize(p.sum.size(), 0);
      for (size_t c = 0; c < q.sum.size(); ++c) {
        p.sum[c] += q.sum[c];
        p.cnt[c] += q.cnt[c];
      }
      merged.push_back(std::move(p));
    }
    if (points_.size() % 2 == 1) merged.push_back(points_.back());
    points_ = std::move(merged);
    stride_ *= 2;
  }
  std::vector<const Point*> all() const {
    std::vector<const Point*> out;
    for (const Point& p : points_) out.push_back(&p);
    if (open_.n > 0) out.push_back(&open_);
    return out;
  }
  std::vector<std::string> names_;
  std::vector<Point> points_;
  Point open_;
  size_t stride_ = 1;
};

}  // namespace html_report_detail

struct HtmlReport::State {
  html_report_detail::Series
      steps;  // x: step; step_ms, data_wait_ms, phase ms, data_wait_share, metrics
  html_report_detail::Series gpu;  // x: step; the GPU figures of each step
  std::vector<std::string> phase_names;
  std::map<std::string, std::vector<std::string>> metric_names;  // section -> names
  std::vector<EpochSummary> epochs;
  std::vector<std::vector<Advice>> advice;
  std::vector<std::pair<TrialResult, bool>> trials;
  std::optional<TuningDecision> decision;
  int64_t last_step = -1;
  std::string started;
};

}  // namespace torchpilot
