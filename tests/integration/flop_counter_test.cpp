// FlopCounter with real LibTorch ops on the CPU: counted FLOPs against hand-computed values
// (linear, conv2d, forward and backward), the leaf rule, unfused attention, the counting window
// and recounting when the batch size changes.
#include "torchpilot/hooks/flops/flop_counter.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "flop_harness.h"
#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/runtime/core/sink.h"

namespace torchpilot {
namespace {

using test::flop_config;
using test::Harness;
using test::P;

// A Linear layer's forward and backward with the input requiring grad:
//   forward  addmm(bias, x, W^T)     2·B·in·out
//   backward dX = dY · W  (mm)       2·B·in·out
//            dW = dYᵀ · X (mm)       2·B·in·out
//            db = Σ_batch dY          a reduction, not a matmul FLOP: not counted
// = 6·B·in·out.
constexpr int64_t kIn = 64, kOut = 32;
double linear_flops(int64_t batch) { return 6.0 * batch * kIn * kOut; }

std::function<void()> linear_step(torch::nn::Linear& lin, int64_t batch) {
  return [&lin, batch] {
    auto x = torch::randn({batch, kIn}).requires_grad_(true);
    lin->forward(x).sum().backward();
  };
}

// The Linear layer's step and an extra matmul of 2·10·20·30 = 12000 FLOPs.
std::function<void()> linear_step_and_mm(torch::nn::Linear& lin, int64_t batch) {
  return [&lin, batch] {
    linear_step(lin, batch)();
    torch::mm(torch::randn({10, 20}), torch::randn({20, 30}));
  };
}

// One step of the Linear layer on a batch of `batch` in `h`: the model FLOPs it was counted at
// (NaN where it was not counted).
double linear_step_flops(Harness& h, torch::nn::Linear& lin, int64_t batch) {
  return h.step(batch, linear_step(lin, batch)).metrics.get("flops", "model_flops");
}

// Two named layers: each layer's forward and backward FLOPs count for its module, the backward
// ones matched through autograd's sequence numbers on the autograd thread; the loss outside any
// scope. enc: 6·B·64·32 (its input requires grad); dec: 32 -> 8, 6·B·32·8.
TEST(FlopCounterTest, ModuleScopesAttributeForwardAndBackward) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  torch::nn::Linear enc(kIn, kOut), dec(kOut, 8);
  const int64_t batch = 16;
  auto body = [&] {
    auto x = torch::randn({batch, kIn}).requires_grad_(true);
    torch::Tensor y;
    {
      ModuleScope m("enc");
      y = enc->forward(x);
    }
    {
      ModuleScope m("dec");
      y = dec->forward(y);
    }
    torch::mm(y.t(), y).sum().backward();  // 2·8·B·8 forward, outside any module
  };
  h.step(batch, body);
  h.step(batch, body);
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  std::map<std::string, double> by;
  for (const OpFlops& m : e.sections.get<FlopEpochStats>()->modules) by[m.op] = m.flops_per_step;
  EXPECT_DOUBLE_EQ(by["enc"], 6.0 * batch * kIn * kOut);
  EXPECT_DOUBLE_EQ(by["dec"], 6.0 * batch * kOut * 8);
  // The unnamed rest: the loss's mm forward and its backward (two mms of the same size).
  EXPECT_DOUBLE_EQ(by[""], 3 * 2.0 * 8 * batch * 8);
  EXPECT_DOUBLE_EQ(by["enc"] + by["dec"] + by[""],
                   e.sections.get<FlopEpochStats>()->model_flops_per_step);
  ASSERT_FALSE(e.sections.get<FlopEpochStats>()->modules.empty());
  EXPECT_EQ(e.sections.get<FlopEpochStats>()->modules.front().op, "enc");  // largest first
}

TEST(FlopCounterTest, WithoutModuleScopesThereIsNoModuleBreakdown) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  torch::nn::Linear lin(kIn, kOut);
  h.step(4, linear_step(lin, 4));
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  EXPECT_TRUE(e.sections.get<FlopEpochStats>()->modules.empty());
}

