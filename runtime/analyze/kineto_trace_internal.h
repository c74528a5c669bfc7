// The parse's cpu_ops and the FLOP count over them, shared by kineto_trace.cpp (parsing) and
// kineto_flops.cpp (FLOPs from recorded shapes).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
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
};

// The FLOP counter's rules on one thread's nested ops: an op with a formula counts only when no
// op with a formula ran inside it (leaf ops), softmaxes likewise; the unfused-attention detector
// sees the leaf matmuls and softmaxes in order. Adds each counted op to the tally of the step
// whose host span holds the op's start.
void count_flops(std::vector<CpuOp>& ops, bool cuda, std::vector<KinetoStep>& steps,
                 std::vector<FlopTally>& tallies);

}  // namespace torchpilot::kineto_detail
