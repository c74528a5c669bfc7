#include "torchpilot/runtime/comm/rank_exchange.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/core/guard.h"
#include "torchpilot/runtime/gpu/gpu_records.h"

namespace torchpilot {

using detail::dump;
using detail::json;

namespace {

Nanos steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s.empty() ? "none" : s;
}

}  // namespace

// --- InMemoryStore
// ---------------------------------------------------------------------------------

void InMemoryStore::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  map_[key] = value;
}
bool InMemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys) {
    if (map_.count(k) == 0) return false;
  }
  return true;
}
std::string InMemoryStore::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.at(key);
}
bool InMemoryStore::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.erase(key) > 0;
}
size_t InMemoryStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

// --- RankExchange
// ----------------------------------------------------------------------------------

RankExchange::RankExchange(std::shared_ptr<KeyValueStore> store, int rank, int world_size,
                           Nanos timeout_ns, std::string prefix)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(std::max(1, world_size)),
      timeout_ns_(timeout_ns),
      prefix_(std::move(prefix)) {}

std::string RankExchange::key(const std::string& tag, int rank) const {
  return prefix_ + tag + "/" + std::to_string(rank);
}

std::string RankExchange::fail(const std::exception_ptr& e) {
  const std::string what = what_of(e);
  if (!failed_.load(std::memory_order_relaxed)) {
    failure_ = what;
    failed_.store(true, std::memory_order_release);
  }
  return what;
}

bool RankExchange::failed_before(std::string* error) const {
  if (!failed_.load(std::memory_order_relaxed)) return false;
  if (error != nullptr) *error = "the store failed earlier: " + failure_;
  return true;
}

std::optional<std::string> RankExchange::take_failure_line() {
  if (!failed() || failure_told_.exchange(true)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  return "rank " + std::to_string(rank_) + ": the store failed (" + failure_ +
         "); no per-rank table, joint tuning or collective watchdog from now on; training goes "
         "on";
}

bool RankExchange::post(const std::string& tag, const std::string& value, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_before(error)) return false;
  try {
    store_->set(key(tag, rank_), value);
    return true;
  } catch (...) {
    const std::string what = fail(std::current_exception());
    if (error != nullptr) *error = what;
    return false;
  }
}

bool RankExchange::aborted(const std::string& family) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_before(nullptr)) return true;
  try {
    return store_->check({prefix_ + "abort/" + family});
  } catch (...) {
    fail(std::current_exception());
    return true;  // a store that fails cannot agree on anything
  }
}

void RankExchange::forget(const std::string& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int r = 0; r < world_size_ && !failed_before(nullptr); ++r) {
    try {
      store_->remove(key(tag, r));
    } catch (...) {  // a key left behind costs memory; the store's failure stops the rest
      fail(std::current_exception());
    }
  }
}

std::optional<std::string> RankExchange::peek(const std::string& tag, int rank,
                                              std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_before(error)) return std::nullopt;
  try {
    const std::string k = key(tag, rank);
    if (!store_->check({k})) return std::nullopt;
    return store_->get(k);
  } catch (...) {
    const std::string what = fail(std::current_exception());
    if (error != nullptr) *error = what;
    return std::nullopt;
  }
}

std::vector<std::optional<std::string>> RankExchange::gather(const std::string& tag,
                                                             Nanos timeout_ns, std::string* error) {
  std::vector<std::optional<std::string>> out(world_size_);
  const Nanos deadline = steady_ns() + timeout_ns;
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    bool all = true;
    for (int r = 0; r < world_size_; ++r) {
      if (out[r]) continue;
      std::string e;
      out[r] = peek(tag, r, &e);
      if (!e.empty()) {
        if (error != nullptr) *error = e;
        return out;  // the store is gone: what was read so far
      }
      all = all && out[r].has_value();
    }
    if (all || steady_ns() >= deadline) return out;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
}

