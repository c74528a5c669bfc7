// load_cupti(): libcupti reached through dlopen/dlsym; TimeBase measurement.
#include "cupti_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

namespace torchpilot {
namespace detail {

namespace {

// CUPTI entry points, resolved by name. A missing one stays null and its method answers
// CUPTI_ERROR_API_NOT_IMPLEMENTED.
class DlopenCuptiApi final : public CuptiApi {
 public:
  DlopenCuptiApi(void* handle, std::string origin) : handle_(handle), origin_(std::move(origin)) {
    resolve(get_version_, "cuptiGetVersion");
    resolve(get_result_string_, "cuptiGetResultString");
    resolve(get_timestamp_, "cuptiGetTimestamp");
    resolve(subscribe_, "cuptiSubscribe");
    resolve(subscribe_v2_, "cuptiSubscribe_v2");
    resolve(unsubscribe_, "cuptiUnsubscribe");
    resolve(finalize_, "cuptiFinalize");
    resolve(activity_register_callbacks_, "cuptiActivityRegisterCallbacks");
    resolve(activity_enable_, "cuptiActivityEnable");
    resolve(activity_disable_, "cuptiActivityDisable");
    resolve(activity_flush_all_, "cuptiActivityFlushAll");
    resolve(activity_get_next_record_, "cuptiActivityGetNextRecord");
    resolve(activity_get_num_dropped_records_, "cuptiActivityGetNumDroppedRecords");
    resolve(profiler_initialize_, "cuptiProfilerInitialize");
    resolve(profiler_deinitialize_, "cuptiProfilerDeInitialize");
    resolve(device_get_chip_name_, "cuptiDeviceGetChipName");
    resolve(pm_get_counter_availability_, "cuptiPmSamplingGetCounterAvailability");
    resolve(host_initialize_, "cuptiProfilerHostInitialize");
    resolve(host_deinitialize_, "cuptiProfilerHostDeinitialize");
    resolve(host_config_add_metrics_, "cuptiProfilerHostConfigAddMetrics");
    resolve(host_get_config_image_size_, "cuptiProfilerHostGetConfigImageSize");
    resolve(host_get_config_image_, "cuptiProfilerHostGetConfigImage");
    resolve(host_get_num_of_passes_, "cuptiProfilerHostGetNumOfPasses");
    resolve(host_evaluate_to_gpu_values_, "cuptiProfilerHostEvaluateToGpuValues");
    resolve(pm_enable_, "cuptiPmSamplingEnable");
    resolve(pm_disable_, "cuptiPmSamplingDisable");
    resolve(pm_set_config_, "cuptiPmSamplingSetConfig");
    resolve(pm_start_, "cuptiPmSamplingStart");
    resolve(pm_stop_, "cuptiPmSamplingStop");
    resolve(pm_decode_data_, "cuptiPmSamplingDecodeData");
    resolve(pm_get_counter_data_size_, "cuptiPmSamplingGetCounterDataSize");
    resolve(pm_counter_data_image_initialize_, "cuptiPmSamplingCounterDataImageInitialize");
    resolve(pm_get_counter_data_info_, "cuptiPmSamplingGetCounterDataInfo");
    resolve(pm_counter_data_get_sample_info_, "cuptiPmSamplingCounterDataGetSampleInfo");
  }
  // The handle is never closed: CUPTI keeps threads and our callbacks registered for the life of
  // the process, and LibTorch may share the same copy.

  std::string origin() const override { return origin_; }

  CUptiResult get_version(uint32_t* v) override { return call(get_version_, v); }
  CUptiResult get_result_string(CUptiResult r, const char** s) override {
    return call(get_result_string_, r, s);
  }
  CUptiResult get_timestamp(uint64_t* t) override { return call(get_timestamp_, t); }
  CUptiResult subscribe(CUpti_SubscriberHandle* s, CUpti_CallbackFunc cb, void* user,
                        CUpti_SubscriberParams* params) override {
    if (subscribe_v2_ != nullptr) return subscribe_v2_(s, cb, user, params);
    return call(subscribe_, s, cb, user);
  }
  CUptiResult unsubscribe(CUpti_SubscriberHandle s) override { return call(unsubscribe_, s); }

