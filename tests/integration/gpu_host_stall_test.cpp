// GPU tests (label gpu; they skip without a GPU) of issues 15 and 17 on real trainers: a real
// torch::save every N steps is a periodic stall with its measured share, and a short-epoch
// trainer's own torchpilot cost is reported each epoch, every step counted in one epoch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "torchpilot/runtime/stalls/step_outliers.h"
#include "torchpilot/torchpilot.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(GpuHostStall, TorchSaveEveryNStepsIsAPeriodicStallWithItsMeasuredShare) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device dev(torch::kCUDA);
  torch::manual_seed(0);
  // About 50 M parameters (200 MB): a save is many times a step.
  torch::nn::Sequential net(torch::nn::Linear(4096, 4096), torch::nn::ReLU(),
                            torch::nn::Linear(4096, 4096), torch::nn::ReLU(),
                            torch::nn::Linear(4096, 4096));
  net->to(dev);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(1e-4));
  const auto x = torch::randn({256, 4096}, dev);
  const std::string path = ::testing::TempDir() + "torchpilot-periodic-save.pt";

  torchpilot::Config c;
  c.gpu.trace_first_step = 1000000;  // no trace window in the measured epochs
  auto sink = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::PilotOptions o;
  o.sinks = {sink};
  torchpilot::Pilot pilot(c, o);
  constexpr int kPeriod = 25, kSteps = 150, kEpochs = 3;
  double saved_s = 0;  // the last epoch's saves, measured here
  for (int e = 0; e < kEpochs; ++e) {
    saved_s = 0;
    for (int i = 0; i < kSteps; ++i) {
      const int64_t step = pilot.steps();
      auto s = pilot.step(256);
      opt.zero_grad();
      net->forward(x).square().mean().backward();
      opt.step();
      torch::cuda::synchronize();
      if (step % kPeriod == kPeriod / 2) {
        const auto t0 = Clock::now();
        torch::save(net, path);
        saved_s += seconds_since(t0);
      }
    }
    pilot.end_epoch();
  }
  std::remove(path.c_str());
  const auto& e = sink->epochs.back();
  const auto* out = e.sections.get<torchpilot::OutlierStats>();
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->period, kPeriod);
  EXPECT_EQ(out->periodic_count, kSteps / kPeriod);
  const double measured_share = saved_s / (static_cast<double>(e.wall_ns) / 1e9);
  std::printf(
      "saves: %.1f ms measured (%.2f%% of the epoch); periodic stall %.1f ms (%.2f%%); "
      "cpu share %.2f\n",
      saved_s * 1e3, 100 * measured_share, static_cast<double>(out->periodic_excess_ns) / 1e6,
      100 * out->periodic_share, out->cpu_share);
  EXPECT_NEAR(out->periodic_share, measured_share, 0.2 * measured_share);
  // The sync probe saw the saves' copies of the parameters to the host (torch::save copies each
  // CUDA tensor to host memory), with the model's bytes.
  double model_mb = 0;
  for (const auto& p : net->parameters()) model_mb += static_cast<double>(p.nbytes()) / 1e6;
  std::printf(
      "probed %lld stalls: sync share %.2f, %.1f syncs and %.1f MB to the host each "
      "(model %.1f MB)\n",
      static_cast<long long>(out->probed), out->sync_share, out->syncs_per_stall,
      out->d2h_mb_per_stall, model_mb);
  // The probe is armed at the steps the period predicts: a stall the prediction misses (after an
  // off-period outlier moved the anchor) goes unprobed. Those probed carry the model's bytes.
  EXPECT_GE(out->probed, 1);
  EXPECT_LE(out->probed, out->periodic_count);
  // Each save copies the whole model. A probe armed at a predicted step can land beside its save
  // (seen once on the H100: 5 probed, 4 saves' bytes), so the bytes come in whole models.
  const double total_mb = out->d2h_mb_per_stall * static_cast<double>(out->probed);
  const double saves = std::round(total_mb / model_mb);
  EXPECT_GE(saves, 1.0);
  EXPECT_LE(saves, static_cast<double>(out->probed));
  EXPECT_NEAR(total_mb, saves * model_mb, 0.02 * model_mb);
  EXPECT_GT(out->sync_share, 0.0);
  EXPECT_LE(out->sync_share, 1.0);
  bool named = false;
  for (const auto& a : sink->advice.back()) named = named || a.id == "periodic_stall";
  EXPECT_TRUE(named || out->periodic_share <= c.advisors.periodic_stall.threshold);
}

struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl()
      : c1(register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32 * 16 * 16, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    return fc(torch::max_pool2d(torch::relu(c1(x)), 2).flatten(1));
  }
  torch::nn::Conv2d c1;
  torch::nn::Linear fc;
};
TORCH_MODULE(SmallCnn);

