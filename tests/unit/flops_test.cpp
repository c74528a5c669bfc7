// FLOP formulas against hand-computed values, precision, the peak table, MFU/HFU math, the
// attention detector, the window planner and the accumulators (runtime/src/flop_*.cpp).
#include "torchpilot/runtime/attention_detector.h"
#include "torchpilot/runtime/device_peaks.h"
#include "torchpilot/runtime/flop_accumulation.h"
#include "torchpilot/runtime/flop_formulas.h"
#include "torchpilot/runtime/flop_windows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace torchpilot {
namespace {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

OpArg T(Shape s, std::string_view dtype = "Float", bool cuda = false) {
  return OpArg::tensor(std::move(s), dtype, cuda);
}

// ---- formulas
// -------------------------------------------------------------------------------------

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

// ---- precision
// ------------------------------------------------------------------------------------

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

// ---- peaks
// ------------------------------------------------------------------------------------------

TEST(PeakTableTest, LookupByDeviceName) {
  struct Case {
    const char* device;
    const char* row;
  };
  const std::vector<Case> cases = {
      {"NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"},
      {"NVIDIA H100 PCIe", "NVIDIA H100 PCIe"},
      {"NVIDIA H100 NVL", "NVIDIA H100 NVL"},
      {"NVIDIA H200", "NVIDIA H200"},
      {"NVIDIA H200 NVL", "NVIDIA H200 NVL"},
      {"NVIDIA GH200 480GB", "NVIDIA GH200"},
      {"NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM"},
      {"NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM 40GB"},
      {"NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB"},
      {"NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe"},
      {"NVIDIA L40S", "NVIDIA L40S"},
      {"NVIDIA L40", "NVIDIA L40"},
      {"NVIDIA B200", "NVIDIA B200"},
      {"NVIDIA GB200", "NVIDIA GB200"},
  };
  for (const Case& c : cases) {
    const DeviceSpec* d = find_device(c.device);
    ASSERT_NE(d, nullptr) << c.device;
    EXPECT_EQ(d->name, c.row) << c.device;
  }
  EXPECT_EQ(find_device("Tesla T4"), nullptr);
  EXPECT_EQ(find_device(""), nullptr);
  EXPECT_EQ(find_device("cpu"), nullptr);
}

TEST(PeakTableTest, DatasheetValues) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  EXPECT_DOUBLE_EQ(h100.flops_per_s[P(MathPrecision::kBf16)], 989.5e12);
  EXPECT_DOUBLE_EQ(h100.flops_per_s[P(MathPrecision::kFp8)], 1979e12);
  EXPECT_DOUBLE_EQ(h100.flops_per_s[P(MathPrecision::kTf32)], 494.5e12);
  EXPECT_DOUBLE_EQ(h100.flops_per_s[P(MathPrecision::kFp32)], 67e12);
  EXPECT_DOUBLE_EQ(h100.dram_bytes_per_s, 3350e9);
  EXPECT_EQ(h100.source, "table: NVIDIA H100 SXM");
  EXPECT_DOUBLE_EQ(resolve_peak("NVIDIA H100 PCIe", 0).flops_per_s[P(MathPrecision::kBf16)],
                   756.5e12);
  EXPECT_DOUBLE_EQ(resolve_peak("NVIDIA H200", 0).dram_bytes_per_s, 4800e9);
  EXPECT_DOUBLE_EQ(resolve_peak("NVIDIA L40S", 0).flops_per_s[P(MathPrecision::kFp8)], 733e12);
  EXPECT_DOUBLE_EQ(resolve_peak("NVIDIA B200", 0).flops_per_s[P(MathPrecision::kBf16)], 2250e12);
  const DevicePeak a100 = resolve_peak("NVIDIA A100-SXM4-80GB", 0);
  EXPECT_DOUBLE_EQ(a100.flops_per_s[P(MathPrecision::kBf16)], 312e12);
  EXPECT_TRUE(std::isnan(a100.flops_per_s[P(MathPrecision::kFp8)])) << "no fp8 on Ampere";
  // Every row: tensor cores beat the CUDA cores, fp16 = bf16.
  for (const DeviceSpec& d : device_table()) {
    const double fp32 = d.tflops[P(MathPrecision::kFp32)];
    const double tf32 = d.tflops[P(MathPrecision::kTf32)];
    const double bf16 = d.tflops[P(MathPrecision::kBf16)];
    EXPECT_GE(tf32, fp32) << d.name;
    EXPECT_GT(bf16, tf32) << d.name;
    EXPECT_EQ(bf16, d.tflops[P(MathPrecision::kFp16)]) << d.name;
    EXPECT_TRUE(std::isnan(d.tflops[P(MathPrecision::kOther)])) << d.name;
    EXPECT_GT(d.dram_gb_per_s, 0) << d.name;
    EXPECT_FALSE(d.source.empty()) << d.name;
  }
}

