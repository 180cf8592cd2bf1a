// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable carrying clang's
// thread-safety capability (base/thread_annotations.h), so that a clang build with -Wthread-safety
// proves every GUARDED_BY member is touched with its mutex held. Same cost as the std types.
//
// Contract: a Mutex is not recursive. CondVar's waits require the mutex held and hold it again
// when they return; waits may wake spuriously, so callers loop on their condition
// (`while (!ready_) cv_.Wait(mu_);`), written out rather than as a lambda, which the analysis
// cannot see into. All thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/clock.h"
#include "base/thread_annotations.h"

namespace concord {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis that the calling thread holds this mutex, where it cannot see it (a
  // callback its holder runs). Checks nothing at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

class CondVar {
 public:
  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's scope releases it
  }
  // Returns false when `at` passed first.
  bool WaitUntil(Mutex& mu, Clock::time_point at) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, at) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // Waits until notified or `deadline` passed (forever when it is infinite); returns false when
  // the deadline passed first.
  bool WaitUntil(Mutex& mu, const Deadline& deadline) REQUIRES(mu) {
    if (!deadline.infinite()) return WaitUntil(mu, deadline.at());
    Wait(mu);
    return true;
  }
  bool WaitFor(Mutex& mu, std::chrono::nanoseconds d) REQUIRES(mu) {
    return WaitUntil(mu, Clock::now() + d);
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace concord
