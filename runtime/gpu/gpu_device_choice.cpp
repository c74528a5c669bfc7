// Which GPU a process observes (gpu_backend.h, choose_gpu_device).
#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {
namespace {
std::atomic<GpuDeviceProbe> probe{nullptr};

// A non-negative decimal integer, or -1.
int parse_index(const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0 || v > 1 << 20) return -1;
  return static_cast<int>(v);
}
}  // namespace

GpuDeviceChoice choose_gpu_device(int configured, const char* local_rank, int visible,
                                  int current) {
  if (configured >= 0) return {configured, "gpu.device"};
  // One GPU per local rank, unless each process sees only its own (CUDA_VISIBLE_DEVICES set per
  // rank): then LOCAL_RANK may exceed what is visible, and the current device says more. Without
  // the driver's count it is not trusted (a device that does not exist would lose the figures).
  const int rank = parse_index(local_rank);
  if (rank >= 0 && rank < visible) return {rank, "LOCAL_RANK"};
  if (current >= 0 && (visible < 0 || current < visible)) return {current, "current device"};
  return {0, "default"};
}

void register_gpu_device_probe(GpuDeviceProbe p) { probe.store(p, std::memory_order_release); }

GpuDeviceProbe gpu_device_probe() { return probe.load(std::memory_order_acquire); }

}  // namespace torchpilot