TEST(PeakTableTest, ConfigOverrideWins) {
  const DevicePeak p = resolve_peak("NVIDIA H100 80GB HBM3", 400);
  EXPECT_EQ(p.source, "config");
  for (double v : p.flops_per_s) EXPECT_DOUBLE_EQ(v, 400e12);
  EXPECT_DOUBLE_EQ(p.datasheet_flops_per_s[P(MathPrecision::kBf16)], 989.5e12)
      << "the datasheet stays known for the advisors";
  // Unknown device (or CPU) with an override: the override is the peak.
  const DevicePeak cpu = resolve_peak("", 2);
  EXPECT_TRUE(cpu.any());
  EXPECT_EQ(cpu.source, "config");
  EXPECT_TRUE(std::isnan(cpu.datasheet_flops_per_s[P(MathPrecision::kFp32)]));
  // Neither: no peak.
  const DevicePeak none = resolve_peak("Tesla T4", 0);
  EXPECT_FALSE(none.any());
  EXPECT_TRUE(none.source.empty());
}

// ---- MFU
// --------------------------------------------------------------------------------------------

PrecisionArray flops_of(std::initializer_list<std::pair<MathPrecision, double>> items) {
  PrecisionArray a{};
  for (const auto& [p, f] : items) a[P(p)] = f;
  return a;
}

TEST(MfuTest, SinglePrecision) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  // Half a second of bf16 peak work in a one-second step: 50%.
  const auto f = flops_of({{MathPrecision::kBf16, 0.5 * 989.5e12}});
  EXPECT_DOUBLE_EQ(time_at_peak(f, h100), 0.5);
  EXPECT_DOUBLE_EQ(utilization(f, h100, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(utilization(f, h100, 2.0), 0.25);
  EXPECT_EQ(dominant_precision(f), MathPrecision::kBf16);
}

TEST(MfuTest, MixedPrecisionsEachAgainstItsOwnPeak) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  // 0.5 s at the bf16 peak + 0.5 s at the fp32 peak in a 2 s step: 50%.
  const auto f =
      flops_of({{MathPrecision::kBf16, 0.5 * 989.5e12}, {MathPrecision::kFp32, 0.5 * 67e12}});
  EXPECT_DOUBLE_EQ(time_at_peak(f, h100), 1.0);
  EXPECT_DOUBLE_EQ(utilization(f, h100, 2.0), 0.5);
  EXPECT_EQ(dominant_precision(f), MathPrecision::kBf16);
  // Held against the bf16 peak alone it would read 0.5 * (1 + 67/989.5) / 2 ~ 27%: not that.
  EXPECT_GT(utilization(f, h100, 2.0), 0.3);
}

