// The engine with ranks as threads: real Engines over the in-process control plane and backend.
#include "core/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/sanitizers.h"
#include "tests/common/tensors.h"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/inproc_transport.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::kAllDTypes;
using harness::LoadElement;
using harness::RunRanks;
using harness::StoreElement;
using harness::WaitUntil;
using std::chrono::milliseconds;

// Input values depend on i only through i % kPeriod, so expected results are computed per period.
constexpr size_t kPeriod = 7 * 11 * 2;

// Rank `rank`'s input element i for `op`: small integers whose sums, products, minima and maxima
// are exact in every dtype (non-negative for uint8; negative ones check truncation toward zero).
double InputValue(ReduceOp op, DType dtype, int rank, size_t i) {
  const bool is_unsigned = dtype == DType::kUint8;
  switch (op) {
    case ReduceOp::kProduct:
      return 1.0 + static_cast<double>((i + rank) % 2);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<double>((i * 7 + rank * 3) % 11) - (is_unsigned ? 0.0 : 5.0);
    default:
      return static_cast<double>(i % 7 + rank) - (is_unsigned ? 0.0 : 3.0);
  }
}

// The expected result element i (i < kPeriod) over `size` ranks, with the scale factors applied
// as the engine does.
double Expected(ReduceOp op, DType dtype, int size, size_t i, double prescale, double postscale) {
  return harness::ExpectedAllreduce(
      op, dtype, size, [&](int rank) { return InputValue(op, dtype, rank, i); }, prescale,
      postscale);
}

// Allowed absolute error for a result of magnitude `expected` in `dtype`.
double Tolerance(DType dtype, double expected) {
  const double scale = std::max(1.0, std::fabs(expected));
  if (IsHalfPrecision(dtype)) return 1e-2 * scale;
  if (dtype == DType::kFloat32) return 1e-6 * scale;
  if (dtype == DType::kFloat64) return 1e-12 * scale;
  return 0.0;
}

// How small allreduces travel: reduced inline by the coordinator (the default threshold), all
// through the backend (threshold 0), or mixed (only rank 0 sends inline data, so the coordinator
// must fall back to the backend).
enum class InlineMode { kDefault, kOff, kMixed };

const char* InlineModeName(InlineMode m) {
  switch (m) {
    case InlineMode::kDefault:
      return "inline";
    case InlineMode::kOff:
      return "noinline";
    case InlineMode::kMixed:
      return "mixedinline";
  }
  return "?";
}

class EngineAllreduceTest : public ::testing::TestWithParam<std::tuple<int, DType, InlineMode>> {};

