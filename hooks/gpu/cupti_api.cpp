// load_cupti(): libcupti reached through dlopen/dlsym; TimeBase measurement.
#include "cupti_api.h"

#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace torchpilot {
namespace detail {

namespace {

// CUPTI entry points, resolved by name (TORCHPILOT_CUPTI_ENTRY_POINTS). A missing one stays null
// and its method answers CUPTI_ERROR_API_NOT_IMPLEMENTED.
class DlopenCuptiApi final : public CuptiApi {
 public:
  DlopenCuptiApi(void* handle, std::string origin) : handle_(handle), origin_(std::move(origin)) {
#define TORCHPILOT_RESOLVE(method, symbol, params, args) resolve(method##_, #symbol);
#define TORCHPILOT_RESOLVE_P(method, symbol, Params) resolve(method##_, #symbol);
    TORCHPILOT_CUPTI_ENTRY_POINTS(TORCHPILOT_RESOLVE, TORCHPILOT_RESOLVE_P)
#undef TORCHPILOT_RESOLVE
#undef TORCHPILOT_RESOLVE_P
    resolve(subscribe_v1_, "cuptiSubscribe");  // subscribe's fallback (see guard() below)
  }
  // The handle is never closed: CUPTI keeps threads and our callbacks registered for the life of
  // the process, and LibTorch may share the same copy.

  std::string origin() const override { return origin_; }

 private:
  // A resolved entry point called through its own signature; null answers
  // CUPTI_ERROR_API_NOT_IMPLEMENTED.
  template <class... A>
  struct Guarded {
    CUptiResult (*fn)(A...);
    CUptiResult operator()(A... a) const {
      return fn == nullptr ? CUPTI_ERROR_API_NOT_IMPLEMENTED : fn(a...);
    }
  };
  template <class... A>
  static Guarded<A...> guard(CUptiResult (*fn)(A...)) {
    return {fn};
  }
  // subscribe: cuptiSubscribe_v2 where the library has it, else cuptiSubscribe (params ignored).
  // Chosen over the template for cuptiSubscribe_v2's type (an exact non-template match).
  auto guard(decltype(&::cuptiSubscribe_v2) v2) const {
    return [v2, v1 = subscribe_v1_](CUpti_SubscriberHandle* s, CUpti_CallbackFunc cb, void* user,
                                    CUpti_SubscriberParams* params) -> CUptiResult {
      if (v2 != nullptr) return v2(s, cb, user, params);
      return v1 != nullptr ? v1(s, cb, user) : CUPTI_ERROR_API_NOT_IMPLEMENTED;
    };
  }

