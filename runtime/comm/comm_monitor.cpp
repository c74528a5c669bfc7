#include "torchpilot/runtime/comm/comm_monitor.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace torchpilot {

namespace {

// Reads a thread's times from any thread: its CPU clock (exact, includes the running slice) and
// schedstat's run-queue wait (updated when it is scheduled in). The file stays open.
class ThreadTimesReader {
 public:
  ThreadTimesReader(clockid_t cpu_clock, int schedstat_fd) : clock_(cpu_clock), fd_(schedstat_fd) {}
  ~ThreadTimesReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool read(ThreadTimes& out) const {
    timespec ts{};
    if (::clock_gettime(clock_, &ts) != 0) return false;
    out.on_cpu_ns = static_cast<Nanos>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    out.runnable_ns = 0;
    if (fd_ >= 0) {
      char buf[128];
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      if (n > 0) {
        buf[n] = '\0';
        unsigned long long cpu = 0, wait = 0;
        if (std::sscanf(buf, "%llu %llu", &cpu, &wait) == 2) {
          out.runnable_ns = static_cast<Nanos>(wait);
        }
      }
    }
    return true;
  }

 private:
  clockid_t clock_;
  int fd_;
};

}  // namespace

ThreadTimesProbe current_thread_times_probe() {
  clockid_t cid;
  if (pthread_getcpuclockid(pthread_self(), &cid) != 0) return nullptr;
  char path[96];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat",
                static_cast<long>(::syscall(SYS_gettid)));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  auto reader = std::make_shared<ThreadTimesReader>(cid, fd);
  return [reader](ThreadTimes& out) { return reader->read(out); };
}

CommMonitor::CommMonitor(Options options) : options_(std::move(options)) {
  clock_ = options_.clock;
}

void CommMonitor::attach(CollectorHost* host) {
  host_ = host;
  if (host != nullptr && !clock_) {
    // Backend threads read the clock after the host is gone: keep a clock of our own.
    clock_ = host->steady_clock() ? default_clock() : nullptr;
    if (!clock_) clock_ = default_clock();
  }
}

Nanos CommMonitor::now() const { return clock_ ? clock_->now_ns() : default_clock()->now_ns(); }

void CommMonitor::set_group(std::string backend, int rank, int world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  backend_ = std::move(backend);
  rank_ = rank;
  world_size_ = std::max(1, world_size);
}

void CommMonitor::set_link(std::string name, double peak_bytes_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  link_ = std::move(name);
  link_peak_ = peak_bytes_per_s;
}

int CommMonitor::rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rank_;
}
int CommMonitor::world_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return world_size_;
}

bool CommMonitor::blocked_ns(Nanos now, Nanos& out) {
  if (!options_.training_thread || !probe_ok_) return false;
  ThreadTimes t;
  if (!options_.training_thread(t)) {
    probe_ok_ = false;
    return false;
  }
  // Wall time neither on a CPU nor waiting for one: blocked (in wait(), a lock, I/O).
  out = now - t.on_cpu_ns - t.runnable_ns;
  return true;
}

void CommMonitor::open_union(Nanos now) {
  union_begin_ = now;
  union_blocked_valid_ = blocked_ns(now, union_blocked_begin_);
}

void CommMonitor::close_union(Nanos now) {
  const Nanos length = std::max<Nanos>(0, now - union_begin_);
  step_.stats.comm_ns += length;
  Nanos blocked = 0;
  if (union_blocked_valid_ && blocked_ns(now, blocked)) {
    step_.stats.exposed_ns += std::clamp<Nanos>(blocked - union_blocked_begin_, 0, length);
  }
}

int64_t CommMonitor::collective_begin(CommOp op, std::string_view name, int64_t bytes,
                                      std::string dtype, int group_size) {
  try {
    const Nanos t = now();
    std::lock_guard<std::mutex> lock(mu_);
    CollectiveRecord r;
    r.op = op;
    r.name = std::string(name);
    r.bytes = bytes;
    r.dtype = std::move(dtype);
    r.group_size = group_size > 0 ? group_size : world_size_;
    r.seq = next_seq_++;
    r.begin_ns = t;
    r.step = current_step_;
    r.in_step = begun_in_step_++;
    if (inflight_++ == 0) open_union(t);
    last_entered_ = r;
    const int64_t seq = r.seq;
    outstanding_.emplace(seq, std::move(r));
    return seq;
  } catch (...) {  // allocation: the collective goes unobserved
    return 0;
  }
}

