// ActivationOffload's shared state and the seams between torch_activation_offload.cpp (the
// engine, its installation, the configuration, knob and scopes) and torch_offload_hooks.cpp (the
// saved-tensor hooks' pack and unpack, prefetch, and the movers that copy storages out and back).
// Private to hooks/memory.
#pragma once

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "torchpilot/hooks/memory/activation_offload.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#define TORCHPILOT_OFFLOAD_CUDA 1
#else
#define TORCHPILOT_OFFLOAD_CUDA 0
#endif

namespace torchpilot {

namespace offload_internal {

struct Entry;  // one offloaded storage (torch_offload_hooks.cpp)
class Mover;   // where a storage goes and how it comes back (torch_offload_hooks.cpp)

// Copies into other host buffers (`host_copies`: tests on the CPU build, failing when asked), or
// on CUDA side streams; null for CUDA in a build without it.
std::shared_ptr<Mover> make_mover(bool host_copies, bool failing_copies);

// The offloading hooks for one saved tensor.
std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks(
    std::shared_ptr<ActivationOffload::State> state);

// An error's message on one line (c10::Error without its backtrace).
std::string one_line(const std::exception& e);

}  // namespace offload_internal

struct ActivationOffload::State : std::enable_shared_from_this<State> {
  using Entry = offload_internal::Entry;
  using Mover = offload_internal::Mover;

  std::shared_ptr<Mover> mover;
  int64_t min_bytes = 1 << 20;
  int depth = 4;
  std::atomic<bool> refused{false};
  LogFn log;

  std::mutex mutex;  // everything below
  uint64_t next_seq = 0;
  std::map<uint64_t, std::weak_ptr<Entry>> live;  // by save order
  std::map<std::pair<const void*, int>, std::weak_ptr<Entry>> by_storage;
  std::deque<std::weak_ptr<Entry>> resident;  // copies not yet settled, oldest first
  size_t pruned_at = 0;
  OffloadStats stats;
  int64_t large_movable = 0, large_other = 0;  // for the CPU-model judgement
  bool judged = false;
  bool offload_failed = false;  // logged once

  // Forget entries that are gone (amortized: when the maps doubled since the last pass).
  void prune() {
    if (live.size() < 2 * pruned_at + 64) return;
    for (auto it = live.begin(); it != live.end();)
      it = it->second.expired() ? live.erase(it) : ++it;
    for (auto it = by_storage.begin(); it != by_storage.end();) {
      it = it->second.expired() ? by_storage.erase(it) : ++it;
    }
    pruned_at = live.size();
  }

  // Settles resident copies beyond `keep` (oldest first).
  void settle_beyond(size_t keep);
};

}  // namespace torchpilot
