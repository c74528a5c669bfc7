#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "torchpilot/runtime/metrics.h"
#include "torchpilot/runtime/sink.h"

namespace torchpilot {
namespace {

using nlohmann::json;

constexpr int kSchemaVersion = 1;

// One line of JSON; invalid UTF-8 (a Latin-1 path in an error message, say) is replaced rather
// than thrown, which would disable the sink for the rest of the run.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

double ms(Nanos ns) { return static_cast<double>(ns) / 1e6; }

std::string fmt_ms(Nanos ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", ms(ns));
  return buf;
}

std::string fmt_pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * f);
  return buf;
}

std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : "%.3g", v);
  return buf;
}

// NaN (not measured) is written as null.
json number(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

std::string fmt_opt_pct(double f) { return measured(f) ? fmt_pct(f) : std::string("n/a"); }

json gpu_stats_json(const GpuStats& g) {
  return {{"wall_ms", ms(g.wall_ns)},
          {"counter_utilization", number(g.counter_utilization)},
          {"sm_efficiency", number(g.sm_efficiency)},
          {"tensor_activity", number(g.tensor_activity)},
          {"dram_throughput", number(g.dram_throughput)},
          {"achieved_occupancy", number(g.achieved_occupancy)},
          {"pcie_read_bytes", number(g.pcie_read_bytes)},
          {"pcie_write_bytes", number(g.pcie_write_bytes)},
          {"nvml_utilization", number(g.nvml_utilization)},
          {"traced_ms", ms(g.traced_ns)},
          {"gpu_utilization", number(g.gpu_utilization)},
          {"estimated_sm_efficiency", number(g.estimated_sm_efficiency)},
          {"kernels", g.kernels},
          {"host_sync_ms", ms(g.host_sync_ns)},
          {"host_syncs", g.host_syncs},
          {"h2d_bytes", g.h2d_bytes},
          {"h2d_pageable_bytes", g.h2d_pageable_bytes},
          {"h2d_pageable_ms", ms(g.h2d_pageable_ns)},
          {"idle_ms",
           {{"data_wait", ms(g.idle_data_wait_ns)},
            {"host_sync", ms(g.idle_host_sync_ns)},
            {"launch_gap", ms(g.idle_launch_gap_ns)},
            {"other", ms(g.idle_other_ns)}}}};
}

json gpu_epoch_json(const GpuEpochStats& e) {
  json kernels = json::array();
  for (const auto& k : e.top_kernels) {
    kernels.push_back({{"name", k.name},
                       {"launches", k.launches},
                       {"total_ms", ms(k.total_ns)},
                       {"mean_blocks_per_sm", k.mean_blocks_per_sm},
                       {"estimated_sm_efficiency", k.estimated_sm_efficiency}});
  }
  json collectors = json::array();
  for (const auto& c : e.collectors) {
    collectors.push_back({{"name", c.name}, {"active", c.active}, {"reason", c.reason}});
  }
  json j = gpu_stats_json(e.stats);
  j["device"] = e.device;
  j["sm_count"] = e.sm_count;
  j["traced_steps"] = e.traced_steps;
  j["dropped_records"] = e.dropped_records;
  j["top_kernels"] = kernels;
  j["collectors"] = collectors;
  return j;
}

json flops_json(const FlopEpochStats& f) {
  json ops = json::array();
  for (const auto& o : f.top_ops) {
    ops.push_back({{"op", o.op},
                   {"precision", to_string(o.precision)},
                   {"flops_per_step", o.flops_per_step},
                   {"calls_per_step", o.calls_per_step}});
  }
  json modules = json::array();
  for (const auto& m : f.modules) {
    modules.push_back({{"module", m.op}, {"flops_per_step", m.flops_per_step}});
  }
  json by = json::object();
  for (int i = 0; i < kMathPrecisions; ++i) {
    if (f.model_flops_by_precision[i] > 0) {
      by[to_string(static_cast<MathPrecision>(i))] = f.model_flops_by_precision[i];
    }
  }
  return {{"device", f.device},
          {"counted_steps", f.counted_steps},
          {"model_flops_per_step", f.model_flops_per_step},
          {"hardware_flops_per_step", f.hardware_flops_per_step},
          {"model_flops_by_precision", by},
          {"achieved_flops_per_s", f.achieved_flops_per_s},
          {"mfu", number(f.mfu)},
          {"hfu", number(f.hfu)},
          {"peak_flops_per_s", number(f.peak_flops_per_s)},
          {"dominant_precision", to_string(f.dominant_precision)},
          {"peak_source", f.peak_source},
          {"unfused_attention_flops_per_step", f.unfused_attention_flops_per_step},
          {"unfused_attention_per_step", f.unfused_attention_per_step},
          {"fused_attention_flops_per_step", f.fused_attention_flops_per_step},
          {"top_ops", ops},
          {"modules", modules}};
}

json setting_json(const Setting& s) {
  json j = json::object();
  for (const auto& [k, v] : s) j[k] = v;
  return j;
}

json loader_json(const LoaderStats& l) {
  return {{"name", l.name},
          {"tunable", l.tunable},
          {"workers", l.settings.workers},
          {"prefetch", l.settings.prefetch},
          {"pin_memory", l.settings.pin_memory},
          {"device_prefetch", l.settings.device_prefetch},
          {"max_workers", l.max_workers},
          {"batches", l.batches},
          {"produce_count", l.produce_count},
          {"produce_ms", ms(l.produce_ns)},
          {"produce_cpu_ms", ms(l.produce_cpu_ns)},
          {"blocked_count", l.blocked_count},
          {"wait_ms", ms(l.wait_ns)}};
}

json advice_json(const Advice& a) {
  json evidence = json::object();
  for (const auto& e : a.evidence) evidence[e.name] = {{"value", e.value}, {"unit", e.unit}};
  return {{"id", a.id},
          {"severity", to_string(a.severity)},
          {"epoch", a.epoch},
          {"finding", a.finding},
          {"cause", a.cause},
          {"action", a.action},
          {"evidence", evidence},
          {"expected_gain", a.expected_gain},
          {"gain_estimated", a.gain_estimated}};
}

json trial_object(const TrialResult& t) {
  return {{"setting", setting_json(t.setting)},
          {"first_step", t.first_step},
          {"last_step", t.last_step},
          {"mean_step_ms", ms(t.mean_step_ns)},
          {"relative_error", t.relative_error},
          {"throughput", t.throughput},
          {"unit", t.unit},
          {"data_wait_fraction", t.data_wait_fraction},
          {"supply_capacity", t.supply_capacity},
          {"supply_limited", t.supply_limited},
          {"demand", t.demand},
          {"failed", t.failed},
          {"note", t.note}};
}

class LogSink final : public Sink {
 public:
  explicit LogSink(std::shared_ptr<spdlog::logger> logger) : logger_(std::move(logger)) {}
  std::string name() const override { return "log"; }
  void on_epoch(const EpochSummary& summary, const std::vector<Advice>& advice) override {
    for (const auto& line : format_epoch(summary, advice)) logger_->info("{}", line);
  }
  void on_trial(const TrialResult& trial, bool kept) override {
    logger_->info("{}", format_trial(trial, kept));
  }
  void on_decision(const TuningDecision& decision) override {
    logger_->info("{}", format_decision(decision));
  }
  void flush() override { logger_->flush(); }

 private:
  std::shared_ptr<spdlog::logger> logger_;
};

class JsonLinesSink final : public Sink {
 public:
  explicit JsonLinesSink(const std::string& path) : path_(path), out_(path, std::ios::app) {
    if (!out_) throw std::runtime_error("torchpilot: cannot open JSON-lines file '" + path + "'");
    // The file is appended to: a run record tells one run's records from the next.
    write(dump(json{{"type", "run"},
                    {"v", kSchemaVersion},
                    {"pid", static_cast<int64_t>(getpid())},
                    {"unix_time_s", static_cast<int64_t>(std::time(nullptr))}}));
  }
  std::string name() const override { return "json-lines " + path_; }
  void on_step(const StepRecord& r, const std::vector<std::string>& names) override {
    write(step_json(r, names));
  }
  void on_epoch(const EpochSummary& s, const std::vector<Advice>& a) override {
    write(epoch_json(s, a));
  }
  void on_trial(const TrialResult& t, bool kept) override { write(trial_json(t, kept)); }
  void on_decision(const TuningDecision& d) override { write(decision_json(d)); }
  void on_gpu_step(const GpuStepRecord& r) override { write(gpu_step_json(r)); }
  void flush() override {
    out_.flush();
    if (!out_) throw std::runtime_error("write to '" + path_ + "' failed");
  }

 private:
  void write(const std::string& line) {
    out_ << line << '\n';
    if (!out_) throw std::runtime_error("write to '" + path_ + "' failed");
  }
  std::string path_;
  std::ofstream out_;
};

}  // namespace

