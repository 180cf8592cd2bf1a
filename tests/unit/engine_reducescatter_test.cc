// Reducescatter beyond the plain case of engine_exchange_test.cc, over the in-process transport
// (ranks as threads): fp16/bf16 compression (results, averages and scales, refusals at enqueue,
// nothing lost), several reducescatters in one response list packed into ONE backend
// reduce-scatter (every dtype, sizes 0, 1 and odd, uneven splits), and outputs that overlap the
// input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/engine.h"
#include "tests/common/tensors.h"
#include "tests/unit/engine_test_util.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::ExpectedAllreduce;
using harness::LoadElement;
using harness::RunRanks;
using harness::StoreElement;

// Rank r's element i of tensor t: a small integer, exact in every dtype, and so are its sums over
// four ranks (unsigned types get 0..4, the others -2..2).
double Value(DType dtype, int rank, int64_t i, int t) {
  const int64_t h = (i * 7 + rank * 3 + t * 5) % 5;
  return dtype == DType::kUint8 ? static_cast<double>(h) : static_cast<double>(h - 2);
}

// Uneven splits of `rows` rows over `size` ranks, different for each tensor t: rank k gets a
// share growing with (k + t) % size, the last rank what is left (rank 0 may get none).
std::vector<int64_t> UnevenSplits(int64_t rows, int size, int t) {
  std::vector<int64_t> splits(size);
  const int64_t shares = static_cast<int64_t>(size) * (size + 1) / 2;
  int64_t left = rows;
  for (int k = 0; k < size; ++k) {
    splits[k] = k == size - 1 ? left : rows * ((k + t) % size) / shares;
    left -= splits[k];
  }
  return splits;
}

// One reducescatter of a test: its request, this rank's input and output buffers.
struct Tensor {
  TensorRequest request;
  std::vector<unsigned char> in, out;
  int64_t first = 0;  // this rank's first row
  std::shared_ptr<RequestState> state;
};

// Tensor t of [rows, cols] with uneven splits, this rank's input filled, the output sized to its
// share plus one guard element of 0xAB bytes.
Tensor MakeTensor(const std::string& name, DType dtype, int64_t rows, int64_t cols, int t, int rank,
                  int size) {
  Tensor x;
  x.request = Request(name, OpType::kReducescatter, dtype, {rows, cols});
  x.request.splits = UnevenSplits(rows, size, t);
  const size_t es = DTypeSize(dtype);
  x.in.resize(static_cast<size_t>(rows * cols) * es);
  for (int64_t i = 0; i < rows * cols; ++i)
    StoreElement(dtype, x.in.data(), i, Value(dtype, rank, i, t));
  for (int k = 0; k < rank; ++k) x.first += x.request.splits[k];
  x.out.assign(static_cast<size_t>(x.request.splits[rank] * cols + 1) * es, 0xAB);
  return x;
}

QueueEntry EntryOf(Tensor& x) {
  const size_t capacity = x.out.size() - DTypeSize(x.request.dtype);  // not the guard
  return Entry(x.request, x.in.data(), x.out.data(), capacity);
}

// Checks this rank's share of x against the expected reduction (within `tolerance`), and that the
// guard element after it is untouched.
void CheckTensor(const Tensor& x, int t, int rank, int size, double tolerance) {
  const TensorRequest& r = x.request;
  const int64_t cols = r.shape[1];
  const int64_t n = r.splits[rank] * cols;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = x.first * cols + i;
    const double want = ExpectedAllreduce(
        r.reduce_op, r.dtype, size, [&](int k) { return Value(r.dtype, k, g, t); }, r.prescale,
        r.postscale);
    const double got = LoadElement(r.dtype, x.out.data(), i);
    ASSERT_NEAR(got, want, tolerance) << r.name << " rank " << rank << " element " << i;
  }
  const size_t es = DTypeSize(r.dtype);
  for (size_t b = 0; b < es; ++b) {
    ASSERT_EQ(x.out[static_cast<size_t>(n) * es + b], 0xAB) << r.name << ": wrote past its share";
  }
}

// Submits `xs` as one group on `engine` and checks each result (tensor t made with index t).
void RunGroupAndCheck(Engine& engine, std::vector<Tensor>& xs, int rank, int size, double tol) {
  ASSERT_TRUE(engine.GroupStart().ok());
  for (Tensor& x : xs) x.state = Submit(engine, EntryOf(x));
  ASSERT_TRUE(engine.GroupEnd().ok());
  for (size_t t = 0; t < xs.size(); ++t) {
    const Status s = Await(xs[t].state);
    ASSERT_TRUE(s.ok()) << s.ToString();
    CheckTensor(xs[t], static_cast<int>(t), rank, size, tol);
  }
}

