// Activation offloading through autograd's default saved-tensor hooks (activation_offload.h;
// docs/offload.md).
//
// The engine: LibTorch's SavedVariable asks Engine::get_default_engine() for default hooks each
// time a tensor is saved for backward (1.13 and 2.x alike). OffloadEngine is LibTorch's Engine
// with only that one virtual overridden; it is made once, never destroyed (the engine's threads
// outlive static destruction, as LibTorch's Python engine does), and installed with
// set_default_engine_stub. It returns hooks only while a scope is open on the calling thread.
//
// The mover: where a storage goes and how it comes back. CudaMover copies on two side streams
// per device (to the host, to the device); HostCopyMover copies CPU storages into other host
// buffers (tests on the CPU build: the same hooks and bookkeeping without a GPU).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <typeinfo>
#include <utility>

#include "torchpilot/hooks/memory/activation_offload.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define TORCHPILOT_OFFLOAD_CUDA 1
#else
#define TORCHPILOT_OFFLOAD_CUDA 0
#endif

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

namespace {

// One offloaded storage (shared by every saved tensor that views it).
struct Entry;

class Mover {
 public:
  virtual ~Mover() = default;
  virtual bool movable(const at::Tensor& t) const = 0;
  // Starts the copy of `flat` (the whole storage) into e.host; e.src keeps `flat` resident.
  virtual void offload(Entry& e, const at::Tensor& flat) = 0;
  // The copy must finish before e.src's memory is reused; then e.src is dropped.
  virtual void settle(Entry& e) = 0;
  // Starts the copy back into e.dev.
  virtual void fetch(Entry& e) = 0;
  // The calling thread's current stream waits for the copy back.
  virtual void consume(Entry& e) = 0;
  // Before the entry's tensors go: copies still running keep their memory safe.
  virtual void release(Entry& e) noexcept = 0;
};

struct MoverData {
  virtual ~MoverData() = default;
};

struct Entry {
  uint64_t seq = 0;
  int64_t bytes = 0;
  at::ScalarType dtype = at::kFloat;
  uint32_t version = 0;                               // of the saved tensor at the copy
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // keeps the storage's address from reuse
  at::Tensor src;   // resident: the original storage, flat, until settled
  at::Tensor host;  // the copy on the host
  at::Tensor dev;   // the copy back
  bool fetched = false;
  std::unique_ptr<MoverData> data;
  std::shared_ptr<Mover> mover;

  explicit Entry(c10::weak_intrusive_ptr<c10::StorageImpl> s) : storage(std::move(s)) {}
  ~Entry() {
    if (mover) mover->release(*this);
  }
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  // The storage as the saved tensor saw it, resident or fetched.
  const at::Tensor& on_device() const { return src.defined() ? src : dev; }
};

class HostCopyMover final : public Mover {
 public:
  explicit HostCopyMover(bool failing) : failing_(failing) {}
  bool movable(const at::Tensor& t) const override { return t.device().is_cpu(); }
  void offload(Entry& e, const at::Tensor& flat) override {
    if (failing_) throw std::runtime_error("no pinned memory left (a test's failing copies)");
    e.host = flat.clone();
    e.src = flat;
  }
  void settle(Entry& e) override { e.src = at::Tensor(); }
  void fetch(Entry& e) override { e.dev = e.host.clone(); }
  void consume(Entry&) override {}
  void release(Entry&) noexcept override {}

 private:
  bool failing_;
};

#if TORCHPILOT_OFFLOAD_CUDA

struct CudaData final : MoverData {
  c10::DeviceIndex device = 0;
  std::optional<c10::cuda::CUDAStream> src_stream;  // where the original was made and is freed
  std::optional<c10::cuda::CUDAStream> dev_stream;  // where the copy back was allocated
  at::cuda::CUDAEvent to_host;                      // the copy to the host is done
  at::cuda::CUDAEvent to_device;                    // the copy back is done
};

class CudaMover final : public Mover {
 public:
  bool movable(const at::Tensor& t) const override { return t.is_cuda(); }

