// Host syncs by cause and the idle partition (one cause per idle second) on synthetic timelines;
// the op-scope hand-over (HostOpScopes), the monitor naming call sites and phases, the host-sync
// and pageable-copy advisors, and the cap on idle-cause gains.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "advice_test_util.h"
#include "fakes/gpu_monitor_rig.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/core/pilot.h"
#include "torchpilot/runtime/core/sink.h"
#include "torchpilot/runtime/gpu/gpu_monitor.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"
#include "torchpilot/runtime/gpu/host_op_scopes.h"
#include "torchpilot/runtime/stalls/step_outliers.h"

namespace torchpilot {
namespace {

KernelRecord kernel(Nanos b, Nanos e) {
  KernelRecord k;
  k.begin = b;
  k.end = e;
  k.blocks = 1000;
  k.name = "k";
  return k;
}

SyncRecord sync(Nanos b, Nanos e, SyncApi api = SyncApi::kStreamSynchronize) {
  SyncRecord s;
  s.begin = b;
  s.end = e;
  s.api = api;
  return s;
}

// A copy of 1 MiB.
CopyRecord copy(Nanos b, Nanos e, CopyKind kind, bool pageable) {
  return test::copy_record(b, e, 1 << 20, kind, pageable);
}

// A sync's [begin, end], to compare with an expected one.
std::pair<Nanos, Nanos> span_of(const SyncRecord& r) { return {r.begin, r.end}; }

HostOpScope scope(Nanos b, Nanos e, std::string op, bool always = true, std::string phase = "") {
  HostOpScope s;
  s.begin = b;
  s.end = e;
  s.op = std::move(op);
  s.always = always;
  s.phase = std::move(phase);
  return s;
}

StepSpans traced(Interval span, Interval wait = {0, 0}) {
  StepSpans s;
  s.host = span;
  s.data_wait = wait;
  s.traced = true;
  return s;
}

Nanos idle_sum(const GpuStats& g) {
  return g.idle_data_wait_ns + g.idle_host_sync_ns + g.idle_pageable_copy_ns +
         g.idle_launch_gap_ns + g.idle_other_ns;
}

// Idle = traced time minus the kernel union, whatever the causes.
Nanos idle_of(const GpuEventBatch& ev, Interval span) {
  std::vector<Interval> busy;
  for (const KernelRecord& k : ev.kernels) busy.push_back({k.begin, k.end});
  return (span.end - span.begin) - union_length(busy, span);
}

// --- the idle partition ------------------------------------------------------------------------

TEST(IdlePartitionTest, FiveCausesAddUpToIdle) {
  // Step [0, 100]: data wait [0, 10]; kernels [10, 20], [30, 40], [60, 70], [80, 90];
  // a sync [40, 45] (drain until 60); a pageable H2D copy [72, 75] (drain until 80).
  GpuEventBatch ev;
  ev.kernels = {kernel(10, 20), kernel(30, 40), kernel(60, 70), kernel(80, 90)};
  ev.syncs = {sync(40, 45)};
  ev.copies = {copy(72, 75, CopyKind::kHostToDevice, true)};
  const GpuStats g = gpu_step_stats(ev, traced({0, 100}, {0, 10}), 100, 1);
  EXPECT_EQ(g.idle_data_wait_ns, 10);     // [0, 10]
  EXPECT_EQ(g.idle_host_sync_ns, 20);     // [40, 60]: the wait and the drain after it
  EXPECT_EQ(g.idle_pageable_copy_ns, 8);  // [72, 80]: the copy and the refill after it
  EXPECT_EQ(g.idle_launch_gap_ns, 12);    // [20, 30] and [70, 72]
  EXPECT_EQ(g.idle_other_ns, 10);         // [90, 100] after the last kernel
  EXPECT_EQ(idle_sum(g), idle_of(ev, {0, 100}));
  EXPECT_EQ(idle_sum(g), 60);
}

TEST(IdlePartitionTest, PrecedenceIsDataWaitPageableCopySync) {
  // One gap [0, 100] (kernels at [-10, 0] and [100, 110]); data wait [0, 30]; a sync [20, 50];
  // a pageable copy [40, 70] (its drain until 100 too): each second once, first match wins. The
  // copy before the sync: pinning removes its wait, removing the sync would not.
  GpuEventBatch ev;
  ev.kernels = {kernel(-10, 0), kernel(100, 110)};
  ev.syncs = {sync(20, 50)};
  ev.copies = {copy(40, 70, CopyKind::kHostToDevice, true)};
  const GpuStats g = gpu_step_stats(ev, traced({0, 100}, {0, 30}), 100, 1);
  EXPECT_EQ(g.idle_data_wait_ns, 30);      // [0, 30]
  EXPECT_EQ(g.idle_pageable_copy_ns, 60);  // [40, 100]: the copy and the refill after it
  EXPECT_EQ(g.idle_host_sync_ns, 10);      // [30, 40]: what the copy left of the sync's drain
  EXPECT_EQ(g.idle_launch_gap_ns + g.idle_other_ns, 0);
  EXPECT_EQ(idle_sum(g), 100);
}

TEST(IdlePartitionTest, ASyncAtEachStepEndLeavesTheNextStepsPageableCopyItsOwn) {
  // Three identical steps of 100: a blocking pageable copy [s+10, s+50] (the host in the op from
  // s+5), kernels [s+50, s+90], a device sync [s+60, s+90] at the step's end, host work until the
  // next step. The sync's drain runs into the next copy; the copy's idle is the copy's in every
  // step, wherever a window starts (it named the sync in some windows and the copy in others).
  auto step_stats = [&](int first, int count) {
    GpuEventBatch ev;
    for (int k = first; k < first + count; ++k) {
      const Nanos s = 100 * k;
      ev.kernels.push_back(kernel(s + 50, s + 90));
      ev.syncs.push_back(sync(s + 60, s + 90));
      ev.copies.push_back(copy(s + 10, s + 50, CopyKind::kHostToDevice, true));
    }
    ev.kernels.push_back(kernel(100 * (first + count) + 50, 100 * (first + count) + 90));
    return gpu_step_stats(ev, traced({100 * first, 100 * (first + count)}), 100, count);
  };
  for (int first : {0, 1, 2}) {
    SCOPED_TRACE(first);
    const GpuStats g = step_stats(first, 2);
    // Idle [s, s+50], [s+90, s+150], [s+190, s+200] of the 200 traced; the copies claim
    // [s+10, s+50] and [s+110, s+150], the syncs' drains (and the start) the other 40.
    EXPECT_EQ(idle_sum(g), 120);
    EXPECT_EQ(g.idle_pageable_copy_ns, 80);
    EXPECT_EQ(g.idle_host_sync_ns + g.idle_other_ns + g.idle_launch_gap_ns, 40);
  }
}

TEST(IdlePartitionTest, SyncEndingInsideAGapClaimsTheDrainUntilTheNextKernel) {
  // Kernels [0, 10] and [50, 60]; the host waits [5, 20] (the GPU drains at 10), then takes
  // until 50 to launch again: [10, 50] is the sync's.
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 10), kernel(50, 60)};
  ev.syncs = {sync(5, 20)};
  const GpuStats g = gpu_step_stats(ev, traced({0, 60}), 100, 1);
  EXPECT_EQ(g.idle_host_sync_ns, 40);
  EXPECT_EQ(g.idle_launch_gap_ns, 0);
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_EQ(g.host_sync_ns, 15);  // the host's own wait
}

