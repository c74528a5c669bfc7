// Threads of torchpilot's own (the step-marker resolver, PM sampling's decode thread, the NVML
// sampler, the trace release, the activity converter, the op-symbol indexer): a CUDA synchronize
// made on one is never a host sync of the training loop. The activity trace tags each sync record
// with the thread that made the call (CUPTI's callback on the call, matched by correlation id);
// gpu_step_stats drops these. Internal to hooks/.
#pragma once

#include <pthread.h>

#include "torchpilot/runtime/cost/cost.h"

namespace torchpilot {
namespace detail {

inline thread_local bool t_own_thread = false;

// Called first thing on each thread torchpilot starts; its CPU time then counts as torchpilot's
// (the epoch summary's "cost" section). `name` (15 characters at most, "tp-..." by convention)
// is what top -H, perf and /proc/<pid>/task/*/comm show for the thread.
inline void mark_own_thread(const char* name) {
  t_own_thread = true;
  register_own_thread();
  pthread_setname_np(pthread_self(), name);  // a failure only leaves the process's name
}
inline bool on_own_thread() { return t_own_thread; }

}  // namespace detail
}  // namespace torchpilot
