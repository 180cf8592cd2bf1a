#include "core/coordinator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/entry_validation.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

// A float32 sum allreduce of shape {4} named `name`.
TensorRequest Req(const std::string& name) {
  TensorRequest r;
  r.name = name;
  r.shape = {4};
  return r;
}

// A message carrying `requests` in full.
RequestMessage Full(std::vector<TensorRequest> requests) {
  RequestMessage m;
  m.requests = std::move(requests);
  return m;
}

// `m` sent in step `step` (Engine::EndStep).
RequestMessage InStep(RequestMessage m, uint64_t step) {
  m.step = step;
  return m;
}

// A message carrying only the cache bits `bits`.
RequestMessage Bits(const std::vector<uint32_t>& bits) {
  RequestMessage m;
  for (uint32_t b : bits) {
    if (b / 64 >= m.cached_mask.size()) m.cached_mask.resize(b / 64 + 1, 0);
    m.cached_mask[b / 64] |= uint64_t{1} << (b % 64);
  }
  return m;
}

// A successful response for `request`, as the engine inserts it into its cache.
Response Ok(const TensorRequest& request) {
  Response r;
  r.request = request;
  return r;
}

// Fixture: a coordinator over `size` ranks with its own response cache; t0 is "now".
class CoordinatorTest : public ::testing::Test {
 protected:
  void Start(int size, StallOptions stall = {}) {
    coordinator_ = std::make_unique<Coordinator>(size, &cache_, stall);
  }
  // Adds `m` from `rank` at t0 + at, expecting success.
  void Add(int rank, const RequestMessage& m, milliseconds at = milliseconds(0)) {
    Status s = coordinator_->Add(rank, m, t0_ + at);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ResponseMessage Take(milliseconds at = milliseconds(0)) {
    StatusOr<ResponseMessage> m = coordinator_->TakeReady(t0_ + at);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : ResponseMessage();
  }
  // The names of the items of `m` in order (cached items through the cache).
  std::vector<std::string> ItemNames(const ResponseMessage& m) const {
    std::vector<std::string> out;
    for (const auto& item : m.items) {
      out.push_back(item.cached ? cache_.Get(item.bit)->request.name : item.response.request.name);
    }
    return out;
  }

  ResponseCache cache_{64};
  std::unique_ptr<Coordinator> coordinator_;
  const Clock::time_point t0_ = Clock::now();
};

using Names = std::vector<std::string>;

class CoordinatorRanksTest : public CoordinatorTest, public ::testing::WithParamInterface<int> {};

TEST_P(CoordinatorRanksTest, ReadyOnlyWhenEveryRankSent) {
  const int size = GetParam();
  Start(size);
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(Take().items.empty());
    Add(r, Full({Req("x")}));
  }
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_FALSE(m.items[0].cached);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  EXPECT_EQ(m.items[0].response.request, Req("x"));
  EXPECT_EQ(coordinator_->pending(), 0u);
  EXPECT_TRUE(Take().items.empty());
}

TEST_P(CoordinatorRanksTest, CachedBitReadyOnlyWhenEveryRankSetIt) {
  const int size = GetParam();
  Start(size);
  cache_.Insert(Ok(Req("a")));
  cache_.Insert(Ok(Req("b")));
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(Take().items.empty());
    Add(r, Bits({1}));
  }
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_TRUE(m.items[0].cached);
  EXPECT_EQ(m.items[0].bit, 1u);
  EXPECT_EQ(coordinator_->pending(), 0u);
}

// Each item names the rank that submitted last and how long after the one before it (the
// straggler's figures for each rank's timeline), full and cached; a join names none.
TEST_P(CoordinatorRanksTest, ItemsNameTheLastRankAndItsWait) {
  const int size = GetParam();
  Start(size);
  cache_.Insert(Ok(Req("cached")));
  // Rank r submits at 10 r ms, except rank 0, which is last at 100 ms (alone: at 0 ms).
  auto arrival = [size](int r) { return milliseconds(r == 0 && size > 1 ? 100 : 10 * r); };
  for (int k = 1; k <= size; ++k) {  // in time order: 1, 2, ..., then 0
    const int r = k % size;
    Add(r, Full({Req("x")}), arrival(r));
    Add(r, Bits({0}), arrival(r));
  }
  ResponseMessage m = Take(milliseconds(200));
  ASSERT_EQ(m.items.size(), 2u);
  const uint32_t wait_us = size == 1 ? 0u : static_cast<uint32_t>(100 - 10 * (size - 1)) * 1000;
  for (const ResponseItem& item : m.items) {
    EXPECT_EQ(item.last_rank, 0);
    EXPECT_EQ(item.last_wait_us, wait_us);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CoordinatorRanksTest, ::testing::Values(1, 2, 3, 4));

// Four float32 values as inline data.
std::string Floats(float a, float b, float c, float d) {
  const float v[4] = {a, b, c, d};
  return std::string(reinterpret_cast<const char*>(v), sizeof(v));
}

std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// Every rank sends `a` with its input (r+1, 2(r+1), ...), in full and then through the cache: the
// response carries the reduction in rank order.
TEST_P(CoordinatorRanksTest, InlineDataIsReducedWhenEveryRankSentIt) {
  const int size = GetParam();
  Start(size);
  float sum = 0;
  for (int r = 0; r < size; ++r) {
    RequestMessage m = Full({Req("a")});
    const float x = static_cast<float>(r + 1);
    m.request_data[0] = Floats(x, 2 * x, -x, 0);
    sum += x;
    EXPECT_TRUE(Take().items.empty());
    Add(r, m);
  }
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  ASSERT_TRUE(m.items[0].data.has_value());
  EXPECT_EQ(AsFloats(*m.items[0].data), (std::vector<float>{sum, 2 * sum, -sum, 0}));

  cache_.Insert(m.items[0].response);
  for (int r = 0; r < size; ++r) {
    RequestMessage bits = Bits({0});
    bits.cached_data[0] = Floats(1, 1, 1, 1);
    Add(r, bits);
  }
  m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_TRUE(m.items[0].cached);
  ASSERT_TRUE(m.items[0].data.has_value());
  const float n = static_cast<float>(size);
  EXPECT_EQ(AsFloats(*m.items[0].data), (std::vector<float>{n, n, n, n}));
  EXPECT_EQ(coordinator_->pending(), 0u);
}

TEST_F(CoordinatorTest, InlineReductionAppliesTheReduceOp) {
  Start(3);
  TensorRequest max = Req("m");
  max.reduce_op = ReduceOp::kMax;
  const std::string inputs[3] = {Floats(1, 9, -3, 0), Floats(5, 2, -7, 0), Floats(0, 4, -1, -2)};
  for (int r = 0; r < 3; ++r) {
    RequestMessage m = Full({max});
    m.request_data[0] = inputs[r];
    Add(r, m);
  }
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  ASSERT_TRUE(m.items[0].data.has_value());
  EXPECT_EQ(AsFloats(*m.items[0].data), (std::vector<float>{5, 9, -1, 0}));
}

// A rank that sent no data (a different threshold) sends the operation to the backend.
TEST_F(CoordinatorTest, InlineDataFromSomeRanksOnlyIsNotReduced) {
  Start(2);
  RequestMessage with = Full({Req("a")});
  with.request_data[0] = Floats(1, 2, 3, 4);
  Add(0, with);
  Add(1, Full({Req("a")}));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk);
  EXPECT_FALSE(m.items[0].data.has_value());
}

