#include "core/wait_gate.h"

namespace concord {

bool WaitGate::Enter() {
  MutexLock lock(mu_);
  if (closed_) return false;
  ++inside_;
  return true;
}

void WaitGate::Leave() {
  bool last;
  {
    MutexLock lock(mu_);
    last = --inside_ == 0 && closed_;
  }
  if (last) left_.NotifyAll();
}

Status WaitGate::CheckWait(const RequestState& state, Deadline deadline) {
  if (!check_ || !deadline.infinite() || !Enter()) return Status::Ok();
  Status refused = check_(state);
  Leave();
  return refused;
}

StatusOr<bool> WaitGate::Wait(RequestState& state, Deadline deadline) {
  if (Enter()) {
    Status refused = check_ && deadline.infinite() ? check_(state) : Status::Ok();
    if (refused.ok() && !state.done()) drive_(state, deadline);
    Leave();
    if (!refused.ok()) return refused;
  }
  return state.Wait(deadline);
}

void WaitGate::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  while (inside_ != 0) left_.Wait(mu_);
}

}  // namespace concord
