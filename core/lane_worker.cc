#include "core/lane_worker.h"

#include <utility>

namespace concord {

LaneWorker::LaneWorker() : thread_([this] { Loop(); }) {}

LaneWorker::~LaneWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LaneWorker::Start(std::function<Status()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = std::move(task);
    running_ = true;
    finished_ = false;
  }
  cv_.notify_all();
}

Status LaneWorker::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return finished_ || !running_; });
  running_ = false;
  return std::exchange(result_, Status::Ok());
}

void LaneWorker::Loop() {
  id_.store(std::this_thread::get_id());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || task_; });
    if (stop_) return;
    std::function<Status()> task = std::move(task_);
    task_ = nullptr;
    lock.unlock();
    Status status = task();
    lock.lock();
    result_ = std::move(status);
    finished_ = true;
    cv_.notify_all();
  }
}

}  // namespace concord
