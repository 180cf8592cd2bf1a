// PlanLanes (core/lane_plan.h): span groups by dtype and backend reduction, shares that cover
// every element once and in order, whole batches for everything else, and balanced lanes.
#include "core/lane_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace concord {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A response list and its plan, built one operation at a time (each in a batch of its own unless
// fused with the previous one).
class Plan {
 public:
  size_t Add(OpType op, DType dtype, ReduceOp reduce, int64_t elements,
             bool fuse_with_last = false) {
    return AddShaped(op, dtype, reduce, {elements}, fuse_with_last);
  }
  size_t AddShaped(OpType op, DType dtype, ReduceOp reduce, std::vector<int64_t> shape,
                   bool fuse_with_last = false) {
    auto r = std::make_unique<Response>();
    r->request.name = "t" + std::to_string(owned_.size());
    r->request.op = op;
    r->request.dtype = dtype;
    r->request.reduce_op = reduce;
    r->request.shape = std::move(shape);
    const size_t index = owned_.size();
    responses.push_back(r.get());
    owned_.push_back(std::move(r));
    if (fuse_with_last) {
      batches.back().members.push_back(index);
      batches.back().bytes += responses[index]->request.NumBytes();
      batches.back().fused = true;
    } else {
      FusionBatch b;
      b.members = {index};
      b.bytes = responses[index]->request.NumBytes();
      batches.push_back(b);
    }
    return index;
  }
  std::vector<size_t> All() const {
    std::vector<size_t> all(batches.size());
    std::iota(all.begin(), all.end(), 0);
    return all;
  }

  std::vector<const Response*> responses;
  std::vector<FusionBatch> batches;

 private:
  std::vector<std::unique_ptr<Response>> owned_;
};

TEST(LanePlanTest, DirectAllreducesGroupByDTypeAndBackendReduction) {
  Plan p;
  const size_t a = p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kSum, 1000);
  const size_t b = p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kAverage, 7);
  const size_t c = p.Add(OpType::kAllreduce, DType::kInt32, ReduceOp::kSum, 3);
  const size_t d = p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kMax, 1);
  const LanePlan lp = PlanLanes(p.batches, p.All(), p.responses, 2, kMiB);
  ASSERT_EQ(lp.groups.size(), 3u);
  // An average reduces as a sum: it shares the sum's collective.
  EXPECT_EQ(lp.groups[0].members, (std::vector<size_t>{a, b}));
  EXPECT_EQ(lp.groups[0].op, ReduceOp::kSum);
  EXPECT_EQ(lp.groups[0].elements, 1007u);
  EXPECT_EQ(lp.groups[1].members, (std::vector<size_t>{c}));
  EXPECT_EQ(lp.groups[2].members, (std::vector<size_t>{d}));
  EXPECT_EQ(lp.groups[2].op, ReduceOp::kMax);
  // Small groups are not cut: one share each, spread over the lanes.
  size_t shares = 0;
  for (const auto& lane : lp.by_lane) shares += lane.size();
  EXPECT_EQ(shares, 3u);
}

// Checks that the shares of a one-group plan cover its members' elements once, in order.
void ExpectOrderedCover(const LanePlan& lp, const Plan& p, size_t expected_shares) {
  std::vector<std::vector<AllreducePiece>> shares;
  for (const auto& lane : lp.by_lane) {
    for (const LaneWork& w : lane) {
      ASSERT_FALSE(w.pieces.empty());
      shares.push_back(w.pieces);
    }
  }
  ASSERT_EQ(shares.size(), expected_shares);
  // Shares were cut in element order; lanes take them in turn, so sort them back by position.
  std::sort(shares.begin(), shares.end(), [](const auto& x, const auto& y) {
    return std::make_pair(x.front().member, x.front().begin) <
           std::make_pair(y.front().member, y.front().begin);
  });
  size_t member = 0, at = 0;
  for (const auto& share : shares) {
    for (const AllreducePiece& piece : share) {
      while (at == static_cast<size_t>(p.responses[member]->request.NumElements())) {
        ++member;
        at = 0;
      }
      EXPECT_EQ(piece.member, member);
      EXPECT_EQ(piece.begin, at);
      EXPECT_GT(piece.count, 0u);
      at += piece.count;
    }
  }
  EXPECT_EQ(member, p.responses.size() - 1);
  EXPECT_EQ(at, static_cast<size_t>(p.responses.back()->request.NumElements()));
}

TEST(LanePlanTest, LargeGroupIsCutIntoSharesOfAtLeastTheMinimum) {
  Plan p;
  // 0.75 + 0.5 + 1 MiB and odd sizes: 2.25 MiB of floats, two shares of at least 1 MiB.
  p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kSum, 196608);
  p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kSum, 131071);
  p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kSum, 262147);
  p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kSum, 1);
  const LanePlan lp = PlanLanes(p.batches, p.All(), p.responses, 4, kMiB);
  ASSERT_EQ(lp.groups.size(), 1u);
  for (const auto& lane : lp.by_lane) EXPECT_LE(lane.size(), 1u);
  ExpectOrderedCover(lp, p, 2);
}

TEST(LanePlanTest, ShareCountIsCappedByTheLanes) {
  Plan p;
  p.Add(OpType::kAllreduce, DType::kFloat64, ReduceOp::kSum, 3 * 1048576 + 5);  // 24 MiB
  const LanePlan lp = PlanLanes(p.batches, p.All(), p.responses, 3, kMiB);
  ExpectOrderedCover(lp, p, 3);
  for (const auto& lane : lp.by_lane) EXPECT_EQ(lane.size(), 1u);
}

