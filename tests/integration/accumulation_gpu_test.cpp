// torchpilot::Accumulation on a GPU (label gpu; skips without one): a real out-of-memory error
// from the CUDA caching allocator in a trial step is recovered with every sample run exactly
// once, and a trial whose allocator peak exceeds autotune.memory_headroom fails with its peak.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fakes/autotune_config.h"
#include "torchpilot/hooks/memory/accumulation.h"
#include "torchpilot/runtime/memory/batch_policy.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace torchpilot {
namespace {

int64_t device_memory() {
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
  if (torch::cuda::is_available()) {
    return static_cast<int64_t>(at::cuda::getDeviceProperties(0)->totalGlobalMem);
  }
#endif
  return 0;
}

Config tuning_config(double headroom) {
  Config c = test::short_autotune_config();
  c.log.level = "warn";
  c.autotune.memory_headroom = headroom;
  return c;
}

constexpr int64_t kBatch = 32;
constexpr int64_t kSteps = 30;

// Each sample's loss is its own parameter: the gradient the optimizer sees counts how often each
// sample ran in the step. `extra(m)` bytes are held on the device during a micro-batch of size m.
struct RunResult {
  std::vector<double> runs;
  int64_t recoveries = 0;
  TuningDecision decision;
};

RunResult run_trainer(double headroom, const std::function<int64_t(int64_t)>& extra) {
  Pilot pilot(tuning_config(headroom));
  auto w = torch::zeros({kBatch * kSteps},
                        torch::dtype(torch::kDouble).device(torch::kCUDA).requires_grad(true));
  AccumulationOptions options;
  options.global_batch = kBatch;
  options.micro_batch = 2;
  options.choices = {2, 16};
  Accumulation acc(pilot, {w}, options);
  RunResult r;
  r.runs.assign(kBatch * kSteps, 0.0);
  for (int64_t s = 0; s < kSteps; ++s) {
    const auto ids = torch::arange(s * kBatch, (s + 1) * kBatch, torch::device(torch::kCUDA));
    auto step = pilot.step(kBatch);
    acc.step(
        {ids},
        [&](const std::vector<at::Tensor>& mb, const MicroBatch& m) {
          const auto loss =
              w.index_select(0, mb[0]).sum() / static_cast<double>(m.size) * m.loss_scale;
          loss.backward();
          if (m.index == 1 && extra(m.size) > 0) {
            // After the first micro-batch's backward: partial gradients are there.
            auto held =
                torch::empty({extra(m.size)}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
            held.fill_(1);
          }
        },
        [&] {
          const auto g = w.grad().cpu();
          for (int64_t i = 0; i < g.numel(); ++i) r.runs[i] += g[i].item<double>() * kBatch;
          w.mutable_grad() = torch::Tensor();
        });
  }
  r.recoveries = acc.recoveries();
  EXPECT_TRUE(pilot.tuning_finished());
  if (pilot.tuning_decision()) r.decision = *pilot.tuning_decision();
  return r;
}

TEST(AccumulationGpu, ARealOutOfMemoryInATrialIsRecoveredExactlyOnce) {
  const int64_t capacity = device_memory();
  if (capacity <= 0) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  // Micro-batch 16 asks for twice the device's memory: the caching allocator throws.
  const RunResult r = run_trainer(0.9, [&](int64_t size) { return size >= 16 ? 2 * capacity : 0; });
  EXPECT_EQ(r.recoveries, 1);
  for (size_t i = 0; i < r.runs.size(); ++i) {
    ASSERT_EQ(r.runs[i], 1.0) << "sample " << i << " ran " << r.runs[i] << " times";
  }
  ASSERT_EQ(r.decision.trials.size(), 2u);
  EXPECT_TRUE(r.decision.trials[1].failed);
  EXPECT_NE(r.decision.trials[1].note.find("out of memory"), std::string::npos)
      << r.decision.trials[1].note;
  EXPECT_EQ(r.decision.chosen.at(kMicroBatchKnob), 2);
  EXPECT_GE(r.decision.trials[0].peak_memory_fraction, 0);  // the allocator's figures are there
}

TEST(AccumulationGpu, APeakAboveTheHeadroomFailsTheTrial) {
  const int64_t capacity = device_memory();
  if (capacity <= 0) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  // Micro-batch 16 holds 40% of the device for a moment (it fits); the headroom is 30%.
  const RunResult r =
      run_trainer(0.3, [&](int64_t size) { return size >= 16 ? capacity * 4 / 10 : 0; });
  EXPECT_EQ(r.recoveries, 0);
  for (size_t i = 0; i < r.runs.size(); ++i) ASSERT_EQ(r.runs[i], 1.0) << "sample " << i;
  ASSERT_EQ(r.decision.trials.size(), 2u);
  const TrialResult& t = r.decision.trials[1];
  EXPECT_TRUE(t.failed);
  EXPECT_NE(t.note.find("autotune.memory_headroom"), std::string::npos) << t.note;
  EXPECT_GE(t.peak_memory_fraction, 0.4);
  EXPECT_LT(r.decision.trials[0].peak_memory_fraction, 0.3);
  EXPECT_EQ(r.decision.chosen.at(kMicroBatchKnob), 2);
}

}  // namespace
}  // namespace torchpilot
