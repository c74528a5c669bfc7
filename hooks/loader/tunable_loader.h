// TunableLoader: a data loader for any stateless LibTorch batch dataset (typically
// `MyDataset(...).map(torch::data::transforms::Stack<>())`) whose workers, prefetch depth, pinned
// memory and GPU prefetch can change at any batch boundary, mid-epoch, without losing or repeating
// a sample. Attach it to a Pilot and its data wait is measured, its counters explain starvation
// advice, and mode: autotune tunes its knobs during warm-up.
//
//   auto dataset = MyDataset(root).map(torch::data::transforms::Stack<>());
//   torchpilot::TunableLoader loader(std::move(dataset), {.batch_size = 64});
//   loader.attach(pilot);
//   for (int epoch = 0; epoch < n; ++epoch)
//     for (auto& batch : loader) { auto step = pilot.step(batch.data.size(0)); ... }
//
// Each worker thread works on its own copy of the dataset (as LibTorch's loader does): shared
// state inside a dataset must be behind a shared_ptr and thread-safe. Batches arrive in sampler
// order. With device_prefetch, tensors arrive on the GPU, already synchronized with the current
// stream. Batch types understood for pinning and GPU prefetch: at::Tensor, torch::data::Example,
// std::vector of those; other types are delivered as they are.
//
// The end of a loop over the loader ends the attached Pilot's epoch: the epoch running out, or the
// loop left early (a break, an exception).
//
// Thread-safety: iterate, call next() and the setters from one thread. Failure behaviour: a
// dataset exception reaches the caller of next() (or the loop's ++) as DataLoaderError, naming
// the sample; the next call delivers the batch's other samples as a smaller batch, so only the
// failing samples are skipped. To go on after one, use `while (auto b = loader.next())` inside
// try/catch (an exception from the loop's ++ ends a range-for, and the next begin() starts a new
// epoch).
// Destroying the loader mid-epoch finishes batches in production and joins all threads, waiting
// at most LoaderOptions::shutdown_timeout_ms: a dataset call still running then (say, blocked
// for good) is abandoned in its detached thread, the attached Pilot's log says so, and its result
// is dropped when it returns. The datasets are shared with those threads, so an abandoned call
// never sees its dataset destroyed; neither the loader nor the Pilot need outlive it.
// The warnings of the loader (a wait observer that failed, workers abandoned) go to the attached
// Pilot's log, or to the torchpilot logger when none is attached.
#pragma once

#include <torch/data/example.h>

#include <atomic>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/hooks/loader/torch_transfer.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/loader/loader_core.h"
#include "torchpilot/runtime/loader/loader_probe.h"

namespace torchpilot {

// Tensor traversal for pinning and copies. Declared first so the templates see each other.
inline void collect_tensors(at::Tensor& tensor, std::vector<at::Tensor*>& out);
template <typename Data>
void collect_tensors(torch::data::Example<Data, torch::data::example::NoTarget>& example,
                     std::vector<at::Tensor*>& out);
template <typename Data, typename Target>
void collect_tensors(torch::data::Example<Data, Target>& example, std::vector<at::Tensor*>& out);
template <typename T>
void collect_tensors(std::vector<T>& items, std::vector<at::Tensor*>& out);

inline void collect_tensors(at::Tensor& tensor, std::vector<at::Tensor*>& out) {
  out.push_back(&tensor);
}
template <typename Data, typename Target>
void collect_tensors(torch::data::Example<Data, Target>& example, std::vector<at::Tensor*>& out) {
  collect_tensors(example.data, out);
  collect_tensors(example.target, out);
}
template <typename Data>
void collect_tensors(torch::data::Example<Data, torch::data::example::NoTarget>& example,
                     std::vector<at::Tensor*>& out) {
  collect_tensors(example.data, out);
}
template <typename T>
void collect_tensors(std::vector<T>& items, std::vector<at::Tensor*>& out) {
  for (auto& item : items) collect_tensors(item, out);
}

namespace detail {
template <typename T, typename = void>
struct has_tensors : std::false_type {};
template <typename T>
struct has_tensors<T, std::void_t<decltype(collect_tensors(
                          std::declval<T&>(), std::declval<std::vector<at::Tensor*>&>()))>>
    : std::true_type {};
}  // namespace detail

template <typename Dataset>
class TunableLoader final : public LoaderProbe {
 public:
  using Batch = typename Dataset::BatchType;
  static_assert(!Dataset::is_stateful, "TunableLoader needs a stateless (index-based) dataset");
  static constexpr bool kMovable = detail::has_tensors<Batch>::value;

