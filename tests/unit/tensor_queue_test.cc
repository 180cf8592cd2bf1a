#include "core/tensor_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace concord {
namespace {

// An entry for an allreduce named `name`, with a fresh completion state.
QueueEntry Entry(const std::string& name) {
  QueueEntry e;
  e.request.name = name;
  e.state = std::make_shared<RequestState>();
  return e;
}

// The entries named by `names`, in order.
std::vector<QueueEntry> Entries(const std::vector<std::string>& names) {
  std::vector<QueueEntry> out;
  for (const auto& n : names) out.push_back(Entry(n));
  return out;
}

// The names of `requests`, in order.
std::vector<std::string> Names(const std::vector<TensorQueue::Fresh>& requests) {
  std::vector<std::string> out;
  for (const auto& r : requests) out.push_back(r.request.name);
  return out;
}

// Unnamed barriers take their numbers when accepted: a refused push (here: a member already in
// flight) takes none, so the next barrier is still number 0 on this rank, as on the others. A
// group is named by its first member's name (a barrier's number) and its size.
TEST(TensorQueueTest, BarriersAreNumberedOnlyWhenAcceptedAndNameTheirGroup) {
  TensorQueue queue([] {});
  ASSERT_TRUE(queue.Push(Entries({"busy"})).ok());
  auto group = [](const std::string& other) {
    QueueEntry barrier = Entry("");
    barrier.request.op = OpType::kBarrier;
    std::vector<QueueEntry> g;
    g.push_back(std::move(barrier));
    g.push_back(Entry(other));
    for (auto& e : g) e.request.group_size = 2;
    return g;
  };
  EXPECT_EQ(queue.Push(group("busy")).code(), Code::kInvalidArgument);
  ASSERT_TRUE(queue.Push(group("free")).ok());
  const auto fresh = queue.PopNew();
  ASSERT_EQ(fresh.size(), 3u);
  EXPECT_EQ(fresh[1].request.name, "__concord.barrier.0");
  EXPECT_EQ(fresh[1].request.group, "__concord.barrier.0#2");
  EXPECT_EQ(fresh[2].request.group, "__concord.barrier.0#2");
  EXPECT_EQ(queue.NextBarrierName(), "__concord.barrier.1");
}

TEST(TensorQueueTest, PushPopKeepsOrder) {
  TensorQueue queue([] {});
  EXPECT_FALSE(queue.OldestNew().has_value());
  ASSERT_TRUE(queue.Push(Entries({"c"})).ok());
  ASSERT_TRUE(queue.Push(Entries({"a", "b"})).ok());
  EXPECT_TRUE(queue.OldestNew().has_value());
  EXPECT_EQ(Names(queue.PopNew()), (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_FALSE(queue.OldestNew().has_value());
  EXPECT_TRUE(queue.PopNew().empty());
  EXPECT_EQ(queue.in_flight(), 3u);  // popped entries stay in flight
  EXPECT_TRUE(queue.Push({}).ok());
}

TEST(TensorQueueTest, DuplicateInFlightNameRefused) {
  TensorQueue queue([] {});
  ASSERT_TRUE(queue.Push(Entries({"a"})).ok());
  queue.PopNew();
  Status s = queue.Push(Entries({"b", "a"}));
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  EXPECT_TRUE(queue.PopNew().empty());  // "b" was not queued either
  EXPECT_EQ(queue.in_flight(), 1u);
}

TEST(TensorQueueTest, GroupWithDuplicateRefusedAtomically) {
  TensorQueue queue([] {});
  Status s = queue.Push(Entries({"x", "y", "x"}));
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("twice"), std::string::npos) << s.message();
  EXPECT_EQ(queue.in_flight(), 0u);
  EXPECT_TRUE(queue.PopNew().empty());
  EXPECT_FALSE(queue.OldestNew().has_value());
}

TEST(TensorQueueTest, TakeRemovesAndFreesTheName) {
  TensorQueue queue([] {});
  ASSERT_TRUE(queue.Push(Entries({"a", "b"})).ok());
  queue.PopNew();
  auto a = queue.Take("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->request.name, "a");
  EXPECT_FALSE(queue.Take("a").has_value());
  EXPECT_FALSE(queue.Take("missing").has_value());
  EXPECT_EQ(queue.in_flight(), 1u);
  EXPECT_TRUE(queue.Push(Entries({"a"})).ok());  // the name may be reused once taken
}

// An entry resubmitted (its request must be sent again) and taken (a response ran it) before the
// next PopNew() is not returned: it is no longer in flight. A name resubmitted twice, or taken
// and pushed again, is returned once.
TEST(TensorQueueTest, TakeWithdrawsAResubmittedEntry) {
  TensorQueue queue([] {});
  ASSERT_TRUE(queue.Push(Entries({"a", "b"})).ok());
  queue.PopNew();
  queue.Resubmit({"a", "b"});
  ASSERT_TRUE(queue.Take("a").has_value());
  EXPECT_EQ(Names(queue.PopNew()), (std::vector<std::string>{"b"}));
  queue.Resubmit({"b", "b"});  // returned once
  EXPECT_EQ(Names(queue.PopNew()), (std::vector<std::string>{"b"}));
  queue.Resubmit({"b"});
  ASSERT_TRUE(queue.Take("b").has_value());
  EXPECT_FALSE(queue.OldestNew().has_value());
  EXPECT_TRUE(queue.PopNew().empty());
  ASSERT_TRUE(queue.Push(Entries({"b"})).ok());
  EXPECT_EQ(Names(queue.PopNew()), (std::vector<std::string>{"b"}));
}

TEST(TensorQueueTest, CloseReturnsInFlightAndRefusesLaterPushes) {
  TensorQueue queue([] {});
  ASSERT_TRUE(queue.Push(Entries({"a", "b"})).ok());
  queue.PopNew();
  ASSERT_TRUE(queue.Push(Entries({"c"})).ok());  // not yet popped
  const Status closed(Code::kPeerFailure, "rank 1 died");
  auto entries = queue.Close(closed);
  std::set<std::string> names;
  for (const auto& e : entries) names.insert(e.request.name);
  EXPECT_EQ(names, (std::set<std::string>{"a", "b", "c"}));
  EXPECT_EQ(queue.in_flight(), 0u);
  EXPECT_TRUE(queue.PopNew().empty());
  Status s = queue.Push(Entries({"d"}));
  EXPECT_EQ(s.code(), Code::kPeerFailure);
  EXPECT_EQ(s.message(), "rank 1 died");
  // A second Close keeps the first status.
  queue.Close(Status(Code::kNotInitialized, "finalized"));
  EXPECT_EQ(queue.Push(Entries({"d"})).code(), Code::kPeerFailure);
}

TEST(TensorQueueTest, WakeCalledOnEverySuccessfulPush) {
  int wakes = 0;
  TensorQueue queue([&] { ++wakes; });
  ASSERT_TRUE(queue.Push(Entries({"a"})).ok());
  ASSERT_TRUE(queue.Push(Entries({"b", "c"})).ok());
  EXPECT_EQ(wakes, 2);
  EXPECT_FALSE(queue.Push(Entries({"a"})).ok());
  EXPECT_EQ(wakes, 2);
}

TEST(TensorQueueTest, WakeRunsOutsideTheLock) {
  // The wake function runs outside the queue's lock: it may call into the queue.
  TensorQueue* self = nullptr;
  size_t seen = 0;
  TensorQueue queue([&] { seen = self->in_flight(); });
  self = &queue;
  ASSERT_TRUE(queue.Push(Entries({"a"})).ok());
  EXPECT_EQ(seen, 1u);
}

TEST(TensorQueueTest, ConcurrentPushesFromSeveralThreads) {
  std::atomic<int> wakes{0};
  TensorQueue queue([&] { wakes.fetch_add(1); });
  constexpr int kThreads = 4, kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(queue.Push(Entries({"t" + std::to_string(t) + "." + std::to_string(i)})).ok());
        // Every thread also tries a shared name: exactly one push of it succeeds overall.
        (void)queue.Push(Entries({"shared." + std::to_string(i)}));  // counted below
      }
    });
  }
  std::vector<TensorQueue::Fresh> popped;
  while (popped.size() < kThreads * kPerThread + kPerThread) {
    for (auto& r : queue.PopNew()) popped.push_back(r);
    std::this_thread::yield();
  }
  for (auto& t : threads) t.join();
  for (auto& r : queue.PopNew()) popped.push_back(r);
  EXPECT_EQ(popped.size(), size_t{kThreads * kPerThread + kPerThread});
  std::set<std::string> names;
  for (const auto& r : popped) names.insert(r.request.name);
  EXPECT_EQ(names.size(), popped.size());
  EXPECT_EQ(queue.in_flight(), popped.size());
  EXPECT_EQ(wakes.load(), static_cast<int>(popped.size()));
  // Each thread's own names came out in its push order.
  for (int t = 0; t < kThreads; ++t) {
    int next = 0;
    const std::string prefix = "t" + std::to_string(t) + ".";
    for (const auto& r : popped) {
      if (r.request.name.compare(0, prefix.size(), prefix) == 0) {
        EXPECT_EQ(r.request.name, prefix + std::to_string(next++));
      }
    }
  }
}

}  // namespace
}  // namespace concord