TEST(IdlePartitionTest, SyncDrainRunsPastAShortKernelUpToTheHostTimeItTook) {
  // loss.item() waits [10, 50] for the step's kernels [0, 50]; right after it the optimizer's
  // kernel [52, 55]; then the host works (the next batch) and launches again at 85. Without the
  // sync the host would have done that work while the GPU computed: [55, 85] is the sync's too.
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 50), kernel(52, 55), kernel(85, 100)};
  ev.syncs = {sync(10, 50)};
  GpuStats g = gpu_step_stats(ev, traced({0, 100}), 100, 1);
  EXPECT_EQ(g.idle_host_sync_ns, 2 + 30);  // [50, 52] and [55, 85]
  EXPECT_EQ(idle_sum(g), 32);
  // A short wait [45, 50] took the host 5: of the later gaps it claims 5 - 2 = 3, [55, 58].
  ev.syncs = {sync(45, 50)};
  g = gpu_step_stats(ev, traced({0, 100}), 100, 1);
  EXPECT_EQ(g.idle_host_sync_ns, 2 + 3);
  EXPECT_EQ(g.idle_launch_gap_ns + g.idle_other_ns, 27);
  EXPECT_EQ(idle_sum(g), 32);
}

TEST(IdlePartitionTest, SyncReturningWhileAKernelRunsCausesNoDrain) {
  // An event synchronize returns at 20 while the kernel [15, 40] runs: the queue never drained,
  // so the gap [40, 50] is a launch gap, not the sync's.
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 10), kernel(15, 40), kernel(50, 60)};
  ev.syncs = {sync(5, 20, SyncApi::kEventSynchronize)};
  const GpuStats g = gpu_step_stats(ev, traced({0, 60}), 100, 1);
  EXPECT_EQ(g.idle_host_sync_ns, 5);    // [10, 15] while it waited
  EXPECT_EQ(g.idle_launch_gap_ns, 10);  // [40, 50]
  EXPECT_EQ(idle_sum(g), 15);
}

TEST(IdlePartitionTest, TwoCausesOnOneGapAreSplitNotDoubleCounted) {
  // One gap [10, 50] between kernels: the host waits for data [10, 25], then a sync [30, 35]
  // (drain until 50). The rest [25, 30] is a launch gap.
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 10), kernel(50, 60)};
  ev.syncs = {sync(30, 35)};
  const GpuStats g = gpu_step_stats(ev, traced({0, 60}, {10, 25}), 100, 1);
  EXPECT_EQ(g.idle_data_wait_ns, 15);
  EXPECT_EQ(g.idle_host_sync_ns, 20);
  EXPECT_EQ(g.idle_launch_gap_ns, 5);
  EXPECT_EQ(idle_sum(g), 40);
  // Two overlapping syncs (two threads) on the same gap: the idle is counted once.
  ev.syncs = {sync(30, 35), sync(32, 45)};
  std::vector<SyncSite> sites;
  const GpuStats two = gpu_step_stats(ev, traced({0, 60}, {10, 25}), 100, 1, &sites);
  EXPECT_EQ(two.idle_host_sync_ns, 20);
  EXPECT_EQ(two.host_syncs, 2);
  EXPECT_EQ(two.host_sync_ns, 15);  // union of the waits [30, 45]
  Nanos site_idle = 0;
  for (const SyncSite& s : sites) site_idle += s.idle_ns;
  EXPECT_EQ(site_idle, two.idle_host_sync_ns);
}

TEST(IdlePartitionTest, AsyncStepsAttributeTheDrainToTheStepWhoseGpuSpanHoldsIt) {
  // The host runs ahead: step 1's host span is [0, 100] but the GPU ran it over [200, 300] and
  // step 2 over [300, 400]. The host calls .item() at the end of step 2's host span... here a
  // sync [250, 310] (host time) that returns once the GPU caught up; the GPU then idles
  // [310, 340] until the host launches again.
  GpuEventBatch ev;
  ev.kernels = {kernel(200, 305), kernel(340, 400)};
  ev.syncs = {sync(250, 310)};
  auto gpu_step = [&](Interval gpu, Interval host) {
    StepSpans s = traced(host);
    s.gpu = gpu;
    s.gpu_timed = true;
    std::vector<SyncSite> sites;
    const GpuStats g = gpu_step_stats(ev, s, 100, 1, &sites);
    return std::make_pair(g, sites);
  };
  const auto [a, a_sites] = gpu_step({200, 300}, {0, 100});
  const auto [b, b_sites] = gpu_step({300, 400}, {100, 200});
  EXPECT_EQ(a.idle_host_sync_ns + a.idle_launch_gap_ns + a.idle_other_ns, 0);  // busy
  EXPECT_EQ(a.host_syncs, 0);  // the sync ended in step 2's GPU span
  EXPECT_EQ(b.host_syncs, 1);
  EXPECT_EQ(b.idle_host_sync_ns, 35);  // [305, 340]: the drain, in step 2 only
  EXPECT_EQ(idle_sum(b), idle_of(ev, {300, 400}));
  ASSERT_EQ(b_sites.size(), 1u);
  EXPECT_EQ(b_sites[0].idle_ns, 35);
  EXPECT_TRUE(a_sites.empty());
}

TEST(IdlePartitionTest, DrainRunningIntoTheNextStepIsCountedThereOnce) {
  // Host spans: the sync [80, 95] ends in step 1 ([0, 100]); the GPU stays idle until the next
  // step's first kernel at 130. Step 1 gets [80, 100], step 2 [100, 130]; the sync counts once.
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 80), kernel(130, 200)};
  ev.syncs = {sync(80, 95)};
  const GpuStats a = gpu_step_stats(ev, traced({0, 100}), 100, 1);
  const GpuStats b = gpu_step_stats(ev, traced({100, 200}), 100, 1);
  EXPECT_EQ(a.idle_host_sync_ns, 20);
  EXPECT_EQ(b.idle_host_sync_ns, 30);
  EXPECT_EQ(a.host_syncs + b.host_syncs, 1);
  EXPECT_EQ(idle_sum(a) + idle_sum(b), 50);
}

