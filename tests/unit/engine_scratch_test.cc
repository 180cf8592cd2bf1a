// The memory the engine keeps after a burst of large tensors: GrowingBuffer's trimming policy on
// its own (a burst is given back, repeated sizes never churn, a need that returns less often than
// once per window widens the window), and the engine's lane buffers, top-k scratch and result pool
// after a large reduce, top-k or owned allgather followed by many small steps, and in a steady
// loop (EngineStats::scratch_bytes, scratch_reallocations and kept_result_bytes).
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/lane.h"
#include "tests/unit/engine_test_util.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::RunRanks;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kCap = 64 * kMiB;

// Lists that each ask `buffer` for `bytes` (0: none).
void Lists(GrowingBuffer& buffer, size_t lists, size_t bytes) {
  for (size_t i = 0; i < lists; ++i) {
    if (bytes > 0) {
      ASSERT_NE(buffer.Get(bytes, kCap), nullptr);
    }
    buffer.EndList();
  }
}

TEST(GrowingBufferTest, ABurstIsGivenBackWithinTwoWindowsOfSmallerLists) {
  GrowingBuffer buffer;
  Lists(buffer, 1, 512 * kMiB);  // above the cap: exactly what was asked
  EXPECT_EQ(buffer.capacity(), 512 * kMiB);
  Lists(buffer, 2 * TrimWindow::kFirstWindow, 64 << 10);
  EXPECT_LT(buffer.capacity(), kMiB);
  // Lists that use no buffer at all free it too.
  Lists(buffer, 1, 8 * kMiB);
  Lists(buffer, 2 * TrimWindow::kFirstWindow, 0);
  EXPECT_EQ(buffer.capacity(), 0u);
}

TEST(GrowingBufferTest, RepeatedSizesNeverReallocate) {
  GrowingBuffer buffer;
  // Each step: one list of 3 MiB and one of 100 KiB (a quarter of 3 MiB's capacity is more).
  auto step = [&buffer] {
    Lists(buffer, 1, 3 * kMiB);
    Lists(buffer, 1, 100 << 10);
  };
  for (int i = 0; i < 5; ++i) step();
  const uint64_t before = buffer.reallocations();
  const size_t capacity = buffer.capacity();
  for (int i = 0; i < 100; ++i) step();
  EXPECT_EQ(buffer.reallocations(), before);
  EXPECT_EQ(buffer.capacity(), capacity);
}

TEST(GrowingBufferTest, ANeedThatReturnsLessOftenThanAWindowWidensItUntilItSettles) {
  GrowingBuffer buffer;
  // Each step asks for 16 MiB once, then runs 200 lists of 4 KiB: more than one window.
  auto step = [&buffer] {
    Lists(buffer, 1, 16 * kMiB);
    Lists(buffer, 200, 4096);
  };
  for (int i = 0; i < 10; ++i) step();
  EXPECT_GE(buffer.window(), 256u);
  const uint64_t before = buffer.reallocations();
  for (int i = 0; i < 100; ++i) step();
  EXPECT_EQ(buffer.reallocations(), before);
  EXPECT_GE(buffer.capacity(), 16 * kMiB);
}

TEST(GrowingBufferTest, SmallBuffersAreNotTrimmed) {
  GrowingBuffer buffer;
  Lists(buffer, 1, TrimWindow::kMinTrimBytes / 2);
  const uint64_t before = buffer.reallocations();
  Lists(buffer, 4 * TrimWindow::kFirstWindow, 1024);
  EXPECT_EQ(buffer.reallocations(), before);
  EXPECT_EQ(buffer.capacity(), TrimWindow::kMinTrimBytes / 2);
}

// Two ranks, one lane each, nothing inlined (every operation runs on a lane).
Job LaneJob() {
  return Job(2, [](Config& c) {
    c.lanes = 1;
    c.inline_threshold_bytes = 0;
  });
}

// One step: a group of `fused` allreduces of 1024 floats each (one fused batch).
void SmallStep(Engine& e, int step, int fused = 3) {
  std::vector<std::vector<float>> data(fused, std::vector<float>(1024, 1.0f));
  std::vector<std::shared_ptr<RequestState>> states;
  ASSERT_TRUE(e.GroupStart().ok());
  for (int k = 0; k < fused; ++k) {
    states.push_back(Submit(
        e, Entry(Request("small." + std::to_string(k), OpType::kAllreduce, DType::kFloat32, {1024}),
                 data[k].data(), data[k].data())));
  }
  ASSERT_TRUE(e.GroupEnd().ok());
  for (auto& s : states) ASSERT_TRUE(Await(s).ok()) << "step " << step;
}

