// The parse's cpu_ops and the FLOP count over them, shared by kineto_trace.cpp (parsing) and
// kineto_flops.cpp (FLOPs from recorded shapes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "torchpilot/runtime/analyze/kineto_trace.h"
#include "torchpilot/runtime/flops/flop_accumulation.h"
#include "torchpilot/runtime/flops/flop_formulas.h"

namespace torchpilot::kineto_detail {

using json = nlohmann::json;

struct CpuOp {
  Nanos begin = 0, end = 0;
  int64_t tid = 0;
  std::string name;
  const json* args = nullptr;
  OpKind kind = OpKind::kUntracked;
  size_t event = 0;  // its index in traceEvents (for messages)
};

// The items of a list of intervals that overlap a window, for windows whose begin never goes
// back (one step after another): a sweep that holds the items begun before the window and not
// yet ended, so that each query costs its answer and a log, not the list's length (a trace of
// 20,000 steps made every per-step scan quadratic).
class Overlaps {
 public:
  // `begin(i)` and `end(i)` of items 0..n-1.
  template <typename Begin, typename End>
  Overlaps(size_t n, Begin begin, End end) : begin_(n), end_(n), order_(n) {
    for (size_t i = 0; i < n; ++i) {
      begin_[i] = begin(i);
      end_[i] = end(i);
    }
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::stable_sort(order_.begin(), order_.end(),
                     [&](size_t a, size_t b) { return begin_[a] < begin_[b]; });
  }
  // The items with end >= lo and begin <= hi, in their list order. `lo` is at least the previous
  // call's (callers keep it so).
  void find(Nanos lo, Nanos hi, std::vector<size_t>& out) {
    out.clear();
    while (next_ < order_.size() && begin_[order_[next_]] < lo) {
      const size_t i = order_[next_++];
      active_.insert({end_[i], i});
    }
    while (!active_.empty() && active_.begin()->first < lo) active_.erase(active_.begin());
    for (const auto& [end, i] : active_) out.push_back(i);
    for (size_t k = next_; k < order_.size() && begin_[order_[k]] <= hi; ++k) {
      out.push_back(order_[k]);
    }
    std::sort(out.begin(), out.end());
  }

 private:
  std::vector<Nanos> begin_, end_;
  std::vector<size_t> order_;                  // by begin
  size_t next_ = 0;                            // order_[next_..] begin at or after the last lo
  std::set<std::pair<Nanos, size_t>> active_;  // begun before lo, by end
};

// The FLOP counter's rules on one thread's nested ops: an op with a formula counts only when no
// op with a formula ran inside it (leaf ops), softmaxes likewise; the unfused-attention detector
// sees the leaf matmuls and softmaxes in order. Adds each counted op to the tally of the step
// whose host span holds the op's start.
void count_flops(std::vector<CpuOp>& ops, bool cuda, std::vector<KinetoStep>& steps,
                 std::vector<FlopTally>& tallies);

}  // namespace torchpilot::kineto_detail