TEST(IdlePartitionTest, RandomTimelinesAlwaysAddUp) {
  // Many small deterministic timelines: the five causes sum to idle, none negative.
  uint64_t seed = 12345;
  auto next = [&](int mod) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<Nanos>((seed >> 33) % static_cast<uint64_t>(mod));
  };
  for (int trial = 0; trial < 200; ++trial) {
    GpuEventBatch ev;
    for (int i = 0; i < 6; ++i) {
      const Nanos b = next(1000);
      ev.kernels.push_back(kernel(b, b + 1 + next(100)));
    }
    for (int i = 0; i < 3; ++i) {
      const Nanos b = next(1000);
      ev.syncs.push_back(sync(b, b + next(80)));
      const Nanos c = next(1000);
      ev.copies.push_back(
          copy(c, c + next(50), i == 0 ? CopyKind::kDeviceToHost : CopyKind::kHostToDevice, true));
    }
    ev.scopes = {scope(next(1000), 1000, "aten::to", false)};
    const Nanos w = next(1000);
    const Interval span{100, 900};
    const GpuStats g = gpu_step_stats(ev, traced(span, {w, w + next(200)}), 100, 1);
    EXPECT_EQ(idle_sum(g), idle_of(ev, span)) << "trial " << trial;
    for (Nanos v : {g.idle_data_wait_ns, g.idle_host_sync_ns, g.idle_pageable_copy_ns,
                    g.idle_launch_gap_ns, g.idle_other_ns}) {
      EXPECT_GE(v, 0) << "trial " << trial;
    }
  }
}

// --- causes ------------------------------------------------------------------------------------

TEST(HostSyncCauseTest, SyncRecordInsideAnOpScopeTakesTheOpAsCause) {
  // .item(): a pageable D2H copy [12, 14] and a stream synchronize [14, 18] inside the scope
  // [10, 19] are one sync, with the scope's extent. A device synchronize outside any scope is
  // named by its API.
  GpuEventBatch ev;
  ev.copies = {copy(12, 14, CopyKind::kDeviceToHost, true)};
  ev.syncs = {sync(14, 18), sync(30, 40, SyncApi::kDeviceSynchronize)};
  ev.scopes = {scope(10, 19, "aten::item", true, "forward")};
  const std::vector<SyncRecord> s = resolve_host_syncs(ev, true);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].cause, "aten::item");
  EXPECT_EQ(s[0].phase, "forward");
  EXPECT_EQ(s[0].api, SyncApi::kBlockingCopy);  // the first thing it blocked in
  EXPECT_EQ(span_of(s[0]), (std::make_pair<Nanos, Nanos>(10, 19)));
  EXPECT_EQ(s[1].cause, "cudaDeviceSynchronize");
  EXPECT_EQ(s[1].api, SyncApi::kDeviceSynchronize);
}

TEST(HostSyncCauseTest, CudaCallsOfOneOpCallAreOneSync) {
  // Ops named by their stack at each CUDA call: .item() makes a scope for its copy [12, 14] and
  // one for its synchronize [14, 18], tied by the call id: one sync. A second item() (id 8) is
  // a second sync.
  GpuEventBatch ev;
  ev.copies = {copy(12, 14, CopyKind::kDeviceToHost, true),
               copy(32, 34, CopyKind::kDeviceToHost, true)};
  ev.syncs = {sync(14, 18), sync(34, 38)};
  HostOpScope a = scope(12, 14, "aten::item", false), b = scope(14, 18, "aten::item", false);
  HostOpScope c = scope(32, 34, "aten::item", false), d = scope(34, 38, "aten::item", false);
  a.call = b.call = 7;
  c.call = d.call = 8;
  ev.scopes = {a, b, c, d};
  const std::vector<SyncRecord> s = resolve_host_syncs(ev, true);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].cause, "aten::item");
  EXPECT_EQ(span_of(s[0]), (std::make_pair<Nanos, Nanos>(12, 18)));
  EXPECT_EQ(span_of(s[1]), (std::make_pair<Nanos, Nanos>(32, 38)));
}

TEST(HostSyncCauseTest, WaitForAPageableCopyToTheDeviceIsACopyStallNotASync) {
  // x.to(cuda, non_blocking) from pageable memory: the host waits in aten::to [10, 40] (a sync
  // record [12, 38]) while the staged copy [30, 38] runs: the pageable-copy cause, not a sync.
  // A later sync with no pageable copy inside stays one.
  GpuEventBatch ev;
  ev.copies = {copy(30, 38, CopyKind::kHostToDevice, true)};
  ev.syncs = {sync(12, 38), sync(60, 70)};
  ev.scopes = {scope(10, 40, "aten::to", false)};
  const std::vector<SyncRecord> s = resolve_host_syncs(ev, true);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].begin, 60);
  StepSpans spans;
  spans.host = {0, 100};
  spans.traced = true;
  ev.kernels = {kernel(0, 5), kernel(45, 55), kernel(90, 100)};
  const GpuStats g = gpu_step_stats(ev, spans, 100, 1);
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_GT(g.idle_pageable_copy_ns, 0);
  EXPECT_EQ(g.idle_pageable_copy_ns, 35);  // [10, 45): from the op's entry to the next kernel
  EXPECT_EQ(g.idle_host_sync_ns, 30);      // [60, 90)
}

TEST(HostSyncCauseTest, APageableCopyTheGpuRanBeforeItsSynchronizeStillOwnsTheWait) {
  // x.to(cuda) from pageable memory with the GPU idle: the staged copy [12, 19] runs inside the
  // copy call [10, 20]; copy_'s synchronize [22, 30] comes after it. The two calls' scopes are one
  // op call: the wait is the copy's (seen on an H200: with the synchronize's scope alone, the
  // same steps read host_sync 0-10% of their idle from window to window).
  GpuEventBatch ev;
  ev.copies = {copy(12, 19, CopyKind::kHostToDevice, true)};
  ev.syncs = {sync(22, 30)};
  HostOpScope copy_call = scope(10, 20, "aten::to", false),
              sync_call = scope(21, 30, "aten::to", false);
  copy_call.call = sync_call.call = 3;
  ev.scopes = {copy_call, sync_call};
  EXPECT_TRUE(resolve_host_syncs(ev, true).empty());
  ev.scopes = {sync_call};  // the synchronize's scope alone: taken for a host sync
  EXPECT_EQ(resolve_host_syncs(ev, true).size(), 1u);
}

