// Kernel classes (kernel_classes.h): names as CUPTI gives them (demangled), from cuBLAS, cuDNN,
// ATen, flash attention and NCCL, and a window's time split by class.
#include "torchpilot/runtime/gpu/kernel_classes.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fakes/gpu_records.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"

namespace torchpilot {
namespace {

KernelClass cls(const std::string& name) { return classify_kernel(name).cls; }

// classify_kernel(name) says class `c`, and fused or not as `fused` says.
void expect_kind(const std::string& name, KernelClass c, bool fused) {
  const KernelKind k = classify_kernel(name);
  EXPECT_EQ(k.cls, c) << name;
  EXPECT_EQ(k.fused, fused) << name;
}

TEST(KernelClasses, CublasAndCudnnGemmsByTensorCoreUse) {
  // Hopper cuBLAS: the type code after nvjet_[smNN_] decides (sss: fp32 on the CUDA cores).
  EXPECT_EQ(cls("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"), KernelClass::kTensorGemm);
  EXPECT_EQ(cls("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN"), KernelClass::kTensorGemm);
  EXPECT_EQ(cls("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NNT"), KernelClass::kTensorGemm);
  EXPECT_EQ(cls("nvjet_sss_128x64_32x6_1x1_v_bz_TNT"), KernelClass::kSimtGemm);
  EXPECT_EQ(cls("nvjet_sm90_sss_64x64_32x8_1x1_h_bz_NNN"), KernelClass::kSimtGemm);
  EXPECT_EQ(cls("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
                "execute_segment_k_off_kernel__5x_cublas"),
            KernelClass::kTensorGemm);
  EXPECT_EQ(cls("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_cublas"),
            KernelClass::kTensorGemm);
  EXPECT_EQ(cls("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3"),
            KernelClass::kSimtGemm);
  EXPECT_EQ(cls("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8"),
            KernelClass::kTensorGemm);
  EXPECT_EQ(cls("cutlass_80_simt_sgemm_128x128_8x4_nn_align1"), KernelClass::kSimtGemm);
  EXPECT_EQ(cls("ampere_sgemm_128x64_nn"), KernelClass::kSimtGemm);
  EXPECT_EQ(cls("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"),
            KernelClass::kTensorGemm);
  EXPECT_EQ(cls("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, "
                "false, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float "
                "const>, cublasGemvTensorStridedBatched<float>, float> >(...)"),
            KernelClass::kSimtGemm);
  EXPECT_EQ(cls("void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, "
                "false, false, true>(int, int, int, float const*, int, float*, float const*, ...)"),
            KernelClass::kSimtGemm);
  EXPECT_EQ(cls("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_"
                "tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8"),
            KernelClass::kTensorGemm);
  EXPECT_EQ(cls("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize"),
            KernelClass::kTensorGemm);
  // A split-K reduction is elementwise work beside its GEMM.
  EXPECT_EQ(cls("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, "
                "false>(cublasSplitKParams<float>, ...)"),
            KernelClass::kElementwise);
}

TEST(KernelClasses, AttentionFusedAndItsUnfusedPieces) {
  expect_kind(
      "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, "
      "4, false, false, cutlass::bfloat16_t> >(...)",
      KernelClass::kAttention, true);
  EXPECT_TRUE(classify_kernel("fmha_cutlassB_bf16_aligned_64x64_k64_sm80(...)").fused);
  EXPECT_TRUE(classify_kernel("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_"
                              "kernel0_0")
                  .fused);
  EXPECT_TRUE(classify_kernel("void attention_kernel_batched_impl<AttentionKernel<cutlass::"
                              "bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true> >")
                  .fused);
  // The captured fixture's softmax (a [*, L] softmax: an unfused attention's piece).
  expect_kind(
      "void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<float, float, float, "
      "at::native::(anonymous namespace)::SoftMaxForwardEpilogue, long, 8>(float*, float const*, "
      "long)",
      KernelClass::kAttention, false);
  EXPECT_EQ(cls("void (anonymous namespace)::softmax_warp_backward<c10::BFloat16, c10::BFloat16, "
                "float, 10, false, false>(c10::BFloat16*, ...)"),
            KernelClass::kAttention);
  EXPECT_EQ(cls("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous "
                "namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::"
                "{lambda()#1}::operator()() const::{lambda(float, bool)#1}, ...>"),
            KernelClass::kAttention);
  // log_softmax (cross-entropy) shares the kernels: its epilogue or is_log_softmax tell.
  EXPECT_EQ(cls("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, "
                "float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)"),
            KernelClass::kElementwise);
  EXPECT_EQ(cls("void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, true, "
                "false>(float*, float const*, int, int, int, bool const*, int, bool)"),
            KernelClass::kElementwise);
}

TEST(KernelClasses, OptimizerElementwiseCommunicationOther) {
  expect_kind(
      "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
      "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous "
      "namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, ...>",
      KernelClass::kOptimizer, true);
  // Per-parameter Adam: addcmul_ on exp_avg_sq, addcdiv_ on the parameter.
  expect_kind(
      "void at::native::vectorized_elementwise_kernel<4, at::native::addcdiv_cuda_kernel(at::"
      "TensorIteratorBase&, c10::Scalar const&)::{lambda()#2}::operator()() const::{lambda()#4}::"
      "operator()() const::{lambda(float, float, float)#1}, std::array<char*, 4ul> >(...)",
      KernelClass::kOptimizer, false);
  EXPECT_EQ(
      cls("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, "
          "float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, "
          "2ul> >(int, ...)"),
      KernelClass::kElementwise);
  EXPECT_EQ(cls("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
                "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, "
                "float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned "
                "int, float, 4, 4> >(...)"),
            KernelClass::kElementwise);
  EXPECT_EQ(cls("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::"
                "BFloat16, float>(int, float, ...)"),
            KernelClass::kElementwise);
  EXPECT_EQ(cls("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
            KernelClass::kCommunication);
  EXPECT_EQ(cls("my_custom_kernel"), KernelClass::kOther);
  EXPECT_EQ(classify_kernel("my_custom_kernel", true).cls, KernelClass::kCommunication);
}

using test::kernel;

KernelRecord on_stream(KernelRecord k, int64_t stream) {
  k.stream = stream;
  return k;
}

// Kernels of the given durations back to back (1 ns apart) on the default stream from t = 1000.
using Sequence = std::vector<std::pair<Nanos, const char*>>;
GpuEventBatch laid_out(const Sequence& seq) {
  GpuEventBatch e;
  Nanos t = 1000;
  for (const auto& [d, name] : seq) {
    e.kernels.push_back(kernel(t, t + d, 1, name));
    t += d + 1;
  }
  return e;
}

StepSpans traced_span(Interval host) {
  StepSpans s;
  s.host = host;
  s.traced = true;
  return s;
}

// Hand-made window over [1000, 1100] on a 100-SM GPU.
GpuEventBatch window_events() {
  GpuEventBatch e;
  e.kernels = {kernel(1010, 1030, 200, "nvjet_tst_128x256"),               // 2 waves
               kernel(1020, 1040, 50, "ampere_sgemm_128x64_nn"),           // half a wave
               kernel(1050, 1060, 10, "cunn_SoftMaxForward"),              // a tenth
               kernel(1070, 1075, 100, "addcdiv_cuda_kernel"),             // one wave
               kernel(990, 1005, 1000, "vectorized_elementwise_kernel")};  // began before
  CopyRecord copy;
  copy.begin = 1000;
  copy.end = 1050;
  copy.bytes = 1;
  CopyRecord memset = copy;
  memset.begin = 1060;
  memset.end = 1062;
  memset.memset = true;
  e.copies = {copy, memset};
  return e;
}

TEST(KernelClasses, WindowTimeIsPartitionedByClassAndIdle) {
  KernelClassStats s;
  add_kernel_classes(s, window_events(), traced_span({1000, 1100}), 100);
  auto ns = [&](KernelClass c) { return s.ns[static_cast<size_t>(c)]; };
  auto launches = [&](KernelClass c) { return s.launches[static_cast<size_t>(c)]; };
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.traced_ns, 100);
  // [1020, 1030) is shared by the two GEMMs: 5 each.
  EXPECT_DOUBLE_EQ(ns(KernelClass::kTensorGemm), 15);
  EXPECT_DOUBLE_EQ(ns(KernelClass::kSimtGemm), 15);
  EXPECT_DOUBLE_EQ(ns(KernelClass::kAttention), 10);
  EXPECT_DOUBLE_EQ(ns(KernelClass::kOptimizer), 5);
  EXPECT_DOUBLE_EQ(ns(KernelClass::kElementwise), 5);  // clipped to the step
  EXPECT_DOUBLE_EQ(s.idle_ns, 50);
  EXPECT_DOUBLE_EQ(s.busy_ns() + s.idle_ns, 100);
  EXPECT_DOUBLE_EQ(s.fused_attention_ns, 0);
  EXPECT_EQ(launches(KernelClass::kTensorGemm), 1);
  EXPECT_EQ(launches(KernelClass::kElementwise), 0);  // launched in the previous step
  EXPECT_EQ(s.per_parameter_optimizer_launches, 1);
  EXPECT_EQ(s.memcpy_ns, 50);
  EXPECT_EQ(s.memset_ns, 2);
  EXPECT_EQ(s.memcpys, 1);
  EXPECT_EQ(s.memsets, 1);
  // At twice the batch: the kernels of a wave or more double (20, 5, 5 -> 40, 10, 10); the
  // half-wave GEMM fills the GPU without growing (20); the tenth-wave softmax stays (10).
  EXPECT_DOUBLE_EQ(s.kernel_sum_ns, 60);
  EXPECT_DOUBLE_EQ(s.kernel_sum_scaled_ns, 90);

  // Steps add up; the GPU span replaces the host span when known; untraced steps add nothing.
  StepSpans gpu = traced_span({0, 10});
  gpu.gpu = {1000, 1100};
  gpu.gpu_timed = true;
  add_kernel_classes(s, window_events(), gpu, 100);
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.ns[static_cast<size_t>(KernelClass::kTensorGemm)], 30);
  StepSpans untraced = traced_span({1000, 1100});
  untraced.traced = false;
  add_kernel_classes(s, window_events(), untraced, 100);
  EXPECT_EQ(s.steps, 2);
}

// An unfused attention as ATen runs it (bf16, nanoGPT's slow path) on one stream, forward then
// backward, with the model's own GEMMs and a loss around it; a second stream's kernels apart.
TEST(KernelClasses, UnfusedAttentionSegmentsAreMeasuredAroundEachSoftmax) {
  const char* gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT";
  const char* mul =
      "void at::native::vectorized_elementwise_kernel<8, at::native::AUnaryFunctor<c10::BFloat16, "
      "c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >";
  const char* mask =
      "void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous "
      "namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}>";
  const char* copy =
      "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>";
  const Sequence seq = {
      {7, gemm},  // qkv projection: not the attention's
      {2, copy},  // q, k, v made contiguous
      {5, gemm},  // QK^T
      {3, mul},   // scale
      {4, mask},  // causal mask
      {6,
       "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, "
       "false, false>"},
      {5, gemm},  // PV
      {7, gemm},  // output projection: not the attention's
      {9, "void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, true, false>"},
      {1, "nll_loss_forward_reduce_cuda_kernel_2d"},  // the loss's log_softmax: no attention
      {7, gemm},                                      // output projection's backward
      {5, gemm},                                      // dP = dY V^T
      {1, copy},  // skipped between backward's two GEMMs, not a piece
      {5, gemm},  // dV = P^T dY
      {8,
       "void (anonymous namespace)::softmax_warp_backward<c10::BFloat16, c10::BFloat16, float, 10, "
       "false, false>"},
      {4, mask},   // mask backward
      {3, mul},    // scale backward
      {5, gemm},   // dQ
      {5, gemm},   // dK
      {7, gemm}};  // qkv projection's backward: a third GEMM, not the attention's
  GpuEventBatch e = laid_out(seq);
  // Another stream: a softmax with no GEMM near it, and a GEMM.
  e.kernels.push_back(on_stream(kernel(1000, 1010, 1, "cunn_SoftMaxForward<4, float>"), 7));
  e.kernels.push_back(on_stream(kernel(1011, 1020, 1, gemm), 7));

  KernelClassStats s;
  add_kernel_classes(s, e, traced_span({1000, 1200}), 100);
  EXPECT_EQ(s.unfused_attention_softmaxes, 2);
  // Pieces: scale 3, mask 4, softmax 6 (forward); softmax 8, mask 4, scale 3 (backward).
  EXPECT_DOUBLE_EQ(s.unfused_attention_pieces_ns, 28);
  // GEMMs: QK^T, PV; dP, dV, dQ, dK: 5 each.
  EXPECT_DOUBLE_EQ(s.unfused_attention_gemm_ns, 30);
  // Their kernels: 6 pieces and 6 GEMMs (the skipped copy and the other stream's are not).
  EXPECT_EQ(s.unfused_attention_launches, 12);

  // Steps add up.
  add_kernel_classes(s, e, traced_span({1000, 1200}), 100);
  EXPECT_EQ(s.unfused_attention_softmaxes, 4);
  EXPECT_DOUBLE_EQ(s.unfused_attention_pieces_ns, 56);
  EXPECT_EQ(s.unfused_attention_launches, 24);

  // A softmax with more kernels than an attention has between it and a GEMM is not bounded.
  GpuEventBatch far;
  Nanos t = 1000;
  far.kernels.push_back(kernel(t, t + 5, 1, gemm));
  for (int i = 0; i < 9; ++i) {
    t += 6;
    far.kernels.push_back(kernel(t, t + 5, 1, mul));
  }
  t += 6;
  far.kernels.push_back(kernel(t, t + 5, 1, "cunn_SoftMaxForward<4, float>"));
  far.kernels.push_back(kernel(t + 6, t + 11, 1, gemm));
  KernelClassStats none;
  add_kernel_classes(none, far, traced_span({1000, 1200}), 100);
  EXPECT_EQ(none.unfused_attention_softmaxes, 0);
  EXPECT_DOUBLE_EQ(none.unfused_attention_pieces_ns, 0);
}

TEST(KernelClasses, BiasesAddedAfterTheirGemmsAreMeasured) {
  const char* gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT";
  const char* gemm_bias = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT";
  // LibTorch 2.11 under bf16 autocast: `output += bias`, a bf16 output and an fp32 bias.
  const char* broadcast_add =
      "void at::native::elementwise_kernel<128, 4, "
      "at::native::gpu_kernel_impl<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, "
      "at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, ...)";
  const char* broadcast_add_113 =  // the older functor name
      "void at::native::elementwise_kernel<128, 2, "
      "at::native::gpu_kernel_impl<at::native::AddFunctor<float> >(at::TensorIteratorBase&, "
      "at::native::AddFunctor<float> const&)::{lambda(int)#1}>(int, ...)";
  const char* residual_vectorized =
      "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
      "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)";
  const char* residual_unrolled =
      "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, "
      "std::array<char*, 3ul>, 4, TrivialOffsetCalculator<2, unsigned int>>(int, ...)";
  const char* layer_norm =
      "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, "
      "false>(int, float, ...)";
  EXPECT_TRUE(is_broadcast_add_kernel(broadcast_add));
  EXPECT_TRUE(is_broadcast_add_kernel(broadcast_add_113));
  EXPECT_FALSE(is_broadcast_add_kernel(residual_vectorized));
  EXPECT_FALSE(is_broadcast_add_kernel(residual_unrolled));
  EXPECT_TRUE(gemm_has_bias_epilogue(gemm_bias));
  EXPECT_FALSE(gemm_has_bias_epilogue(gemm));

  const char* softmax =
      "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, "
      "false, false>";
  const char* conv =
      "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_"
      "warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cudnn";
  const char* split_k = "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float>";
  EXPECT_TRUE(is_convolution_kernel(conv));
  EXPECT_FALSE(is_convolution_kernel(gemm));

  const Sequence seq = {{7, gemm},
                        {4, broadcast_add},  // counted: 4 (GEMM 7)
                        {7, gemm_bias},
                        {4, broadcast_add},  // the GEMM added its bias: not counted
                        {7, gemm},
                        {3, residual_vectorized},  // a contiguous add: not a bias
                        {7, gemm},
                        {3, residual_unrolled},  // nor this
                        {2, layer_norm},
                        {4, broadcast_add},  // a broadcast add after no GEMM: not counted
                        {9, "ampere_sgemm_128x64_nn"},
                        {5, broadcast_add_113},  // counted: 5 (GEMM 9)
                        {6, gemm},
                        {4, broadcast_add},
                        {5, softmax},  // scores += mask, then softmax: not counted
                        {8, conv},
                        {4, broadcast_add},  // a convolution's bias: not counted
                        {11, gemm},
                        {2, split_k},
                        {3, broadcast_add}};  // counted past the split-K reduction: 3 (GEMM 11)
  GpuEventBatch e = laid_out(seq);
  // Another stream: its GEMM, then its add, interleaved in time with the first stream's kernels
  // (counted: 6, GEMM 8); and an add there whose stream's previous kernel is no GEMM.
  e.kernels.push_back(on_stream(kernel(1001, 1009, 1, gemm), 7));
  e.kernels.push_back(on_stream(kernel(1010, 1016, 1, broadcast_add), 7));
  e.kernels.push_back(on_stream(kernel(1017, 1020, 1, broadcast_add), 7));

  KernelClassStats s;
  add_kernel_classes(s, e, traced_span({1000, 1200}), 100);
  EXPECT_EQ(s.unfused_bias_adds, 4);
  EXPECT_DOUBLE_EQ(s.unfused_bias_add_ns, 4 + 5 + 3 + 6);
  EXPECT_DOUBLE_EQ(s.unfused_bias_gemm_ns, 7 + 9 + 11 + 8);
  add_kernel_classes(s, e, traced_span({1000, 1200}), 100);  // steps add up
  EXPECT_EQ(s.unfused_bias_adds, 8);
  EXPECT_DOUBLE_EQ(s.unfused_bias_add_ns, 36);

  GpuEpochStats epoch;
  epoch.kernel_classes = s;
  const auto j = nlohmann::json::parse(section_json(epoch)).at("kernel_classes");
  EXPECT_DOUBLE_EQ(j.at("unfused_bias_adds_per_step").get<double>(), 4);
  EXPECT_DOUBLE_EQ(j.at("unfused_bias_ms_per_step").get<double>(), 18e-6);
  EXPECT_DOUBLE_EQ(j.at("unfused_bias_gemm_ms_per_step").get<double>(), 35e-6);
}

// One GPU step of the GPT example (d 1024, 12 layers, batch 8, bf16 autocast, fused attention and
// AdamW) on an H200, LibTorch 2.11, as captured (tests/fixtures/kernels/README.md).
GpuEventBatch captured_step(const std::string& file) {
  GpuEventBatch e;
  const std::string path = std::string(TORCHPILOT_SOURCE_DIR) + "/tests/fixtures/kernels/" + file;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    ADD_FAILURE() << "cannot open " << path;
    return e;
  }
  std::string line;
  char buf[4096];
  while (gzgets(f, buf, sizeof buf) != nullptr) {
    line += buf;
    if (line.empty() || line.back() != '\n') continue;  // a longer line: read on
    line.pop_back();
    if (!line.empty() && line[0] != '#') {
      long long stream = 0, begin = 0, end = 0;
      int name_at = 0;
      if (std::sscanf(line.c_str(), "%lld\t%lld\t%lld\t%n", &stream, &begin, &end, &name_at) == 3) {
        KernelRecord k = kernel(1'000'000 + begin, 1'000'000 + end, 132, "");
        k.name = line.substr(static_cast<size_t>(name_at));
        k.stream = stream;
        e.kernels.push_back(k);
      }
    }
    line.clear();
  }
  gzclose(f);
  return e;
}