const char* to_string(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kHigh:
      return "high";
  }
  return "?";
}

std::shared_ptr<Sink> make_log_sink(std::shared_ptr<spdlog::logger> logger) {
  return std::make_shared<LogSink>(std::move(logger));
}

std::shared_ptr<Sink> make_json_lines_sink(const std::string& path) {
  return std::make_shared<JsonLinesSink>(path);
}

std::string step_json(const StepRecord& r, const std::vector<std::string>& names) {
  json phases = json::object();
  for (size_t i = 0; i < names.size() && i < kMaxPhases; ++i) phases[names[i]] = ms(r.phase_ns[i]);
  json j = {{"type", "step"},
            {"v", kSchemaVersion},
            {"step", r.step},
            {"epoch", r.epoch},
            {"step_in_epoch", r.step_in_epoch},
            {"end_ns", r.end_ns},
            {"step_ms", ms(r.step_ns())},
            {"data_wait_ms", ms(r.data_wait_ns)},
            {"samples", r.samples},
            {"phases_ms", phases},
            {"model_flops", number(r.model_flops)},
            {"hardware_flops", number(r.hardware_flops)},
            {"mfu", number(r.mfu)},
            {"hfu", number(r.hfu)}};
  return dump(j);
}

std::string gpu_step_json(const GpuStepRecord& r) {
  json j = {{"type", "gpu_step"},
            {"v", kSchemaVersion},
            {"step", r.step},
            {"epoch", r.epoch},
            {"traced", r.traced}};
  j.update(gpu_stats_json(r.stats));
  return dump(j);
}