TEST(HostSyncCauseTest, BlockingCopyWithoutSyncRecordBecomesASync) {
  // .cpu() into pageable memory: only a D2H copy record inside aten::to.
  GpuEventBatch ev;
  ev.copies = {copy(22, 28, CopyKind::kDeviceToHost, true),
               copy(50, 52, CopyKind::kDeviceToHost, false),  // pinned, non-blocking: no sync
               copy(60, 62, CopyKind::kHostToDevice, true)};  // pageable H2D: a copy stall
  ev.scopes = {scope(20, 30, "aten::to", false), scope(49, 53, "aten::to", false),
               scope(59, 63, "aten::copy_", false)};
  const std::vector<SyncRecord> s = resolve_host_syncs(ev, true);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].cause, "aten::to");
  EXPECT_EQ(s[0].api, SyncApi::kBlockingCopy);
  EXPECT_EQ(s[0].begin, 20);
}

TEST(HostSyncCauseTest, OpScopesWithoutCuptiRecordsOnlyCountOutsideWindows) {
  // In a window CUPTI decides: an .item() on a CPU tensor (no record) is no sync. Outside
  // windows only the scopes of ops that always synchronize count (their API unknown).
  GpuEventBatch ev;
  ev.scopes = {scope(10, 12, "aten::item"), scope(20, 30, "aten::to", false)};
  EXPECT_TRUE(resolve_host_syncs(ev, true).empty());
  const std::vector<SyncRecord> s = resolve_host_syncs(ev, false);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].cause, "aten::item");
  EXPECT_EQ(s[0].api, SyncApi::kUnknown);
  StepSpans untraced;
  untraced.host = {0, 100};
  std::vector<SyncSite> sites;
  const GpuStats g = gpu_step_stats(ev, untraced, 100, 1, &sites);
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_EQ(g.host_sync_ns, 2);
  EXPECT_EQ(g.idle_host_sync_ns, 0);  // no trace, no idle
  ASSERT_EQ(sites.size(), 1u);
  EXPECT_EQ(sites[0].api, "unknown");
}

TEST(HostSyncCauseTest, StepSitesGroupByCauseAndPhase) {
  // Three .item() calls in forward, one in optimizer; kernels between them.
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 10), kernel(30, 40), kernel(60, 70), kernel(90, 100)};
  for (Nanos t : {10, 40, 70}) {
    ev.scopes.push_back(scope(t, t + 5, "aten::item", true, t < 70 ? "forward" : "optimizer"));
    ev.syncs.push_back(sync(t + 1, t + 4));
  }
  std::vector<SyncSite> sites;
  const GpuStats g = gpu_step_stats(ev, traced({0, 100}), 100, 1, &sites);
  EXPECT_EQ(g.host_syncs, 3);
  EXPECT_EQ(g.idle_host_sync_ns, 60);
  ASSERT_EQ(sites.size(), 2u);
  const auto fwd = std::find_if(sites.begin(), sites.end(),
                                [](const SyncSite& s) { return s.phase == "forward"; });
  ASSERT_NE(fwd, sites.end());
  EXPECT_EQ(fwd->cause, "aten::item");
  EXPECT_EQ(fwd->api, "cudaStreamSynchronize");
  EXPECT_EQ(fwd->count, 2);
  EXPECT_EQ(fwd->host_wait_ns, 10);
  EXPECT_EQ(fwd->idle_ns, 40);
}

// Kernels [0, 10], [12, 20], [35, 45], [60, 70] and an .item() in forward [45, 50] whose
// synchronize [46, 49] the trainer made; then `other`, an event synchronize [22, 30] in forward
// that no op scope holds.
GpuEventBatch item_and_event_sync(SyncThread other_thread) {
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 10), kernel(12, 20), kernel(35, 45), kernel(60, 70)};
  ev.scopes = {scope(45, 50, "aten::item", true, "forward")};
  SyncRecord item = sync(46, 49);
  item.thread = SyncThread::kTrainer;
  SyncRecord other = sync(22, 30, SyncApi::kEventSynchronize);
  other.phase = "forward";
  other.thread = other_thread;
  ev.syncs = {other, item};
  return ev;
}

// Seen on the H100 (torch 2.11): once per traced step, an event synchronize of ~0.7 ms whose
// correlation id no program API call had while every sync callback was on: CUPTI's or the
// driver's own. It never counts.
TEST(HostSyncCauseTest, SyncsNoProgramCallMadeNeverCount) {
  const GpuEventBatch ev = item_and_event_sync(SyncThread::kInternal);
  const std::vector<SyncRecord> s = resolve_host_syncs(ev, true);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].cause, "aten::item");
  const GpuStats g = gpu_step_stats(ev, traced({0, 70}), 100, 1, nullptr);
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_EQ(g.idle_launch_gap_ns, 17);  // [20, 35] stays a launch gap
  EXPECT_EQ(idle_sum(g), idle_of(ev, {0, 70}));
}

TEST(HostSyncCauseTest, SyncsOfTorchpilotsOwnThreadsNeverCount) {
  // As on the H100 (issue 10): per step, an .item() in forward, and an event synchronize of
  // another thread of ours [22, 30] outside any op scope, in the middle of a launch gap. Only the
  // .item() is a host sync; the gap stays a launch gap.
  GpuEventBatch ev = item_and_event_sync(SyncThread::kOwn);
  ev.syncs[1].stream_id = 7;  // the .item()'s
  ev.syncs[0].event_id = 3;   // ours
  const std::vector<SyncRecord> s = resolve_host_syncs(ev, true);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].cause, "aten::item");
  EXPECT_EQ(s[0].thread, SyncThread::kTrainer);
  EXPECT_EQ(s[0].stream_id, 7);

  std::vector<SyncSite> sites;
  const GpuStats g = gpu_step_stats(ev, traced({0, 70}), 100, 1, &sites);
  EXPECT_EQ(g.host_syncs, 1);
  EXPECT_EQ(g.host_sync_ns, 5);
  EXPECT_EQ(g.idle_host_sync_ns, 15);   // the .item()'s wait and drain [45, 60] only
  EXPECT_EQ(g.idle_launch_gap_ns, 17);  // [10, 12] and [20, 35]: ours took none of it
  EXPECT_EQ(idle_sum(g), idle_of(ev, {0, 70}));
  ASSERT_EQ(sites.size(), 1u);
  EXPECT_EQ(sites[0].cause, "aten::item");
  EXPECT_EQ(sites[0].count, 1);
  EXPECT_EQ(sites[0].trainer_calls, 1);
  EXPECT_EQ(sites[0].other_thread_calls, 0);
  EXPECT_EQ(sites[0].stream_id, 7);
  EXPECT_EQ(sites[0].event_id, -1);
}

