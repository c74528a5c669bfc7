// cupti_capture (GPU machine): records the CUPTI fixtures that tests/unit/cupti_replay_test.cpp
// replays without a GPU (format: hooks/gpu/cupti_fixture.h; tests/fixtures/cupti/README.md).
// From the repository root, with a CUDA LibTorch and the CUDA 13 toolkit:
//
//   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=<libtorch>
//   ninja -C build-gpu cupti_capture
//   build-gpu/bench/cupti_capture --out tests/fixtures/cupti
//
// It runs torchpilot's own GPU backend (PM sampling always on, an activity-trace window of
// kTraceSteps steps) with its CuptiApi wrapped in a recorder, over a short LibTorch workload
// (about 1.5 s): per step an elementwise chain, reductions and a softmax, two bf16 matmuls, a
// pageable host-to-device copy, a .item() (device-to-host copy and sync), then a few ms of idle
// GPU. The recorder keeps what the collectors receive from CUPTI at the inputs of the pure
// converters: each activity record as cuptiActivityGetNextRecord handed it over (convert_record),
// and each PM sample's timestamps and evaluated metric values (to_pm_sample), plus the TimeBase
// offset and the steps on the steady clock. Exits non-zero (writing nothing) when there is no GPU
// or PM sampling or tracing is unavailable. Not part of the library.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cupti_api.h"
#include "cupti_backend.h"
#include "cupti_fixture.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/logging.h"  // no spdlog header next to LibTorch's (the wheel's own fmt)
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace {

using torchpilot::detail::CuptiApi;
namespace fixture = torchpilot::detail::cupti_fixture;

constexpr int kSteps = 100;
constexpr int kTraceFirst = 20;  // steps kTraceFirst .. kTraceFirst + kTraceSteps - 1 are traced
constexpr int kTraceSteps = 8;
constexpr double kPmIntervalMs = 4;
constexpr size_t kMaxActivityRecords = 600;
constexpr size_t kMaxPmSamples = 400;

// Forwards every entry point to the loaded libcupti (generated from the entry-point list).
class ForwardingCuptiApi : public CuptiApi {
 public:
  explicit ForwardingCuptiApi(std::unique_ptr<CuptiApi> inner) : inner_(std::move(inner)) {}
  std::string origin() const override { return inner_->origin(); }
#define TORCHPILOT_FORWARD(method, symbol, params, args) \
  CUptiResult method params override { return inner_->method args; }
#define TORCHPILOT_FORWARD_P(method, symbol, Params) \
  CUptiResult method(Params* p) override { return inner_->method(p); }
  TORCHPILOT_CUPTI_ENTRY_POINTS(TORCHPILOT_FORWARD, TORCHPILOT_FORWARD_P)
#undef TORCHPILOT_FORWARD
#undef TORCHPILOT_FORWARD_P

 private:
  std::unique_ptr<CuptiApi> inner_;
};

// What the recorder kept; shared with main() (the backend owns the recorder).
struct Recorded {
  std::mutex mutex;
  std::vector<std::string> activity;
  int64_t activity_capped = 0, activity_other_kinds = 0;
  std::map<size_t, std::pair<uint64_t, uint64_t>> sample_times;  // by sample index in the image
  std::vector<std::string> pm;
  int64_t pm_capped = 0;
  std::vector<std::string> metrics;  // of the first evaluated sample
};

class RecordingCuptiApi final : public ForwardingCuptiApi {
 public:
  RecordingCuptiApi(std::unique_ptr<CuptiApi> inner, std::shared_ptr<Recorded> out)
      : ForwardingCuptiApi(std::move(inner)), out_(std::move(out)) {}

  // Each record the collector is handed (on CUPTI's buffer-completion thread).
  CUptiResult activity_get_next_record(uint8_t* buffer, size_t valid,
                                       CUpti_Activity** record) override {
    const CUptiResult r = ForwardingCuptiApi::activity_get_next_record(buffer, valid, record);
    if (r != CUPTI_SUCCESS || *record == nullptr) return r;
    std::string line = fixture::activity_line(**record);
    std::lock_guard<std::mutex> lock(out_->mutex);
    if (line.empty()) {
      ++out_->activity_other_kinds;
    } else if (out_->activity.size() >= kMaxActivityRecords) {
      ++out_->activity_capped;
    } else {
      out_->activity.push_back(std::move(line));
    }
    return r;
  }

  // The decoder asks for a sample's times, then evaluates the same sample (PmSampler::decode).
  CUptiResult pm_sampling_counter_data_get_sample_info(
      CUpti_PmSampling_CounterData_GetSampleInfo_Params* p) override {
    const CUptiResult r = ForwardingCuptiApi::pm_sampling_counter_data_get_sample_info(p);
    if (r == CUPTI_SUCCESS) {
      std::lock_guard<std::mutex> lock(out_->mutex);
      out_->sample_times[p->sampleIndex] = {p->startTimestamp, p->endTimestamp};
    }
    return r;
  }
  CUptiResult profiler_host_evaluate_to_gpu_values(
      CUpti_Profiler_Host_EvaluateToGpuValues_Params* p) override {
    const CUptiResult r = ForwardingCuptiApi::profiler_host_evaluate_to_gpu_values(p);
    if (r != CUPTI_SUCCESS) return r;
    std::lock_guard<std::mutex> lock(out_->mutex);
    const auto times = out_->sample_times.find(p->rangeIndex);
    if (times == out_->sample_times.end()) return r;
    fixture::PmLine s;
    s.start = times->second.first;
    s.end = times->second.second;
    s.first = !seen_first_;
    seen_first_ = true;
    for (size_t i = 0; i < p->numMetrics; ++i)
      s.values.emplace_back(p->ppMetricNames[i], p->pMetricValues[i]);
    if (out_->metrics.empty()) {
      for (const auto& v : s.values) out_->metrics.push_back(v.first);
    }
    if (out_->pm.size() >= kMaxPmSamples) {
      ++out_->pm_capped;
    } else {
      out_->pm.push_back(fixture::pm_line(s));
    }
    return r;
  }

 private:
  std::shared_ptr<Recorded> out_;
  bool seen_first_ = false;  // under out_->mutex
};

int64_t steady_ns() { return torchpilot::detail::steady_now_ns(); }

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir = "tests/fixtures/cupti";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--out DIR]  (default tests/fixtures/cupti)\n", argv[0]);
      return arg == "--help" ? 0 : 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "cupti_capture: no CUDA device\n");
    return 1;
  }

  // The workload's tensors and warm-up (cuBLAS, the caching allocator) before the collectors.
  torch::NoGradGuard no_grad;
  auto x = torch::randn({64, 1 << 20}, torch::kCUDA);
  auto s = torch::randn({4096, 8192}, torch::kCUDA);
  auto a = torch::randn({8192, 8192}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  auto host = torch::randn({1 << 20});  // 4 MiB of pageable host memory
  auto c = torch::mm(a, a);
  auto dev = host.to(torch::kCUDA);
  float sink = x.sum().item<float>();
  torch::cuda::synchronize();

  torchpilot::GpuConfig config;
  config.nvml = false;
  config.nvtx = false;
  config.pm_interval_ms = kPmIntervalMs;
  auto recorded = std::make_shared<Recorded>();
  CuptiApi* api = nullptr;  // the recorder, owned by the backend
  auto loaders = torchpilot::detail::dlopen_vendor_loaders(config);
  auto load_cupti = loaders.cupti;
  loaders.cupti = [&](std::string* error) -> std::unique_ptr<CuptiApi> {
    auto inner = load_cupti(error);
    if (inner == nullptr) return nullptr;
    auto recorder = std::make_unique<RecordingCuptiApi>(std::move(inner), recorded);
    api = recorder.get();
    return recorder;
  };
  auto logger = torchpilot::torchpilot_logger();
  auto backend = torchpilot::detail::make_cupti_backend(config, *logger, loaders);
  const torchpilot::GpuDeviceInfo device = backend->device();
  bool ok = device.sm_count > 0 && api != nullptr;
  for (const auto& st : backend->status()) {
    const bool needed = st.name == "pm_sampling" || st.name == "activity";
    std::fprintf(stderr, "cupti_capture: %s %s%s%s\n", st.name.c_str(), st.active ? "on" : "off",
                 st.active ? "" : ": ", st.reason.c_str());
    if (needed && !st.active) ok = false;
  }
  if (!ok) {
    std::fprintf(stderr, "cupti_capture: PM sampling and the activity trace are both needed\n");
    return 1;
  }

  fixture::CaptureInfo info;
  info.device = device.name;
  info.chip = device.chip;
  info.sm_count = device.sm_count;
  api->get_version(&info.cupti_version);
  torchpilot::detail::CuptiClock clock;
  if (!clock.measure(*api)) {
    std::fprintf(stderr, "cupti_capture: cuptiGetTimestamp failed\n");
    return 1;
  }
  info.time_base_offset_ns = clock.get().offset_ns;
  info.pm_interval_ms = kPmIntervalMs;
  info.h2d_pageable_bytes = host.numel() * static_cast<int64_t>(host.element_size());
  info.d2h_item_bytes = static_cast<int64_t>(sizeof(float));

  backend->start();
  bool traced = false;
  for (int i = 0; i < kSteps; ++i) {
    if (i == kTraceFirst) {
      info.trace_from = steady_ns();
      traced = backend->start_trace();
      if (!traced) {
        std::fprintf(stderr, "cupti_capture: start_trace() failed\n");
        backend->stop();
        return 1;
      }
    }
    fixture::StepSpan step;
    step.step = i;
    step.traced = i >= kTraceFirst && i < kTraceFirst + kTraceSteps;
    step.begin = steady_ns();
    for (int k = 0; k < 6; ++k) x = x * 1.0001f + 0.5f;  // elementwise chain
    auto r = x.sum() + torch::softmax(s, 1).sum();
    c = torch::mm(a, a);  // matmuls
    c = torch::mm(c, a);
    dev = host.to(torch::kCUDA);  // pageable host-to-device copy
    sink += r.item<float>();      // device-to-host copy and sync
    std::this_thread::sleep_for(std::chrono::milliseconds(4 + (i % 3) * 3));  // GPU idle
    step.end = steady_ns();
    info.steps.push_back(step);
    if (i == kTraceFirst + kTraceSteps - 1) {
      backend->stop_trace();
      backend->flush();
    }
  }
  torch::cuda::synchronize();
  backend->flush();
  torchpilot::GpuEventBatch batch;
  backend->drain(batch);
  backend->stop();
  backend->drain(batch);
  if (clock.measure(*api)) info.time_base_offset_after_ns = clock.get().offset_ns;

  std::vector<std::string> activity, pm;
  {
    std::lock_guard<std::mutex> lock(recorded->mutex);
    activity = recorded->activity;
    pm = recorded->pm;
    info.pm_metrics = recorded->metrics;
    info.activity_capped = recorded->activity_capped;
    info.activity_other_kinds = recorded->activity_other_kinds;
    info.pm_capped = recorded->pm_capped;
  }
  info.activity_records = static_cast<int64_t>(activity.size());
  info.activity_dropped = batch.dropped;
  info.pm_samples = static_cast<int64_t>(pm.size());
  info.notes = "cupti_capture: " + std::to_string(kSteps) + " steps, steps " +
               std::to_string(kTraceFirst) + ".." + std::to_string(kTraceFirst + kTraceSteps - 1) +
               " traced; backend converted " + std::to_string(batch.kernels.size()) + " kernels, " +
               std::to_string(batch.copies.size()) + " copies, " +
               std::to_string(batch.syncs.size()) + " syncs, " + std::to_string(batch.pm.size()) +
               " PM samples; checksum " + std::to_string(sink);
  if (activity.empty() || pm.empty()) {
    std::fprintf(stderr, "cupti_capture: nothing recorded (%zu activity records, %zu PM samples)\n",
                 activity.size(), pm.size());
    return 1;
  }
  std::string error;
  if (!fixture::write_fixture(out_dir, info, activity, pm, &error)) {
    std::fprintf(stderr, "cupti_capture: %s\n", error.c_str());
    return 1;
  }
  std::printf(
      "cupti_capture: %s (%s, %d SMs, CUPTI %u): %zu activity records (%lld over the cap, %lld "
      "of other kinds, %lld dropped), %zu PM samples (%lld over the cap), TimeBase offset %lld ns "
      "(drift %lld ns) -> %s\n",
      info.device.c_str(), info.chip.c_str(), info.sm_count, info.cupti_version, activity.size(),
      static_cast<long long>(info.activity_capped),
      static_cast<long long>(info.activity_other_kinds),
      static_cast<long long>(info.activity_dropped), pm.size(),
      static_cast<long long>(info.pm_capped), static_cast<long long>(info.time_base_offset_ns),
      static_cast<long long>(info.time_base_offset_after_ns - info.time_base_offset_ns),
      out_dir.c_str());
  return 0;
}
