// Helpers shared by the coordinator's two files (coordinator.cc: matching and readiness;
// coordinator_stalls.cc: what cannot run and why). Internal to core/.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/clock.h"

namespace concord::coordinator_internal {

// Bit `bit` of a rank's bit vector of cache entries.
inline bool TestBit(const std::vector<uint64_t>& v, uint32_t bit) {
  return bit / 64 < v.size() && (v[bit / 64] >> (bit % 64)) & 1u;
}

inline void SetBit(std::vector<uint64_t>& v, uint32_t bit) {
  if (bit / 64 >= v.size()) v.resize(bit / 64 + 1, 0);
  v[bit / 64] |= uint64_t{1} << (bit % 64);
}

inline void ClearBit(std::vector<uint64_t>& v, uint32_t bit) {
  if (bit / 64 < v.size()) v[bit / 64] &= ~(uint64_t{1} << (bit % 64));
}

// "rank 1" or "ranks 0, 2".
inline std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// A duration for messages: "3 s".
inline std::string Seconds(std::chrono::milliseconds d) {
  return FormatSeconds(static_cast<double>(d.count()) / 1000.0);
}

}  // namespace concord::coordinator_internal