TEST(FlopCounterTest, LinearForwardBackwardIsSixBatchInOut) {
  torch::manual_seed(0);
  Harness h(flop_config(1, 2));
  torch::nn::Linear lin(kIn, kOut);
  const int64_t batch = 16;
  EXPECT_FALSE(h.counter->counting()) << "skipping first";
  EXPECT_TRUE(std::isnan(linear_step_flops(h, lin, batch))) << "skipped";
  EXPECT_TRUE(h.counter->counting());
  for (int i = 0; i < 2; ++i) {
    const StepRecord& r = h.step(batch, linear_step(lin, batch));
    EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), linear_flops(batch))
        << "counted step " << i;
    EXPECT_DOUBLE_EQ(r.metrics.get("flops", "hardware_flops"), linear_flops(batch));
    // A machine without a known GPU has no peak; where the process sees a GPU of the table (a
    // CUDA build on a GPU machine), MFU is held against that GPU's peak.
    EXPECT_EQ(std::isnan(r.metrics.get("flops", "mfu")), !h.counter->peak().any());
  }
  EXPECT_FALSE(h.counter->counting()) << "window over";
  EXPECT_EQ(h.counter->windows(), 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, batch), linear_flops(batch));
  }
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  const FlopEpochStats& f = *e.sections.get<FlopEpochStats>();
  EXPECT_EQ(f.counted_steps, 2);
  EXPECT_EQ(f.steps_with_count, 5);
  EXPECT_DOUBLE_EQ(f.model_flops_per_step, linear_flops(batch));
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kFp32)], linear_flops(batch));
  EXPECT_EQ(f.dominant_precision, MathPrecision::kFp32);
  EXPECT_EQ(std::isnan(f.mfu), !h.counter->peak().any());
  EXPECT_EQ(f.device, h.counter->peak().device);
  EXPECT_EQ(f.unparsed_calls, 0);
  EXPECT_EQ(f.unfused_attention_per_step, 0);
  // By op: two backward mms, one forward addmm.
  ASSERT_EQ(f.top_ops.size(), 2u);
  EXPECT_EQ(f.top_ops[0].op, "aten::mm");
  EXPECT_DOUBLE_EQ(f.top_ops[0].flops_per_step, 4.0 * batch * kIn * kOut);
  EXPECT_DOUBLE_EQ(f.top_ops[0].calls_per_step, 2);
  EXPECT_EQ(f.top_ops[1].op, "aten::addmm");
  EXPECT_DOUBLE_EQ(f.top_ops[1].calls_per_step, 1);
}

// The recount tests' start: a counter with a one-step window at step 0, the Linear layer at batch
// 8, and its step with an extra matmul.
class FlopCounterRecountTest : public ::testing::Test {
 protected:
  FlopCounterRecountTest() : h(flop_config(0, 1)) {
    torch::manual_seed(0);
    lin = torch::nn::Linear(kIn, kOut);
    extra = linear_step_and_mm(lin, batch);
  }
  Harness h;
  torch::nn::Linear lin{nullptr};
  static constexpr int64_t batch = 8;
  std::function<void()> extra;
};

TEST_F(FlopCounterRecountTest, CallbacksAreOffOutsideTheWindowAndRecountTurnsThemOn) {
  EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, batch), linear_flops(batch));
  // An extra matmul after the window: not seen (callbacks off), the step keeps the cached count.
  EXPECT_DOUBLE_EQ(h.step(batch, extra).metrics.get("flops", "model_flops"), linear_flops(batch));
  EXPECT_FALSE(h.counter->counting());
  EXPECT_EQ(h.counter->step_hooks(), unsigned{kHookStepRecord})
      << "between windows the Pilot does not call the counter at step boundaries";
  // recount(): the next step is counted and sees the extra mm (2·10·20·30).
  h.counter->recount();
  EXPECT_TRUE(h.counter->counting());
  EXPECT_EQ(h.counter->step_hooks(), unsigned{kHookStepRecord | kHookStepBegin})
      << "the next step's begin opens the window";
  EXPECT_DOUBLE_EQ(h.step(batch, extra).metrics.get("flops", "model_flops"),
                   linear_flops(batch) + 12000.0);
  EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, batch), linear_flops(batch) + 12000.0)
      << "cached from the recount";
}

