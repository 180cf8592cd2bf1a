// LaneReductions (core/ordered_reduction.h) over the in-process backend, ranks as threads. That
// backend's own reductions fold in rank order (tests/unit/inproc_transport.cc), so deterministic
// mode's reductions built from Alltoallv and Allgatherv must give its bits exactly, for every
// float dtype, uneven and empty slices, several spans and uneven reduce-scatter counts; and
// without deterministic mode the backend's own reduction runs (one collective, not two).
#include "core/ordered_reduction.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "tests/common/ranks.h"
#include "tests/unit/inproc_transport.h"

namespace concord {
namespace {

using harness::RunRanks;

constexpr int kRanks = 3;
// Pieces of 64 bytes: the larger allreduces below run in several.
constexpr size_t kCap = 64;

// Rank `rank`'s `count` values of widely varying magnitude, stored as `dtype`.
std::vector<uint8_t> Values(DType dtype, size_t count, int rank, int salt) {
  std::mt19937 rng(1000 * salt + rank);
  std::vector<uint8_t> out(count * DTypeSize(dtype) + 1);
  std::vector<float> f(count);
  for (float& x : f) x = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, rng() % 13 - 6);
  for (size_t i = 0; i < count; ++i) {
    if (rng() & 1) f[i] = -f[i];
    switch (dtype) {
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(f[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t b = FloatToBFloat16(f[i]);
        std::memcpy(out.data() + 2 * i, &b, 2);
        break;
      }
      case DType::kFloat32:
        std::memcpy(out.data() + 4 * i, &f[i], 4);
        break;
      default: {
        const double d = f[i] * (1.0 + 1e-9 * (rng() % 1000));
        std::memcpy(out.data() + 8 * i, &d, 8);
      }
    }
  }
  return out;
}

class OrderedReductionTest : public ::testing::TestWithParam<DType> {};

TEST_P(OrderedReductionTest, AllreduceGivesTheRankOrderFoldsBits) {
  const DType dtype = GetParam();
  const size_t esize = DTypeSize(dtype);
  auto world = std::make_shared<InProcWorld>(kRanks, std::chrono::seconds(20));
  RunRanks(kRanks, [&](int rank) {
    Lane lane;
    lane.backend = world->MakeBackend(rank);
    int salt = 0;
    for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{5}, size_t{1001}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAverage}) {
        std::vector<uint8_t> want = Values(dtype, count, rank, ++salt);
        std::vector<uint8_t> got = want;
        ASSERT_TRUE(lane.backend->Allreduce(want.data(), count, dtype, op).ok());
        LaneReductions reductions(lane, true, kCap);
        ASSERT_TRUE(reductions.Allreduce(got.data(), count, dtype, op).ok());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), count * esize), 0)
            << count << " elements, op " << static_cast<int>(op);
      }
    }
    // Two spans at once, one of them empty, one odd.
    std::vector<uint8_t> a = Values(dtype, 7, rank, 90), b = Values(dtype, 0, rank, 91);
    std::vector<uint8_t> c = Values(dtype, 300, rank, 92);
    std::vector<uint8_t> wa = a, wc = c;
    ASSERT_TRUE(lane.backend->Allreduce(wa.data(), 7, dtype, ReduceOp::kSum).ok());
    ASSERT_TRUE(lane.backend->Allreduce(wc.data(), 300, dtype, ReduceOp::kSum).ok());
    LaneReductions reductions(lane, true, kCap);
    ASSERT_TRUE(
        reductions
            .AllreduceSpans({{a.data(), 7}, {b.data(), 0}, {c.data(), 300}}, dtype, ReduceOp::kSum)
            .ok());
    EXPECT_EQ(std::memcmp(a.data(), wa.data(), 7 * esize), 0);
    EXPECT_EQ(std::memcmp(c.data(), wc.data(), 300 * esize), 0);
  });
}

