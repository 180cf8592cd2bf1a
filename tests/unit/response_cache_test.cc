#include "core/response_cache.h"

#include <gtest/gtest.h>

#include <string>

#include "core/entry_validation.h"

namespace concord {
namespace {

// A successful allreduce response for `name` with the given shape.
Response Allreduce(const std::string& name, std::vector<int64_t> shape) {
  Response r;
  r.request.name = name;
  r.request.shape = std::move(shape);
  return r;
}

// A successful allgather response: trailing dims {3}, first dimension first_dims[r] on rank r.
Response Allgather(const std::string& name, std::vector<int64_t> first_dims) {
  Response r;
  r.request.name = name;
  r.request.op = OpType::kAllgather;
  r.request.shape = {first_dims.at(0), 3};
  r.first_dims = std::move(first_dims);
  return r;
}

TEST(ResponseCacheTest, InsertLookupGet) {
  ResponseCache cache(8);
  EXPECT_EQ(cache.capacity(), 8u);
  const Response a = Allreduce("a", {4});
  const Response b = Allreduce("b", {2, 2});
  EXPECT_FALSE(cache.Lookup(a.request, 0).has_value());
  cache.Insert(a);
  cache.Insert(b);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Lookup(a.request, 0), 0u);
  EXPECT_EQ(cache.Lookup(b.request, 1), 1u);
  ASSERT_NE(cache.Get(1), nullptr);
  EXPECT_EQ(cache.Get(1)->request, b.request);
  EXPECT_EQ(cache.Get(2), nullptr);
  EXPECT_EQ(cache.Get(0xFFFFFFFFu), nullptr);
  // Any field that differs misses.
  TensorRequest other = a.request;
  other.dtype = DType::kFloat64;
  EXPECT_FALSE(cache.Lookup(other, 0).has_value());
  other = a.request;
  other.prescale = 2.0;
  EXPECT_FALSE(cache.Lookup(other, 0).has_value());
}

TEST(ResponseCacheTest, AllgatherMatchesEachRanksOwnFirstDimension) {
  ResponseCache cache(8);
  const Response g = Allgather("g", {2, 5, 0});
  cache.Insert(g);
  for (int rank = 0; rank < 3; ++rank) {
    TensorRequest mine = g.RequestOf(rank);
    EXPECT_EQ(mine.shape[0], g.first_dims[rank]);
    EXPECT_EQ(cache.Lookup(mine, rank), 0u) << "rank " << rank;
    // Another rank's first dimension is not this rank's request.
    TensorRequest wrong = g.RequestOf((rank + 1) % 3);
    EXPECT_FALSE(cache.Lookup(wrong, rank).has_value()) << "rank " << rank;
  }
}

TEST(ResponseCacheTest, IdenticalInsertIgnored) {
  ResponseCache cache(8);
  cache.Insert(Allreduce("a", {4}));
  cache.Insert(Allreduce("a", {4}));
  cache.Insert(Allgather("g", {1, 2}));
  cache.Insert(Allgather("g", {1, 2}));
  EXPECT_EQ(cache.size(), 2u);
}

TEST(ResponseCacheTest, SameNameDifferentSignatureGetsNewBit) {
  ResponseCache cache(8);
  cache.Insert(Allreduce("a", {4}));
  cache.Insert(Allreduce("a", {8}));
  cache.Insert(Allgather("g", {1, 2}));
  cache.Insert(Allgather("g", {1, 3}));  // differs only in rank 1's first dimension
  EXPECT_EQ(cache.size(), 4u);
  EXPECT_EQ(cache.Lookup(Allreduce("a", {4}).request, 0), 0u);
  EXPECT_EQ(cache.Lookup(Allreduce("a", {8}).request, 0), 1u);
  EXPECT_EQ(cache.Lookup(Allgather("g", {1, 3}).RequestOf(1), 1), 3u);
}

TEST(ResponseCacheTest, ErrorsAreNotCached) {
  ResponseCache cache(8);
  Response e = Allreduce("e", {4});
  e.error = Code::kMismatch;
  e.error_message = "ranks disagree";
  cache.Insert(e);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.Lookup(e.request, 0).has_value());
}

