// torchpilot::Accumulation on the CPU (hooks/memory/accumulation.h): gradients of one batch against
// micro-batches with accumulation, out-of-memory recovery during auto-tune with every sample run
// exactly once, the error rethrown outside auto-tune, and the line that says memory figures are
// missing.
#include "torchpilot/hooks/memory/accumulation.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "captured_stderr.h"
#include "fakes/autotune_config.h"
#include "torchpilot/runtime/memory/batch_policy.h"

namespace torchpilot {
namespace {

Config config_for(Mode mode, const std::string& level = "warn") {
  Config c = test::short_autotune_config(mode);
  c.log.level = level;
  return c;
}

// Gradients after a batch of 16 at once and as micro-batches with accumulation.
void expect_same_gradients(torch::Dtype dtype, int64_t micro, double rtol, double atol) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 3));
  model->to(dtype);
  const auto x = torch::randn({16, 8}, torch::dtype(dtype));
  const auto y = torch::randint(0, 3, {16}, torch::kLong);
  namespace F = torch::nn::functional;

  F::cross_entropy(model->forward(x), y).backward();
  std::vector<torch::Tensor> whole;
  for (auto& p : model->parameters()) {
    whole.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }

  Pilot pilot(config_for(Mode::kAdvise));
  Accumulation acc(pilot, model->parameters(), {/*global_batch=*/16, /*world_size=*/1, micro});
  int64_t micro_steps = 0, optimizer_steps = 0;
  double scales = 0;
  acc.step(
      {x, y},
      [&](const std::vector<at::Tensor>& mb, const MicroBatch& m) {
        ++micro_steps;
        scales += m.loss_scale;
        EXPECT_EQ(mb[0].size(0), m.size);
        (F::cross_entropy(model->forward(mb[0]), mb[1]) * m.loss_scale).backward();
      },
      [&] { ++optimizer_steps; });
  EXPECT_EQ(micro_steps, (16 + micro - 1) / micro);
  EXPECT_EQ(optimizer_steps, 1);
  EXPECT_NEAR(scales, 1.0, 1e-12);
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), whole[i], rtol, atol))
        << "parameter " << i << ", micro-batch " << micro << ": max difference "
        << (params[i].grad() - whole[i]).abs().max().item<double>();
  }
}

TEST(Accumulation, GradientsOfFourMicroBatchesEqualOneBatch) {
  expect_same_gradients(torch::kDouble, 4, 1e-12, 1e-14);
  expect_same_gradients(torch::kFloat, 4, 1e-5, 1e-6);
}

TEST(Accumulation, GradientsWithAShorterLastMicroBatch) {
  expect_same_gradients(torch::kDouble, 5, 1e-12, 1e-14);  // 5 + 5 + 5 + 1
}

