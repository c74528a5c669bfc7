#include "torchpilot/runtime/loader_core.h"

#include <sched.h>
#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "torchpilot/runtime/logging.h"

namespace torchpilot {
namespace {

// CPU time of the calling thread: with wall time it tells CPU-bound loading from I/O waits.
Nanos thread_cpu_ns() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<Nanos>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

LoaderCore::LoaderCore(size_t dataset_size, LoaderOptions options, Produce produce,
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

LoaderCore::~LoaderCore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& slot : slots_) {
    if (slot.thread.joinable()) slot.thread.join();
  }
}

size_t LoaderCore::batches_per_epoch() const {
  const size_t bs = options_.batch_size;
  return options_.drop_last ? dataset_size_ / bs : (dataset_size_ + bs - 1) / bs;
}

int64_t LoaderCore::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

std::vector<size_t> LoaderCore::epoch_order(int64_t epoch) const {
  std::vector<size_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), size_t{0});
  if (options_.shuffle) {
    std::mt19937_64 rng(options_.seed + static_cast<uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

void LoaderCore::start_epoch() {
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
      torchpilot_logger()->warn("loader '{}': only {} worker threads could be started: {}",
                                options_.name, settings_.workers, e.what());
    }
  }
  work_cv_.notify_all();
}

bool LoaderCore::can_claim() const {
  const size_t window =
      static_cast<size_t>(std::max(1, settings_.workers)) * static_cast<size_t>(settings_.prefetch);
  // Claims may run one epoch ahead of the current one (its order is known), never further.
  const size_t per_epoch = batches_per_epoch();
  const size_t limit = base_ + (options_.prefetch_across_epochs ? 2 : 1) * per_epoch;
  return started_ && next_claim_ < limit && next_claim_ < next_deliver_ + window;
}

std::vector<size_t> LoaderCore::batch_indices(size_t batch) const {
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

LoaderCore::Result LoaderCore::run_produce(const std::vector<size_t>& indices, int worker,
                                           const LoaderSettings& s) {
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

void LoaderCore::ensure_workers() {
  for (int id = 0; id < settings_.workers; ++id) {
    WorkerSlot& slot = slots_[id];
    if (slot.running) continue;
    // A slot not running has left worker_loop (it clears `running` under mu_ as its last act).
    if (slot.thread.joinable()) slot.thread.join();
    // Create first: if the system refuses a thread, the slot stays free (and the caller sees
    // std::system_error) instead of counting a worker that does not exist.
    try {
      std::thread thread(&LoaderCore::worker_loop, this, id);
      slot.running = true;
      slot.thread = std::move(thread);
    } catch (...) {
      settings_.workers = id;  // the workers that do exist
      throw;
    }
  }
}

void LoaderCore::worker_loop(int id) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (stopping_ || id >= settings_.workers) {
      slots_[id].running = false;
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
    if (generation == generation_) {
      ready_.emplace(batch, std::move(r));
      ready_cv_.notify_all();
    }
  }
}

LoaderCore::Batch LoaderCore::next() {
  const Nanos start = wait_clock_->now_ns();
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
    const Nanos waited = wait_clock_->now_ns() - start;
    blocked_count_.fetch_add(1, std::memory_order_relaxed);
    wait_ns_.fetch_add(waited, std::memory_order_relaxed);
    // wait_observer_ is set on this (the consumer) thread only: no copy or lock needed.
    if (wait_observer_) wait_observer_(waited);
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

void LoaderCore::set_workers(int workers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    settings_.workers = std::clamp(workers, 0, kMaxWorkers);
    ensure_workers();
  }
  work_cv_.notify_all();  // surplus workers exit; the window may have grown
}

void LoaderCore::set_prefetch(int prefetch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    settings_.prefetch = std::clamp(prefetch, 1, 1024);
  }
  work_cv_.notify_all();
}

bool LoaderCore::set_pin_memory(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  settings_.pin_memory = on && pin_available_;
  return settings_.pin_memory == on;
}

bool LoaderCore::set_device_prefetch(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  settings_.device_prefetch = on && device_prefetch_available_;
  return settings_.device_prefetch == on;
}

LoaderSettings LoaderCore::settings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return settings_;
}

LoaderStats LoaderCore::stats() const {
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

void LoaderCore::set_wait_observer(std::function<void(Nanos)> observer,
                                   std::shared_ptr<Clock> clock) {
  // Consumer thread only, like next(), which reads both without the lock.
  wait_observer_ = std::move(observer);
  wait_clock_ = clock ? std::move(clock) : clock_;
}

}  // namespace torchpilot
