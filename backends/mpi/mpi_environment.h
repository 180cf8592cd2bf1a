// The process's MPI library as Concord sees it: initialised once, checked for a usable thread
// level, finalized only by whoever initialised it. Also the MPI error check macro.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "base/status.h"

// Evaluates an MPI call; on failure returns a Status naming the call, MPI's error string and the
// call's file:line. For functions that return Status (or StatusOr).
#define CONCORD_MPI_CHECK(call)                                               \
  do {                                                                        \
    const int concord_mpi_rc_ = (call);                                       \
    if (concord_mpi_rc_ != MPI_SUCCESS) {                                     \
      return ::concord::MpiError(concord_mpi_rc_, #call, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

// Takes the environment's lock (MpiEnvironment::Lock) as `lock`, or returns its StalledError when
// it gave up. For functions that return Status (or StatusOr).
#define CONCORD_MPI_LOCK_OR_RETURN(lock, env) \
  auto lock = (env).Lock();                   \
  if (!lock.owns_lock()) return (env).StalledError()

namespace concord {

// "CALL failed at FILE:LINE: MPI_ERR_x: <MPI_Error_string>" with code kBackendError.
Status MpiError(int mpi_code, const char* call, const char* file, int line);

// Contract: one MpiEnvironment exists per process while anything in Concord uses MPI; every
// communicator's backend and control plane hold a shared_ptr to it (so does the engine's
// keep_alive), and it goes away with the last of them. Acquire() is thread-safe. MPI's state is
// per process, so this is the one object Concord finds through a process-wide registry (a
// weak_ptr in Acquire()); it owns nothing but MPI's lifetime and the lock of its calls.
//
// Thread level: Concord calls MPI from each communicator's stepping thread, its control plane's
// liveness thread, and the thread that creates or destroys a communicator, never from the main
// thread only, so it needs MPI_THREAD_SERIALIZED or better. If MPI is not initialised, Acquire()
// initialises it with MPI_Init_thread asking for MPI_THREAD_MULTIPLE, and finalizes it when the
// last holder goes. If the application initialised MPI, its level is checked the same way and MPI
// is never finalized here. Every Concord MPI call holds Lock(), at every level, so Concord's own
// threads never call MPI at the same time: what SERIALIZED requires, and under MULTIPLE what
// keeps the calls of Concord's threads ordered (ThreadSanitizer cannot see the shared-memory
// hand-offs between Open MPI's processes, and reports two unlocked threads reusing a transport
// fragment as a race). Concord holds it for one non-blocking call at a time (a collective is
// waited for by polling MPI_Test), so a thread never waits long for it. The one blocking call,
// MPI_Comm_create_group (a sub-communicator's start, CreateGroupComm), runs without it under
// MULTIPLE: sub-communicators started at once from several threads, in different orders on
// different ranks, would otherwise each hold a rank's lock waiting for the other, for good
// (scripts/tsan-suppressions.txt then hides what TSan reports inside Open MPI). Under SERIALIZED
// it holds the lock, so there sub-communicators of one process must be started from one thread
// at a time. Under SERIALIZED the application must not call MPI itself while a Concord
// communicator exists (with MULTIPLE it may).
class MpiEnvironment {
 public:
  static StatusOr<std::shared_ptr<MpiEnvironment>> Acquire();
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int thread_level() const { return thread_level_; }
  bool initialised_by_concord() const { return owned_; }

  // The right to call MPI, held by one Concord thread at a time (Lock()); released when destroyed.
  // Not owned when Lock() gave up: then call no MPI.
  class [[nodiscard]] CallLock {
   public:
    CallLock() = default;
    CallLock(CallLock&& other) noexcept : env_(std::exchange(other.env_, nullptr)) {}
    CallLock& operator=(CallLock&&) = delete;
    ~CallLock() {
      if (env_ != nullptr) env_->Unlock();
    }
    bool owns_lock() const { return env_ != nullptr; }
    explicit operator bool() const { return owns_lock(); }

   private:
    friend class MpiEnvironment;
    explicit CallLock(MpiEnvironment* env) : env_(env) {}
    MpiEnvironment* env_ = nullptr;
  };

  // Hold around every MPI call (one call at a time: never across a wait). Waits as long as it
  // takes while the environment is in use. Once it is abandoned (a failure), waits at most
  // kAbandonedLockWait and then gives up, and every later call that finds the lock taken gives up
  // at once: the lock returned is not owned (check it; call no MPI then, StalledError() is the
  // error). A thread stuck for good inside MPI (Open MPI can stall in a call when a peer has
  // exited) must not take down with it the threads queued behind it, and the joins and waits of
  // the engine's failure path that wait for those. (A mutex and a condition variable, not a
  // timed mutex: ThreadSanitizer does not see pthread_mutex_clocklock.)
  CallLock Lock();
  Status StalledError() const;
  static constexpr std::chrono::milliseconds kAbandonedLockWait{500};

  // A request was left pending (a collective passed its deadline; MPI cannot cancel it), or a
  // peer failed (dead, frozen or cut off: Open MPI's MPI_Finalize would wait for it forever). MPI
  // can then neither free its communicator nor finalize safely: the destructor skips
  // MPI_Finalize, and mpirun reports the job as failed.
  void MarkAbandoned() { abandoned_ = true; }
  bool abandoned() const { return abandoned_; }

 private:
  MpiEnvironment(int thread_level, bool owned) : thread_level_(thread_level), owned_(owned) {}

  void Unlock();

  const int thread_level_;
  const bool owned_;
  // The call lock: held_ taken by compare-exchange (uncontended, no other atomic operation); a
  // thread that finds it held waits on call_free_ under call_mu_, counted in waiters_, which
  // Unlock() reads after clearing held_ (both sequentially consistent: a waiter either sees held_
  // cleared or is counted, and then woken under call_mu_).
  std::atomic<bool> held_{false};
  std::atomic<int> waiters_{0};
  std::mutex call_mu_;
  std::condition_variable call_free_;
  bool stalled_ = false;  // a Lock() gave up (see Lock()); guarded by call_mu_
  std::atomic<bool> abandoned_{false};
};

// "MPI_THREAD_SERIALIZED", ...
const char* MpiThreadLevelName(int level);

}  // namespace concord
