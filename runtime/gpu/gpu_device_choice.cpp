// Which GPU a process observes (gpu_backend.h, choose_gpu_device), resolved for every Pilot
// before its collectors are made (a config resolver, collector.h). The registration runs at
// static initialization; its anchor (anchor.h) is named on the link line (CMake, torchpilot_core)
// so that a static library does not drop this object.
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/guard.h"
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

namespace {
// gpu.device auto (-1): resolved once, before any collector reads it, so that every GPU collector
// of a Pilot observes the same device (on a host of several GPUs, each rank its own). The driver
// is asked only when the default collectors (GPU, memory) will read it.
void resolve_device(Config& config, spdlog::logger& logger, bool probe_driver) {
  if (config.gpu.device >= 0) return;
  int visible = -1, current = -1;
  if (const GpuDeviceProbe p = gpu_device_probe(); p != nullptr && probe_driver) {
    (void)failure_of([&] { p(&visible, &current); });
  }
  const GpuDeviceChoice c = choose_gpu_device(-1, std::getenv("LOCAL_RANK"), visible, current);
  config.gpu.device = c.index;
  if (visible > 1 || c.source == "LOCAL_RANK") {
    logger.info("observing GPU {} of {} ({}; gpu.device sets another)", c.index,
                visible < 0 ? std::string("?") : std::to_string(visible), c.source);
  }
  if (current >= 0 && current != c.index) {
    // The step markers follow the observed GPU (its context pushed where the thread keeps another
    // current), so a trainer that really runs on its current GPU needs gpu.device: say it.
    logger.warn(
        "the thread making the Pilot has GPU {} current, but LOCAL_RANK chose GPU {} to observe; "
        "if the trainer runs on GPU {}, set gpu.device: {}",
        current, c.index, current, current);
  }
}

}  // namespace

TORCHPILOT_REGISTRATION(gpu) { register_config_resolver(&resolve_device); }

}  // namespace torchpilot
