#include "core/request_state.h"

namespace concord {

void RequestState::Complete(Status status) {
  Callback callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_) return;
    completing_ = true;
    status_ = std::move(status);
    callback = std::move(callback_);
  }
  if (callback) callback(status_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

bool RequestState::Wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (deadline.infinite()) {
    cv_.wait(lock, [&] { return done_; });
    return true;
  }
  return cv_.wait_until(lock, deadline.at(), [&] { return done_; });
}

bool RequestState::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status RequestState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void RequestState::SetLaunched(std::shared_ptr<DeviceEvent> event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    launched_ = std::move(event);
  }
  cv_.notify_all();
}

StatusOr<std::shared_ptr<DeviceEvent>> RequestState::WaitLaunched(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return done_ || launched_ != nullptr; };
  if (deadline.infinite()) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_until(lock, deadline.at(), ready)) {
    return TimeoutError("the operation was not launched on its device before the deadline");
  }
  if (done_) return std::shared_ptr<DeviceEvent>();
  return launched_;
}

}  // namespace concord
