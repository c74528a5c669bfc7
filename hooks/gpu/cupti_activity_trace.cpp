// The activity buffer collector: CUPTI activity tracing's lifecycle, buffers and their conversion.
#include "cupti_activity_trace.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <iterator>
#include <shared_mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "cupti_activity_internal.h"
#include "op_symbols.h"
#include "own_thread.h"
#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/gpu/host_op_scopes.h"
#include "torchpilot/runtime/gpu/kernel_classes.h"

namespace torchpilot {
namespace detail {

using namespace activity_internal;

namespace {

std::atomic<uint64_t> next_collector_id{1};

const char* kind_name(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return "CONCURRENT_KERNEL";
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return "MEMCPY";
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return "MEMSET";
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      return "SYNCHRONIZATION";
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
      return "OVERHEAD";
    default:
      return "?";
  }
}

}  // namespace

// --- ActivityCollector -------------------------------------------------------------------------

ActivityOptions activity_options(int trace_buffer_mb, int trace_device_buffer_mb) {
  ActivityOptions o;
  o.device_buffer_bytes = static_cast<size_t>(std::max(0, trace_device_buffer_mb)) << 20;
  const size_t total = static_cast<size_t>(std::max(1, trace_buffer_mb)) << 20;
  o.buffer_bytes = std::min<size_t>(4u << 20, total);
  o.max_buffers = std::max<size_t>(1, total / o.buffer_bytes);
  return o;
}

ActivityCollector::ActivityCollector(CuptiApi& api, const CuptiClock& clock, spdlog::logger& logger,
                                     ActivityOptions options)
    : api_(api),
      clock_(clock),
      logger_(logger),
      options_(options),
      id_(next_collector_id.fetch_add(1)) {}

ActivityCollector::~ActivityCollector() {
  (void)failure_of([&] { shutdown(); });  // a destructor must not throw
  stop_converter();                       // shutdown() may have thrown before it
  std::lock_guard<std::mutex> lock(mutex_);
  for (uint8_t* b : free_buffers_) free_buffer(b);
  free_buffers_.clear();
  for (const ReadyBuffer& b : ready_) free_buffer(b.buffer);
  ready_.clear();
}

void ActivityCollector::start_converter() {
  if (converter_.joinable()) return;
  {
    // Before the thread: it runs while this is set. No buffer comes back meanwhile (the routing
    // to this collector comes after).
    std::lock_guard<std::mutex> lock(mutex_);
    converter_running_ = true;
  }
  try {
    converter_ = std::thread([this] {
      try {
        mark_own_thread("tp-cupti-conv");
      } catch (...) {  // unnamed and uncounted: it still converts
      }
      converter_loop();
    });
  } catch (...) {
    // Converted where CUPTI returns them, as before the thread existed: slower launches only.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      converter_running_ = false;
    }
    if (!converter_failure_logged_) {
      converter_failure_logged_ = true;
      logger_.warn("CUPTI activity: no converter thread; buffers converted as CUPTI returns them");
    }
  }
}

void ActivityCollector::stop_converter() {
  if (!converter_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    converter_running_ = false;  // no more queued; what is queued is converted first
  }
  ready_cv_.notify_all();
  converter_.join();
}

void ActivityCollector::converter_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ready_cv_.wait(lock, [&] { return !converter_running_ || !ready_.empty(); });
    if (ready_.empty()) return;  // stopping, nothing left
    const ReadyBuffer b = ready_.front();
    ready_.pop_front();
    ++converting_;
    lock.unlock();
    try {
      convert(b);
    } catch (...) {
      // The buffer's records are lost (a failed allocation); the buffer itself goes back, or is
      // freed when even that fails.
      try {
        std::memset(b.buffer, 0, options_.buffer_bytes);  // CUPTI expects it zeroed
        std::lock_guard<std::mutex> relock(mutex_);
        free_buffers_.push_back(b.buffer);
      } catch (...) {
        free_buffer(b.buffer);
      }
    }
    lock.lock();
    --converting_;
    if (ready_.empty() && converting_ == 0) converted_cv_.notify_all();
  }
}

