// FLOP formulas, precision, device peaks, MFU and the FLOP accumulators (flops.h).
#include "torchpilot/runtime/flops.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <unordered_map>

namespace torchpilot {

namespace {

constexpr double kNaN = kNotMeasured;
constexpr size_t kP = static_cast<size_t>(kMathPrecisions);

size_t idx(MathPrecision p) { return static_cast<size_t>(p); }

PrecisionArray nan_array() {
  PrecisionArray a;
  a.fill(kNaN);
  return a;
}

// Product of dims [from, to) as double; NaN for a negative dim.
double prod(const Shape& s, size_t from, size_t to) {
  double p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) {
    if (s[i] < 0) return kNaN;
    p *= static_cast<double>(s[i]);
  }
  return p;
}

double numel(const Shape& s) { return prod(s, 0, s.size()); }

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

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
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
  return 2.0 * prod(a, 0, 2) * static_cast<double>(b[1]);
}

double bmm_flops(const Shape& a, const Shape& b) {
  if (a.size() != 3 || b.size() != 3 || a[0] != b[0] || a[2] != b[1]) return kNaN;
  return 2.0 * prod(a, 0, 3) * static_cast<double>(b[2]);
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
    spatial = prod(x, 2, x.size());
  } else {
    if (out_spatial.size() != n) return kNaN;
    spatial = numel(out_spatial);
  }
  return 2.0 * static_cast<double>(x[0]) * spatial * prod(w, 2, w.size()) *
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
  const double bh = prod(q, 0, r - 2);
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
  const double bh = prod(q, 0, r - 2);
  const double lq = static_cast<double>(q[r - 2]), lk = static_cast<double>(k[r - 2]);
  const double d = static_cast<double>(q[r - 1]), dv = static_cast<double>(v[r - 1]);
  // dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q (the recomputed QK^T is counted apart).
  return 2.0 * bh * lq * lk * (2.0 * d + 2.0 * dv);
}

