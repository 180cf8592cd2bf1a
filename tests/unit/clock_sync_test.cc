// The clock offsets of the timeline (core/clock_sync.h): the estimator against simulated clocks
// (a skewed clock, asymmetric delays: the estimate is within its bound of the true offset), the
// sync over the TCP point-to-point transport with ranks as threads whose clocks are skewed, a
// rank that does not take part (a deadline, no hang), and the offset in the timeline's metadata.
#include "core/clock_sync.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <future>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "core/timeline.h"
#include "tests/common/comma_locale.h"
#include "tests/unit/tcp_p2p_mesh.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

// Rank 0's clock is the true time; the peer's reads true time plus `skew_ns`. Each round: the ping
// takes `out_ns`, the peer reads its clock `think_ns` after the ping arrived, the reply takes
// `back_ns`; every reading is truncated to `tick_ns`.
ClockRound Simulate(int64_t at_ns, int64_t skew_ns, int64_t out_ns, int64_t think_ns,
                    int64_t back_ns, int64_t tick_ns) {
  auto read = [tick_ns](int64_t t) { return t - t % tick_ns; };
  ClockRound r;
  r.t0_ns = read(at_ns);
  r.remote_ns = read(at_ns + out_ns + think_ns + skew_ns);
  r.t1_ns = read(at_ns + out_ns + think_ns + back_ns);
  return r;
}

