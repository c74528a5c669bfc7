// LoaderCore: exactly-once in-order delivery under live retuning, errors, epochs and shutdown.
// Batches are the vectors of their sample indices; producers sleep a few random microseconds to
// shake the interleavings.
#include "torchpilot/runtime/loader/loader_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fakes/gate.h"

namespace torchpilot {
namespace {

using Indices = std::vector<size_t>;

void jitter(int max_us) {
  thread_local std::mt19937 rng(std::hash<std::thread::id>()(std::this_thread::get_id()));
  const int us = std::uniform_int_distribution<int>(0, max_us)(rng);
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

LoaderCore::Produce echo_produce(int max_jitter_us = 20) {
  return [max_jitter_us](const Indices& indices, int, const LoaderSettings&) {
    jitter(max_jitter_us);
    return std::make_shared<Indices>(indices);
  };
}

const Indices& as_indices(const LoaderCore::Batch& batch) {
  return *std::static_pointer_cast<Indices>(batch);
}

LoaderOptions options(size_t batch_size, int workers, uint64_t seed = 1) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.workers = workers;
  o.seed = seed;
  return o;
}

// One whole epoch as the list of batches, in delivery order.
std::vector<Indices> drain(LoaderCore& loader) {
  std::vector<Indices> batches;
  while (auto b = loader.next()) batches.push_back(as_indices(b));
  return batches;
}

// The epoch's batches, calling next() again after each call that threw (counted in `thrown`).
std::vector<Indices> drain_counting_throws(LoaderCore& loader, int& thrown) {
  std::vector<Indices> batches;
  while (true) {
    LoaderCore::Batch b;
    try {
      b = loader.next();
    } catch (...) {
      ++thrown;
      continue;
    }
    if (!b) break;
    batches.push_back(as_indices(b));
  }
  return batches;
}

Indices flatten(const std::vector<Indices>& batches) {
  Indices all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

void expect_exactly_once(Indices all, size_t n) {
  ASSERT_EQ(all.size(), n);
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(all[i], i) << "index " << i << " missing or repeated";
}

TEST(LoaderCoreTest, ExactlyOncePerEpochForEachWorkerCount) {
  const size_t n = 1000, bs = 7;
  for (int workers : {0, 1, 3, 6}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    LoaderCore loader(n, options(bs, workers), echo_produce(), false, false);
    EXPECT_EQ(loader.batches_per_epoch(), 143u);
    Indices previous;
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.start_epoch();
      EXPECT_EQ(loader.epoch(), epoch);
      const std::vector<Indices> batches = drain(loader);
      ASSERT_EQ(batches.size(), 143u);
      for (size_t b = 0; b + 1 < batches.size(); ++b) ASSERT_EQ(batches[b].size(), bs);
      EXPECT_EQ(batches.back().size(), n % bs);
      const Indices all = flatten(batches);
      expect_exactly_once(all, n);
      EXPECT_NE(all, previous) << "each epoch has its own order";
      previous = all;
      EXPECT_EQ(loader.next(), nullptr) << "stays at the end";
    }
  }
}

TEST(LoaderCoreTest, DropLast) {
  LoaderOptions o = options(8, 3);
  o.drop_last = true;
  LoaderCore loader(100, o, echo_produce(), false, false);
  EXPECT_EQ(loader.batches_per_epoch(), 12u);
  loader.start_epoch();
  const std::vector<Indices> batches = drain(loader);
  ASSERT_EQ(batches.size(), 12u);
  for (const auto& b : batches) EXPECT_EQ(b.size(), 8u);
  Indices all = flatten(batches);
  EXPECT_EQ(std::set<size_t>(all.begin(), all.end()).size(), 96u);
  for (size_t i : all) EXPECT_LT(i, 100u);
}

TEST(LoaderCoreTest, SameSeedSameOrder) {
  LoaderCore a(500, options(16, 0, 42), echo_produce(), false, false);
  LoaderCore b(500, options(16, 4, 42), echo_produce(), false, false);
  LoaderCore c(500, options(16, 4, 43), echo_produce(), false, false);
  for (int epoch = 0; epoch < 2; ++epoch) {
    a.start_epoch();
    b.start_epoch();
    c.start_epoch();
    const std::vector<Indices> from_a = drain(a);
    EXPECT_EQ(from_a, drain(b)) << "epoch " << epoch;
    EXPECT_NE(from_a, drain(c)) << "epoch " << epoch;
  }
  LoaderOptions o = options(10, 2);
  o.shuffle = false;
  LoaderCore ordered(95, o, echo_produce(), false, false);
  ordered.start_epoch();
  Indices expected(95);
  std::iota(expected.begin(), expected.end(), size_t{0});
  EXPECT_EQ(flatten(drain(ordered)), expected);
}

TEST(LoaderCoreTest, RandomLiveRetunesKeepExactlyOnceAndOrder) {
  const size_t n = 600, bs = 4;
  LoaderCore reference(n, options(bs, 0, 9), echo_produce(0), false, false);
  LoaderCore loader(n, options(bs, 2, 9), echo_produce(), false, false);
  std::mt19937 rng(2024);
  int retunes = 0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    reference.start_epoch();
    loader.start_epoch();
    const std::vector<Indices> expected = drain(reference);
    std::vector<Indices> got;
    while (true) {
      if (rng() % 2 == 0) {
        const int workers = static_cast<int>(rng() % 7);
        loader.set_workers(workers);
        EXPECT_EQ(loader.settings().workers, workers);
        ++retunes;
      }
      if (rng() % 3 == 0) {
        const int prefetch = 1 + static_cast<int>(rng() % 8);
        loader.set_prefetch(prefetch);
        EXPECT_EQ(loader.settings().prefetch, prefetch);
        ++retunes;
      }
      auto b = loader.next();
      if (!b) break;
      got.push_back(as_indices(b));
    }
    ASSERT_EQ(got.size(), expected.size()) << "epoch " << epoch;
    expect_exactly_once(flatten(got), n);
    EXPECT_EQ(got, expected) << "in order, epoch " << epoch;
  }
  EXPECT_GT(retunes, 300);
}

TEST(LoaderCoreTest, RetuneWithNoWorkersWhileBatchesAreInFlight) {
  // Slow batches with many workers in flight, then workers = 0: the claimed batches still arrive,
  // the rest are produced inline.
  std::atomic<int> inline_calls{0};
  LoaderCore::Produce produce = [&](const Indices& indices, int worker, const LoaderSettings&) {
    if (worker < 0) ++inline_calls;
    jitter(300);
    return std::make_shared<Indices>(indices);
  };
  LoaderCore loader(200, options(5, 6), produce, false, false);
  loader.set_prefetch(4);
  loader.start_epoch();
  std::vector<Indices> got;
  got.push_back(as_indices(loader.next()));
  loader.set_workers(0);
  while (auto b = loader.next()) got.push_back(as_indices(b));
  EXPECT_EQ(got.size(), 40u);
  expect_exactly_once(flatten(got), 200);
  EXPECT_GT(inline_calls.load(), 0);
}

TEST(LoaderCoreTest, ProduceErrorNamesSampleAndEpochGoesOn) {
  LoaderCore::Produce produce = [](const Indices& indices, int, const LoaderSettings&) {
    jitter(10);
    if (std::find(indices.begin(), indices.end(), size_t{37}) != indices.end()) {
      throw std::runtime_error("corrupt record");
    }
    return std::make_shared<Indices>(indices);
  };
  for (int workers : {0, 3}) {
    for (bool shuffle : {false, true}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + " shuffle " + std::to_string(shuffle));
      LoaderOptions o = options(10, workers, 5);
      o.shuffle = shuffle;
      LoaderCore loader(100, o, produce, false, false);
      for (int epoch = 0; epoch < 2; ++epoch) {
        loader.start_epoch();
        Indices delivered;
        int errors = 0;
        size_t position = 0;  // batches handed out or failed so far this epoch
        size_t failed_at = 0;
        bool after_error = false;
        while (true) {
          try {
            auto b = loader.next();
            if (!b) break;
            const Indices& idx = as_indices(b);
            if (after_error) EXPECT_EQ(idx.size(), 9u) << "the failed batch's other samples";
            after_error = false;
            delivered.insert(delivered.end(), idx.begin(), idx.end());
          } catch (const DataLoaderError& e) {
            after_error = true;
            ++errors;
            ASSERT_TRUE(e.sample_index().has_value());
            EXPECT_EQ(*e.sample_index(), 37u);
            EXPECT_EQ(e.batch_index(), position);
            EXPECT_EQ(e.epoch(), epoch);
            EXPECT_NE(std::string(e.what()).find("sample 37"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("corrupt record"), std::string::npos);
            failed_at = position;
          }
          ++position;
        }
        EXPECT_EQ(errors, 1);
        EXPECT_EQ(position, 11u);  // 10 batches, one of them as an error then its remainder
        if (!shuffle) {
          EXPECT_EQ(failed_at, 3u);  // samples 30..39
        }
        // Every sample but 37 came exactly once.
        std::set<size_t> seen(delivered.begin(), delivered.end());
        EXPECT_EQ(seen.size(), delivered.size());
        EXPECT_EQ(delivered.size(), 99u);
        EXPECT_EQ(seen.count(37), 0u);
      }
    }
  }
}

TEST(LoaderCoreTest, ProduceErrorWithNoSingleCulprit) {
  // The batch fails as a whole but every sample alone is fine.
  LoaderCore::Produce produce = [](const Indices& indices, int, const LoaderSettings&) {
    if (indices.size() > 1 && indices.front() == 20) throw std::runtime_error("batch too big");
    return std::make_shared<Indices>(indices);
  };
  LoaderOptions o = options(10, 2);
  o.shuffle = false;
  LoaderCore loader(50, o, produce, false, false);
  loader.start_epoch();
  int errors = 0;
  size_t delivered = 0;
  while (true) {
    try {
      auto b = loader.next();
      if (!b) break;
      delivered += as_indices(b).size();
    } catch (const DataLoaderError& e) {
      ++errors;
      EXPECT_FALSE(e.sample_index().has_value());
      EXPECT_EQ(e.batch_index(), 2u);
    }
  }
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(delivered, 40u);
}

TEST(LoaderCoreTest, DestructionMidEpochJoinsBusyWorkers) {
  struct Counters {
    std::atomic<int> active{0};
    std::atomic<int> started{0};
  };
  auto counters = std::make_shared<Counters>();
  LoaderCore::Produce slow = [counters](const Indices& indices, int, const LoaderSettings&) {
    ++counters->started;
    ++counters->active;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --counters->active;
    return std::make_shared<Indices>(indices);
  };
  {
    LoaderCore loader(10000, options(4, 4), slow, false, false);
    loader.set_prefetch(8);
    loader.start_epoch();
    ASSERT_NE(loader.next(), nullptr);
    // Workers are now busy producing further batches.
  }
  // Destruction waited for every batch in production and joined the threads.
  EXPECT_EQ(counters->active.load(), 0);
  const int started = counters->started.load();
  EXPECT_GE(started, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(counters->started.load(), started) << "no worker outlived the loader";
}

// A dataset call that never returns on its own: the loader's destruction waits for it only up to
// shutdown_timeout_ms, then abandons the thread (which keeps what it uses alive) and says so once.
TEST(LoaderCoreTest, DestructionAbandonsAProduceCallThatBlocks) {
  auto gate = std::make_shared<test::Gate>();
  LoaderCore::Produce blocking = [gate](const Indices& indices, int, const LoaderSettings&) {
    gate->enter();
    auto batch = std::make_shared<Indices>(indices);
    gate->leave();
    return batch;
  };
  using test::within_ten_seconds;

  LoaderOptions o = options(2, 2);
  o.shutdown_timeout_ms = 200;
  auto loader = std::make_unique<LoaderCore>(100, o, blocking, false, false);
  auto warnings = std::make_shared<std::vector<std::string>>();
  loader->set_warning_sink([warnings](const std::string& m) { warnings->push_back(m); });
  loader->start_epoch();
  ASSERT_TRUE(within_ten_seconds([&] { return gate->entered.load() == 2; }))
      << "both workers are blocked";

  std::chrono::steady_clock::duration elapsed{};
  ASSERT_TRUE(gate->destroyed_in_time([&] { loader.reset(); }, &elapsed))
      << "destruction hung on a blocked dataset call";
  EXPECT_GE(elapsed, std::chrono::milliseconds(200)) << "it waited for the configured bound";
  ASSERT_EQ(warnings->size(), 1u);
  EXPECT_NE(warnings->front().find("2 worker threads"), std::string::npos) << warnings->front();
  EXPECT_NE(warnings->front().find("abandoned"), std::string::npos) << warnings->front();
  EXPECT_EQ(gate->left.load(), 0);

  // The abandoned calls return later; their threads drop the results and end without touching
  // the destroyed loader (run under valgrind or a sanitizer to see it), and claim nothing more.
  gate->open();
  ASSERT_TRUE(within_ten_seconds([&] { return gate->left.load() == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(gate->entered.load(), 2) << "no batch was claimed after destruction";
  EXPECT_EQ(warnings->size(), 1u);
}

// Idle or quick workers do not make destruction wait for the bound, nor warn.
TEST(LoaderCoreTest, DestructionWithQuickWorkersDoesNotWarn) {
  auto warnings = std::make_shared<std::vector<std::string>>();
  const auto begin = std::chrono::steady_clock::now();
  {
    LoaderOptions o = options(2, 3);
    o.shutdown_timeout_ms = 60000;
    LoaderCore loader(1000, o, echo_produce(500), false, false);
    loader.set_warning_sink([warnings](const std::string& m) { warnings->push_back(m); });
    loader.start_epoch();
    ASSERT_NE(loader.next(), nullptr);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(30));
  EXPECT_TRUE(warnings->empty());
}

TEST(LoaderCoreTest, DestructionWithoutEpochOrWithIdleWorkers) {
  { LoaderCore loader(10, options(2, 3), echo_produce(), false, false); }
  {
    LoaderCore loader(10, options(2, 3), echo_produce(), false, false);
    loader.start_epoch();
    drain(loader);  // workers idle, waiting for work
  }
  {
    LoaderCore loader(10, options(2, 0), echo_produce(), false, false);
    loader.set_workers(5);  // threads started before any epoch
  }
  SUCCEED();
}

TEST(LoaderCoreTest, StartEpochMidEpochDropsTheRest) {
  const size_t n = 300, bs = 6;
  LoaderCore reference(n, options(bs, 0, 3), echo_produce(0), false, false);
  reference.start_epoch();
  drain(reference);
  reference.start_epoch();
  const std::vector<Indices> epoch1 = drain(reference);

  LoaderCore loader(n, options(bs, 3, 3), echo_produce(), false, false);
  loader.set_prefetch(4);
  loader.start_epoch();
  for (int i = 0; i < 5; ++i) ASSERT_NE(loader.next(), nullptr);
  loader.start_epoch();  // the rest of epoch 0 (and batches in flight) is dropped
  EXPECT_EQ(loader.epoch(), 1);
  const std::vector<Indices> got = drain(loader);
  EXPECT_EQ(got, epoch1);
  expect_exactly_once(flatten(got), n);
}

TEST(LoaderCoreTest, NextBeforeStartAndEmptyDataset) {
  LoaderCore loader(10, options(3, 2), echo_produce(), false, false);
  EXPECT_EQ(loader.epoch(), -1);
  EXPECT_EQ(loader.next(), nullptr);
  LoaderCore empty(0, options(3, 2), echo_produce(), false, false);
  EXPECT_EQ(empty.batches_per_epoch(), 0u);
  empty.start_epoch();
  EXPECT_EQ(empty.next(), nullptr);
  EXPECT_EQ(empty.stats().batches, 0);
}

TEST(LoaderCoreTest, StatsCountersInline) {
  // Inline loading: every batch is produced on the training thread, which waits for it.
  LoaderCore loader(50, options(5, 0), echo_produce(200), false, false);
  loader.start_epoch();
  drain(loader);
  const LoaderStats s = loader.stats();
  EXPECT_EQ(s.name, "tunable");
  EXPECT_TRUE(s.tunable);
  EXPECT_EQ(s.batches, 10);
  EXPECT_EQ(s.produce_count, 10);
  EXPECT_EQ(s.blocked_count, 10);
  EXPECT_GT(s.produce_ns, 0);
  EXPECT_GE(s.wait_ns, s.produce_ns) << "each inline wait encloses its production";
  EXPECT_EQ(s.settings.workers, 0);
  EXPECT_EQ(s.settings.prefetch, 2);
  EXPECT_EQ(s.max_workers, affinity_cpu_count());
  EXPECT_EQ(loader.max_workers(), affinity_cpu_count());
  EXPECT_GE(s.max_workers, 1);
  EXPECT_FALSE(s.pin_memory_available);
}

TEST(LoaderCoreTest, StatsCountersWithWorkers) {
  LoaderOptions o = options(5, 2);
  o.prefetch_across_epochs = false;
  LoaderCore loader(60, o, echo_produce(), false, false);
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch();
    drain(loader);
    const LoaderStats s = loader.stats();
    EXPECT_EQ(s.batches, 12 * (epoch + 1));
    // Every claimed batch was delivered: nothing produced twice or in vain.
    EXPECT_EQ(s.produce_count, 12 * (epoch + 1));
    EXPECT_LE(s.blocked_count, s.batches);
    EXPECT_EQ(s.settings.workers, 2);
  }
}

TEST(LoaderCoreTest, WorkersRunOnIntoTheNextEpoch) {
  LoaderOptions o = options(5, 2);  // window: 2 workers x prefetch 2 = 4 batches
  LoaderCore loader(60, o, echo_produce(), false, false);
  loader.start_epoch();
  std::vector<int> first(60, 0);
  for (const auto& b : drain(loader)) {
    for (size_t i : b) ++first[i];
  }
  // The workers fill the window with the next epoch's first batches (wait for them, bounded).
  for (int i = 0; i < 2000 && loader.stats().produce_count < 12 + 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const LoaderStats before = loader.stats();
  ASSERT_EQ(before.produce_count, 12 + 4) << "never more than the window ahead";
  loader.start_epoch();
  std::vector<int> second(60, 0);
  std::vector<Indices> batches;
  for (int k = 0; k < 4; ++k) batches.push_back(*std::static_pointer_cast<Indices>(loader.next()));
  EXPECT_EQ(loader.stats().blocked_count, before.blocked_count) << "made ahead: no wait";
  for (const auto& b : drain(loader)) batches.push_back(b);
  for (const auto& b : batches) {
    for (size_t i : b) ++second[i];
  }
  EXPECT_EQ(std::count(first.begin(), first.end(), 1), 60);
  EXPECT_EQ(std::count(second.begin(), second.end(), 1), 60);
  EXPECT_EQ(batches.size(), 12u);
  // The second epoch has its own order (seed + 1), not the first one's.
  LoaderCore fresh(60, o, echo_produce(), false, false);
  fresh.start_epoch();
  EXPECT_NE(drain(fresh).front(), batches.front());
}

TEST(LoaderCoreTest, WaitObserverSeesEveryBlockingWait) {
  LoaderCore loader(40, options(4, 0), echo_produce(100), false, false);
  std::mutex mu;
  int calls = 0;
  Nanos total = 0;
  loader.set_wait_observer(
      [&](Nanos ns) {
        std::lock_guard<std::mutex> lock(mu);
        ++calls;
        total += ns;
        EXPECT_GE(ns, 0);
      },
      nullptr);
  loader.start_epoch();
  drain(loader);
  const LoaderStats s = loader.stats();
  EXPECT_EQ(calls, 10);
  EXPECT_EQ(calls, s.blocked_count);
  EXPECT_EQ(total, s.wait_ns);

  // With workers: observed calls still match the blocked count.
  loader.set_workers(2);
  loader.start_epoch();
  drain(loader);
  const LoaderStats s2 = loader.stats();
  EXPECT_EQ(calls, s2.blocked_count);
  EXPECT_EQ(total, s2.wait_ns);
}

// An observer that throws must not cost a batch nor throw into the loop: next() delivers the
// batch, the observer is disabled after its first failure, and the sink hears of it once.
TEST(LoaderCoreTest, ThrowingWaitObserverLosesNoBatch) {
  for (int workers : {0, 2}) {
    for (bool std_exception : {true, false}) {
      SCOPED_TRACE("workers " + std::to_string(workers) +
                   (std_exception ? ", std::runtime_error" : ", throw 7"));
      LoaderCore loader(40, options(4, workers), echo_produce(workers == 0 ? 0 : 300), false,
                        false);
      int calls = 0;
      loader.set_wait_observer(
          [&](Nanos) {
            if (++calls == 3) {
              if (std_exception) throw std::runtime_error("observer broke");
              throw 7;
            }
          },
          nullptr);
      std::vector<std::string> warnings;
      loader.set_warning_sink([&](const std::string& m) { warnings.push_back(m); });
      for (int epoch = 0; epoch < 2; ++epoch) {
        loader.start_epoch();
        int thrown = 0;
        const std::vector<Indices> batches = drain_counting_throws(loader, thrown);
        EXPECT_EQ(thrown, 0) << "epoch " << epoch;
        expect_exactly_once(flatten(batches), 40);
      }
      if (workers == 0) EXPECT_EQ(calls, 3) << "disabled after its first failure";
      EXPECT_LE(calls, 3);
      if (calls == 3) {
        ASSERT_EQ(warnings.size(), 1u);
        EXPECT_NE(warnings.front().find("wait observer"), std::string::npos) << warnings.front();
        if (std_exception) EXPECT_NE(warnings.front().find("observer broke"), std::string::npos);
      }
    }
  }
}

// A wait clock that throws (the Pilot's clock is the caller's) is as harmless, and so is a warning
// sink that throws: the message then goes to the torchpilot logger.
TEST(LoaderCoreTest, ThrowingWaitClockOrSinkLosesNoBatch) {
  class FailingClock final : public Clock {
   public:
    Nanos now_ns() const override {
      if (++calls_ == 4) throw std::runtime_error("clock broke");
      return calls_ * 1000;
    }

   private:
    mutable int calls_ = 0;
  };
  LoaderCore loader(40, options(4, 0), echo_produce(0), false, false);
  int calls = 0;
  loader.set_wait_observer([&](Nanos) { ++calls; }, std::make_shared<FailingClock>());
  int sink_calls = 0;
  loader.set_warning_sink([&](const std::string&) {
    ++sink_calls;
    throw 1;
  });
  loader.start_epoch();
  int thrown = 0;
  const std::vector<Indices> batches = drain_counting_throws(loader, thrown);
  EXPECT_EQ(thrown, 0);
  expect_exactly_once(flatten(batches), 40);
  EXPECT_EQ(sink_calls, 1);
  const LoaderStats s = loader.stats();
  EXPECT_EQ(s.batches, 10);
  EXPECT_EQ(s.blocked_count, 10);
}

TEST(LoaderCoreTest, PinAndDevicePrefetchOnlyWhenAvailable) {
  LoaderCore unavailable(10, options(2, 0), echo_produce(), false, false);
  EXPECT_FALSE(unavailable.set_pin_memory(true));
  EXPECT_FALSE(unavailable.settings().pin_memory);
  EXPECT_TRUE(unavailable.set_pin_memory(false));
  EXPECT_FALSE(unavailable.set_device_prefetch(true));
  EXPECT_FALSE(unavailable.settings().device_prefetch);

  LoaderOptions o = options(2, 0);
  o.pin_memory = true;  // asked for but not available: off
  LoaderCore asked(10, o, echo_produce(), false, false);
  EXPECT_FALSE(asked.settings().pin_memory);

  LoaderCore available(10, options(2, 0), echo_produce(), true, true);
  EXPECT_TRUE(available.set_pin_memory(true));
  EXPECT_TRUE(available.settings().pin_memory);
  EXPECT_TRUE(available.set_device_prefetch(true));
  EXPECT_TRUE(available.stats().settings.device_prefetch);
  EXPECT_TRUE(available.stats().pin_memory_available);
}

TEST(LoaderCoreTest, ProduceSeesTheLiveSettings) {
  std::atomic<int> pinned{0};
  LoaderCore::Produce produce = [&](const Indices& indices, int, const LoaderSettings& s) {
    if (s.pin_memory) ++pinned;
    return std::make_shared<Indices>(indices);
  };
  LoaderCore loader(20, options(2, 0), produce, true, false);
  loader.start_epoch();
  loader.next();
  EXPECT_EQ(pinned.load(), 0);
  loader.set_pin_memory(true);
  drain(loader);
  EXPECT_EQ(pinned.load(), 9);
}

TEST(LoaderCoreTest, SettersClampAndConstructorValidates) {
  LoaderCore loader(10, options(2, 1), echo_produce(), false, false);
  loader.set_workers(-3);
  EXPECT_EQ(loader.settings().workers, 0);
  loader.set_prefetch(0);
  EXPECT_EQ(loader.settings().prefetch, 1);
  loader.start_epoch();
  expect_exactly_once(flatten(drain(loader)), 10);

  EXPECT_THROW(LoaderCore(10, options(0, 1), echo_produce(), false, false), std::invalid_argument);
  EXPECT_THROW(LoaderCore(10, options(2, -1), echo_produce(), false, false), std::invalid_argument);
  LoaderOptions o = options(2, 1);
  o.prefetch = 0;
  EXPECT_THROW(LoaderCore(10, o, echo_produce(), false, false), std::invalid_argument);
}

}  // namespace
}  // namespace torchpilot
