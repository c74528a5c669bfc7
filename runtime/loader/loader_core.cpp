#include "torchpilot/runtime/loader/loader_core.h"

#include <sched.h>
#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "torchpilot/runtime/core/logging.h"

namespace torchpilot {
namespace {

// CPU time of the calling thread: with wall time it tells CPU-bound loading from I/O waits.
Nanos thread_cpu_ns() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<Nanos>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

// Everything the worker threads touch. Each worker thread holds a shared_ptr to it, so a thread
// abandoned by ~LoaderCore (still inside `produce`) keeps it alive until it ends.
class LoaderCore::Impl : public std::enable_shared_from_this<LoaderCore::Impl> {
 public:
  Impl(size_t dataset_size, LoaderOptions options, Produce produce, bool pin_available,
       bool device_prefetch_available);
  // Not joining anything: every thread was joined or detached by shutdown().
  ~Impl() = default;

  void shutdown();  // ~LoaderCore, consumer thread
  void start_epoch();
  Batch next();
  size_t batches_per_epoch() const;
  int64_t epoch() const;
  void set_workers(int workers);
  void set_prefetch(int prefetch);
  bool set_pin_memory(bool on);
  bool set_device_prefetch(bool on);
  LoaderSettings settings() const;
  LoaderStats stats() const;
  void set_wait_observer(std::function<void(Nanos)> observer, std::shared_ptr<Clock> clock);
  void set_warning_sink(WarningSink sink);

 private:
  struct Result {
    Batch batch;        // with an error: the batch without its failing samples (or null)
    std::string error;  // non-empty: production failed
    std::optional<size_t> failed_sample;  // the first sample that fails on its own
    size_t failed_count = 0;
  };
  struct WorkerSlot {
    std::thread thread;
    bool running = false;
  };

  void worker_loop(int id);
  bool can_claim() const;                                 // under mu_
  std::vector<size_t> batch_indices(size_t batch) const;  // under mu_; batch is a global number
  std::vector<size_t> epoch_order(int64_t epoch) const;
  Result run_produce(const std::vector<size_t>& indices, int worker, const LoaderSettings& s);
  void ensure_workers();  // under mu_
  // Consumer thread only. None of these throws.
  void warn(const std::string& message) noexcept;
  Nanos wait_now(const Clock*& used) noexcept;  // the wait clock's time; `used`: the clock read
  void report_wait(Nanos waited) noexcept;
  void disable_wait_observer(const std::string& what) noexcept;

  const size_t dataset_size_;
  const LoaderOptions options_;
  const Produce produce_;
  const bool pin_available_;
  const bool device_prefetch_available_;
  const int max_workers_;
  std::shared_ptr<Clock> clock_;       // production timing (worker threads)
  std::shared_ptr<Clock> wait_clock_;  // next()'s waits (consumer thread)

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // workers: work may be claimable, or they should exit
  std::condition_variable ready_cv_;  // consumer: a batch became ready
  std::condition_variable exit_cv_;   // shutdown(): a worker left worker_loop
  LoaderSettings settings_;
  bool stopping_ = false;
  std::atomic<bool> stop_requested_{false};  // stopping_, readable without mu_ (retry loop)
  bool started_ = false;                     // an epoch was started: workers may claim
  bool epoch_active_ = false;                // the current epoch has batches left to deliver
  int64_t epoch_ = -1;
  uint64_t generation_ = 0;  // bumps when in-flight batches are dropped; their results are ignored
  // Batch numbers are global: the current epoch is [base_, base_ + batches_per_epoch()), the next
  // one follows. order_ and next_order_ are the two epochs' sample orders.
  size_t base_ = 0;
  std::vector<size_t> order_, next_order_;
  size_t next_claim_ = 0;
  size_t next_deliver_ = 0;
  std::map<size_t, Result> ready_;
  Batch partial_;  // the rest of a failed batch, delivered by the next next()
  std::vector<WorkerSlot> slots_;
  // Consumer thread only (set and called there): no lock.
  std::function<void(Nanos)> wait_observer_;
  WarningSink warning_sink_;

