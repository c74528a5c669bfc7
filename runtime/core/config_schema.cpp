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

// Rows for plain fields: TP_INT(field.path, min, max) etc. The key is the field's path spelled
// out (#field), so a row cannot give a key a name other than the field it sets.
#define TP_INT(field, lo, hi)                                                          \
  {                                                                                    \
#field, Type::kInt, lo, hi, {},                                                      \
        [](const Config& c) -> std::string { return std::to_string(c.field); },          \
        [](Config& c, const Value& v) { c.field = static_cast<decltype(c.field)>(v.i); } \
  }
#define TP_DOUBLE(field, lo, hi)                                                                 \
  {                                                                                              \
#field, Type::kDouble, lo, hi,                                                               \
        {}, [](const Config& c)                                                                  \
                 -> std::string { return text(c.field); }, [](Config & c,                        \
                                                              const Value& v) { c.field = v.d; } \
  }
#define TP_BOOL(field)                                                                           \
  {                                                                                              \
#field, Type::kBool, 0, 0,                                                                   \
        {}, [](const Config& c)                                                                  \
                 -> std::string { return text(c.field); }, [](Config & c,                        \
                                                              const Value& v) { c.field = v.b; } \
  }
#define TP_STRING(field)                                                                   \
  {                                                                                        \
#field, Type::kString, 0, 0,                                                           \
        {}, [](const Config& c)                                                            \
                 -> std::string { return c.field; }, [](Config & c,                        \
                                                        const Value& v) { c.field = v.s; } \
  }

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
      TP_STRING(log.json_path),
      TP_INT(records.step_history, 16, 1 << 20),  // ~0.6 KiB a record: ~600 MiB when full
      TP_DOUBLE(advisors.data_starvation.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.data_starvation.high_severity, 0.0, 1.0),
      TP_DOUBLE(advisors.busy_inefficient.utilization, 0.0, 1.0),
      TP_DOUBLE(advisors.busy_inefficient.sm_efficiency, 0.0, 1.0),
      TP_DOUBLE(advisors.host_sync.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.pageable_copies.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.launch_bound.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.precision.fp32_matmul_threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.attention.unfused_threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.linear_bias.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.optimizer.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.host_bound.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.periodic_stall.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.low_mfu.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.checkpoint.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.memory_pressure.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.exposed_communication.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.exposed_communication.interference, 0.0, 1.0),
      TP_DOUBLE(advisors.low_bus_bandwidth.fraction, 0.0, 1.0),
      TP_INT(advisors.low_bus_bandwidth.small_message_bytes, 0, int64_t{1} << 40),
      TP_DOUBLE(advisors.low_bus_bandwidth.threshold, 0.0, 1.0),
      TP_DOUBLE(advisors.straggler_rank.threshold, 0.0, 10.0),
      TP_INT(autotune.warmup_steps, 0, 1e9),
      TP_DOUBLE(autotune.warmup_seconds, 0.0, 86400.0),
      TP_INT(autotune.settle_steps, 0, 10000),
      TP_INT(autotune.measure_steps, 3, 10000),
      TP_DOUBLE(autotune.min_window_ms, 0.0, 600000.0),
      TP_DOUBLE(autotune.noise_margin, 0.0, 0.5),
      TP_INT(autotune.max_workers, 0, 1024),
      {"autotune.prefetch_choices",
       Type::kIntList,
       1,
       64,
       {},
       [](const Config& c) -> std::string { return text(c.autotune.prefetch_choices); },
       [](Config& c, const Value& v) {
         c.autotune.prefetch_choices.assign(v.list.begin(), v.list.end());
       }},
      TP_BOOL(autotune.tune_pin_memory),
      TP_BOOL(autotune.tune_device_prefetch),
      TP_BOOL(autotune.tune_micro_batch),
      TP_DOUBLE(autotune.memory_headroom, 0.05, 1.0),
      TP_INT(autotune.confirm_settings, 1, 16),
      TP_INT(autotune.confirm_rounds, 0, 10),
      TP_BOOL(gpu.enabled),
      TP_INT(gpu.device, -1, 1023),
      TP_BOOL(gpu.pm_sampling),
      TP_DOUBLE(gpu.pm_interval_ms, 0.1, 1000.0),
      {"gpu.pm_metrics",
       Type::kString,
       0,
       0,
       {"all", "no_pcie", "sm"},
       [](const Config& c) -> std::string { return c.gpu.pm_metrics; },
       [](Config& c, const Value& v) { c.gpu.pm_metrics = v.s; }},
      TP_DOUBLE(gpu.pm_duty, 0.01, 1.0),
      TP_INT(gpu.pm_duty_period_ms, 100, 3600000),
      TP_BOOL(gpu.nvml),
      TP_DOUBLE(gpu.nvml_interval_ms, 10.0, 60000.0),
      TP_BOOL(gpu.nvtx),
      TP_BOOL(gpu.activity),
      TP_BOOL(gpu.step_markers),
      TP_DOUBLE(gpu.marker_poll_ms, 0.1, 1000.0),
      TP_BOOL(gpu.sync_op_names),
      TP_INT(gpu.trace_first_step, 0, 1e9),
      TP_INT(gpu.trace_steps, 1, 100000),
      TP_INT(gpu.trace_every_epochs, 0, 1000000),
      TP_DOUBLE(gpu.trace_anomaly_factor, 0.0, 1000.0),
      TP_INT(gpu.trace_buffer_mb, 1, 4096),
      TP_INT(gpu.trace_device_buffer_mb, 0, 4096),
      TP_DOUBLE(gpu.epoch_end_wait_ms, 0.0, 60000.0),
      TP_STRING(gpu.cupti_path),
      TP_DOUBLE(flops.peak_tflops, 0.0, 1e6),
      TP_INT(flops.skip_steps, 0, 1000000),
      TP_INT(flops.count_steps, 1, 10000),
      TP_INT(flops.recount_every_steps, 0, 1e9),
      TP_BOOL(flops.allow_tf32),
      TP_DOUBLE(cost.budget, 0.0001, 1.0),
      TP_DOUBLE(cost.horizon_s, 1.0, 1e7),
      TP_DOUBLE(outliers.factor, 1.1, 1000.0),
      TP_STRING(report.trace_dir),
      TP_STRING(report.html_path),
      TP_INT(report.prometheus_port, 0, 65535),
      TP_STRING(report.prometheus_address),
      TP_STRING(report.journal_path),
      TP_BOOL(comm.enabled),
      TP_DOUBLE(comm.exchange_timeout_ms, 1.0, 86400000.0),
      TP_DOUBLE(comm.watchdog_ms, 0.0, 86400000.0),
      TP_DOUBLE(comm.link_peak_gbps, 0.0, 1e6),
      TP_BOOL(comm.observe_nccl_ops),
      TP_BOOL(offload.enabled),
      TP_INT(offload.min_bytes, 1, 1e15),
      TP_INT(offload.depth, 0, 1000),
  };
  return table;
}

#undef TP_INT
#undef TP_DOUBLE
#undef TP_BOOL
#undef TP_STRING
}  // namespace

const KeySpec* find_key(const std::string& key) {
  for (const auto& spec : schema()) {
    if (key == spec.key) return &spec;
  }
  return nullptr;
}

}  // namespace config_detail
}  // namespace torchpilot
