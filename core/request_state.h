// Completion state of one enqueued operation, shared (shared_ptr) by the engine, which completes
// it, and the caller's handle, which waits on it. Complete() happens exactly once; the callback
// runs on the completing thread before waiters wake. All methods are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/device_backend.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/mutex.h"
#include "base/status.h"
#include "core/metrics.h"
#include "core/result_buffers.h"
#include "core/timeline.h"

namespace concord {

class RequestState {
 public:
  using Callback = std::function<void(const Status&)>;

  explicit RequestState(Callback callback = nullptr) : callback_(std::move(callback)) {}

  // Sets the final status (first call wins), runs the callback, wakes waiters. Inside Concord each
  // request has one owner that completes it once (docs/ARCHITECTURE.md, "Who completes a
  // request"); complete_calls() lets tests check that.
  void Complete(const Status& status) EXCLUDES(mu_);
  int complete_calls() const EXCLUDES(mu_);
  // Waits until complete or the deadline passes; returns whether complete.
  bool Wait(Deadline deadline) EXCLUDES(mu_);
  bool done() const EXCLUDES(mu_);
  Status status() const EXCLUDES(mu_);

  // Result of an allgather, an alltoall or a recv, set by the engine before Complete() (by the
  // thread that completes it; read after completion). `owned` holds the data when the caller gave
  // no output buffer (a block of the engine's ResultBuffers, unwritten until the operation writes
  // it whole); `splits` (alltoall) the rows received from each rank; a recv also sets the
  // received shape and dtype.
  struct Output {
    void* data = nullptr;
    size_t bytes = 0;
    int64_t first_dim = 0;
    ResultBuffers::Block owned;
    std::vector<int64_t> splits;
    std::vector<int64_t> shape;
    DType dtype = DType::kUint8;
  };
  Output& output() { return output_; }

  // Bytes this rank put on the wire for the operation (lanes running slices of one add
  // concurrently); read after completion.
  void AddWireBytes(uint64_t bytes) { wire_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t wire_bytes() const { return wire_bytes_.load(std::memory_order_relaxed); }

  // Metering (core/metrics.h): set once by the engine before the request is queued; Complete()
  // then records the operation into `metrics` (before waiters wake), with its phases measured
  // from `enqueued` and MarkNegotiated().
  // `from_output`: the bytes and dtype are the output's at completion (a recv of any shape).
  void Meter(std::shared_ptr<Metrics> metrics, const char* op, DType dtype, uint64_t bytes,
             Clock::time_point enqueued, bool from_output = false);
  // The same, for a timeline that is on (core/timeline.h): Complete() records the phases of the
  // operation on tensor `name` into it as well. After Meter().
  void Trace(std::shared_ptr<Timeline> timeline, std::string name);
  // The engine took the request out of its queue to run it: negotiation ends here. `last_rank`
  // and `last_wait_us`: the rank the coordinator waited for last and how long (ResponseItem).
  void MarkNegotiated(int32_t last_rank = -1, uint32_t last_wait_us = 0) {
    last_rank_.store(last_rank, std::memory_order_relaxed);
    last_wait_us_.store(last_wait_us, std::memory_order_relaxed);
    negotiated_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  // Its batch started running (a lane took it up, its device launch began, or the coordinator's
  // inline result is being applied): the time queued behind other batches ends here. The first
  // call counts (lanes running pieces of one operation each call it).
  void MarkStarted() {
    Clock::rep none = 0;
    started_.compare_exchange_strong(none, Clock::now().time_since_epoch().count(),
                                     std::memory_order_relaxed);
  }

  // Device operations: the engine hands over the collective's device event once it is launched
  // (before Complete()). WaitLaunched() waits until then, or until the operation completed, or the
  // deadline: it returns the event while the operation may still run on the device, nullptr once
  // it has completed (successfully or not: status() says which), kTimeout at the deadline.
  void SetLaunched(std::shared_ptr<DeviceEvent> event) EXCLUDES(mu_);
  StatusOr<std::shared_ptr<DeviceEvent>> WaitLaunched(Deadline deadline) EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  CondVar cv_;
  bool completing_ GUARDED_BY(mu_) = false;  // Complete() has been called
  // ... and its callback has returned: set under mu_ (for the waiters on cv_), read by done()
  // without it (a waiter that drives asks after every poll).
  std::atomic<bool> done_{false};
  int complete_calls_ GUARDED_BY(mu_) = 0;
  Status status_ GUARDED_BY(mu_);
  Callback callback_ GUARDED_BY(mu_);
  Output output_;
  std::atomic<uint64_t> wire_bytes_{0};
  std::shared_ptr<DeviceEvent> launched_ GUARDED_BY(mu_);
  // Metering; written by Meter() before the request is shared with another thread.
  std::shared_ptr<Metrics> metrics_;
  std::shared_ptr<Timeline> timeline_;
  std::string name_;  // for the timeline
  OpSample sample_;
  Clock::time_point enqueued_{};
  bool from_output_ = false;
  std::atomic<Clock::rep> negotiated_{0};  // 0: not yet
  std::atomic<Clock::rep> started_{0};     // 0: not yet
  std::atomic<int32_t> last_rank_{-1};
  std::atomic<uint32_t> last_wait_us_{0};
};

}  // namespace concord
