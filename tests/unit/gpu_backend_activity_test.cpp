// The CUPTI backend's activity trace on the CPU, through the fakes (tests/fakes/): buffers, drops,
// conversion off the training thread; the generated default fake, the failure reasons, and the
// real dlopen path on this machine.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fakes/gpu_backend_rig.h"
#include "torchpilot/hooks/gpu/cupti_activity_trace.h"
#include "torchpilot/hooks/gpu/cupti_pm_sampling.h"
#include "torchpilot/hooks/gpu/own_thread.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace torchpilot {
namespace detail {
namespace {

// --- Activity buffers ----------------------------------------------------------------------------

// Gives the rig one activity buffer of `mb` MiB; how many kernel records fill it.
size_t one_buffer_of(Rig& rig, int mb) {
  rig.config.trace_buffer_mb = mb;
  return (static_cast<size_t>(mb) << 20) / sizeof(CUpti_ActivityKernel10);
}

TEST(GpuBackend, SyncRecordsSayWhichThreadMadeTheCall) {
  // Issue 10: a cudaEventSynchronize outside any op, once per step, topped the host syncs on the
  // H100. CUPTI's records carry no thread; its callback on the call does, matched by correlation
  // id: the trainer's (the thread that started the window), torchpilot's own, another.
  Rig rig;
  auto b = rig.started();
  ASSERT_TRUE(b->start_trace());
  rig.cupti->sync_call(101);
  std::string our_name;
  std::thread ours([&] {
    mark_own_thread("tp-test");
    char name[16] = {0};
    pthread_getname_np(pthread_self(), name, sizeof name);
    our_name = name;  // what top -H and /proc show for torchpilot's threads
    rig.cupti->sync_call(102);
  });
  ours.join();
  EXPECT_EQ(our_name, "tp-test");
  std::thread other([&] { rig.cupti->sync_call(103); });
  other.join();
  const uint64_t t0 = rig.cupti->cupti_now();
  for (uint32_t id : {101u, 102u, 103u, 104u}) {  // 104: no callback seen
    CUpti_ActivitySynchronization2 r;
    std::memset(&r, 0, sizeof r);
    r.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    r.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE;
    r.start = t0 + id;
    r.end = t0 + id + 10;
    r.correlationId = id;
    r.streamId = CUPTI_SYNCHRONIZATION_INVALID_VALUE;
    r.cudaEventId = id - 100;
    rig.cupti->produce(r);
  }
  b->stop_trace();
  {
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    EXPECT_TRUE(rig.cupti->enabled_callbacks.empty()) << "callbacks off with the trace";
  }
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  ASSERT_EQ(batch.syncs.size(), 4u);
  std::sort(batch.syncs.begin(), batch.syncs.end(),
            [](const SyncRecord& x, const SyncRecord& y) { return x.begin < y.begin; });
  EXPECT_EQ(batch.syncs[0].thread, SyncThread::kTrainer);
  EXPECT_EQ(batch.syncs[1].thread, SyncThread::kOwn);
  EXPECT_EQ(batch.syncs[2].thread, SyncThread::kOther);
  // Every sync callback was on and none had its id: no program call made it.
  EXPECT_EQ(batch.syncs[3].thread, SyncThread::kInternal);
  EXPECT_EQ(batch.syncs[1].api, SyncApi::kEventSynchronize);
  EXPECT_EQ(batch.syncs[1].event_id, 2);
  EXPECT_EQ(batch.syncs[1].stream_id, -1);
  EXPECT_EQ(batch.syncs[1].correlation_id, 102);
  b->stop();
}

TEST(GpuBackend, ExhaustedBuffersAreCountedAsDropped) {
  Rig rig;
  const size_t fit = one_buffer_of(rig, 1);
  auto b = rig.started();
  ASSERT_TRUE(b->start_trace());
  const size_t total = fit + 500;
  const uint64_t k0 = rig.cupti->cupti_now();
  for (size_t i = 0; i < total; ++i) rig.cupti->produce(kernel_at(k0 + i * 10, k0 + i * 10 + 5));
  b->stop_trace();
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), fit);
  EXPECT_EQ(batch.dropped, 500);
  EXPECT_NE(rig.log().find("all 1 trace buffers (1 MiB) are in use"), std::string::npos);

