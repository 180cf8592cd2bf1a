// Memory for the results that requests own: an allgather, gather or all-to-all given no output
// buffer, a recv that takes the sender's shape, a joined rank's stand-in tensors. Each result is
// read by the application and freed with its request, and the next step asks for the same sizes
// again. Fresh memory costs far more than the copy it receives: a 64 MiB allocation is a new
// mapping whose every page faults on first touch (an owned 64 MiB all-to-all, 2 ranks, shared
// memory: 50 ms against 8.5 ms into the caller's buffer). So freed blocks are kept for reuse.
#pragma once

#include <array>
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
// A kept block nobody took for idle_window() response lists (EndList(), which the engine calls
// after each) is freed too, so a burst of large results does not stay for the communicator's
// life. When a block freed that way would have served a later Take(), it was needed after all (a
// result asked for less often than once per window): the window doubles, up to kMaxIdleWindow
// lists, so a loop that asks for the same results every step settles without allocating.
// Thread-safe: Take() and EndList() from the engine's threads, a block's destruction from
// whichever thread frees its request.
class ResultBuffers : public std::enable_shared_from_this<ResultBuffers> {
 public:
  static constexpr size_t kMaxKept = 8;
  static constexpr size_t kMaxKeptBytes = size_t{512} << 20;
  // A block smaller than this is not kept: the heap serves it without a new mapping.
  static constexpr size_t kMinKeptBytes = size_t{64} << 10;
  static constexpr uint64_t kFirstIdleWindow = 256;  // response lists
  static constexpr uint64_t kMaxIdleWindow = 65536;

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

  // One response list ended: frees the blocks kept idle for idle_window() lists.
  void EndList() EXCLUDES(mu_);

  // Blocks kept now and their bytes, and the idle window (for tests).
  size_t kept() const EXCLUDES(mu_);
  size_t kept_bytes() const EXCLUDES(mu_);
  uint64_t idle_window() const EXCLUDES(mu_);

 private:
  struct Kept {
    std::unique_ptr<uint8_t[]> memory;
    size_t capacity;
    uint64_t since;  // lists_ when it was kept
  };
  void Keep(std::unique_ptr<uint8_t[]> memory, size_t capacity) EXCLUDES(mu_);
  // Whether a block of `capacity` bytes serves a Take() of `bytes`.
  static bool Serves(size_t capacity, size_t bytes) {
    return capacity >= bytes && capacity / 2 <= bytes;
  }

  mutable Mutex mu_;
  std::deque<Kept> kept_ GUARDED_BY(mu_);  // oldest first
  size_t kept_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t lists_ GUARDED_BY(mu_) = 0;  // EndList() calls so far
  uint64_t idle_window_ GUARDED_BY(mu_) = kFirstIdleWindow;
  // The capacities of the last blocks EndList() freed since the window last doubled (0: none).
  std::array<size_t, kMaxKept> freed_idle_ GUARDED_BY(mu_){};
  size_t freed_idle_next_ GUARDED_BY(mu_) = 0;
};

}  // namespace concord