  void offload(Entry& e, const at::Tensor& flat) override {
    auto d = std::make_unique<CudaData>();
    d->device = flat.device().index();
    const c10::cuda::CUDAGuard guard(d->device);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(d->device);
    const c10::cuda::CUDAStream side = side_stream(to_host_, d->device);
    // The copy starts once the op that made the tensor has run.
    at::cuda::CUDAEvent produced;
    produced.record(compute);
    produced.block(side);
    e.host = at::empty({flat.numel()},
                       at::TensorOptions().dtype(flat.scalar_type()).pinned_memory(true));
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      e.host.copy_(flat, /*non_blocking=*/true);  // also keeps the pinned block until it is done
    }
    d->to_host.record(side);
    d->src_stream = compute;
    e.src = flat;
    e.data = std::move(d);
  }

  void settle(Entry& e) override {
    auto& d = static_cast<CudaData&>(*e.data);
    const c10::cuda::CUDAGuard guard(d.device);
    // Compute waits (on the GPU) for the copy; then the memory can go back to compute's pool,
    // whose later users are ordered after this wait.
    d.to_host.block(*d.src_stream);
    e.src = at::Tensor();
  }

  void fetch(Entry& e) override {
    auto& d = static_cast<CudaData&>(*e.data);
    const c10::cuda::CUDAGuard guard(d.device);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(d.device);
    const c10::cuda::CUDAStream side = side_stream(to_device_, d.device);
    // Allocated on the consumer's stream, so that it is freed in that stream's order; the copy
    // waits for what that stream was doing with the memory before, and for the copy out.
    e.dev = at::empty(
        {e.host.numel()},
        at::TensorOptions().dtype(e.host.scalar_type()).device(at::Device(at::kCUDA, d.device)));
    at::cuda::CUDAEvent allocated;
    allocated.record(compute);
    allocated.block(side);
    d.to_host.block(side);
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      e.dev.copy_(e.host, /*non_blocking=*/true);
    }
    d.to_device.record(side);
    d.dev_stream = compute;
  }

  void consume(Entry& e) override {
    auto& d = static_cast<CudaData&>(*e.data);
    const c10::cuda::CUDAGuard guard(d.device);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(d.device);
    d.to_device.block(current);
    if (d.dev_stream && current != *d.dev_stream) e.dev.record_stream(current);
  }

  void release(Entry& e) noexcept override {
    try {
      if (!e.data) return;
      auto& d = static_cast<CudaData&>(*e.data);
      const c10::cuda::CUDAGuard guard(d.device);
      if (e.src.defined() && d.src_stream) d.to_host.block(*d.src_stream);
      if (e.dev.defined() && d.dev_stream) d.to_device.block(*d.dev_stream);
    } catch (...) {  // nothing to do at this point; the streams keep their order
    }
  }

 private:
  using Streams = std::vector<std::optional<c10::cuda::CUDAStream>>;
  c10::cuda::CUDAStream side_stream(Streams& streams, c10::DeviceIndex device) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto i = static_cast<size_t>(device);
    if (streams.size() <= i) streams.resize(i + 1);
    if (!streams[i]) streams[i] = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
    return *streams[i];
  }

  std::mutex mutex_;
  Streams to_host_, to_device_;
};

#endif

}  // namespace

// ------------------------------------------------------------------------------------------------

struct ActivationOffload::State : std::enable_shared_from_this<State> {
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
  void settle_beyond(size_t keep) {
    while (resident.size() > keep) {
      std::shared_ptr<Entry> e = resident.front().lock();
      resident.pop_front();
      if (e && e->src.defined()) mover->settle(*e);
    }
  }
};

namespace {

thread_local ActivationOffload::State* tl_state = nullptr;

// An error's message on one line (c10::Error without its backtrace).
std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  const size_t newline = m.find('\n');
  return newline == std::string::npos ? m : m.substr(0, newline);
}

