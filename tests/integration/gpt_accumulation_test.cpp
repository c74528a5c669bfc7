// The GPT example with gradient accumulation (--micro-batch): from the same seed, the batch run as
// micro-batches gives the same loss trajectory as the whole batch at once (the gradients agree up
// to rounding, so the AdamW updates do), on the CPU in fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpt_test_setup.h"

namespace {

std::vector<double> losses(int64_t micro_batch, int64_t* accumulation) {
  gpt_example::TrainOptions o = gpt_test::tiny_gpt(8, "cpu");
  o.optimizer = gpt_example::Optimizer::kPerParameter;
  o.micro_batch = micro_batch;
  torchpilot::Config c = gpt_test::pilot_config(torchpilot::Mode::kAdvise);
  c.log.level = "warn";
  torchpilot::Pilot pilot(c);  // before the trainer, as in the example
  gpt_example::Trainer trainer(o);
  std::vector<double> out = gpt_test::step_losses(trainer, pilot, 6);
  *accumulation = trainer.accumulation();
  return out;
}

TEST(GptAccumulation, MicroBatchesGiveTheWholeBatchsLosses) {
  int64_t acc_whole = -1, acc_micro = -1, acc_uneven = -1;
  const std::vector<double> whole = losses(0, &acc_whole);
  const std::vector<double> micro = losses(2, &acc_micro);    // 2 x 4
  const std::vector<double> uneven = losses(3, &acc_uneven);  // 3 + 3 + 2
  EXPECT_EQ(acc_whole, 0);                                    // no Accumulation
  EXPECT_EQ(acc_micro, 4);
  EXPECT_EQ(acc_uneven, 3);
  ASSERT_EQ(whole.size(), micro.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_NEAR(micro[i], whole[i], 1e-4 * std::abs(whole[i])) << "step " << i;
    EXPECT_NEAR(uneven[i], whole[i], 1e-4 * std::abs(whole[i])) << "step " << i;
  }
  EXPECT_LT(whole.back(), whole.front() - 0.1);  // it trains
}

}  // namespace
