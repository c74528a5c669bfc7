// FLOP formulas, which ops count, and the precision an op ran in (flop_formulas.h).
#include "torchpilot/runtime/flops/flop_formulas.h"

#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchpilot {

namespace {

constexpr double kNaN = kNotMeasured;

const OpArg* arg(const OpArgs& args, size_t i) { return i < args.size() ? &args[i] : nullptr; }

const Shape* tensor_at(const OpArgs& args, size_t i) {
  const OpArg* a = arg(args, i);
  return a != nullptr && a->kind == OpArg::Kind::kTensor ? &a->ints : nullptr;
}

std::optional<bool> bool_at(const OpArgs& args, size_t i) {
  const OpArg* a = arg(args, i);
  if (a == nullptr || a->ints.size() != 1) return std::nullopt;
  if (a->kind == OpArg::Kind::kBool || a->kind == OpArg::Kind::kInt) return a->ints[0] != 0;
  return std::nullopt;
}

std::optional<int64_t> int_at(const OpArgs& args, size_t i) {
  const OpArg* a = arg(args, i);
  if (a == nullptr || a->kind != OpArg::Kind::kInt || a->ints.size() != 1) return std::nullopt;
  return a->ints[0];
}

// An int-list argument (stride, padding, dilation), broadcast from one value to `n` dims.
std::optional<std::vector<int64_t>> ints_at(const OpArgs& args, size_t i, size_t n) {
  const OpArg* a = arg(args, i);
  if (a == nullptr) return std::nullopt;
  if (a->kind == OpArg::Kind::kInt && a->ints.size() == 1) {
    return std::vector<int64_t>(n, a->ints[0]);
  }
  if (a->kind != OpArg::Kind::kIntList) return std::nullopt;
  if (a->ints.size() == n) return a->ints;
  if (a->ints.size() == 1) return std::vector<int64_t>(n, a->ints[0]);
  return std::nullopt;
}

const std::unordered_map<std::string_view, OpKind>& op_table() {
  static const auto* table = new std::unordered_map<std::string_view, OpKind>{
      {"aten::mm", OpKind::kMatmul},
      {"aten::addmm", OpKind::kMatmul},
      {"aten::_addmm_activation", OpKind::kMatmul},
      {"aten::bmm", OpKind::kMatmul},
      {"aten::baddbmm", OpKind::kMatmul},
      {"aten::addbmm", OpKind::kMatmul},
      {"aten::_scaled_mm", OpKind::kMatmul},
      {"aten::convolution", OpKind::kConvolution},
      {"aten::_convolution", OpKind::kConvolution},
      {"aten::cudnn_convolution", OpKind::kConvolution},
      {"aten::cudnn_convolution_transpose", OpKind::kConvolution},
      {"aten::mkldnn_convolution", OpKind::kConvolution},
      {"aten::_slow_conv2d_forward", OpKind::kConvolution},
      {"aten::convolution_backward", OpKind::kConvolutionBackward},
      {"aten::_scaled_dot_product_flash_attention", OpKind::kAttention},
      {"aten::_scaled_dot_product_efficient_attention", OpKind::kAttention},
      {"aten::_scaled_dot_product_cudnn_attention", OpKind::kAttention},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", OpKind::kAttention},
      {"aten::_scaled_dot_product_fused_attention_overrideable", OpKind::kAttention},
      {"aten::_scaled_dot_product_flash_attention_backward", OpKind::kAttentionBackward},
      {"aten::_scaled_dot_product_efficient_attention_backward", OpKind::kAttentionBackward},
      {"aten::_scaled_dot_product_cudnn_attention_backward", OpKind::kAttentionBackward},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", OpKind::kAttentionBackward},
      {"aten::_scaled_dot_product_fused_attention_overrideable_backward",
       OpKind::kAttentionBackward},
      {"aten::softmax", OpKind::kSoftmax},
      {"aten::_softmax", OpKind::kSoftmax},
      {"aten::_safe_softmax", OpKind::kSoftmax},
      {"aten::_softmax_backward_data", OpKind::kSoftmaxBackward},
      {"aten::scaled_dot_product_attention", OpKind::kAttentionComposite},
      {"aten::_scaled_dot_product_attention", OpKind::kAttentionComposite},  // 1.13
      {"aten::_scaled_dot_product_attention_math", OpKind::kAttentionComposite},
  };
  return *table;
}

// Operand positions of a matmul op: (a, b), and whether the batch dimension is summed.
struct MatmulLayout {
  size_t a, b;
  bool batched;
  bool reduce_batch;
};

std::optional<MatmulLayout> matmul_layout(std::string_view op) {
  if (op == "aten::mm" || op == "aten::_scaled_mm") return MatmulLayout{0, 1, false, false};
  if (op == "aten::addmm" || op == "aten::_addmm_activation") {
    return MatmulLayout{1, 2, false, false};
  }
  if (op == "aten::bmm") return MatmulLayout{0, 1, true, false};
  if (op == "aten::baddbmm") return MatmulLayout{1, 2, true, false};
  if (op == "aten::addbmm") return MatmulLayout{1, 2, true, true};
  return std::nullopt;
}

// Convolution argument positions (input, weight, stride, padding, dilation, transposed);
// npos = not in the schema (defaults: stride 1, padding 0, dilation 1, not transposed).
constexpr size_t npos = static_cast<size_t>(-1);
struct ConvLayout {
  size_t stride, padding, dilation, transposed;
  bool always_transposed;
};

std::optional<ConvLayout> conv_layout(std::string_view op) {
  // convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
  // groups); _convolution adds benchmark, deterministic, cudnn_enabled[, allow_tf32].
  if (op == "aten::convolution" || op == "aten::_convolution") return ConvLayout{3, 4, 5, 6, false};
  // cudnn_convolution(self, weight, padding, stride, dilation, groups, benchmark, ...)
  if (op == "aten::cudnn_convolution") return ConvLayout{3, 2, 4, npos, false};
  // cudnn_convolution_transpose(self, weight, padding, output_padding, stride, dilation, ...)
  if (op == "aten::cudnn_convolution_transpose") return ConvLayout{4, 2, 5, npos, true};
  // mkldnn_convolution(self, weight, bias, padding, stride, dilation, groups)
  if (op == "aten::mkldnn_convolution") return ConvLayout{4, 3, 5, npos, false};
  // _slow_conv2d_forward(self, weight, kernel_size, bias, stride, padding)
  if (op == "aten::_slow_conv2d_forward") return ConvLayout{4, 5, npos, npos, false};
  return std::nullopt;
}

double conv_op_flops(std::string_view op, const OpArgs& args) {
  const auto layout = conv_layout(op);
  const Shape* x = tensor_at(args, 0);
  const Shape* w = tensor_at(args, 1);
  if (!layout || x == nullptr || w == nullptr || x->size() != w->size() || x->size() < 3) {
    return kNaN;
  }
  bool transposed = layout->always_transposed;
  if (layout->transposed != npos) {
    const auto t = bool_at(args, layout->transposed);
    if (!t) return kNaN;
    transposed = *t;
  }
  if (transposed) return conv_flops(*x, *w, {}, true);
  const size_t n = x->size() - 2;
  const auto stride =
      layout->stride == npos ? std::vector<int64_t>(n, 1) : ints_at(args, layout->stride, n);
  const auto padding =
      layout->padding == npos ? std::vector<int64_t>(n, 0) : ints_at(args, layout->padding, n);
  const auto dilation =
      layout->dilation == npos ? std::vector<int64_t>(n, 1) : ints_at(args, layout->dilation, n);
  if (!stride || !padding || !dilation) return kNaN;
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] =
        conv_output_size((*x)[i + 2], (*w)[i + 2], (*stride)[i], (*padding)[i], (*dilation)[i]);
    if (out[i] < 0) return kNaN;
  }
  return conv_flops(*x, *w, out, false);
}