TEST_F(CoordinatorTest, MismatchCarriesNoInlineData) {
  Start(2);
  TensorRequest other = Req("a");
  other.reduce_op = ReduceOp::kMin;
  RequestMessage m0 = Full({Req("a")}), m1 = Full({other});
  m0.request_data[0] = Floats(1, 2, 3, 4);
  m1.request_data[0] = Floats(1, 2, 3, 4);
  Add(0, m0);
  Add(1, m1);
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kMismatch);
  EXPECT_FALSE(m.items[0].data.has_value());
}

// A bit expanded into the full path (another rank sent the name in full) keeps its data.
TEST_F(CoordinatorTest, ExpandedBitKeepsItsInlineData) {
  Start(2);
  cache_.Insert(Ok(Req("a")));
  RequestMessage bits = Bits({0});
  bits.cached_data[0] = Floats(1, 2, 3, 4);
  Add(0, bits);
  RequestMessage full = Full({Req("a")});
  full.request_data[0] = Floats(10, 20, 30, 40);
  Add(1, full);
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_FALSE(m.items[0].cached);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  ASSERT_TRUE(m.items[0].data.has_value());
  EXPECT_EQ(AsFloats(*m.items[0].data), (std::vector<float>{11, 22, 33, 44}));
}

// Of the wrong size, or a broadcast's from a rank that is not its root.
TEST_F(CoordinatorTest, InlineDataThatIsNotTheInputOfACacheEntryIsAProtocolError) {
  Start(2);
  cache_.Insert(Ok(Req("a")));
  TensorRequest broadcast = Req("g");
  broadcast.op = OpType::kBroadcast;
  cache_.Insert(Ok(broadcast));
  RequestMessage short_data = Bits({0});
  short_data.cached_data[0] = "abc";
  Status s = coordinator_->Add(1, short_data, t0_);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  RequestMessage not_root = Bits({1});
  not_root.cached_data[1] = Floats(1, 2, 3, 4);
  s = coordinator_->Add(1, not_root, t0_);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("'g'"), std::string::npos) << s.message();
}

TEST_F(CoordinatorTest, OrderOfFirstArrivalPreserved) {
  Start(2);
  Add(0, Full({Req("a"), Req("b"), Req("c")}));
  Add(1, Full({Req("c"), Req("b")}));
  EXPECT_EQ(ItemNames(Take()), (Names{"b", "c"}));
  Add(1, Full({Req("d"), Req("a")}));
  Add(0, Full({Req("d")}));
  EXPECT_EQ(ItemNames(Take()), (Names{"a", "d"}));
}

TEST_F(CoordinatorTest, UnknownRankAndBitAndDuplicatesAreProtocolErrors) {
  Start(2);
  EXPECT_EQ(coordinator_->Add(2, Full({Req("a")}), t0_).code(), Code::kProtocolError);
  EXPECT_EQ(coordinator_->Add(-1, Full({Req("a")}), t0_).code(), Code::kProtocolError);
  cache_.Insert(Ok(Req("a")));
  Status s = coordinator_->Add(1, Bits({5}), t0_);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("5"), std::string::npos) << s.message();
  Add(0, Full({Req("x")}));
  s = coordinator_->Add(0, Full({Req("x")}), t0_);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
}

TEST_F(CoordinatorTest, AllgatherOfAScalarIsAProtocolError) {
  Start(1);
  TensorRequest r = Req("g");
  r.op = OpType::kAllgather;
  r.shape.clear();
  EXPECT_EQ(coordinator_->Add(0, Full({r}), t0_).code(), Code::kProtocolError);
}

TEST_F(CoordinatorTest, ShapeThatOverflowsIsAProtocolError) {
  Start(1);
  TensorRequest r = Req("huge");
  r.shape = {int64_t{1} << 32, int64_t{1} << 32};
  EXPECT_EQ(coordinator_->Add(0, Full({r}), t0_).code(), Code::kProtocolError);
}

// One field mismatch case: how rank 1's request differs from the others', and what the error says.
struct MismatchCase {
  std::string label;
  std::function<void(TensorRequest&)> base;    // applied on every rank
  std::function<void(TensorRequest&)> differ;  // then applied on rank 1 only
  std::vector<std::string> expected;           // substrings of the error message
};

class CoordinatorMismatchTest : public CoordinatorTest,
                                public ::testing::WithParamInterface<MismatchCase> {};

TEST_P(CoordinatorMismatchTest, ErrorNamesTensorFieldAndRanks) {
  const MismatchCase& c = GetParam();
  Start(3);
  for (int r = 0; r < 3; ++r) {
    TensorRequest q = Req("x");
    c.base(q);
    if (r == 1) c.differ(q);
    Add(r, Full({q}));
  }
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  const Response& resp = m.items[0].response;
  EXPECT_EQ(resp.error, Code::kMismatch);
  EXPECT_NE(resp.error_message.find("tensor 'x'"), std::string::npos) << resp.error_message;
  EXPECT_NE(resp.error_message.find("ranks 0, 2"), std::string::npos) << resp.error_message;
  EXPECT_NE(resp.error_message.find("on rank 1"), std::string::npos) << resp.error_message;
  for (const auto& s : c.expected) {
    EXPECT_NE(resp.error_message.find(s), std::string::npos) << s << " in " << resp.error_message;
  }
  EXPECT_EQ(coordinator_->pending(), 0u);
}

