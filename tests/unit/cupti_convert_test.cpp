// The GPU collectors' pure functions on real CUPTI record structs: activity records -> kernels,
// copies, syncs (steady-clock times, NCCL detection, demangling); PM sample values -> PmSample;
// the CUPTI clock offset; buffer sizing; PM failure reasons.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "fakes/cupti_records.h"
#include "torchpilot/hooks/gpu/cupti_activity_trace.h"
#include "torchpilot/hooks/gpu/cupti_api.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace detail {
namespace {

constexpr int64_t kOffset = 1'700'000'000'000'000'000;  // CUPTI (CLOCK_REALTIME) - steady
const TimeBase kTb{kOffset};

// A kernel of 4 x 3 x 2 blocks of 128 x 2 threads on stream 7.
CUpti_ActivityKernel10 kernel(const char* name, uint64_t start, uint64_t end) {
  CUpti_ActivityKernel10 k = test::cupti_kernel(start, end, name, 4, 128);
  k.gridY = 3;
  k.gridZ = 2;
  k.blockY = 2;
  k.streamId = 7;
  return k;
}

TEST(CuptiConvert, KernelGridNameAndSteadyTimes) {
  const auto k = kernel("_Z9my_kernelILi4EN2at4HalfEEvPT0_i", kOffset + 1000, kOffset + 5000);
  const auto r = to_kernel(k, kTb);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->begin, 1000);
  EXPECT_EQ(r->end, 5000);
  EXPECT_EQ(r->blocks, 24);
  EXPECT_EQ(r->block_threads, 256);
  EXPECT_EQ(r->stream, 7u);
  EXPECT_EQ(r->name, "void my_kernel<4, at::Half>(at::Half*, int)");
  EXPECT_FALSE(r->communication);
}

TEST(CuptiConvert, KernelLargeGridDoesNotOverflow) {
  auto k = kernel("k", kOffset + 1, kOffset + 2);
  k.gridX = 2'000'000'000;
  k.gridY = 4;
  k.gridZ = 1;
  EXPECT_EQ(to_kernel(k, kTb)->blocks, 8'000'000'000LL);
}

TEST(CuptiConvert, NcclKernelsAreCommunication) {
  const auto mangled = kernel("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL11ncclDevComm",
                              kOffset + 10, kOffset + 20);
  const auto r = to_kernel(mangled, kTb);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->name, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm)");
  EXPECT_TRUE(r->communication);
  EXPECT_TRUE(is_communication_kernel("NCCLKernel_Broadcast"));
  EXPECT_TRUE(is_communication_kernel("void at::native::Nccl_copy()"));
  EXPECT_FALSE(is_communication_kernel("ampere_bf16_s16816gemm_bf16_128x64_ldg8"));
  EXPECT_FALSE(is_communication_kernel("ncc"));
  EXPECT_TRUE(is_communication_kernel(
      "__nv_static_32__b4148644_10_onerank_cu_fdf47990__ZN43_GLOBAL__N__b4148644_10_onerank_cu_"
      "fdf4799013oneRankReduceI13FuncPreMulSumIfEEEvPvS3_mmb"));
}

TEST(CuptiConvert, DemangleFallsBackToTheRawName) {
  EXPECT_EQ(demangle("volta_sgemm_128x64_nn"), "volta_sgemm_128x64_nn");
  EXPECT_EQ(demangle("_Zinvalid!!"), "_Zinvalid!!");
  EXPECT_EQ(demangle(nullptr), "<unknown>");
  DemangleCache cache(2);
  EXPECT_EQ(cache.get("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL11ncclDevComm"),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm)");
  EXPECT_EQ(cache.get("plain"), "plain");
  EXPECT_EQ(cache.get("_Z9my_kernelILi4EN2at4HalfEEvPT0_i"),  // evicts (bounded), still right
            "void my_kernel<4, at::Half>(at::Half*, int)");
  EXPECT_EQ(cache.get("plain"), "plain");
}

TEST(CuptiConvert, KernelWithoutTimestampsIsSkipped) {
  EXPECT_FALSE(to_kernel(kernel("k", 0, kOffset + 5), kTb).has_value());
  EXPECT_FALSE(to_kernel(kernel("k", kOffset + 5, 0), kTb).has_value());
  EXPECT_FALSE(to_kernel(kernel("k", kOffset + 9, kOffset + 5), kTb).has_value());
}

// A copy of 1 MiB over [100, 900] (steady).
CUpti_ActivityMemcpy6 memcpy_record(uint8_t copy_kind, uint8_t src, uint8_t dst) {
  return test::cupti_memcpy(copy_kind, src, dst, 1 << 20, kOffset + 100, kOffset + 900);
}

