#include "core/progress_driver.h"

#include <algorithm>
#include <utility>

namespace concord {

ProgressDriver::ProgressDriver(Hooks hooks, std::chrono::microseconds drive_busy_poll)
    : hooks_(std::move(hooks)), drive_busy_poll_(drive_busy_poll) {}

ProgressDriver::~ProgressDriver() {
  // The owner normally stopped it already; the hooks may no longer be callable then.
  if (thread_.joinable()) Stop();
}

void ProgressDriver::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ProgressDriver::Stop() {
  stopping_.store(true);
  // Taking the lock orders the store before a parked thread's next look at stopping_.
  { MutexLock lock(park_mu_); }
  park_cv_.NotifyAll();
  hooks_.interrupt();
  if (thread_.joinable()) thread_.join();
}

bool ProgressDriver::RunsSteps(std::thread::id id) const {
  return id == engine_thread_.load() || id == stepping_thread_.load();
}

void ProgressDriver::Run() {
  engine_thread_.store(std::this_thread::get_id());
  // Forgotten when the thread ends: a later thread may reuse its id.
  struct Forget {
    std::atomic<std::thread::id>& id;
    ~Forget() { id.store(std::thread::id()); }
  } forget{engine_thread_};
  auto rest_poll = kRestPoll;
  for (;;) {
    Deadline limit = Deadline::Infinite();
    {
      // Parked while waiters drive; while resting, one step without waiting after each
      // rest_poll, which doubles up to kMaxRestPoll while nothing happens.
      MutexLock lock(park_mu_);
      parked_ = true;
      while (!stopping_.load() && (drivers_ > 0 || resting_)) {
        if (!park_cv_.WaitFor(park_mu_, rest_poll) && drivers_ == 0 && resting_) {
          limit = Deadline::After(std::chrono::milliseconds(0));
          break;
        }
      }
      rest_poll = resting_ ? std::min(rest_poll * 2, kMaxRestPoll) : kRestPoll;
      parked_ = false;
      if (stopping_.load()) return;
    }
    // With requests in flight, the step polls for their messages before it sleeps, as a driving
    // waiter does: an operation nobody drives then costs no wake-up of this thread per message.
    const auto busy = hooks_.busy() ? drive_busy_poll_ : std::chrono::microseconds(0);
    MutexLock step(step_mu_);
    {
      // A waiter that came while this thread was on its way here drives now. Its interrupt may
      // have ended its own step instead (it took step_mu_ first), so a step here could wait for
      // messages without limit while the waiter waits for step_mu_: park again instead.
      MutexLock lock(park_mu_);
      if (drivers_ > 0) continue;
    }
    if (halted_ || !StepHolding(limit, busy).ok()) return;
  }
}

void ProgressDriver::Drive(RequestState& state, Deadline deadline) {
  bool engine_stepping;
  {
    MutexLock lock(park_mu_);
    if (stopping_.load()) return;
    ++drivers_;
    resting_ = false;
    engine_stepping = !parked_;
  }
  // Its receive returns; it finishes the step and parks.
  if (engine_stepping) hooks_.interrupt();
  // The first step does not wait for messages: the request may not have been submitted yet (a
  // blocking call's enqueue wakes nobody).
  auto limit = Deadline::After(std::chrono::milliseconds(0));
  while (!state.done() && !deadline.passed()) {
    MutexLock step(step_mu_);
    if (halted_ || stopping_.load()) break;
    if (!StepHolding(deadline.Earlier(limit), drive_busy_poll_).ok()) break;
    limit = Deadline::After(kDriveSlice);
  }
  bool resume;
  {
    MutexLock lock(park_mu_);
    if (--drivers_ == 0) resting_ = !hooks_.busy();
    resume = drivers_ == 0 && !resting_;
  }
  if (resume) park_cv_.NotifyAll();
}

Status ProgressDriver::StepHolding(Deadline limit, std::chrono::microseconds busy) {
  stepping_thread_.store(std::this_thread::get_id());
  Status s = hooks_.step(limit, busy);
  if (!s.ok()) {
    halted_ = true;
    hooks_.halted(s);
  }
  stepping_thread_.store(std::thread::id());
  return s;
}

void ProgressDriver::Wake() {
  hooks_.interrupt();
  bool was_resting;
  {
    MutexLock lock(park_mu_);
    was_resting = std::exchange(resting_, false);
  }
  if (was_resting) park_cv_.NotifyAll();
}

void ProgressDriver::NotifyCompletion() {
  bool driven;
  {
    MutexLock lock(park_mu_);
    driven = drivers_ > 0;
  }
  if (driven) hooks_.interrupt();
}

}  // namespace concord