std::optional<std::vector<std::string>> RankExchange::all_gather(const std::string& family,
                                                                 const std::string& tag,
                                                                 const std::string& value,
                                                                 std::vector<int>* missing,
                                                                 std::string* error) {
  if (aborted(family)) {
    if (error != nullptr) *error = "another rank gave up on this exchange earlier";
    return std::nullopt;
  }
  if (!post(tag, value, error)) return std::nullopt;
  auto got = gather(tag, timeout_ns_, error);
  std::vector<std::string> values;
  std::vector<int> absent;
  for (int r = 0; r < world_size_; ++r) {
    if (got[r]) {
      values.push_back(*got[r]);
    } else {
      absent.push_back(r);
    }
  }
  if (!absent.empty()) {
    if (missing != nullptr) *missing = absent;
    // Tell the others (and a rank arriving late) that this exchange is over.
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_before(nullptr)) return std::nullopt;
    try {
      store_->set(prefix_ + "abort/" + family, std::to_string(rank_));
    } catch (...) {
      fail(std::current_exception());
    }
    return std::nullopt;
  }
  // A rank that timed out may have marked the family after this rank's values were all there.
  if (aborted(family)) {
    if (error != nullptr) *error = "another rank gave up on this exchange";
    return std::nullopt;
  }
  return values;
}

// --- rank summaries
// ----------------------------------------------------------------------------------

RankSummary summarize_rank(const EpochSummary& summary, int rank) {
  RankSummary r;
  r.rank = rank;
  r.steps = summary.steps;
  const double steps = std::max<int64_t>(1, summary.steps);
  r.step_ns = static_cast<double>(summary.wall_ns) / steps;
  r.data_wait_ns = static_cast<double>(summary.data_wait_ns) / steps;
  if (const auto* c = summary.sections.get<CommEpochStats>()) {
    r.comm_ns = static_cast<double>(c->stats.comm_ns) / steps;
    r.exposed_ns = static_cast<double>(c->stats.exposed_ns) / steps;
    r.durations = c->durations;
  }
  if (const auto* g = summary.sections.get<GpuEpochStats>()) {
    // A trainer that does not wait for the GPU each step: its host steps say how fast the host
    // queues work, not how long the rank's step takes (ranks run ahead by different amounts).
    // The steps' GPU spans do, when most steps have one.
    if (g->steps > 0 && 2 * g->gpu_timed_steps >= g->steps && g->stats.wall_ns > 0) {
      r.step_ns = static_cast<double>(g->stats.wall_ns) / static_cast<double>(g->steps);
    }
  }
  r.compute_ns = std::max(0.0, r.step_ns - r.data_wait_ns - r.exposed_ns);
  if (const auto* g = summary.sections.get<GpuEpochStats>()) {
    // PM's first: the SM efficiency beside it comes from the same samples (stragglers divide one
    // by the other), and it covers the epoch, not only its trace windows.
    r.gpu_utilization = measured(g->stats.counter_utilization) ? g->stats.counter_utilization
                                                               : g->stats.gpu_utilization;
    r.sm_efficiency = g->stats.sm_efficiency;
    r.sm_clock_mhz = g->stats.sm_clock_mhz;
    if (g->traced_steps > 0) {
      r.host_sync_ns = static_cast<double>(g->stats.idle_host_sync_ns) / g->traced_steps;
    }
  }
  return r;
}

