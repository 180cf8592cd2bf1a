// A rank whose concord_init fails must not leave the others waiting out CONCORD_TIMEOUT_S for
// keys and connections that will never come: they must fail promptly, naming the rank and why.
// After the control plane connected (here: a rank's point-to-point transport cannot listen on the
// CONCORD_HOST it was given), the failing rank closes its control-plane connection; before that
// (rank 0's metrics port taken, or its control plane unable to bind; another rank's metrics port
// taken), it publishes its failure in the store, where the others wait. Ranks are forked children
// over a file store; each writes what its init returned, and how long it took, to a file; the
// parent kills them after the timeout and 10 s more, so that no test hangs.
#include <concord/concord.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "tests/common/forked_ranks.h"
#include "tests/common/taken_port.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

constexpr int kTimeoutS = 6;
// For failures before the control plane is up: a timeout long enough that waiting it out shows.
constexpr int kLongTimeoutS = 20;
constexpr milliseconds kWellUnderLongTimeout{5000};
// An address no interface of this host has (TEST-NET-1, RFC 5737): binding to it fails at once.
constexpr char kUnbindableHost[] = "192.0.2.1";

// What makes the failing rank's init fail: an environment variable it has and the others have not.
struct Fault {
  std::string name;
  std::string value;
};

// Its CONCORD_HOST unbindable: the control plane cannot listen on rank 0, another rank's
// point-to-point transport cannot on another rank (which connected its control plane first).
Fault UnbindableHost() {
  return Fault{"CONCORD_HOST", kUnbindableHost};
}

// Its metrics port taken (`port`, which the test holds): rank R serves on CONCORD_METRICS_PORT
// plus its local rank, which is R with every rank on this host.
Fault MetricsPortTaken(int rank, int port) {
  return Fault{"CONCORD_METRICS_PORT", std::to_string(port - rank)};
}

struct RankResult {
  int code = -1;         // concord_init's status; -1: the rank wrote nothing
  milliseconds took{0};  // how long concord_init took
  std::string error;     // its last error
};

