#include "torchpilot/runtime/comm/comm_records.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <string>
#include <utility>

#include "torchpilot/runtime/core/format.h"

namespace torchpilot {

using detail::dump;
using detail::fmt_num;
using detail::fmt_pct;
using detail::json;
using detail::median;
using detail::number;

const char* to_string(CommOp op) {
  static constexpr const char* kNames[] = {
      "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",  "all_to_all",
      "barrier",    "send",       "recv",           "gather",    "scatter", "other"};
  static_assert(std::size(kNames) == static_cast<size_t>(CommOp::kOther) + 1);
  return detail::enum_name(op, kNames, "other");
}

CommOp comm_op_from_name(std::string_view name) {
  // Drop the backend or namespace prefix ("gloo:", "nccl:", "c10d::"), then underscores, so
  // "all_reduce", "allreduce_" and "allreduce_coalesced" compare alike.
  const size_t colon = name.rfind(':');
  if (colon != std::string_view::npos) name.remove_prefix(colon + 1);
  std::string s;
  for (char c : name) {
    if (c != '_') s.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
  }
  auto starts = [&](const char* p) { return s.rfind(p, 0) == 0; };
  if (starts("allreduce")) return CommOp::kAllReduce;
  if (starts("reducescatter")) return CommOp::kReduceScatter;
  if (starts("allgather")) return CommOp::kAllGather;
  if (starts("alltoall")) return CommOp::kAllToAll;
  if (starts("broadcast")) return CommOp::kBroadcast;
  if (starts("reduce")) return CommOp::kReduce;
  if (starts("barrier")) return CommOp::kBarrier;
  if (starts("send")) return CommOp::kSend;
  if (starts("recv")) return CommOp::kRecv;
  if (starts("gather")) return CommOp::kGather;
  if (starts("scatter")) return CommOp::kScatter;
  return CommOp::kOther;
}

void set_op_bandwidths(CommEpochStats& c, std::vector<CommOpStats> ops) {
  double weighted = 0;
  Nanos busy = 0;
  for (CommOpStats& o : ops) {
    const double s = static_cast<double>(o.busy_ns) / 1e9;
    o.algbw = s > 0 ? static_cast<double>(o.bytes) / s : 0;
    const double factor = bus_bandwidth_factor(o.op, c.world_size);
    o.busbw = o.algbw * factor;
    if (factor > 0) {
      weighted += static_cast<double>(o.bytes) * factor;
      busy += o.busy_ns;
    }
  }
  c.busbw = busy > 0 ? weighted * 1e9 / static_cast<double>(busy) : 0;
  std::sort(ops.begin(), ops.end(),
            [](const CommOpStats& a, const CommOpStats& b) { return a.bytes > b.bytes; });
  c.ops = std::move(ops);
}

double bus_bandwidth_factor(CommOp op, int ranks) {
  if (ranks < 1) return 0;
  const double n = ranks;
  switch (op) {
    case CommOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll:
      return (n - 1) / n;
    case CommOp::kBroadcast:
    case CommOp::kReduce:
    case CommOp::kSend:
    case CommOp::kRecv:
    case CommOp::kGather:
    case CommOp::kScatter:
      return ranks > 1 ? 1.0 : 0.0;
    case CommOp::kBarrier:
    case CommOp::kOther:
      break;
  }
  return 0;
}

double CommStats::overlap() const {
  if (comm_ns <= 0) return kNotMeasured;
  return 1.0 - static_cast<double>(std::min(exposed_ns, comm_ns)) / static_cast<double>(comm_ns);
}

double CommEpochStats::comm_fraction() const {
  return step_wall_ns > 0 ? static_cast<double>(stats.comm_ns) / step_wall_ns : kNotMeasured;
}
double CommEpochStats::exposed_fraction() const {
  return step_wall_ns > 0 ? static_cast<double>(stats.exposed_ns) / step_wall_ns : kNotMeasured;
}

namespace {

std::string fmt_bytes(double b) {
  if (b >= 1e9) return fmt_num(b / 1e9) + " GB";
  if (b >= 1e6) return fmt_num(b / 1e6) + " MB";
  if (b >= 1e3) return fmt_num(b / 1e3) + " kB";
  return fmt_num(b) + " B";
}
std::string fmt_rate(double bytes_per_s) { return fmt_num(bytes_per_s / 1e9) + " GB/s"; }
std::string fmt_step_ms(double ns) { return measured(ns) ? fmt_num(ns / 1e6) : "n/a"; }

}  // namespace

std::string section_json(const CommEpochStats& c) {
  json ops = json::array();
  for (const auto& o : c.ops) {
    ops.push_back({{"op", to_string(o.op)},
                   {"count", o.count},
                   {"bytes", o.bytes},
                   {"mean_bytes", o.mean_bytes()},
                   {"busy_ms", detail::ms(o.busy_ns)},
                   {"algbw", o.algbw},
                   {"busbw", o.busbw}});
  }
  return dump(json{{"backend", c.backend},
                   {"rank", c.rank},
                   {"world_size", c.world_size},
                   {"method", c.method},
                   {"collectives", c.stats.collectives},
                   {"bytes", c.stats.bytes},
                   {"comm_ms", detail::ms(c.stats.comm_ns)},
                   {"exposed_ms", detail::ms(c.stats.exposed_ns)},
                   {"overlap", number(c.stats.overlap())},
                   {"comm_fraction", number(c.comm_fraction())},
                   {"exposed_fraction", number(c.exposed_fraction())},
                   {"busbw", c.busbw},
                   {"link_peak", number(c.link_peak)},
                   {"link", c.link},
                   {"outstanding", c.outstanding},
                   {"gpu_timed_syncs", c.gpu_timed_syncs},
                   {"ops", ops}});
}

void section_text(const CommEpochStats& c, const EpochSummary& epoch,
                  std::vector<std::string>& lines) {
  if (c.stats.collectives == 0 && c.outstanding == 0) {
    lines.push_back("  communication: no collectives (rank " + std::to_string(c.rank) + " of " +
                    std::to_string(c.world_size) + ")");
    return;
  }
  const double steps = std::max<int64_t>(1, c.steps);
  std::string line = "  communication (" + (c.backend.empty() ? std::string("?") : c.backend) +
                     ", rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) +
                     "): " + fmt_num(detail::ms(c.stats.comm_ns) / steps) + " ms/step (" +
                     detail::fmt_opt_pct(c.comm_fraction()) + " of step time), exposed " +
                     fmt_num(detail::ms(c.stats.exposed_ns) / steps) + " ms/step (" +
                     detail::fmt_opt_pct(c.exposed_fraction()) + "), overlap " +
                     detail::fmt_opt_pct(c.stats.overlap()) + "; " +
                     std::to_string(c.stats.collectives) + " collectives, " +
                     fmt_bytes(static_cast<double>(c.stats.bytes)) + ", bus bandwidth " +
                     fmt_rate(c.busbw);
  if (measured(c.link_peak) && c.link_peak > 0) {
    line += " of " + fmt_rate(c.link_peak) + " (" + c.link + ")";
  }
  if (c.gpu_timed_syncs > 0) {
    line += "; GPU time of " + std::to_string(c.gpu_timed_syncs) + " gradient syncs";
  }
  lines.push_back(line);
  std::string ops = "  collectives:";
  for (size_t i = 0; i < c.ops.size() && i < 4; ++i) {
    const CommOpStats& o = c.ops[i];
    ops += std::string(i == 0 ? " " : "; ") + to_string(o.op) + " x" + std::to_string(o.count) +
           " (mean " + fmt_bytes(static_cast<double>(o.mean_bytes())) + ", algbw " +
           fmt_rate(o.algbw) + ", busbw " + fmt_rate(o.busbw) + ")";
  }
  lines.push_back(ops);
  if (c.outstanding > 0) {
    lines.push_back("  " + std::to_string(c.outstanding) +
                    " collective(s) still running at the epoch's end");
  }
  (void)epoch;
}

std::string to_json(const RankSummary& r, bool with_durations) {
  json j{{"rank", r.rank},
         {"steps", r.steps},
         {"step_ns", r.step_ns},
         {"data_wait_ns", r.data_wait_ns},
         {"compute_ns", r.compute_ns},
         {"comm_ns", r.comm_ns},
         {"exposed_ns", r.exposed_ns},
         {"gpu_utilization", number(r.gpu_utilization)},
         {"sm_efficiency", number(r.sm_efficiency)},
         {"sm_clock_mhz", number(r.sm_clock_mhz)},
         {"host_sync_ns", number(r.host_sync_ns)},
         {"wait_ns", number(r.wait_ns)}};
  if (with_durations) {
    json d = json::array();
    for (const CollectiveDuration& c : r.durations) {
      d.push_back(json::array({c.group, c.index, c.duration_ns}));
    }
    j["durations"] = std::move(d);
  }
  return dump(j);
}

bool from_json(const std::string& text, RankSummary& out) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto num = [&](const char* key, double& field) {
    auto it = j.find(key);
    if (it == j.end()) return false;
    field = it->is_number() ? it->get<double>() : kNotMeasured;
    return true;
  };
  RankSummary r;
  auto it = j.find("rank");
  auto st = j.find("steps");
  if (it == j.end() || !it->is_number_integer() || st == j.end() || !st->is_number_integer()) {
    return false;
  }
  r.rank = it->get<int>();
  r.steps = st->get<int64_t>();
  if (!num("step_ns", r.step_ns) || !num("data_wait_ns", r.data_wait_ns) ||
      !num("compute_ns", r.compute_ns) || !num("comm_ns", r.comm_ns) ||
      !num("exposed_ns", r.exposed_ns)) {
    return false;
  }
  num("gpu_utilization", r.gpu_utilization);
  num("sm_efficiency", r.sm_efficiency);
  num("sm_clock_mhz", r.sm_clock_mhz);
  num("host_sync_ns", r.host_sync_ns);
  num("wait_ns", r.wait_ns);
  const auto d = j.find("durations");
  if (d != j.end() && d->is_array()) {
    for (const json& e : *d) {
      if (!e.is_array() || e.size() != 3 || !e[0].is_number_integer() ||
          !e[1].is_number_integer() || !e[2].is_number_integer()) {
        return false;
      }
      r.durations.push_back({e[0].get<int64_t>(), e[1].get<int64_t>(), e[2].get<Nanos>()});
    }
  }
  out = std::move(r);
  return true;
}

