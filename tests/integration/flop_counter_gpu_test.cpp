// FlopCounter on a CUDA GPU (CTest label "gpu"; skips without CUDA or a GPU): precision from
// dtype, TF32 and autocast; SDPA's fused kernels; the device table's peak gives MFU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>

#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/hooks/flops/flop_counter.h"
#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {
namespace {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

bool have_gpu() { return torch::cuda::is_available() && torch::cuda::device_count() > 0; }

struct GpuHarness {
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::unique_ptr<Pilot> pilot;
  std::unique_ptr<FlopCounter> counter;
  GpuHarness() {
    Config c;
    c.mode = Mode::kAdvise;
    c.log.level = "warn";
    c.gpu.enabled = false;  // the FLOP counter alone
    c.flops.skip_steps = 0;
    c.flops.count_steps = 1;
    PilotOptions po;
    po.sinks = {sink};
    pilot = std::make_unique<Pilot>(c, po);
    counter = std::make_unique<FlopCounter>(*pilot);
  }
  const StepRecord& step(int64_t samples, const std::function<void()>& body) {
    {
      auto s = pilot->step(samples);
      body();
      torch::cuda::synchronize();
    }
    return sink->steps.back();
  }
  FlopEpochStats end_epoch() {
    pilot->end_epoch();
    return *sink->epochs.back().sections.get<FlopEpochStats>();
  }
};

TEST(FlopCounterGpu, Bf16LinearHasAPeakAndMfu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  GpuHarness h;
  ASSERT_TRUE(h.counter->peak().any())
      << "device not in the peak table: " << h.counter->peak().device;
  const int64_t B = 256, in = 1024, out = 1024;
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto w = torch::randn({out, in}, opts).requires_grad_(true);
  auto body = [&] {
    auto x = torch::randn({B, in}, opts).requires_grad_(true);
    torch::mm(x, w.t()).sum().backward();
  };
  EXPECT_DOUBLE_EQ(h.step(B, body).metrics.get("flops", "model_flops"), 6.0 * B * in * out);
  const StepRecord& r = h.step(B, body);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), 6.0 * B * in * out);
  EXPECT_GT(r.metrics.get("flops", "mfu"), 0);
  EXPECT_LT(r.metrics.get("flops", "mfu"), 1);
  const FlopEpochStats f = h.end_epoch();
  EXPECT_EQ(f.dominant_precision, MathPrecision::kBf16);
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kBf16)], 6.0 * B * in * out);
  EXPECT_EQ(f.peak_source.find("table: "), 0u) << f.peak_source;
  EXPECT_FALSE(f.device.empty());
  EXPECT_GT(f.mfu, 0);
}

TEST(FlopCounterGpu, Fp32IsTf32OnlyWhenAllowed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  const bool before = at::globalContext().allowTF32CuBLAS();
  GpuHarness h;
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  auto body = [&] { torch::mm(torch::randn({64, 128}, opts), torch::randn({128, 32}, opts)); };
  at::globalContext().setAllowTF32CuBLAS(false);
  h.step(1, body);
  at::globalContext().setAllowTF32CuBLAS(true);
  h.counter->recount();
  h.step(1, body);
  at::globalContext().setAllowTF32CuBLAS(before);
  const FlopEpochStats f = h.end_epoch();
  const double mm = 2.0 * 64 * 128 * 32;
  // Two counted steps: one fp32, one TF32; the epoch mean is half of each.
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kFp32)], mm / 2);
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kTf32)], mm / 2);
}

TEST(FlopCounterGpu, AutocastMatmulCountsAsBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  GpuHarness h;
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  auto body = [&] {
    compat::set_cuda_autocast(true, at::kBFloat16);
    torch::mm(torch::randn({64, 128}, opts), torch::randn({128, 32}, opts));
    compat::set_cuda_autocast(false);
    compat::clear_autocast_cache();
  };
  EXPECT_DOUBLE_EQ(h.step(1, body).metrics.get("flops", "model_flops"), 2.0 * 64 * 128 * 32);
  const FlopEpochStats f = h.end_epoch();
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kBf16)], 2.0 * 64 * 128 * 32);
}

TEST(FlopCounterGpu, Conv2dOnCudnn) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  GpuHarness h;
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(16, 32, 3).padding(1));
  conv->to(torch::kCUDA);
  auto body = [&] {
    auto x = torch::randn({8, 16, 32, 32}, torch::TensorOptions().device(torch::kCUDA));
    conv->forward(x).sum().backward();
  };
  const double forward = 2.0 * 8 * 32 * 32 * 32 * 16 * 9;
  EXPECT_DOUBLE_EQ(h.step(1, body).metrics.get("flops", "model_flops"), 2 * forward)
      << "forward + grad weight";
  const FlopEpochStats f = h.end_epoch();
  EXPECT_EQ(f.unparsed_calls, 0);
  // cuDNN allows TF32 by default: fp32 convolutions count as TF32 unless it was turned off.
  const MathPrecision expected =
      at::globalContext().allowTF32CuDNN() ? MathPrecision::kTf32 : MathPrecision::kFp32;
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(expected)], 2 * forward);
}

#if TORCHPILOT_TORCH_AT_LEAST(2, 0)
TEST(FlopCounterGpu, ScaledDotProductAttentionIsFused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  GpuHarness h;
  const int64_t B = 4, H = 8, L = 256, D = 64;
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto body = [&] {
    auto q = torch::randn({B, H, L, D}, opts).requires_grad_(true);
    auto k = torch::randn({B, H, L, D}, opts).requires_grad_(true);
    auto v = torch::randn({B, H, L, D}, opts).requires_grad_(true);
    at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true).sum().backward();
  };
  const double bmm = 2.0 * B * H * L * L * D;
  const StepRecord r = h.step(1, body);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), 6 * bmm) << "2 forward + 4 backward";
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "hardware_flops"), 7 * bmm)
      << "+ QK^T recomputed in the backward kernel";
  const FlopEpochStats f = h.end_epoch();
  EXPECT_DOUBLE_EQ(f.fused_attention_flops_per_step, 6 * bmm);
  EXPECT_EQ(f.unfused_attention_per_step, 0);
  EXPECT_EQ(f.sdpa_math_fallback_per_step, 0);
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kBf16)], 6 * bmm);
  for (const OpFlops& o : f.top_ops) {
    EXPECT_NE(o.op.find("scaled_dot_product"), std::string::npos) << o.op;
  }
}

TEST(FlopCounterGpu, UnfusedBf16AttentionIsFound) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  GpuHarness h;
  const int64_t B = 4, H = 8, L = 256, D = 64;
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto body = [&] {
    auto q = torch::randn({B, H, L, D}, opts).requires_grad_(true);
    auto k = torch::randn({B, H, L, D}, opts).requires_grad_(true);
    auto v = torch::randn({B, H, L, D}, opts).requires_grad_(true);
    auto p = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / 8.0, -1);
    torch::matmul(p, v).sum().backward();
  };
  const double bmm = 2.0 * B * H * L * L * D;
  EXPECT_DOUBLE_EQ(h.step(1, body).metrics.get("flops", "model_flops"), 6 * bmm);
  const FlopEpochStats f = h.end_epoch();
  EXPECT_EQ(f.unfused_attention_per_step, 1);
  EXPECT_DOUBLE_EQ(f.unfused_attention_flops_per_step, 6 * bmm)
      << "backward runs on the autograd device thread: its detector must see dP, dV, dQ, dK";
}
#endif

}  // namespace
}  // namespace torchpilot
