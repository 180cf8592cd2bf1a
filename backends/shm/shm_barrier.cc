#include "backends/shm/shm_barrier.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <thread>

#include "base/clock.h"

namespace concord {
namespace shm_internal {
namespace {

// How long a waiter polls before it sleeps, and each sleep: short enough that an interrupt or a
// dead peer is seen promptly, long enough to cost nothing. Past the first kSpinBeforeYield a poll
// that finds a rank missing yields the core, as the control plane's busy receive does: when the
// scheduler has put two ranks' waiting threads on one core, a pure spin holds the core from the
// rank it waits for. 1 MiB allreduces, 2 ranks on 2 cores, whole runs in that state: 540-710 us
// with 4000 pure polls (100 us or more), 290-450 us yielding; 145-205 us either way otherwise.
constexpr auto kSpinBeforeYield = std::chrono::microseconds(10);
constexpr auto kSpinLimit = std::chrono::microseconds(100);
constexpr int kPollsPerClockRead = 16;
constexpr long kSleepSliceNs = 2'000'000;
// Liveness of the ranks still awaited is read from /proc every this many slices.
constexpr int kSlicesPerLivenessCheck = 5;

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A shared futex (the word is in memory that other processes map): no FUTEX_PRIVATE_FLAG.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  struct timespec slice {
    0, kSleepSliceNs
  };
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &slice, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

}  // namespace

ShmBarrier::ShmBarrier(ShmSegment* segment, int rank, std::chrono::milliseconds timeout, bool spin,
                       std::vector<int> rank_names)
    : segment_(segment),
      header_(segment->header()),
      rank_(rank),
      size_(segment->size()),
      timeout_(timeout),
      spin_(spin),
      rank_names_(std::move(rank_names)),
      round_(segment->rank_block(rank)->arrived.load(std::memory_order_relaxed)) {
  for (int r = 0; r < size_; ++r) observable_.push_back(segment->process(r).Observable());
}

std::string ShmBarrier::RankName(int r) const {
  const bool named = r >= 0 && static_cast<size_t>(r) < rank_names_.size();
  return "rank " + std::to_string(named ? rank_names_[r] : r);
}

bool ShmBarrier::AllArrived(uint64_t round) const {
  for (int r = 0; r < size_; ++r) {
    if (segment_->rank_block(r)->arrived.load(std::memory_order_acquire) < round) return false;
  }
  return true;
}

Status ShmBarrier::Abort(int dead_rank, Status why) {
  // The dead rank first, then this rank as the author (both seq_cst): whoever sees the author sees
  // the dead rank it named. The first of each is kept; a later abort changes neither.
  if (dead_rank >= 0) {
    int32_t none = -1;
    header_->dead_rank.compare_exchange_strong(none, dead_rank);
  }
  int32_t none = -1;
  header_->aborted_by.compare_exchange_strong(none, rank_);
  header_->wake.fetch_add(1);
  FutexWakeAll(&header_->wake);
  return why;
}

void ShmBarrier::Abandon() {
  segment_->rank_block(rank_)->abandoned.store(1, std::memory_order_seq_cst);
  header_->wake.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&header_->wake);
}

Status ShmBarrier::FindDeparted(uint64_t round) {
  int abandoner = -1;
  for (int r = 0; r < size_; ++r) {
    const RankBlock* block = segment_->rank_block(r);
    if (block->arrived.load(std::memory_order_acquire) >= round) continue;
    // A rank may arrive, find everyone there, return and exit between the load above and the
    // look at /proc: it is gone but it did its part. Only a rank that is gone and, read again
    // after that, still has not arrived failed this round (its last store precedes its exit).
    // A rank in another pid namespace is not looked for by its pid (its pid means another
    // process here): its exit reaches this rank through the interrupt or the deadline.
    const bool gone = observable_[r] && ProcessStartTicks(block->pid) != block->start_ticks;
    if (gone && block->arrived.load(std::memory_order_acquire) >= round) continue;
    // A rank that abandoned the group never arrives again; gone or not, it only followed a
    // failure found elsewhere (its mark, read after its exit was seen, precedes that exit): named
    // only when no rank died here.
    if (block->abandoned.load(std::memory_order_acquire) != 0) {
      if (abandoner < 0) abandoner = r;
      continue;
    }
    if (gone) {
      return Abort(r,
                   Status(Code::kPeerFailure, RankName(r) + " (pid " + std::to_string(block->pid) +
                                                  ") exited during a shared-memory collective"));
    }
  }
  if (abandoner < 0) return Status::Ok();
  // The group is aborted naming nobody: the engine asks its control plane who failed.
  return Abort(-1, Status(Code::kBackendError,
                          RankName(abandoner) + " abandoned the shared-memory collective"));
}

Status ShmBarrier::Check(uint64_t round, const Deadline& deadline) {
  const int aborted_by = header_->aborted_by.load();
  if (aborted_by >= 0 && aborted_by != rank_) {
    const int dead = header_->dead_rank.load();
    if (dead >= 0) {
      return Status(Code::kPeerFailure, RankName(dead) +
                                            " exited during a shared-memory collective (found by " +
                                            RankName(aborted_by) + ")");
    }
    // It gave up (interrupted, or timed out) without knowing who failed: a rank this one finds
    // gone is named; otherwise the engine asks its control plane (a backend error is explained
    // there).
    CONCORD_RETURN_IF_ERROR(FindDeparted(round));
    return Status(Code::kBackendError,
                  RankName(aborted_by) + " abandoned the shared-memory collective");
  }
  if (interrupted_->load()) {
    return Abort(
        -1, Status(Code::kBackendError, "shared-memory collective interrupted: a peer failed"));
  }
  CONCORD_RETURN_IF_ERROR(FindDeparted(round));
  if (deadline.passed()) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (segment_->rank_block(r)->arrived.load() < round) {
        missing += (missing.empty() ? "" : ", ") + RankName(r).substr(5);
      }
    }
    return Abort(-1, Status(Code::kTimeout, "shared-memory collective: rank(s) " + missing +
                                                " did not arrive within " +
                                                std::to_string(timeout_.count()) + " ms"));
  }
  return Status::Ok();
}

