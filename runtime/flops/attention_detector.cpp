// The unfused-attention detector (attention_detector.h).
#include "torchpilot/runtime/flops/attention_detector.h"

#include <cstddef>
#include <utility>

#include "torchpilot/runtime/flops/flop_formulas.h"

namespace torchpilot {

bool AttentionDetector::matches(const Shape& s, const Pending& p) const {
  if (s.size() < 2 || shape_numel(s) != static_cast<double>(p.numel)) return false;
  const int64_t a = s[s.size() - 2], b = s[s.size() - 1];
  return (a == p.lq && b == p.lk) || (a == p.lk && b == p.lq);
}

AttentionDelta AttentionDetector::confirm(Pending& p) {
  AttentionDelta d;
  p.confirmed = true;
  for (size_t i : p.before) {
    if (i < recent_before_.size()) d.unfused_flops += recent_before_[i];
  }
  d.instances = p.backward ? 0 : 1;
  d.math_fallback = (!p.backward && p.inside_sdpa) ? 1 : 0;
  d.traffic_bytes = p.bytes * (p.backward ? 7.0 : 4.0);
  return d;
}

AttentionDelta AttentionDetector::on_matmul(const MatmulShapes& shapes, double flops) {
  AttentionDelta d;
  bool attributed = false;
  if (pending_ && pending_->matmuls_left > 0) {
    Pending& p = *pending_;
    --p.matmuls_left;
    if (matches(shapes.a, p) || matches(shapes.b, p)) {
      if (!p.confirmed && !p.before.empty()) d = confirm(p);
      if (p.confirmed) {
        d.unfused_flops += flops;
        attributed = true;
      }
    }
  }
  recent_.push_back({shapes, flops, attributed});
  if (recent_.size() > static_cast<size_t>(kWindow)) recent_.erase(recent_.begin());
  return d;
}

AttentionDelta AttentionDetector::on_softmax(const Shape& matrix, int64_t element_bytes,
                                             bool backward, bool inside_sdpa) {
  pending_.reset();
  recent_before_.clear();
  if (matrix.size() < 3) {
    recent_.clear();
    return {};
  }
  Pending p;
  const double n = shape_numel(matrix);
  p.numel = static_cast<int64_t>(n);
  p.lq = matrix[matrix.size() - 2];
  p.lk = matrix[matrix.size() - 1];
  p.matmuls_left = kWindow;
  p.backward = backward;
  p.inside_sdpa = inside_sdpa;
  p.bytes = n * static_cast<double>(element_bytes);
  for (const Recent& r : recent_) {
    if (r.attributed) continue;
    if (matches(r.shapes.out, p) || matches(r.shapes.a, p) || matches(r.shapes.b, p)) {
      p.before.push_back(recent_before_.size());
      recent_before_.push_back(r.flops);
    }
  }
  recent_.clear();
  pending_ = std::move(p);
  return {};
}

void AttentionDetector::reset() {
  recent_.clear();
  recent_before_.clear();
  pending_.reset();
}

}  // namespace torchpilot
