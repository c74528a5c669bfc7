// CommMonitor: the collector of communication figures. Backends' threads report each collective's
// start and completion (hooks/comm/comm_observer.h turns c10d's RecordFunction scopes into
// these calls); the monitor keeps the union of the intervals in which collectives run
// (communication time) and, within it, the time the training thread was blocked (exposed
// communication: neither running on a CPU nor waiting for one, read from the kernel's per-thread
// schedstat at each edge of the union). At each step's end it adds the step's figures
// (comm.time_ms, comm.exposed_ms, comm.bytes); at the epoch's end the section "comm"
// (CommEpochStats).
//
// Thread-safety: collective_begin/collective_end/outstanding/set_* from any thread (one mutex,
// held for a few field updates and one /proc read at the union's edges); the Collector calls on
// the training thread. Failure behaviour: never throws into a backend's thread or the training
// loop; without schedstat (not Linux, or CONFIG_SCHED_INFO off) the thread's CPU clock is used and
// time spent runnable but preempted counts as exposed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "torchpilot/runtime/comm/comm_records.h"
#include "torchpilot/runtime/core/collector.h"

namespace torchpilot {

// A thread's accumulated times: on a CPU, and runnable but waiting for one.
struct ThreadTimes {
  Nanos on_cpu_ns = 0;
  Nanos runnable_ns = 0;
};
using ThreadTimesProbe = std::function<bool(ThreadTimes&)>;
// The calling thread's times, readable from any thread later (Linux schedstat, else its CPU
// clock); null when neither works.
ThreadTimesProbe current_thread_times_probe();

class CommMonitor : public Collector {
 public:
  struct Options {
    // The training thread's times; default: the thread of the first on_step_begin.
    ThreadTimesProbe training_thread;
    std::shared_ptr<Clock> clock;  // default: the host's clock
  };
  CommMonitor() : CommMonitor(Options{}) {}
  explicit CommMonitor(Options options);

  std::string name() const override { return "comm"; }
  unsigned step_hooks() const override { return kHookStepBegin | kHookStepEnd; }
  void attach(CollectorHost* host) override;
  void on_step_begin(int64_t step, Nanos now) override;
  void on_step_end(StepRecord& record) override;
  void on_epoch_end(EpochSummary& summary) override;

  // --- from any thread --------------------------------------------------------------------------
  // The group the collectives run on (the first one registered names the section).
  void set_group(std::string backend, int rank, int world_size);
  void set_link(std::string name, double peak_bytes_per_s);
  // Hooks that issue collectives (GradSync) count them here themselves: no observer sees them.
  void set_hooks_count(bool on) { hooks_count_.store(on, std::memory_order_relaxed); }
  bool hooks_count() const { return hooks_count_.load(std::memory_order_relaxed); }
  // A collective started (returns its sequence number) and completed.
  int64_t collective_begin(CommOp op, std::string_view name, int64_t bytes, std::string dtype,
                           int group_size = 0);
  void collective_end(int64_t seq);
  // A collective whose interval is not known here (NCCL: the scope covers its launch; its time
  // comes from the GPU's kernels): counted with its bytes, not timed.
  void collective_counted(CommOp op, std::string_view name, int64_t bytes, std::string dtype);
  // One gradient sync's collectives timed on the GPU (CUDA events; hooks/comm/torch_grad_sync.cpp),
  // reported once the GPU has run them, a step or two after their host step. NCCL collectives are
  // counted from their launches (collective_counted); their time comes from here.
  struct GpuTiming {
    CommOp op = CommOp::kAllReduce;
    int64_t collectives = 0;
    int64_t bytes = 0;
    Nanos busy_ns = 0;     // the collectives' summed GPU durations (NCCL runs a group's in order)
    Nanos exposed_ns = 0;  // how long the compute stream waited for them after backward
    // The sync's number (the same on every rank: GradSync counts its synchronize calls) and each
    // collective's duration in issue order, for rank 0's waiting times (CollectiveDuration).
    int64_t sync = 0;
    std::vector<Nanos> durations;
  };
  void add_gpu_timing(const GpuTiming& timing);
  // The hook cannot time its collectives (no durations from the backend, no events): logged once.
  void gpu_timing_unavailable(const std::string& why);
  // Collectives started and not completed, oldest first; and how many have started.
  std::vector<CollectiveRecord> outstanding() const;
  int64_t started() const;
  // The last collective this rank entered (seq 0: none yet; end_ns 0: not completed, or counted
  // without a time), what the watchdog publishes for the other ranks' hang reports, as NCCL's
  // flight recorder keeps each rank's last collectives.
  CollectiveRecord last_entered() const;
  // The last completed collectives (at most kRecent), oldest first.
  static constexpr size_t kRecent = 256;
  std::vector<CollectiveRecord> recent() const;
  int rank() const;
  int world_size() const;
  Nanos now() const;

 private:
  struct Acc {
    CommStats stats;
    std::map<CommOp, CommOpStats> ops;
    // GPU-timed gradient syncs (add_gpu_timing), whichever host step they belong to.
    int64_t gpu_timed = 0;
    CommStats gpu;
    std::map<CommOp, CommOpStats> gpu_ops;
    std::vector<CollectiveDuration> durations;  // the last ones (keep_duration)
  };
  void keep_duration(const CollectiveDuration& d);  // mu_ held
  // Counts one collective in step_ (in total and by op); mu_ held.
  void count_collective(CommOp op, int64_t bytes, Nanos busy);
  void open_union(Nanos now);              // mu_ held
  void close_union(Nanos now);             // mu_ held: credits the segment to step_
  bool blocked_ns(Nanos now, Nanos& out);  // mu_ held

  Options options_;
  std::shared_ptr<Clock> clock_;
  std::atomic<bool> hooks_count_{false};
  std::atomic<bool> timing_unavailable_logged_{false};
  CollectorHost* host_ = nullptr;

  mutable std::mutex mu_;
  std::string backend_;
  int rank_ = 0;
  int world_size_ = 1;
  std::string link_;
  double link_peak_ = kNotMeasured;
  int64_t next_seq_ = 1;
  int64_t current_step_ = -1;  // on_step_begin's
  int64_t begun_in_step_ = 0;  // collectives begun in it
  std::map<int64_t, CollectiveRecord> outstanding_;
  CollectiveRecord last_entered_;
  std::vector<CollectiveRecord> recent_;
  size_t recent_next_ = 0;
  int inflight_ = 0;
  Nanos union_begin_ = 0;
  Nanos union_blocked_begin_ = 0;
  bool union_blocked_valid_ = false;
  bool probe_ok_ = true;
  Acc step_;   // since the last step boundary
  Acc epoch_;  // since the last epoch boundary
  Nanos epoch_wall_ns_ = 0;
  int64_t epoch_steps_ = 0;
};

}  // namespace torchpilot