// A parameter, or a view / cast of one (the weight's t() in linear, autocast's bf16 copy).
bool parameter_derived(const at::Tensor& t) {
  if (t.is_leaf()) return t.requires_grad();
  const torch::autograd::Node* fn = t.grad_fn().get();
  for (int hops = 0; fn != nullptr && hops < 4; ++hops) {
    if (!detail::is_view_or_cast_node(fn->name())) return false;
    const torch::autograd::Node* next = nullptr;
    for (const auto& edge : fn->next_edges()) {
      if (!edge.is_valid()) continue;
      if (next != nullptr) return false;  // more than one input: not a plain view or cast
      next = edge.function.get();
    }
    if (next == nullptr) return false;
    if (dynamic_cast<const torch::autograd::AccumulateGrad*>(next) != nullptr) return true;
    fn = next;
  }
  return false;
}

class OffloadHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit OffloadHooks(std::shared_ptr<ActivationOffload::State> state)
      : state_(std::move(state)) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    State& s = *state_;
    detail::SavedTensorFacts facts;
    const bool strided = tensor.defined() && tensor.layout() == at::kStrided &&
                         tensor.has_storage() && !tensor.is_quantized();
    facts.movable = strided && s.mover->movable(tensor);
    if (strided) facts.storage_bytes = static_cast<int64_t>(tensor.storage().nbytes());
    const int64_t itemsize = strided ? static_cast<int64_t>(tensor.element_size()) : 1;
    if (facts.movable && facts.storage_bytes >= s.min_bytes)
      facts.parameter = parameter_derived(tensor);
    auto decision = detail::decide_offload(facts, s.min_bytes);
    if (decision == detail::OffloadDecision::kOffload && facts.storage_bytes % itemsize != 0) {
      decision = detail::OffloadDecision::kOther;  // a storage that is not whole elements
    }
    version_.emplace(tensor.unsafeGetTensorImpl()->version_counter());
    saved_version_ = version_->current_version();

    std::shared_ptr<Entry> retired;  // released outside the lock
    const std::lock_guard<std::mutex> lock(s.mutex);
    ++s.stats.saved;
    if (strided && facts.storage_bytes >= s.min_bytes) {
      ++(facts.movable ? s.large_movable : s.large_other);
    }
    switch (decision) {
      case detail::OffloadDecision::kSmall:
        ++s.stats.kept_small;
        break;
      case detail::OffloadDecision::kParameter:
        ++s.stats.kept_parameter;
        break;
      case detail::OffloadDecision::kOther:
        ++s.stats.kept_other;
        break;
      case detail::OffloadDecision::kOffload:
        break;
    }
    if (decision != detail::OffloadDecision::kOffload) {
      // No autograd metadata: holding the tensor itself would make a cycle through its grad_fn.
      kept_ = tensor.detach();
      return;
    }
    sizes_ = tensor.sizes().vec();
    strides_ = tensor.strides().vec();
    offset_ = tensor.storage_offset();
    const std::pair<const void*, int> key(tensor.storage().unsafeGetStorageImpl(),
                                          static_cast<int>(tensor.scalar_type()));
    auto found = s.by_storage.find(key);
    if (found != s.by_storage.end()) {
      std::shared_ptr<Entry> e = found->second.lock();
      if (e && e->version == saved_version_) {
        entry_ = std::move(e);
        ++s.stats.shared;
        return;
      }
      retired = std::move(e);
    }
    auto e = std::make_shared<Entry>(tensor.storage().getWeakStorageImpl());
    e->seq = s.next_seq++;
    e->bytes = facts.storage_bytes;
    e->dtype = tensor.scalar_type();
    e->version = saved_version_;
    e->mover = s.mover;
    try {
      const at::Tensor flat = tensor.detach().as_strided({facts.storage_bytes / itemsize}, {1}, 0);
      s.mover->offload(*e, flat);
    } catch (const std::exception& ex) {
      // No pinned memory left, a CUDA error: this tensor stays on the GPU, forward goes on.
      ++s.stats.kept_other;
      kept_ = tensor.detach();
      if (!s.offload_failed && s.log) {
        s.offload_failed = true;
        s.log(LogLevel::kWarn,
              "activation offloading: copying a saved tensor to the host failed (" + one_line(ex) +
                  "); such tensors stay on the GPU");
      }
      return;
    }
    ++s.stats.offloaded;
    s.stats.offloaded_bytes += facts.storage_bytes;
    s.prune();
    s.live[e->seq] = e;
    s.by_storage[key] = e;
    s.resident.push_back(e);
    s.settle_beyond(static_cast<size_t>(s.depth));
    entry_ = std::move(e);
  }

  at::Tensor call_unpack_hook() override {
    check_version();
    if (!entry_) return kept_;
    State& s = *state_;
    const at::NoGradGuard no_grad;
    std::vector<std::shared_ptr<Entry>> hold;  // released outside the lock
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      // Backward has begun: copies still resident behind forward stay resident (used as they
      // are); nothing more is settled.
      if (entry_->src.defined()) {
        ++s.stats.resident;
      } else {
        if (!entry_->fetched) {
          s.mover->fetch(*entry_);  // a CUDA out-of-memory here is backward's own
          entry_->fetched = true;
          ++s.stats.fetched;
          ++s.stats.fetched_late;
        }
        s.mover->consume(*entry_);
      }
      prefetch(s, hold);
    }
    return entry_->on_device().as_strided(sizes_, strides_, offset_);
  }

 private:
  using State = ActivationOffload::State;

  // The entries saved just before this one come back while this one is used.
  void prefetch(State& s, std::vector<std::shared_ptr<Entry>>& hold) {
    if (s.depth <= 0) return;
    std::vector<uint64_t> candidates;
    auto it = s.live.find(entry_->seq);
    if (it == s.live.end()) return;
    // Walk down from this entry: the nearest earlier live entries that need a fetch.
    int hops = 0;
    while (it != s.live.begin() && candidates.size() < static_cast<size_t>(s.depth) &&
           hops++ < 8 * s.depth + 16) {
      --it;
      std::shared_ptr<Entry> e = it->second.lock();
      if (!e || e->src.defined() || e->fetched) continue;
      candidates.push_back(e->seq);
      hold.push_back(std::move(e));
    }
    for (uint64_t seq : detail::prefetch_order(entry_->seq, candidates, s.depth)) {
      const auto found = s.live.find(seq);
      std::shared_ptr<Entry> e = found == s.live.end() ? nullptr : found->second.lock();
      if (!e) continue;
      try {
        s.mover->fetch(*e);
        e->fetched = true;
        ++s.stats.fetched;
      } catch (...) {  // out of memory ahead of time: fetch when needed instead
        e->dev = at::Tensor();
        break;
      }
    }
  }

  void check_version() const {
    if (!version_) return;
    const uint32_t now = version_->current_version();
    TORCH_CHECK(now == saved_version_,
                "one of the variables needed for gradient computation has been modified by an "
                "inplace operation (while its activation was offloaded by torchpilot): it is at "
                "version ",
                now, "; expected version ", saved_version_, " instead.");
  }

  std::shared_ptr<State> state_;
  at::Tensor kept_;
  std::shared_ptr<Entry> entry_;
  std::vector<int64_t> sizes_, strides_;
  int64_t offset_ = 0;
  std::optional<c10::VariableVersion> version_;
  uint32_t saved_version_ = 0;
};

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
    return std::make_unique<OffloadHooks>(s->shared_from_this());
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
  if (problem.empty()) {
    if (host_copies) {
      state_->mover = std::make_shared<HostCopyMover>(failing_copies);
    } else {
#if TORCHPILOT_OFFLOAD_CUDA
      state_->mover = std::make_shared<CudaMover>();
#endif
    }
  }
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
