// FLOPs from a Kineto trace's recorded shapes: the cpu_ops' inputs as the FLOP formulas'
// arguments, counted per step by the FLOP counter's rules.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "kineto_trace_internal.h"
#include "torchpilot/runtime/flops/attention_detector.h"
#include "torchpilot/runtime/flops/flop_formulas.h"

namespace torchpilot {
namespace {

using json = nlohmann::json;

// The trace does not record whether TF32 was allowed: PyTorch's defaults (TF32 off for
// matmuls, on for cuDNN convolutions), as a program that never sets them runs.
constexpr MathFlags kDefaultMathFlags{/*tf32_matmul=*/false, /*tf32_conv=*/true};

// ---- FLOPs from recorded shapes --------------------------------------------------------------

// The c10 ScalarType names the FLOP formulas read (static storage: OpArg keeps a string_view).
std::string_view c10_dtype(std::string_view kineto) {
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"float", "Float"},
      {"double", "Double"},
      {"c10::Half", "Half"},
      {"c10::BFloat16", "BFloat16"},
      {"c10::Float8_e4m3fn", "Float8_e4m3fn"},
      {"c10::Float8_e5m2", "Float8_e5m2"},
      {"c10::Float8_e4m3fnuz", "Float8_e4m3fnuz"},
      {"c10::Float8_e5m2fnuz", "Float8_e5m2fnuz"},
      {"int", "Int"},
      {"long int", "Long"},
      {"bool", "Bool"},
  };
  for (const auto& [k, c] : kNames) {
    if (k == kineto) return c;
  }
  return "Other";
}

// "[1, 1]" -> {1, 1}; "[True, False]" -> {1, 0}; false when not a list of those.
bool parse_list(const std::string& text, std::vector<int64_t>& out, bool& bools) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return false;
  out.clear();
  bools = false;
  std::string item;
  std::istringstream in(text.substr(1, text.size() - 2));
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    item = item.substr(b, item.find_last_not_of(' ') - b + 1);
    if (item == "True" || item == "False") {
      out.push_back(item == "True" ? 1 : 0);
      bools = true;
      continue;
    }
    char* stop = nullptr;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    if (stop == item.c_str() || *stop != '\0') return false;
    out.push_back(v);
  }
  return true;
}

// A tensor of more elements than this is on no GPU (2^40: 4 TiB in fp32).
constexpr double kMaxElements = 1099511627776.0;

std::string where_dims(size_t event) {
  return "traceEvents[" + std::to_string(event) + "].args.\"Input Dims\"";
}

// A cpu_op's recorded inputs ("Input Dims", "Input type", "Concrete Inputs") as the FLOP
// formulas' arguments. Sizes below 0 or tensors of more than kMaxElements are KinetoErrors.
OpArgs op_args(const json& args, bool cuda, size_t event) {
  OpArgs out;
  const auto dims = args.find("Input Dims");
  const auto types = args.find("Input type");
  if (dims == args.end() || types == args.end()) return out;
  if (!dims->is_array() || !types->is_array()) {
    const std::string where = "traceEvents[" + std::to_string(event) + "].args";
    throw KinetoError(where + ".\"Input Dims\" and .\"Input type\" are " +
                      (dims->is_array() ? "an array and not" : "not an array and") +
                      " an array: expected two arrays");
  }
  const auto concrete = args.find("Concrete Inputs");
  for (size_t i = 0; i < types->size(); ++i) {
    const std::string type = (*types)[i].is_string() ? (*types)[i].get<std::string>() : "";
    std::string value;
    if (concrete != args.end() && concrete->is_array() && i < concrete->size() &&
        (*concrete)[i].is_string()) {
      value = (*concrete)[i].get<std::string>();
    }
    if (type.empty()) {
      out.push_back(OpArg::none());
    } else if (type == "Scalar") {
      if (value == "True" || value == "False") {
        out.push_back(OpArg::boolean(value == "True"));
      } else {
        char* stop = nullptr;
        const long long v = std::strtoll(value.c_str(), &stop, 10);
        if (!value.empty() && *stop == '\0') {
          out.push_back(OpArg::integer(v));
        } else {
          const double d = std::strtod(value.c_str(), &stop);
          out.push_back(!value.empty() && *stop == '\0' ? OpArg::real_number(d) : OpArg{});
        }
      }
    } else if (type == "ScalarList") {
      std::vector<int64_t> ints;
      bool bools = false;
      if (!parse_list(value, ints, bools)) {
        out.push_back(OpArg{});
      } else if (bools) {
        out.push_back(OpArg::bool_list(std::vector<bool>(ints.begin(), ints.end())));
      } else {
        out.push_back(OpArg::int_list(ints));
      }
    } else if (type == "TensorList" || type == "GenericList") {
      out.push_back(OpArg{});
    } else {
      Shape shape;
      if (i < dims->size() && (*dims)[i].is_array()) {
        const json& tensor = (*dims)[i];
        const std::string where = where_dims(event) + "[" + std::to_string(i) + "]";
        double elements = 1;
        for (size_t d = 0; d < tensor.size(); ++d) {
          const json& size = tensor[d];
          const std::string at = where + "[" + std::to_string(d) + "]";
          if (!size.is_number_integer()) {
            throw KinetoError(at + " is not an integer: expected a size of 0 or more");
          }
          if (size.is_number_unsigned() ? size.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                                        : size.get<int64_t>() < 0) {
            throw KinetoError(at + " is " + size.dump() + ": expected a size of 0 or more");
          }
          shape.push_back(size.get<int64_t>());
          elements *= static_cast<double>(shape.back());
        }
        if (elements > kMaxElements) {
          char text[96];
          std::snprintf(text, sizeof text, " has %g elements: expected at most %g (2^40)", elements,
                        kMaxElements);
          throw KinetoError(where + text);
        }
      }
      out.push_back(OpArg::tensor(shape, c10_dtype(type), cuda));
    }
  }
  return out;
}

}  // namespace

