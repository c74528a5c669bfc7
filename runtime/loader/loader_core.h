// The scheduling heart of TunableLoader, free of LibTorch: it owns the epoch's sample order, hands
// batch numbers to worker threads, keeps at most `workers x prefetch` batches in flight (running
// on into the next epoch), and delivers them in order. Knobs change live: a change takes effect for
// the next batch claimed, and since every batch number is claimed exactly once per epoch, no sample
// is lost or repeated.
//
// Thread-safety: next(), start_epoch(), the setters and destruction are for one consumer thread
// (the training loop); settings() and stats() may be read from any thread. Worker threads are
// internal. The callbacks the loader is given run on these threads: `produce` on the workers (or
// on the consumer thread with no workers); the wait observer, its clock and the warning sink on
// the consumer thread only, never on a worker.
//
// Failure behaviour: an exception thrown while producing a batch is caught in the worker, the
// failing samples are located by producing the batch's samples one at a time, and next() throws
// DataLoaderError for that batch in its turn. The next call delivers the batch's other samples as
// a smaller batch, then the epoch goes on: only the failing samples are skipped. Nothing else
// throws out of next(): a wait observer or wait clock that throws (anything, std or not) is caught
// after the batch was taken, the batch is still delivered, the observer is disabled (until one is
// set again), and the warning sink hears of it once. A warning sink that throws is dropped and the
// torchpilot logger used instead.
//
// Destruction (the way out): it stops the workers claiming, then waits for the batches still in
// production (one per worker, plus the sample-by-sample retry of a batch whose dataset call
// failed) up to LoaderOptions::shutdown_timeout_ms in all, and joins those threads. A worker still
// inside `produce` after that, e.g. a dataset call waiting on something that never comes, is
// abandoned: its thread is detached, the warning sink is told once how many were, and the
// destructor returns. An abandoned call keeps running in its thread; when (if ever) it returns, its
// result is dropped and the thread ends without touching the destroyed loader: the state it uses,
// `produce` and everything `produce` captured included, is shared with the thread and freed by
// whichever of the two finishes last. A thread still blocked does not keep the process from
// exiting.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/loader/loader_records.h"

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
  // Destruction waits at most this long for batches in production, then abandons the worker
  // threads still in a dataset call (see "the way out" above). At least 0.
  int64_t shutdown_timeout_ms = 5000;
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
  // training thread. May throw. It may outlive the LoaderCore in an abandoned worker thread (see
  // destruction above): whatever it refers to must be captured by value or shared ownership.
  using Produce =
      std::function<Batch(const std::vector<size_t>& indices, int worker, const LoaderSettings&)>;
  // Receives the loader's warnings (one line each), on the consumer thread.
  using WarningSink = std::function<void(const std::string& message)>;

  static constexpr int kMaxWorkers = 256;

  LoaderCore(size_t dataset_size, LoaderOptions options, Produce produce, bool pin_memory_available,
             bool device_prefetch_available);
  // Bounded: see "the way out" above.
  ~LoaderCore();
  LoaderCore(const LoaderCore&) = delete;
  LoaderCore& operator=(const LoaderCore&) = delete;

  // Starts the next epoch (a new order). After an epoch delivered in full, batches the workers
  // already made for the next one are kept; after an unfinished one, everything is dropped.
  void start_epoch();
  // The next batch in order, waiting if needed; nullptr at the end of the epoch. Throws only
  // DataLoaderError (the dataset's own exceptions).
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
  // (the Pilot's; null: the steady clock). Consumer thread only. If the observer or the clock
  // throws, the observer is disabled (until set again) and the warning sink told once.
  void set_wait_observer(std::function<void(Nanos)> observer, std::shared_ptr<Clock> clock);
  // Where the loader's warnings go (TunableLoader: the Pilot's log); null: the torchpilot logger.
  // Consumer thread only; called on it only (from next(), start_epoch() and the destructor).
  void set_warning_sink(WarningSink sink);

 private:
  class Impl;  // the state shared with the worker threads (they own it with the LoaderCore)

  const size_t dataset_size_;
  const int max_workers_;
  const bool pin_available_;
  const bool device_prefetch_available_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace torchpilot
