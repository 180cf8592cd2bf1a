#include "core/response_cache.h"

#include <algorithm>

namespace concord {

namespace {

// Only successful responses are cached, and never barriers: they carry a fresh sequence-numbered
// name each time, so caching them would only fill the cache with entries nobody asks for again.
// Nor responses with joined ranks: they hold while those ranks wait in concord_join only.
// Nor alltoalls with uneven splits: a mixture of experts routes different counts every call, so
// each would be a new entry nobody asks for again, pushing out the allreduces that are; an even
// alltoall (every split equal) repeats like an allreduce and is cached.
bool Cacheable(const Response& response) {
  if (response.error != Code::kOk || response.request.op == OpType::kBarrier ||
      !response.joined.empty()) {
    return false;
  }
  const std::vector<int64_t>& s = response.splits;
  return response.request.op != OpType::kAlltoall ||
         std::all_of(s.begin(), s.end(), [&s](int64_t c) { return c == s.front(); });
}

}  // namespace

std::optional<uint32_t> ResponseCache::Lookup(const TensorRequest& request, int rank) const {
  auto range = by_name_.equal_range(request.name);
  for (auto it = range.first; it != range.second; ++it) {
    if (entries_[it->second].IsRequestOf(request, rank)) return it->second;
  }
  return std::nullopt;
}

std::optional<uint32_t> ResponseCache::Find(const Response& response) const {
  auto range = by_name_.equal_range(response.request.name);
  for (auto it = range.first; it != range.second; ++it) {
    const Response& e = entries_[it->second];
    if (e.request == response.request && e.first_dims == response.first_dims &&
        e.splits == response.splits) {
      return it->second;
    }
  }
  return std::nullopt;
}

void ResponseCache::Insert(const Response& response) {
  if (!Cacheable(response)) return;
  if (auto same = Find(response)) return Touch(*same);
  if (size_ >= capacity_) return;
  uint32_t bit;
  if (free_.empty()) {
    bit = static_cast<uint32_t>(entries_.size());
    entries_.push_back(response);
    used_.push_back(true);
    evicted_at_.push_back(0);
    sent_.push_back(false);
    position_.emplace_back();
  } else {
    bit = *free_.begin();
    free_.erase(free_.begin());
    entries_[bit] = response;
    used_[bit] = true;
  }
  position_[bit] = recency_.insert(recency_.end(), bit);
  by_name_.emplace(response.request.name, bit);
  ++size_;
}

const Response* ResponseCache::Get(uint32_t bit) const {
  return Used(bit) ? &entries_[bit] : nullptr;
}

size_t ResponseCache::EvictionsNeeded(const ResponseMessage& list) const {
  // Responses new to the cache; two equal ones in one list (which the coordinator never sends)
  // would be counted twice.
  size_t fresh = 0;
  for (const auto& item : list.items) {
    if (!item.cached && Cacheable(item.response) && !Find(item.response)) ++fresh;
  }
  const size_t room = capacity_ - size_;
  return fresh > room ? fresh - room : 0;
}

std::vector<uint32_t> ResponseCache::ChooseVictims(size_t n,
                                                   const std::vector<uint64_t>& keep) const {
  std::vector<uint32_t> victims;
  for (auto it = recency_.begin(); it != recency_.end() && victims.size() < n; ++it) {
    const uint32_t bit = *it;
    if (bit / 64 < keep.size() && (keep[bit / 64] >> (bit % 64)) & 1u) continue;
    victims.push_back(bit);
  }
  std::sort(victims.begin(), victims.end());
  return victims;
}

void ResponseCache::MarkSent(uint32_t bit) {
  if (!Used(bit) || sent_[bit]) return;
  sent_[bit] = true;
  ++sent_count_;
}

void ResponseCache::Touch(uint32_t bit) {
  recency_.splice(recency_.end(), recency_, position_[bit]);
}

void ResponseCache::Evict(uint32_t bit) {
  auto range = by_name_.equal_range(entries_[bit].request.name);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == bit) {
      by_name_.erase(it);
      break;
    }
  }
  recency_.erase(position_[bit]);
  entries_[bit] = Response();
  used_[bit] = false;
  evicted_at_[bit] = ++generation_;
  free_.insert(bit);
  --size_;
}

Status ResponseCache::Apply(const ResponseMessage& list, int rank,
                            std::vector<std::string>* resend) {
  auto unknown = [](uint32_t bit) {
    return ProtocolError("response list names cache entry " + std::to_string(bit) +
                         ", which does not exist");
  };
  // What ran is no longer in flight on this rank: a cached entry by its bit, a full response by
  // its name (a bit the coordinator expanded into its request returns as a full response). A
  // response that lists this rank as joined ran without a request of this rank's: a bit this
  // rank sent for the name since its join is still in flight (Engine::TakeEntries leaves its
  // entry queued), and must be sent again if evicted before it runs.
  for (const auto& item : list.items) {
    if (item.cached) {
      if (!Used(item.bit)) return unknown(item.bit);
      if (sent_[item.bit]) {
        sent_[item.bit] = false;
        --sent_count_;
      }
      Touch(item.bit);
    } else if (sent_count_ > 0 && item.response.AppliesTo(rank) && !item.response.Joined(rank)) {
      auto range = by_name_.equal_range(item.response.request.name);
      for (auto it = range.first; it != range.second; ++it) {
        if (sent_[it->second]) {
          sent_[it->second] = false;
          --sent_count_;
        }
      }
    }
  }
  for (uint32_t bit : list.evictions) {
    if (!Used(bit)) return unknown(bit);
    if (sent_[bit]) {
      resend->push_back(entries_[bit].request.name);
      sent_[bit] = false;
      --sent_count_;
    }
    Evict(bit);
  }
  for (const auto& item : list.items) {
    if (!item.cached) Insert(item.response);
  }
  return Status::Ok();
}

}  // namespace concord
