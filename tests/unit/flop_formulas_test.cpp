// FLOP formulas against hand-computed values, which ops count, and precision
// (runtime/flops/flop_formulas.cpp).
#include "torchpilot/runtime/flops/flop_formulas.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchpilot {
namespace {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

OpArg T(Shape s, std::string_view dtype = "Float", bool cuda = false) {
  return OpArg::tensor(std::move(s), dtype, cuda);
}

// ---- formulas -----------------------------------------------------------------------------------

TEST(FlopFormulaTest, MatmulFamily) {
  // [4,8] x [8,16]: 4*16 outputs, each 8 multiply-adds = 2*4*8*16.
  EXPECT_DOUBLE_EQ(mm_flops({4, 8}, {8, 16}), 1024.0);
  EXPECT_TRUE(std::isnan(mm_flops({4, 8}, {7, 16}))) << "inner dims differ";
  EXPECT_TRUE(std::isnan(mm_flops({4, 8, 1}, {8, 16})));
  EXPECT_DOUBLE_EQ(op_flops("aten::mm", {T({4, 8}), T({8, 16})}), 1024.0);
  // addmm(bias, mat1, mat2, beta, alpha): the bias add is not counted.
  EXPECT_DOUBLE_EQ(op_flops("aten::addmm",
                            {T({16}), T({4, 8}), T({8, 16}), OpArg::integer(1), OpArg::integer(1)}),
                   1024.0);
  // [3,4,5] x [3,5,6] = 2*3*4*5*6.
  EXPECT_DOUBLE_EQ(bmm_flops({3, 4, 5}, {3, 5, 6}), 720.0);
  EXPECT_TRUE(std::isnan(bmm_flops({3, 4, 5}, {2, 5, 6}))) << "batch differs";
  EXPECT_DOUBLE_EQ(op_flops("aten::bmm", {T({3, 4, 5}), T({3, 5, 6})}), 720.0);
  EXPECT_DOUBLE_EQ(op_flops("aten::baddbmm", {T({3, 4, 6}), T({3, 4, 5}), T({3, 5, 6})}), 720.0);
  EXPECT_DOUBLE_EQ(op_flops("aten::addbmm", {T({4, 6}), T({3, 4, 5}), T({3, 5, 6})}), 720.0);
  EXPECT_DOUBLE_EQ(op_flops("aten::_scaled_mm", {T({4, 8}, "Float8_e4m3fn"),
                                                 T({8, 16}, "Float8_e4m3fn"), T({}), T({})}),
                   1024.0);
  // Wrong argument kinds: NaN (the counter reports the call as unparsed).
  EXPECT_TRUE(std::isnan(op_flops("aten::mm", {T({4, 8})})));
  EXPECT_TRUE(std::isnan(op_flops("aten::mm", {OpArg::integer(3), T({8, 16})})));
  // Ops without a formula: 0.
  EXPECT_EQ(op_flops("aten::add", {T({4, 8}), T({4, 8})}), 0.0);
  EXPECT_EQ(op_flops("aten::matmul", {T({4, 8}), T({8, 16})}), 0.0) << "not a leaf: mm counts";
  EXPECT_EQ(op_flops("aten::linear", {T({4, 8}), T({16, 8})}), 0.0) << "not a leaf: addmm counts";
}

TEST(FlopFormulaTest, ConvolutionOutputSize) {
  EXPECT_EQ(conv_output_size(32, 3, 1, 1, 1), 32);
  EXPECT_EQ(conv_output_size(32, 3, 2, 1, 1), 16);
  EXPECT_EQ(conv_output_size(32, 3, 1, 2, 2), 32);
  EXPECT_EQ(conv_output_size(7, 7, 1, 0, 1), 1);
  EXPECT_EQ(conv_output_size(224, 7, 2, 3, 1), 112);
  EXPECT_EQ(conv_output_size(2, 5, 1, 0, 1), 0);
  EXPECT_EQ(conv_output_size(8, 3, 0, 0, 1), -1) << "bad stride";
}

std::vector<OpArg> conv_args(Shape x, Shape w, std::vector<int64_t> stride,
                             std::vector<int64_t> padding, std::vector<int64_t> dilation,
                             bool transposed, int64_t groups) {
  return {T(std::move(x)),
          T(std::move(w)),
          OpArg::none(),
          OpArg::int_list(std::move(stride)),
          OpArg::int_list(std::move(padding)),
          OpArg::int_list(std::move(dilation)),
          OpArg::boolean(transposed),
          OpArg::int_list({0, 0}),
          OpArg::integer(groups)};
}

TEST(FlopFormulaTest, Convolution) {
  // x [2,3,32,32], w [16,3,3,3], stride 1, padding 1: output 32x32; each output element of each
  // of 16 channels takes 3*3*3 multiply-adds: 2 * 2 * 16 * 1024 * 27.
  const double c1 = 2.0 * 2 * 16 * 1024 * 27;
  EXPECT_DOUBLE_EQ(c1, 1769472.0);
  EXPECT_DOUBLE_EQ(conv_flops({2, 3, 32, 32}, {16, 3, 3, 3}, {32, 32}, false), c1);
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution", conv_args({2, 3, 32, 32}, {16, 3, 3, 3}, {1, 1},
                                                           {1, 1}, {1, 1}, false, 1)),
                   c1);
  // _convolution has four more arguments after groups; same positions before.
  std::vector<OpArg> args =
      conv_args({2, 3, 32, 32}, {16, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, false, 1);
  for (int i = 0; i < 4; ++i) args.push_back(OpArg::boolean(false));
  EXPECT_DOUBLE_EQ(op_flops("aten::_convolution", args), c1);
  // Stride 2: output 16x16, a quarter.
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution", conv_args({2, 3, 32, 32}, {16, 3, 3, 3}, {2, 2},
                                                           {1, 1}, {1, 1}, false, 1)),
                   c1 / 4);
  // One-element lists broadcast (1-d style), as the schema allows.
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution",
                            conv_args({2, 3, 32, 32}, {16, 3, 3, 3}, {2}, {1}, {1}, false, 1)),
                   c1 / 4);
  // Depthwise (groups 3, w [3,1,3,3]): 2 * 2 * 3 * 1024 * 9.
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution", conv_args({2, 3, 32, 32}, {3, 1, 3, 3}, {1, 1},
                                                           {1, 1}, {1, 1}, false, 3)),
                   2.0 * 2 * 3 * 1024 * 9);
  // Dilation 2, padding 2 keeps 32x32.
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution", conv_args({2, 3, 32, 32}, {16, 3, 3, 3}, {1, 1},
                                                           {2, 2}, {2, 2}, false, 1)),
                   c1);
  // Transposed: x [2,16,8,8], w [16 (C_in), 8 (C_out), 4, 4]: each input element scatters into
  // 8*16 outputs: 2 * 2 * 64 * 16 * 8 * 16.
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution", conv_args({2, 16, 8, 8}, {16, 8, 4, 4}, {2, 2},
                                                           {1, 1}, {1, 1}, true, 1)),
                   2.0 * 2 * 64 * 16 * 8 * 16);
  // 1-d and 3-d.
  EXPECT_DOUBLE_EQ(
      op_flops("aten::convolution", conv_args({4, 8, 100}, {16, 8, 5}, {1}, {2}, {1}, false, 1)),
      2.0 * 4 * 100 * 16 * 8 * 5);
  EXPECT_DOUBLE_EQ(
      op_flops("aten::convolution", conv_args({1, 2, 4, 4, 4}, {3, 2, 3, 3, 3}, {1, 1, 1},
                                              {0, 0, 0}, {1, 1, 1}, false, 1)),
      2.0 * 1 * 8 * 3 * 2 * 27);
  // The backend ops have their own argument orders.
  // cudnn_convolution(self, weight, padding, stride, dilation, groups, benchmark, ...)
  EXPECT_DOUBLE_EQ(op_flops("aten::cudnn_convolution",
                            {T({2, 3, 32, 32}), T({16, 3, 3, 3}), OpArg::int_list({1, 1}),
                             OpArg::int_list({2, 2}), OpArg::int_list({1, 1}), OpArg::integer(1),
                             OpArg::boolean(false), OpArg::boolean(false), OpArg::boolean(true)}),
                   c1 / 4);
  // mkldnn_convolution(self, weight, bias, padding, stride, dilation, groups)
  EXPECT_DOUBLE_EQ(op_flops("aten::mkldnn_convolution",
                            {T({2, 3, 32, 32}), T({16, 3, 3, 3}), T({16}), OpArg::int_list({1, 1}),
                             OpArg::int_list({2, 2}), OpArg::int_list({1, 1}), OpArg::integer(1)}),
                   c1 / 4);
  // _slow_conv2d_forward(self, weight, kernel_size, bias, stride, padding)
  EXPECT_DOUBLE_EQ(op_flops("aten::_slow_conv2d_forward",
                            {T({2, 3, 32, 32}), T({16, 3, 3, 3}), OpArg::int_list({3, 3}),
                             OpArg::none(), OpArg::int_list({2, 2}), OpArg::int_list({1, 1})}),
                   c1 / 4);
  // Unreadable arguments: NaN, not a guess.
  EXPECT_TRUE(std::isnan(op_flops("aten::convolution", {T({2, 3, 32, 32}), T({16, 3, 3, 3})})));
  std::vector<OpArg> bad =
      conv_args({2, 3, 32, 32}, {16, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, false, 1);
  bad[3] = OpArg::int_list({1, 1, 1});  // three strides for two spatial dims
  EXPECT_TRUE(std::isnan(op_flops("aten::convolution", bad)));
}

