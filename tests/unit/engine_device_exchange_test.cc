// The engine's device path for reduce-scatter, all-to-all, reduce and gather, on the CPU: real
// Engines (ranks as threads) whose CUDA tensors go to the in-process fake device backend
// (inproc_device.h). 1 to 4 ranks; every dtype; sizes 0, 1, odd and large; even and uneven
// splits; every root; in place; the refusals at enqueue.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/engine.h"
#include "core/entry_validation.h"
#include "tests/common/tensors.h"
#include "tests/unit/device_job.h"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/inproc_device.h"

namespace concord {
namespace {

using device_testing::DeviceJob;
using device_testing::Request;
using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Submit;
using harness::kAllDTypes;
using harness::LoadElement;
using harness::RunRanks;
using harness::StoreElement;
using std::chrono::milliseconds;

class DeviceExchangeTest : public ::testing::TestWithParam<int> {};

// Rank r's input element i: i % 5 + 2r (exact in every dtype).
double Input(size_t i, int rank) {
  return static_cast<double>(i % 5 + rank * 2);
}

// Every dtype x rows {0, 1, 7, 1001} of 3 columns x even and uneven splits, sum; floating types
// also average with prescale 0.5 and postscale 4, and in place (the output at the input's start).
TEST_P(DeviceExchangeTest, ReducescatterEveryDTypeSizeAndSplit) {
  const int size = GetParam();
  DeviceJob job(size, milliseconds(0));
  constexpr int64_t kCols = 3;
  size_t launched = 0;
  RunRanks(size, [&](int rank) {
    int k = 0;
    for (DType dtype : kAllDTypes) {
      for (int64_t rows : {0, 1, 7, 1001}) {
        for (int variant = 0; variant < 4; ++variant) {
          const bool uneven = variant == 1;
          const bool scaled = variant >= 2;
          const bool in_place = variant == 3;
          if (scaled && !IsFloatingPoint(dtype)) continue;
          TensorRequest r =
              Request("rs" + std::to_string(k++), OpType::kReducescatter, dtype, {rows, kCols});
          if (uneven) {  // everything to the last rank but one row to rank 0
            r.splits.assign(size, 0);
            r.splits[size - 1] = rows;
            if (rows > 0 && size > 1) {
              r.splits[0] = 1;
              r.splits[size - 1] = rows - 1;
            }
          }
          if (scaled) {
            r.reduce_op = ReduceOp::kAverage;
            r.prescale = 0.5;
            r.postscale = 4.0;
          }
          ASSERT_TRUE(NormalizeSplits(&r, size).ok());
          int64_t first = 0;
          for (int d = 0; d < rank; ++d) first += r.splits[d];
          const size_t mine = static_cast<size_t>(r.splits[rank] * kCols);
          const size_t esize = DTypeSize(dtype);
          std::vector<uint8_t> in(rows * kCols * esize + esize);
          for (size_t i = 0; i < static_cast<size_t>(rows * kCols); ++i) {
            StoreElement(dtype, in.data(), i, Input(i, rank));
          }
          std::vector<uint8_t> out((mine + 1) * esize, 0xAB);
          void* dst = in_place ? in.data() : out.data();
          const double pre = r.prescale, post = r.postscale;
          const ReduceOp op = r.reduce_op;
          Status s = Await(Submit(job[rank], Entry(r, in.data(), dst, mine * esize)));
          ASSERT_TRUE(s.ok()) << s.ToString();
          const uint8_t* got = static_cast<const uint8_t*>(dst);
          for (size_t i = 0; i < mine; ++i) {
            const size_t at = static_cast<size_t>(first * kCols) + i;
            const double want = harness::ExpectedAllreduce(
                op, dtype, size, [&](int rk) { return Input(at, rk); }, pre, post);
            const double tol =
                IsHalfPrecision(dtype) ? 0.05 * std::max(1.0, std::fabs(want)) : 1e-5;
            ASSERT_NEAR(LoadElement(dtype, got, i), want, tol)
                << DTypeName(dtype) << " rows " << rows << " variant " << variant << " element "
                << i << " on rank " << rank;
          }
          if (!in_place) {  // nothing written past this rank's block
            EXPECT_EQ(out[mine * esize], 0xAB);
          }
        }
      }
    }
    if (rank == 0) launched = static_cast<size_t>(k);
  });
  for (int r = 0; r < size; ++r) {
    // One launch each: device reduce-scatters are never fused, nor completed inline.
    EXPECT_EQ(job[r].stats().device_launches.load(), launched);
    EXPECT_EQ(job[r].stats().inline_reductions.load(), 0u);
  }
  EXPECT_EQ(job.world().CollectivesOn(0), 0u);  // the CPU backend stays idle
}

// Rank r sends (r + d) % 3 rows of 2 int32 to rank d (row values r * 100 + d * 10 + j); each rank
// receives them in rank order, with the received splits; a large float64 exchange too.
TEST_P(DeviceExchangeTest, AlltoallUnevenSplitsAndLarge) {
  const int size = GetParam();
  DeviceJob job(size, milliseconds(0));
  auto rows = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
  RunRanks(size, [&](int rank) {
    std::vector<int32_t> in;
    std::vector<int64_t> splits(size);
    for (int d = 0; d < size; ++d) {
      splits[d] = rows(rank, d);
      for (int64_t j = 0; j < splits[d] * 2; ++j) in.push_back(rank * 100 + d * 10 + j);
    }
    TensorRequest r =
        Request("a2a", OpType::kAlltoall, DType::kInt32, {static_cast<int64_t>(in.size() / 2), 2});
    r.splits = splits;
    std::vector<int32_t> want;
    std::vector<int64_t> want_splits;
    for (int s = 0; s < size; ++s) {
      want_splits.push_back(rows(s, rank));
      for (int64_t j = 0; j < rows(s, rank) * 2; ++j) want.push_back(s * 100 + rank * 10 + j);
    }
    std::vector<int32_t> out(want.size() + 1, -1);
    auto state = Submit(job[rank], Entry(r, in.data(), out.data(), want.size() * 4));
    Status s = Await(state);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::vector<int32_t>(out.begin(), out.end() - 1), want);
    EXPECT_EQ(out.back(), -1);
    const RequestState::Output& o = state->output();
    EXPECT_EQ(o.splits, want_splits);
    EXPECT_EQ(o.bytes, want.size() * 4);
    EXPECT_EQ(o.data, out.data());

    // Large, even: 4099 rows of one float64 per destination.
    const int64_t per = 4099;
    std::vector<double> big(per * size), got(per * size, -1.0);
    for (size_t i = 0; i < big.size(); ++i) big[i] = rank * 1e6 + static_cast<double>(i);
    TensorRequest b = Request("a2a.big", OpType::kAlltoall, DType::kFloat64, {per * size});
    ASSERT_TRUE(NormalizeSplits(&b, size).ok());
    s = Await(Submit(job[rank], Entry(b, big.data(), got.data(), got.size() * 8)));
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int src = 0; src < size; ++src) {
      for (int64_t j = 0; j < per; ++j) {
        ASSERT_EQ(got[src * per + j], src * 1e6 + static_cast<double>(rank * per + j));
      }
    }
  });
}

