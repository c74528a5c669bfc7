// CUPTI PM sampling (always on): hardware counters sampled every gpu.pm_interval_ms by the GPU
// itself, decoded on a background thread into PmSample. Follows CUPTI's documented PM-sampling
// sequence (counter availability, host config of the metrics, one pass, enable, set config, counter
// data image, start; decode every 50 ms; stop, decode to the end, disable, host deinitialize).
// cuptiProfilerInitialize/DeInitialize are the backend's (it also needs them for the chip name).
// Internal to hooks/.
//
// Metrics: gr/sm cycles active, tensor pipe, DRAM throughput, warps active (% of peak sustained,
// converted to fractions) and PCIe read/write bytes. When the full set is refused or needs more
// than one pass, the PCIe metrics go first, then everything but sm/gr (the dropped ones are
// logged). The first sample after start is discarded (its values are garbage, seen on the H200).
//
// Cost, measured on an H200 (decode every 50 ms, 2 ms interval): GPU idle, 3% of one core for the
// decode thread whatever the metrics; GPU busy, 2% with gr/sm/dram, but 35-55% of one core as soon
// as sm__pipe_tensor_cycles_active is in the set (cuptiPmSamplingDecodeData: 10-30 ms per call,
// the same at 5 and 10 ms intervals), and flush() then takes 15-75 ms.
//
// With PmOptions::duty < 1 the decode thread also runs the duty cycle: at the end of a burst it
// stops, decodes to the end and disables the sampler; after the pause it enables, configures and
// starts it again (the host config image is kept). A burst that cannot start is retried a period
// later, with reason() set meanwhile.
//
// Thread-safety: configure/start/decode_now/stop from one thread at a time (the training thread,
// or the backend's release thread after a trace window); the decode thread and decode_now
// serialize on one mutex; the sink runs on either thread; paused_final_until() from any thread,
// without waiting.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cupti_api.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace spdlog {
class logger;
}

namespace torchpilot {
namespace detail {

enum class PmMetric {
  kCounterUtilization,
  kSmEfficiency,
  kTensorActivity,
  kDramThroughput,
  kAchievedOccupancy,
  kPcieReadBytes,
  kPcieWriteBytes,
};

const char* pm_metric_name(PmMetric m);  // the CUPTI metric name
bool pm_metric_is_percent(PmMetric m);   // "% of peak" (converted to a fraction)
// The metric sets tried in order: all, without PCIe, sm and gr only.
std::vector<std::vector<PmMetric>> pm_metric_tiers();

// Pure: one sample's values (values[i] belongs to metrics[i]) -> PmSample. Percentages become
// fractions clamped to [0, 1]; byte counts are kept (negative -> 0); a NaN stays NaN (not
// measured); metrics not in the set stay NaN.
PmSample to_pm_sample(const std::vector<PmMetric>& metrics, const double* values, uint64_t start_ns,
                      uint64_t end_ns, const TimeBase& tb);

// The reason PM sampling is off after `call` returned `r`: the known causes in words
// (permissions, counters held by another client, MIG, ...), otherwise "<call> failed: <error>".
std::string pm_sampling_error_reason(CuptiApi& api, const std::string& call, CUptiResult r);

// The metric set of gpu.pm_metrics ("all": empty, the fallback tiers; "no_pcie"; "sm").
std::vector<PmMetric> pm_metric_set(const std::string& name);

struct PmOptions {
  int device = 0;
  std::string chip;               // cuptiDeviceGetChipName
  std::vector<PmMetric> metrics;  // one set to use as is; empty: the fallback tiers
  double interval_ms = 2;
  size_t hardware_buffer_bytes = 64u << 20;
  // Samples per counter data image. The image is re-initialized only when full (about 14 us per
  // slot on an H200: 29 ms for 2048, every 4 s at a 2 ms interval).
  uint32_t max_samples = 2048;
  // Decode thread period. Measured on an H200 at a 2 ms interval, GPU idle: 10 ms took 5.5% of a
  // core (0.43 ms DecodeData + 0.12 ms evaluation per decode), 50 ms 3.1%, 100 ms 3.0%. Samples
  // reach drain() at most this late; flush() decodes at once.
  int decode_period_ms = 50;
  size_t max_decode_rounds = 64;  // per decode call (each empties the image once)
  // gpu.pm_duty: the share of each duty period that the sampler is enabled (1: always). Enabled,
  // PM sampling slows a GPU-bound step by 0.5-1% whatever the interval or the counters
  // (bench/baselines/overhead-isolation/*.json); stopped but enabled, it still does. So between
  // bursts the sampler is disabled (the host config image is kept).
  double duty = 1;
  int duty_period_ms = 2000;
};

class PmSampler {
 public:
  using Sink = std::function<void(std::vector<PmSample>&&)>;
  PmSampler(CuptiApi& api, CuptiClock& clock, spdlog::logger& logger, PmOptions options, Sink sink);
  ~PmSampler();  // stop()
  PmSampler(const PmSampler&) = delete;
  PmSampler& operator=(const PmSampler&) = delete;

