// FakeDriver: a fake of the CUDA driver (CudaDriverApi) for the GPU backend's tests: one device
// by default, with knobs for cuInit's result, the device count, name and attributes.
#pragma once

#include <cstring>
#include <map>
#include <string>

#include "torchpilot/hooks/gpu/cuda_driver.h"

namespace torchpilot {
namespace detail {

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

}  // namespace detail
}  // namespace torchpilot
