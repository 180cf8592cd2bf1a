// One data-plane lane of an engine: a backend with its own connections, the buffers its batches
// use, and (lanes 1 and up) the worker thread that runs them (core/lane_worker.h).
//
// Contract: owned by the engine. Only the thread running the engine's step touches a lane, or the
// lane's worker while that thread waits for it (Engine::RunOnLanes), so a lane needs no lock.
// Buffers are grown rarely, reused by every batch, and freed after a burst (TrimWindow).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backends/backend.h"
#include "core/lane_worker.h"

namespace concord {

// When a buffer that grows with its needs gives its memory back. The engine ends a response list
// on it after each (EndList). Lists are counted in windows of window() lists; at the end of a
// window whose largest need (Use) was under a quarter of the buffer's capacity, a buffer of at
// least kMinTrimBytes is to be freed. So a burst's memory is given back within two windows of
// smaller lists. When a freed buffer then needs more than a quarter of what it held, the size was
// not a burst but a need that comes back less often than once per window: the window doubles (up
// to kMaxWindow lists). A loop whose sizes repeat every step thus settles after a few steps, and
// then never frees nor grows; a need repeated at least once per window never frees at all (a
// buffer that grows to at most twice its need never holds four times a need repeated).
// Not thread-safe: its buffer's owner's.
class TrimWindow {
 public:
  static constexpr uint32_t kFirstWindow = 64;  // lists
  static constexpr uint32_t kMaxWindow = 8192;  // lists
  static constexpr size_t kMinTrimBytes = size_t{1} << 20;

  // A use that needs `bytes` of a buffer that holds `capacity` bytes (and grows when less).
  void Use(size_t bytes, size_t capacity) {
    peak_ = std::max(peak_, bytes);
    if (bytes > capacity && bytes > trimmed_from_ / 4) {
      if (trimmed_from_ > 0) window_ = std::min(2 * window_, kMaxWindow);
      trimmed_from_ = 0;
    }
  }
  // Ends one response list of a buffer that holds `capacity` bytes: whether to free it now.
  bool EndList(size_t capacity) {
    if (++lists_ < window_) return false;
    const bool trim = capacity >= kMinTrimBytes && peak_ < capacity / 4;
    if (trim) trimmed_from_ = capacity;
    lists_ = 0;
    peak_ = 0;
    return trim;
  }
  uint32_t window() const { return window_; }

 private:
  size_t peak_ = 0;     // the largest need in the current window
  uint32_t lists_ = 0;  // lists ended in the current window
  uint32_t window_ = kFirstWindow;
  size_t trimmed_from_ = 0;  // the capacity freed last, until a need past its quarter
};

// A lane's scratch buffer: it grows to the largest size asked of it, geometrically up to a cap,
// so a job warming up reallocates only a few times, and is freed after a burst (TrimWindow: the
// owner calls EndList() after each response list). Contents are not kept across growth or
// trimming. Not thread-safe: one thread at a time (the lane's, see Lane).
class GrowingBuffer {
 public:
  // At least `bytes` bytes; growth doubles the capacity up to `cap` (more when `bytes` is more).
  uint8_t* Get(size_t bytes, size_t cap) {
    trim_.Use(bytes, capacity_);
    if (bytes > capacity_) Reallocate(std::max<size_t>(bytes, std::min(cap, 2 * capacity_)));
    return data_.get();
  }

  // Ends one response list (no pointer from Get() may be used afterwards): frees the buffer when
  // its TrimWindow says so.
  void EndList() {
    if (!trim_.EndList(capacity_)) return;
    data_.reset();
    capacity_ = 0;
    ++reallocations_;
  }

  size_t capacity() const { return capacity_; }
  // Capacity changes so far: growth counts one, a trim one.
  uint64_t reallocations() const { return reallocations_; }
  uint32_t window() const { return trim_.window(); }

 private:
  // May throw std::bad_alloc, leaving the buffer empty (the engine's RunWork reports it).
  void Reallocate(size_t bytes) {
    data_.reset();  // before the new one: never both at once
    capacity_ = 0;
    ++reallocations_;
    data_.reset(new uint8_t[bytes]);
    capacity_ = bytes;
  }

  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
  TrimWindow trim_;
  uint64_t reallocations_ = 0;
};

struct Lane {
  std::unique_ptr<Backend> backend;    // null once the engine failed
  GrowingBuffer fusion;                // fused batches, encoded tensors, allgather scratch
  GrowingBuffer gather;                // top-k's shares; deterministic mode's received slices
  std::unique_ptr<LaneWorker> worker;  // lanes 1.. only
};

}  // namespace concord