void set_collective_waits(std::vector<RankSummary>& ranks) {
  const size_t n = ranks.size();
  bool usable = n >= 2;
  for (const RankSummary& r : ranks) usable = usable && r.rank >= 0;
  // (group, index) -> duration on each rank (by position in `ranks`; -1: no record).
  std::map<std::pair<int64_t, int64_t>, std::vector<Nanos>> by_key;
  if (usable) {
    for (size_t i = 0; i < n; ++i) {
      for (const CollectiveDuration& c : ranks[i].durations) {
        auto& v = by_key[{c.group, c.index}];
        if (v.empty()) v.assign(n, -1);
        v[i] = std::max<Nanos>(0, c.duration_ns);
      }
    }
  }
  for (RankSummary& r : ranks) r.durations.clear();
  // Per group: each rank's longest wait and whom it waited for.
  struct Worst {
    Nanos wait = 0;
    size_t last = 0;  // position of the rank that arrived last
  };
  std::vector<double> wait(n, 0);
  std::vector<std::map<int, double>> wait_for(n);
  int64_t groups = 0;
  auto it = by_key.begin();
  while (it != by_key.end()) {
    const int64_t group = it->first.first;
    std::vector<Worst> worst(n);
    bool any = false;
    for (; it != by_key.end() && it->first.first == group; ++it) {
      const std::vector<Nanos>& d = it->second;
      if (std::find(d.begin(), d.end(), Nanos{-1}) != d.end()) continue;  // not on every rank
      const size_t last = static_cast<size_t>(std::min_element(d.begin(), d.end()) - d.begin());
      any = true;
      for (size_t i = 0; i < n; ++i) {
        const Nanos w = d[i] - d[last];
        if (w > worst[i].wait) worst[i] = {w, last};
      }
    }
    if (!any) continue;
    ++groups;
    for (size_t i = 0; i < n; ++i) {
      if (worst[i].wait == 0) continue;
      wait[i] += static_cast<double>(worst[i].wait);
      wait_for[i][ranks[worst[i].last].rank] += static_cast<double>(worst[i].wait);
    }
  }
  if (groups == 0) return;
  for (size_t i = 0; i < n; ++i) {
    ranks[i].wait_ns = wait[i] / static_cast<double>(groups);
    for (auto& [rank, w] : wait_for[i]) w /= static_cast<double>(groups);
    ranks[i].wait_for_ns = std::move(wait_for[i]);
  }
}