TEST(ResponseCacheTest, FullCacheInsertsNothing) {
  ResponseCache cache(2);
  cache.Insert(Allreduce("a", {1}));
  cache.Insert(Allreduce("b", {1}));
  cache.Insert(Allreduce("c", {1}));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_FALSE(cache.Lookup(Allreduce("c", {1}).request, 0).has_value());
  EXPECT_EQ(cache.Lookup(Allreduce("b", {1}).request, 0), 1u);
}

TEST(ResponseCacheTest, CapacityZeroDisables) {
  ResponseCache cache(0);
  cache.Insert(Allreduce("a", {1}));
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.Get(0), nullptr);
  EXPECT_FALSE(cache.Lookup(Allreduce("a", {1}).request, 0).has_value());
}

// A list of full responses (new to the cache) and cached bits, with `evictions`.
ResponseMessage List(const std::vector<Response>& full, const std::vector<uint32_t>& cached,
                     std::vector<uint32_t> evictions = {}) {
  ResponseMessage m;
  for (uint32_t bit : cached) {
    ResponseItem item;
    item.cached = true;
    item.bit = bit;
    m.items.push_back(item);
  }
  for (const Response& r : full) {
    ResponseItem item;
    item.response = r;
    m.items.push_back(item);
  }
  m.evictions = std::move(evictions);
  return m;
}

// Applies `list` on rank 0, expecting success; returns the names to send again.
std::vector<std::string> Apply(ResponseCache& cache, const ResponseMessage& list, int rank = 0) {
  std::vector<std::string> resend;
  Status s = cache.Apply(list, rank, &resend);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return resend;
}

