// Inline results (core/engine_inline.cc) with ranks as threads: a response message whose inline
// result is malformed (rewritten on its way to a rank) fails that rank with a PROTOCOL error
// naming the tensor, never a crash or a copy out of bounds; and what an inline broadcast counts
// as each rank's wire bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/engine.h"
#include "core/message.h"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/inproc_transport.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::RunRanks;
using harness::WaitUntil;

// A control plane that passes each response message its rank receives from rank 0 through
// `rewrite` before the engine reads it (what a faulty or hostile coordinator could send). Other
// messages pass unchanged. `rewrite` runs on whichever thread steps the engine, one at a time.
class RewritingControlPlane : public ControlPlane {
 public:
  using Rewrite = std::function<void(ResponseMessage&)>;
  RewritingControlPlane(std::unique_ptr<ControlPlane> plane, Rewrite rewrite)
      : plane_(std::move(plane)), rewrite_(std::move(rewrite)) {}
  int rank() const override { return plane_->rank(); }
  int size() const override { return plane_->size(); }
  Status Send(int to, std::string bytes) override { return plane_->Send(to, std::move(bytes)); }
  StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) override {
    return Rewritten(plane_->Receive(out, deadline), out);
  }
  StatusOr<bool> ReceiveBusy(ControlMessage* out, Deadline deadline,
                             std::chrono::microseconds busy) override {
    return Rewritten(plane_->ReceiveBusy(out, deadline, busy), out);
  }
  Status Drain(Deadline deadline) override { return plane_->Drain(deadline); }
  void Wake() override { plane_->Wake(); }
  void SetFailureListener(std::function<void()> listener) override {
    plane_->SetFailureListener(std::move(listener));
  }
  void Abandon() override { plane_->Abandon(); }

 private:
  StatusOr<bool> Rewritten(StatusOr<bool> got, ControlMessage* out) {
    if (!got.ok() || !*got || out->from != 0) return got;
    StatusOr<ResponseMessage> message = ParseResponseMessage(out->bytes);
    if (!message.ok()) return got;
    rewrite_(*message);
    out->bytes = SerializeResponseMessage(*message);
    return got;
  }

  std::unique_ptr<ControlPlane> plane_;
  Rewrite rewrite_;
};

// Two engines over one in-process world; every response message rank 1 receives passes through
// `rewrite`. Both shut down together at the end.
class RewrittenJob {
 public:
  explicit RewrittenJob(RewritingControlPlane::Rewrite rewrite)
      : world_(std::make_shared<InProcWorld>(2, std::chrono::milliseconds(20000))) {
    for (int r = 0; r < 2; ++r) {
      Config c;
      c.rank = r;
      c.size = 2;
      c.log_level = 0;
      // A failure waits at most the timeout and a second for a culprit to be named.
      c.timeout_s = 0.5;
      EXPECT_TRUE(c.Finalize().ok());
      std::vector<std::unique_ptr<Backend>> lanes;
      for (int lane = 0; lane < c.lanes; ++lane) lanes.push_back(world_->MakeBackend(r, lane));
      std::unique_ptr<ControlPlane> plane = world_->MakeControlPlane(r);
      if (r == 1) plane = std::make_unique<RewritingControlPlane>(std::move(plane), rewrite);
      engines_.push_back(std::make_unique<Engine>(c, std::move(plane), std::move(lanes), world_));
    }
  }
  ~RewrittenJob() {
    // The tests fail rank 1, and with it the job: neither shutdown can succeed.
    RunRanks(2, [this](int rank) { (void)engines_[rank]->Shutdown(); });
    engines_.clear();
  }
  Engine& operator[](int rank) { return *engines_[rank]; }

