// Gate: a dataset or produce call that blocks until the test opens it, for the loaders' tests of
// destruction while a worker is stuck; and the polling and bounded-destruction helpers they share.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace torchpilot {
namespace test {

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool is_open = false;
  std::atomic<int> entered{0};  // calls that reached the gate
  std::atomic<int> left{0};     // calls that went on past it (counted by the caller: leave())

  // Counts the caller in and blocks it until the gate opens.
  void enter() {
    ++entered;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return is_open; });
  }
  void leave() { ++left; }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      is_open = true;
    }
    cv.notify_all();
  }

  // Runs `destroy` on a helper thread so that a destructor that hangs fails the test instead of
  // hanging it: whether it returned within 5 s (if not, the gate is opened to let it finish). The
  // time it took until then goes to `elapsed` where given.
  bool destroyed_in_time(const std::function<void()>& destroy,
                         std::chrono::steady_clock::duration* elapsed = nullptr) {
    const auto begin = std::chrono::steady_clock::now();
    std::promise<void> destroyed;
    std::future<void> done = destroyed.get_future();
    std::thread destroyer([&] {
      destroy();
      destroyed.set_value();
    });
    const bool returned = done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (elapsed != nullptr) *elapsed = std::chrono::steady_clock::now() - begin;
    if (!returned) open();
    destroyer.join();
    return returned;
  }
};

// Polls `done` every millisecond for up to 10 s; its last answer.
inline bool within_ten_seconds(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

}  // namespace test
}  // namespace torchpilot
