// load_cupti(): libcupti reached through dlopen/dlsym; TimeBase measurement.
#include "cupti_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <limits>
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

TimeBase measure_time_base(const std::function<uint64_t()>& cupti_now,
                           const std::function<Nanos()>& steady_now, int reads, Nanos* latency_ns) {
  TimeBase best;
  Nanos best_latency = std::numeric_limits<Nanos>::max();
  for (int i = 0; i < std::max(1, reads); ++i) {
    const Nanos s0 = steady_now();
    const uint64_t c = cupti_now();
    const Nanos s1 = steady_now();
    const Nanos latency = s1 - s0;
    if (latency < best_latency) {
      best_latency = latency;
      best.offset_ns = static_cast<int64_t>(c) - (s0 + latency / 2);
    }
  }
  if (latency_ns != nullptr) *latency_ns = best_latency;
  return best;
}

bool CuptiClock::measure(CuptiApi& api, Nanos* latency_ns) {
  bool ok = true;
  auto cupti_now = [&]() -> uint64_t {
    uint64_t t = 0;
    if (api.get_timestamp(&t) != CUPTI_SUCCESS) ok = false;
    return t;
  };
  const TimeBase tb = measure_time_base(cupti_now, steady_now_ns, 5, latency_ns);
  if (ok) set(tb);
  return ok;
}

}  // namespace detail
}  // namespace torchpilot