 private:
  std::shared_ptr<InProcWorld> world_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

// The first full (uncached) item for `name` that carries an inline result, or null.
ResponseItem* InlineItem(ResponseMessage& m, const std::string& name) {
  for (ResponseItem& item : m.items) {
    if (!item.cached && item.data && item.response.request.name == name) return &item;
  }
  return nullptr;
}

// Expects rank 1's request `state` and its engine to fail with a PROTOCOL error about the inline
// result for `tensor`.
void ExpectProtocolErrorOnRank1(RewrittenJob& job, const std::shared_ptr<RequestState>& state,
                                const std::string& tensor) {
  const Status s = Await(state);
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.ToString();
  EXPECT_NE(s.message().find("inline result for tensor '" + tensor + "'"), std::string::npos)
      << s.ToString();
  EXPECT_TRUE(WaitUntil([&] { return !job[1].failure().ok(); }));
  EXPECT_EQ(job[1].failure().code(), Code::kProtocolError) << job[1].failure().ToString();
}

// How the crafted item for a tensor rank 1 never submitted is addressed to it.
enum class Ghost {
  kError,           // an error for every rank
  kErrorForRank0,   // an error for rank 0 only
  kResultForRank0,  // no error, for rank 0 only (error_ranks set)
};

class EngineInlineGhostTest : public ::testing::TestWithParam<Ghost> {};

// Ahead of the real inline allreduce 't', rank 1 receives a copy of it, with its data, for a
// tensor 'ghost' it never submitted: refused (it took no entry for it), before the real one.
TEST_P(EngineInlineGhostTest, AnInlineResultForATensorThisRankDidNotSubmitIsAProtocolError) {
  const Ghost ghost = GetParam();
  std::mutex mu;
  bool rewritten = false;
  RewrittenJob job([&](ResponseMessage& m) {
    ResponseItem* real = InlineItem(m, "t");
    if (real == nullptr) return;
    ResponseItem crafted = *real;
    crafted.response.request.name = "ghost";
    if (ghost != Ghost::kResultForRank0) {
      crafted.response.error = Code::kMismatch;
      crafted.response.error_message = "crafted";
    }
    if (ghost != Ghost::kError) crafted.response.error_ranks = {0};
    m.items.insert(m.items.begin(), crafted);
    std::lock_guard<std::mutex> lock(mu);
    rewritten = true;
  });
  std::vector<std::vector<float>> data(2, std::vector<float>(4, 1.0f));
  std::vector<std::shared_ptr<RequestState>> states(2);
  RunRanks(2, [&](int rank) {
    states[rank] = Submit(job[rank], Entry(Request("t", OpType::kAllreduce, DType::kFloat32, {4}),
                                           data[rank].data(), data[rank].data()));
  });
  EXPECT_TRUE(Await(states[0]).ok());  // rank 0 ran the list it sent
  ExpectProtocolErrorOnRank1(job, states[1], "ghost");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(rewritten) << "'t' did not go inline";
}

INSTANTIATE_TEST_SUITE_P(Addressed, EngineInlineGhostTest,
                         ::testing::Values(Ghost::kError, Ghost::kErrorForRank0,
                                           Ghost::kResultForRank0));

// An inline alltoall whose rows from rank 0 (as rank 1 receives them) are so many that their
// bytes wrap around 2^64: rank 0's first split of 2^61 - 1 rows of 8 bytes would start the rows
// for rank 1 8 bytes before the data, and 2^61 rows add nothing to the data's size, which the
// crafted 16 bytes then match. Refused; before the check, rank 1 read 8 bytes before the data.
TEST(EngineInlineAlltoallTest, RowsWhoseBytesOverflowAreAProtocolError) {
  constexpr int64_t kHuge = int64_t{1} << 61;
  std::mutex mu;
  bool rewritten = false;
  RewrittenJob job([&](ResponseMessage& m) {
    ResponseItem* item = InlineItem(m, "a2a");
    if (item == nullptr) return;
    Response& r = item->response;
    ASSERT_EQ(r.first_dims.size(), 2u);
    ASSERT_EQ(r.splits.size(), 4u);
    r.first_dims[0] = kHuge;
    r.splits[0] = kHuge - 1;  // rank 0 to rank 0
    r.splits[1] = 1;          // rank 0 to rank 1
    // What rank 1 then expects: 2^61 * 8 (0, wrapped) bytes from rank 0, 2 * 8 from itself.
    item->data = std::string(16, '\x5a');
    std::lock_guard<std::mutex> lock(mu);
    rewritten = true;
  });
  // Two rows of 8 bytes each, one to each rank.
  std::vector<std::vector<uint8_t>> in(2), out(2);
  std::vector<std::shared_ptr<RequestState>> states(2);
  RunRanks(2, [&](int rank) {
    in[rank].assign(16, static_cast<uint8_t>(rank + 1));
    out[rank].assign(16, 0);
    TensorRequest r = Request("a2a", OpType::kAlltoall, DType::kUint8, {2, 8});
    r.splits = {1, 1};
    states[rank] = Submit(job[rank], Entry(r, in[rank].data(), out[rank].data(), 16));
  });
  EXPECT_TRUE(Await(states[0]).ok());
  ExpectProtocolErrorOnRank1(job, states[1], "a2a");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(rewritten) << "'a2a' did not go inline";
}

// Rank lists from the wire that no coordinator sends: every rank joined in an average (its
// integer division by the contributors divided by zero: SIGFPE), or a rank past the communicator.
// Rank 1 refuses the response with a PROTOCOL error naming the tensor.
class EngineResponseRanksTest : public ::testing::TestWithParam<std::vector<int32_t>> {};

TEST_P(EngineResponseRanksTest, ARankListNoCoordinatorSendsIsAProtocolError) {
  const std::vector<int32_t> joined = GetParam();
  std::mutex mu;
  bool rewritten = false;
  RewrittenJob job([&](ResponseMessage& m) {
    for (ResponseItem& item : m.items) {
      if (item.cached || item.response.request.name != "avg") continue;
      item.response.joined = joined;
      std::lock_guard<std::mutex> lock(mu);
      rewritten = true;
    }
  });
  // Too large to go inline: it runs on the lanes.
  constexpr int64_t kCount = 100000;
  std::vector<std::vector<int32_t>> data(2, std::vector<int32_t>(kCount, 6));
  std::vector<std::shared_ptr<RequestState>> states(2);
  RunRanks(2, [&](int rank) {
    TensorRequest r = Request("avg", OpType::kAllreduce, DType::kInt32, {kCount});
    r.reduce_op = ReduceOp::kAverage;
    states[rank] = Submit(job[rank], Entry(r, data[rank].data(), data[rank].data()));
  });
  const Status s = Await(states[1]);
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.ToString();
  EXPECT_NE(s.message().find("response for tensor 'avg'"), std::string::npos) << s.ToString();
  EXPECT_TRUE(WaitUntil([&] { return !job[1].failure().ok(); }));
  (void)Await(states[0]);  // fails once rank 1 has: it never takes part
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(rewritten);
}

INSTANTIATE_TEST_SUITE_P(Joined, EngineResponseRanksTest,
                         ::testing::Values(std::vector<int32_t>{0, 1}, std::vector<int32_t>{5}));

// An inline broadcast: the root sends its input to rank 0 (unless it is rank 0), rank 0 sends it
// to every other rank, the other ranks send nothing (concord_request_wire_bytes).
TEST(EngineInlineWireBytesTest, ABroadcastCountsWhatEachRankSends) {
  constexpr int kSize = 3;
  constexpr size_t kFloats = 16;
  constexpr uint64_t kBytes = kFloats * sizeof(float);
  Job job(kSize);
  for (int root = 0; root < kSize; ++root) {
    RunRanks(kSize, [&](int rank) {
      const uint64_t inlined = job[rank].stats().inline_reductions.load();
      std::vector<float> v(kFloats, static_cast<float>(rank));
      TensorRequest r = Request("b." + std::to_string(root), OpType::kBroadcast, DType::kFloat32,
                                {static_cast<int64_t>(kFloats)});
      r.root = root;
      const std::shared_ptr<RequestState> state = Submit(job[rank], Entry(r, v.data(), v.data()));
      const Status s = Await(state);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(v, std::vector<float>(kFloats, static_cast<float>(root)));
      EXPECT_EQ(job[rank].stats().inline_reductions.load(), inlined + 1) << "not inline";
      const uint64_t want = rank == 0 ? kBytes * (kSize - 1) : rank == root ? kBytes : 0;
      EXPECT_EQ(state->wire_bytes(), want) << "rank " << rank << ", root " << root;
    });
  }
}

}  // namespace
}  // namespace concord