// Every reduce op x sizes {0, 1, 7, 4099, 1<<20}, in place and out of place (out of place with
// prescale 0.5 and postscale 4 on floating types), all of one op enqueued together.
TEST_P(EngineAllreduceTest, EveryOpAndSize) {
  // Plain variables, not a structured binding: clang 14 (the tsan pass) cannot capture those.
  const int size = std::get<0>(GetParam());
  const DType dtype = std::get<1>(GetParam());
  const auto mode = std::get<2>(GetParam());
  const std::vector<size_t> counts = {0, 1, 7, 4099, size_t{1} << 20};
  const size_t elem = DTypeSize(dtype);
  Job job(size, [mode = mode](Config& c) {
    if (mode == InlineMode::kOff || (mode == InlineMode::kMixed && c.rank != 0)) {
      c.inline_threshold_bytes = 0;
    } else if (mode == InlineMode::kMixed) {
      c.inline_threshold_bytes = Config::kMaxInlineBytes;
    }
  });
  for (int op_index = 0; op_index < kNumReduceOps; ++op_index) {
    const auto op = static_cast<ReduceOp>(op_index);
    RunRanks(size, [&](int rank) {
      struct Case {
        std::vector<uint8_t> in, out;
        double pre, post;
        std::shared_ptr<RequestState> state;
      };
      std::vector<Case> cases;
      for (size_t n : counts) {
        for (bool in_place : {true, false}) {
          Case c;
          const bool scaled = !in_place && IsFloatingPoint(dtype);
          c.pre = scaled ? 0.5 : 1.0;
          c.post = scaled ? 4.0 : 1.0;
          c.in.resize(n * elem);
          for (size_t i = 0; i < n; ++i)
            StoreElement(dtype, c.in.data(), i, InputValue(op, dtype, rank, i));
          if (!in_place) c.out.assign(n * elem, 0xAB);
          cases.push_back(std::move(c));
        }
      }
      size_t k = 0;
      for (size_t n : counts) {
        for (bool in_place : {true, false}) {
          Case& c = cases[k++];
          TensorRequest r = Request("t." + std::to_string(n) + (in_place ? ".in" : ".out"),
                                    OpType::kAllreduce, dtype, {static_cast<int64_t>(n)});
          r.reduce_op = op;
          r.prescale = c.pre;
          r.postscale = c.post;
          c.state = Submit(job[rank], Entry(r, c.in.data(), in_place ? c.in.data() : c.out.data()));
        }
      }
      k = 0;
      for (size_t n : counts) {
        for (bool in_place : {true, false}) {
          Case& c = cases[k++];
          Status s = Await(c.state);
          ASSERT_TRUE(s.ok()) << s.ToString();
          std::vector<double> expected(kPeriod);
          for (size_t i = 0; i < kPeriod; ++i) {
            expected[i] = Expected(op, dtype, size, i, c.pre, c.post);
          }
          const uint8_t* got = in_place ? c.in.data() : c.out.data();
          size_t wrong = 0;
          for (size_t i = 0; i < n && wrong < 3; ++i) {
            const double want = expected[i % kPeriod];
            const double have = LoadElement(dtype, got, i);
            if (std::fabs(have - want) > Tolerance(dtype, want)) {
              ++wrong;
              ADD_FAILURE() << "rank " << rank << " " << ReduceOpName(op) << " n=" << n
                            << (in_place ? " in place" : " out of place") << " element " << i
                            << ": got " << have << ", want " << want;
            }
          }
        }
      }
    });
  }
  // The small sizes took the inline path exactly when every rank offered their data.
  for (int rank = 0; rank < size; ++rank) {
    const uint64_t inlined = job[rank].stats().inline_reductions.load();
    if (size > 1 && mode == InlineMode::kDefault) {
      EXPECT_GT(inlined, 0u) << "rank " << rank;
    } else {
      EXPECT_EQ(inlined, 0u) << "rank " << rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndDTypes, EngineAllreduceTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::ValuesIn(kAllDTypes),
                       ::testing::Values(InlineMode::kDefault, InlineMode::kOff,
                                         InlineMode::kMixed)),
    [](const ::testing::TestParamInfo<std::tuple<int, DType, InlineMode>>& info) {
      return std::to_string(std::get<0>(info.param)) + "ranks_" +
             DTypeName(std::get<1>(info.param)) + "_" + InlineModeName(std::get<2>(info.param));
    });

class EngineRanksTest : public ::testing::TestWithParam<int> {};

// Rank r contributes (r + 2) % 3 rows of 3 int32 values r * 100 + j.
int64_t FirstDim(int rank) {
  return (rank + 2) % 3;
}

TEST_P(EngineRanksTest, AllgatherWithDifferentFirstDims) {
  const int size = GetParam();
  Job job(size);
  std::vector<int32_t> want;
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    for (int64_t j = 0; j < FirstDim(r) * 3; ++j) want.push_back(static_cast<int32_t>(r * 100 + j));
    rows += FirstDim(r);
  }
  const size_t total = want.size() * sizeof(int32_t);
  RunRanks(size, [&](int rank) {
    std::vector<int32_t> in(FirstDim(rank) * 3);
    for (size_t j = 0; j < in.size(); ++j) in[j] = static_cast<int32_t>(rank * 100 + j);
    const TensorRequest base = Request("", OpType::kAllgather, DType::kInt32, {FirstDim(rank), 3});
    // Caller's buffer, exactly large enough.
    std::vector<int32_t> out(want.size() + 1, -1);
    TensorRequest r = base;
    r.name = "ag.caller";
    auto caller = Submit(job[rank], Entry(r, in.data(), out.data(), total));
    // Library-owned output.
    r.name = "ag.owned";
    auto owned = Submit(job[rank], Entry(r, in.data(), nullptr));
    // Rank 1's buffer is one byte short: only rank 1 fails.
    std::vector<int32_t> small(want.size() + 1, -1);
    r.name = "ag.small";
    auto short_one =
        Submit(job[rank], Entry(r, in.data(), small.data(), rank == 1 ? total - 1 : total));

    Status s = Await(caller);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::vector<int32_t>(out.begin(), out.end() - 1), want);
    EXPECT_EQ(out.back(), -1);
    EXPECT_EQ(caller->output().data, out.data());
    EXPECT_EQ(caller->output().bytes, total);
    EXPECT_EQ(caller->output().first_dim, rows);

    s = Await(owned);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const auto& o = owned->output();
    EXPECT_EQ(o.bytes, total);
    EXPECT_EQ(o.first_dim, rows);
    ASSERT_EQ(o.owned.size(), total);
    EXPECT_EQ(o.data, o.owned.data());
    std::vector<int32_t> got(want.size());
    std::memcpy(got.data(), o.data, total);
    EXPECT_EQ(got, want);

    s = Await(short_one);
    if (rank == 1) {
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find("ag.small"), std::string::npos) << s.message();
      EXPECT_EQ(short_one->output().data, nullptr);
      EXPECT_EQ(small, std::vector<int32_t>(want.size() + 1, -1));  // untouched
    } else {
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(std::vector<int32_t>(small.begin(), small.end() - 1), want);
    }
  });
  EXPECT_TRUE(job[0].failure().ok());
}

TEST_P(EngineRanksTest, BroadcastFromEveryRoot) {
  const int size = GetParam();
  Job job(size);
  constexpr int kCount = 1000;
  RunRanks(size, [&](int rank) {
    for (int root = 0; root < size; ++root) {
      std::vector<int64_t> in(kCount), out(kCount, -1), inplace(kCount, -1);
      if (rank == root) {
        for (int i = 0; i < kCount; ++i) in[i] = inplace[i] = root * 100000 + i;
      }
      TensorRequest r =
          Request("bcast." + std::to_string(root), OpType::kBroadcast, DType::kInt64, {kCount});
      r.root = root;
      auto a = Submit(job[rank], Entry(r, in.data(), out.data()));
      r.name += ".inplace";
      auto b = Submit(job[rank], Entry(r, inplace.data(), inplace.data()));
      Status s = Await(a);
      ASSERT_TRUE(s.ok()) << s.ToString();
      s = Await(b);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int i = 0; i < kCount; ++i) {
        ASSERT_EQ(out[i], root * 100000 + i) << "root " << root << " rank " << rank;
        ASSERT_EQ(inplace[i], root * 100000 + i) << "root " << root << " rank " << rank;
      }
    }
  });
}

