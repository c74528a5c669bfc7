// CuptiApiFake: the default fake of CuptiApi, generated from TORCHPILOT_CUPTI_ENTRY_POINTS
// (hooks/gpu/cupti_api.h). Every entry point
//   1. for a params-struct (P) entry point, checks p->structSize against Params_STRUCT_SIZE (a
//      wrong one is recorded in bad_struct_sizes and the call goes on; a null p answers
//      CUPTI_ERROR_INVALID_PARAMETER);
//   2. answers fail[symbol] where a test set one (fail["cuptiPmSamplingEnable"] = ...);
//   3. runs its script, the virtual on_<method>(same parameters), which answers default_result
//      (CUPTI_ERROR_NOT_INITIALIZED unless configured) until a test fake overrides it.
// Test fakes override only the on_<method> they script. Locking: the P entry points (profiler and
// PM sampling, which never call back) run their script with `m` held; the X entry points run it
// without (the activity ones call back into the collector), and scripts take `m` as they need.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "torchpilot/hooks/gpu/cupti_api.h"

namespace torchpilot {
namespace detail {

class CuptiApiFake : public CuptiApi {
 public:
  explicit CuptiApiFake(CUptiResult default_result = CUPTI_ERROR_NOT_INITIALIZED)
      : default_result(default_result) {}

  CUptiResult default_result;                 // what an entry point without a script answers
  mutable std::mutex m;                       // guards what follows and the P scripts
  std::map<std::string, CUptiResult> fail;    // CUPTI symbol -> result it answers instead
  std::vector<std::string> bad_struct_sizes;  // params structs passed with a wrong structSize

  std::string origin() const override { return "fake"; }

#define TORCHPILOT_FAKE_X(method, symbol, params, args)                 \
  CUptiResult method params final {                                     \
    if (CUptiResult r = failure(#symbol); r != CUPTI_SUCCESS) return r; \
    return on_##method args;                                            \
  }                                                                     \
  virtual CUptiResult on_##method params { return default_result; }
#define TORCHPILOT_FAKE_P(method, symbol, Params)                                        \
  CUptiResult method(Params* p) final {                                                  \
    std::lock_guard<std::mutex> lock(m);                                                 \
    if (p == nullptr || p->structSize != Params##_STRUCT_SIZE) {                         \
      bad_struct_sizes.push_back(#Params);                                               \
    }                                                                                    \
    if (p == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;                              \
    if (auto it = fail.find(#symbol); it != fail.end() && it->second != CUPTI_SUCCESS) { \
      return it->second;                                                                 \
    }                                                                                    \
    return on_##method(p);                                                               \
  }                                                                                      \
  virtual CUptiResult on_##method(Params* p) { return default_result; }
  TORCHPILOT_CUPTI_ENTRY_POINTS(TORCHPILOT_FAKE_X, TORCHPILOT_FAKE_P)
#undef TORCHPILOT_FAKE_X
#undef TORCHPILOT_FAKE_P

 private:
  CUptiResult failure(const char* symbol) const {
    std::lock_guard<std::mutex> lock(m);
    auto it = fail.find(symbol);
    return it == fail.end() ? CUPTI_SUCCESS : it->second;
  }
};

}  // namespace detail
}  // namespace torchpilot
