// The TCP control plane's setup against a misconfigured job: ranks as threads over 127.0.0.1,
// rendezvousing through a HashStore.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "backends/tcp_control_plane.h"
#include "base/clock.h"
#include "rendezvous/hash_store.h"
#include "tests/common/comma_locale.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

TcpControlPlaneOptions Options(int rank, int size) {
  TcpControlPlaneOptions o;
  o.rank = rank;
  o.size = size;
  o.prefix = "job/comm0";
  o.connect_timeout = milliseconds(5000);
  o.liveness_timeout = milliseconds(5000);
  return o;
}

// Rank 1 counts 3 ranks, rank 0 counts 2: rank 0 refuses it and fails at once, naming the rank
// and both sizes, instead of waiting out its timeout and calling rank 1 missing.
TEST(TcpControlPlaneSetupTest, ASizeMismatchFailsRankZeroAtOnce) {
  HashStore store;
  Status one = Status::Ok();
  std::thread rank1([&] { one = CreateTcpControlPlane(Options(1, 3), &store).status(); });
  const auto start = Clock::now();
  const Status zero = CreateTcpControlPlane(Options(0, 2), &store).status();
  const auto took = Clock::now() - start;
  rank1.join();
  EXPECT_EQ(one.code(), Code::kInvalidArgument) << one.ToString();
  EXPECT_EQ(zero.code(), Code::kInvalidArgument) << zero.ToString();
  EXPECT_NE(zero.message().find("rank 1 connected to rank 0 for a job of 3 ranks, but rank 0's "
                                "has 2"),
            std::string::npos)
      << zero.message();
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(took).count(), 2000) << zero.ToString();
}

// Rank 1 never comes: rank 0's timeout names its connect timeout with a decimal point whatever
// LC_NUMERIC the application set (under de_DE it read "within 0,25 s").
TEST(TcpControlPlaneSetupTest, TheTimeoutIsWrittenInTheCLocaleWhateverTheApplicationSet) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  HashStore store;
  TcpControlPlaneOptions o = Options(0, 2);
  o.connect_timeout = milliseconds(250);
  const Status zero = CreateTcpControlPlane(o, &store).status();
  EXPECT_EQ(zero.code(), Code::kTimeout) << zero.ToString();
  EXPECT_NE(zero.message().find("only 0 of 1 ranks connected to rank 0 within 0.25 s (missing: 1)"),
            std::string::npos)
      << zero.message();
}

}  // namespace
}  // namespace concord