// Shares are cut without forming elements * k: a group of 2^63 elements (four of 2^61) still
// splits into four shares that cover it in order (the product wrapped past 2^64 and lost half of
// the group).
TEST(LanePlanTest, AGroupPastTwoToTheSixtyFourOverTheSharesIsCutWhole) {
  Plan p;
  // Planning reads only shapes: no memory of this size exists.
  for (int i = 0; i < 4; ++i) {
    p.AddShaped(OpType::kAllreduce, DType::kUint8, ReduceOp::kSum,
                {int64_t{1} << 31, int64_t{1} << 30});
  }
  const LanePlan lp = PlanLanes(p.batches, p.All(), p.responses, 4, kMiB);
  ASSERT_EQ(lp.groups.size(), 1u);
  EXPECT_EQ(lp.groups[0].elements, size_t{1} << 63);
  ExpectOrderedCover(lp, p, 4);
}

// A group whose bytes pass 2^64 (2^62 float64 elements) is cut into one share per lane; its
// byte count wrapped to 0, which made it one share.
TEST(LanePlanTest, AGroupPastTwoToTheSixtyFourBytesGetsEveryLane) {
  Plan p;
  p.AddShaped(OpType::kAllreduce, DType::kFloat64, ReduceOp::kSum,
              {int64_t{1} << 31, int64_t{1} << 31});
  const LanePlan lp = PlanLanes(p.batches, p.All(), p.responses, 4, kMiB);
  ExpectOrderedCover(lp, p, 4);
}

TEST(LanePlanTest, EmptyAllreducesFormAGroupWithoutWork) {
  Plan p;
  const size_t a = p.Add(OpType::kAllreduce, DType::kFloat16, ReduceOp::kSum, 0);
  const LanePlan lp = PlanLanes(p.batches, p.All(), p.responses, 2, kMiB);
  // It completes with its group, though no lane runs anything for it.
  ASSERT_EQ(lp.groups.size(), 1u);
  EXPECT_EQ(lp.groups[0].members, (std::vector<size_t>{a}));
  for (const auto& lane : lp.by_lane) EXPECT_TRUE(lane.empty());
}

TEST(LanePlanTest, OtherBatchesRunWholeOnTheLeastLoadedLane) {
  Plan p;
  p.Add(OpType::kAllgather, DType::kUint8, ReduceOp::kSum, 1000);
  p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kSum, 10);
  p.Add(OpType::kAllreduce, DType::kFloat32, ReduceOp::kSum, 20, /*fuse_with_last=*/true);
  p.Add(OpType::kBroadcast, DType::kUint8, ReduceOp::kSum, 10);
  Response failed;
  failed.request.name = "failed";
  failed.request.shape = {4};
  failed.error = Code::kMismatch;
  p.responses.push_back(&failed);
  FusionBatch fb;
  fb.members = {p.responses.size() - 1};
  p.batches.push_back(fb);
  const LanePlan lp = PlanLanes(p.batches, p.All(), p.responses, 2, kMiB);
  // A fused batch and an error response are never span work.
  EXPECT_TRUE(lp.groups.empty());
  std::vector<size_t> lane_of(p.batches.size(), 99);
  for (size_t l = 0; l < lp.by_lane.size(); ++l) {
    for (const LaneWork& w : lp.by_lane[l]) {
      EXPECT_TRUE(w.pieces.empty());
      lane_of[w.batch] = l;
    }
  }
  // 1000 bytes to lane 0; then the lighter lane 1 takes the 120-byte fused batch, the broadcast
  // and the failed response (lane 1 stays lighter than 1000 bytes).
  EXPECT_EQ(lane_of[0], 0u);
  EXPECT_EQ(lane_of[1], 1u);
  EXPECT_EQ(lane_of[2], 1u);
  EXPECT_EQ(lane_of[3], 1u);
}

TEST(LanePlanTest, SameInputSamePlan) {
  Plan p;
  for (int i = 0; i < 40; ++i) {
    p.Add(OpType::kAllreduce, i % 3 ? DType::kFloat32 : DType::kBFloat16,
          i % 2 ? ReduceOp::kSum : ReduceOp::kAverage, 1 + 37 * i * i);
  }
  const LanePlan x = PlanLanes(p.batches, p.All(), p.responses, 3, 64 << 10);
  const LanePlan y = PlanLanes(p.batches, p.All(), p.responses, 3, 64 << 10);
  ASSERT_EQ(x.by_lane.size(), y.by_lane.size());
  for (size_t l = 0; l < x.by_lane.size(); ++l) {
    ASSERT_EQ(x.by_lane[l].size(), y.by_lane[l].size());
    for (size_t k = 0; k < x.by_lane[l].size(); ++k) {
      ASSERT_EQ(x.by_lane[l][k].pieces.size(), y.by_lane[l][k].pieces.size());
      for (size_t q = 0; q < x.by_lane[l][k].pieces.size(); ++q) {
        EXPECT_EQ(x.by_lane[l][k].pieces[q].member, y.by_lane[l][k].pieces[q].member);
        EXPECT_EQ(x.by_lane[l][k].pieces[q].begin, y.by_lane[l][k].pieces[q].begin);
        EXPECT_EQ(x.by_lane[l][k].pieces[q].count, y.by_lane[l][k].pieces[q].count);
      }
    }
  }
}

}  // namespace
}  // namespace concord
