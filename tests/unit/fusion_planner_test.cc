#include "core/fusion_planner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace concord {
namespace {

// A successful float32 sum allreduce of `elements` elements.
Response Small(const std::string& name, int64_t elements) {
  Response r;
  r.request.name = name;
  r.request.shape = {elements};
  return r;
}

// Plans over `responses` (by pointer, as the engine does).
std::vector<FusionBatch> Plan(const std::vector<Response>& responses, FusionOptions options) {
  std::vector<const Response*> ptrs;
  for (const auto& r : responses) ptrs.push_back(&r);
  return PlanFusion(ptrs, options);
}

// The members of every batch, for comparing whole plans.
std::vector<std::vector<size_t>> Members(const std::vector<FusionBatch>& batches) {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : batches) out.push_back(b.members);
  return out;
}

using Groups = std::vector<std::vector<size_t>>;

TEST(FusionPlannerTest, EmptyList) {
  EXPECT_TRUE(Plan({}, FusionOptions{}).empty());
}

TEST(FusionPlannerTest, CompatibleSmallAllreducesFuseUpToTheThreshold) {
  FusionOptions o;
  o.threshold = 100;  // bytes: two 40-byte tensors fit, a third does not
  o.direct_bytes = 1000;
  auto plan = Plan({Small("a", 10), Small("b", 10), Small("c", 10), Small("d", 5)}, o);
  EXPECT_EQ(Members(plan), (Groups{{0, 1, 3}, {2}}));
  EXPECT_EQ(plan[0].bytes, 100u);
  EXPECT_TRUE(plan[0].fused);
  EXPECT_EQ(plan[1].bytes, 40u);
  EXPECT_TRUE(plan[1].fused);  // a lone small tensor still uses the fusion buffer
}

TEST(FusionPlannerTest, LooksAheadPastIncompatibleOnes) {
  std::vector<Response> list = {Small("a", 4), Small("b", 4), Small("c", 4), Small("d", 4),
                                Small("e", 4), Small("f", 4), Small("g", 4)};
  list[1].request.dtype = DType::kFloat64;
  list[2].request.reduce_op = ReduceOp::kMax;
  list[3].request.prescale = 0.5;
  list[4].request.postscale = 2.0;
  list[5].request.device = 0;
  auto plan = Plan(list, FusionOptions{});
  EXPECT_EQ(Members(plan), (Groups{{0, 6}, {1}, {2}, {3}, {4}, {5}}));
  for (const auto& b : plan) EXPECT_TRUE(b.fused);
}

TEST(FusionPlannerTest, LargeAllreducesRunAloneInPlace) {
  FusionOptions o;
  o.direct_bytes = 64;
  auto plan = Plan({Small("a", 2), Small("big", 16), Small("b", 2), Small("bigger", 100)}, o);
  EXPECT_EQ(Members(plan), (Groups{{0, 2}, {1}, {3}}));
  EXPECT_TRUE(plan[0].fused);
  EXPECT_FALSE(plan[1].fused);
  EXPECT_EQ(plan[1].bytes, 64u);
  EXPECT_FALSE(plan[2].fused);
}

TEST(FusionPlannerTest, OtherOpsAndErrorsRunAlone) {
  std::vector<Response> list = {Small("a", 1),     Small("gather", 1), Small("b", 1),
                                Small("bcast", 1), Small("err", 1),    Small("barrier", 0),
                                Small("c", 1)};
  list[1].request.op = OpType::kAllgather;
  list[1].first_dims = {1};
  list[3].request.op = OpType::kBroadcast;
  list[4].error = Code::kMismatch;
  list[5].request.op = OpType::kBarrier;
  list[5].request.shape = {};
  auto plan = Plan(list, FusionOptions{});
  EXPECT_EQ(Members(plan), (Groups{{0, 2, 6}, {1}, {3}, {4}, {5}}));
  for (size_t i = 1; i < plan.size(); ++i) EXPECT_FALSE(plan[i].fused) << i;
}

