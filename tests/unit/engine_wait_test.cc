// Engine::Wait: progress by the waiter. A thread waiting for its request runs the engine's steps
// itself; these tests check results, on which thread callbacks run, several waiters at once,
// waits that time out, failures while a waiter drives, and handles that outlive their engine.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/unit/engine_test_util.h"

namespace concord {
namespace {

using namespace engine_testing;
using harness::Latch;
using harness::RunRanks;
using harness::WaitUntil;

// A request whose callback records the thread it ran on.
struct Traced {
  std::shared_ptr<RequestState> state;
  std::shared_ptr<std::thread::id> ran_on = std::make_shared<std::thread::id>();
};

Traced TracedAllreduce(Engine& engine, const std::string& name, std::vector<float>& data,
                       bool then_wait = false) {
  Traced t;
  auto ran_on = t.ran_on;
  QueueEntry e =
      Entry(Request(name, OpType::kAllreduce, DType::kFloat32, {static_cast<int64_t>(data.size())}),
            data.data(), data.data());
  e.state = std::make_shared<RequestState>(
      [ran_on](const Status&) { *ran_on = std::this_thread::get_id(); });
  t.state = e.state;
  EXPECT_TRUE(engine.Enqueue(std::move(e), then_wait).ok());
  return t;
}

class EngineWaitTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Sizes 0, 1, odd, inline and past the direct threshold; every rank waits for each in turn, as a
// blocking call does (then_wait). The waiter drives (callbacks on its thread) when waiter_progress
// is on, and never when it is off.
TEST_P(EngineWaitTest, WaiterCompletesItsOwnRequests) {
  // Plain variables, not a structured binding: clang 14 (the tsan pass) cannot capture those.
  const int size = std::get<0>(GetParam());
  const bool waiter_progress = std::get<1>(GetParam());
  Job job(size, [&](Config& c) { c.waiter_progress = waiter_progress; });
  const std::vector<size_t> counts = {0, 1, 1001, 3, 300000, 7};
  std::atomic<int> on_waiter{0}, total{0};
  RunRanks(size, [&](int rank) {
    for (int step = 0; step < 20; ++step) {
      for (size_t i = 0; i < counts.size(); ++i) {
        std::vector<float> data(counts[i], static_cast<float>(rank + 1));
        Traced t = TracedAllreduce(job[rank], "t" + std::to_string(i), data, true);
        ASSERT_TRUE(job[rank].Wait(*t.state, Deadline::After(milliseconds(20000))));
        ASSERT_TRUE(t.state->status().ok()) << t.state->status().ToString();
        const float want = static_cast<float>(size * (size + 1) / 2);
        for (float v : data) ASSERT_EQ(v, want);
        ++total;
        if (*t.ran_on == std::this_thread::get_id()) ++on_waiter;
      }
    }
  });
  if (waiter_progress) {
    // The engine thread, finishing a step the waiter interrupted, may complete one now and then.
    EXPECT_GT(on_waiter.load(), total.load() / 2) << on_waiter << " of " << total;
  } else {
    EXPECT_EQ(on_waiter.load(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndMode, EngineWaitTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()));

// Several threads per rank wait at once, each for its own tensors, while other requests of the
// rank complete by callback only: every one completes with the right sum.
TEST(EngineWaitManyTest, SeveralWaitersAndAsyncRequests) {
  const int size = 3, waiters = 3;
  Job job(size);
  RunRanks(size, [&](int rank) {
    std::vector<float> async_data(64, 1.0f);
    std::atomic<bool> async_done{false};
    QueueEntry async_entry = Entry(Request("async", OpType::kAllreduce, DType::kFloat32, {64}),
                                   async_data.data(), async_data.data());
    async_entry.state =
        std::make_shared<RequestState>([&](const Status& s) { async_done = s.ok(); });
    auto async_state = Submit(job[rank], std::move(async_entry));
    std::vector<std::thread> threads;
    for (int w = 0; w < waiters; ++w) {
      threads.emplace_back([&, w] {
        for (int step = 0; step < 30; ++step) {
          std::vector<float> data(1 + 97 * w, 2.0f);
          Traced t = TracedAllreduce(job[rank], "w" + std::to_string(w), data);
          ASSERT_TRUE(job[rank].Wait(*t.state, Deadline::After(milliseconds(20000))));
          ASSERT_TRUE(t.state->status().ok()) << t.state->status().ToString();
          for (float v : data) ASSERT_EQ(v, 2.0f * size);
        }
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(async_state->Wait(Deadline::After(milliseconds(20000))));
    EXPECT_TRUE(async_done.load());
    for (float v : async_data) EXPECT_EQ(v, static_cast<float>(size));
  });
}

// A request the other rank never submits: Wait() returns false at its deadline, and the request
// still completes once the other rank submits.
TEST(EngineWaitDeadlineTest, ReturnsAtTheDeadline) {
  Job job(2);
  std::vector<float> a(5, 1.0f), b(5, 2.0f);
  auto state = Submit(
      job[0], Entry(Request("late", OpType::kAllreduce, DType::kFloat32, {5}), a.data(), a.data()));
  const auto start = Clock::now();
  EXPECT_FALSE(job[0].Wait(*state, Deadline::After(milliseconds(100))));
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, milliseconds(100));
  EXPECT_LT(waited, milliseconds(2000));
  auto other = Submit(
      job[1], Entry(Request("late", OpType::kAllreduce, DType::kFloat32, {5}), b.data(), b.data()));
  EXPECT_TRUE(job[1].Wait(*other, Deadline::After(milliseconds(20000))));
  EXPECT_TRUE(job[0].Wait(*state, Deadline::After(milliseconds(20000))));
  EXPECT_TRUE(state->status().ok());
  for (float v : a) EXPECT_EQ(v, 3.0f);
}

// A rank dies while the others drive their waits: they fail promptly with the victim's rank.
TEST(EngineWaitFailureTest, PeerDiesWhileWaitersDrive) {
  const int size = 3, victim = 0;
  Job job(size);
  std::vector<std::vector<float>> data(size, std::vector<float>(16, 1.0f));
  std::vector<Status> results(size);
  std::vector<uint64_t> sent(size);
  for (int r = 0; r < size; ++r) sent[r] = job.world().Received(victim, r);
  Latch waiting(size - 1);
  Clock::time_point start;
  RunRanks(size, [&](int rank) {
    if (rank == victim) {
      // Dies once every other rank is about to wait and the victim, the coordinator, holds their
      // requests.
      ASSERT_TRUE(waiting.Wait());
      ASSERT_TRUE(WaitUntil([&] {
        for (int r = 1; r < size; ++r) {
          if (job.world().Received(victim, r) == sent[r]) return false;
        }
        return true;
      }));
      start = Clock::now();
      job.world().Kill(victim);
      return;
    }
    auto state =
        Submit(job[rank], Entry(Request("pending", OpType::kAllreduce, DType::kFloat32, {16}),
                                data[rank].data(), data[rank].data()));
    waiting.CountDown();
    job[rank].Wait(*state, Deadline::After(milliseconds(5000)));
    results[rank] = state->done() ? state->status() : TimeoutError("still waiting");
  });
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  for (int r = 1; r < size; ++r) {
    EXPECT_EQ(results[r].code(), Code::kPeerFailure)
        << "rank " << r << ": " << results[r].ToString();
    EXPECT_FALSE(job[r].failure().ok());
  }
}

// A callback on the waiting thread cannot finalize its engine (it would wait for itself).
TEST(EngineWaitCallbackTest, FinalizeFromACallbackIsRefused) {
  Job job(2);
  RunRanks(2, [&](int rank) {
    std::vector<float> data(3, 1.0f);
    Status from_callback;
    QueueEntry e =
        Entry(Request("cb", OpType::kAllreduce, DType::kFloat32, {3}), data.data(), data.data());
    Engine& engine = job[rank];
    e.state =
        std::make_shared<RequestState>([&](const Status&) { from_callback = engine.Shutdown(); });
    auto state = Submit(engine, std::move(e));
    ASSERT_TRUE(engine.Wait(*state, Deadline::After(milliseconds(20000))));
    EXPECT_EQ(from_callback.code(), Code::kInvalidArgument) << from_callback.ToString();
  });
}

// A pending request's callback runs on the thread in Shutdown(), which completes it with
// kNotInitialized: finalizing again from there is refused, not a wait for Shutdown() itself.
TEST(EngineWaitCallbackTest, FinalizeFromACallbackRunByShutdownIsRefused) {
  Job job(
      2, [](Config& c) { c.timeout_s = 0.3; }, milliseconds(300));
  std::vector<float> data(3, 1.0f);
  Engine& engine = job[1];
  Status from_callback;
  QueueEntry e = Entry(Request("never.run", OpType::kAllreduce, DType::kFloat32, {3}), data.data(),
                       data.data());
  e.state =
      std::make_shared<RequestState>([&](const Status&) { from_callback = engine.Shutdown(); });
  auto state = Submit(engine, std::move(e));
  // Rank 0 never submits it: Shutdown() completes it after its finalize barrier times out, and
  // says that the barrier did not complete.
  EXPECT_EQ(engine.Shutdown().code(), Code::kTimeout);
  ASSERT_TRUE(state->done());
  EXPECT_EQ(state->status().code(), Code::kNotInitialized) << state->status().ToString();
  EXPECT_EQ(from_callback.code(), Code::kInvalidArgument) << from_callback.ToString();
  // Rank 0's barrier cannot complete without rank 1 either.
  EXPECT_FALSE(job[0].Shutdown().ok());
}

// A handle's gate outlives the engine: waiting through it afterwards waits plainly.
TEST(EngineWaitLifetimeTest, GateOutlivesTheEngine) {
  std::shared_ptr<WaitGate> gate;
  std::shared_ptr<RequestState> pending;
  std::vector<float> data(4, 1.0f);
  {
    Job job(
        2, [](Config& c) { c.timeout_s = 0.3; }, milliseconds(300));
    job.ExpectUnevenEnd();
    gate = job[1].wait_gate();
    pending = Submit(job[1], Entry(Request("never", OpType::kAllreduce, DType::kFloat32, {4}),
                                   data.data(), data.data()));
  }
  const StatusOr<bool> completed = gate->Wait(*pending, Deadline::After(milliseconds(1000)));
  ASSERT_TRUE(completed.ok() && *completed);
  // Rank 1's finalize completes it (kNotInitialized), unless rank 0's finalize reached the
  // coordinator first: then it failed at once, naming rank 0 (kPeerFailure).
  const Code code = pending->status().code();
  EXPECT_TRUE(code == Code::kNotInitialized || code == Code::kPeerFailure)
      << pending->status().ToString();
}

}  // namespace
}  // namespace concord