void CommMonitor::collective_end(int64_t seq) {
  if (seq <= 0) return;
  try {
    const Nanos t = now();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = outstanding_.find(seq);
    if (it == outstanding_.end()) return;
    CollectiveRecord r = std::move(it->second);
    outstanding_.erase(it);
    r.end_ns = t;
    if (r.seq == last_entered_.seq) last_entered_.end_ns = t;
    if (--inflight_ == 0) close_union(t);
    const Nanos busy = std::max<Nanos>(0, r.end_ns - r.begin_ns);
    keep_duration({r.step, r.in_step, busy});
    count_collective(r.op, r.bytes, busy);
    if (recent_.size() < kRecent) {
      recent_.push_back(std::move(r));
    } else {
      recent_[recent_next_] = std::move(r);
      recent_next_ = (recent_next_ + 1) % kRecent;
    }
  } catch (...) {
  }
}

void CommMonitor::collective_counted(CommOp op, std::string_view name, int64_t bytes,
                                     std::string dtype) {
  try {
    const Nanos t = now();
    std::lock_guard<std::mutex> lock(mu_);
    // It takes a sequence number, as a timed one does, but keeps no record beyond the last one.
    last_entered_ = CollectiveRecord{};
    last_entered_.op = op;
    last_entered_.name = std::string(name);
    last_entered_.bytes = bytes;
    last_entered_.dtype = std::move(dtype);
    last_entered_.group_size = world_size_;
    last_entered_.seq = next_seq_++;
    last_entered_.begin_ns = t;
    last_entered_.step = current_step_;
    count_collective(op, bytes, 0);
  } catch (...) {
  }
}

void CommMonitor::count_collective(CommOp op, int64_t bytes, Nanos busy) {
  step_.stats.collectives += 1;
  step_.stats.bytes += bytes;
  step_.stats.busy_ns += busy;
  CommOpStats& o = step_.ops[op];
  o.op = op;
  o.count += 1;
  o.bytes += bytes;
  o.busy_ns += busy;
}

void CommMonitor::gpu_timing_unavailable(const std::string& why) {
  if (timing_unavailable_logged_.exchange(true) || host_ == nullptr) return;
  try {
    host_->log(LogLevel::kWarn,
               "communication: the gradient all-reduces cannot be timed on the GPU (" + why +
                   "); NCCL communication time comes from detailed windows only");
  } catch (...) {  // logging never fails the caller
  }
}

void CommMonitor::add_gpu_timing(const GpuTiming& t) {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_.gpu_timed += 1;
    epoch_.gpu.collectives += t.collectives;
    epoch_.gpu.bytes += t.bytes;
    epoch_.gpu.busy_ns += std::max<Nanos>(0, t.busy_ns);
    epoch_.gpu.exposed_ns += std::clamp<Nanos>(t.exposed_ns, 0, std::max<Nanos>(0, t.busy_ns));
    CommOpStats& o = epoch_.gpu_ops[t.op];
    o.op = t.op;
    o.count += t.collectives;
    o.bytes += t.bytes;
    o.busy_ns += std::max<Nanos>(0, t.busy_ns);
    for (size_t i = 0; i < t.durations.size(); ++i) {
      keep_duration(
          {gpu_sync_group(t.sync), static_cast<int64_t>(i), std::max<Nanos>(0, t.durations[i])});
    }
  } catch (...) {
  }
}

namespace {
// The index from which `v` keeps at most `keep` entries, moved on past the rest of a group the
// cut would split (a group missing its first collectives would show too small a wait).
size_t whole_groups_from(const std::vector<CollectiveDuration>& v, size_t keep) {
  size_t from = v.size() > keep ? v.size() - keep : 0;
  if (from == 0) return 0;
  const int64_t split = v[from - 1].group;
  while (from < v.size() && v[from].group == split) ++from;
  return from;
}
}  // namespace

void CommMonitor::keep_duration(const CollectiveDuration& d) {
  auto& v = epoch_.durations;
  if (v.size() >= 2 * kMaxCollectiveDurations) {  // amortized: the oldest half goes
    v.erase(v.begin(),
            v.begin() + static_cast<std::ptrdiff_t>(whole_groups_from(v, kMaxCollectiveDurations)));
  }
  v.push_back(d);
}

std::vector<CollectiveRecord> CommMonitor::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CollectiveRecord> out;
  for (const auto& [seq, r] : outstanding_) out.push_back(r);
  return out;
}

int64_t CommMonitor::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_ - 1;
}

CollectiveRecord CommMonitor::last_entered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_entered_;
}

