#include "core/plane_teardown.h"

#include <thread>

#include "base/clock.h"

namespace concord {

std::shared_ptr<PlaneTeardown> PlaneTeardown::Start(
    std::unique_ptr<ControlPlane> plane, std::vector<std::pair<int, std::string>> messages,
    std::chrono::milliseconds drain) {
  auto teardown = std::make_shared<PlaneTeardown>();
  std::thread([teardown, plane = std::move(plane), messages = std::move(messages),
               drain]() mutable {
    for (auto& [to, bytes] : messages) (void)plane->Send(to, std::move(bytes));
    if (drain.count() > 0) (void)plane->Drain(Deadline::After(drain));
    plane.reset();
    teardown->Done();
  }).detach();
  return teardown;
}

bool PlaneTeardown::WaitFor(std::chrono::milliseconds wait) {
  const Deadline deadline = Deadline::After(wait);
  MutexLock lock(mu_);
  while (!done_) {
    if (!cv_.WaitUntil(mu_, deadline.at())) return done_;
  }
  return true;
}

void PlaneTeardown::Done() {
  {
    MutexLock lock(mu_);
    done_ = true;
  }
  cv_.NotifyAll();
}

}  // namespace concord
