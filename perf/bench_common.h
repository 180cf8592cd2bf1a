// What the perf tools share: failing on a library error, reading integer options, medians and
// percentiles, the slowest rank's figure, and the known data their results are checked on.
#pragma once

#include <errno.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "concord/concord.h"

namespace concord::bench {

// Exits with the library's message when `s` failed (a benchmark has no partial result to keep).
inline void CheckOrExit(const char* tool, concord_comm_t comm, concord_status_t s,
                        const std::string& what) {
  if (s == CONCORD_SUCCESS) return;
  std::fprintf(stderr, "%s: %s failed: %s (%s)\n", tool, what.c_str(), concord_status_string(s),
               concord_comm_last_error(comm));
  std::exit(1);
}

// The value `text` of option `flag` as an integer: the whole of it, decimal, from min to max (atoi
// read "1e3" as 1 and "5abc" as 5; strtoll alone skips leading blanks). Anything else is a usage
// error: `usage`, which must not return, gets "FLAG takes an integer from MIN to MAX, not 'TEXT'".
template <typename UsageError>
long long ParseInteger(const std::string& flag, const std::string& text, long long min,
                       long long max, UsageError&& usage) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' ||
      errno != 0 || x < min || x > max) {
    usage(flag + " takes an integer from " + std::to_string(min) + " to " + std::to_string(max) +
          ", not '" + text + "'");
  }
  return x;
}

// The p-th percentile (0 <= p <= 100), interpolated linearly between the two nearest values; 0
// for none. p = 50 is the median (the mean of the middle two for an even count).
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = (static_cast<double>(v.size()) - 1) * std::clamp(p, 0.0, 100.0) / 100;
  const size_t below = static_cast<size_t>(at);
  if (below + 1 >= v.size()) return v.back();
  return v[below] + (v[below + 1] - v[below]) * (at - static_cast<double>(below));
}

inline double Median(std::vector<double> v) {
  return Percentile(std::move(v), 50);
}

// The maximum of a per-rank value across ranks (an allreduce named `name`).
inline double MaxAcrossRanks(const char* tool, concord_comm_t comm, double value,
                             const std::string& name) {
  int64_t one = 1;
  concord_tensor_t t{&value, CONCORD_FLOAT64, 1, &one, CONCORD_DEVICE_CPU};
  concord_allreduce_opts_t o;
  concord_allreduce_opts_init(&o);
  o.op = CONCORD_MAX;
  CheckOrExit(tool, comm, concord_allreduce(comm, name.c_str(), &t, nullptr, &o),
              "timing reduction");
  return value;
}

// Checked results: after its timed iterations every row of concord-perf runs its operation once
// more on this known data and compares what came back (a benchmark that reports a fast wrong
// result is worse than none). The values are small integers, exact in every dtype.
//
// ReductionInput: what `rank` of `size` contributes at element i of a reduction with `op`. For an
// average every rank gives 1 + i % 5; otherwise one rank per element ((rank + i) % size == 0)
// gives 1 + i % 5 and the others a filler the op ignores (0 for sum and max, 6 for min, 1 for
// product), so that a lost, doubled or misplaced contribution shows. The result of every op is
// ReductionExpected(i).
inline double ReductionExpected(size_t i) {
  return 1.0 + static_cast<double>(i % 5);
}
inline double ReductionInput(concord_reduce_op_t op, int rank, int size, size_t i) {
  if (op == CONCORD_AVERAGE || (static_cast<size_t>(rank) + i) % static_cast<size_t>(size) == 0) {
    return ReductionExpected(i);
  }
  return op == CONCORD_MIN ? 6 : op == CONCORD_PRODUCT ? 1 : 0;
}

// What `rank` holds at element i of an operation that only moves data (allgather, all-to-all,
// broadcast, send/recv): 1 to 11, different for neighbouring ranks and elements.
inline double MoveInput(int rank, size_t i) {
  return 1.0 + static_cast<double>((3 * static_cast<size_t>(rank) + i) % 11);
}

// The first i < count where get(i) differs from want(i) by more than tolerance x |want(i)|, as
// "element I is X, expected Y"; "" when there is none.
template <typename Get, typename Want>
std::string FirstWrongElement(size_t count, Get get, Want want, double tolerance = 0) {
  for (size_t i = 0; i < count; ++i) {
    const double got = get(i), expected = want(i);
    if (!(std::fabs(got - expected) <= tolerance * std::fabs(expected))) {
      char text[128];
      std::snprintf(text, sizeof(text), "element %zu is %g, expected %g", i, got, expected);
      return text;
    }
  }
  return "";
}

}  // namespace concord::bench
