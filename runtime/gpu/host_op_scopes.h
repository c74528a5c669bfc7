// The hand-over from the CUPTI callbacks on synchronizing calls (hooks/gpu/cupti_activity_trace.cpp
// names each call's ATen op by its stack, hooks/gpu/op_symbols.h) to the GPU monitor: a small
// bounded buffer of HostOpScope (gpu_backend.h). The monitor enables it while a trace window runs
// and drains the scopes with the backend's events; a CUPTI sync record inside a scope takes the
// scope's op as its cause (docs/metrics.md, "Host syncs by cause").
//
// One per process (CUPTI's callbacks are process-wide). Thread-safety: push() from any thread
// (syncs happen on the training thread and elsewhere); the rest from the training thread.
// Nothing here throws after construction except std::bad_alloc.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {

class HostOpScopes {
 public:
  static constexpr size_t kCapacity = 4096;  // scopes between two drains; beyond: dropped

  static HostOpScopes& instance();

  // The monitor: scopes are wanted (a trace window runs) or not.
  void enable(bool on);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // A scope ended. False (and counted in dropped()) when the buffer is full.
  bool push(HostOpScope scope);
  // Moves the scopes pushed since the last call into `out` (appends).
  void drain(std::vector<HostOpScope>& out);
  // Scopes lost to a full buffer since the last call.
  int64_t take_dropped();

 private:
  std::atomic<bool> enabled_{false};
  std::mutex mu_;
  std::vector<HostOpScope> scopes_;
  int64_t dropped_ = 0;
};

}  // namespace torchpilot