TEST(ClockSyncTest, EstimateIsWithinItsBoundOfTheTrueOffset) {
  std::mt19937_64 random(42);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t skew_ns =
        std::uniform_int_distribution<int64_t>(-5'000'000'000, 5'000'000'000)(random);
    // Asymmetric: the way out is up to a millisecond, the way back up to 20 us.
    std::uniform_int_distribution<int64_t> out(1'000, 1'000'000), back(1'000, 20'000),
        think(0, 50'000);
    const int64_t tick_ns = trial % 2 ? 1 : 1'000;
    std::vector<ClockRound> rounds;
    int64_t at_ns = 1'800'000'000'000'000'000;
    for (int k = 0; k < 8; ++k) {
      rounds.push_back(Simulate(at_ns, skew_ns, out(random), think(random), back(random), tick_ns));
      at_ns += 5'000'000;
    }
    const std::optional<ClockOffset> e = EstimateClockOffset(rounds);
    ASSERT_TRUE(e);
    const double truth_us = static_cast<double>(skew_ns) / 1e3;
    // A reading truncated to a tick moves each of the three by less than one tick.
    const double tick_us = static_cast<double>(tick_ns) / 1e3;
    EXPECT_LE(std::fabs(e->offset_us - truth_us), e->error_us + 2 * tick_us)
        << "trial " << trial << ": offset " << e->offset_us << " error " << e->error_us;
    int64_t shortest = INT64_MAX;
    for (const ClockRound& r : rounds) shortest = std::min(shortest, r.t1_ns - r.t0_ns);
    EXPECT_EQ(e->error_us, static_cast<double>((shortest + 1) / 2) / 1e3) << "trial " << trial;
  }
}

TEST(ClockSyncTest, TheShortestRoundTripWinsAndBadRoundsAreSkipped) {
  // True offset 1000 ns. Round 1: 400 ns out, 0 back (error 200 ns, estimate off by 200);
  // round 2: 50 ns each way (error 50 ns, exact); round 3: t1 before t0 (a clock stepped back).
  const std::vector<ClockRound> rounds = {{0, 1400, 400}, {10'000, 11'050, 10'100}, {500, 0, 400}};
  const std::optional<ClockOffset> e = EstimateClockOffset(rounds);
  ASSERT_TRUE(e);
  EXPECT_DOUBLE_EQ(e->offset_us, 1.0);
  EXPECT_DOUBLE_EQ(e->error_us, 0.05);
  EXPECT_FALSE(EstimateClockOffset({}));
  EXPECT_FALSE(EstimateClockOffset({{500, 0, 400}}));
}

TEST(ClockSyncTest, ReadingsAtTheEndsOfInt64NeitherOverflowNorWin) {
  // A round trip from INT64_MIN to INT64_MAX is the longest there is, not -1 ns: the 10 ns one
  // wins (true offset 1000 ns).
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  std::optional<ClockOffset> e = EstimateClockOffset({{lo, 0, hi}, {0, 1005, 10}});
  ASSERT_TRUE(e);
  EXPECT_DOUBLE_EQ(e->offset_us, 1.0);
  EXPECT_DOUBLE_EQ(e->error_us, 0.005);
  e = EstimateClockOffset({{lo, 0, hi}});
  ASSERT_TRUE(e);
  EXPECT_DOUBLE_EQ(e->offset_us, 0.001);  // the midpoint is -1 ns
  EXPECT_DOUBLE_EQ(e->error_us, 9223372036854775.808);
  // A peer whose clock reads INT64_MIN is about 3e11 s behind rank 0's, not ahead.
  const int64_t now = 1'800'000'000'000'000'000;
  e = EstimateClockOffset({{now, lo, now + 1000}});
  ASSERT_TRUE(e);
  EXPECT_DOUBLE_EQ(e->offset_us, (static_cast<double>(lo) - static_cast<double>(now + 500)) / 1e3);
  EXPECT_DOUBLE_EQ(e->error_us, 0.5);
}

// Two ranks over TCP whose rank 1's clock answers INT64_MIN: rank 0's result and rank 1's.
std::pair<ClockSyncResult, ClockSyncResult> SyncWithAGarbageClock() {
  auto ranks = TcpP2pMesh(2);
  EXPECT_EQ(ranks.size(), 2u);
  if (ranks.size() != 2) return {};
  ClockSyncOptions o;
  o.deadline = Deadline::After(milliseconds(10000));
  ClockSyncOptions garbage = o;
  garbage.clock = [] { return std::numeric_limits<int64_t>::min(); };
  auto one = std::async(std::launch::async, [&] { return SyncClock(*ranks[1], garbage); });
  ClockSyncResult zero = SyncClock(*ranks[0], o);
  return {std::move(zero), one.get()};
}

TEST(ClockSyncTest, APeerWhoseClockAnswersGarbageGetsNoOffset) {
  const auto [zero, other] = SyncWithAGarbageClock();
  EXPECT_EQ(zero.status.code(), Code::kUnavailable);
  EXPECT_NE(zero.status.message().find("rank 1: "), std::string::npos) << zero.status.ToString();
  EXPECT_NE(zero.status.message().find("int64"), std::string::npos) << zero.status.ToString();
  EXPECT_FALSE(other.offset) << other.offset->offset_us;
  EXPECT_EQ(other.status.code(), Code::kUnavailable) << other.status.ToString();
}

// The garbage clock's reading in that error has a decimal point whatever LC_NUMERIC the
// application set (under de_DE it read "a clock reading -1,1e+10 s off rank 0's").
TEST(ClockSyncTest, AGarbageReadingIsWrittenInTheCLocaleWhateverTheApplicationSet) {
  const harness::CommaLocale comma;  // before the transport's threads start
  if (!comma.active()) GTEST_SKIP() << comma.why();
  const ClockSyncResult zero = SyncWithAGarbageClock().first;
  // About -1.1e+10 s: INT64_MIN ns minus rank 0's system clock (the digits follow the date).
  const std::string& message = zero.status.message();
  const std::string before = "a clock reading -1.1", after = "e+10 s off rank 0's";
  const size_t at = message.find(before);
  ASSERT_NE(at, std::string::npos) << message;
  const size_t end = message.find(after, at);
  ASSERT_NE(end, std::string::npos) << message;
  const std::string digits = message.substr(at + before.size(), end - at - before.size());
  EXPECT_EQ(digits.find_first_not_of("0123456789"), std::string::npos) << message;
}

TEST(ClockSyncTest, SkewedRanksGetTheirOffsetsOverTheTransport) {
  auto ranks = TcpP2pMesh(3);
  ASSERT_EQ(ranks.size(), 3u);
  const int64_t skews_ns[] = {0, 3'000'000'000, -1'500'000'000};
  std::vector<std::future<ClockSyncResult>> results;
  for (int r = 0; r < 3; ++r) {
    results.push_back(std::async(std::launch::async, [&, r] {
      ClockSyncOptions o;
      o.deadline = Deadline::After(milliseconds(10000));
      o.clock = [skew = skews_ns[r]] { return SystemClockNs() + skew; };
      return SyncClock(*ranks[r], o);
    }));
  }
  for (int r = 0; r < 3; ++r) {
    const ClockSyncResult got = results[r].get();
    EXPECT_TRUE(got.status.ok()) << got.status.ToString();
    ASSERT_TRUE(got.offset) << "rank " << r;
    const double truth_us = static_cast<double>(skews_ns[r]) / 1e3;
    EXPECT_LE(std::fabs(got.offset->offset_us - truth_us), got.offset->error_us + 1e-3)
        << "rank " << r << ": " << got.offset->offset_us << " +- " << got.offset->error_us;
    EXPECT_LT(got.offset->error_us, 100'000) << "rank " << r;  // loopback round trips
    if (r == 0) {
      EXPECT_EQ(got.offset->error_us, 0);
    }
  }
}

TEST(ClockSyncTest, ARankThatDoesNotTakePartCostsTheDeadlineNotAHang) {
  auto ranks = TcpP2pMesh(3);
  ASSERT_EQ(ranks.size(), 3u);
  ClockSyncOptions o;
  o.deadline = Deadline::After(milliseconds(300));
  // Rank 1 never answers; rank 2 does, but rank 0 reaches it only after the deadline passed.
  auto two = std::async(std::launch::async, [&] { return SyncClock(*ranks[2], o); });
  const auto began = Clock::now();
  const ClockSyncResult zero = SyncClock(*ranks[0], o);
  const ClockSyncResult other = two.get();
  EXPECT_LT(Clock::now() - began, milliseconds(5000));
  ASSERT_TRUE(zero.offset);  // rank 0's own offset is 0 whatever happened to the others
  EXPECT_EQ(zero.offset->offset_us, 0);
  EXPECT_EQ(zero.status.code(), Code::kUnavailable);
  EXPECT_NE(zero.status.message().find("rank 1: "), std::string::npos) << zero.status.ToString();
  EXPECT_FALSE(other.offset);
  EXPECT_FALSE(other.status.ok());
  EXPECT_NE(other.status.message().find("measuring this rank's clock offset from rank 0's"),
            std::string::npos)
      << other.status.ToString();
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ClockSyncTest, TheTimelineRecordsTheOffsetOnlyWhenGiven) {
  const std::string base = ::testing::TempDir() + "/clock_sync_test_" + std::to_string(::getpid());
  for (bool with : {true, false}) {
    Timeline timeline(1, 2, [](const std::string&) {});
    auto file = OpenTimelineFile(base, 1, "test");
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    std::optional<ClockOffset> clock;
    if (with) clock = ClockOffset{-2500000.25, 31.5};
    ASSERT_TRUE(timeline.Start(std::move(*file), clock).ok());
    timeline.Stop();
    const std::string text = Read(base + ".rank1");
    if (with) {
      EXPECT_NE(text.find("\"concord_start_us\":"), std::string::npos) << text;
      EXPECT_NE(text.find(",\"concord_clock_offset_us\":-2500000.250,"
                          "\"concord_clock_error_us\":31.500}}"),
                std::string::npos)
          << text;
    } else {
      EXPECT_EQ(text.find("concord_clock"), std::string::npos) << text;
    }
  }
  std::remove((base + ".rank1").c_str());
}

}  // namespace
}  // namespace concord