// One rank: concord_init (with `fault` set when given), then a barrier on success; writes
// "code took_ms error" to `out`. Returns the child's exit status, 0.
int RunRank(int rank, int size, int timeout_s, const Fault* fault, const std::string& store,
            const std::string& out) {
  ::clearenv();
  ::setenv("CONCORD_STORE", store.c_str(), 1);
  ::setenv("CONCORD_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("CONCORD_SIZE", std::to_string(size).c_str(), 1);
  ::setenv("CONCORD_TIMEOUT_S", std::to_string(timeout_s).c_str(), 1);
  ::setenv("CONCORD_LOG_LEVEL", "0", 1);
  if (fault != nullptr) ::setenv(fault->name.c_str(), fault->value.c_str(), 1);
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

// Runs a job of `size` ranks in which rank `bad` has `fault`; returns every rank's result.
std::vector<RankResult> RunJob(int size, int bad, const Fault& fault, int timeout_s = kTimeoutS) {
  char dir[] = "/tmp/concord-startup-failure.XXXXXX";
  EXPECT_NE(::mkdtemp(dir), nullptr);
  const std::string store = std::string("file://") + dir + "/store";
  // This process runs no other thread now.
  harness::RunForkedRanks(
      size,
      [&](int rank) {
        return RunRank(rank, size, timeout_s, rank == bad ? &fault : nullptr, store,
                       std::string(dir) + "/rank" + std::to_string(rank));
      },
      milliseconds((timeout_s + 10) * 1000));
  std::vector<RankResult> results(static_cast<size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    std::ifstream file(std::string(dir) + "/rank" + std::to_string(rank));
    long long took = 0;
    RankResult& r = results[rank];
    if (file >> r.code >> took) {
      r.took = milliseconds(took);
      file.get();  // the space before the error
      std::getline(file, r.error);
    }
  }
  EXPECT_EQ(std::system(("rm -rf " + std::string(dir)).c_str()), 0);
  return results;
}

// Within a third of the timeout: the others learnt of the failure, they did not time out.
constexpr milliseconds kPromptly{kTimeoutS * 1000 / 3};

TEST(StartupFailureTest, RankZeroLearnsAtOnceThatRankOneFailedToStart) {
  const std::vector<RankResult> r = RunJob(2, 1, UnbindableHost());
  EXPECT_NE(r[1].code, -1);
  EXPECT_NE(r[1].code, CONCORD_SUCCESS);
  EXPECT_NE(r[1].error.find(kUnbindableHost), std::string::npos) << r[1].error;
  EXPECT_NE(r[0].code, CONCORD_SUCCESS);
  EXPECT_NE(r[0].code, -1);
  EXPECT_LT(r[0].took.count(), kPromptly.count()) << r[0].error;
  // Rank 1 failed after its control plane was up, and published its failure before its
  // connections closed: rank 0's error leads with it. Rank 1's own error is its own, not that
  // failure told back as a peer's.
  EXPECT_NE(r[1].code, CONCORD_ERR_PEER_FAILURE) << r[1].error;
  EXPECT_EQ(r[0].error.rfind("PEER_FAILURE: rank 1 failed to start", 0), 0u) << r[0].error;
  EXPECT_NE(r[0].error.find(kUnbindableHost), std::string::npos) << r[0].error;
  EXPECT_NE(r[0].error.find("rank 1 closed its connection"), std::string::npos) << r[0].error;
}

// Rank 2 fails after its control plane is up: rank 0 learns of it through its connection, rank 1
// through rank 0's, which closes when rank 0's start fails (or, when rank 1 had not reached rank
// 0's point-to-point listener yet, through the refused connection to rank 0; or, when its own
// control plane was not up yet, through the failure rank 2 published).
TEST(StartupFailureTest, EveryRankLearnsAtOnceThatAnotherFailedToStart) {
  const std::vector<RankResult> r = RunJob(3, 2, UnbindableHost());
  EXPECT_NE(r[2].code, CONCORD_SUCCESS);
  EXPECT_NE(r[2].code, -1);
  EXPECT_NE(r[2].code, CONCORD_ERR_PEER_FAILURE) << r[2].error;
  for (int rank : {0, 1}) {
    EXPECT_NE(r[rank].code, CONCORD_SUCCESS) << "rank " << rank;
    EXPECT_NE(r[rank].code, -1) << "rank " << rank;
    EXPECT_LT(r[rank].took.count(), kPromptly.count()) << "rank " << rank << ": " << r[rank].error;
  }
  EXPECT_NE(r[0].error.find("rank 2 closed its connection"), std::string::npos) << r[0].error;
  // Both lead with rank 2's own failure, published before its connections closed.
  for (int rank : {0, 1}) {
    EXPECT_EQ(r[rank].error.rfind("PEER_FAILURE: rank 2 failed to start", 0), 0u) << r[rank].error;
    EXPECT_NE(r[rank].error.find(kUnbindableHost), std::string::npos) << r[rank].error;
  }
}

// Rank 0's metrics port is taken: its init fails before it publishes the job settings, which the
// others wait for. They must fail at once, naming rank 0 and the port, not after the timeout.
TEST(StartupFailureTest, EveryRankLearnsAtOnceThatRankZerosMetricsPortIsTaken) {
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const harness::TakenPort taken;
    ASSERT_NE(taken.port(), 0);
    const std::string port = std::to_string(taken.port());
    const std::vector<RankResult> r =
        RunJob(size, 0, MetricsPortTaken(0, taken.port()), kLongTimeoutS);
    EXPECT_EQ(r[0].code, CONCORD_ERR_UNAVAILABLE) << r[0].error;
    EXPECT_NE(r[0].error.find(port), std::string::npos) << r[0].error;
    for (int rank = 1; rank < size; ++rank) {
      EXPECT_EQ(r[rank].code, CONCORD_ERR_PEER_FAILURE) << "rank " << rank << ": " << r[rank].error;
      EXPECT_LT(r[rank].took.count(), kWellUnderLongTimeout.count()) << "rank " << rank;
      EXPECT_NE(r[rank].error.find("rank 0 failed to start: UNAVAILABLE: CONCORD_METRICS_PORT"),
                std::string::npos)
          << "rank " << rank << ": " << r[rank].error;
      EXPECT_NE(r[rank].error.find(port), std::string::npos)
          << "rank " << rank << ": " << r[rank].error;
    }
  }
}

// Rank 0 publishes the job settings, then its control plane cannot listen: the others, waiting
// for its address, must fail at once naming rank 0 and why.
TEST(StartupFailureTest, EveryRankLearnsAtOnceThatRankZerosControlPlaneCannotListen) {
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const std::vector<RankResult> r = RunJob(size, 0, UnbindableHost(), kLongTimeoutS);
    EXPECT_NE(r[0].code, CONCORD_SUCCESS);
    EXPECT_NE(r[0].code, -1);
    for (int rank = 1; rank < size; ++rank) {
      EXPECT_EQ(r[rank].code, CONCORD_ERR_PEER_FAILURE) << "rank " << rank << ": " << r[rank].error;
      EXPECT_LT(r[rank].took.count(), kWellUnderLongTimeout.count()) << "rank " << rank;
      EXPECT_NE(r[rank].error.find("rank 0 failed to start"), std::string::npos)
          << "rank " << rank << ": " << r[rank].error;
      EXPECT_NE(r[rank].error.find(kUnbindableHost), std::string::npos)
          << "rank " << rank << ": " << r[rank].error;
    }
  }
}

// The last rank's metrics port is taken: rank 0, waiting for its control-plane connection, must
// fail at once naming it and the port; with three ranks, rank 1 too. However rank 1's start ends
// (the published failure seen in a wait; rank 0's connection closed once connected to it; the
// connection to rank 0 refused, rank 0 gone first), it comes after the published failure, since
// rank 0 fails only on that: its error is PEER_FAILURE and starts with it.
TEST(StartupFailureTest, EveryRankLearnsAtOnceThatAnotherRanksMetricsPortIsTaken) {
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const int bad = size - 1;
    const harness::TakenPort taken;
    ASSERT_NE(taken.port(), 0);
    const std::string port = std::to_string(taken.port());
    const std::vector<RankResult> r =
        RunJob(size, bad, MetricsPortTaken(bad, taken.port()), kLongTimeoutS);
    EXPECT_EQ(r[bad].code, CONCORD_ERR_UNAVAILABLE) << r[bad].error;
    const std::string failed = "PEER_FAILURE: rank " + std::to_string(bad) +
                               " failed to start: UNAVAILABLE: CONCORD_METRICS_PORT";
    for (int rank = 0; rank < bad; ++rank) {
      EXPECT_EQ(r[rank].code, CONCORD_ERR_PEER_FAILURE) << "rank " << rank << ": " << r[rank].error;
      EXPECT_LT(r[rank].took.count(), kWellUnderLongTimeout.count()) << "rank " << rank;
      EXPECT_EQ(r[rank].error.rfind(failed, 0), 0u) << "rank " << rank << ": " << r[rank].error;
      EXPECT_NE(r[rank].error.find(port), std::string::npos)
          << "rank " << rank << ": " << r[rank].error;
    }
  }
}

}  // namespace
}  // namespace concord
