#include "core/result_buffers.h"

#include <utility>

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
      if (it->capacity >= bytes && it->capacity / 2 <= bytes &&
          (best == kept_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != kept_.end()) {
      Block block(std::move(best->memory), best->capacity, bytes, weak_from_this());
      kept_bytes_ -= best->capacity;
      kept_.erase(best);
      return block;
    }
  }
  // new T[n] for a byte type leaves the bytes unwritten: no pass over memory about to be filled.
  return Block(std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes, bytes, weak_from_this());
}

void ResultBuffers::Keep(std::unique_ptr<uint8_t[]> memory, size_t capacity) {
  if (capacity < kMinKeptBytes || capacity > kMaxKeptBytes) return;
  std::deque<Kept> dropped;  // freed outside the lock
  MutexLock lock(mu_);
  kept_.push_back({std::move(memory), capacity});
  kept_bytes_ += capacity;
  while (kept_.size() > kMaxKept || kept_bytes_ > kMaxKeptBytes) {
    kept_bytes_ -= kept_.front().capacity;
    dropped.push_back(std::move(kept_.front()));
    kept_.pop_front();
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

}  // namespace concord
