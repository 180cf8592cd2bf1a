// The engine's reducescatter and alltoall over the in-process transport (ranks as threads):
// results, splits, the validation at enqueue, mismatches on every rank, groups and the response
// cache (even alltoalls are cached, uneven ones not).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/engine.h"
#include "tests/unit/engine_test_util.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::RunRanks;

// How the ranks' small operations travel (core/engine_inline.cc): through the coordinator
// (inline, the default), on the backend (off), or on the backend because the last rank sends no
// inline data while the others do (mixed).
enum class Inline { kDefault, kOff, kMixed };

// A job of `size` ranks in inline mode `mode`.
std::function<void(Config&)> InlineTweak(Inline mode) {
  return [mode](Config& c) {
    if (mode == Inline::kOff || (mode == Inline::kMixed && c.rank == c.size - 1)) {
      c.inline_threshold_bytes = 0;
    }
  };
}

class ExchangeTest : public ::testing::TestWithParam<std::tuple<int, Inline>> {};

// Rank r's reducescatter input: element i is r * 1000 + i.
std::vector<int64_t> RsInput(int rank, size_t n) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rank * 1000 + static_cast<int64_t>(i);
  return v;
}

TEST_P(ExchangeTest, ReducescatterEvenAndUnevenSplits) {
  const int size = std::get<0>(GetParam());
  Job job(size, InlineTweak(std::get<1>(GetParam())));
  constexpr int64_t kCols = 3;
  // 2 * size + 1 rows, split evenly (the first rank gets the extra row), then unevenly.
  const int64_t rows = 2 * size + 1;
  std::vector<int64_t> uneven(size, 0);
  uneven[size - 1] = rows;  // every row to the last rank
  RunRanks(size, [&](int rank) {
    for (const bool even : {true, false}) {
      TensorRequest r = Request(even ? "rs.even" : "rs.uneven", OpType::kReducescatter,
                                DType::kInt64, {rows, kCols});
      if (!even) r.splits = uneven;
      ASSERT_TRUE(NormalizeSplits(&r, size).ok());
      const std::vector<int64_t> in = RsInput(rank, rows * kCols);
      int64_t first = 0;
      for (int k = 0; k < rank; ++k) first += r.splits[k];
      const int64_t mine = r.splits[rank];
      if (even) {
        EXPECT_EQ(mine, rows / size + (rank < rows % size ? 1 : 0));
      }
      std::vector<int64_t> out(mine * kCols + 1, -7);
      Status s = Await(Submit(job[rank], Entry(r, in.data(), out.data(), mine * kCols * 8)));
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int64_t i = 0; i < mine * kCols; ++i) {
        int64_t want = 0;
        for (int k = 0; k < size; ++k) want += k * 1000 + first * kCols + i;
        ASSERT_EQ(out[i], want) << "rank " << rank << " element " << i;
      }
      EXPECT_EQ(out.back(), -7);  // nothing written past this rank's share
    }
  });
}

TEST_P(ExchangeTest, ReducescatterAverageAndScales) {
  const int size = std::get<0>(GetParam());
  Job job(size, InlineTweak(std::get<1>(GetParam())));
  RunRanks(size, [&](int rank) {
    TensorRequest r = Request("rs.avg", OpType::kReducescatter, DType::kFloat32, {size * 2});
    r.reduce_op = ReduceOp::kAverage;
    r.prescale = 2.0;
    r.postscale = 0.5;
    ASSERT_TRUE(NormalizeSplits(&r, size).ok());
    std::vector<float> in(size * 2, static_cast<float>(rank + 1));
    std::vector<float> out(2, 0.0f);
    Status s = Await(Submit(job[rank], Entry(r, in.data(), out.data(), 8)));
    ASSERT_TRUE(s.ok()) << s.ToString();
    // mean of 2 * (k + 1) over ranks, halved: (size + 1) / 2.
    EXPECT_FLOAT_EQ(out[0], (size + 1) / 2.0f);
    EXPECT_FLOAT_EQ(out[1], (size + 1) / 2.0f);
  });
}

// Rank r sends (r + d) % 3 rows of 2 int32 to rank d; row values r * 100 + d * 10 + j.
int64_t Rows(int from, int to) {
  return (from + to) % 3;
}