// A rank whose SM clock is below this share of the others' median runs its kernels slower for
// that alone (boost clocks differ by a few percent between healthy GPUs of one host).
constexpr double kLowerClockShare = 0.95;

namespace {

// A rank's GPU idle per step, from its GPU utilization (NaN when not measured).
double gpu_idle_ns(const RankSummary& r) {
  if (!measured(r.gpu_utilization)) return kNotMeasured;
  return std::max(0.0, 1.0 - r.gpu_utilization) * r.step_ns;
}

// SM efficiency over the time the GPU was busy: the epoch's figure counts idle time as
// inefficient, which would blame a rank's kernels for its host's delays.
double busy_sm_efficiency(const RankSummary& r) {
  if (!measured(r.sm_efficiency)) return kNotMeasured;
  if (!measured(r.gpu_utilization)) return r.sm_efficiency;
  return r.gpu_utilization > 0 ? std::min(1.0, r.sm_efficiency / r.gpu_utilization) : kNotMeasured;
}

}  // namespace

std::vector<Straggler> find_stragglers(const std::vector<RankSummary>& ranks, double threshold) {
  std::vector<Straggler> out;
  if (ranks.size() < 2) return out;
  for (const RankSummary& r : ranks) {
    // Against the other ranks' median: with two ranks the median of all would split the gap.
    std::vector<double> compute, data, step, sm, sync, clock, idle;
    for (const RankSummary& o : ranks) {
      if (o.rank == r.rank) continue;
      compute.push_back(o.compute_ns);
      data.push_back(o.data_wait_ns);
      step.push_back(o.step_ns);
      if (measured(busy_sm_efficiency(o))) sm.push_back(busy_sm_efficiency(o));
      if (measured(gpu_idle_ns(o))) idle.push_back(gpu_idle_ns(o));
      if (measured(o.host_sync_ns)) sync.push_back(o.host_sync_ns);
      if (measured(o.sm_clock_mhz)) clock.push_back(o.sm_clock_mhz);
    }
    const double med_step = median(step);
    const double excess_compute = r.compute_ns - median(compute);
    const double excess_data = r.data_wait_ns - median(data);
    const double excess = std::max(excess_compute, excess_data);
    if (!(med_step > 0) || excess <= threshold * med_step) continue;
    Straggler s;
    s.rank = r.rank;
    s.excess_ns = excess;
    if (excess_data >= excess_compute) {
      s.cause = "data wait (" + fmt_step_ms(r.data_wait_ns) + " ms/step against " +
                fmt_step_ms(median(data)) + ")";
    } else if (measured(r.host_sync_ns) && !sync.empty() &&
               r.host_sync_ns - median(sync) > 0.5 * excess_compute) {
      s.cause = "host syncs (GPU idle after them " + fmt_step_ms(r.host_sync_ns) +
                " ms/step against " + fmt_step_ms(median(sync)) + ")";
    } else if (measured(gpu_idle_ns(r)) && !idle.empty() &&
               gpu_idle_ns(r) - median(idle) > 0.5 * excess_compute) {
      // Its GPU sits idle while its host works (the planted straggler of bench/collectives: host
      // work on the training thread). Its SM efficiency is low for the idle alone.
      s.cause = "host work (its GPU idle " + fmt_step_ms(gpu_idle_ns(r)) + " ms/step against " +
                fmt_step_ms(median(idle)) + " on the other ranks: the GPU waits for the host)";
    } else if (measured(r.sm_clock_mhz) && !clock.empty() &&
               r.sm_clock_mhz < kLowerClockShare * median(clock)) {
      // The same kernels at a lower clock take longer: power, thermal limits or a slower part.
      s.cause = "lower SM clock (" + fmt_num(r.sm_clock_mhz) + " MHz while busy against " +
                fmt_num(median(clock)) + " MHz on the other ranks: a power or thermal limit)";
    } else if (measured(busy_sm_efficiency(r)) && !sm.empty() &&
               busy_sm_efficiency(r) < 0.9 * median(sm)) {
      s.cause = "slower kernels (SM efficiency while busy " + fmt_pct(busy_sm_efficiency(r)) +
                " against " + fmt_pct(median(sm)) + ")";
    } else {
      s.cause = "compute (" + fmt_step_ms(r.compute_ns) + " ms/step against " +
                fmt_step_ms(median(compute)) + ")";
    }
    // Measured from collective durations when every rank has them; else each rank's exposed
    // communication, bounded by the excess (overlapped, part of the wait hides in compute).
    s.others_wait_from_durations = std::all_of(
        ranks.begin(), ranks.end(), [](const RankSummary& o) { return measured(o.wait_ns); });
    for (const RankSummary& o : ranks) {
      if (o.rank == r.rank) continue;
      if (s.others_wait_from_durations) {
        const auto w = o.wait_for_ns.find(r.rank);
        if (w != o.wait_for_ns.end()) s.others_wait_ns += w->second;
      } else {
        s.others_wait_ns += std::min(std::max(0.0, o.exposed_ns), excess);
      }
    }
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const Straggler& a, const Straggler& b) { return a.excess_ns > b.excess_ns; });
  return out;
}

