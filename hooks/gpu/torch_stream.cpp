// The trainer's current CUDA stream for the GPU step markers (marker_stream.h): in builds whose
// LibTorch has CUDA, LibTorch's current stream of the observed device (a side stream under a
// CUDAStreamGuard, else the default stream). Elsewhere this file only keeps its link anchor.
// Registered at static initialization; the anchor is named on the link line (CMake, torchpilot).
#include "torchpilot/hooks/gpu/marker_stream.h"

#if TORCHPILOT_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>

#include <limits>
#endif

namespace torchpilot {
namespace {

#if TORCHPILOT_TORCH_CUDA
// Called only once a CUDA context is current on the thread (the trainer touched CUDA).
void* current_stream(int device) {
  if (device < 0 || device > std::numeric_limits<c10::DeviceIndex>::max()) return nullptr;
  try {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  } catch (...) {
    return nullptr;  // the legacy default stream; nothing throws into the training loop
  }
}

const bool registered = [] {
  detail::set_marker_stream_provider(&current_stream);
  return true;
}();
#else
const bool registered = false;
#endif

}  // namespace
}  // namespace torchpilot

extern "C" int torchpilot_torch_stream_anchor() { return torchpilot::registered ? 1 : 0; }
