// Helpers for engine tests: a job of engines whose ranks are threads of this process (run them with
// harness::RunRanks, tests/common/ranks.h), and shorthands to build, submit and await requests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/engine.h"
#include "tests/common/ranks.h"
#include "tests/unit/inproc_transport.h"

namespace concord {
namespace engine_testing {

using std::chrono::milliseconds;

// A job of `size` engines whose ranks are threads of this process, joined by one InProcWorld.
// `tweak` may change each rank's Config before Finalize(); `device`, when given, makes each
// rank's device plane (whatever it uses must outlive the job). All engines shut down together
// (their Shutdown() is a negotiated barrier) before any is destroyed, so tearing down never looks
// like a rank dying.
class Job {
 public:
  // `p2p`: each rank's point-to-point transport (none without it).
  explicit Job(int size, const std::function<void(Config&)>& tweak = nullptr,
               milliseconds backend_timeout = milliseconds(20000),
               const std::function<DevicePlane(int rank)>& device = nullptr,
               const std::function<std::unique_ptr<P2pTransport>(int rank)>& p2p = nullptr)
      : world_(std::make_shared<InProcWorld>(size, backend_timeout)) {
    for (int r = 0; r < size; ++r) {
      Config c;
      c.rank = r;
      c.size = size;
      c.log_level = 0;
      if (tweak) tweak(c);
      EXPECT_TRUE(c.Finalize().ok());
      std::vector<std::unique_ptr<Backend>> lanes;
      for (int lane = 0; lane < c.lanes; ++lane) lanes.push_back(world_->MakeBackend(r, lane));
      engines_.push_back(std::make_unique<Engine>(c, world_->MakeControlPlane(r), std::move(lanes),
                                                  world_, device ? device(r) : DevicePlane(),
                                                  p2p ? p2p(r) : nullptr));
    }
  }
  ~Job() {
    // A rank whose job failed may report that its finalize barrier failed too; a healthy job's
    // finalize must succeed everywhere.
    harness::RunRanks(size(), [this](int rank) {
      const Status s = engines_[rank]->Shutdown();
      if (!engines_[rank]->failure().ok()) return;
      if (uneven_end_ && s.code() == Code::kMismatch) {
        EXPECT_NE(s.message().find("still submitted tensors"), std::string::npos) << s.ToString();
      } else {
        EXPECT_TRUE(s.ok()) << "rank " << rank << ": " << s.ToString();
      }
    });
    engines_.clear();
  }
  // The test leaves an operation in flight on some rank at the end: a rank whose finalize
  // fails it may report that (kMismatch, "... still submitted tensors ...").
  void ExpectUnevenEnd() { uneven_end_ = true; }
  int size() const { return static_cast<int>(engines_.size()); }
  Engine& operator[](int rank) { return *engines_[rank]; }
  InProcWorld& world() { return *world_; }

 private:
  std::shared_ptr<InProcWorld> world_;
  std::vector<std::unique_ptr<Engine>> engines_;
  bool uneven_end_ = false;
};

// A QueueEntry for `request` over the given buffers, with a fresh completion state.
inline QueueEntry Entry(TensorRequest request, const void* input, void* output,
                        size_t capacity = 0) {
  QueueEntry e;
  e.request = std::move(request);
  e.input = input;
  e.output = output;
  e.output_capacity = capacity;
  e.state = std::make_shared<RequestState>();
  return e;
}

// Enqueues `entry` on `engine` (expecting success) and returns its completion state.
inline std::shared_ptr<RequestState> Submit(Engine& engine, QueueEntry entry) {
  auto state = entry.state;
  Status s = engine.Enqueue(std::move(entry));
  EXPECT_TRUE(s.ok()) << s.ToString();
  return state;
}

// The final status of `state`, or a kTimeout status when it does not complete within `limit`.
inline Status Await(const std::shared_ptr<RequestState>& state,
                    milliseconds limit = milliseconds(20000)) {
  if (!state->Wait(Deadline::After(limit))) return TimeoutError("request did not complete");
  return state->status();
}

// A request with the given name, op, dtype and shape; every other field at its default.
inline TensorRequest Request(const std::string& name, OpType op, DType dtype,
                             std::vector<int64_t> shape) {
  TensorRequest r;
  r.name = name;
  r.op = op;
  r.dtype = dtype;
  r.shape = std::move(shape);
  return r;
}

}  // namespace engine_testing
}  // namespace concord
