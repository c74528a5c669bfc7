// GPU step markers (hooks/gpu/cuda_markers.*) on a fake CUDA driver whose events complete when
// the test says (the GPU "reaching" them), and through the CUPTI backend.
#include "torchpilot/hooks/gpu/cuda_markers.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "torchpilot/hooks/gpu/cuda_driver.h"
#include "torchpilot/hooks/gpu/cupti_api.h"
#include "torchpilot/hooks/gpu/cupti_backend.h"
#include "torchpilot/hooks/gpu/marker_stream.h"
#include "torchpilot/hooks/gpu/nvml_sampler.h"
#include "torchpilot/runtime/core/config.h"

namespace torchpilot {
namespace detail {
namespace {

CUcontext fake_ptr(uintptr_t v) { return reinterpret_cast<CUcontext>(v); }

// Events are numbered handles. Events on the private stream (the anchors) complete when recorded,
// at the fake host clock's time; the others (markers on the trainer's stream) when the test calls
// gpu_reaches(). GPU time and the host clock are the same clock here.
class FakeEventDriver final : public CudaDriverApi {
 public:
  struct Event {
    bool recorded = false, done = false;
    Nanos gpu_time = 0;
    CUstream stream = nullptr;
    uint64_t seq = 0;  // recording order
  };
  mutable std::mutex mutex;
  Nanos host = 1000000000;       // the fake steady clock, ns
  Nanos host_step = 100;         // each reading advances it (a driver call's duration)
  Nanos slow_private_query = 0;  // extra host time a query of an anchor takes
  bool refuse_negative = false;  // elapsed time of an end event older than the start: error
  CUresult stream_create_result = CUDA_SUCCESS;
  CUcontext current = fake_ptr(0xC0);
  CUdevice current_device = 0;
  // Device 1's primary context (a trainer whose tensors live on GPU 1 while its thread keeps GPU
  // 0 current): active once the trainer used it; pushed and popped around a marker.
  bool primary_active = false;
  CUcontext primary = fake_ptr(0xD1);
  std::vector<std::pair<CUcontext, CUdevice>> pushed_stack;
  int pushes = 0, pops = 0, retains = 0, releases = 0;
  CUresult pop_result = CUDA_SUCCESS;
  CUcontext last_set = nullptr;
  std::vector<CUcontext> record_contexts;  // the context current at each event_record
  std::map<uintptr_t, Event> events;
  uintptr_t next_handle = 1;
  uint64_t next_seq = 1;
  std::vector<CUstream> private_streams;
  int streams_created = 0, streams_destroyed = 0, events_destroyed = 0, set_current = 0;

  Nanos now() {
    std::lock_guard<std::mutex> lock(mutex);
    host += host_step;
    return host;
  }
  // The GPU reaches the oldest pending marker, at `t`.
  bool gpu_reaches(Nanos t) {
    std::lock_guard<std::mutex> lock(mutex);
    Event* oldest = nullptr;
    for (auto& [h, e] : events) {
      if (e.recorded && !e.done && !is_private(e.stream) &&
          (oldest == nullptr || e.seq < oldest->seq)) {
        oldest = &e;
      }
    }
    if (oldest == nullptr) return false;
    oldest->done = true;
    oldest->gpu_time = t;
    return true;
  }

  // Probe (for the backend test).
  CUresult init(unsigned) override { return CUDA_SUCCESS; }
  CUresult device_get_count(int* c) override {
    *c = 1;
    return CUDA_SUCCESS;
  }
  CUresult device_get(CUdevice* d, int ordinal) override {
    *d = ordinal;
    return CUDA_SUCCESS;
  }
  CUresult device_get_name(char* out, int len, CUdevice) override {
    std::strncpy(out, "Fake GPU", static_cast<size_t>(len));
    return CUDA_SUCCESS;
  }
  CUresult device_get_attribute(int* v, CUdevice_attribute a, CUdevice) override {
    *v = a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 9;
    return CUDA_SUCCESS;
  }
  CUresult device_get_pci_bus_id(char* out, int len, CUdevice) override {
    std::strncpy(out, "0000:01:00.0", static_cast<size_t>(len));
    return CUDA_SUCCESS;
  }
  CUresult get_error_name(CUresult, const char** s) override {
    *s = "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
  }
  CUresult get_error_string(CUresult, const char** s) override {
    *s = "fake error";
    return CUDA_SUCCESS;
  }