std::string ActivityCollector::init() {
  CUpti_SubscriberParams params{};
  params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  params.subscriberName = "torchpilot";
  char other[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1] = {0};
  params.oldSubscriberName = other;
  params.oldSubscriberSize = sizeof other - 1;
  const CUptiResult r = api_.subscribe(&subscriber_, on_callback, nullptr, &params);
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    std::string reason = std::string(kAnotherCuptiClient) +
                         " (Nsight Systems, PyTorch's profiler) is attached: activity tracing off";
    // Kineto subscribes without a name ("CUPTI for <not provided>"): only a real name is shown.
    const std::string name(other);
    if (!name.empty() && name.find("not provided") == std::string::npos) {
      reason += " (CUPTI names it: " + name + ")";
    }
    return reason;
  }
  if (r != CUPTI_SUCCESS) return "cuptiSubscribe failed: " + cupti_error_name(api_, r);
  subscribed_ = true;
  OpSymbolIndex::instance().build_async();  // ready long before a window names a sync's op
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_ = BufferStats{};  // counted per attachment (a window)
  }
  start_converter();  // before the routing: a buffer may come back at once
  {
    std::unique_lock<std::shared_mutex> lock(route_mutex());
    if (route() != nullptr && route() != this) {
      logger_.warn("CUPTI activity: a second GPU backend takes over the activity callbacks");
    }
    route() = this;
    routed_ = true;
  }
  {
    // Before any kind is enabled: CUPTI sizes the context's device buffers when it attaches. The
    // attribute is process-wide: 0 puts back the size CUPTI had when first asked.
    static std::atomic<size_t> cupti_default{0};
    size_t bytes = 0, size = sizeof bytes;
    if (api_.activity_get_attribute(CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, &size, &bytes) !=
        CUPTI_SUCCESS) {
      bytes = 0;
    }
    size_t expected = 0;
    if (bytes > 0) cupti_default.compare_exchange_strong(expected, bytes);
    size_t want =
        options_.device_buffer_bytes > 0 ? options_.device_buffer_bytes : cupti_default.load();
    if (want > 0 && want != bytes) {
      size = sizeof want;
      const CUptiResult ra =
          api_.activity_set_attribute(CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, &size, &want);
      logger_.debug("CUPTI activity: device buffer {} KiB (was {} KiB){}", want >> 10, bytes >> 10,
                    ra == CUPTI_SUCCESS ? "" : ": refused, " + cupti_error_name(api_, ra));
    } else {
      logger_.debug("CUPTI activity: device buffer {} KiB", bytes >> 10);
    }
  }
  {
    // Our buffers come zeroed (calloc, then memset after conversion): CUPTI then need not zero
    // 4 MiB inside the launch that asks for one. Process-wide: put back at shutdown.
    uint8_t zeroed = 1;
    size_t size = sizeof zeroed;
    zeroed_out_set_ = api_.activity_set_attribute(CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER,
                                                  &size, &zeroed) == CUPTI_SUCCESS;
  }
  const CUptiResult rr = api_.activity_register_callbacks(on_buffer_requested, on_buffer_completed);
  if (rr != CUPTI_SUCCESS) {
    shutdown();
    return "cuptiActivityRegisterCallbacks failed: " + cupti_error_name(api_, rr);
  }
  logger_.debug("CUPTI activity: {} buffers of {} KiB at most", options_.max_buffers,
                options_.buffer_bytes >> 10);
  return {};
}