std::string section_json(const RankEpochStats& r) {
  json ranks = json::array();
  for (const auto& s : r.ranks) ranks.push_back(json::parse(to_json(s)));
  json stragglers = json::array();
  for (const auto& s : r.stragglers) {
    stragglers.push_back(
        {{"rank", s.rank},
         {"cause", s.cause},
         {"excess_ms", s.excess_ns / 1e6},
         {"others_wait_ms", s.others_wait_ns / 1e6},
         {"others_wait_from",
          s.others_wait_from_durations ? "collective durations" : "exposed communication"}});
  }
  return dump(json{{"epoch", r.epoch},
                   {"ready_ms", r.ready_ms},
                   {"world_size", r.world_size},
                   {"ranks_reported", r.ranks_reported},
                   {"ranks_omitted", r.ranks_omitted},
                   {"step_ms_p50", number(r.step_ns_p50 / 1e6)},
                   {"step_ms_p90", number(r.step_ns_p90 / 1e6)},
                   {"step_ms_max", number(r.step_ns_max / 1e6)},
                   {"ranks", ranks},
                   {"missing", r.missing},
                   {"stragglers", stragglers},
                   {"threshold", r.threshold}});
}

void section_text(const RankEpochStats& r, const EpochSummary& epoch,
                  std::vector<std::string>& lines) {
  const std::string of =
      r.epoch == epoch.epoch ? std::string() : ", of epoch " + std::to_string(r.epoch);
  lines.push_back("  ranks (ms/step" + of +
                  "): rank | step | data wait | compute | comm | exposed | waits for others "
                  "| GPU util | SM eff");
  for (const RankSummary& s : r.ranks) {
    lines.push_back("    " + std::to_string(s.rank) + " | " + fmt_step_ms(s.step_ns) + " | " +
                    fmt_step_ms(s.data_wait_ns) + " | " + fmt_step_ms(s.compute_ns) + " | " +
                    fmt_step_ms(s.comm_ns) + " | " + fmt_step_ms(s.exposed_ns) + " | " +
                    fmt_step_ms(s.wait_ns) + " | " + detail::fmt_opt_pct(s.gpu_utilization) +
                    " | " + detail::fmt_opt_pct(s.sm_efficiency));
  }
  if (r.ranks_omitted > 0) {
    lines.push_back("    ... " + std::to_string(r.ranks_omitted) + " more of " +
                    std::to_string(r.ranks_reported) + " ranks (the slowest are shown); step p50 " +
                    fmt_step_ms(r.step_ns_p50) + ", p90 " + fmt_step_ms(r.step_ns_p90) + ", max " +
                    fmt_step_ms(r.step_ns_max) + " ms over all");
  }
  if (!r.missing.empty()) {
    std::string m;
    for (int x : r.missing) m += (m.empty() ? "" : ", ") + std::to_string(x);
    lines.push_back("  ranks " + m + " did not report epoch " + std::to_string(r.epoch) +
                    " within the exchange timeout");
  }
  for (const Straggler& s : r.stragglers) {
    lines.push_back("  straggler: rank " + std::to_string(s.rank) + ", " + s.cause + "; " +
                    fmt_num(s.excess_ns / 1e6) + " ms/step over the others' median, the other " +
                    "ranks wait " + fmt_num(s.others_wait_ns / 1e6) + " ms/step for it in total" +
                    (s.others_wait_from_durations ? " (from collective durations)"
                                                  : " (their exposed communication)"));
  }
  (void)epoch;
}

}  // namespace torchpilot
