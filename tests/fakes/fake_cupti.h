// FakeCupti: CUPTI as the GPU collectors see it, for the GPU backend's tests (built on the
// generated default fake, cupti_api_fake.h); FakeSample: a PM sample it decodes.
#pragma once

#include <cupti_driver_cbid.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cupti_api_fake.h"
#include "torchpilot/hooks/gpu/cupti_activity_trace.h"
#include "torchpilot/hooks/gpu/cupti_api.h"
#include "torchpilot/hooks/gpu/cupti_fixture.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"

namespace torchpilot {
namespace detail {

struct FakeSample {
  uint64_t start = 0, end = 0;
  std::map<std::string, double> values;  // by metric name
};

// CUPTI as the collectors see it, on the generated default fake (cupti_api_fake.h: structSize
// checks, `fail` by symbol, `m`): records the calls, holds activity buffers like CUPTI does
// (records written by produce(), returned by flush or when full) and a "hardware buffer" of PM
// samples (push_sample) decoded into the counter data image.
class FakeCupti final : public CuptiApiFake {
 public:
  // Knobs.
  uint32_t version = CUPTI_API_VERSION;
  CUptiResult subscribe_result = CUPTI_SUCCESS;
  std::string other_subscriber;
  std::set<std::string> rejected_metrics;  // ConfigAddMetrics refuses sets containing these
  size_t max_metrics_per_pass = 64;        // more -> 2 passes
  // CUPTI clock = steady x clock_rate + clock_offset_ns. Rate 2.1, offset 0: TSC ticks of a
  // 2.1 GHz host, as after PyTorch's profiler registered its timestamps. Atomic: a test changes
  // them while the collectors' threads read the clock.
  std::atomic<int64_t> clock_offset_ns{1'700'000'000'000'000'000};
  std::atomic<double> clock_rate{1.0};
  std::string chip = "GH100";

  // Recorded (under m).
  int subscribes = 0, unsubscribes = 0, finalizes = 0;
  CUpti_CallbackFunc last_callback = nullptr;  // of the latest subscription
  void* last_userdata = nullptr;
  std::vector<CUpti_CallbackDomain> enabled_domains;
  CUptiResult on_enable_domain(uint32_t enable, CUpti_SubscriberHandle,
                               CUpti_CallbackDomain domain) override {
    std::lock_guard<std::mutex> lock(m);
    if (enable != 0) enabled_domains.push_back(domain);
    return CUPTI_SUCCESS;
  }
  std::set<std::pair<int, int>> enabled_callbacks;  // (domain, cbid) enabled now
  CUptiResult on_enable_callback(uint32_t enable, CUpti_SubscriberHandle, CUpti_CallbackDomain d,
                                 CUpti_CallbackId cbid) override {
    std::lock_guard<std::mutex> lock(m);
    if (enable != 0) {
      enabled_callbacks.insert({d, static_cast<int>(cbid)});
    } else {
      enabled_callbacks.erase({d, static_cast<int>(cbid)});
    }
    return CUPTI_SUCCESS;
  }
  // The program calls cuEventSynchronize on this thread: CUPTI's callback at its entry.
  void sync_call(uint32_t correlation_id) {
    CUpti_CallbackFunc cb = nullptr;
    {
      std::lock_guard<std::mutex> lock(m);
      if (enabled_callbacks.count(
              {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize}) == 0) {
        return;
      }
      cb = last_callback;
    }
    CUpti_CallbackData data{};
    data.callbackSite = CUPTI_API_ENTER;
    data.functionName = "cuEventSynchronize";
    data.correlationId = correlation_id;
    cb(last_userdata, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize,
       &data);
  }
  bool detached = false;  // cuptiFinalize ran, nothing attached since
  bool profiler_needs_reattach = true;
  std::set<int> enabled_kinds;
  // CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE (process-wide in CUPTI), and its value when a kind
  // was last enabled.
  size_t device_buffer = 3200000, device_buffer_at_enable = 0;
  int disables = 0;
  CUpti_BuffersCallbackRequestFunc requested = nullptr;
  CUpti_BuffersCallbackCompleteFunc completed = nullptr;
  std::vector<std::string> calls;    // the PM sampling sequence, by short name
  std::vector<std::string> metrics;  // of the last ConfigAddMetrics
  int host_inits = 0, host_deinits = 0;
  bool profiler_initialized = false, pm_enabled = false, pm_started = false;
  uint64_t interval_ns = 0;
  int trigger_mode = -1;
  size_t hw_buffer_bytes = 0;
  std::deque<FakeSample> hardware;
  std::vector<FakeSample> image;
  size_t dropped = 0;  // records CUPTI dropped for want of a buffer
  int flushes = 0;
  std::set<std::thread::id> record_readers;  // threads that read records out of a buffer
  int image_inits = 0;
  bool hold_decode = false, decode_held = false;  // under m
  uint8_t zeroed_out = 0;    // CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER; under m
  bool scribble = false;     // hand_back_current() writes past the valid bytes
  int unzeroed_buffers = 0;  // buffers handed out not zeroed while zeroed_out; under m
  std::condition_variable decode_cv;
  static constexpr size_t kImageSamples = 4;