  // Markers.
  CUresult ctx_get_current(CUcontext* c) override {
    std::lock_guard<std::mutex> lock(mutex);
    *c = current;
    return CUDA_SUCCESS;
  }
  CUresult ctx_set_current(CUcontext c) override {
    std::lock_guard<std::mutex> lock(mutex);
    ++set_current;
    last_set = c;
    return CUDA_SUCCESS;
  }
  CUresult ctx_get_device(CUdevice* d) override {
    std::lock_guard<std::mutex> lock(mutex);
    *d = current_device;
    return CUDA_SUCCESS;
  }
  CUresult ctx_push_current(CUcontext c) override {
    std::lock_guard<std::mutex> lock(mutex);
    ++pushes;
    pushed_stack.emplace_back(current, current_device);
    current = c;
    current_device = c == primary ? 1 : current_device;
    return CUDA_SUCCESS;
  }
  CUresult ctx_pop_current(CUcontext* c) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (pushed_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (pop_result != CUDA_SUCCESS) return pop_result;
    ++pops;
    *c = current;
    std::tie(current, current_device) = pushed_stack.back();
    pushed_stack.pop_back();
    return CUDA_SUCCESS;
  }
  CUresult primary_ctx_get_state(CUdevice d, unsigned* flags, int* active) override {
    std::lock_guard<std::mutex> lock(mutex);
    *flags = 0;
    *active = d == 1 && primary_active ? 1 : 0;
    return CUDA_SUCCESS;
  }
  CUresult primary_ctx_retain(CUcontext* c, CUdevice d) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (d != 1) return CUDA_ERROR_INVALID_DEVICE;
    ++retains;
    *c = primary;
    return CUDA_SUCCESS;
  }
  CUresult primary_ctx_release(CUdevice d) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (d == 1) ++releases;
    return CUDA_SUCCESS;
  }
  CUresult stream_create(CUstream* s, unsigned flags) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (stream_create_result != CUDA_SUCCESS) return stream_create_result;
    EXPECT_EQ(flags, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
    *s = reinterpret_cast<CUstream>(0x5000 + ++streams_created);
    private_streams.push_back(*s);
    return CUDA_SUCCESS;
  }
  CUresult stream_destroy(CUstream) override {
    std::lock_guard<std::mutex> lock(mutex);
    ++streams_destroyed;
    return CUDA_SUCCESS;
  }
  CUresult event_create(CUevent* e, unsigned flags) override {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(flags & CU_EVENT_DISABLE_TIMING, 0u);
    const uintptr_t h = next_handle++;
    events[h] = Event{};
    *e = reinterpret_cast<CUevent>(h);
    return CUDA_SUCCESS;
  }
  CUresult event_record(CUevent e, CUstream s) override {
    std::lock_guard<std::mutex> lock(mutex);
    Event& ev = events.at(reinterpret_cast<uintptr_t>(e));
    ev.recorded = true;
    ev.seq = next_seq++;
    ev.stream = s;
    ev.done = is_private(s);
    ev.gpu_time = host;
    record_contexts.push_back(current);
    return CUDA_SUCCESS;
  }
  CUresult event_query(CUevent e) override {
    std::lock_guard<std::mutex> lock(mutex);
    const Event& ev = events.at(reinterpret_cast<uintptr_t>(e));
    if (is_private(ev.stream)) host += slow_private_query;
    return ev.done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  }
  CUresult event_elapsed_time(float* ms, CUevent a, CUevent b) override {
    std::lock_guard<std::mutex> lock(mutex);
    const Event& ea = events.at(reinterpret_cast<uintptr_t>(a));
    const Event& eb = events.at(reinterpret_cast<uintptr_t>(b));
    if (!ea.done || !eb.done) return CUDA_ERROR_NOT_READY;
    if (refuse_negative && eb.gpu_time < ea.gpu_time) return CUDA_ERROR_INVALID_VALUE;
    *ms = static_cast<float>(static_cast<double>(eb.gpu_time - ea.gpu_time) / 1e6);
    return CUDA_SUCCESS;
  }
  CUresult event_destroy(CUevent) override {
    std::lock_guard<std::mutex> lock(mutex);
    ++events_destroyed;
    return CUDA_SUCCESS;
  }

