// The peak table, peak resolution and the MFU/HFU math (runtime/flops/device_peaks.cpp).
#include "torchpilot/runtime/flops/device_peaks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

namespace torchpilot {
namespace {

constexpr size_t P(MathPrecision p) { return static_cast<size_t>(p); }

// ---- peaks --------------------------------------------------------------------------------------

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

// ---- MFU ----------------------------------------------------------------------------------------

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

}  // namespace
}  // namespace torchpilot