namespace {

// The table's rows bounded (RankEpochStats::kMaxRankRows): the distribution of every rank's step
// time, then the slowest rows (stragglers first), by rank.
void bound_rows(RankEpochStats& t) {
  t.ranks_reported = static_cast<int64_t>(t.ranks.size());
  if (t.ranks.empty()) return;
  std::vector<double> steps;
  for (const RankSummary& r : t.ranks) steps.push_back(r.step_ns);
  std::sort(steps.begin(), steps.end());
  auto at = [&](double q) { return steps[static_cast<size_t>(q * (steps.size() - 1) + 0.5)]; };
  t.step_ns_p50 = at(0.5);
  t.step_ns_p90 = at(0.9);
  t.step_ns_max = steps.back();
  if (t.ranks.size() <= RankEpochStats::kMaxRankRows) return;
  std::set<int> straggling;
  for (const Straggler& s : t.stragglers) straggling.insert(s.rank);
  std::stable_sort(t.ranks.begin(), t.ranks.end(), [&](const RankSummary& a, const RankSummary& b) {
    const bool sa = straggling.count(a.rank) > 0, sb = straggling.count(b.rank) > 0;
    return sa != sb ? sa : a.step_ns > b.step_ns;
  });
  t.ranks_omitted = static_cast<int64_t>(t.ranks.size() - RankEpochStats::kMaxRankRows);
  t.ranks.resize(RankEpochStats::kMaxRankRows);
  std::sort(t.ranks.begin(), t.ranks.end(),
            [](const RankSummary& a, const RankSummary& b) { return a.rank < b.rank; });
}

}  // namespace

RankCollector::RankCollector(std::shared_ptr<RankExchange> exchange, double straggler_threshold,
                             Nanos wait_ns)
    : exchange_(std::move(exchange)), threshold_(straggler_threshold), wait_ns_(wait_ns) {
  if (exchange_ && exchange_->rank() == 0 && exchange_->world_size() > 1) {
    gatherer_ = std::thread([this] { gather_loop(); });
  }
}

RankCollector::~RankCollector() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (gatherer_.joinable()) gatherer_.join();
}

void RankCollector::on_epoch_end(EpochSummary& summary) {
  if (!exchange_ || store_failed_) return;
  const int rank = exchange_->rank();
  const std::string tag = "epoch/" + std::to_string(summary.epoch);
  std::string mine = to_json(summarize_rank(summary, rank), /*with_durations=*/true);
  // Sent (or handed to the gatherer): the epoch's summary, kept by the Pilot, need not carry them.
  if (auto* c = summary.sections.get<CommEpochStats>()) {
    std::vector<CollectiveDuration>().swap(c->durations);
  }
  if (gatherer_.joinable()) {
    // Rank 0: its own summary is posted by the gatherer too, so that its training thread makes no
    // store call and never waits for the store's lock while the gatherer reads.
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back({summary.epoch, tag, steady_ns(), std::move(mine)});
    }
    cv_.notify_all();
    // A short grace for this epoch's table (ranks end an epoch together, held by the all-reduce);
    // past it the table comes with a later epoch.
    if (wait_ns_ > 0) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::nanoseconds(wait_ns_), [&] {
        for (const auto& r : ready_) {
          if (r.first.epoch == summary.epoch) return true;
        }
        return stop_;
      });
    }
    attach_ready(summary);
    return;
  }
  if (!exchange_->post(tag, mine)) {
    store_failed_ = true;
    tell_failure();
    return;
  }
  if (rank != 0) return;
  // One rank: its own table, at once.
  std::string gather_error;
  RankEpochStats stats = gather_table({summary.epoch, tag, steady_ns(), {}}, &gather_error);
  report_missing(stats, gather_error);
  summary.sections.set(std::move(stats));
}

void RankCollector::attach_ready(EpochSummary& summary) {
  std::vector<std::pair<RankEpochStats, std::string>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready.swap(ready_);
  }
  if (ready.empty()) return;
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = failed_;
  }
  if (failed) {
    store_failed_ = true;
    tell_failure();
    return;
  }
  for (const auto& r : ready) report_missing(r.first, r.second);
  // One section a summary: the latest table (an earlier one, rarely still pending after a later
  // epoch's, was logged above only by its missing ranks).
  summary.sections.set(std::move(ready.back().first));
}

void RankCollector::tell_failure() {
  const auto line = exchange_->take_failure_line();
  if (line && host_ != nullptr) host_->log(LogLevel::kWarn, *line);
}

