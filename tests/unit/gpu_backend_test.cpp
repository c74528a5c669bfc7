// The CUPTI/NVML/NVTX backend on the CPU: fakes of the CUDA driver, CUPTI and NVML drive it
// through its degrade paths (no driver, cuInit failure, no device, no libcupti, permissions,
// counters busy, MIG, a second CUPTI subscriber, no NVML), PM sampling (sequence, first sample
// discarded, metric fallbacks, clock offset), the activity trace (buffers, conversion, drops), and
// the real dlopen path on this machine.
#include "torchpilot/runtime/gpu/gpu_backend.h"

#include <cupti_driver_cbid.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "cupti_api_fake.h"
#include "torchpilot/hooks/gpu/cuda_driver.h"
#include "torchpilot/hooks/gpu/cupti_activity_trace.h"
#include "torchpilot/hooks/gpu/cupti_api.h"
#include "torchpilot/hooks/gpu/cupti_backend.h"
#include "torchpilot/hooks/gpu/cupti_fixture.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"
#include "torchpilot/hooks/gpu/nvml_sampler.h"
#include "torchpilot/hooks/gpu/own_thread.h"
#include "torchpilot/runtime/core/config.h"

namespace torchpilot {
namespace detail {
namespace {

// --- Fakes -------------------------------------------------------------------------------------

class FakeDriver final : public CudaDriverApi {
 public:
  CUresult init_result = CUDA_SUCCESS;
  int count = 1;
  std::string name = "NVIDIA H200";
  int sms = 132;
  int cc_major = 9, cc_minor = 0;
  std::string pci = "0000:3B:00.0";

  CUresult init(unsigned) override { return init_result; }
  CUresult device_get_count(int* c) override {
    *c = count;
    return CUDA_SUCCESS;
  }
  CUresult device_get(CUdevice* d, int ordinal) override {
    if (ordinal >= count) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
  }
  CUresult device_get_name(char* out, int len, CUdevice) override {
    std::strncpy(out, name.c_str(), static_cast<size_t>(len));
    return CUDA_SUCCESS;
  }
  CUresult device_get_attribute(int* v, CUdevice_attribute a, CUdevice) override {
    switch (a) {
      case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = sms;
        return CUDA_SUCCESS;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *v = cc_major;
        return CUDA_SUCCESS;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *v = cc_minor;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  CUresult device_get_pci_bus_id(char* out, int len, CUdevice) override {
    std::strncpy(out, pci.c_str(), static_cast<size_t>(len));
    return CUDA_SUCCESS;
  }
  CUresult get_error_name(CUresult e, const char** s) override {
    *s = e == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
  }
  CUresult get_error_string(CUresult e, const char** s) override {
    *s = e == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device is detected" : "unknown error";
    return CUDA_SUCCESS;
  }
};

class FakeNvml final : public NvmlApi {
 public:
  NvmlReturn init_result = kNvmlSuccess;
  NvmlReturn utilization_result = kNvmlSuccess;
  unsigned gpu_percent = 87;
  std::atomic<int> reads{0};
  std::atomic<int> shutdowns{0};
  std::string pci_asked;

  NvmlReturn init() override { return init_result; }
  NvmlReturn shutdown() override {
    ++shutdowns;
    return kNvmlSuccess;
  }
  NvmlReturn device_get_handle_by_index(unsigned, NvmlDevice* d) override {
    *d = reinterpret_cast<NvmlDevice>(this);
    return kNvmlSuccess;
  }
  NvmlReturn device_get_handle_by_pci_bus_id(const char* bus, NvmlDevice* d) override {
    pci_asked = bus;
    *d = reinterpret_cast<NvmlDevice>(this);
    return kNvmlSuccess;
  }
  NvmlReturn device_get_utilization_rates(NvmlDevice, NvmlUtilization* u) override {
    ++reads;
    if (utilization_result != kNvmlSuccess) return utilization_result;
    u->gpu = gpu_percent;
    u->memory = 10;
    return kNvmlSuccess;
  }
  std::string error_string(NvmlReturn r) override { return "NVML error " + std::to_string(r); }
  unsigned sm_mhz = 1755;                  // 0: nvmlDeviceGetClockInfo not found
  unsigned long long clock_reasons = 0x4;  // SW power cap
  NvmlReturn device_get_sm_clock(NvmlDevice, unsigned* mhz) override {
    if (sm_mhz == 0) return NvmlApi::device_get_sm_clock(nullptr, mhz);
    *mhz = sm_mhz;
    return kNvmlSuccess;
  }
  NvmlReturn device_get_clock_reasons(NvmlDevice, unsigned long long* reasons) override {
    *reasons = clock_reasons;
    return kNvmlSuccess;
  }
  int active_links = -1;  // -1: nvmlDeviceGetNvLinkState not found
  NvmlReturn device_get_nvlink_state(NvmlDevice, unsigned link, int* active) override {
    if (active_links < 0) return NvmlApi::device_get_nvlink_state(nullptr, link, active);
    if (link >= 18) return 2;  // NVML_ERROR_INVALID_ARGUMENT
    *active = static_cast<int>(link) < active_links ? 1 : 0;
    return kNvmlSuccess;
  }
};

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

// --- Rig: fakes handed to the backend through its loaders ---------------------------------------

struct Rig {
  std::unique_ptr<FakeDriver> driver_owned = std::make_unique<FakeDriver>();
  std::unique_ptr<FakeCupti> cupti_owned = std::make_unique<FakeCupti>();
  std::unique_ptr<FakeNvml> nvml_owned = std::make_unique<FakeNvml>();
  FakeDriver* driver = driver_owned.get();
  FakeCupti* cupti = cupti_owned.get();
  FakeNvml* nvml = nvml_owned.get();
  bool driver_missing = false, cupti_missing = false, nvml_missing = false;
  int cupti_loads = 0, nvml_loads = 0;

  std::ostringstream log_text;
  std::shared_ptr<spdlog::logger> logger;
  GpuConfig config;

  Rig() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text);
    logger = std::make_shared<spdlog::logger>("gpu_backend_test", sink);
    logger->set_level(spdlog::level::debug);
    config.pm_interval_ms = 2;
    config.pm_duty = 1;  // tests of the duty cycle set it; the others sample throughout
    config.nvml_interval_ms = 2;
  }

  GpuVendorLoaders loaders() {
    GpuVendorLoaders l;
    l.driver = [this](std::string* error) -> std::unique_ptr<CudaDriverApi> {
      if (driver_missing) {
        *error = "no GPU driver (libcuda.so.1 not found)";
        return nullptr;
      }
      return std::move(driver_owned);
    };
    l.cupti = [this](std::string* error) -> std::unique_ptr<CuptiApi> {
      ++cupti_loads;
      if (cupti_missing) {
        *error = "libcupti not found (test)";
        return nullptr;
      }
      return std::move(cupti_owned);
    };
    l.nvml = [this](std::string* error) -> std::unique_ptr<NvmlApi> {
      ++nvml_loads;
      if (nvml_missing) {
        *error = "NVML not found (libnvidia-ml.so.1): NVML utilization off";
        return nullptr;
      }
      return std::move(nvml_owned);
    };
    return l;
  }