std::string ActivityCollector::enable() {
  if (enabled_) return {};
  if (!routed_) return "activity tracing is not initialized";
  std::vector<CUpti_ActivityKind> kinds = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                           CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
                                           CUPTI_ACTIVITY_KIND_SYNCHRONIZATION};
  // CUPTI's account of its own overhead, for the debug line at shutdown: a diagnostic only.
  if (logger_.should_log(spdlog::level::debug)) kinds.push_back(CUPTI_ACTIVITY_KIND_OVERHEAD);
  for (const auto kind : kinds) {
    const CUptiResult r = api_.activity_enable(kind);
    if (r == CUPTI_SUCCESS) {
      enabled_kinds_.push_back(kind);
      continue;
    }
    const std::string why = std::string("cuptiActivityEnable(") + kind_name(kind) +
                            ") failed: " + cupti_error_name(api_, r);
    if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) return why;
    logger_.warn("CUPTI activity: {}; traced without it", why);
  }
  {
    // enable() runs on the thread that runs the steps (the monitor's start of a window).
    std::lock_guard<std::mutex> lock(mutex_);
    trainer_ = std::this_thread::get_id();
    trainer_cupti_id_ = static_cast<uint32_t>(pthread_self());
    sync_callers_.clear();
  }
  // Callbacks on the synchronizing calls only (a few per step): without them every sync record's
  // thread is unknown and counts, as before.
  int refused = 0;
  for (const SyncCallbackId& c : kSyncCallbacks) {
    if (api_.enable_callback(1, subscriber_, c.domain, c.cbid) != CUPTI_SUCCESS) ++refused;
  }
  for (const SyncCallbackId& c : kCopyCallbacks) {  // op names only: a refusal loses no figure
    api_.enable_callback(1, subscriber_, c.domain, c.cbid);
  }
  sync_callbacks_ = refused < static_cast<int>(std::size(kSyncCallbacks));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all_sync_callers_known_ = refused == 0;
  }
  if (refused > 0) {
    logger_.debug("CUPTI activity: {} of {} sync callbacks refused; their syncs' thread unknown",
                  refused, std::size(kSyncCallbacks));
  }
  enabled_ = true;
  return {};
}

void ActivityCollector::note_sync_call(uint32_t correlation_id, bool own_thread) {
  const SyncThread thread = own_thread ? SyncThread::kOwn : SyncThread::kOther;
  std::lock_guard<std::mutex> lock(mutex_);
  // Entries whose record never came (dropped, or the other id of a runtime/driver pair) are
  // forgotten in bulk: a record whose entry went with them counts with its thread unknown.
  if (sync_callers_.size() >= kMaxSyncCallers) {
    sync_callers_.clear();
    all_sync_callers_known_ = false;
  }
  sync_callers_[correlation_id] =
      !own_thread && std::this_thread::get_id() == trainer_ ? SyncThread::kTrainer : thread;
}

void ActivityCollector::disable() {
  if (sync_callbacks_) {
    for (const SyncCallbackId& c : kSyncCallbacks) {
      api_.enable_callback(0, subscriber_, c.domain, c.cbid);
    }
    sync_callbacks_ = false;
  }
  if (enabled_) {
    for (const SyncCallbackId& c : kCopyCallbacks) {
      api_.enable_callback(0, subscriber_, c.domain, c.cbid);
    }
  }
  for (const auto kind : enabled_kinds_) api_.activity_disable(kind);
  enabled_kinds_.clear();
  enabled_ = false;
}