void RankCollector::report_missing(const RankEpochStats& table, const std::string& error) {
  std::vector<int> newly_missing;
  for (int r : table.missing) {
    if (reported_missing_.insert(r).second) newly_missing.push_back(r);
  }
  if (newly_missing.empty() || host_ == nullptr) return;
  host_->log(LogLevel::kWarn, "ranks: rank(s) " + ranks_text(newly_missing) +
                                  " did not report epoch " + std::to_string(table.epoch) +
                                  " within " + detail::fmt_num(exchange_->timeout_ns() / 1e6) +
                                  " ms (stopped or stalled?); the table shows the others" +
                                  (error.empty() ? "" : "; store: " + error));
}

RankEpochStats RankCollector::gather_table(const Job& job, std::string* error) {
  // RankExchange::gather's loop, but one the destructor can stop: a rank that never reports
  // would otherwise hold the program's exit for the whole exchange timeout.
  const int world = exchange_->world_size();
  std::vector<std::optional<std::string>> got(world);
  const Nanos deadline = job.ended_ns + exchange_->timeout_ns();
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    bool all = true;
    for (int r = 0; r < world; ++r) {
      if (got[r]) continue;
      std::string e;
      got[r] = exchange_->peek(job.tag, r, &e);
      if (!e.empty()) {
        *error = e;  // the store is gone: what was read so far
        break;
      }
      all = all && got[r].has_value();
    }
    if (all || !error->empty() || steady_ns() >= deadline) break;
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, pause, [&] { return stop_; })) break;
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
  exchange_->forget(job.tag);  // read once, here
  RankEpochStats stats;
  stats.epoch = job.epoch;
  stats.ready_ms = static_cast<double>(steady_ns() - job.ended_ns) / 1e6;
  stats.world_size = exchange_->world_size();
  stats.threshold = threshold_;
  for (int r = 0; r < world; ++r) {
    RankSummary s;
    if (got[r] && from_json(*got[r], s)) {
      stats.ranks.push_back(std::move(s));
    } else {
      stats.missing.push_back(r);
    }
  }
  set_collective_waits(stats.ranks);  // among the ranks that reported
  stats.stragglers = find_stragglers(stats.ranks, threshold_);
  bound_rows(stats);
  return stats;
}

void RankCollector::gather_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = jobs_.front();
      jobs_.erase(jobs_.begin());
      busy_ = true;
    }
    std::string error;
    RankEpochStats table;
    try {
      if (!exchange_->post(job.tag, job.summary, &error)) {
        // The store is gone: said once, no tables from now on.
        std::lock_guard<std::mutex> lock(mu_);
        ready_.emplace_back(RankEpochStats{}, error);
        ready_.back().first.epoch = job.epoch;
        failed_ = true;
        busy_ = false;
        cv_.notify_all();
        return;
      }
      table = gather_table(job, &error);
    } catch (const std::exception& e) {  // nothing escapes a thread
      table.epoch = job.epoch;
      error = e.what();
    }
    // The store went away while reading: the ranks it did not read are not the ranks' fault.
    const bool store_gone = exchange_->failed();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace_back(std::move(table), error);
      failed_ = failed_ || store_gone;
      busy_ = false;
    }
    cv_.notify_all();
    if (store_gone) return;
  }
}

void RankCollector::on_close() {
  if (!gatherer_.joinable()) return;
  // The last epoch's table: waited for (each job is bounded by the exchange timeout), then logged,
  // there being no summary left to carry it.
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::nanoseconds(exchange_->timeout_ns() + 1000000000LL),
                 [&] { return stop_ || failed_ || (jobs_.empty() && !busy_); });
  }
  EpochSummary last;
  attach_ready(last);
  const RankEpochStats* table = last.sections.get<RankEpochStats>();
  if (table == nullptr || host_ == nullptr) return;
  last.epoch = -1;  // the text then names the table's epoch
  std::vector<std::string> lines;
  section_text(*table, last, lines);
  for (const std::string& line : lines) host_->log(LogLevel::kInfo, line);
}