// Request mutators for the mismatch cases: none, into a {2, 3} allgather, into a broadcast.
void NoChange(TensorRequest&) {}
void MakeAllgather(TensorRequest& r) {
  r.op = OpType::kAllgather;
  r.shape = {2, 3};
}
void MakeBroadcast(TensorRequest& r) {
  r.op = OpType::kBroadcast;
}
void MakeReduce(TensorRequest& r) {
  r.op = OpType::kReduce;
}
void MakeGather(TensorRequest& r) {
  r.op = OpType::kGather;
  r.shape = {2, 3};
}

INSTANTIATE_TEST_SUITE_P(
    Fields, CoordinatorMismatchTest,
    ::testing::Values(
        MismatchCase{"dtype",
                     NoChange,
                     [](TensorRequest& r) { r.dtype = DType::kFloat64; },
                     {"dtype", "float32 on ranks 0, 2", "float64 on rank 1"}},
        MismatchCase{"shape",
                     NoChange,
                     [](TensorRequest& r) {
                       r.shape = {2, 2};
                     },
                     {"shape", "[4] on ranks 0, 2", "[2, 2] on rank 1"}},
        MismatchCase{"op",
                     NoChange,
                     [](TensorRequest& r) { r.op = OpType::kBroadcast; },
                     {"operation", "allreduce", "broadcast"}},
        MismatchCase{"reduce_op",
                     NoChange,
                     [](TensorRequest& r) { r.reduce_op = ReduceOp::kMax; },
                     {"reduce op", "sum", "max"}},
        MismatchCase{"root",
                     MakeBroadcast,
                     [](TensorRequest& r) { r.root = 2; },
                     {"root", "0 on ranks 0, 2", "2 on rank 1"}},
        MismatchCase{"reduce_root",
                     MakeReduce,
                     [](TensorRequest& r) { r.root = 2; },
                     {"root", "0 on ranks 0, 2", "2 on rank 1"}},
        MismatchCase{"reduce_reduce_op",
                     MakeReduce,
                     [](TensorRequest& r) { r.reduce_op = ReduceOp::kMin; },
                     {"reduce op", "sum on ranks 0, 2", "min on rank 1"}},
        MismatchCase{"reduce_postscale",
                     MakeReduce,
                     [](TensorRequest& r) { r.postscale = 2; },
                     {"postscale"}},
        MismatchCase{"reduce_against_allreduce",
                     MakeReduce,
                     [](TensorRequest& r) { r.op = OpType::kAllreduce; },
                     {"operation", "reduce on ranks 0, 2", "allreduce on rank 1"}},
        MismatchCase{"gather_root",
                     MakeGather,
                     [](TensorRequest& r) { r.root = 1; },
                     {"root", "0 on ranks 0, 2", "1 on rank 1"}},
        MismatchCase{"gather_trailing",
                     MakeGather,
                     [](TensorRequest& r) {
                       r.shape = {2, 4};
                     },
                     {"shape after the first dimension", "[3] on ranks 0, 2", "[4] on rank 1"}},
        MismatchCase{
            "prescale", NoChange, [](TensorRequest& r) { r.prescale = 0.5; }, {"prescale"}},
        // Values that print alike with six decimals must still be told apart.
        MismatchCase{"tiny_prescale",
                     NoChange,
                     [](TensorRequest& r) { r.prescale = 1.0000000001; },
                     {"prescale"}},
        MismatchCase{
            "postscale", NoChange, [](TensorRequest& r) { r.postscale = 1e-9; }, {"postscale"}},
        MismatchCase{
            "device", NoChange, [](TensorRequest& r) { r.device = 0; }, {"device", "cpu", "cuda"}},
        MismatchCase{"allgather_trailing",
                     MakeAllgather,
                     [](TensorRequest& r) {
                       r.shape = {2, 4};
                     },
                     {"shape after the first dimension", "[3] on ranks 0, 2", "[4] on rank 1"}},
        MismatchCase{"allgather_ndim",
                     MakeAllgather,
                     [](TensorRequest& r) { r.shape = {2}; },
                     {"number of dimensions"}},
        MismatchCase{"group",
                     NoChange,
                     [](TensorRequest& r) {
                       r.group = "x#1";
                       r.group_size = 1;
                     },
                     {"group", "no group"}}),
    [](const ::testing::TestParamInfo<MismatchCase>& info) { return info.param.label; });

TEST_F(CoordinatorTest, GatherFirstDimsMayDifferAndTheResponseCarriesThem) {
  Start(3);
  const std::vector<int64_t> dims = {2, 0, 5};
  for (int r = 0; r < 3; ++r) {
    TensorRequest q = Req("g");
    MakeGather(q);
    q.root = 2;
    q.shape[0] = dims[r];
    Add(r, Full({q}));
  }
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  const Response& resp = m.items[0].response;
  EXPECT_EQ(resp.error, Code::kOk) << resp.error_message;
  EXPECT_EQ(resp.first_dims, dims);
  EXPECT_EQ(resp.request.root, 2);
  EXPECT_EQ(resp.RequestOf(1).shape, (std::vector<int64_t>{0, 3}));
}

TEST_F(CoordinatorTest, AllgatherFirstDimsMayDiffer) {
  Start(3);
  const std::vector<int64_t> dims = {2, 0, 5};
  for (int r = 0; r < 3; ++r) {
    TensorRequest q = Req("g");
    MakeAllgather(q);
    q.shape[0] = dims[r];
    Add(r, Full({q}));
  }
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  const Response& resp = m.items[0].response;
  EXPECT_EQ(resp.error, Code::kOk) << resp.error_message;
  EXPECT_EQ(resp.first_dims, dims);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(resp.RequestOf(r).shape[0], dims[r]);
}

