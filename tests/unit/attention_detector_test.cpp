// The unfused-attention detector (runtime/flops/attention_detector.cpp).
#include "torchpilot/runtime/flops/attention_detector.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace torchpilot {
namespace {

// ---- attention detector -------------------------------------------------------------------------

// Attention with B=2, H=4, L=16, D=32 computed as bmm + softmax + bmm (bmm shapes [B*H, ...]).
struct Unfused {
  static constexpr int64_t BH = 8, L = 16, D = 32;
  const double f = 2.0 * BH * L * L * D;  // each of the matmuls
  AttentionDelta forward(AttentionDetector& d, bool inside_sdpa = false) const {
    AttentionDelta sum;
    auto add = [&](const AttentionDelta& x) {
      sum.unfused_flops += x.unfused_flops;
      sum.instances += x.instances;
      sum.math_fallback += x.math_fallback;
      sum.traffic_bytes += x.traffic_bytes;
    };
    add(d.on_matmul({{BH, L, D}, {BH, D, L}, {BH, L, L}}, f));  // S = Q K^T
    add(d.on_softmax({2, 4, L, L}, 4, false, inside_sdpa));     // P = softmax(S)
    add(d.on_matmul({{BH, L, L}, {BH, L, D}, {BH, L, D}}, f));  // O = P V
    return sum;
  }
  AttentionDelta backward(AttentionDetector& d) const {
    AttentionDelta sum;
    auto add = [&](const AttentionDelta& x) {
      sum.unfused_flops += x.unfused_flops;
      sum.instances += x.instances;
      sum.traffic_bytes += x.traffic_bytes;
    };
    add(d.on_matmul({{BH, L, D}, {BH, D, L}, {BH, L, L}}, f));  // dP = dO V^T
    add(d.on_matmul({{BH, L, L}, {BH, L, D}, {BH, L, D}}, f));  // dV = P^T dO
    add(d.on_softmax({2, 4, L, L}, 4, true, false));            // dS
    add(d.on_matmul({{BH, L, L}, {BH, L, D}, {BH, L, D}}, f));  // dQ = dS K
    add(d.on_matmul({{BH, L, L}, {BH, L, D}, {BH, L, D}}, f));  // dK = dS^T Q
    return sum;
  }
};

TEST(AttentionDetectorTest, FindsForwardAndBackward) {
  AttentionDetector d;
  const Unfused u;
  const AttentionDelta fwd = u.forward(d);
  EXPECT_DOUBLE_EQ(fwd.unfused_flops, 2 * u.f);
  EXPECT_EQ(fwd.instances, 1);
  EXPECT_EQ(fwd.math_fallback, 0);
  // Score matrix: 2*4*16*16 fp32 elements, 4 passes.
  EXPECT_DOUBLE_EQ(fwd.traffic_bytes, 4.0 * 2 * 4 * 16 * 16 * 4);
  const AttentionDelta bwd = u.backward(d);
  EXPECT_DOUBLE_EQ(bwd.unfused_flops, 4 * u.f);
  EXPECT_EQ(bwd.instances, 0) << "instances are forward softmaxes";
  EXPECT_DOUBLE_EQ(bwd.traffic_bytes, 7.0 * 2 * 4 * 16 * 16 * 4);
}

TEST(AttentionDetectorTest, LayersInSequenceCountEachMatmulOnce) {
  AttentionDetector d;
  const Unfused u;
  double total = 0;
  int instances = 0;
  for (int layer = 0; layer < 3; ++layer) {
    const AttentionDelta a = u.forward(d);
    total += a.unfused_flops;
    instances += a.instances;
    // The layer's projections and MLP in between (shapes unrelated to the score matrix).
    d.on_matmul({{32, 64}, {64, 64}, {32, 64}}, 1e6);
    d.on_matmul({{32, 64}, {64, 256}, {32, 256}}, 1e6);
  }
  EXPECT_DOUBLE_EQ(total, 3 * 2 * u.f);
  EXPECT_EQ(instances, 3);
}

TEST(AttentionDetectorTest, InsideSdpaIsTheMathFallback) {
  AttentionDetector d;
  EXPECT_EQ(Unfused().forward(d, true).math_fallback, 1);
}

TEST(AttentionDetectorTest, NoFalsePositives) {
  const Unfused u;
  {
    // A classifier's softmax (rank 2) after a linear layer, followed by a matmul of its shape.
    AttentionDetector d;
    EXPECT_FALSE(d.on_matmul({{32, 64}, {64, 10}, {32, 10}}, 1e5).any());
    d.on_softmax({32, 10}, 4, false, false);
    EXPECT_FALSE(d.on_matmul({{32, 10}, {10, 64}, {32, 64}}, 1e5).any());
  }
  {
    // A softmax with a matching matmul before but none after (e.g. attention weights returned).
    AttentionDetector d;
    d.on_matmul({{u.BH, u.L, u.D}, {u.BH, u.D, u.L}, {u.BH, u.L, u.L}}, u.f);
    d.on_softmax({2, 4, u.L, u.L}, 4, false, false);
    for (int i = 0; i < 6; ++i) {
      EXPECT_FALSE(d.on_matmul({{32, 64}, {64, 64}, {32, 64}}, 1e6).any());
    }
    // A matching matmul beyond the window does not count.
    EXPECT_FALSE(d.on_matmul({{u.BH, u.L, u.L}, {u.BH, u.L, u.D}, {u.BH, u.L, u.D}}, u.f).any());
  }
  {
    // A matching matmul after, none before (the softmax's input came from elsewhere).
    AttentionDetector d;
    d.on_softmax({2, 4, u.L, u.L}, 4, false, false);
    EXPECT_FALSE(d.on_matmul({{u.BH, u.L, u.L}, {u.BH, u.L, u.D}, {u.BH, u.L, u.D}}, u.f).any());
  }
  {
    // Same element count, other trailing dims: no match.
    AttentionDetector d;
    d.on_matmul({{8, 32, 8}, {8, 8, 8}, {8, 32, 8}}, 1e3);  // 2048 elements, dims (32, 8)
    d.on_softmax({2, 4, 16, 16}, 4, false, false);          // 2048 elements, dims (16, 16)
    EXPECT_FALSE(d.on_matmul({{8, 32, 8}, {8, 8, 4}, {8, 32, 4}}, 1e3).any());
  }
  {
    // reset() forgets a half-seen attention.
    AttentionDetector d;
    d.on_matmul({{u.BH, u.L, u.D}, {u.BH, u.D, u.L}, {u.BH, u.L, u.L}}, u.f);
    d.on_softmax({2, 4, u.L, u.L}, 4, false, false);
    d.reset();
    EXPECT_FALSE(d.on_matmul({{u.BH, u.L, u.L}, {u.BH, u.L, u.D}, {u.BH, u.L, u.D}}, u.f).any());
  }
}

}  // namespace
}  // namespace torchpilot
