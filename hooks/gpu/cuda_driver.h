// CudaDriverApi: the thin vendor interface to the few CUDA driver entry points the GPU backend
// needs to find its device (name, SM count, compute capability, PCI bus id) and to time step
// boundaries with events (cuda_markers.h). Production code
// reaches libcuda.so.1 through dlopen (load_cuda_driver); tests substitute a fake. Internal to
// hooks/.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>

#include "torchpilot/runtime/gpu/gpu_backend.h"

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
  // Step markers (cuda_markers.h). Not every fake needs them: by default not supported.
  virtual CUresult ctx_get_current(CUcontext* ctx) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult ctx_set_current(CUcontext ctx) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult ctx_get_device(CUdevice* device) { return CUDA_ERROR_NOT_SUPPORTED; }
  // The observed device's primary context, for a training thread that keeps another device
  // current (LibTorch restores its current device after each op on a tensor of another GPU).
  virtual CUresult ctx_push_current(CUcontext ctx) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult ctx_pop_current(CUcontext* ctx) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult primary_ctx_get_state(CUdevice device, unsigned* flags, int* active) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult primary_ctx_retain(CUcontext* ctx, CUdevice device) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult primary_ctx_release(CUdevice device) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult stream_create(CUstream* stream, unsigned flags) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult stream_destroy(CUstream stream) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult event_create(CUevent* event, unsigned flags) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult event_record(CUevent event, CUstream stream) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult event_query(CUevent event) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult event_elapsed_time(float* ms, CUevent start, CUevent end) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult event_destroy(CUevent event) { return CUDA_ERROR_NOT_SUPPORTED; }
};

// dlopen("libcuda.so.1"); null with `error` set when there is no driver.
std::unique_ptr<CudaDriverApi> load_cuda_driver(std::string* error);

// "CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected".
std::string cuda_error_text(CudaDriverApi& api, CUresult result);

// For gpu.device auto (choose_gpu_device): the devices this process sees and the device of the
// context current on the calling thread; each left as it is (-1) where the driver cannot say.
void probe_visible_and_current(CudaDriverApi& api, int* visible, int* current);

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
