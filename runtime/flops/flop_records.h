// Vendor-neutral FLOP records (docs/metrics.md, "MFU"): what the FLOP counter (hooks/flop_counter)
// counted from the ops a step ran, and the MFU/HFU derived from it. Plain values; NaN = unknown.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

// The arithmetic a matmul-like op ran in; decides which peak FLOP/s it is held against.
enum class MathPrecision { kFp32, kTf32, kBf16, kFp16, kFp8, kFp64, kOther };
const char* to_string(MathPrecision precision);
constexpr int kMathPrecisions = 7;

// One op (by name and precision) in the counted steps.
struct OpFlops {
  std::string op;  // e.g. "aten::mm"
  MathPrecision precision = MathPrecision::kOther;
  double flops_per_step = 0;
  double calls_per_step = 0;
};

// The epoch summary's "flops" section.
struct FlopEpochStats {
  static constexpr const char* kSectionName = "flops";
  std::string device;         // the GPU the peak is for; empty on CPU
  int64_t counted_steps = 0;  // steps whose ops were counted (the counting windows)
  // Per step, from the counting windows (mean). model: recomputation excluded; hardware: included.
  double model_flops_per_step = 0;
  double hardware_flops_per_step = 0;
  double model_flops_by_precision[kMathPrecisions] = {};  // index: MathPrecision
  // Over the epoch's steps: counted FLOPs per step x steps / wall time.
  double achieved_flops_per_s = 0;
  // MFU = time the model FLOPs take at the peak of their precision / step time; HFU likewise with
  // hardware FLOPs. NaN without a peak (CPU, unknown GPU without flops.peak_tflops).
  double mfu = kNotMeasured;
  double hfu = kNotMeasured;
  double peak_flops_per_s = kNotMeasured;  // of the dominant precision
  MathPrecision dominant_precision = MathPrecision::kOther;
  // MFU against the device's best dense peak for a model's work (bf16 or fp16 tensor cores,
  // whichever is higher): the peak the precision advice means. Equal to mfu for a model that
  // already runs in that precision; far below it for an fp32 model. NaN without that peak.
  double mfu_best_peak = kNotMeasured;
  MathPrecision best_peak_precision = MathPrecision::kOther;
  std::string peak_source;  // "table: NVIDIA H200 bf16 dense", "config", "measured"
  // Attention: softmax between two batched matmuls (unfused) vs scaled_dot_product_attention.
  double unfused_attention_flops_per_step = 0;
  int64_t unfused_attention_per_step = 0;
  double fused_attention_flops_per_step = 0;
  std::vector<OpFlops> top_ops;  // by FLOPs, largest first
  // Model FLOPs by named module (torchpilot::ModuleScope; `op` holds the name, "" = outside any
  // named module), largest first. Backward ops count for the module whose forward op made them.
  std::vector<OpFlops> modules;
  // --- added with the FLOP counter (runtime/flops/flop_*.h) ---
  int64_t steps_with_count = 0;  // steps of the epoch that had a FLOP count (the rest: NaN)
  double hardware_flops_by_precision[kMathPrecisions] = {};
  // Peaks per precision (FLOP/s): what MFU used (flops.peak_tflops sets them all), and the
  // device table's datasheet figures (NaN: unknown device or precision). DRAM: bytes/s.
  double peak_flops_by_precision[kMathPrecisions] = {kNotMeasured, kNotMeasured, kNotMeasured,
                                                     kNotMeasured, kNotMeasured, kNotMeasured,
                                                     kNotMeasured};
  double datasheet_flops_by_precision[kMathPrecisions] = {kNotMeasured, kNotMeasured, kNotMeasured,
                                                          kNotMeasured, kNotMeasured, kNotMeasured,
                                                          kNotMeasured};
  double dram_bytes_per_s = kNotMeasured;
  // Unfused attentions found inside scaled_dot_product_attention (its math fallback), per step.
  double sdpa_math_fallback_per_step = 0;
  // Estimated DRAM traffic of the unfused attentions' score matrices per step (bytes): what a
  // fused kernel would not move (attention_detector.h).
  double unfused_attention_traffic_bytes_per_step = 0;
  int64_t unparsed_calls = 0;  // calls of counted ops whose arguments could not be read
};

std::string section_json(const FlopEpochStats& flops);
// "MFU 35.1% (HFU 36.0%)"; where the model's precision is not the device's best dense one,
// "MFU 4.9% of the bf16 dense peak (73.1% of the fp32 peak; HFU 73.1%)".
std::string mfu_text(const FlopEpochStats& flops);
// The FLOPs and per-module lines; the MFU goes on the GPU line when the epoch has a GPU section,
// else on a line of its own.
void section_text(const FlopEpochStats& flops, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

}  // namespace torchpilot