  std::atomic<int64_t> batches_{0}, produce_count_{0}, produce_ns_{0}, produce_cpu_ns_{0},
      blocked_count_{0}, wait_ns_{0};
};

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

LoaderCore::LoaderCore(size_t dataset_size, LoaderOptions options, Produce produce,
                       bool pin_memory_available, bool device_prefetch_available)
    : dataset_size_(dataset_size),
      max_workers_(affinity_cpu_count()),
      pin_available_(pin_memory_available),
      device_prefetch_available_(device_prefetch_available),
      impl_(std::make_shared<Impl>(dataset_size, std::move(options), std::move(produce),
                                   pin_memory_available, device_prefetch_available)) {}

LoaderCore::~LoaderCore() { impl_->shutdown(); }

void LoaderCore::start_epoch() { impl_->start_epoch(); }
LoaderCore::Batch LoaderCore::next() { return impl_->next(); }
size_t LoaderCore::batches_per_epoch() const { return impl_->batches_per_epoch(); }
int64_t LoaderCore::epoch() const { return impl_->epoch(); }
void LoaderCore::set_workers(int workers) { impl_->set_workers(workers); }
void LoaderCore::set_prefetch(int prefetch) { impl_->set_prefetch(prefetch); }
bool LoaderCore::set_pin_memory(bool on) { return impl_->set_pin_memory(on); }
bool LoaderCore::set_device_prefetch(bool on) { return impl_->set_device_prefetch(on); }
LoaderSettings LoaderCore::settings() const { return impl_->settings(); }
LoaderStats LoaderCore::stats() const { return impl_->stats(); }
void LoaderCore::set_wait_observer(std::function<void(Nanos)> observer,
                                   std::shared_ptr<Clock> clock) {
  impl_->set_wait_observer(std::move(observer), std::move(clock));
}
void LoaderCore::set_warning_sink(WarningSink sink) { impl_->set_warning_sink(std::move(sink)); }

LoaderCore::Impl::Impl(size_t dataset_size, LoaderOptions options, Produce produce,
                       bool pin_memory_available, bool device_prefetch_available)
    : dataset_size_(dataset_size),
      options_(std::move(options)),
      produce_(std::move(produce)),
      pin_available_(pin_memory_available),
      device_prefetch_available_(device_prefetch_available),
      max_workers_(affinity_cpu_count()),
      clock_(default_clock()),
      wait_clock_(clock_) {
  if (options_.batch_size == 0) throw std::invalid_argument("torchpilot loader: batch_size is 0");
  if (options_.workers < 0 || options_.workers > kMaxWorkers) {
    throw std::invalid_argument("torchpilot loader: workers must be in [0, " +
                                std::to_string(kMaxWorkers) + "]");
  }
  if (options_.prefetch < 1)
    throw std::invalid_argument("torchpilot loader: prefetch must be >= 1");
  if (options_.shutdown_timeout_ms < 0)
    throw std::invalid_argument("torchpilot loader: shutdown_timeout_ms must be >= 0");
  slots_.resize(kMaxWorkers);
  settings_.workers = options_.workers;
  settings_.prefetch = options_.prefetch;
  settings_.pin_memory = options_.pin_memory && pin_available_;
  settings_.device_prefetch = options_.device_prefetch && device_prefetch_available_;
  const char* why = "needs LibTorch with CUDA, a CUDA device, and tensor batches";
  if (options_.pin_memory && !pin_available_) {
    torchpilot_logger()->warn("loader '{}': pin_memory is off: it {}", options_.name, why);
  }
  if (options_.device_prefetch && !device_prefetch_available_) {
    torchpilot_logger()->warn("loader '{}': device_prefetch is off: it {}", options_.name, why);
  }
}

void LoaderCore::Impl::shutdown() {
  std::vector<std::thread> finished;
  std::map<size_t, Result> dropped;
  Batch dropped_partial;
  int abandoned = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    stop_requested_ = true;
    work_cv_.notify_all();
    // Wait for the batches in production, but not forever: a dataset call may never return.
    const int64_t bound_ms = std::min<int64_t>(options_.shutdown_timeout_ms, int64_t{1} << 40);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(bound_ms);
    exit_cv_.wait_until(lock, deadline, [&] {
      return std::none_of(slots_.begin(), slots_.end(),
                          [](const WorkerSlot& slot) { return slot.running; });
    });
    for (auto& slot : slots_) {
      if (!slot.thread.joinable()) continue;
      if (slot.running) {
        // Still inside `produce`: let it be. The thread owns this Impl too (worker_loop's
        // shared_ptr), so whatever it touches when the call returns is still there; it then sees
        // stopping_, drops the batch and ends.
        slot.thread.detach();
        ++abandoned;
      } else {
        finished.push_back(std::move(slot.thread));  // it has left worker_loop: joins at once
      }
    }
    // Batches made but not delivered go now, on this thread, even if an abandoned thread keeps
    // this Impl alive for a while.
    dropped.swap(ready_);
    dropped_partial = std::move(partial_);
  }
  for (auto& thread : finished) thread.join();
  dropped.clear();
  dropped_partial = nullptr;
  if (abandoned > 0) {
    warn("loader '" + options_.name + "': " + std::to_string(abandoned) + " worker thread" +
         (abandoned == 1 ? " was" : "s were") + " still in a dataset call " +
         std::to_string(options_.shutdown_timeout_ms) +
         " ms after the loader's destruction began (shutdown_timeout_ms); abandoned them: their "
         "threads are detached, their batches will be dropped");
  }
}

size_t LoaderCore::Impl::batches_per_epoch() const {
  const size_t bs = options_.batch_size;
  return options_.drop_last ? dataset_size_ / bs : (dataset_size_ + bs - 1) / bs;
}

int64_t LoaderCore::Impl::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

std::vector<size_t> LoaderCore::Impl::epoch_order(int64_t epoch) const {
  std::vector<size_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), size_t{0});
  if (options_.shuffle) {
    std::mt19937_64 rng(options_.seed + static_cast<uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

void LoaderCore::Impl::start_epoch() {
  std::string warning;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t per_epoch = batches_per_epoch();
    partial_ = nullptr;  // a failed batch's remainder belongs to the epoch being left
    if (started_ && next_deliver_ == base_ + per_epoch) {
      // The last epoch was delivered in full: go on into the next, whose first batches the
      // workers may have produced already (claims run on across the boundary).
      ++epoch_;
      base_ += per_epoch;
      order_ = options_.prefetch_across_epochs ? std::move(next_order_) : epoch_order(epoch_);
    } else {
      // First epoch, or one abandoned part-way: drop everything in flight and start afresh.
      ++generation_;
      ++epoch_;
      ready_.clear();
      base_ = next_claim_;
      next_deliver_ = next_claim_;
      order_ = epoch_order(epoch_);
    }
    next_order_ = options_.prefetch_across_epochs ? epoch_order(epoch_ + 1) : std::vector<size_t>();
    started_ = true;
    epoch_active_ = true;
    try {
      ensure_workers();
    } catch (const std::exception& e) {
      // Fewer workers than asked for (settings_ says how many): load with those, say so once.
      warning = "loader '" + options_.name + "': only " + std::to_string(settings_.workers) +
                " worker threads could be started: " + e.what();
    }
  }
  work_cv_.notify_all();
  if (!warning.empty()) warn(warning);  // not under mu_: the sink is the caller's code
}

bool LoaderCore::Impl::can_claim() const {
  const size_t window =
      static_cast<size_t>(std::max(1, settings_.workers)) * static_cast<size_t>(settings_.prefetch);
  // Claims may run one epoch ahead of the current one (its order is known), never further.
  const size_t per_epoch = batches_per_epoch();
  const size_t limit = base_ + (options_.prefetch_across_epochs ? 2 : 1) * per_epoch;
  return started_ && next_claim_ < limit && next_claim_ < next_deliver_ + window;
}

std::vector<size_t> LoaderCore::Impl::batch_indices(size_t batch) const {
  // Global batch numbers: the current epoch starts at base_, the next one right after it.
  size_t local = batch - base_;
  const std::vector<size_t>* order = &order_;
  if (local >= batches_per_epoch()) {
    local -= batches_per_epoch();
    order = &next_order_;
  }
  const size_t begin = local * options_.batch_size;
  const size_t end = std::min(order->size(), begin + options_.batch_size);
  return std::vector<size_t>(order->begin() + begin, order->begin() + end);
}

LoaderCore::Impl::Result LoaderCore::Impl::run_produce(const std::vector<size_t>& indices,
                                                       int worker, const LoaderSettings& s) {
  Result r;
  const Nanos start = clock_->now_ns();
  const Nanos cpu_start = thread_cpu_ns();
  try {
    r.batch = produce_(indices, worker, s);
  } catch (const std::exception& e) {
    r.error = e.what();
  } catch (...) {
    r.error = "unknown exception";
  }
  produce_ns_.fetch_add(clock_->now_ns() - start, std::memory_order_relaxed);
  produce_cpu_ns_.fetch_add(thread_cpu_ns() - cpu_start, std::memory_order_relaxed);
  produce_count_.fetch_add(1, std::memory_order_relaxed);
  if (r.error.empty()) return r;
  if (indices.size() == 1) {
    r.failed_sample = indices.front();
    r.failed_count = 1;
    return r;
  }
  // Find the culprits: produce the samples one by one, without pinning or copies. The others
  // are then delivered as a smaller batch, so only the failing samples are skipped.
  LoaderSettings plain = s;
  plain.pin_memory = plain.device_prefetch = false;
  std::vector<size_t> good;
  for (size_t index : indices) {
    if (stop_requested_.load()) break;  // shutting down: the batch is dropped anyway
    try {
      produce_({index}, worker, plain);
      good.push_back(index);
    } catch (...) {
      if (!r.failed_sample) r.failed_sample = index;
      ++r.failed_count;
    }
  }
  if (!good.empty() && good.size() < indices.size()) {
    try {
      r.batch = produce_(good, worker, s);
    } catch (...) {
      r.batch = nullptr;  // the samples fail only together: nothing to deliver
    }
  }
  return r;
}

void LoaderCore::Impl::ensure_workers() {
  for (int id = 0; id < settings_.workers; ++id) {
    WorkerSlot& slot = slots_[id];
    if (slot.running) continue;
    // A slot not running has left worker_loop (it clears `running` under mu_ as its last act).
    if (slot.thread.joinable()) slot.thread.join();
    // Create first: if the system refuses a thread, the slot stays free (and the caller sees
    // std::system_error) instead of counting a worker that does not exist.
    try {
      // The thread co-owns this Impl: see shutdown().
      std::thread thread(&Impl::worker_loop, shared_from_this(), id);
      slot.running = true;
      slot.thread = std::move(thread);
    } catch (...) {
      settings_.workers = id;  // the workers that do exist
      throw;
    }
  }
}

void LoaderCore::Impl::worker_loop(int id) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (stopping_ || id >= settings_.workers) {
      slots_[id].running = false;
      exit_cv_.notify_all();
      return;
    }
    if (!can_claim()) {
      work_cv_.wait(lock);
      continue;
    }
    const size_t batch = next_claim_++;
    const uint64_t generation = generation_;
    const std::vector<size_t> indices = batch_indices(batch);
    const LoaderSettings s = settings_;
    lock.unlock();
    Result r = run_produce(indices, id, s);
    lock.lock();
    if (generation == generation_ && !stopping_) {
      ready_.emplace(batch, std::move(r));
      ready_cv_.notify_all();
    }
  }
}