TEST(FlopFormulaTest, ConvolutionBackwardRespectsOutputMask) {
  const double forward = 2.0 * 2 * 16 * 1024 * 27;
  auto args = [](bool in, bool w, bool b) {
    return std::vector<OpArg>{
        T({2, 16, 32, 32}),      T({2, 3, 32, 32}),           T({16, 3, 3, 3}),
        OpArg::int_list({16}),   OpArg::int_list({1, 1}),     OpArg::int_list({1, 1}),
        OpArg::int_list({1, 1}), OpArg::boolean(false),       OpArg::int_list({0, 0}),
        OpArg::integer(1),       OpArg::bool_list({in, w, b})};
  };
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution_backward", args(true, true, true)), 2 * forward);
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution_backward", args(false, true, true)), forward)
      << "first layer: no grad input";
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution_backward", args(true, false, false)), forward);
  EXPECT_DOUBLE_EQ(op_flops("aten::convolution_backward", args(false, false, true)), 0.0)
      << "bias gradient is a reduction, not counted";
  // Strided: the forward's output is grad_output's spatial size (16x16).
  EXPECT_DOUBLE_EQ(
      conv_backward_flops({2, 16, 16, 16}, {2, 3, 32, 32}, {16, 3, 3, 3}, false, true, true),
      2 * forward / 4);
  // Transposed: the cost is the transposed forward's (input spatial).
  EXPECT_DOUBLE_EQ(
      conv_backward_flops({2, 8, 16, 16}, {2, 16, 8, 8}, {16, 8, 4, 4}, true, true, true),
      2 * (2.0 * 2 * 64 * 16 * 8 * 16));
}