class Images : public torch::data::datasets::Dataset<Images> {
 public:
  explicit Images(int64_t n)
      : data_(torch::randn({n, 3, 32, 32})), y_(torch::randint(0, 10, {n})) {}
  torch::data::Example<> get(size_t i) override {
    return {data_[static_cast<int64_t>(i)], y_[static_cast<int64_t>(i)]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(data_.size(0)); }

 private:
  torch::Tensor data_, y_;
};

TEST(GpuHostStall, ShortEpochTrainersCostIsReportedAndEveryStepCountedOnce) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device dev(torch::kCUDA);
  SmallCnn net;
  net->to(dev);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01));
  auto loader =
      torch::data::make_data_loader(Images(512 * 20).map(torch::data::transforms::Stack<>()),
                                    torch::data::DataLoaderOptions().batch_size(512).workers(4));
  auto sink = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::PilotOptions o;
  o.sinks = {sink};
  torchpilot::Pilot pilot(torchpilot::Config{}, o);  // the defaults
  torchpilot::FlopCounter flops(pilot);
  for (int e = 0; e < 40; ++e) {
    for (auto& b : torchpilot::watch(*loader, pilot)) {
      auto step = pilot.step(b.data.size(0));
      opt.zero_grad();
      torch::nn::functional::cross_entropy(net->forward(b.data.to(dev)), b.target.to(dev))
          .backward();
      opt.step();
    }
    torch::cuda::synchronize();
  }
  ASSERT_EQ(sink->epochs.size(), 40u);
  // Reported each epoch, with where it went. No timed assertion here (bench/short_epochs
  // measures what it costs the epoch); the accounting must hold: every step's GPU figures count
  // in exactly one epoch, those the epoch's end did not wait for in the next.
  std::vector<double> fractions;
  int64_t counted = 0;
  for (const auto& e : sink->epochs) {
    const auto* c = e.sections.get<torchpilot::CostStats>();
    ASSERT_NE(c, nullptr) << "epoch " << e.epoch;
    EXPECT_GT(c->training_thread_ns, 0);
    EXPECT_FALSE(c->step_parts.empty());
    EXPECT_FALSE(c->epoch_end_parts.empty());
    fractions.push_back(c->fraction);
    const auto* g = e.sections.get<torchpilot::GpuEpochStats>();
    ASSERT_NE(g, nullptr) << "epoch " << e.epoch;
    counted += g->steps;
  }
  const auto& last_gpu = *sink->epochs.back().sections.get<torchpilot::GpuEpochStats>();
  EXPECT_EQ(counted + last_gpu.carried_steps, 40 * 20);
  std::sort(fractions.begin(), fractions.end());
  const auto* last = sink->epochs.back().sections.get<torchpilot::CostStats>();
  std::printf("torchpilot's share per epoch: median %.3f%%, max %.3f%%; over the run %.3f%%\n",
              100 * fractions[fractions.size() / 2], 100 * fractions.back(),
              100 * last->horizon_fraction);
}

// The memory collector: each epoch reports its own allocator peak (the peaks are reset at each
// epoch's end), and the device's capacity.
TEST(GpuMemory, EachEpochReportsItsOwnPeak) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto sink = std::make_shared<torchpilot::RecordingSink>();
  torchpilot::PilotOptions o;
  o.sinks = {sink};
  torchpilot::Config c;
  c.gpu.trace_first_step = 1000000;
  torchpilot::Pilot pilot(c, o);
  constexpr int64_t kGiB = int64_t{1} << 30;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int i = 0; i < 3; ++i) {
      auto step = pilot.step(1);
      // Epoch 0 holds 2 GiB at once; epoch 1 only 64 MiB.
      const int64_t bytes = epoch == 0 ? 2 * kGiB : 64 << 20;
      auto t = torch::empty({bytes / 4}, torch::TensorOptions().device(torch::kCUDA));
      t.fill_(1.0f);
    }
    torch::cuda::synchronize();
    pilot.end_epoch();
  }
  ASSERT_EQ(sink->epochs.size(), 2u);
  const auto* m0 = sink->epochs[0].sections.get<torchpilot::MemoryEpochStats>();
  const auto* m1 = sink->epochs[1].sections.get<torchpilot::MemoryEpochStats>();
  ASSERT_NE(m0, nullptr);
  ASSERT_NE(m1, nullptr);
  std::printf(
      "  epoch 0: peak allocated %.3f GiB, reserved %.3f GiB of %.1f GiB; epoch 1: %.3f, "
      "%.3f\n",
      static_cast<double>(m0->peak_allocated_bytes) / kGiB,
      static_cast<double>(m0->peak_reserved_bytes) / kGiB,
      static_cast<double>(m0->capacity_bytes) / kGiB,
      static_cast<double>(m1->peak_allocated_bytes) / kGiB,
      static_cast<double>(m1->peak_reserved_bytes) / kGiB);
  EXPECT_GE(m0->peak_allocated_bytes, 2 * kGiB);
  EXPECT_GE(m0->peak_reserved_bytes, m0->peak_allocated_bytes);
  EXPECT_GT(m0->capacity_bytes, 8 * kGiB);
  EXPECT_LT(m1->peak_allocated_bytes, kGiB) << "the peak was reset at epoch 0's end";
  EXPECT_EQ(m1->ooms, 0);
}

}  // namespace
