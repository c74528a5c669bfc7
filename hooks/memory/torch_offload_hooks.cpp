// Activation offloading's saved-tensor hooks (activation_offload_internal.h): pack (what is
// offloaded, storages shared between saved tensors, the copy out, settling resident copies),
// unpack (the copy back, prefetch of the entries saved before) and the movers. Apart from
// torch_activation_offload.cpp because this is the per-tensor path; that file holds the engine
// that hands these hooks out and the configuration around it.
//
// The mover: where a storage goes and how it comes back. CudaMover copies on two side streams
// per device (to the host, to the device); HostCopyMover copies CPU storages into other host
// buffers (tests on the CPU build: the same hooks and bookkeeping without a GPU).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <optional>
#include <stdexcept>
#include <vector>

#include "activation_offload_internal.h"

#if TORCHPILOT_OFFLOAD_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace torchpilot {

namespace offload_internal {

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

// One offloaded storage (shared by every saved tensor that views it).
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

namespace {

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

}  // namespace

std::shared_ptr<Mover> make_mover(bool host_copies, bool failing_copies) {
  if (host_copies) return std::make_shared<HostCopyMover>(failing_copies);
#if TORCHPILOT_OFFLOAD_CUDA
  return std::make_shared<CudaMover>();
#else
  return nullptr;
#endif
}

std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks(
    std::shared_ptr<ActivationOffload::State> state) {
  return std::make_unique<OffloadHooks>(std::move(state));
}

}  // namespace offload_internal

void ActivationOffload::State::settle_beyond(size_t keep) {
  while (resident.size() > keep) {
    std::shared_ptr<Entry> e = resident.front().lock();
    resident.pop_front();
    if (e && e->src.defined()) mover->settle(*e);
  }
}

}  // namespace torchpilot
