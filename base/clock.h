// Monotonic time and deadlines. A Deadline is a point on the steady clock; Infinite() never passes.
// Value type, thread-compatible.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "base/c_locale.h"

namespace concord {

using Clock = std::chrono::steady_clock;

// Seconds (a configuration value) as whole milliseconds, rounded to nearest.
inline std::chrono::milliseconds MillisFromSeconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

// A duration for messages: "3 s", "0.25 s" (at most 6 significant digits; a decimal point
// whatever the application's locale).
inline std::string FormatSeconds(double seconds) {
  const ScopedCLocale c_locale;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", seconds);
  return buf;
}

class Deadline {
 public:
  static Deadline After(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  static Deadline Infinite() { return Deadline(Clock::time_point::max()); }
  bool infinite() const { return at_ == Clock::time_point::max(); }
  bool passed() const { return !infinite() && Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }
  // Milliseconds left, rounded up, clamped to [0, INT32_MAX]; -1 when infinite (poll's convention).
  int PollTimeoutMs() const;
  Deadline Earlier(const Deadline& other) const { return other.at_ < at_ ? other : *this; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

inline int Deadline::PollTimeoutMs() const {
  if (infinite()) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(at_ - Clock::now());
  if (left.count() <= 0) return 0;
  const int64_t ms = (left.count() + 999) / 1000;
  return ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms);
}

}  // namespace concord
