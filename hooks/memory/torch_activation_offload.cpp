// Activation offloading through autograd's default saved-tensor hooks (activation_offload.h;
// docs/offload.md).
//
// The engine: LibTorch's SavedVariable asks Engine::get_default_engine() for default hooks each
// time a tensor is saved for backward (1.13 and 2.x alike). OffloadEngine is LibTorch's Engine
// with only that one virtual overridden; it is made once, never destroyed (the engine's threads
// outlive static destruction, as LibTorch's Python engine does), and installed with
// set_default_engine_stub. It returns hooks only while a scope is open on the calling thread.
//
// The hooks (pack, unpack, prefetch) and the movers that copy storages out and back are in
// torch_offload_hooks.cpp; this file holds the engine and the ActivationOffload around them.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <typeinfo>
#include <utility>

#include "activation_offload_internal.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {

namespace detail {

OffloadDecision decide_offload(const SavedTensorFacts& facts, int64_t min_bytes) {
  if (!facts.movable) return OffloadDecision::kOther;
  if (facts.parameter) return OffloadDecision::kParameter;
  if (facts.storage_bytes < min_bytes) return OffloadDecision::kSmall;
  return OffloadDecision::kOffload;
}

bool is_view_or_cast_node(const std::string& name) {
  static const char* const kNames[] = {
      "ToCopyBackward0",  "TBackward0",          "TransposeBackward0",
      "PermuteBackward0", "ViewBackward0",       "ExpandBackward0",
      "AliasBackward0",   "UnsafeViewBackward0", "ReshapeAliasBackward0"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

std::vector<uint64_t> prefetch_order(uint64_t current, const std::vector<uint64_t>& candidates,
                                     int depth) {
  std::vector<uint64_t> before;
  for (uint64_t c : candidates) {
    if (c < current) before.push_back(c);
  }
  std::sort(before.begin(), before.end(), std::greater<uint64_t>());
  if (depth < 0) depth = 0;
  if (before.size() > static_cast<size_t>(depth)) before.resize(static_cast<size_t>(depth));
  return before;
}

}  // namespace detail

namespace offload_internal {

// An error's message on one line (c10::Error without its backtrace).
std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  const size_t newline = m.find('\n');
  return newline == std::string::npos ? m : m.substr(0, newline);
}

}  // namespace offload_internal

namespace {

using offload_internal::one_line;

thread_local ActivationOffload::State* tl_state = nullptr;

class OffloadEngine final : public torch::autograd::Engine {
 public:
  OffloadEngine() = default;
  ~OffloadEngine() override { stop(); }

  // LibTorch 2.x starts the device threads once per process, not per engine (a function-local
  // static in initialize_device_threads_pool): when LibTorch's own engine ran a backward before
  // this one was installed, this engine has no device queues and a CUDA backward fails an
  // internal assert. Such an engine adopts the threads (queues and reentrant pool) that did start.
  c10::intrusive_ptr<at::ivalue::Future> execute_with_graph_task(
      const std::shared_ptr<torch::autograd::GraphTask>& graph_task,
      std::shared_ptr<torch::autograd::Node> graph_root,
      torch::autograd::InputBuffer&& input_buffer) override {
    initialize_device_threads_pool();
    std::call_once(adopted_, [this] { adopt_started_threads(); });
    return Engine::execute_with_graph_task(graph_task, std::move(graph_root),
                                           std::move(input_buffer));
  }
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    ActivationOffload::State* s = tl_state;
    if (s == nullptr) return nullptr;
    return offload_internal::make_hooks(s->shared_from_this());
  }

 private:
  void adopt_started_threads() {
    // Pointers to protected members, applied to the base engine (protected access is per class).
    auto queues = &OffloadEngine::device_ready_queues_;
    auto pool = &OffloadEngine::thread_pool_shared_;
    Engine& base = Engine::get_base_engine();
    if (&base == this) return;
    if ((this->*queues).empty() && !(base.*queues).empty()) this->*queues = base.*queues;
    if (!(this->*pool) && (base.*pool)) this->*pool = base.*pool;
  }

  std::once_flag adopted_;
};

torch::autograd::Engine& offload_engine() {
  static OffloadEngine* engine = new OffloadEngine();  // never destroyed: see the top
  return *engine;
}

// Installs the engine once per process; "" when it is (or was) installed, else why not.
std::string install_engine() {
  static std::once_flag once;
  static std::string problem;
  std::call_once(once, [] {
    try {
      torch::autograd::Engine& current = torch::autograd::Engine::get_default_engine();
      if (typeid(current) != typeid(torch::autograd::Engine)) {
        problem = std::string("another autograd engine is installed (") + typeid(current).name() +
                  ", e.g. Python's); its saved-tensor hooks are left alone";
        return;
      }
      torch::autograd::set_default_engine_stub(&offload_engine);
    } catch (const std::exception& e) {
      problem = "installing the autograd engine failed: " + one_line(e);
    }
  });
  return problem;
}

std::string cuda_problem() {
#if TORCHPILOT_OFFLOAD_CUDA
  try {
    if (!torch::cuda::is_available()) return "no CUDA device is visible";
  } catch (const std::exception& e) {
    return "CUDA is not usable: " + one_line(e);
  }
  return {};
#else
  return "this LibTorch has no CUDA (a CPU build)";
#endif
}

void log_stderr(LogLevel, const std::string& message) {
  std::fprintf(stderr, "torchpilot: %s\n", message.c_str());
}

}  // namespace