TEST_P(ExchangeTest, AlltoallUnevenSplitsAndReceivedSplits) {
  const int size = std::get<0>(GetParam());
  Job job(size, InlineTweak(std::get<1>(GetParam())));
  RunRanks(size, [&](int rank) {
    std::vector<int64_t> splits(size);
    std::vector<int32_t> in;
    for (int d = 0; d < size; ++d) {
      splits[d] = Rows(rank, d);
      for (int64_t j = 0; j < splits[d] * 2; ++j) in.push_back(rank * 100 + d * 10 + j);
    }
    std::vector<int32_t> want;
    std::vector<int64_t> want_splits;
    for (int s = 0; s < size; ++s) {
      want_splits.push_back(Rows(s, rank));
      for (int64_t j = 0; j < Rows(s, rank) * 2; ++j) want.push_back(s * 100 + rank * 10 + j);
    }
    const int64_t dim0 = static_cast<int64_t>(in.size() / 2);
    TensorRequest r = Request("a2a", OpType::kAlltoall, DType::kInt32, {dim0, 2});
    r.splits = splits;
    // Owned by the request, then into the caller's buffer, then one too small on rank 0 only.
    for (int round = 0; round < 3; ++round) {
      const size_t need = want.size() * 4;
      std::vector<int32_t> buf(want.size() + 1, -1);
      void* out = round == 0 ? nullptr : buf.data();
      const size_t cap = round == 2 && rank == 0 ? need - 1 : need;
      auto state = Submit(job[rank], Entry(r, in.data(), out, round == 0 ? 0 : cap));
      Status s = Await(state);
      if (round == 2 && rank == 0 && need > 0) {
        EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
        EXPECT_NE(s.message().find("'a2a'"), std::string::npos) << s.message();
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      const RequestState::Output& o = state->output();
      EXPECT_EQ(o.splits, want_splits);
      EXPECT_EQ(o.bytes, need);
      int64_t rows = 0;
      for (int64_t c : want_splits) rows += c;
      EXPECT_EQ(o.first_dim, rows);
      std::vector<int32_t> got(want.size());
      if (need > 0) std::memcpy(got.data(), o.data, need);
      EXPECT_EQ(got, want);
      if (round == 1) {
        EXPECT_EQ(buf.back(), -1);
      }
    }
  });
  EXPECT_TRUE(job[0].failure().ok());
}

TEST_P(ExchangeTest, EvenAlltoallIsCachedUnevenIsNot) {
  const int size = std::get<0>(GetParam());
  Job job(size, InlineTweak(std::get<1>(GetParam())));
  for (const bool even : {true, false}) {
    for (int step = 0; step < 3; ++step) {
      RunRanks(size, [&](int rank) {
        const uint64_t cached = job[rank].stats().responses_cached.load();
        TensorRequest r =
            Request(even ? "even" : "uneven", OpType::kAlltoall, DType::kFloat32, {2 * size});
        std::vector<float> in(2 * size, static_cast<float>(rank));
        if (!even) {
          // A different routing every step, as a mixture of experts does.
          r.splits.assign(size, 0);
          r.splits[(rank + step) % size] = 2 * size;
        }
        ASSERT_TRUE(NormalizeSplits(&r, size).ok());
        auto state = Submit(job[rank], Entry(r, in.data(), nullptr));
        ASSERT_TRUE(Await(state).ok());
        const uint64_t hits = job[rank].stats().responses_cached.load() - cached;
        // One rank's only split is always the whole tensor: even.
        const bool cacheable = even || size == 1;
        EXPECT_EQ(hits, cacheable && step > 0 ? 1u : 0u) << (even ? "even " : "uneven ") << step;
      });
    }
  }
}

TEST_P(ExchangeTest, InsideAGroupWithAnAllreduce) {
  const int size = std::get<0>(GetParam());
  Job job(size, InlineTweak(std::get<1>(GetParam())));
  RunRanks(size, [&](int rank) {
    std::vector<float> grad(4, 1.0f);
    std::vector<float> rs_in(size, 1.0f), rs_out(1, 0.0f);
    std::vector<float> a2a_in(size, static_cast<float>(rank));
    TensorRequest rs = Request("g.rs", OpType::kReducescatter, DType::kFloat32, {size});
    ASSERT_TRUE(NormalizeSplits(&rs, size).ok());
    TensorRequest a2a = Request("g.a2a", OpType::kAlltoall, DType::kFloat32, {size});
    ASSERT_TRUE(NormalizeSplits(&a2a, size).ok());
    ASSERT_TRUE(job[rank].GroupStart().ok());
    auto a = Submit(job[rank], Entry(Request("g.grad", OpType::kAllreduce, DType::kFloat32, {4}),
                                     grad.data(), grad.data()));
    auto b = Submit(job[rank], Entry(rs, rs_in.data(), rs_out.data(), 4));
    auto c = Submit(job[rank], Entry(a2a, a2a_in.data(), nullptr));
    ASSERT_TRUE(job[rank].GroupEnd().ok());
    for (const auto& state : {a, b, c}) ASSERT_TRUE(Await(state).ok());
    EXPECT_EQ(grad[0], static_cast<float>(size));
    EXPECT_EQ(rs_out[0], static_cast<float>(size));
    std::vector<float> got(size);
    std::memcpy(got.data(), c->output().data, size * 4);
    for (int s = 0; s < size; ++s) EXPECT_EQ(got[s], static_cast<float>(s));
  });
}

// Every small operation completes through the coordinator (stats().inline_reductions) when
// every rank that must sends its input, and on the backend otherwise, with the same results: in
// mixed mode the last rank sends nothing, so only broadcasts from the other roots go inline.
TEST_P(ExchangeTest, SmallOperationsOfEveryKindGoInlineWhenEveryRankSends) {
  const int size = std::get<0>(GetParam());
  const Inline mode = std::get<1>(GetParam());
  Job job(size, InlineTweak(mode));
  RunRanks(size, [&](int rank) {
    const uint64_t before = job[rank].stats().inline_reductions.load();
    std::vector<std::shared_ptr<RequestState>> states;
    std::vector<int32_t> rs_in(2 * size, rank + 1), rs_out(2, 0);
    TensorRequest rs = Request("s.rs", OpType::kReducescatter, DType::kInt32, {2 * size});
    ASSERT_TRUE(NormalizeSplits(&rs, size).ok());
    states.push_back(Submit(job[rank], Entry(rs, rs_in.data(), rs_out.data(), 8)));
    // Rank r gathers r rows of one value r (rank 0 none).
    std::vector<int32_t> ag_in(rank, rank);
    states.push_back(Submit(job[rank], Entry(Request("s.ag", OpType::kAllgather, DType::kInt32,
                                                     {static_cast<int64_t>(rank)}),
                                             ag_in.data(), nullptr)));
    // Rank r sends d + 1 rows of value 10 r + d to rank d.
    std::vector<int32_t> a2a_in;
    TensorRequest a2a = Request("s.a2a", OpType::kAlltoall, DType::kInt32, {0});
    for (int d = 0; d < size; ++d) {
      a2a.splits.push_back(d + 1);
      a2a_in.insert(a2a_in.end(), d + 1, 10 * rank + d);
    }
    a2a.shape[0] = static_cast<int64_t>(a2a_in.size());
    states.push_back(Submit(job[rank], Entry(a2a, a2a_in.data(), nullptr)));
    std::vector<std::vector<float>> bc(size, std::vector<float>(3, static_cast<float>(rank)));
    for (int root = 0; root < size; ++root) {
      TensorRequest b =
          Request("s.bc." + std::to_string(root), OpType::kBroadcast, DType::kFloat32, {3});
      b.root = root;
      states.push_back(Submit(job[rank], Entry(b, bc[root].data(), bc[root].data())));
    }
    for (const auto& state : states) ASSERT_TRUE(Await(state).ok());
    EXPECT_EQ(rs_out, std::vector<int32_t>(2, size * (size + 1) / 2));
    std::vector<int32_t> gathered;
    for (int r = 0; r < size; ++r) gathered.insert(gathered.end(), r, r);
    const RequestState::Output& ag = states[1]->output();
    ASSERT_EQ(ag.bytes, gathered.size() * 4);
    if (ag.bytes > 0) {
      EXPECT_EQ(std::memcmp(ag.data, gathered.data(), ag.bytes), 0);
    }
    std::vector<int32_t> received;
    for (int s = 0; s < size; ++s) received.insert(received.end(), rank + 1, 10 * s + rank);
    const RequestState::Output& got = states[2]->output();
    ASSERT_EQ(got.bytes, received.size() * 4);
    EXPECT_EQ(std::memcmp(got.data, received.data(), got.bytes), 0);
    EXPECT_EQ(got.splits, std::vector<int64_t>(size, rank + 1));
    for (int root = 0; root < size; ++root) {
      EXPECT_EQ(bc[root], std::vector<float>(3, static_cast<float>(root))) << "root " << root;
    }
    uint64_t want = 0;
    if (size > 1 && mode == Inline::kDefault) want = 3 + size;
    if (size > 1 && mode == Inline::kMixed) want = size - 1;
    EXPECT_EQ(job[rank].stats().inline_reductions.load() - before, want) << "rank " << rank;
  });
}

std::string RanksAndInlineName(const ::testing::TestParamInfo<std::tuple<int, Inline>>& info) {
  static const char* const kNames[] = {"inline", "noinline", "mixedinline"};
  return std::to_string(std::get<0>(info.param)) + "ranks_" +
         kNames[static_cast<int>(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(RanksAndInline, ExchangeTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Inline::kDefault, Inline::kOff,
                                                              Inline::kMixed)),
                         RanksAndInlineName);

// A field on which rank 1 differs; the error must name `field`.
struct Mismatch {
  std::string label;
  OpType op;
  std::function<void(TensorRequest&)> differ;
  std::string field;
};

class ExchangeMismatchTest : public ::testing::TestWithParam<Mismatch> {};

TEST_P(ExchangeMismatchTest, EveryRankFailsNamingFieldAndRanks) {
  const Mismatch& c = GetParam();
  constexpr int kSize = 3;
  Job job(kSize);
  RunRanks(kSize, [&](int rank) {
    std::vector<double> in(64, 1.0), out(64, 0.0);
    TensorRequest r = Request("bad", c.op, DType::kFloat32, {6, 2});
    if (rank == 1) c.differ(r);
    ASSERT_TRUE(NormalizeSplits(&r, kSize).ok());
    Status s = Await(Submit(job[rank], Entry(r, in.data(), out.data(), out.size() * 8)));
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_NE(s.message().find("'bad'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("on rank 1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("on ranks 0, 2"), std::string::npos) << s.message();
    // The engine goes on.
    TensorRequest ok = Request("bad", c.op, DType::kFloat32, {6, 2});
    ASSERT_TRUE(NormalizeSplits(&ok, kSize).ok());
    s = Await(Submit(job[rank], Entry(ok, in.data(), out.data(), out.size() * 8)));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ExchangeMismatchTest,
    ::testing::Values(Mismatch{"rs_dtype", OpType::kReducescatter,
                               [](TensorRequest& r) { r.dtype = DType::kFloat64; }, "dtype"},
                      Mismatch{"rs_op", OpType::kReducescatter,
                               [](TensorRequest& r) { r.reduce_op = ReduceOp::kMax; }, "reduce op"},
                      Mismatch{"rs_prescale", OpType::kReducescatter,
                               [](TensorRequest& r) { r.prescale = 2; }, "prescale"},
                      Mismatch{"rs_compression", OpType::kReducescatter,
                               [](TensorRequest& r) { r.compression = "bf16"; }, "compression"},
                      Mismatch{"rs_splits", OpType::kReducescatter,
                               [](TensorRequest& r) {
                                 r.splits = {6, 0, 0};
                               },
                               "splits"},
                      Mismatch{"rs_shape", OpType::kReducescatter,
                               [](TensorRequest& r) {
                                 r.shape = {6, 1};
                               },
                               "shape"},
                      Mismatch{"a2a_dtype", OpType::kAlltoall,
                               [](TensorRequest& r) { r.dtype = DType::kInt32; }, "dtype"},
                      Mismatch{"a2a_dims", OpType::kAlltoall,
                               [](TensorRequest& r) {
                                 r.shape = {6, 1};
                               },
                               "shape after the first dimension"},
                      Mismatch{"a2a_op", OpType::kAlltoall,
                               [](TensorRequest& r) { r.op = OpType::kReducescatter; },
                               "operation"}),
    [](const ::testing::TestParamInfo<Mismatch>& info) { return info.param.label; });

TEST(ExchangeValidateTest, BadSplitsAreRefusedAtEnqueue) {
  Job job(2);
  RunRanks(2, [&](int rank) {
    std::vector<float> in(8, 1.0f), out(8, 0.0f);
    auto refused = [&](TensorRequest r, size_t capacity, const std::string& what) {
      const Status s = job[rank].Enqueue(Entry(r, in.data(), out.data(), capacity));
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << what << ": " << s.ToString();
      EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    };
    for (OpType op : {OpType::kReducescatter, OpType::kAlltoall}) {
      TensorRequest r = Request("t", op, DType::kFloat32, {4, 2});
      r.splits = {1, 2};
      refused(r, 32, "sum to 3");
      r.splits = {5, -1};
      refused(r, 32, "negative");
      r.splits = {4};
      refused(r, 32, "one split per rank");
      // Summed exactly, as the coordinator sums them (it used to fail the communicator for
      // splits each clamped here to the largest tensor size).
      r.splits = {int64_t{1} << 62, int64_t{1} << 62};
      refused(r, 32, "overflow");
      r.shape = {int64_t{1} << 50, 0};
      r.splits = {int64_t{1} << 60, 0};
      refused(r, 0, "sum to 1152921504606846976");
      r.shape = {4, 2};
      TensorRequest scalar = Request("t", op, DType::kFloat32, {});
      scalar.splits = {0, 0};
      refused(scalar, 32, "at least one dimension");
    }
    TensorRequest odd = Request("t", OpType::kAlltoall, DType::kFloat32, {3});
    EXPECT_EQ(NormalizeSplits(&odd, 2).code(), Code::kInvalidArgument);
    TensorRequest rs = Request("t", OpType::kReducescatter, DType::kFloat32, {4, 2});
    rs.splits = {2, 2};
    refused(rs, 15, "output holds 15 bytes");
    rs.dtype = DType::kInt32;
    rs.prescale = 2.0;
    refused(rs, 16, "floating-point");
  });
}

}  // namespace
}  // namespace concord