  std::unique_ptr<GpuBackend> make() { return make_cupti_backend(config, *logger, loaders()); }
  std::string log() {
    logger->flush();
    return log_text.str();
  }
};

CollectorStatus status_of(const GpuBackend& b, const std::string& name) {
  for (const auto& s : b.status()) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no status entry " << name;
  return {};
}

// Polls until `pred` holds (at most 3 s).
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

// Whether `text` shows in the rig's log within eventually()'s time (a collector thread logs it).
bool logged_eventually(Rig& rig, const std::string& text) {
  return eventually([&] { return rig.log_text.str().find(text) != std::string::npos; });
}

const char* kKernelName = "_Z9my_kernelILi4EN2at4HalfEEvPT0_i";

CUpti_ActivityKernel10 kernel_at(uint64_t start, uint64_t end, const char* name = kKernelName) {
  CUpti_ActivityKernel10 k;
  std::memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = start;
  k.end = end;
  k.gridX = 132;
  k.gridY = k.gridZ = 1;
  k.blockX = 256;
  k.blockY = k.blockZ = 1;
  k.name = name;
  return k;
}

FakeSample sample(uint64_t start, uint64_t end, double sm_pct) {
  FakeSample s;
  s.start = start;
  s.end = end;
  s.values = {{pm_metric_name(PmMetric::kCounterUtilization), sm_pct + 1},
              {pm_metric_name(PmMetric::kSmEfficiency), sm_pct},
              {pm_metric_name(PmMetric::kTensorActivity), 30.0},
              {pm_metric_name(PmMetric::kDramThroughput), 60.0},
              {pm_metric_name(PmMetric::kAchievedOccupancy), 40.0},
              {pm_metric_name(PmMetric::kPcieReadBytes), 1000.0},
              {pm_metric_name(PmMetric::kPcieWriteBytes), 2000.0}};
  return s;
}

TEST(GpuBackend, AutoDeviceOutsideAPilotTakesLocalRankWhenVisible) {
  const char* old = std::getenv("LOCAL_RANK");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("LOCAL_RANK", "1", 1);
  {
    Rig rig;
    rig.driver->count = 2;
    auto b = rig.make();  // config.device: -1 (auto)
    EXPECT_EQ(b->device().index, 1);
  }
  {
    Rig rig;  // one device visible (CUDA_VISIBLE_DEVICES per rank): LOCAL_RANK is no index
    auto b = rig.make();
    EXPECT_EQ(b->device().index, 0);
    EXPECT_EQ(b->device().sm_count, 132);
  }
  if (old != nullptr) {
    ::setenv("LOCAL_RANK", saved.c_str(), 1);
  } else {
    ::unsetenv("LOCAL_RANK");
  }
}

// --- CUPTI's clock ------------------------------------------------------------------------------

// PyTorch's profiler registers its own timestamps with CUPTI (TSC ticks), and they stay after it
// stops: the clock's rate is measured along with its offset, and follows a change of clock.
TEST(CuptiClockTest, MeasuresATickClocksRateAndFollowsAChangeOfClock) {
  FakeCupti cupti;
  const auto error_ns = [&](const CuptiClock& clock) {  // the least of three (preemption)
    double least = 1e18;
    for (int i = 0; i < 3; ++i) {
      const Nanos steady = steady_now_ns();
      least = std::min(
          least, std::abs(static_cast<double>(clock.get().to_steady(cupti.cupti_now()) - steady)));
    }
    return least;
  };
  CuptiClock clock;
  ASSERT_TRUE(clock.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_EQ(clock.get().scale, 1.0);  // CUPTI's own clock: nanoseconds
  EXPECT_LT(error_ns(clock), 1e5);
  cupti.clock_rate = 2.1;  // the profiler's timestamps: ticks of a 2.1 GHz host
  cupti.clock_offset_ns = 0;
  ASSERT_TRUE(clock.measure(cupti));  // the training thread does not wait: rate not known yet
  EXPECT_EQ(clock.get().scale, 1.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ASSERT_TRUE(clock.measure(cupti));  // a second reading of the new clock: its rate
  EXPECT_NEAR(clock.get().scale, 1 / 2.1, 1e-3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_LT(error_ns(clock), 1e5);
  // A clock on ticks from the start, measured where waiting is allowed: the rate at once.
  CuptiClock fresh;
  ASSERT_TRUE(fresh.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_NEAR(fresh.get().scale, 1 / 2.1, 1e-3);
  EXPECT_LT(error_ns(fresh), 1e5);
  // Back to nanoseconds (the callback gone): found on the next measure that may wait.
  cupti.clock_rate = 1.0;
  cupti.clock_offset_ns = 1'700'000'000'000'000'000;
  ASSERT_TRUE(fresh.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_EQ(fresh.get().scale, 1.0);
  EXPECT_LT(error_ns(fresh), 1e5);
  // CLOCK_REALTIME stepped by 10 ms (NTP): still a nanosecond clock, with the new offset.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cupti.clock_offset_ns += 10'000'000;
  ASSERT_TRUE(fresh.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_EQ(fresh.get().scale, 1.0);
  EXPECT_LT(error_ns(fresh), 1e5);
}

// A tick clock whose rate changes by more than 1% (another client's timestamps on another
// clock): a new line, with the new rate; within 1% the longer baseline refines the rate.
TEST(CuptiClockTest, ATickRateThatChangesStartsANewLine) {
  FakeCupti cupti;
  cupti.clock_rate = 2.1;
  cupti.clock_offset_ns = 0;
  CuptiClock clock;
  ASSERT_TRUE(clock.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_NEAR(clock.get().scale, 1 / 2.1, 1e-3);
  EXPECT_FALSE(clock.take_tick_clock_note());  // one baseline: not confirmed yet
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(clock.measure(cupti));
  EXPECT_NEAR(clock.get().scale, 1 / 2.1, 1e-4);
  EXPECT_TRUE(clock.take_tick_clock_note());   // a second baseline agreed
  EXPECT_FALSE(clock.take_tick_clock_note());  // once
  cupti.clock_rate = 2.5;
  cupti.clock_offset_ns = -1'000'000'000;
  ASSERT_TRUE(clock.measure(cupti, nullptr, kClockWaitNs));
  EXPECT_NEAR(clock.get().scale, 1 / 2.5, 1e-3);
}

// A backend started after PyTorch's profiler ran: its PM samples, on CUPTI's tick clock, land on
// the steady clock (seen on the H100 with torch 2.11: without the rate, none reached the steps).
TEST(GpuBackend, PmSamplesOnATickClockLandOnTheSteadyClock) {
  Rig rig;
  rig.cupti->clock_rate = 2.1;
  rig.cupti->clock_offset_ns = 0;
  auto b = rig.make();
  b->start();
  const Nanos s0 = steady_now_ns();
  const uint64_t t0 = rig.cupti->cupti_now();
  const auto at = [t0](int i) { return t0 + static_cast<uint64_t>(std::llround(i * 2e6 * 2.1)); };
  for (int i = 0; i < 6; ++i) rig.cupti->push_sample(sample(at(i), at(i + 1), 10.0 * i));
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->flush();
    b->drain(batch);
    return batch.pm.size() >= 5;
  }));
  EXPECT_NEAR(static_cast<double>(batch.pm[0].begin - s0), 2e6, 1e5);  // sample 1 (0 discarded)
  EXPECT_NEAR(static_cast<double>(batch.pm[0].end - batch.pm[0].begin), 2e6, 2e3);
  EXPECT_NEAR(static_cast<double>(batch.pm[4].end - s0), 12e6, 1e5);
  // Said once the decode thread's next reading confirmed the rate.
  EXPECT_TRUE(logged_eventually(rig, "CUPTI's clock is not in nanoseconds"));
  b->stop();
}

// The clock changes while PM sampling runs (the profiler starts): the decode thread measures the
// new clock, and samples land on the steady clock again.
TEST(GpuBackend, PmSamplesFollowCuptisClockWhenAnotherClientChangesIt) {
  Rig rig;
  auto b = rig.make();
  b->start();
  rig.cupti->clock_rate = 2.1;
  rig.cupti->clock_offset_ns = 0;
  // No flush from this thread: the decode thread alone decodes, and measures the new clock.
  GpuEventBatch batch;
  std::vector<Nanos> pushed;  // each sample's steady start
  bool first = true;
  EXPECT_TRUE(eventually([&] {
    const Nanos s0 = steady_now_ns();
    const uint64_t t0 = rig.cupti->cupti_now();
    if (first) {  // the first sample after the start is discarded
      rig.cupti->push_sample(sample(t0, t0 + 4'200'000, 20.0));
      first = false;
    }
    rig.cupti->push_sample(sample(t0, t0 + 4'200'000, 20.0));
    pushed.push_back(s0);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    batch.clear();
    b->drain(batch);
    for (const PmSample& p : batch.pm) {
      const bool lasts = std::abs(static_cast<double>(p.end - p.begin) - 2e6) < 2e3;
      for (Nanos s : pushed) {
        if (lasts && std::abs(static_cast<double>(p.begin - s)) < 1e5) return true;
      }
    }
    return false;
  })) << rig.log_text.str();
  EXPECT_TRUE(logged_eventually(rig, "CUPTI's clock is not in nanoseconds"));
  b->stop();
}

// --- Happy path --------------------------------------------------------------------------------

TEST(GpuBackend, EverythingWorksWithHealthyFakes) {
  Rig rig;
  auto b = rig.make();
  const GpuDeviceInfo d = b->device();
  EXPECT_EQ(d.name, "NVIDIA H200");
  EXPECT_EQ(d.sm_count, 132);
  EXPECT_EQ(d.chip, "GH100");
  for (const auto& s : b->status()) EXPECT_TRUE(s.active) << s.name << ": " << s.reason;
  ASSERT_EQ(b->status().size(), 4u);
  EXPECT_EQ(rig.nvml->pci_asked, "0000:3B:00.0");  // NVML found by PCI bus id, not by index
  EXPECT_EQ(rig.cupti->subscribes, 1);
  EXPECT_NE(rig.cupti->requested, nullptr);

  // PM sampling follows the documented sequence; interval in ns, GPU-time trigger, 64 MiB.
  EXPECT_EQ(rig.cupti->calls,
            (std::vector<std::string>{"GetCounterAvailability", "GetCounterAvailability",
                                      "HostInitialize", "ConfigAddMetrics", "Enable", "SetConfig",
                                      "GetCounterDataSize"}));
  EXPECT_EQ(rig.cupti->metrics.size(), 7u);
  EXPECT_EQ(rig.cupti->interval_ns, 2'000'000u);
  EXPECT_EQ(rig.cupti->trigger_mode, CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL);
  EXPECT_EQ(rig.cupti->hw_buffer_bytes, 64u << 20);

  b->start();
  EXPECT_TRUE(rig.cupti->pm_started);
  // Six samples: the first is discarded; the image holds four, so decoding takes two rounds.
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 6; ++i) {
    rig.cupti->push_sample(sample(t0 + i * 2'000'000, t0 + (i + 1) * 2'000'000, 10.0 * i));
  }
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->flush();
    b->drain(batch);
    return batch.pm.size() >= 5 && batch.nvml.size() >= 2;
  }));
  ASSERT_EQ(batch.pm.size(), 5u);
  EXPECT_DOUBLE_EQ(batch.pm[0].sm_efficiency, 0.10);  // sample 1; sample 0 was discarded
  EXPECT_DOUBLE_EQ(batch.pm[0].counter_utilization, 0.11);
  EXPECT_DOUBLE_EQ(batch.pm[4].sm_efficiency, 0.50);
  EXPECT_DOUBLE_EQ(batch.pm[0].pcie_write_bytes, 2000.0);
  // On the steady clock: CUPTI's offset removed (within the paired-read latency).
  const Nanos steady_t0 = static_cast<Nanos>(t0) - rig.cupti->clock_offset_ns;
  EXPECT_NEAR(static_cast<double>(batch.pm[0].begin - steady_t0), 2e6, 1e5);
  EXPECT_EQ(batch.pm[0].end - batch.pm[0].begin, 2'000'000);
  EXPECT_DOUBLE_EQ(batch.nvml[0].utilization, 0.87);
  EXPECT_DOUBLE_EQ(batch.nvml[0].sm_clock_mhz, 1755.0);
  EXPECT_EQ(batch.nvml[0].clock_limited, 1);  // the power cap holds the clock down
  EXPECT_NEAR(static_cast<double>(batch.nvml[0].time), static_cast<double>(steady_now_ns()), 5e9);

  // A detailed window (the rig logs at debug: CUPTI's overhead records too).
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->enabled_kinds,
            (std::set<int>{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                           CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
                           CUPTI_ACTIVITY_KIND_OVERHEAD}));
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0 + 1000, k0 + 9000));
  CUpti_ActivityMemcpy6 copy;
  std::memset(&copy, 0, sizeof copy);
  copy.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  copy.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  copy.srcKind = CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
  copy.bytes = 4096;
  copy.start = k0 + 10;
  copy.end = k0 + 500;
  rig.cupti->produce(copy);
  b->stop_trace();
  EXPECT_TRUE(rig.cupti->enabled_kinds.empty());
  batch.clear();
  b->drain(batch);
  EXPECT_TRUE(batch.kernels.empty());  // still in CUPTI's buffer until a flush
  b->flush();
  b->drain(batch);
  ASSERT_EQ(batch.kernels.size(), 1u);
  EXPECT_EQ(batch.kernels[0].name, "void my_kernel<4, at::Half>(at::Half*, int)");
  EXPECT_EQ(batch.kernels[0].blocks, 132);
  EXPECT_EQ(batch.kernels[0].end - batch.kernels[0].begin, 8000);
  const Nanos steady_k0 = static_cast<Nanos>(k0) - rig.cupti->clock_offset_ns;
  EXPECT_NEAR(static_cast<double>(batch.kernels[0].begin - steady_k0), 1000, 1e5);
  ASSERT_EQ(batch.copies.size(), 1u);
  EXPECT_TRUE(batch.copies[0].pageable);
  EXPECT_EQ(batch.dropped, 0);