class ReducescatterTest : public ::testing::TestWithParam<int> {};

// fp16 and bf16 on float32 and float64, sum (prescaled and postscaled), average, min and max
// (reduced in 16 bits with that operation; they used to come back as sums), uneven splits with
// sizes 0, 1 and odd, in one group: compressed reducescatters fuse whatever their
// size, so this is one backend reduce-scatter per (spec, dtype, op).
TEST_P(ReducescatterTest, CompressedMatchesTheDenseResult) {
  const int size = GetParam();
  Job job(size);
  const int64_t kRows[] = {0, 1, 2 * size + 1, 101};
  for (const char* spec : {"fp16", "bf16"}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax}) {
        const uint64_t before = job.world().CollectivesOn(0) + job.world().CollectivesOn(1);
        RunRanks(size, [&](int rank) {
          std::vector<Tensor> xs;
          for (int t = 0; t < 4; ++t) {
            xs.push_back(MakeTensor("c." + std::to_string(t), dtype, kRows[t], 3, t, rank, size));
            xs.back().request.compression = spec;
            xs.back().request.reduce_op = op;
            if (op == ReduceOp::kSum) {
              xs.back().request.prescale = 0.5;
              xs.back().request.postscale = 4.0;
            }
          }
          // Results are at most 16 in magnitude: fp16 rounds them within 2^-11 relative per step,
          // bf16 within 2^-8; a misplaced block is off by about 1 or more.
          RunGroupAndCheck(job[rank], xs, rank, size, std::string(spec) == "fp16" ? 0.02 : 0.25);
        });
        EXPECT_EQ(job.world().CollectivesOn(0) + job.world().CollectivesOn(1) - before, 1u)
            << spec << " " << DTypeName(dtype);
      }
    }
  }
}

// Refused at enqueue with INVALID_ARGUMENT naming the tensor, on this rank alone, nothing queued:
// top-k (not summable), a cast on an integer dtype, an unknown spec. The same name then runs; a
// cast on a 16-bit floating dtype passes it through.
TEST_P(ReducescatterTest, UnsupportedCompressionIsRefusedAtEnqueue) {
  const int size = GetParam();
  Job job(size);
  RunRanks(size, [&](int rank) {
    struct Refusal {
      const char* spec;
      DType dtype;
      const char* says;
    };
    for (const Refusal& bad :
         {Refusal{"topk:density=0.5", DType::kFloat32, "summable"},
          Refusal{"fp16", DType::kInt32, "int32"}, Refusal{"bf16", DType::kInt8, "int8"},
          Refusal{"zstd", DType::kFloat32, "zstd"}}) {
      Tensor x = MakeTensor("r", bad.dtype, 2 * size, 1, 0, rank, size);
      x.request.compression = bad.spec;
      const Status s = job[rank].Enqueue(EntryOf(x));
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad.spec << ": " << s.ToString();
      EXPECT_NE(s.message().find("'r'"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(bad.says), std::string::npos) << s.message();
    }
    Tensor x = MakeTensor("r", DType::kFloat32, 2 * size, 1, 0, rank, size);
    x.request.compression = "none";  // an explicit none is no compression
    Status s = Await(Submit(job[rank], EntryOf(x)));
    ASSERT_TRUE(s.ok()) << s.ToString();
    CheckTensor(x, 0, rank, size, 0.0);
    // A 16-bit floating tensor travels as it is under a cast (exact: no rounding to another
    // 16-bit format).
    for (DType half : {DType::kFloat16, DType::kBFloat16}) {
      for (const char* spec : {"fp16", "bf16"}) {
        Tensor h = MakeTensor("h", half, 2 * size + 1, 3, 1, rank, size);
        h.request.compression = spec;
        s = Await(Submit(job[rank], EntryOf(h)));
        ASSERT_TRUE(s.ok()) << spec << " " << DTypeName(half) << ": " << s.ToString();
        CheckTensor(h, 1, rank, size, 0.0);
      }
    }
  });
}

// The backend path for small operations: without it they complete inline (core/engine_inline.cc,
// tested in engine_exchange_test.cc), with no backend call to count.
void NoInline(Config& c) {
  c.inline_threshold_bytes = 0;
}

// Small reducescatters of one dtype in one group (sizes 0, 1 and odd, different uneven splits and
// row widths) run as ONE backend reduce-scatter, for every dtype, with the results each would give
// alone: sums (prescaled and postscaled on the floating types), and an average of int32 and
// float32 (each member divided after).
TEST_P(ReducescatterTest, SmallOnesFuseIntoOneBackendCall) {
  const int size = GetParam();
  Job job(size, NoInline);
  const int64_t kRows[] = {0, 1, 7, 2 * size + 3};
  const int64_t kCols[] = {3, 1, 2, 5};
  for (DType dtype : harness::kAllDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      if (op == ReduceOp::kAverage && dtype != DType::kInt32 && dtype != DType::kFloat32) continue;
      const bool scaled = op == ReduceOp::kSum && harness::IsFloat(dtype);
      const uint64_t before = job.world().CollectivesOn(0) + job.world().CollectivesOn(1);
      RunRanks(size, [&](int rank) {
        const uint64_t fused = job[rank].stats().fused_tensors.load();
        std::vector<Tensor> xs;
        for (int t = 0; t < 4; ++t) {
          xs.push_back(MakeTensor("f." + std::string(DTypeName(dtype)) + "." + std::to_string(t),
                                  dtype, kRows[t], kCols[t], t, rank, size));
          xs.back().request.reduce_op = op;
          if (scaled) {
            xs.back().request.prescale = 0.5;
            xs.back().request.postscale = 4.0;
          }
        }
        RunGroupAndCheck(job[rank], xs, rank, size, harness::IsFloat(dtype) ? 1e-6 : 0);
        EXPECT_EQ(job[rank].stats().fused_tensors.load() - fused, xs.size());
      });
      EXPECT_EQ(job.world().CollectivesOn(0) + job.world().CollectivesOn(1) - before, 1u)
          << DTypeName(dtype) << " " << ReduceOpName(op);
    }
  }
}