  TunableLoader(Dataset dataset, LoaderOptions options)
      : shared_(std::make_shared<Shared>(std::move(dataset), options.device_index)),
        device_index_(options.device_index),
        core_(
            dataset_size(shared_->prototype), std::move(options),
            // By value: an abandoned worker (see destruction above) may run this after the
            // loader is gone.
            [shared = shared_](const std::vector<size_t>& indices, int worker,
                               const LoaderSettings& s) {
              return produce(*shared, indices, worker, s);
            },
            kMovable && detail::pin_memory_available(),
            kMovable && detail::device_prefetch_available()) {}

  ~TunableLoader() override {
    // Batches still in production are dropped: skip their pinning and GPU copies.
    shared_->closing = true;
    // The Pilot stays in pilot_ (and in the core's warning sink) until core_ is destroyed, so
    // that a warning of its shutdown reaches the Pilot's log.
    if (pilot_ != nullptr) detach_loader(*pilot_, this);
  }
  TunableLoader(const TunableLoader&) = delete;
  TunableLoader& operator=(const TunableLoader&) = delete;

  // Reports waits to the pilot, registers the loader.* knobs, and ends the pilot's epoch when an
  // epoch of this loader is exhausted.
  // Attaching to another pilot detaches from the previous one.
  void attach(Pilot& pilot) {
    if (pilot_ != nullptr && pilot_ != &pilot) detach_loader(*pilot_, this);
    pilot_ = &pilot;
    core_.set_wait_observer([p = &pilot](Nanos ns) { p->record_data_wait(ns); },
                            pilot.shared_clock());
    core_.set_warning_sink(
        [p = &pilot](const std::string& message) { p->log(LogLevel::kWarn, message); });
    attach_loader(pilot, this, make_knobs());
  }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;
    // The iterator begin() returned owns the epoch's loop (a moved-to one takes it over; a copy
    // does not): destroyed before the epoch ran out (a break), it ends the pilot's epoch.
    Iterator(Iterator&& other) noexcept
        : loader_(other.loader_),
          current_(std::move(other.current_)),
          owns_loop_(std::exchange(other.owns_loop_, false)) {}
    Iterator(const Iterator& other)
        : loader_(other.loader_), current_(other.current_), owns_loop_(false) {}
    Iterator& operator=(const Iterator&) = delete;
    Iterator& operator=(Iterator&&) = delete;
    ~Iterator() {
      if (owns_loop_ && loader_ != nullptr) loader_->loop_left();
    }
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      if (!current_) loader_ = nullptr;
      return *this;
    }
    bool operator==(const Iterator& other) const { return loader_ == other.loader_; }
    bool operator!=(const Iterator& other) const { return loader_ != other.loader_; }