  // A second window works the same.
  ASSERT_TRUE(b->start_trace());
  rig.cupti->produce(kernel_at(k0 + 20000, k0 + 21000));
  b->stop_trace();
  b->flush();
  batch.clear();
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);

  b->range_push("step 1");
  b->range_pop();

  b->stop();
  EXPECT_FALSE(rig.cupti->pm_started);
  EXPECT_FALSE(rig.cupti->pm_enabled);
  EXPECT_EQ(rig.cupti->host_inits, rig.cupti->host_deinits);
  EXPECT_FALSE(rig.cupti->profiler_initialized);
  // Subscribed at construction only to detect another client, then for the windows; stop()
  // unsubscribes and detaches CUPTI (cuptiFinalize) because a window had attached it.
  EXPECT_EQ(rig.cupti->subscribes, 2);
  EXPECT_EQ(rig.cupti->unsubscribes, 2);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_GE(rig.nvml->shutdowns.load(), 1);
  const int reads = rig.nvml->reads.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(rig.nvml->reads.load(), reads);  // the sampler thread is gone
  b->stop();                                 // idempotent
  EXPECT_EQ(rig.cupti->unsubscribes, 2);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_TRUE(rig.cupti->bad_struct_sizes.empty())
      << "structSize wrong in " << rig.cupti->bad_struct_sizes.front();
  // The clock check the lead reads on the GPU machine.
  const std::string log = rig.log();
  EXPECT_NE(log.find("PM sampling clock check (first sample, discarded)"), std::string::npos);
  EXPECT_NE(log.find("CUPTI clock: offset to the steady clock"), std::string::npos);
  EXPECT_EQ(log.find("PM sampling: sample times are"), std::string::npos);
}

TEST(GpuBackend, ReleasingTheTraceDetachesCuptiAndPmSamplingComesBack) {
  Rig rig;
  auto b = rig.make();
  b->start();
  EXPECT_EQ(rig.cupti->subscribes, 1);    // the probe at construction ...
  EXPECT_EQ(rig.cupti->unsubscribes, 1);  // ... released at once: PyTorch's profiler may subscribe
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->subscribes, 2);
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0 + 1000, k0 + 9000));
  b->stop_trace();
  b->release_trace();   // returns at once; the release runs on its own thread
  b->finish_release();  // no CUDA call came: the release finalizes itself
  EXPECT_FALSE(b->trace_releasing());
  // Unsubscribed; a subscription offered cuptiFinalize to the next CUDA call's exit, none came,
  // so it was dropped and CUPTI finalized directly; then a brief subscription re-attaches CUPTI
  // so the profiler API initializes again for PM sampling.
  EXPECT_EQ(rig.cupti->subscribes, 4);
  EXPECT_EQ(rig.cupti->unsubscribes, 4);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_TRUE(rig.cupti->profiler_initialized);
  EXPECT_NE(rig.log().find("CUPTI re-attached for PM sampling after a trace window: ok"),
            std::string::npos);
  EXPECT_TRUE(rig.cupti->pm_started);
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);  // the forced flush of the release delivered it
  for (const auto& st : b->status()) EXPECT_TRUE(st.active) << st.name << ": " << st.reason;
  // The next window attaches again.
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->subscribes, 5);
  b->stop_trace();
  b->release_trace();
  b->finish_release();
  EXPECT_EQ(rig.cupti->finalizes, 2);
  b->stop();
  EXPECT_EQ(rig.cupti->finalizes, 2);  // nothing attached any more
  EXPECT_FALSE(rig.cupti->pm_started);
}

// A window's kinds are enabled with CUPTI's device buffer at gpu.trace_device_buffer_mb; 0 puts
// back the size CUPTI had (the attribute outlives a backend in CUPTI).
TEST(GpuBackend, TheWindowsDeviceBufferIsSetBeforeItsKindsAreEnabled) {
  size_t left_by_first = 0;
  {
    Rig rig;
    rig.config.trace_device_buffer_mb = 64;
    auto b = rig.make();
    b->start();
    ASSERT_TRUE(b->start_trace());
    EXPECT_EQ(rig.cupti->device_buffer_at_enable, size_t{64} << 20);
    left_by_first = rig.cupti->device_buffer;
    b->stop_trace();
    b->stop();
  }
  Rig rig;
  rig.config.trace_device_buffer_mb = 0;
  rig.cupti->device_buffer = left_by_first;
  auto b = rig.make();
  b->start();
  ASSERT_TRUE(b->start_trace());
  EXPECT_EQ(rig.cupti->device_buffer_at_enable, size_t{3200000});
  b->stop_trace();
  b->stop();
}

