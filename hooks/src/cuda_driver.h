// CudaDriverApi: the thin vendor interface to the few CUDA driver entry points the GPU backend
// needs to find its device (name, SM count, compute capability, PCI bus id). Production code
// reaches libcuda.so.1 through dlopen (load_cuda_driver); tests substitute a fake. Internal to
// hooks/.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>

#include "torchpilot/runtime/gpu_backend.h"

namespace torchpilot {
namespace detail {

class CudaDriverApi {
 public:
  virtual ~CudaDriverApi() = default;
  virtual CUresult init(unsigned flags) = 0;
  virtual CUresult device_get_count(int* count) = 0;
  virtual CUresult device_get(CUdevice* device, int ordinal) = 0;
  virtual CUresult device_get_name(char* name, int len, CUdevice device) = 0;
  virtual CUresult device_get_attribute(int* value, CUdevice_attribute attribute,
                                        CUdevice device) = 0;
  virtual CUresult device_get_pci_bus_id(char* bus_id, int len, CUdevice device) = 0;
  virtual CUresult get_error_name(CUresult error, const char** str) = 0;
  virtual CUresult get_error_string(CUresult error, const char** str) = 0;
};

// dlopen("libcuda.so.1"); null with `error` set when there is no driver.
std::unique_ptr<CudaDriverApi> load_cuda_driver(std::string* error);

// "CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected".
std::string cuda_error_text(CudaDriverApi& api, CUresult result);

// What the driver says about device `index`.
struct ProbedDevice {
  GpuDeviceInfo info;  // sm_count 0 when there is none
  int cc_major = 0, cc_minor = 0;
  std::string pci_bus_id;  // "0000:3B:00.0"; empty when unknown
  std::string error;       // why there is no device (empty when found)
};
// cuInit, cuDeviceGetCount, cuDeviceGet, name, SM count, compute capability, PCI bus id.
ProbedDevice probe_device(CudaDriverApi& api, int index);

}  // namespace detail
}  // namespace torchpilot
