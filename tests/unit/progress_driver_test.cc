// ProgressDriver (core/progress_driver.h) against a fake engine: who runs the steps (the engine
// thread, or a waiter while the engine thread parks), that only one thread steps at a time, that
// a rest ends on Wake(), and that a failed step halts every stepping thread at once.
#include "core/progress_driver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace concord {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// A fake engine step: it waits for a message like the control plane's receive (here: until
// interrupted or its limit), records which thread stepped, and runs OnStep's function afterwards.
class FakeSteps {
 public:
  ProgressDriver::Hooks Hooks() {
    return ProgressDriver::Hooks{[this](Deadline limit, microseconds busy_poll) {
                                   RecordBusyPoll(busy_poll);
                                   return Step(limit);
                                 },
                                 [this](const Status& s) {
                                   halted_with = s.code();  // before the count the test waits for
                                   halted_calls.fetch_add(1);
                                 },
                                 [this] { Interrupt(); }, [this] { return busy.load(); }};
  }

  Status Step(Deadline limit) {
    if (limit.infinite()) waiting_steps.fetch_add(1);
    const int now_inside = inside.fetch_add(1) + 1;
    int seen = max_inside.load();
    while (now_inside > seen && !max_inside.compare_exchange_weak(seen, now_inside)) {
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (limit.infinite()) {
        cv_.wait(lock, [this] { return interrupted_; });
      } else {
        cv_.wait_until(lock, limit.at(), [this] { return interrupted_; });
      }
      interrupted_ = false;
    }
    std::function<void()> after;
    {
      std::lock_guard<std::mutex> lock(mu_);
      steppers_.push_back(std::this_thread::get_id());
      after = on_step_;
    }
    steps.fetch_add(1);
    Status result =
        fail_next.exchange(false) ? Status(Code::kPeerFailure, "rank 1 died") : Status::Ok();
    if (after) after();
    inside.fetch_sub(1);
    return result;
  }

  void Interrupt() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      interrupted_ = true;
    }
    cv_.notify_all();
  }

  // The busy poll of the steps begun so far, in order.
  void RecordBusyPoll(microseconds busy_poll) {
    std::lock_guard<std::mutex> lock(mu_);
    busy_polls_.push_back(busy_poll);
  }
  std::vector<microseconds> BusyPolls() {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_polls_;
  }

  // Steps run by `id` so far.
  int StepsBy(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (auto s : steppers_) n += s == id;
    return n;
  }

  std::atomic<int> steps{0};
  std::atomic<int> waiting_steps{0};  // steps begun with no limit: waiting for messages
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  std::atomic<int> halted_calls{0};
  std::atomic<Code> halted_with{Code::kOk};
  std::atomic<bool> busy{true};
  std::atomic<bool> fail_next{false};
  // What every step runs after its wait (steps may be running on other threads meanwhile).
  void OnStep(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    on_step_ = std::move(f);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool interrupted_ = false;
  std::vector<std::thread::id> steppers_;
  std::vector<microseconds> busy_polls_;
  std::function<void()> on_step_;
};

// Waits until `condition` holds, at most 5 s.
template <typename F>
bool Eventually(F condition) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (!condition()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(microseconds(200));  // polling a condition, not ordering
  }
  return true;
}

TEST(ProgressDriverTest, EngineThreadStepsOnWakeAndStops) {
  FakeSteps fake;
  ProgressDriver driver(fake.Hooks(), microseconds(0));
  driver.Start();
  // The engine thread waits in its first step until something interrupts it.
  const int before = fake.steps.load();
  driver.Wake();
  EXPECT_TRUE(Eventually([&] { return fake.steps.load() > before; }));
  EXPECT_FALSE(driver.RunsSteps(std::this_thread::get_id()));
  driver.Stop();
  EXPECT_TRUE(driver.stopping());
  EXPECT_EQ(fake.halted_calls.load(), 0);
}

TEST(ProgressDriverTest, EngineThreadPollsOnlyWhileRequestsAreInFlight) {
  FakeSteps fake;
  fake.busy = false;
  ProgressDriver driver(fake.Hooks(), microseconds(50));
  driver.Start();
  ASSERT_TRUE(Eventually([&] { return fake.BusyPolls().size() == 1; }));
  fake.busy = true;
  driver.Wake();  // ends the first step; the next begins with a request in flight
  ASSERT_TRUE(Eventually([&] { return fake.BusyPolls().size() == 2; }));
  fake.busy = false;
  driver.Wake();
  ASSERT_TRUE(Eventually([&] { return fake.BusyPolls().size() == 3; }));
  driver.Stop();
  const std::vector<microseconds> polls = fake.BusyPolls();
  EXPECT_EQ(polls[0], microseconds(0));
  EXPECT_EQ(polls[1], microseconds(50));
  EXPECT_EQ(polls[2], microseconds(0));
}

