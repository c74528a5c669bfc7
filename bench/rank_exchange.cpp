// rank_exchange: the per-epoch exchange of rank summaries at scale (docs/collectives.md, "At
// scale"), with many ranks simulated on one machine: one thread per rank, each with its own
// RankExchange and RankCollector over its own client of one real c10d TCPStore on loopback (the
// store torchrun gives a job), every rank ending each epoch at the same moment (a barrier).
// Measured per rank count: the training thread's time in on_epoch_end on rank 0 and on the
// others (median and max over epochs after the first), the time from rank 0's epoch end until
// its table of every rank is complete (the table's ready_ms), and the store's traffic per epoch
// (calls and bytes, counted by a wrapper around each client). Then a hang report at that scale:
// every rank publishes its last collective as its watchdog does (the last rank one collective
// behind) and rank 0's CommWatchdog reports a collective outstanding: its time on the watchdog's
// thread, its store calls and the line's length.
//   rank_exchange [--ranks 8 --ranks 64 ...] [--epochs 6] [--machine M --commit C --out FILE]
#if __has_include(<torch/csrc/distributed/c10d/TCPStore.hpp>)
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#define TORCHPILOT_BENCH_TCPSTORE 1
#else
#define TORCHPILOT_BENCH_TCPSTORE 0
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "torchpilot/hooks/comm/collectives.h"
#include "torchpilot/runtime/comm/comm_monitor.h"
#include "torchpilot/runtime/comm/rank_exchange.h"
#include "torchpilot/runtime/core/clock.h"

#if TORCHPILOT_BENCH_TCPSTORE
namespace {

using namespace torchpilot;
using nlohmann::json;

// Counts a client's calls and bytes (every rank's wrapper adds to the same totals).
struct Traffic {
  std::atomic<int64_t> calls{0}, bytes{0};
};
class CountingStore final : public KeyValueStore {
 public:
  CountingStore(std::shared_ptr<KeyValueStore> inner, Traffic* t)
      : inner_(std::move(inner)), t_(t) {}
  void set(const std::string& key, const std::string& value) override {
    count(key.size() + value.size());
    inner_->set(key, value);
  }
  bool check(const std::vector<std::string>& keys) override {
    size_t n = 0;
    for (const auto& k : keys) n += k.size();
    count(n);
    return inner_->check(keys);
  }
  std::string get(const std::string& key) override {
    std::string v = inner_->get(key);
    count(key.size() + v.size());
    return v;
  }
  bool remove(const std::string& key) override {
    count(key.size());
    return inner_->remove(key);
  }

 private:
  void count(size_t bytes) {
    t_->calls += 1;
    t_->bytes += static_cast<int64_t>(bytes);
  }
  std::shared_ptr<KeyValueStore> inner_;
  Traffic* t_;
};

// Every rank's thread waits here until all have arrived (C++17 has no std::barrier).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  int64_t gen_ = 0;
};

// One rank's epoch: a summary as a data-parallel trainer's (comm section included).
EpochSummary epoch_of(int64_t epoch, int rank) {
  EpochSummary s;
  s.epoch = epoch;
  s.steps = 100;
  s.wall_ns = 100 * 30'000'000LL + rank * 1000;
  s.data_wait_ns = 100 * 1'000'000LL;
  CommEpochStats c;
  c.steps = 100;
  c.stats.comm_ns = 100 * 5'000'000LL;
  c.stats.exposed_ns = 100 * 500'000LL;
  s.sections.set(c);
  return s;
}

