#include "core/wait_gate.h"

namespace concord {

bool WaitGate::Wait(RequestState& state, Deadline deadline) {
  bool entered = false;
  {
    MutexLock lock(mu_);
    if (!closed_) {
      ++inside_;
      entered = true;
    }
  }
  if (entered) {
    if (!state.done()) drive_(state, deadline);
    bool last;
    {
      MutexLock lock(mu_);
      last = --inside_ == 0 && closed_;
    }
    if (last) left_.NotifyAll();
  }
  return state.Wait(deadline);
}

void WaitGate::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  while (inside_ != 0) left_.Wait(mu_);
}

}  // namespace concord