 private:
  bool is_private(CUstream s) const {
    for (CUstream p : private_streams) {
      if (p == s) return true;
    }
    return false;
  }
};

void* trainer_stream(int) { return reinterpret_cast<void*>(0x7777); }
int asked_device = -1;
void* stream_of_device(int device) {
  asked_device = device;
  return reinterpret_cast<void*>(0x7000 + device);
}

// The process-wide stream provider for one test, reset whatever the test's end.
struct ScopedStreamProvider {
  explicit ScopedStreamProvider(MarkerStreamProvider p) { set_marker_stream_provider(p); }
  ~ScopedStreamProvider() { set_marker_stream_provider(nullptr); }
};

struct MarkerRig {
  FakeEventDriver driver;
  std::ostringstream log_text;
  std::shared_ptr<spdlog::logger> logger;
  std::unique_ptr<CudaMarkers> markers;

  explicit MarkerRig(size_t pool = 16, int device = 0) {
    logger = std::make_shared<spdlog::logger>(
        "markers", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
    MarkerOptions o;
    o.pool = pool;
    o.thread = false;
    o.now = [this] { return driver.now(); };
    markers = std::make_unique<CudaMarkers>(driver, device, *logger, o);
  }
  // The first boundary with a context current starts the markers; the resolver sets up.
  void start() {
    ASSERT_FALSE(markers->record(100));
    markers->resolve_once();
  }
  std::vector<MarkerRecord> drain() {
    std::vector<MarkerRecord> out;
    markers->drain(out);
    return out;
  }
};

TEST(CudaMarkersTest, NothingIsRecordedWithoutAContextOnTheThread) {
  MarkerRig rig;
  rig.driver.current = nullptr;
  EXPECT_FALSE(rig.markers->record(1));
  rig.markers->resolve_once();
  EXPECT_FALSE(rig.markers->record(2));
  EXPECT_EQ(rig.markers->counters().no_context, 2);
  EXPECT_EQ(rig.driver.streams_created, 0) << "no set-up, and no context created by us";
  EXPECT_EQ(rig.driver.set_current, 0);
}

TEST(CudaMarkersTest, AnotherDevicesContextIsNotMarked) {
  MarkerRig rig;
  rig.driver.current_device = 1;  // observing device 0
  EXPECT_FALSE(rig.markers->record(1));
  rig.markers->resolve_once();
  EXPECT_FALSE(rig.markers->record(2));
  EXPECT_EQ(rig.markers->counters().other_context, 2);
  EXPECT_EQ(rig.driver.streams_created, 0);
  // Said once, with the device observed.
  const std::string log = rig.log_text.str();
  const std::string said = "current CUDA context is not GPU 0's (gpu.device)";
  ASSERT_NE(log.find(said), std::string::npos) << log;
  EXPECT_EQ(log.find(said, log.find(said) + 1), std::string::npos) << log;
}

// A trainer on GPU 1 whose thread keeps GPU 0 current (LibTorch's device guard restores it after
// each op on a cuda:1 tensor): markers wait until GPU 1's primary context is active, then are
// recorded on GPU 1's current stream with that context pushed, and the thread's own comes back.
TEST(CudaMarkersTest, AThreadKeepingAnotherGpuCurrentGetsMarkersInTheObservedGpusContext) {
  const ScopedStreamProvider provider(&stream_of_device);
  MarkerRig rig(16, 1);  // observing GPU 1; the thread has GPU 0's context (0xC0) current
  EXPECT_FALSE(rig.markers->record(1)) << "GPU 1 has no active context: none is created";
  EXPECT_EQ(rig.driver.retains, 0);
  EXPECT_EQ(rig.markers->counters().other_context, 1);

  rig.driver.primary_active = true;  // the trainer's first op on cuda:1
  EXPECT_FALSE(rig.markers->record(2)) << "the first sight starts the resolver";
  EXPECT_EQ(rig.driver.retains, 1);
  rig.markers->resolve_once();
  ASSERT_TRUE(rig.markers->record(3));
  ASSERT_TRUE(rig.markers->record(4));
  EXPECT_EQ(rig.driver.pushes, 2);
  EXPECT_EQ(rig.driver.pops, 2);
  EXPECT_EQ(rig.driver.current, fake_ptr(0xC0)) << "the thread's own context is current again";
  EXPECT_EQ(rig.driver.current_device, 0);
  EXPECT_EQ(asked_device, 1) << "the stream is GPU 1's current one";
  int in_primary_on_its_stream = 0;
  for (const auto& [h, e] : rig.driver.events) {
    if (e.recorded && e.stream == reinterpret_cast<CUstream>(0x7001)) ++in_primary_on_its_stream;
  }
  EXPECT_EQ(in_primary_on_its_stream, 2);
  for (size_t i = rig.driver.record_contexts.size() - 2; i < rig.driver.record_contexts.size();
       ++i) {
    EXPECT_EQ(rig.driver.record_contexts[i], fake_ptr(0xD1)) << "recorded in GPU 1's context";
  }
  EXPECT_EQ(rig.markers->counters().pushed, 2);

  ASSERT_TRUE(rig.driver.gpu_reaches(rig.driver.host + 1000000));
  rig.markers->resolve_once();
  const auto done = rig.drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 3u);
  const std::string log = rig.log_text.str();
  EXPECT_NE(log.find("recorded on GPU 1's current stream with its context pushed"),
            std::string::npos)
      << log;
  rig.markers->stop();
  EXPECT_EQ(rig.driver.releases, 1) << "the retained context is released once";
  rig.markers->stop();
  EXPECT_EQ(rig.driver.releases, 1);
}

// The single-GPU case: the thread's own context was the observed GPU's when first seen; another
// context current later is skipped (we hold no reference to push it), as before.
TEST(CudaMarkersTest, TheThreadsOwnContextIsNeverPushed) {
  MarkerRig rig;  // observing GPU 0, the thread's current
  rig.start();
  ASSERT_TRUE(rig.markers->record(1));
  rig.driver.current = fake_ptr(0xC1);  // the thread switched to another context
  rig.driver.current_device = 1;
  EXPECT_FALSE(rig.markers->record(2));
  EXPECT_EQ(rig.driver.pushes, 0);
  EXPECT_EQ(rig.driver.retains, 0);
  EXPECT_EQ(rig.markers->counters().other_context, 1);
  EXPECT_EQ(rig.markers->counters().pushed, 0);
}

// A pop that fails leaves the observed context on the thread: the trainer's is made current again
// and markers turn off with one line.
TEST(CudaMarkersTest, AFailedPopRestoresTheThreadsContextAndTurnsMarkersOff) {
  MarkerRig rig(16, 1);
  rig.driver.primary_active = true;
  rig.start();
  rig.driver.pop_result = CUDA_ERROR_INVALID_CONTEXT;
  EXPECT_FALSE(rig.markers->record(1));
  EXPECT_EQ(rig.driver.last_set, fake_ptr(0xC0)) << "the thread's own context is set back";
  EXPECT_NE(rig.markers->reason().find("cuCtxPopCurrent failed"), std::string::npos);
  EXPECT_FALSE(rig.markers->record(2)) << "off for good";
  EXPECT_EQ(rig.driver.pushes, 1);
}

TEST(CudaMarkersTest, MarkersOnTheTrainersStreamResolveInOrderToSteadyTime) {
  const ScopedStreamProvider provider(&trainer_stream);
  MarkerRig rig;
  rig.start();
  EXPECT_EQ(rig.driver.set_current, 1) << "the resolver makes the context current";
  ASSERT_TRUE(rig.markers->record(1));
  ASSERT_TRUE(rig.markers->record(2));
  int on_trainer_stream = 0;
  for (const auto& [h, e] : rig.driver.events) {
    if (e.recorded && e.stream == reinterpret_cast<CUstream>(0x7777)) ++on_trainer_stream;
  }
  EXPECT_EQ(on_trainer_stream, 2) << "recorded on the provider's stream";
  rig.markers->resolve_once();
  EXPECT_TRUE(rig.drain().empty()) << "the GPU has not reached them";

  const Nanos t1 = rig.driver.host + 5000000;  // 5 ms after now
  ASSERT_TRUE(rig.driver.gpu_reaches(t1));
  rig.markers->resolve_once();
  auto done = rig.drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_NEAR(static_cast<double>(done[0].time), static_cast<double>(t1), 1000.0);

  ASSERT_TRUE(rig.driver.gpu_reaches(t1 + 7000000));
  rig.markers->resolve_once();
  done = rig.drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 2u);
  EXPECT_NEAR(static_cast<double>(done[0].time), static_cast<double>(t1 + 7000000), 1000.0);
  EXPECT_EQ(rig.markers->counters().recorded, 2);
  EXPECT_EQ(rig.markers->counters().resolved, 2);
  EXPECT_LE(rig.markers->counters().anchor_error_ns, 1000);
}