void ActivityCollector::flush(bool forced) {
  if (!routed_) return;
  // No lock held: CUPTI calls buffer_completed on this thread before returning.
  const CUptiResult r = api_.activity_flush_all(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
  if (r != CUPTI_SUCCESS) logger_.debug("cuptiActivityFlushAll: {}", cupti_error_name(api_, r));
  {
    // What the flush returned is converted before the caller drains it. Bounded (conversion is
    // tens of milliseconds a buffer): what is not converted by then reaches a later drain.
    std::unique_lock<std::mutex> lock(mutex_);
    if (!converted_cv_.wait_for(lock, std::chrono::seconds(1),
                                [&] { return ready_.empty() && converting_ == 0; })) {
      logger_.debug("CUPTI activity: {} buffers still being converted after a flush",
                    ready_.size() + static_cast<size_t>(converting_));
    }
  }
  size_t dropped = 0;
  if (api_.activity_get_num_dropped_records(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.dropped += static_cast<int64_t>(dropped);
  }
}

void ActivityCollector::drain(GpuEventBatch& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto append = [](auto& to, auto& from) {
    if (to.empty()) {
      to.swap(from);
    } else {
      to.insert(to.end(), std::make_move_iterator(from.begin()),
                std::make_move_iterator(from.end()));
    }
    from.clear();
  };
  append(out.kernels, pending_.kernels);
  append(out.copies, pending_.copies);
  append(out.syncs, pending_.syncs);
  out.dropped += pending_.dropped;
  pending_.dropped = 0;
  pending_records_ = 0;
}

void ActivityCollector::shutdown() {
  const bool attached = routed_ || subscribed_;  // the debug lines once per attachment
  if (zeroed_out_set_) {
    // First, whatever fails below: another client's buffers after ours (the PyTorch profiler's)
    // are not zeroed. Ours still are; CUPTI zeroing them again costs only time.
    zeroed_out_set_ = false;
    uint8_t zeroed = 0;
    size_t size = sizeof zeroed;
    api_.activity_set_attribute(CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, &size, &zeroed);
  }
  if (enabled_) disable();
  if (routed_) {
    flush(true);  // our buffers back from CUPTI while still routed here
    std::unique_lock<std::shared_mutex> lock(route_mutex());
    if (route() == this) route() = nullptr;
    routed_ = false;
  }
  if (subscribed_) {
    api_.unsubscribe(subscriber_);
    subscribed_ = false;
    subscriber_ = nullptr;
  }
  stop_converter();  // after the forced flush: what it returned is converted first
  if (!attached) return;
  const BufferStats s = buffer_stats();
  if (s.completed > 0) {
    logger_.debug(
        "CUPTI activity: {} buffers completed ({} on the training thread), {} records converted "
        "in {:.1f} ms",
        s.completed, s.on_trainer, s.records, s.convert_ns / 1e6);
  }
  static const char* const kOverheadNames[BufferStats::kOverheadKinds] = {"driver/unknown",
                                                                          "buffer flush",
                                                                          "instrumentation",
                                                                          "resource",
                                                                          "module loading",
                                                                          "lazy function loading",
                                                                          "command buffer full",
                                                                          "activity buffer request",
                                                                          "UVM init",
                                                                          "other"};
  std::string overheads;
  for (int i = 0; i < BufferStats::kOverheadKinds; ++i) {
    if (s.overhead_count[i] == 0) continue;
    overheads += fmt::format("{}{} {}x {:.2f} ms (training thread {:.2f} ms)",
                             overheads.empty() ? "" : ", ", kOverheadNames[i], s.overhead_count[i],
                             s.overhead_ns[i] / 1e6, s.overhead_trainer_ns[i] / 1e6);
  }
  if (!overheads.empty()) logger_.debug("CUPTI overhead records: {}", overheads);
}

void ActivityCollector::buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = nullptr;
  *size = 0;
  *max_records = 0;  // as many as fit
  bool log_refusal = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_buffers_.empty()) {
      *buffer = free_buffers_.back();
      free_buffers_.pop_back();
    } else if (allocated_buffers_ < options_.max_buffers) {
      *buffer = allocate_buffer(options_.buffer_bytes, id_);
      if (*buffer != nullptr) ++allocated_buffers_;
    }
    if (*buffer == nullptr) {
      ++refused_;
      log_refusal = !refusal_logged_;
      refusal_logged_ = true;
    }
  }
  if (*buffer != nullptr) {
    *size = options_.buffer_bytes;
  } else if (log_refusal) {
    logger_.warn(
        "CUPTI activity: all {} trace buffers ({} MiB) are in use; CUPTI drops records until one "
        "comes back (gpu.trace_buffer_mb raises the limit)",
        options_.max_buffers, (options_.max_buffers * options_.buffer_bytes) >> 20);
  }
}

