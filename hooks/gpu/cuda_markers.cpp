// CudaMarkers: step-boundary events recorded on the training thread, resolved on our own thread.
#include "cuda_markers.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <exception>

#include "cuda_driver.h"
#include "cupti_api.h"
#include "marker_stream.h"
#include "own_thread.h"

namespace torchpilot {
namespace detail {

namespace {
constexpr size_t kBatch = 64;   // events queried per pass at most (oldest first)
constexpr size_t kMinPool = 8;  // fewer events than this: markers off
}  // namespace

CudaMarkers::CudaMarkers(CudaDriverApi& api, int device, spdlog::logger& logger,
                         MarkerOptions options)
    : api_(api), device_index_(device), logger_(logger), options_(std::move(options)) {
  if (!options_.now) options_.now = [] { return steady_now_ns(); };
}

CudaMarkers::~CudaMarkers() { stop(); }

bool CudaMarkers::record(uint64_t id, size_t keep_free) {
  if (off_.load(std::memory_order_acquire)) return false;
  CUcontext ctx = nullptr;
  if (api_.ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.no_context;
    return false;
  }
  CUcontext known = context_.load(std::memory_order_acquire);
  if (known == nullptr) {
    // The first context seen on the training thread: the observed device's? Else the observed
    // device's primary context, once the trainer made it active (its tensors live there while
    // the thread keeps another device current). Then the resolver takes over (set-up off this
    // thread); markers are recorded from the next boundary on.
    CUdevice want = 0, have = 0;
    const bool found = api_.device_get(&want, device_index_) == CUDA_SUCCESS;
    if (found && api_.ctx_get_device(&have) == CUDA_SUCCESS && want == have) {
      known = ctx;
    } else if (found) {
      known = retain_active_primary(want);
      if (known != nullptr) {
        logger_.info(
            "GPU step markers: the training thread keeps another GPU current; they are recorded "
            "on GPU {}'s current stream with its context pushed for each",
            device_index_);
      }
    }
    if (known == nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (counters_.other_context++ == 0) {
        // Said once: a trainer on one GPU whose thread keeps another device current gets host
        // spans, and should know why.
        logger_.info(
            "GPU step markers wait: the training thread's current CUDA context is not GPU {}'s "
            "(gpu.device), which has no active context yet; its steps are attributed by host "
            "time until one is",
            device_index_);
      }
      return false;
    }
    context_.store(known, std::memory_order_release);
    if (options_.thread) {
      try {
        thread_ = std::thread([this] { run(); });
      } catch (const std::exception& e) {
        fail(std::string("no resolver thread: ") + e.what());
      }
    }
    return false;
  }
  const bool push = ctx != known;
  if (push && !retained_.load(std::memory_order_acquire)) {
    // The thread's own context, seen first, and now another: we hold no reference to push it.
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.other_context;
    return false;
  }
  if (!ready_.load(std::memory_order_acquire)) return false;
  CUevent event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() <= keep_free) {
      ++counters_.pool_exhausted;
      return false;
    }
    event = free_.back();
    free_.pop_back();
  }
  const MarkerStreamProvider provider = marker_stream_provider();
  const auto stream =
      static_cast<CUstream>(provider != nullptr ? provider(device_index_) : nullptr);
  CUresult r = CUDA_SUCCESS;
  bool popped = true;
  if (push) {
    // The thread's own context comes back on top whatever the record did.
    r = api_.ctx_push_current(known);
    if (r == CUDA_SUCCESS) {
      r = api_.event_record(event, stream);
      CUcontext was = nullptr;
      popped = api_.ctx_pop_current(&was) == CUDA_SUCCESS;
    }
  } else {
    r = api_.event_record(event, stream);
  }
  if (!popped) {
    (void)api_.ctx_set_current(ctx);  // the trainer's context on top again, whatever the stack
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(event);
    }
    fail("cuCtxPopCurrent failed after a marker was recorded in GPU " +
         std::to_string(device_index_) + "'s context");
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (r != CUDA_SUCCESS) {
    free_.push_back(event);
    ++counters_.errors;
    return false;
  }
  in_flight_.push_back({id, event});
  ++counters_.recorded;
  if (push) ++counters_.pushed;
  return true;
}

