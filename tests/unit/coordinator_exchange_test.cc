// The coordinator and response cache with reducescatter and alltoall: every rank's alltoall
// splits in the response, the splits compared for reducescatter, splits that do not fit their
// request refused as protocol errors, and which alltoalls the cache keeps.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/coordinator.h"

namespace concord {
namespace {

TensorRequest Split(const std::string& name, OpType op, std::vector<int64_t> shape,
                    std::vector<int64_t> splits) {
  TensorRequest r;
  r.name = name;
  r.op = op;
  r.shape = std::move(shape);
  r.splits = std::move(splits);
  return r;
}

RequestMessage Full(const TensorRequest& r) {
  RequestMessage m;
  m.requests.push_back(r);
  return m;
}

class CoordinatorExchangeTest : public ::testing::Test {
 protected:
  void Start(int size) {
    coordinator_ = std::make_unique<Coordinator>(size, &cache_, StallOptions{});
  }
  void Add(int rank, const TensorRequest& r) {
    const Status s = coordinator_->Add(rank, Full(r), Clock::now());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  Response TakeOne() {
    StatusOr<ResponseMessage> m = coordinator_->TakeReady(Clock::now());
    EXPECT_TRUE(m.ok() && m->items.size() == 1u);
    return m.ok() && m->items.size() == 1u ? m->items[0].response : Response();
  }
  ResponseCache cache_{64};
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorExchangeTest, AlltoallResponseCarriesEveryRanksSplits) {
  Start(3);
  const std::vector<std::vector<int64_t>> splits = {{1, 0, 2}, {0, 0, 0}, {4, 1, 1}};
  std::vector<TensorRequest> requests;
  for (int r = 0; r < 3; ++r) {
    int64_t rows = 0;
    for (int64_t c : splits[r]) rows += c;
    requests.push_back(Split("a2a", OpType::kAlltoall, {rows, 5}, splits[r]));
    Add(r, requests.back());
  }
  const Response resp = TakeOne();
  ASSERT_EQ(resp.error, Code::kOk) << resp.error_message;
  EXPECT_EQ(resp.first_dims, (std::vector<int64_t>{3, 0, 6}));
  EXPECT_EQ(resp.splits, (std::vector<int64_t>{1, 0, 2, 0, 0, 0, 4, 1, 1}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(resp.RequestOf(r), requests[r]) << "rank " << r;
    EXPECT_TRUE(resp.IsRequestOf(requests[r], r)) << "rank " << r;
    EXPECT_FALSE(resp.IsRequestOf(requests[(r + 1) % 3], r)) << "rank " << r;
  }
}

TEST_F(CoordinatorExchangeTest, ReducescatterSplitsMustAgree) {
  Start(3);
  Add(0, Split("rs", OpType::kReducescatter, {6}, {2, 2, 2}));
  Add(1, Split("rs", OpType::kReducescatter, {6}, {6, 0, 0}));
  Add(2, Split("rs", OpType::kReducescatter, {6}, {2, 2, 2}));
  const Response resp = TakeOne();
  EXPECT_EQ(resp.error, Code::kMismatch);
  EXPECT_NE(resp.error_message.find("tensor 'rs'"), std::string::npos) << resp.error_message;
  EXPECT_NE(resp.error_message.find("splits: [2, 2, 2] on ranks 0, 2; [6, 0, 0] on rank 1"),
            std::string::npos)
      << resp.error_message;
}

TEST_F(CoordinatorExchangeTest, AlltoallOpMismatchIsNamed) {
  Start(2);
  Add(0, Split("x", OpType::kAlltoall, {2}, {1, 1}));
  Add(1, Split("x", OpType::kReducescatter, {2}, {1, 1}));
  const Response resp = TakeOne();
  EXPECT_EQ(resp.error, Code::kMismatch);
  EXPECT_NE(resp.error_message.find("alltoall on rank 0; reducescatter on rank 1"),
            std::string::npos)
      << resp.error_message;
}

TEST_F(CoordinatorExchangeTest, SplitsThatDoNotFitAreProtocolErrors) {
  Start(2);
  // (Negative splits never get here: the wire format refuses them, message.cc.)
  const TensorRequest bad[] = {
      Split("a", OpType::kAlltoall, {4}, {1, 1}),    // sums to 2, not 4
      Split("b", OpType::kReducescatter, {4}, {4}),  // one split for two ranks
      Split("c", OpType::kAlltoall, {}, {0, 0}),     // a scalar
      Split("d", OpType::kAllreduce, {4}, {2, 2}),   // splits on an allreduce
  };
  for (const TensorRequest& r : bad) {
    const Status s = coordinator_->Add(1, Full(r), Clock::now());
    EXPECT_EQ(s.code(), Code::kProtocolError) << r.name << ": " << s.ToString();
    EXPECT_NE(s.message().find("'" + r.name + "'"), std::string::npos) << s.message();
  }
}

TEST(ResponseCacheExchangeTest, EvenAlltoallsAreCachedUnevenOnesNot) {
  ResponseCache cache(8);
  Response even;
  even.request = Split("even", OpType::kAlltoall, {4}, {2, 2});
  even.first_dims = {4, 4};
  even.splits = {2, 2, 2, 2};
  cache.Insert(even);
  EXPECT_EQ(cache.size(), 1u);
  ASSERT_TRUE(cache.Lookup(Split("even", OpType::kAlltoall, {4}, {2, 2}), 1).has_value());
  EXPECT_FALSE(cache.Lookup(Split("even", OpType::kAlltoall, {4}, {3, 1}), 1).has_value());
  Response uneven = even;
  uneven.request.name = "uneven";
  uneven.splits = {2, 2, 3, 1};
  cache.Insert(uneven);
  EXPECT_EQ(cache.size(), 1u);
  Response rs;
  rs.request = Split("rs", OpType::kReducescatter, {4}, {3, 1});
  cache.Insert(rs);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(cache.Lookup(rs.request, 0).has_value());
  TensorRequest other = rs.request;
  other.splits = {1, 3};
  EXPECT_FALSE(cache.Lookup(other, 0).has_value());
}

}  // namespace
}  // namespace concord
