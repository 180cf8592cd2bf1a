// A rank whose concord_init fails on a setting only it has makes every rank's init fail at once
// (it publishes its failure in the store), and when every rank calls concord_init again in the
// same process, the retries must meet: every rank counts its communicators in the store (the Nth
// on every rank shares a key prefix), and every rank's failed init counted, so the retries meet
// under the next prefix, where nothing of the failed init is to be read (not even by the rank that
// failed). Two ranks in forked children over a file store; the bad rank's first init has the bad
// value, its second not. Each child tries twice at most; the parent kills them after 20 s so
// that no test hangs.
#include <concord/concord.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/clock.h"
#include "tests/common/forked_ranks.h"
#include "tests/common/taken_port.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

constexpr int kTimeoutS = 3;
// Every rank's first init fails (the bad rank's on its bad value, the others' with it) and its
// second meets the others': a third would hide a retry that read what the first left behind.
constexpr int kAttempts = 2;

// One rank: concord_init until it succeeds (at most kAttempts), `bad_name`=`bad_value` set for
// rank `bad_rank`'s first attempt only; then a barrier on the communicator. Returns the child's
// exit status: 0 on success.
int RunRank(int rank, const std::string& store, int bad_rank, const std::string& bad_name,
            const std::string& bad_value) {
  ::clearenv();
  ::setenv("CONCORD_STORE", store.c_str(), 1);
  ::setenv("CONCORD_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("CONCORD_SIZE", "2", 1);
  ::setenv("CONCORD_TIMEOUT_S", std::to_string(kTimeoutS).c_str(), 1);
  ::setenv("CONCORD_LOG_LEVEL", "0", 1);
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (rank == bad_rank && attempt == 0) {
      ::setenv(bad_name.c_str(), bad_value.c_str(), 1);
    } else {
      ::unsetenv(bad_name.c_str());
    }
    concord_comm_t comm = nullptr;
    if (concord_init(&comm) != CONCORD_SUCCESS) {
      std::fprintf(stderr, "rank %d attempt %d: %s\n", rank, attempt,
                   concord_comm_last_error(nullptr));
      continue;
    }
    const concord_status_t s = concord_barrier(comm);
    concord_finalize(comm);
    return s == CONCORD_SUCCESS ? 0 : 1;
  }
  return 1;
}

// Starts both ranks and waits for them: true when both succeeded. *elapsed: until the last one
// ended.
bool RunJob(int bad_rank, const std::string& bad_name, const std::string& bad_value,
            milliseconds* elapsed) {
  char dir[] = "/tmp/concord-init-retry.XXXXXX";
  EXPECT_NE(::mkdtemp(dir), nullptr);
  const std::string store = std::string("file://") + dir;
  const auto start = Clock::now();
  // This process runs no other thread now.
  const std::vector<int> statuses = harness::RunForkedRanks(
      2, [&](int rank) { return RunRank(rank, store, bad_rank, bad_name, bad_value); },
      milliseconds(20000));
  bool ok = true;
  for (int status : statuses) ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  *elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_EQ(std::system(("rm -rf " + std::string(dir)).c_str()), 0);
  return ok;
}

// Rank 1's first init finds that its CONCORD_LANES differs from rank 0's, and rank 0's first fails
// with it; their second ones meet.
TEST(InitRetryTest, RetryAfterAJobSettingMismatchMeetsTheOthers) {
  milliseconds elapsed{0};
  EXPECT_TRUE(RunJob(1, "CONCORD_LANES", "3", &elapsed));
  EXPECT_LT(elapsed, milliseconds(kTimeoutS * 1000)) << "the ranks met only after a timeout";
}

// Rank 1's first init names a network interface that does not exist.
TEST(InitRetryTest, RetryAfterABadInterfaceMeetsTheOthers) {
  milliseconds elapsed{0};
  EXPECT_TRUE(RunJob(1, "CONCORD_IFACE", "concord-no-such-if0", &elapsed));
  EXPECT_LT(elapsed, milliseconds(kTimeoutS * 1000)) << "the ranks met only after a timeout";
}

// Rank 0's first init finds its metrics port taken, before it publishes the job settings; rank 1's
// first fails with it. Rank 0's second must not read its first one's failure, and meets rank 1's.
TEST(InitRetryTest, RetryAfterRankZeroFailedToStartMeetsTheOthers) {
  const harness::TakenPort taken;
  ASSERT_NE(taken.port(), 0);
  milliseconds elapsed{0};
  EXPECT_TRUE(RunJob(0, "CONCORD_METRICS_PORT", std::to_string(taken.port()), &elapsed));
  EXPECT_LT(elapsed, milliseconds(kTimeoutS * 1000)) << "the ranks met only after a timeout";
}

}  // namespace
}  // namespace concord
