// Join and the order of submissions (coordinator.h, point 8), through the engine with ranks as
// threads: what a rank enqueues after its join never runs with the joined ranks standing in for
// the others, even when it leaves in one message with the join (Engine::SubmitNew ends a message
// at a join); what a rank enqueued before its join runs before the join completes.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/engine.h"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/inproc_transport.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::WaitUntil;
using std::chrono::milliseconds;

// 'x': an average of four elements.
TensorRequest AverageX() {
  TensorRequest r = Request("x", OpType::kAllreduce, DType::kFloat32, {4});
  r.reduce_op = ReduceOp::kAverage;
  return r;
}

TEST(NegotiationJoinOrderTest, AnEntryEnqueuedAfterAJoinInOneCycleWaitsForTheOthersNext) {
  // Rank 1 gathers for a second before it sends (the cycle time): its join and the 'x' it
  // enqueues just after leave together. 'x' is in the response cache, so it would travel as a
  // bit, which the coordinator reads before the message's requests.
  Job job(2, [](Config& c) {
    if (c.rank == 1) c.cycle_time_ms = 1000;
  });
  std::vector<float> v0(4, 1.0f), v1(4, 3.0f);
  auto x0 = Submit(job[0], Entry(AverageX(), v0.data(), v0.data()));
  auto x1 = Submit(job[1], Entry(AverageX(), v1.data(), v1.data()));
  ASSERT_TRUE(Await(x0).ok());
  ASSERT_TRUE(Await(x1).ok());
  const uint64_t sent = job.world().Received(0, 1);
  StatusOr<int> last1 = Status::Ok();
  std::thread joiner([&] { last1 = job[1].Join(); });
  std::this_thread::sleep_for(milliseconds(100));  // the join is queued, its cycle still open
  v1.assign(4, 3.0f);
  x1 = Submit(job[1], Entry(AverageX(), v1.data(), v1.data()));
  EXPECT_TRUE(WaitUntil([&] { return job.world().Received(0, 1) > sent; }, milliseconds(10000)));
  // Rank 0 joins too: the join completes, and nobody stands in for rank 1's later 'x'.
  StatusOr<int> last0 = job[0].Join();
  joiner.join();
  ASSERT_TRUE(last0.ok()) << last0.status().ToString();
  ASSERT_TRUE(last1.ok()) << last1.status().ToString();
  EXPECT_FALSE(x1->done()) << "rank 1's 'x' ran without rank 0's: " << v1[0];
  // It runs with rank 0's next 'x'.
  v0.assign(4, 1.0f);
  x0 = Submit(job[0], Entry(AverageX(), v0.data(), v0.data()));
  EXPECT_TRUE(Await(x0).ok());
  EXPECT_TRUE(Await(x1).ok());
  EXPECT_EQ(v0, std::vector<float>(4, 2.0f));
  EXPECT_EQ(v1, std::vector<float>(4, 2.0f));
}

TEST(NegotiationJoinOrderTest, AnEntryEnqueuedBeforeAJoinRunsWhenTheLastRankJoins) {
  // Rank 0 enqueues 'y' and joins without waiting for it; rank 1 joined before and lacks 'y';
  // rank 2 joins last. 'y' runs with ranks 1 and 2 standing in (it did not, and waited for ever,
  // when the first join reached the coordinator before 'y').
  Job job(3);
  StatusOr<int> last1 = Status::Ok(), last0 = Status::Ok();
  std::thread joiner1([&] { last1 = job[1].Join(); });
  EXPECT_TRUE(WaitUntil([&] { return job.world().Received(0, 1) >= 1; }));
  std::vector<float> y(4, 6.0f);
  auto y0 = Submit(
      job[0], Entry(Request("y", OpType::kAllreduce, DType::kFloat32, {4}), y.data(), y.data()));
  std::thread joiner0([&] { last0 = job[0].Join(); });
  std::this_thread::sleep_for(milliseconds(100));
  StatusOr<int> last2 = job[2].Join();
  joiner1.join();
  joiner0.join();
  for (const auto* last : {&last0, &last1, &last2}) {
    ASSERT_TRUE(last->ok()) << last->status().ToString();
    EXPECT_EQ(**last, 2);
  }
  Status s = Await(y0, milliseconds(5000));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(y, std::vector<float>(4, 6.0f));
}

}  // namespace
}  // namespace concord
