#include "torchpilot/runtime/flops/flop_records.h"

#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace torchpilot {

const char* to_string(MathPrecision precision) {
  static constexpr const char* kNames[] = {"fp32", "tf32", "bf16", "fp16", "fp8", "fp64", "other"};
  static_assert(std::size(kNames) == kMathPrecisions);
  return detail::enum_name(precision, kNames, "other");
}

namespace {
using namespace detail;
}  // namespace

std::string section_json(const FlopEpochStats& f) {
  json ops = json::array();
  for (const auto& o : f.top_ops) {
    ops.push_back({{"op", o.op},
                   {"precision", to_string(o.precision)},
                   {"flops_per_step", o.flops_per_step},
                   {"calls_per_step", o.calls_per_step}});
  }
  json modules = json::array();
  for (const auto& m : f.modules) {
    modules.push_back({{"module", m.op}, {"flops_per_step", m.flops_per_step}});
  }
  json by = json::object();
  for (int i = 0; i < kMathPrecisions; ++i) {
    if (f.model_flops_by_precision[i] > 0) {
      by[to_string(static_cast<MathPrecision>(i))] = f.model_flops_by_precision[i];
    }
  }
  return dump(json{{"device", f.device},
                   {"counted_steps", f.counted_steps},
                   {"model_flops_per_step", f.model_flops_per_step},
                   {"hardware_flops_per_step", f.hardware_flops_per_step},
                   {"model_flops_by_precision", by},
                   {"achieved_flops_per_s", f.achieved_flops_per_s},
                   {"mfu", number(f.mfu)},
                   {"mfu_best_peak", number(f.mfu_best_peak)},
                   {"best_peak_precision", to_string(f.best_peak_precision)},
                   {"hfu", number(f.hfu)},
                   {"peak_flops_per_s", number(f.peak_flops_per_s)},
                   {"dominant_precision", to_string(f.dominant_precision)},
                   {"peak_source", f.peak_source},
                   {"unfused_attention_flops_per_step", f.unfused_attention_flops_per_step},
                   {"unfused_attention_per_step", f.unfused_attention_per_step},
                   {"fused_attention_flops_per_step", f.fused_attention_flops_per_step},
                   {"top_ops", ops},
                   {"modules", modules}});
}

std::string mfu_text(const FlopEpochStats& f) {
  const bool other_peak = measured(f.mfu_best_peak) && measured(f.mfu) &&
                          f.best_peak_precision != MathPrecision::kOther &&
                          f.dominant_precision != f.best_peak_precision &&
                          std::abs(f.mfu_best_peak - f.mfu) > 0.0005;
  if (!other_peak) return "MFU " + fmt_opt_pct(f.mfu) + " (HFU " + fmt_opt_pct(f.hfu) + ")";
  return "MFU " + fmt_pct(f.mfu_best_peak) + " of the " + to_string(f.best_peak_precision) +
         " dense peak (" + fmt_pct(f.mfu) + " of the " + to_string(f.dominant_precision) +
         " peak; HFU " + fmt_opt_pct(f.hfu) + ")";
}

void section_text(const FlopEpochStats& flops, const EpochSummary& s,
                  std::vector<std::string>& lines) {
  // With a GPU section the MFU sits on its line, beside utilization and SM efficiency.
  if (s.sections.get<GpuEpochStats>() == nullptr) {
    lines.push_back("  GPU " + mfu_text(flops));
  }
  if (flops.counted_steps > 0) {
    const FlopEpochStats& f = flops;
    lines.push_back(
        "  FLOPs: " + fmt_num(f.model_flops_per_step / 1e12) + " TFLOP/step model, " +
        fmt_num(f.hardware_flops_per_step / 1e12) + " hardware; achieved " +
        fmt_num(f.achieved_flops_per_s / 1e12) + " TFLOP/s" +
        (measured(f.peak_flops_per_s)
             ? " of " + fmt_num(f.peak_flops_per_s / 1e12) + " peak (" + f.peak_source + ")"
             : std::string(" (no peak known for this device)")));
    if (!f.modules.empty() && f.model_flops_per_step > 0) {
      constexpr size_t kShown = 8;
      std::string line = "  FLOPs by module:";
      for (size_t i = 0; i < f.modules.size() && i < kShown; ++i) {
        line += std::string(i == 0 ? " " : ", ") +
                (f.modules[i].op.empty() ? std::string("(unnamed)") : f.modules[i].op) + " " +
                fmt_pct(f.modules[i].flops_per_step / f.model_flops_per_step);
      }
      if (f.modules.size() > kShown) line += ", ...";
      lines.push_back(line);
    }
  }
}

}  // namespace torchpilot