double conv_backward_op_flops(const OpArgs& args) {
  // convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
  // transposed, output_padding, groups, output_mask)
  const Shape* go = tensor_at(args, 0);
  const Shape* x = tensor_at(args, 1);
  const Shape* w = tensor_at(args, 2);
  const auto transposed = bool_at(args, 7);
  const OpArg* mask = arg(args, 10);
  if (go == nullptr || x == nullptr || w == nullptr || !transposed || mask == nullptr ||
      mask->kind != OpArg::Kind::kBoolList || mask->ints.size() < 2) {
    return kNaN;
  }
  return conv_backward_flops(*go, *x, *w, *transposed, mask->ints[0] != 0, mask->ints[1] != 0);
}

}  // namespace

// ---- OpArg --------------------------------------------------------------------------------------

OpArg OpArg::tensor(Shape sizes, std::string_view dtype, bool cuda) {
  OpArg a;
  a.kind = Kind::kTensor;
  a.ints = std::move(sizes);
  a.dtype = dtype;
  a.cuda = cuda;
  return a;
}
OpArg OpArg::integer(int64_t value) {
  OpArg a;
  a.kind = Kind::kInt;
  a.ints = {value};
  return a;
}
OpArg OpArg::int_list(std::vector<int64_t> values) {
  OpArg a;
  a.kind = Kind::kIntList;
  a.ints = std::move(values);
  return a;
}
OpArg OpArg::boolean(bool value) {
  OpArg a;
  a.kind = Kind::kBool;
  a.ints = {value ? 1 : 0};
  return a;
}
OpArg OpArg::bool_list(const std::vector<bool>& values) {
  OpArg a;
  a.kind = Kind::kBoolList;
  for (bool v : values) a.ints.push_back(v ? 1 : 0);
  return a;
}
OpArg OpArg::real_number(double value) {
  OpArg a;
  a.kind = Kind::kDouble;
  a.real = value;
  return a;
}
OpArg OpArg::none() {
  OpArg a;
  a.kind = Kind::kNone;
  return a;
}

