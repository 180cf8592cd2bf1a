// The progress driver: which thread runs the engine's steps, and when.
//
// An engine makes progress in steps (Engine::Step: take the negotiation messages that arrived,
// submit new requests, coordinate on rank 0, execute ready response lists). One thread at a time
// runs a step, holding step_mu_. Two kinds of thread run them:
//  - the engine thread (started by Start()), which blocks in the control plane's receive while
//    there is nothing to do; while requests are in flight (Hooks::busy) each of its steps first
//    polls for messages without sleeping, for drive_busy_poll like a waiter's, so an operation
//    nobody waits for (submitted now, waited for later) is not slowed by a wake-up per message;
//  - waiters: a thread that waits for its own request (Drive(): progress by the waiter) runs the
//    steps itself, so a blocking operation costs no hand-off between threads.
// The hand-off between them, over park_mu_ and park_cv_:
//  - drive: a waiter counts itself in drivers_ and, when the engine thread is inside a step,
//    interrupts its receive (Hooks::interrupt); the engine thread finishes that step and parks
//    (waits on park_cv_) while drivers_ > 0. Waiters take turns at step_mu_, each stepping for at
//    most kDriveSlice before it looks at its own request and deadline again. An engine thread
//    that left its park looks at drivers_ again once it holds step_mu_, and parks instead of
//    stepping when a waiter came meanwhile (whose interrupt its own step may have taken).
//  - rest: when the last waiter leaves with nothing in flight (Hooks::busy), the engine thread
//    rests: instead of blocking in receive it steps without waiting every kRestPoll, doubling up
//    to kMaxRestPoll while nothing happens, so the next waiter finds step_mu_ free. Wake() (new
//    work) ends a rest at once.
//  - resume: when the last waiter leaves with work in flight, the engine thread steps again.
// A failed step halts the driver: Hooks::halted runs once, on the failing thread, still holding
// step_mu_, and no thread runs another step.
//
// Contract: Start() once, from the owner; Stop() from any thread but the engine thread: it makes
// the engine thread return and joins it; waiters then return within one slice, and later Drive()
// calls return at once. Drive() from any thread that is not running a step (the engine refuses
// waits on its own threads before calling it). Wake() and NotifyCompletion() from any thread. The
// hooks run on the stepping thread (step, halted) or on the calling thread (interrupt, busy);
// interrupt and busy must not take step_mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "core/request_state.h"

namespace concord {

class ProgressDriver {
 public:
  struct Hooks {
    // One step: `limit` bounds its wait for messages, of which it spends up to `busy` polling
    // without sleeping. Called with step_mu_ held.
    std::function<Status(Deadline limit, std::chrono::microseconds busy)> step;
    // The step failed with this status; called once, with step_mu_ held.
    std::function<void(const Status&)> halted;
    // Makes a step that waits for messages return now (the control plane's Wake()).
    std::function<void()> interrupt;
    // Whether requests are in flight (the engine thread rests only when there are none).
    std::function<bool()> busy;
  };

  // `drive_busy_poll`: how long a driving waiter, or the engine thread while requests are in
  // flight, polls for messages without sleeping in each of its steps (0 where spinning would take
  // the core from the rank it waits for).
  ProgressDriver(Hooks hooks, std::chrono::microseconds drive_busy_poll);
  ~ProgressDriver();
  ProgressDriver(const ProgressDriver&) = delete;
  ProgressDriver& operator=(const ProgressDriver&) = delete;

  void Start();
  void Stop() EXCLUDES(park_mu_, step_mu_);
  bool stopping() const { return stopping_.load(); }

  // Runs steps on the calling thread until `state` completes, the deadline passes, the driver
  // halts or stops (see the class comment).
  void Drive(RequestState& state, Deadline deadline) EXCLUDES(park_mu_, step_mu_);
  // New work: a step waiting for messages returns, and a resting engine thread steps at once.
  void Wake() EXCLUDES(park_mu_);
  // An operation completed outside any step (a device completion): a driving waiter that waits
  // for messages returns and sees it.
  void NotifyCompletion() EXCLUDES(park_mu_);

  // Whether `id` is the engine thread or the thread running a step now.
  bool RunsSteps(std::thread::id id) const;

  // The lock whoever runs a step holds; for the thread-safety analysis of state only steps touch.
  Mutex& step_mutex() const RETURN_CAPABILITY(step_mu_) { return step_mu_; }

  // A resting engine thread steps after kRestPoll, then ever less often, down to once every
  // kMaxRestPoll; a driving waiter's step waits at most kDriveSlice for messages before it looks
  // at its request (completed elsewhere) and deadline again.
  static constexpr std::chrono::milliseconds kRestPoll{2};
  static constexpr std::chrono::milliseconds kMaxRestPoll{64};
  static constexpr std::chrono::milliseconds kDriveSlice{1};

 private:
  void Run() EXCLUDES(park_mu_, step_mu_);
  // Runs one step on the calling thread and halts the driver when it fails.
  Status StepHolding(Deadline limit, std::chrono::microseconds busy) REQUIRES(step_mu_);

  const Hooks hooks_;
  const std::chrono::microseconds drive_busy_poll_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::thread::id> engine_thread_{};    // set by the engine thread itself
  std::atomic<std::thread::id> stepping_thread_{};  // the thread running a step, if any

  // A step may wake the engine (a completion callback enqueues): step_mu_ before park_mu_.
  mutable Mutex step_mu_ ACQUIRED_BEFORE(park_mu_);
  bool halted_ GUARDED_BY(step_mu_) = false;  // a step failed: no more steps

  Mutex park_mu_;
  CondVar park_cv_;
  int drivers_ GUARDED_BY(park_mu_) = 0;       // waiters driving or about to
  bool resting_ GUARDED_BY(park_mu_) = false;  // the last waiter left with nothing in flight
  bool parked_ GUARDED_BY(park_mu_) = false;   // the engine thread is parked (not in a step)

  std::thread thread_;
};

}  // namespace concord
