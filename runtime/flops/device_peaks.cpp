// The device table, peak resolution and MFU/HFU (device_peaks.h).
#include "torchpilot/runtime/flops/device_peaks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

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

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

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

Calibration calibration(std::string_view device_name) {
  const std::string n = lower(device_name);
  auto any = [&](std::initializer_list<const char*> words) {
    for (const char* w : words) {
      if (n.find(w) != std::string::npos) return true;
    }
    return false;
  };
  // Hopper: a large bf16 GEMM reaches about 790 of 989.5 TFLOP/s on the H200 (docs/metrics.md,
  // "Peaks"); FlashAttention-2 reaches 35-40% of the peak on the H100 and cuDNN's
  // or FlashAttention-3's fused attention 55-75% (their papers): 0.4 sits at the library PyTorch
  // picks most often.
  // Pinned host-to-device copies: PCIe Gen5 x16 on Hopper, 49 GB/s measured on an H100 SXM
  // (bench/planted_pairs.cpp, pageable_copies fixed form: 38.5 MB in 0.785 ms per step); Gen4 x16
  // on Ampere, about half; unknown: Gen3 x16's 12 GB/s, the slowest link in use.
  if (any({"h100", "h200", "gh200", "h800"})) {
    return {0.8, 0.4,
            "Hopper: bf16 GEMM 790/989.5 TFLOP/s measured on an H200; fused attention "
            "as FlashAttention-2",
            49e9};
  }
  // Ampere: cuBLAS ~250 of 312 TFLOP/s; FlashAttention-2 50-73% forward, ~60% with backward.
  if (any({"a100", "a800", "a30", "a10"})) {
    return {0.8, 0.5, "Ampere: cuBLAS and FlashAttention-2 published figures", 24e9};
  }
  if (any({"b200", "gb200", "b100"})) {
    return {0.75, 0.45, "Blackwell: assumed (not measured here)", 49e9};
  }
  return {0.7, 0.4, "assumed: GPU generation not in the calibration table", 12e9};
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

MathPrecision best_dense_precision(const DevicePeak& peak) {
  const double bf16 = peak.flops_per_s[static_cast<size_t>(MathPrecision::kBf16)];
  const double fp16 = peak.flops_per_s[static_cast<size_t>(MathPrecision::kFp16)];
  if (!(bf16 > 0) && !(fp16 > 0)) return MathPrecision::kOther;
  return fp16 > 0 && !(fp16 <= bf16) ? MathPrecision::kFp16 : MathPrecision::kBf16;
}

double utilization_at_best_peak(const PrecisionArray& flops, const DevicePeak& peak,
                                double seconds) {
  const MathPrecision best = best_dense_precision(peak);
  if (best == MathPrecision::kOther || !(seconds > 0)) return kNaN;
  double total = 0;
  for (double f : flops) total += f;
  return total / peak.flops_per_s[static_cast<size_t>(best)] / seconds;
}

}  // namespace torchpilot