 public:
#define TORCHPILOT_FORWARD(method, symbol, params, args) \
  CUptiResult method params override { return guard(method##_) args; }
#define TORCHPILOT_FORWARD_P(method, symbol, Params) \
  CUptiResult method(Params* p) override { return guard(method##_)(p); }
  TORCHPILOT_CUPTI_ENTRY_POINTS(TORCHPILOT_FORWARD, TORCHPILOT_FORWARD_P)
#undef TORCHPILOT_FORWARD
#undef TORCHPILOT_FORWARD_P

 private:
  template <class F>
  void resolve(F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(handle_, name));
  }

  void* handle_;
  std::string origin_;
#define TORCHPILOT_POINTER(method, symbol, params, args) decltype(&::symbol) method##_ = nullptr;
#define TORCHPILOT_POINTER_P(method, symbol, Params) decltype(&::symbol) method##_ = nullptr;
  TORCHPILOT_CUPTI_ENTRY_POINTS(TORCHPILOT_POINTER, TORCHPILOT_POINTER_P)
#undef TORCHPILOT_POINTER
#undef TORCHPILOT_POINTER_P
  decltype(&::cuptiSubscribe) subscribe_v1_ = nullptr;
};

// The path a handle was loaded from (dlinfo would need _GNU_SOURCE's link_map; dladdr of a symbol
// is enough).
std::string path_of(void* handle, const std::string& fallback) {
  void* sym = dlsym(handle, "cuptiGetVersion");
  Dl_info info{};
  if (sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return fallback;
}

}  // namespace

std::unique_ptr<CuptiApi> load_cupti(const std::string& configured_path, std::string* error) {
  struct Attempt {
    std::string name;
    int flags;
    const char* what;
    bool configured;
  };
  std::vector<Attempt> attempts;
  // The copy already in the process (LibTorch's) comes first: a second copy conflicts with it.
  attempts.push_back({"libcupti.so.13", RTLD_NOW | RTLD_NOLOAD, "already loaded", false});
  attempts.push_back({"libcupti.so", RTLD_NOW | RTLD_NOLOAD, "already loaded", false});
  if (!configured_path.empty()) {
    attempts.push_back({configured_path, RTLD_NOW, "gpu.cupti_path", true});
  }
  attempts.push_back({"libcupti.so.13", RTLD_NOW, "loader search path", false});
  attempts.push_back({"libcupti.so", RTLD_NOW, "loader search path", false});
  attempts.push_back({"/usr/local/cuda/lib64/libcupti.so.13", RTLD_NOW, "CUDA toolkit", false});
  attempts.push_back(
      {"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13", RTLD_NOW, "CUDA toolkit", false});
  std::string configured_error;
  for (const auto& a : attempts) {
    void* handle = dlopen(a.name.c_str(), a.flags);
    if (handle == nullptr) {
      if (a.configured) {
        const char* e = dlerror();
        configured_error = e != nullptr ? e : "dlopen failed";
      }
      continue;
    }
    return std::make_unique<DlopenCuptiApi>(
        handle, path_of(handle, a.name) + " (" + std::string(a.what) + ")");
  }
  if (error != nullptr) {
    *error = "libcupti not found (tried libcupti.so.13 in the process, ";
    if (!configured_path.empty()) {
      *error += "gpu.cupti_path " + configured_path + " [" + configured_error + "], ";
    }
    *error += "the loader's search path, /usr/local/cuda/lib64 and /usr/local/cuda/extras/CUPTI)";
  }
  return nullptr;
}

std::string cupti_error_name(CuptiApi& api, CUptiResult result) {
  const char* s = nullptr;
  std::string name;
  if (api.get_result_string(result, &s) == CUPTI_SUCCESS && s != nullptr) name = s;
  if (name.empty()) name = "CUPTI error";
  return name + " (" + std::to_string(static_cast<int>(result)) + ")";
}

Nanos steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ClockPair read_clock_pair(const std::function<uint64_t()>& cupti_now,
                          const std::function<Nanos()>& steady_now, int reads) {
  ClockPair best;
  best.latency = std::numeric_limits<Nanos>::max();
  for (int i = 0; i < std::max(1, reads); ++i) {
    const Nanos s0 = steady_now();
    const uint64_t c = cupti_now();
    const Nanos s1 = steady_now();
    if (s1 - s0 < best.latency) best = {c, s0 + (s1 - s0) / 2, s1 - s0};
  }
  return best;
}

TimeBase time_base_through(const ClockPair& now, const ClockPair* earlier, double fallback_scale,
                           bool* rate_measured) {
  TimeBase tb;
  tb.offset_ns = static_cast<int64_t>(now.cupti) - now.steady;
  tb.anchor = now.cupti;
  tb.scale = fallback_scale;
  bool measured = false;
  if (earlier != nullptr && now.steady - earlier->steady >= kMinClockBaselineNs &&
      now.cupti > earlier->cupti) {
    const double rate = static_cast<double>(now.steady - earlier->steady) /
                        static_cast<double>(now.cupti - earlier->cupti);
    // Plausible clocks: nanoseconds, or ticks of 0.05-20 GHz.
    if (rate > 0.05 && rate < 20) {
      measured = true;
      tb.scale = std::abs(rate - 1) <= 2e-3 ? 1.0 : rate;
    }
  }
  if (rate_measured != nullptr) *rate_measured = measured;
  return tb;
}

bool CuptiClock::measure(CuptiApi& api, Nanos* latency_ns, Nanos wait_ns) {
  bool ok = true;
  auto cupti_now = [&]() -> uint64_t {
    uint64_t t = 0;
    if (api.get_timestamp(&t) != CUPTI_SUCCESS) ok = false;
    return t;
  };
  ClockPair now = read_clock_pair(cupti_now, steady_now_ns);
  if (!ok) return false;
  bool have_first = false, rate_known = false;
  ClockPair first;
  double scale = 1.0;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    have_first = have_first_;
    rate_known = rate_known_;
    first = first_;
    scale = tb_.scale;
    generation = generation_;
  }
  const bool was_known = rate_known;
  bool measured = false;
  TimeBase tb = time_base_through(now, have_first ? &first : nullptr, scale, &measured);
  // The same clock as the first reading: its rate found now, if it was not known; else a
  // nanosecond clock that stays one, or a tick clock within 1% of its rate (the longer baseline
  // refines it). Anything else is another clock since (an NTP step, another client's timestamp
  // callback): this reading starts it.
  const bool same =
      measured &&
      (!rate_known || (scale == 1.0 ? tb.scale == 1.0 : std::abs(tb.scale / scale - 1) <= 0.01));
  ClockPair start = now;
  if (same) {
    rate_known = true;
  } else {
    tb.scale = scale;  // until the new clock's rate is known
    rate_known = false;
    if (wait_ns > 0) {
      // Off the training thread: a second reading a moment later gives the new clock's rate.
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::max(wait_ns, kMinClockBaselineNs)));
      const ClockPair later = read_clock_pair(cupti_now, steady_now_ns);
      if (!ok) return false;
      tb = time_base_through(later, &start, scale, &rate_known);
      now = later;
      if (!rate_known) start = later;  // changed again in between: go on from here
    }
  }
  if (latency_ns != nullptr) *latency_ns = now.latency;
  std::lock_guard<std::mutex> lock(mutex_);
  // Another measure (the training thread's, the decode thread's) wrote meanwhile: its line is as
  // fresh, and this one's view of the state is stale.
  if (generation_ != generation) return true;
  ++generation_;
  tb_ = tb;
  rate_known_ = rate_known;
  if (!same) {
    first_ = start;
    have_first_ = true;
  }
  // A tick rate that a second, longer baseline agreed with (not one pair across a clock step).
  if (same && was_known && tb.scale != 1.0) tick_confirmed_ = true;
  return true;
}

void note_tick_clock(CuptiClock& clock, spdlog::logger& logger) {
  if (!clock.take_tick_clock_note()) return;
  logger.info(
      "CUPTI's clock is not in nanoseconds here (another client, such as PyTorch's profiler, "
      "registered its own timestamps): {:.4f} ns a unit, converted",
      clock.get().scale);
}

bool CuptiClock::take_tick_clock_note() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!tick_confirmed_ || tick_noted_) return false;
  tick_noted_ = true;
  return true;
}

}  // namespace detail
}  // namespace torchpilot
