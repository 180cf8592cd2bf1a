// How a request's handle waits: through its engine while the engine exists, so the waiting thread
// can run the engine's steps itself (Engine::Drive, progress by the waiter), and plainly on the
// request's state once the engine has gone. Handles may outlive their communicator, so the engine
// and every handle it gave out share this gate (shared_ptr); the engine closes it before it goes.
// While it is open, the engine may also refuse a wait without a limit that could never end (the
// check function: a request the waiting thread's own open group still holds).
//
// Thread-safe. Close() blocks until every Wait() and CheckWait() that is inside the drive or check
// function has left it; the drive function must therefore return promptly once its engine stops.
#pragma once

#include <functional>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "core/request_state.h"

namespace concord {

class WaitGate {
 public:
  // Runs progress on the calling thread until the state completes, the deadline passes, or it
  // cannot (it may return at once).
  using DriveFn = std::function<void(RequestState&, Deadline)>;
  // OK, or why a wait for the state by the calling thread could never end.
  using CheckFn = std::function<Status(const RequestState&)>;

  explicit WaitGate(DriveFn drive, CheckFn check = nullptr)
      : drive_(std::move(drive)), check_(std::move(check)) {}

  // For a wait until `deadline`: the check function's answer for the calling thread when the
  // deadline is infinite and the gate open; else OK (a limited wait ends anyway).
  Status CheckWait(const RequestState& state, Deadline deadline);
  // Waits until `state` completes or the deadline passes; returns whether it completed, or
  // CheckWait()'s refusal (then it waited for nothing).
  StatusOr<bool> Wait(RequestState& state, Deadline deadline);
  // Later Wait()s wait plainly; returns once no Wait() is inside the drive or check function.
  void Close();

 private:
  // Counts the caller in while the gate is open (false: closed, nothing counted); Leave() undoes.
  bool Enter();
  void Leave();

  Mutex mu_;
  CondVar left_;
  int inside_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
  const DriveFn drive_;
  const CheckFn check_;
};

}  // namespace concord
