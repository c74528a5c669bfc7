// CuptiApi: the thin vendor interface to CUPTI (one virtual method per entry point the collectors
// use, generated from one list: TORCHPILOT_CUPTI_ENTRY_POINTS), in the style of kineto's
// CuptiActivityApi. Production code reaches libcupti through
// load_cupti(), which dlopens it (nothing links against CUDA libraries: the library loads and runs
// on a machine without a driver); tests substitute a fake. Internal to hooks/.
//
// Which libcupti: the copy the process already loaded (LibTorch's, from the wheel: two copies in
// one process conflict), then gpu.cupti_path, then the loader's search path, then the CUDA
// toolkit's usual folders.
//
// Thread-safety: CUPTI's entry points are thread-safe where CUPTI says so; the interface adds no
// state of its own after loading.
#pragma once

#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_pmsampling.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_result.h>
#include <cupti_target.h>
#include <cupti_version.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "torchpilot/runtime/core/clock.h"

namespace spdlog {
class logger;
}  // namespace spdlog

namespace torchpilot {
namespace detail {

// The CUPTI entry points, one line each, grouped by what uses them. Two shapes:
//   X(method, symbol, (parameters), (arguments))  an entry point with its own signature;
//   P(method, symbol, Params)                      one taking a `Params* p` whose structSize must
//                                                  be Params##_STRUCT_SIZE (the profiler APIs).
// Every entry point returns CUptiResult. The list generates the CuptiApi interface (below), the
// dlopen implementation's resolution and forwarding (cupti_api.cpp) and the tests' default fake
// (tests/unit/cupti_api_fake.h): adding an entry point is one line here.

// General and subscription (backend, activity).
#define TORCHPILOT_CUPTI_GENERAL(X, P)                                                    \
  X(get_version, cuptiGetVersion, (uint32_t * version), (version))                        \
  X(get_result_string, cuptiGetResultString, (CUptiResult result, const char** str),      \
    (result, str))                                                                        \
  X(get_timestamp, cuptiGetTimestamp, (uint64_t * timestamp), (timestamp))                \
  /* cuptiSubscribe_v2 names the client already attached; where the library lacks it, the \
     dlopen implementation falls back to cuptiSubscribe (params ignored). */              \
  X(subscribe, cuptiSubscribe_v2,                                                         \
    (CUpti_SubscriberHandle * subscriber, CUpti_CallbackFunc callback, void* userdata,    \
     CUpti_SubscriberParams* params),                                                     \
    (subscriber, callback, userdata, params))                                             \
  X(unsubscribe, cuptiUnsubscribe, (CUpti_SubscriberHandle subscriber), (subscriber))     \
  X(enable_domain, cuptiEnableDomain,                                                     \
    (uint32_t enable, CUpti_SubscriberHandle subscriber, CUpti_CallbackDomain domain),    \
    (enable, subscriber, domain))                                                         \
  X(enable_callback, cuptiEnableCallback,                                                 \
    (uint32_t enable, CUpti_SubscriberHandle subscriber, CUpti_CallbackDomain domain,     \
     CUpti_CallbackId cbid),                                                              \
    (enable, subscriber, domain, cbid))                                                   \
  /* Detaches CUPTI from the process (kineto's teardown after a trace). */                \
  X(finalize, cuptiFinalize, (), ())

// Activity API (detailed windows).
#define TORCHPILOT_CUPTI_ACTIVITY(X, P)                                                        \
  X(activity_register_callbacks, cuptiActivityRegisterCallbacks,                               \
    (CUpti_BuffersCallbackRequestFunc requested, CUpti_BuffersCallbackCompleteFunc completed), \
    (requested, completed))                                                                    \
  X(activity_enable, cuptiActivityEnable, (CUpti_ActivityKind kind), (kind))                   \
  X(activity_disable, cuptiActivityDisable, (CUpti_ActivityKind kind), (kind))                 \
  X(activity_flush_all, cuptiActivityFlushAll, (uint32_t flag), (flag))                        \
  X(activity_get_next_record, cuptiActivityGetNextRecord,                                      \
    (uint8_t * buffer, size_t valid_bytes, CUpti_Activity * *record),                          \
    (buffer, valid_bytes, record))                                                             \
  X(activity_get_num_dropped_records, cuptiActivityGetNumDroppedRecords,                       \
    (CUcontext context, uint32_t stream_id, size_t * dropped), (context, stream_id, dropped))  \
  X(activity_get_attribute, cuptiActivityGetAttribute,                                         \
    (CUpti_ActivityAttribute attribute, size_t * value_size, void* value),                     \
    (attribute, value_size, value))                                                            \
  X(activity_set_attribute, cuptiActivitySetAttribute,                                         \
    (CUpti_ActivityAttribute attribute, size_t * value_size, void* value),                     \
    (attribute, value_size, value))

// Profiler target and host (the backend's chip name; PM sampling's metric configuration and
// evaluation).
#define TORCHPILOT_CUPTI_PROFILER(X, P)                                                           \
  P(profiler_initialize, cuptiProfilerInitialize, CUpti_Profiler_Initialize_Params)               \
  P(profiler_deinitialize, cuptiProfilerDeInitialize, CUpti_Profiler_DeInitialize_Params)         \
  P(device_get_chip_name, cuptiDeviceGetChipName, CUpti_Device_GetChipName_Params)                \
  P(profiler_host_initialize, cuptiProfilerHostInitialize, CUpti_Profiler_Host_Initialize_Params) \
  P(profiler_host_deinitialize, cuptiProfilerHostDeinitialize,                                    \
    CUpti_Profiler_Host_Deinitialize_Params)                                                      \
  P(profiler_host_config_add_metrics, cuptiProfilerHostConfigAddMetrics,                          \
    CUpti_Profiler_Host_ConfigAddMetrics_Params)                                                  \
  P(profiler_host_get_config_image_size, cuptiProfilerHostGetConfigImageSize,                     \
    CUpti_Profiler_Host_GetConfigImageSize_Params)                                                \
  P(profiler_host_get_config_image, cuptiProfilerHostGetConfigImage,                              \
    CUpti_Profiler_Host_GetConfigImage_Params)                                                    \
  P(profiler_host_get_num_of_passes, cuptiProfilerHostGetNumOfPasses,                             \
    CUpti_Profiler_Host_GetNumOfPasses_Params)                                                    \
  P(profiler_host_evaluate_to_gpu_values, cuptiProfilerHostEvaluateToGpuValues,                   \
    CUpti_Profiler_Host_EvaluateToGpuValues_Params)

// PM sampling (always on).
#define TORCHPILOT_CUPTI_PM_SAMPLING(X, P)                                                  \
  P(pm_sampling_get_counter_availability, cuptiPmSamplingGetCounterAvailability,            \
    CUpti_PmSampling_GetCounterAvailability_Params)                                         \
  P(pm_sampling_enable, cuptiPmSamplingEnable, CUpti_PmSampling_Enable_Params)              \
  P(pm_sampling_disable, cuptiPmSamplingDisable, CUpti_PmSampling_Disable_Params)           \
  P(pm_sampling_set_config, cuptiPmSamplingSetConfig, CUpti_PmSampling_SetConfig_Params)    \
  P(pm_sampling_start, cuptiPmSamplingStart, CUpti_PmSampling_Start_Params)                 \
  P(pm_sampling_stop, cuptiPmSamplingStop, CUpti_PmSampling_Stop_Params)                    \
  P(pm_sampling_decode_data, cuptiPmSamplingDecodeData, CUpti_PmSampling_DecodeData_Params) \
  P(pm_sampling_get_counter_data_size, cuptiPmSamplingGetCounterDataSize,                   \
    CUpti_PmSampling_GetCounterDataSize_Params)                                             \
  P(pm_sampling_counter_data_image_initialize, cuptiPmSamplingCounterDataImageInitialize,   \
    CUpti_PmSampling_CounterDataImage_Initialize_Params)                                    \
  P(pm_sampling_get_counter_data_info, cuptiPmSamplingGetCounterDataInfo,                   \
    CUpti_PmSampling_GetCounterDataInfo_Params)                                             \
  P(pm_sampling_counter_data_get_sample_info, cuptiPmSamplingCounterDataGetSampleInfo,      \
    CUpti_PmSampling_CounterData_GetSampleInfo_Params)

#define TORCHPILOT_CUPTI_ENTRY_POINTS(X, P) \
  TORCHPILOT_CUPTI_GENERAL(X, P)            \
  TORCHPILOT_CUPTI_ACTIVITY(X, P)           \
  TORCHPILOT_CUPTI_PROFILER(X, P)           \
  TORCHPILOT_CUPTI_PM_SAMPLING(X, P)

class CuptiApi {
 public:
  virtual ~CuptiApi() = default;

