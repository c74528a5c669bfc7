#include "prometheus_exporter.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/flops/flop_records.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace torchpilot {
namespace {

const char kReplacement[] = "\xef\xbf\xbd";  // U+FFFD, in UTF-8

// The text with each invalid UTF-8 sequence replaced by U+FFFD. nlohmann::json's dump replaces
// them (the JSON log relies on it too); parsing its output back gives the mended text.
std::string valid_utf8(const std::string& text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) return text;
  using nlohmann::json;
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

// A label value (quote: true) or a HELP text: valid UTF-8 with backslash, newline (and in a label
// the double quote) escaped, as the format asks. Other control characters become U+FFFD: the
// format has no escape for them, and a raw carriage return or NUL breaks line-based readers.
std::string escaped(const std::string& text, bool quote) {
  std::string out;
  for (char c : valid_utf8(text)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += kReplacement;
    } else {
      out += c;
    }
  }
  return out;
}

std::string label_value(const std::string& v) { return escaped(v, true); }

// A metric name matches [a-zA-Z_:][a-zA-Z0-9_:]*; any other byte becomes '_'.
std::string metric_name(std::string name) {
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) name[i] = '_';
  }
  return name.empty() ? "_" : name;
}

std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Writer {
 public:
  explicit Writer(const MetricsSnapshot& s)
      : base_("rank=\"" + label_value(s.rank) + "\",device=\"" + label_value(s.device) + "\"") {}
  // Names and help texts pass through metric_name and escaped; `labels` come escaped.
  void family(const std::string& name, const char* type, const std::string& help) {
    const std::string n = metric_name(name);
    out_ += "# HELP " + n + " " + escaped(help, false) + "\n# TYPE " + n + " " + type + "\n";
  }
  void sample(const std::string& name, double v, const std::string& labels = "") {
    out_ += metric_name(name) + "{" + base_ + (labels.empty() ? "" : "," + labels) + "} " +
            value_text(v) + "\n";
  }
  void one(const std::string& name, const char* type, const std::string& help, double v) {
    family(name, type, help);
    sample(name, v);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string base_;
  std::string out_;
};

// rank: the launcher's RANK (torchrun, Slurm wrappers), else 0.
std::string rank_from_env() {
  const char* r = std::getenv("RANK");
  return r != nullptr && *r != '\0' ? r : "0";
}

}  // namespace

std::string prometheus_text(const MetricsSnapshot& s) {
  Writer w(s);
  w.one("torchpilot_steps_total", "counter", "Training steps completed.",
        static_cast<double>(s.steps));
  w.one("torchpilot_samples_total", "counter",
        "Samples of the completed steps (0 if not reported).", static_cast<double>(s.samples));
  w.one("torchpilot_epochs_total", "counter", "Epochs completed.", static_cast<double>(s.epochs));
  w.family("torchpilot_step_duration_seconds", "summary",
           "Step time, boundary to boundary (the wait for the batch included).");
  w.sample("torchpilot_step_duration_seconds_sum", s.step_seconds_sum);
  w.sample("torchpilot_step_duration_seconds_count", static_cast<double>(s.steps));
  w.one("torchpilot_last_step_duration_seconds", "gauge", "The latest step's time.",
        s.last_step_seconds);
  w.one("torchpilot_data_wait_seconds_total", "counter",
        "Time the training thread waited for batches.", s.data_wait_seconds);
  if (!s.phase_seconds.empty()) {
    // Two names may make one label (their invalid bytes replaced alike): one series, their sum.
    std::map<std::string, double> by_label;
    for (const auto& [phase, sec] : s.phase_seconds) by_label[label_value(phase)] += sec;
    w.family("torchpilot_phase_seconds_total", "counter", "Time in each phase of the steps.");
    for (const auto& [label, sec] : by_label) {
      w.sample("torchpilot_phase_seconds_total", sec, "phase=\"" + label + "\"");
    }
  }
  if (s.epochs > 0) {
    w.one("torchpilot_epoch_samples_per_second", "gauge", "The last epoch's throughput.",
          s.epoch_samples_per_second);
    w.one("torchpilot_epoch_data_wait_ratio", "gauge",
          "The last epoch's data wait as a share of step time.", s.epoch_data_wait_ratio);
    w.one("torchpilot_epoch_step_p50_seconds", "gauge", "The last epoch's median step time.",
          s.epoch_step_p50_seconds);
    w.one("torchpilot_epoch_step_p90_seconds", "gauge",
          "The last epoch's 90th-percentile step time.", s.epoch_step_p90_seconds);
  }
  if (s.has_mfu) {
    w.one("torchpilot_mfu_ratio", "gauge", "The last epoch's model FLOPs utilization.",
          s.mfu_ratio);
    w.one("torchpilot_hfu_ratio", "gauge", "The last epoch's hardware FLOPs utilization.",
          s.hfu_ratio);
  }
  for (const auto& [name, v] : s.gpu) {
    w.one("torchpilot_gpu_" + name + "_ratio", "gauge",
          "The latest step's GPU " + name + " (docs/metrics.md).", v);
  }
  if (!s.advice.empty()) {
    w.family("torchpilot_advice_expected_gain_ratio", "gauge",
             "The last epoch's advice by id: expected throughput gain (0.4 = +40%).");
    for (const auto& a : s.advice) {
      w.sample("torchpilot_advice_expected_gain_ratio", a.expected_gain,
               "id=\"" + label_value(a.id) + "\",severity=\"" + label_value(a.severity) + "\"");
    }
  }
  for (const auto& [name, hv] : s.extra) w.one(name, "gauge", hv.first, hv.second);
  return w.take();
}

