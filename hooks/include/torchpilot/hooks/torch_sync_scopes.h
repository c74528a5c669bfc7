// The op-scope hook that names host syncs (docs/metrics.md, "Host syncs by cause"): a
// RecordFunction callback that records the host extent of the ops that may synchronize with the
// GPU (aten::item / _local_scalar_dense, is_nonzero, nonzero, masked_select, unique*,
// repeat_interleave, equal; the copies aten::to / _to_copy / copy_) into HostOpScopes, where the
// GPU monitor matches them with CUPTI's sync records. Only the outermost such op on a thread is
// recorded (aten::to, not the copy_ inside it). No inputs are boxed: whether a copy blocked is
// read from CUPTI (a sync record or a device-to-host copy into pageable memory inside it).
//
// Cost: an active RecordFunction callback makes every op build its record and call it: +0.27-0.44
// us per op not recorded, +1.07-1.59 us per op recorded, on a shared 2-core Debian 12 machine with
// LibTorch 1.13 (bench/sync_scope_overhead.cpp), so 1-2 ms on a step of 4,000 ops: above the
// 1% always-on budget. The callback is added disabled and is on only while the monitor traces a
// window (HostOpScopes::enable).
//
// Every Pilot that sees a CUDA device makes one (a default collector,
// hooks/src/torch_sync_scopes.cpp); tests make one directly. One hook per process is active; a
// second stays inert. Thread-safety: construct and destroy on the training thread; the callback
// runs on any thread. Failure behaviour: nothing throws after construction; the constructor does
// not throw either (a callback that cannot be added leaves the hook inert: active() is false).
#pragma once

#include <cstdint>

namespace torchpilot {

class SyncScopeHook {
 public:
  SyncScopeHook();
  ~SyncScopeHook();
  SyncScopeHook(const SyncScopeHook&) = delete;
  SyncScopeHook& operator=(const SyncScopeHook&) = delete;
  // This hook owns the callback (false: another hook does, or it could not be added).
  bool active() const { return active_; }

 private:
  bool active_ = false;
  uint64_t handle_ = 0;  // at::CallbackHandle
};

// The kind of op `name` is for the hook: 0 not recorded, 1 synchronizes whenever its tensor is on
// the GPU, 2 only sometimes (copies).
int sync_op_kind(const char* name);

}  // namespace torchpilot
