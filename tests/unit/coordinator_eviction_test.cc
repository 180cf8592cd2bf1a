// The coordinator with a full response cache (coordinator.h, protocol point 3): which entries a
// list evicts, and what happens to a bit that was evicted while it was on its way.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/coordinator.h"

namespace concord {
namespace {

// A float32 sum allreduce named `name` of shape {n}.
TensorRequest Req(const std::string& name, int64_t n = 4) {
  TensorRequest r;
  r.name = name;
  r.shape = {n};
  return r;
}

RequestMessage Full(std::vector<TensorRequest> requests, uint64_t generation) {
  RequestMessage m;
  m.cache_generation = generation;
  m.requests = std::move(requests);
  return m;
}

RequestMessage Bits(const std::vector<uint32_t>& bits, uint64_t generation) {
  RequestMessage m;
  m.cache_generation = generation;
  for (uint32_t b : bits) {
    if (b / 64 >= m.cached_mask.size()) m.cached_mask.resize(b / 64 + 1, 0);
    m.cached_mask[b / 64] |= uint64_t{1} << (b % 64);
  }
  return m;
}

// Rank 0's side: a coordinator and the cache it reads, to which every list taken is applied, as
// rank 0's engine does after executing it.
class CoordinatorEvictionTest : public ::testing::Test {
 protected:
  void Start(int size, size_t capacity) {
    cache_ = std::make_unique<ResponseCache>(capacity);
    coordinator_ = std::make_unique<Coordinator>(size, cache_.get(), StallOptions());
  }
  void Add(int rank, const RequestMessage& m) {
    Status s = coordinator_->Add(rank, m, Clock::now());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Takes what is ready and applies it to the cache; the names of its items, in order.
  std::vector<std::string> Run(ResponseMessage* out = nullptr) {
    StatusOr<ResponseMessage> m = coordinator_->TakeReady(Clock::now());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return {};
    std::vector<std::string> names;
    for (const auto& item : m->items) {
      names.push_back(item.cached ? cache_->Get(item.bit)->request.name
                                  : item.response.request.name);
    }
    std::vector<std::string> resend;
    Status s = cache_->Apply(*m, 0, &resend);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (out != nullptr) *out = std::move(*m);
    return names;
  }
  // Every rank sends `names` in full (at the current generation) and they run.
  void RunFull(int size, const std::vector<std::string>& names) {
    std::vector<TensorRequest> requests;
    for (const auto& n : names) requests.push_back(Req(n));
    for (int r = 0; r < size; ++r) Add(r, Full(requests, cache_->generation()));
    EXPECT_EQ(Run(), names);
  }
  uint64_t generation() const { return cache_->generation(); }

  std::unique_ptr<ResponseCache> cache_;
  std::unique_ptr<Coordinator> coordinator_;
};

using Names = std::vector<std::string>;

TEST_F(CoordinatorEvictionTest, ListEvictsTheLeastRecentlyExecutedThatNoBitWaitsOn) {
  Start(3, 3);
  RunFull(3, {"a", "b", "c"});  // bits 0, 1, 2
  // a waits for ranks 1 and 2 through its bit; c was expanded (rank 1 sent it in full, with
  // another shape) and waits for rank 2. Both keep their bits, so b goes, though a is older.
  Add(0, Bits({0, 2}, generation()));
  Add(1, Full({Req("c", 8)}, generation()));
  for (int r = 0; r < 3; ++r) Add(r, Full({Req("d")}, generation()));
  ResponseMessage m;
  EXPECT_EQ(Run(&m), (Names{"d"}));
  EXPECT_EQ(m.evictions, (std::vector<uint32_t>{1}));
  EXPECT_EQ(generation(), 1u);
  EXPECT_EQ(cache_->Lookup(Req("d"), 0), 1u);
  // With everything it needs held, a list inserts what fits and evicts nothing more.
  for (int r = 0; r < 3; ++r) Add(r, Full({Req("e")}, generation()));
  Add(1, Bits({1}, generation()));  // d now waits too
  EXPECT_EQ(Run(&m), (Names{"e"}));
  EXPECT_TRUE(m.evictions.empty());
  EXPECT_FALSE(cache_->Lookup(Req("e"), 0).has_value());
  // Once a has run, it is the one to go.
  Add(0, Bits({1}, generation()));
  Add(1, Bits({0}, generation()));
  Add(2, Bits({0, 1}, generation()));
  EXPECT_EQ(Run(), (Names{"a", "d"}));
  Add(2, Full({Req("c", 4)}, generation()));
  EXPECT_EQ(Run(&m).size(), 1u);  // c: a mismatch
  EXPECT_EQ(m.items[0].response.error, Code::kMismatch);
  for (int r = 0; r < 3; ++r) Add(r, Full({Req("f")}, generation()));
  EXPECT_EQ(Run(&m), (Names{"f"}));
  EXPECT_EQ(m.evictions, (std::vector<uint32_t>{2}));  // c: executed least recently
  EXPECT_EQ(coordinator_->pending(), 0u);
}

TEST_F(CoordinatorEvictionTest, GroupMembersHeldThroughTheirBitsKeepThem) {
  Start(2, 2);
  TensorRequest a = Req("a"), b = Req("b");
  for (TensorRequest* q : {&a, &b}) {
    q->group = "a#2";
    q->group_size = 2;
  }
  for (int r = 0; r < 2; ++r) Add(r, Full({a, Req("x")}, generation()));
  EXPECT_EQ(Run(), (Names{"x"}));  // a held for b
  for (int r = 0; r < 2; ++r) Add(r, Full({b}, generation()));
  EXPECT_EQ(Run(), (Names{"a", "b"}));  // x is evicted for them: a takes bit 0, b bit 1
  ASSERT_EQ(cache_->Lookup(a, 0), 0u);
  for (int r = 0; r < 2; ++r) Add(r, Bits({0}, generation()));  // a again, held for b
  for (int r = 0; r < 2; ++r) Add(r, Full({Req("y")}, generation()));
  ResponseMessage m;
  EXPECT_EQ(Run(&m), (Names{"y"}));
  EXPECT_EQ(m.evictions, (std::vector<uint32_t>{1}));  // b, not the held a
  for (int r = 0; r < 2; ++r) Add(r, Full({b}, generation()));
  EXPECT_EQ(Run(&m), (Names{"a", "b"}));
  EXPECT_EQ(m.evictions, (std::vector<uint32_t>{1}));  // y, not a, which runs in the list
}

TEST_F(CoordinatorEvictionTest, StaleBitIsIgnoredAndNeverMatchedToTheEntryThatReplacedIt) {
  Start(2, 2);
  RunFull(2, {"a", "b"});  // bits 0, 1 at generation 0
  // Rank 1 sends a's bit at generation 0; before it arrives, a list evicts a for c.
  const RequestMessage in_flight = Bits({0}, 0);
  RunFull(2, {"c"});
  EXPECT_EQ(generation(), 1u);
  ASSERT_EQ(cache_->Lookup(Req("c"), 0), 0u);  // c took a's bit
  Add(1, in_flight);
  EXPECT_EQ(coordinator_->pending(), 0u);
  // Rank 0 sends c through the same bit: it must wait for rank 1, not run with rank 1's a.
  Add(0, Bits({0}, generation()));
  EXPECT_TRUE(Run().empty());
  EXPECT_EQ(coordinator_->pending(), 1u);
  // Rank 1 saw the eviction while its bit was in flight: it sends a again, in full.
  Add(1, Full({Req("a")}, generation()));
  Add(0, Full({Req("a")}, generation()));
  ResponseMessage m;
  EXPECT_EQ(Run(&m), (Names{"a"}));
  EXPECT_EQ(m.evictions, (std::vector<uint32_t>{1}));  // b; c waits on rank 0's bit
  Add(1, Bits({0}, generation()));
  EXPECT_EQ(Run(), (Names{"c"}));
  EXPECT_EQ(coordinator_->pending(), 0u);
  // Its inline data goes with a stale bit, unread.
  RequestMessage stale = Bits({0}, 0);
  stale.cached_data[0] = "xyz";
  Add(1, stale);
  EXPECT_EQ(coordinator_->pending(), 0u);
}

TEST_F(CoordinatorEvictionTest, GenerationAheadOfTheCoordinatorsIsAProtocolError) {
  Start(2, 2);
  Status s = coordinator_->Add(1, Bits({}, 1), Clock::now());
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("generation 1, ahead of the coordinator's 0"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace concord
