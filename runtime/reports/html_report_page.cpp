// The HTML report's page: its charts, styles and HtmlReport::html(), rendered from the state.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
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
namespace {

using detail::json;
using html_report_detail::panels;
using html_report_detail::panels_mutex;

std::string esc(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v, const char* f = "%.3g") {
  if (!measured(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string pct(double f) { return measured(f) ? num(100 * f, "%.1f") + "%" : "n/a"; }

const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Line {
  std::string name;
  std::vector<double> ys;
};

constexpr double kW = 760, kH = 220, kLeft = 56, kRight = 12, kTop = 12, kBottom = 28;

std::string axis_text(double v) { return num(v, std::fabs(v) >= 100 ? "%.0f" : "%.3g"); }

const char* color(size_t i) { return kColors[i % (sizeof kColors / sizeof kColors[0])]; }

// A chart's <svg> opening tag and its y grid: five lines from 0 to ymax, labelled.
std::string svg_with_y_grid(double ymax) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\">",
                kW, kH, kW, kH);
  std::string svg = buf;
  for (int i = 0; i <= 4; ++i) {
    const double v = ymax * i / 4, y = kTop + (1 - v / ymax) * (kH - kTop - kBottom);
    std::snprintf(buf, sizeof buf,
                  "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                  "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">",
                  kLeft, kW - kRight, y, y, kLeft - 4, y + 4);
    svg += buf + axis_text(v) + "</text>";
  }
  return svg;
}

// The legend's entry for series i.
std::string legend_key(size_t i, const std::string& name) {
  return "<span class=\"key\"><i style=\"background:" + std::string(color(i)) + "\"></i>" +
         esc(name) + "</span>";
}

// The chart's figure: its caption, the svg (closed here) and the legend.
std::string figure(const std::string& id, const std::string& title, const std::string& unit,
                   const std::string& svg, const std::string& legend) {
  return "<figure class=\"chart\" id=\"" + id + "\"><figcaption>" + esc(title) + " (" + esc(unit) +
         ")</figcaption>" + svg + "</svg><div class=\"legend\">" + legend + "</div></figure>\n";
}

// A line chart of `lines` over `xs`; values times `scale`; gaps (NaN) break a line.
std::string line_chart(const std::string& id, const std::string& title, const std::string& unit,
                       const std::vector<double>& xs, const std::vector<Line>& lines,
                       double scale = 1, double fixed_max = 0) {
  double xmin = 0, xmax = 1, ymax = fixed_max;
  if (!xs.empty()) {
    xmin = xs.front();
    xmax = std::max(xs.back(), xmin + 1);
  }
  if (fixed_max <= 0) {
    for (const Line& l : lines) {
      for (double y : l.ys) {
        if (measured(y)) ymax = std::max(ymax, y * scale);
      }
    }
    if (ymax <= 0) ymax = 1;
    ymax *= 1.05;
  }
  auto px = [&](double x) { return kLeft + (x - xmin) / (xmax - xmin) * (kW - kLeft - kRight); };
  auto py = [&](double y) { return kTop + (1 - y / ymax) * (kH - kTop - kBottom); };
  std::string svg = svg_with_y_grid(ymax);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\">%s</text>"
                "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>",
                kLeft, kH - 8, axis_text(xmin).c_str(), kW - kRight, kH - 8,
                axis_text(xmax).c_str());
  svg += buf;
  std::string legend;
  for (size_t li = 0; li < lines.size(); ++li) {
    std::string points;
    auto flush_line = [&] {
      if (!points.empty()) {
        svg += "<polyline fill=\"none\" stroke=\"" + std::string(color(li)) +
               "\" stroke-width=\"1.5\" data-series=\"" + esc(lines[li].name) + "\" points=\"" +
               points + "\"/>";
      }
      points.clear();
    };
    size_t count = 0;
    for (size_t i = 0; i < xs.size() && i < lines[li].ys.size(); ++i) {
      const double y = lines[li].ys[i];
      if (!measured(y)) {
        flush_line();
        continue;
      }
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(xs[i]), py(std::min(y * scale, ymax)));
      points += buf;
      ++count;
    }
    // A single point still shows (as a short dash).
    if (count == 1) {
      double x = 0, y = 0;
      std::sscanf(points.c_str(), "%lf,%lf", &x, &y);
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x + 4, y);
      points += buf;
    }
    flush_line();
    legend += legend_key(li, lines[li].name);
  }
  return figure(id, title, unit, svg, legend);
}

