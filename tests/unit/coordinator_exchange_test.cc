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

// Bytes 0..n-1 plus `base`, as one rank's inline input.
std::string Bytes(size_t n, char base) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(base + i);
  return s;
}

// Each op's inline result (core/engine_inline.cc): a reducescatter's inputs reduced, an
// allgather's and an alltoall's concatenated in rank order whatever their sizes, a broadcast's
// the root's alone.
TEST_F(CoordinatorExchangeTest, InlineDataIsCombinedAsEachOpNeeds) {
  Start(3);
  const std::vector<int64_t> rows = {2, 0, 3};  // allgather and alltoall first dims
  std::string concatenated;
  for (int r = 0; r < 3; ++r) {
    RequestMessage m;
    TensorRequest rs = Split("rs", OpType::kReducescatter, {3}, {1, 1, 1});
    rs.dtype = DType::kInt8;
    m.requests.push_back(rs);
    m.request_data[0] = std::string(3, static_cast<char>(r + 1));
    TensorRequest ag = Split("ag", OpType::kAllgather, {rows[r]}, {});
    ag.dtype = DType::kUint8;
    m.requests.push_back(ag);
    m.request_data[1] = Bytes(static_cast<size_t>(rows[r]), static_cast<char>(10 * r));
    TensorRequest a2a = Split("a2a", OpType::kAlltoall, {rows[r]}, {rows[r], 0, 0});
    a2a.dtype = DType::kUint8;
    m.requests.push_back(a2a);
    m.request_data[2] = m.request_data[1];
    concatenated += m.request_data[1];
    TensorRequest bc = Split("bc", OpType::kBroadcast, {2}, {});
    bc.dtype = DType::kUint8;
    bc.root = 1;
    m.requests.push_back(bc);
    if (r == 1) m.request_data[3] = "hi";
    ASSERT_TRUE(coordinator_->Add(r, std::move(m), Clock::now()).ok());
  }
  StatusOr<ResponseMessage> m = coordinator_->TakeReady(Clock::now());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->items.size(), 4u);
  for (const ResponseItem& item : m->items) {
    ASSERT_EQ(item.response.error, Code::kOk) << item.response.error_message;
    ASSERT_TRUE(item.data.has_value()) << item.response.request.name;
    const std::string& name = item.response.request.name;
    const std::string want = name == "rs"   ? std::string(3, 6)
                             : name == "bc" ? std::string("hi")
                                            : concatenated;  // allgather, alltoall
    EXPECT_EQ(*item.data, want) << name;
  }
}

// Inline data that is not the sender's input: a non-root's broadcast data, a size other than
// its request's, a barrier's (through the cache: coordinator_test.cc).
TEST_F(CoordinatorExchangeTest, InlineDataThatIsNotTheInputIsAProtocolError) {
  Start(2);
  TensorRequest bc = Split("bc", OpType::kBroadcast, {2}, {});
  bc.dtype = DType::kUint8;
  TensorRequest barrier = Split("b", OpType::kBarrier, {}, {});
  barrier.dtype = DType::kUint8;
  const std::vector<std::pair<TensorRequest, std::string>> cases = {
      {bc, "hi"}, {Split("ag", OpType::kAllgather, {1}, {}), "toolong"}, {barrier, ""}};
  for (const auto& [request, data] : cases) {
    RequestMessage m = Full(request);
    m.request_data[0] = data;
    const Status s = coordinator_->Add(1, std::move(m), Clock::now());
    EXPECT_EQ(s.code(), Code::kProtocolError) << request.name << ": " << s.ToString();
    EXPECT_NE(s.message().find("inline data for tensor '" + request.name + "'"), std::string::npos)
        << s.message();
    Start(2);
  }
}

}  // namespace
}  // namespace concord
