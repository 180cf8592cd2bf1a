// Tests of the Gloo backend's allreduce cache: reuse across buffers, rebinding, LRU bounds by
// count and bytes (what the entries hold), with 2 ranks as threads; which buffers Gloo's algorithm
// objects can take.
#include "backends/gloo/allreduce_cache.h"

#include <gtest/gtest.h>

#include <climits>
#include <functional>
#include <vector>

#include "backends/gloo/gloo_context.h"
#include "tests/gloo/gloo_test_util.h"

namespace concord {
namespace gloo_internal {
namespace {

// Runs body(cache, rank) on two ranks, each with its own cache over its own Gloo context.
void RunTwoRanks(size_t max_entries, size_t max_bytes,
                 const std::function<void(AllreduceCache&, int rank)>& body) {
  testing_gloo::RunContextRanks(2, [&](const std::shared_ptr<GlooContext>& context, int rank) {
    AllreduceCache cache(context, context, max_entries, max_bytes);
    body(cache, rank);
  });
}

void SumOnce(AllreduceCache& cache, AllreduceAlgorithm algorithm, std::vector<float>& buf,
             int rank) {
  for (float& v : buf) v = static_cast<float>(rank + 1);
  cache.Run(algorithm, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
  for (float v : buf) ASSERT_EQ(v, 3.0f);
}

TEST(AllreduceCacheTest, ObjectAlgorithmsIgnoreTheCallersPointer) {
  RunTwoRanks(8, size_t{1} << 20, [](AllreduceCache& cache, int rank) {
    std::vector<float> a(100), b(100);
    SumOnce(cache, AllreduceAlgorithm::kRing, a, rank);
    SumOnce(cache, AllreduceAlgorithm::kRing, a, rank);
    // Average shares the sum's entry.
    cache.Run(AllreduceAlgorithm::kRing, a.data(), a.size(), DType::kFloat32, ReduceOp::kAverage);
    // Only rank 0 changes buffers: both must keep meeting on the same object.
    SumOnce(cache, AllreduceAlgorithm::kRing, rank == 0 ? b : a, rank);
    EXPECT_EQ(cache.builds(), 1u);
    EXPECT_EQ(cache.entries(), 1u);
  });
}

TEST(AllreduceCacheTest, FunctionStyleKeepsOneEntryPerPointer) {
  RunTwoRanks(8, size_t{1} << 20, [](AllreduceCache& cache, int rank) {
    std::vector<float> a(100), b(100);
    SumOnce(cache, AllreduceAlgorithm::kFunction, a, rank);
    SumOnce(cache, AllreduceAlgorithm::kFunction, a, rank);
    EXPECT_EQ(cache.builds(), 1u);
    // Only rank 0 switches buffers: function-style entries own no slots, so that is safe.
    SumOnce(cache, AllreduceAlgorithm::kFunction, rank == 0 ? b : a, rank);
    EXPECT_EQ(cache.builds(), rank == 0 ? 2u : 1u);
    EXPECT_EQ(cache.entries(), rank == 0 ? 2u : 1u);
    SumOnce(cache, AllreduceAlgorithm::kFunction, a, rank);  // a is still bound on both ranks
    EXPECT_EQ(cache.builds(), rank == 0 ? 2u : 1u);
  });
}

TEST(AllreduceCacheTest, FunctionStyleEntriesAreBoundedByCount) {
  RunTwoRanks(2, size_t{1} << 20, [](AllreduceCache& cache, int rank) {
    std::vector<std::vector<float>> bufs(3, std::vector<float>(50));
    for (auto& buf : bufs) SumOnce(cache, AllreduceAlgorithm::kFunction, buf, rank);
    EXPECT_EQ(cache.entries(), 2u);
    EXPECT_EQ(cache.builds(), 3u);
    SumOnce(cache, AllreduceAlgorithm::kFunction, bufs[0], rank);  // evicted: built again
    EXPECT_EQ(cache.builds(), 4u);
  });
}

TEST(AllreduceCacheTest, EvictsLeastRecentlyUsedByCount) {
  RunTwoRanks(3, size_t{1} << 30, [](AllreduceCache& cache, int rank) {
    std::vector<std::vector<float>> bufs = {std::vector<float>(10), std::vector<float>(20),
                                            std::vector<float>(30), std::vector<float>(40)};
    for (int i = 0; i < 3; ++i) SumOnce(cache, AllreduceAlgorithm::kHalvingDoubling, bufs[i], rank);
    SumOnce(cache, AllreduceAlgorithm::kHalvingDoubling, bufs[0], rank);  // 0 becomes most recent
    SumOnce(cache, AllreduceAlgorithm::kHalvingDoubling, bufs[3], rank);  // evicts 1
    EXPECT_EQ(cache.entries(), 3u);
    EXPECT_EQ(cache.builds(), 4u);
    SumOnce(cache, AllreduceAlgorithm::kHalvingDoubling, bufs[0], rank);  // still cached
    EXPECT_EQ(cache.builds(), 4u);
    SumOnce(cache, AllreduceAlgorithm::kHalvingDoubling, bufs[1], rank);  // rebuilt
    EXPECT_EQ(cache.builds(), 5u);
  });
}

TEST(AllreduceCacheTest, EvictsByBytesButKeepsOneOversizedEntry) {
  // ring_chunked entries hold 3x their data (ObjectEntryBytes).
  RunTwoRanks(64, 3000, [](AllreduceCache& cache, int rank) {
    std::vector<float> small(100), other(150), big(1000);
    SumOnce(cache, AllreduceAlgorithm::kRingChunked, small, rank);  // 400 bytes: 1200 held
    SumOnce(cache, AllreduceAlgorithm::kRingChunked, other, rank);  // 600 bytes: 3000 in all
    EXPECT_EQ(cache.entries(), 2u);
    EXPECT_EQ(cache.bytes(), 3000u);
    SumOnce(cache, AllreduceAlgorithm::kRingChunked, big, rank);  // 4000 bytes: alone
    EXPECT_EQ(cache.entries(), 1u);
    EXPECT_EQ(cache.bytes(), 12000u);
    SumOnce(cache, AllreduceAlgorithm::kRingChunked, small, rank);
    EXPECT_EQ(cache.entries(), 1u);
    EXPECT_EQ(cache.bytes(), 1200u);
  });
}

// The bytes bound counts what an entry holds (its buffer and Gloo's scratch), not only the data:
// with the data alone, 256 entries of 800 KB held about 600 MiB per lane.
TEST(AllreduceCacheTest, BytesCountTheAlgorithmsScratch) {
  EXPECT_EQ(ObjectEntryBytes(AllreduceAlgorithm::kRing, 100, DType::kFloat32), 1200u);
  EXPECT_EQ(ObjectEntryBytes(AllreduceAlgorithm::kRingChunked, 100, DType::kFloat64), 2400u);
  EXPECT_EQ(ObjectEntryBytes(AllreduceAlgorithm::kHalvingDoubling, 100, DType::kFloat16), 400u);
  EXPECT_EQ(ObjectEntryBytes(AllreduceAlgorithm::kBcube, 100, DType::kUint8), 200u);
  EXPECT_EQ(ObjectEntryBytes(AllreduceAlgorithm::kFunction, 100, DType::kFloat32), 0u);
  // Room for two halving-doubling entries of about 100 floats (about 800 bytes each), not three.
  RunTwoRanks(64, 1700, [](AllreduceCache& cache, int rank) {
    std::vector<std::vector<float>> bufs = {std::vector<float>(100), std::vector<float>(101),
                                            std::vector<float>(102)};
    for (auto& buf : bufs) SumOnce(cache, AllreduceAlgorithm::kHalvingDoubling, buf, rank);
    EXPECT_EQ(cache.entries(), 2u);
    EXPECT_LE(cache.bytes(), 1700u);
    SumOnce(cache, AllreduceAlgorithm::kHalvingDoubling, bufs[0], rank);  // evicted: built again
    EXPECT_EQ(cache.builds(), 4u);
  });
}

// Gloo's algorithm objects keep the buffer's bytes in an int (gloo/allreduce_ring.h: `const int
// bytes_ = count_ * sizeof(T)`): past INT_MAX bytes, whatever the element count, they must not run.
TEST(GlooAllreduceTest, ObjectAlgorithmsNeedTheirBytesToFitAnInt) {
  const size_t max = static_cast<size_t>(INT_MAX);
  EXPECT_TRUE(AlgorithmObjectFits(max, 1));
  EXPECT_FALSE(AlgorithmObjectFits(max + 1, 1));
  EXPECT_TRUE(AlgorithmObjectFits(max / 4, 4));
  EXPECT_FALSE(AlgorithmObjectFits(max / 4 + 1, 4));  // 2 GiB of float32: fewer than INT_MAX
  EXPECT_FALSE(AlgorithmObjectFits(max / 8 + 1, 8));
  EXPECT_FALSE(AlgorithmObjectFits(max / 2 + 1, 2));
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRingChunked,
                               AllreduceAlgorithm::kHalvingDoubling}) {
    EXPECT_TRUE(AlgorithmSupports(a, 3, max / 8, 8));
    EXPECT_FALSE(AlgorithmSupports(a, 3, max / 8 + 1, 8));
    EXPECT_FALSE(AlgorithmSupports(a, 3, (size_t{1} << 29) + 1, 4));
  }
  EXPECT_TRUE(AlgorithmSupports(AllreduceAlgorithm::kFunction, 3, size_t{1} << 40, 8));
}

}  // namespace
}  // namespace gloo_internal
}  // namespace concord
