// The coordinator with a full response cache (coordinator.h, protocol point 3): which entries a
// list evicts, and what happens to a bit that was evicted while it was on its way.
#include <gtest/gtest.h>

#include <optional>
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

// A coordinator and every rank's response cache (caches_[0], rank 0's, is the one it reads), to
// which every list taken is applied, as each rank's engine does after executing it.
class CoordinatorEvictionTest : public ::testing::Test {
 protected:
  void Start(int size, size_t capacity) {
    caches_.clear();
    for (int r = 0; r < size; ++r) caches_.push_back(std::make_unique<ResponseCache>(capacity));
    cache_ = caches_[0].get();
    resend_.assign(size, {});
    coordinator_ = std::make_unique<Coordinator>(size, cache_, StallOptions());
  }
  void Add(int rank, const RequestMessage& m) {
    Status s = coordinator_->Add(rank, m, Clock::now());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // `rank`'s message for `requests`, as its engine builds it: each one a cache entry's bit (marked
  // sent) when its cache holds one, else in full.
  RequestMessage Send(int rank, const std::vector<TensorRequest>& requests) {
    ResponseCache& cache = *caches_[rank];
    RequestMessage m = Bits({}, cache.generation());
    for (const auto& q : requests) {
      if (std::optional<uint32_t> bit = cache.Lookup(q, rank)) {
        cache.MarkSent(*bit);
        if (*bit / 64 >= m.cached_mask.size()) m.cached_mask.resize(*bit / 64 + 1, 0);
        m.cached_mask[*bit / 64] |= uint64_t{1} << (*bit % 64);
      } else {
        m.requests.push_back(q);
      }
    }
    return m;
  }
  // Takes what is ready and applies it to every rank's cache, keeping in resend_ what each rank
  // must send again; the names of its items, in order.
  std::vector<std::string> Run(ResponseMessage* out = nullptr) {
    StatusOr<ResponseMessage> m = coordinator_->TakeReady(Clock::now());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return {};
    std::vector<std::string> names;
    for (const auto& item : m->items) {
      names.push_back(item.cached ? cache_->Get(item.bit)->request.name
                                  : item.response.request.name);
    }
    for (size_t r = 0; r < caches_.size(); ++r) {
      resend_[r].clear();
      Status s = caches_[r]->Apply(*m, static_cast<int>(r), &resend_[r]);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
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

  std::vector<std::unique_ptr<ResponseCache>> caches_;  // by rank
  ResponseCache* cache_ = nullptr;                      // rank 0's
  std::vector<std::vector<std::string>> resend_;        // by rank, from the last Run
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

// A member's bit expanded into its request (a rank sent the member in full) stands for that
// request while the member is held for its group: evicting it would tell the ranks that sent it
// to send the request again though the held member runs it, and the coordinator would keep their
// second request waiting forever (the next submission of the name: "sent twice").
TEST_F(CoordinatorEvictionTest, BitExpandedIntoAMemberHeldForItsGroupIsKept) {
  Start(3, 3);
  TensorRequest a = Req("a");
  auto b = [](int64_t rows) {  // an allgather: each rank's own number of rows
    TensorRequest q = Req("b");
    q.op = OpType::kAllgather;
    q.shape = {rows, 1};
    return q;
  };
  auto grouped = [](TensorRequest q) {
    q.group = "a#2";
    q.group_size = 2;
    return q;
  };
  for (int r = 0; r < 3; ++r) Add(r, Send(r, {grouped(a), grouped(b(2))}));
  EXPECT_EQ(Run(), (Names{"a", "b"}));  // bits 0 and 1
  RunFull(3, {"z"});                    // bit 2
  // Rank 2 sends the group again (a as bit 0; b with 3 rows, in full), and while it is on its
  // way, x evicts a: rank 2 sends a again in full.
  const RequestMessage in_flight = Send(2, {grouped(a), grouped(b(3))});
  for (int r = 0; r < 3; ++r) Add(r, Send(r, {Req("x")}));
  ResponseMessage m;
  EXPECT_EQ(Run(&m), (Names{"x"}));
  EXPECT_EQ(m.evictions, (std::vector<uint32_t>{0}));
  EXPECT_EQ(resend_[2], (Names{"a"}));
  Add(2, in_flight);
  // Ranks 0 and 1 send the group (a in full, b as bit 1): b is ready and held for a. y needs
  // room: z goes, not b's bit.
  for (int r = 0; r < 2; ++r) Add(r, Send(r, {grouped(a), grouped(b(2)), Req("y")}));
  Add(2, Send(2, {Req("y")}));
  EXPECT_EQ(Run(&m), (Names{"y"}));
  EXPECT_EQ(m.evictions, (std::vector<uint32_t>{2}));
  EXPECT_TRUE(resend_[0].empty());
  EXPECT_TRUE(resend_[1].empty());
  // Each rank sends again what that list told it to (nothing), and rank 2 its a: the group runs,
  // and nothing is left waiting.
  for (int r = 0; r < 3; ++r) {
    std::vector<TensorRequest> again;
    for (const auto& name : resend_[r]) again.push_back(name == "a" ? grouped(a) : grouped(b(2)));
    if (!again.empty()) Add(r, Send(r, again));
  }
  Add(2, Send(2, {grouped(a)}));
  EXPECT_EQ(Run(), (Names{"b", "a"}));  // in the order they became ready
  EXPECT_EQ(coordinator_->pending(), 0u);
  Status s = coordinator_->Add(1, Send(1, {grouped(b(5))}), Clock::now());
  EXPECT_TRUE(s.ok()) << s.ToString();
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