// The release runs off the training thread and hands cuptiFinalize to the exit of the program's
// next CUDA call (CUPTI's safe point), made here by invoking the subscribed callback as CUPTI
// would.
TEST(GpuBackend, ReleaseFinalizesCuptiAtTheNextCudaCallsExit) {
  Rig rig;
  auto b = rig.make();
  b->start();
  ASSERT_TRUE(b->start_trace());
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0 + 1000, k0 + 9000));
  b->stop_trace();
  b->release_trace();
  // Wait (bounded) for the release thread to offer the finalize to the driver and runtime APIs.
  CUpti_CallbackFunc cb = nullptr;
  void* userdata = nullptr;
  for (int i = 0; i < 5000 && cb == nullptr; ++i) {
    {
      std::lock_guard<std::mutex> lock(rig.cupti->m);
      if (rig.cupti->enabled_domains.size() >= 2) {
        cb = rig.cupti->last_callback;
        userdata = rig.cupti->last_userdata;
      }
    }
    if (cb == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NE(cb, nullptr) << "the release never subscribed to the CUDA API callbacks";
  EXPECT_EQ(rig.cupti->finalizes, 0);
  CUpti_CallbackData entry{};
  entry.callbackSite = CUPTI_API_ENTER;
  cb(userdata, CUPTI_CB_DOMAIN_RUNTIME_API, 0, &entry);  // an entry is not the safe point
  EXPECT_EQ(rig.cupti->finalizes, 0);
  CUpti_CallbackData exit{};
  exit.callbackSite = CUPTI_API_EXIT;
  cb(userdata, CUPTI_CB_DOMAIN_RUNTIME_API, 0, &exit);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  cb(userdata, CUPTI_CB_DOMAIN_DRIVER_API, 0, &exit);  // a second call finalizes nothing more
  b->finish_release();
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_EQ(rig.cupti->unsubscribes, 3) << "finalizing dropped that subscription itself";
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);
  EXPECT_TRUE(rig.cupti->pm_started);
  b->stop();
}

TEST(GpuBackend, AFailedTraceStartDetachesCuptiAgain) {
  Rig rig;
  rig.cupti->fail["cuptiActivityEnable"] = CUPTI_ERROR_NOT_SUPPORTED;
  auto b = rig.make();
  b->start();
  EXPECT_FALSE(b->start_trace());
  // Subscribed for the attempt, then unsubscribed and finalized; PM sampling came back.
  EXPECT_EQ(rig.cupti->subscribes, rig.cupti->unsubscribes);
  EXPECT_EQ(rig.cupti->finalizes, 1);
  EXPECT_TRUE(rig.cupti->pm_started);
  for (const auto& st : b->status()) {
    if (st.name == "activity") EXPECT_FALSE(st.active);
    if (st.name == "pm_sampling") EXPECT_TRUE(st.active) << st.reason;
  }
  b->stop();
  EXPECT_EQ(rig.cupti->finalizes, 1);
}

TEST(GpuBackend, FlushDecodesPendingSamplesSynchronously) {
  Rig rig;
  auto b = rig.make();
  b->start();
  const uint64_t t0 = rig.cupti->cupti_now();
  rig.cupti->push_sample(sample(t0, t0 + 1, 1));  // discarded
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    return rig.cupti->hardware.empty();
  }));
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + 10 + i, t0 + 11 + i, 20));
  b->flush();  // whatever the decode thread has not taken yet, flush decodes now
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    EXPECT_TRUE(rig.cupti->hardware.empty());
  }
  b->drain(batch);
  EXPECT_EQ(batch.pm.size(), 3u);
  b->stop();
}

TEST(GpuBackend, ImageIsReinitializedOnlyWhenFull) {
  Rig rig;
  auto b = rig.make();
  ASSERT_EQ(rig.cupti->image_inits, 1);  // at configuration
  b->start();
  const uint64_t t0 = rig.cupti->cupti_now();
  GpuEventBatch batch;
  auto decoded = [&](size_t n) {
    return eventually([&] {
      b->flush();
      b->drain(batch);
      return batch.pm.size() >= n;
    });
  };
  rig.cupti->push_sample(sample(t0, t0 + 1, 1));  // discarded
  rig.cupti->push_sample(sample(t0 + 1, t0 + 2, 10));
  ASSERT_TRUE(decoded(1));
  EXPECT_EQ(rig.cupti->image_inits, 1);  // two of four slots used: kept
  rig.cupti->push_sample(sample(t0 + 2, t0 + 3, 20));
  ASSERT_TRUE(decoded(2));
  EXPECT_EQ(rig.cupti->image_inits, 1);
  rig.cupti->push_sample(sample(t0 + 3, t0 + 4, 30));  // fills the image
  ASSERT_TRUE(decoded(3));
  EXPECT_EQ(rig.cupti->image_inits, 2);
  for (int i = 4; i < 11; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 10.0 * i));
  ASSERT_TRUE(decoded(10));
  b->stop();
  b->drain(batch);
  ASSERT_EQ(batch.pm.size(), 10u);  // each sample once, in order
  for (size_t i = 0; i < batch.pm.size(); ++i) {
    EXPECT_DOUBLE_EQ(batch.pm[i].sm_efficiency, 0.1 * static_cast<double>(i + 1)) << i;
  }
}

TEST(GpuBackend, StopDecodesWhatIsLeftAndDrainStillReturnsIt) {
  Rig rig;
  auto b = rig.make();
  b->start();
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 50));
  b->stop();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.pm.size(), 2u);  // three minus the discarded first
  const auto& calls = rig.cupti->calls;
  ASSERT_GE(calls.size(), 3u);
  EXPECT_EQ(calls[calls.size() - 3], "Stop");
  EXPECT_EQ(calls[calls.size() - 2], "Disable");
  EXPECT_EQ(calls[calls.size() - 1], "HostDeinitialize");
}

// --- Device degrade paths ------------------------------------------------------------------------

TEST(GpuBackend, NoLibcudaMeansNoDeviceAndNoOtherLibraryLoaded) {
  Rig rig;
  rig.driver_missing = true;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  for (const auto& s : b->status()) {
    EXPECT_FALSE(s.active);
    EXPECT_EQ(s.reason, "no GPU driver (libcuda.so.1 not found)") << s.name;
  }
  EXPECT_EQ(rig.cupti_loads, 0);
  EXPECT_EQ(rig.nvml_loads, 0);
  b->start();
  EXPECT_FALSE(b->start_trace());
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_TRUE(batch.pm.empty());
  b->range_push("x");
  b->range_pop();
  b->stop();
}

TEST(GpuBackend, CuInitFailureIsTheReason) {
  Rig rig;
  rig.driver->init_result = CUDA_ERROR_NO_DEVICE;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected");
  EXPECT_EQ(status_of(*b, "nvml").reason, status_of(*b, "pm_sampling").reason);
  EXPECT_EQ(rig.cupti_loads, 0);
}

TEST(GpuBackend, NoDeviceAtTheConfiguredIndex) {
  Rig rig;
  rig.config.device = 2;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  EXPECT_EQ(b->device().index, 2);
  const auto s = status_of(*b, "activity");
  EXPECT_FALSE(s.active);
  EXPECT_EQ(s.reason.rfind("no CUDA device 2 (this process sees 1 device", 0), 0u) << s.reason;
}

TEST(GpuBackend, DisabledInTheConfiguration) {
  Rig rig;
  rig.config.enabled = false;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 0);
  EXPECT_EQ(status_of(*b, "nvtx").reason, "off in the configuration (gpu.enabled: false)");
}

TEST(GpuBackend, CollectorsOffInTheConfiguration) {
  Rig rig;
  rig.config.pm_sampling = false;
  rig.config.activity = false;
  rig.config.nvml = false;
  rig.config.nvtx = false;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 132);
  EXPECT_EQ(b->device().chip, "GH100");  // the chip name still comes from CUPTI
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "off in the configuration (gpu.pm_sampling: false)");
  EXPECT_EQ(status_of(*b, "activity").reason, "off in the configuration (gpu.activity: false)");
  EXPECT_EQ(status_of(*b, "nvml").reason, "off in the configuration (gpu.nvml: false)");
  EXPECT_EQ(status_of(*b, "nvtx").reason, "off in the configuration (gpu.nvtx: false)");
  EXPECT_EQ(rig.cupti->subscribes, 0);  // no subscriber: PyTorch's profiler stays usable
  EXPECT_EQ(rig.nvml_loads, 0);
  b->start();
  EXPECT_FALSE(b->start_trace());
  b->range_push("x");  // no-op
  b->range_pop();
  b->stop();
  EXPECT_FALSE(rig.cupti->profiler_initialized);
}

// --- CUPTI degrade paths -------------------------------------------------------------------------

