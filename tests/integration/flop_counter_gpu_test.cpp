// FlopCounter on a CUDA GPU (CTest label "gpu"; skips without CUDA or a GPU): precision from
// dtype, TF32 and autocast; SDPA's fused kernels; the device table's peak gives MFU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>

#include "flop_harness.h"
#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/hooks/flops/flop_counter.h"
#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {
namespace {

using test::P;

bool have_gpu() { return torch::cuda::is_available() && torch::cuda::device_count() > 0; }

// The FLOP counter alone (no GPU monitor), counting every step; a step waits for the GPU.
struct GpuHarness : test::Harness {
  GpuHarness() : Harness(test::flop_config(0, 1)) {}
  const StepRecord& step(int64_t samples, const std::function<void()>& body) {
    return Harness::step(samples, [&] {
      body();
      torch::cuda::synchronize();
    });
  }
  FlopEpochStats end_epoch() { return *Harness::end_epoch().sections.get<FlopEpochStats>(); }
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
// Attention of bf16 queries, keys and values on the GPU (batch 4, 8 heads of 64, length 256;
// random, requiring grad) as `attention` computes it, summed and backpropagated in one step of `h`.
using Attention =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;
constexpr int64_t kB = 4, kH = 8, kL = 256, kD = 64;
constexpr double kBmmFlops = 2.0 * kB * kH * kL * kL * kD;  // one of its batched matmuls
const StepRecord& attention_step(GpuHarness& h, const Attention& attention) {
  return h.step(1, [&] {
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    auto q = torch::randn({kB, kH, kL, kD}, opts).requires_grad_(true);
    auto k = torch::randn({kB, kH, kL, kD}, opts).requires_grad_(true);
    auto v = torch::randn({kB, kH, kL, kD}, opts).requires_grad_(true);
    attention(q, k, v).sum().backward();
  });
}

TEST(FlopCounterGpu, ScaledDotProductAttentionIsFused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA in this LibTorch or no GPU";
  GpuHarness h;
  const double bmm = kBmmFlops;
  const StepRecord r = attention_step(h, [](const auto& q, const auto& k, const auto& v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  });
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
  const double bmm = kBmmFlops;
  const StepRecord& r = attention_step(h, [](const auto& q, const auto& k, const auto& v) {
    return torch::matmul(torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / 8.0, -1), v);
  });
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), 6 * bmm);
  const FlopEpochStats f = h.end_epoch();
  EXPECT_EQ(f.unfused_attention_per_step, 1);
  EXPECT_DOUBLE_EQ(f.unfused_attention_flops_per_step, 6 * bmm)
      << "backward runs on the autograd device thread: its detector must see dP, dV, dQ, dK";
}
#endif

}  // namespace
}  // namespace torchpilot