TEST_F(CoordinatorTest, BitOnOneRankAndFullRequestOnAnotherAreExpandedAndValidated) {
  Start(2);
  cache_.Insert(Ok(Req("a")));
  TensorRequest different = Req("a");
  different.dtype = DType::kInt32;
  Add(0, Bits({0}));
  Add(1, Full({different}));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_FALSE(m.items[0].cached);
  EXPECT_EQ(m.items[0].response.error, Code::kMismatch);
  EXPECT_NE(m.items[0].response.error_message.find("dtype"), std::string::npos);
  EXPECT_EQ(coordinator_->pending(), 0u);

  // Equal requests through both paths make a normal response.
  Add(1, Full({Req("a")}));
  Add(0, Bits({0}));
  m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  EXPECT_EQ(m.items[0].response.request, Req("a"));
}

TEST_F(CoordinatorTest, ExpandedBitWaitsForTheMissingRank) {
  Start(3);
  cache_.Insert(Ok(Req("a")));
  Add(0, Bits({0}));
  Add(1, Full({Req("a")}));
  EXPECT_TRUE(Take().items.empty());
  Add(2, Bits({0}));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
}

TEST_F(CoordinatorTest, DifferentBitsOfOneNameAreExpanded) {
  Start(2);
  TensorRequest big = Req("a");
  big.shape = {8};
  cache_.Insert(Ok(Req("a")));
  cache_.Insert(Ok(big));
  Add(0, Bits({0}));
  Add(1, Bits({1}));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kMismatch);
  EXPECT_NE(m.items[0].response.error_message.find("[4] on rank 0; [8] on rank 1"),
            std::string::npos)
      << m.items[0].response.error_message;
  EXPECT_EQ(coordinator_->pending(), 0u);
}

TEST_F(CoordinatorTest, GroupsLeaveOnlyWhole) {
  Start(2);
  TensorRequest a = Req("a"), b = Req("b"), c = Req("c");
  for (TensorRequest* q : {&a, &b}) {
    q->group = "a#2";
    q->group_size = 2;
  }
  Add(0, Full({a, c}));
  Add(1, Full({a, c}));
  EXPECT_EQ(ItemNames(Take()), (Names{"c"}));  // a is held for b
  EXPECT_EQ(coordinator_->pending(), 1u);
  Add(0, Full({b}));
  EXPECT_TRUE(Take().items.empty());
  Add(1, Full({b}));
  EXPECT_EQ(ItemNames(Take()), (Names{"a", "b"}));
  EXPECT_EQ(coordinator_->pending(), 0u);

  // Cached members are held the same way, and a failed member counts as ready.
  cache_.Insert(Ok(a));
  TensorRequest b_wrong = b;
  b_wrong.dtype = DType::kInt8;
  Add(0, Bits({0}));
  Add(1, Bits({0}));
  EXPECT_TRUE(Take().items.empty());
  Add(0, Full({b}));
  Add(1, Full({b_wrong}));
  ResponseMessage m = Take();
  EXPECT_EQ(ItemNames(m), (Names{"a", "b"}));
  EXPECT_TRUE(m.items[0].cached);
  EXPECT_EQ(m.items[1].response.error, Code::kMismatch);
}

TEST_F(CoordinatorTest, StallWarningsNameMissingRanksAndWhatTheyLastSubmittedOnce) {
  StallOptions stall;
  stall.warning = milliseconds(1000);
  Start(3, stall);
  cache_.Insert(Ok(Req("cached")));
  Add(0, Full({Req("x")}));
  Add(2, Full({Req("x")}), milliseconds(500));
  Add(1, Bits({0}), milliseconds(200));
  EXPECT_TRUE(Take().items.empty());
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(999)).empty());
  auto w = coordinator_->StallWarnings(t0_ + milliseconds(1000));
  ASSERT_EQ(w.size(), 1u);
  for (const char* part : {"tensor 'x'", "for rank 1 (rank 1 last submitted 'cached' 0.8 s ago)",
                           "ranks 0, 2 submitted it"}) {
    EXPECT_NE(w[0].find(part), std::string::npos) << part << " not in: " << w[0];
  }
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(1100)).empty());
  w = coordinator_->StallWarnings(t0_ + milliseconds(1200));
  ASSERT_EQ(w.size(), 1u);
  for (const char* part : {"tensor 'cached'",
                           "for ranks 0, 2 (rank 0 last submitted 'x' 1.2 s ago; "
                           "rank 2 last submitted 'x' 0.7 s ago)",
                           "rank 1 submitted it"}) {
    EXPECT_NE(w[0].find(part), std::string::npos) << part << " not in: " << w[0];
  }
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(5000)).empty());
}

// A bit that waited past the warning and is then expanded (another rank sent the name in full)
// is not warned about again: the ranks still missing are among those its warning named.
TEST_F(CoordinatorTest, StallWarningIsNotRepeatedWhenItsBitIsExpanded) {
  StallOptions stall;
  stall.warning = milliseconds(100);
  Start(3, stall);
  cache_.Insert(Ok(Req("a")));
  Add(0, Bits({0}));
  EXPECT_TRUE(Take(milliseconds(100)).items.empty());
  auto w = coordinator_->StallWarnings(t0_ + milliseconds(100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("tensor 'a' has waited for more than 0.1 s for ranks 1, 2"),
            std::string::npos)
      << w[0];
  Add(1, Full({Req("a")}), milliseconds(150));
  EXPECT_TRUE(Take(milliseconds(150)).items.empty());
  EXPECT_EQ(coordinator_->pending(), 1u);  // expanded: waits for rank 2
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(200)).empty());
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());  // no warning to come, no shutdown
  Add(2, Bits({0}), milliseconds(250));
  ResponseMessage m = Take(milliseconds(250));
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
}

TEST_F(CoordinatorTest, StallWarningSaysWhenARankHasSubmittedNothing) {
  StallOptions stall;
  stall.warning = milliseconds(100);
  Start(2, stall);
  Add(0, Full({Req("x")}));
  auto w = coordinator_->StallWarnings(t0_ + milliseconds(100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("rank 1 has submitted nothing"), std::string::npos) << w[0];
}

TEST_F(CoordinatorTest, StallShutdownFailsTheJobNamingTheTensorAndTheMissingRank) {
  StallOptions stall;
  stall.warning = milliseconds(100);
  stall.shutdown = milliseconds(1000);
  Start(3, stall);
  cache_.Insert(Ok(Req("cached")));
  Add(0, Full({Req("x")}));
  Add(1, Full({Req("x")}));
  Add(2, Bits({0}), milliseconds(300));
  EXPECT_TRUE(Take(milliseconds(999)).items.empty());
  StatusOr<ResponseMessage> m = coordinator_->TakeReady(t0_ + milliseconds(1000));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kTimeout);
  // The oldest stalled operation, its missing rank and what that rank did instead.
  for (const char* part : {"tensor 'x' was not submitted by rank 2 (rank 2 last submitted 'cached' "
                           "0.7 s ago)",
                           "stall shutdown time of 1 s", "ranks 0, 1 submitted it"}) {
    EXPECT_NE(m.status().message().find(part), std::string::npos)
        << part << " not in: " << m.status().message();
  }
}