TEST(CuptiConvert, MemcpyPageableHostToDevice) {
  const auto r =
      to_copy(memcpy_record(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
                            CUPTI_ACTIVITY_MEMORY_KIND_DEVICE),
              kTb);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, CopyKind::kHostToDevice);
  EXPECT_TRUE(r->pageable);
  EXPECT_FALSE(r->memset);
  EXPECT_EQ(r->bytes, 1 << 20);
  EXPECT_EQ(r->begin, 100);
  EXPECT_EQ(r->end, 900);
}

TEST(CuptiConvert, MemcpyPinnedAndDeviceSides) {
  // Pinned H2D, D2H (the host side is the destination: pageable), D2D.
  struct Case {
    uint8_t copy_kind, src, dst;
    CopyKind kind;
    bool pageable;
  };
  for (const Case& c :
       {Case{CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PINNED,
             CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, CopyKind::kHostToDevice, false},
        Case{CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
             CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE, CopyKind::kDeviceToHost, true},
        Case{CUPTI_ACTIVITY_MEMCPY_KIND_DTOD, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
             CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, CopyKind::kDeviceToDevice, false}}) {
    SCOPED_TRACE("copy kind " + std::to_string(c.copy_kind) + " from " + std::to_string(c.src) +
                 " to " + std::to_string(c.dst));
    const auto r = to_copy(memcpy_record(c.copy_kind, c.src, c.dst), kTb);
    EXPECT_EQ(r->kind, c.kind);
    EXPECT_EQ(r->pageable, c.pageable);
  }
  EXPECT_EQ(to_copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_HTOA), CopyKind::kHostToDevice);
  EXPECT_EQ(to_copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_ATOH), CopyKind::kDeviceToHost);
  EXPECT_EQ(to_copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_PTOP), CopyKind::kDeviceToDevice);
  EXPECT_EQ(to_copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_HTOH), CopyKind::kOther);
  EXPECT_EQ(to_copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN), CopyKind::kOther);
}

TEST(CuptiConvert, Memset) {
  CUpti_ActivityMemset4 m;
  std::memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  m.bytes = 4096;
  m.start = kOffset + 50;
  m.end = kOffset + 60;
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  const auto r = to_memset(m, kTb);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->memset);
  EXPECT_EQ(r->kind, CopyKind::kOther);
  EXPECT_EQ(r->bytes, 4096);
  EXPECT_EQ(r->begin, 50);
  EXPECT_EQ(r->end, 60);
  EXPECT_FALSE(r->pageable);
}

CUpti_ActivitySynchronization2 sync_record(CUpti_ActivitySynchronizationType type) {
  CUpti_ActivitySynchronization2 s;
  std::memset(&s, 0, sizeof s);
  s.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
  s.type = type;
  s.start = kOffset + 3000;
  s.end = kOffset + 8000;
  return s;
}

TEST(CuptiConvert, HostSynchronization) {
  const std::pair<CUpti_ActivitySynchronizationType, SyncApi> types[] = {
      {CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE, SyncApi::kEventSynchronize},
      {CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE, SyncApi::kStreamSynchronize},
      {CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE, SyncApi::kDeviceSynchronize},
      {CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN, SyncApi::kUnknown}};
  for (const auto& [type, api] : types) {
    const auto r = to_sync(sync_record(type), kTb);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->begin, 3000);
    EXPECT_EQ(r->end, 8000);
    EXPECT_EQ(r->api, api) << to_string(api);
    EXPECT_TRUE(r->cause.empty());  // resolved per step, against the op scopes
  }
  EXPECT_STREQ(to_string(SyncApi::kDeviceSynchronize), "cudaDeviceSynchronize");
  // cudaStreamWaitEvent blocks a stream, not the host.
  EXPECT_FALSE(
      to_sync(sync_record(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT), kTb).has_value());
}

