// torchpilot configuration: defaults, YAML files and TORCHPILOT_* environment overrides.
// configs/default.yaml documents every key; docs/configuration.md explains precedence.
//
// Failure behaviour: every loader here validates the whole input and throws ConfigError naming the
// source (file or environment variable), the key and the reason. That happens at start-up, before
// training; nothing else in torchpilot throws into the training loop.
// Thread-safety: Config is a plain value; load it once and hand it to Pilot.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torchpilot {

enum class Mode { kOff, kAdvise, kAutotune };
const char* to_string(Mode mode);

// A key is the path of the field it sets: key "log.level" sets Config::log.level, key
// "advisors.low_mfu.threshold" sets Config::advisors.low_mfu.threshold (docs/configuration.md).
// A subsystem may register a section of its own instead (config_section.h): key "toy.threshold"
// then sets config.section<ToyConfig>().threshold.

struct LogConfig {
  std::string level = "info";  // trace | debug | info | warn | error | off
  std::string json_path;       // JSON-lines records; empty: none
};

struct RecordsConfig {
  int step_history = 4096;  // per-step records kept in memory (ring buffer, grown as steps come)
};

struct AutotuneConfig {
  int warmup_steps = 200;      // budget for all trials, counted from the first step, ...
  double warmup_seconds = 10;  // ... or this long, whichever is larger (fast steps)
  int settle_steps = 3;        // steps ignored after a change (queues refill)
  int measure_steps = 10;      // steps measured per trial, at least ...
  double min_window_ms = 250;  // ... and at least this long
  double noise_margin = 0.03;  // a candidate must beat the incumbent by this fraction
  int max_workers = 0;         // 0: the number of CPUs in this process's affinity mask
  std::vector<int> prefetch_choices = {1, 2, 4, 8};  // batches in flight per worker
  bool tune_pin_memory = true;                       // only where LibTorch has CUDA
  bool tune_device_prefetch = true;                  // only where LibTorch has CUDA
  // The micro-batch search (a torchpilot::Accumulation attached): after the loader's knobs.
  bool tune_micro_batch = true;
  // A trial whose peak allocated memory exceeds this share of the device's memory fails: room
  // left for what a trial does not see (other shapes, a fragmented cache).
  double memory_headroom = 0.9;
  // Confirmation: after the search, the best settings (at most this many, within 15% of the best)
  // are measured again in interleaved rounds and the best median wins: one noisy window must not
  // pick the setting (winner's curse). confirm_settings 1 or confirm_rounds 0: off.
  int confirm_settings = 3;
  int confirm_rounds = 2;
};

// GPU collectors (hooks/: CUPTI PM sampling and activity, NVML, NVTX); docs/metrics.md, "GPU".
struct GpuConfig {
  bool enabled = true;        // observe the GPU when one is present
  int device = -1;            // CUDA device index observed; -1: auto (choose_gpu_device)
  bool pm_sampling = true;    // always-on hardware counters (SM, tensor pipe, DRAM, PCIe)
  double pm_interval_ms = 2;  // PM sampling interval
  // PM sampling's counters: "all" (SM, tensor pipe, DRAM, occupancy, PCIe; fewer where the GPU
  // refuses the set), "no_pcie" (all but PCIe), "sm" (GPU and SM activity only).
  std::string pm_metrics = "all";
  // The share of each pm_duty_period_ms that PM sampling is enabled (1: always). Enabled, it
  // costs a GPU-bound step 0.5-1%; in bursts of 0.8 s every 4 s, 0.1-0.2% (2 H200s, one and two
  // ranks; 0.5 s every 2 s: 0.35-0.55%, each turn on and off costs too). Between bursts the
  // sampler is disabled; steps in a pause have no PM figures (epoch means weigh by the time
  // samples cover). Bursts and pauses last 100 ms at least.
  double pm_duty = 0.2;
  int pm_duty_period_ms = 4000;
  bool nvml = true;               // NVML utilization.gpu beside the truth
  double nvml_interval_ms = 100;  // NVML polling interval
  bool nvtx = true;               // NVTX ranges for steps and phases ("torchpilot" domain)
  bool activity = true;           // CUPTI activity trace in detailed windows
  bool step_markers = true;       // CUDA events at step boundaries: figures by GPU time
  double marker_poll_ms = 1;      // how often our thread looks for the GPU reaching them
  // Outside trace windows a marker only at a boundary this long (host time) after the previous
  // one: steps in between share the span, each its host time's share (0: every boundary).
  double marker_interval_ms = 50;
  bool sync_op_names = true;          // windows name each host sync's op (its stack, walked)
  int trace_first_step = 20;          // first window: from this step, or once auto-tune is done
  int trace_steps = 10;               // steps per detailed window
  int trace_every_epochs = 0;         // a window every N epochs (0: the first window only)
  double trace_anomaly_factor = 3.0;  // a step slower than this x the median opens one (0: off)
  int trace_buffer_mb = 32;           // most memory for activity buffers
  int trace_device_buffer_mb = 64;    // CUPTI's device buffer per context (0: CUPTI's default)
  // The most an epoch's end waits for the GPU to finish the epoch's steps; it waits no longer
  // than cost.budget / 4 x the epoch's time less torchpilot's time in it either. Steps not finished
  // count in the next epoch.
  double epoch_end_wait_ms = 1000;
  std::string cupti_path;  // libcupti to load; empty: LibTorch's, then the default search
};

