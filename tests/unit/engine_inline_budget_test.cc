// The inline message budget (Engine::kInlineMessageBudgetBytes, coordinator.h point 2): a burst
// of small operations whose inputs or results together pass it still completes, correctly, with
// every negotiation message under the budget; the operations past it run on the backend. A burst
// of first submissions with long names splits a rank's requests into messages under it too.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "tests/unit/engine_test_util.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Request;
using engine_testing::Submit;
using harness::RunRanks;

// A control plane that records the largest message any rank sent through it (with
// `requests_only`, the largest sent to rank 0: a rank's requests).
class SizeRecordingControlPlane : public ControlPlane {
 public:
  SizeRecordingControlPlane(std::unique_ptr<ControlPlane> plane,
                            std::shared_ptr<std::atomic<size_t>> largest,
                            bool requests_only = false)
      : plane_(std::move(plane)), largest_(std::move(largest)), requests_only_(requests_only) {}
  int rank() const override { return plane_->rank(); }
  int size() const override { return plane_->size(); }
  Status Send(int to, std::string bytes) override {
    size_t seen = largest_->load();
    while ((to == 0 || !requests_only_) && bytes.size() > seen &&
           !largest_->compare_exchange_weak(seen, bytes.size())) {
    }
    return plane_->Send(to, std::move(bytes));
  }
  StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) override {
    return plane_->Receive(out, deadline);
  }
  StatusOr<bool> ReceiveBusy(ControlMessage* out, Deadline deadline,
                             std::chrono::microseconds busy) override {
    return plane_->ReceiveBusy(out, deadline, busy);
  }
  Status Drain(Deadline deadline) override { return plane_->Drain(deadline); }
  void Wake() override { plane_->Wake(); }
  void SetFailureListener(std::function<void()> listener) override {
    plane_->SetFailureListener(std::move(listener));
  }
  void Abandon() override { plane_->Abandon(); }

 private:
  std::unique_ptr<ControlPlane> plane_;
  std::shared_ptr<std::atomic<size_t>> largest_;
  const bool requests_only_;
};

// `size` engines of one in-process world, each with the inline message budget `budget`, whose
// control planes record their largest message into `largest` (SizeRecordingControlPlane).
std::vector<std::unique_ptr<Engine>> MakeEngines(int size, size_t budget,
                                                 std::shared_ptr<std::atomic<size_t>> largest,
                                                 bool requests_only) {
  auto world = std::make_shared<InProcWorld>(size, std::chrono::milliseconds(20000));
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < size; ++r) {
    Config c;
    c.rank = r;
    c.size = size;
    c.log_level = 0;
    EXPECT_TRUE(c.Finalize().ok());
    std::vector<std::unique_ptr<Backend>> lanes;
    for (int lane = 0; lane < c.lanes; ++lane) lanes.push_back(world->MakeBackend(r, lane));
    engines.push_back(
        std::make_unique<Engine>(c,
                                 std::make_unique<SizeRecordingControlPlane>(
                                     world->MakeControlPlane(r), largest, requests_only),
                                 std::move(lanes), world));
    engines.back()->SetInlineMessageBudget(budget);
  }
  return engines;
}

