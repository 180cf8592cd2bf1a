// A rank whose concord_init fails after the control plane connected (here: its point-to-point
// transport cannot listen on the CONCORD_HOST it was given) closes its control-plane connection;
// the other ranks must learn of it at once and fail their init naming the rank, not wait out
// CONCORD_TIMEOUT_S for its keys and connections. Ranks are forked children over a file store;
// each writes what its init returned, and how long it took, to a file; the parent kills them
// after 20 s so that no test hangs.
#include <concord/concord.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "tests/common/forked_ranks.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

constexpr int kTimeoutS = 6;
// An address no interface of this host has (TEST-NET-1, RFC 5737): binding to it fails at once.
constexpr char kUnbindableHost[] = "192.0.2.1";

struct RankResult {
  int code = -1;         // concord_init's status; -1: the rank wrote nothing
  milliseconds took{0};  // how long concord_init took
  std::string error;     // its last error
};

// One rank: concord_init (with CONCORD_HOST unbindable when `bad`), then a barrier on success;
// writes "code took_ms error" to `out`. Returns the child's exit status, 0.
int RunRank(int rank, int size, bool bad, const std::string& store, const std::string& out) {
  ::clearenv();
  ::setenv("CONCORD_STORE", store.c_str(), 1);
  ::setenv("CONCORD_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("CONCORD_SIZE", std::to_string(size).c_str(), 1);
  ::setenv("CONCORD_TIMEOUT_S", std::to_string(kTimeoutS).c_str(), 1);
  ::setenv("CONCORD_LOG_LEVEL", "0", 1);
  if (bad) ::setenv("CONCORD_HOST", kUnbindableHost, 1);
  const auto start = Clock::now();
  concord_comm_t comm = nullptr;
  const concord_status_t s = concord_init(&comm);
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  std::ofstream file(out);
  file << static_cast<int>(s) << " " << took.count() << " "
       << (s == CONCORD_SUCCESS ? "" : concord_comm_last_error(nullptr)) << "\n";
  file.close();
  if (s == CONCORD_SUCCESS) {
    (void)concord_barrier(comm);
    concord_finalize(comm);
  }
  return 0;
}

// Runs a job of `size` ranks in which rank `bad` fails its init; returns every rank's result.
std::vector<RankResult> RunJob(int size, int bad) {
  char dir[] = "/tmp/concord-startup-failure.XXXXXX";
  EXPECT_NE(::mkdtemp(dir), nullptr);
  const std::string store = std::string("file://") + dir + "/store";
  // This process runs no other thread now.
  harness::RunForkedRanks(
      size,
      [&](int rank) {
        return RunRank(rank, size, rank == bad, store,
                       std::string(dir) + "/rank" + std::to_string(rank));
      },
      milliseconds(20000));
  std::vector<RankResult> results(static_cast<size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    std::ifstream file(std::string(dir) + "/rank" + std::to_string(rank));
    long long took = 0;
    RankResult& r = results[rank];
    if (file >> r.code >> took) {
      r.took = milliseconds(took);
      std::getline(file, r.error);
    }
  }
  EXPECT_EQ(std::system(("rm -rf " + std::string(dir)).c_str()), 0);
  return results;
}

// Within a third of the timeout: the others learnt of the failure, they did not time out.
constexpr milliseconds kPromptly{kTimeoutS * 1000 / 3};

TEST(StartupFailureTest, RankZeroLearnsAtOnceThatRankOneFailedToStart) {
  const std::vector<RankResult> r = RunJob(2, 1);
  EXPECT_NE(r[1].code, -1);
  EXPECT_NE(r[1].code, CONCORD_SUCCESS);
  EXPECT_NE(r[1].error.find(kUnbindableHost), std::string::npos) << r[1].error;
  EXPECT_NE(r[0].code, CONCORD_SUCCESS);
  EXPECT_NE(r[0].code, -1);
  EXPECT_LT(r[0].took.count(), kPromptly.count()) << r[0].error;
  EXPECT_NE(r[0].error.find("rank 1 closed its connection"), std::string::npos) << r[0].error;
}

// Rank 2 fails: rank 0 learns of it through its connection, rank 1 through rank 0's, which
// closes when rank 0's start fails (or, when rank 1 had not reached rank 0's point-to-point
// listener yet, through the refused connection to rank 0).
TEST(StartupFailureTest, EveryRankLearnsAtOnceThatAnotherFailedToStart) {
  const std::vector<RankResult> r = RunJob(3, 2);
  EXPECT_NE(r[2].code, CONCORD_SUCCESS);
  EXPECT_NE(r[2].code, -1);
  for (int rank : {0, 1}) {
    EXPECT_NE(r[rank].code, CONCORD_SUCCESS) << "rank " << rank;
    EXPECT_NE(r[rank].code, -1) << "rank " << rank;
    EXPECT_LT(r[rank].took.count(), kPromptly.count()) << "rank " << rank << ": " << r[rank].error;
  }
  EXPECT_NE(r[0].error.find("rank 2 closed its connection"), std::string::npos) << r[0].error;
  EXPECT_TRUE(r[1].error.find("rank 0 closed its connection") != std::string::npos ||
              r[1].error.find("point-to-point connection to rank 0") != std::string::npos)
      << r[1].error;
}

}  // namespace
}  // namespace concord