TEST(MfuTest, PrecisionsWithoutPeakUseTheDominantOne) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  const auto f =
      flops_of({{MathPrecision::kBf16, 0.5 * 989.5e12}, {MathPrecision::kOther, 0.25 * 989.5e12}});
  EXPECT_DOUBLE_EQ(time_at_peak(f, h100), 0.75);
  // fp8 on an A100 (no fp8 peak) is held against the dominant bf16 peak.
  const DevicePeak a100 = resolve_peak("NVIDIA A100-SXM4-80GB", 0);
  const auto g = flops_of({{MathPrecision::kBf16, 312e12}, {MathPrecision::kFp8, 156e12}});
  EXPECT_DOUBLE_EQ(time_at_peak(g, a100), 1.5);
  // Only fp8 FLOPs on an A100: nothing to hold them against.
  EXPECT_TRUE(std::isnan(time_at_peak(flops_of({{MathPrecision::kFp8, 1e12}}), a100)));
  EXPECT_TRUE(std::isnan(utilization(flops_of({{MathPrecision::kFp8, 1e12}}), a100, 1.0)));
}

TEST(MfuTest, NaNWithoutPeakOrTime) {
  const auto f = flops_of({{MathPrecision::kFp32, 1e9}});
  EXPECT_TRUE(std::isnan(utilization(f, resolve_peak("", 0), 1.0))) << "CPU: no peak";
  EXPECT_TRUE(std::isnan(utilization(f, resolve_peak("NVIDIA H200", 0), 0.0)));
  EXPECT_DOUBLE_EQ(utilization(PrecisionArray{}, resolve_peak("NVIDIA H200", 0), 1.0), 0.0);
  // A config peak applies to every precision.
  EXPECT_DOUBLE_EQ(utilization(f, resolve_peak("", 1e-3), 1.0), 1.0);  // 1 GFLOP/s peak
}

TEST(MfuTest, HfuCountsRecomputation) {
  const DevicePeak h200 = resolve_peak("NVIDIA H200", 0);
  FlopTally t;
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.3 * 989.5e12, false);
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.1 * 989.5e12, true);
  const StepFlops s = t.per_step(1);
  EXPECT_NEAR(utilization(s.model_by_precision, h200, 1.0), 0.3, 1e-12);
  EXPECT_NEAR(utilization(s.hardware_by_precision, h200, 1.0), 0.4, 1e-12);
}

// ---- attention detector
// -----------------------------------------------------------------------------

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

// ---- tallies
// ------------------------------------------------------------------------------------------

TEST(FlopTallyTest, PerStepMeansAndTopOps) {
  FlopTally t;
  EXPECT_TRUE(t.empty());
  // Two steps: each runs two bf16 mms of 100, one fp32 conv of 50, one fused attention of 40,
  // and a recomputed mm of 30 (hardware only).
  for (int step = 0; step < 2; ++step) {
    t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 100, false);
    t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 100, false);
    t.add("aten::convolution", OpKind::kConvolution, MathPrecision::kFp32, 50, false);
    t.add("aten::_scaled_dot_product_flash_attention", OpKind::kAttention, MathPrecision::kBf16, 40,
          false);
    t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 30, true);
  }
  t.add_attention({12, 1, 0, 64});
  t.add_unparsed();
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, kNotMeasured, false);  // ignored
  const StepFlops s = t.per_step(2);
  EXPECT_DOUBLE_EQ(s.model_flops, 290);
  EXPECT_DOUBLE_EQ(s.hardware_flops, 320);
  EXPECT_DOUBLE_EQ(s.model_by_precision[P(MathPrecision::kBf16)], 240);
  EXPECT_DOUBLE_EQ(s.model_by_precision[P(MathPrecision::kFp32)], 50);
  EXPECT_DOUBLE_EQ(s.hardware_by_precision[P(MathPrecision::kBf16)], 270);
  EXPECT_DOUBLE_EQ(s.fused_attention_flops, 40);
  EXPECT_DOUBLE_EQ(s.unfused_attention_flops, 6);
  EXPECT_DOUBLE_EQ(s.unfused_attention, 0.5);
  EXPECT_DOUBLE_EQ(s.unfused_attention_traffic_bytes, 32);
  EXPECT_EQ(s.unparsed_calls, 1);
  ASSERT_EQ(s.ops.size(), 3u);
  EXPECT_EQ(s.ops[0].op, "aten::mm");
  EXPECT_DOUBLE_EQ(s.ops[0].flops_per_step, 200);
  EXPECT_DOUBLE_EQ(s.ops[0].calls_per_step, 2);
  EXPECT_EQ(s.ops[1].op, "aten::convolution");
  EXPECT_EQ(s.ops[1].precision, MathPrecision::kFp32);
  EXPECT_EQ(s.ops[2].op, "aten::_scaled_dot_product_flash_attention");
  t.clear();
  EXPECT_TRUE(t.empty());
  EXPECT_DOUBLE_EQ(t.per_step(1).model_flops, 0);
}