// What torchpilot may cost (runtime/cost/cost.h; docs/metrics.md, "Cost").
struct CostConfig {
  double budget = 0.01;    // most of the run time torchpilot may take on the training thread ...
  double horizon_s = 600;  // ... counted over this sliding horizon; optional work waits for room
};

// FLOP counting and MFU (hooks/flop_counter); docs/metrics.md, "MFU".
struct FlopConfig {
  double peak_tflops = 0;       // dense peak for MFU; 0: from the device table
  int skip_steps = 2;           // steps before counting (first-iteration effects)
  int count_steps = 3;          // steps per counting window
  int recount_every_steps = 0;  // also recount every N steps (0: only when shapes change)
  bool allow_tf32 = false;      // opt-in: turn on TF32 for fp32 matmuls (changes numerics)
};

// Thresholds of the advisors (docs/advice.md), one section per rule.
struct DataStarvationConfig {
  double threshold = 0.05;      // data-wait fraction above which advice is given
  double high_severity = 0.25;  // ... and above which it is high severity
};
struct BusyInefficientConfig {
  double utilization = 0.8;    // busy but inefficient: GPU utilization at least ...
  double sm_efficiency = 0.5;  // ... and SM efficiency below this
};
struct HostSyncConfig {
  double threshold = 0.05;  // host-sync stall: GPU idle caused by host syncs, share of step time
};
struct PageableCopiesConfig {
  double threshold = 0.02;  // pageable copies: GPU idle they cause, share of step time
};
struct LaunchBoundConfig {
  double threshold = 0.2;  // launch-bound: share of step time in launch gaps
};
struct Fp32MatmulConfig {
  double threshold = 0.2;  // share of matmul FLOPs in plain fp32
};
struct UnfusedAttentionConfig {
  double threshold = 0.02;  // share of model FLOPs in unfused attention
};
struct UnfusedLinearBiasConfig {
  double threshold = 0.02;  // biases added outside their GEMMs: share of step time the adds take
};
struct PerParameterOptimizerConfig {
  double threshold = 0.05;  // per-parameter optimizer: share of step time its update takes
};
struct HostBoundConfig {
  double threshold = 0.2;  // host-bound: GPU idle outside waits and syncs, share of step time
};
struct PeriodicStallConfig {
  double threshold = 0.02;  // periodic stall: recurring outliers' excess time, share of the epoch
};
struct CheckpointConfig {
  double threshold = 0.05;  // work lost to failures, expected share of wall time
};
struct MemoryPressureConfig {
  double threshold = 0.9;  // peak reserved above this share of device memory is pressure
};
struct LowMfuConfig {
  double threshold = 0.3;  // MFU below this gets a breakdown
  // The breakdown names bf16 when fp32 matmuls hold more than this share of the FLOPs, else
  // fused attention when unfused attention holds more than this share of them.
  double fp32_share = 0.2;
  double unfused_attention_share = 0.02;
};
struct SmallMicroBatchConfig {
  double launch_gap_share = 0.2;  // launch gaps above this share of traced step time ...
  double memory_share = 0.9;      // ... and k x the peak allocated within this share of memory
};
struct ExposedCommunicationConfig {
  double threshold = 0.05;  // exposed communication: share of step time
  // The share of an overlapped collective's time that the compute it overlaps loses (NCCL's
  // kernels take SMs and memory bandwidth): 0.7 measured on 2 H100s over NVLink
  // (bench/baselines/collectives/*x2.json). Overlap removes exposed x (1 - this).
  double interference = 0.7;
};
struct LowBusBandwidthConfig {
  double fraction = 0.5;                  // bus bandwidth below this fraction of the link's peak
  int64_t small_message_bytes = 1 << 20;  // ... or a mean all-reduce message below this size
  double threshold = 0.05;                // ... while communication takes this share of step time
};
struct StragglerRankConfig {
  double threshold = 0.1;  // compute or data wait above the other ranks' median by this x step
};
struct AdvisorsConfig {
  DataStarvationConfig data_starvation;
  BusyInefficientConfig busy_inefficient;
  HostSyncConfig host_sync;
  PageableCopiesConfig pageable_copies;
  LaunchBoundConfig launch_bound;
  Fp32MatmulConfig fp32_matmul;
  UnfusedAttentionConfig unfused_attention;
  UnfusedLinearBiasConfig unfused_linear_bias;
  PerParameterOptimizerConfig per_parameter_optimizer;
  HostBoundConfig host_bound;
  PeriodicStallConfig periodic_stall;
  LowMfuConfig low_mfu;
  CheckpointConfig checkpoint;
  MemoryPressureConfig memory_pressure;
  SmallMicroBatchConfig small_micro_batch;
  ExposedCommunicationConfig exposed_communication;
  LowBusBandwidthConfig low_bus_bandwidth;
  StragglerRankConfig straggler_rank;
};

