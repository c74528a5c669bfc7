// GPU truth on a real GPU (label gpu; skips without one): the classic one-SM kernel that reads
// ~100% busy, a bf16 GEMM loop that fills the SMs and tensor pipes, and PM counters against the
// activity trace on a mixed workload. (A run under PyTorch's profiler: gpu_profiler_test.cpp.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>

#include "gpu_test_support.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"
#include "torchpilot/torchpilot.h"

#if TORCHPILOT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <dlfcn.h>
#endif

namespace torchpilot {
namespace {

#if TORCHPILOT_TORCH_CUDA

// A kernel that keeps one block of 32 threads busy for `ns` nanoseconds (spinning on the GPU's
// global timer). PTX loaded through the driver API, so no CUDA compiler is needed to build.
const char* kSpinPtx = R"(
.version 7.0
.target sm_70
.address_size 64
.visible .entry tp_spin(.param .u64 ns)
{
  .reg .pred %p;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [ns];
  mov.u64 %rd2, %globaltimer;
LOOP:
  mov.u64 %rd3, %globaltimer;
  sub.s64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p, %rd4, %rd1;
  @%p bra LOOP;
  ret;
}
)";

class SpinKernel {
 public:
  SpinKernel() {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    load_ = reinterpret_cast<LoadFn>(dlsym(lib_, "cuModuleLoadData"));
    get_ = reinterpret_cast<GetFn>(dlsym(lib_, "cuModuleGetFunction"));
    launch_ = reinterpret_cast<LaunchFn>(dlsym(lib_, "cuLaunchKernel"));
    if (!load_ || !get_ || !launch_) return;
    torch::zeros({1}, torch::kCUDA);  // LibTorch makes its primary context current here
    void* module = nullptr;
    if (load_(&module, kSpinPtx) != 0 || get_(&fn_, module, "tp_spin") != 0) fn_ = nullptr;
  }
  bool ok() const { return fn_ != nullptr; }
  // One block of 32 threads on the current stream.
  void launch(int64_t ns) {
    uint64_t arg = static_cast<uint64_t>(ns);
    void* params[] = {&arg};
    void* stream = at::cuda::getCurrentCUDAStream().stream();
    ASSERT_EQ(launch_(fn_, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr), 0);
  }

 private:
  using LoadFn = int (*)(void**, const void*);
  using GetFn = int (*)(void**, void*, const char*);
  using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, void*, void**, void**);
  void* lib_ = nullptr;
  LoadFn load_ = nullptr;
  GetFn get_ = nullptr;
  LaunchFn launch_ = nullptr;
  void* fn_ = nullptr;
};

using testing_support::gpu_config;
using testing_support::PilotRun;

void print_gpu(const char* what, const EpochSummary& s) {
  if (!s.sections.get<GpuEpochStats>()) return;
  const GpuStats& g = s.sections.get<GpuEpochStats>()->stats;
  std::printf(
      "[%s] %s: counter util %.4f, kernel util %.4f, NVML %.3f, SM eff %.4f, est SM eff %.4f, "
      "tensor %.4f, DRAM %.4f, occupancy %.4f, traced %lld steps, kernels %lld\n",
      what, s.sections.get<GpuEpochStats>()->device.c_str(), g.counter_utilization,
      g.gpu_utilization, g.nvml_utilization, g.sm_efficiency, g.estimated_sm_efficiency,
      g.tensor_activity, g.dram_throughput, g.achieved_occupancy,
      static_cast<long long>(s.sections.get<GpuEpochStats>()->traced_steps),
      static_cast<long long>(g.kernels));
}

class GpuTruthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// (1) One block on one SM for seconds: nvidia-smi's view says busy, the SMs say otherwise.
TEST_F(GpuTruthTest, OneSmKernelIsBusyButNotEfficient) {
  SpinKernel spin;
  ASSERT_TRUE(spin.ok()) << "could not load the spin kernel through the driver API";
  PilotRun run(gpu_config(1, 3));
  TORCHPILOT_REQUIRE_COLLECTORS(run, "pm_sampling", "activity");
  for (int i = 0; i < 6; ++i) {
    auto step = run.pilot->step(1);
    spin.launch(400 * 1000 * 1000);  // 0.4 s
    torch::cuda::synchronize();
  }
  run.pilot->end_epoch();
  const EpochSummary& s = run.epoch();
  print_gpu("one-SM", s);
  ASSERT_TRUE(s.sections.get<GpuEpochStats>());
  const GpuStats& g = s.sections.get<GpuEpochStats>()->stats;
  EXPECT_EQ(s.sections.get<GpuEpochStats>()->traced_steps, 3);
  EXPECT_GE(g.gpu_utilization, 0.95);  // kernel union: what nvidia-smi calls utilization
  EXPECT_GE(g.counter_utilization, 0.95);
  EXPECT_LE(g.sm_efficiency, 0.02);  // 1 of 132 SMs = 0.76%
  EXPECT_LE(g.estimated_sm_efficiency, 0.02);
  const auto& advice = run.sink->advice.back();
  auto it = std::find_if(advice.begin(), advice.end(),
                         [](const Advice& a) { return a.id == "busy_inefficient"; });
  ASSERT_NE(it, advice.end()) << "the classic case must be diagnosed";
  EXPECT_EQ(it->severity, Severity::kHigh);
  EXPECT_NE(it->cause.find("tp_spin"), std::string::npos) << it->cause;
}