TEST(GpuBackend, NoLibcuptiLeavesNvmlAndNvtx) {
  Rig rig;
  rig.cupti_missing = true;
  auto b = rig.make();
  EXPECT_EQ(b->device().sm_count, 132);
  EXPECT_EQ(b->device().chip, "");
  EXPECT_EQ(status_of(*b, "pm_sampling").reason, "libcupti not found (test)");
  EXPECT_EQ(status_of(*b, "activity").reason, "libcupti not found (test)");
  EXPECT_TRUE(status_of(*b, "nvml").active);
  EXPECT_TRUE(status_of(*b, "nvtx").active);
  b->start();
  EXPECT_FALSE(b->start_trace());
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->drain(batch);
    return !batch.nvml.empty();
  }));
  b->stop();
}

TEST(GpuBackend, OldLibcuptiIsRefused) {
  Rig rig;
  rig.cupti->version = 26;  // CUDA 12.8's CUPTI: older record layouts
  auto b = rig.make();
  EXPECT_NE(status_of(*b, "activity").reason.find("has CUPTI API version 26"), std::string::npos);
  EXPECT_FALSE(status_of(*b, "pm_sampling").active);
  EXPECT_EQ(rig.cupti->subscribes, 0);
}

TEST(GpuBackend, InsufficientPrivilegesTurnsOffPmSamplingOnly) {
  Rig rig;
  rig.cupti->fail["cuptiPmSamplingGetCounterAvailability"] = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  auto b = rig.make();
  const auto pm = status_of(*b, "pm_sampling");
  EXPECT_FALSE(pm.active);
  EXPECT_EQ(pm.reason,
            "no permission for GPU performance counters (needs root, CAP_SYS_ADMIN or "
            "NVreg_RestrictProfilingToAdminUsers=0)");
  EXPECT_TRUE(status_of(*b, "activity").active);
  EXPECT_TRUE(status_of(*b, "nvml").active);
  b->start();
  ASSERT_TRUE(b->start_trace());
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->produce(kernel_at(k0, k0 + 100));
  b->stop_trace();
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);
  EXPECT_TRUE(batch.pm.empty());
  b->stop();
  EXPECT_FALSE(rig.cupti->profiler_initialized);
}

TEST(GpuBackend, PrivilegesRefusedAtEnable) {
  Rig rig;
  rig.cupti->fail["cuptiPmSamplingEnable"] = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "pm_sampling").reason.rfind("no permission for GPU performance", 0), 0u);
  EXPECT_EQ(rig.cupti->host_inits, rig.cupti->host_deinits);  // the host object was released
}

TEST(GpuBackend, HardwareBusy) {
  Rig rig;
  rig.cupti->fail["cuptiPmSamplingEnable"] = CUPTI_ERROR_HARDWARE_BUSY;
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "counters held by another client (DCGM or Nsight)");
  EXPECT_TRUE(status_of(*b, "activity").active);
}

TEST(GpuBackend, HardwareBusyAtStart) {
  Rig rig;
  rig.cupti->fail["cuptiPmSamplingStart"] = CUPTI_ERROR_HARDWARE_BUSY;
  auto b = rig.make();
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  b->start();
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "counters held by another client (DCGM or Nsight)");
  EXPECT_TRUE(status_of(*b, "nvml").active);
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

TEST(GpuBackend, MigInstance) {
  Rig rig;
  rig.cupti->fail["cuptiPmSamplingGetCounterAvailability"] = CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED;
  auto b = rig.make();
  const auto reason = status_of(*b, "pm_sampling").reason;
  EXPECT_NE(reason.find("MIG"), std::string::npos) << reason;
  Rig rig2;
  rig2.cupti->fail["cuptiPmSamplingEnable"] = CUPTI_ERROR_NOT_SUPPORTED;
  auto b2 = rig2.make();
  EXPECT_NE(status_of(*b2, "pm_sampling").reason.find("MIG"), std::string::npos);
}

TEST(GpuBackend, ComputeCapabilityBelow86HasNoTimeTrigger) {
  Rig rig;
  rig.driver->cc_major = 8;
  rig.driver->cc_minor = 0;  // A100
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "PM sampling needs compute capability 8.6 or newer (its GPU-time trigger); this GPU "
            "is 8.0");
  EXPECT_TRUE(status_of(*b, "activity").active);
}

TEST(GpuBackend, SecondSubscriberTurnsOffActivityOnly) {
  Rig rig;
  rig.cupti->subscribe_result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  rig.cupti->other_subscriber = "CUPTI for Nsight Systems";
  auto b = rig.make();
  const auto a = status_of(*b, "activity");
  EXPECT_FALSE(a.active);
  EXPECT_EQ(a.reason.rfind("another CUPTI client (Nsight Systems, PyTorch's profiler) is attached: "
                           "activity tracing off",
                           0),
            0u)
      << a.reason;
  EXPECT_NE(a.reason.find("CUPTI for Nsight Systems"), std::string::npos);
  EXPECT_EQ(rig.cupti->requested, nullptr);  // no buffer callbacks registered
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  b->start();
  EXPECT_FALSE(b->start_trace());
  EXPECT_TRUE(rig.cupti->enabled_kinds.empty());
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 70));
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->flush();
    b->drain(batch);
    return batch.pm.size() >= 2;
  }));
  EXPECT_DOUBLE_EQ(batch.pm[0].sm_efficiency, 0.7);
  b->stop();
  EXPECT_EQ(rig.cupti->unsubscribes, 0);
}

// PyTorch's profiler started and stopped inside a run: while it holds CUPTI, windows are skipped
// (one line), and once it lets go they work again.
TEST(GpuBackend, ASecondSubscriberThatLeavesLetsWindowsResume) {
  Rig rig;
  auto b = rig.make();
  b->start();
  auto count = [&](const std::string& text) {
    const std::string l = rig.log_text.str();
    int n = 0;
    for (size_t at = l.find(text); at != std::string::npos; at = l.find(text, at + 1)) ++n;
    return n;
  };
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->subscribe_result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(b->start_trace());
    EXPECT_TRUE(b->trace_busy());
  }
  EXPECT_EQ(count("GPU trace window skipped: another CUPTI client"), 1) << rig.log_text.str();
  EXPECT_FALSE(status_of(*b, "activity").active);
  EXPECT_TRUE(status_of(*b, "pm_sampling").active) << "PM sampling is not the subscription's";
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->subscribe_result = CUPTI_SUCCESS;
  }
  EXPECT_TRUE(b->start_trace());
  EXPECT_FALSE(b->trace_busy());
  EXPECT_TRUE(status_of(*b, "activity").active) << status_of(*b, "activity").reason;
  EXPECT_EQ(count("GPU trace windows resume"), 1) << rig.log_text.str();
  b->stop_trace();
  b->release_trace();
  b->stop();
}

// Sample times on another clock (what PyTorch's profiler did to CUPTI's timestamps on the H200):
// dropped with one line and PM sampling reported off, until they line up again.
TEST(GpuBackend, SamplesOffTheSteadyClockAreDroppedUntilTheyLineUpAgain) {
  Rig rig;
  auto b = rig.make();
  b->start();
  const uint64_t t0 = rig.cupti->cupti_now();
  const uint64_t away = 240'000'000'000ull;                              // 240 s
  rig.cupti->push_sample(sample(t0 - away, t0 - away + 1'000'000, 10));  // discarded (first)
  for (int i = 0; i < 4; ++i) {
    rig.cupti->push_sample(sample(t0 - away + i * 1'000'000, t0 - away + (i + 1) * 1'000'000, 50));
  }
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->flush();
    return rig.log_text.str().find("PM sampling: sample times are") != std::string::npos;
  })) << rig.log_text.str();
  b->drain(batch);
  EXPECT_TRUE(batch.pm.empty()) << "a sample 240 s away would land on the wrong steps";
  EXPECT_FALSE(status_of(*b, "pm_sampling").active);
  const uint64_t t1 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) {
    rig.cupti->push_sample(sample(t1 + i * 1'000'000, t1 + (i + 1) * 1'000'000, 80));
  }
  ASSERT_TRUE(eventually([&] {
    b->flush();
    b->drain(batch);
    return batch.pm.size() >= 3;
  }));
  EXPECT_DOUBLE_EQ(batch.pm.back().sm_efficiency, 0.8);
  EXPECT_TRUE(status_of(*b, "pm_sampling").active) << status_of(*b, "pm_sampling").reason;
  const std::string log = rig.log_text.str();
  EXPECT_EQ(log.find("PM sampling: sample times are"), log.rfind("PM sampling: sample times are"))
      << "one line per period:\n"
      << log;
  EXPECT_NE(log.find("line up with the steps again"), std::string::npos) << log;
  b->stop();
}