StepFlops count_of(double bf16, double fp32 = 0) {
  FlopTally t;
  if (bf16 > 0) t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, bf16, false);
  if (fp32 > 0) t.add("aten::addmm", OpKind::kMatmul, MathPrecision::kFp32, fp32, false);
  return t.per_step(1);
}

// ---- window planner
// ------------------------------------------------------------------------------------

struct PlannerRun {
  FlopWindowPlanner planner;
  int64_t counted = 0;
  explicit PlannerRun(FlopConfig c) : planner(c) {}
  // Runs one step of `samples`; a counted step "counts" `flops` bf16 FLOPs.
  const StepFlops* step(int64_t samples, double flops) {
    const bool count = planner.begin_step();
    StepFlops own = count_of(flops);
    if (count) ++counted;
    return planner.end_step(samples, count ? &own : nullptr);
  }
};

FlopConfig window_config(int skip, int count, int every = 0) {
  FlopConfig c;
  c.skip_steps = skip;
  c.count_steps = count;
  c.recount_every_steps = every;
  return c;
}

TEST(FlopWindowPlannerTest, SkipThenCountThenReuse) {
  PlannerRun r(window_config(2, 3));
  EXPECT_FALSE(r.planner.counting());
  EXPECT_EQ(r.step(32, 100), nullptr);  // skipped
  EXPECT_EQ(r.step(32, 100), nullptr);  // skipped
  EXPECT_TRUE(r.planner.counting()) << "the window opens with the next step";
  EXPECT_EQ(r.counted, 0);
  // Counted steps get their own count.
  const StepFlops* a = r.step(32, 90);
  ASSERT_NE(a, nullptr);
  EXPECT_DOUBLE_EQ(a->model_flops, 90);
  EXPECT_DOUBLE_EQ(r.step(32, 100)->model_flops, 100);
  EXPECT_DOUBLE_EQ(r.step(32, 110)->model_flops, 110);
  EXPECT_EQ(r.counted, 3);
  EXPECT_FALSE(r.planner.counting());
  EXPECT_EQ(r.planner.windows(), 1);
  // Later steps: the window's mean, without counting.
  for (int i = 0; i < 20; ++i) {
    const StepFlops* s = r.step(32, 999);
    ASSERT_NE(s, nullptr);
    EXPECT_DOUBLE_EQ(s->model_flops, 100);
  }
  EXPECT_EQ(r.counted, 3);
}

TEST(FlopWindowPlannerTest, NewSampleCountIsCountedOnceAndRemembered) {
  PlannerRun r(window_config(0, 2));
  r.step(32, 100);
  r.step(32, 100);
  EXPECT_EQ(r.planner.windows(), 1);
  // The batch size changes: that step has no count, the next ones are counted.
  EXPECT_EQ(r.step(16, 50), nullptr);
  EXPECT_TRUE(r.planner.counting());
  EXPECT_DOUBLE_EQ(r.step(16, 50)->model_flops, 50);
  EXPECT_DOUBLE_EQ(r.step(16, 50)->model_flops, 50);
  EXPECT_EQ(r.planner.windows(), 2);
  EXPECT_EQ(r.counted, 4);
  // Back to 32 and again 16: both remembered, nothing counted.
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 100);
  EXPECT_DOUBLE_EQ(r.step(16, 0)->model_flops, 50);
  EXPECT_EQ(r.counted, 4);
}

