#include "core/result_buffers.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace concord {

ResultBuffers::Block::~Block() {
  Release();
}

ResultBuffers::Block& ResultBuffers::Block::operator=(Block&& other) noexcept {
  if (this != &other) {
    Release();
    memory_ = std::move(other.memory_);
    capacity_ = std::exchange(other.capacity_, 0);
    size_ = std::exchange(other.size_, 0);
    pool_ = std::move(other.pool_);
  }
  return *this;
}

void ResultBuffers::Block::Release() {
  if (!memory_) return;
  if (std::shared_ptr<ResultBuffers> pool = pool_.lock()) {
    try {
      pool->Keep(std::move(memory_), capacity_);
    } catch (...) {
      // Out of memory for the list: the block is freed instead (Keep's argument owned it).
    }
  }
  memory_.reset();
  capacity_ = size_ = 0;
}

ResultBuffers::Block ResultBuffers::Take(size_t bytes) {
  if (bytes == 0) return Block();
  {
    MutexLock lock(mu_);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (Serves(it->capacity, bytes) && (best == kept_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != kept_.end()) {
      Block block(std::move(best->memory), best->capacity, bytes, weak_from_this());
      kept_bytes_ -= best->capacity;
      kept_.erase(best);
      return block;
    }
    for (size_t capacity : freed_idle_) {
      if (Serves(capacity, bytes)) {  // freed too early: wait longer from now on
        idle_window_ = std::min(2 * idle_window_, kMaxIdleWindow);
        freed_idle_.fill(0);
        break;
      }
    }
  }
  // new T[n] for a byte type leaves the bytes unwritten: no pass over memory about to be filled.
  return Block(std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes, bytes, weak_from_this());
}

void ResultBuffers::Keep(std::unique_ptr<uint8_t[]> memory, size_t capacity) {
  if (capacity < kMinKeptBytes || capacity > kMaxKeptBytes) return;
  std::vector<Kept> dropped;  // freed outside the lock (a vector: no allocation while empty)
  MutexLock lock(mu_);
  kept_.push_back({std::move(memory), capacity, lists_});
  kept_bytes_ += capacity;
  while (kept_.size() > kMaxKept || kept_bytes_ > kMaxKeptBytes) {
    kept_bytes_ -= kept_.front().capacity;
    dropped.push_back(std::move(kept_.front()));
    kept_.pop_front();
  }
}

void ResultBuffers::EndList() {
  // Allocates nothing (it runs after every list, outside any handler of std::bad_alloc): a block
  // idle that long is freed under the lock, which nothing waits for then.
  MutexLock lock(mu_);
  ++lists_;
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (lists_ - it->since < idle_window_) {
      ++it;
      continue;
    }
    kept_bytes_ -= it->capacity;
    freed_idle_[freed_idle_next_++ % freed_idle_.size()] = it->capacity;
    it = kept_.erase(it);
  }
}

size_t ResultBuffers::kept() const {
  MutexLock lock(mu_);
  return kept_.size();
}

size_t ResultBuffers::kept_bytes() const {
  MutexLock lock(mu_);
  return kept_bytes_;
}

uint64_t ResultBuffers::idle_window() const {
  MutexLock lock(mu_);
  return idle_window_;
}

}  // namespace concord