TEST(GpuBackend, ActivityEnableFailureIsReported) {
  Rig rig;
  rig.cupti->fail["cuptiActivityEnable"] = CUPTI_ERROR_UNKNOWN;
  auto b = rig.make();
  EXPECT_TRUE(status_of(*b, "activity").active);
  EXPECT_FALSE(b->start_trace());
  EXPECT_EQ(status_of(*b, "activity").reason,
            "cuptiActivityEnable(CONCURRENT_KERNEL) failed: CUPTI_ERROR_UNKNOWN (999)");
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
}

// --- PM metric fallbacks -------------------------------------------------------------------------

TEST(GpuBackend, PcieMetricsRejectedFallsBackToFive) {
  Rig rig;
  rig.cupti->rejected_metrics = {"pcie__read_bytes.sum"};
  auto b = rig.make();
  ASSERT_TRUE(status_of(*b, "pm_sampling").active);
  EXPECT_EQ(rig.cupti->metrics.size(), 5u);
  EXPECT_EQ(rig.cupti->host_inits, 2);
  b->start();
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 2; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 33));
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->flush();
    b->drain(batch);
    return !batch.pm.empty();
  }));
  EXPECT_DOUBLE_EQ(batch.pm[0].tensor_activity, 0.30);
  EXPECT_TRUE(std::isnan(batch.pm[0].pcie_read_bytes));
  b->stop();
  const std::string log = rig.log();
  EXPECT_NE(log.find("PM sampling without pcie__read_bytes.sum, pcie__write_bytes.sum"),
            std::string::npos)
      << log;
}

TEST(GpuBackend, MultiPassSetsFallBackToSmAndGr) {
  Rig rig;
  rig.cupti->max_metrics_per_pass = 2;
  auto b = rig.make();
  ASSERT_TRUE(status_of(*b, "pm_sampling").active);
  EXPECT_EQ(rig.cupti->metrics,
            (std::vector<std::string>{pm_metric_name(PmMetric::kCounterUtilization),
                                      pm_metric_name(PmMetric::kSmEfficiency)}));
  EXPECT_EQ(rig.cupti->host_inits, 3);
  EXPECT_EQ(rig.cupti->host_deinits, 2);
  EXPECT_NE(rig.log().find("the set needs 2 passes"), std::string::npos);
}

TEST(GpuBackend, NoSinglePassSetTurnsPmSamplingOff) {
  Rig rig;
  rig.cupti->rejected_metrics = {pm_metric_name(PmMetric::kSmEfficiency)};
  auto b = rig.make();
  const auto pm = status_of(*b, "pm_sampling");
  EXPECT_FALSE(pm.active);
  EXPECT_EQ(pm.reason.rfind("PM sampling has no single-pass metric set on this GPU", 0), 0u);
  EXPECT_EQ(rig.cupti->host_inits, rig.cupti->host_deinits);
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

// gpu.pm_duty < 1: the sampler is enabled for its share of each period and disabled between
// bursts (enabled, even stopped, it costs the GPU's work); the host config image is made once.
// Each burst's first sample is discarded like the first after any start.
// A started backend sampling in bursts of 100 ms every 200 ms.
std::unique_ptr<GpuBackend> start_in_bursts(Rig& rig) {
  rig.config.pm_duty = 0.5;
  rig.config.pm_duty_period_ms = 200;
  auto b = rig.make();
  b->start();
  return b;
}

bool pm_started(const Rig& rig) {
  std::lock_guard<std::mutex> lock(rig.cupti->m);
  return rig.cupti->pm_started;
}

TEST(GpuBackend, PmDutyCycleDisablesTheSamplerBetweenBursts) {
  Rig rig;
  auto b = start_in_bursts(rig);
  auto count = [&](const std::string& call) {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    return std::count(rig.cupti->calls.begin(), rig.cupti->calls.end(), call);
  };
  ASSERT_TRUE(eventually([&] { return count("Enable") >= 3 && count("Disable") >= 2; }));
  EXPECT_EQ(count("ConfigAddMetrics"), 1);
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    const auto& calls = rig.cupti->calls;
    std::string last;  // of Start and Stop
    for (const auto& c : calls) {
      if (c == "Start" || c == "Stop") last = c;
      if (c == "Disable") EXPECT_EQ(last, "Stop") << "disabled while started";
    }
  }
  ASSERT_TRUE(eventually([&] { return pm_started(rig); }));
  const uint64_t t0 = rig.cupti->cupti_now();
  for (int i = 0; i < 3; ++i) rig.cupti->push_sample(sample(t0 + i, t0 + i + 1, 20));
  GpuEventBatch batch;
  ASSERT_TRUE(eventually([&] {
    b->drain(batch);
    return batch.pm.size() >= 2;
  }));
  EXPECT_EQ(batch.pm.size(), 2u);  // the first of the burst discarded
  // Paused, the backend says the samples up to now are all there; sampling, it does not.
  ASSERT_TRUE(eventually([&] {
    GpuEventBatch paused;
    b->drain(paused);
    return paused.pm_final_until > 0;
  }));
  ASSERT_TRUE(eventually([&] {
    GpuEventBatch sampling;
    b->drain(sampling);
    return sampling.pm_final_until == 0;
  }));
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
  EXPECT_FALSE(rig.cupti->pm_started);
}

// A burst that cannot start (another client holds the counters) leaves PM sampling off with the
// reason while it lasts, and it is tried again a period later, not given up.
TEST(GpuBackend, PmSamplingThatCannotResumeAfterAPauseIsTriedAgain) {
  Rig rig;
  auto b = start_in_bursts(rig);
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->fail["cuptiPmSamplingEnable"] = CUPTI_ERROR_NOT_COMPATIBLE;
  }
  ASSERT_TRUE(eventually([&] { return !status_of(*b, "pm_sampling").active; }));
  EXPECT_EQ(
      status_of(*b, "pm_sampling").reason.rfind("PM sampling could not resume after a pause: ", 0),
      0u)
      << status_of(*b, "pm_sampling").reason;
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->fail.erase("cuptiPmSamplingEnable");
  }
  ASSERT_TRUE(eventually([&] { return status_of(*b, "pm_sampling").active; }));
  ASSERT_TRUE(eventually([&] { return pm_started(rig); }));
  EXPECT_NE(rig.log().find("PM sampling resumed"), std::string::npos) << rig.log();
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

// The training thread's drain never waits for a decode in progress (the decode thread holds the
// sampler while CUPTI decodes: 10-30 ms a call on an H100, which stalled every step when drain
// asked the sampler whether it was paused under the same lock).
TEST(GpuBackend, DrainDoesNotWaitForAPmDecodeInProgress) {
  Rig rig;
  auto b = rig.make();
  b->start();
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->hold_decode = true;
  }
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    return rig.cupti->decode_held;
  }));
  auto drained = std::async(std::launch::async, [&] {
    GpuEventBatch batch;
    b->drain(batch);
  });
  // Not a speed limit: a drain that waits for the decode never returns until it is let go.
  const bool returned = drained.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->hold_decode = false;
  }
  rig.cupti->decode_cv.notify_all();
  drained.wait();
  EXPECT_TRUE(returned) << "drain waited for the PM decode";
  b->stop();
}

TEST(GpuBackend, DecodeFailureStopsPmSamplingWithAReason) {
  Rig rig;
  auto b = rig.make();
  b->start();
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    rig.cupti->fail["cuptiPmSamplingDecodeData"] = CUPTI_ERROR_UNKNOWN;
  }
  ASSERT_TRUE(eventually([&] { return !status_of(*b, "pm_sampling").active; }));
  EXPECT_EQ(status_of(*b, "pm_sampling").reason,
            "cuptiPmSamplingDecodeData failed: CUPTI_ERROR_UNKNOWN (999)");
  b->stop();
  EXPECT_FALSE(rig.cupti->pm_enabled);
}

// --- NVML ----------------------------------------------------------------------------------------

TEST(NvlinkPeak, ActiveLinksTimesTheGenerationsRate) {
  FakeNvml nvml;
  NvmlDevice d = reinterpret_cast<NvmlDevice>(&nvml);
  EXPECT_EQ(nvlink_peak(nvml, d, 9).links, 0) << "no NvLinkState entry point: no links";
  nvml.active_links = 18;
  const NvlinkPeak hopper = nvlink_peak(nvml, d, 9);
  EXPECT_EQ(hopper.links, 18);
  EXPECT_DOUBLE_EQ(hopper.bytes_per_s, 450e9);  // H100/H200 SXM: 450 GB/s per direction
  nvml.active_links = 12;
  EXPECT_DOUBLE_EQ(nvlink_peak(nvml, d, 8).bytes_per_s, 300e9);  // A100
  nvml.active_links = 18;
  EXPECT_DOUBLE_EQ(nvlink_peak(nvml, d, 10).bytes_per_s, 900e9);  // Blackwell
  nvml.active_links = 0;
  EXPECT_EQ(nvlink_peak(nvml, d, 9).bytes_per_s, 0.0);  // PCIe only
}