std::string epoch_json(const EpochSummary& s, const std::vector<Advice>& advice) {
  json phases = json::object();
  for (const auto& p : s.phases) phases[p.name] = ms(p.ns);
  json list = json::array();
  for (const auto& a : advice) list.push_back(advice_json(a));
  json j = {{"type", "epoch"},
            {"v", kSchemaVersion},
            {"epoch", s.epoch},
            {"steps", s.steps},
            {"first_step", s.first_step},
            {"samples", s.samples},
            {"wall_s", static_cast<double>(s.wall_ns) / 1e9},
            {"data_wait_s", static_cast<double>(s.data_wait_ns) / 1e9},
            {"data_wait_fraction", s.data_wait_fraction},
            {"step_p50_ms", ms(s.step_p50_ns)},
            {"step_p90_ms", ms(s.step_p90_ns)},
            {"steps_per_s", s.steps_per_s},
            {"samples_per_s", s.samples_per_s},
            {"phases_ms", phases},
            {"tuning_steps", s.tuning_steps},
            {"tuned", s.tuned},
            {"loader", s.loader ? loader_json(*s.loader) : json(nullptr)},
            {"gpu", s.gpu ? gpu_epoch_json(*s.gpu) : json(nullptr)},
            {"flops", s.flops ? flops_json(*s.flops) : json(nullptr)},
            {"advice", list}};
  return dump(j);
}

std::string trial_json(const TrialResult& t, bool kept) {
  json j = trial_object(t);
  j["type"] = "tuning_trial";
  j["v"] = kSchemaVersion;
  j["kept"] = kept;
  return dump(j);
}

std::string decision_json(const TuningDecision& d) {
  json trials = json::array();
  for (const auto& t : d.trials) trials.push_back(trial_object(t));
  json j = {{"type", "tuning_decision"},
            {"v", kSchemaVersion},
            {"policy", d.policy},
            {"baseline", setting_json(d.baseline)},
            {"chosen", setting_json(d.chosen)},
            {"baseline_throughput", d.baseline_throughput},
            {"chosen_throughput", d.chosen_throughput},
            {"unit", d.unit},
            {"decided_at_step", d.decided_at_step},
            {"steps_used", d.steps_used},
            {"reason", d.reason},
            {"trials", trials}};
  return dump(j);
}

