// The response cache: responses executed before, each named by a small integer (its bit, below
// the capacity), so a rank whose new request equals one of them sends the bit instead of the
// request, and the coordinator answers with the bit instead of the response when every rank sent
// it.
//
// Consistency: every rank applies each executed response list (Apply) in the same order, so the
// cache is the same everywhere without any exchange. A list first evicts the entries it names
// (chosen by the coordinator, ChooseVictims: the least recently executed ones no rank is known to
// wait on), then inserts its new responses into the lowest free bits. So a bit can change meaning,
// and the generation tells when: it counts evictions, every request message carries its sender's,
// and a bit evicted after that generation (EvictedAfter) is stale: the coordinator ignores it and
// the sender, which saw the eviction while its bit was in flight (MarkSent), sends that request
// again in full. Not thread-safe: owned by the engine, used by the thread running its step.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "core/message.h"
#include "core/request.h"

namespace concord {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  size_t size() const { return size_; }
  // Evictions so far: the same on every rank that applied the same lists.
  uint64_t generation() const { return generation_; }

  // The bit of an entry whose response `rank` would have requested exactly `request` for.
  std::optional<uint32_t> Lookup(const TensorRequest& request, int rank) const;

  // Adds a successful response, as the most recently executed entry, unless it is a barrier or
  // the cache is full; an identical entry only becomes the most recently executed.
  void Insert(const Response& response);

  // The response behind a bit, or nullptr when no such entry exists.
  const Response* Get(uint32_t bit) const;

  // Whether `bit` was evicted after `generation`: a bit its sender looked up then is stale.
  bool EvictedAfter(uint32_t bit, uint64_t generation) const {
    return bit < evicted_at_.size() && evicted_at_[bit] > generation;
  }

  // --- The coordinator (rank 0's cache, before rank 0 applies `list`) ---
  // How many entries must go for every new response of `list` to fit (it may count more than
  // are needed, never fewer).
  size_t EvictionsNeeded(const ResponseMessage& list) const;
  // Up to `n` bits to evict, least recently executed first among those not set in `keep`,
  // in increasing order.
  std::vector<uint32_t> ChooseVictims(size_t n, const std::vector<uint64_t>& keep) const;

  // --- Every rank ---
  // This rank sent `bit` for a request now in flight.
  void MarkSent(uint32_t bit);
  // Applies an executed list: its cached entries become the most recently executed, its
  // evictions are made, its new responses inserted. Appends to `resend` the names of this rank's
  // requests sent as bits that were evicted before they ran (a response that lists this rank as
  // joined ran none of its requests): they must be sent again in full.
  // kProtocolError when the list names a bit that holds no entry.
  Status Apply(const ResponseMessage& list, int rank, std::vector<std::string>* resend);

 private:
  bool Used(uint32_t bit) const { return bit < used_.size() && used_[bit]; }
  std::optional<uint32_t> Find(const Response& response) const;  // an identical entry
  void Touch(uint32_t bit);
  void Evict(uint32_t bit);

  size_t capacity_;
  size_t size_ = 0;
  uint64_t generation_ = 0;
  // By bit: the entry, whether it holds one, when it was last evicted (a generation; 0: never),
  // whether this rank sent it for a request in flight, and its place in `recency_`.
  std::vector<Response> entries_;
  std::vector<bool> used_;
  std::vector<uint64_t> evicted_at_;
  std::vector<bool> sent_;
  size_t sent_count_ = 0;
  std::vector<std::list<uint32_t>::iterator> position_;
  std::list<uint32_t> recency_;  // entries, least recently executed first
  std::set<uint32_t> free_;      // evicted bits, reused lowest first
  std::unordered_multimap<std::string, uint32_t> by_name_;
};

}  // namespace concord