// The engine thread has left its park but not yet taken the step lock when a waiter comes: the
// waiter's interrupt ends the waiter's own first step, not the engine thread's. The engine thread
// must then park again rather than start a step that waits for messages without limit (the
// waiter would wait for the step lock for good: mp_comm_split hung so, 2 runs in 12).
TEST(ProgressDriverTest, EngineThreadOnItsWayToAStepYieldsToAWaiterThatCameMeanwhile) {
  FakeSteps fake;
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_open = false;
  std::atomic<bool> engine_at_gate{false};
  std::atomic<std::thread::id> engine_id{};
  ProgressDriver::Hooks hooks = fake.Hooks();
  // The engine thread calls `busy` after leaving its park, before the step lock: it waits there
  // (its first time) until the waiter below has interrupted and stepped.
  hooks.busy = [&] {
    if (engine_id.load() == std::thread::id()) {
      engine_id = std::this_thread::get_id();
      engine_at_gate = true;
      std::unique_lock<std::mutex> lock(gate_mu);
      gate_cv.wait(lock, [&] { return gate_open; });
    }
    return true;
  };
  ProgressDriver driver(std::move(hooks), microseconds(0));
  driver.Start();
  ASSERT_TRUE(Eventually([&] { return engine_at_gate.load(); }));
  RequestState state;
  std::atomic<int> waiter_steps{0};
  const std::thread::id main_id = std::this_thread::get_id();
  std::atomic<std::thread::id> waiter_id{};
  fake.OnStep([&] {
    if (std::this_thread::get_id() != waiter_id.load()) return;
    if (waiter_steps.fetch_add(1) + 1 == 1) {
      {
        std::lock_guard<std::mutex> lock(gate_mu);
        gate_open = true;  // the engine thread goes for the step lock now
      }
      gate_cv.notify_all();
      std::this_thread::sleep_for(milliseconds(20));  // lets it queue for the lock
    }
    if (waiter_steps.load() == 20) state.Complete(Status::Ok());
  });
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    waiter_id = std::this_thread::get_id();
    driver.Drive(state, Deadline::After(milliseconds(20000)));
    returned = true;
  });
  EXPECT_TRUE(Eventually([&] { return returned.load(); }))
      << "the waiter is stuck after " << waiter_steps.load() << " steps";
  EXPECT_TRUE(state.done());
  fake.OnStep(nullptr);
  driver.Stop();  // also ends a stuck engine step, so the waiter returns
  waiter.join();
  EXPECT_NE(engine_id.load(), main_id);
}

TEST(ProgressDriverTest, WaiterRunsTheStepsItself) {
  FakeSteps fake;
  ProgressDriver driver(fake.Hooks(), microseconds(0));
  driver.Start();
  RequestState state;
  int mine = 0;
  const std::thread::id waiter = std::this_thread::get_id();
  fake.OnStep([&] {
    if (std::this_thread::get_id() == waiter && ++mine == 5) state.Complete(Status::Ok());
  });
  driver.Drive(state, Deadline::After(milliseconds(5000)));
  EXPECT_TRUE(state.done());
  EXPECT_EQ(fake.StepsBy(waiter), 5);
  // The engine thread finished the step it was in and parked: never two steppers at once.
  EXPECT_EQ(fake.max_inside.load(), 1);
  fake.OnStep(nullptr);
  driver.Stop();
}

TEST(ProgressDriverTest, OneStepperAtATimeAmongManyWaiters) {
  FakeSteps fake;
  ProgressDriver driver(fake.Hooks(), microseconds(0));
  driver.Start();
  std::vector<std::thread> waiters;
  std::atomic<int> finished{0};
  for (int w = 0; w < 4; ++w) {
    waiters.emplace_back([&] {
      for (int k = 0; k < 20; ++k) {
        RequestState state;
        std::thread completer([&] {
          std::this_thread::sleep_for(microseconds(300));  // the operation takes a while
          state.Complete(Status::Ok());
        });
        driver.Drive(state, Deadline::After(milliseconds(5000)));
        completer.join();
      }
      finished.fetch_add(1);
    });
  }
  for (auto& t : waiters) t.join();
  EXPECT_EQ(finished.load(), 4);
  EXPECT_EQ(fake.max_inside.load(), 1);
  driver.Stop();
}

TEST(ProgressDriverTest, RestingEngineThreadStepsAtOnceOnWake) {
  FakeSteps fake;
  fake.busy = false;  // nothing in flight when the waiter leaves: the engine thread rests
  ProgressDriver driver(fake.Hooks(), microseconds(0));
  driver.Start();
  RequestState state;
  fake.OnStep([&] { state.Complete(Status::Ok()); });
  driver.Drive(state, Deadline::After(milliseconds(5000)));
  fake.OnStep(nullptr);
  // Resting, it steps now and then without waiting for messages, ever less often.
  const int waiting = fake.waiting_steps.load();
  const int resting = fake.steps.load();
  EXPECT_TRUE(Eventually([&] { return fake.steps.load() > resting + 1; }));
  EXPECT_EQ(fake.waiting_steps.load(), waiting);
  // A wake ends the rest: the engine thread steps again, waiting for messages as it does when
  // idle.
  driver.Wake();
  EXPECT_TRUE(Eventually([&] { return fake.waiting_steps.load() > waiting; }));
  driver.Stop();
}

TEST(ProgressDriverTest, FailedStepHaltsEverySteppingThread) {
  FakeSteps fake;
  ProgressDriver driver(fake.Hooks(), microseconds(0));
  driver.Start();
  fake.fail_next = true;
  driver.Wake();
  EXPECT_TRUE(Eventually([&] { return fake.halted_calls.load() == 1; }));
  EXPECT_EQ(fake.halted_with.load(), Code::kPeerFailure);
  // Halted: a waiter runs no step and returns at once, well before its deadline.
  const int steps = fake.steps.load();
  RequestState state;
  const auto start = Clock::now();
  driver.Drive(state, Deadline::After(milliseconds(5000)));
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_EQ(fake.steps.load(), steps);
  EXPECT_FALSE(state.done());
  driver.Stop();
  EXPECT_EQ(fake.halted_calls.load(), 1);
}

TEST(ProgressDriverTest, DriveAfterStopReturnsAtOnce) {
  FakeSteps fake;
  ProgressDriver driver(fake.Hooks(), microseconds(0));
  driver.Start();
  driver.Stop();
  const int steps = fake.steps.load();
  RequestState state;
  driver.Drive(state, Deadline::Infinite());
  EXPECT_EQ(fake.steps.load(), steps);
}

}  // namespace
}  // namespace concord
