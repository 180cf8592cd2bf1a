// A shared-memory segment that the ranks of one communicator lane on one host map together, and
// the identity that tells which ranks share a host.
//
// Lifetime: rank 0 creates a POSIX shared-memory object, every rank maps it, and every rank
// unlinks its name as soon as all of them have tried to map it, so the name exists for the
// length of the set-up only: a job killed with SIGKILL afterwards leaves nothing in /dev/shm (the
// memory goes with the last mapping). Rank 0 says the name before it creates the object, so that
// should it die before it publishes the name, the others unlink it. The pages are reserved up front
// (posix_fallocate), so a full /dev/shm is an error at set-up, never a SIGBUS in a collective.
//
// Layout: a header (sizes, the futex word and abort flags), then one control block per rank (its
// barrier counter, pid, process start time and abandon flag, each on cache lines of its own), then
// for each rank two data halves of `half_bytes` (page-aligned), which the collectives use
// alternately.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace concord {

class Store;

namespace shm_internal {

constexpr size_t kCacheLine = 128;  // two lines: the adjacent-line prefetcher pairs them

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "atomics in shared memory must be lock-free (hence address-free)");

struct alignas(kCacheLine) SegmentHeader {
  uint32_t magic = 0;
  uint32_t layout_version = 0;
  int32_t size = 0;
  uint64_t half_bytes = 0;
  // Bumped by every arrival at a barrier; sleepers wait on it with a futex.
  alignas(kCacheLine) std::atomic<uint32_t> wake{0};
  std::atomic<uint32_t> sleepers{0};
  // Set once by the first rank that finds the group broken: the rank it found dead (or -1 when it
  // gave up for another reason) and its own rank, so that the others fail at once, naming them.
  alignas(kCacheLine) std::atomic<int32_t> aborted_by{-1};
  std::atomic<int32_t> dead_rank{-1};
};

struct alignas(kCacheLine) RankBlock {
  std::atomic<uint64_t> arrived{0};  // the last barrier round this rank reached
  int32_t pid = 0;
  uint64_t start_ticks = 0;    // the process's start time (/proc/<pid>/stat), against pid reuse
  uint64_t pid_namespace = 0;  // the pid's namespace: another one's pids mean nothing here
  // Set (1) by the rank's ShmBarrier::Abandon() when its job failed: its exit, which follows,
  // is a consequence of a failure, never the cause another rank should name.
  std::atomic<uint32_t> abandoned{0};
};

// A process as the other ranks look for it: its pid, start time and pid namespace.
struct ProcessIdentity {
  int32_t pid = 0;
  uint64_t start_ticks = 0;
  uint64_t pid_namespace = 0;
  // This process's.
  static ProcessIdentity Self();
  // Whether this process can tell by its pid if `this` still runs: both are in one pid
  // namespace (ranks that CONCORD_HOST_ID puts together may not be).
  bool Observable() const;
  // Whether it is gone (no such process, a zombie, or another process with its pid). Only
  // meaningful when Observable().
  bool Gone() const;
};

// This host as the shared memory sees it: the boot id and the mount, IPC, network and pid
// namespaces, so that ranks in different containers or emulated hosts (network namespaces) never
// count as co-located. `override_id` (CONCORD_HOST_ID) replaces it when not empty.
std::string HostIdentity(const std::string& override_id);

// The start time of process `pid` in clock ticks since boot, or 0 when it no longer runs (no
// such process, or a zombie).
uint64_t ProcessStartTicks(int pid);

// One mapping of the segment. Contract: created collectively by Open(); owned by one backend;
// unmapped in the destructor. Not thread-safe by itself: the atomics inside are the protocol.
class ShmSegment {
 public:
  // Collective over the `size` ranks of a lane under `key_prefix` in `store`: every rank says
  // which process it is, rank 0 creates the segment once all did (so a rank that died before set-up
  // leaves no name behind), all map it, all unlink it. Every rank gets the same outcome: the
  // mapping, or kUnavailable naming the rank and reason when any rank could not create or map it
  // (the caller may fall back to another transport), or a timeout or store error. A rank that
  // exits during the set-up is found by its pid within kSetupCheck where that is observable
  // (kPeerFailure naming it; the name is unlinked at once), else at the timeout. Errors name rank
  // r as rank_names[r] (empty: r).
  static StatusOr<std::unique_ptr<ShmSegment>> Open(int rank, int size, size_t half_bytes,
                                                    const std::string& key_prefix, Store* store,
                                                    std::chrono::milliseconds timeout,
                                                    const std::vector<int>& rank_names = {});
  // How often a rank waiting for the others' set-up looks at whether they still run.
  static constexpr std::chrono::milliseconds kSetupCheck{50};
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }
  RankBlock* rank_block(int r) const { return reinterpret_cast<RankBlock*>(base_ + blocks_) + r; }
  // Rank r's data half h (0 or 1), half_bytes() long.
  uint8_t* half(int r, int h) const { return base_ + data_ + (2 * size_t(r) + h) * half_bytes_; }
  size_t half_bytes() const { return half_bytes_; }
  // The process of rank r, as it said when it mapped the segment.
  ProcessIdentity process(int r) const;
  int size() const { return size_; }

 private:
  ShmSegment(uint8_t* base, size_t bytes, int size, size_t half_bytes);
  static size_t BlocksOffset();
  static size_t DataOffset(int size);

  uint8_t* const base_;
  const size_t bytes_;
  const int size_;
  const size_t half_bytes_;
  const size_t blocks_;
  const size_t data_;
};

}  // namespace shm_internal
}  // namespace concord
