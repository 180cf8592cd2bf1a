// The control plane's teardown after a failure (Engine::Fail): its last messages (rank 0's abort,
// another rank's failure report) and its destruction, on a thread of its own.
//
// Why a thread: the stepping thread that fails is often the application's, waiting for a request,
// and over MPI any call made after a peer exited can stall for good inside Open MPI (its TCP
// transport reconnects to the process that is gone, the connect fails, and the error report it
// prints waits on the event loop that the same MPI call is running). The engine waits for it for
// at most a bound before it completes its requests, and as long again at Shutdown().
//
// Contract: Start() takes the plane, which nobody else may use any more; the thread owns
// everything it touches (nothing of the engine), so it may outlive the engine when it stalls: it
// is then left to itself (and the process never finalizes MPI, which the plane's Abandon() already
// arranged). WaitFor() is thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/control_plane.h"
#include "base/mutex.h"

namespace concord {

class PlaneTeardown {
 public:
  // Sends each of `messages` ((rank, bytes), errors ignored: best effort), then drains for at most
  // `drain` when it is positive, then destroys `plane`; all on a new, detached thread.
  static std::shared_ptr<PlaneTeardown> Start(std::unique_ptr<ControlPlane> plane,
                                              std::vector<std::pair<int, std::string>> messages,
                                              std::chrono::milliseconds drain);

  // Whether the teardown ended within `wait`.
  bool WaitFor(std::chrono::milliseconds wait) EXCLUDES(mu_);

 private:
  void Done() EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
};

}  // namespace concord