  // The buffer came back: the next window records again.
  ASSERT_TRUE(b->start_trace());
  rig.cupti->produce(kernel_at(k0, k0 + 5));
  b->stop_trace();
  b->flush();
  batch.clear();
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 1u);
  EXPECT_EQ(batch.dropped, 0);
  b->stop();
}

// CUPTI is told our buffers come zeroed (it would zero 4 MiB inside a launch otherwise): a buffer
// used, converted and handed out again is zeroed first; the attribute is put back at release.
TEST(GpuBackend, ActivityBuffersAreHandedToCuptiZeroed) {
  Rig rig;
  // One 1 MiB buffer, used again and again. Fewer records than fit: the bytes past them are
  // scribbled on when the buffer comes back.
  const size_t fit = one_buffer_of(rig, 1) - 1;
  auto b = rig.started();
  const uint64_t k0 = rig.cupti->cupti_now();
  rig.cupti->scribble = true;
  for (int window = 0; window < 2; ++window) {
    ASSERT_TRUE(b->start_trace());
    {
      std::lock_guard<std::mutex> lock(rig.cupti->m);
      EXPECT_EQ(rig.cupti->zeroed_out, 1);
    }
    for (int round = 0; round < 3; ++round) {
      // An empty buffer written into and handed back (valid size 0), then a full one.
      rig.cupti->hand_back_empty();
      b->flush();  // waits for the conversion: the buffer is free again
      for (size_t i = 0; i < fit; ++i) rig.cupti->produce(kernel_at(k0 + i * 10, k0 + i * 10 + 5));
      rig.cupti->hand_back_current();
      GpuEventBatch batch;
      ASSERT_TRUE(eventually([&] {
        b->drain(batch);
        return batch.kernels.size() >= fit;
      }));
      EXPECT_EQ(batch.kernels.size(), fit);
    }
    b->stop_trace();
    b->release_trace();
    b->finish_release();
    std::lock_guard<std::mutex> lock(rig.cupti->m);
    EXPECT_EQ(rig.cupti->zeroed_out, 0);
  }
  std::lock_guard<std::mutex> lock(rig.cupti->m);
  EXPECT_EQ(rig.cupti->unzeroed_buffers, 0);
  EXPECT_EQ(rig.cupti->dropped, 0u);
}

