// The straggler report: which rank the others wait for, from the arrival times the coordinator
// sees (CONCORD_STRAGGLER_REPORT_S).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"

namespace concord {

// Cumulative figures since the start: per rank, the operations it arrived last for and the
// union of the time the others waited for it (seconds). Value type.
struct StragglerTotals {
  uint64_t operations = 0;
  std::vector<uint64_t> last;
  std::vector<double> waited_s;
};

// When an operation's submissions reached the coordinator: the last one (its rank) and the one
// before it. The others waited for the last rank from `previous` to `latest`. Value type.
struct Arrivals {
  Clock::time_point latest{};
  Clock::time_point previous{};
  int latest_rank = -1;  // -1: nothing arrived yet

  void Note(int rank, Clock::time_point now);
  // Both operations' submissions as one (the coordinator merges a name's cache bits).
  void Merge(const Arrivals& other);
};

// Attributes each ready operation's wait to the rank that arrived last: the others waited for it
// from the previous arrival to its own. Per rank and per period it keeps how often the rank was
// last and the union of the times the others waited for it (the waits of one step's operations
// overlap: a rank that starts a step 40 ms late is 40 ms late for each of its tensors, and the
// step waits 40 ms, not 40 ms per tensor), within the period: a wait that began in an earlier one
// counts from the period's start (the totals keep it whole). At the end of each period Report()
// names the rank the others waited for most, when that is worth a line: at least 5% of the period,
// and last for more than 1.5/size of the operations (75% at 2 ranks; uniform lateness is 1/size).
// Pure logic (no I/O, no threads); not thread-safe, owned by the coordinator.
class StragglerTracker {
 public:
  // `period` zero: never reports (OnReady still counts).
  StragglerTracker(int size, std::chrono::milliseconds period, Clock::time_point start);

  // An operation of `step` (0 when the application marks no steps) became ready.
  void OnReady(const Arrivals& arrivals, uint64_t step);

  // The report line of the period that ended at or before `now` (nothing when no period ended or
  // none is worth a line); a new period starts when one ended.
  std::optional<std::string> Report(Clock::time_point now);

  // Since the start (periods do not reset them).
  const StragglerTotals& totals() const { return totals_; }

 private:
  struct RankPeriod {
    uint64_t last = 0;                  // operations it arrived last for
    Clock::duration waited{};           // union of the others' waits for it
    Clock::time_point covered_until{};  // end of that union so far
  };

  const int size_;
  const std::chrono::milliseconds period_;
  Clock::time_point period_start_;
  std::vector<RankPeriod> ranks_;
  uint64_t operations_ = 0;  // ready in this period
  uint64_t first_step_ = 0;  // steps seen in this period (0 and 0: none marked)
  uint64_t last_step_ = 0;
  StragglerTotals totals_;
};

}  // namespace concord