TEST(CudaMarkersTest, ThePoolIsBoundedAndReusedOnceMarkersResolve) {
  MarkerRig rig(8);
  rig.start();
  for (uint64_t id = 1; id <= 5; ++id) ASSERT_TRUE(rig.markers->record(id, 3));
  EXPECT_FALSE(rig.markers->record(6, 3)) << "an optional marker leaves 3 events free";
  for (uint64_t id = 6; id <= 8; ++id) ASSERT_TRUE(rig.markers->record(id));
  EXPECT_FALSE(rig.markers->record(9)) << "every event in flight";
  EXPECT_EQ(rig.markers->counters().pool_exhausted, 2);
  rig.driver.gpu_reaches(rig.driver.host);
  rig.markers->resolve_once();
  EXPECT_TRUE(rig.markers->record(10));
  EXPECT_EQ(rig.drain().size(), 1u);
}

TEST(CudaMarkersTest, AnchorIsRenewedAndOlderMarkersStillResolve) {
  MarkerRig rig;
  rig.driver.refuse_negative = true;  // a driver that refuses end-before-start intervals
  rig.start();
  ASSERT_TRUE(rig.markers->record(1));
  const Nanos t = rig.driver.host + 1000;
  rig.driver.gpu_reaches(t);      // completed, not yet polled ...
  rig.driver.host += 3000000000;  // ... when the anchor is 3 s old: renewed first
  rig.markers->resolve_once();
  EXPECT_EQ(rig.markers->counters().anchors, 2);
  const auto done = rig.drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_NEAR(static_cast<double>(done[0].time), static_cast<double>(t), 1000.0)
      << "a marker older than the anchor";
}