  CUptiResult activity_register_callbacks(CUpti_BuffersCallbackRequestFunc req,
                                          CUpti_BuffersCallbackCompleteFunc done) override {
    return call(activity_register_callbacks_, req, done);
  }
  CUptiResult activity_enable(CUpti_ActivityKind k) override { return call(activity_enable_, k); }
  CUptiResult activity_disable(CUpti_ActivityKind k) override { return call(activity_disable_, k); }
  CUptiResult activity_flush_all(uint32_t flag) override { return call(activity_flush_all_, flag); }
  CUptiResult activity_get_next_record(uint8_t* buffer, size_t valid,
                                       CUpti_Activity** record) override {
    return call(activity_get_next_record_, buffer, valid, record);
  }
  CUptiResult activity_get_num_dropped_records(CUcontext ctx, uint32_t stream,
                                               size_t* dropped) override {
    return call(activity_get_num_dropped_records_, ctx, stream, dropped);
  }

  CUptiResult finalize() override { return call(finalize_); }
  CUptiResult profiler_initialize(CUpti_Profiler_Initialize_Params* p) override {
    return call(profiler_initialize_, p);
  }
  CUptiResult profiler_deinitialize(CUpti_Profiler_DeInitialize_Params* p) override {
    return call(profiler_deinitialize_, p);
  }
  CUptiResult device_get_chip_name(CUpti_Device_GetChipName_Params* p) override {
    return call(device_get_chip_name_, p);
  }
  CUptiResult pm_sampling_get_counter_availability(
      CUpti_PmSampling_GetCounterAvailability_Params* p) override {
    return call(pm_get_counter_availability_, p);
  }
  CUptiResult profiler_host_initialize(CUpti_Profiler_Host_Initialize_Params* p) override {
    return call(host_initialize_, p);
  }
  CUptiResult profiler_host_deinitialize(CUpti_Profiler_Host_Deinitialize_Params* p) override {
    return call(host_deinitialize_, p);
  }
  CUptiResult profiler_host_config_add_metrics(
      CUpti_Profiler_Host_ConfigAddMetrics_Params* p) override {
    return call(host_config_add_metrics_, p);
  }
  CUptiResult profiler_host_get_config_image_size(
      CUpti_Profiler_Host_GetConfigImageSize_Params* p) override {
    return call(host_get_config_image_size_, p);
  }
  CUptiResult profiler_host_get_config_image(
      CUpti_Profiler_Host_GetConfigImage_Params* p) override {
    return call(host_get_config_image_, p);
  }
  CUptiResult profiler_host_get_num_of_passes(
      CUpti_Profiler_Host_GetNumOfPasses_Params* p) override {
    return call(host_get_num_of_passes_, p);
  }
  CUptiResult profiler_host_evaluate_to_gpu_values(
      CUpti_Profiler_Host_EvaluateToGpuValues_Params* p) override {
    return call(host_evaluate_to_gpu_values_, p);
  }
  CUptiResult pm_sampling_enable(CUpti_PmSampling_Enable_Params* p) override {
    return call(pm_enable_, p);
  }
  CUptiResult pm_sampling_disable(CUpti_PmSampling_Disable_Params* p) override {
    return call(pm_disable_, p);
  }
  CUptiResult pm_sampling_set_config(CUpti_PmSampling_SetConfig_Params* p) override {
    return call(pm_set_config_, p);
  }
  CUptiResult pm_sampling_start(CUpti_PmSampling_Start_Params* p) override {
    return call(pm_start_, p);
  }
  CUptiResult pm_sampling_stop(CUpti_PmSampling_Stop_Params* p) override {
    return call(pm_stop_, p);
  }
  CUptiResult pm_sampling_decode_data(CUpti_PmSampling_DecodeData_Params* p) override {
    return call(pm_decode_data_, p);
  }
  CUptiResult pm_sampling_get_counter_data_size(
      CUpti_PmSampling_GetCounterDataSize_Params* p) override {
    return call(pm_get_counter_data_size_, p);
  }
  CUptiResult pm_sampling_counter_data_image_initialize(
      CUpti_PmSampling_CounterDataImage_Initialize_Params* p) override {
    return call(pm_counter_data_image_initialize_, p);
  }
  CUptiResult pm_sampling_get_counter_data_info(
      CUpti_PmSampling_GetCounterDataInfo_Params* p) override {
    return call(pm_get_counter_data_info_, p);
  }
  CUptiResult pm_sampling_counter_data_get_sample_info(
      CUpti_PmSampling_CounterData_GetSampleInfo_Params* p) override {
    return call(pm_counter_data_get_sample_info_, p);
  }

