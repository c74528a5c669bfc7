// The Prometheus endpoint (docs/reports.md, "Prometheus"): a sink that keeps the latest figures
// and serves them at GET /metrics in the text exposition format, with cpp-httplib on threads of
// its own (report.prometheus_port, report.prometheus_address; loopback by default).
//
// Never stalls or throws into the training loop: the sink updates its figures on the training
// thread and hands a copy over only when the scrape side's mutex is free (try_lock); a scrape
// formats from its copy. A bind failure (port in use, bad address) is one warning line and no
// endpoint. Clients cannot hold it: each request has a deadline, the open connections a cap, and
// the destructor closes them rather than waiting for them (PrometheusLimits). Registered with the
// runtime as a default sink (prometheus_exporter.cpp).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/sink.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

// Step-time histogram buckets (upper bounds, seconds): steps from half a millisecond to a minute.
inline constexpr double kStepSecondsBuckets[] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
inline constexpr size_t kStepSecondsBucketCount =
    sizeof kStepSecondsBuckets / sizeof kStepSecondsBuckets[0];

// Every label set is fixed for a series' life: rank on every sample (RANK, else 0); device only
// on the GPU figures, from the GPU observed (absent without one); an advice's severity is the
// value of its own gauge, never a label.
struct MetricsSnapshot {
  std::string rank = "0";
  std::string gpu_device;  // the CUDA device index observed; empty: no GPU figures yet
  int64_t steps = 0, samples = 0, epochs = 0;
  double step_seconds_sum = 0, data_wait_seconds = 0, last_step_seconds = 0;
  // Steps at most each bucket's bound (not cumulative; the exposition sums them), and above all.
  int64_t step_buckets[kStepSecondsBucketCount + 1] = {};
  std::map<std::string, double> phase_seconds;  // by phase name
  // The last epoch's figures (NaN: not measured).
  double epoch_samples_per_second = 0, epoch_data_wait_ratio = 0;
  double mfu_ratio = 0, hfu_ratio = 0;
  bool has_mfu = false;
  // Communication since the start (the comm sections' totals): its time and the part of it the
  // training thread waited for; has_comm once a comm section came.
  bool has_comm = false;
  double comm_seconds = 0, exposed_comm_seconds = 0;
  // Rank 0's last cross-rank table: the stragglers (at most kMaxStragglers, largest excess first)
  // and the ranks that reported.
  struct StragglerFigure {
    int rank = 0;
    double excess_seconds = 0;  // per step
  };
  static constexpr size_t kMaxStragglers = 8;
  bool has_ranks = false;
  int64_t ranks_reported = 0;
  std::vector<StragglerFigure> stragglers;
  // The latest step's GPU figures, by name (sm_efficiency, ...), fractions.
  std::map<std::string, double> gpu;
  struct AdviceGain {
    std::string id;
    int severity = 0;  // 1 info, 2 warning, 3 high
    double expected_gain = 0;
  };
  std::vector<AdviceGain> advice;  // the last epoch's
  // Named gauges other parts may set (the run journal's ETTR): name -> (help, value).
  std::map<std::string, std::pair<std::string, double>> extra;
};

// The text exposition format (version 0.0.4) of a snapshot.
std::string prometheus_text(const MetricsSnapshot& s);

// What the endpoint grants its clients, so that none can hold it or the program's exit.
struct PrometheusLimits {
  // Connections open at once (waiting for their request or being answered); one more is closed
  // as soon as it is accepted.
  int max_connections = 64;
  // From a connection's accept to its answer sent: a client still sending its request then, or
  // not reading the answer, is closed. A scraper sends its request at once.
  std::chrono::milliseconds request_deadline{5000};
};

class PrometheusSink : public Sink {
 public:
  // Binds `address`:`port` (port 0: any free port, for tests). serving() false after a failed
  // bind, with one warning line on `logger`; the endpoint also warns there once if clients reach
  // limits.max_connections.
  PrometheusSink(const std::string& address, int port, std::shared_ptr<spdlog::logger> logger,
                 PrometheusLimits limits = {});
  ~PrometheusSink() override;
  std::string name() const override { return "prometheus"; }
  void on_step(const StepRecord& record, const std::vector<std::string>& phase_names) override;
  void on_epoch(const EpochSummary& summary, const std::vector<Advice>& advice) override;
  void on_late_step(const LateStepRecord& record) override;

  bool serving() const { return endpoint_ != nullptr; }
  int port() const { return port_; }
  std::string scrape() const;  // what GET /metrics answers

 private:
  class Endpoint;  // the HTTP server and its threads (prometheus_exporter.cpp)
  void publish();
  MetricsSnapshot state_;  // training thread
  mutable std::mutex mutex_;
  MetricsSnapshot published_;  // under mutex_
  std::unique_ptr<Endpoint> endpoint_;
  int port_ = 0;
};

}  // namespace torchpilot
