// The rounds that the shared-memory collectives advance in lockstep, with failure detection.
//
// Protocol: every rank counts the barrier rounds it has reached in its own RankBlock::arrived.
// Arrive(t) publishes t (release) and bumps the header's futex word; Wait(t) returns once every
// rank's counter is at least t (acquire), so whatever a rank wrote before arriving is visible to
// every rank after its wait. A waiter spins briefly (a peer usually arrives within microseconds;
// past 10 us it yields the core between polls: its peer may wait to run there), then sleeps on
// the futex word in short slices, checking between slices: this rank's interrupt flag (the engine's
// control plane found a peer failed), the header's abort flag (another rank found the group
// broken), the liveness of the ranks it waits for (pid and start time: a rank killed with SIGKILL
// is seen within a slice; not for a rank in another pid namespace, which CONCORD_HOST_ID may put
// on this host: its exit comes through the interrupt or the deadline) and whether they abandoned
// the group (below), and its deadline. The first rank to find the group broken sets the abort
// flag, naming the dead rank, so that every other rank fails at once. The dead rank is published
// before the abort's author, so a rank that sees the abort sees the rank it names; an abort that
// names none (an interrupt, a timeout) still leaves each waiter to name a rank it finds gone
// itself.
//
// A rank whose job failed elsewhere (its engine's failure path) marks itself abandoned in its
// block, outside any collective, before it exits: a waiter for a round that such a rank has not
// reached fails (a backend error, which the engine explains from its control plane) and never
// names it for its exit, a consequence of the failure, not its cause (a rank that exits after
// rank 0 aborted the job would otherwise be blamed for the crash of the rank that rank 0 names);
// a rank that died without the mark is named first. A round that every rank reached before the
// mark completes as usual.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/shm/shm_segment.h"
#include "base/clock.h"
#include "base/status.h"

namespace concord {
namespace shm_internal {

// Contract: one per backend, used by the backend's calling thread only, except the interrupt
// flag, which any thread may set at any time (it is shared, and outlives the barrier).
class ShmBarrier {
 public:
  // Errors name rank r as rank_names[r] (BackendOptions::rank_names; empty: r).
  ShmBarrier(ShmSegment* segment, int rank, std::chrono::milliseconds timeout, bool spin,
             std::vector<int> rank_names);

  // Arrives at the next round and waits for every rank to reach it. kPeerFailure naming the rank
  // that died (or the rank that aborted), kTimeout when a rank stays away longer than the timeout,
  // kBackendError when interrupted. After an error the group is aborted for every rank.
  Status Sync();

  const std::shared_ptr<std::atomic<bool>>& interrupted() const { return interrupted_; }

  // The last round this rank arrived at.
  uint64_t round() const { return round_; }
  // Whether the group is aborted or this rank interrupted: a collective in progress should stop
  // touching its peers' memory and meet them at its next Sync(), which then fails.
  bool Aborted() const;
  // The error of a collective that stopped because Aborted(): the abort as Sync() reports it (this
  // rank aborts the group first when only it was interrupted).
  Status Stopped();
  // For a collective in which the ranks touch each other's memory after round `published` (a
  // direct allreduce's reads and writes), once it failed here and the group is aborted (as every
  // failed Sync() and Abort() leave it): arrives at round `published` + 1, promising the others
  // that this rank no longer touches theirs, and waits until no rank may touch this rank's any
  // more: each has arrived there too, never reached `published` (it never began), or is gone.
  // Neither the abort nor the interrupt ends the wait (the ranks still running see them and stop
  // within a piece); the timeout does.
  void Drain(uint64_t published);

  // Aborts the group for every rank (they fail at their next wait, naming `dead_rank` when it is
  // not -1, else this rank) and returns `why`: for an error found outside Sync().
  Status Abort(int dead_rank, Status why);

  // This rank's job failed and it leaves the group for good (no collective of its own runs now
  // or later): marks it abandoned and wakes the waiters, so that those waiting for a round it has
  // not reached fail at once, and none names it when its process exits afterwards. Atomics only.
  void Abandon();

 private:
  bool AllArrived(uint64_t round) const;
  // Publishes this rank's arrival at `round` and wakes the sleepers.
  void Arrive(uint64_t round);
  // Waits until every rank reached `round`, or an error (see Check).
  Status WaitAll(uint64_t round);
  // The first error among: abort flag, interrupt, a waited-for rank gone, the deadline.
  Status Check(uint64_t round, const Deadline& deadline);
  // For the ranks that have not reached `round`: kPeerFailure naming the first that is gone
  // without having abandoned the group (the group is aborted naming it); else kBackendError
  // naming the first that abandoned it (the group is aborted naming nobody); else OK.
  Status FindDeparted(uint64_t round);
  // "rank N": rank r's name in errors.
  std::string RankName(int r) const;

  ShmSegment* const segment_;
  SegmentHeader* const header_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const bool spin_;
  const std::vector<int> rank_names_;
  uint64_t round_ = 0;
  std::vector<bool> observable_;  // whether rank r's exit shows in this rank's /proc
  std::shared_ptr<std::atomic<bool>> interrupted_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace shm_internal
}  // namespace concord
