// The GPU backend of builds with the CUDA toolkit's headers: CUPTI PM sampling (always on), CUPTI
// activity tracing (detailed windows), NVML utilization (always on) and NVTX ranges, behind
// GpuBackend (runtime/gpu/gpu_backend.h). Internal to hooks/.
//
// Vendor libraries are reached through thin interfaces (CudaDriverApi, CuptiApi, NvmlApi) loaded
// with dlopen, so the library loads and runs on a machine without a driver; tests inject fakes.
// Each collector that cannot run says why in status() and the others keep working:
//   no libcuda / cuInit failure / no device at gpu.device -> no device (sm_count 0), every
//     collector gives that reason;
//   libcupti missing or too old -> pm_sampling and activity off;
//   PM sampling: permissions (35), counters held by DCGM/Nsight (26), MIG (43), compute capability
//     below 8.6, no single-pass metric set -> pm_sampling off;
//   another CUPTI subscriber (39: Nsight Systems, PyTorch's profiler) -> activity off;
//   no libnvidia-ml / NVML errors -> nvml off.
// Thread-safety: the GpuBackend methods belong to one thread (the training thread); the PM decode
// thread, the NVML thread and CUPTI's buffer callbacks hand events over under a mutex. The logger
// must outlive the backend. Nothing throws out of the backend.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {

struct GpuConfig;

namespace detail {
class CudaDriverApi;
class CuptiApi;
class NvmlApi;

// How the backend gets its vendor interfaces. Each loader returns null and sets the reason when
// its library is missing. The driver is loaded first; CUPTI and NVML only when there is a device.
struct GpuVendorLoaders {
  std::function<std::unique_ptr<CudaDriverApi>(std::string* error)> driver;
  std::function<std::unique_ptr<CuptiApi>(std::string* error)> cupti;
  std::function<std::unique_ptr<NvmlApi>(std::string* error)> nvml;
};

// The production loaders: dlopen of libcuda.so.1, libcupti (gpu.cupti_path and the search order
// in cupti_api.h), libnvidia-ml.so.1.
GpuVendorLoaders dlopen_vendor_loaders(const GpuConfig& config);

std::unique_ptr<GpuBackend> make_cupti_backend(const GpuConfig& config, spdlog::logger& logger,
                                               GpuVendorLoaders loaders);
}  // namespace detail

// The backend with the real (dlopen) vendor libraries.
std::unique_ptr<GpuBackend> make_cupti_backend(const GpuConfig& config, spdlog::logger& logger);

}  // namespace torchpilot
