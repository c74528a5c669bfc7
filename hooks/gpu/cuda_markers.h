// GPU step markers (GpuBackend::record_marker; docs/metrics.md, "GPU time of a step"): a CUDA
// event recorded on the trainer's current stream (marker_stream.h) at each step boundary, without
// synchronizing, and resolved off the training thread to the steady-clock time at which the GPU
// reached it. Internal to hooks/.
//
// Recording (training thread): only once a CUDA context is current on the calling thread (the
// trainer touched CUDA; we never create one there), on the observed device's current stream in
// its context. A thread that keeps another device current (LibTorch restores the current device
// after each op on another GPU's tensors) gets the observed device's primary context pushed for
// the record, once that context is active (retained, never created by us). Events come from a
// fixed pool; none free -> not recorded (counted). Cost: one cuCtxGetCurrent and one
// cuEventRecord (~1-3 us; a push and a pop more where pushed), no synchronization.
//
// Resolution (a thread of ours, with that context made current): every poll_ns it queries the
// oldest events in flight (cuEventQuery, in recording order) and converts each completed one with
// cuEventElapsedTime against an anchor: an event recorded on a private non-blocking stream whose
// completion's host time is taken by polling it (spinning on cuEventQuery; not
// cuEventSynchronize, which the activity trace would report as a host sync of the training step).
// The anchor is renewed every reanchor_ns (float milliseconds lose precision with distance: 1 s
// keeps it under 0.1 us) and taken again when its completion is known to less than
// max_anchor_error_ns; an anchor older than kMaxAnchorAgeNs is not used. After repeated failed
// anchors (the private stream shares a hardware queue with busy work) the stream is replaced.
//
// Failure behaviour: nothing throws; a driver error while setting up turns markers off for good
// (logged once); the monitor then attributes steps by host time.
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "torchpilot/runtime/gpu/gpu_backend.h"

namespace spdlog {
class logger;
}

namespace torchpilot {
namespace detail {

class CudaDriverApi;

struct MarkerOptions {
  size_t pool = 256;                  // events in flight at most
  Nanos poll_ns = 1000000;            // the resolver's period
  Nanos reanchor_ns = 1000000000;     // a new anchor every second
  Nanos max_anchor_error_ns = 20000;  // an anchor known less precisely is taken again
  Nanos anchor_spin_ns = 2000000;     // longest spin on an anchor's completion
  bool thread = true;                 // false (tests): resolve_once() drives resolution
  std::function<Nanos()> now;         // the steady clock; tests give their own
};

class CudaMarkers {
 public:
  static constexpr Nanos kMaxAnchorAgeNs = 60000000000;  // 60 s: ~4 us float resolution
  static constexpr int kAnchorFailuresBeforeNewStream = 3;

  // `device`: the CUDA device index observed; markers are recorded in its context only.
  CudaMarkers(CudaDriverApi& api, int device, spdlog::logger& logger, MarkerOptions options = {});
  ~CudaMarkers();
  CudaMarkers(const CudaMarkers&) = delete;
  CudaMarkers& operator=(const CudaMarkers&) = delete;

  // Training thread. False: not recorded (no context current yet, another device's context
  // while the observed device has no active one, the pool not ready or exhausted, markers off).
  // `keep_free`: recorded only while more than this many events are free (optional markers, such as
  // phases', leave the rest to steps').
  bool record(uint64_t id, size_t keep_free = 0);
  // Markers resolved since the last call, in recording order.
  void drain(std::vector<MarkerRecord>& out);
  // Blocks until marker `id` is resolved (or dropped), nothing older is in flight, or
  // `timeout_ns` passed.
  void await(uint64_t id, Nanos timeout_ns);
  // Joins the resolver; events and the private stream are destroyed. Idempotent.
  void stop();
  // One resolver pass (set-up first if needed). The thread calls it; tests without it too.
  void resolve_once();

  struct Counters {
    int64_t recorded = 0, resolved = 0;
    int64_t no_context = 0;      // record() with no CUDA context current on the thread
    int64_t other_context = 0;   // ... with another device's context current, none to push
    int64_t pushed = 0;          // recorded with the observed context pushed for the call
    int64_t pool_exhausted = 0;  // ... with every event in flight (or all but `keep_free`)
    int64_t errors = 0;          // driver errors on record, query or elapsed time (dropped)
    int64_t anchors = 0, anchor_failures = 0, streams_replaced = 0;
    Nanos anchor_error_ns = 0;  // of the anchor in use: half its completion's uncertainty
  };
  Counters counters() const;
  // Why markers are off for good; empty while they work (or have not started).
  std::string reason() const;

 private:
  struct InFlight {
    uint64_t id = 0;
    CUevent event = nullptr;
  };
  Nanos now() const { return options_.now(); }
  bool set_up();  // resolver thread, context current: stream, anchor, pool
  // The observed device's primary context, retained, if the trainer made it active; else null.
  CUcontext retain_active_primary(CUdevice device);
  void tear_down();
  void fail(const std::string& why);
  bool anchor();
  bool elapsed_from_anchor(CUevent event, Nanos* ns);
  void run();

  CudaDriverApi& api_;
  int device_index_;
  spdlog::logger& logger_;
  MarkerOptions options_;

  std::atomic<CUcontext> context_{nullptr};  // the observed device's context, once seen
  std::atomic<bool> retained_{false};        // context_ is a primary context we retained
  CUdevice retained_device_ = 0;             // ... of this device (set before retained_)
  std::atomic<bool> ready_{false};           // the pool exists: record() may use it
  std::atomic<bool> off_{false};             // failed or stopped: record() returns false
  bool set_up_done_ = false;                 // resolver side
  std::thread thread_;

  // Resolver-only state.
  CUstream stream_ = nullptr;
  CUevent anchor_event_ = nullptr;     // completed; its completion's host time below
  CUevent candidate_event_ = nullptr;  // the next anchor being taken
  Nanos anchor_host_ = 0;              // steady-clock time of the anchor's completion
  Nanos anchor_taken_ = 0;
  bool anchored_ = false;
  int anchor_failures_in_row_ = 0;

  mutable std::mutex mutex_;          // everything below
  std::condition_variable wake_;      // the resolver's sleep; stop
  std::condition_variable resolved_;  // await()
  bool stopping_ = false;
  std::vector<CUevent> free_;
  std::deque<InFlight> in_flight_;  // in recording order
  std::vector<CUevent> all_events_;
  std::vector<MarkerRecord> done_;
  Counters counters_;
  std::string reason_;
};

}  // namespace detail
}  // namespace torchpilot
