// The fixture of the NCCL backend's GPU tests: one rank per usable GPU (at most 4), ranks as
// threads of the test process sharing an in-memory store. Without a usable device, SetUp() skips
// the test with the CUDA error and the NCCL version.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "backends/cuda/cuda_device.h"
#include "backends/nccl/nccl_backend.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"

namespace concord {
namespace nccl_testing {

using std::chrono::milliseconds;

// Completion of one launch, waited for by the test thread.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  DeviceBackend::Done Callback() {
    return [this](const Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      status = s;
      done = true;
      cv.notify_all();
    };
  }
  Status Wait(milliseconds limit = milliseconds(60000)) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return done; })) return TimeoutError("no completion");
    return status;
  }
};

class NcclBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<int> count = cuda::DeviceCount();
    if (!count.ok()) {
      GTEST_SKIP() << "no usable CUDA device: " << count.status().message() << "; NCCL "
                   << cuda::NcclVersion();
    }
    ranks_ = std::min(*count, 4);  // NCCL wants one GPU per rank of a communicator
  }

  // Starts one backend per rank (device = rank) and runs fn(rank, backend) on a thread each.
  void OnRanks(const std::function<void(int, DeviceBackend&)>& fn, int ranks = 0,
               milliseconds timeout = milliseconds(30000)) {
    ranks = ranks > 0 ? ranks : ranks_;
    HashStore store;
    harness::RunRanks(ranks, [&](int r) {
      BackendOptions o;
      o.rank = r;
      o.size = ranks;
      o.prefix = "test/" + std::to_string(prefix_);
      o.timeout = timeout;
      auto backend = CreateNcclBackend(r, o, &store);
      ASSERT_TRUE(backend.ok()) << backend.status().ToString();
      fn(r, **backend);
    });
    ++prefix_;
  }

  int ranks_ = 1;
  int prefix_ = 0;
};

}  // namespace nccl_testing
}  // namespace concord