TEST_P(EngineRanksTest, Barriers) {
  const int size = GetParam();
  Job job(size);
  RunRanks(size, [&](int rank) {
    for (int i = 0; i < 3; ++i) {
      TensorRequest r = Request(job[rank].NextBarrierName(), OpType::kBarrier, DType::kUint8, {});
      EXPECT_EQ(r.name, "__concord.barrier." + std::to_string(i));
      Status s = Await(Submit(job[rank], Entry(r, nullptr, nullptr)));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  });
}

TEST_P(EngineRanksTest, GroupIsFusedIntoOneBatch) {
  const int size = GetParam();
  // Small tensors would be reduced inline by the coordinator; this is about the backend path.
  Job job(size, [](Config& c) { c.inline_threshold_bytes = 0; });
  RunRanks(size, [&](int rank) {
    Engine& e = job[rank];
    EXPECT_EQ(e.GroupEnd().code(), Code::kInvalidArgument);
    const uint64_t batches = e.stats().batches.load();
    const uint64_t fused = e.stats().fused_tensors.load();
    std::vector<std::vector<float>> data;
    for (int k = 0; k < 3; ++k) data.emplace_back(5 + k, static_cast<float>(rank + k));
    ASSERT_TRUE(e.GroupStart().ok());
    EXPECT_EQ(e.GroupStart().code(), Code::kInvalidArgument);  // groups do not nest
    std::vector<std::shared_ptr<RequestState>> states;
    for (int k = 0; k < 3; ++k) {
      TensorRequest r = Request("grp." + std::to_string(k), OpType::kAllreduce, DType::kFloat32,
                                {static_cast<int64_t>(data[k].size())});
      states.push_back(Submit(e, Entry(r, data[k].data(), data[k].data())));
    }
    // A repeated name within the group is refused; the group goes on without it.
    TensorRequest dup = Request("grp.0", OpType::kAllreduce, DType::kFloat32, {5});
    EXPECT_EQ(e.Enqueue(Entry(dup, data[0].data(), data[0].data())).code(), Code::kInvalidArgument);
    ASSERT_TRUE(e.GroupEnd().ok());
    for (int k = 0; k < 3; ++k) {
      Status s = Await(states[k]);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const float want = static_cast<float>(size * (size - 1) / 2 + size * k);
      for (float v : data[k]) EXPECT_EQ(v, want);
    }
    EXPECT_EQ(e.stats().batches.load() - batches, 1u);
    EXPECT_EQ(e.stats().fused_tensors.load() - fused, 3u);
  });
}

// Groups are per thread: two threads of every rank hold groups open at the same time (each
// waits, inside its group, until the other has opened its own), and each group_end submits its
// own members only. Before, the second thread's GroupStart was refused ("another thread has a
// group open on this communicator"). A third thread's ungrouped allreduce is not held by them.
TEST_P(EngineRanksTest, ThreadsHoldTheirOwnGroupsAtOnce) {
  const int size = GetParam();
  Job job(size);
  RunRanks(size, [&](int rank) {
    Engine& e = job[rank];
    std::atomic<int> opened{0};
    std::vector<std::vector<float>> data(5, std::vector<float>(7, static_cast<float>(rank)));
    std::vector<std::shared_ptr<RequestState>> states(5);
    auto submit = [&](int k) {
      TensorRequest r =
          Request("thread_group." + std::to_string(k), OpType::kAllreduce, DType::kFloat32, {7});
      states[k] = Submit(e, Entry(r, data[k].data(), data[k].data()));
    };
    auto grouped = [&](int first) {
      const Status started = e.GroupStart();
      opened.fetch_add(1);  // also when refused: the other thread must not wait for ever
      ASSERT_TRUE(started.ok()) << started.ToString();
      while (opened.load() < 2) std::this_thread::yield();
      submit(first);
      submit(first + 1);
      // The other thread's group is open too, and this one is not closed by it.
      EXPECT_EQ(e.GroupStart().code(), Code::kInvalidArgument);  // groups do not nest
      ASSERT_TRUE(e.GroupEnd().ok());
      EXPECT_EQ(e.GroupEnd().code(), Code::kInvalidArgument);
    };
    std::thread a(grouped, 0);
    std::thread b(grouped, 2);
    std::thread c([&] {
      while (opened.load() < 2) std::this_thread::yield();
      submit(4);
      EXPECT_TRUE(Await(states[4]).ok());  // not held by the open groups
    });
    a.join();
    b.join();
    c.join();
    for (int k = 0; k < 5; ++k) {
      ASSERT_NE(states[k], nullptr);
      Status s = Await(states[k]);
      ASSERT_TRUE(s.ok()) << "tensor " << k << ": " << s.ToString();
      for (float v : data[k]) EXPECT_EQ(v, static_cast<float>(size * (size - 1) / 2));
    }
  });
}

// What a completion callback enqueues is not held by a group that the thread running the callback
// has open. A thread that waits runs the engine's steps, so it runs the callbacks of whatever
// completes meanwhile: rank 0's thread opens a group, then waits for 'cb.first' (enqueued by
// another thread), whose callback enqueues 'cb.then'. Before, 'cb.then' was held in that thread's
// group until its group_end, while rank 1 ran it at once.
TEST(EngineGroupTest, ACallbackEnqueuesOutsideTheGroupOfTheThreadRunningIt) {
  Job job(2);
  RunRanks(2, [&](int rank) {
    Engine& e = job[rank];
    std::vector<float> first(3, 1.0f), then(3, 1.0f), member(3, 1.0f);
    std::shared_ptr<RequestState> then_state;
    std::thread::id callback_thread;
    QueueEntry first_entry = Entry(Request("cb.first", OpType::kAllreduce, DType::kFloat32, {3}),
                                   first.data(), first.data());
    first_entry.state = std::make_shared<RequestState>([&](const Status& s) {
      callback_thread = std::this_thread::get_id();
      if (!s.ok()) return;
      then_state = Submit(e, Entry(Request("cb.then", OpType::kAllreduce, DType::kFloat32, {3}),
                                   then.data(), then.data()));
    });
    std::shared_ptr<RequestState> first_state = first_entry.state;
    ASSERT_TRUE(e.GroupStart().ok());
    std::shared_ptr<RequestState> member_state =
        Submit(e, Entry(Request("cb.member", OpType::kAllreduce, DType::kFloat32, {3}),
                        member.data(), member.data()));
    if (rank == 1) std::this_thread::sleep_for(milliseconds(200));  // rank 0 is waiting by then
    std::thread([&] { Submit(e, std::move(first_entry)); }).join();
    // The callback runs before Wait() returns; on rank 0 on this thread, which ran the steps.
    ASSERT_TRUE(e.Wait(*first_state, Deadline::After(milliseconds(20000))));
    ASSERT_TRUE(first_state->status().ok()) << first_state->status().ToString();
    if (rank == 0) {
      ASSERT_EQ(callback_thread, std::this_thread::get_id())
          << "the callback ran on another thread: this test no longer shows the case";
    }
    ASSERT_NE(then_state, nullptr);
    EXPECT_TRUE(e.Wait(*then_state, Deadline::After(milliseconds(5000))))
        << "'cb.then' was held by this thread's group";
    ASSERT_TRUE(e.GroupEnd().ok());
    EXPECT_TRUE(Await(member_state).ok());
    EXPECT_TRUE(Await(then_state).ok()) << then_state->status().ToString();
    EXPECT_EQ(then[0], 2.0f);
  });
}

// Small reduces to different roots fuse into one batch (one allreduce of the fusion buffer), and
// a large one runs alone (Backend::Reduce): only each root's output is written.
TEST_P(EngineRanksTest, ReducesToDifferentRootsFuseAndOnlyRootsGetResults) {
  const int size = GetParam();
  Job job(size, [](Config& c) { c.inline_threshold_bytes = 0; });
  RunRanks(size, [&](int rank) {
    Engine& e = job[rank];
    const uint64_t batches = e.stats().batches.load();
    const uint64_t fused = e.stats().fused_tensors.load();
    const std::vector<int64_t> counts = {5, 6, 7, int64_t{1} << 18};
    std::vector<std::vector<float>> in, out;
    for (size_t k = 0; k < counts.size(); ++k) {
      in.emplace_back(counts[k], static_cast<float>(rank + k));
      out.emplace_back(counts[k], -1.0f);
    }
    ASSERT_TRUE(e.GroupStart().ok());
    std::vector<std::shared_ptr<RequestState>> states;
    for (size_t k = 0; k < counts.size(); ++k) {
      TensorRequest r =
          Request("rd." + std::to_string(k), OpType::kReduce, DType::kFloat32, {counts[k]});
      r.root = static_cast<int>(k) % size;
      states.push_back(Submit(e, Entry(r, in[k].data(), out[k].data())));
    }
    ASSERT_TRUE(e.GroupEnd().ok());
    for (size_t k = 0; k < counts.size(); ++k) {
      Status s = Await(states[k]);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const bool root = static_cast<int>(k) % size == rank;
      const float want = root ? static_cast<float>(size * (size - 1) / 2 + size * k) : -1.0f;
      for (float v : out[k]) ASSERT_EQ(v, want) << "tensor " << k << " rank " << rank;
      for (float v : in[k]) ASSERT_EQ(v, static_cast<float>(rank + k));
    }
    EXPECT_EQ(e.stats().batches.load() - batches, 2u);
    EXPECT_EQ(e.stats().fused_tensors.load() - fused, 3u);
  });
}

// The direct allreduces of one list run as one group cut into shares over every lane, and each
// result is still right. The test backend runs a share's buffers one by one (the default
// Backend::AllreduceSpans), so each piece counts as one collective.
TEST(EngineLanesTest, OneListRunsOnEveryLane) {
  constexpr int kLanes = 3, kTensors = 7;
  constexpr size_t kCount = 200000;  // 800 KB each: above the direct threshold, never fused
  Job job(2, [](Config& c) { c.lanes = kLanes; });
  RunRanks(2, [&](int rank) {
    Engine& e = job[rank];
    std::vector<std::vector<float>> data;
    for (int k = 0; k < kTensors; ++k) data.emplace_back(kCount, static_cast<float>(rank + k));
    ASSERT_TRUE(e.GroupStart().ok());
    std::vector<std::shared_ptr<RequestState>> states;
    for (int k = 0; k < kTensors; ++k) {
      TensorRequest r = Request("lane." + std::to_string(k), OpType::kAllreduce, DType::kFloat32,
                                {static_cast<int64_t>(kCount)});
      states.push_back(Submit(e, Entry(r, data[k].data(), data[k].data())));
    }
    ASSERT_TRUE(e.GroupEnd().ok());
    for (int k = 0; k < kTensors; ++k) {
      Status s = Await(states[k]);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(data[k].front(), static_cast<float>(1 + 2 * k));
      EXPECT_EQ(data[k].back(), static_cast<float>(1 + 2 * k));
    }
  });
  // 5.6 MB in three shares of 466,666-466,667 elements: the cuts fall inside tensors 2 and 4, so
  // each lane runs three pieces.
  for (int lane = 0; lane < kLanes; ++lane) {
    EXPECT_EQ(job.world().CollectivesOn(lane), 3u) << "lane " << lane;
  }
}

// Direct allreduces of different dtypes and reductions in one list form one group each; sizes
// 0, 1, odd and large, out of place with prescale, postscale and an average, at 3 ranks, all come
// out right.
TEST(EngineLanesTest, DirectAllreducesGroupByDTypeAndReduction) {
  struct Case {
    DType dtype;
    ReduceOp op;
    double prescale, postscale;
  };
  const Case cases[] = {{DType::kFloat32, ReduceOp::kSum, 1, 1},
                        {DType::kFloat32, ReduceOp::kAverage, 2, 3},
                        {DType::kInt32, ReduceOp::kMax, 1, 1},
                        {DType::kFloat16, ReduceOp::kSum, 1, 1},
                        {DType::kFloat64, ReduceOp::kMin, 1, 1}};
  const size_t counts[] = {0, 1, 3, 1001, 600000};
  constexpr int kRanks = 3;
  // No fusion and no inline reduction: every allreduce is direct.
  Job job(kRanks, [](Config& c) {
    c.lanes = 2;
    c.fusion_threshold_bytes = 0;
    c.inline_threshold_bytes = 0;
  });
  RunRanks(kRanks, [&](int rank) {
    Engine& e = job[rank];
    std::vector<std::vector<unsigned char>> in, out;
    std::vector<std::shared_ptr<RequestState>> states;
    ASSERT_TRUE(e.GroupStart().ok());
    for (size_t c = 0; c < std::size(cases); ++c) {
      for (size_t count : counts) {
        const Case& k = cases[c];
        in.emplace_back(count * DTypeSize(k.dtype) + 1);
        out.emplace_back(count * DTypeSize(k.dtype) + 1, 0xee);
        for (size_t i = 0; i < count; ++i) {
          StoreElement(k.dtype, in.back().data(), i, static_cast<double>((i + rank) % 5));
        }
        TensorRequest r = Request("group." + std::to_string(c) + "." + std::to_string(count),
                                  OpType::kAllreduce, k.dtype, {static_cast<int64_t>(count)});
        r.reduce_op = k.op;
        r.prescale = k.prescale;
        r.postscale = k.postscale;
        states.push_back(Submit(e, Entry(r, in.back().data(), out.back().data())));
      }
    }
    ASSERT_TRUE(e.GroupEnd().ok());
    size_t t = 0;
    for (const Case& k : cases) {
      for (size_t count : counts) {
        Status s = Await(states[t]);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (size_t i = 0; i < count; ++i) {
          const double want = harness::ExpectedAllreduce(
              k.op, k.dtype, kRanks, [&](int r) { return static_cast<double>((i + r) % 5); },
              k.prescale, k.postscale);
          ASSERT_NEAR(LoadElement(k.dtype, out[t].data(), i), want, 1e-5)
              << DTypeName(k.dtype) << " " << ReduceOpName(k.op) << " count " << count
              << " element " << i << " rank " << rank;
        }
        EXPECT_EQ(out[t].back(), 0xee) << "wrote past the output";
        ++t;
      }
    }
  });
}

// A large allreduce alone is cut into one share per lane; out of place with scaling and an
// average, every share gets the same treatment.
TEST(EngineLanesTest, LargeAllreduceIsSlicedOverTheLanes) {
  constexpr int kLanes = 3;
  constexpr size_t kCount = 1000003;  // 4 MB of float32: three slices of at least 1 MiB
  Job job(2, [](Config& c) { c.lanes = kLanes; });
  RunRanks(2, [&](int rank) {
    std::vector<float> in(kCount), out(kCount, -1.f);
    for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>(i % 1000 + rank);
    TensorRequest r =
        Request("sliced", OpType::kAllreduce, DType::kFloat32, {static_cast<int64_t>(kCount)});
    r.reduce_op = ReduceOp::kAverage;
    r.prescale = 2.0;
    r.postscale = 3.0;
    Status s = Await(Submit(job[rank], Entry(r, in.data(), out.data())));
    ASSERT_TRUE(s.ok()) << s.ToString();
    size_t wrong = 0;
    for (size_t i = 0; i < kCount && wrong < 3; ++i) {
      // (2a + 2(a + 1)) / 2 * 3 with a = i % 1000.
      const float want = static_cast<float>(3 * (2 * (i % 1000) + 1));
      if (out[i] != want) {
        ++wrong;
        ADD_FAILURE() << "rank " << rank << " element " << i << ": " << out[i] << " != " << want;
      }
      if (in[i] != static_cast<float>(i % 1000 + rank)) ++wrong;
    }
    EXPECT_EQ(wrong, 0u);
  });
  for (int lane = 0; lane < kLanes; ++lane) {
    EXPECT_EQ(job.world().CollectivesOn(lane), 1u) << "lane " << lane;
  }
}

// Rank 2 finalizes while ranks 0 and 1 still submit "x", one after the other, so that each
// submission fails without it in a response of its own: rank 2's finalize names "x" once.
TEST(EngineFinalizeTest, TheLeftBehindErrorNamesEachTensorOnce) {
  std::vector<float> data(4, 1.0f);
  Job job(3);
  job.ExpectUnevenEnd();
  Status finalized;
  std::thread leaver([&] { finalized = job[2].Shutdown(); });
  for (int rank : {0, 1}) {
    auto x = Submit(job[rank], Entry(Request("x", OpType::kAllreduce, DType::kFloat32, {4}),
                                     data.data(), data.data()));
    const Status s = Await(x, milliseconds(10000));
    EXPECT_EQ(s.code(), Code::kPeerFailure) << "rank " << rank << ": " << s.ToString();
  }
  RunRanks(2, [&](int rank) { (void)job[rank].Shutdown(); });
  leaver.join();
  EXPECT_EQ(finalized.code(), Code::kMismatch) << finalized.ToString();
  const std::string& m = finalized.message();
  const size_t first = m.find("'x'");
  EXPECT_NE(first, std::string::npos) << m;
  EXPECT_EQ(m.find("'x'", first + 1), std::string::npos) << m;
  EXPECT_NE(m.find("ranks 0, 1 still submitted tensors"), std::string::npos) << m;
}

TEST(EngineGroupTest, RefusedGroupCompletesItsMembers) {
  std::vector<float> data(4, 1.0f);  // outlives the job: "held" is in flight until shutdown
  Job job(2);
  job.ExpectUnevenEnd();
  // Only rank 0 submits "held", so it stays in flight.
  auto held = Submit(job[0], Entry(Request("held", OpType::kAllreduce, DType::kFloat32, {4}),
                                   data.data(), data.data()));
  ASSERT_TRUE(job[0].GroupStart().ok());
  auto other = Submit(job[0], Entry(Request("other", OpType::kAllreduce, DType::kFloat32, {4}),
                                    data.data(), data.data()));
  auto again = Submit(job[0], Entry(Request("held", OpType::kAllreduce, DType::kFloat32, {4}),
                                    data.data(), data.data()));
  Status s = job[0].GroupEnd();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_EQ(Await(other, milliseconds(1000)).code(), Code::kInvalidArgument);
  EXPECT_EQ(Await(again, milliseconds(1000)).code(), Code::kInvalidArgument);
  EXPECT_FALSE(held->done());
}

TEST_P(EngineRanksTest, ManyTensorsFromSeveralThreadsInDifferentOrders) {
  const int size = GetParam();
  constexpr int kTensors = 60, kThreads = 3;
  Job job(size);
  RunRanks(size, [&](int rank) {
    std::vector<std::vector<int32_t>> data(kTensors);
    std::vector<std::shared_ptr<RequestState>> states(kTensors);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<int> mine;
        for (int k = t; k < kTensors; k += kThreads) mine.push_back(k);
        std::shuffle(mine.begin(), mine.end(), std::mt19937(rank * 100 + t));
        for (int k : mine) {
          data[k].assign((k * 13) % 200, rank + k);
          TensorRequest r = Request("many." + std::to_string(k), OpType::kAllreduce, DType::kInt32,
                                    {static_cast<int64_t>(data[k].size())});
          states[k] = Submit(job[rank], Entry(r, data[k].data(), data[k].data()));
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int k = 0; k < kTensors; ++k) {
      Status s = Await(states[k]);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int32_t v : data[k]) ASSERT_EQ(v, size * (size - 1) / 2 + size * k);
    }
  });
}