TEST_P(CoordinatorRanksTest, ASubmissionInAnOlderStepFailsAndTheNewestWaits) {
  // The last rank skipped 'x' in step 3: its step-4 'x' must not be reduced with the others'
  // step-3 'x'. Full requests and cached bits alike.
  const int size = GetParam();
  if (size < 2) GTEST_SKIP() << "one rank has no one to disagree with";
  for (bool cached : {false, true}) {
    SCOPED_TRACE(cached ? "cached" : "full");
    Start(size);
    cache_ = ResponseCache(64);
    if (cached) cache_.Insert(Ok(Req("x")));
    auto x = [&] { return cached ? Bits({0}) : Full({Req("x")}); };
    for (int r = 0; r + 1 < size; ++r) Add(r, InStep(x(), 3));
    EXPECT_TRUE(Take().items.empty());
    Add(size - 1, InStep(x(), 4));
    ResponseMessage m = Take();
    ASSERT_EQ(m.items.size(), 1u);
    const Response& error = m.items[0].response;
    EXPECT_FALSE(m.items[0].cached);
    EXPECT_EQ(error.request.name, "x");
    EXPECT_EQ(error.error, Code::kMismatch);
    std::vector<int32_t> older;
    for (int r = 0; r + 1 < size; ++r) older.push_back(r);
    EXPECT_EQ(error.error_ranks, older);
    EXPECT_FALSE(error.AppliesTo(size - 1));
    const std::string step4 = "step 4 on rank " + std::to_string(size - 1);
    for (const std::string& part : {std::string("tensor 'x' was submitted in different steps"),
                                    std::string("step 3 on rank"), step4}) {
      EXPECT_NE(error.error_message.find(part), std::string::npos)
          << part << " not in: " << error.error_message;
    }
    EXPECT_EQ(coordinator_->pending(), 1u);  // the newest waits
    // The others' step-4 'x' completes with it.
    for (int r = 0; r + 1 < size; ++r) Add(r, InStep(x(), 4));
    m = Take();
    ASSERT_EQ(m.items.size(), 1u);
    const Response& ok = m.items[0].cached ? *cache_.Get(m.items[0].bit) : m.items[0].response;
    EXPECT_EQ(ok.error, Code::kOk) << ok.error_message;
    EXPECT_EQ(ok.request.name, "x");
    EXPECT_EQ(coordinator_->pending(), 0u);
  }
}

TEST_F(CoordinatorTest, EqualStepsTakeTheFastPath) {
  Start(3);
  cache_.Insert(Ok(Req("x")));
  for (int r = 0; r < 3; ++r) Add(r, InStep(Bits({0}), 7));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_TRUE(m.items[0].cached);
}

TEST_F(CoordinatorTest, ThreeDifferentStepsFailAllButTheNewest) {
  Start(3);
  Add(0, InStep(Full({Req("x")}), 1));
  Add(1, InStep(Full({Req("x")}), 2));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error_ranks, (std::vector<int32_t>{0}));
  Add(2, InStep(Full({Req("x")}), 3));
  m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error_ranks, (std::vector<int32_t>{1}));
  EXPECT_EQ(coordinator_->pending(), 1u);
}