namespace kineto_detail {

void count_flops(std::vector<CpuOp>& ops, bool cuda, std::vector<KinetoStep>& steps,
                 std::vector<FlopTally>& tallies) {
  std::sort(ops.begin(), ops.end(), [](const CpuOp& a, const CpuOp& b) {
    if (a.tid != b.tid) return a.tid < b.tid;
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end > b.end;  // outer first
  });
  // Steps are in order and never overlap: a binary search.
  auto step_of = [&](Nanos t) -> int {
    const auto after =
        std::upper_bound(steps.begin(), steps.end(), t,
                         [](Nanos at, const KinetoStep& k) { return at < k.spans.host.begin; });
    if (after == steps.begin() || t >= std::prev(after)->spans.host.end) return -1;
    return static_cast<int>(std::prev(after) - steps.begin());
  };
  size_t i = 0;
  while (i < ops.size()) {
    const int64_t tid = ops[i].tid;
    size_t j = i;
    while (j < ops.size() && ops[j].tid == tid) ++j;
    // Tracked ops of this thread, with a leaf flag from the nesting.
    std::vector<size_t> tracked;
    for (size_t k = i; k < j; ++k) {
      if (ops[k].kind != OpKind::kUntracked) tracked.push_back(k);
    }
    std::vector<bool> has_child(tracked.size(), false);
    std::vector<size_t> stack;  // indices into tracked
    std::vector<int> sdpa_depth_at(tracked.size(), 0);
    for (size_t t = 0; t < tracked.size(); ++t) {
      const CpuOp& op = ops[tracked[t]];
      while (!stack.empty() && ops[tracked[stack.back()]].end <= op.begin) stack.pop_back();
      int sdpa = 0;
      for (size_t s : stack) sdpa += ops[tracked[s]].kind == OpKind::kAttentionComposite ? 1 : 0;
      sdpa_depth_at[t] = sdpa;
      if (op.kind != OpKind::kAttentionComposite) {
        // The nearest open op of the same sort (formula or softmax) is not a leaf.
        for (auto s = stack.rbegin(); s != stack.rend(); ++s) {
          const OpKind k = ops[tracked[*s]].kind;
          if (k == OpKind::kAttentionComposite) continue;
          if (has_formula(k) == has_formula(op.kind)) {
            has_child[*s] = true;
            break;
          }
        }
      }
      stack.push_back(t);
    }
    // Leaf ops in order of their end (when the live counter's callback sees them finish).
    std::vector<size_t> order;
    for (size_t t = 0; t < tracked.size(); ++t) {
      if (!has_child[t] && ops[tracked[t]].kind != OpKind::kAttentionComposite) order.push_back(t);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return ops[tracked[a]].end < ops[tracked[b]].end; });
    AttentionDetector detector;
    for (size_t t : order) {
      const CpuOp& op = ops[tracked[t]];
      const int s = step_of(op.begin);
      if (op.args == nullptr) continue;
      const OpArgs args = op_args(*op.args, cuda, op.event);
      if (has_formula(op.kind)) {
        const double flops = op_flops(op.name, args);
        AttentionDelta delta;
        if (op.kind == OpKind::kMatmul && flops >= 0) {
          if (const auto shapes = matmul_shapes(op.name, args)) {
            delta = detector.on_matmul(*shapes, flops);
          }
        }
        if (s < 0) continue;
        FlopTally& tally = tallies[static_cast<size_t>(s)];
        if (std::isnan(flops)) {
          tally.add_unparsed();
        } else {
          const MathPrecision p = op_precision(op.name, args, kDefaultMathFlags);
          tally.add(op.name, op.kind, p, flops, /*recompute=*/false);
          const double recompute = op_recompute_flops(op.name, args);
          if (recompute > 0) tally.add(op.name, op.kind, p, recompute, /*recompute=*/true);
        }
        if (delta.any()) tally.add_attention(delta);
      } else if (const auto shape = softmax_shape(op.name, args)) {
        const int64_t bytes = args.empty() ? 4 : dtype_bytes(args[0].dtype);
        detector.on_softmax(*shape, bytes, op.kind == OpKind::kSoftmaxBackward,
                            sdpa_depth_at[t] > 0);
      }
    }
    i = j;
  }
}

}  // namespace kineto_detail
}  // namespace torchpilot