TEST(CudaMarkersTest, AnImpreciseAnchorIsRetriedOnAnotherStream) {
  MarkerRig rig;
  rig.driver.slow_private_query = 200000;  // each anchor query takes 0.2 ms: too imprecise
  rig.start();
  ASSERT_TRUE(rig.markers->record(1));
  rig.driver.gpu_reaches(rig.driver.host);
  for (int i = 0; i < CudaMarkers::kAnchorFailuresBeforeNewStream - 1; ++i) {
    rig.markers->resolve_once();
  }
  EXPECT_TRUE(rig.drain().empty()) << "no anchor, no times";
  EXPECT_EQ(rig.markers->counters().anchor_failures, CudaMarkers::kAnchorFailuresBeforeNewStream);
  EXPECT_EQ(rig.markers->counters().streams_replaced, 1);
  rig.driver.slow_private_query = 0;
  rig.markers->resolve_once();
  EXPECT_EQ(rig.drain().size(), 1u);
}

TEST(CudaMarkersTest, ASetUpFailureTurnsMarkersOffWithOneLine) {
  MarkerRig rig;
  rig.driver.stream_create_result = CUDA_ERROR_OUT_OF_MEMORY;
  rig.start();
  EXPECT_FALSE(rig.markers->record(1));
  EXPECT_FALSE(rig.markers->reason().empty());
  rig.logger->flush();
  EXPECT_NE(rig.log_text.str().find("GPU step markers off"), std::string::npos);
  rig.markers->stop();
  EXPECT_FALSE(rig.markers->record(2));
}