TEST(GpuBackend, FullBuffersDeliveredByCuptisThread) {
  Rig rig;
  const size_t fit = one_buffer_of(rig, 2);
  auto b = rig.make();
  ASSERT_TRUE(b->start_trace());
  const uint64_t k0 = rig.cupti->cupti_now();
  for (size_t i = 0; i < fit + 1; ++i) rig.cupti->produce(kernel_at(k0 + i, k0 + i + 1));
  // The first buffer filled up; CUPTI's worker hands it back from another thread. The collector
  // only queues it there: its converter thread turns it into events, which drain() then holds.
  std::thread worker([&] { rig.cupti->complete_full(); });
  worker.join();
  GpuEventBatch batch;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (batch.kernels.size() < fit && std::chrono::steady_clock::now() < deadline) {
    b->drain(batch);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(batch.kernels.size(), fit);
  b->stop();  // forced flush; the record after the full buffer found no buffer: dropped
  b->drain(batch);
  EXPECT_EQ(batch.dropped, 1);
  EXPECT_EQ(batch.kernels.size() + static_cast<size_t>(batch.dropped), fit + 1);
}

TEST(GpuBackend, ABufferReturnedOnTheTrainingThreadIsConvertedOffIt) {
  Rig rig;
  auto b = rig.make();
  ASSERT_TRUE(b->start_trace());
  const uint64_t k0 = rig.cupti->cupti_now();
  for (int i = 0; i < 10; ++i) rig.cupti->produce(kernel_at(k0 + i, k0 + i + 1));
  rig.cupti->hand_back_current();  // inside one of the trainer's launches
  b->flush();                      // returns once what CUPTI returned is converted
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_EQ(batch.kernels.size(), 10u);
  std::lock_guard<std::mutex> lock(rig.cupti->m);
  EXPECT_EQ(rig.cupti->record_readers.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(rig.cupti->record_readers.size(), 1u);  // the collector's converter
}

TEST(GpuBackend, CuptisOverheadRecordsAreSummedAtDebugLevelOnly) {
  for (const bool debug : {true, false}) {
    Rig rig;
    rig.logger->set_level(debug ? spdlog::level::debug : spdlog::level::info);
    auto b = rig.make();
    ASSERT_TRUE(b->start_trace());
    EXPECT_EQ(rig.cupti->enabled_kinds.count(CUPTI_ACTIVITY_KIND_OVERHEAD), debug ? 1u : 0u);
    const uint64_t t0 = rig.cupti->cupti_now();
    CUpti_ActivityOverhead3 o{};
    o.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
    o.overheadKind = CUPTI_ACTIVITY_OVERHEAD_COMMAND_BUFFER_FULL;
    o.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
    o.objectId.pt.threadId = static_cast<uint32_t>(pthread_self());  // the trainer's
    o.start = t0;
    o.end = t0 + 2'000'000;
    rig.cupti->produce(o);
    o.overheadKind = CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH;
    o.objectId.pt.threadId += 1;  // another thread
    o.end = t0 + 500'000;
    rig.cupti->produce(o);
    rig.cupti->produce(kernel_at(t0, t0 + 1000));
    b->stop();
    GpuEventBatch batch;
    b->drain(batch);
    EXPECT_EQ(batch.kernels.size(), 1u);  // overhead records are not events
    const std::string log = rig.log_text.str();
    if (debug) {
      EXPECT_NE(log.find("buffer flush 1x 0.50 ms (training thread 0.00 ms), command buffer "
                         "full 1x 2.00 ms (training thread 2.00 ms)"),
                std::string::npos)
          << log;
    } else {
      EXPECT_EQ(log.find("CUPTI overhead records"), std::string::npos) << log;
    }
  }
}

TEST(GpuBackend, BufferOfAReplacedBackendIsFreedNotConverted) {
  Rig rig1;
  auto b1 = rig1.make();
  ASSERT_TRUE(b1->start_trace());
  const uint64_t k0 = rig1.cupti->cupti_now();
  rig1.cupti->produce(kernel_at(k0, k0 + 1));
  // The buffer is still in "CUPTI's" hands when a second backend takes over the callbacks.
  Rig rig2;
  auto b2 = rig2.make();
  rig1.cupti->complete_full();
  rig1.cupti->activity_flush_all(0);  // delivered to b2's routing: not b2's buffer
  b2->flush();                        // whatever b2 queued is converted before the drain
  GpuEventBatch batch;
  b2->drain(batch);
  EXPECT_TRUE(batch.kernels.empty());
  b2->stop();
  b1->stop();
}

// --- The generated default fake ---------------------------------------------------------------

TEST(CuptiApiFake, UnscriptedEntryPointsAnswerTheDefault) {
  CuptiApiFake fake;  // CUPTI_ERROR_NOT_INITIALIZED
  uint32_t version = 0;
  EXPECT_EQ(fake.get_version(&version), CUPTI_ERROR_NOT_INITIALIZED);
  CUpti_PmSampling_Stop_Params stop{};  // structSize 0: recorded, the call goes on
  EXPECT_EQ(fake.pm_sampling_stop(&stop), CUPTI_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(fake.bad_struct_sizes, std::vector<std::string>{"CUpti_PmSampling_Stop_Params"});
  EXPECT_EQ(fake.pm_sampling_stop(nullptr), CUPTI_ERROR_INVALID_PARAMETER);
  CuptiApiFake ok(CUPTI_SUCCESS);
  ok.fail["cuptiActivityFlushAll"] = CUPTI_ERROR_UNKNOWN;
  EXPECT_EQ(ok.activity_flush_all(0), CUPTI_ERROR_UNKNOWN);
  EXPECT_EQ(ok.finalize(), CUPTI_SUCCESS);
  CUpti_PmSampling_Start_Params start{};
  start.structSize = CUpti_PmSampling_Start_Params_STRUCT_SIZE;
  EXPECT_EQ(ok.pm_sampling_start(&start), CUPTI_SUCCESS);
  EXPECT_TRUE(ok.bad_struct_sizes.empty());
}

// --- Failure reasons ---------------------------------------------------------------------------

TEST(PmSamplingReasons, ExactStrings) {
  FakeCupti api;
  EXPECT_EQ(pm_sampling_error_reason(api, "x", CUPTI_ERROR_INSUFFICIENT_PRIVILEGES),
            "no permission for GPU performance counters (needs root, CAP_SYS_ADMIN or "
            "NVreg_RestrictProfilingToAdminUsers=0)");
  EXPECT_EQ(pm_sampling_error_reason(api, "x", CUPTI_ERROR_HARDWARE_BUSY),
            "counters held by another client (DCGM or Nsight)");
  EXPECT_NE(pm_sampling_error_reason(api, "x", CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED).find("MIG"),
            std::string::npos);
  EXPECT_EQ(pm_sampling_error_reason(api, "cuptiPmSamplingStart", CUPTI_ERROR_UNKNOWN),
            "cuptiPmSamplingStart failed: CUPTI_ERROR_UNKNOWN (999)");
}

// --- The real thing on this machine
// ----------------------------------------------------------------

TEST(GpuBackendReal, DlopenPathWithoutADriver) {
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (libcuda == nullptr) libcuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (libcuda != nullptr) GTEST_SKIP() << "a GPU driver is installed here";
  std::ostringstream text;
  auto logger = std::make_shared<spdlog::logger>(
      "real", std::make_shared<spdlog::sinks::ostream_sink_mt>(text));
  GpuConfig config;
  auto b = make_cupti_backend(config, *logger);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->device().sm_count, 0);
  const auto status = b->status();
  ASSERT_EQ(status.size(), 4u);
  for (const auto& s : status) {
    EXPECT_FALSE(s.active);
    EXPECT_EQ(s.reason, "no GPU driver (libcuda.so.1 not found)") << s.name;
  }
  b->start();
  EXPECT_FALSE(b->start_trace());
  b->stop_trace();
  b->flush();
  GpuEventBatch batch;
  b->drain(batch);
  EXPECT_TRUE(batch.kernels.empty());
  b->range_push("x");
  b->range_pop();
  b->stop();
  std::string error;
  EXPECT_EQ(load_cuda_driver(&error), nullptr);
  EXPECT_EQ(error, "no GPU driver (libcuda.so.1 not found)");
}

TEST(GpuBackendReal, MissingEntryPointsAnswerNotImplemented) {
  // A "libcupti" without CUPTI's symbols (libm, through gpu.cupti_path): every entry point,
  // subscribe included (neither cuptiSubscribe_v2 nor its fallback), answers API_NOT_IMPLEMENTED.
  if (dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD) != nullptr ||
      dlopen("libcupti.so", RTLD_NOW | RTLD_NOLOAD) != nullptr) {
    GTEST_SKIP() << "libcupti is already loaded in this process (it would be found first)";
  }
  std::string error;
  auto api = load_cupti("libm.so.6", &error);
  ASSERT_NE(api, nullptr) << error;
  EXPECT_NE(api->origin().find("gpu.cupti_path"), std::string::npos) << api->origin();
  uint32_t version = 0;
  EXPECT_EQ(api->get_version(&version), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  CUpti_SubscriberHandle subscriber = nullptr;
  auto no_op = [](void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {};
  EXPECT_EQ(api->subscribe(&subscriber, no_op, nullptr, nullptr), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  EXPECT_EQ(api->finalize(), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  CUpti_PmSampling_Start_Params start{};
  start.structSize = CUpti_PmSampling_Start_Params_STRUCT_SIZE;
  EXPECT_EQ(api->pm_sampling_start(&start), CUPTI_ERROR_API_NOT_IMPLEMENTED);
  EXPECT_EQ(cupti_error_name(*api, CUPTI_ERROR_UNKNOWN), "CUPTI error (999)");
}

TEST(GpuBackendReal, LibcuptiLoadsWithoutADriver) {
  // This machine has the toolkit's libcupti: it loads (dlopen only; nothing is called that needs
  // a driver) and reports a CUDA 13 API version.
  std::string error;
  auto api = load_cupti("", &error);
  if (api == nullptr) GTEST_SKIP() << error;
  uint32_t version = 0;
  EXPECT_EQ(api->get_version(&version), CUPTI_SUCCESS);
  EXPECT_GE(version, 130000u);
  EXPECT_NE(api->origin().find("libcupti"), std::string::npos) << api->origin();
  // A configured path that does not exist is skipped, with the search going on.
  auto again = load_cupti("/nonexistent/libcupti.so.13", &error);
  EXPECT_NE(again, nullptr);
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
