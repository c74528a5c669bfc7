// ActivationOffload: the activations autograd saves for backward move to pinned host memory
// during forward, on a side stream overlapped with compute, and come back ahead of backward
// (fetched in reverse order of saving, a few ahead). Gradients are bitwise the same as without
// it: a saved tensor comes back with its dtype, sizes, strides, storage offset and alignment.
//
//   torchpilot::ActivationOffload offload(pilot);       // offload.* keys; knob offload.enabled
//   {
//     auto s = offload.scope();                         // everything saved in here (this thread)
//     loss = criterion(model->forward(x), y);
//   }
//   loss.backward();
//   // per module: auto s = offload.scope(); inside a module's forward, or
//   //             y = offload.run([&] { return block->forward(x); });
//
// How: LibTorch asks the default autograd engine for "default saved-tensor hooks" each time an op
// saves a tensor for backward. ActivationOffload installs, once per process, an engine that is
// LibTorch's own in every other respect and hands out offloading hooks only while a scope of an
// enabled ActivationOffload is open on the calling thread (outside, the hooks are null: training
// code outside scopes is untouched). Installing it must happen before the first backward of the
// process; it is refused (one line) when another engine, such as Python's, is already installed.
//
// What moves: a saved CUDA tensor whose storage holds at least `min_bytes`; the whole storage
// moves once even when several saved tensors view it (q, k and v of one fused projection).
// What stays: smaller tensors, tensors off the GPU, parameters and the views and casts of
// parameters (autocast's bf16 copies of the weights): they stay on the GPU anyway, moving them
// would save nothing.
// Streams: the copy to the host waits (on the GPU) for the op that produced the tensor; at most
// `depth` copies run behind compute, the next save makes compute wait (on the GPU, no host sync)
// for the oldest, and only then is its GPU memory released. In backward the first use of an
// offloaded tensor fetches it and the `depth` saved before it; its consumer waits for the copy
// on the GPU. A tensor still resident (its copy not yet settled) is used as it is.
// An offloaded tensor modified in place after it was saved is reported at backward as autograd
// reports it without offloading (the same error).
//
// Degrade: without LibTorch CUDA or a GPU, or with another autograd engine installed, the
// constructor logs one line (when offloading was asked for) and scopes do nothing. When the first
// scope that saw large tensors saw only CPU tensors (a CPU model), one line says offloading is
// refused and later scopes do nothing. Nothing throws into the training loop except what autograd
// itself would throw (an in-place change of a saved tensor; a CUDA out-of-memory while fetching).
// LibTorch 1.13 and 2.x have the same engine interface; the CPU build (1.13) tests the mechanism
// with host-to-host copies (for_testing_host_copies), the GPU build (2.x) the CUDA path.
//
// Thread-safety: construct, destroy, set_enabled() and the knob on the training thread; scopes on
// any thread (each thread's own); the hooks run on the forward thread (pack) and on autograd's
// threads (unpack) and share the offload's state under a mutex. Close its scopes before it goes;
// a backward after it went still works (the saved tensors keep its state alive).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/knobs.h"
#include "torchpilot/runtime/core/logging.h"

namespace torchpilot {

class Pilot;

struct OffloadOptions {
  bool enabled = true;          // scopes offload; false: they do nothing (until enabled)
  int64_t min_bytes = 1 << 20;  // storages smaller than this stay on the GPU
  int depth = 4;                // copies in flight behind forward; fetches ahead in backward
};

// Counters since construction (or reset_stats()).
struct OffloadStats {
  int64_t saved = 0;            // tensors saved inside enabled scopes
  int64_t offloaded = 0;        // storages copied to the host
  int64_t offloaded_bytes = 0;  // their bytes
  int64_t shared = 0;           // saved tensors that viewed a storage already offloaded
  int64_t kept_small = 0;       // below min_bytes
  int64_t kept_parameter = 0;   // parameters, their views and casts
  int64_t kept_other = 0;       // not a CUDA tensor, not strided, or no storage
  int64_t fetched = 0;          // storages copied back
  int64_t fetched_late = 0;     // of those, fetched only when backward needed them (not ahead)
  int64_t resident = 0;         // uses served from the GPU copy still held (no fetch)
};

class ActivationOffload {
 public:
  using LogFn = std::function<void(LogLevel, const std::string&)>;

