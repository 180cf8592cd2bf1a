#include "core/straggler.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/coordinator.h"
#include "tests/common/comma_locale.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

// Arrivals of one operation: the others by `previous`, `rank` last at `latest` (ms after t0).
Arrivals Late(Clock::time_point t0, int rank, int previous_ms, int latest_ms) {
  Arrivals a;
  a.Note((rank + 1) % 4, t0 + milliseconds(previous_ms));
  a.Note(rank, t0 + milliseconds(latest_ms));
  return a;
}

TEST(ArrivalsTest, KeepsTheLastRankAndTheArrivalBeforeIt) {
  const auto t0 = Clock::now();
  Arrivals a;
  EXPECT_EQ(a.latest_rank, -1);
  a.Note(2, t0);
  EXPECT_EQ(a.previous, t0);  // alone: no wait
  a.Note(0, t0 + milliseconds(5));
  a.Note(1, t0 + milliseconds(9));
  EXPECT_EQ(a.latest_rank, 1);
  EXPECT_EQ(a.previous, t0 + milliseconds(5));
  EXPECT_EQ(a.latest, t0 + milliseconds(9));
  // Merging another name's arrivals: the latest of all stays last, the next latest before it.
  Arrivals b;
  b.Note(3, t0 + milliseconds(7));
  Arrivals merged = a;
  merged.Merge(b);
  EXPECT_EQ(merged.latest_rank, 1);
  EXPECT_EQ(merged.previous, t0 + milliseconds(7));
  b.Note(2, t0 + milliseconds(20));
  merged.Merge(b);
  EXPECT_EQ(merged.latest_rank, 2);
  EXPECT_EQ(merged.previous, t0 + milliseconds(9));
  Arrivals empty;
  merged.Merge(empty);
  EXPECT_EQ(merged.latest_rank, 2);
  empty.Merge(a);
  EXPECT_EQ(empty.latest_rank, 1);
}

TEST(StragglerTrackerTest, NamesTheRankOthersWaitForCountingOverlapsOnce) {
  const auto t0 = Clock::now();
  StragglerTracker tracker(4, milliseconds(1000), t0);
  // 10 steps of 100 ms; in each, rank 3 is 40 ms late for 5 tensors whose waits overlap.
  for (int step = 0; step < 10; ++step) {
    for (int t = 0; t < 5; ++t) {
      tracker.OnReady(Late(t0, 3, 100 * step + t, 100 * step + 40 + t), step + 1);
    }
  }
  EXPECT_FALSE(tracker.Report(t0 + milliseconds(999)));  // the period has not ended
  const auto line = tracker.Report(t0 + milliseconds(1000));
  ASSERT_TRUE(line);
  // Each step's union is 40 + 4 ms (the last tensor's wait ends 4 ms after the first's).
  EXPECT_EQ(*line,
            "rank 3 arrived last for 100% of 50 operations in the last 1.0 s; the others waited "
            "0.440 s for it (44% of the time), 44.0 ms a step over 10 steps");
  // A new period: nothing happened in it.
  EXPECT_FALSE(tracker.Report(t0 + milliseconds(2000)));
}

// The report reaches the log with a decimal point whatever LC_NUMERIC the application set (under
// de_DE it read "in the last 1,0 s; the others waited 0,440 s").
TEST(StragglerTrackerTest, TheReportIsWrittenInTheCLocaleWhateverTheApplicationSet) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  const auto t0 = Clock::now();
  StragglerTracker tracker(4, milliseconds(1000), t0);
  for (int step = 0; step < 10; ++step) {
    for (int t = 0; t < 5; ++t) {
      tracker.OnReady(Late(t0, 3, 100 * step + t, 100 * step + 40 + t), step + 1);
    }
  }
  const auto line = tracker.Report(t0 + milliseconds(1000));
  ASSERT_TRUE(line);
  EXPECT_EQ(*line,
            "rank 3 arrived last for 100% of 50 operations in the last 1.0 s; the others waited "
            "0.440 s for it (44% of the time), 44.0 ms a step over 10 steps");
}