TEST(FlopWindowPlannerTest, PartialLastBatchDoesNotRecountTheFullOne) {
  PlannerRun r(window_config(0, 3));
  for (int i = 0; i < 3; ++i) r.step(32, 100);
  // The epoch's last batch of 20 samples has no count; the next step (32) is counted, but since
  // 32 is known the window closes after that one step.
  EXPECT_EQ(r.step(20, 60), nullptr);
  EXPECT_DOUBLE_EQ(r.step(32, 101)->model_flops, 101);
  EXPECT_FALSE(r.planner.counting());
  EXPECT_EQ(r.counted, 4);
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 100) << "the remembered window mean";
}

TEST(FlopWindowPlannerTest, WindowRestartsWhenSamplesChangeInside) {
  PlannerRun r(window_config(0, 3));
  r.step(32, 100);
  r.step(16, 50);  // the window restarts with this step
  EXPECT_TRUE(r.planner.counting());
  r.step(16, 50);
  r.step(16, 50);
  EXPECT_FALSE(r.planner.counting());
  EXPECT_DOUBLE_EQ(r.planner.count_for(16)->model_flops, 50);
  EXPECT_EQ(r.planner.count_for(32), nullptr);
}

TEST(FlopWindowPlannerTest, RecountEveryNStepsAndOnRequest) {
  PlannerRun r(window_config(0, 1, 5));
  r.step(32, 100);
  EXPECT_EQ(r.counted, 1);
  for (int i = 0; i < 5; ++i) r.step(32, 0);
  EXPECT_TRUE(r.planner.counting()) << "5 steps since the window";
  EXPECT_DOUBLE_EQ(r.step(32, 120)->model_flops, 120);
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 120) << "the new count replaces the old";
  EXPECT_EQ(r.counted, 2);
  r.planner.recount();
  EXPECT_TRUE(r.planner.counting());
  EXPECT_EQ(r.planner.count_for(32), nullptr);
  EXPECT_DOUBLE_EQ(r.step(32, 130)->model_flops, 130);
  EXPECT_DOUBLE_EQ(r.step(32, 0)->model_flops, 130);
  EXPECT_EQ(r.counted, 3);
}

TEST(FlopWindowPlannerTest, RemembersAtMostEightSampleCounts) {
  PlannerRun r(window_config(0, 1));
  for (int64_t s = 1; s <= 10; ++s) {
    r.step(s, 0);                       // unknown: the next step counts
    r.step(s, static_cast<double>(s));  // counted
  }
  EXPECT_EQ(r.planner.count_for(1), nullptr);
  EXPECT_EQ(r.planner.count_for(2), nullptr);
  EXPECT_NE(r.planner.count_for(3), nullptr);
  EXPECT_DOUBLE_EQ(r.planner.count_for(10)->model_flops, 10);
}

// ---- epoch accumulator
// ------------------------------------------------------------------------------------