TEST(Accumulation, SizesAndChoices) {
  Pilot pilot(config_for(Mode::kAutotune));
  Accumulation acc(pilot, {}, {/*global_batch=*/64, /*world_size=*/2, /*micro_batch=*/2});
  EXPECT_EQ(acc.rank_batch(), 32);
  EXPECT_EQ(acc.micro_batch(), 2);
  EXPECT_EQ(acc.accumulation(), 16);  // 2 x 16 x 2 ranks = 64
  EXPECT_EQ(acc.choices(), (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  ASSERT_NE(pilot.knobs().find(kMicroBatchKnob), nullptr);
  EXPECT_THROW(Accumulation(pilot, {}, {63, 2, 0}), std::invalid_argument);
  EXPECT_THROW(Accumulation(pilot, {}, {64, 1, 65}), std::invalid_argument);
}

enum class OomKind { kOutOfMemoryError, kErrorMessage };

[[noreturn]] void throw_oom(OomKind kind) {
  if (kind == OomKind::kOutOfMemoryError) {
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)");
  }
  TORCH_CHECK(false, "CUDA error: out of memory (injected by the test)");
  std::abort();  // not reached
}

// Sample ids are the batch; each sample's loss is its own parameter, so the gradient the
// optimizer sees counts, per sample, how often it ran in that step (x 1/batch): exactly-once is
// read off the gradients themselves.
struct ExactlyOnce {
  static constexpr int64_t kBatch = 32;
  static constexpr int64_t kSteps = 40;
  torch::Tensor w =
      torch::zeros({kBatch * kSteps}, torch::dtype(torch::kDouble).requires_grad(true));
  std::vector<double> runs = std::vector<double>(kBatch * kSteps, 0.0);
  int64_t oom_thrown = 0;

  void micro_step(const std::vector<at::Tensor>& mb, const MicroBatch& m) {
    // (sum over the micro-batch of w[id]) / size x loss_scale: each id's gradient is 1/batch.
    const auto loss = w.index_select(0, mb[0]).sum() / static_cast<double>(m.size) * m.loss_scale;
    loss.backward();
  }
  void optimizer_step() {
    const auto g = w.grad().contiguous();
    const double* p = g.data_ptr<double>();
    for (int64_t i = 0; i < g.numel(); ++i) runs[static_cast<size_t>(i)] += p[i] * kBatch;
    w.mutable_grad() = torch::Tensor();
  }
};

void run_exactly_once(OomKind kind, int64_t start, std::vector<int64_t> choices,
                      int64_t oom_at_or_above) {
  Pilot pilot(config_for(Mode::kAutotune));
  ExactlyOnce t;
  AccumulationOptions options;
  options.global_batch = ExactlyOnce::kBatch;
  options.micro_batch = start;
  options.choices = std::move(choices);
  Accumulation acc(pilot, {t.w}, options);
  for (int64_t s = 0; s < ExactlyOnce::kSteps; ++s) {
    const auto ids = torch::arange(s * ExactlyOnce::kBatch, (s + 1) * ExactlyOnce::kBatch);
    auto step = pilot.step(ExactlyOnce::kBatch);
    acc.step(
        {ids},
        [&](const std::vector<at::Tensor>& mb, const MicroBatch& m) {
          // Runs out of memory in the second micro-batch, after the first one's backward left
          // partial gradients behind.
          if (m.index == 1 && m.size >= oom_at_or_above) {
            ++t.oom_thrown;
            throw_oom(kind);
          }
          t.micro_step(mb, m);
        },
        [&] { t.optimizer_step(); });
  }
  ASSERT_GE(t.oom_thrown, 1);
  EXPECT_EQ(acc.recoveries(), t.oom_thrown);
  for (size_t i = 0; i < t.runs.size(); ++i) {
    ASSERT_EQ(t.runs[i], 1.0) << "sample " << i << " ran " << t.runs[i] << " times";
  }
  ASSERT_TRUE(pilot.tuning_finished());
  const TuningDecision& d = *pilot.tuning_decision();
  EXPECT_LT(d.chosen.at(kMicroBatchKnob), oom_at_or_above);
  EXPECT_LT(acc.micro_batch(), oom_at_or_above);
  EXPECT_EQ(pilot.steps(), ExactlyOnce::kSteps);  // the run went on
}

TEST(Accumulation, OutOfMemoryMidTrialIsRecoveredExactlyOnce) {
  // Start 2; the search tries 16 next (the only larger choice below the batch), which runs out.
  for (const OomKind kind : {OomKind::kOutOfMemoryError, OomKind::kErrorMessage}) {
    run_exactly_once(kind, 2, {2, 16}, 16);
  }
}

TEST(Accumulation, OutOfMemoryMidTrialFailsTheTrial) {
  Pilot pilot(config_for(Mode::kAutotune));
  ExactlyOnce t;
  AccumulationOptions options;
  options.global_batch = ExactlyOnce::kBatch;
  options.micro_batch = 2;
  options.choices = {2, 16};
  Accumulation acc(pilot, {t.w}, options);
  for (int64_t s = 0; s < ExactlyOnce::kSteps && !pilot.tuning_finished(); ++s) {
    const auto ids = torch::arange(s * ExactlyOnce::kBatch, (s + 1) * ExactlyOnce::kBatch);
    auto step = pilot.step(ExactlyOnce::kBatch);
    acc.step(
        {ids},
        [&](const std::vector<at::Tensor>& mb, const MicroBatch& m) {
          if (m.index == 1 && m.size >= 16) throw_oom(OomKind::kOutOfMemoryError);
          t.micro_step(mb, m);
        },
        [&] { t.optimizer_step(); });
  }
  ASSERT_TRUE(pilot.tuning_finished());
  const TuningDecision& d = *pilot.tuning_decision();
  ASSERT_EQ(d.trials.size(), 2u);
  EXPECT_FALSE(d.trials[0].failed);
  EXPECT_TRUE(d.trials[1].failed);
  EXPECT_EQ(d.trials[1].setting.at(kMicroBatchKnob), 16);
  EXPECT_NE(d.trials[1].note.find("out of memory at batch.micro=16"), std::string::npos)
      << d.trials[1].note;
  EXPECT_EQ(d.chosen.at(kMicroBatchKnob), 2);
}

TEST(Accumulation, AStartThatDoesNotFitGoesSmaller) {
  // The very first step runs out at 16, before any trial: the next smaller choice, 2.
  run_exactly_once(OomKind::kOutOfMemoryError, 16, {2, 16}, 16);
}

TEST(Accumulation, OutOfMemoryOutsideAutotuneIsTheTrainersOwn) {
  Pilot pilot(config_for(Mode::kAdvise));
  ExactlyOnce t;
  Accumulation acc(pilot, {t.w}, {ExactlyOnce::kBatch, 1, 4});
  const auto ids = torch::arange(0, ExactlyOnce::kBatch);
  bool optimizer_ran = false;
  EXPECT_THROW(acc.step(
                   {ids},
                   [&](const std::vector<at::Tensor>& mb, const MicroBatch& m) {
                     if (m.index == 1) throw_oom(OomKind::kOutOfMemoryError);
                     t.micro_step(mb, m);
                   },
                   [&] { optimizer_ran = true; }),
               c10::OutOfMemoryError);
  EXPECT_FALSE(optimizer_ran);
  EXPECT_EQ(acc.recoveries(), 0);
  EXPECT_EQ(acc.micro_batch(), 4);
  // Another error is never taken for an out-of-memory one, in auto-tune either.
  Pilot tuning(config_for(Mode::kAutotune));
  Accumulation acc2(tuning, {t.w}, {ExactlyOnce::kBatch, 1, 4});
  auto step = tuning.step(ExactlyOnce::kBatch);
  EXPECT_THROW(acc2.step(
                   {ids},
                   [&](const std::vector<at::Tensor>&, const MicroBatch&) {
                     TORCH_CHECK(false, "shape mismatch");
                   },
                   [] {}),
               c10::Error);
  EXPECT_EQ(acc2.recoveries(), 0);
  EXPECT_THROW(acc2.step({ids, ids.narrow(0, 0, 3)}, {}, {}), std::invalid_argument);
  // A fixed micro-batch (tune off) in mode autotune: no knob, no recovery.
  Pilot fixed_pilot(config_for(Mode::kAutotune));
  AccumulationOptions fixed_options{ExactlyOnce::kBatch, 1, 4};
  fixed_options.tune = false;
  Accumulation fixed(fixed_pilot, {t.w}, fixed_options);
  EXPECT_EQ(fixed_pilot.knobs().find(kMicroBatchKnob), nullptr);
  auto fixed_step = fixed_pilot.step(ExactlyOnce::kBatch);
  EXPECT_THROW(fixed.step(
                   {ids},
                   [&](const std::vector<at::Tensor>&, const MicroBatch&) {
                     throw_oom(OomKind::kOutOfMemoryError);
                   },
                   [] {}),
               c10::OutOfMemoryError);
  EXPECT_EQ(fixed.micro_batch(), 4);
}

TEST(Accumulation, ThePilotMayGoFirst) {
  auto pilot = std::make_unique<Pilot>(config_for(Mode::kAutotune));
  ExactlyOnce t;
  auto acc = std::make_unique<Accumulation>(*pilot, std::vector<at::Tensor>{t.w},
                                            AccumulationOptions{ExactlyOnce::kBatch, 1, 4});
  ASSERT_NE(pilot->knobs().find(kMicroBatchKnob), nullptr);
  pilot.reset();  // the Accumulation hears it (sanitizer builds catch a use after free)
  const auto ids = torch::arange(0, ExactlyOnce::kBatch);
  acc->step(
      {ids}, [&](const std::vector<at::Tensor>& mb, const MicroBatch& m) { t.micro_step(mb, m); },
      [&] { t.optimizer_step(); });
  EXPECT_EQ(t.runs[0], 1.0);
  // Without its Pilot nothing is recovered: the error is the trainer's.
  EXPECT_THROW(acc->step(
                   {ids},
                   [&](const std::vector<at::Tensor>&, const MicroBatch&) {
                     throw_oom(OomKind::kOutOfMemoryError);
                   },
                   [] {}),
               c10::OutOfMemoryError);
  acc.reset();
}

TEST(Accumulation, SaysOnceThatMemoryFiguresAreMissingOnTheCpu) {
  std::string text;
  {
    testing_support::CapturedStderr captured("accumulation-test");
    {
      Pilot pilot(config_for(Mode::kAutotune, "info"));
      ExactlyOnce t;
      Accumulation acc(pilot, {t.w}, {ExactlyOnce::kBatch, 1, 2});
      // The warm-up budget (60 steps) bounds the search and its re-measurements; a noisy machine
      // may need all of it, so the loop runs past it.
      for (int64_t s = 0; s < 90 && !pilot.tuning_finished(); ++s) {
        const auto ids = torch::arange(s * ExactlyOnce::kBatch, (s + 1) * ExactlyOnce::kBatch);
        auto step = pilot.step(ExactlyOnce::kBatch);
        acc.step(
            {ids},
            [&](const std::vector<at::Tensor>& mb, const MicroBatch& m) { t.micro_step(mb, m); },
            [&] { t.optimizer_step(); });
      }
      EXPECT_TRUE(pilot.tuning_finished());  // the search ran by throughput
      pilot.flush();
    }
    {
      Pilot advise(config_for(Mode::kAdvise, "info"));  // no search: nothing to say
      Accumulation acc(advise, {}, {ExactlyOnce::kBatch, 1, 2});
      advise.flush();
    }
    text = captured.text();
  }
  EXPECT_EQ(testing_support::occurrences(text, "memory figures missing"), 1) << text;
  EXPECT_NE(text.find("autotune trial [batch.micro="), std::string::npos) << text;
}

}  // namespace
}  // namespace torchpilot
