#include "core/straggler.h"

#include <algorithm>
#include <cstdio>

#include "base/c_locale.h"

namespace concord {

void Arrivals::Note(int rank, Clock::time_point now) {
  previous = latest_rank < 0 ? now : latest;
  latest = now;
  latest_rank = rank;
}

void Arrivals::Merge(const Arrivals& other) {
  if (other.latest_rank < 0) return;
  // The later of the two last arrivals stays last; the one before it is the latest of the rest.
  if (latest_rank < 0 || other.latest > latest) {
    const Clock::time_point before =
        latest_rank < 0 ? other.previous : std::max(other.previous, latest);
    *this = other;
    previous = before;
    return;
  }
  previous = std::max(previous, other.latest);
}

StragglerTracker::StragglerTracker(int size, std::chrono::milliseconds period,
                                   Clock::time_point start)
    : size_(size), period_(period), period_start_(start), ranks_(size) {
  totals_.last.assign(static_cast<size_t>(size), 0);
  totals_.waited_s.assign(static_cast<size_t>(size), 0.0);
}

void StragglerTracker::OnReady(const Arrivals& arrivals, uint64_t step) {
  if (arrivals.latest_rank < 0 || arrivals.latest_rank >= size_) return;
  RankPeriod& r = ranks_[arrivals.latest_rank];
  ++operations_;
  ++r.last;
  // Operations become ready about in order of their last arrival: the union grows by what lies
  // beyond what it covers (an operation ready late with an earlier last arrival adds only that).
  const Clock::time_point from = std::max(arrivals.previous, r.covered_until);
  ++totals_.operations;
  ++totals_.last[arrivals.latest_rank];
  if (arrivals.latest > from) {
    totals_.waited_s[arrivals.latest_rank] +=
        std::chrono::duration<double>(arrivals.latest - from).count();
  }
  // The period's figure: only the wait within it (a wait that began in an earlier period, say a
  // rank 90 s late in a 60 s period, would make it more than the period).
  const Clock::time_point period_from = std::max(from, period_start_);
  if (arrivals.latest > period_from) r.waited += arrivals.latest - period_from;
  r.covered_until = std::max(r.covered_until, arrivals.latest);
  if (step != 0) {
    first_step_ = first_step_ == 0 ? step : std::min(first_step_, step);
    last_step_ = std::max(last_step_, step);
  }
}

std::optional<std::string> StragglerTracker::Report(Clock::time_point now) {
  if (period_.count() <= 0 || now - period_start_ < period_) return std::nullopt;
  const double seconds = std::chrono::duration<double>(now - period_start_).count();
  const auto worst = std::max_element(
      ranks_.begin(), ranks_.end(),
      [](const RankPeriod& a, const RankPeriod& b) { return a.waited < b.waited; });
  const double waited = std::chrono::duration<double>(worst->waited).count();
  const double share_last =
      operations_ == 0 ? 0.0 : static_cast<double>(worst->last) / static_cast<double>(operations_);
  const int rank = static_cast<int>(worst - ranks_.begin());
  const uint64_t operations = operations_;
  const uint64_t steps = last_step_ == 0 ? 0 : last_step_ - first_step_ + 1;
  // A new period, whether or not this one is worth a line.
  period_start_ = now;
  operations_ = 0;
  first_step_ = last_step_ = 0;
  for (RankPeriod& r : ranks_) r = RankPeriod{0, {}, r.covered_until};
  if (size_ < 2 || waited < 0.05 * seconds || share_last <= std::min(0.9, 1.5 / size_)) {
    return std::nullopt;
  }
  const ScopedCLocale c_locale;  // "1.5 s", not "1,5 s", whatever the application's LC_NUMERIC
  char line[320];
  int n = std::snprintf(line, sizeof(line),
                        "rank %d arrived last for %.0f%% of %llu operations in the last %.1f s; "
                        "the others waited %.3f s for it (%.0f%% of the time)",
                        rank, 100.0 * share_last, static_cast<unsigned long long>(operations),
                        seconds, waited, 100.0 * waited / seconds);
  if (steps > 0 && n > 0 && static_cast<size_t>(n) < sizeof(line)) {
    std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n),
                  ", %.1f ms a step over %llu steps", 1000.0 * waited / static_cast<double>(steps),
                  static_cast<unsigned long long>(steps));
  }
  return std::string(line);
}

}  // namespace concord