double sdpa_backward_recompute_flops(const Shape& q, const Shape& k) {
  if (q.size() < 3 || k.size() != q.size()) return kNaN;
  const size_t r = q.size();
  if (k[r - 1] != q[r - 1]) return kNaN;
  return 2.0 * prod(q, 0, r - 2) * static_cast<double>(q[r - 2]) * static_cast<double>(k[r - 2]) *
         static_cast<double>(q[r - 1]);
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

// ---- peaks --------------------------------------------------------------------------------------

const std::vector<DeviceSpec>& device_table() {
  // Dense tensor-core figures are the datasheets' "with sparsity" figures halved. Order of the
  // columns: fp32 (CUDA cores), tf32, bf16, fp16, fp8, fp64 (tensor core), other (none).
  const double n = kNaN;
  static const auto* table = new std::vector<DeviceSpec>{
      {"NVIDIA GB200",
       {"gb200"},
       {80, 1250, 2500, 2500, 5000, 40, n},
       8000,
       "NVIDIA GB200 NVL72 datasheet, per GPU"},
      {"NVIDIA B200",
       {"b200"},
       {75, 1100, 2250, 2250, 4500, 37, n},
       7700,
       "NVIDIA HGX B200 datasheet, per GPU"},
      {"NVIDIA GH200",
       {"gh200"},
       {67, 494.5, 989.5, 989.5, 1979, 67, n},
       4000,
       "NVIDIA GH200 Grace Hopper datasheet (96 GB HBM3)"},
      {"NVIDIA H200 NVL",
       {"h200", "nvl"},
       {60, 417.5, 835.5, 835.5, 1670.5, 60, n},
       4800,
       "NVIDIA H200 datasheet, H200 NVL"},
      {"NVIDIA H200",
       {"h200"},
       {67, 494.5, 989.5, 989.5, 1979, 67, n},
       4800,
       "NVIDIA H200 datasheet, H200 SXM"},
      {"NVIDIA H100 PCIe",
       {"h100", "pcie"},
       {51, 378, 756.5, 756.5, 1513, 51, n},
       2000,
       "NVIDIA H100 datasheet, H100 PCIe"},
      {"NVIDIA H100 NVL",
       {"h100", "nvl"},
       {60, 417.5, 835.5, 835.5, 1670.5, 60, n},
       3900,
       "NVIDIA H100 datasheet, H100 NVL"},
      {"NVIDIA H100 SXM",
       {"h100"},
       {67, 494.5, 989.5, 989.5, 1979, 67, n},
       3350,
       "NVIDIA H100 datasheet, H100 SXM"},
      {"NVIDIA A100 PCIe 40GB",
       {"a100", "pcie", "40gb"},
       {19.5, 156, 312, 312, n, 19.5, n},
       1555,
       "NVIDIA A100 datasheet, A100 40GB PCIe"},
      {"NVIDIA A100 PCIe",
       {"a100", "pcie"},
       {19.5, 156, 312, 312, n, 19.5, n},
       1935,
       "NVIDIA A100 datasheet, A100 80GB PCIe"},
      {"NVIDIA A100 SXM 40GB",
       {"a100", "40gb"},
       {19.5, 156, 312, 312, n, 19.5, n},
       1555,
       "NVIDIA A100 datasheet, A100 40GB SXM"},
      {"NVIDIA A100 SXM",
       {"a100"},
       {19.5, 156, 312, 312, n, 19.5, n},
       2039,
       "NVIDIA A100 datasheet, A100 80GB SXM"},
      {"NVIDIA L40S",
       {"l40s"},
       {91.6, 183, 362.05, 362.05, 733, n, n},
       864,
       "NVIDIA L40S datasheet"},
      {"NVIDIA L40", {"l40"}, {90.5, 90.5, 181.05, 181.05, 362, n, n}, 864, "NVIDIA L40 datasheet"},
  };
  return *table;
}

const DeviceSpec* find_device(std::string_view device_name) {
  if (device_name.empty()) return nullptr;
  const std::string name = lower(device_name);
  for (const DeviceSpec& d : device_table()) {
    bool all = true;
    for (const std::string& m : d.match) {
      if (name.find(m) == std::string::npos) {
        all = false;
        break;
      }
    }
    if (all) return &d;
  }
  return nullptr;
}

DevicePeak::DevicePeak()
    : flops_per_s(nan_array()), datasheet_flops_per_s(nan_array()), dram_bytes_per_s(kNaN) {}

bool DevicePeak::any() const {
  return std::any_of(flops_per_s.begin(), flops_per_s.end(), [](double v) { return v > 0; });
}

DevicePeak resolve_peak(std::string_view device_name, double config_peak_tflops) {
  DevicePeak p;
  p.device = std::string(device_name);
  if (const DeviceSpec* d = find_device(device_name)) {
    for (size_t i = 0; i < kP; ++i) p.datasheet_flops_per_s[i] = d->tflops[i] * 1e12;
    p.flops_per_s = p.datasheet_flops_per_s;
    p.dram_bytes_per_s = d->dram_gb_per_s * 1e9;
    p.source = "table: " + d->name;
  }
  if (config_peak_tflops > 0) {
    p.flops_per_s.fill(config_peak_tflops * 1e12);
    p.source = "config";
  }
  return p;
}

// ---- MFU ----------------------------------------------------------------------------------------

MathPrecision dominant_precision(const PrecisionArray& flops) {
  MathPrecision best = MathPrecision::kOther;
  double most = 0;
  for (size_t i = 0; i < kP; ++i) {
    if (i == idx(MathPrecision::kOther)) continue;
    if (flops[i] > most) {
      most = flops[i];
      best = static_cast<MathPrecision>(i);
    }
  }
  return best;
}

double time_at_peak(const PrecisionArray& flops, const DevicePeak& peak) {
  const double dominant_peak = peak.flops_per_s[idx(dominant_precision(flops))];
  double seconds = 0;
  for (size_t i = 0; i < kP; ++i) {
    if (!(flops[i] > 0)) continue;
    double p = peak.flops_per_s[i];
    if (!(p > 0)) p = dominant_peak;
    if (!(p > 0)) return kNaN;
    seconds += flops[i] / p;
  }
  return seconds;
}

double utilization(const PrecisionArray& flops, const DevicePeak& peak, double seconds) {
  if (!(seconds > 0) || !peak.any()) return kNaN;
  const double t = time_at_peak(flops, peak);
  return std::isnan(t) ? kNaN : t / seconds;
}

// ---- attention detector
// ---------------------------------------------------------------------------

bool AttentionDetector::matches(const Shape& s, const Pending& p) const {
  if (s.size() < 2 || numel(s) != static_cast<double>(p.numel)) return false;
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
  const double n = numel(matrix);
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

// ---- tallies ------------------------------------------------------------------------------------

void FlopTally::add(std::string_view op, OpKind kind, MathPrecision precision, double flops,
                    bool recompute, std::string_view module) {
  if (!(flops >= 0)) return;
  hardware_[idx(precision)] += flops;
  if (recompute) return;
  model_[idx(precision)] += flops;
  auto m = modules_.find(module);
  if (m == modules_.end()) m = modules_.emplace(std::string(module), Sum{}).first;
  m->second.model += flops;
  m->second.calls += 1;
  Sum& s = ops_[{std::string(op), precision}];
  s.model += flops;
  s.calls += 1;
  if (kind == OpKind::kAttention || kind == OpKind::kAttentionBackward) fused_ += flops;
}

void FlopTally::add_attention(const AttentionDelta& d) {
  attention_.unfused_flops += d.unfused_flops;
  attention_.instances += d.instances;
  attention_.math_fallback += d.math_fallback;
  attention_.traffic_bytes += d.traffic_bytes;
}

void FlopTally::clear() { *this = FlopTally(); }

StepFlops FlopTally::per_step(int64_t steps) const {
  StepFlops s;
  const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
  for (size_t i = 0; i < kP; ++i) {
    s.model_by_precision[i] = model_[i] / n;
    s.hardware_by_precision[i] = hardware_[i] / n;
    s.model_flops += s.model_by_precision[i];
    s.hardware_flops += s.hardware_by_precision[i];
  }
  for (const auto& [key, sum] : ops_) {
    s.ops.push_back({key.first, key.second, sum.model / n, sum.calls / n});
  }
  for (const auto& [name, sum] : modules_) {
    s.modules.push_back({name, MathPrecision::kOther, sum.model / n, sum.calls / n});
  }
  std::stable_sort(s.modules.begin(), s.modules.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  std::stable_sort(s.ops.begin(), s.ops.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  s.unfused_attention_flops = attention_.unfused_flops / n;
  s.unfused_attention = attention_.instances / n;
  s.sdpa_math_fallback = attention_.math_fallback / n;
  s.unfused_attention_traffic_bytes = attention_.traffic_bytes / n;
  s.fused_attention_flops = fused_ / n;
  s.unparsed_calls = static_cast<int64_t>(std::ceil(static_cast<double>(unparsed_) / n));
  return s;
}

void StepFlopsSum::add(const StepFlops& s) {
  ++steps_;
  sum_.model_flops += s.model_flops;
  sum_.hardware_flops += s.hardware_flops;
  for (size_t i = 0; i < kP; ++i) {
    sum_.model_by_precision[i] += s.model_by_precision[i];
    sum_.hardware_by_precision[i] += s.hardware_by_precision[i];
  }
  sum_.unfused_attention_flops += s.unfused_attention_flops;
  sum_.unfused_attention += s.unfused_attention;
  sum_.sdpa_math_fallback += s.sdpa_math_fallback;
  sum_.unfused_attention_traffic_bytes += s.unfused_attention_traffic_bytes;
  sum_.fused_attention_flops += s.fused_attention_flops;
  sum_.unparsed_calls += s.unparsed_calls;
  for (const OpFlops& o : s.ops) {
    OpFlops& t = ops_[{o.op, o.precision}];
    t.op = o.op;
    t.precision = o.precision;
    t.flops_per_step += o.flops_per_step;
    t.calls_per_step += o.calls_per_step;
  }
  for (const OpFlops& o : s.modules) {
    OpFlops& t = modules_[o.op];
    t.op = o.op;
    t.flops_per_step += o.flops_per_step;
    t.calls_per_step += o.calls_per_step;
  }
}

StepFlops StepFlopsSum::mean() const {
  StepFlops m;
  if (steps_ == 0) return m;
  const double n = static_cast<double>(steps_);
  m.model_flops = sum_.model_flops / n;
  m.hardware_flops = sum_.hardware_flops / n;
  for (size_t i = 0; i < kP; ++i) {
    m.model_by_precision[i] = sum_.model_by_precision[i] / n;
    m.hardware_by_precision[i] = sum_.hardware_by_precision[i] / n;
  }
  m.unfused_attention_flops = sum_.unfused_attention_flops / n;
  m.unfused_attention = sum_.unfused_attention / n;
  m.sdpa_math_fallback = sum_.sdpa_math_fallback / n;
  m.unfused_attention_traffic_bytes = sum_.unfused_attention_traffic_bytes / n;
  m.fused_attention_flops = sum_.fused_attention_flops / n;
  m.unparsed_calls = static_cast<int64_t>(std::ceil(static_cast<double>(sum_.unparsed_calls) / n));
  for (const auto& [key, o] : ops_) {
    m.ops.push_back({o.op, o.precision, o.flops_per_step / n, o.calls_per_step / n});
  }
  std::stable_sort(m.ops.begin(), m.ops.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  for (const auto& [name, o] : modules_) {
    m.modules.push_back({o.op, MathPrecision::kOther, o.flops_per_step / n, o.calls_per_step / n});
  }
  std::stable_sort(m.modules.begin(), m.modules.end(), [](const OpFlops& a, const OpFlops& b) {
    return a.flops_per_step > b.flops_per_step;
  });
  return m;
}

// ---- window planner -----------------------------------------------------------------------------

FlopWindowPlanner::FlopWindowPlanner(const FlopConfig& config)
    : config_(config), state_(config.skip_steps > 0 ? State::kSkipping : State::kCounting) {
  if (config_.count_steps < 1) config_.count_steps = 1;
}

bool FlopWindowPlanner::begin_step() {
  step_counted_ = state_ == State::kCounting;
  return step_counted_;
}

const StepFlops* FlopWindowPlanner::count_for(int64_t samples) const {
  for (const auto& [s, count] : cache_) {
    if (s == samples) return &count;
  }
  return nullptr;
}

void FlopWindowPlanner::store(int64_t samples, StepFlops count) {
  cache_.erase(std::remove_if(cache_.begin(), cache_.end(),
                              [&](const auto& e) { return e.first == samples; }),
               cache_.end());
  cache_.insert(cache_.begin(), {samples, std::move(count)});
  if (cache_.size() > kMaxCached) cache_.resize(kMaxCached);
}

const StepFlops* FlopWindowPlanner::end_step(int64_t samples, const StepFlops* counted) {
  ++steps_;
  ++since_window_;
  const bool was_counted = step_counted_ && counted != nullptr;
  step_counted_ = false;
  if (was_counted && state_ == State::kCounting) {
    last_counted_ = *counted;
    // A window opened for a new sample count that meets an already counted one: nothing to do.
    if (window_target_ && samples != *window_target_ && window_.steps() == 0 &&
        count_for(samples) != nullptr) {
      window_target_.reset();
      state_ = State::kIdle;
      return &last_counted_;
    }
    if (window_.steps() > 0 && samples != window_samples_) window_.clear();  // shapes changed
    if (window_.steps() == 0) window_samples_ = samples;
    window_.add(*counted);
    if (window_.steps() >= config_.count_steps) {
      store(window_samples_, window_.mean());
      window_.clear();
      window_target_.reset();
      ++windows_;
      since_window_ = 0;
      state_ = State::kIdle;
    }
    return &last_counted_;
  }
  if (state_ == State::kSkipping) {
    if (steps_ >= config_.skip_steps) state_ = State::kCounting;
    return count_for(samples);
  }
  const StepFlops* known = count_for(samples);
  if (state_ == State::kIdle) {
    if (known == nullptr) {
      state_ = State::kCounting;  // a sample count without a count: count the next step
      window_target_ = samples;
    } else if (config_.recount_every_steps > 0 && since_window_ >= config_.recount_every_steps) {
      state_ = State::kCounting;
    }
  }
  return known;
}

void FlopWindowPlanner::recount() {
  cache_.clear();
  window_.clear();
  window_target_.reset();
  state_ = State::kCounting;
}

// ---- epoch accumulator
// ----------------------------------------------------------------------------

void FlopEpochAccumulator::add_step(const StepFlops* count, double step_seconds, bool counted) {
  if (counted) ++counted_steps_;
  if (count == nullptr) return;
  known_.add(*count);
  known_seconds_ += step_seconds;
  PrecisionArray& model = counted ? window_model_ : steady_model_;
  PrecisionArray& hardware = counted ? window_hardware_ : steady_hardware_;
  for (size_t i = 0; i < kP; ++i) {
    model[i] += count->model_by_precision[i];
    hardware[i] += count->hardware_by_precision[i];
  }
  if (counted) {
    window_seconds_ += step_seconds;
  } else {
    steady_seconds_ += step_seconds;
    ++steady_steps_;
  }
}

FlopEpochStats FlopEpochAccumulator::summarize(const DevicePeak& peak) const {
  FlopEpochStats f;
  f.device = peak.device;
  f.counted_steps = counted_steps_;
  f.steps_with_count = known_.steps();
  const StepFlops m = known_.mean();
  f.model_flops_per_step = m.model_flops;
  f.hardware_flops_per_step = m.hardware_flops;
  for (size_t i = 0; i < kP; ++i) {
    f.model_flops_by_precision[i] = m.model_by_precision[i];
    f.hardware_flops_by_precision[i] = m.hardware_by_precision[i];
    f.peak_flops_by_precision[i] = peak.flops_per_s[i];
    f.datasheet_flops_by_precision[i] = peak.datasheet_flops_per_s[i];
  }
  f.dram_bytes_per_s = peak.dram_bytes_per_s;
  f.achieved_flops_per_s =
      known_seconds_ > 0 ? m.model_flops * static_cast<double>(known_.steps()) / known_seconds_ : 0;
  // Counted steps carry the callbacks' cost: MFU comes from the other steps where there are any.
  if (steady_steps_ > 0) {
    f.mfu = utilization(steady_model_, peak, steady_seconds_);
    f.hfu = utilization(steady_hardware_, peak, steady_seconds_);
  } else if (known_.steps() > 0) {
    f.mfu = utilization(window_model_, peak, window_seconds_);
    f.hfu = utilization(window_hardware_, peak, window_seconds_);
  }
  f.dominant_precision = dominant_precision(m.model_by_precision);
  f.peak_flops_per_s = peak.flops_per_s[idx(f.dominant_precision)];
  if (!(f.peak_flops_per_s > 0)) f.peak_flops_per_s = kNotMeasured;
  if (peak.source == "config") {
    f.peak_source = "config";
  } else if (!peak.source.empty() && f.peak_flops_per_s > 0) {
    f.peak_source = peak.source + " " + to_string(f.dominant_precision) + " dense";
  }
  f.unfused_attention_flops_per_step = m.unfused_attention_flops;
  f.unfused_attention_per_step = std::llround(m.unfused_attention);
  f.sdpa_math_fallback_per_step = m.sdpa_math_fallback;
  f.unfused_attention_traffic_bytes_per_step = m.unfused_attention_traffic_bytes;
  f.fused_attention_flops_per_step = m.fused_attention_flops;
  f.unparsed_calls = m.unparsed_calls;
  f.top_ops.assign(m.ops.begin(),
                   m.ops.begin() + static_cast<std::ptrdiff_t>(std::min(m.ops.size(), kTopOps)));
  // Module attribution only where the model named modules (not just the unnamed rest).
  if (!(m.modules.size() == 1 && m.modules.front().op.empty())) {
    f.modules.assign(m.modules.begin(), m.modules.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                                m.modules.size(), kTopModules)));
  }
  return f;
}

void fill_step_flops(StepRecord& record, const StepFlops* count, const DevicePeak& peak) {
  StepMetrics& m = record.metrics;
  if (count == nullptr) {
    for (const char* name : {"model_flops", "hardware_flops", "mfu", "hfu"}) {
      m.set("flops", name, kNotMeasured);
    }
    return;
  }
  const double seconds = static_cast<double>(record.step_ns()) / 1e9;
  m.set("flops", "model_flops", count->model_flops);
  m.set("flops", "hardware_flops", count->hardware_flops);
  m.set("flops", "mfu", utilization(count->model_by_precision, peak, seconds));
  m.set("flops", "hfu", utilization(count->hardware_by_precision, peak, seconds));
}

void flop_log(spdlog::logger& logger, FlopLogLevel level, const std::string& message) {
  switch (level) {
    case FlopLogLevel::kDebug:
      logger.debug("{}", message);
      break;
    case FlopLogLevel::kInfo:
      logger.info("{}", message);
      break;
    case FlopLogLevel::kWarn:
      logger.warn("{}", message);
      break;
    case FlopLogLevel::kError:
      logger.error("{}", message);
      break;
  }
}

}  // namespace torchpilot