TEST(FlopFormulaTest, ScaledDotProductAttention) {
  // q, k, v [B=2, H=4, L=128, D=64]: QK^T and PV are 2*B*H*L*L*D each: 4*B*H*L*L*D.
  const double f = 4.0 * 2 * 4 * 128 * 128 * 64;
  EXPECT_DOUBLE_EQ(sdpa_flops({2, 4, 128, 64}, {2, 4, 128, 64}, {2, 4, 128, 64}), f);
  // Backward: 4 bmms of the same size = 2x in model FLOPs, and QK^T recomputed (hardware only).
  EXPECT_DOUBLE_EQ(
      sdpa_backward_flops({2, 4, 128, 64}, {2, 4, 128, 64}, {2, 4, 128, 64}, {2, 4, 128, 64}),
      2.0 * f);
  EXPECT_DOUBLE_EQ(sdpa_backward_recompute_flops({2, 4, 128, 64}, {2, 4, 128, 64}), 0.5 * f);
  // Cross attention, Lq 32, Lk 128, Dv 16: 2*B*H*Lq*Lk*(D + Dv).
  EXPECT_DOUBLE_EQ(sdpa_flops({2, 4, 32, 64}, {2, 4, 128, 64}, {2, 4, 128, 16}),
                   2.0 * 8 * 32 * 128 * (64 + 16));
  // Grouped-query attention: the query's heads count.
  EXPECT_DOUBLE_EQ(sdpa_flops({2, 4, 128, 64}, {2, 1, 128, 64}, {2, 1, 128, 64}), f);
  EXPECT_TRUE(std::isnan(sdpa_flops({2, 4, 128, 64}, {2, 4, 128, 32}, {2, 4, 128, 64})));

  const OpArg q = T({2, 4, 128, 64}, "BFloat16", true);
  // _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, return_debug_mask, scale)
  // Causal attention is counted in full, as torch/utils/flop_counter.py does.
  for (bool causal : {false, true}) {
    EXPECT_DOUBLE_EQ(op_flops("aten::_scaled_dot_product_flash_attention",
                              {q, q, q, OpArg::real_number(0), OpArg::boolean(causal),
                               OpArg::boolean(false), OpArg::none()}),
                     f);
  }
  // _scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_log_sumexp, ...)
  EXPECT_DOUBLE_EQ(op_flops("aten::_scaled_dot_product_efficient_attention",
                            {q, q, q, OpArg::none(), OpArg::boolean(true)}),
                   f);
  EXPECT_DOUBLE_EQ(op_flops("aten::_scaled_dot_product_cudnn_attention", {q, q, q}), f);
  EXPECT_DOUBLE_EQ(op_flops("aten::_scaled_dot_product_flash_attention_for_cpu",
                            {T({2, 4, 128, 64}), T({2, 4, 128, 64}), T({2, 4, 128, 64})}),
                   f);
  // Backward ops: (grad_out, q, k, v, out, logsumexp, ...).
  for (const char* op : {"aten::_scaled_dot_product_flash_attention_backward",
                         "aten::_scaled_dot_product_efficient_attention_backward",
                         "aten::_scaled_dot_product_cudnn_attention_backward"}) {
    EXPECT_DOUBLE_EQ(op_flops(op, {q, q, q, q, q, T({2, 4, 128})}), 2.0 * f) << op;
    EXPECT_DOUBLE_EQ(op_recompute_flops(op, {q, q, q, q, q, T({2, 4, 128})}), 0.5 * f) << op;
  }
  EXPECT_EQ(op_recompute_flops("aten::mm", {T({4, 8}), T({8, 16})}), 0.0);
  // The composite scaled_dot_product_attention is not counted (its inner op is).
  EXPECT_EQ(op_flops("aten::scaled_dot_product_attention", {q, q, q}), 0.0);
}

