// The GPT example's two linear paths compute the same layers: torch::linear (the bias in the
// GEMM) and the Linear modules' forward (LibTorch's C++ frontend: matmul, then += bias on 3-D
// inputs; the path the unfused_linear_bias advice finds) give the same logits and gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpt_model.h"
#include "gpt_test_setup.h"
#include "torchpilot/hooks/core/compat.h"

namespace {

using gpt_example::Gpt;
using gpt_example::GptConfig;

// Logits and the gradients of their sum, from a model built with `aten_linear` (same seeds).
std::pair<torch::Tensor, std::vector<torch::Tensor>> run(bool aten_linear,
                                                         const std::string& device, bool autocast) {
  GptConfig c = gpt_test::tiny_gpt_model();
  c.aten_linear = aten_linear;
  torch::manual_seed(7);
  Gpt model(c);
  model->to(torch::Device(device));
  torch::manual_seed(8);
  const torch::Tensor tokens =
      torch::randint(c.vocab, {3, c.seq}, torch::TensorOptions().dtype(torch::kLong))
          .to(torch::Device(device));
  if (autocast) torchpilot::compat::set_cuda_autocast(true);
  torch::Tensor logits = model->forward(tokens);
  if (autocast) {
    torchpilot::compat::set_cuda_autocast(false);
    torchpilot::compat::clear_autocast_cache();
  }
  logits.to(torch::kFloat).sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().to(torch::kCPU));
  return {logits.detach().to(torch::kFloat).to(torch::kCPU), grads};
}

void expect_same(bool autocast, const std::string& device, double tolerance) {
  const auto [aten_logits, aten_grads] = run(true, device, autocast);
  const auto [module_logits, module_grads] = run(false, device, autocast);
  EXPECT_TRUE(torch::allclose(aten_logits, module_logits, tolerance, tolerance))
      << (aten_logits - module_logits).abs().max().item<double>();
  ASSERT_EQ(aten_grads.size(), module_grads.size());
  for (size_t i = 0; i < aten_grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(aten_grads[i], module_grads[i], tolerance, tolerance))
        << "parameter " << i << ": "
        << (aten_grads[i] - module_grads[i]).abs().max().item<double>();
  }
}

TEST(GptLinear, AtenAndModuleLinearAgreeOnCpu) { expect_same(false, "cpu", 1e-5); }

// The two paths do differ: on a 3-D input the module's forward ends in the bias add, torch::linear
// in a reshape of one addmm.
TEST(GptLinear, TheTwoPathsRunDifferentOps) {
  torch::nn::Linear layer(4, 6);
  const torch::Tensor x = torch::randn({2, 3, 4});
  const auto aten = gpt_example::linear(layer, x, true);
  const auto module = gpt_example::linear(layer, x, false);
  ASSERT_TRUE(aten.grad_fn() && module.grad_fn());
  EXPECT_NE(module.grad_fn()->name().find("AddBackward"), std::string::npos)
      << module.grad_fn()->name();
  EXPECT_EQ(aten.grad_fn()->name().find("AddBackward"), std::string::npos)
      << aten.grad_fn()->name();
  EXPECT_TRUE(torch::allclose(aten, module, 1e-5, 1e-5));
}

TEST(GptLinear, AtenAndModuleLinearAgreeOnCudaInBf16) {
  if (!gpt_example::cuda_available()) GTEST_SKIP() << "no CUDA device";
  // bf16 keeps 8 bits of mantissa; the two paths round the bias add differently.
  expect_same(true, "cuda", 3e-2);
}

}  // namespace