LoaderCore::Batch LoaderCore::Impl::next() {
  const Clock* start_clock = nullptr;
  const Nanos start = wait_now(start_clock);
  bool blocked = false;
  std::unique_lock<std::mutex> lock(mu_);
  if (partial_) {
    // What was left of a batch whose dataset call failed (see the error thrown just before).
    batches_.fetch_add(1, std::memory_order_relaxed);
    return std::move(partial_);
  }
  if (!epoch_active_) return nullptr;
  if (next_deliver_ >= base_ + batches_per_epoch()) {
    epoch_active_ = false;
    return nullptr;
  }
  const size_t batch = next_deliver_;
  const size_t batch_in_epoch = batch - base_;
  auto it = ready_.find(batch);
  Result r;
  if (it != ready_.end()) {
    r = std::move(it->second);
    ready_.erase(it);
  } else if (settings_.workers == 0 && next_claim_ == batch) {
    // No workers: the training thread produces the batch itself (and waits for it).
    ++next_claim_;
    const std::vector<size_t> indices = batch_indices(batch);
    const LoaderSettings s = settings_;
    lock.unlock();
    r = run_produce(indices, -1, s);
    lock.lock();
    blocked = true;
  } else {
    blocked = true;
    ready_cv_.wait(lock, [&] { return ready_.count(batch) > 0; });
    it = ready_.find(batch);
    r = std::move(it->second);
    ready_.erase(it);
  }
  ++next_deliver_;
  const int64_t epoch = epoch_;
  const uint64_t generation_at_delivery = generation_;
  lock.unlock();
  work_cv_.notify_all();  // the window moved on

  batches_.fetch_add(1, std::memory_order_relaxed);
  if (blocked) {
    // From here on nothing may throw before the batch is returned (or its error thrown): the
    // batch is taken, and a lost batch would break exactly-once. wait_now() and report_wait()
    // catch whatever the clock and the observer throw.
    const Clock* end_clock = nullptr;
    const Nanos end = wait_now(end_clock);
    // A wait clock that failed in between was replaced: the two readings do not compare.
    const Nanos waited = end_clock == start_clock ? std::max<Nanos>(0, end - start) : 0;
    blocked_count_.fetch_add(1, std::memory_order_relaxed);
    wait_ns_.fetch_add(waited, std::memory_order_relaxed);
    report_wait(waited);
  }
  if (!r.error.empty()) {
    // The batch's other samples, if any, come with the next call.
    {
      std::lock_guard<std::mutex> relock(mu_);
      if (generation_ == generation_at_delivery) partial_ = std::move(r.batch);
    }
    std::string where = r.failed_sample ? "sample " + std::to_string(*r.failed_sample)
                                        : "a sample (none failed alone)";
    if (r.failed_count > 1) where += " and " + std::to_string(r.failed_count - 1) + " more";
    throw DataLoaderError("torchpilot loader '" + options_.name + "': the dataset threw on " +
                              where + " (batch " + std::to_string(batch_in_epoch) + " of epoch " +
                              std::to_string(epoch) + "): " + r.error,
                          r.failed_sample, batch_in_epoch, epoch);
  }
  return r.batch;
}

