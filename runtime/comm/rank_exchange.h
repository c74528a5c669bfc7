// Across ranks: everything torchpilot exchanges between the ranks of a data-parallel run goes
// through a key-value store (hooks/ adapts c10d's TCPStore or FileStore), never through a
// collective on the trainer's process group, and every wait is bounded: a rank that does not
// answer within the timeout is reported, never waited for forever.
//
//  - RankExchange: post a value under a tag, gather every rank's (all ranks) or rank 0's view,
//    with a timeout; a rank that times out in an all-gather marks the tag's family aborted so the
//    others stop too (see all_gather).
//  - RankCollector: at each epoch's end every rank posts its summary (RankSummary); rank 0 gathers
//    them (bounded wait) and adds the section "ranks" (per-rank table, stragglers).
//  - make_trial_agreement: the trial engine's cross-rank agreement (TrialAgreement, tuning.h);
//    make_interval_agreement: the length of the Pilot's intervals (interval.h).
//  - CommWatchdog: a thread that publishes the last collective this rank entered (op, sequence
//    number, bytes, dtype, running or completed) and logs, once, a collective outstanding longer
//    than a threshold with the last collective every rank entered (as NCCL's flight recorder
//    does), grouped so that the line stays short at a thousand ranks.
//
// Thread-safety: RankExchange serializes its store calls (one mutex); RankCollector is called on
// the training thread and, on rank 0, gathers on a thread of its own; CommWatchdog runs its own
// thread. Failure behaviour: the first store call that throws (the store's server died) fails the
// exchange for good: later calls fail at once without touching the store (a dead or stalled store
// costs one timeout, not one per call), and whichever part notices first logs the one line
// (take_failure_line); nothing here throws into the loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "torchpilot/runtime/comm/comm_monitor.h"
#include "torchpilot/runtime/comm/comm_records.h"
#include "torchpilot/runtime/core/collector.h"
#include "torchpilot/runtime/core/interval.h"
#include "torchpilot/runtime/core/tuning.h"

namespace torchpilot {

// What torchpilot needs of a store. Implementations may throw (a dead server); callers catch.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Whether every key is present, without blocking.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // A present key's value.
  virtual std::string get(const std::string& key) = 0;
  // Deletes a key once nobody will read it (keeps the store from growing with the epochs); false
  // when the store cannot.
  virtual bool remove(const std::string& key) {
    (void)key;
    return false;
  }
};

// A store in this process's memory (tests; thread-safe).
class InMemoryStore : public KeyValueStore {
 public:
  void set(const std::string& key, const std::string& value) override;
  bool check(const std::vector<std::string>& keys) override;
  std::string get(const std::string& key) override;
  bool remove(const std::string& key) override;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> map_;
};

class RankExchange {
 public:
  RankExchange(std::shared_ptr<KeyValueStore> store, int rank, int world_size, Nanos timeout_ns,
               std::string prefix = "torchpilot/");
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Nanos timeout_ns() const { return timeout_ns_; }

  // Posts this rank's value under `tag`. False if the store failed (`error` says why).
  bool post(const std::string& tag, const std::string& value, std::string* error = nullptr);
  // Every rank's value under `tag`, by rank, waiting up to the timeout. On a timeout: nullopt,
  // the ranks missing in *missing, and `family` marked aborted, so that a rank arriving late
  // (which would find everyone's values) stops too; a call finding its family aborted returns
  // nullopt at once. A store failure counts as a timeout.
  std::optional<std::vector<std::string>> all_gather(const std::string& family,
                                                     const std::string& tag,
                                                     const std::string& value,
                                                     std::vector<int>* missing,
                                                     std::string* error = nullptr);
  // The values the ranks posted under `tag`, waiting up to `timeout_ns` for all (nullopt entries
  // for the ranks that did not post).
  std::vector<std::optional<std::string>> gather(const std::string& tag, Nanos timeout_ns,
                                                 std::string* error = nullptr);
  // Deletes every rank's value under `tag` (after a gather, by the only rank that reads them);
  // store failures are ignored.
  void forget(const std::string& tag);
  // What a rank posted under `tag` now, without waiting.
  std::optional<std::string> peek(const std::string& tag, int rank, std::string* error = nullptr);
  bool aborted(const std::string& family);
  // Whether a store call has failed (every call since has failed at once).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The one line that says the store failed, for the first caller after the failure (empty
  // before it and for every later caller): the parts using the exchange each stop, one says so.
  std::optional<std::string> take_failure_line();

 private:
  std::string key(const std::string& tag, int rank) const;
  // The exchange's state after a store call threw; mu_ held. Returns the error text.
  std::string fail(const std::exception_ptr& e);
  // True (with *error set) when the store failed earlier; mu_ held.
  bool failed_before(std::string* error) const;
  std::shared_ptr<KeyValueStore> store_;
  int rank_;
  int world_size_;
  Nanos timeout_ns_;
  std::string prefix_;
  std::mutex mu_;  // one store call at a time (c10d clients are not all thread-safe)
  std::atomic<bool> failed_{false};
  std::string failure_;  // mu_
  std::atomic<bool> failure_told_{false};
};

