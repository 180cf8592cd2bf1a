// The engine's failure path: a backend that fails in the middle of a response list. Every request
// of every rank completes, exactly once (RequestState::complete_calls), with the failing rank's
// error or its peers' failure, or successfully when it ran before the failure; nothing hangs.
// One owner completes each request (core/engine_execute.cc), so no request is completed twice
// with two different statuses, of which only the first would count.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/unit/engine_test_util.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Request;
using std::chrono::milliseconds;

// Passes every call to the wrapped backend, but fails its first call of the collective named
// `fail` ("Allreduce", "AllreduceSpans", ...) with kBackendError, as a transport error would.
// Used by one lane's thread, like any backend.
class FailingBackend : public Backend {
 public:
  FailingBackend(std::unique_ptr<Backend> inner, std::string fail)
      : inner_(std::move(inner)), fail_(std::move(fail)) {}
  const char* name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(Count("Allreduce"));
    return inner_->Allreduce(data, count, dtype, op);
  }
  Status AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype,
                        ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(Count("AllreduceSpans"));
    return inner_->AllreduceSpans(spans, dtype, op);
  }
  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    CONCORD_RETURN_IF_ERROR(Count("Allgatherv"));
    return inner_->Allgatherv(in, out, bytes);
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    CONCORD_RETURN_IF_ERROR(Count("Broadcast"));
    return inner_->Broadcast(data, bytes, root);
  }
  Status Barrier() override {
    CONCORD_RETURN_IF_ERROR(Count("Barrier"));
    return inner_->Barrier();
  }
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(Count("ReduceScatter"));
    return inner_->ReduceScatter(in, out, counts, dtype, op);
  }
  Status Alltoallv(const void* in, const std::vector<size_t>& send, void* out,
                   const std::vector<size_t>& recv) override {
    CONCORD_RETURN_IF_ERROR(Count("Alltoallv"));
    return inner_->Alltoallv(in, send, out, recv);
  }

 private:
  Status Count(const char* what) {
    if (failed_ || fail_ != what) return Status::Ok();
    failed_ = true;
    return Status(Code::kBackendError, std::string("injected failure of ") + what + " on rank " +
                                           std::to_string(inner_->rank()));
  }

  std::unique_ptr<Backend> inner_;
  const std::string fail_;
  bool failed_ = false;
};

// A job whose `victim` rank fails the first collective named `fail` on each of its lanes. An
// injected failure has no culprit to find: the victim waits out its attribution window (timeout_s
// + 1 s: Engine::ExplainFailure) and its peers their blocked collective (the world's timeout)
// before the abort, so both are short (3 s) to keep each case at about 4 s.
class FailingJob {
 public:
  FailingJob(int size, int victim, const std::string& fail)
      : world_(std::make_shared<InProcWorld>(size, milliseconds(3000))) {
    for (int r = 0; r < size; ++r) {
      Config c;
      c.rank = r;
      c.size = size;
      c.log_level = 0;
      c.lanes = 2;
      c.timeout_s = 3;
      EXPECT_TRUE(c.Finalize().ok());
      std::vector<std::unique_ptr<Backend>> lanes;
      for (int l = 0; l < c.lanes; ++l) {
        std::unique_ptr<Backend> b = world_->MakeBackend(r, l);
        if (r == victim) b = std::make_unique<FailingBackend>(std::move(b), fail);
        lanes.push_back(std::move(b));
      }
      engines_.push_back(
          std::make_unique<Engine>(c, world_->MakeControlPlane(r), std::move(lanes), world_));
    }
  }
  ~FailingJob() {
    // The engines failed (or are failing): Shutdown() returns; a rank that ran its finalize
    // barrier before it learned of the failure reports that the barrier failed.
    for (auto& e : engines_) {
      const Status s = e->Shutdown();
      EXPECT_TRUE(s.ok() || !e->failure().ok()) << s.ToString();
    }
  }
  Engine& operator[](int rank) { return *engines_[rank]; }

