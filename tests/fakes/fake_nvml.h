// FakeNvml: a fake of NVML (NvmlApi) for the GPU backend's tests.
#pragma once

#include <cstring>
#include <string>

#include "torchpilot/hooks/gpu/nvml_sampler.h"

namespace torchpilot {
namespace detail {

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

}  // namespace detail
}  // namespace torchpilot