void ActivityCollector::buffer_completed(uint8_t* buffer, size_t, size_t valid_size) {
  if (buffer == nullptr) return;
  const uint64_t owner = owner_of(buffer);
  if (owner != id_) {
    free_buffer(buffer);  // another (former) collector's: freed; not ours at all: untouched
    return;
  }
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.completed;
    if (std::this_thread::get_id() == trainer_) ++stats_.on_trainer;
    // Empty ones too: what CUPTI wrote past valid_size is unsaid, and the buffer goes back to it
    // zeroed (convert() zeroes it, off this thread when the converter runs).
    if (converter_running_) {
      ready_.push_back({buffer, valid_size});
      queued = true;
    }
  }
  if (queued) {
    ready_cv_.notify_one();
    return;
  }
  convert({buffer, valid_size});
}

void ActivityCollector::convert(const ReadyBuffer& b) {
  const Nanos t0 = steady_now_ns();
  GpuEventBatch batch;
  const TimeBase tb = clock_.get();
  CUpti_Activity* record = nullptr;
  size_t converted = 0;
  BufferStats overhead;
  uint32_t trainer = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    trainer = trainer_cupti_id_;
  }
  while (api_.activity_get_next_record(b.buffer, b.valid_size, &record) == CUPTI_SUCCESS &&
         record != nullptr) {
    if (record->kind == CUPTI_ACTIVITY_KIND_OVERHEAD) {
      const auto& o = reinterpret_cast<const CUpti_ActivityOverhead3&>(*record);
      const int i = std::clamp(static_cast<int>(static_cast<uint32_t>(o.overheadKind) >> 16), 0,
                               BufferStats::kOverheadKinds - 1);
      const Nanos ns = o.end > o.start ? tb.to_steady(o.end) - tb.to_steady(o.start) : 0;
      ++overhead.overhead_count[i];
      overhead.overhead_ns[i] += ns;
      if (o.objectKind == CUPTI_ACTIVITY_OBJECT_THREAD && o.objectId.pt.threadId == trainer) {
        overhead.overhead_trainer_ns[i] += ns;
      }
      std::free(o.overheadData);  // CUPTI's: the client frees it
      continue;
    }
    if (convert_record(*record, tb, batch, &names_)) ++converted;
  }
  // Zeroed here, off the launching threads, where CUPTI would otherwise zero it as it hands the
  // buffer out (inside a launch). The whole buffer: what CUPTI wrote past valid_size is unsaid.
  std::memset(b.buffer, 0, options_.buffer_bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < BufferStats::kOverheadKinds; ++i) {
    stats_.overhead_count[i] += overhead.overhead_count[i];
    stats_.overhead_ns[i] += overhead.overhead_ns[i];
    stats_.overhead_trainer_ns[i] += overhead.overhead_trainer_ns[i];
  }
  for (SyncRecord& s : batch.syncs) {
    const auto it = sync_callers_.find(static_cast<uint32_t>(s.correlation_id));
    if (s.correlation_id < 0 || it == sync_callers_.end()) {
      if (all_sync_callers_known_ && s.correlation_id >= 0) s.thread = SyncThread::kInternal;
      continue;
    }
    s.thread = it->second;
    sync_callers_.erase(it);
  }
  const size_t room = options_.max_pending_records > pending_records_
                          ? options_.max_pending_records - pending_records_
                          : 0;
  if (converted <= room) {
    auto append = [](auto& to, auto& from) {
      to.insert(to.end(), std::make_move_iterator(from.begin()),
                std::make_move_iterator(from.end()));
    };
    append(pending_.kernels, batch.kernels);
    append(pending_.copies, batch.copies);
    append(pending_.syncs, batch.syncs);
    pending_records_ += converted;
  } else {
    pending_.dropped += static_cast<int64_t>(converted);  // nobody drains: keep memory bounded
  }
  free_buffers_.push_back(b.buffer);
  stats_.records += static_cast<int64_t>(converted);
  stats_.convert_ns += steady_now_ns() - t0;
}

int64_t ActivityCollector::refused_requests() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refused_;
}

ActivityCollector::BufferStats ActivityCollector::buffer_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace detail
}  // namespace torchpilot
