// Tests of the shared-memory barrier's abort record (backends/shm/shm_barrier.h) on segments that
// ranks as threads (and a child process) map: an abort publishes the dead rank it names no later
// than its author, so that no waiter sees the one without the other; and a waiter told of an
// abort that names no dead rank still names a rank that exited instead of reporting the
// collective abandoned.
#include "backends/shm/shm_barrier.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
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

}  // namespace
}  // namespace shm_internal
}  // namespace concord
