// One data-plane lane of an engine: a backend with its own connections, the buffers its batches
// use, and (lanes 1 and up) the worker thread that runs them (core/lane_worker.h).
//
// Contract: owned by the engine. Only the thread running the engine's step touches a lane, or the
// lane's worker while that thread waits for it (Engine::RunOnLanes), so a lane needs no lock.
// Buffers are grown rarely, never shrunk, and reused by every batch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backends/backend.h"
#include "core/lane_worker.h"

namespace concord {

// A buffer that grows to the largest size asked of it, geometrically up to a cap, so a job
// warming up reallocates only a few times. Contents are not kept across growth.
class GrowingBuffer {
 public:
  // At least `bytes` bytes; growth doubles the capacity up to `cap` (more when `bytes` is more).
  uint8_t* Get(size_t bytes, size_t cap) {
    if (bytes > capacity_) {
      capacity_ = std::max<size_t>(bytes, std::min(cap, 2 * capacity_));
      data_.reset(new uint8_t[capacity_]);
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
};

struct Lane {
  std::unique_ptr<Backend> backend;    // null once the engine failed
  GrowingBuffer fusion;                // fused batches, encoded tensors, allgather scratch
  GrowingBuffer gather;                // top-k's shares; deterministic mode's received slices
  std::unique_ptr<LaneWorker> worker;  // lanes 1.. only
};

}  // namespace concord