TEST(HostSyncCauseTest, SyncsOfOtherProgramThreadsStillCount) {
  // A sync on another thread of the program (autograd's device thread, inside backward()) holds
  // the trainer up just the same: it counts, and says which thread made it.
  GpuEventBatch ev;
  ev.kernels = {kernel(0, 10), kernel(40, 50)};
  SyncRecord other = sync(10, 20, SyncApi::kEventSynchronize);
  other.thread = SyncThread::kOther;
  other.event_id = 9;
  ev.syncs = {other};
  std::vector<SyncSite> sites;
  const GpuStats g = gpu_step_stats(ev, traced({0, 50}), 100, 1, &sites);
  EXPECT_EQ(g.host_syncs, 1);
  ASSERT_EQ(sites.size(), 1u);
  EXPECT_EQ(sites[0].cause, "cudaEventSynchronize");
  EXPECT_EQ(sites[0].other_thread_calls, 1);
  EXPECT_EQ(sites[0].trainer_calls, 0);
  EXPECT_EQ(sites[0].event_id, 9);
}

// --- HostOpScopes ------------------------------------------------------------------------------

TEST(HostOpScopesTest, BoundedAndSwitchedByTheMonitor) {
  HostOpScopes& h = HostOpScopes::instance();
  std::vector<HostOpScope> out;
  h.drain(out);
  (void)h.take_dropped();
  EXPECT_FALSE(h.enabled());
  h.enable(true);
  EXPECT_TRUE(h.enabled());
  h.enable(false);
  EXPECT_FALSE(h.enabled());
  for (size_t i = 0; i < HostOpScopes::kCapacity + 3; ++i) h.push(scope(1, 2, "aten::item"));
  out.clear();
  h.drain(out);
  EXPECT_EQ(out.size(), HostOpScopes::kCapacity);
  EXPECT_EQ(h.take_dropped(), 3);
  EXPECT_EQ(h.take_dropped(), 0);
}

// --- the monitor: sites and phases over an epoch ---------------------------------------------

using test::FakeBackend;

TEST(HostSyncMonitorTest, EpochNamesTopCallSitesWithTheirPhase) {
  Config c = test::Rig::window_config(0, 3);  // the window opens when due (a short fake run)
  c.gpu.nvtx = false;
  test::Rig rig(c, false);
  rig.clock->advance(1'000'000);
  rig.backend->statuses = {{"pm_sampling", false, "off"},
                           {"activity", true, ""},
                           {"nvml", false, "off"},
                           {"nvtx", false, "off"}};
  rig.make(c);
  const auto& clock = rig.clock;
  const auto& backend = rig.backend;
  std::vector<bool> switched;  // whether scopes were wanted, in each step
  {
    Pilot& pilot = *rig.pilot;
    for (int i = 0; i < 4; ++i) {
      auto step = pilot.step(1);
      switched.push_back(HostOpScopes::instance().enabled());
      const Nanos b = clock->now_ns();
      {
        auto p = pilot.phase("forward");
        clock->advance(10);
        const Nanos t = clock->now_ns();
        // .item() in forward: the op scope (from the hook) and CUPTI's stream synchronize.
        if (HostOpScopes::instance().enabled()) {
          HostOpScopes::instance().push(scope(t, t + 20, "aten::item"));
        }
        if (backend->tracing) backend->queued.syncs.push_back(sync(t + 2, t + 18));
        clock->advance(30);
      }
      // Kernels [b, b+10] and, after the host launched again, [b+50, b+60].
      if (backend->tracing) {
        backend->queued.kernels.push_back(kernel(b, b + 10));
        backend->queued.kernels.push_back(kernel(b + 50, b + 60));
      }
      clock->advance(20);
    }
    pilot.end_epoch();
    rig.pilot.reset();
  }
  EXPECT_NE(std::find(switched.begin(), switched.end(), true), switched.end());
  EXPECT_FALSE(HostOpScopes::instance().enabled()) << "off again after the window";
  ASSERT_EQ(rig.sink->epochs.size(), 1u);
  const GpuEpochStats* gpu = rig.sink->epochs[0].sections.get<GpuEpochStats>();
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->traced_steps, 3);
  ASSERT_FALSE(gpu->top_sync_sites.empty());
  const SyncSite& top = gpu->top_sync_sites.front();
  EXPECT_EQ(top.cause, "aten::item");
  EXPECT_EQ(top.phase, "forward");
  EXPECT_EQ(top.api, "cudaStreamSynchronize");
  EXPECT_EQ(top.count, 3);
  EXPECT_EQ(top.host_wait_ns, 3 * 20);
  EXPECT_EQ(top.idle_ns, gpu->stats.idle_host_sync_ns);
  EXPECT_EQ(gpu->stats.idle_host_sync_ns, 3 * 40);  // [b+10, b+50] each traced step
  EXPECT_EQ(gpu->stats.host_syncs, 3);
}

// The sync probe as the Pilot calls it (hooks/gpu/torch_sync_probe.cpp): asked at a marked
// step, it times the next one and writes sync.probed and sync.ms (`ms` here) into its record.
class FakeSyncProbe final : public Collector {
 public:
  explicit FakeSyncProbe(double ms) : ms_(ms) {}
  std::string name() const override { return "fake_sync_probe"; }
  unsigned step_hooks() const override { return kHookPeriodStepEnd; }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_step_end(StepRecord& r) override {
    if (probing_) {
      r.metrics.set("sync", "probed", 1);
      r.metrics.set("sync", "ms", ms_);
      probed.push_back(r.step);
    }
    probing_ = r.probe_syncs;
    if (host_ != nullptr)
      host_->set_step_hooks(*this, probing_ ? kHookStepEnd : kHookPeriodStepEnd);
  }
  std::vector<int64_t> probed;

 private:
  double ms_;
  CollectorHost* host_ = nullptr;
  bool probing_ = false;
};

// Ends a step begun at `b` after `ms` ms, with PM and NVML samples up to its end: its figures are
// final, and it finishes at a collection (every 100 ms of host time).
void end_sampled_step(test::Rig& rig, Nanos b, Nanos ms) {
  rig.clock->advance(ms * test::Rig::kMs);
  rig.backend->queued.pm.push_back(test::pm(b, rig.clock->now_ns(), 0.5));
  rig.backend->queued.nvml.push_back({rig.clock->now_ns() - 1, 1.0});
}

// Ends the epoch; its gpu section (null unless there is exactly one epoch).
const GpuEpochStats* end_only_epoch(test::Rig& rig) {
  rig.pilot->end_epoch();
  if (rig.sink->epochs.size() != 1) return nullptr;
  return rig.sink->epochs[0].sections.get<GpuEpochStats>();
}

