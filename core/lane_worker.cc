#include "core/lane_worker.h"

#include <utility>

namespace concord {

LaneWorker::LaneWorker() : thread_([this] { Loop(); }) {}

LaneWorker::~LaneWorker() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void LaneWorker::Start(std::function<Status()> task) {
  {
    MutexLock lock(mu_);
    task_ = std::move(task);
    running_ = true;
    finished_ = false;
  }
  cv_.NotifyAll();
}

Status LaneWorker::Wait() {
  MutexLock lock(mu_);
  while (!finished_ && running_) cv_.Wait(mu_);
  running_ = false;
  return std::exchange(result_, Status::Ok());
}

void LaneWorker::Loop() {
  id_.store(std::this_thread::get_id());
  for (;;) {
    std::function<Status()> task;
    {
      MutexLock lock(mu_);
      while (!stop_ && !task_) cv_.Wait(mu_);
      if (stop_) return;
      task = std::move(task_);
      task_ = nullptr;
    }
    Status status = task();
    {
      MutexLock lock(mu_);
      result_ = std::move(status);
      finished_ = true;
    }
    cv_.NotifyAll();
  }
}

}  // namespace concord