// recount() inside a step: that step ran under the old counts and keeps them; the next one is
// counted.
TEST_F(FlopCounterRecountTest, ARecountInsideAStepCountsTheNextOne) {
  EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, batch), linear_flops(batch));
  auto recount_then_extra = [&] {
    h.counter->recount();
    extra();
  };
  EXPECT_DOUBLE_EQ(h.step(batch, recount_then_extra).metrics.get("flops", "model_flops"),
                   linear_flops(batch))
      << "the step that asked keeps the count it began under";
  EXPECT_DOUBLE_EQ(h.step(batch, extra).metrics.get("flops", "model_flops"),
                   linear_flops(batch) + 12000.0)
      << "the next step is counted";
}

TEST(FlopCounterTest, RecountsWhenTheBatchSizeChanges) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 2));
  torch::nn::Linear lin(kIn, kOut);
  for (int i = 0; i < 3; ++i) h.step(16, linear_step(lin, 16));
  EXPECT_FALSE(h.counter->counting());
  // Batch 8: that step has no count yet; the next two are counted.
  EXPECT_TRUE(std::isnan(linear_step_flops(h, lin, 8)));
  EXPECT_TRUE(h.counter->counting());
  EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, 8), linear_flops(8));
  EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, 8), linear_flops(8));
  EXPECT_FALSE(h.counter->counting());
  EXPECT_EQ(h.counter->windows(), 2);
  // Both sizes are remembered.
  EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, 16), linear_flops(16));
  EXPECT_DOUBLE_EQ(linear_step_flops(h, lin, 8), linear_flops(8));
  EXPECT_FALSE(h.counter->counting());
  EXPECT_EQ(h.counter->windows(), 2);
}

// conv2d on [N=4, 3, 16, 16] with 8 filters of 3x3: forward 2·N·Hout·Wout·Cout·Cin·9.
TEST(FlopCounterTest, Conv2dForwardAndBackward) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  struct Case {
    int64_t stride;
    bool input_grad;
    double forward;
  };
  const double f1 = 2.0 * 4 * 16 * 16 * 8 * 3 * 9;  // stride 1, padding 1: 16x16
  const double f2 = 2.0 * 4 * 8 * 8 * 8 * 3 * 9;    // stride 2, padding 1: 8x8
  const std::vector<Case> cases = {{1, false, f1}, {1, true, f1}, {2, true, f2}};
  int64_t samples = 1;
  for (const Case& c : cases) {
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).stride(c.stride).padding(1));
    auto body = [&] {
      auto x = torch::randn({4, 3, 16, 16});
      if (c.input_grad) x.requires_grad_(true);
      conv->forward(x).sum().backward();
    };
    // A new sample count each case, so each is counted (the first step of a new count is not).
    ++samples;
    h.step(samples, body);
    const StepRecord& r = h.step(samples, body);
    // Backward: grad weight = one forward's FLOPs, grad input (when needed) another; the bias
    // gradient is a reduction.
    const double expected = c.forward * (c.input_grad ? 3 : 2);
    EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), expected)
        << "stride " << c.stride << ", input grad " << c.input_grad;
  }
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  EXPECT_EQ(e.sections.get<FlopEpochStats>()->unparsed_calls, 0);
  bool forward_seen = false, backward_seen = false;
  for (const OpFlops& o : e.sections.get<FlopEpochStats>()->top_ops) {
    if (o.op == "aten::convolution_backward") backward_seen = true;
    if (o.op.find("conv") != std::string::npos && o.op != "aten::convolution_backward") {
      forward_seen = true;
    }
  }
  EXPECT_TRUE(forward_seen);
  EXPECT_TRUE(backward_seen);
}

// Attention written out: S = QKᵀ/√d, P = softmax(S), O = PV, with q, k, v [B, H, L, D].
constexpr int64_t B = 2, H = 4, L = 16, D = 8;
constexpr double kBmm = 2.0 * B * H * L * L * D;  // one of the attention bmms

void unfused_attention() {
  auto q = torch::randn({B, H, L, D}).requires_grad_(true);
  auto k = torch::randn({B, H, L, D}).requires_grad_(true);
  auto v = torch::randn({B, H, L, D}).requires_grad_(true);
  auto s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
  auto p = torch::softmax(s, -1);
  torch::matmul(p, v).sum().backward();
}

