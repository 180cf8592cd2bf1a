// Tests of ResultBuffers (core/result_buffers.h), the memory of results that requests own: a freed
// block is taken again for a result it fits without wasting half of it, small and huge blocks are
// not kept, the limits drop the oldest blocks, a block may outlive its pool, and threads take and
// free blocks concurrently.
#include "core/result_buffers.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace concord {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(ResultBuffersTest, AFreedBlockIsTakenAgainForAResultItFits) {
  auto pool = std::make_shared<ResultBuffers>();
  uint8_t* first = nullptr;
  {
    ResultBuffers::Block b = pool->Take(4 * kMiB);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), 4 * kMiB);
    std::memset(b.data(), 7, b.size());  // the whole block is writable
    first = b.data();
  }
  EXPECT_EQ(pool->kept(), 1u);
  EXPECT_EQ(pool->kept_bytes(), 4 * kMiB);
  ResultBuffers::Block again = pool->Take(3 * kMiB);  // fits, wastes less than half
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(again.size(), 3 * kMiB);
  EXPECT_EQ(pool->kept(), 0u);
  EXPECT_EQ(pool->kept_bytes(), 0u);
}

TEST(ResultBuffersTest, ABlockTooLargeOrTooSmallForTheResultIsNotTaken) {
  auto pool = std::make_shared<ResultBuffers>();
  { ResultBuffers::Block b = pool->Take(4 * kMiB); }
  ResultBuffers::Block small = pool->Take(kMiB);  // would waste 3/4 of the kept block
  ResultBuffers::Block large = pool->Take(5 * kMiB);
  EXPECT_EQ(pool->kept(), 1u);
  EXPECT_EQ(small.size(), kMiB);
  EXPECT_EQ(large.size(), 5 * kMiB);
}

TEST(ResultBuffersTest, TheSmallestFittingBlockIsTaken) {
  auto pool = std::make_shared<ResultBuffers>();
  uint8_t* three = nullptr;
  {
    ResultBuffers::Block a = pool->Take(4 * kMiB);
    ResultBuffers::Block b = pool->Take(3 * kMiB);
    three = b.data();
  }
  ResultBuffers::Block taken = pool->Take(2 * kMiB);
  EXPECT_EQ(taken.data(), three);
  EXPECT_EQ(pool->kept(), 1u);
  EXPECT_EQ(pool->kept_bytes(), 4 * kMiB);
}

TEST(ResultBuffersTest, EmptySmallAndHugeBlocksAreNotKept) {
  auto pool = std::make_shared<ResultBuffers>();
  {
    ResultBuffers::Block empty = pool->Take(0);
    EXPECT_EQ(empty.data(), nullptr);
    EXPECT_EQ(empty.size(), 0u);
    ResultBuffers::Block one = pool->Take(1);
    ResultBuffers::Block small = pool->Take(ResultBuffers::kMinKeptBytes - 1);
    ResultBuffers::Block huge = pool->Take(ResultBuffers::kMaxKeptBytes + 1);
    ASSERT_NE(huge.data(), nullptr);
  }
  EXPECT_EQ(pool->kept(), 0u);
  { ResultBuffers::Block smallest = pool->Take(ResultBuffers::kMinKeptBytes); }
  EXPECT_EQ(pool->kept(), 1u);
}

TEST(ResultBuffersTest, TheLimitsDropTheOldestBlocks) {
  auto pool = std::make_shared<ResultBuffers>();
  {
    std::vector<ResultBuffers::Block> blocks;
    for (size_t i = 0; i < ResultBuffers::kMaxKept + 3; ++i) blocks.push_back(pool->Take(kMiB));
    uint8_t* last = blocks.back().data();
    blocks.clear();  // freed in order: the first three are dropped
    EXPECT_EQ(pool->kept(), ResultBuffers::kMaxKept);
    EXPECT_EQ(pool->kept_bytes(), ResultBuffers::kMaxKept * kMiB);
    bool last_kept = false;
    for (size_t i = 0; i < ResultBuffers::kMaxKept; ++i) {
      blocks.push_back(pool->Take(kMiB));
      last_kept |= blocks.back().data() == last;
    }
    EXPECT_TRUE(last_kept);
  }
  // Bytes: two blocks of more than half the limit cannot both stay.
  auto bytes = std::make_shared<ResultBuffers>();
  {
    ResultBuffers::Block a = bytes->Take(ResultBuffers::kMaxKeptBytes / 2 + kMiB);
    ResultBuffers::Block b = bytes->Take(ResultBuffers::kMaxKeptBytes / 2 + kMiB);
  }
  EXPECT_EQ(bytes->kept(), 1u);
  EXPECT_LE(bytes->kept_bytes(), ResultBuffers::kMaxKeptBytes);
}

