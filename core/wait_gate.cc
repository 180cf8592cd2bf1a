#include "core/wait_gate.h"

namespace concord {

bool WaitGate::Wait(RequestState& state, Deadline deadline) {
  bool entered = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      ++inside_;
      entered = true;
    }
  }
  if (entered) {
    if (!state.done()) drive_(state, deadline);
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --inside_ == 0 && closed_;
    }
    if (last) left_.notify_all();
  }
  return state.Wait(deadline);
}

void WaitGate::Close() {
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;
  left_.wait(lock, [this] { return inside_ == 0; });
}

}  // namespace concord
