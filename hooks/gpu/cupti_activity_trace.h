// CUPTI activity tracing (detailed windows): pure converters from CUPTI activity records to the
// vendor-neutral records of gpu_backend.h, and ActivityCollector, which owns the activity buffers
// CUPTI fills and turns completed buffers into events. Internal to hooks/.
//
// Buffers: fixed size, at most `max_buffers` allocated at a time (gpu.trace_buffer_mb in all).
// When they are all in CUPTI's hands, bufferRequested answers with no buffer and CUPTI drops and
// counts the records (cuptiActivityGetNumDroppedRecords, read in flush() and reported as
// GpuEventBatch::dropped).
//
// Thread-safety: init/enable/disable/flush/drain/shutdown from one thread at a time (the training
// thread, or the release thread at a window's end; drain() may run beside the release's
// shutdown(), under the mutex). buffer_requested/buffer_completed run on whatever thread CUPTI
// calls them from (a launching thread, CUPTI's worker, or the thread inside
// cuptiActivityFlushAll). buffer_completed only queues the buffer: the collector's converter
// thread turns it into events (a 4 MiB buffer takes milliseconds, which a launching thread, the
// trainer's among them, must not pay; kineto's bufferCompleted also only queues). Only when no
// converter thread could start is a buffer converted where CUPTI returns it. No lock of ours is
// held while calling into CUPTI, and the callbacks call nothing in CUPTI but
// cuptiActivityGetNextRecord in that fallback (kineto's ABBA deadlock: a mutex held across
// cuptiActivityFlushAll, which runs bufferCompleted synchronously).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cupti_api.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace spdlog {
class logger;
}

namespace torchpilot {
namespace detail {

// How ActivityCollector::init's reason begins when another client holds CUPTI's subscription.
inline constexpr const char* kAnotherCuptiClient = "another CUPTI client";

// --- Pure converters ---------------------------------------------------------------------------

// abi::__cxa_demangle for "_Z..." names; anything else (or a failure) comes back unchanged.
std::string demangle(const char* name);
// CUpti_ActivityMemcpyKind -> CopyKind (array copies count as their host/device side).
CopyKind to_copy_kind(uint8_t cupti_copy_kind);

// Demangled names by mangled name (bounded: cleared when it reaches `capacity`). Thread-safe.
class DemangleCache {
 public:
  explicit DemangleCache(size_t capacity = 4096) : capacity_(capacity) {}
  std::string get(const char* mangled);

 private:
  size_t capacity_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::string> names_;
};

// Records without timestamps (CUPTI leaves 0 when it ran out of device memory) or with end <
// start give nullopt. Times are converted to the steady clock with `tb`.
std::optional<KernelRecord> to_kernel(const CUpti_ActivityKernel10& r, const TimeBase& tb,
                                      DemangleCache* names = nullptr);
std::optional<CopyRecord> to_copy(const CUpti_ActivityMemcpy6& r, const TimeBase& tb);
std::optional<CopyRecord> to_memset(const CUpti_ActivityMemset4& r, const TimeBase& tb);
// Host-blocking synchronizations only: cudaStreamWaitEvent (STREAM_WAIT_EVENT) makes the GPU wait,
// not the host, and gives nullopt.
std::optional<SyncRecord> to_sync(const CUpti_ActivitySynchronization2& r, const TimeBase& tb);

// Converts one record by its kind into `out` (KERNEL and CONCURRENT_KERNEL: Kernel10, MEMCPY:
// Memcpy6, MEMSET: Memset4, SYNCHRONIZATION: Synchronization2). False for other kinds and
// records without timestamps.
bool convert_record(const CUpti_Activity& record, const TimeBase& tb, GpuEventBatch& out,
                    DemangleCache* names = nullptr);

// --- The collector -----------------------------------------------------------------------------

struct ActivityOptions {
  size_t buffer_bytes = 4u << 20;         // one activity buffer
  size_t max_buffers = 8;                 // allocated at a time (in CUPTI's hands or free)
  size_t max_pending_records = 1u << 20;  // converted, not yet drained; beyond: counted dropped
  // CUPTI's device buffer for kernel and copy timestamps, per context (0: CUPTI's default).
  size_t device_buffer_bytes = 0;
};
// 4 MiB buffers, trace_buffer_mb in all (at least one buffer; smaller buffers below 4 MiB).
ActivityOptions activity_options(int trace_buffer_mb, int trace_device_buffer_mb = 0);

class ActivityCollector {
 public:
  ActivityCollector(CuptiApi& api, const CuptiClock& clock, spdlog::logger& logger,
                    ActivityOptions options);
  ~ActivityCollector();  // shutdown()
  ActivityCollector(const ActivityCollector&) = delete;
  ActivityCollector& operator=(const ActivityCollector&) = delete;