TEST(CudaMarkersTest, StopDestroysEveryEventAndTheStream) {
  MarkerRig rig(8);
  rig.start();
  ASSERT_TRUE(rig.markers->record(1));
  rig.markers->stop();
  EXPECT_EQ(rig.driver.events_destroyed, 8 + 2);  // the pool and both anchor events
  EXPECT_EQ(rig.driver.streams_destroyed, 1);
  EXPECT_FALSE(rig.markers->record(2));
  rig.markers->stop();  // idempotent
}

TEST(CudaMarkersTest, TheResolverThreadResolvesAndJoins) {
  FakeEventDriver driver;
  auto logger = std::make_shared<spdlog::logger>("markers-thread",
                                                 std::make_shared<spdlog::sinks::null_sink_mt>());
  MarkerOptions o;
  o.now = [&driver] { return driver.now(); };
  CudaMarkers markers(driver, 0, *logger, o);
  EXPECT_FALSE(markers.record(1));  // starts the resolver
  // Bounded wait for its set-up (a failure here means it never came up).
  bool recorded = false;
  for (int i = 0; i < 5000 && !recorded; ++i) {
    recorded = markers.record(2);
    if (!recorded) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(recorded);
  driver.gpu_reaches(driver.now());
  markers.await(2, 10000000000);
  std::vector<MarkerRecord> out;
  markers.drain(out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id, 2u);
  markers.stop();
  EXPECT_EQ(driver.streams_destroyed, 1);
}

TEST(CudaMarkersTest, TheCuptiBackendForwardsMarkers) {
  auto owned = std::make_unique<FakeEventDriver>();
  FakeEventDriver* driver = owned.get();
  std::ostringstream log_text;
  auto logger = std::make_shared<spdlog::logger>(
      "backend", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
  GpuConfig config;
  config.nvtx = false;
  GpuVendorLoaders loaders;
  loaders.driver = [&owned](std::string*) -> std::unique_ptr<CudaDriverApi> {
    return std::move(owned);
  };
  loaders.cupti = [](std::string* e) -> std::unique_ptr<CuptiApi> {
    *e = "libcupti not found (test)";
    return nullptr;
  };
  loaders.nvml = [](std::string* e) -> std::unique_ptr<NvmlApi> {
    *e = "NVML not found (test)";
    return nullptr;
  };
  auto backend = make_cupti_backend(config, *logger, std::move(loaders));
  ASSERT_EQ(backend->device().sm_count, 132);
  bool recorded = false;
  for (int i = 0; i < 5000 && !recorded; ++i) {
    recorded = backend->record_marker(7);
    if (!recorded) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(recorded);
  driver->gpu_reaches(driver->now());
  backend->await_marker(7, 10000000000);
  GpuEventBatch batch;
  backend->drain(batch);
  ASSERT_EQ(batch.markers.size(), 1u);
  EXPECT_EQ(batch.markers[0].id, 7u);
  backend->stop();
  EXPECT_FALSE(backend->record_marker(8));

  // Off in the configuration: never recorded.
  GpuConfig off = config;
  off.step_markers = false;
  GpuVendorLoaders l2;
  l2.driver = [](std::string*) -> std::unique_ptr<CudaDriverApi> {
    return std::make_unique<FakeEventDriver>();
  };
  auto quiet = make_cupti_backend(off, *logger, std::move(l2));
  EXPECT_FALSE(quiet->record_marker(1));
  EXPECT_FALSE(quiet->record_marker(2));
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