// A reduce of `n` floats to rank 0: rank 1 reduces into its lane's scratch.
void Reduce(Engine& e, int rank, size_t n, const std::string& name) {
  std::vector<float> in(n, 1.0f), out(rank == 0 ? n : 0);
  TensorRequest r = Request(name, OpType::kReduce, DType::kFloat32, {static_cast<int64_t>(n)});
  r.root = 0;
  ASSERT_TRUE(Await(Submit(e, Entry(r, in.data(), rank == 0 ? out.data() : nullptr))).ok());
  if (rank == 0) {
    EXPECT_EQ(out[n - 1], 2.0f);
  }
}

TEST(EngineScratchTest, LaneBuffersShrinkBackAfterALargeReduce) {
  Job job = LaneJob();
  RunRanks(2, [&](int rank) {
    Engine& e = job[rank];
    Reduce(e, rank, 8 * kMiB / sizeof(float), "burst");
    SmallStep(e, 0);  // stats are updated after each list, here the reduce's
    if (rank == 1) {
      EXPECT_GE(e.stats().scratch_bytes.load(), 8 * kMiB);
    }
    for (uint32_t step = 1; step <= 2 * TrimWindow::kFirstWindow + 8; ++step) SmallStep(e, step);
    EXPECT_LT(e.stats().scratch_bytes.load(), kMiB) << "rank " << rank;
  });
}

// Top-k's selection scratch grows with the largest tensor it selected from, and the lanes'
// buffers with its encoded bytes and every rank's shares: all given back after the burst.
TEST(EngineScratchTest, TopkScratchShrinksBackAfterALargeTensor) {
  Job job = LaneJob();
  RunRanks(2, [&](int rank) {
    Engine& e = job[rank];
    auto topk = [&e](const std::string& name, size_t n) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) - 500.0f;
      TensorRequest r =
          Request(name, OpType::kAllreduce, DType::kFloat32, {static_cast<int64_t>(n)});
      r.compression = "topk:density=0.5";
      Status s = Await(Submit(e, Entry(r, v.data(), v.data())));
      ASSERT_TRUE(s.ok()) << s.ToString();
    };
    topk("burst", 4 * kMiB / sizeof(float) * 4);
    topk("small", 1024);
    EXPECT_GE(e.stats().scratch_bytes.load(), 16 * kMiB) << "rank " << rank;
    for (uint32_t step = 1; step <= 2 * TrimWindow::kFirstWindow + 8; ++step) topk("small", 1024);
    EXPECT_LT(e.stats().scratch_bytes.load(), kMiB) << "rank " << rank;
  });
}

TEST(EngineScratchTest, OwnedResultsOfABurstAreNotKeptForever) {
  Job job = LaneJob();
  RunRanks(2, [&](int rank) {
    Engine& e = job[rank];
    {
      std::vector<float> in(4 * kMiB / sizeof(float), 1.0f);
      auto state = Submit(e, Entry(Request("owned", OpType::kAllgather, DType::kFloat32,
                                           {static_cast<int64_t>(in.size())}),
                                   in.data(), nullptr));
      ASSERT_TRUE(Await(state).ok());
      EXPECT_EQ(state->output().bytes, 8 * kMiB);
    }  // the request is freed: its block is kept for reuse
    // Stats are updated after each list, after it completed its requests: two lists later they
    // show the freed block.
    SmallStep(e, 0);
    SmallStep(e, 1);
    EXPECT_EQ(e.stats().kept_result_bytes.load(), 8 * kMiB);
    for (uint64_t step = 2; step <= ResultBuffers::kFirstIdleWindow + 8; ++step) SmallStep(e, step);
    EXPECT_EQ(e.stats().kept_result_bytes.load(), 0u) << "rank " << rank;
  });
}

TEST(EngineScratchTest, ASteadyLoopNeitherAllocatesNorFreesScratch) {
  Job job = LaneJob();
  RunRanks(2, [&](int rank) {
    Engine& e = job[rank];
    std::vector<float> in(kMiB / sizeof(float), 1.0f);
    // Each step: a 2 MiB reduce (scratch on rank 1), an owned 2 MiB allgather, a fused group.
    auto step = [&](int s) {
      Reduce(e, rank, 2 * kMiB / sizeof(float), "reduce");
      auto gathered = Submit(e, Entry(Request("owned", OpType::kAllgather, DType::kFloat32,
                                              {static_cast<int64_t>(in.size())}),
                                      in.data(), nullptr));
      ASSERT_TRUE(Await(gathered).ok());
      SmallStep(e, s);
    };
    for (int s = 0; s < 5; ++s) step(s);
    const uint64_t reallocations = e.stats().scratch_reallocations.load();
    const uint64_t bytes = e.stats().scratch_bytes.load();
    for (int s = 0; s < 100; ++s) step(s);
    EXPECT_EQ(e.stats().scratch_reallocations.load(), reallocations) << "rank " << rank;
    EXPECT_EQ(e.stats().scratch_bytes.load(), bytes) << "rank " << rank;
  });
}

}  // namespace
}  // namespace concord