TEST(CuptiConvert, ConvertRecordDispatchesOnKind) {
  GpuEventBatch out;
  const auto k =
      kernel("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL11ncclDevComm", kOffset + 1, kOffset + 2);
  auto legacy = k;
  legacy.kind = CUPTI_ACTIVITY_KIND_KERNEL;
  const auto m = memcpy_record(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
                               CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
  CUpti_ActivityMemset4 ms;
  std::memset(&ms, 0, sizeof ms);
  ms.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  ms.start = kOffset + 1;
  ms.end = kOffset + 2;
  const auto s = sync_record(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE);
  CUpti_Activity other{};
  other.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  DemangleCache names;
  EXPECT_TRUE(convert_record(reinterpret_cast<const CUpti_Activity&>(k), kTb, out, &names));
  EXPECT_TRUE(convert_record(reinterpret_cast<const CUpti_Activity&>(legacy), kTb, out));
  EXPECT_TRUE(convert_record(reinterpret_cast<const CUpti_Activity&>(m), kTb, out));
  EXPECT_TRUE(convert_record(reinterpret_cast<const CUpti_Activity&>(ms), kTb, out));
  EXPECT_TRUE(convert_record(reinterpret_cast<const CUpti_Activity&>(s), kTb, out));
  EXPECT_FALSE(convert_record(other, kTb, out));
  ASSERT_EQ(out.kernels.size(), 2u);
  EXPECT_TRUE(out.kernels[0].communication);
  ASSERT_EQ(out.copies.size(), 2u);
  EXPECT_TRUE(out.copies[0].pageable);
  EXPECT_TRUE(out.copies[1].memset);
  EXPECT_EQ(out.syncs.size(), 1u);
}

TEST(CuptiClockOffset, MinLatencyPairWins) {
  // Steady reads: pairs (0,100), (200,210), (300,350), ...; CUPTI reads in between.
  const std::vector<Nanos> steady = {0, 100, 200, 210, 300, 350, 400, 480, 500, 590};
  const std::vector<uint64_t> cupti = {5'000'000, 5'000'300, 5'000'333, 5'000'444, 5'000'555};
  size_t si = 0, ci = 0;
  const ClockPair p = read_clock_pair([&] { return cupti[ci++]; }, [&] { return steady[si++]; }, 5);
  const Nanos latency = p.latency;
  const TimeBase tb = time_base_through(p, nullptr, 1.0);
  EXPECT_EQ(latency, 10);
  // The second pair: CUPTI 5'000'300 at steady 205.
  EXPECT_EQ(tb.offset_ns, 5'000'300 - 205);
  EXPECT_EQ(tb.to_steady(5'000'300), 205);
  EXPECT_EQ(si, 10u);
  EXPECT_EQ(ci, 5u);
}

TEST(CuptiClockOffset, RealSteadyClockIsMonotonicInOffsetTerms) {
  // With CUPTI's clock = steady + 1 s, the measured offset is 1 s within the read latency.
  const ClockPair p = read_clock_pair(
      [] { return static_cast<uint64_t>(steady_now_ns() + 1'000'000'000); }, steady_now_ns, 5);
  const Nanos latency = p.latency;
  const TimeBase tb = time_base_through(p, nullptr, 1.0);
  EXPECT_NEAR(static_cast<double>(tb.offset_ns), 1e9, static_cast<double>(latency) + 1000.0);
}

TEST(CuptiClockLine, NanosecondClockKeepsRateOne) {
  // 600 ppb apart over 50 ms (NTP's slewing): a nanosecond clock still.
  const ClockPair earlier{1'000'000, 0, 50};
  const ClockPair now{1'000'000 + 50'000'030, 50'000'000, 50};
  bool measured = false;
  const TimeBase tb = time_base_through(now, &earlier, 0.5, &measured);
  EXPECT_TRUE(measured);
  EXPECT_EQ(tb.scale, 1.0);
  EXPECT_EQ(tb.offset_ns, 1'000'030);
  EXPECT_EQ(tb.to_steady(now.cupti + 1'000'000'000), 1'050'000'000);
}

TEST(CuptiClockLine, TickClockGetsItsRate) {
  // Ticks of a 2.1 GHz host (PyTorch's profiler's timestamps), 50 ms apart.
  const ClockPair earlier{5'000, 0, 50};
  const ClockPair now{5'000 + 105'000'000, 50'000'000, 50};
  bool measured = false;
  const TimeBase tb = time_base_through(now, &earlier, 1.0, &measured);
  EXPECT_TRUE(measured);
  EXPECT_NEAR(tb.scale, 1 / 2.1, 1e-12);
  EXPECT_EQ(tb.to_steady(now.cupti), 50'000'000);
  EXPECT_NEAR(static_cast<double>(tb.to_steady(now.cupti + 2'100'000'000)), 1'050'000'000.0, 2.0);
  EXPECT_NEAR(static_cast<double>(tb.to_steady(earlier.cupti)), 0.0, 2.0);  // before the anchor
}

TEST(CuptiClockLine, NoUsableEarlierReadingKeepsTheFallbackRate) {
  const ClockPair now{2'000'000'000, 100'000'000, 50};
  bool measured = true;
  EXPECT_EQ(time_base_through(now, nullptr, 0.5, &measured).scale, 0.5);
  EXPECT_FALSE(measured);
  const ClockPair close{now.cupti - 500'000, now.steady - 500'000, 50};  // < 1 ms apart
  EXPECT_EQ(time_base_through(now, &close, 0.5, &measured).scale, 0.5);
  EXPECT_FALSE(measured);
  const ClockPair later_clock{now.cupti + 1, now.steady - 50'000'000, 50};  // went backwards
  EXPECT_EQ(time_base_through(now, &later_clock, 0.5, &measured).scale, 0.5);
  EXPECT_FALSE(measured);
  const ClockPair realtime{1'700'000'000'000'000'000, now.steady - 50'000'000, 50};
  EXPECT_EQ(time_base_through(now, &realtime, 1.0, &measured).scale, 1.0);  // another clock
  EXPECT_FALSE(measured);
  const ClockPair slow{now.cupti - 1'000, now.steady - 50'000'000, 50};  // 50 us a unit
  EXPECT_EQ(time_base_through(now, &slow, 1.0, &measured).scale, 1.0);
  EXPECT_FALSE(measured);
  // The offset is the newest reading's either way.
  EXPECT_EQ(time_base_through(now, nullptr, 0.5).offset_ns, 1'900'000'000);
}

TEST(PmSampleConvert, ValuesInMetricOrderBecomeFractions) {
  const auto metrics = pm_metric_tiers().front();
  ASSERT_EQ(metrics.size(), 7u);
  // gr, sm, tensor, dram, warps (percent), pcie read/write (bytes).
  const double values[] = {26.6, 24.65, 97.0, 64.0, 101.5, 1.5e6, 2.5e3};
  const PmSample s = to_pm_sample(metrics, values, kOffset + 2'000'000, kOffset + 4'000'000, kTb);
  EXPECT_EQ(s.begin, 2'000'000);
  EXPECT_EQ(s.end, 4'000'000);
  EXPECT_DOUBLE_EQ(s.counter_utilization, 0.266);
  EXPECT_DOUBLE_EQ(s.sm_efficiency, 0.2465);
  EXPECT_DOUBLE_EQ(s.tensor_activity, 0.97);
  EXPECT_DOUBLE_EQ(s.dram_throughput, 0.64);
  EXPECT_DOUBLE_EQ(s.achieved_occupancy, 1.0);  // clamped
  EXPECT_DOUBLE_EQ(s.pcie_read_bytes, 1.5e6);
  EXPECT_DOUBLE_EQ(s.pcie_write_bytes, 2.5e3);
}

TEST(PmSampleConvert, MissingMetricsStayNaN) {
  const std::vector<PmMetric> metrics = {PmMetric::kSmEfficiency, PmMetric::kCounterUtilization};
  const double values[] = {50.0, std::nan("")};
  const PmSample s = to_pm_sample(metrics, values, kOffset, kOffset + 1, kTb);
  EXPECT_DOUBLE_EQ(s.sm_efficiency, 0.5);
  EXPECT_TRUE(std::isnan(s.counter_utilization));  // evaluated as NaN
  EXPECT_TRUE(std::isnan(s.tensor_activity));      // not in the set
  EXPECT_TRUE(std::isnan(s.pcie_read_bytes));
  const double negative[] = {-3.0, 0.0};
  EXPECT_DOUBLE_EQ(to_pm_sample(metrics, negative, kOffset, kOffset + 1, kTb).sm_efficiency, 0.0);
}

TEST(PmSampleConvert, MetricTiersDropPcieThenAllButSmAndGr) {
  const auto tiers = pm_metric_tiers();
  ASSERT_EQ(tiers.size(), 3u);
  EXPECT_EQ(tiers[1].size(), 5u);
  for (auto m : tiers[1]) EXPECT_TRUE(pm_metric_is_percent(m));
  EXPECT_EQ(tiers[2],
            (std::vector<PmMetric>{PmMetric::kCounterUtilization, PmMetric::kSmEfficiency}));
  EXPECT_STREQ(pm_metric_name(PmMetric::kTensorActivity),
               "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed");
  EXPECT_STREQ(pm_metric_name(PmMetric::kPcieReadBytes), "pcie__read_bytes.sum");
}

TEST(ActivityBuffers, SizesFollowTraceBufferMb) {
  auto o = activity_options(32);
  EXPECT_EQ(o.buffer_bytes, 4u << 20);
  EXPECT_EQ(o.max_buffers, 8u);
  o = activity_options(1);
  EXPECT_EQ(o.buffer_bytes, 1u << 20);
  EXPECT_EQ(o.max_buffers, 1u);
  o = activity_options(6);
  EXPECT_EQ(o.buffer_bytes, 4u << 20);
  EXPECT_EQ(o.max_buffers, 1u);
  o = activity_options(0);
  EXPECT_EQ(o.max_buffers, 1u);
}

TEST(ActivityRecords, StructsAreEightByteMultiples) {
  // CUPTI packs records at 8-byte alignment; the collector reads them in place.
  EXPECT_EQ(sizeof(CUpti_ActivityKernel10) % 8, 0u);
  EXPECT_EQ(sizeof(CUpti_ActivityMemcpy6) % 8, 0u);
  EXPECT_EQ(sizeof(CUpti_ActivityMemset4) % 8, 0u);
  EXPECT_EQ(sizeof(CUpti_ActivitySynchronization2) % 8, 0u);
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
