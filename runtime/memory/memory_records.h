// Device memory per epoch (docs/metrics.md, "Memory"): the CUDA caching allocator's statistics,
// read at each epoch's end by the memory collector (hooks/memory/torch_memory.cpp), which resets
// the allocator's peaks there so that each epoch has its own. The memory_pressure advisor reads it.
//
// Pure data. Absent on the CPU or where LibTorch has no CUDA (nothing to say then).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

struct MemoryEpochStats {
  static constexpr const char* kSectionName = "memory";
  int device = 0;
  int64_t capacity_bytes = 0;        // the device's memory (cudaMemGetInfo's total)
  int64_t peak_allocated_bytes = 0;  // the most held by tensors at once this epoch
  int64_t peak_reserved_bytes = 0;   // the most the allocator held from the driver this epoch
  int64_t reserved_bytes = 0;        // held from the driver at the epoch's end
  int64_t alloc_retries = 0;  // cudaMalloc failures retried after freeing the cache (this epoch)
  int64_t ooms = 0;           // out-of-memory errors the allocator raised (this epoch)
  // Shares of capacity_bytes (0 when unknown).
  double peak_allocated_fraction() const;
  double peak_reserved_fraction() const;
  // Reserved but not allocated at the peaks: the cache's slack, fragmentation included.
  int64_t slack_bytes() const {
    return peak_reserved_bytes > peak_allocated_bytes ? peak_reserved_bytes - peak_allocated_bytes
                                                      : 0;
  }
};
std::string section_json(const MemoryEpochStats& m);
void section_text(const MemoryEpochStats& m, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

}  // namespace torchpilot
