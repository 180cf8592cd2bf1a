// The response cache: responses executed before, each named by a small integer (its bit), so a
// rank whose new request equals one of them sends the bit instead of the request, and the
// coordinator answers with the bit instead of the response when every rank sent it.
//
// Consistency: every rank inserts in the same order (the order in which the shared response list
// is executed), so bit numbers agree everywhere without any exchange. Entries are never evicted or
// changed, so a bit in flight never changes meaning; when the cache is full, new responses simply
// take the full path. Not thread-safe: owned by the engine, used by the thread running its step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/request.h"

namespace concord {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  size_t size() const { return entries_.size(); }

  // The bit of an entry whose response `rank` would have requested exactly `request` for.
  std::optional<uint32_t> Lookup(const TensorRequest& request, int rank) const;

  // Adds a successful response unless it is a barrier, an identical one is cached or the cache
  // is full.
  void Insert(const Response& response);

  // The response behind a bit, or nullptr when no such bit exists.
  const Response* Get(uint32_t bit) const;

 private:
  size_t capacity_;
  std::vector<Response> entries_;
  std::unordered_multimap<std::string, uint32_t> by_name_;
};

}  // namespace concord
