// NVML through dlopen, and the utilization sampler thread.
#include "nvml_sampler.h"

#include <dlfcn.h>

#include <chrono>

#include "own_thread.h"

namespace torchpilot {
namespace detail {

namespace {

class DlopenNvml final : public NvmlApi {
 public:
  explicit DlopenNvml(void* handle) {
    resolve(handle, init_, "nvmlInit_v2");
    resolve(handle, shutdown_, "nvmlShutdown");
    resolve(handle, by_index_, "nvmlDeviceGetHandleByIndex_v2");
    resolve(handle, by_pci_, "nvmlDeviceGetHandleByPciBusId_v2");
    resolve(handle, utilization_, "nvmlDeviceGetUtilizationRates");
    resolve(handle, error_string_, "nvmlErrorString");
    resolve(handle, nvlink_state_, "nvmlDeviceGetNvLinkState");
    resolve(handle, clock_info_, "nvmlDeviceGetClockInfo");
    resolve(handle, clock_reasons_, "nvmlDeviceGetCurrentClocksEventReasons");
    if (clock_reasons_ == nullptr) {  // drivers before 535
      resolve(handle, clock_reasons_, "nvmlDeviceGetCurrentClocksThrottleReasons");
    }
  }

  NvmlReturn init() override { return call(init_); }
  NvmlReturn shutdown() override { return call(shutdown_); }
  NvmlReturn device_get_handle_by_index(unsigned index, NvmlDevice* d) override {
    return call(by_index_, index, d);
  }
  NvmlReturn device_get_handle_by_pci_bus_id(const char* bus, NvmlDevice* d) override {
    return call(by_pci_, bus, d);
  }
  NvmlReturn device_get_utilization_rates(NvmlDevice d, NvmlUtilization* u) override {
    return call(utilization_, d, u);
  }
  NvmlReturn device_get_nvlink_state(NvmlDevice d, unsigned link, int* active) override {
    return call(nvlink_state_, d, link, active);
  }
  NvmlReturn device_get_sm_clock(NvmlDevice d, unsigned* mhz) override {
    return call(clock_info_, d, 1u /* NVML_CLOCK_SM */, mhz);
  }
  NvmlReturn device_get_clock_reasons(NvmlDevice d, unsigned long long* reasons) override {
    return call(clock_reasons_, d, reasons);
  }
  std::string error_string(NvmlReturn r) override {
    const char* s = error_string_ != nullptr ? error_string_(r) : nullptr;
    return (s != nullptr ? std::string(s) : std::string("NVML error")) + " (" + std::to_string(r) +
           ")";
  }

 private:
  static constexpr NvmlReturn kFunctionNotFound = 13;  // NVML_ERROR_FUNCTION_NOT_FOUND
  template <class F>
  static void resolve(void* handle, F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(handle, name));
  }
  template <class F, class... Args>
  static NvmlReturn call(F fn, Args... args) {
    if (fn == nullptr) return kFunctionNotFound;
    return fn(args...);
  }

  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  NvmlReturn (*by_index_)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*by_pci_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization_)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*nvlink_state_)(NvmlDevice, unsigned, int*) = nullptr;
  NvmlReturn (*clock_info_)(NvmlDevice, unsigned, unsigned*) = nullptr;
  NvmlReturn (*clock_reasons_)(NvmlDevice, unsigned long long*) = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
};

constexpr int kMaxConsecutiveFailures = 5;

}  // namespace

std::unique_ptr<NvmlApi> load_nvml(std::string* error) {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (handle == nullptr) {
    if (error != nullptr) *error = "NVML not found (libnvidia-ml.so.1): NVML utilization off";
    return nullptr;
  }
  return std::make_unique<DlopenNvml>(handle);
}

NvlinkPeak nvlink_peak(NvmlApi& api, NvmlDevice device, int compute_major) {
  constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
  NvlinkPeak p;
  for (unsigned link = 0; link < kMaxLinks; ++link) {
    int active = 0;
    if (api.device_get_nvlink_state(device, link, &active) != kNvmlSuccess) continue;
    if (active == 1) ++p.links;
  }
  const double per_link = compute_major >= 10 ? 50e9 : compute_major == 6 ? 20e9 : 25e9;
  p.bytes_per_s = p.links * per_link;
  return p;
}