// Bars per epoch (values times `scale`), one group per label.
std::string bar_chart(const std::string& id, const std::string& title, const std::string& unit,
                      const std::vector<std::string>& labels, const std::vector<Line>& bars,
                      double scale) {
  double ymax = 0;
  for (const Line& b : bars) {
    for (double v : b.ys) {
      if (measured(v)) ymax = std::max(ymax, v * scale);
    }
  }
  if (ymax <= 0) ymax = 1;
  ymax *= 1.1;
  std::string svg = svg_with_y_grid(ymax);
  char buf[256];
  const double plot_w = kW - kLeft - kRight, plot_h = kH - kTop - kBottom;
  const double group = plot_w / std::max<size_t>(1, labels.size());
  const double bar = group * 0.8 / std::max<size_t>(1, bars.size());
  std::string legend;
  for (size_t g = 0; g < labels.size(); ++g) {
    const double x0 = kLeft + g * group + group * 0.1;
    std::snprintf(buf, sizeof buf,
                  "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                  x0 + group * 0.4, kH - 8);
    svg += buf + esc(labels[g]) + "</text>";
    for (size_t b = 0; b < bars.size(); ++b) {
      const double v = g < bars[b].ys.size() ? bars[b].ys[g] : kNotMeasured;
      if (!measured(v)) continue;
      const double h = std::max(1.0, v * scale / ymax * plot_h);
      std::snprintf(buf, sizeof buf,
                    "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                    "fill=\"%s\"><title>",
                    x0 + b * bar, kTop + plot_h - h, bar * 0.95, h, color(b));
      svg += buf + esc(bars[b].name + " " + labels[g] + ": " + num(v * scale)) + "</title></rect>";
    }
  }
  for (size_t b = 0; b < bars.size(); ++b) {
    legend += legend_key(b, bars[b].name);
  }
  return figure(id, title, unit, svg, legend);
}

std::string scalar_text(const json& v) {
  if (v.is_number_float()) return num(v.get<double>(), "%.4g");
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}
figure.chart{margin:12px 0}figcaption{font-weight:600;margin-bottom:4px}
.grid{stroke:#eee}.tick{font-size:11px;fill:#666}
.legend .key{margin-right:14px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.advice{border-left:4px solid #888;padding:6px 12px;margin:10px 0;background:#fafafa}
.advice.high{border-color:#d62728}.advice.warning{border-color:#ff7f0e}.advice.info{border-color:#1f77b4}
.muted{color:#777}
)";

// Counts the charts the browser actually drew (non-empty geometry) into #render-check.
const char* kCheckScript = R"(
document.addEventListener('DOMContentLoaded', function () {
  var charts = document.querySelectorAll('figure.chart'), drawn = 0;
  charts.forEach(function (f) {
    var ok = false;
    f.querySelectorAll('polyline, rect.bar').forEach(function (e) {
      var b = e.getBBox(); if (b.width > 0 || b.height > 0) ok = true;
    });
    f.setAttribute('data-rendered', ok ? 'yes' : 'no'); if (ok) drawn++;
  });
  var p = document.getElementById('render-check');
  p.setAttribute('data-charts', charts.length); p.setAttribute('data-drawn', drawn);
  p.textContent = 'charts: ' + charts.length + ', drawn: ' + drawn +
      ', advice: ' + document.querySelectorAll('.advice').length;
});
)";

}  // namespace

std::string HtmlReport::html() const {
  const State& s = *s_;
  std::string h;
  h += "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>torchpilot "
       "report</title><style>";
  h += kStyle;
  h += "</style></head><body>\n<h1>torchpilot report</h1>\n";
  std::string device;
  for (const auto& e : s.epochs) {
    if (const auto* g = e.sections.get<GpuEpochStats>()) device = g->device;
  }
  h += "<p class=\"muted\">run started " + esc(s.started) + "; " + std::to_string(s.epochs.size()) +
       " epochs, " + std::to_string(s.last_step + 1) + " steps" +
       (device.empty() ? std::string() : "; GPU " + esc(device)) + "</p>\n";
  // ETTR across restarts, from the run journal (report.journal_path).
  if (!s.epochs.empty()) {
    if (const auto* j = s.epochs.back().sections.get<RunJournalStats>()) {
      h += "<p id=\"ettr\">ETTR " + pct(j->ettr) + " over " + std::to_string(j->runs) +
           " runs: " + std::to_string(j->failures) + " failures, " + num(j->lost_s, "%.0f") +
           " s of work lost, " + std::to_string(j->checkpoints) + " checkpoints</p>\n";
    }
  }

  // Epochs.
  h += "<h2>Epochs</h2>\n<table id=\"epochs\"><tr><th>epoch</th><th>steps</th><th>samples/s</th>"
       "<th>step p50 ms</th><th>step p90 ms</th><th>data wait</th><th>GPU utilization</th>"
       "<th>SM efficiency</th><th>MFU</th><th>advice</th></tr>\n";
  for (size_t i = 0; i < s.epochs.size(); ++i) {
    const EpochSummary& e = s.epochs[i];
    const auto* g = e.sections.get<GpuEpochStats>();
    const auto* f = e.sections.get<FlopEpochStats>();
    // An interval (closed by torchpilot, no epoch end for interval.seconds) or the last steps at
    // exit say so beside the number.
    const char* kind = e.closed_by == PeriodEnd::kInterval ? " (interval)"
                       : e.closed_by == PeriodEnd::kExit   ? " (at exit)"
                                                           : "";
    h += "<tr><td>" + std::to_string(e.epoch) + kind + "</td><td>" + std::to_string(e.steps) +
         "</td><td>" + num(e.samples_per_s, "%.1f") + "</td><td>" +
         num(detail::ms(e.step_p50_ns), "%.2f") + "</td><td>" +
         num(detail::ms(e.step_p90_ns), "%.2f") + "</td><td>" + pct(e.data_wait_fraction) +
         "</td><td>" + (g ? pct(g->stats.counter_utilization) : "n/a") + "</td><td>" +
         (g ? pct(g->stats.sm_efficiency) : "n/a") + "</td><td>" + (f ? pct(f->mfu) : "n/a") +
         "</td><td>" + std::to_string(s.advice[i].size()) + "</td></tr>\n";
  }
  h += "</table>\n";

  // Steps.
  const std::vector<double> xs = s.steps.xs();
  if (!xs.empty()) {
    h += "<h2>Steps</h2>\n";
    std::vector<Line> lines = {{"step", s.steps.ys("step")}};
    for (const auto& p : s.phase_names) {
      if (s.steps.any("phase:" + p)) lines.push_back({p, s.steps.ys("phase:" + p)});
    }
    lines.push_back({"data wait", s.steps.ys("data wait")});
    h += line_chart("chart-step-time", "Step time and its phases over steps", "ms", xs, lines);
    h += line_chart("chart-data-wait", "Data-wait share of step time", "%", xs,
                    {{"data wait share", s.steps.ys("data_wait_share")}}, 100, 100);
  }

  // GPU.
  const std::vector<double> gx = s.gpu.xs();
  if (!gx.empty()) {
    h += "<h2>GPU</h2>\n";
    std::vector<Line> util;
    for (const char* n :
         {"counter_utilization", "nvml_utilization", "sm_efficiency", "gpu_utilization"}) {
      if (s.gpu.any(n)) util.push_back({n, s.gpu.ys(n)});
    }
    if (!util.empty()) {
      h += line_chart("chart-gpu-util", "GPU utilization beside SM efficiency", "%", gx, util, 100,
                      100);
    }
    std::vector<Line> pipes;
    for (const char* n : {"tensor_activity", "dram_throughput", "achieved_occupancy"}) {
      if (s.gpu.any(n)) pipes.push_back({n, s.gpu.ys(n)});
    }
    if (!pipes.empty()) {
      h += line_chart("chart-tensor-dram", "Tensor pipes and DRAM over time", "%", gx, pipes, 100,
                      100);
    }
  }

  // MFU per epoch.
  std::vector<std::string> labels;
  Line mfu{"MFU", {}}, hfu{"HFU", {}};
  bool any_mfu = false;
  for (const auto& e : s.epochs) {
    labels.push_back((e.closed_by == PeriodEnd::kInterval ? "interval " : "epoch ") +
                     std::to_string(e.epoch));
    const auto* f = e.sections.get<FlopEpochStats>();
    mfu.ys.push_back(f ? f->mfu : kNotMeasured);
    hfu.ys.push_back(f ? f->hfu : kNotMeasured);
    any_mfu = any_mfu || (f && measured(f->mfu));
  }
  if (any_mfu) {
    h += "<h2>MFU</h2>\n" + bar_chart("chart-mfu", "MFU per epoch", "%", labels, {mfu, hfu}, 100);
  }

  // Collectors' step figures: communication first (section "comm"), then the others.
  for (const auto& [section, names] : s.metric_names) {
    if (section == "flops") continue;
    std::vector<Line> lines;
    for (const auto& n : names) lines.push_back({n, s.steps.ys(section + "." + n)});
    const bool comm = section == "comm";
    h += "<h2>" + std::string(comm ? "Communication" : esc(section)) + "</h2>\n";
    h += line_chart("chart-metrics-" + esc(section),
                    comm ? "Communication and exposed communication" : section + " per step",
                    comm ? "ms" : "value", xs, lines);
  }

  // Auto-tune.
  if (!s.trials.empty() || s.decision) {
    h += "<h2>Auto-tune</h2>\n<table id=\"trials\"><tr><th class=\"l\">setting</th>"
         "<th>throughput</th><th>data wait</th><th>steps</th><th class=\"l\">kept</th></tr>\n";
    for (const auto& [t, kept] : s.trials) {
      h += "<tr><td class=\"l\">" + esc(to_string(t.setting)) + "</td><td>" +
           num(t.throughput, "%.1f") + " " + esc(t.unit) + "</td><td>" + pct(t.data_wait_fraction) +
           "</td><td>" + std::to_string(t.first_step) + "-" + std::to_string(t.last_step) +
           "</td><td class=\"l\">" +
           (t.confirmation ? std::string(t.failed ? "re-measurement " : "re-measurement") : "") +
           (t.failed ? "failed: " + esc(t.note)
            : kept   ? "best so far"
                     : "") +
           "</td></tr>\n";
    }
    h += "</table>\n";
    if (s.decision) {
      const TuningDecision& d = *s.decision;
      h += "<p id=\"decision\">decision at step " + std::to_string(d.decided_at_step) + ": " +
           esc(to_string(d.chosen)) + " at " + num(d.chosen_throughput, "%.1f") + " " +
           esc(d.unit) + " against " + esc(to_string(d.baseline)) + " at " +
           num(d.baseline_throughput, "%.1f") + " (" + esc(d.reason) + ")</p>\n";
    }
  }

  // Advice.
  h += "<h2>Advice</h2>\n";
  size_t advice_count = 0;
  for (size_t i = 0; i < s.advice.size(); ++i) {
    for (const Advice& a : s.advice[i]) {
      ++advice_count;
      h += "<div class=\"advice " + std::string(to_string(a.severity)) + "\" data-id=\"" +
           esc(a.id) + "\"><b>[" + to_string(a.severity) + "] " + esc(a.id) + "</b> (epoch " +
           std::to_string(a.epoch) + ")<br>" + esc(a.finding) + "<br><i>cause:</i> " +
           esc(a.cause) + "<br><i>action:</i> " + esc(a.action) + "<br><i>expected gain:</i> " +
           (a.expected_gain > 0 ? "+" + num(100 * a.expected_gain, "%.1f") + "%" +
                                      (a.gain_estimated ? " (estimated)" : " (measured)")
                                : std::string("not estimated")) +
           "<table class=\"evidence\"><tr><th class=\"l\">evidence</th><th>value</th>"
           "<th class=\"l\">unit</th></tr>";
      for (const Evidence& e : a.evidence) {
        h += "<tr><td class=\"l\">" + esc(e.name) + "</td><td>" + num(e.value, "%.4g") +
             "</td><td class=\"l\">" + esc(e.unit) + "</td></tr>";
      }
      h += "</table></div>\n";
    }
  }
  if (advice_count == 0) h += "<p>no advice</p>\n";

  // Sections this report does not chart (the run journal, collectives, a program's own), as
  // tables of their scalar fields, latest epoch.
  if (!s.epochs.empty()) {
    for (const auto& sec : s.epochs.back().sections.all()) {
      const std::string name(sec->name());
      if (name == "gpu" || name == "flops" || name == "loader") continue;
      json j;
      try {
        j = json::parse(sec->json());
      } catch (const std::exception&) {
        continue;
      }
      if (!j.is_object()) continue;
      h += "<h2>" + esc(name) + "</h2>\n<table class=\"section\" data-section=\"" + esc(name) +
           "\">";
      for (const auto& [k, v] : j.items()) {
        if (v.is_structured()) continue;
        h += "<tr><td class=\"l\">" + esc(k) + "</td><td>" + esc(scalar_text(v)) + "</td></tr>";
      }
      h += "</table>\n";
    }
  }

  // Panels registered by other parts of the library.
  std::vector<std::pair<std::string, ReportPanel>> extra;
  {
    std::lock_guard<std::mutex> lock(panels_mutex());
    extra = panels();
  }
  ReportView view{&s.epochs, &s.advice};
  for (const auto& [name, panel] : extra) {
    try {
      h += panel(view);
    } catch (const std::exception& e) {
      h += "<p class=\"muted\">panel " + esc(name) + " failed: " + esc(e.what()) + "</p>\n";
    }
  }

  h += "<p id=\"render-check\" class=\"muted\">charts not checked (scripts off)</p>\n<script>";
  h += kCheckScript;
  h += "</script>\n</body></html>\n";
  return h;
}

}  // namespace torchpilot
