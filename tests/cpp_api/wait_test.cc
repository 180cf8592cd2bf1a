// Future::wait_for through the C++ API: a limit that passes is "not yet" (false, the operation
// still runs and may be waited on again); an operation that fails by a deadline of its own throws
// concord::Error with CONCORD_ERR_TIMEOUT. Ranks are threads of this process over a file store
// private to the test.
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "concord/concord.hpp"
#include "gtest/gtest.h"
#include "tests/cpp_api/communicators.h"

namespace {

void RunRanks(int size, const std::function<void(concord::Communicator&)>& body) {
  concord::harness::RunCommunicators(size, "cpp-wait-test", body);
}

TEST(CppWaitTest, ALimitThatPassesIsNotYetAndTheFutureStaysWaitable) {
  RunRanks(1, [](concord::Communicator& comm) {
    std::vector<float> v(5, 2.0f);
    concord::Future f;
    {
      concord::Communicator::Group group(comm);  // nothing runs before the group ends
      f = comm.allreduce_async("held", concord::TensorView(v));
      EXPECT_FALSE(f.wait_for(0.05));
      EXPECT_FALSE(f.wait_for(0));
      EXPECT_FALSE(f.ready());
    }
    EXPECT_TRUE(f.wait_for(10));
    EXPECT_TRUE(f.ready());
    EXPECT_TRUE(f.wait_for(0));  // finished: true at once
    for (float x : v) EXPECT_EQ(x, 2.0f);
  });
}

// Only rank 0 submits "rank0.only"; CONCORD_STALL_SHUTDOWN_S=1 fails it with TIMEOUT after a
// second. wait_for first says "not yet", then throws the operation's TIMEOUT.
TEST(CppWaitTest, AnOperationThatTimesOutThrowsTimeout) {
  ASSERT_EQ(setenv("CONCORD_STALL_SHUTDOWN_S", "1", 1), 0);  // read at init, before the ranks run
  concord::harness::Latch rank0_done(1);
  RunRanks(2, [&](concord::Communicator& comm) {
    if (comm.rank() != 0) {
      EXPECT_TRUE(rank0_done.Wait());  // keeps this rank's engine up meanwhile
      return;
    }
    std::vector<float> v(3, 1.0f);
    concord::Future f = comm.allreduce_async("rank0.only", concord::TensorView(v));
    EXPECT_FALSE(f.wait_for(0.05));
    try {
      f.wait_for(30);
      ADD_FAILURE() << "an operation only rank 0 submitted succeeded";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_TIMEOUT) << e.what();
      EXPECT_NE(std::string(e.what()).find("stall shutdown"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(f.ready());
    rank0_done.CountDown();
  });
  unsetenv("CONCORD_STALL_SHUTDOWN_S");
}

}  // namespace