// ---- formulas -----------------------------------------------------------------------------------

OpKind op_kind(std::string_view op) {
  const auto& t = op_table();
  const auto it = t.find(op);
  return it == t.end() ? OpKind::kUntracked : it->second;
}

double mm_flops(const Shape& a, const Shape& b) {
  if (a.size() != 2 || b.size() != 2 || a[1] != b[0]) return kNaN;
  return 2.0 * shape_product(a, 0, 2) * static_cast<double>(b[1]);
}

double bmm_flops(const Shape& a, const Shape& b) {
  if (a.size() != 3 || b.size() != 3 || a[0] != b[0] || a[2] != b[1]) return kNaN;
  return 2.0 * shape_product(a, 0, 3) * static_cast<double>(b[2]);
}

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                         int64_t dilation) {
  if (stride <= 0 || dilation <= 0 || kernel < 0) return -1;
  const int64_t span = in + 2 * padding - dilation * (kernel - 1) - 1;
  if (span < 0) return 0;
  return span / stride + 1;
}

double conv_flops(const Shape& x, const Shape& w, const Shape& out_spatial, bool transposed) {
  if (x.size() < 3 || w.size() != x.size()) return kNaN;
  const size_t n = x.size() - 2;
  double spatial;
  if (transposed) {
    spatial = shape_product(x, 2, x.size());
  } else {
    if (out_spatial.size() != n) return kNaN;
    spatial = shape_numel(out_spatial);
  }
  return 2.0 * static_cast<double>(x[0]) * spatial * shape_product(w, 2, w.size()) *
         static_cast<double>(w[0]) * static_cast<double>(w[1]);
}

