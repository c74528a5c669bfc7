#include "torchpilot/runtime/gpu/gpu_metrics.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "torchpilot/runtime/core/metrics.h"

namespace torchpilot {

void merge_in_place(std::vector<Interval>& intervals) {
  auto by_begin = [](const Interval& x, const Interval& y) { return x.begin < y.begin; };
  if (!std::is_sorted(intervals.begin(), intervals.end(), by_begin)) {
    std::sort(intervals.begin(), intervals.end(), by_begin);
  }
  size_t n = 0;
  for (const Interval& i : intervals) {
    if (n > 0 && i.begin <= intervals[n - 1].end) {
      intervals[n - 1].end = std::max(intervals[n - 1].end, i.end);
    } else {
      intervals[n++] = i;
    }
  }
  intervals.resize(n);
}

namespace {

// Clips to the window and drops empty intervals, in place (no allocation: this runs for every
// step).
void clip(std::vector<Interval>& intervals, Interval window) {
  size_t n = 0;
  for (Interval i : intervals) {
    i.begin = std::max(i.begin, window.begin);
    i.end = std::min(i.end, window.end);
    if (i.end > i.begin) intervals[n++] = i;
  }
  intervals.resize(n);
}
std::vector<Interval> clipped(std::vector<Interval> intervals, Interval window) {
  clip(intervals, window);
  return intervals;
}

std::vector<Interval> merged(std::vector<Interval> intervals) {
  merge_in_place(intervals);
  return intervals;
}

// Joins intervals (sorted, disjoint) less than `gap` apart, unless one of `ends` (sorted) falls in
// between: a compute stream resuming as a collective ends was waiting for it.
std::vector<Interval> bridged(std::vector<Interval> intervals, Nanos gap,
                              const std::vector<Nanos>& ends) {
  std::vector<Interval> out;
  for (const Interval& i : intervals) {
    const auto end =
        out.empty() ? ends.end() : std::upper_bound(ends.begin(), ends.end(), out.back().end);
    const bool waited = end != ends.end() && *end <= i.begin;
    if (!out.empty() && i.begin - out.back().end < gap && !waited) {
      out.back().end = std::max(out.back().end, i.end);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

// The communication intervals (sorted, disjoint) with each idle gap of `running` (sorted,
// disjoint: communication and other work) shorter than `gap` that ends where a communication
// interval starts, unless `work` (sorted, disjoint: bridged) covers it (a switch between queued
// kernels, not the collective's launch).
std::vector<Interval> with_gaps_before(std::vector<Interval> comm,
                                       const std::vector<Interval>& running,
                                       const std::vector<Interval>& work, Nanos gap) {
  auto starts_at = [&comm](Nanos t) {
    return std::binary_search(
        comm.begin(), comm.end(), Interval{t, t},
        [](const Interval& x, const Interval& y) { return x.begin < y.begin; });
  };
  auto covered = [&work](Interval i) {
    auto w = std::upper_bound(work.begin(), work.end(), i.begin,
                              [](Nanos t, const Interval& x) { return t < x.begin; });
    return w != work.begin() && std::prev(w)->end >= i.end;
  };
  std::vector<Interval> gaps;  // apart: comm is searched while they are found
  for (size_t i = 0; i + 1 < running.size(); ++i) {
    const Interval idle{running[i].end, running[i + 1].begin};
    if (idle.end - idle.begin < gap && starts_at(idle.end) && !covered(idle)) gaps.push_back(idle);
  }
  if (gaps.empty()) return comm;
  comm.insert(comm.end(), gaps.begin(), gaps.end());
  return merged(std::move(comm));
}

}  // namespace

Nanos union_length(std::vector<Interval> intervals, Interval window) {
  return union_length_in_place(intervals, window);
}

Nanos union_length_in_place(std::vector<Interval>& intervals, Interval window) {
  clip(intervals, window);
  merge_in_place(intervals);
  Nanos total = 0;
  for (const Interval& i : intervals) total += i.end - i.begin;
  return total;
}

Nanos intersection_length(std::vector<Interval> a, std::vector<Interval> b, Interval window) {
  const std::vector<Interval> x = merged(clipped(std::move(a), window));
  const std::vector<Interval> y = merged(clipped(std::move(b), window));
  // Two sorted disjoint lists: walk both.
  Nanos total = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const Nanos lo = std::max(x[i].begin, y[j].begin);
    const Nanos hi = std::min(x[i].end, y[j].end);
    if (hi > lo) total += hi - lo;
    if (x[i].end < y[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

GpuWindowMetrics gpu_window_metrics(const std::vector<KernelEvent>& kernels, Interval window,
                                    int sm_count, std::vector<Interval> copies) {
  GpuWindowMetrics m;
  m.window_ns = std::max<Nanos>(0, window.end - window.begin);
  if (m.window_ns == 0 || sm_count <= 0) return m;

  std::vector<Interval> all, comm, compute;
  // Sweep events: +share at a kernel's start, -share at its end (clipped to the window).
  std::vector<std::pair<Nanos, double>> edges;
  for (const KernelEvent& k : kernels) {
    const Interval i{std::max(k.begin, window.begin), std::min(k.end, window.end)};
    if (i.end <= i.begin) continue;
    all.push_back(i);
    (k.communication ? comm : compute).push_back(i);
    const double share =
        std::min(1.0, static_cast<double>(std::max<int64_t>(0, k.blocks)) / sm_count);
    edges.emplace_back(i.begin, share);
    edges.emplace_back(i.end, -share);
  }
  m.gpu_utilization = fraction(union_length(all, window), m.window_ns);

  std::sort(edges.begin(), edges.end());
  double active = 0;  // summed shares of the kernels running now
  double busy_sm_ns = 0;
  for (size_t e = 0; e < edges.size(); ++e) {
    active += edges[e].second;
    if (e + 1 < edges.size()) {
      const Nanos span = edges[e + 1].first - edges[e].first;
      busy_sm_ns += std::min(1.0, std::max(0.0, active)) * static_cast<double>(span);
    }
  }
  m.estimated_sm_efficiency = std::min(1.0, busy_sm_ns / static_cast<double>(m.window_ns));

  if (comm.empty()) return m;
  // Compute kernels and copies closer than kComputeGapBridgeNs count as one busy stretch: the GPU's
  // switch from one queued kernel to the next is not time communication adds to the step (removing
  // the communication would not remove it). A gap in which a collective ends is a wait for it.
  // Copies are work too (a bucket's copy before its all-reduce): removing the communication
  // would not remove them.
  std::vector<Nanos> comm_ends;
  comm_ends.reserve(comm.size());
  for (const Interval& c : comm) comm_ends.push_back(c.end);
  std::sort(comm_ends.begin(), comm_ends.end());
  std::vector<Interval> work = merged(clipped(std::move(compute), window));
  if (!copies.empty()) {
    std::vector<Interval> c = clipped(std::move(copies), window);
    c.insert(c.end(), work.begin(), work.end());
    work = merged(std::move(c));
  }
  const std::vector<Interval> busy = bridged(work, kComputeGapBridgeNs, comm_ends);
  std::vector<Interval> comm_merged = merged(comm);
  std::vector<Interval> running = comm_merged;
  running.insert(running.end(), work.begin(), work.end());
  comm_merged =
      with_gaps_before(std::move(comm_merged), merged(std::move(running)), busy, kCommGapBridgeNs);
  m.comm_ns = union_length(comm_merged, window);
  m.comm_overlapped_ns = intersection_length(std::move(comm_merged), busy, window);
  m.exposed_comm_ns = m.comm_ns - m.comm_overlapped_ns;
  m.comm_overlap = fraction(m.comm_overlapped_ns, m.comm_ns);
  return m;
}

}  // namespace torchpilot