CUcontext CudaMarkers::retain_active_primary(CUdevice device) {
  unsigned flags = 0;
  int active = 0;
  if (api_.primary_ctx_get_state(device, &flags, &active) != CUDA_SUCCESS || active == 0) {
    return nullptr;  // we never create a context: the trainer has not used this GPU yet
  }
  CUcontext ctx = nullptr;
  if (api_.primary_ctx_retain(&ctx, device) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  retained_device_ = device;
  retained_.store(true, std::memory_order_release);
  return ctx;
}

void CudaMarkers::drain(std::vector<MarkerRecord>& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  out.insert(out.end(), done_.begin(), done_.end());
  done_.clear();
}

void CudaMarkers::await(uint64_t id, Nanos timeout_ns) {
  if (!options_.thread) {
    resolve_once();
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  resolved_.wait_for(lock, std::chrono::nanoseconds(timeout_ns), [&] {
    return stopping_ || off_.load() || in_flight_.empty() || in_flight_.front().id > id;
  });
}

void CudaMarkers::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    if (counters_.recorded > 0) {
      // For cost investigations (log.level debug): how the resolver and its anchors fared.
      logger_.debug(
          "GPU step markers: {} recorded ({} pushed), {} resolved, {} errors, {} pool exhausted; "
          "anchors {} taken, {} failed, {} streams replaced, last error {:.1f} us",
          counters_.recorded, counters_.pushed, counters_.resolved, counters_.errors,
          counters_.pool_exhausted, counters_.anchors, counters_.anchor_failures,
          counters_.streams_replaced, counters_.anchor_error_ns / 1e3);
    }
  }
  off_.store(true, std::memory_order_release);
  ready_.store(false, std::memory_order_release);
  wake_.notify_all();
  resolved_.notify_all();
  if (thread_.joinable()) {
    thread_.join();  // it tears down with the context current
  } else if (set_up_done_) {
    tear_down();
  }
  // After the events and the stream went: they belong to the context.
  if (retained_.exchange(false)) api_.primary_ctx_release(retained_device_);
}

void CudaMarkers::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reason_.empty()) return;
    reason_ = why;
  }
  off_.store(true, std::memory_order_release);
  ready_.store(false, std::memory_order_release);
  resolved_.notify_all();
  logger_.warn("GPU step markers off: {}; steps are attributed by host time", why);
}

std::string CudaMarkers::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

CudaMarkers::Counters CudaMarkers::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

bool CudaMarkers::set_up() {
  set_up_done_ = true;  // whatever is created below is destroyed by tear_down()
  CUresult r = api_.ctx_set_current(context_.load(std::memory_order_acquire));
  if (r != CUDA_SUCCESS) {
    fail("cuCtxSetCurrent failed: " + cuda_error_text(api_, r));
    return false;
  }
  r = api_.stream_create(&stream_, CU_STREAM_NON_BLOCKING);
  if (r == CUDA_SUCCESS) r = api_.event_create(&anchor_event_, CU_EVENT_DEFAULT);
  if (r == CUDA_SUCCESS) r = api_.event_create(&candidate_event_, CU_EVENT_DEFAULT);
  if (r != CUDA_SUCCESS) {
    fail("no private stream or anchor events: " + cuda_error_text(api_, r));
    return false;
  }
  std::vector<CUevent> events;
  events.reserve(options_.pool);
  for (size_t i = 0; i < options_.pool; ++i) {
    CUevent e = nullptr;
    r = api_.event_create(&e, CU_EVENT_DEFAULT);  // timing on: elapsed times need it
    if (r != CUDA_SUCCESS) break;
    events.push_back(e);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all_events_ = events;
    free_ = events;
  }
  if (events.size() < kMinPool) {
    fail("cuEventCreate failed: " + cuda_error_text(api_, r));
    return false;
  }
  ready_.store(true, std::memory_order_release);
  logger_.debug("GPU step markers: {} events, resolved every {:.1f} ms", events.size(),
                options_.poll_ns / 1e6);
  return true;
}

void CudaMarkers::tear_down() {
  std::vector<CUevent> events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events.swap(all_events_);
    free_.clear();
    in_flight_.clear();  // destroying an event still in flight is allowed
  }
  for (CUevent e : events) api_.event_destroy(e);
  for (CUevent* e : {&anchor_event_, &candidate_event_}) {
    if (*e != nullptr) api_.event_destroy(*e);
    *e = nullptr;
  }
  if (stream_ != nullptr) api_.stream_destroy(stream_);
  stream_ = nullptr;
  anchored_ = false;
}