  // --- Test helpers ---
  uint64_t cupti_now() const {
    const double rate = clock_rate.load();
    const Nanos steady = steady_now_ns();
    return static_cast<uint64_t>(
        (rate == 1.0 ? steady : std::llround(static_cast<double>(steady) * rate)) +
        clock_offset_ns.load());
  }
  void push_sample(FakeSample s) {
    std::lock_guard<std::mutex> lock(m);
    hardware.push_back(std::move(s));
  }
  // Writes a record as CUPTI would: into the current buffer, asking for a new one when it is
  // full; no buffer -> the record is dropped and counted.
  template <class R>
  void produce(const R& record) {
    if (cur_ == nullptr || cur_used_ + sizeof(R) > cur_size_) {
      if (cur_ != nullptr) full_.push_back({cur_, cur_used_});
      cur_ = nullptr;
      uint8_t* b = nullptr;
      size_t size = 0, max_records = 0;
      requested(&b, &size, &max_records);  // no lock: the collector may call back
      if (b == nullptr || size < sizeof(R)) {
        std::lock_guard<std::mutex> lock(m);
        ++dropped;
        return;
      }
      check_zeroed(b, size);
      cur_ = b;
      cur_size_ = size;
      cur_used_ = 0;
    }
    std::memcpy(cur_ + cur_used_, &record, sizeof(R));
    cur_used_ += sizeof(R);
  }
  // CUPTI returning the buffer being filled on the calling thread (inside a launch, as with
  // per-thread activity buffers).
  void hand_back_current() {
    if (cur_ != nullptr) {
      // CUPTI may leave bytes past what it reports valid (unsaid): the client zeroes them too.
      if (scribble)
        std::memset(cur_ + cur_used_, 0xAB, std::min<size_t>(64, cur_size_ - cur_used_));
      full_.push_back({cur_, cur_used_});
    }
    cur_ = nullptr;
    complete_full();
  }
  // CUPTI asking for a buffer, writing into it and handing it back with no valid record.
  void hand_back_empty() {
    uint8_t* b = nullptr;
    size_t size = 0, max_records = 0;
    requested(&b, &size, &max_records);
    if (b == nullptr) return;
    check_zeroed(b, size);
    std::memset(b, 0xAB, std::min<size_t>(64, size));
    if (completed != nullptr) completed(nullptr, 0, b, size, 0);
  }
  void check_zeroed(const uint8_t* b, size_t size) {
    std::lock_guard<std::mutex> lock(m);
    // Told the client zeroes its buffers, CUPTI would not: a stale byte would reach records.
    if (zeroed_out != 0 && std::any_of(b, b + size, [](uint8_t x) { return x != 0; })) {
      ++unzeroed_buffers;
    }
  }
  // CUPTI's worker thread returning the full buffers.
  void complete_full() {
    auto full = std::move(full_);
    full_.clear();
    if (completed == nullptr) return;
    for (auto& [b, used] : full) completed(nullptr, 0, b, used, used);
  }