TEST_F(CoordinatorTest, WhatWaitsForAFinalizedRankFailsAtOnceNamingIt) {
  Start(3);
  cache_.Insert(Ok(Req("cached")));
  TensorRequest bye = Req(FinalizeName());
  bye.op = OpType::kBarrier;
  bye.shape.clear();
  Add(0, Full({Req("x")}));
  Add(1, Full({Req("x")}));
  Add(2, InStep(Full({bye}), 5));  // finalizes early, in an earlier step than the others
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  const Response& x = m.items[0].response;
  EXPECT_EQ(x.request.name, "x");
  EXPECT_EQ(x.error, Code::kPeerFailure);
  EXPECT_EQ(x.error_ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_NE(x.error_message.find("rank 2 has finalized"), std::string::npos) << x.error_message;
  // Later submissions fail at once too, cached or not.
  Add(0, Bits({0}));
  Add(1, Full({Req("y")}));
  m = Take();
  ASSERT_EQ(m.items.size(), 2u);
  for (const auto& item : m.items) {
    EXPECT_FALSE(item.cached);
    EXPECT_EQ(item.response.error, Code::kPeerFailure) << item.response.error_message;
  }
  EXPECT_EQ(m.items[0].response.error_ranks, (std::vector<int32_t>{0}));
  EXPECT_EQ(m.items[1].response.error_ranks, (std::vector<int32_t>{1}));
  // The finalize barrier completes when the others finalize, whatever their steps.
  Add(0, InStep(Full({bye}), 9));
  EXPECT_TRUE(Take().items.empty());
  Add(1, InStep(Full({bye}), 9));
  m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  EXPECT_EQ(coordinator_->pending(), 0u);
}

// rank's join request (the barrier concord_join submits).
RequestMessage Join(uint64_t seq, uint64_t step = 0) {
  TensorRequest join = Req(JoinName(seq));
  join.op = OpType::kBarrier;
  join.shape.clear();
  return InStep(Full({join}), step);
}

TEST_F(CoordinatorTest, JoinedRanksAreListedAndTheirBitsExpanded) {
  Start(3);
  cache_.Insert(Ok(Req("cached")));
  Add(2, Join(0, 4));
  // Ready once ranks 0 and 1 sent it, as a bit or in full; a joined rank's lack is listed.
  Add(0, Bits({0}));
  EXPECT_TRUE(Take().items.empty());
  Add(1, Full({Req("cached")}));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_FALSE(m.items[0].cached);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  EXPECT_EQ(m.items[0].response.joined, (std::vector<int32_t>{2}));
  EXPECT_EQ(m.items[0].response.Contributors(3), 2);
  // An allgather: the joined rank gives no rows. A broadcast from it fails on the submitters.
  TensorRequest gather = Req("g");
  gather.op = OpType::kAllgather;
  TensorRequest bcast = Req("b");
  bcast.op = OpType::kBroadcast;
  bcast.root = 2;
  Add(0, Full({gather, bcast}));
  Add(1, Full({gather, bcast}));
  m = Take();
  ASSERT_EQ(m.items.size(), 2u);
  EXPECT_EQ(m.items[0].response.first_dims, (std::vector<int64_t>{4, 4, 0}));
  EXPECT_EQ(m.items[1].response.error, Code::kInvalidArgument);
  EXPECT_EQ(m.items[1].response.error_ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_NE(m.items[1].response.error_message.find("rank 2 has joined"), std::string::npos)
      << m.items[1].response.error_message;
  // The join completes when every rank joined, listing them in the order they did.
  Add(0, Join(0, 7));
  EXPECT_TRUE(Take().items.empty());
  Add(1, Join(0, 9));
  m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  EXPECT_EQ(m.items[0].response.joined, (std::vector<int32_t>{2, 0, 1}));
  // Afterwards nobody is joined, and steps count from each rank's join: no step mismatch.
  Add(0, InStep(Full({Req("next")}), 7));
  Add(1, InStep(Full({Req("next")}), 9));
  EXPECT_TRUE(Take().items.empty());
  Add(2, InStep(Full({Req("next")}), 4));
  m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  EXPECT_TRUE(m.items[0].response.joined.empty());
}

TEST_F(CoordinatorTest, AGroupMemberFailedInAnOlderStepAndReadyAgainCountsOnce) {
  // Group "x#2" of x and y. Rank 1 sent x in step 0 and y in step 1 (it ended a step inside the
  // group), then joined. Rank 0 sends x in step 1: rank 1's step-0 x fails, and rank 0's x is
  // ready at once (rank 1 joined). That error and that response are one member, x: the group
  // waits for y, and leaves whole once y is ready (counted as two members, x left without y, and
  // y, alone, was held forever).
  Start(2);
  TensorRequest x = Req("x"), y = Req("y");
  for (TensorRequest* q : {&x, &y}) {
    q->group = "x#2";
    q->group_size = 2;
  }
  Add(1, InStep(Full({x}), 0));
  Add(1, InStep(Full({y}), 1));
  Add(1, Join(0, 1));
  EXPECT_TRUE(Take().items.empty());
  Add(0, InStep(Full({x}), 1));
  EXPECT_EQ(ItemNames(Take()), Names{}) << "x left without y";
  Add(0, InStep(Full({y}), 1));
  ResponseMessage m = Take();
  ASSERT_EQ(ItemNames(m), (Names{"x", "x", "y"}));
  EXPECT_EQ(m.items[0].response.error, Code::kMismatch);
  EXPECT_EQ(m.items[0].response.error_ranks, (std::vector<int32_t>{1}));
  EXPECT_EQ(m.items[1].response.error, Code::kOk) << m.items[1].response.error_message;
  EXPECT_EQ(m.items[1].response.joined, (std::vector<int32_t>{1}));
  EXPECT_EQ(m.items[2].response.error, Code::kOk) << m.items[2].response.error_message;
  EXPECT_TRUE(m.items[2].response.joined.empty());
  EXPECT_EQ(coordinator_->pending(), 1u);  // rank 1's join, nothing held
}

// Group "a#3" of a, b and c.
std::vector<TensorRequest> GroupOfThree() {
  std::vector<TensorRequest> members = {Req("a"), Req("b"), Req("c")};
  for (TensorRequest& q : members) {
    q.group = "a#3";
    q.group_size = 3;
  }
  return members;
}

// Members held for the rest of their group stall like any operation, from their first
// submission: one warning per group naming the members it lacks, and the stall shutdown.
TEST_F(CoordinatorTest, AHeldGroupWarnsAndFailsTheJobLikeAStalledTensor) {
  StallOptions stall;
  stall.warning = milliseconds(100);
  stall.shutdown = milliseconds(1000);
  Start(2, stall);
  const std::vector<TensorRequest> g = GroupOfThree();
  Add(0, Full({g[0]}));
  Add(1, Full({g[0]}));
  Add(0, Full({g[1]}), milliseconds(50));
  EXPECT_TRUE(Take(milliseconds(50)).items.empty());  // a is held; b waits for rank 1
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + milliseconds(100));
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(99)).empty());
  auto w = coordinator_->StallWarnings(t0_ + milliseconds(100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("group 'a#3' has waited for more than 0.1 s for 2 of its 3 members: 'b' "
                      "(not yet submitted by every rank) and 1 that no rank has submitted; 'a' "
                      "is ready"),
            std::string::npos)
      << w[0];
  w = coordinator_->StallWarnings(t0_ + milliseconds(150));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("tensor 'b' has waited"), std::string::npos) << w[0];
  // b is held too; the group's warning is not repeated, and its shutdown is the next check.
  Add(1, Full({g[1]}), milliseconds(200));
  EXPECT_TRUE(Take(milliseconds(200)).items.empty());
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(300)).empty());
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + milliseconds(1000));
  EXPECT_TRUE(Take(milliseconds(999)).items.empty());
  StatusOr<ResponseMessage> m = coordinator_->TakeReady(t0_ + milliseconds(1000));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kTimeout);
  EXPECT_NE(m.status().message().find(
                "group 'a#3' did not complete within the stall shutdown time of 1 s: it lacks 1 "
                "of its 3 members: 1 that no rank has submitted; 'a', 'b' are ready"),
            std::string::npos)
      << m.status().message();
}