TEST(ResultBuffersTest, MovingABlockMovesItsMemoryAndReturnsWhatItHeld) {
  auto pool = std::make_shared<ResultBuffers>();
  ResultBuffers::Block a = pool->Take(2 * kMiB);
  uint8_t* memory = a.data();
  ResultBuffers::Block b = std::move(a);
  EXPECT_EQ(b.data(), memory);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(pool->kept(), 0u);
  b = pool->Take(kMiB);  // the 2 MiB block goes back to the pool
  EXPECT_EQ(pool->kept(), 1u);
  EXPECT_EQ(pool->kept_bytes(), 2 * kMiB);
}

TEST(ResultBuffersTest, ABlockMayOutliveItsPool) {
  ResultBuffers::Block b;
  {
    auto pool = std::make_shared<ResultBuffers>();
    b = pool->Take(kMiB);
  }
  // Still valid (AddressSanitizer would report a freed block); freed, not kept, when b goes.
  ASSERT_NE(b.data(), nullptr);
  ASSERT_EQ(b.size(), kMiB);
  std::memset(b.data(), 1, b.size());
  EXPECT_EQ(b.data()[0], 1);
  EXPECT_EQ(b.data()[kMiB - 1], 1);
}

TEST(ResultBuffersTest, ThreadsTakeAndFreeBlocksConcurrently) {
  auto pool = std::make_shared<ResultBuffers>();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([pool, t] {
      for (int i = 0; i < 200; ++i) {
        ResultBuffers::Block b = pool->Take(kMiB / 4 * (1 + (i + t) % 4));
        b.data()[0] = static_cast<uint8_t>(i);
        b.data()[b.size() - 1] = static_cast<uint8_t>(t);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(pool->kept(), ResultBuffers::kMaxKept);
}

// A block nobody takes for idle_window() response lists is freed: a burst of large results does
// not stay for the communicator's life.
TEST(ResultBuffersTest, ABlockKeptIdleForAWindowOfListsIsFreed) {
  auto pool = std::make_shared<ResultBuffers>();
  { ResultBuffers::Block b = pool->Take(64 * kMiB); }
  for (uint64_t i = 1; i < ResultBuffers::kFirstIdleWindow; ++i) pool->EndList();
  EXPECT_EQ(pool->kept_bytes(), 64 * kMiB);
  pool->EndList();
  EXPECT_EQ(pool->kept(), 0u);
  EXPECT_EQ(pool->kept_bytes(), 0u);
}

// A result taken and freed again every list stays kept (a steady loop never allocates); one
// asked for less often than once per window was freed too early, and widens the window until it
// is kept across its period.
TEST(ResultBuffersTest, AResultAskedForAgainIsKeptAndWidensTheWindow) {
  auto pool = std::make_shared<ResultBuffers>();
  uint8_t* first = nullptr;
  {
    ResultBuffers::Block b = pool->Take(4 * kMiB);
    first = b.data();
  }
  for (uint64_t i = 0; i < 4 * ResultBuffers::kFirstIdleWindow; ++i) {
    ResultBuffers::Block b = pool->Take(4 * kMiB);
    EXPECT_EQ(b.data(), first) << "list " << i;
    pool->EndList();
  }
  EXPECT_EQ(pool->idle_window(), ResultBuffers::kFirstIdleWindow);

  // Asked for every 300 lists: freed once, then the window doubles and it is kept.
  const uint64_t period = ResultBuffers::kFirstIdleWindow + 44;
  uint8_t* taken = nullptr;
  int fresh = 0;
  for (int round = 0; round < 6; ++round) {
    {
      ResultBuffers::Block b = pool->Take(4 * kMiB);
      if (b.data() != taken) ++fresh;
      taken = b.data();
    }
    for (uint64_t i = 0; i < period; ++i) pool->EndList();
  }
  EXPECT_EQ(pool->idle_window(), 2 * ResultBuffers::kFirstIdleWindow);
  EXPECT_EQ(pool->kept(), 1u);  // kept across the last period
  // The first block and the one after the early free (which may reuse its address), no more.
  EXPECT_LE(fresh, 2);
}

}  // namespace
}  // namespace concord