TEST(FlopCounterTest, UnfusedAttentionIsFound) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  // 2 bmms forward, 4 backward (dP, dV, dQ, dK).
  EXPECT_DOUBLE_EQ(h.step(1, unfused_attention).metrics.get("flops", "model_flops"), 6 * kBmm);
  h.step(1, unfused_attention);
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  const FlopEpochStats& f = *e.sections.get<FlopEpochStats>();
  EXPECT_EQ(f.unfused_attention_per_step, 1);
  EXPECT_DOUBLE_EQ(f.unfused_attention_flops_per_step, 6 * kBmm);
  EXPECT_DOUBLE_EQ(f.fused_attention_flops_per_step, 0);
  EXPECT_EQ(f.sdpa_math_fallback_per_step, 0);
  // Score matrix B·H·L·L fp32: 4 passes forward, 7 backward.
  EXPECT_DOUBLE_EQ(f.unfused_attention_traffic_bytes_per_step, 11.0 * B * H * L * L * 4);
  // The advisor sees it (share 100% > 2%); on CPU without a bandwidth the gain is not sized.
  bool advised = false;
  for (const Advice& a : h.sink->advice.back()) advised |= a.id == "unfused_attention";
  EXPECT_TRUE(advised);
}

TEST(FlopCounterTest, MatmulsWithoutSoftmaxAreNotAttention) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  auto body = [] {
    auto a = torch::randn({B * H, L, D}).requires_grad_(true);
    auto b = torch::randn({B * H, D, L}).requires_grad_(true);
    auto s = torch::bmm(a, b);
    torch::bmm(torch::relu(s), torch::randn({B * H, L, D})).sum().backward();
  };
  h.step(1, body);
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  EXPECT_EQ(e.sections.get<FlopEpochStats>()->unfused_attention_per_step, 0);
  EXPECT_DOUBLE_EQ(e.sections.get<FlopEpochStats>()->unfused_attention_flops_per_step, 0);
  EXPECT_GT(e.sections.get<FlopEpochStats>()->model_flops_per_step, 0);
}

#if TORCHPILOT_TORCH_AT_LEAST(2, 0)
TEST(FlopCounterTest, ScaledDotProductAttentionIsNotUnfused) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  auto body = [] {
    auto q = torch::randn({B, H, L, D}).requires_grad_(true);
    auto k = torch::randn({B, H, L, D}).requires_grad_(true);
    auto v = torch::randn({B, H, L, D}).requires_grad_(true);
    at::scaled_dot_product_attention(q, k, v).sum().backward();
  };
  const StepRecord r = h.step(1, body);
  const double counted = r.metrics.get("flops", "model_flops");
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  if (e.sections.get<FlopEpochStats>()->fused_attention_flops_per_step > 0) {
    // A fused CPU kernel: forward 2 bmm-equivalents, backward 4, plus the scores it recomputes
    // (hardware FLOPs only).
    EXPECT_DOUBLE_EQ(counted, 6 * kBmm);
    EXPECT_DOUBLE_EQ(r.metrics.get("flops", "hardware_flops"), 7 * kBmm);
    EXPECT_DOUBLE_EQ(e.sections.get<FlopEpochStats>()->fused_attention_flops_per_step, 6 * kBmm);
    EXPECT_EQ(e.sections.get<FlopEpochStats>()->unfused_attention_per_step, 0);
  } else {
    // The math path: its bmms (2 forward, 4 backward), found as SDPA's math fallback.
    EXPECT_DOUBLE_EQ(counted, 6 * kBmm);
    EXPECT_EQ(e.sections.get<FlopEpochStats>()->sdpa_math_fallback_per_step, 1);
    EXPECT_EQ(e.sections.get<FlopEpochStats>()->unfused_attention_per_step, 1);
  }
}
#endif

