// GPU memory under pressure: the "memory" section (MemoryEpochStats) and the memory_pressure
// advisor on planted allocator figures.
#include <gtest/gtest.h>

#include <string>

#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/gpu/gpu_records.h"
#include "torchpilot/runtime/memory/memory_records.h"

namespace torchpilot {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

EpochSummary with_memory(int64_t allocated, int64_t reserved, int64_t retries = 0,
                         int64_t ooms = 0) {
  MemoryEpochStats m;
  m.capacity_bytes = 80 * kGiB;
  m.peak_allocated_bytes = allocated;
  m.peak_reserved_bytes = reserved;
  m.reserved_bytes = reserved;
  m.alloc_retries = retries;
  m.ooms = ooms;
  EpochSummary s;
  s.steps = 10;
  s.sections.set(m);
  return s;
}

TEST(MemoryPressure, QuietWithRoomAndWithoutTheSection) {
  EXPECT_FALSE(advise_memory_pressure(with_memory(40 * kGiB, 50 * kGiB), AdvisorsConfig{}));
  EXPECT_FALSE(advise_memory_pressure(EpochSummary{}, AdvisorsConfig{}));
}

TEST(MemoryPressure, TensorsFillingTheDeviceAskForLessActivationMemory) {
  auto a = advise_memory_pressure(with_memory(74 * kGiB, 76 * kGiB), AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->severity, Severity::kWarning);
  EXPECT_NE(a->finding.find("peak reserved 76.00 GiB (95.0% of 80.00 GiB), peak allocated "
                            "74.00 GiB (92.5%)"),
            std::string::npos)
      << a->finding;
  EXPECT_NE(a->action.find("activation checkpointing"), std::string::npos) << a->action;
  EXPECT_EQ(a->action.find("expandable_segments"), std::string::npos) << a->action;
  EXPECT_FALSE(a->gain_estimated);
}

TEST(MemoryPressure, RetriesWithALargeSlackAreFragmentation) {
  // 20 GiB cached but not allocated at the peak, and the allocator had to retry: high.
  auto a = advise_memory_pressure(with_memory(50 * kGiB, 70 * kGiB, 12), AdvisorsConfig{});
  ASSERT_TRUE(a.has_value()) << "retries are pressure below the threshold too";
  EXPECT_EQ(a->severity, Severity::kHigh);
  EXPECT_NE(a->finding.find("12 allocations failed and were retried"), std::string::npos);
  EXPECT_NE(a->cause.find("20.00 GiB (28.6% of the reserved memory)"), std::string::npos)
      << a->cause;
  EXPECT_NE(a->action.find("expandable_segments:True"), std::string::npos) << a->action;
  EXPECT_NE(a->action.find("each retry frees the allocator's cache"), std::string::npos);
}

TEST(SmallMicroBatch, LaunchBoundWithRoomInMemory) {
  EpochSummary s = with_memory(10 * kGiB, 12 * kGiB);  // 12.5% of 80 GiB
  GpuEpochStats g;
  g.traced_steps = 4;
  g.stats.traced_ns = 400000000;
  g.stats.idle_launch_gap_ns = 200000000;  // half the traced time between kernels
  s.sections.set(g);
  auto a = advise_small_micro_batch(s, AdvisorsConfig{});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->severity, Severity::kInfo);
  // 0.9 x 80 GiB = 72 GiB holds 7 x 10 GiB.
  EXPECT_NE(a->finding.find("memory allows a 7x larger micro-batch (peak allocated 10.00 GiB, "
                            "12.5% of 80.00 GiB) while the GPU idles 50.0%"),
            std::string::npos)
      << a->finding;
  EXPECT_FALSE(a->gain_estimated);
  // Not launch-bound, or no room for twice the peak, or the allocator retrying: quiet.
  g.stats.idle_launch_gap_ns = 10000000;
  s.sections.set(g);
  EXPECT_FALSE(advise_small_micro_batch(s, AdvisorsConfig{}));
  g.stats.idle_launch_gap_ns = 200000000;
  s.sections.set(g);
  EXPECT_FALSE(advise_small_micro_batch(with_memory(40 * kGiB, 44 * kGiB), AdvisorsConfig{}));
  EpochSummary retrying = with_memory(10 * kGiB, 12 * kGiB, 3);
  retrying.sections.set(g);
  EXPECT_FALSE(advise_small_micro_batch(retrying, AdvisorsConfig{}));
}

TEST(MemoryPressure, TheSectionSaysItsFigures) {
  MemoryEpochStats m;
  m.device = 1;
  m.capacity_bytes = 80 * kGiB;
  m.peak_allocated_bytes = 40 * kGiB;
  m.peak_reserved_bytes = 48 * kGiB;
  m.ooms = 1;
  EXPECT_EQ(m.slack_bytes(), 8 * kGiB);
  std::vector<std::string> lines;
  section_text(m, EpochSummary{}, lines);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "  memory (GPU 1): peak allocated 40.00 GiB (50.0% of 80.0 GiB), peak reserved 48.00 "
            "GiB (60.0%), 8.00 GiB reserved but not allocated at the peak; 0 allocator retries, "
            "1 OOMs");
  const std::string json = section_json(m);
  EXPECT_NE(json.find("\"slack_bytes\":8589934592"), std::string::npos) << json;
  EXPECT_NE(json.find("\"ooms\":1"), std::string::npos) << json;
}

}  // namespace
}  // namespace torchpilot
