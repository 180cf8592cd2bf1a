// Memory for the results that requests own: an allgather, gather or all-to-all given no output
// buffer, a recv that takes the sender's shape, a joined rank's stand-in tensors. Each result is
// read by the application and freed with its request, and the next step asks for the same sizes
// again. Fresh memory costs far more than the copy it receives: a 64 MiB allocation is a new
// mapping whose every page faults on first touch (an owned 64 MiB all-to-all, 2 ranks, shared
// memory: 50 ms against 8.5 ms into the caller's buffer). So freed blocks are kept for reuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

#include "base/mutex.h"

namespace concord {

// A pool of result blocks, shared (shared_ptr) by the engine that takes blocks from it and by the
// blocks it handed out, which return to it when freed (a block that outlives the pool is simply
// freed). Keeps at most kMaxKept blocks of at most kMaxKeptBytes in all, dropping the oldest.
// Thread-safe: Take() from the engine's threads, a block's destruction from whichever thread
// frees its request.
class ResultBuffers : public std::enable_shared_from_this<ResultBuffers> {
 public:
  static constexpr size_t kMaxKept = 8;
  static constexpr size_t kMaxKeptBytes = size_t{512} << 20;
  // A block smaller than this is not kept: the heap serves it without a new mapping.
  static constexpr size_t kMinKeptBytes = size_t{64} << 10;

  // `bytes` bytes of memory, unwritten (their contents are whatever the block held). Move-only.
  class Block {
   public:
    Block() = default;
    ~Block();
    Block(Block&& other) noexcept { *this = std::move(other); }
    Block& operator=(Block&& other) noexcept;
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;

    uint8_t* data() const { return memory_.get(); }
    size_t size() const { return size_; }

   private:
    friend class ResultBuffers;
    Block(std::unique_ptr<uint8_t[]> memory, size_t capacity, size_t size,
          std::weak_ptr<ResultBuffers> pool)
        : memory_(std::move(memory)), capacity_(capacity), size_(size), pool_(std::move(pool)) {}
    void Release();

    std::unique_ptr<uint8_t[]> memory_;
    size_t capacity_ = 0;
    size_t size_ = 0;
    std::weak_ptr<ResultBuffers> pool_;
  };

  // A kept block that holds `bytes` without wasting more than half of it (the smallest such),
  // else new memory. Empty (null data) for 0 bytes.
  Block Take(size_t bytes) EXCLUDES(mu_);

  // Blocks kept now and their bytes (for tests).
  size_t kept() const EXCLUDES(mu_);
  size_t kept_bytes() const EXCLUDES(mu_);

 private:
  struct Kept {
    std::unique_ptr<uint8_t[]> memory;
    size_t capacity;
  };
  void Keep(std::unique_ptr<uint8_t[]> memory, size_t capacity) EXCLUDES(mu_);

  mutable Mutex mu_;
  std::deque<Kept> kept_ GUARDED_BY(mu_);  // oldest first
  size_t kept_bytes_ GUARDED_BY(mu_) = 0;
};

}  // namespace concord