json run_ranks(int ranks, int epochs, double wait_ms) {
  c10d::TCPStoreOptions server_opts;
  server_opts.port = 0;
  server_opts.isServer = true;
  server_opts.waitWorkers = false;
  server_opts.timeout = std::chrono::seconds(60);
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_opts);
  const auto port = server->getPort();
  Traffic traffic;
  Barrier barrier(ranks);
  std::vector<std::vector<double>> cost_ms(ranks);  // per rank, per epoch
  std::vector<double> ready_ms;                     // rank 0's tables
  std::mutex ready_mu;
  int64_t epoch_calls = 0, epoch_bytes = 0;  // the epochs' traffic, before the hang report
  double hang_ms = 0;
  int64_t hang_calls = 0;
  std::string hang_line;
  const auto t0 = bench::Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      c10d::TCPStoreOptions o;
      o.port = port;
      o.isServer = false;
      o.waitWorkers = false;
      o.timeout = std::chrono::seconds(60);
      auto client = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
      auto store = std::make_shared<CountingStore>(adapt_store(client), &traffic);
      auto exchange = std::make_shared<RankExchange>(store, r, ranks, 30'000'000'000LL);
      // wait_ms 0 (comm.ranks_wait_ms's default): rank 0 never waits for the table at an epoch
      // end; a wait past the gather (the design before) holds it until the table is complete.
      RankCollector collector(exchange, 0.1, static_cast<Nanos>(wait_ms * 1e6));
      for (int e = 0; e < epochs; ++e) {
        barrier.arrive_and_wait();  // every rank ends epoch e now
        EpochSummary s = epoch_of(e, r);
        const auto b = bench::Clock::now();
        collector.on_epoch_end(s);
        cost_ms[r].push_back(bench::ms_since(b));
        if (const auto* t = s.sections.get<RankEpochStats>()) {
          std::lock_guard<std::mutex> lock(ready_mu);
          ready_ms.push_back(t->ready_ms);
        }
        // The next epoch's steps: the gatherer works meanwhile.
        std::this_thread::sleep_for(std::chrono::milliseconds(200 + ranks));
      }
      barrier.arrive_and_wait();
      collector.on_close();
      barrier.arrive_and_wait();
      if (r == 0) {
        epoch_calls = traffic.calls;
        epoch_bytes = traffic.bytes;
      }
      exchange->post("coll/last", r == ranks - 1 ? R"({"seq":4,"op":"all_reduce","bytes":33280,)"
                                                   R"("dtype":"Float","done":true})"
                                                 : R"({"seq":5,"op":"all_reduce","bytes":33280,)"
                                                   R"("dtype":"Float","done":false})");
      barrier.arrive_and_wait();
      if (r != 0) return;
      auto clock = std::make_shared<ManualClock>(0);
      CommMonitor monitor({nullptr, clock});
      for (int i = 0; i < 4; ++i) {
        monitor.collective_end(
            monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 33280, "Float"));
      }
      monitor.collective_begin(CommOp::kAllReduce, "gloo:all_reduce", 33280, "Float");
      // A threshold of an hour: the watchdog's own thread (a poll a second) reports nothing
      // before the clock is moved past it; the poll below is the one that reports.
      CommWatchdog dog(exchange, &monitor, 3'600'000'000'000LL,
                       [&](const std::string& m) { hang_line = m; });
      clock->set(7'200'000'000'000LL);
      const int64_t calls = traffic.calls;
      const auto b = bench::Clock::now();
      dog.poll();
      hang_ms = bench::ms_since(b);
      hang_calls = traffic.calls - calls;
    });
  }
  for (auto& t : threads) t.join();
  auto after_first = [](const std::vector<double>& v) {
    return std::vector<double>(v.begin() + (v.size() > 1 ? 1 : 0), v.end());
  };
  std::vector<double> others;
  double others_max = 0;
  for (int r = 1; r < ranks; ++r) {
    for (double x : after_first(cost_ms[r])) {
      others.push_back(x);
      others_max = std::max(others_max, x);
    }
  }
  const std::vector<double> zero = after_first(cost_ms[0]);
  json j = {{"ranks", ranks},
            {"ranks_wait_ms", wait_ms},
            {"epochs", epochs},
            {"rank0_epoch_end_ms_median", bench::median(zero)},
            {"rank0_epoch_end_ms_max", *std::max_element(zero.begin(), zero.end())},
            {"others_epoch_end_ms_median", bench::median(others)},
            {"others_epoch_end_ms_max", others_max},
            {"table_ready_ms_median", bench::median(ready_ms)},
            {"tables", ready_ms.size()},
            {"store_calls_per_epoch", static_cast<double>(epoch_calls) / epochs},
            {"store_bytes_per_epoch", static_cast<double>(epoch_bytes) / epochs},
            {"hang_report_ms", hang_ms},
            {"hang_report_store_calls", hang_calls},
            {"hang_report_chars", hang_line.size()},
            {"hang_report", hang_line},
            {"seconds", bench::seconds_since(t0)}};
  std::printf(
      "%5d ranks, wait %g ms: rank 0 %.3f ms (max %.3f), others %.3f ms (max %.3f) at an epoch "
      "end; "
      "table complete %.1f ms after rank 0's epoch end; %.0f store calls, %.0f kB an "
      "epoch; a hang report %.1f ms, %lld store calls, %zu characters\n",
      ranks, wait_ms, j["rank0_epoch_end_ms_median"].get<double>(),
      j["rank0_epoch_end_ms_max"].get<double>(), j["others_epoch_end_ms_median"].get<double>(),
      others_max, j["table_ready_ms_median"].get<double>(),
      j["store_calls_per_epoch"].get<double>(), j["store_bytes_per_epoch"].get<double>() / 1e3,
      hang_ms, static_cast<long long>(hang_calls), hang_line.size());
  std::fflush(stdout);
  return j;
}

int run(int argc, char** argv) {
  CLI::App app{
      "rank_exchange: the per-epoch rank exchange at scale, ranks simulated by threads "
      "over a c10d TCPStore on loopback"};
  std::vector<int> counts;
  int epochs = 6;
  std::vector<double> waits;
  bench::RunFlags flags;
  app.add_option("--ranks", counts, "rank counts to run (default 8 64 256 1024)")
      ->check(CLI::Range(2, 4096));
  bench::int_flag(app, "--epochs", epochs, 2, 1000, "epochs per rank count");
  app.add_option("--wait-ms", waits,
                 "rank 0's wait for its table at an epoch end, ms (comm.ranks_wait_ms; default "
                 "0 and 30000, the latter waiting for the whole gather as before)")
      ->check(CLI::Range(0.0, 86400000.0));
  bench::add_run_flags(app, flags, "results JSON");
  CLI11_PARSE(app, argc, argv);
  if (counts.empty()) counts = {8, 64, 256, 1024};
  if (waits.empty()) waits = {0, 30000};
  json out = bench::run_header("rank_exchange", flags);
  out["method"] =
      "one thread per rank, each with its own RankExchange and RankCollector (comm.ranks_wait_ms "
      "as ranks_wait_ms) over its own client of one c10d TCPStore on loopback; every rank ends "
      "each epoch at the "
      "same moment; per rank count, medians over the epochs after the first";
  out["runs"] = json::array();
  for (int n : counts) {
    for (double w : waits) out["runs"].push_back(run_ranks(n, epochs, w));
  }
  bench::write_results("rank_exchange", flags, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("rank_exchange", argc, argv, run); }
#else
int main() {
  std::fprintf(stderr, "rank_exchange: this LibTorch has no c10d TCPStore\n");
  return 2;
}
#endif
