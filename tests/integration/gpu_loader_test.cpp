// GPU tests of the loader's pinned memory and side-stream prefetch (CTest label "gpu").
// They skip where LibTorch has no CUDA or no GPU is present.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "torchpilot/torchpilot.h"

namespace {

class IndexDataset : public torch::data::datasets::Dataset<IndexDataset> {
 public:
  explicit IndexDataset(size_t size) : size_(size) {}
  torch::data::Example<> get(size_t i) override {
    // A larger payload so copies take real time: 64K floats, all equal to i.
    return {torch::full({1 << 16}, static_cast<float>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
};
using Stacked = decltype(IndexDataset(1).map(torch::data::transforms::Stack<>()));

bool have_gpu() { return torchpilot::detail::pin_memory_available(); }

TEST(GpuLoader, DevicePrefetchDeliversCorrectCudaBatchesExactlyOnce) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  constexpr size_t kSize = 600;
  torchpilot::LoaderOptions options;
  options.batch_size = 16;
  options.workers = 4;
  options.pin_memory = true;
  options.device_prefetch = true;
  torchpilot::TunableLoader<Stacked> loader(
      IndexDataset(kSize).map(torch::data::transforms::Stack<>()), options);
  std::mt19937 rng(3);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen(kSize, 0);
    for (auto& batch : loader) {
      // Work on the current stream right away: the prefetch event must order it after the copy.
      torch::Tensor x = batch.data.to(torch::kCUDA);
      torch::Tensor t = batch.target.to(torch::kCUDA);
      torch::Tensor expected = t.to(torch::kFloat32).unsqueeze(1).expand({-1, 1 << 16});
      ASSERT_TRUE(torch::equal(x, expected)) << "epoch " << epoch;
      auto cpu_targets = t.cpu();
      for (int64_t k = 0; k < cpu_targets.size(0); ++k) ++seen.at(cpu_targets[k].item<int64_t>());
      // Live retunes, GPU prefetch and pinning included.
      loader.set_workers(1 + static_cast<int>(rng() % 6));
      loader.set_prefetch(1 + static_cast<int>(rng() % 4));
      loader.set_pin_memory(rng() % 2 == 0);
      loader.set_device_prefetch(rng() % 2 == 0);
    }
    for (size_t i = 0; i < kSize; ++i) ASSERT_EQ(seen[i], 1) << "sample " << i;
  }
}

TEST(GpuLoader, BatchesArriveWhereTheSettingsSay) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  torchpilot::LoaderOptions options;
  options.batch_size = 8;
  options.workers = 2;
  options.pin_memory = true;
  torchpilot::TunableLoader<Stacked> loader(
      IndexDataset(64).map(torch::data::transforms::Stack<>()), options);
  loader.start_epoch();
  auto pinned = loader.next();
  ASSERT_TRUE(pinned.has_value());
  // Batches already in flight were produced with the old settings; drain them.
  loader.set_device_prefetch(true);
  bool saw_cuda = false;
  while (auto b = loader.next()) {
    if (b->data.is_cuda()) {
      saw_cuda = true;
      EXPECT_TRUE(b->target.is_cuda());
    } else {
      EXPECT_TRUE(b->data.is_pinned());
    }
  }
  EXPECT_TRUE(pinned->data.is_pinned());
  EXPECT_TRUE(saw_cuda);
}

}  // namespace