NvlinkPeak nvlink_peak_of(int cuda_index, const std::string& pci_bus_id, int compute_major,
                          std::string* error) {
  std::unique_ptr<NvmlApi> api = load_nvml(error);
  if (!api) return {};
  NvmlSampler opener(*api);  // nvmlInit and the handle; shut down when it goes
  const std::string why = opener.open(cuda_index, pci_bus_id);
  if (!why.empty()) {
    if (error != nullptr) *error = why;
    return {};
  }
  return nvlink_peak(*api, opener.device(), compute_major);
}

std::string NvmlSampler::open(int cuda_index, const std::string& pci_bus_id) {
  NvmlReturn r = api_.init();
  if (r != kNvmlSuccess) return "nvmlInit failed: " + api_.error_string(r);
  initialized_ = true;
  if (!pci_bus_id.empty()) {
    r = api_.device_get_handle_by_pci_bus_id(pci_bus_id.c_str(), &device_);
    if (r == kNvmlSuccess) return {};
  }
  // No bus id (or NVML does not know it): NVML's index, right when CUDA sees all GPUs in PCI order.
  r = api_.device_get_handle_by_index(static_cast<unsigned>(cuda_index), &device_);
  if (r != kNvmlSuccess) {
    return "nvmlDeviceGetHandle for CUDA device " + std::to_string(cuda_index) +
           (pci_bus_id.empty() ? "" : " (PCI " + pci_bus_id + ")") +
           " failed: " + api_.error_string(r);
  }
  return {};
}

bool NvmlSampler::read(UtilSample* out, NvmlReturn* error) {
  NvmlUtilization u;
  const NvmlReturn r = api_.device_get_utilization_rates(device_, &u);
  if (r != kNvmlSuccess) {
    *error = r;
    return false;
  }
  out->time = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now().time_since_epoch())
                  .count();
  out->utilization = static_cast<double>(u.gpu) / 100.0;
  // The clock and its limits: optional (a driver without them leaves them unknown).
  unsigned mhz = 0;
  if (api_.device_get_sm_clock(device_, &mhz) == kNvmlSuccess) {
    out->sm_clock_mhz = static_cast<double>(mhz);
  }
  unsigned long long reasons = 0;
  if (api_.device_get_clock_reasons(device_, &reasons) == kNvmlSuccess) {
    out->clock_limited = (reasons & kClockLimitReasons) != 0 ? 1 : 0;
  }
  return true;
}

std::string NvmlSampler::start(double interval_ms, Sink sink) {
  if (thread_.joinable()) return {};
  if (device_ == nullptr) return "NVML device not open";
  UtilSample first;
  NvmlReturn error = kNvmlSuccess;
  if (!read(&first, &error)) {
    return "nvmlDeviceGetUtilizationRates failed: " + api_.error_string(error);
  }
  sink_ = std::move(sink);
  sink_(first);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = false;
  }
  const double ms = interval_ms > 0 ? interval_ms : 100.0;
  const auto interval =
      std::chrono::nanoseconds(static_cast<int64_t>(ms * 1e6 < 1e6 ? 1e6 : ms * 1e6));
  thread_ = std::thread([this, interval] {
    mark_own_thread("tp-nvml");
    run(interval);
  });
  return {};
}

void NvmlSampler::run(std::chrono::nanoseconds interval) {
  int failures = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, interval, [this] { return stop_requested_; })) {
    lock.unlock();
    UtilSample s;
    NvmlReturn error = kNvmlSuccess;
    const bool ok = read(&s, &error);
    if (ok) {
      failures = 0;
      try {  // nothing may escape a collector thread; a reading lost is a reading lost
        sink_(s);
      } catch (...) {
      }
    }
    lock.lock();
    if (!ok && ++failures >= kMaxConsecutiveFailures) {
      reason_ = "nvmlDeviceGetUtilizationRates failed " + std::to_string(failures) +
                " times in a row: " + api_.error_string(error);
      return;
    }
  }
}

void NvmlSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (initialized_) {
    api_.shutdown();
    initialized_ = false;
    device_ = nullptr;
  }
}

std::string NvmlSampler::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

}  // namespace detail
}  // namespace torchpilot
