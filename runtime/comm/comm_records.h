// Collectives: what a collective looks like to torchpilot (op, bytes, dtype, group size, sequence
// number, times), the per-step and per-epoch communication figures, the per-rank summaries rank 0
// gathers, and the bus-bandwidth conventions (docs/metrics.md, "Communication").
//
// Communication time: the union of the intervals in which collectives run (CPU/Gloo: from the
// backend's start of the work to its completion). Exposed communication: the part of it in which
// the training thread is blocked (neither on a CPU nor waiting for one), i.e. its wait() on the
// result; on the GPU, the part in which no compute kernel runs. Overlap = 1 - exposed /
// communication. Algorithm bandwidth = bytes / time; bus bandwidth = algbw x the nccl-tests factor
// of the op (bus_bandwidth_factor).
//
// Thread-safety: plain values. Failure behaviour: nothing here throws except allocation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "torchpilot/runtime/core/clock.h"
#include "torchpilot/runtime/core/records.h"

namespace torchpilot {

enum class CommOp {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv,
  kGather,
  kScatter,
  kOther
};
constexpr int kCommOps = 12;

// "all_reduce", ...
const char* to_string(CommOp op);
// The op of a backend's profiling title or op name: "gloo:all_reduce", "nccl:all_reduce",
// "c10d::allreduce_", "allreduce", "all_gather_into_tensor", "_reduce_scatter_base", ...
// kOther when unknown.
CommOp comm_op_from_name(std::string_view name);
// nccl-tests' bus bandwidth factor for `ranks` ranks: all-reduce 2(n-1)/n, all-gather,
// reduce-scatter and all-to-all (n-1)/n, broadcast, reduce, send/recv 1; 0 for a barrier (no
// payload) and for one rank where the factor is 0 (no bus traffic).
double bus_bandwidth_factor(CommOp op, int ranks);

// One collective as observed in this process.
struct CollectiveRecord {
  CommOp op = CommOp::kOther;
  std::string name;     // as the backend called it ("gloo:all_reduce")
  int64_t bytes = 0;    // payload of this rank's input (all tensors)
  std::string dtype;    // of the first tensor ("Float")
  int group_size = 0;   // ranks in the group (0: unknown)
  int64_t seq = 0;      // this process's collectives in start order, from 1
  Nanos begin_ns = 0;   // the backend started it
  Nanos end_ns = 0;     // completed (0: outstanding)
  int64_t step = -1;    // the step it began in (-1: before the first)
  int64_t in_step = 0;  // its place among that step's collectives, from 0
};

// One collective's duration on this rank, keyed so that the ranks' records of it match (the ranks
// of a group issue the same collectives in the same order): `group` is the step it began in
// (host-timed collectives; -1 before the first step) or, for GPU-timed ones, -2 - the gradient
// sync it belongs to (GradSync's count of synchronize calls; negative so that the two kinds never
// share a key), `index` its place in that group. A collective ends at about the same time
// on every rank, so the longer it ran here, the earlier this rank arrived and the longer it waited
// for the last one (collective_waits; docs/metrics.md, "Waiting for other ranks").
struct CollectiveDuration {
  int64_t group = 0;
  int64_t index = 0;
  Nanos duration_ns = 0;
};
// The group of a GPU-timed gradient sync's collectives.
constexpr int64_t gpu_sync_group(int64_t sync) { return -2 - sync; }
// The most durations a rank keeps (its epoch's last) and sends rank 0 per epoch.
constexpr size_t kMaxCollectiveDurations = 512;

// Communication figures of a set of steps.
struct CommStats {
  int64_t collectives = 0;  // completed
  int64_t bytes = 0;
  Nanos comm_ns = 0;     // union of the collectives' intervals
  Nanos exposed_ns = 0;  // of which the training thread was blocked (or no compute kernel ran)
  Nanos busy_ns = 0;     // sum of the collectives' own durations (for bandwidth)
  // 1 - exposed / comm; NaN without communication.
  double overlap() const;
};

// Per op, over an epoch.
struct CommOpStats {
  CommOp op = CommOp::kOther;
  int64_t count = 0;
  int64_t bytes = 0;
  Nanos busy_ns = 0;  // sum of durations
  double algbw = 0;   // bytes / s over the op's summed duration
  double busbw = 0;   // algbw x bus_bandwidth_factor
  int64_t mean_bytes() const { return count > 0 ? bytes / count : 0; }
};

// The epoch's section "comm".
struct CommEpochStats {
  static constexpr const char* kSectionName = "comm";
  std::string backend;  // "gloo", "nccl", "" when unknown
  int rank = 0;
  int world_size = 1;
  std::string method;            // how exposed time was measured ("training thread blocked", ...)
  int64_t steps = 0;             // steps of the epoch
  CommStats stats;               // totals over the epoch's steps
  Nanos step_wall_ns = 0;        // the same steps' wall time
  std::vector<CommOpStats> ops;  // most bytes first
  double busbw = 0;              // all ops together: bytes-weighted (sum bytes x factor / busy)
  double link_peak = kNotMeasured;  // bytes/s of the link the ranks share, when known
  std::string link;                 // its name ("NVLink", "PCIe", "loopback", ...)
  int64_t outstanding = 0;          // collectives still running at the epoch's end
  // Gradient syncs timed on the GPU (CUDA events) whose figures, per sync, give stats for the
  // epoch's steps; 0: the figures are the host's (Gloo) or absent (NCCL without GPU timing).
  int64_t gpu_timed_syncs = 0;
  // The epoch's last collectives' durations (at most kMaxCollectiveDurations), for rank 0's
  // waiting times; not in the section's JSON.
  std::vector<CollectiveDuration> durations;
  // Fractions of the epoch's step time.
  double comm_fraction() const;
  double exposed_fraction() const;
};
// The epoch's ops (their bytes and busy time set) into c.ops, most bytes first, each with its
// algorithm and bus bandwidth (the nccl-tests conventions, c.world_size ranks), and c.busbw.
void set_op_bandwidths(CommEpochStats& c, std::vector<CommOpStats> ops);
std::string section_json(const CommEpochStats& c);
void section_text(const CommEpochStats& c, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

// One rank's epoch, as rank 0 gathers it through the store (per-step means, ns; NaN: not measured).
struct RankSummary {
  int rank = 0;
  int64_t steps = 0;
  double step_ns = 0;  // mean step time
  double data_wait_ns = 0;
  double compute_ns = 0;  // step - data wait - exposed communication
  double comm_ns = 0;
  double exposed_ns = 0;
  double gpu_utilization = kNotMeasured;
  double sm_efficiency = kNotMeasured;
  double sm_clock_mhz = kNotMeasured;  // NVML's SM clock, mean over the epoch (NaN: not read)
  double host_sync_ns = kNotMeasured;  // GPU idle after host syncs, per step, when traced
  // Sent to rank 0 (the exchange's JSON only): this rank's collective durations.
  std::vector<CollectiveDuration> durations;
  // Set on rank 0 by set_collective_waits: the time this rank's collectives waited for later
  // ranks, per step (per gradient sync on the GPU); and of it, by rank, the part spent waiting
  // for that rank (empty: not measured).
  double wait_ns = kNotMeasured;
  std::map<int, double> wait_for_ns;  // by the rank waited for; absent: none
};
// `with_durations`: the exchange's form; the section's leaves them out.
std::string to_json(const RankSummary& r, bool with_durations = false);
// False when the text is not a RankSummary's JSON.
bool from_json(const std::string& text, RankSummary& out);

// Each rank's wait for the others at collectives, from every rank's durations. For each group every
// rank has records of: a collective's wait on a rank is its duration there less its shortest
// duration on any rank (that of the last rank to arrive, the one waited for); a rank's wait in the
// group is its longest such wait (one stream runs the collectives in order, so each one's wait
// overlaps the earlier ones'), blamed on the rank that arrived last there. wait_ns and wait_for_ns
// are the means over the groups; both stay unset when no group is common to all ranks. The
// durations are cleared.
void set_collective_waits(std::vector<RankSummary>& ranks);

// A rank whose compute or data time per step exceeds the ranks' median by more than the
// threshold (fraction of the median step).
struct Straggler {
  int rank = 0;
  std::string cause;     // "data wait", "lower SM clock", "slower kernels", "compute", ...
  double excess_ns = 0;  // its (compute + data wait) above the median, per step
  // The other ranks' wait for it per step, summed: from collective durations where rank 0 has
  // them (wait_for_ns), else each rank's exposed communication bounded by the excess.
  double others_wait_ns = 0;
  bool others_wait_from_durations = false;
};

// The epoch's per-rank table on rank 0: section "ranks".
struct RankEpochStats {
  static constexpr const char* kSectionName = "ranks";
  // The epoch the table is of: rank 0 gathers it off the training thread, so it may come with a
  // later epoch's summary (RankCollector).
  int64_t epoch = 0;
  double ready_ms = 0;  // from rank 0's end of that epoch until every rank's summary was read
  int world_size = 0;
  // By rank; the missing ones absent. Past kMaxRankRows reporting ranks, only the slowest
  // kMaxRankRows (stragglers included) stay, and the rest are counted and summarised below, so
  // that a thousand ranks' table stays a few dozen rows in the log and the JSON.
  static constexpr size_t kMaxRankRows = 32;
  std::vector<RankSummary> ranks;
  int64_t ranks_reported = 0;  // all that reported, rows kept or not
  int64_t ranks_omitted = 0;
  double step_ns_p50 = kNotMeasured, step_ns_p90 = kNotMeasured, step_ns_max = kNotMeasured;
  std::vector<int> missing;  // ranks that did not report within the timeout
  std::vector<Straggler> stragglers;
  double threshold = 0;  // as configured
};
std::string section_json(const RankEpochStats& r);
void section_text(const RankEpochStats& r, const EpochSummary& epoch,
                  std::vector<std::string>& lines);

// Stragglers among `ranks` (at least 2 needed): compute or data wait above the median by more
// than threshold x the median step time.
std::vector<Straggler> find_stragglers(const std::vector<RankSummary>& ranks, double threshold);

}  // namespace torchpilot