TEST(KernelClasses, CapturedGptStepsFromTheFrontendLinearAndFromPython) {
  // torch::nn::Linear in C++: each of the 48 linears with a bias (4 a block, 12 blocks) runs its
  // GEMM and then `output += bias` in ATen's generic kernel: 3.95 ms of the 30.6 ms step.
  const GpuEventBatch cxx = captured_step("gpt-linear-frontend-h200.tsv.gz");
  ASSERT_EQ(cxx.kernels.size(), 727u);
  KernelClassStats c;
  add_kernel_classes(c, cxx, traced_span({1'000'000, 1'000'000 + 30'638'183}), 132);
  EXPECT_EQ(c.unfused_bias_adds, 48);
  EXPECT_DOUBLE_EQ(c.unfused_bias_add_ns, 3'954'333);
  EXPECT_DOUBLE_EQ(c.unfused_bias_gemm_ns, 3'317'722);

  // The same model in Python (F.linear: cuBLASLt's bias epilogue), same GPU: none.
  const GpuEventBatch py = captured_step("gpt-python-fused-h200.tsv.gz");
  ASSERT_EQ(py.kernels.size(), 720u);
  KernelClassStats p;
  add_kernel_classes(p, py, traced_span({1'000'000, 1'000'000 + 40'000'000}), 132);
  EXPECT_EQ(p.unfused_bias_adds, 0);
  EXPECT_DOUBLE_EQ(p.unfused_bias_add_ns, 0);
}