TEST(FlopFormulaTest, OpKinds) {
  EXPECT_EQ(op_kind("aten::mm"), OpKind::kMatmul);
  EXPECT_EQ(op_kind("aten::addmm"), OpKind::kMatmul);
  EXPECT_EQ(op_kind("aten::convolution_backward"), OpKind::kConvolutionBackward);
  EXPECT_EQ(op_kind("aten::_scaled_dot_product_flash_attention"), OpKind::kAttention);
  EXPECT_EQ(op_kind("aten::_scaled_dot_product_flash_attention_backward"),
            OpKind::kAttentionBackward);
  EXPECT_EQ(op_kind("aten::_softmax"), OpKind::kSoftmax);
  EXPECT_EQ(op_kind("aten::_softmax_backward_data"), OpKind::kSoftmaxBackward);
  EXPECT_EQ(op_kind("aten::scaled_dot_product_attention"), OpKind::kAttentionComposite);
  EXPECT_EQ(op_kind("aten::matmul"), OpKind::kUntracked);
  EXPECT_EQ(op_kind("aten::linear"), OpKind::kUntracked);
  EXPECT_EQ(op_kind("autograd::engine::evaluate_function: MmBackward0"), OpKind::kUntracked);
  EXPECT_EQ(op_kind(""), OpKind::kUntracked);
  EXPECT_TRUE(has_formula(OpKind::kMatmul));
  EXPECT_FALSE(has_formula(OpKind::kSoftmax));
  EXPECT_TRUE(is_tracked(OpKind::kSoftmax));
  EXPECT_FALSE(is_tracked(OpKind::kAttentionComposite));
}

TEST(FlopFormulaTest, MatmulAndSoftmaxShapes) {
  auto m = matmul_shapes("aten::addmm", {T({16}), T({4, 8}), T({8, 16})});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->a, (Shape{4, 8}));
  EXPECT_EQ(m->b, (Shape{8, 16}));
  EXPECT_EQ(m->out, (Shape{4, 16}));
  m = matmul_shapes("aten::bmm", {T({3, 4, 5}), T({3, 5, 6})});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->out, (Shape{3, 4, 6}));
  m = matmul_shapes("aten::addbmm", {T({4, 6}), T({3, 4, 5}), T({3, 5, 6})});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->out, (Shape{4, 6}));
  EXPECT_FALSE(matmul_shapes("aten::convolution", {T({1, 1, 1}), T({1, 1, 1})}).has_value());

  auto s = softmax_shape("aten::_softmax",
                         {T({2, 4, 16, 16}), OpArg::integer(-1), OpArg::boolean(false)});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (Shape{2, 4, 16, 16}));
  EXPECT_TRUE(softmax_shape("aten::softmax", {T({2, 4, 16, 16}), OpArg::integer(3)}).has_value());
  EXPECT_FALSE(softmax_shape("aten::softmax", {T({2, 4, 16, 16}), OpArg::integer(1)}).has_value())
      << "not over the last dim";
  EXPECT_TRUE(softmax_shape("aten::_softmax_backward_data", {T({2, 4, 16, 16}), T({2, 4, 16, 16}),
                                                             OpArg::integer(-1), OpArg::integer(6)})
                  .has_value());
}