void ShmBarrier::Arrive(uint64_t round) {
  round_ = round;
  segment_->rank_block(rank_)->arrived.store(round, std::memory_order_seq_cst);
  header_->wake.fetch_add(1, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&header_->wake);
}

bool ShmBarrier::Aborted() const {
  return header_->aborted_by.load() >= 0 || interrupted_->load();
}

Status ShmBarrier::Stopped() {
  Status status = Check(round_ + 1, Deadline::Infinite());
  if (!status.ok()) return status;
  return Abort(-1,
               Status(Code::kBackendError, "shared-memory collective stopped: the group aborted"));
}

void ShmBarrier::Drain(uint64_t published) {
  const uint64_t done = published + 1;
  if (round_ < done) Arrive(done);
  // A rank that has not reached `published` may still arrive there, but then sees the abort (set
  // before this rank reads its counter; both seq_cst) and fails that round without beginning.
  auto may_touch = [&](int r) {
    const RankBlock* block = segment_->rank_block(r);
    const uint64_t arrived = block->arrived.load(std::memory_order_acquire);
    if (arrived >= done || arrived < published) return false;
    return !(observable_[r] && ProcessStartTicks(block->pid) != block->start_ticks);
  };
  const Deadline deadline = Deadline::After(timeout_);
  for (;;) {
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = header_->wake.load(std::memory_order_seq_cst);
    bool waiting = false;
    for (int r = 0; r < size_ && !waiting; ++r) waiting = may_touch(r);
    if (!waiting || deadline.passed()) {
      header_->sleepers.fetch_sub(1);
      return;
    }
    FutexWait(&header_->wake, seen);
    header_->sleepers.fetch_sub(1);
  }
}

Status ShmBarrier::Sync() {
  const uint64_t round = round_ + 1;
  Arrive(round);
  CONCORD_RETURN_IF_ERROR(WaitAll(round));
  // A rank that arrived and then gave up (it timed out waiting for a third) has failed this
  // collective: so does every rank, even one that found everybody arrived.
  if (header_->aborted_by.load() >= 0) return Check(round, Deadline::Infinite());
  return Status::Ok();
}

Status ShmBarrier::WaitAll(uint64_t round) {
  if (spin_) {
    const auto start = Clock::now();
    for (int i = 1;; ++i) {
      if (AllArrived(round)) return Status::Ok();
      CpuRelax();
      if (i % kPollsPerClockRead != 0) continue;
      const auto spun = Clock::now() - start;
      if (spun >= kSpinLimit) break;
      if (spun >= kSpinBeforeYield) std::this_thread::yield();
    }
  } else {
    for (int i = 0; i < 4; ++i) {
      if (AllArrived(round)) return Status::Ok();
      std::this_thread::yield();
    }
  }
  const Deadline deadline = Deadline::After(timeout_);
  for (int slice = 0;; ++slice) {
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = header_->wake.load(std::memory_order_seq_cst);
    if (AllArrived(round)) {
      header_->sleepers.fetch_sub(1);
      return Status::Ok();
    }
    FutexWait(&header_->wake, seen);
    header_->sleepers.fetch_sub(1);
    if (AllArrived(round)) return Status::Ok();
    if (header_->aborted_by.load() >= 0 || interrupted_->load() || deadline.passed() ||
        slice % kSlicesPerLivenessCheck == 0) {
      CONCORD_RETURN_IF_ERROR(Check(round, deadline));
    }
  }
}

}  // namespace shm_internal
}  // namespace concord
