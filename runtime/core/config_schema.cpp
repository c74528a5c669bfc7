// The configuration schema: one row per key (its type, range and field), the table that the YAML
// reader, the environment reader and config_keys() walk.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "config_internal.h"

namespace torchpilot {
namespace config_detail {

std::string text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
std::string text(bool v) { return v ? "true" : "false"; }
std::string text(int64_t v) { return std::to_string(v); }
std::string text(const std::string& v) { return v; }
std::string text(const std::vector<int>& list) {
  std::string out;
  for (int v : list) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

namespace {
std::mutex& rows_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<KeySpec>& registered_rows() {
  static std::vector<KeySpec> rows;
  return rows;
}
const std::vector<KeySpec>& builtin_schema();
}  // namespace

void register_rows(const char* section, std::vector<KeySpec> rows) {
  std::lock_guard<std::mutex> lock(rows_mutex());
  for (auto& row : rows) {
    const bool taken = row.key.rfind(std::string(section) + ".", 0) != 0 ||
                       std::any_of(builtin_schema().begin(), builtin_schema().end(),
                                   [&](const KeySpec& k) { return k.key == row.key; }) ||
                       std::any_of(registered_rows().begin(), registered_rows().end(),
                                   [&](const KeySpec& k) { return k.key == row.key; });
    if (!taken) registered_rows().push_back(std::move(row));
  }
}

const std::vector<KeySpec>& schema() {
  // Registration ends with static initialization; the merged table is rebuilt if one came later.
  std::lock_guard<std::mutex> lock(rows_mutex());
  static std::vector<KeySpec> merged;
  static size_t merged_rows = static_cast<size_t>(-1);
  if (merged_rows != registered_rows().size()) {
    merged = builtin_schema();
    merged.insert(merged.end(), registered_rows().begin(), registered_rows().end());
    merged_rows = registered_rows().size();
  }
  return merged;
}

namespace {

// A row for a plain field: TP_KEY(field.path, min, max), its type from the field's. The key is the
// field's path spelled out (#field), so a row cannot give a key a name other than the field it
// sets.
#define TP_KEY(field, lo, hi)                                                                      \
  {                                                                                                \
#field, type_of < std::decay_t < decltype(Config{}.field)>>(), lo, hi,                         \
        {}, [](const Config& c) { return value_text(c.field); }, [](Config & c,                    \
                                                                    const Value&                   \
                                                                        v) { assign(c.field, v); } \
  }
#define TP_FLAG(field) TP_KEY(field, 0, 0)
// A string field that names a file or folder: checked as a path (Type::kPath).
KeySpec as_path(KeySpec row) {
  row.type = Type::kPath;
  return row;
}
#define TP_PATH(field) as_path(TP_KEY(field, 0, 0))

const std::vector<KeySpec>& builtin_schema() {
  static const std::vector<KeySpec> table = {
      {"mode",
       Type::kString,
       0,
       0,
       {"off", "advise", "autotune"},
       [](const Config& c) -> std::string { return to_string(c.mode); },
       [](Config& c, const Value& v) {
         c.mode = v.s == "off" ? Mode::kOff : v.s == "advise" ? Mode::kAdvise : Mode::kAutotune;
       }},
      {"log.level",
       Type::kString,
       0,
       0,
       {"trace", "debug", "info", "warn", "error", "off"},
       [](const Config& c) -> std::string { return c.log.level; },
       [](Config& c, const Value& v) { c.log.level = v.s; }},
      TP_PATH(log.json_path),
      TP_KEY(records.step_history, 16, 1 << 20),  // ~0.6 KiB a record: ~600 MiB when full
      TP_KEY(advisors.data_starvation.threshold, 0.0, 1.0),
      TP_KEY(advisors.data_starvation.high_severity, 0.0, 1.0),
      TP_KEY(advisors.busy_inefficient.utilization, 0.0, 1.0),
      TP_KEY(advisors.busy_inefficient.sm_efficiency, 0.0, 1.0),
      TP_KEY(advisors.host_sync.threshold, 0.0, 1.0),
      TP_KEY(advisors.pageable_copies.threshold, 0.0, 1.0),
      TP_KEY(advisors.launch_bound.threshold, 0.0, 1.0),
      TP_KEY(advisors.fp32_matmul.threshold, 0.0, 1.0),
      TP_KEY(advisors.unfused_attention.threshold, 0.0, 1.0),
      TP_KEY(advisors.unfused_linear_bias.threshold, 0.0, 1.0),
      TP_KEY(advisors.per_parameter_optimizer.threshold, 0.0, 1.0),
      TP_KEY(advisors.host_bound.threshold, 0.0, 1.0),
      TP_KEY(advisors.periodic_stall.threshold, 0.0, 1.0),
      TP_KEY(advisors.low_mfu.threshold, 0.0, 1.0),
      TP_KEY(advisors.low_mfu.fp32_share, 0.0, 1.0),
      TP_KEY(advisors.low_mfu.unfused_attention_share, 0.0, 1.0),
      TP_KEY(advisors.checkpoint.threshold, 0.0, 1.0),
      TP_KEY(advisors.memory_pressure.threshold, 0.0, 1.0),
      TP_KEY(advisors.small_micro_batch.launch_gap_share, 0.0, 1.0),
      TP_KEY(advisors.small_micro_batch.memory_share, 0.0, 1.0),
      TP_KEY(advisors.exposed_communication.threshold, 0.0, 1.0),
      TP_KEY(advisors.exposed_communication.interference, 0.0, 1.0),
      TP_KEY(advisors.low_bus_bandwidth.fraction, 0.0, 1.0),
      TP_KEY(advisors.low_bus_bandwidth.small_message_bytes, 0, int64_t{1} << 40),
      TP_KEY(advisors.low_bus_bandwidth.threshold, 0.0, 1.0),
      TP_KEY(advisors.straggler_rank.threshold, 0.0, 10.0),
      TP_KEY(autotune.warmup_steps, 0, 1e9),
      TP_KEY(autotune.warmup_seconds, 0.0, 86400.0),
      TP_KEY(autotune.settle_steps, 0, 10000),
      TP_KEY(autotune.measure_steps, 3, 10000),
      TP_KEY(autotune.min_window_ms, 0.0, 600000.0),
      TP_KEY(autotune.noise_margin, 0.0, 0.5),
      TP_KEY(autotune.max_workers, 0, 1024),
      {"autotune.prefetch_choices",
       Type::kIntList,
       1,
       64,
       {},
       [](const Config& c) -> std::string { return text(c.autotune.prefetch_choices); },
       [](Config& c, const Value& v) {
         c.autotune.prefetch_choices.assign(v.list.begin(), v.list.end());
       }},
      TP_FLAG(autotune.tune_pin_memory),
      TP_FLAG(autotune.tune_device_prefetch),
      TP_FLAG(autotune.tune_micro_batch),
      TP_KEY(autotune.memory_headroom, 0.05, 1.0),
      TP_KEY(autotune.confirm_settings, 1, 16),
      TP_KEY(autotune.confirm_rounds, 0, 10),
      TP_FLAG(gpu.enabled),
      TP_KEY(gpu.device, -1, 1023),
      TP_FLAG(gpu.pm_sampling),
      TP_KEY(gpu.pm_interval_ms, 0.1, 1000.0),
      {"gpu.pm_metrics",
       Type::kString,
       0,
       0,
       {"all", "no_pcie", "sm"},
       [](const Config& c) -> std::string { return c.gpu.pm_metrics; },
       [](Config& c, const Value& v) { c.gpu.pm_metrics = v.s; }},
      TP_KEY(gpu.pm_duty, 0.01, 1.0),
      TP_KEY(gpu.pm_duty_period_ms, 100, 3600000),
      TP_FLAG(gpu.nvml),
      TP_KEY(gpu.nvml_interval_ms, 10.0, 60000.0),
      TP_FLAG(gpu.nvtx),
      TP_FLAG(gpu.activity),
      TP_FLAG(gpu.step_markers),
      TP_KEY(gpu.marker_poll_ms, 0.1, 1000.0),
      TP_KEY(gpu.marker_interval_ms, 0.0, 60000.0),
      TP_FLAG(gpu.sync_op_names),
      TP_KEY(gpu.trace_first_step, 0, 1e9),
      TP_KEY(gpu.trace_steps, 1, 100000),
      TP_KEY(gpu.trace_every_epochs, 0, 1000000),
      TP_KEY(gpu.trace_anomaly_factor, 0.0, 1000.0),
      TP_KEY(gpu.trace_buffer_mb, 1, 4096),
      TP_KEY(gpu.trace_device_buffer_mb, 0, 4096),
      TP_KEY(gpu.epoch_end_wait_ms, 0.0, 60000.0),
      TP_PATH(gpu.cupti_path),
      TP_KEY(flops.peak_tflops, 0.0, 1e6),
      TP_KEY(flops.skip_steps, 0, 1000000),
      TP_KEY(flops.count_steps, 1, 10000),
      TP_KEY(flops.recount_every_steps, 0, 1e9),
      TP_FLAG(flops.allow_tf32),
      TP_KEY(cost.budget, 0.0001, 1.0),
      TP_KEY(cost.horizon_s, 1.0, 1e7),
      TP_PATH(report.trace_dir),
      TP_PATH(report.html_path),
      TP_KEY(report.prometheus_port, 0, 65535),
      // Not empty: cpp-httplib would bind IPv6 loopback only, with no word.
      TP_KEY(report.prometheus_address, 1, 0),
      TP_PATH(report.journal_path),
      TP_FLAG(comm.enabled),
      TP_KEY(comm.exchange_timeout_ms, 1.0, 86400000.0),
      TP_KEY(comm.ranks_wait_ms, 0.0, 86400000.0),
      TP_KEY(comm.watchdog_ms, 0.0, 86400000.0),
      TP_KEY(comm.link_peak_gbps, 0.0, 1e6),
      TP_FLAG(comm.observe_nccl_ops),
      TP_FLAG(offload.enabled),
      TP_KEY(offload.min_bytes, 1, 1e15),
      TP_KEY(offload.depth, 0, 1000),
  };
  return table;
}

#undef TP_KEY
#undef TP_FLAG
#undef TP_PATH
}  // namespace

const KeySpec* find_key(const std::string& key) {
  for (const auto& spec : schema()) {
    if (key == spec.key) return &spec;
  }
  return nullptr;
}

}  // namespace config_detail
}  // namespace torchpilot
