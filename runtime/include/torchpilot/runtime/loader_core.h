// The scheduling heart of TunableLoader, free of LibTorch: it owns the epoch's sample order, hands
// batch numbers to worker threads, keeps at most `workers x prefetch` batches in flight (running
// on into the next epoch), and delivers them in order. Knobs change live: a change takes effect for
// the next batch claimed, and since every batch number is claimed exactly once per epoch, no sample
// is lost or repeated.
//
// Thread-safety: next(), start_epoch() and the setters are for one consumer thread (the training
// loop); settings() and stats() may be read from any thread. Worker threads are internal.
// Failure behaviour: an exception thrown while producing a batch is caught in the worker, the
// failing samples are located by producing the batch's samples one at a time, and next() throws
// DataLoaderError for that batch in its turn. The next call delivers the batch's other samples as
// a smaller batch, then the epoch goes on: only the failing samples are skipped.
// Destruction waits for batches in production (one per worker, plus the sample-by-sample retry
// of a batch whose dataset call failed) and joins every thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "torchpilot/runtime/clock.h"
#include "torchpilot/runtime/loader_records.h"

namespace torchpilot {

struct LoaderOptions {
  size_t batch_size = 1;
  int workers = 0;               // 0: batches are produced on the training thread
  int prefetch = 2;              // batches in flight or ready per worker
  bool pin_memory = false;       // CUDA builds: batches in page-locked memory
  bool device_prefetch = false;  // CUDA builds: batches copied to the GPU ahead of use
  int device_index = 0;          // the GPU for device_prefetch
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;  // epoch e shuffles with seed + e
  // Workers go on into the next epoch's batches (its order is fixed by the seed) once the current
  // epoch is all claimed, so a new epoch does not start with an empty pipeline. Batches made
  // ahead are dropped if the next start_epoch() comes before the epoch was delivered in full.
  bool prefetch_across_epochs = true;
  std::string name = "tunable";
};

// The dataset threw while producing a batch. what() names the sample, batch and epoch.
class DataLoaderError : public std::runtime_error {
 public:
  DataLoaderError(const std::string& message, std::optional<size_t> sample, size_t batch,
                  int64_t epoch)
      : std::runtime_error(message), sample_(sample), batch_(batch), epoch_(epoch) {}
  // The first sample of the batch whose production throws on its own (if one does); the batch's
  // other samples come as a smaller batch from the next call to next().
  std::optional<size_t> sample_index() const { return sample_; }
  size_t batch_index() const { return batch_; }
  int64_t epoch() const { return epoch_; }

 private:
  std::optional<size_t> sample_;
  size_t batch_;
  int64_t epoch_;
};

// Number of CPUs in this process's affinity mask (at least 1).
int affinity_cpu_count();

class LoaderCore {
 public:
  using Batch = std::shared_ptr<void>;
  // Produces the batch of the given sample indices. `worker` is the worker slot (0..) or -1 on the
  // training thread. May throw.
  using Produce =
      std::function<Batch(const std::vector<size_t>& indices, int worker, const LoaderSettings&)>;

  static constexpr int kMaxWorkers = 256;

  LoaderCore(size_t dataset_size, LoaderOptions options, Produce produce, bool pin_memory_available,
             bool device_prefetch_available);
  ~LoaderCore();
  LoaderCore(const LoaderCore&) = delete;
  LoaderCore& operator=(const LoaderCore&) = delete;

  // Starts the next epoch (a new order). After an epoch delivered in full, batches the workers
  // already made for the next one are kept; after an unfinished one, everything is dropped.
  void start_epoch();
  // The next batch in order, waiting if needed; nullptr at the end of the epoch.
  Batch next();

  size_t dataset_size() const { return dataset_size_; }
  size_t batches_per_epoch() const;
  int64_t epoch() const;

  // Live knobs. Values are clamped to their range; unavailable features stay off (false return).
  // set_workers throws std::system_error if a thread cannot be created; the workers that could be
  // started keep working and settings() says how many.
  void set_workers(int workers);
  void set_prefetch(int prefetch);
  bool set_pin_memory(bool on);
  bool set_device_prefetch(bool on);

  LoaderSettings settings() const;
  LoaderStats stats() const;
  int max_workers() const { return max_workers_; }
  bool pin_memory_available() const { return pin_available_; }
  bool device_prefetch_available() const { return device_prefetch_available_; }

  // Called with each blocking wait of next() (the Pilot's record_data_wait), timed with `clock`
  // (the Pilot's; null: the steady clock). Consumer thread only.
  void set_wait_observer(std::function<void(Nanos)> observer, std::shared_ptr<Clock> clock);

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
  LoaderSettings settings_;
  bool stopping_ = false;
  bool started_ = false;       // an epoch was started: workers may claim
  bool epoch_active_ = false;  // the current epoch has batches left to deliver
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
  std::function<void(Nanos)> wait_observer_;

  std::atomic<int64_t> batches_{0}, produce_count_{0}, produce_ns_{0}, produce_cpu_ns_{0},
      blocked_count_{0}, wait_ns_{0};
};

}  // namespace torchpilot