// autocast re-dispatches aten::mm with bf16 inputs inside the fp32 call: the inner (leaf) op
// counts once, as bf16.
TEST(FlopCounterTest, AutocastCountsTheInnerOpOnce) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  auto body = [] {
#if TORCHPILOT_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
#else
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
#endif
    torch::mm(torch::randn({16, 32}), torch::randn({32, 8}));
#if TORCHPILOT_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(at::kCPU, false);
#else
    at::autocast::set_cpu_enabled(false);
#endif
    at::autocast::clear_cache();
  };
  const StepRecord& r = h.step(1, body);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), 2.0 * 16 * 32 * 8);
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  EXPECT_DOUBLE_EQ(
      e.sections.get<FlopEpochStats>()->model_flops_by_precision[P(MathPrecision::kBf16)],
      2.0 * 16 * 32 * 8);
  EXPECT_DOUBLE_EQ(
      e.sections.get<FlopEpochStats>()->model_flops_by_precision[P(MathPrecision::kFp32)], 0);
}

TEST(FlopCounterTest, OpsOnOtherThreadsCount) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  auto body = [] {
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([] { torch::mm(torch::randn({10, 20}), torch::randn({20, 30})); });
    }
    for (auto& t : threads) t.join();
  };
  EXPECT_DOUBLE_EQ(h.step(1, body).metrics.get("flops", "model_flops"), 3 * 12000.0);
}

TEST(FlopCounterTest, RecomputationCountsInHardwareFlopsOnly) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1));
  torch::nn::Linear lin(kIn, kOut);
  auto body = [&] {
    linear_step(lin, 8)();
    // The forward again, as activation checkpointing would in backward.
    auto scope = h.counter->recompute();
    torch::NoGradGuard no_grad;
    lin->forward(torch::randn({8, kIn}));
  };
  const StepRecord& r = h.step(8, body);
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "model_flops"), linear_flops(8));
  EXPECT_DOUBLE_EQ(r.metrics.get("flops", "hardware_flops"),
                   linear_flops(8) + 2.0 * 8 * kIn * kOut);
}

TEST(FlopCounterTest, ConfigPeakGivesMfuOnCpu) {
  torch::manual_seed(0);
  Harness h(flop_config(0, 1, /*peak_tflops=*/0.001));  // 1 GFLOP/s
  torch::nn::Linear lin(kIn, kOut);
  EXPECT_EQ(h.counter->peak().source, "config");
  h.step(8, linear_step(lin, 8));
  for (int i = 0; i < 3; ++i) {
    const StepRecord& r = h.step(8, linear_step(lin, 8));
    const double seconds = static_cast<double>(r.step_ns()) / 1e9;
    EXPECT_NEAR(r.metrics.get("flops", "mfu"), linear_flops(8) / 1e9 / seconds,
                1e-9 * r.metrics.get("flops", "mfu"));
    EXPECT_DOUBLE_EQ(r.metrics.get("flops", "hfu"), r.metrics.get("flops", "mfu"));
  }
  const EpochSummary& e = h.end_epoch();
  ASSERT_TRUE((e.sections.get<FlopEpochStats>() != nullptr));
  EXPECT_GT(e.sections.get<FlopEpochStats>()->mfu, 0);
  EXPECT_EQ(e.sections.get<FlopEpochStats>()->peak_source, "config");
  EXPECT_DOUBLE_EQ(e.sections.get<FlopEpochStats>()->peak_flops_per_s, 1e9);
}

TEST(FlopCounterTest, ModeOffAndASecondCounterAreInert) {
  {
    Config off = flop_config(0, 1);
    off.mode = Mode::kOff;
    Pilot pilot(off);
    FlopCounter counter(pilot);
    EXPECT_FALSE(counter.counting());
  }
  Harness h(flop_config(0, 1));
  FlopCounter second(*h.pilot);
  EXPECT_FALSE(second.counting());
  EXPECT_TRUE(h.counter->counting());
  EXPECT_DOUBLE_EQ(h.step(1,
                          [] {
                            torch::mm(torch::randn({10, 20}), torch::randn({20, 30}));
                          })
                       .metrics.get("flops", "model_flops"),
                   12000.0)
      << "counted once";
}

TEST(FlopCounterTest, PilotDestroyedFirst) {
  auto pilot = std::make_unique<Pilot>(flop_config(0, 1));
  FlopCounter counter(*pilot);
  { auto s = pilot->step(1); }
  pilot.reset();  // calls forget_pilot(); the counter's destructor must not touch the Pilot
  SUCCEED();
}

}  // namespace
}  // namespace torchpilot