// Reports (docs/reports.md): trace files, the HTML report, the metrics endpoint, the run journal.
struct ReportConfig {
  std::string trace_dir;    // Chrome/Perfetto trace JSON per detailed window; empty: none
  std::string html_path;    // self-contained HTML report, rewritten per epoch; empty: none
  int prometheus_port = 0;  // Prometheus text endpoint on this port; 0: off
  std::string prometheus_address = "127.0.0.1";  // the address it binds (loopback by default)
  std::string journal_path;  // ETTR run journal, JSON lines appended; empty: none
};

// Collectives (docs/collectives.md).
struct CommConfig {
  bool enabled = true;                 // observe collectives on c10d process groups
  double exchange_timeout_ms = 10000;  // a rank missing a cross-rank exchange this long: reported
  // How long rank 0's training thread waits at an epoch end for that epoch's per-rank table
  // (gathered on a thread of its own); a table not complete by then comes with a later epoch.
  double ranks_wait_ms = 0;
  double watchdog_ms = 60000;  // a collective outstanding this long is logged (0: off)
  double link_peak_gbps = 0;   // the link's peak bus bandwidth, GB/s (0: unknown)
  // Count every NCCL collective through a global RecordFunction callback (every op then pays
  // for a RecordFunction); off: GradSync's all-reduces are counted, the others in trace windows.
  bool observe_nccl_ops = false;
};

// Activation offloading (torchpilot::ActivationOffload made from a Pilot; docs/offload.md).
struct OffloadConfig {
  bool enabled = false;  // its scopes offload (autotune's knob offload.enabled may turn it on)
  int64_t min_bytes = 1048576;  // saved storages smaller than this stay on the GPU
  int depth = 4;                // copies in flight behind forward; fetches ahead in backward
};

// Sections that subsystems register (config_section.h), with value semantics (copies clone).
class ConfigSections {
 public:
  ConfigSections() = default;
  ConfigSections(const ConfigSections& other) { *this = other; }
  ConfigSections& operator=(const ConfigSections& other) {
    if (this == &other) return *this;
    items_.clear();
    for (const auto& item : other.items_) items_.push_back(item->clone());
    return *this;
  }
  ConfigSections(ConfigSections&&) noexcept = default;
  ConfigSections& operator=(ConfigSections&&) noexcept = default;

  // The section of type S, made from its defaults on first use.
  template <typename S>
  S& get() {
    for (const auto& item : items_) {
      if (auto* h = dynamic_cast<Holder<S>*>(item.get())) return h->value;
    }
    items_.push_back(std::make_unique<Holder<S>>());
    return static_cast<Holder<S>&>(*items_.back()).value;
  }
  // The section of type S, or its defaults when none was set.
  template <typename S>
  const S& get() const {
    for (const auto& item : items_) {
      if (auto* h = dynamic_cast<const Holder<S>*>(item.get())) return h->value;
    }
    static const S defaults{};
    return defaults;
  }

