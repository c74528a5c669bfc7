// Diagnostic (GPU machine): what a GPU step marker costs the training thread, call by call, on a
// trainer-like loop. On an H200 the markers were 8.5 us of the always-on GPU part's 17 us a step
// (short_epochs with gpu.step_markers off; scripts/gpu_run.sh shortparts). Phases, each over
// STEPS steps of a small-kernel workload (KERNELS matmuls of 256x256 a step, never synchronized
// but every 50 steps), rotated over CYCLES cycles:
//   none      the workload alone (the timed call is empty)
//   ctx       cuCtxGetCurrent
//   stream    LibTorch's current stream (what the marker stream provider returns)
//   record    cuEventRecord of a pooled event on that stream (no resolver thread)
//   markers   CudaMarkers::record, the library's path, its resolver thread polling every 1 ms
// For each phase the median and mean of the timed call (ns) and the median step time (us); one
// JSON line per phase and cycle. Not part of the library; results in bench/runs/.
//   marker_cost_probe [cycles] [steps] [kernels]
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda_driver.h"
#include "cuda_markers.h"
#include "marker_stream.h"
#include "torchpilot/runtime/core/logging.h"  // no spdlog header next to LibTorch's (the wheel's own fmt)

namespace {

using Clock = std::chrono::steady_clock;
namespace d = torchpilot::detail;

void* current_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

struct Stats {
  double call_median_ns = 0, call_mean_ns = 0, step_median_us = 0;
};

template <typename Call>
Stats run_phase(int steps, int kernels, const torch::Tensor& a, Call&& call) {
  std::vector<double> calls, step_us;
  calls.reserve(steps);
  step_us.reserve(steps);
  auto x = a;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    for (int k = 0; k < kernels; ++k) x = torch::matmul(x, a).tanh_();
    const auto c0 = Clock::now();
    call(s);
    const auto c1 = Clock::now();
    if (s % 50 == 49) torch::cuda::synchronize();  // keep the queue bounded, as a trainer's .item()
    calls.push_back(std::chrono::duration<double, std::nano>(c1 - c0).count());
    step_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  torch::cuda::synchronize();
  Stats st;
  double sum = 0;
  for (double c : calls) sum += c;
  st.call_mean_ns = sum / static_cast<double>(calls.size());
  std::sort(calls.begin(), calls.end());
  st.call_median_ns = calls[calls.size() / 2];
  std::sort(step_us.begin(), step_us.end());
  st.step_median_us = step_us[step_us.size() / 2];
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  const int cycles = argc > 1 ? std::atoi(argv[1]) : 3;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 2000;
  const int kernels = argc > 3 ? std::atoi(argv[3]) : 20;
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "marker_cost_probe: no CUDA device\n");
    return 2;
  }
  std::string error;
  auto api = d::load_cuda_driver(&error);
  if (!api) {
    std::fprintf(stderr, "marker_cost_probe: no driver: %s\n", error.c_str());
    return 2;
  }
  d::set_marker_stream_provider(&current_stream);
  const torch::Tensor a =
      torch::randn({256, 256}, torch::TensorOptions().device(torch::kCUDA)) * 0.05;
  torch::cuda::synchronize();  // the context is current from here

  std::vector<CUevent> pool(256);
  for (auto& e : pool) {  // timing on, as the library's events
    if (api->event_create(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
      std::fprintf(stderr, "marker_cost_probe: cuEventCreate failed\n");
      return 2;
    }
  }
  auto logger = torchpilot::torchpilot_logger();
  const char* names[] = {"none", "ctx", "stream", "record", "markers"};
  for (int cycle = 0; cycle < cycles; ++cycle) {
    for (int p = 0; p < 5; ++p) {
      const int phase = (p + cycle) % 5;  // rotated: no phase always first
      Stats st;
      volatile uintptr_t sink = 0;
      if (phase == 0) {
        st = run_phase(steps, kernels, a, [](int) {});
      } else if (phase == 1) {
        st = run_phase(steps, kernels, a, [&](int) {
          CUcontext c = nullptr;
          (void)api->ctx_get_current(&c);
          sink = sink + reinterpret_cast<uintptr_t>(c);
        });
      } else if (phase == 2) {
        st = run_phase(steps, kernels, a,
                       [&](int) { sink = sink + reinterpret_cast<uintptr_t>(current_stream(0)); });
      } else if (phase == 3) {
        st = run_phase(steps, kernels, a, [&](int s) {
          (void)api->event_record(pool[static_cast<size_t>(s) % pool.size()],
                                  static_cast<CUstream>(current_stream(0)));
        });
      } else {
        d::CudaMarkers markers(*api, 0, *logger);
        std::vector<torchpilot::MarkerRecord> done;
        (void)markers.record(0);  // the first record hands set-up to the resolver thread
        for (int i = 0; i < 200 && markers.counters().anchors == 0; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        uint64_t id = 1;
        st = run_phase(steps, kernels, a, [&](int s) {
          (void)markers.record(id++);
          if (s % 20 == 19) markers.drain(done);
        });
        const auto c = markers.counters();
        std::printf(
            "{\"phase\":\"markers_counters\",\"cycle\":%d,\"recorded\":%lld,\"resolved\":%lld,"
            "\"pool_exhausted\":%lld,\"errors\":%lld}\n",
            cycle, static_cast<long long>(c.recorded), static_cast<long long>(c.resolved),
            static_cast<long long>(c.pool_exhausted), static_cast<long long>(c.errors));
        markers.stop();
      }
      std::printf(
          "{\"phase\":\"%s\",\"cycle\":%d,\"steps\":%d,\"kernels\":%d,\"call_median_ns\":%.0f,"
          "\"call_mean_ns\":%.0f,\"step_median_us\":%.1f}\n",
          names[phase], cycle, steps, kernels, st.call_median_ns, st.call_mean_ns,
          st.step_median_us);
      std::fflush(stdout);
    }
  }
  for (auto& e : pool) (void)api->event_destroy(e);
  return 0;
}
