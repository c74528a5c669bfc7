// watch(): measure a stock LibTorch DataLoader without changing it (advice only, no tuning).
//
//   auto loader = torch::data::make_data_loader(dataset, options);
//   for (auto& batch : torchpilot::watch(*loader, pilot)) { auto step = pilot.step(); ... }
//
// Each wait for a batch (the first one included) is reported to the pilot as data wait; the end
// of the iteration ends the pilot's epoch. Thread-safety: as the wrapped loader (one thread).
// Failure behaviour: exceptions from the loader pass through unchanged.
#pragma once

#include <torch/data/iterator.h>

#include <atomic>
#include <thread>
#include <type_traits>
#include <utility>

#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/loader/loader_probe.h"

namespace torchpilot {

template <typename Loader>
class WatchedLoader final : public LoaderProbe {
 public:
  using Batch = typename Loader::BatchType;
  using Inner = torch::data::Iterator<Batch>;

  WatchedLoader(Loader& loader, Pilot& pilot) : loader_(loader), pilot_(&pilot) {
    attach_loader(pilot, this, {});
  }
  ~WatchedLoader() override {
    if (pilot_ != nullptr) detach_loader(*pilot_, this);
  }
  WatchedLoader(const WatchedLoader&) = delete;
  WatchedLoader& operator=(const WatchedLoader&) = delete;

  class Iterator {
   public:
    Batch& operator*() { return *inner_; }
    Batch* operator->() { return &*inner_; }
    Iterator& operator++() {
      owner_->timed([&] {
        ++inner_;
        return inner_ == end_;  // the stock iterator fetches lazily: force it inside the timer
      });
      return *this;
    }
    bool operator!=(const Iterator& other) const { return !(inner_ == other.inner_); }
    bool operator==(const Iterator& other) const { return inner_ == other.inner_; }

   private:
    friend class WatchedLoader;
    Iterator(WatchedLoader* owner, Inner inner, Inner end)
        : owner_(owner), inner_(std::move(inner)), end_(std::move(end)) {}
    WatchedLoader* owner_;
    Inner inner_;
    Inner end_;
  };

  Iterator begin() {
    std::optional<Inner> first;
    timed([&] {
      first.emplace(loader_.begin());
      return *first == loader_.end();
    });
    return Iterator(this, std::move(*first), loader_.end());
  }
  Iterator end() { return Iterator(this, loader_.end(), loader_.end()); }

  LoaderStats stats() const override {
    LoaderStats s;
    s.name = "watched";
    // Read once: glibc reads /sys for it (tens of microseconds at every epoch's end).
    static const int cpus = static_cast<int>(std::thread::hardware_concurrency());
    s.max_workers = cpus;
    read_options(loader_, s, 0);
    s.batches = batches_.load(std::memory_order_relaxed);
    s.blocked_count = s.batches;
    s.wait_ns = wait_ns_.load(std::memory_order_relaxed);
    return s;
  }
  void forget_pilot() override { pilot_ = nullptr; }

 private:
  // The stock loader's options (torch::data::DataLoaderBase::options(), the same in LibTorch
  // 1.13 and 2.x; timeout is c10::optional there, std::optional here: both read alike). Another
  // loader type: unknown.
  template <typename L>
  static auto read_options(const L& loader, LoaderStats& s, int)
      -> decltype((void)loader.options().max_jobs, void()) {
    const auto& o = loader.options();
    s.settings_known = true;
    s.settings.workers = static_cast<int>(o.workers);
    s.settings.prefetch = o.workers > 0 ? static_cast<int>(o.max_jobs / o.workers) : 1;
    s.batch_size = static_cast<int64_t>(o.batch_size);
    s.max_jobs = static_cast<int64_t>(o.max_jobs);
    s.timeout_ms = o.timeout.has_value() ? static_cast<int64_t>(o.timeout->count()) : 0;
  }
  template <typename L>
  static void read_options(const L&, LoaderStats& s, long) {
    s.settings_known = false;
  }

  // Runs one fetch, reports its wait, and ends the pilot's epoch when the loader is exhausted.
  template <typename Fetch>
  void timed(Fetch&& fetch) {
    const Nanos start = pilot_ != nullptr ? pilot_->clock().now_ns() : 0;
    const bool exhausted = fetch();
    if (pilot_ == nullptr) return;
    const Nanos waited = pilot_->clock().now_ns() - start;
    if (exhausted) {
      pilot_->end_epoch();
      return;
    }
    batches_.fetch_add(1, std::memory_order_relaxed);
    wait_ns_.fetch_add(waited, std::memory_order_relaxed);
    pilot_->record_data_wait(waited);
  }

  Loader& loader_;
  Pilot* pilot_;
  std::atomic<int64_t> batches_{0};
  std::atomic<Nanos> wait_ns_{0};
};

// Wraps `loader` (a torch::data DataLoader, e.g. *make_data_loader(...)) for one pilot.
template <typename Loader>
WatchedLoader<Loader> watch(Loader& loader, Pilot& pilot) {
  return WatchedLoader<Loader>(loader, pilot);
}

}  // namespace torchpilot
