// Ranks as threads of one gtest process, and the synchronisation tests use between threads.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace concord {
namespace harness {

// How long RunRanks waits for its ranks: below ctest's 120 s per unit test (tests/CMakeLists.txt),
// so that a hung rank is named by RunRanks rather than killed anonymously by ctest.
inline constexpr std::chrono::seconds kRanksTimeout{100};

// RunRanks(size, body) runs body(rank) on one thread per rank, 0 .. size - 1, and returns once
// every one has returned.
//
// Contract: each rank's gtest failures carry "rank R" (a SCOPED_TRACE on its thread), and an
// exception escaping a body (which would otherwise end the process) is a failure naming the rank,
// so one run reports every rank's failures; a fatal failure (ASSERT_*) ends only that rank's
// body. When some ranks have not returned within kRanksTimeout, they are named on stderr and the
// process aborts: a hung rank fails the test at once, and says which it was. `body` runs on all
// ranks at once.
inline void RunRanks(int size, const std::function<void(int rank)>& body) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> done(size, false);
  int running = size;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      {
        SCOPED_TRACE("rank " + std::to_string(rank));
        try {
          body(rank);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "an exception escaped rank " << rank << ": " << e.what();
        } catch (...) {
          ADD_FAILURE() << "an exception escaped rank " << rank;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      done[rank] = true;
      --running;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, kRanksTimeout, [&] { return running == 0; })) {
      std::string stuck;
      for (int rank = 0; rank < size; ++rank) {
        if (!done[rank]) stuck += (stuck.empty() ? "" : ", ") + std::to_string(rank);
      }
      std::fflush(stdout);
      std::fprintf(stderr, "RunRanks: rank(s) %s of %d still running after %lld s; aborting\n",
                   stuck.c_str(), size, static_cast<long long>(kRanksTimeout.count()));
      std::abort();  // the threads cannot be stopped, and joining them would hang
    }
  }
  for (auto& t : threads) t.join();
}

// A one-shot countdown that orders events between threads (std::latch is C++20; Concord builds as
// C++17): Wait() returns once CountDown() has been called `count` times in all. Thread-safe.
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}

  void CountDown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (count_ > 0 && --count_ == 0) cv_.notify_all();
  }

  // Whether the count reached zero within 20 s (a test that gets false should fail: the event it
  // waited for never came).
  [[nodiscard]] bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [this] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

// Polls `holds` every millisecond until it is true or `limit` passes; returns whether it became
// true. For waiting on a state that has nothing to notify a waiter (a counter another thread
// bumps, a failure an engine records).
[[nodiscard]] inline bool WaitUntil(
    const std::function<bool()>& holds,
    std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!holds()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a poll interval, not an order
  }
  return true;
}

}  // namespace harness
}  // namespace concord
