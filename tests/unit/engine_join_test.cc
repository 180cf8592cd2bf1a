// Join (core/engine_join.cc) with ranks as threads: a response that lists this rank as joined ran
// without a request of this rank's, so the rank takes part through a stand-in and leaves an entry
// of that name it enqueued after joining to be negotiated on its own.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/engine.h"
#include "tests/common/sanitizers.h"
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

// Rank 1 gathers what it enqueues for a second before sending it (the cycle time): an operation
// it enqueues once its join has reached rank 0 stays unsent while the others' one of that name
// runs.
constexpr double kRank1CycleMs = 1000;

// Rank 1's join, on a thread of its own (it returns when every rank joined), and the 'x' rank 1
// enqueues after joining.
struct JoinedThenEnqueued {
  std::thread joiner;
  StatusOr<int> last = Status::Ok();
  std::shared_ptr<RequestState> x1;
};

// 'x': an average of four elements.
TensorRequest AverageX(DType dtype = DType::kFloat32) {
  TensorRequest r = Request("x", OpType::kAllreduce, dtype, {4});
  r.reduce_op = ReduceOp::kAverage;
  return r;
}

// Starts rank 1's join and waits until rank 0, the coordinator, holds it. The tests expect
// rather than assert while the join's thread runs: every rank joins at the end, which ends it.
void StartJoin(Job& job, JoinedThenEnqueued* out) {
  out->joiner = std::thread([&job, out] { out->last = job[1].Join(); });
  EXPECT_TRUE(WaitUntil([&] { return job.world().Received(0, 1) >= 1; }));
}

TEST(EngineJoinTest, AJoinedRanksOwnLaterEntryIsNotTheStandIn) {
  Job job(2, [](Config& c) {
    if (c.rank == 1) c.cycle_time_ms = kRank1CycleMs;
  });
  JoinedThenEnqueued j;
  StartJoin(job, &j);
  // Rank 1, joined, enqueues 'x' (still unsent); then rank 0's 'x' runs with rank 1 joined: an
  // average of rank 0's alone. Rank 1 takes part with the identity, not with its own 'x', which
  // the coordinator has not seen (it made the average 11).
  std::vector<float> v1(4, 10.0f), v0(4, 1.0f);
  j.x1 = Submit(job[1], Entry(AverageX(), v1.data(), v1.data()));
  Status s = Await(Submit(job[0], Entry(AverageX(), v0.data(), v0.data())));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(v0, std::vector<float>(4, 1.0f));
  // Rank 1's 'x' is a submission of its own: once it reached rank 0, it runs with rank 0's next.
  EXPECT_FALSE(j.x1->done());
  EXPECT_TRUE(WaitUntil([&] { return job.world().Received(0, 1) >= 2; }, milliseconds(10000)));
  std::vector<float> again(4, 1.0f);
  s = Await(Submit(job[0], Entry(AverageX(), again.data(), again.data())));
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = Await(j.x1);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(again, std::vector<float>(4, 5.5f));
  EXPECT_EQ(v1, std::vector<float>(4, 5.5f));
  StatusOr<int> last = job[0].Join();
  j.joiner.join();
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_TRUE(j.last.ok()) << j.last.status().ToString();
  EXPECT_EQ(*last, 0);
  EXPECT_EQ(*j.last, 0);
}

TEST(EngineJoinTest, AnErrorAmongTheOthersLeavesAJoinedRanksOwnEntryAlone) {
  Job job(3, [](Config& c) {
    if (c.rank == 1) c.cycle_time_ms = kRank1CycleMs;
  });
  JoinedThenEnqueued j;
  StartJoin(job, &j);
  // Ranks 0 and 2 disagree on 'x' while rank 1 is joined: the error is theirs, not that of the
  // 'x' rank 1 enqueued after joining (it completed with their mismatch).
  std::vector<float> v1(4, 10.0f), v0(4, 1.0f), v2(4, 1.0f);
  j.x1 = Submit(job[1], Entry(AverageX(), v1.data(), v1.data()));
  auto x0 = Submit(job[0], Entry(AverageX(), v0.data(), v0.data()));
  auto x2 = Submit(job[2], Entry(AverageX(DType::kInt32), v2.data(), v2.data()));
  EXPECT_EQ(Await(x0).code(), Code::kMismatch);
  EXPECT_EQ(Await(x2).code(), Code::kMismatch);
  EXPECT_FALSE(j.x1->done());
  // Once it reached rank 0, rank 1's 'x' runs with the others' next one: (1 + 10 + 1) / 3.
  EXPECT_TRUE(WaitUntil([&] { return job.world().Received(0, 1) >= 2; }, milliseconds(10000)));
  x0 = Submit(job[0], Entry(AverageX(), v0.data(), v0.data()));
  x2 = Submit(job[2], Entry(AverageX(), v2.data(), v2.data()));
  for (const auto& state : {x0, x2, j.x1}) {
    Status s = Await(state);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(v1, std::vector<float>(4, 4.0f));
  std::thread joiner2([&job] { EXPECT_TRUE(job[2].Join().ok()); });
  EXPECT_TRUE(job[0].Join().ok());
  joiner2.join();
  j.joiner.join();
  EXPECT_TRUE(j.last.ok()) << j.last.status().ToString();
}

// A joined rank's stand-in for an operation too large for this host's memory (a broadcast of
// 2^48 bytes) fails its step with an error naming the tensor, instead of std::bad_alloc escaping
// the thread that steps the engine (std::terminate); its join completes with that error.
TEST(EngineJoinTest, AStandInTooLargeForMemoryFailsWithAnErrorNotACrash) {
  if (harness::kSanitized) GTEST_SKIP() << harness::kSanitizedWhy;
  // The failure waits at most the timeout and a second for a culprit to be named.
  Job job(2, [](Config& c) { c.timeout_s = 0.5; });
  JoinedThenEnqueued j;
  StartJoin(job, &j);
  // In place on rank 0, the root, and never read: its own backend fails to take the memory too.
  uint8_t input = 0;
  const auto huge =
      Submit(job[0], Entry(Request("huge", OpType::kBroadcast, DType::kUint8, {int64_t{1} << 48}),
                           &input, &input));
  EXPECT_NE(Await(huge).code(), Code::kOk);
  j.joiner.join();
  ASSERT_FALSE(j.last.ok());
  EXPECT_NE(j.last.status().message().find(
                "out of memory for this joined rank's stand-in in the broadcast of tensor 'huge'"),
            std::string::npos)
      << j.last.status().ToString();
  EXPECT_TRUE(WaitUntil([&] { return !job[1].failure().ok(); }));
}

}  // namespace
}  // namespace concord
