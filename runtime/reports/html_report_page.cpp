// The HTML report's page: its charts, styles and HtmlReport::html(), rendered from the state.
// Order (docs/reports.md): what to fix first (the ranked findings), then the figures that show
// it (throughput, GPU, MFU, communication, memory, loader, auto-tune), the epochs, and the
// internals folded away.
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
#include "torchpilot/runtime/loader/loader_records.h"
#include "torchpilot/runtime/memory/memory_records.h"
#include "torchpilot/runtime/reports/findings.h"
#include "torchpilot/runtime/reports/run_journal.h"

namespace torchpilot {
namespace {

using detail::json;
using html_report_detail::panels;
using html_report_detail::panels_mutex;

const char* kDash = "\xe2\x80\x94";   // — for a figure not measured
const char* kArrow = "\xe2\x86\x92";  // →

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
  if (!measured(v)) return kDash;
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string pct(double f) { return measured(f) ? num(100 * f, "%.1f") + "%" : kDash; }
std::string gain_text(double g) { return "+" + num(100 * g, g < 0.1 ? "%.1f" : "%.0f") + "%"; }

// "data_starvation" -> "Data starvation", "low_mfu" -> "Low MFU": an advice id or a field name
// as words.
std::string words(const std::string& name, bool capital) {
  std::string out = name;
  std::replace(out.begin(), out.end(), '_', ' ');
  for (const char* acronym : {"mfu", "hfu", "gpu", "cpu", "sm"}) {
    const std::string a = acronym;
    for (size_t at = out.find(a); at != std::string::npos; at = out.find(a, at + a.size())) {
      const bool starts = at == 0 || out[at - 1] == ' ';
      const bool ends = at + a.size() == out.size() || out[at + a.size()] == ' ';
      if (starts && ends) {
        for (size_t i = 0; i < a.size(); ++i) out[at + i] = static_cast<char>(a[i] - 'a' + 'A');
      }
    }
  }
  if (capital && !out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = out[0] - 'a' + 'A';
  return out;
}

const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
const char* color(size_t i) { return kColors[i % (sizeof kColors / sizeof kColors[0])]; }

// A line: `label` in the legend (words, with the chart's unit in its caption), `key` the field it
// draws (data-series, for tools and tests; the label when empty).
struct Line {
  std::string label;
  std::vector<double> ys;
  std::string key;
};

// A vertical mark on a step axis: an epoch's first step, or the tuning decision.
struct Mark {
  double x = 0;
  std::string label;
  const char* cls = "epoch-mark";
};

// Charts are drawn in a 1040-unit-wide box and scaled to the page's width.
constexpr double kW = 1040, kH = 240, kLeft = 56, kRight = 16, kTop = 22, kBottom = 34;

std::string axis_text(double v) { return num(v, std::fabs(v) >= 100 ? "%.0f" : "%.3g"); }

// Round tick positions (1, 2 or 5 times a power of ten) covering [lo, hi], about `n` of them.
std::vector<double> ticks(double lo, double hi, int n) {
  std::vector<double> out;
  if (!(hi > lo)) return out;
  const double raw = (hi - lo) / n, mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
  return out;
}

// A chart's <svg> opening tag and its y grid from 0 to ymax, labelled.
std::string svg_with_y_grid(double ymax) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %.0f %.0f\" "
                "preserveAspectRatio=\"xMinYMin meet\">",
                kW, kH);
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

std::string legend_key(size_t i, const std::string& label) {
  return "<span class=\"key\"><i style=\"background:" + std::string(color(i)) + "\"></i>" +
         esc(label) + "</span>";
}

// The chart's figure: its caption, the svg (closed here) and the legend.
std::string figure(const std::string& id, const std::string& title, const std::string& unit,
                   const std::string& svg, const std::string& legend) {
  return "<figure class=\"chart\" id=\"" + esc(id) + "\"><figcaption>" + esc(title) + " (" +
         esc(unit) + ")</figcaption>" + svg + "</svg><div class=\"legend\">" + legend +
         "</div></figure>\n";
}

// A line chart of `lines` over steps `xs`; values times `scale`; gaps (NaN) break a line. The x
// axis has round ticks and `marks` (epoch boundaries) as dashed lines with their labels.
std::string line_chart(const std::string& id, const std::string& title, const std::string& unit,
                       const std::vector<double>& xs, const std::vector<Line>& lines,
                       const std::vector<Mark>& marks, double scale = 1, double fixed_max = 0) {
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
  char buf[320];
  const double axis_y = kH - kBottom;
  for (double t : ticks(xmin, xmax, 8)) {
    std::snprintf(buf, sizeof buf,
                  "<line class=\"axis\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                  "<text class=\"tick xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                  px(t), px(t), axis_y, axis_y + 4, px(t), axis_y + 15);
    svg += buf + axis_text(t) + "</text>";
  }
  std::snprintf(buf, sizeof buf,
                "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">step</text>",
                kW - kRight, kH - 3);
  svg += buf;
  // Marks inside the axis, left to right (one at its left edge labelled only); an epoch's label
  // only where there is room for it after the previous one.
  std::vector<Mark> sorted = marks;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Mark& a, const Mark& b) { return a.x < b.x; });
  double label_end = -1e9;
  for (const Mark& m : sorted) {
    if (m.x < xmin - 1 || m.x > xmax) continue;
    const double x = px(std::max(m.x, xmin));
    if (m.x > xmin) {
      std::snprintf(buf, sizeof buf,
                    "<line class=\"%s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", m.cls,
                    x, x, kTop - 6, axis_y);
      svg += buf;
    }
    if (std::string(m.cls) == "decision-mark") {  // always said, below the epochs' labels
      std::snprintf(buf, sizeof buf, "<text class=\"mark-label\" x=\"%.1f\" y=\"%.1f\">", x + 3,
                    kTop + 10);
      svg += buf + esc(m.label) + "</text>";
      continue;
    }
    if (x >= label_end && x < kW - kRight - 30) {
      std::snprintf(buf, sizeof buf, "<text class=\"mark-label\" x=\"%.1f\" y=\"%.1f\">", x + 3,
                    kTop - 9);
      svg += buf + esc(m.label) + "</text>";
      label_end = x + 10 + 6.0 * static_cast<double>(m.label.size());  // 11px text: ~6 a letter
    }
  }
  std::string legend;
  for (size_t li = 0; li < lines.size(); ++li) {
    const std::string& key = lines[li].key.empty() ? lines[li].label : lines[li].key;
    std::string points;
    auto flush_line = [&] {
      if (!points.empty()) {
        svg += "<polyline fill=\"none\" stroke=\"" + std::string(color(li)) +
               "\" stroke-width=\"1.5\" data-series=\"" + esc(key) + "\" points=\"" + points +
               "\"/>";
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
    legend += legend_key(li, lines[li].label);
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
  char buf[320];
  const double plot_w = kW - kLeft - kRight, plot_h = kH - kTop - kBottom;
  const double group = plot_w / std::max<size_t>(1, labels.size());
  const double bar = group * 0.8 / std::max<size_t>(1, bars.size());
  // Every label where they fit, else every k-th.
  const size_t every = std::max<size_t>(1, static_cast<size_t>(std::ceil(70 / group)));
  std::string legend;
  for (size_t g = 0; g < labels.size(); ++g) {
    const double x0 = kLeft + g * group + group * 0.1;
    if (g % every == 0) {
      std::snprintf(buf, sizeof buf,
                    "<text class=\"tick xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                    x0 + group * 0.4, kH - kBottom + 15);
      svg += buf + esc(labels[g]) + "</text>";
    }
    for (size_t b = 0; b < bars.size(); ++b) {
      const double v = g < bars[b].ys.size() ? bars[b].ys[g] : kNotMeasured;
      if (!measured(v)) continue;
      const double h = std::max(1.0, v * scale / ymax * plot_h);
      std::snprintf(buf, sizeof buf,
                    "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                    "fill=\"%s\"><title>",
                    x0 + b * bar, kTop + plot_h - h, bar * 0.95, h, color(b));
      svg += buf + esc(bars[b].label + " " + labels[g] + ": " + num(v * scale) + " " + unit) +
             "</title></rect>";
    }
  }
  for (size_t b = 0; b < bars.size(); ++b) legend += legend_key(b, bars[b].label);
  return figure(id, title, unit, svg, legend);
}

// A finding's trend as a tiny line (no axes): its gain per epoch, or its figure without gains.
std::string sparkline(const std::vector<double>& ys) {
  if (ys.size() < 2) return {};
  const auto [lo, hi] = std::minmax_element(ys.begin(), ys.end());
  const double span = *hi - *lo > 0 ? *hi - *lo : 1;
  std::string points;
  char buf[64];
  for (size_t i = 0; i < ys.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.1f,%.1f ", 2 + 76.0 * i / (ys.size() - 1),
                  16 - 14 * (ys[i] - *lo) / span);
    points += buf;
  }
  return "<svg class=\"spark\" viewBox=\"0 0 80 18\" width=\"80\" height=\"18\"><polyline "
         "fill=\"none\" stroke=\"#555\" stroke-width=\"1.5\" points=\"" +
         points + "\"/></svg>";
}

// "0-3, 5": the epochs a finding was given in, runs collapsed.
std::string epoch_ranges(const std::vector<FindingPoint>& trend) {
  std::string out;
  for (size_t i = 0; i < trend.size();) {
    size_t j = i;
    while (j + 1 < trend.size() && trend[j + 1].epoch == trend[j].epoch + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(trend[i].epoch);
    if (j > i) out += "\xe2\x80\x93" + std::to_string(trend[j].epoch);  // en dash
    i = j + 1;
  }
  return out;
}

// "epochs 0-7: +42% -> +38%" (or its first evidence figure when no gain was estimated), with a
// sparkline of three points or more.
std::string trend_text(const Finding& f) {
  const auto& t = f.trend;
  std::string out = (t.size() == 1 ? "epoch " : "epochs ") + epoch_ranges(t);
  const bool gains =
      std::any_of(t.begin(), t.end(), [](const FindingPoint& p) { return p.gain > 0; });
  std::vector<double> ys;
  for (const FindingPoint& p : t) ys.push_back(gains ? p.gain : p.figure);
  if (gains) {
    out += ": " + gain_text(t.front().gain);
    if (t.size() > 1) out += " " + std::string(kArrow) + " " + gain_text(t.back().gain);
  } else if (!f.latest.evidence.empty()) {
    const Evidence& e = f.latest.evidence.front();
    out += ": " + esc(words(e.name, false)) + " " + num(t.front().figure, "%.3g");
    if (t.size() > 1) out += " " + std::string(kArrow) + " " + num(t.back().figure, "%.3g");
    if (e.unit != "fraction") out += " " + esc(e.unit);
  }
  return "<span class=\"trend\">" + out + (ys.size() >= 3 ? " " + sparkline(ys) : "") + "</span>";
}

std::string evidence_table(const Advice& a) {
  std::string h =
      "<table class=\"evidence\"><tr><th class=\"l\">evidence</th><th>value</th>"
      "<th class=\"l\">unit</th></tr>";
  for (const Evidence& e : a.evidence) {
    h += "<tr><td class=\"l\">" + esc(words(e.name, false)) + "</td><td>" + num(e.value, "%.4g") +
         "</td><td class=\"l\">" + esc(e.unit) + "</td></tr>";
  }
  return h + "</table>";
}

// A ranked finding: its gain (measured or estimated), what was found, the one action, its trend,
// what auto-tune did about it; the cause and evidence folded.
std::string finding_card(const Finding& f, size_t rank) {
  const Advice& a = f.latest;
  const std::string gain = a.expected_gain > 0
                               ? "<span class=\"gain\">" + gain_text(a.expected_gain) +
                                     "</span><span class=\"how\">" +
                                     (a.gain_estimated ? "estimated" : "measured") + "</span>"
                               : std::string("<span class=\"how\">gain not estimated</span>");
  std::string h = "<li class=\"finding" + std::string(rank == 1 ? " top" : "") + "\" data-rank=\"" +
                  std::to_string(rank) + "\" data-id=\"" + esc(f.id) + "\" data-subject=\"" +
                  esc(f.subject) + "\" data-gain=\"" + num(a.expected_gain, "%.4f") + "\">";
  if (rank == 1) h += "<div class=\"first\">Fix this first</div>";
  h += "<div class=\"head\">" + gain + "<b>" + esc(words(f.id, true)) + "</b>" +
       (f.subject.empty() ? "" : " (" + esc(f.subject) + ")") + " <span class=\"sev " +
       to_string(a.severity) + "\">" + to_string(a.severity) + "</span></div>";
  h += "<p>" + esc(a.finding) + "</p><p class=\"action\"><b>Do:</b> " + esc(a.action) + "</p>";
  h += "<p class=\"muted\">" + trend_text(f);
  if (!f.tuned_setting.empty()) {
    h += "; auto-tune chose " + esc(f.tuned_setting) + ", and it was still found after that";
  }
  h += "</p><details><summary>cause and evidence</summary><p><i>cause:</i> " + esc(a.cause) +
       "</p>" + evidence_table(a) + "</details></li>\n";
  return h;
}

std::string findings_section(const Findings& f, const std::optional<TuningDecision>& decision,
                             size_t epochs) {
  std::string h = "<section id=\"findings\"><h2>What to fix first</h2>\n";
  if (f.ranked.empty()) {
    h += "<p>No open findings: no advisor spoke in the last of " + std::to_string(epochs) +
         " epochs.</p>\n";
  } else {
    h += "<ol class=\"ranked\">\n";
    for (size_t i = 0; i < f.ranked.size(); ++i) h += finding_card(f.ranked[i], i + 1);
    h += "</ol>\n";
  }
  if (!f.answered.empty()) {
    // The tuner measured what these advise: its decision, not the advisor's estimate, stands.
    h += "<h3>Answered by auto-tune</h3><ul id=\"answered\">\n";
    for (const Finding& a : f.answered) {
      h += "<li class=\"finding answered\" data-id=\"" + esc(a.id) + "\"><b>" +
           esc(words(a.id, true)) + "</b> (" + trend_text(a) + "): answered by tuning: kept " +
           esc(a.tuned_setting);
      if (decision && decision->baseline_throughput > 0) {
        h += ", measured " + num(decision->baseline_throughput, "%.0f") + " " + kArrow + " " +
             num(decision->chosen_throughput, "%.0f") + " " + esc(decision->unit);
      }
      h += "</li>\n";
    }
    h += "</ul>\n";
  }
  if (!f.earlier.empty()) {
    h += "<h3>No longer found</h3><ul id=\"earlier\">\n";
    for (const Finding& e : f.earlier) {
      h += "<li class=\"finding earlier\" data-id=\"" + esc(e.id) + "\"><b>" +
           esc(words(e.id, true)) + "</b>" +
           (e.subject.empty() ? "" : " (" + esc(e.subject) + ")") + ": " + trend_text(e) + "; " +
           esc(e.latest.finding) + "</li>\n";
    }
    h += "</ul>\n";
  }
  return h + "</section>\n";
}

// The GPU monitor's figures, as the charts label them.
const std::pair<const char*, const char*> kGpuUtilization[] = {
    {"sm_efficiency", "SM efficiency (counters)"},
    {"counter_utilization", "GPU busy (counters)"},
    {"nvml_utilization", "NVML utilization"},
    {"gpu_utilization", "GPU busy (trace windows)"}};
const std::pair<const char*, const char*> kGpuPipes[] = {
    {"tensor_activity", "tensor pipes active"},
    {"dram_throughput", "DRAM bandwidth used"},
    {"achieved_occupancy", "achieved occupancy"}};

// A step metric's legend label: communication's own names in words, "_ms" dropped (the unit is in
// the caption).
std::string metric_label(const std::string& section, const std::string& name) {
  if (section == "comm" && (name == "time_ms" || name == "communication_ms"))
    return "communication";
  if (section == "comm" && (name == "exposed_ms" || name == "exposed_communication_ms")) {
    return "exposed (not overlapped)";
  }
  const bool ms = name.size() > 3 && name.compare(name.size() - 3, 3, "_ms") == 0;
  return words(ms ? name.substr(0, name.size() - 3) : name, false);
}
bool is_ms(const std::string& name) {
  return name.size() > 3 && name.compare(name.size() - 3, 3, "_ms") == 0;
}

std::string scalar_text(const json& v) {
  if (v.is_null()) return kDash;
  if (v.is_number_float()) return num(v.get<double>(), "%.4g");
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string setting_cell(const Setting& s) { return s.empty() ? "(none)" : to_string(s); }

const char* kStyle = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;padding:0 24px;color:#222;max-width:1100px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:30px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}tr.chosen td{background:#e8f5e9;font-weight:600}
figure.chart{margin:14px 0}figure.chart svg{width:100%;height:auto;display:block}
figcaption{font-weight:600;margin-bottom:4px}
.grid{stroke:#eee}.axis{stroke:#999}.tick{font-size:11px;fill:#666}
.epoch-mark{stroke:#bbb;stroke-dasharray:4 3}.decision-mark{stroke:#2ca02c;stroke-dasharray:6 3}
.mark-label{font-size:11px;fill:#888}
.legend .key{margin-right:14px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
ol.ranked{list-style:none;padding:0;margin:0}
.finding{border-left:4px solid #888;padding:6px 12px;margin:10px 0;background:#fafafa}
.finding p{margin:4px 0}.finding .head b{font-size:15px}
.finding.top{border-left-width:8px;background:#fff8e6;padding:10px 16px}.finding.top .head b{font-size:18px}
.first{font-weight:700;color:#b35c00;text-transform:uppercase;font-size:12px;letter-spacing:.05em}
.gain{font-weight:700;font-size:18px;margin-right:4px;color:#1a7f37}.how{font-size:12px;color:#666;margin-right:10px}
.sev{font-size:11px;padding:1px 6px;border-radius:8px;background:#eee}.sev.high{background:#fde2e1}
.sev.warning{background:#fff0d9}.action{font-weight:500}
.finding.answered,.finding.earlier{border-color:#2ca02c;background:#f5fbf6}.finding.earlier{border-color:#bbb}
.spark{vertical-align:middle}
.advice{border-left:4px solid #888;padding:6px 12px;margin:10px 0;background:#fafafa}
.advice.high,.finding:has(.sev.high){border-color:#d62728}.advice.warning,.finding:has(.sev.warning){border-color:#ff7f0e}
.advice.info{border-color:#1f77b4}
.muted{color:#777}details#internals{margin-top:30px}details#internals>summary{font-size:18px;font-weight:600;cursor:pointer}
)";

// Checks what the browser drew into #render-check: the charts on show with non-empty geometry
// (getBBox; charts in a closed <details> are not drawn and are counted apart), the narrowest chart
// as a share of the page's text width, and whether the findings come before every chart.
const char* kCheckScript = R"(
document.addEventListener('DOMContentLoaded', function () {
  var charts = document.querySelectorAll('figure.chart'), shown = 0, drawn = 0, narrowest = 100;
  var findings = document.getElementById('findings'), first = 'yes';
  var width = document.querySelector('h1').getBoundingClientRect().width;
  charts.forEach(function (f) {
    if (f.closest('details:not([open])')) return;
    shown++;
    var ok = false;
    f.querySelectorAll('polyline, rect.bar').forEach(function (e) {
      var b = e.getBBox(); if (b.width > 0 || b.height > 0) ok = true;
    });
    f.setAttribute('data-rendered', ok ? 'yes' : 'no'); if (ok) drawn++;
    var r = f.querySelector('svg').getBoundingClientRect();
    narrowest = Math.min(narrowest, Math.round(100 * r.width / width));
    if (findings && r.top < findings.getBoundingClientRect().top) first = 'no';
  });
  var p = document.getElementById('render-check');
  p.setAttribute('data-charts', shown); p.setAttribute('data-drawn', drawn);
  p.setAttribute('data-folded', charts.length - shown);
  p.setAttribute('data-narrowest', narrowest); p.setAttribute('data-findings-first', first);
  p.textContent = 'charts: ' + shown + ', drawn: ' + drawn + ', findings: ' +
      document.querySelectorAll('#findings .finding').length;
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

  // What to fix first.
  const Findings findings = rank_findings(s.epochs, s.advice, s.decision ? &*s.decision : nullptr);
  h += findings_section(findings, s.decision, s.epochs.size());

  // ETTR across restarts, from the run journal (report.journal_path).
  if (!s.epochs.empty()) {
    if (const auto* j = s.epochs.back().sections.get<RunJournalStats>()) {
      h += "<p id=\"ettr\">ETTR " + pct(j->ettr) + " over " + std::to_string(j->runs) +
           " runs: " + std::to_string(j->failures) + " failures, " + num(j->lost_s, "%.0f") +
           " s of work lost, " + std::to_string(j->checkpoints) + " checkpoints</p>\n";
    }
  }

  // Epoch boundaries (and the tuning decision) on every step axis.
  std::vector<Mark> marks;
  for (const auto& e : s.epochs) {
    marks.push_back(
        {static_cast<double>(e.first_step) - 0.5,
         (e.closed_by == PeriodEnd::kInterval ? "interval " : "epoch ") + std::to_string(e.epoch)});
  }
  if (s.decision && !s.decision->trials.empty()) {  // no trials: nothing was tunable
    marks.push_back({static_cast<double>(s.decision->decided_at_step) + 0.5, "auto-tune decided",
                     "decision-mark"});
  }

  // Throughput and step time.
  const std::vector<double> xs = s.steps.xs();
  if (!xs.empty()) {
    h += "<h2>Throughput</h2>\n";
    const bool samples = s.steps.any("samples/s");
    h += line_chart("chart-throughput", "Throughput over steps", samples ? "samples/s" : "steps/s",
                    xs,
                    {{samples ? "throughput" : "steps per second",
                      s.steps.ys(samples ? "samples/s" : "steps/s"), "throughput"}},
                    marks);
    std::vector<Line> lines = {{"step", s.steps.ys("step"), "step"}};
    for (const auto& p : s.phase_names) {
      if (s.steps.any("phase:" + p)) lines.push_back({p, s.steps.ys("phase:" + p), p});
    }
    lines.push_back({"data wait", s.steps.ys("data wait"), "data wait"});
    h += line_chart("chart-step-time", "Step time and its phases", "ms", xs, lines, marks);
    h += line_chart("chart-data-wait", "Data wait as a share of step time", "%", xs,
                    {{"data wait", s.steps.ys("data_wait_share"), "data wait share"}}, marks, 100,
                    100);
  }

  // GPU: SM efficiency (what the SMs did) beside utilization (that some kernel ran).
  const std::vector<double> gx = s.gpu.xs();
  if (!gx.empty()) {
    h += "<h2>GPU</h2>\n";
    std::vector<Line> util, pipes;
    for (const auto& [key, label] : kGpuUtilization) {
      if (s.gpu.any(key)) util.push_back({label, s.gpu.ys(key), key});
    }
    for (const auto& [key, label] : kGpuPipes) {
      if (s.gpu.any(key)) pipes.push_back({label, s.gpu.ys(key), key});
    }
    if (!util.empty()) {
      h += line_chart("chart-gpu-util", "SM efficiency beside GPU utilization", "%", gx, util,
                      marks, 100, 100);
    }
    if (!pipes.empty()) {
      h += line_chart("chart-tensor-dram", "Tensor pipes, DRAM and occupancy", "%", gx, pipes,
                      marks, 100, 100);
    }
  }

  // MFU and memory per epoch.
  std::vector<std::string> labels;
  Line mfu{"MFU", {}, "mfu"}, hfu{"HFU (recomputation counted)", {}, "hfu"};
  Line allocated{"peak allocated", {}, "peak_allocated"},
      reserved{"peak reserved", {}, "peak_reserved"};
  bool any_mfu = false, any_memory = false;
  for (const auto& e : s.epochs) {
    labels.push_back((e.closed_by == PeriodEnd::kInterval ? "interval " : "epoch ") +
                     std::to_string(e.epoch));
    const auto* f = e.sections.get<FlopEpochStats>();
    mfu.ys.push_back(f ? f->mfu : kNotMeasured);
    hfu.ys.push_back(f ? f->hfu : kNotMeasured);
    any_mfu = any_mfu || (f && measured(f->mfu));
    const auto* m = e.sections.get<MemoryEpochStats>();
    const bool known = m != nullptr && m->capacity_bytes > 0;
    allocated.ys.push_back(known ? m->peak_allocated_fraction() : kNotMeasured);
    reserved.ys.push_back(known ? m->peak_reserved_fraction() : kNotMeasured);
    any_memory = any_memory || known;
  }
  if (any_mfu) {
    h += "<h2>MFU</h2>\n" + bar_chart("chart-mfu", "Model FLOPs utilization per epoch", "% of peak",
                                      labels, {mfu, hfu}, 100);
  }

  // Communication: the collector's step times in section "comm".
  const auto comm = s.metric_names.find("comm");
  if (comm != s.metric_names.end()) {
    std::vector<Line> lines;
    for (const auto& n : comm->second) {
      if (is_ms(n)) lines.push_back({metric_label("comm", n), s.steps.ys("comm." + n), n});
    }
    if (!lines.empty()) {
      h += "<h2>Communication</h2>\n" + line_chart("chart-metrics-comm",
                                                   "Communication per step and its exposed part",
                                                   "ms", xs, lines, marks);
    }
  }

  if (any_memory) {
    const auto* m = s.epochs.back().sections.get<MemoryEpochStats>();
    h += "<h2>Memory</h2>\n" + bar_chart("chart-memory", "Device memory at its peak per epoch",
                                         "% of capacity", labels, {allocated, reserved}, 100);
    if (m != nullptr) {
      h += "<p class=\"muted\">last epoch: capacity " +
           num(static_cast<double>(m->capacity_bytes) / (1ull << 30), "%.1f") + " GiB, " +
           std::to_string(m->alloc_retries) + " allocation retries, " + std::to_string(m->ooms) +
           " out-of-memory errors</p>\n";
    }
  }

  // The loader's settings per epoch (what auto-tune changes), beside what its waits cost.
  if (std::any_of(s.epochs.begin(), s.epochs.end(),
                  [](const EpochSummary& e) { return e.sections.get<LoaderStats>() != nullptr; })) {
    h += "<h2>Loader</h2>\n<table id=\"loader\"><tr><th>epoch</th><th class=\"l\">loader</th>"
         "<th>workers</th><th>prefetch</th><th>pin memory</th><th>GPU prefetch</th>"
         "<th>batch size</th><th>production per batch</th><th>data wait</th></tr>\n";
    for (const auto& e : s.epochs) {
      const auto* l = e.sections.get<LoaderStats>();
      if (l == nullptr) continue;
      const bool k = l->settings_known;
      auto yes_no = [&](bool v) { return std::string(!k ? kDash : v ? "yes" : "no"); };
      h += "<tr><td>" + std::to_string(e.epoch) + "</td><td class=\"l\">" + esc(l->name) +
           "</td><td>" + (k ? std::to_string(l->settings.workers) : kDash) + "</td><td>" +
           (k ? std::to_string(l->settings.prefetch) : kDash) + "</td><td>" +
           yes_no(l->settings.pin_memory) + "</td><td>" + yes_no(l->settings.device_prefetch) +
           "</td><td>" + (l->batch_size >= 0 ? std::to_string(l->batch_size) : kDash) +
           "</td><td>" +
           (l->produce_count > 0
                ? num(detail::ms(l->produce_ns) / static_cast<double>(l->produce_count), "%.2f") +
                      " ms"
                : kDash) +
           "</td><td>" + pct(e.data_wait_fraction) + "</td></tr>\n";
    }
    h += "</table>\n";
  }

  // Auto-tune: the decision first, then its trials with the chosen one marked.
  if (!s.trials.empty() || s.decision) {
    h += "<h2>Auto-tune</h2>\n";
    if (s.decision) {
      const TuningDecision& d = *s.decision;
      const double gain = d.baseline_throughput > 0
                              ? d.chosen_throughput / d.baseline_throughput - 1
                              : kNotMeasured;
      h += "<p id=\"decision\">Chose <b>" + esc(setting_cell(d.chosen)) + "</b> at " +
           num(d.chosen_throughput, "%.1f") + " " + esc(d.unit) + " against " +
           esc(setting_cell(d.baseline)) + " at " + num(d.baseline_throughput, "%.1f") +
           (measured(gain) ? " (" + std::string(gain >= 0 ? "+" : "") + num(100 * gain, "%.0f") +
                                 "%, measured)"
                           : std::string()) +
           ", decided at step " + std::to_string(d.decided_at_step) + ": " + esc(d.reason) +
           "</p>\n";
    }
    h += "<table id=\"trials\"><tr><th class=\"l\">setting</th>"
         "<th>throughput</th><th>data wait</th><th>steps</th><th class=\"l\">outcome</th></tr>\n";
    bool chosen_marked = false;
    for (size_t i = 0; i < s.trials.size(); ++i) {
      const auto& [t, kept] = s.trials[i];
      // The chosen row: the first trial that measured the decided setting.
      const bool chosen =
          s.decision && !chosen_marked && !t.failed && t.setting == s.decision->chosen;
      chosen_marked = chosen_marked || chosen;
      std::string outcome =
          (t.confirmation ? std::string(t.failed ? "re-measurement " : "re-measurement") : "") +
          (t.failed ? "failed: " + esc(t.note)
           : kept   ? "best so far"
                    : "");
      if (i == 0 && !t.confirmation) outcome = "baseline" + (outcome.empty() ? "" : "; " + outcome);
      if (chosen) outcome += "; chosen";
      h += std::string(chosen ? "<tr class=\"chosen\">" : "<tr>") + "<td class=\"l\">" +
           esc(setting_cell(t.setting)) + "</td><td>" + num(t.throughput, "%.1f") + " " +
           esc(t.unit) + "</td><td>" + pct(t.data_wait_fraction) + "</td><td>" +
           std::to_string(t.first_step) + "-" + std::to_string(t.last_step) +
           "</td><td class=\"l\">" + outcome + "</td></tr>\n";
    }
    h += "</table>\n";
  }

  // Epochs.
  h += "<h2>Epochs</h2>\n<table id=\"epochs\"><tr><th>epoch</th><th>steps</th><th>samples/s</th>"
       "<th>step p50 ms</th><th>step p90 ms</th><th>data wait</th><th>GPU busy</th>"
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
         "</td><td>" + (e.samples_per_s > 0 ? num(e.samples_per_s, "%.1f") : kDash) + "</td><td>" +
         num(detail::ms(e.step_p50_ns), "%.2f") + "</td><td>" +
         num(detail::ms(e.step_p90_ns), "%.2f") + "</td><td>" + pct(e.data_wait_fraction) +
         "</td><td>" + (g ? pct(g->stats.counter_utilization) : kDash) + "</td><td>" +
         (g ? pct(g->stats.sm_efficiency) : kDash) + "</td><td>" + (f ? pct(f->mfu) : kDash) +
         "</td><td>" + std::to_string(s.advice[i].size()) + "</td></tr>\n";
  }
  h += "</table>\n";

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

  // Internals, folded: every advice as each epoch gave it, the probes' step figures, and the
  // sections charted nowhere above as tables of their fields (latest epoch).
  h += "<details id=\"internals\"><summary>Internals: every advice by epoch, probe figures, "
       "raw sections</summary>\n<h2>Advice by epoch</h2>\n";
  size_t advice_count = 0;
  for (size_t i = 0; i < s.advice.size(); ++i) {
    for (const Advice& a : s.advice[i]) {
      ++advice_count;
      h += "<div class=\"advice " + std::string(to_string(a.severity)) + "\" data-id=\"" +
           esc(a.id) + "\"><b>[" + to_string(a.severity) + "] " + esc(a.id) + "</b> (epoch " +
           std::to_string(a.epoch) + ")<br>" + esc(a.finding) + "<br><i>cause:</i> " +
           esc(a.cause) + "<br><i>action:</i> " + esc(a.action) + "<br><i>expected gain:</i> " +
           (a.expected_gain > 0
                ? gain_text(a.expected_gain) + (a.gain_estimated ? " (estimated)" : " (measured)")
                : std::string("not estimated")) +
           evidence_table(a) + "</div>\n";
    }
  }
  if (advice_count == 0) h += "<p>no advice</p>\n";
  for (const auto& [section, names] : s.metric_names) {
    if (section == "flops") continue;
    std::vector<Line> lines;
    for (const auto& n : names) {
      if (section != "comm" || !is_ms(n)) lines.push_back({n, s.steps.ys(section + "." + n), n});
    }
    if (lines.empty()) continue;
    h += line_chart("chart-metrics-" + section, "Step figures of section " + section, "value", xs,
                    lines, marks);
  }
  if (!s.epochs.empty()) {
    for (const auto& sec : s.epochs.back().sections.all()) {
      const std::string name(sec->name());
      if (name == "gpu" || name == "flops" || name == "loader" || name == "memory") continue;
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
  h += "</details>\n";

  h += "<p id=\"render-check\" class=\"muted\">charts not checked (scripts off)</p>\n<script>";
  h += kCheckScript;
  h += "</script>\n</body></html>\n";
  return h;
}

}  // namespace torchpilot
