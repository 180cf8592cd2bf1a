// Tests of the shared-memory barrier's abort record (backends/shm/shm_barrier.h) on segments that
// ranks as threads (and a child process) map: an abort publishes the dead rank it names no later
// than its author, so that no waiter sees the one without the other; and a waiter told of an
// abort that names no dead rank still names a rank that exited instead of reporting the
// collective abandoned; and a rank that abandoned the group before it exited (its job failed
// elsewhere) is never named for its exit.
#include "backends/shm/shm_barrier.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/shm/shm_segment.h"
#include "rendezvous/file_store.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"
#include "tests/common/temp_dir.h"
#include "tests/gloo/gloo_test_util.h"

namespace concord {
namespace shm_internal {
namespace {

using testing_gloo::UniquePrefix;

constexpr size_t kHalfBytes = 4096;
constexpr std::chrono::milliseconds kTimeout{20000};

// A waiter reads the abort record as ShmBarrier does (who aborted, then the rank it named) while
// another thread aborts, many times over: it must never find the author without the dead rank.
// Before the fix the author was published first, and a reader between the two stores saw -1.
TEST(ShmBarrierTest, AnAbortPublishesTheDeadRankNoLaterThanItsAuthor) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  std::vector<std::unique_ptr<ShmSegment>> segments(2);
  harness::RunRanks(2, [&](int rank) {
    auto segment = ShmSegment::Open(rank, 2, kHalfBytes, prefix, &store, kTimeout);
    ASSERT_TRUE(segment.ok()) << segment.status().ToString();
    segments[rank] = std::move(*segment);
  });
  ASSERT_TRUE(segments[0] && segments[1]);
  ShmBarrier aborter(segments[0].get(), 0, kTimeout, true, {});
  SegmentHeader* header = segments[1]->header();  // the waiter's own mapping

  constexpr int kIterations = 20000;
  std::atomic<int> started{-1};  // the iteration the aborter may run
  std::atomic<int> finished{-1};
  int torn = 0;
  std::thread abort_thread([&] {
    for (int i = 0; i < kIterations; ++i) {
      while (started.load(std::memory_order_acquire) < i) std::this_thread::yield();
      (void)aborter.Abort(1, Status(Code::kPeerFailure, "test"));
      while (finished.load(std::memory_order_acquire) < i) std::this_thread::yield();
    }
  });
  for (int i = 0; i < kIterations; ++i) {
    segments[0]->header()->dead_rank.store(-1);
    segments[0]->header()->aborted_by.store(-1);
    started.store(i, std::memory_order_release);
    int by = -1;
    for (int polls = 0; (by = header->aborted_by.load(std::memory_order_acquire)) < 0; ++polls) {
      if (polls % 64 == 63) std::this_thread::yield();
    }
    const int dead = header->dead_rank.load(std::memory_order_acquire);
    if (by != 0 || dead != 1) ++torn;
    finished.store(i, std::memory_order_release);
  }
  abort_thread.join();
  EXPECT_EQ(torn, 0) << "of " << kIterations << " aborts, a waiter saw this many without their "
                     << "dead rank";
}

// Ranks 0 and 1 are threads, rank 2 a child process that exits right after the set-up without
// arriving. Rank 0 aborts naming no dead rank (as an interrupted rank does; or an aborting rank
// killed before it named one); rank 1, waiting, must name rank 2, which it can see is gone, not
// report that rank 0 abandoned the collective.
TEST(ShmBarrierTest, AWaiterNamesAnExitedRankThatTheAbortDidNotName) {
  harness::TempDir dir("concord-shm-test-");
  ASSERT_FALSE(dir.path().empty());
  auto store = FileStore::Create(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string prefix = UniquePrefix();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto segment = ShmSegment::Open(2, 3, kHalfBytes, prefix, store->get(), kTimeout);
    ::_exit(segment.ok() ? 0 : 3);
  }
  std::vector<std::unique_ptr<ShmSegment>> segments(2);
  harness::RunRanks(2, [&](int rank) {
    auto segment = ShmSegment::Open(rank, 3, kHalfBytes, prefix, store->get(), kTimeout);
    ASSERT_TRUE(segment.ok()) << segment.status().ToString();
    segments[rank] = std::move(*segment);
  });
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_TRUE(segments[0] && segments[1]);
  ShmBarrier rank0(segments[0].get(), 0, kTimeout, true, {});
  ShmBarrier rank1(segments[1].get(), 1, kTimeout, true, {});
  (void)rank0.Abort(-1, Status(Code::kBackendError, "interrupted"));
  const auto start = std::chrono::steady_clock::now();
  const Status s = rank1.Sync();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 2 (pid " + std::to_string(child) + ") exited"),
            std::string::npos)
      << s.ToString();
}

// Ranks 0 and 1 are threads; ranks 2.. child processes, forked before ranks 0 and 1 map
// the segment, each mapping it, then running `child(rank, its mapping, its barrier)` and exiting.
// Returns rank 0's and rank 1's mappings once every child has exited; fills `pids` with the
// children's.
std::vector<std::unique_ptr<ShmSegment>> MapWithChildren(
    int size, const std::function<void(int, ShmSegment&, ShmBarrier&)>& child,
    std::vector<pid_t>* pids) {
  harness::TempDir dir("concord-shm-test-");
  EXPECT_FALSE(dir.path().empty());
  auto store = FileStore::Create(dir.path());
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return {};
  const std::string prefix = UniquePrefix();
  for (int rank = 2; rank < size; ++rank) {
    const pid_t pid = ::fork();
    EXPECT_GE(pid, 0);
    if (pid == 0) {
      auto segment = ShmSegment::Open(rank, size, kHalfBytes, prefix, store->get(), kTimeout);
      if (!segment.ok()) ::_exit(3);
      ShmBarrier barrier(segment->get(), rank, kTimeout, true, {});
      child(rank, **segment, barrier);
      ::_exit(0);
    }
    pids->push_back(pid);
  }
  std::vector<std::unique_ptr<ShmSegment>> segments(2);
  harness::RunRanks(2, [&](int rank) {
    auto segment = ShmSegment::Open(rank, size, kHalfBytes, prefix, store->get(), kTimeout);
    ASSERT_TRUE(segment.ok()) << segment.status().ToString();
    segments[rank] = std::move(*segment);
  });
  for (pid_t pid : *pids) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  return segments;
}

// Rank 2 abandons the group (its job failed elsewhere: rank 0 aborted it) and exits; rank 3 dies
// without a word, before either arrives. Rank 1, waiting, names rank 3, the rank that failed, not
// rank 2, whose exit only followed the failure (before the fix: "rank 2 exited").
TEST(ShmBarrierTest, ARankThatAbandonedTheGroupIsNotNamedForItsExit) {
  std::vector<pid_t> pids;
  auto segments = MapWithChildren(
      4,
      [](int rank, ShmSegment&, ShmBarrier& barrier) {
        if (rank == 2) barrier.Abandon();
      },
      &pids);
  ASSERT_TRUE(segments.size() == 2 && segments[0] && segments[1] && pids.size() == 2);
  EXPECT_EQ(segments[1]->rank_block(2)->abandoned.load(), 1u);
  ShmBarrier rank1(segments[1].get(), 1, kTimeout, true, {});
  const Status s = rank1.Sync();
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 3 (pid " + std::to_string(pids[1]) + ") exited"),
            std::string::npos)
      << s.ToString();
  // Rank 0 arrives later and is told of rank 3 by rank 1's abort.
  ShmBarrier rank0(segments[0].get(), 0, kTimeout, true, {});
  const Status s0 = rank0.Sync();
  EXPECT_EQ(s0.code(), Code::kPeerFailure) << s0.ToString();
  EXPECT_NE(s0.message().find("rank 3 exited during a shared-memory collective (found by rank 1)"),
            std::string::npos)
      << s0.ToString();
}

