// A worker thread for one of the engine's extra lanes (see engine.h): it runs one task at a time.
//
// Contract: owned and driven by one thread (the engine's): Start(task) hands a task over (no task
// may be running), Wait() blocks until it returned and gives its status. id() may be read from
// any thread. The destructor stops and joins the thread; it must not run while a task runs.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

#include "base/mutex.h"
#include "base/status.h"

namespace concord {

class LaneWorker {
 public:
  LaneWorker();
  ~LaneWorker();
  LaneWorker(const LaneWorker&) = delete;
  LaneWorker& operator=(const LaneWorker&) = delete;

  void Start(std::function<Status()> task) EXCLUDES(mu_);
  Status Wait() EXCLUDES(mu_);
  // The worker thread's id (default-constructed until the thread has started).
  std::thread::id id() const { return id_.load(); }

 private:
  void Loop() EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  // Set by Start(), cleared by the worker when it takes it.
  std::function<Status()> task_ GUARDED_BY(mu_);
  bool running_ GUARDED_BY(mu_) = false;   // a task was started and Wait() has not collected it
  bool finished_ GUARDED_BY(mu_) = false;  // the running task returned; result_ holds its status
  bool stop_ GUARDED_BY(mu_) = false;
  Status result_ GUARDED_BY(mu_);
  std::atomic<std::thread::id> id_{};
  std::thread thread_;
};

}  // namespace concord
