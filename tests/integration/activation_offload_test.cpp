// ActivationOffload on the CPU build: the pure decisions, the refusal line, and the whole
// mechanism (engine stub, default saved-tensor hooks, storage sharing, settling, fetching ahead,
// the in-place check) with host-to-host copies standing in for the GPU.
#include "torchpilot/hooks/memory/activation_offload.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "offload_test_model.h"
#include "torchpilot/runtime/core/config.h"
#include "torchpilot/runtime/core/pilot.h"

namespace torchpilot {
namespace {

using detail::OffloadDecision;
using offload_test::bitwise_equal;
using offload_test::gradients;
using offload_test::TinyModel;

struct Lines {
  std::vector<std::string> lines;
  ActivationOffload::LogFn fn() {
    return [this](LogLevel, const std::string& m) { lines.push_back(m); };
  }
  int count(const std::string& part) const {
    int n = 0;
    for (const auto& l : lines) n += l.find(part) != std::string::npos ? 1 : 0;
    return n;
  }
};

TEST(ActivationOffloadRules, DecisionBySizeParameterAndDevice) {
  detail::SavedTensorFacts f;
  f.movable = true;
  f.storage_bytes = 1 << 20;
  EXPECT_EQ(detail::decide_offload(f, 1 << 20), OffloadDecision::kOffload);
  EXPECT_EQ(detail::decide_offload(f, (1 << 20) + 1), OffloadDecision::kSmall);
  f.parameter = true;
  EXPECT_EQ(detail::decide_offload(f, 1), OffloadDecision::kParameter);
  f.movable = false;
  EXPECT_EQ(detail::decide_offload(f, 1), OffloadDecision::kOther);
}

TEST(ActivationOffloadRules, ViewAndCastNodes) {
  for (const char* n : {"TBackward0", "ToCopyBackward0", "ViewBackward0", "TransposeBackward0"}) {
    EXPECT_TRUE(detail::is_view_or_cast_node(n)) << n;
  }
  for (const char* n : {"MmBackward0", "AddmmBackward0", "EmbeddingBackward0", "GeluBackward0",
                        "torch::autograd::AccumulateGrad"}) {
    EXPECT_FALSE(detail::is_view_or_cast_node(n)) << n;
  }
}

TEST(ActivationOffloadRules, PrefetchNearestEarlierFirstUpToDepth) {
  EXPECT_EQ(detail::prefetch_order(10, {2, 9, 11, 7, 8, 3}, 3), (std::vector<uint64_t>{9, 8, 7}));
  EXPECT_EQ(detail::prefetch_order(10, {12, 11}, 3), std::vector<uint64_t>{});
  EXPECT_EQ(detail::prefetch_order(5, {1, 4}, 0), std::vector<uint64_t>{});
  EXPECT_EQ(detail::prefetch_order(5, {1, 4}, 8), (std::vector<uint64_t>{4, 1}));
}

// Without a GPU (this build) the constructor refuses with one line; with a GPU (a CUDA build), a
// CPU model is refused with one line at the end of its first scope. Either way no throw, the
// scope runs the model as before, and exactly one line.
TEST(ActivationOffload, CpuModelIsRefusedWithOneLine) {
  torch::manual_seed(3);
  TinyModel model(32, 4, 2);
  const auto x = torch::randn({2, 16, 32});
  Lines log;
  OffloadOptions o;
  o.min_bytes = 1024;
  ActivationOffload offload(o, log.fn());
  const auto plain = gradients(model, x);
  for (int i = 0; i < 3; ++i) {
    const auto with = gradients(model, x, [&](torch::Tensor in) {
      auto s = offload.scope();
      return model->forward(in).sum();
    });
    EXPECT_TRUE(bitwise_equal(plain, with));
  }
  offload.set_enabled(false);  // the knob turning it off and on again: no second line
  offload.set_enabled(true);
  for (const auto& l : log.lines) std::printf("  log: %s\n", l.c_str());
  ASSERT_EQ(log.lines.size(), 1u);
  EXPECT_EQ(log.count("activation offloading refused"), 1);
  EXPECT_TRUE(offload.refused());
  EXPECT_FALSE(offload.enabled());
  EXPECT_EQ(offload.stats().offloaded, 0);
  if (!offload.available()) {
    EXPECT_NE(offload.unavailable_reason().find("CUDA"), std::string::npos)
        << offload.unavailable_reason();
  }
}

TEST(ActivationOffload, NotAskedForSaysNothing) {
  Lines log;
  OffloadOptions o;
  o.enabled = false;
  ActivationOffload offload(o, log.fn());
  EXPECT_TRUE(log.lines.empty());
  EXPECT_FALSE(offload.enabled());
}

TEST(ActivationOffload, FromAPilotTakesItsConfigAndItsKnobGoesWithIt) {
  Config c;
  c.log.level = "off";
  c.gpu.enabled = false;
  c.offload.enabled = true;
  c.offload.min_bytes = 4096;
  c.offload.depth = 2;
  Pilot pilot(c);
  {
    ActivationOffload offload(pilot);
    EXPECT_TRUE(offload.options().enabled);
    EXPECT_EQ(offload.options().min_bytes, 4096);
    EXPECT_EQ(offload.options().depth, 2);
    // The knob where offloading is available (a GPU), none here without one.
    EXPECT_EQ(pilot.knobs().find("offload.enabled") != nullptr, offload.available());
  }
  EXPECT_EQ(pilot.knobs().find("offload.enabled"), nullptr);
}

struct HostRun {
  std::vector<torch::Tensor> grads;
  OffloadStats stats;
};

HostRun run_with_host_copies(TinyModel& model, const torch::Tensor& x, OffloadOptions o,
                             bool per_block) {
  auto offload = ActivationOffload::for_testing_host_copies(o);
  HostRun r;
  r.grads = gradients(model, x, [&](torch::Tensor in) {
    if (per_block) {
      return model
          ->forward(in,
                    [&](offload_test::TinyBlock& b, torch::Tensor t) {
                      return offload->run([&] { return b->forward(t); });
                    })
          .sum();
    }
    auto s = offload->scope();
    return model->forward(in).sum();
  });
  r.stats = offload->stats();
  return r;
}

// The whole mechanism on the CPU (LibTorch 1.13 here): every depth, whole-forward and per-block
// scopes give bit-identical gradients, and the bookkeeping shows what moved.
TEST(ActivationOffload, HostCopiesGiveBitIdenticalGradients) {
  torch::manual_seed(5);
  TinyModel model(64, 4, 3);
  const auto x = torch::randn({2, 32, 64});
  const auto plain = gradients(model, x);
  for (int depth : {0, 1, 4, 1000}) {
    for (bool per_block : {false, true}) {
      SCOPED_TRACE("depth " + std::to_string(depth) + (per_block ? " per block" : " whole"));
      OffloadOptions o;
      o.min_bytes = 4096;
      o.depth = depth;
      const HostRun r = run_with_host_copies(model, x, o, per_block);
      EXPECT_TRUE(bitwise_equal(plain, r.grads));
      const OffloadStats& s = r.stats;
      std::printf(
          "  depth %d %s: saved %lld, offloaded %lld (%lld bytes), shared %lld, small %lld, "
          "parameter %lld, other %lld, fetched %lld (late %lld), resident %lld\n",
          depth, per_block ? "per block" : "whole", (long long)s.saved, (long long)s.offloaded,
          (long long)s.offloaded_bytes, (long long)s.shared, (long long)s.kept_small,
          (long long)s.kept_parameter, (long long)s.kept_other, (long long)s.fetched,
          (long long)s.fetched_late, (long long)s.resident);
      EXPECT_GT(s.offloaded, 10);
      EXPECT_GT(s.shared, 0) << "q, k and v view the QKV projection's storage";
      EXPECT_GT(s.kept_parameter, 0) << "the Linear weights' t() are parameters";
      EXPECT_GT(s.kept_small, 0) << "LayerNorm's statistics are small";
      EXPECT_EQ(s.kept_other, 0);
      if (depth == 0) {
        EXPECT_EQ(s.resident, 0);
        EXPECT_EQ(s.fetched, s.offloaded);
        EXPECT_EQ(s.fetched_late, s.offloaded) << "nothing fetched ahead at depth 0";
      } else if (depth >= 1000) {
        EXPECT_EQ(s.fetched, 0) << "every copy still resident";
        EXPECT_GT(s.resident, 0);
      } else {
        EXPECT_GT(s.resident, 0);
        EXPECT_GT(s.fetched, 0);
        EXPECT_LT(s.fetched_late, s.fetched) << "some fetched ahead";
        EXPECT_EQ(s.fetched, s.offloaded - depth) << "all but the last `depth` copies, resident";
      }
    }
  }
}

TEST(ActivationOffload, OutsideAScopeAndWhenDisabledNothingIsSaved) {
  torch::manual_seed(6);
  TinyModel model(32, 4, 1);
  const auto x = torch::randn({2, 16, 32});
  OffloadOptions o;
  o.min_bytes = 1024;
  auto offload = ActivationOffload::for_testing_host_copies(o);
  gradients(model, x);
  EXPECT_EQ(offload->stats().saved, 0);
  // Another thread's scope does not reach this thread.
  {
    auto s = offload->scope();
    std::thread([&] { gradients(model, x); }).join();
  }
  EXPECT_EQ(offload->stats().saved, 0);
  Knob k = offload->knob();
  EXPECT_EQ(k.name, "offload.enabled");
  EXPECT_EQ(k.domain, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(k.get(), 1);
  k.set(0);
  EXPECT_FALSE(offload->enabled());
  gradients(model, x, [&](torch::Tensor in) {
    auto s = offload->scope();
    return model->forward(in).sum();
  });
  EXPECT_EQ(offload->stats().saved, 0);
  k.set(1);
  gradients(model, x, [&](torch::Tensor in) {
    auto s = offload->scope();
    return model->forward(in).sum();
  });
  EXPECT_GT(offload->stats().offloaded, 0);
}

// A copy to the host that fails (no pinned memory left): the tensor stays, forward and backward
// go on with the same gradients, one line says so.
TEST(ActivationOffload, AFailingCopyKeepsTheTensorWithOneLine) {
  torch::manual_seed(8);
  TinyModel model(32, 4, 2);
  const auto x = torch::randn({2, 16, 32});
  const auto plain = gradients(model, x);
  Lines log;
  OffloadOptions o;
  o.min_bytes = 1024;
  auto offload = ActivationOffload::for_testing_host_copies(o, log.fn(), /*failing_copies=*/true);
  for (int i = 0; i < 2; ++i) {
    const auto with = gradients(model, x, [&](torch::Tensor in) {
      auto s = offload->scope();
      return model->forward(in).sum();
    });
    EXPECT_TRUE(bitwise_equal(plain, with));
  }
  EXPECT_EQ(offload->stats().offloaded, 0);
  EXPECT_GT(offload->stats().kept_other, 0);
  ASSERT_EQ(log.lines.size(), 1u);
  EXPECT_EQ(log.count("copying a saved tensor to the host failed"), 1) << log.lines[0];
}

// A saved tensor changed in place after it was saved: autograd's error, offloaded or not.
TEST(ActivationOffload, InPlaceChangeOfASavedTensorIsStillAnError) {
  OffloadOptions o;
  o.min_bytes = 64;
  o.depth = 0;
  auto offload = ActivationOffload::for_testing_host_copies(o);
  for (bool offloaded : {false, true}) {
    SCOPED_TRACE(offloaded ? "offloaded" : "plain");
    auto w = torch::randn({64, 64}, torch::requires_grad());
    torch::Tensor loss;
    torch::Tensor a;
    {
      std::optional<ActivationOffload::Scope> s;
      if (offloaded) s.emplace(offload->scope());
      a = w * 2;
      loss = a.sin().sum();  // sin saves a
    }
    {
      torch::NoGradGuard g;
      a.add_(1);
    }
    EXPECT_THROW(loss.backward(), c10::Error);
  }
  EXPECT_GT(offload->stats().offloaded, 0);
}

// Two saves of one storage share one copy; different versions do not.
TEST(ActivationOffload, ViewsOfOneStorageShareOneCopy) {
  OffloadOptions o;
  o.min_bytes = 64;
  o.depth = 0;
  auto offload = ActivationOffload::for_testing_host_copies(o);
  auto w = torch::randn({8, 96}, torch::requires_grad());
  auto plain_grad = [&](bool offloaded) {
    w.mutable_grad() = torch::Tensor();
    torch::Tensor loss;
    {
      std::optional<ActivationOffload::Scope> s;
      if (offloaded) s.emplace(offload->scope());
      auto h = w * 3;  // one storage, three views
      auto parts = h.chunk(3, 1);
      loss = (parts[0] * parts[1] * parts[2].t().t()).sum();
    }
    loss.backward();
    return w.grad().clone();
  };
  const auto ref = plain_grad(false);
  const auto got = plain_grad(true);
  EXPECT_TRUE(torch::equal(ref, got));
  const OffloadStats s = offload->stats();
  EXPECT_GE(s.shared, 2);
  EXPECT_LE(s.offloaded, 2);  // h's storage, and the product's
}

}  // namespace
}  // namespace torchpilot