void LoaderCore::Impl::set_workers(int workers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    settings_.workers = std::clamp(workers, 0, kMaxWorkers);
    ensure_workers();
  }
  work_cv_.notify_all();  // surplus workers exit; the window may have grown
}

void LoaderCore::Impl::set_prefetch(int prefetch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    settings_.prefetch = std::clamp(prefetch, 1, 1024);
  }
  work_cv_.notify_all();
}

bool LoaderCore::Impl::set_pin_memory(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  settings_.pin_memory = on && pin_available_;
  return settings_.pin_memory == on;
}

bool LoaderCore::Impl::set_device_prefetch(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  settings_.device_prefetch = on && device_prefetch_available_;
  return settings_.device_prefetch == on;
}

LoaderSettings LoaderCore::Impl::settings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return settings_;
}

LoaderStats LoaderCore::Impl::stats() const {
  LoaderStats s;
  s.name = options_.name;
  s.tunable = true;
  s.settings = settings();
  s.max_workers = max_workers_;
  s.pin_memory_available = pin_available_;
  s.device_prefetch_available = device_prefetch_available_;
  s.batches = batches_.load(std::memory_order_relaxed);
  s.produce_count = produce_count_.load(std::memory_order_relaxed);
  s.produce_ns = produce_ns_.load(std::memory_order_relaxed);
  s.produce_cpu_ns = produce_cpu_ns_.load(std::memory_order_relaxed);
  s.blocked_count = blocked_count_.load(std::memory_order_relaxed);
  s.wait_ns = wait_ns_.load(std::memory_order_relaxed);
  return s;
}

