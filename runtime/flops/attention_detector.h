// The unfused-attention detector (docs/metrics.md, "MFU and FLOPs"): finds attention computed as
// matmul -> softmax -> matmul in one thread's sequence of leaf ops and attributes those matmuls'
// FLOPs to it. hooks/flop_counter feeds it each thread's counted matmuls and softmaxes.
// Internal: used by hooks/flops/flop_counter.cpp and the tests; not part of the user API.
//
// Thread-safety: AttentionDetector is not thread-safe; one per thread, or its owner serializes
// access.
// Failure behaviour: nothing here throws; shapes that do not fit are not matched.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "torchpilot/runtime/flops/flop_formulas.h"

namespace torchpilot {

// What the attention detector adds when it confirms an unfused attention.
struct AttentionDelta {
  double unfused_flops = 0;  // matmul FLOPs newly attributed to unfused attention
  int instances = 0;         // forward softmaxes confirmed
  int math_fallback = 0;     // ... of which inside scaled_dot_product_attention
  double traffic_bytes = 0;  // estimated score-matrix DRAM traffic
  bool any() const { return unfused_flops > 0 || instances > 0; }
};

// Unfused attention on one thread's sequence of leaf ops. The heuristic:
//   - The "score matrix" is the input of a softmax (or softmax backward) over the last dimension
//     of a tensor of rank >= 3: numel N, last two dims (Lq, Lk).
//   - A matmul matches it when one of its operands or its result has N elements and last two
//     dims {Lq, Lk} (either order; bmm shapes [B*H, L, L] match a [B, H, L, L] softmax).
//   - Matching matmuls among the last 4 since the previous softmax precede it (QK^T; in backward
//     dP = dO V^T and dV = P^T dO); matching matmuls among the next 4 follow it (PV; in backward
//     dQ = dS K and dK = dS^T Q).
//   - With at least one matching matmul before and one after, the softmax is an unfused attention:
//     all the matching matmuls' FLOPs count as unfused attention (each matmul once). A forward
//     softmax counts one instance. Score-matrix traffic is estimated as N x element size x 4
//     passes (forward: QK^T writes S, softmax reads S and writes P, PV reads P) or x 7 (backward).
//   - Found while aten::scaled_dot_product_attention is open on the thread: its math fallback.
// Fused SDPA ops never reach the detector. Recomputed ops are not fed to it.
class AttentionDetector {
 public:
  AttentionDelta on_matmul(const MatmulShapes& shapes, double flops);
  AttentionDelta on_softmax(const Shape& matrix, int64_t element_bytes, bool backward,
                            bool inside_sdpa);
  void reset();

  static constexpr int kWindow = 4;

 private:
  struct Recent {
    MatmulShapes shapes;
    double flops = 0;
    bool attributed = false;
  };
  struct Pending {
    int64_t numel = 0, lq = 0, lk = 0;
    int matmuls_left = 0;
    bool confirmed = false;
    bool backward = false;
    bool inside_sdpa = false;
    double bytes = 0;
    std::vector<size_t> before;  // indices into recent_before_
  };
  bool matches(const Shape& s, const Pending& p) const;
  AttentionDelta confirm(Pending& p);
  std::vector<Recent> recent_;         // since the last softmax, at most kWindow
  std::vector<double> recent_before_;  // FLOPs of the pending softmax's matching predecessors
  std::optional<Pending> pending_;
};

}  // namespace torchpilot