  // Subscribes (no callback enabled yet) to learn whether another CUPTI client is attached, then
  // registers the buffer callbacks and routes CUPTI's callbacks here. Returns the reason tracing
  // is unavailable, empty when it is available.
  std::string init();
  // Enables CONCURRENT_KERNEL, MEMCPY, MEMSET and SYNCHRONIZATION, and CUPTI's callbacks on the
  // synchronizing calls (cuda{Event,Stream,Device}Synchronize, cu{Event,Stream,Ctx}Synchronize)
  // that tag sync records with their caller's thread; the calling thread is taken as the
  // trainer's. Returns the reason on failure (kernel tracing is required; the other kinds are
  // logged and skipped when refused; refused callbacks leave the thread unknown).
  std::string enable();
  void disable();
  bool enabled() const { return enabled_; }
  // cuptiActivityFlushAll (flag 0, or FLUSH_FORCED), waits until the converter has turned the
  // buffers CUPTI returned into events (bounded), then reads CUPTI's dropped-record count. Holds
  // no lock while CUPTI runs buffer_completed on this thread.
  void flush(bool forced);
  // Appends the kernels, copies and syncs converted since the last call; adds `dropped`.
  void drain(GpuEventBatch& out);
  // Disables tracing, forces a flush, unsubscribes, unroutes the callbacks, stops the converter.
  // Idempotent.
  void shutdown();

  // CUPTI's callback on a synchronizing call, on the calling thread (enable() turns them on):
  // notes the thread by the call's correlation id, to tag its sync record (SyncRecord::thread):
  // torchpilot's own (own_thread.h), the one that enabled the trace (the trainer's), or another.
  void note_sync_call(uint32_t correlation_id, bool own_thread);

  // CUPTI's buffer callbacks (through process-wide trampolines: they carry no user data).
  void buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records);
  void buffer_completed(uint8_t* buffer, size_t size, size_t valid_size);

  // Requests answered with no buffer (all in use) since construction.
  int64_t refused_requests() const;

  // Completed buffers since the last init() (a window's attachment): how many, how many CUPTI
  // delivered on the thread that enabled the trace (the trainer's), and the converter's time on
  // them. shutdown() logs them at debug level.
  struct BufferStats {
    int64_t completed = 0;
    int64_t on_trainer = 0;
    int64_t records = 0;
    Nanos convert_ns = 0;
    // CUPTI's own overhead records (CUPTI_ACTIVITY_KIND_OVERHEAD, enabled at debug level only),
    // by CUpti_ActivityOverheadKind >> 16 (0: unknown or driver compiler): their time in all, and
    // on the trainer's thread.
    static constexpr int kOverheadKinds = 10;
    int64_t overhead_count[kOverheadKinds] = {};
    Nanos overhead_ns[kOverheadKinds] = {};
    Nanos overhead_trainer_ns[kOverheadKinds] = {};
  };
  BufferStats buffer_stats() const;

 private:
  struct ReadyBuffer {
    uint8_t* buffer = nullptr;
    size_t valid_size = 0;
  };
  void start_converter();
  void stop_converter();
  void converter_loop();
  // Records of `buffer` into pending_; the buffer back to the free list.
  void convert(const ReadyBuffer& b);

  CuptiApi& api_;
  const CuptiClock& clock_;
  spdlog::logger& logger_;
  ActivityOptions options_;
  uint64_t id_;  // owner tag of the buffers this collector allocates
  DemangleCache names_;
  bool subscribed_ = false;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  bool routed_ = false;
  // CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER was set by init(): shutdown() puts it back.
  bool zeroed_out_set_ = false;
  bool enabled_ = false;
  bool sync_callbacks_ = false;  // some sync callbacks enabled (enable() to disable())
  // Every sync callback was enabled for the current window and no caller was forgotten: a sync
  // record with no caller was made by no program call (SyncThread::kInternal).
  bool all_sync_callers_known_ = false;
  std::vector<CUpti_ActivityKind> enabled_kinds_;
  static constexpr size_t kMaxSyncCallers = 4096;

  mutable std::mutex mutex_;  // guards what follows
  GpuEventBatch pending_;     // kernels, copies, syncs, dropped
  size_t pending_records_ = 0;
  std::vector<uint8_t*> free_buffers_;
  size_t allocated_buffers_ = 0;
  int64_t refused_ = 0;
  bool refusal_logged_ = false;
  std::thread::id trainer_;        // the thread that called enable()
  uint32_t trainer_cupti_id_ = 0;  // its id as CUPTI's records give it (pthread_self)
  std::unordered_map<uint32_t, SyncThread> sync_callers_;  // correlation id -> caller's thread
  std::deque<ReadyBuffer> ready_;                          // completed, not yet converted
  int converting_ = 0;                                     // taken from ready_, being converted
  std::condition_variable ready_cv_;      // a buffer queued, or converter_running_ cleared
  std::condition_variable converted_cv_;  // ready_ empty and nothing being converted
  bool converter_running_ = false;  // the converter takes queued buffers (else: stop once empty)
  std::thread converter_;           // absent: buffers are converted where CUPTI returns them
  bool converter_failure_logged_ = false;
  BufferStats stats_;
};

}  // namespace detail
}  // namespace torchpilot