TEST_P(EngineRanksTest, RepeatedStepsHitTheResponseCache) {
  const int size = GetParam();
  constexpr int kTensors = 10;
  Job job(size);
  for (int step = 0; step < 3; ++step) {
    RunRanks(size, [&](int rank) {
      const uint64_t cached = job[rank].stats().responses_cached.load();
      std::vector<std::vector<double>> data(kTensors);
      std::vector<std::shared_ptr<RequestState>> states;
      for (int k = 0; k < kTensors; ++k) {
        data[k].assign(k + 1, 1.0 + step);
        TensorRequest r =
            Request("step." + std::to_string(k), OpType::kAllreduce, DType::kFloat64, {k + 1});
        states.push_back(Submit(job[rank], Entry(r, data[k].data(), data[k].data())));
      }
      for (int k = 0; k < kTensors; ++k) {
        Status s = Await(states[k]);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (double v : data[k]) EXPECT_EQ(v, size * (1.0 + step));
      }
      const uint64_t now = job[rank].stats().responses_cached.load();
      EXPECT_EQ(now - cached, step == 0 ? 0u : uint64_t{kTensors}) << "step " << step;
    });
  }
}

// One mismatch: rank 1 submits `differ`'s version of tensor "bad"; the error names `field`.
struct EngineMismatch {
  std::string label;
  std::function<void(TensorRequest&)> differ;
  std::string field;
};