 private:
  std::shared_ptr<InProcWorld> world_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

// One rank's operations, all in one group (so one response list): two allreduces small enough to
// be reduced inline by the coordinator, three fused ones (too large for inline, too small to run
// alone), a fused fp16-compressed pair, a span group of two direct allreduces large enough for a
// share on each lane, an allgather and a broadcast (too large for the coordinator to complete
// inline) and a barrier.
struct RankWork {
  std::vector<std::vector<float>> data;
  std::vector<uint8_t> gathered;
  std::vector<std::shared_ptr<RequestState>> states;
};

void SubmitWork(Engine& e, int rank, RankWork& w) {
  const std::vector<int64_t> sizes = {1, 7, 9000, 10001, 12000, 5, 9, 400000, 500001, 4000, 9000};
  for (int64_t n : sizes) w.data.emplace_back(static_cast<size_t>(n), 1.0f + rank);
  w.gathered.resize(3 * 4000 * sizeof(float));
  ASSERT_TRUE(e.GroupStart().ok());
  auto submit = [&](TensorRequest r, const void* in, void* out, size_t capacity = 0) {
    QueueEntry entry = Entry(std::move(r), in, out, capacity);
    w.states.push_back(entry.state);
    ASSERT_TRUE(e.Enqueue(std::move(entry)).ok());
  };
  for (size_t k = 0; k < 7; ++k) {
    TensorRequest r =
        Request("small." + std::to_string(k), OpType::kAllreduce, DType::kFloat32, {sizes[k]});
    if (k >= 5) r.compression = "fp16";
    submit(r, w.data[k].data(), w.data[k].data());
  }
  for (size_t k = 7; k < 9; ++k) {
    submit(Request("large." + std::to_string(k), OpType::kAllreduce, DType::kFloat32, {sizes[k]}),
           w.data[k].data(), w.data[k].data());
  }
  submit(Request("gather", OpType::kAllgather, DType::kFloat32, {4000}), w.data[9].data(),
         w.gathered.data(), w.gathered.size());
  TensorRequest b = Request("bcast", OpType::kBroadcast, DType::kFloat32, {9000});
  b.root = 1;
  submit(b, w.data[10].data(), w.data[10].data());
  submit(Request(e.NextBarrierName(), OpType::kBarrier, DType::kUint8, {}), nullptr, nullptr);
  ASSERT_TRUE(e.GroupEnd().ok());
}

class EngineFailureTest : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(EngineFailureTest, EveryRequestCompletesExactlyOnce) {
  const auto [victim, fail] = GetParam();
  constexpr int kSize = 3;
  FailingJob job(kSize, victim, fail);
  std::vector<RankWork> work(kSize);
  for (int r = 0; r < kSize; ++r) SubmitWork(job[r], r, work[r]);
  for (int r = 0; r < kSize; ++r) {
    int victim_errors = 0;
    for (size_t k = 0; k < work[r].states.size(); ++k) {
      const auto& state = work[r].states[k];
      const Status s = Await(state, milliseconds(30000));
      ASSERT_NE(s.code(), Code::kTimeout) << "rank " << r << " request " << k << " hangs";
      EXPECT_EQ(state->complete_calls(), 1)
          << "rank " << r << " request " << k << ": " << s.ToString();
      if (s.ok()) continue;  // it ran before the failure
      const bool injected = s.message().find("injected failure") != std::string::npos;
      if (r == victim) {
        EXPECT_TRUE(injected) << "rank " << r << ": " << s.ToString();
        victim_errors += injected;
      } else if (s.code() != Code::kPeerFailure) {
        // Rank 0 tells the others why it aborted (its own error's code).
        EXPECT_NE(s.message().find("rank 0 aborted the job"), std::string::npos) << s.ToString();
      }
    }
    if (r == victim) {
      EXPECT_GT(victim_errors, 0) << "the injected failure reached no request";
    }
  }
  EXPECT_FALSE(job[victim].failure().ok());
}

// Rank 0 (the coordinator) or another rank fails in each kind of collective: Allreduce is the
// fused batches (plain and compressed, one per lane), AllreduceSpans the span group's shares.
INSTANTIATE_TEST_SUITE_P(VictimAndCollective, EngineFailureTest,
                         ::testing::Combine(::testing::Values(0, 2),
                                            ::testing::Values("Allreduce", "AllreduceSpans",
                                                              "Allgatherv", "Broadcast",
                                                              "Barrier")));

}  // namespace
}  // namespace concord