// Rank 2 abandons the group and exits, and nobody else failed here: rank 1's wait fails at once,
// reporting the collective abandoned (a backend error, which the engine explains from its control
// plane), not that rank 2 exited.
TEST(ShmBarrierTest, AnAbandonedGroupFailsItsWaitersWithoutBlamingTheAbandoner) {
  std::vector<pid_t> pids;
  auto segments = MapWithChildren(
      3, [](int, ShmSegment&, ShmBarrier& barrier) { barrier.Abandon(); }, &pids);
  ASSERT_TRUE(segments.size() == 2 && segments[0] && segments[1] && pids.size() == 1);
  ShmBarrier rank1(segments[1].get(), 1, kTimeout, true, {});
  const auto start = std::chrono::steady_clock::now();
  const Status s = rank1.Sync();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(s.code(), Code::kBackendError) << s.ToString();
  EXPECT_NE(s.message().find("rank 2 abandoned the shared-memory collective"), std::string::npos)
      << s.ToString();
}

// Rank 2 reaches round 1 and only then abandons the group and exits (its job failed after its
// last collective: a peer died): round 1, which every rank reached, completes for ranks 0 and 1;
// round 2 fails, reporting the collective abandoned.
TEST(ShmBarrierTest, ARoundEveryRankReachedBeforeTheAbandonmentCompletes) {
  std::vector<pid_t> pids;
  auto segments = MapWithChildren(
      3,
      [](int rank, ShmSegment& segment, ShmBarrier& barrier) {
        segment.rank_block(rank)->arrived.store(1);  // as its Sync() of round 1 arrives
        barrier.Abandon();
      },
      &pids);
  ASSERT_TRUE(segments.size() == 2 && segments[0] && segments[1] && pids.size() == 1);
  std::vector<Status> first(2), second(2);
  harness::RunRanks(2, [&](int rank) {
    ShmBarrier barrier(segments[rank].get(), rank, kTimeout, true, {});
    first[rank] = barrier.Sync();
    second[rank] = barrier.Sync();
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(first[rank].ok()) << "rank " << rank << ": " << first[rank].ToString();
    EXPECT_EQ(second[rank].code(), Code::kBackendError)
        << "rank " << rank << ": " << second[rank].ToString();
  }
}

}  // namespace
}  // namespace shm_internal
}  // namespace concord