   private:
    friend class TunableLoader;
    Iterator(TunableLoader* loader, bool owns_loop) : loader_(loader), owns_loop_(owns_loop) {}
    TunableLoader* loader_;
    std::optional<Batch> current_;
    bool owns_loop_;
  };

  // Starts a new epoch and returns its first batch.
  Iterator begin() {
    start_epoch();
    Iterator it(this, true);
    ++it;
    return it;
  }
  Iterator end() { return Iterator(nullptr, false); }

  void start_epoch() { core_.start_epoch(); }
  // The next batch of the current epoch; nullopt at its end.
  std::optional<Batch> next() {
    std::shared_ptr<void> staged = core_.next();
    if (!staged) {
      if (pilot_ != nullptr) pilot_->end_epoch();
      return std::nullopt;
    }
    auto* s = static_cast<Staged*>(staged.get());
    if constexpr (kMovable) {
      if (s->copy_event) {
        std::vector<at::Tensor*> tensors;
        collect_tensors(s->value, tensors);
        detail::wait_for_copy(s->copy_event, tensors, device_index_);
      }
    }
    return std::move(s->value);
  }

  // A loop over this loader was left before its epoch ran out: the pilot's epoch ends there.
  void loop_left() noexcept {
    if (pilot_ == nullptr) return;
    try {
      pilot_->end_epoch();  // guards what it runs; this keeps a destructor from ever throwing
    } catch (...) {
    }
  }

  void set_workers(int workers) { core_.set_workers(workers); }
  void set_prefetch(int prefetch) { core_.set_prefetch(prefetch); }
  bool set_pin_memory(bool on) { return core_.set_pin_memory(on); }
  bool set_device_prefetch(bool on) { return core_.set_device_prefetch(on); }
  LoaderSettings settings() const { return core_.settings(); }
  LoaderStats stats() const override { return core_.stats(); }
  const LoaderCore& core() const { return core_; }
  size_t batches_per_epoch() const { return core_.batches_per_epoch(); }

 private:
  struct Staged {
    Batch value;
    std::shared_ptr<void> copy_event;  // set when the batch was sent to the GPU ahead of use
  };
  // What the workers use, owned with them: a worker abandoned by the core's bounded shutdown may
  // still be inside a dataset call when the loader is destroyed.
  struct Shared {
    Shared(Dataset dataset, int device)
        : prototype(std::move(dataset)),
          inline_dataset(prototype),
          worker_datasets(LoaderCore::kMaxWorkers),
          device_index(device) {}
    Dataset prototype;
    Dataset inline_dataset;
    std::vector<std::unique_ptr<Dataset>> worker_datasets;
    const int device_index;
    std::atomic<bool> closing{false};  // the loader is being destroyed
  };

  static size_t dataset_size(const Dataset& dataset) {
    auto size = compat::to_std(dataset.size());
    if (!size) throw std::invalid_argument("torchpilot::TunableLoader needs a dataset with a size");
    return *size;
  }

  static Dataset& dataset_for(Shared& shared, int worker) {
    if (worker < 0) return shared.inline_dataset;  // the training thread's own copy
    auto& slot = shared.worker_datasets[static_cast<size_t>(worker)];
    // Only worker `worker` touches its slot; the prototype is never used to produce, so copying
    // it from several threads at once only reads it.
    if (!slot) slot = std::make_unique<Dataset>(shared.prototype);
    return *slot;
  }

  static LoaderCore::Batch produce(Shared& shared, const std::vector<size_t>& indices, int worker,
                                   const LoaderSettings& s) {
    Dataset& dataset = dataset_for(shared, worker);
    auto staged = std::make_shared<Staged>(
        Staged{dataset.get_batch(typename Dataset::BatchRequestType(indices)), nullptr});
    if constexpr (kMovable) {
      if ((s.pin_memory || s.device_prefetch) && !shared.closing.load()) {
        std::vector<at::Tensor*> tensors;
        collect_tensors(staged->value, tensors);
        if (s.pin_memory) detail::pin_tensors(tensors);
        if (s.device_prefetch)
          staged->copy_event = detail::copy_to_device_async(tensors, shared.device_index);
      }
    }
    return staged;
  }

  std::vector<Knob> make_knobs() {
    std::vector<Knob> knobs;
    Knob workers{"loader.workers",
                 {},
                 [this] { return int64_t{core_.settings().workers}; },
                 [this](int64_t v) { core_.set_workers(static_cast<int>(v)); }};
    const int max =
        std::min(LoaderCore::kMaxWorkers, std::max(core_.max_workers(), core_.settings().workers));
    for (int w = 0; w <= max; ++w) workers.domain.push_back(w);
    knobs.push_back(std::move(workers));
    Knob prefetch{"loader.prefetch",
                  {},
                  [this] { return int64_t{core_.settings().prefetch}; },
                  [this](int64_t v) { core_.set_prefetch(static_cast<int>(v)); }};
    for (int p = 1; p <= 64; ++p) prefetch.domain.push_back(p);
    knobs.push_back(std::move(prefetch));
    auto boolean = [](bool available) {
      return available ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0};
    };
    knobs.push_back({"loader.pin_memory", boolean(core_.pin_memory_available()),
                     [this] { return int64_t{core_.settings().pin_memory}; },
                     [this](int64_t v) { core_.set_pin_memory(v != 0); }});
    knobs.push_back({"loader.device_prefetch", boolean(core_.device_prefetch_available()),
                     [this] { return int64_t{core_.settings().device_prefetch}; },
                     [this](int64_t v) { core_.set_device_prefetch(v != 0); }});
    return knobs;
  }

  void forget_pilot() override {
    pilot_ = nullptr;
    core_.set_wait_observer(nullptr, nullptr);
    core_.set_warning_sink(nullptr);
  }

  std::shared_ptr<Shared> shared_;
  int device_index_;
  Pilot* pilot_ = nullptr;
  LoaderCore core_;  // last: destroyed first, while pilot_ is still set
};

}  // namespace torchpilot
