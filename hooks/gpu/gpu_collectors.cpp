// The GPU collector of every Pilot: a GpuMonitor over this build's backend (CUPTI/NVML/NVTX when
// the CUDA toolkit's headers were found at configure time), registered with the runtime as a
// default collector. Each reason the GPU is not observed is logged once.
// The registration runs at static initialization; the anchor below is named on the link line
// (CMake, torchpilot_gpu_collectors) so that a static library does not drop this object.
#include <spdlog/spdlog.h>

#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"

#if TORCHPILOT_HAVE_CUPTI
#include "cuda_driver.h"
#include "cupti_backend.h"
#endif

namespace torchpilot {
namespace {

std::unique_ptr<GpuBackend> make_build_backend(const GpuConfig& config, spdlog::logger& logger) {
#if TORCHPILOT_HAVE_CUPTI
  return make_cupti_backend(config, logger);
#else
  (void)config;
  (void)logger;
  return make_unavailable_gpu_backend(
      "this build has no GPU collectors (the CUDA toolkit's CUPTI headers were not found at "
      "configure time)");
#endif
}

std::unique_ptr<Collector> make_gpu_collector(CollectorHost& host) {
  const Config& config = host.config();
  if (!config.gpu.enabled) return nullptr;
  spdlog::logger& log = host.logger();
  // GPU events carry steady-clock times: with another clock (a test's, a simulation's) they
  // cannot be placed in steps. A program can still add a GpuMonitor over a backend of its own.
  if (!host.steady_clock()) {
    log.info(
        "GPU collectors off: the Pilot runs on a custom clock, GPU events use the steady clock");
    return nullptr;
  }
  return make_gpu_monitor(config.gpu, make_build_backend(config.gpu, log), log);
}

#if TORCHPILOT_HAVE_CUPTI
// For gpu.device auto: the devices this process sees, and the device of the context current on
// the calling thread (the trainer's, when it chose its GPU before making the Pilot).
void probe_devices(int* visible, int* current) {
  std::string error;
  const std::unique_ptr<detail::CudaDriverApi> api = detail::load_cuda_driver(&error);
  if (api != nullptr) detail::probe_visible_and_current(*api, visible, current);
}
#endif

const bool registered = [] {
  register_default_collector("gpu", 0, &make_gpu_collector);
#if TORCHPILOT_HAVE_CUPTI
  register_gpu_device_probe(&probe_devices);
#endif
  return true;
}();

}  // namespace
}  // namespace torchpilot

extern "C" int torchpilot_gpu_collectors_anchor() { return torchpilot::registered ? 1 : 0; }
