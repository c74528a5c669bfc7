// watch(): measure a stock LibTorch DataLoader without changing it (advice only, no tuning).
//
//   auto loader = torch::data::make_data_loader(dataset, options);
//   for (auto& batch : torchpilot::watch(*loader, pilot)) { auto step = pilot.step(); ... }
//
// Each wait for a batch (the first one included) is reported to the pilot as data wait, and what
// producing the batches costs is measured from outside the loader (stock_loader_meter.h: with
// workers 0 the fetch's CPU time on the training thread; with workers, the process's CPU time less
// the training thread's, read at epoch ends), so starvation advice is sized as a TunableLoader's.
// Construct it (call watch()) on the training thread. The end of
// the loop ends the pilot's epoch: the loader running out, or the loop left early (a break after
// N steps over an endless dataset: the begin() iterator's destruction ends the pass). A watched
// loader made once may be looped over again, each loop an epoch: after a loop left early the
// next one goes on where it stopped (LibTorch's loader refuses a new pass while batches are in
// flight), after one that ran out it starts the loader again.
// Thread-safety: as the wrapped loader (one thread).
// Failure behaviour: exceptions from the loader pass through unchanged; ending a pass never throws.
#pragma once

#include <ATen/Parallel.h>
#include <torch/data/iterator.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/loader/loader_core.h"
#include "torchpilot/runtime/loader/loader_probe.h"
#include "torchpilot/runtime/loader/stock_loader_meter.h"

namespace torchpilot {

template <typename Loader>
class WatchedLoader final : public LoaderProbe {
 public:
  using Batch = typename Loader::BatchType;
  using Inner = torch::data::Iterator<Batch>;

  WatchedLoader(Loader& loader, Pilot& pilot)
      : loader_(loader), pilot_(&pilot), meter_(pilot.clock().now_ns()) {
    LoaderStats s;
    read_options(loader_, s, 0);
    inline_workers_ = s.settings_known && s.settings.workers == 0;
    intra_op_threads_ = at::get_num_threads();
    attach_loader(pilot, this, {});
  }
  ~WatchedLoader() override {
    if (pilot_ != nullptr) detach_loader(*pilot_, this);
  }
  WatchedLoader(const WatchedLoader&) = delete;
  WatchedLoader& operator=(const WatchedLoader&) = delete;

  class Iterator {
   public:
    // The iterator begin() returned owns the pass (a moved-to one takes it over; a copy does
    // not): its destruction before the loader ran out ends the pass.
    Iterator(Iterator&& other) noexcept
        : owner_(other.owner_),
          inner_(std::move(other.inner_)),
          end_(std::move(other.end_)),
          pass_(std::exchange(other.pass_, 0)) {}
    Iterator(const Iterator& other)
        : owner_(other.owner_), inner_(other.inner_), end_(other.end_), pass_(0) {}
    Iterator& operator=(const Iterator&) = delete;
    Iterator& operator=(Iterator&&) = delete;
    ~Iterator() {
      if (pass_ != 0) owner_->pass_left(pass_, inner_);
    }
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
    Iterator(WatchedLoader* owner, Inner inner, Inner end, int64_t pass)
        : owner_(owner), inner_(std::move(inner)), end_(std::move(end)), pass_(pass) {}
    WatchedLoader* owner_;
    Inner inner_;
    Inner end_;
    int64_t pass_;  // the pass this iterator ends when destroyed (0: none)
  };

  Iterator begin() {
    const int64_t pass = ++passes_;
    pass_open_ = true;
    std::optional<Inner> first;
    if (resume_) {
      // The last loop was left at a batch it used: go on from the next one.
      first = std::move(resume_);
      resume_.reset();
      timed([&] {
        ++*first;
        return *first == loader_.end();
      });
    } else {
      timed([&] {
        first.emplace(loader_.begin());
        return *first == loader_.end();
      });
    }
    return Iterator(this, std::move(*first), loader_.end(), pass);
  }
  Iterator end() { return Iterator(this, loader_.end(), loader_.end(), 0); }

  LoaderStats stats() const override {
    LoaderStats s;
    s.name = "watched";
    // Read once, as TunableLoader's count: the CPUs in the process's affinity mask.
    static const int cpus = affinity_cpu_count();
    s.max_workers = cpus;
    s.intra_op_threads = intra_op_threads_;
    read_options(loader_, s, 0);
    s.batches = batches_.load(std::memory_order_relaxed);
    s.blocked_count = s.batches;
    s.wait_ns = wait_ns_.load(std::memory_order_relaxed);
    if (s.settings_known && pilot_ != nullptr) {
      meter_.fill(s, s.settings.workers, s.batches, pilot_->clock().now_ns());
    }
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
    // Workers 0: this thread produces the batch inside the fetch; its CPU time is the batch's.
    const Nanos cpu_start = inline_workers_ && pilot_ != nullptr ? meter_.fetch_begin() : -1;
    const bool exhausted = fetch();
    if (pilot_ == nullptr) return;
    const Nanos waited = pilot_->clock().now_ns() - start;
    if (exhausted) {
      pass_open_ = false;
      pilot_->end_epoch();
      return;
    }
    if (cpu_start >= 0) meter_.fetch_end(cpu_start, waited);
    batches_.fetch_add(1, std::memory_order_relaxed);
    wait_ns_.fetch_add(waited, std::memory_order_relaxed);
    pilot_->record_data_wait(waited);
  }

  // The loop of pass `pass` was left before the loader ran out at `at`: the pilot's epoch ends
  // with it, and the next loop resumes from `at` (a pass begun since, or one that ran out, has
  // nothing to end).
  void pass_left(int64_t pass, Inner& at) noexcept {
    if (pass != passes_ || !pass_open_) return;
    pass_open_ = false;
    try {
      resume_.emplace(std::move(at));
    } catch (...) {  // the stock iterator's move does not throw; if one did: a fresh pass next
    }
    if (pilot_ == nullptr) return;
    try {
      pilot_->end_epoch();  // guards what it runs; this keeps a destructor from ever throwing
    } catch (...) {
    }
  }

  Loader& loader_;
  Pilot* pilot_;
  StockLoaderMeter meter_;
  bool inline_workers_ = false;  // workers 0: batches are produced inside the fetch
  std::optional<Inner> resume_;  // where a loop left early stopped
  int intra_op_threads_ = 0;     // at::get_num_threads() on the training thread, at watch()
  int64_t passes_ = 0;           // begin() calls so far
  bool pass_open_ = false;       // the latest pass has neither run out nor been left
  std::atomic<int64_t> batches_{0};
  std::atomic<Nanos> wait_ns_{0};
};

// Wraps `loader` (a torch::data DataLoader, e.g. *make_data_loader(...)) for one pilot.
template <typename Loader>
WatchedLoader<Loader> watch(Loader& loader, Pilot& pilot) {
  return WatchedLoader<Loader>(loader, pilot);
}

}  // namespace torchpilot
