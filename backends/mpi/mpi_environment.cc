#include "backends/mpi/mpi_environment.h"

#include <cstdlib>
#include <cstring>

namespace concord {
namespace {

// libnbc (Open MPI's non-blocking collectives) picks its MPI_Iallreduce algorithm by itself
// unless told: at 2 ranks it then runs 64 MiB about 2x slower than blocking MPI_Allreduce, while
// its reduce-scatter + allgather (Rabenseifner) algorithm matches it at every size we measured.
// Concord's collectives are MPI_Iallreduce, so when the variable exists and still holds its
// default 0 ("ignore": nobody chose, e.g. with OMPI_MCA_coll_libnbc_iallreduce_algorithm), it is
// set to 3 (Rabenseifner) for this process. Every Concord rank does the same, as the variable's
// scope (all processes must agree) requires. Best effort: a missing variable (another MPI, a
// newer Open MPI) changes nothing.
void TuneLibnbcIallreduce() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return;
  int index = -1;
  if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      int value = -1;
      if (count == 1 && MPI_T_cvar_read(handle, &value) == MPI_SUCCESS && value == 0) {
        int rabenseifner = 3;
        MPI_T_cvar_write(handle, &rabenseifner);
      }
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
}

// Open MPI's shared-memory transport sends messages up to its eager limit (4 KiB by default) at
// once and larger ones through a rendezvous, which costs a small allreduce about 6 us here.
// Concord's negotiation messages carry small allreduces' data (CONCORD_INLINE_THRESHOLD, 32 KiB),
// so before Concord initialises MPI it raises that limit to kEagerLimit, unless the variable is
// set already (mpirun --mca, or the environment: the user's choice wins). Every rank does the
// same. Other MPI libraries ignore these variables.
constexpr const char* kEagerLimit = "32768";
void RaiseSharedMemoryEagerLimit() {
  setenv("OMPI_MCA_btl_vader_eager_limit", kEagerLimit, /*overwrite=*/0);  // Open MPI 4
  setenv("OMPI_MCA_btl_sm_eager_limit", kEagerLimit, /*overwrite=*/0);     // Open MPI 5
}

// Guards the process's one MpiEnvironment: its creation, and its destruction (MPI_Finalize), so a
// communicator being created never races the last one being destroyed.
std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

std::weak_ptr<MpiEnvironment>& Registry() {
  static std::weak_ptr<MpiEnvironment> env;
  return env;
}

}  // namespace

Status MpiError(int mpi_code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING + 1] = {0};
  int length = 0;
  if (MPI_Error_string(mpi_code, text, &length) != MPI_SUCCESS) {
    std::strcpy(text, "unknown MPI error");
  }
  return Status(Code::kBackendError, std::string(call) + " failed at " + file + ":" +
                                         std::to_string(line) + ": " + text + " (MPI error " +
                                         std::to_string(mpi_code) + ")");
}

const char* MpiThreadLevelName(int level) {
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  return "an unknown MPI thread level";
}

StatusOr<std::shared_ptr<MpiEnvironment>> MpiEnvironment::Acquire() {
  std::lock_guard<std::mutex> hold(RegistryMutex());
  if (auto existing = Registry().lock()) return existing;

  int finalized = 0, initialized = 0;
  CONCORD_MPI_CHECK(MPI_Finalized(&finalized));
  if (finalized) {
    return Status(Code::kUnavailable,
                  "MPI was already finalized in this process and cannot be initialised again");
  }
  CONCORD_MPI_CHECK(MPI_Initialized(&initialized));
  int level = MPI_THREAD_SINGLE;
  bool owned = false;
  if (initialized) {
    CONCORD_MPI_CHECK(MPI_Query_thread(&level));
  } else {
    RaiseSharedMemoryEagerLimit();
    CONCORD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &level));
    owned = true;
  }
  if (level < MPI_THREAD_SERIALIZED) {
    if (owned) MPI_Finalize();
    return Status(Code::kUnavailable,
                  std::string("MPI provides only ") + MpiThreadLevelName(level) +
                      (owned ? " (Concord asked for MPI_THREAD_MULTIPLE)"
                             : " (the application initialised MPI)") +
                      ": Concord calls MPI from its engine thread, which needs "
                      "MPI_THREAD_SERIALIZED or better; initialise MPI with MPI_Init_thread and "
                      "MPI_THREAD_MULTIPLE");
  }
  TuneLibnbcIallreduce();
  std::shared_ptr<MpiEnvironment> env(new MpiEnvironment(level, owned));
  Registry() = env;
  return env;
}

MpiEnvironment::~MpiEnvironment() {
  // With a request abandoned at its deadline MPI_Finalize may wait forever for it; the process
  // then ends without finalizing and mpirun reports the failure.
  std::lock_guard<std::mutex> hold(RegistryMutex());
  if (owned_ && !abandoned_) MPI_Finalize();
}

MpiEnvironment::CallLock MpiEnvironment::Lock() {
  bool free = false;
  if (held_.compare_exchange_strong(free, true)) return CallLock(this);
  std::unique_lock<std::mutex> lock(call_mu_);
  ++waiters_;
  const auto since = std::chrono::steady_clock::now();
  bool taken = false;
  for (;;) {
    free = false;
    if (held_.compare_exchange_strong(free, true)) {
      taken = true;
      break;
    }
    if (stalled_) break;
    call_free_.wait_for(lock, std::chrono::milliseconds(10));
    if (abandoned_ && std::chrono::steady_clock::now() - since >= kAbandonedLockWait) {
      free = false;
      taken = held_.compare_exchange_strong(free, true);
      if (!taken) stalled_ = true;  // later calls give up at once: a failure path makes many
      break;
    }
  }
  --waiters_;
  return taken ? CallLock(this) : CallLock();
}

void MpiEnvironment::Unlock() {
  held_.store(false);
  if (waiters_.load() == 0) return;
  { std::lock_guard<std::mutex> lock(call_mu_); }  // a counted waiter is waiting, or sees held_
  call_free_.notify_one();
}

Status MpiEnvironment::StalledError() const {
  return Status(Code::kBackendError,
                "gave up waiting for MPI: after a failure, another thread's MPI call has not "
                "returned for " +
                    std::to_string(kAbandonedLockWait.count()) +
                    " ms (MPI may be stuck on a peer that exited)");
}

}  // namespace concord
