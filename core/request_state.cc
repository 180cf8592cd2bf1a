#include "core/request_state.h"

namespace concord {

void RequestState::Complete(const Status& status) {
  Callback callback;
  {
    MutexLock lock(mu_);
    ++complete_calls_;
    if (completing_) return;
    completing_ = true;
    status_ = status;
    callback = std::move(callback_);
  }
  if (callback) callback(status);
  {
    MutexLock lock(mu_);
    done_ = true;
  }
  cv_.NotifyAll();
}

int RequestState::complete_calls() const {
  MutexLock lock(mu_);
  return complete_calls_;
}

bool RequestState::Wait(Deadline deadline) {
  MutexLock lock(mu_);
  while (!done_) {
    if (!cv_.WaitUntil(mu_, deadline) && !done_) return false;
  }
  return true;
}

bool RequestState::done() const {
  MutexLock lock(mu_);
  return done_;
}

Status RequestState::status() const {
  MutexLock lock(mu_);
  return status_;
}

void RequestState::SetLaunched(std::shared_ptr<DeviceEvent> event) {
  {
    MutexLock lock(mu_);
    launched_ = std::move(event);
  }
  cv_.NotifyAll();
}

StatusOr<std::shared_ptr<DeviceEvent>> RequestState::WaitLaunched(Deadline deadline) {
  MutexLock lock(mu_);
  while (!done_ && launched_ == nullptr) {
    if (!cv_.WaitUntil(mu_, deadline) && !done_ && launched_ == nullptr) {
      return TimeoutError("the operation was not launched on its device before the deadline");
    }
  }
  if (done_) return std::shared_ptr<DeviceEvent>();
  return launched_;
}

}  // namespace concord
