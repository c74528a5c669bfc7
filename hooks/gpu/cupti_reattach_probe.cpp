// Diagnostic (GPU machine): what CUPTI leaves behind after an activity-trace window, and which way
// of bringing the profiler API back (for PM sampling) after cuptiFinalize keeps kernel launches
// fast. One variant per process (cuptiFinalize is process-wide):
//   cupti_reattach_probe baseline | probe | nofinalize | finalize | reattach-subscribe |
//                        reattach-timestamp | reattach-profiler | backend-pm | backend-nopm |
//                        kinds-kernel | kinds-kernel-noprof | kinds-kernel-nosub |
//                        kinds-subscribe-only | kinds-all | kinds-all-callbacks | kinds-ab
// (kinds-*: which activity kinds and callbacks make a launch dearer while a window is on;
// kinds-ab: in one process, rounds of six states in rotated order -- subscribed only, the kernel
// kind, the window's four kinds, and those with the window's main sync and copy callbacks (8 of
// its 14: no _ptsz/_ptds variants, cudaThreadSynchronize, cuCtxSynchronize_v2), the runtime ones
// only, the driver ones only -- and each state's median step against subscribed-only, per launch.)
// (kinds-kernel-nosub: the kernel kind without a callback subscription, as a tracer that needs no
// callbacks would run; kinds-subscribe-only: subscribed, buffers registered, no kind enabled.)
// (backend-*: torchpilot's own GPU backend, PM sampling on or off, a window, release_trace().)
// Prints the median time of a launch-bound step (2000 tiny kernels + synchronize) before the
// window, during it, and after it. Not part of the library; results in bench/runs/ (baseline
// bench/baselines/cupti-reattach-probe/h200.jsonl).
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_profiler_target.h>
#include <cupti_runtime_cbid.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cupti_backend.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/logging.h"  // no spdlog header next to LibTorch's (the wheel's own fmt)
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace {

template <typename F>
F sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8u << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}
void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t) { std::free(buffer); }
void CUPTIAPI no_op(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

double step_ms(torch::Tensor& y, int steps) {
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) y.add_(1.0);
    torch::cuda::synchronize();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string variant = argc > 1 ? argv[1] : "baseline";
  auto y = torch::zeros({1}, torch::kCUDA);
  step_ms(y, 10);
  const double before = step_ms(y, 30);
  if (variant.rfind("backend", 0) == 0) {
    auto logger = torchpilot::torchpilot_logger();
    torchpilot::GpuConfig c;
    c.nvml = false;
    c.pm_sampling = variant == "backend-pm";
    auto b = torchpilot::make_cupti_backend(c, *logger);
    b->start();
    const double pm_only = step_ms(y, 30);
    b->start_trace();
    const double during = step_ms(y, 20);
    b->stop_trace();
    b->flush();
    b->release_trace();
    step_ms(y, 5);
    const double after = step_ms(y, 30);
    torchpilot::GpuEventBatch batch;
    b->drain(batch);
    std::string status;
    for (const auto& st : b->status()) status += st.name + (st.active ? "=on " : "=off ");
    std::printf(
        "{\"variant\": \"%s\", \"before_ms\": %.3f, \"collectors_started_ms\": %.3f, "
        "\"during_ms\": %.3f, \"after_ms\": %.3f, \"after_vs_before\": %.4f, \"kernels\": %zu, "
        "\"pm_samples\": %zu, \"status\": \"%s\"}\n",
        variant.c_str(), before, pm_only, during, after, after / before - 1, batch.kernels.size(),
        batch.pm.size(), status.c_str());
    return 0;
  }
  void* lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen("libcupti.so.13", RTLD_NOW);
  if (lib == nullptr) {
    std::printf("{\"variant\": \"%s\", \"error\": \"no libcupti\"}\n", variant.c_str());
    return 1;
  }
  auto subscribe = sym<decltype(&cuptiSubscribe)>(lib, "cuptiSubscribe");
  auto unsubscribe = sym<decltype(&cuptiUnsubscribe)>(lib, "cuptiUnsubscribe");
  auto reg = sym<decltype(&cuptiActivityRegisterCallbacks)>(lib, "cuptiActivityRegisterCallbacks");
  auto enable = sym<decltype(&cuptiActivityEnable)>(lib, "cuptiActivityEnable");
  auto disable = sym<decltype(&cuptiActivityDisable)>(lib, "cuptiActivityDisable");
  auto flush = sym<decltype(&cuptiActivityFlushAll)>(lib, "cuptiActivityFlushAll");
  auto finalize = sym<decltype(&cuptiFinalize)>(lib, "cuptiFinalize");
  auto timestamp = sym<decltype(&cuptiGetTimestamp)>(lib, "cuptiGetTimestamp");
  auto prof_init = sym<decltype(&cuptiProfilerInitialize)>(lib, "cuptiProfilerInitialize");
  auto prof_deinit = sym<decltype(&cuptiProfilerDeInitialize)>(lib, "cuptiProfilerDeInitialize");
  auto init_profiler = [&]() {
    CUpti_Profiler_Initialize_Params p{};
    p.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE;
    return static_cast<int>(prof_init(&p));
  };
  if (variant == "kinds-ab") {
    CUpti_Profiler_Initialize_Params ip{};
    ip.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE;
    prof_init(&ip);  // as the backend does at construction
    auto enable_cb = sym<decltype(&cuptiEnableCallback)>(lib, "cuptiEnableCallback");
    CUpti_SubscriberHandle h = nullptr;
    subscribe(&h, no_op, nullptr);
    reg(requested, completed);
    const CUpti_ActivityKind all[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                      CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
                                      CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};
    // The window's callbacks (hooks/gpu/cupti_activity_trace.cpp: kSyncCallbacks, kCopyCallbacks).
    const std::pair<CUpti_CallbackDomain, CUpti_CallbackId> cbs[] = {
        {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020},
        {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020},
        {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020},
        {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize},
        {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize},
        {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize},
        {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020},
        {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020}};
    const char* names[] = {"subscribed",
                           "kernel",
                           "four_kinds",
                           "four_kinds_callbacks",
                           "four_kinds_runtime_cbs",
                           "four_kinds_driver_cbs"};
    auto set_state = [&](int state) {
      for (size_t k = 0; k < 4; ++k) {
        const bool want = (state == 1 && k == 0) || state >= 2;
        if (want) {
          enable(all[k]);
        } else {
          disable(all[k]);
        }
      }
      for (const auto& [d, c] : cbs) {
        const bool on = state == 3 || (state == 4 && d == CUPTI_CB_DOMAIN_RUNTIME_API) ||
                        (state == 5 && d == CUPTI_CB_DOMAIN_DRIVER_API);
        enable_cb(on ? 1 : 0, h, d, c);
      }
    };
    std::vector<double> per[6];
    for (int round = 0; round < 12; ++round) {
      for (int i = 0; i < 6; ++i) {
        const int state = (i + round) % 6;
        set_state(state);
        step_ms(y, 2);
        per[state].push_back(step_ms(y, 5));
      }
    }
    set_state(0);
    flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    unsubscribe(h);
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("{\"variant\": \"kinds-ab\", \"before_ms\": %.3f, \"launches_per_step\": 2000",
                before);
    for (int k = 0; k < 6; ++k) {
      std::printf(", \"%s_ms\": %.3f, \"%s_us_per_launch\": %.3f", names[k], med(per[k]), names[k],
                  (med(per[k]) - med(per[0])) * 1000 / 2000);
    }
    std::printf("}\n");
    return 0;
  }
  const bool kinds = variant.rfind("kinds-", 0) == 0;
  // As the backend does at construction (kinds-kernel-noprof: never, to see what it costs).
  int init_before = variant == "kinds-kernel-noprof" ? -1 : init_profiler();
  CUpti_SubscriberHandle h = nullptr;
  subscribe(&h, no_op, nullptr);  // the construction-time probe
  unsubscribe(h);
  double during = -1, after = -1;
  int init_after = -1, init_after2 = -1;
  if (variant != "baseline" && variant != "probe") {
    const bool subscribed = variant != "kinds-kernel-nosub";
    if (subscribed) subscribe(&h, no_op, nullptr);
    reg(requested, completed);
    std::vector<CUpti_ActivityKind> on = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL};
    if (variant == "kinds-subscribe-only") on.clear();
    if (!kinds || variant.rfind("kinds-all", 0) == 0)
      on.push_back(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
    if (variant.rfind("kinds-all", 0) == 0) {
      on.push_back(CUPTI_ACTIVITY_KIND_MEMCPY);
      on.push_back(CUPTI_ACTIVITY_KIND_MEMSET);
    }
    for (auto k : on) enable(k);
    if (variant == "kinds-all-callbacks") {
      auto enable_cb = sym<decltype(&cuptiEnableCallback)>(lib, "cuptiEnableCallback");
      enable_cb(1, h, CUPTI_CB_DOMAIN_RUNTIME_API,
                CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020);
      enable_cb(1, h, CUPTI_CB_DOMAIN_RUNTIME_API,
                CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020);
      enable_cb(1, h, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize);
      enable_cb(1, h, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize);
    }
    during = step_ms(y, 20);
    for (auto k : on) disable(k);
    flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (subscribed) unsubscribe(h);
    if (variant != "nofinalize") {
      CUpti_Profiler_DeInitialize_Params d{};
      d.structSize = CUpti_Profiler_DeInitialize_Params_STRUCT_SIZE;
      prof_deinit(&d);
      finalize();
      if (variant == "reattach-subscribe") {
        subscribe(&h, no_op, nullptr);
        unsubscribe(h);
        init_after = init_profiler();
      } else if (variant == "reattach-timestamp") {
        uint64_t t = 0;
        timestamp(&t);
        init_after = init_profiler();
      } else if (variant == "reattach-profiler") {
        init_after = init_profiler();
        torch::cuda::synchronize();
        init_after2 = init_profiler();
      }
    }
  }
  step_ms(y, 5);
  after = step_ms(y, 30);
  std::printf(
      "{\"variant\": \"%s\", \"before_ms\": %.3f, \"during_ms\": %.3f, \"after_ms\": %.3f, "
      "\"after_vs_before\": %.4f, \"profiler_init_at_start\": %d, \"profiler_init_after\": %d, "
      "\"profiler_init_after_retry\": %d}\n",
      variant.c_str(), before, during, after, after / before - 1, init_before, init_after,
      init_after2);
  return 0;
}