// A reduce to every root (sum of int32, average of float32 with scales) and a gather of rank-many
// rows to every root; the other ranks give no output and their buffers stay untouched.
TEST_P(DeviceExchangeTest, ReduceAndGatherToEveryRoot) {
  const int size = GetParam();
  DeviceJob job(size, milliseconds(0));
  RunRanks(size, [&](int rank) {
    for (int root = 0; root < size; ++root) {
      const std::string tag = std::to_string(root);
      std::vector<int32_t> ints(7);
      for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<int32_t>(rank * 10 + i);
      std::vector<int32_t> ints_out(7, -1);
      TensorRequest ri = Request("rd.i" + tag, OpType::kReduce, DType::kInt32, {7});
      ri.root = root;
      std::vector<float> floats(4099, static_cast<float>(rank + 1)), floats_out(4099, -1.0f);
      TensorRequest rf = Request("rd.f" + tag, OpType::kReduce, DType::kFloat32, {4099});
      rf.root = root;
      rf.reduce_op = ReduceOp::kAverage;
      rf.prescale = 2.0;
      rf.postscale = 0.5;
      const bool mine = rank == root;
      auto si = Submit(job[rank], Entry(ri, ints.data(), mine ? ints_out.data() : nullptr));
      // The root reduces in place.
      auto sf = Submit(job[rank], Entry(rf, floats.data(), mine ? floats.data() : nullptr));
      std::vector<int64_t> rows_in(rank * 2, rank * 1000 + root);  // `rank` rows of 2
      std::vector<int64_t> gathered(size * size + 1, -1);
      TensorRequest g = Request("ga" + tag, OpType::kGather, DType::kInt64, {rank, 2});
      g.root = root;
      auto sg = Submit(job[rank], Entry(g, rows_in.data(), mine ? gathered.data() : nullptr,
                                        mine ? gathered.size() * 8 : 0));
      for (const auto& st : {si, sf, sg}) {
        Status s = Await(st);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      if (mine) {
        for (size_t i = 0; i < ints.size(); ++i) {
          int32_t want = 0;
          for (int r = 0; r < size; ++r) want += static_cast<int32_t>(r * 10 + i);
          ASSERT_EQ(ints_out[i], want);
        }
        // mean of 2 (r + 1), halved: (size + 1) / 2.
        EXPECT_FLOAT_EQ(floats[0], (size + 1) / 2.0f);
        EXPECT_FLOAT_EQ(floats[4098], (size + 1) / 2.0f);
        std::vector<int64_t> want;
        for (int r = 0; r < size; ++r) want.insert(want.end(), r * 2, r * 1000 + root);
        EXPECT_EQ(std::vector<int64_t>(gathered.begin(), gathered.begin() + want.size()), want);
        EXPECT_EQ(gathered[want.size()], -1);
        EXPECT_EQ(sg->output().first_dim, size * (size - 1) / 2);
        EXPECT_EQ(sg->output().bytes, want.size() * 8);
      } else {
        EXPECT_EQ(ints_out, std::vector<int32_t>(7, -1));
        EXPECT_EQ(floats[0], static_cast<float>(rank + 1));  // a non-root's input is unchanged
        EXPECT_EQ(sg->output().bytes, 0u);
      }
    }
  });
}

// An output too small for what an alltoall or a gather receives fails that rank's request with
// INVALID_ARGUMENT after taking part; the other ranks' succeed and the next operation runs.
TEST_P(DeviceExchangeTest, OutputTooSmallFailsOnlyThatRank) {
  const int size = GetParam();
  DeviceJob job(size, milliseconds(0));
  RunRanks(size, [&](int rank) {
    std::vector<float> in(size * 2, 1.0f), out(size * 2, 0.0f);
    TensorRequest a = Request("a2a.small", OpType::kAlltoall, DType::kFloat32, {size * 2});
    ASSERT_TRUE(NormalizeSplits(&a, size).ok());
    const size_t capacity = rank == size - 1 ? 4 : out.size() * 4;
    Status s = Await(Submit(job[rank], Entry(a, in.data(), out.data(), capacity)));
    if (rank == size - 1) {
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find("alltoall result needs"), std::string::npos) << s.message();
    } else {
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    TensorRequest g = Request("ga.small", OpType::kGather, DType::kFloat32, {2});
    g.root = 0;
    s = Await(Submit(job[rank],
                     Entry(g, in.data(), rank == 0 ? out.data() : nullptr, rank == 0 ? 4 : 0)));
    if (rank == 0) {
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find("gather result needs"), std::string::npos) << s.message();
    } else {
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    std::vector<float> x(3, 1.0f);
    s = Await(Submit(job[rank], Entry(Request("after", OpType::kAllreduce, DType::kFloat32, {3}),
                                      x.data(), x.data())));
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(x[0], static_cast<float>(size));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceExchangeTest, ::testing::Values(1, 2, 3, 4));

// Refused at enqueue, with the reason: an alltoall or a gather's root without an output (device
// memory cannot be owned by the request), a reduce's root without one (as on the CPU); an
// alltoall whose output overlaps its input; a
// reduce-scatter or reduce in deterministic mode (NCCL does not reduce in rank order). Nothing is
// lost: the next one runs.
TEST(DeviceExchangeRefusalTest, RefusedAtEnqueueWithTheReason) {
  DeviceJob job(1, milliseconds(0));
  std::vector<float> data(4, 1.0f);
  TensorRequest a = Request("a2a", OpType::kAlltoall, DType::kFloat32, {4});
  ASSERT_TRUE(NormalizeSplits(&a, 1).ok());
  for (const TensorRequest& r : {a, Request("ga", OpType::kGather, DType::kFloat32, {4})}) {
    Status s = job[0].Enqueue(Entry(r, data.data(), nullptr));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("needs an output buffer on the device"), std::string::npos)
        << s.message();
  }
  Status root = job[0].Enqueue(
      Entry(Request("rd", OpType::kReduce, DType::kFloat32, {4}), data.data(), nullptr));
  EXPECT_EQ(root.code(), Code::kInvalidArgument) << root.ToString();
  EXPECT_NE(root.message().find("NULL on the root"), std::string::npos) << root.message();
  DeviceJob deterministic(1, milliseconds(0), [](Config& c) { c.deterministic = true; });
  TensorRequest rs = Request("rs", OpType::kReducescatter, DType::kFloat32, {4});
  ASSERT_TRUE(NormalizeSplits(&rs, 1).ok());
  for (const TensorRequest& r : {rs, Request("rd", OpType::kReduce, DType::kFloat32, {4})}) {
    std::vector<float> out(4);
    Status s = deterministic[0].Enqueue(Entry(r, data.data(), out.data(), 16));
    EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("deterministic mode"), std::string::npos) << s.message();
  }
  // An alltoall whose output is, or crosses, its input (the device sends and receives at once).
  for (float* output : {data.data(), data.data() + 2}) {
    Status s = job[0].Enqueue(Entry(a, data.data(), output, 16));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("needs an output that does not overlap its input"),
              std::string::npos)
        << s.message();
  }
  std::vector<float> out(4);
  Status s = Await(Submit(job[0], Entry(a, data.data(), out.data(), 16)));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out, data);
}

}  // namespace
}  // namespace concord