// After a window whose steps had host syncs, the next ordinary steps are timed by the sync probe
// (their records marked probe_syncs) and the epoch sums what it measured; a window without syncs
// asks for none. The syncs are known from the window's op scopes as they come (before its
// records are flushed), or from its finished steps' sync records.
TEST(HostSyncMonitorTest, OrdinaryStepsAfterAWindowWithSyncsAreProbed) {
  for (const char* kind : {"records", "scopes", "none"}) {
    SCOPED_TRACE(kind);
    const bool records = std::string(kind) == "records";
    const bool scopes = std::string(kind) == "scopes";
    const bool syncs = records || scopes;
    Config c = test::Rig::window_config(0, 3);
    c.gpu.nvtx = false;
    test::Rig rig(c, false);
    rig.clock->advance(1'000'000);
    auto probe = std::make_shared<FakeSyncProbe>(0.25);
    rig.after = {probe};
    rig.make(c);
    const auto& clock = rig.clock;
    const auto& backend = rig.backend;
    std::vector<int64_t> traced;
    for (int i = 0; i < 24; ++i) {
      auto step = rig.pilot->step(1);
      const Nanos b = clock->now_ns();
      if (backend->tracing) {
        traced.push_back(i);
        if (records) backend->queued.syncs.push_back(sync(b + 12, b + 28));
        if (scopes && HostOpScopes::instance().enabled()) {
          HostOpScopes::instance().push(scope(b + 12, b + 28, "aten::item"));
        }
        backend->queued.kernels.push_back(kernel(b, b + 10));
        backend->queued.kernels.push_back(kernel(b + 50, b + 60));
      }
      end_sampled_step(rig, b, 20);  // a collection every few steps
    }
    const GpuEpochStats* gpu = end_only_epoch(rig);
    ASSERT_NE(gpu, nullptr);
    ASSERT_EQ(traced.size(), 3u);
    EXPECT_EQ(gpu->stats.host_syncs, records ? 3 : 0);
    EXPECT_EQ(gpu->traced_steps, 3);
    if (!syncs) {
      EXPECT_TRUE(probe->probed.empty());
      EXPECT_EQ(gpu->sync_probed_steps, 0);
      continue;
    }
    ASSERT_EQ(probe->probed.size(), 8u) << "kSyncProbeSteps, once";
    EXPECT_GT(probe->probed.front(), traced.back()) << "ordinary steps only";
    EXPECT_EQ(probe->probed.back() - probe->probed.front(), 7) << "consecutive";
    EXPECT_EQ(gpu->sync_probed_steps, 8);
    EXPECT_EQ(gpu->sync_probed_ns, 8 * 250'000);
  }
}

// Marks one step at a recurring stall's period, as the stall tracker does.
class PeriodMarker final : public Collector {
 public:
  explicit PeriodMarker(int64_t step) : step_(step) {}
  std::string name() const override { return "period_marker"; }
  unsigned step_hooks() const override { return kHookStepEnd; }
  void on_step_end(StepRecord& r) override { r.at_period = r.step == step_; }

 private:
  int64_t step_;
};

// The probed steps that count are ordinary ones: not a stall's (a step at a period and the one
// after it, which the stall tracker has the probe time), not a new window's traced step.
TEST(HostSyncMonitorTest, ProbedStepsNearAStallOrInANewWindowDoNotCount) {
  for (const bool stall : {true, false}) {
    SCOPED_TRACE(stall ? "a stall" : "a new window");
    Config c = test::Rig::window_config(0, 3);
    c.gpu.nvtx = false;
    test::Rig rig(c, false);
    rig.clock->advance(1'000'000);
    auto probe = std::make_shared<FakeSyncProbe>(0.25);
    rig.after = {std::make_shared<PeriodMarker>(stall ? 8 : -1), probe};
    rig.make(c);
    std::vector<int64_t> traced;
    for (int i = 0; i < 24; ++i) {
      if (!stall && i == 9) rig.pilot->request_window(2);  // inside the probed steps (6-13)
      auto step = rig.pilot->step(1);
      const Nanos b = rig.clock->now_ns();
      if (rig.backend->tracing) {
        traced.push_back(i);
        rig.backend->queued.syncs.push_back(sync(b + 12, b + 28));
        rig.backend->queued.kernels.push_back(kernel(b, b + 10));
      }
      end_sampled_step(rig, b, 20);
    }
    const GpuEpochStats* gpu = end_only_epoch(rig);
    ASSERT_NE(gpu, nullptr);
    int64_t ordinary = 0;
    for (const int64_t s : probe->probed) {
      const bool in_window = std::find(traced.begin(), traced.end(), s) != traced.end();
      if (!in_window && !(stall && (s == 8 || s == 9))) ++ordinary;
    }
    ASSERT_LT(ordinary, static_cast<int64_t>(probe->probed.size())) << "the case happened";
    EXPECT_EQ(gpu->sync_probed_steps, ordinary);
    EXPECT_EQ(gpu->sync_probed_ns, ordinary * 250'000);
  }
}

// The epoch's ordinary steps leave out the window's steps, its tail until the trace stopped, the
// steps while its release ran and those the sync probe timed; their own work and data wait are
// theirs (a window's step waits less: the loader had longer).
TEST(HostSyncMonitorTest, OrdinaryStepsLeaveOutTheWindowItsReleaseAndTheProbe) {
  Config c = test::Rig::window_config(4, 3);
  c.gpu.nvtx = false;
  test::Rig rig(c, false);
  rig.clock->advance(1'000'000);
  rig.backend->slow_release = true;
  rig.make(c);
  const auto& clock = rig.clock;
  const auto& backend = rig.backend;
  int slow = 0;  // window and release steps
  for (int i = 0; i < 40; ++i) {
    auto step = rig.pilot->step(1);
    const Nanos b = clock->now_ns();
    // Window steps take 30 ms, steps while the release runs 25 ms, the others 10 ms.
    Nanos ms = backend->tracing ? 30 : backend->releasing ? 25 : 10;
    if (ms > 10) ++slow;
    if (backend->tracing) {
      backend->queued.syncs.push_back(sync(b + 12, b + 28));
      backend->queued.kernels.push_back(kernel(b, b + 10));
    }
    if (i == 20) backend->finish_release();
    rig.pilot->record_data_wait((ms > 10 ? 1 : 4) * test::Rig::kMs);
    end_sampled_step(rig, b, ms);
  }
  const GpuEpochStats* gpu = end_only_epoch(rig);
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->traced_steps, 3);
  ASSERT_GT(slow, 10) << "a release of several steps";
  // All but the window, its tail, the release's and the 8 probed steps (one step's lag each).
  EXPECT_GE(gpu->ordinary_steps, 40 - slow - 8 - 3);
  EXPECT_LE(gpu->ordinary_steps, 40 - slow - 8);
  // Every ordinary step took 10 ms (the histogram's bucket edge holds it within 2%).
  EXPECT_NEAR(static_cast<double>(gpu->ordinary_step_p50_ns), 10e6, 0.02 * 10e6);
  EXPECT_NEAR(static_cast<double>(gpu->ordinary_compute_p50_ns), 6e6, 0.02 * 6e6);
  EXPECT_EQ(gpu->ordinary_data_wait_ns, gpu->ordinary_steps * 4 * test::Rig::kMs);
  EXPECT_GT(rig.sink->epochs[0].step_p50_ns, 0);
}

// --- advisors ------------------------------------------------------------------------------------

constexpr Nanos kMs = 1000000;

using test::evidence;
EpochSummary traced_summary() {
  EpochSummary s = test::traced_gpu_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.gpu_utilization = 0.6;
  e.stats.idle_other_ns = 10 * kMs;
  return s;
}

TEST(HostSyncAdvisorTest, StatesTheIdleCausedAndNamesTopCallSites) {
  EpochSummary s = traced_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.host_sync_ns = 20 * kMs;        // the host's own wait is small ...
  e.stats.idle_host_sync_ns = 300 * kMs;  // ... the idle it causes is not
  e.stats.host_syncs = 40;
  e.top_sync_sites = {{"aten::item", "cudaStreamSynchronize", "forward", 30, 15 * kMs, 250 * kMs},
                      {"aten::nonzero", "cudaStreamSynchronize", "", 10, 5 * kMs, 50 * kMs}};
  const auto a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NE(a->finding.find("30.0% of step time in GPU idle"), std::string::npos) << a->finding;
  EXPECT_NE(a->finding.find("blocked 2.0%"), std::string::npos) << a->finding;
  EXPECT_NE(a->cause.find("aten::item in phase forward (3.0 per step, 25.0%"), std::string::npos)
      << a->cause;
  EXPECT_NE(a->cause.find("aten::nonzero (1.0 per step"), std::string::npos) << a->cause;
  // The host still issues the rest of the step: removing the syncs gives back at most the 2% it
  // was blocked in them, not the 30% of idle (the drain is the host's own launching and work).
  EXPECT_NEAR(a->expected_gain, 0.02 / 0.98, 1e-9);
  EXPECT_NEAR(evidence(*a, "host_blocked_in_syncs_per_step").value_or(0), 20.0 / 10, 1e-9);
  EXPECT_NE(a->action.find("at most the host's time blocked in syncs"), std::string::npos)
      << a->action;
  EXPECT_TRUE(a->gain_estimated);
  EXPECT_EQ(a->severity, Severity::kInfo);  // by the gain, not by the idle
  // A host blocked longer than the idle (it waited for the GPU's work): step -> step - idle.
  e.stats.host_sync_ns = 400 * kMs;
  const auto b = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(b);
  EXPECT_EQ(b->severity, Severity::kHigh);
  EXPECT_NEAR(b->expected_gain, 0.3 / 0.7, 1e-9);
  EXPECT_EQ(b->action.find("at most the host's time blocked"), std::string::npos) << b->action;
}

// Tracing slowed the host's launches, so in the window it waited less in its syncs than in
// ordinary steps: the probe's untraced wait bounds the gain where it is the larger (a planted pair
// with four item() a 14 ms step: 0.9 ms blocked in the window, the fix measured 2.6 ms).
TEST(HostSyncAdvisorTest, OrdinaryStepsProbedAfterTheWindowRaiseTheBlockedBound) {
  EpochSummary s = traced_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.host_sync_ns = 20 * kMs;  // 2 ms a traced step of 100 ms
  e.stats.idle_host_sync_ns = 300 * kMs;
  e.stats.host_syncs = 40;
  e.sync_probed_steps = 8;
  e.sync_probed_ns = 8 * 10 * kMs;  // 10 ms an ordinary step
  auto a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 0.1 / 0.9, 1e-9);
  EXPECT_NEAR(evidence(*a, "host_blocked_in_syncs_untraced_per_step").value_or(0), 10, 1e-9);
  EXPECT_NEAR(evidence(*a, "host_blocked_in_syncs_per_step").value_or(0), 2, 1e-9);
  EXPECT_NE(a->action.find("10 ms of a 100 ms step, timed in untraced steps after the window: 2 "
                           "ms in its traced ones"),
            std::string::npos)
      << a->action;
  // Probed steps that waited less than the window's: the window's wait stands.
  e.sync_probed_ns = 8 * kMs;
  a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 0.02 / 0.98, 1e-9);
  EXPECT_EQ(a->action.find("timed in untraced steps"), std::string::npos) << a->action;
  // Waits longer than the idle: the idle bounds the gain, as without a probe.
  e.sync_probed_ns = 8 * 50 * kMs;
  a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 0.3 / 0.7, 1e-9);
}