  // Where the library came from (a path or soname; "fake" in tests).
  virtual std::string origin() const = 0;

  // One pure virtual method per entry point of the list above.
#define TORCHPILOT_CUPTI_DECLARE(method, symbol, params, args) \
  virtual CUptiResult method params = 0;
#define TORCHPILOT_CUPTI_DECLARE_P(method, symbol, Params) \
  virtual CUptiResult method(Params* p) = 0;
  TORCHPILOT_CUPTI_ENTRY_POINTS(TORCHPILOT_CUPTI_DECLARE, TORCHPILOT_CUPTI_DECLARE_P)
#undef TORCHPILOT_CUPTI_DECLARE
#undef TORCHPILOT_CUPTI_DECLARE_P
};

// Loads libcupti (see the header comment for the order) and resolves its entry points. Returns
// null with `error` set when no library could be loaded. An entry point missing from the loaded
// library answers CUPTI_ERROR_API_NOT_IMPLEMENTED (its collector then reports that).
std::unique_ptr<CuptiApi> load_cupti(const std::string& configured_path, std::string* error);

// "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES (35)": CUPTI's name for `result` and its number.
std::string cupti_error_name(CuptiApi& api, CUptiResult result);

// CUPTI timestamps (activity records, PM samples) are on CUPTI's own clock: CLOCK_REALTIME in ns
// on Linux, unless a client registered a timestamp callback
// (cuptiActivityRegisterTimestampCallback). PyTorch's profiler (Kineto, torch 2.x) registers one
// that returns TSC ticks, and it stays for the rest of the process. The collectors convert CUPTI
// readings to the steady clock along a line through a paired reading: its offset, and the CUPTI
// clock's rate where that is not 1 ns a unit.
struct TimeBase {
  int64_t offset_ns = 0;  // the CUPTI reading at the anchor minus the steady reading there
  double scale = 1.0;     // steady ns per CUPTI unit (1: a nanosecond clock)
  uint64_t anchor = 0;    // the CUPTI reading the line goes through (used when scale != 1)
  Nanos to_steady(uint64_t cupti_ns) const {
    if (scale == 1.0) return static_cast<Nanos>(cupti_ns) - offset_ns;
    const double units = static_cast<double>(static_cast<int64_t>(cupti_ns - anchor));
    // Clamped: a garbage timestamp must not overflow (a real one is hours from the anchor).
    const double ns = std::clamp(units * scale, -4e18, 4e18);
    return static_cast<Nanos>(anchor) - offset_ns + std::llround(ns);
  }
};

// One paired reading: a CUPTI reading and the steady time it was taken at.
struct ClockPair {
  uint64_t cupti = 0;
  Nanos steady = 0;
  Nanos latency = 0;  // of the steady reads around it
};

// The pair from `reads` paired reads: steady, CUPTI, steady; the one with the least latency wins
// and the CUPTI reading is taken to fall at the midpoint of its two steady readings. Pure (clocks
// injected).
ClockPair read_clock_pair(const std::function<uint64_t()>& cupti_now,
                          const std::function<Nanos()>& steady_now, int reads = 5);

// The line through `now`. Its rate comes from `earlier`, a reading of the same clock at least
// kMinClockBaselineNs before: 1 when within 0.2% of it (a nanosecond clock; the reads' latency
// and NTP's slewing would only blur it), otherwise the measured rate. Without a usable `earlier`
// (none, too close, or a CUPTI clock that went backwards or moved at an implausible rate: another
// clock since), the rate is `fallback_scale` and `*rate_measured` (when not null) is false.
constexpr Nanos kMinClockBaselineNs = 1'000'000;
// How long a thread that may wait waits for the second reading of a clock not seen before.
constexpr Nanos kClockWaitNs = 2'000'000;
TimeBase time_base_through(const ClockPair& now, const ClockPair* earlier, double fallback_scale,
                           bool* rate_measured = nullptr);

// The one info line, once a clock's rate other than 1 was confirmed (CuptiClock below).
class CuptiClock;
void note_tick_clock(CuptiClock& clock, spdlog::logger& logger);

// The steady clock the events are on (std::chrono::steady_clock, ns since its epoch).
Nanos steady_now_ns();

// The current TimeBase, shared by the collectors (the activity collector's converter and the PM
// decode thread read it while the training thread and the decode thread re-measure it).
class CuptiClock {
 public:
  TimeBase get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return tb_;
  }
  // Measures with api.get_timestamp(): the offset from a paired reading now, the rate from the
  // first reading of the same clock. When there is none (the first measure, or the clock changed
  // since), a second reading `wait_ns` later gives the rate, if `wait_ns` > 0 (threads that may
  // wait: never the training thread). False (the line unchanged) when a read fails.
  bool measure(CuptiApi& api, Nanos* latency_ns = nullptr, Nanos wait_ns = 0);
  // True once: the first time a rate other than 1 was confirmed (two baselines agreeing), for the
  // one log line saying so.
  bool take_tick_clock_note();

 private:
  mutable std::mutex mutex_;
  TimeBase tb_;
  bool have_first_ = false;
  bool rate_known_ = false;  // of the clock now in use
  ClockPair first_;          // its first reading
  uint64_t generation_ = 0;  // of the state: a measure that raced another keeps the other's
  bool tick_confirmed_ = false, tick_noted_ = false;
};

}  // namespace detail
}  // namespace torchpilot