double conv_backward_flops(const Shape& grad_out, const Shape& x, const Shape& w, bool transposed,
                           bool grad_input, bool grad_weight) {
  if (grad_out.size() != x.size() || x.size() < 3) return kNaN;
  // The forward convolution's cost: its output is grad_out (or, transposed, its input is x).
  const Shape out(grad_out.begin() + 2, grad_out.end());
  const double forward = conv_flops(x, w, out, transposed);
  return (grad_input ? forward : 0.0) + (grad_weight ? forward : 0.0);
}

double sdpa_flops(const Shape& q, const Shape& k, const Shape& v) {
  if (q.size() < 3 || k.size() != q.size() || v.size() != q.size()) return kNaN;
  const size_t r = q.size();
  if (k[r - 1] != q[r - 1] || v[r - 2] != k[r - 2]) return kNaN;
  const double bh = shape_product(q, 0, r - 2);
  const double lq = static_cast<double>(q[r - 2]), lk = static_cast<double>(k[r - 2]);
  const double d = static_cast<double>(q[r - 1]), dv = static_cast<double>(v[r - 1]);
  return 2.0 * bh * lq * lk * d + 2.0 * bh * lq * lk * dv;
}

double sdpa_backward_flops(const Shape& grad_out, const Shape& q, const Shape& k, const Shape& v) {
  if (q.size() < 3 || k.size() != q.size() || v.size() != q.size() || grad_out.size() != q.size()) {
    return kNaN;
  }
  const size_t r = q.size();
  if (k[r - 1] != q[r - 1] || v[r - 2] != k[r - 2]) return kNaN;
  const double bh = shape_product(q, 0, r - 2);
  const double lq = static_cast<double>(q[r - 2]), lk = static_cast<double>(k[r - 2]);
  const double d = static_cast<double>(q[r - 1]), dv = static_cast<double>(v[r - 1]);
  // dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q (the recomputed QK^T is counted apart).
  return 2.0 * bh * lq * lk * (2.0 * d + 2.0 * dv);
}

double sdpa_backward_recompute_flops(const Shape& q, const Shape& k) {
  if (q.size() < 3 || k.size() != q.size()) return kNaN;
  const size_t r = q.size();
  if (k[r - 1] != q[r - 1]) return kNaN;
  return 2.0 * shape_product(q, 0, r - 2) * static_cast<double>(q[r - 2]) *
         static_cast<double>(k[r - 2]) * static_cast<double>(q[r - 1]);
}

std::optional<MatmulShapes> matmul_shapes(std::string_view op, const OpArgs& args) {
  const auto layout = matmul_layout(op);
  if (!layout) return std::nullopt;
  const Shape* a = tensor_at(args, layout->a);
  const Shape* b = tensor_at(args, layout->b);
  if (a == nullptr || b == nullptr) return std::nullopt;
  MatmulShapes m{*a, *b, {}};
  if (layout->batched) {
    if (a->size() != 3 || b->size() != 3) return std::nullopt;
    m.out = layout->reduce_batch ? Shape{(*a)[1], (*b)[2]} : Shape{(*a)[0], (*a)[1], (*b)[2]};
  } else {
    if (a->size() != 2 || b->size() != 2) return std::nullopt;
    m.out = {(*a)[0], (*b)[1]};
  }
  return m;
}

std::optional<Shape> softmax_shape(std::string_view op, const OpArgs& args) {
  size_t dim_at;
  if (op == "aten::softmax" || op == "aten::_softmax" || op == "aten::_safe_softmax") {
    dim_at = 1;  // (self, dim, ...)
  } else if (op == "aten::_softmax_backward_data") {
    dim_at = 2;  // (grad_output, output, dim, input_dtype)
  } else {
    return std::nullopt;
  }
  const Shape* s = tensor_at(args, 0);
  const auto dim = int_at(args, dim_at);
  if (s == nullptr || !dim || s->empty()) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(s->size());
  if (*dim != -1 && *dim != rank - 1) return std::nullopt;
  return *s;
}

