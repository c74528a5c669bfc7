// FLOP accounting without LibTorch (docs/metrics.md, "MFU and FLOPs"): FLOP formulas from an op's
// name and arguments, the arithmetic precision an op ran in, the peak dense FLOP/s of known GPUs,
// MFU/HFU, the unfused-attention detector, and the accumulators that turn counted ops into step
// and epoch figures. hooks/flop_counter converts RecordFunction callbacks into these calls.
//
// Conventions follow torch/utils/flop_counter.py: a multiply-add is 2 FLOPs; only matmuls,
// convolutions and attention are counted (elementwise ops, norms and softmax are not); bias
// additions are not counted; causal attention is counted in full.
//
// Thread-safety: plain values and functions. FlopTally, AttentionDetector, FlopWindowPlanner and
// FlopEpochAccumulator are not thread-safe; their owner serializes access.
// Failure behaviour: nothing here throws on bad input; a formula whose arguments do not fit the
// op's schema returns NaN.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchpilot/runtime/config.h"
#include "torchpilot/runtime/flop_records.h"
#include "torchpilot/runtime/records.h"

namespace spdlog {
class logger;
}

namespace torchpilot {

using Shape = std::vector<int64_t>;
using PrecisionArray = std::array<double, kMathPrecisions>;  // index: MathPrecision

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

// ---- peaks
// -----------------------------------------------------------------------------------------

// One row of the device table: dense (no sparsity) vendor datasheet peaks.
struct DeviceSpec {
  std::string name;                // "NVIDIA H100 SXM"
  std::vector<std::string> match;  // lower-case substrings that must all be in the device name
  PrecisionArray tflops;           // dense TFLOP/s by precision; NaN where the GPU has none
  double dram_gb_per_s;            // HBM/GDDR bandwidth, GB/s
  std::string source;              // datasheet
};
// Most specific rows first (GH200 before H200, H100 PCIe before H100, L40S before L40, ...).
const std::vector<DeviceSpec>& device_table();
const DeviceSpec* find_device(std::string_view device_name);  // null: not in the table

struct DevicePeak {
  std::string device;                    // the device name given (empty on CPU)
  PrecisionArray flops_per_s;            // what MFU uses; NaN where unknown
  PrecisionArray datasheet_flops_per_s;  // the table's row; NaN where unknown
  double dram_bytes_per_s;
  std::string source;  // "table: NVIDIA H100 SXM", "config", or "" (no peak)
  DevicePeak();
  bool any() const;  // some precision has a peak
};
// The table row for `device_name`; flops.peak_tflops > 0 overrides every precision ("config").
DevicePeak resolve_peak(std::string_view device_name, double config_peak_tflops);

// ---- MFU
// ------------------------------------------------------------------------------------------

// The precision with the most FLOPs (kOther only when nothing else ran).
MathPrecision dominant_precision(const PrecisionArray& flops);
// Seconds the FLOPs take at the peak of their precision; FLOPs of a precision without a peak
// (kOther, or fp8 on an A100) are held against the dominant precision's peak. NaN when that has
// no peak either, 0 for no FLOPs.
double time_at_peak(const PrecisionArray& flops, const DevicePeak& peak);
// time_at_peak / seconds: MFU for model FLOPs, HFU for hardware FLOPs. NaN without a peak or time.
double utilization(const PrecisionArray& flops, const DevicePeak& peak, double seconds);

// ---- one step's count ---------------------------------------------------------------------------

struct StepFlops {
  double model_flops = 0;     // recomputation excluded
  double hardware_flops = 0;  // recomputation included
  PrecisionArray model_by_precision{};
  PrecisionArray hardware_by_precision{};
  std::vector<OpFlops> ops;      // model FLOPs by (op, precision), largest first
  std::vector<OpFlops> modules;  // model FLOPs by module name (`op`), largest first
  double unfused_attention_flops = 0;
  double unfused_attention = 0;  // forward instances
  double sdpa_math_fallback = 0;
  double unfused_attention_traffic_bytes = 0;
  double fused_attention_flops = 0;
  int64_t unparsed_calls = 0;
};

// What the attention detector adds when it confirms an unfused attention.
struct AttentionDelta {
  double unfused_flops = 0;  // matmul FLOPs newly attributed to unfused attention
  int instances = 0;         // forward softmaxes confirmed
  int math_fallback = 0;     // ... of which inside scaled_dot_product_attention
  double traffic_bytes = 0;  // estimated score-matrix DRAM traffic
  bool any() const { return unfused_flops > 0 || instances > 0; }
};

// Unfused attention on one thread's sequence of leaf ops. The heuristic:
//   - The "score matrix" is the input of a softmax (or softmax backward) over the last dimension
//     of a tensor of rank >= 3: numel N, last two dims (Lq, Lk).
//   - A matmul matches it when one of its operands or its result has N elements and last two
//     dims {Lq, Lk} (either order; bmm shapes [B*H, L, L] match a [B, H, L, L] softmax).
//   - Matching matmuls among the last 4 since the previous softmax precede it (QK^T; in backward
//     dP = dO V^T and dV = P^T dO); matching matmuls among the next 4 follow it (PV; in backward
//     dQ = dS K and dK = dS^T Q).
//   - With at least one matching matmul before and one after, the softmax is an unfused attention:
//     all the matching matmuls' FLOPs count as unfused attention (each matmul once). A forward
//     softmax counts one instance. Score-matrix traffic is estimated as N x element size x 4
//     passes (forward: QK^T writes S, softmax reads S and writes P, PV reads P) or x 7 (backward).
//   - Found while aten::scaled_dot_product_attention is open on the thread: its math fallback.
// Fused SDPA ops never reach the detector. Recomputed ops are not fed to it.
class AttentionDetector {
 public:
  AttentionDelta on_matmul(const MatmulShapes& shapes, double flops);
  AttentionDelta on_softmax(const Shape& matrix, int64_t element_bytes, bool backward,
                            bool inside_sdpa);
  void reset();