// --- tuning across ranks
// -----------------------------------------------------------------------------

namespace {

// TrialWindow's fields under their JSON keys: what to_json writes and from_json reads. A field
// marked optional may be absent (a window from an older build): it keeps its default (unknown).
constexpr bool kRequired = true, kOptional = false;
template <typename Window, typename Field>
void window_fields(Window& w, Field&& field) {
  field("trial", w.trial, kRequired);
  field("round", w.round, kRequired);
  field("first_step", w.first_step, kRequired);
  field("last_step", w.last_step, kRequired);
  field("throughput", w.throughput, kRequired);
  field("demand", w.demand, kRequired);
  field("supply_capacity", w.supply_capacity, kRequired);
  field("supply_limited", w.supply_limited, kRequired);
  field("mean_step_ns", w.mean_step_ns, kRequired);
  field("relative_error", w.relative_error, kRequired);
  field("data_wait_fraction", w.data_wait_fraction, kRequired);
  field("window_ns", w.window_ns, kRequired);
  field("elapsed_ns", w.elapsed_ns, kRequired);
  field("peak_memory_fraction", w.peak_memory_fraction, kOptional);
  field("peak_memory_bytes", w.peak_memory_bytes, kOptional);
  field("failed", w.failed, kRequired);
  field("note", w.note, kRequired);
}

}  // namespace

std::string to_json(const TrialWindow& w) {
  json j = json::object();
  window_fields(w, [&](const char* key, const auto& value, bool) { j[key] = value; });
  return dump(j);
}

bool from_json(const std::string& text, TrialWindow& out) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  try {
    TrialWindow w;
    window_fields(w, [&](const char* key, auto& value, bool required) {
      if (required || j.contains(key)) value = j.at(key).get<std::decay_t<decltype(value)>>();
    });
    out = std::move(w);
    return true;
  } catch (...) {
    return false;
  }
}

std::optional<TrialWindow> combine_trial_windows(const std::vector<TrialWindow>& windows) {
  if (windows.empty()) return std::nullopt;
  TrialWindow c = windows.front();
  size_t slowest = 0;
  for (size_t i = 0; i < windows.size(); ++i) {
    const TrialWindow& w = windows[i];
    if (w.trial != c.trial || w.round != c.round || w.first_step != c.first_step ||
        w.last_step != c.last_step) {
      return std::nullopt;  // the ranks are not measuring the same steps
    }
    if (w.throughput < windows[slowest].throughput) slowest = i;
  }
  const TrialWindow& s = windows[slowest];
  c.throughput = s.throughput;
  c.demand = s.demand;
  c.supply_capacity = s.supply_capacity;
  c.supply_limited = s.supply_limited;
  c.data_wait_fraction = s.data_wait_fraction;
  c.failed = false;
  c.note.clear();
  for (const TrialWindow& w : windows) {
    c.mean_step_ns = std::max(c.mean_step_ns, w.mean_step_ns);
    c.relative_error = std::max(c.relative_error, w.relative_error);
    c.window_ns = std::max(c.window_ns, w.window_ns);
    c.elapsed_ns = std::max(c.elapsed_ns, w.elapsed_ns);
    // The rank nearest to running out governs (the fraction; its bytes go with it).
    if (w.peak_memory_fraction > c.peak_memory_fraction) {
      c.peak_memory_fraction = w.peak_memory_fraction;
      c.peak_memory_bytes = w.peak_memory_bytes;
    }
    if (w.failed) {
      c.failed = true;
      if (c.note.empty()) c.note = w.note;
    }
  }
  return c;
}

