// How a request's handle waits: through its engine while the engine exists, so the waiting thread
// can run the engine's steps itself (Engine::Drive, progress by the waiter), and plainly on the
// request's state once the engine has gone. Handles may outlive their communicator, so the engine
// and every handle it gave out share this gate (shared_ptr); the engine closes it before it goes.
//
// Thread-safe. Close() blocks until every Wait() that is inside the drive function has left it;
// the drive function must therefore return promptly once its engine stops.
#pragma once

#include <functional>

#include "base/clock.h"
#include "base/mutex.h"
#include "core/request_state.h"

namespace concord {

class WaitGate {
 public:
  // Runs progress on the calling thread until the state completes, the deadline passes, or it
  // cannot (it may return at once).
  using DriveFn = std::function<void(RequestState&, Deadline)>;

  explicit WaitGate(DriveFn drive) : drive_(std::move(drive)) {}

  // Waits until `state` completes or the deadline passes; returns whether it completed.
  bool Wait(RequestState& state, Deadline deadline);
  // Later Wait()s wait plainly; returns once no Wait() is inside the drive function.
  void Close();

 private:
  Mutex mu_;
  CondVar left_;
  int inside_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
  const DriveFn drive_;
};

}  // namespace concord
