#include "backends/gloo/allreduce_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace concord {
namespace gloo_internal {
namespace {

// The slot counter restarts from 0 past this value (identically on every rank).
constexpr int kSlotWrap = 1 << 30;

}  // namespace

size_t ObjectEntryBytes(AllreduceAlgorithm algorithm, size_t count, DType dtype) {
  const size_t data = count * DTypeSize(dtype);
  switch (algorithm) {
    case AllreduceAlgorithm::kRing:
    case AllreduceAlgorithm::kRingChunked:
      return 3 * data;
    case AllreduceAlgorithm::kHalvingDoubling:
    case AllreduceAlgorithm::kBcube:
      return 2 * data;
    case AllreduceAlgorithm::kFunction:
      return 0;
  }
  return 0;
}

AllreduceCache::AllreduceCache(std::shared_ptr<GlooContext> object_context,
                               std::shared_ptr<GlooContext> function_context, size_t max_entries,
                               size_t max_bytes)
    : object_context_(std::move(object_context)),
      function_context_(std::move(function_context)),
      max_entries_(std::max<size_t>(max_entries, 1)),
      max_bytes_(max_bytes) {}

void AllreduceCache::Run(AllreduceAlgorithm algorithm, void* data, size_t count, DType dtype,
                         ReduceOp op) {
  // Average reduces as a sum: share the entry.
  const ReduceOp key_op = WireReduceOp(op);
  if (algorithm == AllreduceAlgorithm::kFunction) return RunFunction(data, count, dtype, key_op);
  const size_t bytes = count * DTypeSize(dtype);
  Entry& entry =
      Lookup(Key{algorithm, count, dtype, key_op}, ObjectEntryBytes(algorithm, count, dtype));
  if (!entry.allreduce) {
    entry.owned.resize(bytes);
    Build(entry, entry.owned.data());
  }
  std::memcpy(entry.owned.data(), data, bytes);
  entry.allreduce->Run();
  std::memcpy(data, entry.owned.data(), bytes);
}

void AllreduceCache::RunFunction(void* data, size_t count, DType dtype, ReduceOp op) {
  const FunctionKey key{data, count, dtype, op};
  auto found = function_index_.find(key);
  if (found != function_index_.end()) {
    function_lru_.splice(function_lru_.begin(), function_lru_, found->second);
  } else {
    if (function_lru_.size() >= max_entries_) {
      function_index_.erase(function_lru_.back().key);
      function_lru_.pop_back();
    }
    function_lru_.push_front(
        FunctionEntry{key, MakeBoundAllreduce(function_context_, AllreduceAlgorithm::kFunction,
                                              data, count, dtype, op)});
    function_index_[key] = function_lru_.begin();
    ++builds_;
  }
  function_lru_.front().allreduce->Run();
}

AllreduceCache::Entry& AllreduceCache::Lookup(const Key& key, size_t bytes) {
  auto found = index_.find(key);
  if (found != index_.end()) {
    lru_.splice(lru_.begin(), lru_, found->second);
    return lru_.front();
  }
  EvictUntilFits(bytes);
  lru_.emplace_front();
  Entry& entry = lru_.front();
  entry.key = key;
  entry.bytes = bytes;
  index_[key] = lru_.begin();
  bytes_ += bytes;
  return entry;
}

void AllreduceCache::Build(Entry& entry, void* data) {
  entry.allreduce.reset();
  entry.bound = nullptr;
  if (object_context_->next_slot() > kSlotWrap) object_context_->set_next_slot(0);
  const auto& [algorithm, count, dtype, op] = entry.key;
  const auto& context =
      algorithm == AllreduceAlgorithm::kFunction ? function_context_ : object_context_;
  entry.allreduce = MakeBoundAllreduce(context, algorithm, data, count, dtype, op);
  entry.bound = data;
  ++builds_;
}

void AllreduceCache::EvictUntilFits(size_t incoming_bytes) {
  while (!lru_.empty() && (lru_.size() >= max_entries_ || bytes_ + incoming_bytes > max_bytes_)) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

}  // namespace gloo_internal
}  // namespace concord