TEST(GpuBackend, NvmlMissing) {
  Rig rig;
  rig.nvml_missing = true;
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "nvml").reason,
            "NVML not found (libnvidia-ml.so.1): NVML utilization off");
  EXPECT_TRUE(status_of(*b, "pm_sampling").active);
  EXPECT_TRUE(status_of(*b, "activity").active);
  b->start();
  b->stop();
}

TEST(GpuBackend, NvmlReadFailureAtStart) {
  Rig rig;
  rig.nvml->utilization_result = 3;  // NVML_ERROR_NOT_SUPPORTED (MIG, vGPU)
  auto b = rig.make();
  EXPECT_TRUE(status_of(*b, "nvml").active);
  b->start();
  EXPECT_EQ(status_of(*b, "nvml").reason, "nvmlDeviceGetUtilizationRates failed: NVML error 3");
  b->stop();
}

TEST(GpuBackend, NvmlInitFailure) {
  Rig rig;
  rig.nvml->init_result = 9;  // NVML_ERROR_DRIVER_NOT_LOADED
  auto b = rig.make();
  EXPECT_EQ(status_of(*b, "nvml").reason, "nvmlInit failed: NVML error 9");
}

// --- Activity buffers ----------------------------------------------------------------------------

TEST(GpuBackend, SyncRecordsSayWhichThreadMadeTheCall) {
  // Issue 10: a cudaEventSynchronize outside any op, once per step, topped the host syncs on the
  // H100. CUPTI's records carry no thread; its callback on the call does, matched by correlation
  // id: the trainer's (the thread that started the window), torchpilot's own, another.
  Rig rig;
  auto b = rig.make();
  b->start();
  ASSERT_TRUE(b->start_trace());
  rig.cupti->sync_call(101);
  std::string our_name;
  std::thread ours([&] {
    mark_own_thread("tp-test");
    char name[16] = {0};
    pthread_getname_np(pthread_self(), name, sizeof name);
    our_name = name;  // what top -H and /proc show for torchpilot's threads
    rig.cupti->sync_call(102);
  });
  ours.join();
  EXPECT_EQ(our_name, "tp-test");
  std::thread other([&] { rig.cupti->sync_call(103); });
  other.join();
  const uint64_t t0 = rig.cupti->cupti_now();
  for (uint32_t id : {101u, 102u, 103u, 104u}) {  // 104: no callback seen
    CUpti_ActivitySynchronization2 r;
    std::memset(&r, 0, sizeof r);
    r.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    r.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE;
    r.start = t0 + id;
    r.end = t0 + id + 10;
    r.correlationId = id;
    r.streamId = CUPTI_SYNCHRONIZATION_INVALID_VALUE;
    r.cudaEventId = id - 100;
    rig.cupti->produce(r);
  }
  b->stop_trace();
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    EXPECT_TRUE(rig.cupti->enabled_callbacks.empty()) << "callbacks off with the trace";
  }
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  ASSERT_EQ(batch.syncs.size(), 4u);
  std::sort(batch.syncs.begin(), batch.syncs.end(),
            [](const SyncRecord& x, const SyncRecord& y) { return x.begin < y.begin; });
  EXPECT_EQ(batch.syncs[0].thread, SyncThread::kTrainer);
  EXPECT_EQ(batch.syncs[1].thread, SyncThread::kOwn);
  EXPECT_EQ(batch.syncs[2].thread, SyncThread::kOther);
  // Every sync callback was on and none had its id: no program call made it.
  EXPECT_EQ(batch.syncs[3].thread, SyncThread::kInternal);
  EXPECT_EQ(batch.syncs[1].api, SyncApi::kEventSynchronize);
  EXPECT_EQ(batch.syncs[1].event_id, 2);
  EXPECT_EQ(batch.syncs[1].stream_id, -1);
  EXPECT_EQ(batch.syncs[1].correlation_id, 102);
  b->stop();
}

TEST(GpuBackend, ExhaustedBuffersAreCountedAsDropped) {
  Rig rig;
  rig.config.trace_buffer_mb = 1;  // one 1 MiB buffer
  auto b = rig.make();
  b->start();
  ASSERT_TRUE(b->start_trace());
  const size_t fit = (1u << 20) / sizeof(CUpti_ActivityKernel10);
  const size_t total = fit + 500;
  const uint64_t k0 = rig.cupti->cupti_now();
  for (size_t i = 0; i < total; ++i) rig.cupti->produce(kernel_at(k0 + i * 10, k0 + i * 10 + 5));
  b->stop_trace();
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), fit);
  EXPECT_EQ(batch.dropped, 500);
  EXPECT_NE(rig.log().find("all 1 trace buffers (1 MiB) are in use"), std::string::npos);

  // The buffer came back: the next window records again.
  ASSERT_TRUE(b->start_trace());
  rig.cupti->produce(kernel_at(k0, k0 + 5));
  b->stop_trace();
  b->flush();
  batch.clear();
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);
  EXPECT_EQ(batch.dropped, 0);
  b->stop();
}

// CUPTI is told our buffers come zeroed (it would zero 4 MiB inside a launch otherwise): a buffer
// used, converted and handed out again is zeroed first; the attribute is put back at release.
TEST(GpuBackend, ActivityBuffersAreHandedToCuptiZeroed) {
  Rig rig;
  rig.config.trace_buffer_mb = 1;  // one 1 MiB buffer, used again and again
  auto b = rig.make();
  b->start();
  // Fewer records than fit: the bytes past them are scribbled on when the buffer comes back.
  const size_t fit = (1u << 20) / sizeof(CUpti_ActivityKernel10) - 1;
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->scribble = true;
  for (int window = 0; window < 2; ++window) {
    ASSERT_TRUE(b->start_trace());
    {
      std::lock_guard<std::mutex> lock(rig.cupti->m);
      EXPECT_EQ(rig.cupti->zeroed_out, 1);
    }
    for (int round = 0; round < 3; ++round) {
      // An empty buffer written into and handed back (valid size 0), then a full one.
      rig.cupti->hand_back_empty();
      b->flush();  // waits for the conversion: the buffer is free again
      for (size_t i = 0; i < fit; ++i) rig.cupti->produce(kernel_at(k0 + i * 10, k0 + i * 10 + 5));
      rig.cupti->hand_back_current();
      GpuEventBatch batch;
      ASSERT_TRUE(eventually([&] {
        b->drain(batch);
        return batch.kernels.size() >= fit;
      }));
      EXPECT_EQ(batch.kernels.size(), fit);
    }
    b->stop_trace();
    b->release_trace();
    b->finish_release();
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    EXPECT_EQ(rig.cupti->zeroed_out, 0);
  }
  std::lock_guard<std::mutex> lock(rig.cupti->m);
  EXPECT_EQ(rig.cupti->unzeroed_buffers, 0);
  EXPECT_EQ(rig.cupti->dropped, 0u);
}