class EngineMismatchTest : public ::testing::TestWithParam<std::tuple<int, EngineMismatch>> {};

TEST_P(EngineMismatchTest, EveryRankFailsAndTheEngineGoesOn) {
  // Plain variables, not a structured binding: clang 14 (the tsan pass) cannot capture those.
  const int size = std::get<0>(GetParam());
  const EngineMismatch& c = std::get<1>(GetParam());
  Job job(size);
  RunRanks(size, [&](int rank) {
    // Large enough for every variant (rank 1 reads 8 float64 in the "dtype" case).
    std::vector<float> data(64, 1.0f), out(64, 0.0f);
    TensorRequest r = Request("bad", OpType::kAllreduce, DType::kFloat32, {8});
    if (rank == 1) c.differ(r);
    Status s = Await(Submit(job[rank], Entry(r, data.data(), out.data(), out.size() * 4)));
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_NE(s.message().find("'bad'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("on rank 1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(size == 2 ? "on rank 0" : "on ranks 0, 2"), std::string::npos)
        << s.message();
    // The same name and others work afterwards.
    for (const char* name : {"bad", "good"}) {
      TensorRequest ok = Request(name, OpType::kAllreduce, DType::kFloat32, {8});
      std::vector<float> d(8, 1.0f);
      s = Await(Submit(job[rank], Entry(ok, d.data(), d.data())));
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(d[7], static_cast<float>(size));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Fields, EngineMismatchTest,
    ::testing::Combine(
        ::testing::Values(2, 3, 4),
        ::testing::Values(
            EngineMismatch{"dtype", [](TensorRequest& r) { r.dtype = DType::kFloat64; }, "dtype"},
            EngineMismatch{"shape",
                           [](TensorRequest& r) {
                             r.shape = {2, 4};
                           },
                           "shape"},
            EngineMismatch{"op", [](TensorRequest& r) { r.op = OpType::kAllgather; },
                           "operation"})),
    [](const ::testing::TestParamInfo<std::tuple<int, EngineMismatch>>& info) {
      return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param).label;
    });

TEST_P(EngineRanksTest, ShutdownCompletesPendingWithNotInitialized) {
  const int size = GetParam();
  // Shutdown() first waits (at most the timeout) for a finalizing barrier the others never join.
  Job job(
      size, [](Config& c) { c.timeout_s = 0.3; }, milliseconds(300));
  std::vector<float> data(4, 1.0f);
  // Only the last rank submits: the request can never run.
  Engine& last = job[size - 1];
  const uint64_t sent = job.world().Received(0, size - 1);
  auto state = size == 1
                   ? nullptr
                   : Submit(last, Entry(Request("lonely", OpType::kAllreduce, DType::kFloat32, {4}),
                                        data.data(), data.data()));
  // Shut down once the request is pending at the coordinator, not only queued here.
  if (state) {
    ASSERT_TRUE(WaitUntil([&] { return job.world().Received(0, size - 1) > sent; }));
  }
  // Alone, the finalize barrier cannot complete: Shutdown() says so (and still shuts down).
  Status down = last.Shutdown();
  if (size == 1) {
    EXPECT_TRUE(down.ok()) << down.ToString();
  } else {
    EXPECT_EQ(down.code(), Code::kTimeout) << down.ToString();
    EXPECT_NE(down.message().find("the finalize barrier did not complete"), std::string::npos)
        << down.ToString();
  }
  EXPECT_TRUE(last.stopped());
  EXPECT_TRUE(last.Shutdown().ok());  // a second call has nothing left to report
  if (state) {
    ASSERT_TRUE(state->done());
    EXPECT_EQ(state->status().code(), Code::kNotInitialized);
  }
  Status s = last.Enqueue(
      Entry(Request("later", OpType::kAllreduce, DType::kFloat32, {4}), data.data(), data.data()));
  EXPECT_EQ(s.code(), Code::kNotInitialized) << s.ToString();
  // The others' finalize barrier cannot complete without the rank that left either.
  harness::RunRanks(size - 1, [&](int rank) {
    Status other = job[rank].Shutdown();
    EXPECT_FALSE(other.ok()) << "rank " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EngineRanksTest, ::testing::Values(1, 2, 3, 4));

// Results too large for this host's memory (owned allgather results of 2^49 bytes, on both
// lanes: the stepping thread's and a worker's) fail the job with an error naming the tensor,
// instead of std::bad_alloc escaping the engine's threads (std::terminate).
TEST(EngineMemoryTest, AResultTooLargeForMemoryFailsWithAnErrorNotACrash) {
  if (harness::kSanitized) GTEST_SKIP() << harness::kSanitizedWhy;
  // The failure waits at most the timeout and a second for a culprit to be named.
  Job job(2, [](Config& c) { c.timeout_s = 0.5; });
  RunRanks(2, [&](int rank) {
    // Never read: the result's memory is taken before the collective.
    const uint8_t input = 0;
    std::vector<std::shared_ptr<RequestState>> states;
    ASSERT_TRUE(job[rank].GroupStart().ok());
    for (const char* name : {"huge.a", "huge.b"}) {
      states.push_back(Submit(
          job[rank], Entry(Request(name, OpType::kAllgather, DType::kUint8, {int64_t{1} << 48}),
                           &input, nullptr)));
    }
    ASSERT_TRUE(job[rank].GroupEnd().ok());
    for (const auto& state : states) {
      const Status s = Await(state);
      EXPECT_NE(s.code(), Code::kOk);
      EXPECT_NE(s.code(), Code::kTimeout) << s.ToString();
      EXPECT_NE(s.message().find("out of memory running the allgather of tensor 'huge."),
                std::string::npos)
          << s.ToString();
    }
    // The list completes its entries first, then the failed step fails the engine.
    EXPECT_TRUE(WaitUntil([&] { return !job[rank].failure().ok(); }));
  });
}

class EngineDeathTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Every rank but the victim (rank 0 or the last) has a request pending; the victim dies.
TEST_P(EngineDeathTest, OtherRanksFailPromptly) {
  // Plain variables, not a structured binding: clang 14 (the tsan pass) cannot capture those.
  const int size = std::get<0>(GetParam());
  const bool kill_zero = std::get<1>(GetParam());
  const int victim = kill_zero ? 0 : size - 1;
  Job job(size);
  std::vector<std::vector<float>> data(size, std::vector<float>(16, 1.0f));
  std::vector<std::shared_ptr<RequestState>> states(size);
  std::vector<uint64_t> sent(size);
  for (int r = 0; r < size; ++r) sent[r] = job.world().Received(0, r);
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    states[r] = Submit(job[r], Entry(Request("pending", OpType::kAllreduce, DType::kFloat32, {16}),
                                     data[r].data(), data[r].data()));
  }
  // The victim dies once the coordinator (rank 0) holds every other rank's request. Rank 0's own
  // travels in no message: it may still be queued, and must fail just the same.
  ASSERT_TRUE(WaitUntil([&] {
    for (int r = 1; r < size; ++r) {
      if (r != victim && job.world().Received(0, r) == sent[r]) return false;
    }
    return true;
  }));
  const auto start = Clock::now();
  job.world().Kill(victim);
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    Status s = Await(states[r], milliseconds(3000));
    EXPECT_EQ(s.code(), Code::kPeerFailure) << "rank " << r << ": " << s.ToString();
    EXPECT_NE(s.message().find(std::to_string(victim)), std::string::npos) << s.message();
  }
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    // Later enqueues return the failure at once.
    Status s = job[r].Enqueue(Entry(Request("after", OpType::kAllreduce, DType::kFloat32, {16}),
                                    data[r].data(), data[r].data()));
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_FALSE(job[r].failure().ok()) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(SizesAndVictims, EngineDeathTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool()));

TEST(EngineStallTest, StallShutdownFailsTheJobOnEveryRankNamingTheMissingRank) {
  Job job(2, [](Config& c) {
    c.stall_warning_s = 0.05;
    c.stall_shutdown_s = 0.2;
  });
  std::vector<float> data(4, 1.0f);
  auto state = Submit(job[0], Entry(Request("stalled", OpType::kAllreduce, DType::kFloat32, {4}),
                                    data.data(), data.data()));
  Status s = Await(state, milliseconds(5000));
  EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
  EXPECT_NE(s.message().find("tensor 'stalled' was not submitted by rank 1"), std::string::npos)
      << s.message();
  // Failing once, on every rank (rank 1 learns it from rank 0's abort), is the end of the job.
  ASSERT_TRUE(WaitUntil([&] { return !job[1].failure().ok(); }, milliseconds(5000)));
  EXPECT_EQ(job[1].failure().code(), Code::kTimeout) << job[1].failure().ToString();
  EXPECT_NE(job[1].failure().message().find("'stalled'"), std::string::npos)
      << job[1].failure().ToString();
  std::vector<float> d(4, 1.0f);
  Status late = job[1].Enqueue(
      Entry(Request("stalled", OpType::kAllreduce, DType::kFloat32, {4}), d.data(), d.data()));
  EXPECT_EQ(late.code(), Code::kTimeout) << late.ToString();
}

// One invalid entry: how to break a valid allreduce entry, and the code expected.
struct InvalidCase {
  std::string label;
  std::function<void(QueueEntry&)> breakit;
  Code code;
  std::string text;  // part of the message
};

// gtest prints a parameter with this instead of dumping its bytes.
void PrintTo(const InvalidCase& c, std::ostream* os) {
  *os << c.label;
}

class EngineValidateTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(EngineValidateTest, RefusedWithNothingQueued) {
  const InvalidCase& c = GetParam();
  Job job(1);
  std::vector<int32_t> data(6, 1);
  QueueEntry e =
      Entry(Request("v", OpType::kAllreduce, DType::kInt32, {2, 3}), data.data(), data.data());
  c.breakit(e);
  const std::string name = e.request.name;
  Status s = job[0].Enqueue(std::move(e));
  EXPECT_EQ(s.code(), c.code) << s.ToString();
  EXPECT_NE(s.message().find(c.text), std::string::npos) << s.message();
  // Nothing was queued: the same name can be enqueued validly and runs.
  if (!name.empty() && name.rfind("__concord", 0) != 0 && name.size() <= kMaxNameBytes) {
    Status ok = Await(Submit(job[0], Entry(Request(name, OpType::kAllreduce, DType::kInt32, {6}),
                                           data.data(), data.data())));
    EXPECT_TRUE(ok.ok()) << ok.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EngineValidateTest,
    ::testing::Values(
        InvalidCase{"empty_name", [](QueueEntry& e) { e.request.name.clear(); },
                    Code::kInvalidArgument, "empty"},
        InvalidCase{"reserved_prefix", [](QueueEntry& e) { e.request.name = "__concord.x"; },
                    Code::kInvalidArgument, "reserved"},
        InvalidCase{"name_too_long",
                    [](QueueEntry& e) { e.request.name.assign(kMaxNameBytes + 1, 'n'); },
                    Code::kInvalidArgument, "bytes long; names take at most 65536 bytes"},
        InvalidCase{"negative_dim",
                    [](QueueEntry& e) {
                      e.request.shape = {2, -3};
                    },
                    Code::kInvalidArgument, "negative dimension"},
        InvalidCase{"too_many_dims", [](QueueEntry& e) { e.request.shape.assign(9, 1); },
                    Code::kInvalidArgument, "8 dimensions"},
        InvalidCase{"too_large",
                    [](QueueEntry& e) {
                      e.request.shape = {int64_t{1} << 40, int64_t{1} << 20};
                    },
                    Code::kInvalidArgument, "too large"},
        InvalidCase{"bad_root",
                    [](QueueEntry& e) {
                      e.request.op = OpType::kBroadcast;
                      e.request.root = 1;
                    },
                    Code::kInvalidArgument, "root 1"},
        InvalidCase{"negative_root",
                    [](QueueEntry& e) {
                      e.request.op = OpType::kBroadcast;
                      e.request.root = -1;
                    },
                    Code::kInvalidArgument, "root -1"},
        InvalidCase{"null_input", [](QueueEntry& e) { e.input = nullptr; }, Code::kInvalidArgument,
                    "input data is NULL"},
        InvalidCase{"null_output", [](QueueEntry& e) { e.output = nullptr; },
                    Code::kInvalidArgument, "output data is NULL"},
        InvalidCase{"scale_on_int", [](QueueEntry& e) { e.request.prescale = 2.0; },
                    Code::kInvalidArgument, "floating-point"},
        InvalidCase{"postscale_on_int", [](QueueEntry& e) { e.request.postscale = 0.5; },
                    Code::kInvalidArgument, "floating-point"},
        InvalidCase{"infinite_scale",
                    [](QueueEntry& e) {
                      e.request.dtype = DType::kFloat32;
                      e.request.prescale = INFINITY;
                    },
                    Code::kInvalidArgument, "finite"},
        InvalidCase{"allgather_scalar",
                    [](QueueEntry& e) {
                      e.request.op = OpType::kAllgather;
                      e.request.shape.clear();
                    },
                    Code::kInvalidArgument, "at least one dimension"},
        InvalidCase{"bad_dtype", [](QueueEntry& e) { e.request.dtype = static_cast<DType>(42); },
                    Code::kInvalidArgument, "dtype"},
        InvalidCase{"bad_reduce_op",
                    [](QueueEntry& e) { e.request.reduce_op = static_cast<ReduceOp>(9); },
                    Code::kInvalidArgument, "reduce op"},
        // This job has no device backend (engine_device_test covers one).
        InvalidCase{"device", [](QueueEntry& e) { e.request.device = 0; }, Code::kUnavailable,
                    "on CUDA device 0: no GPU backend"},
        InvalidCase{"negative_device", [](QueueEntry& e) { e.request.device = -2; },
                    Code::kInvalidArgument, "neither the CPU"},
        InvalidCase{"no_state", [](QueueEntry& e) { e.state.reset(); }, Code::kInternal,
                    "completion state"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.label; });

// A name of the longest length runs across ranks (its messages parse); a 2 MiB one, past what a
// message's string may hold, is refused at enqueue. It used to pass, and then rank 0 could not
// parse rank 1's request: PROTOCOL_ERROR on both ranks, the communicator failed for good.
TEST(EngineValidateTest, LongNamesRunOrAreRefusedAtEnqueueAndTheCommunicatorLives) {
  Job job(2);
  RunRanks(2, [&](int rank) {
    std::vector<float> v(3, 1.0f);
    const std::string longest(kMaxNameBytes, 'l');
    Status s =
        Await(Submit(job[rank], Entry(Request(longest, OpType::kAllreduce, DType::kFloat32, {3}),
                                      v.data(), v.data())));
    ASSERT_TRUE(s.ok()) << s.ToString().substr(0, 300);
    EXPECT_EQ(v[0], 2.0f);
    const std::string huge(2 << 20, 'h');
    s = job[rank].Enqueue(
        Entry(Request(huge, OpType::kAllreduce, DType::kFloat32, {3}), v.data(), v.data()));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString().substr(0, 300);
    EXPECT_LT(s.message().size(), 1000u);
    s = Await(Submit(job[rank], Entry(Request("after", OpType::kAllreduce, DType::kFloat32, {3}),
                                      v.data(), v.data())));
    ASSERT_TRUE(s.ok()) << s.ToString().substr(0, 300);
    EXPECT_EQ(v[0], 4.0f);
  });
}

TEST(EngineValidateTest, ValidEdgeCasesAccepted) {
  QueueEntry barrier =
      Entry(Request("__concord.barrier.0", OpType::kBarrier, DType::kUint8, {}), nullptr, nullptr);
  EXPECT_TRUE(ValidateEntry(barrier, 2).ok());
  QueueEntry empty =
      Entry(Request("empty", OpType::kAllreduce, DType::kFloat32, {0, 5}), nullptr, nullptr);
  EXPECT_TRUE(ValidateEntry(empty, 2).ok());
  QueueEntry gather =
      Entry(Request("g", OpType::kAllgather, DType::kFloat32, {0}), nullptr, nullptr);
  EXPECT_TRUE(ValidateEntry(gather, 2).ok());
}

}  // namespace
}  // namespace concord
