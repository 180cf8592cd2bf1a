// An in-process, asynchronous fake of a device backend (backends/device_backend.h) for engine
// tests: ranks are threads, "device memory" is host memory, and one worker thread plays the GPUs
// and the network. A collective completes on that worker thread, a configurable delay after every
// rank has launched it, so the engine's asynchronous device path runs on the CPU.
//
// Stand-ins for CUDA objects: a ready stream given with a tensor is a FakeStream*, a ready event a
// FakeEvent* (the operation reads its inputs only once the event is set and the collectives the
// stream waited for when the operation was enqueued have finished: CaptureReady() makes a
// FakeReady, and the engine passes only that on); StreamWait() takes a FakeStream* and records
// there that the stream must wait for the collective.
//
// Contract: as DeviceBackend's (completions in launch order, on the worker thread, never inside
// Launch(); a collective past its deadline fails with kTimeout and breaks the world, failing every
// other rank's collectives in flight with kPeerFailure). A stalled rank's launches are accepted
// but never take part, as if its GPU or its peer link hung: only its own Abort() ends them. The
// world must outlive its backends (hold it in a shared_ptr); all methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/device_backend.h"

namespace concord {

// Set by a producer once the tensor's data is written.
struct FakeEvent {
  std::atomic<bool> set{false};
};

// Records the collectives a stream was made to wait for.
struct FakeStream {
  std::mutex mu;
  std::vector<std::shared_ptr<std::atomic<bool>>> waits;  // each: the collective has finished
  // True when every collective the stream waits for has finished.
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& w : waits) {
      if (!w->load()) return false;
    }
    return true;
  }
};

// CaptureReady()'s: the event given, and the collectives the stream given was waiting for then
// (those it is made to wait for later are not waited for, as CUDA work queued on a stream after
// the capture is not).
struct FakeReady {
  FakeEvent* event = nullptr;
  std::vector<std::shared_ptr<std::atomic<bool>>> stream_waits;
  std::thread::id captured_on;
  bool Ready() const {
    if (event != nullptr && !event->set.load()) return false;
    for (const auto& w : stream_waits) {
      if (!w->load()) return false;
    }
    return true;
  }
};

class InProcDeviceWorld {
 public:
  // The fake CUDA devices that exist: ids 0 .. kDevices - 1.
  static constexpr int kDevices = 2;

  InProcDeviceWorld(int size, std::chrono::milliseconds delay);
  ~InProcDeviceWorld();
  InProcDeviceWorld(const InProcDeviceWorld&) = delete;
  InProcDeviceWorld& operator=(const InProcDeviceWorld&) = delete;

  std::unique_ptr<DeviceBackend> MakeBackend(int rank, int device);
  // From now on `rank`'s launches never take part in a collective.
  void Stall(int rank);
  // Collectives completed successfully (counted once per collective, not per rank).
  uint64_t completed();
  // CopyLocal() calls of every rank so far.
  uint64_t copies() const { return copies_.load(); }
  // The threads CaptureReady() was called on, every rank's, in call order.
  std::vector<std::thread::id> capture_threads();

 private:
  friend class InProcDeviceBackend;
  struct Pending {
    DeviceCollective collective;
    DeviceBackend::Done done;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  struct RankState {
    std::deque<Pending> queue;  // launched, not yet completed, in launch order
    bool stalled = false;
    bool running = false;  // the worker is completing this rank's front collective
    Status aborted;        // set by Abort(): later launches fail with it
  };

  void Loop();
  // Whether every rank's front collective is ready to run (launched, not stalled, inputs ready).
  bool FrontsReady() const;
  // Computes the collective at every rank's front into its outputs; false when they mismatch.
  bool Compute(const std::vector<Pending*>& fronts);
  // Fails what is queued: `rank`'s with `status`, every other rank's with kPeerFailure. Needs mu_;
  // returns the callbacks to run once it is released.
  std::vector<std::function<void()>> Break(int rank, const Status& status);

  const int size_;
  const std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankState> ranks_;
  uint64_t completed_ = 0;
  int delivering_ = 0;  // the worker is calling callbacks that Break() took (outside mu_)
  std::atomic<uint64_t> copies_{0};
  // Every capture, kept for the world's life: a launched collective reads its FakeReady on the
  // worker thread, after the engine has let go of it (a CUDA event's wait is issued in Launch()).
  std::vector<std::shared_ptr<FakeReady>> captures_;  // guarded by mu_
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace concord