// What does not fuse: a reducescatter at the direct threshold runs alone (on the caller's
// buffers), one with other scales is another batch, and with fusion off (threshold 0) each runs
// alone; the results are the same.
TEST_P(ReducescatterTest, LargeOnesAndFusionOffRunAlone) {
  const int size = GetParam();
  for (const bool fusion : {true, false}) {
    Job job(size, [fusion](Config& c) {
      NoInline(c);
      c.direct_threshold_bytes = 4096;
      if (!fusion) c.fusion_threshold_bytes = 0;
    });
    const uint64_t before = job.world().CollectivesOn(0) + job.world().CollectivesOn(1);
    RunRanks(size, [&](int rank) {
      std::vector<Tensor> xs;
      xs.push_back(MakeTensor("a", DType::kFloat32, 5, 3, 0, rank, size));
      xs.push_back(MakeTensor("b", DType::kFloat32, 1024, 1, 1, rank, size));  // 4 KiB: alone
      xs.push_back(MakeTensor("c", DType::kFloat32, 9, 2, 2, rank, size));
      xs.push_back(MakeTensor("d", DType::kFloat32, 3, 1, 3, rank, size));
      xs.back().request.prescale = 2.0;  // another batch
      RunGroupAndCheck(job[rank], xs, rank, size, 1e-6);
    });
    EXPECT_EQ(job.world().CollectivesOn(0) + job.world().CollectivesOn(1) - before,
              fusion ? 3u : 4u);
  }
}

// An output inside the input gives the same result: in place (this rank's rows at the start of
// the input buffer) and at its end, on the packed path (small) and alone (at least the direct
// threshold: the backend never sees overlapping buffers), prescaled or not.
TEST_P(ReducescatterTest, OutputMayOverlapTheInput) {
  const int size = GetParam();
  Job job(size, [](Config& c) {
    NoInline(c);
    c.direct_threshold_bytes = 4096;
  });
  for (const int64_t rows : {int64_t{7}, int64_t{3001}}) {  // 12 KiB of float32: alone
    for (const bool at_start : {true, false}) {
      for (const double prescale : {1.0, 0.5}) {
        RunRanks(size, [&](int rank) {
          Tensor x = MakeTensor("overlap", DType::kFloat32, rows, 1, 1, rank, size);
          x.request.prescale = prescale;
          const size_t bytes = static_cast<size_t>(x.request.splits[rank]) * 4;
          unsigned char* out = x.in.data() + (at_start ? 0 : x.in.size() - bytes);
          const Status s = Await(Submit(job[rank], Entry(x.request, x.in.data(), out, bytes)));
          ASSERT_TRUE(s.ok()) << s.ToString();
          if (bytes > 0) std::memcpy(x.out.data(), out, bytes);
          CheckTensor(x, 1, rank, size, 1e-6);
        });
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReducescatterTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace concord
