#include "torchpilot/runtime/cost/cost.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/metrics.h"

namespace torchpilot {

// --- CostBudget -------------------------------------------------------------------------------

CostBudget::CostBudget(const CostConfig& config)
    : config_(config),
      slice_ns_(std::max<Nanos>(1, static_cast<Nanos>(config.horizon_s * 1e9 / kBuckets))),
      buckets_(kBuckets) {}

void CostBudget::start(Nanos now) {
  if (start_ns_ < 0) start_ns_ = now;
}

int64_t CostBudget::slice(Nanos now) const {
  return std::max<Nanos>(0, now - start_ns_) / slice_ns_;
}

void CostBudget::spend(Nanos now, Nanos ns) {
  if (ns <= 0) return;
  start(now);
  const int64_t i = slice(now);
  Bucket& b = buckets_[static_cast<size_t>(i % kBuckets)];
  if (b.index != i) b = {i, 0};  // a slice that left the horizon is reused
  b.ns += ns;
}

Nanos CostBudget::spent(Nanos now) const {
  if (start_ns_ < 0) return 0;
  const int64_t last = slice(now);
  Nanos sum = 0;
  for (const Bucket& b : buckets_) {
    if (b.index >= 0 && b.index > last - kBuckets && b.index <= last) sum += b.ns;
  }
  return sum;
}

Nanos CostBudget::allowance(Nanos now) const {
  if (start_ns_ < 0) return 0;
  const double run = static_cast<double>(std::max<Nanos>(0, now - start_ns_));
  return static_cast<Nanos>(config_.budget * std::min(run, config_.horizon_s * 1e9));
}

bool CostBudget::allows(Nanos now, Nanos estimate) const {
  if (config_.budget >= 1) return true;  // the whole run time: no limit
  return spent(now) + std::max<Nanos>(0, estimate) <= allowance(now);
}

double CostBudget::span_s(Nanos now) const {
  if (start_ns_ < 0) return 0;
  return std::min(static_cast<double>(std::max<Nanos>(0, now - start_ns_)) / 1e9,
                  config_.horizon_s);
}

double CostBudget::horizon_fraction(Nanos now) const {
  if (start_ns_ < 0 || now <= start_ns_) return 0;
  const double run = std::min(static_cast<double>(now - start_ns_), config_.horizon_s * 1e9);
  return static_cast<double>(spent(now)) / run;
}

// --- the section ------------------------------------------------------------------------------

std::string section_json(const CostStats& c) {
  using namespace detail;
  json parts = json::object();
  for (const auto& [name, ns] : c.epoch_end_parts) parts[name] = ms(ns);
  json step_parts = json::object();
  for (const auto& [name, ns] : c.step_parts) step_parts[name] = ms(ns);
  return dump(json{{"training_thread_ms", ms(c.training_thread_ns)},
                   {"step_calls_ms", ms(c.step_calls_ns)},
                   {"epoch_end_ms", ms(c.epoch_end_ns)},
                   {"window_ms", ms(c.window_ns)},
                   {"epoch_ms", ms(c.epoch_ns)},
                   {"fraction", c.fraction},
                   {"horizon_fraction", c.horizon_fraction},
                   {"budget", c.budget},
                   {"horizon_s", c.horizon_s},
                   {"deferred", c.deferred},
                   {"own_threads_cpu_ms",
                    c.own_threads_cpu_ns >= 0 ? json(ms(c.own_threads_cpu_ns)) : json(nullptr)},
                   {"epoch_end_parts_ms", parts},
                   {"step_parts_ms", step_parts}});
}

void section_text(const CostStats& c, const EpochSummary&, std::vector<std::string>& lines) {
  using namespace detail;
  // Where the time went: the parts of 0.1 ms and more, largest first.
  auto parts = [](const std::vector<std::pair<std::string, Nanos>>& of) {
    std::string out;
    for (const auto& [name, ns] : of) {
      if (ns < 100000) continue;
      out += (out.empty() ? ": " : ", ") + name + " " + fmt_ms(ns);
    }
    return out;
  };
  std::string line = "  torchpilot: " + fmt_ms(c.training_thread_ns) + ", " + fmt_pct(c.fraction) +
                     " of the epoch (steps " + fmt_ms(c.step_calls_ns) + parts(c.step_parts) +
                     "; epoch end " + fmt_ms(c.epoch_end_ns) + parts(c.epoch_end_parts);
  if (c.window_ns > 0) line += "; trace windows " + fmt_ms(c.window_ns);
  line += "); " + fmt_pct(c.horizon_fraction) + " of run time over the last " +
          fmt_num(c.horizon_s) + " s (budget " + fmt_pct(c.budget) + ")";
  if (c.own_threads_cpu_ns >= 0) {
    line += "; its threads " + fmt_ms(c.own_threads_cpu_ns) + " CPU on other cores";
  }
  if (c.deferred > 0) {
    line += "; " + std::to_string(c.deferred) + " optional trace window" +
            (c.deferred == 1 ? "" : "s") + " deferred for the budget";
  }
  lines.push_back(line);
}

// --- CPU clocks -------------------------------------------------------------------------------

namespace {
Nanos read_cpu_clock(clockid_t id) {
  timespec ts{};
  if (clock_gettime(id, &ts) != 0) return -1;
  return static_cast<Nanos>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct OwnThreads {
  std::mutex mu;
  std::vector<clockid_t> live;
  Nanos retired_ns = 0;
};
OwnThreads& own_threads() {
  static OwnThreads* threads = new OwnThreads();  // never destroyed: threads may exit late
  return *threads;
}

// Registered while its thread lives; at the thread's exit its CPU time is kept as retired.
struct OwnThreadEntry {
  clockid_t clock{};
  bool ok = false;
  OwnThreadEntry() {
    ok = pthread_getcpuclockid(pthread_self(), &clock) == 0;
    if (!ok) return;
    OwnThreads& t = own_threads();
    std::lock_guard<std::mutex> lock(t.mu);
    t.live.push_back(clock);
  }
  ~OwnThreadEntry() {
    if (!ok) return;
    const Nanos ns = read_cpu_clock(CLOCK_THREAD_CPUTIME_ID);
    OwnThreads& t = own_threads();
    std::lock_guard<std::mutex> lock(t.mu);
    t.live.erase(std::remove(t.live.begin(), t.live.end(), clock), t.live.end());
    if (ns > 0) t.retired_ns += ns;
  }
};
}  // namespace

void register_own_thread() { static thread_local OwnThreadEntry entry; }

Nanos own_threads_cpu_ns() {
  OwnThreads& t = own_threads();
  std::lock_guard<std::mutex> lock(t.mu);
  Nanos sum = t.retired_ns;
  // A thread's clock is read under the lock its exit takes first: it is still alive here.
  for (clockid_t c : t.live) sum += std::max<Nanos>(0, read_cpu_clock(c));
  return sum;
}

}  // namespace torchpilot
