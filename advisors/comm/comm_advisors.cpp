// Communication advisors: exposed communication, low bus bandwidth, straggler ranks
// (docs/advice.md).
#include <algorithm>
#include <cmath>
#include <string>

#include "torchpilot/advisors/core/advice_text.h"
#include "torchpilot/advisors/core/advisors.h"
#include "torchpilot/runtime/comm/comm_records.h"

namespace torchpilot {
namespace {

using detail::gain_from_removing;
using detail::num;
using detail::pct;

double gbps(double bytes_per_s) { return bytes_per_s / 1e9; }

}  // namespace

std::optional<Advice> advise_exposed_communication(const EpochSummary& s,
                                                   const AdvisorsConfig& config) {
  const CommEpochStats* c = s.sections.get<CommEpochStats>();
  if (c == nullptr || c->steps == 0 || c->step_wall_ns <= 0 || c->stats.comm_ns <= 0) {
    return std::nullopt;
  }
  const double steps = static_cast<double>(c->steps);
  const double step_ms = c->step_wall_ns / 1e6 / steps;
  const double comm_ms = c->stats.comm_ns / 1e6 / steps;
  double exposed_ms = c->stats.exposed_ns / 1e6 / steps;
  // Waiting for a straggler shows as exposed time on the other ranks: straggler_rank speaks for
  // that part (rank 0's table; other ranks cannot tell).
  double straggler_ms = 0;
  if (const RankEpochStats* r = s.sections.get<RankEpochStats>()) {
    const Straggler* top = r->stragglers.empty() ? nullptr : &r->stragglers.front();
    if (top != nullptr && top->rank != c->rank) {
      // This rank's own wait for it when measured from collective durations, else its excess.
      double wait_ns = top->excess_ns;
      const auto me = std::find_if(r->ranks.begin(), r->ranks.end(),
                                   [&](const RankSummary& x) { return x.rank == c->rank; });
      if (top->others_wait_from_durations && me != r->ranks.end()) {
        const auto w = me->wait_for_ns.find(top->rank);
        wait_ns = w == me->wait_for_ns.end() ? 0.0 : w->second;
      }
      straggler_ms = std::min(exposed_ms, wait_ns / 1e6);
      exposed_ms -= straggler_ms;
    }
  }
  const double exposed = exposed_ms / step_ms;
  if (!measured(exposed) || exposed < config.exposed_communication.threshold) return std::nullopt;
  const double overlap = c->stats.overlap();
  Advice a;
  a.id = "exposed_communication";
  a.severity = exposed >= 0.2 ? Severity::kHigh : Severity::kWarning;
  a.finding = "communication is exposed " + pct(exposed) + " of step time (" +
              num(exposed_ms, "%.2f") + " of " + num(comm_ms, "%.2f") +
              " ms/step of collectives, overlap " + pct(measured(overlap) ? overlap : 0) + ", a " +
              num(step_ms, "%.2f") + " ms step; threshold " +
              pct(config.exposed_communication.threshold) + ")";
  a.evidence = {{"exposed_fraction", exposed, "fraction"},
                {"exposed_per_step", exposed_ms, "ms"},
                {"comm_per_step", comm_ms, "ms"},
                {"overlap", measured(overlap) ? overlap : 0.0, "fraction"},
                {"step_time", step_ms, "ms"},
                {"threshold", config.exposed_communication.threshold, "fraction"}};
  if (straggler_ms > 0) a.evidence.push_back({"straggler_wait_excluded", straggler_ms, "ms"});
  // Overlapped, a collective still costs the compute beside it part of its time (NCCL's kernels
  // take SMs and memory bandwidth; on the CPU, cores): overlap removes exposed x (1 -
  // interference), and a step takes at least its communication.
  const double kappa = std::clamp(config.exposed_communication.interference, 0.0, 1.0);
  const double predicted_ms = std::max(step_ms - exposed_ms * (1 - kappa), comm_ms);
  a.expected_gain = gain_from_removing(std::max(0.0, step_ms - predicted_ms) / step_ms);
  a.gain_estimated = true;
  a.evidence.push_back({"interference", kappa, "fraction"});
  if (measured(overlap) && overlap < 0.5) {
    a.cause =
        "the gradients are all-reduced after backward (or waited on at once): the step waits "
        "while they travel";
    a.action =
        "issue the all-reduce from backward, bucket by bucket, as gradients become ready "
        "(torchpilot::GradSync with overlap on; mode autotune tunes its bucket size, "
        "grad_sync.bucket_mb) and wait only before the optimizer step; the gain is estimated "
        "with overlapped collectives costing the compute beside them " +
        pct(kappa) + " of their time (advisors.exposed_communication.interference)";
  } else {
    a.cause = "communication takes longer than the compute it overlaps with (" +
              num(comm_ms, "%.2f") + " ms of collectives against " +
              num(step_ms - exposed_ms, "%.2f") + " ms of other work)";
    a.action =
        "send fewer bytes or faster: larger buckets (fewer, bigger messages), bf16 "
        "gradients, or a larger batch per rank to give backward more time to cover them";
  }
  return a;
}

std::optional<Advice> advise_low_bus_bandwidth(const EpochSummary& s,
                                               const AdvisorsConfig& config) {
  const CommEpochStats* c = s.sections.get<CommEpochStats>();
  if (c == nullptr || c->steps == 0 || c->world_size < 2 || c->stats.comm_ns <= 0) {
    return std::nullopt;
  }
  const double comm_share = c->comm_fraction();
  if (!measured(comm_share) || comm_share < config.low_bus_bandwidth.threshold) return std::nullopt;
  const CommOpStats* ar = nullptr;
  for (const CommOpStats& o : c->ops) {
    if (o.op == CommOp::kAllReduce) ar = &o;
  }
  // A straggler's wait is in the collectives' time: their rate says nothing of the link then.
  if (const RankEpochStats* r = s.sections.get<RankEpochStats>(); r && !r->stragglers.empty()) {
    return std::nullopt;
  }
  const bool peak_known = measured(c->link_peak) && c->link_peak > 0;
  const bool slow = peak_known && c->busbw < config.low_bus_bandwidth.fraction * c->link_peak;
  const bool small = ar != nullptr && ar->count > 0 &&
                     ar->mean_bytes() < config.low_bus_bandwidth.small_message_bytes;
  if (!slow && !small) return std::nullopt;
  Advice a;
  a.id = "low_bus_bandwidth";
  a.severity = Severity::kWarning;
  a.finding = "collectives reach " + num(gbps(c->busbw), "%.3g") + " GB/s bus bandwidth" +
              (peak_known ? " (" + pct(c->busbw / c->link_peak) + " of the " + c->link + "'s " +
                                num(gbps(c->link_peak), "%.0f") + " GB/s)"
                          : std::string()) +
              (small ? "; all-reduce messages average " +
                           num(static_cast<double>(ar->mean_bytes()) / 1e3, "%.1f") + " kB"
                     : "") +
              ", while communication takes " + pct(comm_share) + " of step time";
  a.evidence = {{"busbw", gbps(c->busbw), "GB/s"}, {"comm_fraction", comm_share, "fraction"}};
  if (peak_known) a.evidence.push_back({"link_peak", gbps(c->link_peak), "GB/s"});
  if (ar != nullptr) {
    a.evidence.push_back({"allreduce_mean_bytes", static_cast<double>(ar->mean_bytes()), "bytes"});
    a.evidence.push_back({"allreduce_count", static_cast<double>(ar->count), "collectives"});
  }
  // The reference rate: the link's share in the config, else the best op's rate in this epoch.
  double target = peak_known ? config.low_bus_bandwidth.fraction * c->link_peak : 0;
  if (!peak_known) {
    for (const CommOpStats& o : c->ops) target = std::max(target, o.busbw);
  }
  if (target > c->busbw && c->busbw > 0) {
    // The exposed part shrinks with the faster rate: exposed x (1 - busbw / target).
    const double removed = static_cast<double>(c->stats.exposed_ns) * (1.0 - c->busbw / target) /
                           static_cast<double>(c->step_wall_ns);
    a.expected_gain = gain_from_removing(removed);
    a.evidence.push_back({"reference_busbw", gbps(target), "GB/s"});
  }
  a.gain_estimated = true;
  // One all-reduce a step: the whole gradient is one message already; buckets cannot grow it.
  const double per_step =
      ar != nullptr ? static_cast<double>(ar->count) / static_cast<double>(c->steps) : 0;
  if (small && per_step <= 1.5) {
    a.evidence.push_back({"allreduce_per_step", per_step, "collectives"});
    a.cause = "the whole gradient is one all-reduce of " +
              num(static_cast<double>(ar->mean_bytes()) / 1e3, "%.1f") +
              " kB a step: the model is small for its ranks, and each step pays the "
              "collective's latency";
    a.action =
        "all-reduce less often: accumulate gradients over several micro-batches and average "
        "them once (GradSync::synchronize() after the last), or give each rank more work per "
        "step; a larger bucket cannot help";
  } else if (small) {
    a.cause =
        "messages are small: each collective pays its latency for little payload (a "
        "bucket too small, or one all-reduce per parameter)";
    a.action =
        "bucket gradients into fewer, larger all-reduces (torchpilot::GradSync bucket_mb "
        "25 or more)";
  } else {
    a.cause =
        "the link runs far below its peak: the ranks may talk over PCIe or the host where "
        "NVLink was expected, or the GPUs sit on different PCIe switches";
    a.action =
        "check the topology (nvidia-smi topo -m) and NCCL's chosen transport "
        "(NCCL_DEBUG=INFO); place the ranks on NVLink-connected GPUs";
  }
  return a;
}

std::optional<Advice> advise_straggler_rank(const EpochSummary& s, const AdvisorsConfig& config) {
  const RankEpochStats* r = s.sections.get<RankEpochStats>();
  if (r == nullptr || r->stragglers.empty() || r->ranks.size() < 2) return std::nullopt;
  const Straggler& worst = r->stragglers.front();
  std::vector<double> steps;
  for (const RankSummary& x : r->ranks) steps.push_back(x.step_ns);
  std::sort(steps.begin(), steps.end());
  const double step_ns = steps[steps.size() / 2];
  if (!(step_ns > 0)) return std::nullopt;
  Advice a;
  a.id = "straggler_rank";
  const double excess_share = std::min(0.99, worst.excess_ns / step_ns);
  a.severity = excess_share >= 0.2 ? Severity::kHigh : Severity::kWarning;
  a.finding = "rank " + std::to_string(worst.rank) + " is a straggler: " + worst.cause + "; " +
              num(worst.excess_ns / 1e6, "%.2f") + " ms/step over the other ranks' median (" +
              pct(excess_share) + " of a " + num(step_ns / 1e6, "%.2f") +
              " ms step), and the other ranks wait " + num(worst.others_wait_ns / 1e6, "%.2f") +
              " ms/step for it in collectives";
  a.cause = "every rank waits for the slowest one in each gradient all-reduce";
  a.action = "find why rank " + std::to_string(worst.rank) +
             " is slower: its data loading (workers, storage), its GPU (clocks, throttling, "
             "another process), host syncs, or an uneven share of work";
  a.evidence = {{"rank", static_cast<double>(worst.rank), "rank"},
                {"excess_per_step", worst.excess_ns / 1e6, "ms"},
                {"others_wait_per_step", worst.others_wait_ns / 1e6, "ms"},
                {"step_time", step_ns / 1e6, "ms"},
                {"threshold", config.straggler_rank.threshold, "fraction"}};
  // At the others' pace the step loses what the others wait for it: measured from collective
  // durations where rank 0 has them (overlapped, the excess misses the part of the wait that
  // slows the others' compute), else the straggler's excess.
  double lost_share = excess_share;
  if (worst.others_wait_from_durations) {
    const double per_rank = worst.others_wait_ns / static_cast<double>(r->ranks.size() - 1);
    lost_share = std::min(0.99, per_rank / step_ns);
  }
  a.expected_gain = gain_from_removing(lost_share);
  a.gain_estimated = true;
  return a;
}

}  // namespace torchpilot