 private:
  struct Item {
    virtual ~Item() = default;
    virtual std::unique_ptr<Item> clone() const = 0;
  };
  template <typename S>
  struct Holder final : Item {
    S value{};
    std::unique_ptr<Item> clone() const override { return std::make_unique<Holder<S>>(*this); }
  };
  std::vector<std::unique_ptr<Item>> items_;
};

// Where a loader took a key's value from, for errors found later (at the Pilot's start).
struct ValueSource {
  std::string where;  // "my.yaml:4", "environment variable TORCHPILOT_REPORT_HTML_PATH"
  std::string value;  // the value it set, as text (config_values)
};

struct Config {
  Mode mode = Mode::kAdvise;
  LogConfig log;
  RecordsConfig records;
  AdvisorsConfig advisors;
  AutotuneConfig autotune;
  GpuConfig gpu;
  FlopConfig flops;
  CostConfig cost;
  ReportConfig report;
  CommConfig comm;
  OffloadConfig offload;
  // Sections registered by subsystems outside the ones above (config_section.h).
  ConfigSections sections;
  template <typename S>
  S& section() {
    return sections.get<S>();
  }
  template <typename S>
  const S& section() const {
    return sections.get<S>();
  }
  // By key: where the loaders (below) took each value from. source_of() reads it.
  std::map<std::string, ValueSource> sources;

  // Defaults, then TORCHPILOT_CONFIG's file if that variable is set, then TORCHPILOT_* overrides,
  // then the cross-key checks on the merged values.
  static Config load();
  // The file (a regular file holding one YAML document), then TORCHPILOT_* overrides, then the
  // cross-key checks on the merged values.
  static Config from_yaml_file(const std::string& path);
  // YAML text; `origin` names it in errors. No environment overrides.
  static Config from_yaml_string(const std::string& text, const std::string& origin = "<string>");
};

class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string source, std::string key, std::string reason);
  const std::string& source() const { return source_; }
  const std::string& key() const { return key_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string source_, key_, reason_;
};

// Environment variables as (name, value) pairs; injected in tests.
using Environment = std::vector<std::pair<std::string, std::string>>;
Environment process_environment();

// Applies TORCHPILOT_<KEY> overrides, then the cross-key checks: key "autotune.warmup_steps" is
// TORCHPILOT_AUTOTUNE_WARMUP_STEPS. Lists are comma-separated ("1,2,4"). An unknown TORCHPILOT_*
// variable is an error, except TORCHPILOT_CONFIG and the CMake build options
// (TORCHPILOT_GPU_COLLECTORS, TORCHPILOT_BUILD_*, TORCHPILOT_INSTALL), which are passed over.
void apply_env_overrides(Config& config, const Environment& env);

// Checks every key of a Config (built in code or loaded) against the same ranges and rules as
// the file and environment readers; throws ConfigError naming the key. The Pilot calls it.
void validate(const Config& config);

// Where `key`'s value came from, for a ConfigError: the file and line or the environment variable
// that set it, while it still holds the value set there; else "Config" (set in code, or default).
std::string source_of(const Config& config, const std::string& key);

// Checks the outputs' paths against the file system before any output is opened (the Pilot calls
// it at start, unless mode is off): log.json_path, report.html_path and report.journal_path must
// each be a regular file this process may write (the JSON log also a FIFO or character device) or
// a name in a folder that takes new files; report.trace_dir a folder that takes new files, or one
// that can be made; no two outputs one file (compared by canonical path, symbolic links and ".."
// resolved, and by inode). Leaves nothing behind: no file it made stays, none is truncated.
// Throws ConfigError naming the key, source_of() and the OS's reason.
void check_output_paths(const Config& config);

// The journal file of one rank (`rank`: the launcher's RANK, or null): rank 0 and a program
// without ranks use `path`; rank N > 0 uses it with ".rankN" before the extension
// (run.journal.jsonl -> run.journal.rank1.jsonl). Ranks sharing one config then never share a
// file: appends from several hosts to one file interleave, and it would grow with every rank.
std::string journal_path_for_rank(const std::string& path, const char* rank);

// Every key as "section.name", in file order; docs and tests use it.
std::vector<std::string> config_keys();

// Every key with its value as text (lists comma-separated), in file order.
std::vector<std::pair<std::string, std::string>> config_values(const Config& config);

}  // namespace torchpilot