// Small reducescatters fuse with each other whatever their splits and shapes, never with an
// allreduce; a large one runs alone, a compressed one of any size fuses with its kind.
TEST(FusionPlannerTest, ReducescattersFuseAmongThemselves) {
  FusionOptions o;
  o.direct_bytes = 64;
  std::vector<Response> list = {Small("rs.a", 4),     Small("ar", 4),   Small("rs.b", 6),
                                Small("rs.big", 16),  Small("rs.c", 2), Small("rs.fp16.a", 100),
                                Small("rs.fp16.b", 3)};
  for (size_t i : {0, 2, 3, 4, 5, 6}) {
    list[i].request.op = OpType::kReducescatter;
    list[i].request.splits = {list[i].request.shape[0]};
  }
  list[2].request.shape = {3, 2};  // another shape and split: still fuses
  list[2].request.splits = {3};
  list[5].request.compression = "fp16";
  list[6].request.compression = "fp16";
  auto plan = Plan(list, o);
  EXPECT_EQ(Members(plan), (Groups{{0, 2, 4}, {1}, {3}, {5, 6}}));
  EXPECT_TRUE(plan[0].fused);
  EXPECT_EQ(plan[0].bytes, 48u);
  EXPECT_FALSE(plan[2].fused);
  EXPECT_TRUE(plan[3].fused);
}

TEST(FusionPlannerTest, ThresholdZeroDisablesFusion) {
  FusionOptions o;
  o.threshold = 0;
  auto plan = Plan({Small("a", 1), Small("b", 1), Small("c", 0)}, o);
  EXPECT_EQ(Members(plan), (Groups{{0}, {1}, {2}}));
  for (const auto& b : plan) EXPECT_FALSE(b.fused);
}

TEST(FusionPlannerTest, ZeroSizedTensorsFuse) {
  auto plan = Plan({Small("a", 0), Small("b", 3), Small("c", 0)}, FusionOptions{});
  EXPECT_EQ(Members(plan), (Groups{{0, 1, 2}}));
  EXPECT_EQ(plan[0].bytes, 12u);
}

TEST(FusionPlannerTest, Deterministic) {
  std::vector<Response> list;
  for (int i = 0; i < 200; ++i) {
    list.push_back(Small("t" + std::to_string(i), (i * 37) % 300));
    list.back().request.dtype = (i % 3 == 0) ? DType::kFloat64 : DType::kFloat32;
  }
  FusionOptions o;
  o.threshold = 2000;
  o.direct_bytes = 1100;
  const auto first = Members(Plan(list, o));
  EXPECT_EQ(Members(Plan(list, o)), first);
  // Every response is in exactly one batch, each batch within the threshold when fused.
  std::vector<int> seen(list.size(), 0);
  for (const auto& b : Plan(list, o)) {
    for (size_t m : b.members) ++seen[m];
    if (b.fused) {
      EXPECT_LE(b.bytes, o.threshold);
    } else {
      EXPECT_EQ(b.members.size(), 1u);
    }
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

}  // namespace
}  // namespace concord

namespace concord {
namespace {

TEST(FusedMessageBytesTest, PowerOfTwoBelowOneMebibyteExactAbove) {
  EXPECT_EQ(FusedMessageBytes(0, 4), 4u);
  EXPECT_EQ(FusedMessageBytes(1, 1), 1u);
  EXPECT_EQ(FusedMessageBytes(4, 4), 4u);
  EXPECT_EQ(FusedMessageBytes(12, 4), 16u);
  EXPECT_EQ(FusedMessageBytes(4100, 2), 8192u);
  EXPECT_EQ(FusedMessageBytes(24, 8), 32u);
  EXPECT_EQ(FusedMessageBytes((1 << 20) - 4, 4), size_t{1} << 20);
  EXPECT_EQ(FusedMessageBytes((1 << 20) + 4, 4), (size_t{1} << 20) + 4);
  for (size_t payload = 1; payload < 5000; payload += 7) {
    for (size_t elem : {1, 2, 4, 8}) {
      const size_t bytes = FusedMessageBytes(payload * elem, elem);
      EXPECT_GE(bytes, payload * elem);
      EXPECT_LT(bytes, 2 * payload * elem + elem);
      EXPECT_EQ(bytes % elem, 0u);
    }
  }
}

}  // namespace
}  // namespace concord
