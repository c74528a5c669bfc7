#include "torchpilot/runtime/loader/stock_loader_meter.h"

#include <pthread.h>

#include <algorithm>

namespace torchpilot {
namespace {

Nanos read_clock(clockid_t clock) {
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<Nanos>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

StockLoaderMeter::StockLoaderMeter(Nanos now_ns) : start_ns_(now_ns) {
  training_clock_ok_ = pthread_getcpuclockid(pthread_self(), &training_clock_) == 0;
  start_process_ns_ = process_cpu_ns();
  start_training_ns_ = training_cpu_ns();
}

Nanos StockLoaderMeter::process_cpu_ns() const { return read_clock(CLOCK_PROCESS_CPUTIME_ID); }

Nanos StockLoaderMeter::training_cpu_ns() const {
  return training_clock_ok_ ? read_clock(training_clock_) : -1;
}

Nanos StockLoaderMeter::fetch_begin() const { return read_clock(CLOCK_THREAD_CPUTIME_ID); }

void StockLoaderMeter::fetch_end(Nanos cpu_begin, Nanos wall_ns) {
  const Nanos cpu_end = read_clock(CLOCK_THREAD_CPUTIME_ID);
  if (cpu_begin < 0 || cpu_end < 0) return;
  inline_count_.fetch_add(1, std::memory_order_relaxed);
  inline_ns_.fetch_add(std::max<Nanos>(0, wall_ns), std::memory_order_relaxed);
  inline_cpu_ns_.fetch_add(std::max<Nanos>(0, cpu_end - cpu_begin), std::memory_order_relaxed);
}

void StockLoaderMeter::fill(LoaderStats& s, int workers, int64_t batches, Nanos now_ns) const {
  if (workers <= 0) {
    s.produce_count = inline_count_.load(std::memory_order_relaxed);
    s.produce_ns = inline_ns_.load(std::memory_order_relaxed);
    s.produce_cpu_ns = inline_cpu_ns_.load(std::memory_order_relaxed);
    s.production_estimated = false;
    return;
  }
  const Nanos process = process_cpu_ns(), training = training_cpu_ns();
  if (process < 0 || training < 0 || start_process_ns_ < 0 || start_training_ns_ < 0) return;
  s.produce_count = batches;
  s.produce_ns = static_cast<Nanos>(workers) * std::max<Nanos>(0, now_ns - start_ns_);
  // A batch is made by one worker thread, whose CPU time cannot exceed its wall time: the other
  // threads counted in (intra-op threads spinning, the CUDA driver's, torchpilot's) are cut off
  // there (on an H200 they made sleeping workers read as 330% CPU-bound).
  s.produce_cpu_ns =
      std::min(s.produce_ns,
               std::max<Nanos>(0, (process - start_process_ns_) - (training - start_training_ns_)));
  s.production_estimated = true;
}

}  // namespace torchpilot