void LoaderCore::Impl::set_wait_observer(std::function<void(Nanos)> observer,
                                         std::shared_ptr<Clock> clock) {
  // Consumer thread only, like next(), which reads both without the lock.
  wait_observer_ = std::move(observer);
  wait_clock_ = clock ? std::move(clock) : clock_;
}

void LoaderCore::Impl::set_warning_sink(WarningSink sink) { warning_sink_ = std::move(sink); }

void LoaderCore::Impl::warn(const std::string& message) noexcept {
  if (warning_sink_) {
    try {
      warning_sink_(message);
      return;
    } catch (...) {
      warning_sink_ = nullptr;  // a sink that throws is not called again
      try {
        torchpilot_logger()->warn("loader '{}': the warning sink threw; it is no longer used",
                                  options_.name);
      } catch (...) {
      }
    }
  }
  try {
    torchpilot_logger()->warn("{}", message);
  } catch (...) {
  }
}

Nanos LoaderCore::Impl::wait_now(const Clock*& used) noexcept {
  if (wait_clock_ != clock_) {
    try {
      used = wait_clock_.get();
      return wait_clock_->now_ns();
    } catch (const std::exception& e) {
      disable_wait_observer(std::string("the wait clock threw: ") + e.what());
    } catch (...) {
      disable_wait_observer("the wait clock threw a non-standard exception");
    }
  }
  used = clock_.get();
  return clock_->now_ns();  // the steady clock: does not throw
}

void LoaderCore::Impl::report_wait(Nanos waited) noexcept {
  if (!wait_observer_) return;
  try {
    wait_observer_(waited);
  } catch (const std::exception& e) {
    disable_wait_observer(std::string("the wait observer threw: ") + e.what());
  } catch (...) {
    disable_wait_observer("the wait observer threw a non-standard exception");
  }
}

void LoaderCore::Impl::disable_wait_observer(const std::string& what) noexcept {
  // The observer and its clock go together (the Pilot's record_data_wait and clock): both are
  // dropped, the loader's own clock times its waits from now on, and the batch is delivered.
  const bool had_observer = static_cast<bool>(wait_observer_);
  wait_observer_ = nullptr;
  wait_clock_ = clock_;
  try {
    warn("loader '" + options_.name + "': " + what + "; " +
         (had_observer ? "the wait observer is disabled" : "the loader's own clock is used") +
         " (the batch was delivered)");
  } catch (...) {
  }
}

}  // namespace torchpilot