TEST(GpuBackend, FullBuffersDeliveredByCuptisThread) {
  Rig rig;
  rig.config.trace_buffer_mb = 2;  // one 2 MiB buffer
  auto b = rig.make();
  ASSERT_TRUE(b->start_trace());
  const size_t fit = (2u << 20) / sizeof(CUpti_ActivityKernel10);
  const uint64_t k0 = rig.cupti->cupti_now();
  for (size_t i = 0; i < fit + 1; ++i) rig.cupti->produce(kernel_at(k0 + i, k0 + i + 1));
  // The first buffer filled up; CUPTI's worker hands it back from another thread. The collector
  // only queues it there: its converter thread turns it into events, which drain() then holds.
  std::thread worker([&] { rig.cupti->complete_full(); });
  worker.join();
  GpuEventBatch batch;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (batch.kernels.size() < fit && std::chrono::steady_clock::now() < deadline) {
    b->drain(batch);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(batch.kernels.size(), fit);
  b->stop();  // forced flush; the record after the full buffer found no buffer: dropped
  b->drain(batch);
  EXPECT_EQ(batch.dropped, 1);
  EXPECT_EQ(batch.kernels.size() + static_cast<size_t>(batch.dropped), fit + 1);
}

TEST(GpuBackend, ABufferReturnedOnTheTrainingThreadIsConvertedOffIt) {
  Rig rig;
  auto b = rig.make();
  ASSERT_TRUE(b->start_trace());
  const uint64_t k0 = rig.cupti->cupti_now();
  for (int i = 0; i < 10; ++i) rig.cupti->produce(kernel_at(k0 + i, k0 + i + 1));
  rig.cupti->hand_back_current();  // inside one of the trainer's launches
  b->flush();                      // returns once what CUPTI returned is converted
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 10u);
  std::lock_guard<std::mutex> lock(rig.cupti->m);
  EXPECT_EQ(rig.cupti->record_readers.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(rig.cupti->record_readers.size(), 1u);  // the collector's converter
}

TEST(GpuBackend, CuptisOverheadRecordsAreSummedAtDebugLevelOnly) {
  for (const bool debug : {true, false}) {
    Rig rig;
    rig.logger->set_level(debug ? spdlog::level::debug : spdlog::level::info);
    auto b = rig.make();
    ASSERT_TRUE(b->start_trace());
    EXPECT_EQ(rig.cupti->enabled_kinds.count(CUPTI_ACTIVITY_KIND_OVERHEAD), debug ? 1u : 0u);
    const uint64_t t0 = rig.cupti->cupti_now();
    CUpti_ActivityOverhead3 o{};
    o.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
    o.overheadKind = CUPTI_ACTIVITY_OVERHEAD_COMMAND_BUFFER_FULL;
    o.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
    o.objectId.pt.threadId = static_cast<uint32_t>(pthread_self());  // the trainer's
    o.start = t0;
    o.end = t0 + 2'000'000;
    rig.cupti->produce(o);
    o.overheadKind = CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH;
    o.objectId.pt.threadId += 1;  // another thread
    o.end = t0 + 500'000;
    rig.cupti->produce(o);
    rig.cupti->produce(kernel_at(t0, t0 + 1000));
    b->stop();
    GpuEventBatch batch;
    b->drain(batch);
    EXPECT_EQ(batch.kernels.size(), 1u);  // overhead records are not events
    const std::string log = rig.log_text.str();
    if (debug) {
      EXPECT_NE(log.find("buffer flush 1x 0.50 ms (training thread 0.00 ms), command buffer "
                         "full 1x 2.00 ms (training thread 2.00 ms)"),
                std::string::npos)
          << log;
    } else {
      EXPECT_EQ(log.find("CUPTI overhead records"), std::string::npos) << log;
    }
  }
}

TEST(GpuBackend, BufferOfAReplacedBackendIsFreedNotConverted) {
  Rig rig1;
  auto b1 = rig1.make();
  ASSERT_TRUE(b1->start_trace());
  const uint64_t k0 = rig1.cupti->cupti_now();
  rig1.cupti->produce(kernel_at(k0, k0 + 1));
  // The buffer is still in "CUPTI's" hands when a second backend takes over the callbacks.
  Rig rig2;
  auto b2 = rig2.make();
  rig1.cupti->complete_full();
  rig1.cupti->activity_flush_all(0);  // delivered to b2's routing: not b2's buffer
  b2->flush();                        // whatever b2 queued is converted before the drain
  GpuEventBatch batch;
  b2->drain(batch);
  EXPECT_TRUE(batch.kernels.empty());
  b2->stop();
  b1->stop();
}

// --- The generated default fake ---------------------------------------------------------------

TEST(CuptiApiFake, UnscriptedEntryPointsAnswerTheDefault) {
  CuptiApiFake fake;  // CUPTI_ERROR_NOT_INITIALIZED
  uint32_t version = 0;
  EXPECT_EQ(fake.get_version(&version), CUPTI_ERROR_NOT_INITIALIZED);
  CUpti_PmSampling_Stop_Params stop{};  // structSize 0: recorded, the call goes on
  EXPECT_EQ(fake.pm_sampling_stop(&stop), CUPTI_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(fake.bad_struct_sizes, std::vector<std::string>{"CUpti_PmSampling_Stop_Params"});
  EXPECT_EQ(fake.pm_sampling_stop(nullptr), CUPTI_ERROR_INVALID_PARAMETER);
  CuptiApiFake ok(CUPTI_SUCCESS);
  ok.fail["cuptiActivityFlushAll"] = CUPTI_ERROR_UNKNOWN;
  EXPECT_EQ(ok.activity_flush_all(0), CUPTI_ERROR_UNKNOWN);
  EXPECT_EQ(ok.finalize(), CUPTI_SUCCESS);
  CUpti_PmSampling_Start_Params start{};
  start.structSize = CUpti_PmSampling_Start_Params_STRUCT_SIZE;
  EXPECT_EQ(ok.pm_sampling_start(&start), CUPTI_SUCCESS);
  EXPECT_TRUE(ok.bad_struct_sizes.empty());
}

// --- Failure reasons ---------------------------------------------------------------------------

TEST(PmSamplingReasons, ExactStrings) {
  FakeCupti api;
  EXPECT_EQ(pm_sampling_error_reason(api, "x", CUPTI_ERROR_INSUFFICIENT_PRIVILEGES),
            "no permission for GPU performance counters (needs root, CAP_SYS_ADMIN or "
            "NVreg_RestrictProfilingToAdminUsers=0)");
  EXPECT_EQ(pm_sampling_error_reason(api, "x", CUPTI_ERROR_HARDWARE_BUSY),
            "counters held by another client (DCGM or Nsight)");
  EXPECT_NE(pm_sampling_error_reason(api, "x", CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED).find("MIG"),
            std::string::npos);
  EXPECT_EQ(pm_sampling_error_reason(api, "cuptiPmSamplingStart", CUPTI_ERROR_UNKNOWN),
            "cuptiPmSamplingStart failed: CUPTI_ERROR_UNKNOWN (999)");
}

// --- The real thing on this machine
// ----------------------------------------------------------------

TEST(GpuBackendReal, DlopenPathWithoutADriver) {
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (libcuda == nullptr) libcuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (libcuda != nullptr) GTEST_SKIP() << "a GPU driver is installed here";
  std::ostringstream text;
  auto logger = std::make_shared<spdlog::logger>(
      "real", std::make_shared<spdlog::sinks::ostream_sink_mt>(text));
  GpuConfig config;
  auto b = make_cupti_backend(config, *logger);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->device().sm_count, 0);
  const auto status = b->status();
  ASSERT_EQ(status.size(), 4u);
  for (const auto& s : status) {
    EXPECT_FALSE(s.active);
    EXPECT_EQ(s.reason, "no GPU driver (libcuda.so.1 not found)") << s.name;
  }
  b->start();
  EXPECT_FALSE(b->start_trace());
  b->stop_trace();
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_TRUE(batch.kernels.empty());
  b->range_push("x");
  b->range_pop();
  b->stop();
  std::string error;
  EXPECT_EQ(load_cuda_driver(&error), nullptr);
  EXPECT_EQ(error, "no GPU driver (libcuda.so.1 not found)");
}

TEST(GpuBackendReal, MissingEntryPointsAnswerNotImplemented) {
  // A "libcupti" without CUPTI's symbols (libm, through gpu.cupti_path): every entry point,
  // subscribe included (neither cuptiSubscribe_v2 nor its fallback), answers API_NOT_IMPLEMENTED.
  if (dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD) != nullptr ||
      dlopen("libcupti.so", RTLD_NOW | RTLD_NOLOAD) != nullptr) {
    GTEST_SKIP() << "libcupti is already loaded in this process (it would be found first)";
  }
  std::string error;
  auto api = load_cupti("libm.so.6", &error);
  ASSERT_NE(api, nullptr) << error;
  EXPECT_NE(api->origin().find("gpu.cupti_path"), std::string::npos) << api->origin();
  uint32_t version = 0;
  EXPECT_EQ(api->get_version(&version), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  CUpti_SubscriberHandle subscriber = nullptr;
  auto no_op = [](void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {};
  EXPECT_EQ(api->subscribe(&subscriber, no_op, nullptr, nullptr), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  EXPECT_EQ(api->finalize(), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  CUpti_PmSampling_Start_Params start{};
  start.structSize = CUpti_PmSampling_Start_Params_STRUCT_SIZE;
  EXPECT_EQ(api->pm_sampling_start(&start), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  EXPECT_EQ(cupti_error_name(*api, CUPTI_ERROR_UNKNOWN), "CUPTI error (999)");
}

TEST(GpuBackendReal, LibcuptiLoadsWithoutADriver) {
  // This machine has the toolkit's libcupti: it loads (dlopen only; nothing is called that needs
  // a driver) and reports a CUDA 13 API version.
  std::string error;
  auto api = load_cupti("", &error);
  if (api == nullptr) GTEST_SKIP() << error;
  uint32_t version = 0;
  EXPECT_EQ(api->get_version(&version), CUPTI_SUCCESS);
  EXPECT_GE(version, 130000u);
  EXPECT_NE(api->origin().find("libcupti"), std::string::npos) << api->origin();
  // A configured path that does not exist is skipped, with the search going on.
  auto again = load_cupti("/nonexistent/libcupti.so.13", &error);
  EXPECT_NE(again, nullptr);
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