  static constexpr int kWindow = 4;

 private:
  struct Recent {
    MatmulShapes shapes;
    double flops = 0;
    bool attributed = false;
  };
  struct Pending {
    int64_t numel = 0, lq = 0, lk = 0;
    int matmuls_left = 0;
    bool confirmed = false;
    bool backward = false;
    bool inside_sdpa = false;
    double bytes = 0;
    std::vector<size_t> before;  // indices into recent_before_
  };
  bool matches(const Shape& s, const Pending& p) const;
  AttentionDelta confirm(Pending& p);
  std::vector<Recent> recent_;         // since the last softmax, at most kWindow
  std::vector<double> recent_before_;  // FLOPs of the pending softmax's matching predecessors
  std::optional<Pending> pending_;
};

// Sums of the ops counted in a window (the hook serializes calls).
class FlopTally {
 public:
  // `module`: the innermost named module the op ran in ("" for none).
  void add(std::string_view op, OpKind kind, MathPrecision precision, double flops, bool recompute,
           std::string_view module = {});
  void add_attention(const AttentionDelta& delta);
  void add_unparsed() { ++unparsed_; }
  void clear();
  bool empty() const { return ops_.empty() && unparsed_ == 0; }
  // The window's per-step means over `steps` steps.
  StepFlops per_step(int64_t steps) const;

 private:
  struct Sum {
    double model = 0, calls = 0;
  };
  std::map<std::pair<std::string, MathPrecision>, Sum> ops_;
  std::map<std::string, Sum, std::less<>> modules_;
  PrecisionArray model_{}, hardware_{};
  double fused_ = 0;
  AttentionDelta attention_;
  int64_t unparsed_ = 0;
};

// Sums of several StepFlops (a window, an epoch), with their per-step mean.
class StepFlopsSum {
 public:
  void add(const StepFlops& s);
  int64_t steps() const { return steps_; }
  StepFlops mean() const;
  void clear() { *this = StepFlopsSum(); }

 private:
  int64_t steps_ = 0;
  StepFlops sum_;
  std::map<std::pair<std::string, MathPrecision>, OpFlops> ops_;
  std::map<std::string, OpFlops> modules_;
};

// When to count. The first window opens after `skip_steps` steps and counts `count_steps` steps;
// their mean is the count of every later step with the same samples per step (StepRecord::samples;
// up to 8 sample counts are remembered). A step whose samples have no count opens a new window at
// the next step (no skip); so does every `recount_every_steps`-th step (if > 0), and recount().
// A counted step gets its own count. A window whose steps' samples differ restarts.
class FlopWindowPlanner {
 public:
  explicit FlopWindowPlanner(const FlopConfig& config);
  // At a step's start: count this step's ops?
  bool begin_step();
  // At a step's end, with the step's own count if it was counted. Returns the count that applies
  // to the step, or null (no count yet for its samples).
  const StepFlops* end_step(int64_t samples, const StepFlops* counted);
  void recount();
  // A window is open, or opens with the next step.
  bool counting() const { return state_ == State::kCounting; }
  // Windows completed so far.
  int64_t windows() const { return windows_; }
  const StepFlops* count_for(int64_t samples) const;

  static constexpr size_t kMaxCached = 8;

 private:
  enum class State { kSkipping, kCounting, kIdle };
  void store(int64_t samples, StepFlops count);
  FlopConfig config_;
  State state_;
  bool step_counted_ = false;  // the current step was opened as counted
  int64_t steps_ = 0;          // steps ended
  int64_t since_window_ = 0;   // steps ended since the last window completed
  int64_t window_samples_ = 0;
  std::optional<int64_t> window_target_;  // the window counts this sample count (new shapes)
  StepFlopsSum window_;
  int64_t windows_ = 0;
  StepFlops last_counted_;
  std::vector<std::pair<int64_t, StepFlops>> cache_;  // most recent first
};

// An epoch's steps -> FlopEpochStats.
class FlopEpochAccumulator {
 public:
  // count: the step's count (null: unknown); counted: its ops were counted (callbacks on).
  void add_step(const StepFlops* count, double step_seconds, bool counted);
  FlopEpochStats summarize(const DevicePeak& peak) const;
  void clear() { *this = FlopEpochAccumulator(); }

  static constexpr size_t kTopOps = 10;
  static constexpr size_t kTopModules = 32;

 private:
  int64_t counted_steps_ = 0;
  StepFlopsSum known_;  // steps with a count
  double known_seconds_ = 0;
  PrecisionArray steady_model_{}, steady_hardware_{};  // steps with a count, not counted
  double steady_seconds_ = 0;
  int64_t steady_steps_ = 0;
  PrecisionArray window_model_{}, window_hardware_{};  // counted steps
  double window_seconds_ = 0;
};

// Fills a step record's FLOP fields from its count (NaN without one).
void fill_step_flops(StepRecord& record, const StepFlops* count, const DevicePeak& peak);

// One line to the log, for hooks/flop_counter.cpp: LibTorch 2.x bundles a newer fmt than the
// system spdlog's, so that file cannot include spdlog next to ATen.
enum class FlopLogLevel { kDebug, kInfo, kWarn, kError };
void flop_log(spdlog::logger& logger, FlopLogLevel level, const std::string& message);

}  // namespace torchpilot
