// Averages divide by the ranks that contributed, on every execution path: with rank 2 of 3
// joined, ranks 0 and 1 run integer and floating averages fused, direct (sliced over the lanes)
// and reduced to a root (fused and alone), in one group.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/engine.h"
#include "tests/common/ranks.h"
#include "tests/unit/engine_test_util.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::RunRanks;
using harness::WaitUntil;

// Rank r's element i: 2 * (i % 5) + r + 1, so ranks 0 and 1 sum to 4 * (i % 5) + 3: an integer
// average over the two contributors truncates to 2 * (i % 5) + 1; over three ranks it would not.
template <typename T>
std::vector<T> Input(int rank, size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(2 * (i % 5) + rank + 1);
  return v;
}

double Average(size_t i, bool integer) {
  return integer ? 2.0 * (i % 5) + 1 : 2.0 * (i % 5) + 1.5;
}

// One operation of the group: its request, this rank's buffers, and what to check afterwards.
struct Op {
  TensorRequest request;
  std::vector<int64_t> in64, out64;  // int64 tensors
  std::vector<int32_t> in32, out32;  // int32 tensors
  std::vector<float> inf, outf;      // float32 tensors
  bool checked = true;               // false: a reduce's non-root (no result)
  std::shared_ptr<RequestState> state;
};

TEST(EngineJoinedAverageTest, EveryPathDividesByTheContributors) {
  // Tensors of 512 KiB and more run alone (direct; 2 MiB: sliced over both lanes); inline results
  // are never used with a joined rank.
  Job job(3);
  std::thread joiner([&job] { EXPECT_TRUE(job[2].Join().ok()); });
  EXPECT_TRUE(WaitUntil([&] { return job.world().Received(0, 2) >= 1; }));
  RunRanks(2, [&](int rank) {
    std::vector<std::unique_ptr<Op>> ops;
    auto add = [&](const std::string& name, OpType type, DType dtype, std::vector<int64_t> shape) {
      auto op = std::make_unique<Op>();
      op->request = Request(name, type, dtype, std::move(shape));
      op->request.reduce_op = ReduceOp::kAverage;
      ops.push_back(std::move(op));
      return ops.back().get();
    };
    add("fused.i32", OpType::kAllreduce, DType::kInt32, {100});
    add("fused.f32", OpType::kAllreduce, DType::kFloat32, {100});
    add("direct.i64", OpType::kAllreduce, DType::kInt64, {int64_t{1} << 16});
    add("direct.f32", OpType::kAllreduce, DType::kFloat32, {int64_t{1} << 19});  // 2 lanes
    add("reduce.fused.i32", OpType::kReduce, DType::kInt32, {64})->request.root = 1;
    add("reduce.alone.i64", OpType::kReduce, DType::kInt64, {int64_t{1} << 16})->request.root = 0;
    // Expectations only: each rank must reach its Join(), which rank 2's waits for.
    EXPECT_TRUE(job[rank].GroupStart().ok());
    for (auto& op : ops) {
      TensorRequest& r = op->request;
      const size_t n = static_cast<size_t>(r.NumElements());
      op->checked = r.op != OpType::kReduce || r.root == rank;
      const void* input = nullptr;
      void* output = nullptr;
      if (r.dtype == DType::kInt64) {
        op->in64 = Input<int64_t>(rank, n);
        op->out64.assign(n, -1);
        input = op->in64.data();
        output = op->out64.data();
      } else if (r.dtype == DType::kInt32) {
        op->in32 = Input<int32_t>(rank, n);
        op->out32.assign(n, -1);
        input = op->in32.data();
        output = op->out32.data();
      } else {
        op->inf = Input<float>(rank, n);
        op->outf.assign(n, -1.0f);
        input = op->inf.data();
        output = op->outf.data();
      }
      op->state = Submit(job[rank], Entry(r, input, output));
    }
    EXPECT_TRUE(job[rank].GroupEnd().ok());
    for (auto& op : ops) {
      const Status s = Await(op->state);
      EXPECT_TRUE(s.ok()) << op->request.name << ": " << s.ToString();
      if (!s.ok() || !op->checked) continue;
      const bool integer = op->request.dtype != DType::kFloat32;
      const size_t n = op->out64.size() + op->out32.size() + op->outf.size();
      for (size_t k = 0; k < n; ++k) {
        const double got = !op->out64.empty()   ? static_cast<double>(op->out64[k])
                           : !op->out32.empty() ? static_cast<double>(op->out32[k])
                                                : static_cast<double>(op->outf[k]);
        if (got != Average(k, integer)) {
          ADD_FAILURE() << "rank " << rank << " " << op->request.name << " element " << k
                        << ": got " << got << ", want " << Average(k, integer);
          break;
        }
      }
    }
    EXPECT_TRUE(job[rank].Join().ok());
  });
  joiner.join();
}

}  // namespace
}  // namespace concord