// (2) A large bf16 GEMM loop fills the SMs and keeps the tensor pipes busy.
TEST_F(GpuTruthTest, Bf16GemmLoopIsEfficient) {
  auto a = torch::randn({8192, 8192}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  auto b = torch::randn({8192, 8192}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  auto c = torch::mm(a, b);  // cuBLAS warm-up before measuring
  torch::cuda::synchronize();
  PilotRun run(gpu_config(1000000, 1));
  TORCHPILOT_REQUIRE_COLLECTORS(run, "pm_sampling");
  // About a second: NVML's utilization is an average over its own period, which lags the start.
  for (int i = 0; i < 24; ++i) {
    auto step = run.pilot->step(1);
    for (int k = 0; k < 30; ++k) c = torch::mm(a, b);
    torch::cuda::synchronize();
  }
  run.pilot->end_epoch();
  const EpochSummary& s = run.epoch();
  print_gpu("bf16 GEMM", s);
  ASSERT_TRUE(s.sections.get<GpuEpochStats>());
  EXPECT_GE(s.sections.get<GpuEpochStats>()->stats.sm_efficiency, 0.90);
  EXPECT_GE(s.sections.get<GpuEpochStats>()->stats.tensor_activity, 0.5);
  const GpuStats& g = s.sections.get<GpuEpochStats>()->stats;
  std::printf("[bf16 GEMM] NVML SM clock %.0f MHz while busy, clock limited %.2f of readings\n",
              g.sm_clock_mhz, g.clock_limited);
  if (g.nvml_utilization >= 0.5) {
    // NVML read while the GEMMs kept the GPU busy (readings under 50% utilization do not count
    // for the clock): its SM clock and how often a limit held it.
    EXPECT_GT(g.sm_clock_mhz, 500.0);
    EXPECT_LT(g.sm_clock_mhz, 3000.0);
    EXPECT_GE(g.clock_limited, 0.0);
    EXPECT_LE(g.clock_limited, 1.0);
  }
  const auto& advice = run.sink->advice.back();
  EXPECT_TRUE(std::none_of(advice.begin(), advice.end(),
                           [](const Advice& x) { return x.id == "busy_inefficient"; }));
}

// (3) PM-sampled SM activity agrees with the activity trace's busy time on a mixed workload
// whose kernels each fill the GPU (large elementwise, reductions, softmax, big GEMMs), with idle
// gaps between bursts. (Kernels that leave SMs idle make the two differ: that is the point of
// SM efficiency, and test (1) covers it.)
TEST_F(GpuTruthTest, PmSmActivityAgreesWithTraceBusyTime) {
  auto x = torch::randn({64, 1 << 20}, torch::kCUDA);
  auto s = torch::randn({4096, 8192}, torch::kCUDA);
  auto a = torch::randn({8192, 8192}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  auto c = torch::mm(a, a);
  torch::cuda::synchronize();
  constexpr int kSteps = 16;
  PilotRun run(gpu_config(0, kSteps));  // the window opens after step 0: steps 1..16 traced
  TORCHPILOT_REQUIRE_COLLECTORS(run, "pm_sampling", "activity");
  for (int i = 0; i < kSteps + 1; ++i) {
    auto step = run.pilot->step(1);
    for (int k = 0; k < 8; ++k) x = x * 1.0001f + 0.5f;
    auto r = x.sum() + torch::softmax(s, 1).sum();
    c = torch::mm(a, a);
    c = torch::mm(c, a);
    torch::cuda::synchronize();
    std::this_thread::sleep_for(std::chrono::milliseconds(4 + (i % 3) * 3));  // GPU idle
  }
  run.pilot->end_epoch();
  const EpochSummary& e = run.epoch();
  print_gpu("mixed", e);
  ASSERT_TRUE(e.sections.get<GpuEpochStats>());
  EXPECT_EQ(e.sections.get<GpuEpochStats>()->traced_steps, kSteps);
  // Over the traced steps (time-weighted), and per step.
  double wall = 0, busy = 0, sm = 0, gr = 0;
  int compared = 0;
  for (const auto& r : run.sink->late<GpuStepRecord>()) {
    if (!r.traced || !measured(r.stats.sm_efficiency) || !measured(r.stats.gpu_utilization)) {
      continue;
    }
    ++compared;
    const double w = static_cast<double>(r.stats.wall_ns);
    wall += w;
    busy += r.stats.gpu_utilization * w;
    sm += r.stats.sm_efficiency * w;
    gr += r.stats.counter_utilization * w;
    std::printf("  step %lld: %.2f ms, trace busy %.4f, PM SM active %.4f, PM GR active %.4f\n",
                static_cast<long long>(r.step), w / 1e6, r.stats.gpu_utilization,
                r.stats.sm_efficiency, r.stats.counter_utilization);
  }
  ASSERT_GE(compared, kSteps - 2);
  busy /= wall;
  sm /= wall;
  gr /= wall;
  std::printf("  traced steps: trace busy %.4f, PM SM active %.4f, PM GR active %.4f\n", busy, sm,
              gr);
  EXPECT_GT(busy, 0.2);
  EXPECT_LT(busy, 0.9);
  EXPECT_NEAR(sm, busy, 0.05);
  EXPECT_NEAR(gr, busy, 0.05);
}

// (4) Kernel classes on Hopper's real kernel names: a bf16 and an fp32 (TF32 off) matmul, a
// softmax over the last dimension of a 4-d tensor (an unfused attention's piece), an elementwise
// add; the classes and idle add up to the traced time.
TEST_F(GpuTruthTest, KernelClassesOfRealKernels) {
  const bool tf32 = at::globalContext().allowTF32CuBLAS();
  at::globalContext().setAllowTF32CuBLAS(false);
  auto a = torch::randn({4096, 4096}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  auto f = torch::randn({2048, 2048}, torch::kCUDA);
  auto scores = torch::randn({8, 16, 512, 512}, torch::kCUDA);
  auto c = torch::mm(a, a) + torch::mm(f, f).sum();
  torch::cuda::synchronize();
  PilotRun run(gpu_config(1, 4));
  TORCHPILOT_REQUIRE_COLLECTORS(run, "activity");
  for (int i = 0; i < 6; ++i) {
    auto step = run.pilot->step(1);
    for (int k = 0; k < 4; ++k) {
      c = torch::mm(a, a);
      auto d = torch::mm(f, f);
      auto p = torch::softmax(scores, -1);
      f = f + 1e-6 * d;
    }
    torch::cuda::synchronize();
  }
  run.pilot->end_epoch();
  at::globalContext().setAllowTF32CuBLAS(tf32);
  const GpuEpochStats* g = run.epoch().sections.get<GpuEpochStats>();
  ASSERT_NE(g, nullptr);
  const KernelClassStats& k = g->kernel_classes;
  ASSERT_GT(k.steps, 0);
  for (int i = 0; i < kKernelClasses; ++i) {
    std::printf("  %s: %.3f ms/step, %.1f launches/step\n", to_string(static_cast<KernelClass>(i)),
                k.per_step_ms(k.ns[static_cast<size_t>(i)]),
                static_cast<double>(k.launches[static_cast<size_t>(i)]) / k.steps);
  }
  for (const KernelSummary& ks : g->top_kernels) {
    std::printf("  [%s] %s\n", to_string(classify_kernel(ks.name).cls), ks.name.c_str());
  }
  const auto ns = [&](KernelClass c) { return k.ns[static_cast<size_t>(c)]; };
  EXPECT_GT(ns(KernelClass::kTensorGemm), 0) << "the bf16 matmul";
  EXPECT_GT(ns(KernelClass::kSimtGemm), 0) << "the fp32 matmul with TF32 off";
  EXPECT_GT(ns(KernelClass::kAttention), 0) << "the softmax";
  EXPECT_GT(ns(KernelClass::kElementwise), 0);
  EXPECT_EQ(ns(KernelClass::kOther), 0);
  EXPECT_NEAR(k.busy_ns() + k.idle_ns, static_cast<double>(k.traced_ns), 1e3);
}

#else

TEST(GpuTruthTest, NeedsCudaLibTorch) { GTEST_SKIP() << "LibTorch without CUDA"; }

#endif

}  // namespace
}  // namespace torchpilot