// ------------------------------------------------------------------------------------------------

ActivationOffload::ActivationOffload(Pilot& pilot)
    : ActivationOffload(
          OffloadOptions{pilot.config().offload.enabled, pilot.config().offload.min_bytes,
                         pilot.config().offload.depth},
          [p = &pilot](LogLevel level, const std::string& m) { p->log(level, m); }) {
  if (available()) {
    pilot_ = &pilot;
    pilot.knobs().add(knob());
  }
}

ActivationOffload::ActivationOffload(OffloadOptions options, LogFn log)
    : options_(options), log_(log ? std::move(log) : LogFn(&log_stderr)) {
  init(/*host_copies=*/false);
}

ActivationOffload::ActivationOffload(OffloadOptions options, LogFn log, TestTag tag)
    : options_(options), log_(log ? std::move(log) : LogFn(&log_stderr)) {
  init(/*host_copies=*/true, tag.failing_copies);
}

std::unique_ptr<ActivationOffload> ActivationOffload::for_testing_host_copies(
    OffloadOptions options, LogFn log, bool failing_copies) {
  return std::unique_ptr<ActivationOffload>(
      new ActivationOffload(options, std::move(log), TestTag{failing_copies}));
}

void ActivationOffload::init(bool host_copies, bool failing_copies) {
  enabled_ = options_.enabled;
  state_ = std::make_shared<State>();
  state_->min_bytes = std::max<int64_t>(options_.min_bytes, 1);
  state_->depth = std::max(options_.depth, 0);
  state_->log = log_;
  std::string problem = host_copies ? std::string() : cuda_problem();
  if (problem.empty()) problem = install_engine();
  if (problem.empty()) state_->mover = offload_internal::make_mover(host_copies, failing_copies);
  reason_ = problem;
  if (options_.enabled) log_refusal();
}

void ActivationOffload::log_refusal() {
  if (available() || refusal_logged_) return;
  refusal_logged_ = true;
  log_(LogLevel::kWarn,
       "activation offloading refused: " + reason_ + "; training goes on without it");
}

ActivationOffload::~ActivationOffload() {
  if (pilot_ != nullptr) pilot_->knobs().remove_prefix("offload.");
}

bool ActivationOffload::available() const { return state_->mover != nullptr; }
std::string ActivationOffload::unavailable_reason() const { return reason_; }
bool ActivationOffload::refused() const { return !available() || state_->refused.load(); }

void ActivationOffload::set_enabled(bool enabled) {
  if (enabled) log_refusal();
  enabled_ = enabled;
}

bool ActivationOffload::enabled() const { return enabled_ && !refused(); }

Knob ActivationOffload::knob() {
  Knob k;
  k.name = "offload.enabled";
  k.domain = {0, 1};
  k.get = [this] { return int64_t{enabled_ ? 1 : 0}; };
  k.set = [this](int64_t v) { set_enabled(v != 0); };
  return k;
}

OffloadStats ActivationOffload::stats() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

void ActivationOffload::reset_stats() {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  state_->stats = OffloadStats{};
}

ActivationOffload::Scope ActivationOffload::scope() {
  return Scope(enabled() ? static_cast<void*>(state_.get()) : nullptr);
}

ActivationOffload::Scope::Scope(void* state) : state_(state), previous_(tl_state) {
  tl_state = static_cast<State*>(state);
}

ActivationOffload::Scope::Scope(Scope&& other) noexcept
    : state_(other.state_), previous_(other.previous_), active_(other.active_) {
  other.active_ = false;
}

ActivationOffload::Scope::~Scope() {
  if (!active_) return;
  tl_state = static_cast<State*>(previous_);
  auto* s = static_cast<State*>(state_);
  if (s == nullptr) return;
  // A CPU model: the first scope that saw large tensors saw none the mover takes.
  std::string line;
  {
    const std::lock_guard<std::mutex> lock(s->mutex);
    if (!s->judged && (s->large_movable > 0 || s->large_other > 0)) {
      s->judged = true;
      if (s->large_movable == 0) {
        s->refused = true;
        line =
            "activation offloading refused: the saved activations are not on a GPU (a CPU "
            "model); nothing is offloaded and later scopes do nothing";
      }
    }
  }
  if (!line.empty() && s->log) s->log(LogLevel::kWarn, line);
}

}  // namespace torchpilot