TEST(KernelClasses, TraceFromClipsAWindowsFirstStep) {
  KernelClassStats s;
  StepSpans spans = traced_span({1000, 1100});
  spans.trace_from = 1050;
  add_kernel_classes(s, window_events(), spans, 100);
  EXPECT_EQ(s.traced_ns, 50);
  EXPECT_DOUBLE_EQ(s.ns[static_cast<size_t>(KernelClass::kTensorGemm)], 0);
  EXPECT_DOUBLE_EQ(s.ns[static_cast<size_t>(KernelClass::kAttention)], 10);
  EXPECT_DOUBLE_EQ(s.busy_ns() + s.idle_ns, 50);
}

TEST(KernelClasses, EpochSectionCarriesTheClasses) {
  GpuEpochStats e;
  e.device = "NVIDIA H100";
  add_kernel_classes(e.kernel_classes, window_events(), traced_span({1000, 1100}), 100);
  const auto j = nlohmann::json::parse(section_json(e));
  const auto& k = j.at("kernel_classes");
  EXPECT_EQ(k.at("steps"), 1);
  EXPECT_DOUBLE_EQ(k.at("ms_per_step").at("tensor_gemm").get<double>(), 15e-6);
  EXPECT_DOUBLE_EQ(k.at("ms_per_step").at("idle").get<double>(), 50e-6);
  EXPECT_DOUBLE_EQ(k.at("launches_per_step").at("optimizer").get<double>(), 1);
  EXPECT_DOUBLE_EQ(k.at("memcpy_ms_per_step").get<double>(), 50e-6);

  e.traced_steps = 1;
  e.stats.traced_ns = 100;
  EpochSummary summary;
  std::vector<std::string> lines;
  section_text(e, summary, lines);
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  EXPECT_NE(all.find("GPU time by kernel class"), std::string::npos) << all;
  EXPECT_NE(all.find("tensor-core GEMM/conv 15.0%"), std::string::npos) << all;
  EXPECT_NE(all.find("idle 50.0%"), std::string::npos) << all;
}

}  // namespace
}  // namespace torchpilot