std::vector<std::string> format_epoch(const EpochSummary& s, const std::vector<Advice>& advice) {
  std::vector<std::string> lines;
  std::string head = "epoch " + std::to_string(s.epoch) + ": " + std::to_string(s.steps) +
                     " steps in " + fmt_num(static_cast<double>(s.wall_ns) / 1e9) + " s";
  if (s.samples_per_s > 0) head += ", " + fmt_num(s.samples_per_s) + " samples/s";
  head += "; step p50 " + fmt_ms(s.step_p50_ns) + ", p90 " + fmt_ms(s.step_p90_ns) +
          "; data wait " + fmt_pct(s.data_wait_fraction) + " of step time";
  lines.push_back(head);
  if (s.tuning_steps > 0) {
    lines.push_back("  " + std::to_string(s.tuning_steps) +
                    " of these steps ran auto-tune trials: the figures mix loader settings");
  }
  std::string phases;
  for (const auto& p : s.phases) {
    phases += (phases.empty() ? "" : ", ") + p.name + " " + fmt_pct(fraction(p.ns, s.wall_ns));
  }
  if (!phases.empty()) lines.push_back("  phases (share of step time): " + phases);
  if (s.loader) {
    const LoaderStats& l = *s.loader;
    std::string line = "  loader (" + l.name + "): workers " + std::to_string(l.settings.workers) +
                       ", prefetch " + std::to_string(l.settings.prefetch) + ", pinned " +
                       (l.settings.pin_memory ? "yes" : "no") + ", device prefetch " +
                       (l.settings.device_prefetch ? "yes" : "no");
    if (l.produce_count > 0) {
      line += "; " + std::to_string(l.produce_count) + " batches at " +
              fmt_ms(l.produce_ns / l.produce_count) + " each (per thread)";
    }
    lines.push_back(line);
  }
  if (s.gpu || s.flops) {
    // The truth side by side: what nvidia-smi says, what the SMs did, what the math units did.
    std::string line = "  GPU";
    if (s.gpu) {
      const GpuStats& g = s.gpu->stats;
      const double util =
          measured(g.counter_utilization) ? g.counter_utilization : g.gpu_utilization;
      line += " " + s.gpu->device + ": utilization " + fmt_opt_pct(util) + " (NVML " +
              fmt_opt_pct(g.nvml_utilization) + "), SM efficiency " +
              (measured(g.sm_efficiency) ? fmt_pct(g.sm_efficiency)
               : measured(g.estimated_sm_efficiency)
                   ? fmt_pct(g.estimated_sm_efficiency) + " (estimated)"
                   : std::string("n/a")) +
              ", tensor " + fmt_opt_pct(g.tensor_activity) + ", DRAM " +
              fmt_opt_pct(g.dram_throughput) + ", occupancy " + fmt_opt_pct(g.achieved_occupancy);
    }
    if (s.flops) {
      line += std::string(s.gpu ? ";" : "") + " MFU " + fmt_opt_pct(s.flops->mfu) + " (HFU " +
              fmt_opt_pct(s.flops->hfu) + ")";
    }
    lines.push_back(line);
  }
  if (s.gpu && s.gpu->traced_steps > 0) {
    const GpuStats& g = s.gpu->stats;
    const double t = static_cast<double>(std::max<Nanos>(1, g.traced_ns));
    const double steps = static_cast<double>(s.gpu->traced_steps);
    lines.push_back(
        "  traced " + std::to_string(s.gpu->traced_steps) + " steps: kernel busy " +
        fmt_opt_pct(g.gpu_utilization) + ", estimated SM efficiency " +
        fmt_opt_pct(g.estimated_sm_efficiency) + ", " + fmt_num(g.kernels / steps) +
        " kernels/step; host sync " + fmt_pct(g.host_sync_ns / t) + " (" +
        fmt_num(g.host_syncs / steps) + "/step); H2D " + fmt_num(g.h2d_bytes / steps / 1e6) +
        " MB/step (" + fmt_pct(fraction(g.h2d_pageable_bytes, std::max<int64_t>(1, g.h2d_bytes))) +
        " pageable); GPU idle: data wait " + fmt_pct(g.idle_data_wait_ns / t) + ", host sync " +
        fmt_pct(g.idle_host_sync_ns / t) + ", launch gaps " + fmt_pct(g.idle_launch_gap_ns / t) +
        ", other " + fmt_pct(g.idle_other_ns / t) +
        (s.gpu->dropped_records > 0
             ? "; " + std::to_string(s.gpu->dropped_records) + " records dropped (understated)"
             : ""));
  }
  if (s.flops && s.flops->counted_steps > 0) {
    const FlopEpochStats& f = *s.flops;
    lines.push_back(
        "  FLOPs: " + fmt_num(f.model_flops_per_step / 1e12) + " TFLOP/step model, " +
        fmt_num(f.hardware_flops_per_step / 1e12) + " hardware; achieved " +
        fmt_num(f.achieved_flops_per_s / 1e12) + " TFLOP/s" +
        (measured(f.peak_flops_per_s)
             ? " of " + fmt_num(f.peak_flops_per_s / 1e12) + " peak (" + f.peak_source + ")"
             : std::string(" (no peak known for this device)")));
    if (!f.modules.empty() && f.model_flops_per_step > 0) {
      constexpr size_t kShown = 8;
      std::string line = "  FLOPs by module:";
      for (size_t i = 0; i < f.modules.size() && i < kShown; ++i) {
        line += std::string(i == 0 ? " " : ", ") +
                (f.modules[i].op.empty() ? std::string("(unnamed)") : f.modules[i].op) + " " +
                fmt_pct(f.modules[i].flops_per_step / f.model_flops_per_step);
      }
      if (f.modules.size() > kShown) line += ", ...";
      lines.push_back(line);
    }
  }
  if (advice.empty()) lines.push_back("  no advice: nothing above its threshold");
  for (const auto& a : advice) {
    lines.push_back("ADVICE [" + std::string(to_string(a.severity)) + "] " + a.id + ": " +
                    a.finding);
    if (!a.cause.empty()) lines.push_back("  cause: " + a.cause);
    if (!a.action.empty()) lines.push_back("  action: " + a.action);
    if (a.expected_gain > 0) {
      lines.push_back("  expected gain: +" + fmt_pct(a.expected_gain) + " throughput" +
                      (a.gain_estimated ? " (estimated)" : " (measured)"));
    }
  }
  return lines;
}