// A group with a member no rank submitted can never complete once a rank finalized: its ready
// members fail (cached or not) instead of being held forever. A member some rank submitted may
// still come: the group waits for it.
TEST_F(CoordinatorTest, AGroupThatCanNeverCompleteFailsWhenARankFinalizes) {
  const std::vector<TensorRequest> g = GroupOfThree();
  TensorRequest bye = Req(FinalizeName());
  bye.op = OpType::kBarrier;
  bye.shape.clear();
  Start(3);
  Add(2, Full({g[0], g[1], g[2], bye}));
  Add(0, Full({g[0], g[1]}));
  Add(1, Full({g[0], g[1]}));
  EXPECT_TRUE(Take().items.empty());  // a and b wait for c, which rank 2 sent
  Add(0, Full({g[2]}));
  Add(1, Full({g[2]}));
  ResponseMessage m = Take();
  ASSERT_EQ(ItemNames(m), (Names{"a", "b", "c"}));
  for (const auto& item : m.items) {
    EXPECT_EQ(item.response.error, Code::kOk) << item.response.error_message;
  }

  Start(3);
  cache_.Insert(Ok(g[0]));
  for (int r = 0; r < 3; ++r) Add(r, Bits({0}));
  Add(0, Full({g[1]}));
  Add(1, Full({g[1]}));
  EXPECT_TRUE(Take().items.empty());  // a is held
  Add(2, Full({g[1], bye}));          // rank 2 never sends c, and nobody else has
  m = Take();
  ASSERT_EQ(ItemNames(m), (Names{"a", "b"}));
  for (const auto& item : m.items) {
    EXPECT_FALSE(item.cached);
    EXPECT_EQ(item.response.error, Code::kPeerFailure);
    EXPECT_EQ(item.response.error_ranks, (std::vector<int32_t>{0, 1, 2}));
    EXPECT_NE(item.response.error_message.find("its group 'a#3' lacks a member that no rank has "
                                               "submitted, and rank 2 has finalized"),
              std::string::npos)
        << item.response.error_message;
  }
  EXPECT_EQ(coordinator_->pending(), 1u);  // the finalize barrier
}

TEST_F(CoordinatorTest, AJoinWaitingForTheOthersNeverStalls) {
  StallOptions stall;
  stall.warning = milliseconds(10);
  stall.shutdown = milliseconds(20);
  Start(2, stall);
  Add(0, Join(0));
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(50)).empty());
  EXPECT_TRUE(Take(milliseconds(50)).items.empty());
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());
}

TEST_F(CoordinatorTest, FinalizeBarrierWarningSaysWhoFinalized) {
  StallOptions stall;
  stall.warning = milliseconds(100);
  stall.shutdown = milliseconds(200);
  Start(2, stall);
  TensorRequest bye = Req(FinalizeName());
  bye.op = OpType::kBarrier;
  bye.shape.clear();
  Add(1, Full({bye}));
  auto w = coordinator_->StallWarnings(t0_ + milliseconds(100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("rank 1 has finalized and waited for more than 0.1 s for rank 0"),
            std::string::npos)
      << w[0];
  // Not a stall that fails the job: the finalizing rank's own timeout bounds its wait.
  EXPECT_TRUE(coordinator_->TakeReady(t0_ + milliseconds(1000)).ok());
}

TEST_F(CoordinatorTest, NextStallCheckSchedulesNoShutdownForTheFinalizeBarrier) {
  StallOptions stall;
  stall.warning = milliseconds(100);
  stall.shutdown = milliseconds(200);
  Start(2, stall);
  TensorRequest bye = Req(FinalizeName());
  bye.op = OpType::kBarrier;
  bye.shape.clear();
  Add(1, Full({bye}));
  // The warning is due; the shutdown, which never fails the job for this barrier, is not: a
  // check scheduled for it would stay in the past, and rank 0's engine would poll without rest.
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + milliseconds(100));
  EXPECT_EQ(coordinator_->StallWarnings(t0_ + milliseconds(100)).size(), 1u);
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());
  EXPECT_TRUE(coordinator_->TakeReady(t0_ + milliseconds(1000)).ok());
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());
}

TEST_F(CoordinatorTest, NextStallCheck) {
  StallOptions stall;
  stall.warning = milliseconds(100);
  stall.shutdown = milliseconds(1000);
  Start(2, stall);
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());
  Add(0, Full({Req("x")}), milliseconds(50));
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + milliseconds(150));
  coordinator_->StallWarnings(t0_ + milliseconds(150));
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + milliseconds(1050));
  Add(1, Full({Req("x")}));
  Take(milliseconds(200));
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());

  // Without a shutdown time, nothing is due once warned.
  Start(2, StallOptions{milliseconds(100), milliseconds(0)});
  Add(0, Full({Req("y")}));
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + milliseconds(100));
  coordinator_->StallWarnings(t0_ + milliseconds(100));
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());
}

TEST_F(CoordinatorTest, ARootOutsideTheCommunicatorIsAProtocolError) {
  // Checked where it arrives: with ranks joined, the one request that makes the operation ready
  // is never compared with another, and the root indexes the coordinator's per-rank state.
  for (OpType op : {OpType::kBroadcast, OpType::kReduce, OpType::kGather}) {
    for (int32_t root : {3, -1, 1 << 30}) {
      SCOPED_TRACE(std::string(OpTypeName(op)) + " root " + std::to_string(root));
      Start(3);
      Add(1, Join(0));
      Add(2, Join(0));
      TensorRequest q = Req("b");
      q.op = op;
      q.root = root;
      Status s = coordinator_->Add(0, Full({q}), t0_);
      EXPECT_EQ(s.code(), Code::kProtocolError) << s.ToString();
      EXPECT_NE(s.message().find("rank 0 sent tensor 'b'"), std::string::npos) << s.ToString();
      EXPECT_NE(s.message().find("root " + std::to_string(root)), std::string::npos)
          << s.ToString();
    }
  }
  // Other operations carry no root: theirs is not looked at.
  Start(2);
  TensorRequest q = Req("x");
  q.root = 7;
  Add(0, Full({q}));
}

TEST_F(CoordinatorTest, TheNewestStepStallsFromTheTimeItsOlderStepsFailed) {
  // The clock is the caller's (TakeReady's `now`), here an hour before the real one.
  StallOptions stall;
  stall.warning = milliseconds(100);
  Start(2, stall);
  const milliseconds hour_ago(-3600 * 1000);
  Add(0, InStep(Full({Req("x")}), 1), hour_ago);
  Add(1, InStep(Full({Req("x")}), 2), hour_ago);
  ResponseMessage m = Take(hour_ago);
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error_ranks, (std::vector<int32_t>{0}));
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + hour_ago + milliseconds(100));
  auto w = coordinator_->StallWarnings(t0_ + hour_ago + milliseconds(100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("tensor 'x' has waited for more than 0.1 s for rank 0"), std::string::npos)
      << w[0];
}