  // The sequence up to an initialized counter data image. Returns the reason on failure (and
  // undoes what was done), empty on success.
  std::string configure();
  // cuptiPmSamplingStart and the decode thread. Returns the reason on failure.
  std::string start();
  // Decodes what the hardware buffer holds now (flush()); serialized with the decode thread.
  void decode_now();
  // Wakes the decode thread to decode now; returns at once.
  void request_decode();
  // Stop, decode until the end of the records, Disable, HostDeinitialize. Idempotent.
  void stop();
  // Paused between bursts: now (every sample before it went to the sink; the next burst's come
  // after it). Otherwise 0. Never waits: the training thread calls it while a decode may hold
  // the sampler for tens of ms.
  Nanos paused_final_until() const;
  // Set when decoding failed on its own (sampling stopped); empty while it works.
  std::string reason() const;
  // The metric set in use (after fallbacks).
  std::vector<PmMetric> metrics() const { return metrics_; }

 private:
  std::string configure_metrics(const std::vector<uint8_t>& availability);
  std::string enable_device();  // Enable, SetConfig, counter data image
  void disable_device();        // Disable (the host object stays)
  void release();               // Disable + HostDeinitialize where held
  bool start_device();          // Start; decode_mutex_ held; false: reason_ set
  void stop_device_locked();    // Stop, decode to the end; decode_mutex_ held
  struct Duty {
    Nanos on, off;  // a burst's and a pause's length
  };
  Duty duty() const;
  bool burst_over_locked() const;         // the running burst is due to stop; decode_mutex_ held
  void duty_step_locked();                // pauses or resumes a burst when due; decode_mutex_ held
  bool decode_locked();                   // decode_mutex_ held; false on error (reason set)
  bool lines_up(const PmSample& sample);  // its times are on the steady clock (else dropped)
  void fail_on_exception(const char* what);  // takes decode_mutex_ then state_mutex_
  bool reinit_image();
  void run();

  CuptiApi& api_;
  CuptiClock& clock_;  // re-measured when samples stop lining up
  spdlog::logger& logger_;
  PmOptions options_;
  Sink sink_;

  std::vector<PmMetric> metrics_;
  std::vector<const char*> metric_names_;
  std::vector<uint8_t> config_image_;
  std::vector<uint8_t> counter_data_;
  CUpti_Profiler_Host_Object* host_ = nullptr;
  CUpti_PmSampling_Object* sampler_ = nullptr;
  bool started_ = false;

  mutable std::mutex decode_mutex_;  // the counter data image and the decode state below
  bool running_ = false;             // Start called on the enabled sampler (false between bursts)
  std::atomic<bool> paused_{false};  // between bursts, the last burst's samples delivered
  Nanos phase_since_ns_ = 0;         // when the current burst or pause began
  bool resume_failing_ = false;      // a burst could not start (said once until one does)
  int64_t bursts_ = 0;               // started (logged at stop)
  bool discard_next_ = true;
  bool clock_checked_ = false;
  bool overflow_logged_ = false;
  bool evaluate_error_logged_ = false;
  // Samples whose times do not line up with the steady clock (lines_up()); under state_mutex_.
  bool misaligned_ = false;
  int64_t dropped_misaligned_ = 0;
  Nanos last_remeasure_ns_ = 0;
  bool failed_ = false;
  size_t consumed_ = 0;  // samples of the current image already evaluated
  struct {
    int64_t decodes = 0, samples = 0, inits = 0;
    Nanos decode_ns = 0, evaluate_ns = 0, init_ns = 0;
  } stats_;  // logged (debug) at stop

  std::thread thread_;
  mutable std::mutex state_mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  bool decode_requested_ = false;  // request_decode(): decode before the period is up
  std::string reason_;
};

}  // namespace detail
}  // namespace torchpilot