PrometheusSink::PrometheusSink(const std::string& address, int port, spdlog::logger& logger,
                               std::string device)
    : server_(std::make_unique<httplib::Server>()) {
  state_.rank = rank_from_env();
  state_.device = std::move(device);
  published_ = state_;
  // One worker: scrapes are rare and small.
  server_->new_task_queue = [] { return new httplib::ThreadPool(1); };
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(scrape(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // SO_REUSEADDR only (a restart binds through TIME_WAIT); no SO_REUSEPORT, which would let a
  // second process share the port silently.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
  });
  bool ok = false;
  if (port == 0) {
    port_ = server_->bind_to_any_port(address);
    ok = port_ > 0;
  } else {
    port_ = port;
    ok = server_->bind_to_port(address, port);
  }
  if (!ok) {
    logger.warn("Prometheus endpoint off: cannot bind {}:{} (in use, or not an address here)",
                address, port);
    return;
  }
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_done_ = true;
  });
  logger.info("Prometheus metrics at http://{}:{}/metrics", address, port_);
}

PrometheusSink::~PrometheusSink() {
  if (!thread_.joinable()) return;
  // stop() does nothing until the server runs: a sink destroyed right after it started would
  // otherwise leave its thread in accept() for ever.
  while (!listen_done_) {
    if (server_->is_running()) {
      server_->stop();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  thread_.join();
}

std::string PrometheusSink::scrape() const {
  MetricsSnapshot copy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copy = published_;
  }
  return prometheus_text(copy);
}

void PrometheusSink::publish() {
  // Never waits for a scrape: a busy mutex leaves the copy to the next update.
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock()) published_ = state_;
}

void PrometheusSink::on_step(const StepRecord& r, const std::vector<std::string>& phase_names) {
  ++state_.steps;
  state_.samples += r.samples;
  const double sec = static_cast<double>(r.step_ns()) / 1e9;
  state_.step_seconds_sum += sec;
  state_.last_step_seconds = sec;
  state_.data_wait_seconds += static_cast<double>(r.data_wait_ns) / 1e9;
  for (size_t i = 0; i < phase_names.size() && i < r.phase_ns.size(); ++i) {
    if (r.phase_ns[i] > 0 || state_.phase_seconds.count(phase_names[i]) > 0) {
      state_.phase_seconds[phase_names[i]] += static_cast<double>(r.phase_ns[i]) / 1e9;
    }
  }
  publish();
}

void PrometheusSink::on_late_step(const LateStepRecord& r) {
  const GpuStepRecord* g = r.get<GpuStepRecord>();
  if (g == nullptr) return;
  auto set = [this](const char* name, double v) {
    if (measured(v)) state_.gpu[name] = v;
  };
  set("counter_utilization", g->stats.counter_utilization);
  set("sm_efficiency", g->stats.sm_efficiency);
  set("tensor_activity", g->stats.tensor_activity);
  set("dram_throughput", g->stats.dram_throughput);
  set("achieved_occupancy", g->stats.achieved_occupancy);
  set("nvml_utilization", g->stats.nvml_utilization);
  publish();
}

void PrometheusSink::on_epoch(const EpochSummary& e, const std::vector<Advice>& advice) {
  ++state_.epochs;
  state_.epoch_samples_per_second = e.samples_per_s;
  state_.epoch_data_wait_ratio = e.data_wait_fraction;
  state_.epoch_step_p50_seconds = static_cast<double>(e.step_p50_ns) / 1e9;
  state_.epoch_step_p90_seconds = static_cast<double>(e.step_p90_ns) / 1e9;
  if (const auto* f = e.sections.get<FlopEpochStats>(); f != nullptr && measured(f->mfu)) {
    state_.has_mfu = true;
    state_.mfu_ratio = f->mfu;
    state_.hfu_ratio = f->hfu;
  }
  state_.advice.clear();
  for (const Advice& a : advice) {
    state_.advice.push_back({a.id, to_string(a.severity), a.expected_gain});
  }
  publish();
}

namespace {

std::shared_ptr<Sink> make_prometheus_sink(const Config& config,
                                           const std::shared_ptr<spdlog::logger>& logger) {
  if (config.report.prometheus_port == 0) return nullptr;
  auto sink = std::make_shared<PrometheusSink>(config.report.prometheus_address,
                                               config.report.prometheus_port, *logger,
                                               std::to_string(config.gpu.device));
  if (!sink->serving()) return nullptr;
  return sink;
}

const bool registered = [] {
  register_default_sink("prometheus", 40, &make_prometheus_sink);
  return true;
}();

}  // namespace
}  // namespace torchpilot

// Named on the link line (CMake) so that static linking keeps the registration.
extern "C" void torchpilot_prometheus_anchor() {}