TrialAgreement make_trial_agreement(std::shared_ptr<RankExchange> exchange,
                                    std::function<void(const std::string&)> log) {
  auto logged = std::make_shared<bool>(false);
  return [exchange, log, logged](const TrialWindow& mine) -> std::optional<TrialWindow> {
    const std::string tag = "tune/" + std::to_string(mine.trial) + "/" + std::to_string(mine.round);
    std::vector<int> missing;
    std::string error;
    auto values = exchange->all_gather("tune", tag, to_json(mine), &missing, &error);
    std::optional<TrialWindow> agreed;
    std::string why;
    if (values) {
      std::vector<TrialWindow> windows(values->size());
      bool ok = true;
      for (size_t i = 0; i < values->size() && ok; ++i) ok = from_json((*values)[i], windows[i]);
      agreed = ok ? combine_trial_windows(windows) : std::nullopt;
      if (!agreed) why = "the ranks measured different steps";
    } else if (!missing.empty()) {
      why = "rank(s) " + ranks_text(missing) + " missed it within " +
            detail::fmt_num(exchange->timeout_ns() / 1e6) + " ms";
    } else {
      why = error;
    }
    if (!agreed && !*logged && log) {
      *logged = true;
      log("autotune: the tuning exchange after trial " + std::to_string(mine.trial) + " (steps " +
          std::to_string(mine.first_step) + "-" + std::to_string(mine.last_step) +
          ") failed: " + why + "; every rank keeps its starting settings");
    }
    return agreed;
  };
}

IntervalAgreement make_interval_agreement(std::shared_ptr<RankExchange> exchange) {
  auto round = std::make_shared<int64_t>(0);
  return [exchange, round](int64_t proposed) -> std::optional<int64_t> {
    const std::string tag = "interval/" + std::to_string((*round)++);
    std::vector<int> missing;
    auto values = exchange->all_gather("interval", tag, std::to_string(proposed), &missing);
    if (!values) return std::nullopt;
    int64_t longest = 0;
    for (const std::string& v : *values) {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n <= 0) return std::nullopt;
      longest = std::max<int64_t>(longest, n);
    }
    return longest;
  };
}

// --- watchdog
// ----------------------------------------------------------------------------------------

CommWatchdog::CommWatchdog(std::shared_ptr<RankExchange> exchange, CommMonitor* monitor,
                           Nanos threshold_ns, std::function<void(const std::string&)> log)
    : exchange_(std::move(exchange)),
      monitor_(monitor),
      threshold_ns_(threshold_ns),
      log_(std::move(log)) {
  const auto period =
      std::chrono::nanoseconds(std::clamp<Nanos>(threshold_ns_ / 4, 10'000'000, 1'000'000'000));
  thread_ = std::thread([this, period] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, period, [this] { return stop_; });
      if (stop_) break;
      lock.unlock();
      poll();
      lock.lock();
    }
  });
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

namespace {

// What a rank's watchdog publishes of the last collective it entered, and reads of the others'.
struct LastCollective {
  int64_t seq = 0;  // 0: none entered yet
  std::string op;
  int64_t bytes = 0;
  std::string dtype;
  bool done = false;
};

std::string encode(const CollectiveRecord& r) {
  json j = {{"seq", r.seq}};
  if (r.seq > 0) {
    j["op"] = to_string(r.op);
    j["bytes"] = r.bytes;
    j["dtype"] = r.dtype;
    j["done"] = r.end_ns > 0;
  }
  return dump(j);
}

std::optional<LastCollective> decode(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("seq")) return std::nullopt;
  try {
    LastCollective c;
    c.seq = j.at("seq").get<int64_t>();
    c.op = j.value("op", std::string());
    c.bytes = j.value("bytes", int64_t{0});
    c.dtype = j.value("dtype", std::string());
    c.done = j.value("done", false);
    return c;
  } catch (...) {
    return std::nullopt;
  }
}

std::string describe(const LastCollective& c) {
  if (c.seq <= 0) return "none entered yet";
  return c.op + " seq " + std::to_string(c.seq) + " (" + std::to_string(c.bytes) + " bytes, " +
         c.dtype + ", " + (c.done ? "completed" : "running") + ")";
}

std::string ranks_word(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_ranges(ranks);
}

}  // namespace