std::string format_trial(const TrialResult& t, bool kept) {
  if (t.failed) return "autotune trial [" + to_string(t.setting) + "] failed: " + t.note;
  return "autotune trial [" + to_string(t.setting) + "]: " + fmt_num(t.throughput) + " " + t.unit +
         " (mean step " + fmt_ms(t.mean_step_ns) + " +-" + fmt_pct(t.relative_error) +
         ", data wait " + fmt_pct(t.data_wait_fraction) +
         (t.supply_limited ? ", capped at the loader's capacity (steps ran on a backlog)" : "") +
         ", steps " + std::to_string(t.first_step) + "-" + std::to_string(t.last_step) + ")" +
         (kept ? " -> best so far" : "");
}

std::string format_decision(const TuningDecision& d) {
  if (d.trials.empty()) return "autotune: no decision (" + d.reason + ")";
  std::string gain;
  if (d.baseline_throughput > 0) {
    gain = " (" + std::string(d.chosen_throughput >= d.baseline_throughput ? "+" : "") +
           fmt_pct(d.chosen_throughput / d.baseline_throughput - 1.0) + ", measured)";
  }
  return "autotune decision: [" + to_string(d.chosen) + "] " + fmt_num(d.chosen_throughput) + " " +
         d.unit + " vs baseline [" + to_string(d.baseline) + "] " + fmt_num(d.baseline_throughput) +
         " " + d.unit + gain + "; " + std::to_string(d.trials.size()) + " trials in " +
         std::to_string(d.steps_used) + " warm-up steps, decided at step " +
         std::to_string(d.decided_at_step) + " (" + d.reason + ")";
}

}  // namespace torchpilot