TEST(ResponseCacheEvictionTest, LeastRecentlyExecutedGoFirstAndKeptBitsStay) {
  ResponseCache cache(4);
  Apply(cache,
        List({Allreduce("a", {1}), Allreduce("b", {1}), Allreduce("c", {1}), Allreduce("d", {1})},
             {}));
  EXPECT_EQ(cache.size(), 4u);
  // a (bit 0) and c (bit 2) run again: b, d are now the least recently executed.
  Apply(cache, List({}, {2, 0}));
  const ResponseMessage two_new = List({Allreduce("e", {1}), Allreduce("f", {1})}, {});
  EXPECT_EQ(cache.EvictionsNeeded(two_new), 2u);
  EXPECT_EQ(cache.ChooseVictims(2, {}), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(cache.ChooseVictims(1, {}), (std::vector<uint32_t>{1}));
  // A kept bit (one the coordinator holds) is passed over: next in line is c, then a.
  EXPECT_EQ(cache.ChooseVictims(2, {uint64_t{1} << 1}), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(cache.ChooseVictims(9, {0xF}), (std::vector<uint32_t>{}));
  // Responses already cached, errors and barriers need no room.
  Response error = Allreduce("x", {1});
  error.error = Code::kMismatch;
  EXPECT_EQ(cache.EvictionsNeeded(List({Allreduce("a", {1}), error}, {})), 0u);
  EXPECT_EQ(cache.EvictionsNeeded(List({Allreduce("a", {2})}, {})), 1u);
  ResponseCache roomy(8);
  Apply(roomy, List({Allreduce("a", {1})}, {}));
  EXPECT_EQ(roomy.EvictionsNeeded(two_new), 0u);
}

TEST(ResponseCacheEvictionTest, EvictedBitsAreReusedLowestFirstAndTheGenerationTellsStaleBits) {
  ResponseCache cache(3);
  Apply(cache, List({Allreduce("a", {1}), Allreduce("b", {1}), Allreduce("c", {1})}, {}));
  EXPECT_EQ(cache.generation(), 0u);
  const uint64_t before = cache.generation();
  EXPECT_FALSE(cache.EvictedAfter(0, before));
  // d and e replace c and a, which the list evicts; they take bits 0 and 2, lowest first.
  Apply(cache, List({Allreduce("d", {1}), Allreduce("e", {1})}, {}, {0, 2}));
  EXPECT_EQ(cache.generation(), 2u);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.Lookup(Allreduce("d", {1}).request, 0), 0u);
  EXPECT_EQ(cache.Lookup(Allreduce("e", {1}).request, 0), 2u);
  EXPECT_EQ(cache.Lookup(Allreduce("b", {1}).request, 0), 1u);
  EXPECT_FALSE(cache.Lookup(Allreduce("a", {1}).request, 0).has_value());
  EXPECT_FALSE(cache.Lookup(Allreduce("c", {1}).request, 0).has_value());
  // A bit looked up before the evictions is stale; after them it is not; bit 1 never was.
  EXPECT_TRUE(cache.EvictedAfter(0, before));
  EXPECT_TRUE(cache.EvictedAfter(2, before));
  EXPECT_TRUE(cache.EvictedAfter(2, before + 1));  // bit 2 went second
  EXPECT_FALSE(cache.EvictedAfter(0, cache.generation()));
  EXPECT_FALSE(cache.EvictedAfter(1, before));
  EXPECT_FALSE(cache.EvictedAfter(99, before));
  // An eviction leaves a hole until something is inserted.
  Apply(cache, List({}, {}, {1}));
  EXPECT_EQ(cache.Get(1), nullptr);
  EXPECT_EQ(cache.size(), 2u);
  cache.Insert(Allreduce("f", {1}));
  EXPECT_EQ(cache.Lookup(Allreduce("f", {1}).request, 0), 1u);
}

TEST(ResponseCacheEvictionTest, BitsSentAndEvictedBeforeTheyRanAreSentAgain) {
  ResponseCache cache(4);
  Apply(cache,
        List({Allreduce("a", {1}), Allreduce("b", {1}), Allreduce("c", {1}), Allreduce("d", {1})},
             {}));
  cache.MarkSent(0);  // a: runs through its bit
  cache.MarkSent(1);  // b: evicted while in flight
  cache.MarkSent(2);  // c: the coordinator expanded it; it runs as a full response
  cache.MarkSent(3);  // d: its full response is an error for other ranks only
  Response c_full = Allreduce("c", {1});
  c_full.error = Code::kMismatch;
  Response d_other = Allreduce("d", {1});
  d_other.error = Code::kMismatch;
  d_other.error_ranks = {1};
  EXPECT_EQ(Apply(cache, List({c_full, d_other}, {0})), std::vector<std::string>{});
  EXPECT_EQ(Apply(cache, List({}, {}, {0, 1, 2, 3})), (std::vector<std::string>{"b", "d"}));
  // Once run or sent again, a bit is no longer this rank's.
  Apply(cache, List({Allreduce("a", {1}), Allreduce("b", {1})}, {}));
  EXPECT_EQ(Apply(cache, List({}, {}, {0, 1})), std::vector<std::string>{});
}

// A full response that lists this rank as joined ran without a request of this rank's (the
// others' submission, with this rank standing in): the bit this rank sent for that name after
// joining is still in flight (Engine::TakeEntries leaves its entry queued), so an eviction before
// it ran makes the rank send it again. Without that, the coordinator ignores the stale bit and
// the rank never resends it: the operation waits until the stall shutdown.
TEST(ResponseCacheEvictionTest, AResponseListingThisRankAsJoinedLeavesItsBitInFlight) {
  ResponseCache joined_rank(2), other_rank(2);
  for (ResponseCache* cache : {&joined_rank, &other_rank}) {
    Apply(*cache, List({Allreduce("x", {1})}, {}), cache == &joined_rank ? 1 : 0);
    cache->MarkSent(0);  // x, as its bit
  }
  // The others' x, with rank 1 joined: ran, and failed among the others.
  Response ran = Allreduce("x", {1});
  ran.joined = {1};
  Response failed = ran;
  failed.error = Code::kMismatch;
  for (const Response& r : {ran, failed}) {
    EXPECT_EQ(Apply(joined_rank, List({r}, {}), 1), std::vector<std::string>{});
    EXPECT_EQ(Apply(other_rank, List({r}, {}), 0), std::vector<std::string>{});
  }
  // Rank 1's bit is still in flight; rank 0's ran.
  EXPECT_EQ(Apply(joined_rank, List({}, {}, {0}), 1), std::vector<std::string>{"x"});
  EXPECT_EQ(Apply(other_rank, List({}, {}, {0}), 0), std::vector<std::string>{});
  // The join's own response, which lists every rank as joined, is never cached: no bit is ever
  // sent for a join.
  Response join;
  join.request.name = JoinName(0);
  join.request.op = OpType::kBarrier;
  join.request.dtype = DType::kUint8;
  join.joined = {1, 0};
  joined_rank.Insert(join);
  EXPECT_EQ(joined_rank.size(), 0u);
  EXPECT_FALSE(joined_rank.Lookup(join.request, 1).has_value());
}

TEST(ResponseCacheEvictionTest, ListNamingNoEntryIsAProtocolError) {
  ResponseCache cache(2);
  cache.Insert(Allreduce("a", {1}));
  std::vector<std::string> resend;
  EXPECT_EQ(cache.Apply(List({}, {1}), 0, &resend).code(), Code::kProtocolError);
  EXPECT_EQ(cache.Apply(List({}, {}, {1}), 0, &resend).code(), Code::kProtocolError);
  EXPECT_EQ(cache.Apply(List({}, {}, {7}), 0, &resend).code(), Code::kProtocolError);
}

// Ranks that apply the same lists agree bit for bit, whatever each of them sent.
TEST(ResponseCacheEvictionTest, CachesApplyingTheSameListsAgree) {
  ResponseCache lead(5), other(5);
  for (int step = 0; step < 40; ++step) {
    std::vector<Response> fresh = {Allreduce("one-off." + std::to_string(step), {1})};
    if (step % 7 == 0) fresh.push_back(Allreduce("static", {step % 2 + 1}));
    std::vector<uint32_t> cached;
    if (auto bit = lead.Lookup(Allreduce("static", {1}).request, 0)) cached.push_back(*bit);
    ResponseMessage list = List(fresh, cached);
    std::vector<uint64_t> keep(1, 0);  // the bits the list runs
    for (uint32_t bit : cached) keep[0] |= uint64_t{1} << bit;
    list.evictions = lead.ChooseVictims(lead.EvictionsNeeded(list), keep);
    if (step % 3 == 0 && other.Get(0) != nullptr) other.MarkSent(0);
    Apply(lead, list);
    Apply(other, list, 1);
    ASSERT_EQ(lead.generation(), other.generation());
    ASSERT_EQ(lead.size(), other.size());
    for (uint32_t bit = 0; bit < 5; ++bit) {
      ASSERT_EQ(lead.Get(bit) == nullptr, other.Get(bit) == nullptr) << bit;
      if (lead.Get(bit)) {
        EXPECT_EQ(lead.Get(bit)->request, other.Get(bit)->request);
      }
    }
  }
  EXPECT_GT(lead.generation(), 30u);
}

}  // namespace
}  // namespace concord

