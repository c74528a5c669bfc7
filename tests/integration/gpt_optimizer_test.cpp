// The GPT example's three AdamW paths compute the same update: from the same seed, the
// per-parameter torch::optim::AdamW, the foreach path and (on CUDA, LibTorch >= 2.1) the fused
// kernel give the same loss trajectory. A high learning rate makes a wrong bias correction,
// weight decay or moment update show within a few steps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpt_test_setup.h"

namespace {

using gpt_example::Optimizer;

std::vector<double> losses(Optimizer optimizer, const std::string& device, Optimizer* ran) {
  gpt_example::TrainOptions o = gpt_test::tiny_gpt(4, device);
  o.optimizer = optimizer;
  gpt_example::Trainer trainer(o);
  *ran = trainer.optimizer();
  torchpilot::Pilot pilot(gpt_test::pilot_config(torchpilot::Mode::kOff));
  return gpt_test::step_losses(trainer, pilot, 8);
}

void expect_same(const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], tolerance * std::abs(a[i])) << "step " << i;
  }
}

TEST(GptOptimizer, ForeachMatchesPerParameterOnCpu) {
  Optimizer ran;
  const std::vector<double> reference = losses(Optimizer::kPerParameter, "cpu", &ran);
  EXPECT_EQ(ran, Optimizer::kPerParameter);
  const std::vector<double> foreach = losses(Optimizer::kForeach, "cpu", &ran);
  EXPECT_EQ(ran, Optimizer::kForeach);
  expect_same(reference, foreach, 1e-4);
  // It trains: the loss falls from ln(256) ~ 5.5 at this learning rate.
  EXPECT_LT(reference.back(), reference.front() - 0.1);
}

TEST(GptOptimizer, FusedFallsBackToForeachWhereUnavailable) {
  if (gpt_example::fused_adamw_compiled()) GTEST_SKIP() << "fused AdamW is compiled in";
  Optimizer ran;
  losses(Optimizer::kFused, "cpu", &ran);
  EXPECT_EQ(ran, Optimizer::kForeach);
}

TEST(GptOptimizer, FusedMatchesPerParameterOnCuda) {
  if (!gpt_example::cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (!gpt_example::fused_adamw_compiled()) GTEST_SKIP() << "no at::_fused_adamw_ in this build";
  Optimizer ran;
  const std::vector<double> reference = losses(Optimizer::kPerParameter, "cuda", &ran);
  const std::vector<double> fused = losses(Optimizer::kFused, "cuda", &ran);
  EXPECT_EQ(ran, Optimizer::kFused);
  const std::vector<double> foreach = losses(Optimizer::kForeach, "cuda", &ran);
  // Different kernels sum in different orders: close, not bit-identical.
  expect_same(reference, fused, 1e-3);
  expect_same(reference, foreach, 1e-3);
}

}  // namespace
