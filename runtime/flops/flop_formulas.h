// FLOP formulas without LibTorch (docs/metrics.md, "MFU and FLOPs"): which ops count (OpKind),
// the FLOPs of one call from the op's name and arguments, and the arithmetic precision it ran in.
// hooks/flop_counter converts each op's c10::IValue arguments into OpArgs for these calls.
// Internal: used by hooks/flops/flop_counter.cpp and the tests; not part of the user API.
//
// Conventions follow torch/utils/flop_counter.py: a multiply-add is 2 FLOPs; only matmuls,
// convolutions and attention are counted (elementwise ops, norms and softmax are not); bias
// additions are not counted; causal attention is counted in full.
//
// Thread-safety: plain values and pure functions; safe from any thread.
// Failure behaviour: nothing here throws on bad input; a formula whose arguments do not fit the
// op's schema returns NaN.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "torchpilot/runtime/flops/flop_records.h"

namespace torchpilot {

using Shape = std::vector<int64_t>;
// Product of a shape's dims [from, to) as a double (NaN for a negative dim), and of all of them.
double shape_product(const Shape& shape, size_t from, size_t to);
double shape_numel(const Shape& shape);

// ---- op arguments ----------------------------------------------------------------------------

// What the formulas see of one op argument (the hook converts each c10::IValue).
struct OpArg {
  enum class Kind : uint8_t { kNone, kTensor, kInt, kIntList, kBool, kBoolList, kDouble, kOther };
  Kind kind = Kind::kOther;
  std::vector<int64_t> ints;  // tensor: sizes; int: the value; int list; bool(s): 0/1
  double real = 0;            // kDouble
  std::string_view dtype;     // tensor: c10 ScalarType name ("Float", "BFloat16", ...); static
  bool cuda = false;          // tensor on a CUDA device

  static OpArg tensor(Shape sizes, std::string_view dtype = "Float", bool cuda = false);
  static OpArg integer(int64_t value);
  static OpArg int_list(std::vector<int64_t> values);
  static OpArg boolean(bool value);
  static OpArg bool_list(const std::vector<bool>& values);
  static OpArg real_number(double value);
  static OpArg none();
};
using OpArgs = std::vector<OpArg>;

// ---- which ops count ---------------------------------------------------------------------------

enum class OpKind : uint8_t {
  kUntracked,            // not looked at
  kMatmul,               // aten::mm, addmm, bmm, baddbmm, addbmm, _scaled_mm, _addmm_activation
  kConvolution,          // aten::convolution, _convolution, cudnn_convolution(_transpose),
                         // mkldnn_convolution, _slow_conv2d_forward
  kConvolutionBackward,  // aten::convolution_backward
  kAttention,  // fused SDPA forward: _scaled_dot_product_{flash,efficient,cudnn}_attention,
               // _scaled_dot_product_flash_attention_for_cpu, ..._fused_attention_overrideable
  kAttentionBackward,   // their _backward ops
  kSoftmax,             // aten::softmax, _softmax, _safe_softmax (no FLOPs; attention detector)
  kSoftmaxBackward,     // aten::_softmax_backward_data (no FLOPs; attention detector)
  kAttentionComposite,  // aten::scaled_dot_product_attention, _scaled_dot_product_attention_math:
                        // not counted (their inner ops are); marks "inside SDPA"
};
OpKind op_kind(std::string_view op);
// Ops with a FLOP formula (matmul, convolution, attention and their backward).
inline bool has_formula(OpKind k) {
  return k == OpKind::kMatmul || k == OpKind::kConvolution || k == OpKind::kConvolutionBackward ||
         k == OpKind::kAttention || k == OpKind::kAttentionBackward;
}
// Ops the counter follows with a frame (leaf rule): formula ops and softmax markers.
inline bool is_tracked(OpKind k) {
  return has_formula(k) || k == OpKind::kSoftmax || k == OpKind::kSoftmaxBackward;
}

// ---- formulas (NaN when the shapes do not fit) -------------------------------------------------

double mm_flops(const Shape& a, const Shape& b);   // [m,k] x [k,n]: 2mkn
double bmm_flops(const Shape& a, const Shape& b);  // [B,m,k] x [B,k,n]: 2Bmkn
// One spatial output size of a convolution: (in + 2p - d(k-1) - 1) / s + 1.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                         int64_t dilation);
// Convolution (x: [N, C_in, spatial...], w: [C_out, C_in/groups, k...] or, transposed,
// [C_in, C_out/groups, k...]): 2 x N x prod(out spatial) x prod(k) x w[0] x w[1]; transposed
// convolutions use the input's spatial size instead of the output's. out_spatial is ignored when
// transposed. Groups are in w's second dimension.
double conv_flops(const Shape& x, const Shape& w, const Shape& out_spatial, bool transposed);
// convolution_backward: grad input and grad weight each cost one forward convolution.
double conv_backward_flops(const Shape& grad_out, const Shape& x, const Shape& w, bool transposed,
                           bool grad_input, bool grad_weight);
// Scaled dot-product attention, q: [B,H,Lq,D], k: [B,Hk,Lk,D], v: [B,Hk,Lk,Dv]:
// QK^T + PV = 2BH·Lq·Lk·D + 2BH·Lq·Lk·Dv (= 4BH·Lq·Lk·D). Backward runs 5 such bmms: dP, dV,
// dQ, dK (2x forward: model FLOPs) plus QK^T recomputed by the fused kernels (hardware only, as
// MFU excludes recomputation).
double sdpa_flops(const Shape& q, const Shape& k, const Shape& v);
double sdpa_backward_flops(const Shape& grad_out, const Shape& q, const Shape& k, const Shape& v);
double sdpa_backward_recompute_flops(const Shape& q, const Shape& k);

// FLOPs of one call from the op name and its positional arguments (schemas of LibTorch 1.13 and
// 2.x); NaN when the arguments do not fit, 0 for ops without a formula.
double op_flops(std::string_view op, const OpArgs& args);
// FLOPs the op recomputes on top of op_flops (fused attention backward: QK^T); 0 for the rest.
double op_recompute_flops(std::string_view op, const OpArgs& args);

// A matmul's operands and result (for the attention detector).
struct MatmulShapes {
  Shape a, b, out;
};
std::optional<MatmulShapes> matmul_shapes(std::string_view op, const OpArgs& args);
// A softmax(-backward) over the last dimension: the shape of the matrix it normalizes.
std::optional<Shape> softmax_shape(std::string_view op, const OpArgs& args);

// ---- precision ----------------------------------------------------------------------------------

// From the c10 ScalarType name: "Float" -> fp32 (tf32 when allowed), "BFloat16", "Half",
// "Float8_*" -> fp8, "Double" -> fp64, anything else -> other.
MathPrecision precision_of(std::string_view dtype, bool tf32_allowed);
int64_t dtype_bytes(std::string_view dtype);  // element size; 4 when unknown
// TF32 for fp32 on CUDA tensors: matmuls follow cuBLAS's flag, convolutions cuDNN's.
struct MathFlags {
  bool tf32_matmul = false;  // at::globalContext().allowTF32CuBLAS()
  bool tf32_conv = false;    // at::globalContext().allowTF32CuDNN()
};
MathPrecision op_precision(std::string_view op, const OpArgs& args, const MathFlags& flags);

}  // namespace torchpilot
