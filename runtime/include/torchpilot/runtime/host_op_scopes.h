// The hand-over from the op-scope hook (hooks/src/torch_sync_scopes.cpp, LibTorch's
// RecordFunction) to the GPU monitor: a small bounded buffer of HostOpScope (gpu_backend.h).
// The monitor switches the hook on while a trace window runs and drains the scopes with the
// backend's events; a CUPTI sync record inside a scope takes the scope's op as its cause
// (docs/metrics.md, "Host syncs by cause").
//
// One per process (the RecordFunction callback is process-wide). Thread-safety: push() from any
// thread (ops run on the training thread and on autograd's); the rest from the training thread.
// Nothing here throws after construction except std::bad_alloc.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "torchpilot/runtime/gpu_backend.h"

namespace torchpilot {

class HostOpScopes {
 public:
  static constexpr size_t kCapacity = 4096;  // scopes between two drains; beyond: dropped

  static HostOpScopes& instance();

  // The hook: `on_off(true)` turns its callback on, `on_off(false)` off. Called at once with the
  // current state, then whenever it changes. An empty function unsets it.
  void set_switch(std::function<void(bool)> on_off);
  bool has_switch() const;
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
  mutable std::mutex switch_mu_;  // held while the switch runs: on/off calls stay in order
  std::function<void(bool)> switch_;
  std::mutex mu_;
  std::vector<HostOpScope> scopes_;
  int64_t dropped_ = 0;
};

}  // namespace torchpilot
