// Peak FLOP/s and MFU without LibTorch (docs/metrics.md, "MFU and FLOPs"): the dense datasheet
// peaks of known GPUs (device_table), the peak MFU is held against (resolve_peak: the table row
// or flops.peak_tflops), and MFU/HFU from FLOPs by precision and time.
//
// Thread-safety: plain values and pure functions; device_table() is built once, on first use,
// and read-only after that; safe from any thread.
// Failure behaviour: nothing here throws; an unknown device has no peak (DevicePeak::any() is
// false) and MFU without a peak or time is NaN.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "torchpilot/runtime/flops/flop_records.h"

namespace torchpilot {

using PrecisionArray = std::array<double, kMathPrecisions>;  // index: MathPrecision

// ---- peaks
// ---------------------------------------------------------------------------------------

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

// Achieved fractions of the datasheet peaks, by GPU generation: what the advisors' gain models
// predict a replacement kernel at (docs/metrics.md, "Calibration"). Matched like the device table.
struct Calibration {
  double gemm;             // a large bf16/fp16/TF32 GEMM (cuBLAS) / the datasheet peak
  double fused_attention;  // fused attention forward + backward / the datasheet peak
  std::string source;      // where the figures come from
  // Host-to-device copies from pinned memory, bytes/s (the host link as the GPU is usually
  // attached): what a pageable copy takes once pinned.
  double h2d_pinned_bytes_per_s = 12e9;
};
Calibration calibration(std::string_view device_name);

// ---- MFU
// -----------------------------------------------------------------------------------------

// The precision with the most FLOPs (kOther only when nothing else ran).
MathPrecision dominant_precision(const PrecisionArray& flops);
// Seconds the FLOPs take at the peak of their precision; FLOPs of a precision without a peak
// (kOther, or fp8 on an A100) are held against the dominant precision's peak. NaN when that has
// no peak either, 0 for no FLOPs.
double time_at_peak(const PrecisionArray& flops, const DevicePeak& peak);
// time_at_peak / seconds: MFU for model FLOPs, HFU for hardware FLOPs. NaN without a peak or time.
double utilization(const PrecisionArray& flops, const DevicePeak& peak, double seconds);
// The device's best dense peak for a model's work: bf16 or fp16, whichever is higher (kOther when
// neither is known).
MathPrecision best_dense_precision(const DevicePeak& peak);
// All the FLOPs at best_dense_precision's peak / seconds. NaN without that peak or time.
double utilization_at_best_peak(const PrecisionArray& flops, const DevicePeak& peak,
                                double seconds);

}  // namespace torchpilot