double op_recompute_flops(std::string_view op, const OpArgs& args) {
  if (op_kind(op) != OpKind::kAttentionBackward) return 0;
  const Shape *q = tensor_at(args, 1), *k = tensor_at(args, 2);
  if (q == nullptr || k == nullptr) return 0;
  const double f = sdpa_backward_recompute_flops(*q, *k);
  return f >= 0 ? f : 0;
}

double op_flops(std::string_view op, const OpArgs& args) {
  switch (op_kind(op)) {
    case OpKind::kMatmul: {
      const auto layout = matmul_layout(op);
      const Shape* a = tensor_at(args, layout->a);
      const Shape* b = tensor_at(args, layout->b);
      if (a == nullptr || b == nullptr) return kNaN;
      return layout->batched ? bmm_flops(*a, *b) : mm_flops(*a, *b);
    }
    case OpKind::kConvolution:
      return conv_op_flops(op, args);
    case OpKind::kConvolutionBackward:
      return conv_backward_op_flops(args);
    case OpKind::kAttention: {
      const Shape *q = tensor_at(args, 0), *k = tensor_at(args, 1), *v = tensor_at(args, 2);
      if (q == nullptr || k == nullptr || v == nullptr) return kNaN;
      return sdpa_flops(*q, *k, *v);
    }
    case OpKind::kAttentionBackward: {
      const Shape *go = tensor_at(args, 0), *q = tensor_at(args, 1), *k = tensor_at(args, 2),
                  *v = tensor_at(args, 3);
      if (go == nullptr || q == nullptr || k == nullptr || v == nullptr) return kNaN;
      return sdpa_backward_flops(*go, *q, *k, *v);
    }
    default:
      return 0;
  }
}

// ---- precision ----------------------------------------------------------------------------------

MathPrecision precision_of(std::string_view dtype, bool tf32_allowed) {
  if (dtype == "Float") return tf32_allowed ? MathPrecision::kTf32 : MathPrecision::kFp32;
  if (dtype == "BFloat16") return MathPrecision::kBf16;
  if (dtype == "Half") return MathPrecision::kFp16;
  if (dtype == "Double") return MathPrecision::kFp64;
  if (dtype.substr(0, 6) == "Float8") return MathPrecision::kFp8;
  return MathPrecision::kOther;
}

int64_t dtype_bytes(std::string_view dtype) {
  if (dtype == "Double" || dtype == "Long" || dtype == "ComplexFloat") return 8;
  if (dtype == "Half" || dtype == "BFloat16" || dtype == "Short") return 2;
  if (dtype.substr(0, 6) == "Float8" || dtype == "Byte" || dtype == "Char" || dtype == "Bool") {
    return 1;
  }
  return 4;
}

MathPrecision op_precision(std::string_view op, const OpArgs& args, const MathFlags& flags) {
  const OpKind kind = op_kind(op);
  size_t at = 0;
  if (kind == OpKind::kMatmul) {
    at = matmul_layout(op)->a;
  } else if (kind == OpKind::kAttentionBackward) {
    at = 1;  // query
  }
  const OpArg* a = arg(args, at);
  if (a == nullptr || a->kind != OpArg::Kind::kTensor) {
    // The first tensor argument, whatever it is.
    a = nullptr;
    for (const OpArg& x : args) {
      if (x.kind == OpArg::Kind::kTensor) {
        a = &x;
        break;
      }
    }
    if (a == nullptr) return MathPrecision::kOther;
  }
  bool tf32 = false;
  if (a->cuda) {
    if (kind == OpKind::kMatmul) tf32 = flags.tf32_matmul;
    if (kind == OpKind::kConvolution || kind == OpKind::kConvolutionBackward) {
      tf32 = flags.tf32_conv;
    }
  }
  return precision_of(a->dtype, tf32);
}

double shape_product(const Shape& s, size_t from, size_t to) {
  double p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) {
    if (s[i] < 0) return kNotMeasured;
    p *= static_cast<double>(s[i]);
  }
  return p;
}

double shape_numel(const Shape& s) { return shape_product(s, 0, s.size()); }

}  // namespace torchpilot