namespace concord {
namespace {

TEST(ResponseCacheBarrierTest, BarriersAreNotCached) {
  ResponseCache cache(4);
  for (int i = 0; i < 10; ++i) {
    Response r;
    r.request.name = "__concord.barrier." + std::to_string(i);
    r.request.op = OpType::kBarrier;
    r.request.dtype = DType::kUint8;
    cache.Insert(r);
  }
  EXPECT_EQ(cache.size(), 0u);
  Response grad;
  grad.request.name = "grad";
  grad.request.shape = {3};
  cache.Insert(grad);
  EXPECT_EQ(cache.size(), 1u);
}

}  // namespace
}  // namespace concord

namespace concord {
namespace {

TEST(ResponseIsRequestOfTest, AgreesWithRequestOf) {
  Response r;
  r.request.name = "g";
  r.request.op = OpType::kAllgather;
  r.request.shape = {2, 3};
  r.first_dims = {2, 5, 0};
  for (int rank = 0; rank < 3; ++rank) {
    const TensorRequest own = r.RequestOf(rank);
    EXPECT_TRUE(r.IsRequestOf(own, rank)) << rank;
    TensorRequest other = own;
    other.shape[0] += 1;
    EXPECT_FALSE(r.IsRequestOf(other, rank));
    other = own;
    other.shape[1] = 4;
    EXPECT_FALSE(r.IsRequestOf(other, rank));
    other = own;
    other.dtype = DType::kInt8;
    EXPECT_FALSE(r.IsRequestOf(other, rank));
    other = own;
    other.shape.push_back(1);
    EXPECT_FALSE(r.IsRequestOf(other, rank));
  }
  r.request.op = OpType::kAllreduce;  // every rank must then have rank 0's very shape
  EXPECT_TRUE(r.IsRequestOf(r.request, 1));
  TensorRequest scaled = r.request;
  scaled.prescale = 0.5;
  EXPECT_FALSE(r.IsRequestOf(scaled, 1));
}

}  // namespace
}  // namespace concord