std::vector<CollectiveRecord> CommMonitor::recent() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CollectiveRecord> out;
  for (size_t i = 0; i < recent_.size(); ++i) {
    out.push_back(recent_[(recent_next_ + i) % recent_.size()]);
  }
  return out;
}

void CommMonitor::on_step_begin(int64_t step, Nanos) {
  std::lock_guard<std::mutex> lock(mu_);
  current_step_ = step;
  begun_in_step_ = 0;
  if (!options_.training_thread && probe_ok_) {
    options_.training_thread = current_thread_times_probe();
    if (!options_.training_thread) probe_ok_ = false;
  }
}

void CommMonitor::on_step_end(StepRecord& record) {
  Acc step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inflight_ > 0) {  // split the running union at the boundary
      const Nanos t = now();
      close_union(t);
      open_union(t);
    }
    step = std::move(step_);
    step_ = Acc{};
    epoch_.stats.collectives += step.stats.collectives;
    epoch_.stats.bytes += step.stats.bytes;
    epoch_.stats.comm_ns += step.stats.comm_ns;
    epoch_.stats.exposed_ns += step.stats.exposed_ns;
    epoch_.stats.busy_ns += step.stats.busy_ns;
    for (const auto& [op, o] : step.ops) {
      CommOpStats& e = epoch_.ops[op];
      e.op = op;
      e.count += o.count;
      e.bytes += o.bytes;
      e.busy_ns += o.busy_ns;
    }
  }
  epoch_wall_ns_ += record.step_ns();
  epoch_steps_ += 1;
  record.metrics.set("comm", "time_ms", static_cast<double>(step.stats.comm_ns) / 1e6);
  record.metrics.set("comm", "exposed_ms", static_cast<double>(step.stats.exposed_ns) / 1e6);
  record.metrics.set("comm", "bytes", static_cast<double>(step.stats.bytes));
}

void CommMonitor::on_epoch_end(EpochSummary& summary) {
  CommEpochStats c;
  Acc acc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    acc = std::move(epoch_);
    epoch_ = Acc{};
    c.backend = backend_;
    c.rank = rank_;
    c.world_size = world_size_;
    c.link = link_;
    c.link_peak = link_peak_;
    c.outstanding = static_cast<int64_t>(outstanding_.size());
    c.method = probe_ok_ && options_.training_thread
                   ? "training thread blocked while collectives run (CPU clock and schedstat)"
                   : "not measured (no per-thread times)";
  }
  c.steps = epoch_steps_;
  c.step_wall_ns = epoch_wall_ns_;
  c.stats = acc.stats;
  c.durations.assign(acc.durations.begin() + static_cast<std::ptrdiff_t>(whole_groups_from(
                                                 acc.durations, kMaxCollectiveDurations)),
                     acc.durations.end());
  epoch_steps_ = 0;
  epoch_wall_ns_ = 0;
  if (acc.stats.comm_ns == 0 && acc.gpu_timed > 0 && acc.gpu.busy_ns > 0) {
    // Launch-counted collectives (NCCL): time from the GPU-timed syncs, per timed sync, for each
    // of the epoch's steps (the timed ones lag their host steps by a step or two).
    c.gpu_timed_syncs = acc.gpu_timed;
    const double per_step = static_cast<double>(c.steps) / static_cast<double>(acc.gpu_timed);
    auto scaled = [per_step](Nanos ns) {
      return static_cast<Nanos>(static_cast<double>(ns) * per_step);
    };
    // One stream runs the group's collectives in order: their union is their summed durations.
    c.stats.comm_ns = c.stats.busy_ns = scaled(acc.gpu.busy_ns);
    c.stats.exposed_ns = scaled(acc.gpu.exposed_ns);
    c.method =
        "GPU time: CUDA events around each gradient sync (the compute stream's wait after "
        "backward) and NCCL's own collective timing";
    // Each op's rate from its timed collectives, kept for the bytes counted at launch.
    for (auto& [op, o] : acc.ops) {
      const auto it = acc.gpu_ops.find(op);
      if (it == acc.gpu_ops.end() || it->second.bytes <= 0) continue;
      o.busy_ns = static_cast<Nanos>(static_cast<double>(o.bytes) *
                                     static_cast<double>(it->second.busy_ns) /
                                     static_cast<double>(it->second.bytes));
    }
  }
  std::vector<CommOpStats> ops;
  for (const auto& [op, o] : acc.ops) ops.push_back(o);
  set_op_bandwidths(c, std::move(ops));
  summary.sections.set(std::move(c));
}

}  // namespace torchpilot