std::string rank_ranges(std::vector<int> ranks, size_t max_runs) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.empty()) return "none";
  std::string s;
  size_t runs = 0, i = 0;
  for (; i < ranks.size() && runs < max_runs; ++runs) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (runs == 0 ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  if (i < ranks.size()) s += " and " + std::to_string(ranks.size() - i) + " more";
  return s;
}

void CommWatchdog::poll() {
  if (monitor_ == nullptr || !exchange_) return;
  std::lock_guard<std::mutex> polling(poll_mu_);  // the thread's poll and a caller's
  try {
    // This rank's last collective, when it changed (one store call; none once the store failed).
    const CollectiveRecord mine = monitor_->last_entered();
    const std::string value = encode(mine);
    if (value != published_ && !exchange_->failed()) {
      if (exchange_->post("coll/last", value)) {
        published_ = value;
      } else if (const auto line = exchange_->take_failure_line(); line && log_) {
        log_(*line);
      }
    }
    const Nanos now = monitor_->now();
    // In a hang every rank waiting reports: only every stride-th rank (at most kReaders of them)
    // reads every rank's entry, so that a hang at a thousand ranks costs the store thousands of
    // reads, not a million.
    constexpr int kReaders = 8;
    const int world = exchange_->world_size();
    const int stride = (world + kReaders - 1) / kReaders;
    const bool reads_all = exchange_->rank() % stride == 0;
    for (const CollectiveRecord& r : monitor_->outstanding()) {
      if (now - r.begin_ns < threshold_ns_ || logged_.count(r.seq) != 0) continue;
      logged_.insert(r.seq);
      std::string line = "collective " + std::string(to_string(r.op)) + " seq " +
                         std::to_string(r.seq) + " (" + std::to_string(r.bytes) + " bytes, " +
                         r.dtype + ") outstanding for " +
                         detail::fmt_num((now - r.begin_ns) / 1e9) + " s on rank " +
                         std::to_string(exchange_->rank());
      if (!reads_all) {
        std::vector<int> readers;
        for (int k = 0; k < world; k += stride) readers.push_back(k);
        if (log_) {
          log_(line + "; every rank's last collective: in the reports of " + ranks_word(readers));
        }
        continue;
      }
      // Every rank's last collective, grouped by what it was (ranks of a data-parallel job are
      // mostly at the same one: a few groups, however many ranks), the furthest behind first.
      std::map<std::pair<int64_t, std::string>, std::vector<int>> groups;
      std::vector<int> reached, behind, silent;
      for (int k = 0; k < world; ++k) {
        std::optional<LastCollective> c;
        if (k == exchange_->rank()) {
          c = decode(encode(monitor_->last_entered()));
        } else if (const auto v = exchange_->peek("coll/last", k)) {
          c = decode(*v);
        }
        if (!c) {
          silent.push_back(k);
          continue;
        }
        (c->seq >= r.seq ? reached : behind).push_back(k);
        groups[{c->seq, describe(*c)}].push_back(k);
      }
      if (!log_) continue;
      line += ": reached by " + ranks_word(reached) +
              (behind.empty() ? "" : "; not reached by " + ranks_word(behind)) +
              (silent.empty() ? ""
                              : "; no report from " + ranks_word(silent) +
                                    (exchange_->failed() ? " (the store failed)"
                                                         : " (not started, or stopped)")) +
              "; last collective entered:";
      constexpr size_t kMaxGroups = 8;
      size_t shown = 0;
      int not_shown = 0;
      for (const auto& [key, ranks] : groups) {
        if (shown++ < kMaxGroups) {
          line += (shown == 1 ? " " : "; ") + ranks_word(ranks) + " " + key.second;
        } else {
          not_shown += static_cast<int>(ranks.size());
        }
      }
      if (not_shown > 0) line += "; " + std::to_string(not_shown) + " more ranks elsewhere";
      if (groups.empty()) line += " none known";
      log_(line);
    }
  } catch (...) {  // allocation in a log line: skip this poll
  }
}

}  // namespace torchpilot
