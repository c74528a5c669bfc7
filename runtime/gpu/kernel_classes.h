// Kernel classes (docs/metrics.md, "Kernel classes"): what kind of work a traced kernel does,
// told from its name, and a detailed window's GPU time split by class. The advisors size their
// gains from these measured times (docs/advice.md).
//
// Pure: no vendor, no LibTorch. Thread-safety: plain values and pure functions.
// Failure behaviour: nothing here throws; an unknown name is class "other".
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "torchpilot/runtime/core/clock.h"

namespace torchpilot {

struct GpuEventBatch;
struct StepSpans;
class KernelIndex;

enum class KernelClass {
  kTensorGemm,     // GEMM/convolution on the tensor cores (bf16, fp16, TF32, fp8)
  kSimtGemm,       // GEMM/convolution/GEMV on the CUDA cores (fp32 SIMT, gemv)
  kAttention,      // fused attention kernels, and the pieces of an unfused one (softmax, mask)
  kElementwise,    // elementwise, reductions, normalization, copies, indexing, losses
  kOptimizer,      // optimizer updates (multi-tensor / fused, and per-parameter Adam's addcmul,
                   // addcdiv)
  kCommunication,  // NCCL
  kOther,          // none of the above
};
constexpr int kKernelClasses = 7;
// JSON key ("tensor_gemm", "simt_gemm", "attention", "elementwise", "optimizer",
// "communication", "other").
const char* to_string(KernelClass c);
// Advisory-log words ("tensor-core GEMM/conv", ...).
const char* label(KernelClass c);

struct KernelKind {
  KernelClass cls = KernelClass::kOther;
  // Attention: a fused kernel (flash, memory-efficient, cuDNN SDPA), not a piece of an unfused
  // one. Optimizer: a multi-tensor or fused kernel, not a per-parameter one.
  bool fused = false;
};
// A collective's kernel, by its name: NCCL's say "nccl"; with one rank it reduces in a kernel of
// its onerank.cu instead ("oneRankReduce", seen on the H100 for an AVG all-reduce).
bool is_communication_kernel(std::string_view name);
// The class of a kernel from its (demangled) name; `communication` is the trace's NCCL flag.
KernelKind classify_kernel(std::string_view name, bool communication = false);
// ATen's generic elementwise add (strided or broadcast operands; at::native::elementwise_kernel
// with an add functor), not its vectorized or unrolled forms (contiguous operands).
bool is_broadcast_add_kernel(std::string_view name);
// A GEMM kernel whose name says it adds a bias in its epilogue (cuBLASLt: "..._bias_...").
bool gemm_has_bias_epilogue(std::string_view name);
// A convolution's kernel (cuDNN's, implicit GEMM, Winograd), of the GEMM classes.
bool is_convolution_kernel(std::string_view name);

// The batch factor the launch-bound model predicts for (kernel_sum_scaled_ns).
constexpr double kLaunchBoundBatchFactor = 2.0;

// Traced GPU time of one or more steps by kernel class. The classes and idle_ns partition the
// traced time: an instant when k kernels run counts 1/k to each kernel's class, an instant when
// none runs is idle (the same idle as GpuStats' idle split). Copies and memsets run on copy
// engines beside kernels: their time is given apart, not in the partition.
struct KernelClassStats {
  int64_t steps = 0;
  Nanos traced_ns = 0;
  std::array<double, kKernelClasses> ns{};  // index: KernelClass
  std::array<int64_t, kKernelClasses> launches{};
  double idle_ns = 0;                            // no kernel running
  double fused_attention_ns = 0;                 // part of ns[attention] from fused kernels
  double fused_optimizer_ns = 0;                 // part of ns[optimizer] from multi-tensor kernels
  int64_t per_parameter_optimizer_launches = 0;  // addcmul/addcdiv kernels (per-parameter Adam)
  Nanos memcpy_ns = 0;                           // union of memcpy records (copy engines)
  Nanos memset_ns = 0;
  int64_t memcpys = 0, memsets = 0;
  // Launch-bound model: the kernels' durations summed (overlaps counted twice), and the same with
  // each kernel scaled to kLaunchBoundBatchFactor x the batch (docs/advice.md, "launch_bound").
  double kernel_sum_ns = 0;
  double kernel_sum_scaled_ns = 0;
  // Unfused attention, measured (docs/advice.md, "unfused_attention"): around each unfused
  // softmax kernel on its stream, the kernels up to the nearest GEMM on either side (scale, mask,
  // casts, dropout, softmax: forward and backward) and those bounding GEMMs (QK^T and PV: one each
  // side in forward, two in backward). Durations summed.
  double unfused_attention_pieces_ns = 0;
  double unfused_attention_gemm_ns = 0;
  int64_t unfused_attention_softmaxes = 0;  // softmax kernels that bounded a segment
  int64_t unfused_attention_launches = 0;   // kernels in those segments, GEMMs included
  // A bias added outside its GEMM (docs/advice.md, "unfused_linear_bias"): on a stream, a matrix
  // GEMM (not a convolution) with no bias epilogue followed by a broadcast add (ATen's generic,
  // strided elementwise add kernel; contiguous adds such as residuals run vectorized or unrolled
  // ones), a split-K reduction between them allowed, and no softmax within 4 kernels after it (an
  // attention mask). LibTorch's C++ torch::nn::Linear does this for inputs of more than 2 dims.
  double unfused_bias_add_ns = 0;   // the add kernels' durations, summed
  double unfused_bias_gemm_ns = 0;  // the GEMMs before them
  int64_t unfused_bias_adds = 0;

  double busy_ns() const;  // sum of ns: the kernel union
  double per_step_ms(double total_ns) const {
    return steps > 0 ? total_ns / 1e6 / static_cast<double>(steps) : 0;
  }
  void add(const KernelClassStats& other);
};

// Adds one traced step to `stats`: the events inside the step's traced span (the GPU span when
// known, else the host span; from trace_from on: the rule gpu_step_stats uses). Untraced steps
// add nothing. `kernels` (optional): an index over events.kernels (built here when absent).
void add_kernel_classes(KernelClassStats& stats, const GpuEventBatch& events,
                        const StepSpans& spans, int sm_count, const KernelIndex* kernels = nullptr);

}  // namespace torchpilot