 private:
  template <class F>
  void resolve(F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(handle_, name));
  }
  template <class F, class... Args>
  static CUptiResult call(F fn, Args... args) {
    if (fn == nullptr) return CUPTI_ERROR_API_NOT_IMPLEMENTED;
    return fn(args...);
  }

  void* handle_;
  std::string origin_;
  decltype(&::cuptiGetVersion) get_version_ = nullptr;
  decltype(&::cuptiGetResultString) get_result_string_ = nullptr;
  decltype(&::cuptiGetTimestamp) get_timestamp_ = nullptr;
  decltype(&::cuptiSubscribe) subscribe_ = nullptr;
  decltype(&::cuptiSubscribe_v2) subscribe_v2_ = nullptr;
  decltype(&::cuptiUnsubscribe) unsubscribe_ = nullptr;
  decltype(&::cuptiFinalize) finalize_ = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) activity_register_callbacks_ = nullptr;
  decltype(&::cuptiActivityEnable) activity_enable_ = nullptr;
  decltype(&::cuptiActivityDisable) activity_disable_ = nullptr;
  decltype(&::cuptiActivityFlushAll) activity_flush_all_ = nullptr;
  decltype(&::cuptiActivityGetNextRecord) activity_get_next_record_ = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) activity_get_num_dropped_records_ = nullptr;
  decltype(&::cuptiProfilerInitialize) profiler_initialize_ = nullptr;
  decltype(&::cuptiProfilerDeInitialize) profiler_deinitialize_ = nullptr;
  decltype(&::cuptiDeviceGetChipName) device_get_chip_name_ = nullptr;
  decltype(&::cuptiPmSamplingGetCounterAvailability) pm_get_counter_availability_ = nullptr;
  decltype(&::cuptiProfilerHostInitialize) host_initialize_ = nullptr;
  decltype(&::cuptiProfilerHostDeinitialize) host_deinitialize_ = nullptr;
  decltype(&::cuptiProfilerHostConfigAddMetrics) host_config_add_metrics_ = nullptr;
  decltype(&::cuptiProfilerHostGetConfigImageSize) host_get_config_image_size_ = nullptr;
  decltype(&::cuptiProfilerHostGetConfigImage) host_get_config_image_ = nullptr;
  decltype(&::cuptiProfilerHostGetNumOfPasses) host_get_num_of_passes_ = nullptr;
  decltype(&::cuptiProfilerHostEvaluateToGpuValues) host_evaluate_to_gpu_values_ = nullptr;
  decltype(&::cuptiPmSamplingEnable) pm_enable_ = nullptr;
  decltype(&::cuptiPmSamplingDisable) pm_disable_ = nullptr;
  decltype(&::cuptiPmSamplingSetConfig) pm_set_config_ = nullptr;
  decltype(&::cuptiPmSamplingStart) pm_start_ = nullptr;
  decltype(&::cuptiPmSamplingStop) pm_stop_ = nullptr;
  decltype(&::cuptiPmSamplingDecodeData) pm_decode_data_ = nullptr;
  decltype(&::cuptiPmSamplingGetCounterDataSize) pm_get_counter_data_size_ = nullptr;
  decltype(&::cuptiPmSamplingCounterDataImageInitialize) pm_counter_data_image_initialize_ =
      nullptr;
  decltype(&::cuptiPmSamplingGetCounterDataInfo) pm_get_counter_data_info_ = nullptr;
  decltype(&::cuptiPmSamplingCounterDataGetSampleInfo) pm_counter_data_get_sample_info_ = nullptr;
};

