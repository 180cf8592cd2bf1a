#include "core/response_cache.h"

#include <gtest/gtest.h>

#include <string>

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