// The window's steps ran slower on the GPU than the others (tracing slowed the host's launches,
// and a host that syncs every step leaves the GPU waiting for them): the sync's idle is taken as
// the untraced steps have it. Instance R of the planted pairs: traced 11.0 ms, 50.6% busy, 38.1%
// idle after syncs; untraced 7.85 ms; the fix measured +27%, where the window's share said +62%.
TEST(HostSyncAdvisorTest, GainIsForTheUntracedStepsWhenTheWindowSlowedTheHost) {
  EpochSummary s = traced_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.traced_ns = 10 * 11 * kMs;
  e.stats.gpu_utilization = 0.506;
  e.stats.idle_host_sync_ns = static_cast<Nanos>(0.381 * 110 * kMs);
  e.stats.host_sync_ns = 40 * kMs;
  e.stats.host_syncs = 10;
  s.step_p50_ns = static_cast<Nanos>(7.85 * kMs);
  const double busy = 0.506 * 11, share = (7.85 - busy) / (11 - busy);
  const double removed = 0.381 * 11 * share / 7.85;
  auto a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, removed / (1 - removed), 1e-3);
  EXPECT_NEAR(a->expected_gain, 0.29, 0.01);
  EXPECT_NE(a->finding.find("38.1% of step time in GPU idle"), std::string::npos) << a->finding;
  EXPECT_NE(a->action.find("the traced ones ran 11.00 ms on the GPU against 7.85 ms"),
            std::string::npos)
      << a->action;
  // The median GPU span of ordinary steps (step markers) comes first when there is one.
  OutlierStats o;
  o.gpu_median_ns = static_cast<Nanos>(9.0 * kMs);
  s.sections.set<OutlierStats>(o);
  a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  const double share9 = (9.0 - busy) / (11 - busy), removed9 = 0.381 * 11 * share9 / 9.0;
  EXPECT_NEAR(a->expected_gain, removed9 / (1 - removed9), 1e-3);
  // Untraced steps as slow as the traced ones: the window's share, as before.
  o.gpu_median_ns = 11 * kMs;
  s.sections.set<OutlierStats>(o);
  a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_NEAR(a->expected_gain, 0.381 / 0.619, 1e-3);
  EXPECT_EQ(a->action.find("estimated for the untraced steps"), std::string::npos) << a->action;
}

