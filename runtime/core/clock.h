// Time source for everything torchpilot measures. Injected so tests can drive time by hand.
// Thread-safety: both clocks may be read from any thread. ManualClock may be advanced from any
// thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace torchpilot {

using Nanos = int64_t;  // durations and timestamps, nanoseconds

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Nanos now_ns() const = 0;
};

// std::chrono::steady_clock: monotonic, not wall time.
class SteadyClock final : public Clock {
 public:
  Nanos now_ns() const override;
};

// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID): user + system, not blocked time.
class ThreadCpuClock final : public Clock {
 public:
  Nanos now_ns() const override;
};

// A clock that moves only when told to (tests, simulations).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Nanos start = 0) : now_(start) {}
  Nanos now_ns() const override { return now_.load(std::memory_order_relaxed); }
  void advance(Nanos d) { now_.fetch_add(d, std::memory_order_relaxed); }
  void set(Nanos t) { now_.store(t, std::memory_order_relaxed); }

 private:
  std::atomic<Nanos> now_;
};

// The process-wide steady clock, shared by default.
std::shared_ptr<Clock> default_clock();

}  // namespace torchpilot
