// The memory collector (docs/metrics.md, "Memory"): at each epoch's end, the CUDA caching
// allocator's statistics of the observed GPU (gpu.device) into the epoch's "memory" section
// (MemoryEpochStats), its peaks reset there so that each epoch has its own; retries and OOMs are
// counted as this epoch's. Where LibTorch has no CUDA or the device is not visible: no collector.
//
// A default collector (one per Pilot), registered at static initialization; the anchor is named
// on the link line (CMake, torchpilot). Nothing here throws into the training loop: a failure is
// logged once and the section is left out.
#include <memory>
#include <string>

#include "torchpilot/runtime/core/anchor.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/memory/memory_records.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#define TORCHPILOT_MEMORY_COLLECTOR 1
#else
#define TORCHPILOT_MEMORY_COLLECTOR 0
#endif

namespace torchpilot {
namespace {

#if TORCHPILOT_MEMORY_COLLECTOR

class MemoryCollector final : public Collector {
 public:
  explicit MemoryCollector(int device) : device_(static_cast<c10::DeviceIndex>(device)) {
    // The capacity from the device's properties, which needs no CUDA context: a device guard and
    // cudaMemGetInfo would make one on that GPU (hundreds of MB, and the thread's current device
    // switched to it) in a process that may train on another.
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, device_) == cudaSuccess) {
      capacity_ = static_cast<int64_t>(props.totalGlobalMem);
    } else {
      (void)cudaGetLastError();  // not left for the trainer's next check
    }
    try {
      const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device_);
      retries_ = s.num_alloc_retries;
      ooms_ = s.num_ooms;
    } catch (...) {  // no allocation on the device yet: counters from zero
    }
  }
  std::string name() const override { return "memory"; }
  unsigned step_hooks() const override { return 0; }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_epoch_end(EpochSummary& summary) override {
    try {
      const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device_);
      constexpr size_t kAll = 0;  // StatType::AGGREGATE: every pool
      MemoryEpochStats m;
      m.device = device_;
      m.capacity_bytes = capacity_;
      m.peak_allocated_bytes = s.allocated_bytes[kAll].peak;
      m.peak_reserved_bytes = s.reserved_bytes[kAll].peak;
      m.reserved_bytes = s.reserved_bytes[kAll].current;
      m.alloc_retries = static_cast<int64_t>(s.num_alloc_retries) - retries_;
      m.ooms = static_cast<int64_t>(s.num_ooms) - ooms_;
      retries_ = s.num_alloc_retries;
      ooms_ = s.num_ooms;
      c10::cuda::CUDACachingAllocator::resetPeakStats(device_);
      if (capacity_ > 0) summary.sections.set(m);
    } catch (const std::exception& e) {
      if (!warned_ && host_ != nullptr) {
        warned_ = true;
        host_->log(LogLevel::kInfo, std::string("GPU memory figures unavailable: ") + e.what());
      }
    }
  }

 private:
  c10::DeviceIndex device_;
  CollectorHost* host_ = nullptr;
  int64_t capacity_ = 0;
  int64_t retries_ = 0, ooms_ = 0;
  bool warned_ = false;
};

std::unique_ptr<Collector> make_memory_collector(CollectorHost& host) {
  const Config& c = host.config();
  if (c.mode == Mode::kOff || !c.gpu.enabled) return nullptr;
  try {
    if (c.gpu.device < 0 || c.gpu.device >= static_cast<int>(c10::cuda::device_count())) {
      return nullptr;
    }
  } catch (...) {
    return nullptr;
  }
  return std::make_unique<MemoryCollector>(c.gpu.device);
}

#else

std::unique_ptr<Collector> make_memory_collector(CollectorHost&) { return nullptr; }

#endif

}  // namespace

TORCHPILOT_REGISTRATION(memory) { register_default_collector("memory", 0, &make_memory_collector); }

}  // namespace torchpilot