TEST(HostSyncAdvisorTest, BlockingPageableCopyNamesPinningFirst) {
  EpochSummary s = traced_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.host_sync_ns = 350 * kMs;  // a blocking copy waits for the queue and the transfer
  e.stats.idle_host_sync_ns = 300 * kMs;
  e.stats.host_syncs = 10;
  e.top_sync_sites = {{"aten::to", "cudaStreamSynchronize", "copy", 10, 350 * kMs, 300 * kMs}};
  // No pageable bytes went to the device: a copy to the host (e.g. .cpu()), the general action.
  auto a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->action.find("pin the host tensors"), std::string::npos) << a->action;
  // 385 MB to the device from pageable memory: pinning leads the action.
  e.stats.h2d_bytes = e.stats.h2d_pageable_bytes = 385'000'000;
  a = advise_host_sync(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->action.find("pin the host tensors"), 0u) << a->action;
  EXPECT_NE(a->action.find("non_blocking=true"), std::string::npos) << a->action;
  EXPECT_NE(a->cause.find("38.5 MB per step"), std::string::npos) << a->cause;
  EXPECT_NEAR(a->expected_gain, 0.3 / 0.7, 1e-9);  // the gain is the sync's idle, as before
}

TEST(HostSyncAdvisorTest, PageableCopiesUseTheirIdleShare) {
  EpochSummary s = traced_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.h2d_bytes = e.stats.h2d_pageable_bytes = 100'000'000;
  e.stats.h2d_pageable_ns = 100 * kMs;
  e.stats.idle_pageable_copy_ns = 50 * kMs;  // the GPU idled for half of the copy time
  const auto a = advise_pageable_copies(s, AdvisorsConfig{});
  ASSERT_TRUE(a);
  // The idle removed, less the 10 MB per step pinned at the uncalibrated 12 GB/s (0.83 ms of a
  // 100 ms step) that stays in the stream.
  const double pinned = 10e6 / 12e9 / 0.1;
  EXPECT_NEAR(a->expected_gain, 1 / (1 - 0.05 + pinned) - 1, 1e-9);
  EXPECT_NEAR(*evidence(*a, "predicted_pinned_copy_time"), 10e6 / 12e9 * 1e3, 1e-9);
  EXPECT_NE(a->finding.find("idle for 5.0%"), std::string::npos) << a->finding;
  // On a Hopper GPU, the link's calibrated 49 GB/s; the median step (50 ms) is the step.
  e.device = "NVIDIA H100 80GB HBM3";
  s.step_p50_ns = 50 * kMs;
  EXPECT_NEAR(advise_pageable_copies(s, AdvisorsConfig{})->expected_gain,
              1 / (1 - 0.05 + 10e6 / 49e9 / 0.05) - 1, 1e-9);
  // Copies while the GPU was kept busy (or whose idle a sync claimed) cost nothing: quiet.
  e.stats.idle_pageable_copy_ns = 1 * kMs;
  EXPECT_FALSE(advise_pageable_copies(s, AdvisorsConfig{}));
}

Advice advice(const char* id, double removed) {
  Advice a;
  a.id = id;
  a.expected_gain = removed / (1 - removed);
  return a;
}

TEST(IdleGainCapTest, IdleCauseGainsNeverRemoveMoreThanTheIdleTime) {
  // Idle is 30% of traced time; host_sync claims 20% and launch_bound 20%, data starvation 5%:
  // 45% > 30%, so each is scaled by 30/45. fp32_matmul is not an idle cause: untouched.
  EpochSummary s = traced_summary();
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.idle_other_ns = 0;
  e.stats.idle_host_sync_ns = 200 * kMs;
  e.stats.idle_launch_gap_ns = 50 * kMs;
  e.stats.idle_data_wait_ns = 50 * kMs;
  std::vector<Advice> all = {advice("data_starvation", 0.05), advice("host_sync", 0.2),
                             advice("launch_bound", 0.2), advice("fp32_matmul", 0.5)};
  cap_idle_gains(all, s);
  double removed = 0;
  for (const Advice& a : all) {
    if (is_idle_cause(a.id)) removed += a.expected_gain / (1 + a.expected_gain);
  }
  EXPECT_NEAR(removed, 0.3, 1e-9);
  EXPECT_NEAR(all[1].expected_gain / (1 + all[1].expected_gain), 0.2 * 0.3 / 0.45, 1e-9);
  EXPECT_NEAR(all[3].expected_gain, 1.0, 1e-9);
  EXPECT_NE(all[1].action.find("estimated gain scaled down"), std::string::npos);
  EXPECT_EQ(all[1].evidence.back().name, "uncapped_expected_gain");
  // Within the idle time: nothing changes.
  std::vector<Advice> small = {advice("host_sync", 0.1), advice("launch_bound", 0.1)};
  const double before = small[0].expected_gain;
  cap_idle_gains(small, s);
  EXPECT_DOUBLE_EQ(small[0].expected_gain, before);
  // Without a traced window there is no idle figure to cap by.
  EpochSummary cpu;
  std::vector<Advice> starving = {advice("data_starvation", 0.6)};
  cap_idle_gains(starving, cpu);
  EXPECT_NEAR(starving[0].expected_gain, 1.5, 1e-9);
}

TEST(IdleGainCapTest, RunAdvisorsAppliesTheCap) {
  // The loop waited for data 30% of the time (host time, while the GPU had work queued: only
  // 5% of the traced idle), host syncs cost 25% and launch gaps 10%: the idle is 40%, the three
  // advices together would remove 65%.
  EpochSummary s = traced_summary();
  s.data_wait_fraction = 0.3;
  s.data_wait_ns = 300 * kMs;
  GpuEpochStats& e = *s.sections.get<GpuEpochStats>();
  e.stats.idle_other_ns = 0;
  e.stats.idle_data_wait_ns = 50 * kMs;
  e.stats.idle_host_sync_ns = 250 * kMs;
  e.stats.idle_launch_gap_ns = 100 * kMs;
  e.stats.host_syncs = 10;
  Config c;
  c.advisors.launch_bound.threshold = 0.05;
  const std::vector<Advice> out = run_advisors(s, c);
  double removed = 0;
  int idle_causes = 0;
  for (const Advice& a : out) {
    if (!is_idle_cause(a.id)) continue;
    ++idle_causes;
    removed += a.expected_gain / (1 + a.expected_gain);
  }
  EXPECT_EQ(idle_causes, 3);
  EXPECT_NEAR(removed, 0.4, 1e-9);
}

}  // namespace
}  // namespace torchpilot