bool CudaMarkers::anchor() {
  // The candidate's completion is bracketed by host times: after the start of the last query
  // that found it pending (or its recording), before the end of the one that found it done.
  const Nanos t0 = now();
  bool ok = false;
  Nanos error = 0;
  if (api_.event_record(candidate_event_, stream_) == CUDA_SUCCESS) {
    Nanos lo = t0;
    for (;;) {
      const Nanos q0 = now();
      const CUresult r = api_.event_query(candidate_event_);
      const Nanos q1 = now();
      if (r == CUDA_SUCCESS) {
        error = (q1 - lo) / 2;
        if (error <= options_.max_anchor_error_ns) {
          std::swap(anchor_event_, candidate_event_);
          anchor_host_ = lo + error;
          anchor_taken_ = q1;
          anchored_ = true;
          ok = true;
        }
        break;
      }
      if (r != CUDA_ERROR_NOT_READY || q1 - t0 > options_.anchor_spin_ns) break;
      lo = q0;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (ok) {
    anchor_failures_in_row_ = 0;
    ++counters_.anchors;
    counters_.anchor_error_ns = error;
    return true;
  }
  ++counters_.anchor_failures;
  if (++anchor_failures_in_row_ >= kAnchorFailuresBeforeNewStream) {
    // Probably queued behind busy work on a shared hardware queue: another stream may not be.
    anchor_failures_in_row_ = 0;
    CUstream fresh = nullptr;
    if (api_.stream_create(&fresh, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
      api_.stream_destroy(stream_);
      stream_ = fresh;
      ++counters_.streams_replaced;
    }
  }
  return false;
}

bool CudaMarkers::elapsed_from_anchor(CUevent event, Nanos* ns) {
  float ms = 0;
  if (api_.event_elapsed_time(&ms, anchor_event_, event) == CUDA_SUCCESS) {
    *ns = anchor_host_ + static_cast<Nanos>(std::llround(static_cast<double>(ms) * 1e6));
    return true;
  }
  // An event that completed before the anchor, should the driver refuse a negative interval.
  if (api_.event_elapsed_time(&ms, event, anchor_event_) == CUDA_SUCCESS) {
    *ns = anchor_host_ - static_cast<Nanos>(std::llround(static_cast<double>(ms) * 1e6));
    return true;
  }
  return false;
}

void CudaMarkers::resolve_once() {
  if (!set_up_done_) {
    if (context_.load(std::memory_order_acquire) == nullptr || off_.load()) return;
    if (!set_up()) return;
  }
  if (!ready_.load(std::memory_order_acquire)) return;
  if (!anchored_ || now() - anchor_taken_ >= options_.reanchor_ns) anchor();
  if (anchored_ && now() - anchor_taken_ > kMaxAnchorAgeNs) anchored_ = false;  // too imprecise
  if (!anchored_) return;  // markers wait; the monitor falls back after its bound

  std::vector<InFlight> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < in_flight_.size() && i < kBatch; ++i) batch.push_back(in_flight_[i]);
  }
  // Oldest first: events on one stream complete in order, so the first pending one ends the pass.
  std::vector<MarkerRecord> done;
  size_t finished = 0;
  int64_t errors = 0;
  CUresult first_error = CUDA_SUCCESS;
  for (const InFlight& f : batch) {
    const CUresult r = api_.event_query(f.event);
    if (r == CUDA_ERROR_NOT_READY) break;
    ++finished;
    Nanos t = 0;
    if (r == CUDA_SUCCESS && elapsed_from_anchor(f.event, &t)) {
      done.push_back({f.id, t});
    } else {
      ++errors;  // dropped: the monitor gives its steps their host span
      if (first_error == CUDA_SUCCESS) first_error = r;
    }
  }
  if (finished == 0) return;
  bool log_error = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < finished && !in_flight_.empty(); ++i) {
      free_.push_back(in_flight_.front().event);
      in_flight_.pop_front();
    }
    done_.insert(done_.end(), done.begin(), done.end());
    counters_.resolved += static_cast<int64_t>(done.size());
    log_error = errors > 0 && counters_.errors == 0;
    counters_.errors += errors;
  }
  resolved_.notify_all();
  if (log_error) {
    logger_.warn("GPU step marker not resolved ({}); its steps are attributed by host time",
                 first_error == CUDA_SUCCESS ? std::string("elapsed time unavailable")
                                             : cuda_error_text(api_, first_error));
  }
}

void CudaMarkers::run() {
  mark_own_thread("tp-markers");
  for (;;) {
    resolve_once();
    if (off_.load(std::memory_order_acquire)) break;  // failed: nothing left to resolve
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) break;
    wake_.wait_for(lock, std::chrono::nanoseconds(options_.poll_ns), [&] { return stopping_; });
    if (stopping_) break;
  }
  tear_down();
}

}  // namespace detail
}  // namespace torchpilot