TEST_F(CoordinatorTest, ARankWhoseJoinFailedIsNoLongerJoined) {
  // Rank 1 joined; rank 0 finalized instead: rank 1's join fails. Rank 1 is no longer joined, so
  // the finalize barrier's warning names it, and an operation waits for it again.
  StallOptions stall;
  stall.warning = milliseconds(100);
  Start(3, stall);
  TensorRequest bye = Req(FinalizeName());
  bye.op = OpType::kBarrier;
  bye.shape.clear();
  Add(1, Join(0));
  Add(0, Full({bye}));
  ResponseMessage m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kPeerFailure);
  EXPECT_EQ(m.items[0].response.error_ranks, (std::vector<int32_t>{1}));
  Add(2, Full({bye}));
  EXPECT_TRUE(Take().items.empty());
  auto w = coordinator_->StallWarnings(t0_ + milliseconds(100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("ranks 0, 2 have finalized and waited for more than 0.1 s for rank 1 ("),
            std::string::npos)
      << w[0];
}

TEST_F(CoordinatorTest, AJoinedRanksNextSubmissionCountsItsStepFromItsJoin) {
  // Rank 1 ran out of data in step 5 and joined; it submits 'x' for the next epoch while joined.
  // Rank 0 joins in step 10 and submits 'x': both are their first step after the join.
  Start(2);
  Add(1, Join(0, 5));
  Add(1, InStep(Full({Req("x")}), 5));
  Add(0, Join(0, 10));
  ResponseMessage m = Take();
  ASSERT_EQ(ItemNames(m), Names{JoinName(0)});
  Add(0, InStep(Full({Req("x")}), 10));
  m = Take();
  ASSERT_EQ(m.items.size(), 1u);
  EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
  EXPECT_TRUE(m.items[0].response.joined.empty());
}

TEST_F(CoordinatorTest, WhatARankSubmittedBeforeItJoinedRunsWhenTheLastRankJoins) {
  // Rank 0 submits 'y', then joins without waiting for it; rank 2, which lacks 'y', joins last.
  // 'y' runs with ranks 1 and 2 standing in, before the join completes (after it, nobody stands
  // in, and 'y' would wait for them for ever), whether it arrived before the join or after.
  for (bool y_first : {true, false}) {
    SCOPED_TRACE(y_first ? "y before the first join" : "y after the first join");
    Start(3);
    if (y_first) Add(0, Full({Req("y")}));
    Add(1, Join(0));
    if (!y_first) Add(0, Full({Req("y")}));
    EXPECT_TRUE(Take().items.empty());  // 'y' waits for rank 2
    Add(0, Join(0));
    Add(2, Join(0));
    ResponseMessage m = Take();
    ASSERT_EQ(ItemNames(m), (Names{"y", JoinName(0)}));
    EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
    EXPECT_EQ(m.items[0].response.joined, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(coordinator_->pending(), 0u);
  }
}

TEST_F(CoordinatorTest, WhatOnlyJoinedRanksSubmittedWaitsForTheOthersNextSubmission) {
  // Rank 1 joined, then submitted 'x' (in full or as a bit): when rank 0 joins too, nobody stands
  // in for it, whatever the order of arrival; it runs with rank 0's next 'x'.
  cache_.Insert(Ok(Req("x")));
  for (bool cached : {false, true}) {
    SCOPED_TRACE(cached ? "cached" : "full");
    Start(2);
    Add(1, Join(0));
    Add(1, cached ? Bits({0}) : Full({Req("x")}));
    EXPECT_TRUE(Take().items.empty());
    Add(0, Join(0));
    ResponseMessage m = Take();
    ASSERT_EQ(ItemNames(m), Names{JoinName(0)});
    EXPECT_EQ(coordinator_->pending(), 1u);
    Add(0, Full({Req("x")}));
    m = Take();
    ASSERT_EQ(ItemNames(m), Names{"x"});
    EXPECT_EQ(m.items[0].response.error, Code::kOk) << m.items[0].response.error_message;
    EXPECT_TRUE(m.items[0].response.joined.empty());
  }
}

TEST_F(CoordinatorTest, ACacheMaskLongerThanTheCacheIsAProtocolError) {
  // Every bit is below the capacity (64 here: one word). A longer mask is malformed: one of
  // 2^26 + 1 words (512 MiB, within the control plane's frame limit) named bit 2^32, which
  // wrapped around to entry 0 and ran it.
  Start(2);
  cache_.Insert(Ok(Req("a")));
  RequestMessage m = Bits({0});
  m.cached_mask.push_back(0);
  Status s = coordinator_->Add(1, m, t0_);
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.ToString();
  EXPECT_NE(s.message().find("rank 1 sent a response-cache mask of 2 words, for a cache of 64"),
            std::string::npos)
      << s.ToString();
  Add(1, Bits({0}));  // as long as the cache: fine
}

TEST_F(CoordinatorTest, WhatOnlyJoinedRanksSubmittedStallsFromTheJoinsEnd) {
  // Rank 1 joined and submitted 'x' for its next epoch; rank 0's epoch lasts past the stall
  // shutdown time. Like the join, 'x' waits for it without a warning or a shutdown; once the join
  // completes, it is an ordinary submission and stalls from then on.
  StallOptions stall;
  stall.warning = milliseconds(100);
  stall.shutdown = milliseconds(200);
  Start(2, stall);
  Add(1, Join(0));
  Add(1, Full({Req("x")}));
  EXPECT_FALSE(coordinator_->NextStallCheck().has_value());
  EXPECT_TRUE(coordinator_->StallWarnings(t0_ + milliseconds(1000)).empty());
  EXPECT_TRUE(Take(milliseconds(1000)).items.empty());
  Add(0, Join(0), milliseconds(1000));
  ASSERT_EQ(ItemNames(Take(milliseconds(1000))), Names{JoinName(0)});
  EXPECT_EQ(coordinator_->NextStallCheck(), t0_ + milliseconds(1100));
  auto w = coordinator_->StallWarnings(t0_ + milliseconds(1100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("tensor 'x' has waited for more than 0.1 s for rank 0"), std::string::npos)
      << w[0];
}

}  // namespace
}  // namespace concord