  // --- General and activity scripts (X entry points: they take m themselves) ---
  CUptiResult on_get_version(uint32_t* v) override {
    *v = version;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_get_result_string(CUptiResult r, const char** s) override {
    static const std::map<int, const char*> names = {
        {CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"},
        {CUPTI_ERROR_HARDWARE_BUSY, "CUPTI_ERROR_HARDWARE_BUSY"},
        {CUPTI_ERROR_INVALID_METRIC_NAME, "CUPTI_ERROR_INVALID_METRIC_NAME"},
        {CUPTI_ERROR_UNKNOWN, "CUPTI_ERROR_UNKNOWN"}};
    auto it = names.find(r);
    *s = it == names.end() ? "CUPTI_ERROR_OTHER" : it->second;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_get_timestamp(uint64_t* t) override {
    *t = cupti_now();
    return CUPTI_SUCCESS;
  }
  CUptiResult on_subscribe(CUpti_SubscriberHandle* s, CUpti_CallbackFunc cb, void* userdata,
                           CUpti_SubscriberParams* p) override {
    std::lock_guard<std::mutex> lock(m);
    last_callback = cb;
    last_userdata = userdata;
    if (p != nullptr && p->structSize != CUpti_SubscriberParams_STRUCT_SIZE) {
      bad_struct_sizes.push_back("CUpti_SubscriberParams");
    }
    if (cb == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
    if (subscribe_result != CUPTI_SUCCESS) {
      if (p != nullptr && p->oldSubscriberName != nullptr && !other_subscriber.empty()) {
        std::strncpy(p->oldSubscriberName, other_subscriber.c_str(), p->oldSubscriberSize);
      }
      return subscribe_result;
    }
    ++subscribes;
    detached = false;  // any subscription attaches CUPTI again
    *s = reinterpret_cast<CUpti_SubscriberHandle>(this);
    return CUPTI_SUCCESS;
  }
  CUptiResult on_unsubscribe(CUpti_SubscriberHandle) override {
    std::lock_guard<std::mutex> lock(m);
    ++unsubscribes;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_finalize() override {
    std::lock_guard<std::mutex> lock(m);
    ++finalizes;
    profiler_initialized = false;
    detached = true;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_activity_register_callbacks(CUpti_BuffersCallbackRequestFunc req,
                                             CUpti_BuffersCallbackCompleteFunc done) override {
    std::lock_guard<std::mutex> lock(m);
    requested = req;
    completed = done;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_activity_enable(CUpti_ActivityKind k) override {
    std::lock_guard<std::mutex> lock(m);
    enabled_kinds.insert(k);
    device_buffer_at_enable = device_buffer;
    return CUPTI_SUCCESS;
  }
  // Only the device buffer's size is modelled.
  static bool buffer_size(CUpti_ActivityAttribute a, const size_t* size) {
    return a == CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE && *size == sizeof(size_t);
  }
  CUptiResult on_activity_get_attribute(CUpti_ActivityAttribute a, size_t* size,
                                        void* value) override {
    if (!buffer_size(a, size)) return CUPTI_ERROR_INVALID_PARAMETER;
    std::lock_guard<std::mutex> lock(m);
    *static_cast<size_t*>(value) = device_buffer;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_activity_set_attribute(CUpti_ActivityAttribute a, size_t* size,
                                        void* value) override {
    if (a == CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER && *size == sizeof(uint8_t)) {
      std::lock_guard<std::mutex> lock(m);
      zeroed_out = *static_cast<uint8_t*>(value);
      return CUPTI_SUCCESS;
    }
    if (!buffer_size(a, size)) return CUPTI_ERROR_INVALID_PARAMETER;
    std::lock_guard<std::mutex> lock(m);
    device_buffer = *static_cast<size_t*>(value);
    return CUPTI_SUCCESS;
  }
  CUptiResult on_activity_disable(CUpti_ActivityKind k) override {
    std::lock_guard<std::mutex> lock(m);
    enabled_kinds.erase(k);
    ++disables;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_activity_flush_all(uint32_t) override {
    {
      std::lock_guard<std::mutex> lock(m);
      ++flushes;
    }
    if (cur_ != nullptr) full_.push_back({cur_, cur_used_});
    cur_ = nullptr;
    complete_full();  // synchronously, on the caller's thread, as CUPTI does
    return CUPTI_SUCCESS;
  }
  CUptiResult on_activity_get_next_record(uint8_t* buffer, size_t valid,
                                          CUpti_Activity** record) override {
    {
      std::lock_guard<std::mutex> lock(m);
      record_readers.insert(std::this_thread::get_id());
    }
    size_t offset = 0;
    if (*record != nullptr) {
      offset = static_cast<size_t>(reinterpret_cast<uint8_t*>(*record) - buffer) +
               record_size((*record)->kind);
    }
    if (offset >= valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = reinterpret_cast<CUpti_Activity*>(buffer + offset);
    return CUPTI_SUCCESS;
  }
  CUptiResult on_activity_get_num_dropped_records(CUcontext, uint32_t, size_t* d) override {
    std::lock_guard<std::mutex> lock(m);
    *d = dropped;
    dropped = 0;
    return CUPTI_SUCCESS;
  }

  // --- Profiler and PM sampling scripts (P entry points: m held, structSize checked) ---
  CUptiResult on_profiler_initialize(CUpti_Profiler_Initialize_Params*) override {
    // As on the H200: after cuptiFinalize the profiler API needs CUPTI attached again first.
    if (detached && profiler_needs_reattach) return CUPTI_ERROR_NOT_INITIALIZED;
    profiler_initialized = true;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_deinitialize(CUpti_Profiler_DeInitialize_Params*) override {
    profiler_initialized = false;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_device_get_chip_name(CUpti_Device_GetChipName_Params* p) override {
    if (!profiler_initialized) return CUPTI_ERROR_NOT_INITIALIZED;
    p->pChipName = chip.c_str();
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_get_counter_availability(
      CUpti_PmSampling_GetCounterAvailability_Params* p) override {
    calls.push_back("GetCounterAvailability");
    if (p->pCounterAvailabilityImage == nullptr) {
      p->counterAvailabilityImageSize = 24;
    } else {
      std::memset(p->pCounterAvailabilityImage, 0xab, p->counterAvailabilityImageSize);
    }
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_host_initialize(CUpti_Profiler_Host_Initialize_Params* p) override {
    calls.push_back("HostInitialize");
    if (p->profilerType != CUPTI_PROFILER_TYPE_PM_SAMPLING || p->pChipName == nullptr ||
        chip != p->pChipName || p->pCounterAvailabilityImage == nullptr ||
        p->pCounterAvailabilityImage[0] != 0xab) {
      return CUPTI_ERROR_INVALID_PARAMETER;
    }
    ++host_inits;
    p->pHostObject = reinterpret_cast<CUpti_Profiler_Host_Object*>(&host_inits);
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_host_deinitialize(CUpti_Profiler_Host_Deinitialize_Params*) override {
    calls.push_back("HostDeinitialize");
    ++host_deinits;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_host_config_add_metrics(
      CUpti_Profiler_Host_ConfigAddMetrics_Params* p) override {
    calls.push_back("ConfigAddMetrics");
    metrics.assign(p->ppMetricNames, p->ppMetricNames + p->numMetrics);
    for (const auto& name : metrics) {
      if (rejected_metrics.count(name) != 0) return CUPTI_ERROR_INVALID_METRIC_NAME;
    }
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_host_get_config_image_size(
      CUpti_Profiler_Host_GetConfigImageSize_Params* p) override {
    p->configImageSize = 64;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_host_get_config_image(
      CUpti_Profiler_Host_GetConfigImage_Params* p) override {
    if (p->configImageSize != 64 || p->pConfigImage == nullptr) {
      return CUPTI_ERROR_INVALID_PARAMETER;
    }
    std::memset(p->pConfigImage, static_cast<int>(metrics.size()), 64);
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_host_get_num_of_passes(
      CUpti_Profiler_Host_GetNumOfPasses_Params* p) override {
    const size_t n = p->pConfigImage != nullptr ? p->pConfigImage[0] : 0;
    p->numOfPasses = n > max_metrics_per_pass ? 2 : 1;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_profiler_host_evaluate_to_gpu_values(
      CUpti_Profiler_Host_EvaluateToGpuValues_Params* p) override {
    if (p->rangeIndex >= image.size()) return CUPTI_ERROR_INVALID_PARAMETER;
    const auto& s = image[p->rangeIndex];
    for (size_t i = 0; i < p->numMetrics; ++i) {
      auto it = s.values.find(p->ppMetricNames[i]);
      p->pMetricValues[i] = it == s.values.end() ? std::nan("") : it->second;
    }
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_enable(CUpti_PmSampling_Enable_Params* p) override {
    calls.push_back("Enable");
    pm_enabled = true;
    p->pPmSamplingObject = reinterpret_cast<CUpti_PmSampling_Object*>(&pm_enabled);
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_disable(CUpti_PmSampling_Disable_Params*) override {
    calls.push_back("Disable");
    pm_enabled = false;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_set_config(CUpti_PmSampling_SetConfig_Params* p) override {
    calls.push_back("SetConfig");
    interval_ns = p->samplingInterval;
    trigger_mode = p->triggerMode;
    hw_buffer_bytes = p->hardwareBufferSize;
    return p->pConfig != nullptr && p->configSize == 64 ? CUPTI_SUCCESS
                                                        : CUPTI_ERROR_INVALID_PARAMETER;
  }
  CUptiResult on_pm_sampling_start(CUpti_PmSampling_Start_Params*) override {
    calls.push_back("Start");
    pm_started = true;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_stop(CUpti_PmSampling_Stop_Params*) override {
    calls.push_back("Stop");
    pm_started = false;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_decode_data(CUpti_PmSampling_DecodeData_Params* p) override {
    if (hold_decode) {
      // A slow decode (10-30 ms on an H100 with the tensor metric): held until the test lets
      // go, with `m` released meanwhile (the caller's guard holds it again on return).
      std::unique_lock<std::mutex> held(m, std::adopt_lock);
      decode_held = true;
      decode_cv.wait(held, [this] { return !hold_decode; });
      decode_held = false;
      held.release();
    }
    // Appends to what the image holds (until re-initialized); a small image exercises
    // COUNTER_DATA_FULL.
    while (!hardware.empty() && image.size() < kImageSamples) {
      image.push_back(hardware.front());
      hardware.pop_front();
    }
    p->decodeStopReason = hardware.empty() ? CUPTI_PM_SAMPLING_DECODE_STOP_REASON_END_OF_RECORDS
                                           : CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL;
    p->overflow = 0;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_get_counter_data_size(
      CUpti_PmSampling_GetCounterDataSize_Params* p) override {
    calls.push_back("GetCounterDataSize");
    p->counterDataSize = 128 + 16 * p->maxSamples;
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_counter_data_image_initialize(
      CUpti_PmSampling_CounterDataImage_Initialize_Params* p) override {
    image.clear();
    ++image_inits;
    return p->pCounterData != nullptr ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
  }
  CUptiResult on_pm_sampling_get_counter_data_info(
      CUpti_PmSampling_GetCounterDataInfo_Params* p) override {
    p->numTotalSamples = kImageSamples;
    p->numPopulatedSamples = image.size();
    p->numCompletedSamples = image.size();
    return CUPTI_SUCCESS;
  }
  CUptiResult on_pm_sampling_counter_data_get_sample_info(
      CUpti_PmSampling_CounterData_GetSampleInfo_Params* p) override {
    if (p->sampleIndex >= image.size()) return CUPTI_ERROR_INVALID_PARAMETER;
    p->startTimestamp = image[p->sampleIndex].start;
    p->endTimestamp = image[p->sampleIndex].end;
    return CUPTI_SUCCESS;
  }

 private:
  static size_t record_size(CUpti_ActivityKind kind) {
    return std::max<size_t>(8, cupti_fixture::activity_record_size(kind));
  }

  // Activity buffers in CUPTI's hands (touched by the test thread only).
  uint8_t* cur_ = nullptr;
  size_t cur_size_ = 0, cur_used_ = 0;
  std::vector<std::pair<uint8_t*, size_t>> full_;
};

}  // namespace detail
}  // namespace torchpilot
