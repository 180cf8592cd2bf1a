// Completion state of one enqueued operation, shared (shared_ptr) by the engine, which completes
// it, and the caller's handle, which waits on it. Complete() happens exactly once; the callback
// runs on the completing thread before waiters wake. All methods are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "backends/device_backend.h"
#include "base/clock.h"
#include "base/status.h"

namespace concord {

class RequestState {
 public:
  using Callback = std::function<void(const Status&)>;

  explicit RequestState(Callback callback = nullptr) : callback_(std::move(callback)) {}

  // Sets the final status (first call wins), runs the callback, wakes waiters.
  void Complete(Status status);
  // Waits until complete or the deadline passes; returns whether complete.
  bool Wait(Deadline deadline);
  bool done() const;
  Status status() const;

  // Result of an allgather, set by the engine before Complete(). `owned` holds the data when the
  // caller gave no output buffer.
  struct Output {
    void* data = nullptr;
    size_t bytes = 0;
    int64_t first_dim = 0;
    std::vector<uint8_t> owned;
  };
  Output& output() { return output_; }

  // Bytes this rank put on the wire for the operation (lanes running slices of one add
  // concurrently); read after completion.
  void AddWireBytes(uint64_t bytes) { wire_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t wire_bytes() const { return wire_bytes_.load(std::memory_order_relaxed); }

  // Device operations: the engine hands over the collective's device event once it is launched
  // (before Complete()). WaitLaunched() waits until then, or until the operation completed, or the
  // deadline: it returns the event while the operation may still run on the device, nullptr once
  // it has completed (successfully or not: status() says which), kTimeout at the deadline.
  void SetLaunched(std::shared_ptr<DeviceEvent> event);
  StatusOr<std::shared_ptr<DeviceEvent>> WaitLaunched(Deadline deadline);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool completing_ = false;  // Complete() has been called
  bool done_ = false;        // ... and its callback has returned
  Status status_;
  Callback callback_;
  Output output_;
  std::atomic<uint64_t> wire_bytes_{0};
  std::shared_ptr<DeviceEvent> launched_;
};

}  // namespace concord