// The per-epoch exchange of rank summaries (section "ranks" on rank 0). Add it after the
// collectors whose sections it reads (comm, gpu). Every rank posts its summary at its epoch's end
// (one store call). Rank 0 reads the others' on a thread of its own, so that its training thread
// never waits for the slowest rank's epoch end nor pays a store call per rank: the table of
// epoch N goes into the first summary after it is complete: epoch N's own when it is complete
// within `wait_ns` of rank 0's epoch end, else a later epoch's (section field `epoch`). At the
// run's end (on_close) a table still being gathered is waited for (bounded by the exchange
// timeout) and logged.
class RankCollector : public Collector {
 public:
  RankCollector(std::shared_ptr<RankExchange> exchange, double straggler_threshold,
                Nanos wait_ns = 0);
  ~RankCollector() override;  // stops and joins the gatherer
  RankCollector(const RankCollector&) = delete;
  RankCollector& operator=(const RankCollector&) = delete;
  std::string name() const override { return "ranks"; }
  unsigned step_hooks() const override { return 0; }
  void attach(CollectorHost* host) override { host_ = host; }
  void on_epoch_end(EpochSummary& summary) override;
  void on_close() override;

 private:
  struct Job {
    int64_t epoch = 0;
    std::string tag;
    Nanos ended_ns = 0;
    std::string summary;  // rank 0's own, which the gatherer posts first
  };
  void gather_loop();
  RankEpochStats gather_table(const Job& job, std::string* error);
  void attach_ready(EpochSummary& summary);
  void report_missing(const RankEpochStats& table, const std::string& error);
  void tell_failure();  // the exchange's one line, if this is the first part to notice

  std::shared_ptr<RankExchange> exchange_;
  double threshold_;
  Nanos wait_ns_;
  CollectorHost* host_ = nullptr;
  std::set<int> reported_missing_;  // training thread
  bool store_failed_ = false;       // training thread
  // Rank 0's gatherer: jobs in, complete tables out.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Job> jobs_;
  std::vector<std::pair<RankEpochStats, std::string>> ready_;  // with the store's error, if any
  bool busy_ = false;
  bool failed_ = false;  // the store failed: the gatherer stopped
  bool stop_ = false;
  std::thread gatherer_;
};

// This rank's summary of an epoch (reads the sections "comm" and "gpu" when present).
// The step time is the steps' GPU span when most steps have one (section "gpu"), else the host's.
RankSummary summarize_rank(const EpochSummary& summary, int rank);

// The trial engine's agreement over RankExchange: each trial's window is all-gathered under
// tag "tune/<trial>/<round>" (family "tune"), combined by combine_trial_windows.
TrialAgreement make_trial_agreement(std::shared_ptr<RankExchange> exchange,
                                    std::function<void(const std::string&)> log);
// The Pilot's interval agreement over RankExchange (interval.h): the ranks' proposed lengths are
// all-gathered under tag "interval/<n>" (family "interval"); the longest one is every rank's.
IntervalAgreement make_interval_agreement(std::shared_ptr<RankExchange> exchange);
// Deterministic combination of the ranks' windows (same inputs, same result on every rank): the
// slowest rank governs (lowest throughput, its data-wait share), the longest window and elapsed
// time, the largest error; failed if any failed; nullopt if they measured different steps.
std::optional<TrialWindow> combine_trial_windows(const std::vector<TrialWindow>& windows);
std::string to_json(const TrialWindow& w);
bool from_json(const std::string& text, TrialWindow& out);
// "0-3, 5, 7-9": ascending ranks as runs, at most `max_runs` of them, then "and N more".
std::string rank_ranges(std::vector<int> ranks, size_t max_runs = 16);

// Logs (once per collective) a collective outstanding longer than `threshold_ns`, with the ranks
// that have reached it, those that have not and those that never reported, and the last
// collective each rank entered (what each rank's watchdog publishes under "coll/last"). Only
// every (world / 8)-th rank reads every rank's entry; the others' line names those ranks.
class CommWatchdog {
 public:
  CommWatchdog(std::shared_ptr<RankExchange> exchange, CommMonitor* monitor, Nanos threshold_ns,
               std::function<void(const std::string&)> log);
  ~CommWatchdog();  // stops and joins the thread
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;
  // One poll (the thread calls it; tests may too).
  void poll();

 private:
  std::shared_ptr<RankExchange> exchange_;
  CommMonitor* monitor_;
  Nanos threshold_ns_;
  std::function<void(const std::string&)> log_;
  std::mutex poll_mu_;     // one poll at a time; guards the two below
  std::string published_;  // the last value posted under "coll/last"
  std::set<int64_t> logged_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace torchpilot