// ---- precision ----------------------------------------------------------------------------------

TEST(MathPrecisionTest, FromDtypeAndTf32) {
  EXPECT_EQ(precision_of("Float", false), MathPrecision::kFp32);
  EXPECT_EQ(precision_of("Float", true), MathPrecision::kTf32);
  EXPECT_EQ(precision_of("BFloat16", true), MathPrecision::kBf16);
  EXPECT_EQ(precision_of("Half", false), MathPrecision::kFp16);
  EXPECT_EQ(precision_of("Float8_e4m3fn", false), MathPrecision::kFp8);
  EXPECT_EQ(precision_of("Float8_e5m2", false), MathPrecision::kFp8);
  EXPECT_EQ(precision_of("Double", true), MathPrecision::kFp64);
  EXPECT_EQ(precision_of("Int", false), MathPrecision::kOther);
  EXPECT_EQ(dtype_bytes("Float"), 4);
  EXPECT_EQ(dtype_bytes("BFloat16"), 2);
  EXPECT_EQ(dtype_bytes("Float8_e4m3fn"), 1);
  EXPECT_EQ(dtype_bytes("Double"), 8);

  EXPECT_STREQ(to_string(MathPrecision::kFp32), "fp32");
  EXPECT_STREQ(to_string(MathPrecision::kTf32), "tf32");
  EXPECT_STREQ(to_string(MathPrecision::kBf16), "bf16");
  EXPECT_STREQ(to_string(MathPrecision::kFp16), "fp16");
  EXPECT_STREQ(to_string(MathPrecision::kFp8), "fp8");
  EXPECT_STREQ(to_string(MathPrecision::kFp64), "fp64");
  EXPECT_STREQ(to_string(MathPrecision::kOther), "other");
}

TEST(MathPrecisionTest, OpPrecisionFollowsTheRightFlag) {
  const MathFlags cublas{true, false};
  const MathFlags cudnn{false, true};
  const std::vector<OpArg> mm_cuda = {T({4, 8}, "Float", true), T({8, 16}, "Float", true)};
  const std::vector<OpArg> mm_cpu = {T({4, 8}), T({8, 16})};
  EXPECT_EQ(op_precision("aten::mm", mm_cuda, cublas), MathPrecision::kTf32);
  EXPECT_EQ(op_precision("aten::mm", mm_cuda, cudnn), MathPrecision::kFp32);
  EXPECT_EQ(op_precision("aten::mm", mm_cpu, cublas), MathPrecision::kFp32) << "no TF32 on CPU";
  const auto conv = conv_args({2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, false, 1);
  std::vector<OpArg> conv_cuda = conv;
  conv_cuda[0].cuda = conv_cuda[1].cuda = true;
  EXPECT_EQ(op_precision("aten::convolution", conv_cuda, cudnn), MathPrecision::kTf32);
  EXPECT_EQ(op_precision("aten::convolution", conv_cuda, cublas), MathPrecision::kFp32);
  // addmm: the matrices' dtype, not the bias's (autocast casts all three; be exact anyway).
  EXPECT_EQ(op_precision(
                "aten::addmm",
                {T({16}, "Float", true), T({4, 8}, "BFloat16", true), T({8, 16}, "BFloat16", true)},
                cublas),
            MathPrecision::kBf16);
  EXPECT_EQ(op_precision("aten::_scaled_dot_product_flash_attention_backward",
                         {T({2, 4, 8, 8}, "Float", true), T({2, 4, 8, 8}, "Half", true)}, cublas),
            MathPrecision::kFp16);
  EXPECT_EQ(op_precision("aten::mm", {}, cublas), MathPrecision::kOther);
}

}  // namespace
}  // namespace torchpilot