// The path a handle was loaded from (dlinfo would need _GNU_SOURCE's link_map; dladdr of a symbol
// is enough).
std::string path_of(void* handle, const std::string& fallback) {
  void* sym = dlsym(handle, "cuptiGetVersion");
  Dl_info info{};
  if (sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return fallback;
}

}  // namespace

std::unique_ptr<CuptiApi> load_cupti(const std::string& configured_path, std::string* error) {
  struct Attempt {
    std::string name;
    int flags;
    const char* what;
    bool configured;
  };
  std::vector<Attempt> attempts;
  // The copy already in the process (LibTorch's) comes first: a second copy conflicts with it.
  attempts.push_back({"libcupti.so.13", RTLD_NOW | RTLD_NOLOAD, "already loaded", false});
  attempts.push_back({"libcupti.so", RTLD_NOW | RTLD_NOLOAD, "already loaded", false});
  if (!configured_path.empty()) {
    attempts.push_back({configured_path, RTLD_NOW, "gpu.cupti_path", true});
  }
  attempts.push_back({"libcupti.so.13", RTLD_NOW, "loader search path", false});
  attempts.push_back({"libcupti.so", RTLD_NOW, "loader search path", false});
  attempts.push_back({"/usr/local/cuda/lib64/libcupti.so.13", RTLD_NOW, "CUDA toolkit", false});
  attempts.push_back(
      {"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13", RTLD_NOW, "CUDA toolkit", false});
  std::string configured_error;
  for (const auto& a : attempts) {
    void* handle = dlopen(a.name.c_str(), a.flags);
    if (handle == nullptr) {
      if (a.configured) {
        const char* e = dlerror();
        configured_error = e != nullptr ? e : "dlopen failed";
      }
      continue;
    }
    return std::make_unique<DlopenCuptiApi>(
        handle, path_of(handle, a.name) + " (" + std::string(a.what) + ")");
  }
  if (error != nullptr) {
    *error = "libcupti not found (tried libcupti.so.13 in the process, ";
    if (!configured_path.empty()) {
      *error += "gpu.cupti_path " + configured_path + " [" + configured_error + "], ";
    }
    *error += "the loader's search path, /usr/local/cuda/lib64 and /usr/local/cuda/extras/CUPTI)";
  }
  return nullptr;
}

std::string cupti_error_name(CuptiApi& api, CUptiResult result) {
  const char* s = nullptr;
  std::string name;
  if (api.get_result_string(result, &s) == CUPTI_SUCCESS && s != nullptr) name = s;
  if (name.empty()) name = "CUPTI error";
  return name + " (" + std::to_string(static_cast<int>(result)) + ")";
}

Nanos steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TimeBase measure_time_base(const std::function<uint64_t()>& cupti_now,
                           const std::function<Nanos()>& steady_now, int reads, Nanos* latency_ns) {
  TimeBase best;
  Nanos best_latency = std::numeric_limits<Nanos>::max();
  for (int i = 0; i < std::max(1, reads); ++i) {
    const Nanos s0 = steady_now();
    const uint64_t c = cupti_now();
    const Nanos s1 = steady_now();
    const Nanos latency = s1 - s0;
    if (latency < best_latency) {
      best_latency = latency;
      best.offset_ns = static_cast<int64_t>(c) - (s0 + latency / 2);
    }
  }
  if (latency_ns != nullptr) *latency_ns = best_latency;
  return best;
}

bool CuptiClock::measure(CuptiApi& api, Nanos* latency_ns) {
  bool ok = true;
  auto cupti_now = [&]() -> uint64_t {
    uint64_t t = 0;
    if (api.get_timestamp(&t) != CUPTI_SUCCESS) ok = false;
    return t;
  };
  const TimeBase tb = measure_time_base(cupti_now, steady_now_ns, 5, latency_ns);
  if (ok) set(tb);
  return ok;
}

}  // namespace detail
}  // namespace torchpilot
