// Registers this build's GPU backend with the runtime: CUPTI/NVML/NVTX when the CUDA toolkit's
// headers were found at configure time, otherwise one that says why there is no GPU data.
// The registration runs at static initialization; the anchor below is named on the link line
// (CMake, torchpilot_gpu_collectors) so that a static library does not drop this object.
#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/gpu_backend.h"

#if TORCHPILOT_HAVE_CUPTI
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

const bool registered = [] {
  register_gpu_backend_factory(&make_build_backend);
  return true;
}();

}  // namespace
}  // namespace torchpilot

extern "C" int torchpilot_gpu_collectors_anchor() { return torchpilot::registered ? 1 : 0; }
