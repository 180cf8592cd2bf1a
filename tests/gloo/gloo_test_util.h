// Helpers for the Gloo tests: inputs whose every reduction is exact, and ranks as threads
// (tests/common/ranks.h), each with its own backend over a shared in-memory store on 127.0.0.1.
#pragma once

#include <gloo/barrier.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/gloo/gloo_backend.h"
#include "backends/gloo/gloo_context.h"
#include "base/dtype.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"
#include "tests/common/tensors.h"

namespace concord {
namespace testing_gloo {

// Rank r's i-th input. Chosen so that every result is exact in every dtype with up to 4 ranks:
// sums stay below 32, products are powers of two up to 16, halves appear only in float types.
inline double Input(DType dtype, ReduceOp op, int rank, size_t i) {
  const bool fp = IsFloatingPoint(dtype);
  const bool is_unsigned = dtype == DType::kUint8;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: {
      const double v = static_cast<double>((i * 7 + rank * 3) % 8);
      return fp ? v - 3.5 : v;
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const double v = static_cast<double>((i * 13 + rank * 7) % 11) - (is_unsigned ? 0 : 5);
      return fp ? v / 2 : v;
    }
    case ReduceOp::kProduct: {
      const size_t k = (i + rank) % 3;
      if (k == 0) return 2;
      if (k == 1 || !fp) return 1;
      return -0.5;
    }
  }
  return 0;
}

inline double Expected(DType dtype, ReduceOp op, int size, size_t i) {
  return harness::ReduceOverRanks(op, size, [&](int rank) { return Input(dtype, op, rank, i); });
}

// A prefix no other test in this process used.
inline std::string UniquePrefix() {
  static std::atomic<int> counter{0};
  return "test" + std::to_string(counter++);
}

// Options for `rank` of a job of `size` ranks rendezvousing under `prefix`.
inline BackendOptions Options(int rank, int size, const std::string& prefix,
                              std::chrono::milliseconds timeout,
                              const std::string& algorithm = "auto") {
  BackendOptions options;
  options.rank = rank;
  options.size = size;
  options.prefix = prefix;
  options.timeout = timeout;
  options.algorithm = algorithm;
  return options;
}

// Runs body(context, rank) on `size` ranks, each with its own Gloo context over one store (for the
// layers below the backend), and ends with a barrier (see RunRanks). A rank whose context cannot
// be created fails the test and skips the body.
inline void RunContextRanks(
    int size,
    const std::function<void(const std::shared_ptr<gloo_internal::GlooContext>&, int rank)>& body) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  harness::RunRanks(size, [&](int rank) {
    gloo_internal::GlooConnectOptions options;
    options.rank = rank;
    options.size = size;
    options.prefix = prefix;
    options.timeout = std::chrono::milliseconds(20000);
    StatusOr<std::shared_ptr<gloo_internal::GlooContext>> context =
        gloo_internal::ConnectGloo(options, &store);
    ASSERT_TRUE(context.ok()) << context.status().ToString();
    body(*context, rank);
    if (!::testing::Test::HasFailure()) {
      gloo::BarrierOptions barrier(*context);
      gloo::barrier(barrier);
    }
  });
}

// Creates `size` backends (one per rank, over one store), runs body(backend) on each rank and
// ends with a barrier. A rank whose backend cannot be created fails the test and skips the body.
inline void RunRanks(int size, const std::string& algorithm,
                     const std::function<void(Backend&)>& body) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  harness::RunRanks(size, [&](int rank) {
    StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(
        Options(rank, size, prefix, std::chrono::milliseconds(20000), algorithm), &store);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    body(**backend);
    // Shut down collectively: Gloo's last sends may still be in flight when a collective
    // returns, and destroying the backend at once could cut them off for a slower peer.
    if (!::testing::Test::HasFailure()) {
      EXPECT_TRUE((*backend)->Barrier().ok());
    }
  });
}

// Two ranks run `op` once; then rank 1's backend goes away and rank 0 runs `op` again, which must
// fail (backend error or timeout) within the backends' 2 s timeout plus a second, with `mentions`
// in its message, and leave the backend refusing further calls with that same error.
inline void ExpectPeerGoneFails(const std::function<Status(Backend&)>& op,
                                const std::string& mentions) {
  const std::chrono::milliseconds timeout(2000);
  HashStore store;
  const std::string prefix = UniquePrefix();
  harness::Latch peer_gone(1);
  harness::RunRanks(2, [&](int rank) {
    StatusOr<std::unique_ptr<Backend>> created =
        CreateGlooBackend(Options(rank, 2, prefix, timeout), &store);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    std::unique_ptr<Backend> backend = std::move(*created);
    ASSERT_TRUE(op(*backend).ok());
    ASSERT_TRUE(backend->Barrier().ok());
    if (rank == 1) {
      backend.reset();
      peer_gone.CountDown();
      return;
    }
    ASSERT_TRUE(peer_gone.Wait()) << "rank 1's backend was never destroyed";
    const auto start = std::chrono::steady_clock::now();
    const Status status = op(*backend);
    EXPECT_LT(std::chrono::steady_clock::now() - start, timeout + std::chrono::seconds(1));
    EXPECT_TRUE(status.code() == Code::kBackendError || status.code() == Code::kTimeout)
        << status.ToString();
    EXPECT_NE(status.message().find(mentions), std::string::npos) << status.ToString();
    const Status again = backend->Barrier();
    EXPECT_EQ(again.code(), status.code());
    EXPECT_EQ(again.message(), status.message());
  });
}

}  // namespace testing_gloo
}  // namespace concord