// Shuts every engine down, each on its rank's thread, then destroys them.
void ShutDown(std::vector<std::unique_ptr<Engine>>& engines) {
  RunRanks(static_cast<int>(engines.size()), [&](int rank) {
    const Status s = engines[rank]->Shutdown();
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  engines.clear();
}

TEST(EngineInlineBudgetTest, ABurstPastTheBudgetCompletesWithEveryMessageUnderIt) {
  constexpr int kSize = 3;
  constexpr size_t kBudget = 64 << 10;
  // Each rank sends 2 x 24 x 4 KiB of inputs, rank 0 would send 24 x 12 KiB of allgathers and
  // 24 x 4 KiB of reductions back: each several times the budget, each operation inline-eligible
  // (the default threshold, 32 KiB, over 3 ranks for an allgather: 10 KiB).
  constexpr int kTensors = 24;
  constexpr size_t kFloats = 1024;
  // What a message holds besides inline data: names, shapes, flags, for 2 x 24 operations.
  constexpr size_t kOverhead = 16 << 10;

  auto largest = std::make_shared<std::atomic<size_t>>(0);
  std::vector<std::unique_ptr<Engine>> engines =
      MakeEngines(kSize, kBudget, largest, /*requests_only=*/false);

  // Twice: full requests first, then the same names as cache bits with their inline data.
  for (int round = 0; round < 2; ++round) {
    RunRanks(kSize, [&](int rank) {
      Engine& engine = *engines[rank];
      std::vector<std::vector<float>> sums(kTensors), gathers(kTensors);
      std::vector<std::vector<float>> sum_out(kTensors), gather_out(kTensors);
      std::vector<std::shared_ptr<RequestState>> states;
      ASSERT_TRUE(engine.GroupStart().ok());
      for (int t = 0; t < kTensors; ++t) {
        sums[t].resize(kFloats);
        gathers[t].resize(kFloats);
        for (size_t i = 0; i < kFloats; ++i) {
          sums[t][i] = static_cast<float>(rank * 1000 + t * 10 + round + i % 7);
          gathers[t][i] = static_cast<float>(rank * 100000 + t * 1000 + i);
        }
        sum_out[t].assign(kFloats, -1.0f);
        gather_out[t].assign(kFloats * kSize, -1.0f);
        const auto shape = std::vector<int64_t>{static_cast<int64_t>(kFloats)};
        states.push_back(Submit(engine, Entry(Request("sum." + std::to_string(t),
                                                      OpType::kAllreduce, DType::kFloat32, shape),
                                              sums[t].data(), sum_out[t].data())));
        states.push_back(Submit(engine, Entry(Request("gather." + std::to_string(t),
                                                      OpType::kAllgather, DType::kFloat32, shape),
                                              gathers[t].data(), gather_out[t].data(),
                                              kFloats * kSize * sizeof(float))));
      }
      ASSERT_TRUE(engine.GroupEnd().ok());
      for (const auto& state : states) {
        const Status s = Await(state);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      for (int t = 0; t < kTensors; ++t) {
        for (size_t i = 0; i < kFloats; ++i) {
          float want = 0;
          for (int r = 0; r < kSize; ++r) {
            want += static_cast<float>(r * 1000 + t * 10 + round + i % 7);
          }
          ASSERT_EQ(sum_out[t][i], want) << "sum." << t << " element " << i;
        }
        for (int r = 0; r < kSize; ++r) {
          for (size_t i = 0; i < kFloats; ++i) {
            ASSERT_EQ(gather_out[t][r * kFloats + i], static_cast<float>(r * 100000 + t * 1000 + i))
                << "gather." << t << " rank " << r << " element " << i;
          }
        }
      }
    });
  }

  EXPECT_LE(largest->load(), kBudget + kOverhead);
  // Some operations went inline, the rest through the backend.
  for (int r = 0; r < kSize; ++r) {
    const uint64_t inlined = engines[r]->stats().inline_reductions.load();
    EXPECT_GT(inlined, 0u) << "rank " << r;
    EXPECT_LT(inlined, 2u * 2 * kTensors) << "rank " << r;
  }
  ShutDown(engines);
}

// A rank's first submissions of many long names (each of them travels whole) once went as one
// request message, as long as all the names together: with enough of them (the control plane's
// frame limit is 1 GiB, a name 64 KiB) the job failed. Now a full request that would take its
// message past the budget begins the next one.
TEST(EngineInlineBudgetTest, LongNamesSplitARanksRequestsIntoMessagesUnderTheBudget) {
  constexpr int kSize = 3;
  constexpr size_t kBudget = 16 << 10;
  constexpr int kTensors = 24;           // 24 names of 2 KiB: three times the budget
  constexpr size_t kOverhead = 1 << 10;  // the message's header, counts, a data entry
  auto largest = std::make_shared<std::atomic<size_t>>(0);
  std::vector<std::unique_ptr<Engine>> engines =
      MakeEngines(kSize, kBudget, largest, /*requests_only=*/true);
  // Twice: the second time the names are cache bits.
  for (int round = 0; round < 2; ++round) {
    RunRanks(kSize, [&](int rank) {
      Engine& engine = *engines[rank];
      std::vector<float> in(kTensors), out(kTensors, -1.0f);
      std::vector<std::shared_ptr<RequestState>> states;
      ASSERT_TRUE(engine.GroupStart().ok());
      for (int t = 0; t < kTensors; ++t) {
        in[t] = static_cast<float>(rank * 100 + t + round);
        const std::string name = std::string(2048, 'n') + "." + std::to_string(t);
        states.push_back(Submit(
            engine,
            Entry(Request(name, OpType::kAllreduce, DType::kFloat32, {1}), &in[t], &out[t])));
      }
      ASSERT_TRUE(engine.GroupEnd().ok());
      for (const auto& state : states) {
        const Status s = Await(state);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      for (int t = 0; t < kTensors; ++t) {
        float want = 0;
        for (int r = 0; r < kSize; ++r) want += static_cast<float>(r * 100 + t + round);
        ASSERT_EQ(out[t], want) << "tensor " << t;
      }
    });
  }
  EXPECT_GT(largest->load(), kBudget / 2);  // the names did travel, in messages near the budget
  EXPECT_LE(largest->load(), kBudget + kOverhead);
  ShutDown(engines);
}

}  // namespace
}  // namespace concord