  // Options from the Pilot's config (offload.*), logging through the Pilot; adds the knob
  // "offload.enabled" to pilot.knobs() when offloading is available. The Pilot must outlive it.
  explicit ActivationOffload(Pilot& pilot);
  // Without a Pilot; `log` defaults to stderr.
  explicit ActivationOffload(OffloadOptions options = {}, LogFn log = {});
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // For tests on a machine without a GPU: "offloads" CPU tensors by copying their storage into
  // another host buffer and back, through the same hooks, bookkeeping and engine. With
  // `failing_copies` every copy to the host throws (the fallback path).
  static std::unique_ptr<ActivationOffload> for_testing_host_copies(OffloadOptions options,
                                                                    LogFn log = {},
                                                                    bool failing_copies = false);

  // While it lives, tensors saved for backward by ops on this thread are offloaded (when enabled
  // and available). Nests: the innermost scope's offload decides. Move-only.
  class Scope {
   public:
    Scope(Scope&& other) noexcept;
    Scope& operator=(Scope&&) = delete;
    Scope(const Scope&) = delete;
    ~Scope();

   private:
    friend class ActivationOffload;
    explicit Scope(void* state);
    void* state_ = nullptr;     // this scope's offload state; null: inert
    void* previous_ = nullptr;  // the thread's scope state before this one
    bool active_ = true;        // false once moved from
  };
  Scope scope();
  // f() inside a scope: per-module opt-in around a module call.
  template <typename F>
  auto run(F&& f) -> decltype(f()) {
    auto s = scope();
    return f();
  }

  // This process can offload: LibTorch with CUDA, a GPU, the engine installed.
  bool available() const;
  // Why not (empty when available).
  std::string unavailable_reason() const;
  // Refused for a CPU model (see above), or not available.
  bool refused() const;
  void set_enabled(bool enabled);
  bool enabled() const;  // asked for, available and not refused
  // The options it was made with (enabled as asked at construction).
  const OffloadOptions& options() const { return options_; }
  // "offload.enabled", domain {0, 1}: the auto-tuner turns it on where memory limits the
  // micro-batch (docs/offload.md, "In auto-tune"). Takes effect from the next forward.
  Knob knob();

  OffloadStats stats() const;
  void reset_stats();

  struct State;  // shared with the hooks

 private:
  struct TestTag {
    bool failing_copies = false;
  };
  ActivationOffload(OffloadOptions options, LogFn log, TestTag tag);
  void init(bool host_copies, bool failing_copies = false);
  void log_refusal();  // once, when not available

  OffloadOptions options_;
  std::atomic<bool> enabled_{false};
  LogFn log_;
  bool refusal_logged_ = false;
  std::string reason_;      // why not available
  Pilot* pilot_ = nullptr;  // whose knob registry holds offload.enabled
  std::shared_ptr<State> state_;
};

namespace detail {

// The pure decisions, for tests.
enum class OffloadDecision { kOffload, kSmall, kParameter, kOther };
struct SavedTensorFacts {
  bool movable = false;    // accepted by the mover (a strided CUDA tensor with a storage)
  bool parameter = false;  // a leaf requiring grad, or a view/cast chain from one
  int64_t storage_bytes = 0;
};
OffloadDecision decide_offload(const SavedTensorFacts& facts, int64_t min_bytes);
// Autograd nodes that only view or cast their one input (a parameter's t(), autocast's bf16
// copy): followed from a saved tensor to find a parameter behind it.
bool is_view_or_cast_node(const std::string& node_name);
// Which entries to fetch ahead when entry `current` (a save sequence number) is used: up to
// `depth` of the `candidates` (live entries neither resident nor fetched) saved before it, the
// nearest first.
std::vector<uint64_t> prefetch_order(uint64_t current, const std::vector<uint64_t>& candidates,
                                     int depth);

}  // namespace detail
}  // namespace torchpilot