TEST(StragglerTrackerTest, BalancedOrBriefWaitsAreNotReported) {
  const auto t0 = Clock::now();
  {
    // Every rank last in turn, 40 ms each: no rank is last for more than 1.5/4 of them.
    StragglerTracker tracker(4, milliseconds(1000), t0);
    for (int i = 0; i < 20; ++i) tracker.OnReady(Late(t0, i % 4, 50 * i, 50 * i + 40), 0);
    EXPECT_FALSE(tracker.Report(t0 + milliseconds(1000)));
  }
  {
    // Always rank 1, but 1 ms a time: 2% of the period.
    StragglerTracker tracker(4, milliseconds(1000), t0);
    for (int i = 0; i < 20; ++i) tracker.OnReady(Late(t0, 1, 50 * i, 50 * i + 1), 0);
    EXPECT_FALSE(tracker.Report(t0 + milliseconds(1000)));
  }
  {
    // Two ranks: last for 70% is chance enough (the bar is 75%); for 80% it is reported, and
    // unmarked steps say no "a step".
    for (int share : {70, 80}) {
      StragglerTracker tracker(2, milliseconds(1000), t0);
      for (int i = 0; i < 10; ++i) {
        tracker.OnReady(Late(t0, i * 10 < share ? 1 : 0, 100 * i, 100 * i + 30), 0);
      }
      const auto line = tracker.Report(t0 + milliseconds(1000));
      EXPECT_EQ(line.has_value(), share == 80) << share;
      if (line) {
        EXPECT_EQ(line->find("a step"), std::string::npos) << *line;
      }
    }
  }
  {
    // Period zero: never.
    StragglerTracker tracker(4, milliseconds(0), t0);
    tracker.OnReady(Late(t0, 1, 0, 900), 0);
    EXPECT_FALSE(tracker.Report(t0 + milliseconds(100000)));
  }
}

// A rank far later than a period (rank 0 writing a checkpoint while the others wait): the period's
// line counts the wait within the period, never more than the period; the totals keep it whole.
TEST(StragglerTrackerTest, AWaitThatBeganInAnEarlierPeriodCountsFromThePeriodsStart) {
  const auto t0 = Clock::now();
  StragglerTracker tracker(2, milliseconds(1000), t0);
  EXPECT_FALSE(tracker.Report(t0 + milliseconds(1000)));  // nothing ready in the first period
  tracker.OnReady(Late(t0, 1, 500, 1900), 0);             // waited 1.4 s, 0.9 s in this period
  const auto line = tracker.Report(t0 + milliseconds(2000));
  ASSERT_TRUE(line);
  EXPECT_EQ(*line,
            "rank 1 arrived last for 100% of 1 operations in the last 1.0 s; the others waited "
            "0.900 s for it (90% of the time)");
  EXPECT_DOUBLE_EQ(tracker.totals().waited_s[1], 1.4);
}

TEST(StragglerTrackerTest, IgnoresArrivalsOfNoRank) {
  const auto t0 = Clock::now();
  StragglerTracker tracker(2, milliseconds(10), t0);
  tracker.OnReady(Arrivals{}, 0);
  Arrivals outside;
  outside.Note(7, t0);
  tracker.OnReady(outside, 0);
  EXPECT_FALSE(tracker.Report(t0 + milliseconds(10)));
}

// Through the coordinator: full requests and cache bits are charged to the rank whose submission
// made them ready; joins and the finalize barrier are not charged.
TEST(CoordinatorStragglerTest, ChargesTheLastSubmitter) {
  ResponseCache cache(16);
  Coordinator coordinator(3, &cache, StallOptions{}, milliseconds(50));
  const auto t0 = Clock::now();
  TensorRequest w;
  w.name = "w";
  w.shape = {4};
  for (int step = 0; step < 4; ++step) {
    RequestMessage m;
    m.requests = {w};
    m.step = static_cast<uint64_t>(step + 1);
    const auto at = t0 + milliseconds(10 * step);
    ASSERT_TRUE(coordinator.Add(0, m, at).ok());
    ASSERT_TRUE(coordinator.Add(1, m, at + milliseconds(1)).ok());
    ASSERT_TRUE(coordinator.Add(2, m, at + milliseconds(8)).ok());
    auto ready = coordinator.TakeReady(at + milliseconds(8));
    ASSERT_TRUE(ready.ok());
    ASSERT_EQ(ready->items.size(), 1u);
  }
  const auto line = coordinator.StragglerReport(t0 + milliseconds(100));
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("rank 2 arrived last for 100% of 4 operations"), std::string::npos) << *line;
  EXPECT_NE(line->find("0.028 s"), std::string::npos) << *line;  // 4 x 7 ms
  EXPECT_NE(line->find("7.0 ms a step over 4 steps"), std::string::npos) << *line;
}

}  // namespace
}  // namespace concord
