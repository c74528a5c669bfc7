// CuptiApi: the thin vendor interface to CUPTI (one virtual method per entry point the collectors
// use), in the style of kineto's CuptiActivityApi. Production code reaches libcupti through
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

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "torchpilot/runtime/clock.h"

namespace torchpilot {
namespace detail {

class CuptiApi {
 public:
  virtual ~CuptiApi() = default;

  // Where the library came from (a path or soname; "fake" in tests).
  virtual std::string origin() const = 0;

  // General.
  virtual CUptiResult get_version(uint32_t* version) = 0;
  virtual CUptiResult get_result_string(CUptiResult result, const char** str) = 0;
  virtual CUptiResult get_timestamp(uint64_t* timestamp) = 0;
  // cuptiSubscribe_v2 where the library has it (it names the client already attached), else
  // cuptiSubscribe (params ignored).
  virtual CUptiResult subscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                                void* userdata, CUpti_SubscriberParams* params) = 0;
  virtual CUptiResult unsubscribe(CUpti_SubscriberHandle subscriber) = 0;
  // cuptiFinalize: detaches CUPTI from the process (kineto's teardown after a trace).
  virtual CUptiResult finalize() = 0;

  // Activity API.
  virtual CUptiResult activity_register_callbacks(CUpti_BuffersCallbackRequestFunc requested,
                                                  CUpti_BuffersCallbackCompleteFunc completed) = 0;
  virtual CUptiResult activity_enable(CUpti_ActivityKind kind) = 0;
  virtual CUptiResult activity_disable(CUpti_ActivityKind kind) = 0;
  virtual CUptiResult activity_flush_all(uint32_t flag) = 0;
  virtual CUptiResult activity_get_next_record(uint8_t* buffer, size_t valid_bytes,
                                               CUpti_Activity** record) = 0;
  virtual CUptiResult activity_get_num_dropped_records(CUcontext context, uint32_t stream_id,
                                                       size_t* dropped) = 0;

  // Profiler (target and host) and PM sampling.
  virtual CUptiResult profiler_initialize(CUpti_Profiler_Initialize_Params* p) = 0;
  virtual CUptiResult profiler_deinitialize(CUpti_Profiler_DeInitialize_Params* p) = 0;
  virtual CUptiResult device_get_chip_name(CUpti_Device_GetChipName_Params* p) = 0;
  virtual CUptiResult pm_sampling_get_counter_availability(
      CUpti_PmSampling_GetCounterAvailability_Params* p) = 0;
  virtual CUptiResult profiler_host_initialize(CUpti_Profiler_Host_Initialize_Params* p) = 0;
  virtual CUptiResult profiler_host_deinitialize(CUpti_Profiler_Host_Deinitialize_Params* p) = 0;
  virtual CUptiResult profiler_host_config_add_metrics(
      CUpti_Profiler_Host_ConfigAddMetrics_Params* p) = 0;
  virtual CUptiResult profiler_host_get_config_image_size(
      CUpti_Profiler_Host_GetConfigImageSize_Params* p) = 0;
  virtual CUptiResult profiler_host_get_config_image(
      CUpti_Profiler_Host_GetConfigImage_Params* p) = 0;
  virtual CUptiResult profiler_host_get_num_of_passes(
      CUpti_Profiler_Host_GetNumOfPasses_Params* p) = 0;
  virtual CUptiResult profiler_host_evaluate_to_gpu_values(
      CUpti_Profiler_Host_EvaluateToGpuValues_Params* p) = 0;
  virtual CUptiResult pm_sampling_enable(CUpti_PmSampling_Enable_Params* p) = 0;
  virtual CUptiResult pm_sampling_disable(CUpti_PmSampling_Disable_Params* p) = 0;
  virtual CUptiResult pm_sampling_set_config(CUpti_PmSampling_SetConfig_Params* p) = 0;
  virtual CUptiResult pm_sampling_start(CUpti_PmSampling_Start_Params* p) = 0;
  virtual CUptiResult pm_sampling_stop(CUpti_PmSampling_Stop_Params* p) = 0;
  virtual CUptiResult pm_sampling_decode_data(CUpti_PmSampling_DecodeData_Params* p) = 0;
  virtual CUptiResult pm_sampling_get_counter_data_size(
      CUpti_PmSampling_GetCounterDataSize_Params* p) = 0;
  virtual CUptiResult pm_sampling_counter_data_image_initialize(
      CUpti_PmSampling_CounterDataImage_Initialize_Params* p) = 0;
  virtual CUptiResult pm_sampling_get_counter_data_info(
      CUpti_PmSampling_GetCounterDataInfo_Params* p) = 0;
  virtual CUptiResult pm_sampling_counter_data_get_sample_info(
      CUpti_PmSampling_CounterData_GetSampleInfo_Params* p) = 0;
};

// Loads libcupti (see the header comment for the order) and resolves its entry points. Returns
// null with `error` set when no library could be loaded. An entry point missing from the loaded
// library answers CUPTI_ERROR_API_NOT_IMPLEMENTED (its collector then reports that).
std::unique_ptr<CuptiApi> load_cupti(const std::string& configured_path, std::string* error);

// "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES (35)": CUPTI's name for `result` and its number.
std::string cupti_error_name(CuptiApi& api, CUptiResult result);

// CUPTI timestamps (activity records; PM samples, presumably) are on CUPTI's own clock
// (CLOCK_REALTIME on Linux unless a timestamp callback is registered). The collectors convert them
// to the steady clock with an offset measured by paired reads.
struct TimeBase {
  int64_t offset_ns = 0;  // CUPTI clock minus steady clock
  Nanos to_steady(uint64_t cupti_ns) const { return static_cast<Nanos>(cupti_ns) - offset_ns; }
};

// The offset from `reads` paired reads: steady, CUPTI, steady; the pair with the least latency
// wins and the CUPTI reading is taken to fall at the midpoint of its two steady readings. Pure
// (clocks injected). `latency_ns` receives the winning pair's latency when not null.
TimeBase measure_time_base(const std::function<uint64_t()>& cupti_now,
                           const std::function<Nanos()>& steady_now, int reads = 5,
                           Nanos* latency_ns = nullptr);

// The steady clock the events are on (std::chrono::steady_clock, ns since its epoch).
Nanos steady_now_ns();

// The current TimeBase, shared by the collectors (the activity callback and the PM decode thread
// read it while the training thread re-measures it at each trace window).
class CuptiClock {
 public:
  TimeBase get() const { return TimeBase{offset_.load(std::memory_order_relaxed)}; }
  void set(TimeBase tb) { offset_.store(tb.offset_ns, std::memory_order_relaxed); }
  // Measures with api.get_timestamp(); false (and the offset unchanged) when that fails.
  bool measure(CuptiApi& api, Nanos* latency_ns = nullptr);

 private:
  std::atomic<int64_t> offset_{0};
};

}  // namespace detail
}  // namespace torchpilot