TEST_P(OrderedReductionTest, ReduceScatterGivesTheRankOrderFoldsBits) {
  const DType dtype = GetParam();
  const size_t esize = DTypeSize(dtype);
  auto world = std::make_shared<InProcWorld>(kRanks, std::chrono::seconds(20));
  RunRanks(kRanks, [&](int rank) {
    Lane lane;
    lane.backend = world->MakeBackend(rank);
    int salt = 0;
    for (const std::vector<size_t>& counts :
         std::vector<std::vector<size_t>>{{3, 0, 5}, {0, 0, 0}, {1, 1, 1}, {400, 401, 2}}) {
      const size_t total = counts[0] + counts[1] + counts[2];
      const std::vector<uint8_t> in = Values(dtype, total, rank, ++salt);
      std::vector<uint8_t> want(counts[rank] * esize + 1), got(counts[rank] * esize + 1);
      ASSERT_TRUE(
          lane.backend->ReduceScatter(in.data(), want.data(), counts, dtype, ReduceOp::kSum).ok());
      LaneReductions reductions(lane, true, kCap);
      ASSERT_TRUE(
          reductions.ReduceScatter(in.data(), got.data(), counts, dtype, ReduceOp::kSum).ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), counts[rank] * esize), 0)
          << counts[0] << ", " << counts[1] << ", " << counts[2];
    }
  });
}

INSTANTIATE_TEST_SUITE_P(FloatTypes, OrderedReductionTest,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                           DType::kFloat64),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(OrderedReductionSwitchTest, OnlyDeterministicModeFoldsInCore) {
  auto world = std::make_shared<InProcWorld>(kRanks, std::chrono::seconds(20));
  RunRanks(kRanks, [&](int rank) {
    Lane lane;
    lane.backend = world->MakeBackend(rank);
    float x[10] = {};
    ASSERT_TRUE(
        LaneReductions(lane, false, kCap).Allreduce(x, 10, DType::kFloat32, ReduceOp::kSum).ok());
  });
  EXPECT_EQ(world->CollectivesOn(0), 1u);  // the backend's allreduce
  RunRanks(kRanks, [&](int rank) {
    Lane lane;
    lane.backend = world->MakeBackend(rank);
    float x[10] = {};
    ASSERT_TRUE(
        LaneReductions(lane, true, kCap).Allreduce(x, 10, DType::kFloat32, ReduceOp::kSum).ok());
  });
  EXPECT_EQ(world->CollectivesOn(0), 3u);  // an all-to-all and an allgather
}

// A backend with ordered reductions of its own (as Gloo's): the in-process one, whose reductions
// fold in rank order already, counting the ordered calls it gets.
class OrderedCounting : public Backend {
 public:
  OrderedCounting(std::unique_ptr<Backend> inner, std::atomic<int>* ordered)
      : inner_(std::move(inner)), ordered_(ordered) {}
  const char* name() const override { return "ordered-counting"; }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool HasOrderedReductions() const override { return true; }
  Status OrderedReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                              DType dtype, ReduceOp op) override {
    ordered_->fetch_add(1);
    return inner_->ReduceScatter(in, out, counts, dtype, op);
  }
  Status OrderedAllreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    ordered_->fetch_add(1);
    return inner_->Allreduce(data, count, dtype, op);
  }
  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return inner_->Allreduce(data, count, dtype, op);
  }
  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    return inner_->Allgatherv(in, out, bytes);
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  Status Barrier() override { return inner_->Barrier(); }
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override {
    return inner_->ReduceScatter(in, out, counts, dtype, op);
  }
  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    return inner_->Alltoallv(in, send_bytes, out, recv_bytes);
  }

 private:
  std::unique_ptr<Backend> inner_;
  std::atomic<int>* ordered_;
};

// Deterministic mode runs a backend's own ordered reductions where it has them (one call each,
// whatever the piece size: the backend bounds its own scratch), and never without the mode.
TEST(OrderedReductionSwitchTest, ABackendsOwnOrderedReductionsRunInDeterministicModeOnly) {
  for (bool deterministic : {false, true}) {
    auto world = std::make_shared<InProcWorld>(kRanks, std::chrono::seconds(20));
    std::atomic<int> ordered{0};
    RunRanks(kRanks, [&](int rank) {
      Lane lane;
      lane.backend = std::make_unique<OrderedCounting>(world->MakeBackend(rank), &ordered);
      LaneReductions reductions(lane, deterministic, kCap);
      float x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
      ASSERT_TRUE(reductions.Allreduce(x, 10, DType::kFloat32, ReduceOp::kSum).ok());
      EXPECT_EQ(x[9], 30.0f);
      float in[6] = {1, 1, 2, 2, 3, 3}, out[2] = {};
      ASSERT_TRUE(
          reductions.ReduceScatter(in, out, {2, 2, 2}, DType::kFloat32, ReduceOp::kMax).ok());
      EXPECT_EQ(out[0], static_cast<float>(rank + 1));
    });
    EXPECT_EQ(ordered.load(), deterministic ? 2 * kRanks : 0) << deterministic;
  }
}

}  // namespace
}  // namespace concord