TEST(FlopEpochAccumulatorTest, SummarizesKnownSteps) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  FlopEpochAccumulator acc;
  const StepFlops c = count_of(0.25 * 989.5e12);  // a quarter second at the bf16 peak
  acc.add_step(nullptr, 1.0, false);              // before any count
  acc.add_step(&c, 2.0, true);                    // counted (slower: callbacks on)
  acc.add_step(&c, 1.0, false);
  acc.add_step(&c, 1.0, false);
  const FlopEpochStats f = acc.summarize(h100);
  EXPECT_EQ(f.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(f.counted_steps, 1);
  EXPECT_EQ(f.steps_with_count, 3);
  EXPECT_DOUBLE_EQ(f.model_flops_per_step, 0.25 * 989.5e12);
  EXPECT_DOUBLE_EQ(f.model_flops_by_precision[P(MathPrecision::kBf16)], 0.25 * 989.5e12);
  EXPECT_DOUBLE_EQ(f.achieved_flops_per_s, 3 * 0.25 * 989.5e12 / 4.0);
  EXPECT_DOUBLE_EQ(f.mfu, 0.25) << "from the uncounted steps";
  EXPECT_DOUBLE_EQ(f.hfu, 0.25);
  EXPECT_EQ(f.dominant_precision, MathPrecision::kBf16);
  EXPECT_DOUBLE_EQ(f.peak_flops_per_s, 989.5e12);
  EXPECT_EQ(f.peak_source, "table: NVIDIA H100 SXM bf16 dense");
  EXPECT_DOUBLE_EQ(f.datasheet_flops_by_precision[P(MathPrecision::kFp32)], 67e12);
  EXPECT_DOUBLE_EQ(f.dram_bytes_per_s, 3350e9);
  ASSERT_EQ(f.top_ops.size(), 1u);
  EXPECT_EQ(f.top_ops[0].op, "aten::mm");

  // Only counted steps: MFU from them.
  FlopEpochAccumulator only;
  only.add_step(&c, 0.5, true);
  EXPECT_DOUBLE_EQ(only.summarize(h100).mfu, 0.5);
  // No peak: NaN, the FLOPs still there.
  const FlopEpochStats cpu = acc.summarize(resolve_peak("", 0));
  EXPECT_TRUE(std::isnan(cpu.mfu));
  EXPECT_TRUE(std::isnan(cpu.hfu));
  EXPECT_TRUE(std::isnan(cpu.peak_flops_per_s));
  EXPECT_TRUE(cpu.peak_source.empty());
  EXPECT_DOUBLE_EQ(cpu.model_flops_per_step, 0.25 * 989.5e12);
  // Config peak.
  EXPECT_EQ(acc.summarize(resolve_peak("NVIDIA H100 80GB HBM3", 1000)).peak_source, "config");
  // Nothing known.
  FlopEpochAccumulator empty;
  empty.add_step(nullptr, 1.0, false);
  const FlopEpochStats e = empty.summarize(h100);
  EXPECT_EQ(e.steps_with_count, 0);
  EXPECT_TRUE(std::isnan(e.mfu));
  EXPECT_EQ(e.model_flops_per_step, 0);
  acc.clear();
  EXPECT_EQ(acc.summarize(h100).steps_with_count, 0);
}

TEST(FlopEpochAccumulatorTest, TopOpsAreCappedAndOrdered) {
  FlopTally t;
  for (int i = 0; i < 15; ++i) {
    t.add("op" + std::to_string(i), OpKind::kMatmul, MathPrecision::kBf16, 100.0 + i, false);
  }
  const StepFlops s = t.per_step(1);
  FlopEpochAccumulator acc;
  acc.add_step(&s, 1.0, false);
  const FlopEpochStats f = acc.summarize(resolve_peak("", 0));
  ASSERT_EQ(f.top_ops.size(), FlopEpochAccumulator::kTopOps);
  EXPECT_EQ(f.top_ops[0].op, "op14");
  EXPECT_EQ(f.top_ops[9].op, "op5");
}

TEST(FillStepFlopsTest, RecordFields) {
  const DevicePeak h100 = resolve_peak("NVIDIA H100 80GB HBM3", 0);
  StepRecord r;
  r.begin_ns = 0;
  r.end_ns = 1'000'000'000;
  FlopTally t;
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.25 * 989.5e12, false);
  t.add("aten::mm", OpKind::kMatmul, MathPrecision::kBf16, 0.25 * 989.5e12, true);
  const StepFlops c = t.per_step(1);
  fill_step_flops(r, &c, h100);
  EXPECT_DOUBLE_EQ(r.model_flops, 0.25 * 989.5e12);
  EXPECT_DOUBLE_EQ(r.hardware_flops, 0.5 * 989.5e12);
  EXPECT_DOUBLE_EQ(r.mfu, 0.25);
  EXPECT_DOUBLE_EQ(r.hfu, 0.5);
  fill_step_flops(r, nullptr, h100);
  EXPECT_TRUE(std::isnan(r.model_flops));
  EXPECT_TRUE(std::isnan(r.mfu));
  fill_step_flops(r, &c, resolve_peak("", 0));
  EXPECT_DOUBLE_EQ(r.model_flops, 0.25 * 989.5e12);
  EXPECT_TRUE(std::isnan(r.mfu)) << "no peak on CPU";
}

}  // namespace
}  // namespace torchpilot
