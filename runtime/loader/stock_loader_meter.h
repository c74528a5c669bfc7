// What a stock loader (LibTorch's DataLoader, watched by hooks/loader/watch.h) spends producing
// batches, measured from outside it: its code cannot be timed and its threads are not named.
//  - workers 0: the training thread produces each batch inside the fetch, so the fetch's wall
//    time and the thread's CPU time meanwhile are the batch's production (two clock reads a
//    batch, on the training thread).
//  - workers N: the workers' CPU time is the process's CPU time less the training thread's, read
//    when the counters are (epoch ends), never per batch. It is an upper bound: any other
//    thread's CPU time (LibTorch's intra-op threads, torchpilot's own) counts as the loader's, so
//    I/O-bound production can only be mistaken for CPU-bound, never the reverse. Their wall time
//    is N x the time elapsed, which holds while every worker is busy: when the step waits for
//    batches, the only time the advice reads it (LoaderStats::production_estimated says so).
// Where a CPU clock cannot be read the production counters stay 0 (the advice then says the
// production time is not visible).
// Thread-safety: construct and call fetch_begin/fetch_end on the training thread; fill() from
// any thread.
#pragma once

#include <time.h>

#include <atomic>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/loader/loader_records.h"

namespace torchpilot {

class StockLoaderMeter {
 public:
  // Takes the calling thread as the training thread; `now_ns` is the Pilot's clock.
  explicit StockLoaderMeter(Nanos now_ns);

  // Around each fetch of a loader with workers 0: the training thread's CPU time before it, then
  // the fetch's wall time and that CPU time again after it.
  Nanos fetch_begin() const;
  void fetch_end(Nanos cpu_begin, Nanos wall_ns);

  // The cumulative production counters (produce_count, produce_ns, produce_cpu_ns,
  // production_estimated) of a loader with `workers` workers that has handed out `batches`.
  void fill(LoaderStats& s, int workers, int64_t batches, Nanos now_ns) const;

 private:
  Nanos process_cpu_ns() const;
  Nanos training_cpu_ns() const;

  bool training_clock_ok_ = false;
  clockid_t training_clock_{};
  Nanos start_ns_ = 0;            // the Pilot's clock at construction
  Nanos start_process_ns_ = -1;   // the process's CPU time then
  Nanos start_training_ns_ = -1;  // the training thread's
  // Workers 0: the fetches' wall and CPU time.
  std::atomic<int64_t> inline_count_{0};
  std::atomic<Nanos> inline_ns_{0};
  std::atomic<Nanos> inline_cpu_ns_{0};
};

}  // namespace torchpilot
