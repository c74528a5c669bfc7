// NVML utilization.gpu, always on: NvmlApi (the thin vendor interface; libnvidia-ml.so.1 through
// dlopen, a fake in tests) and NvmlSampler (a thread reading nvmlDeviceGetUtilizationRates every
// gpu.nvml_interval_ms). There is no nvml.h in the toolkit: the few entry points used are declared
// here with NVML's stable C ABI. Internal to hooks/.
//
// Thread-safety: open/start/stop from one thread (the training thread); reason() from any thread.
// The sink runs on the sampler thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "nvlink_peak.h"
#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {
namespace detail {

// NVML's C ABI (nvml.h): nvmlReturn_t is an int enum, nvmlDevice_t an opaque pointer,
// nvmlUtilization_t two unsigned ints (percent).
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu = 0;     // percent of time a kernel ran over NVML's sample period
  unsigned int memory = 0;  // percent of time device memory was read or written
};

class NvmlApi {
 public:
  virtual ~NvmlApi() = default;
  virtual NvmlReturn init() = 0;  // nvmlInit_v2
  virtual NvmlReturn shutdown() = 0;
  virtual NvmlReturn device_get_handle_by_index(unsigned index, NvmlDevice* device) = 0;  // _v2
  virtual NvmlReturn device_get_handle_by_pci_bus_id(const char* bus_id,
                                                     NvmlDevice* device) = 0;  // _v2
  virtual NvmlReturn device_get_utilization_rates(NvmlDevice device, NvmlUtilization* u) = 0;
  virtual std::string error_string(NvmlReturn r) = 0;
  // nvmlDeviceGetNvLinkState: *active 1 when the link is up. Not found by default (fakes).
  virtual NvmlReturn device_get_nvlink_state(NvmlDevice /*device*/, unsigned /*link*/,
                                             int* /*active*/) {
    return kNvmlFunctionNotFound;
  }
  // nvmlDeviceGetClockInfo(device, NVML_CLOCK_SM = 1, &mhz). Not found by default (fakes).
  virtual NvmlReturn device_get_sm_clock(NvmlDevice /*device*/, unsigned* /*mhz*/) {
    return kNvmlFunctionNotFound;
  }
  // nvmlDeviceGetCurrentClocksEventReasons (older drivers: ...ThrottleReasons): a bitmask.
  virtual NvmlReturn device_get_clock_reasons(NvmlDevice /*device*/,
                                              unsigned long long* /*reasons*/) {
    return kNvmlFunctionNotFound;
  }
  static constexpr NvmlReturn kNvmlFunctionNotFound = 13;  // NVML_ERROR_FUNCTION_NOT_FOUND
};

NvlinkPeak nvlink_peak(NvmlApi& api, NvmlDevice device, int compute_major);

// The clock event reasons that hold the SM clock below what the GPU could run (nvml.h's
// nvmlClocksEventReason*: SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40,
// HW power brake 0x80); idle, application clocks, sync boost and display clocks are not limits.
constexpr unsigned long long kClockLimitReasons = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

// dlopen("libnvidia-ml.so.1"); null with `error` set when it is missing.
std::unique_ptr<NvmlApi> load_nvml(std::string* error);

class NvmlSampler {
 public:
  using Sink = std::function<void(const UtilSample&)>;
  explicit NvmlSampler(NvmlApi& api) : api_(api) {}
  ~NvmlSampler() {
    (void)failure_of([&] { stop(); });
  }  // destructors must not throw
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  // nvmlInit and the device handle: by PCI bus id when known (NVML numbers GPUs in PCI order,
  // ignoring CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER), else by the CUDA index. Returns the
  // reason NVML is off, empty on success.
  std::string open(int cuda_index, const std::string& pci_bus_id);
  // Reads once (a failure is returned as the reason, and no thread starts), then starts the
  // sampler thread: every interval_ms a UtilSample{steady now, gpu / 100, SM clock, clock
  // limited} goes to `sink` (the clock fields stay unknown where the driver lacks those calls).
  std::string start(double interval_ms, Sink sink);
  // Joins the thread and shuts NVML down. Idempotent.
  void stop();
  // Why sampling stopped on its own (repeated read failures); empty while it works.
  std::string reason() const;
  NvmlDevice device() const { return device_; }  // after open()

 private:
  bool read(UtilSample* out, NvmlReturn* error);
  void run(std::chrono::nanoseconds interval);

  NvmlApi& api_;
  NvmlDevice device_ = nullptr;
  bool initialized_ = false;
  Sink sink_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  std::string reason_;
};

}  // namespace detail
}  // namespace torchpilot
