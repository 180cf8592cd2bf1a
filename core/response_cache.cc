#include "core/response_cache.h"

namespace concord {

std::optional<uint32_t> ResponseCache::Lookup(const TensorRequest& request, int rank) const {
  auto range = by_name_.equal_range(request.name);
  for (auto it = range.first; it != range.second; ++it) {
    if (entries_[it->second].IsRequestOf(request, rank)) return it->second;
  }
  return std::nullopt;
}

void ResponseCache::Insert(const Response& response) {
  // Barriers carry a fresh sequence-numbered name each time: caching them would only fill the
  // cache with entries nobody asks for again.
  if (response.error != Code::kOk || response.request.op == OpType::kBarrier ||
      entries_.size() >= capacity_) {
    return;
  }
  auto range = by_name_.equal_range(response.request.name);
  for (auto it = range.first; it != range.second; ++it) {
    const Response& e = entries_[it->second];
    if (e.request == response.request && e.first_dims == response.first_dims) return;
  }
  const auto bit = static_cast<uint32_t>(entries_.size());
  entries_.push_back(response);
  by_name_.emplace(response.request.name, bit);
}

const Response* ResponseCache::Get(uint32_t bit) const {
  return bit < entries_.size() ? &entries_[bit] : nullptr;
}

}  // namespace concord
