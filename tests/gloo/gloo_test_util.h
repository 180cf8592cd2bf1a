// Helpers for the Gloo tests: run one function per rank on threads, each with its own backend over
// a shared in-memory store on 127.0.0.1.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/gloo/gloo_backend.h"
#include "base/dtype.h"
#include "rendezvous/hash_store.h"
#include "tests/common/typed_elements.h"

namespace concord {
namespace testing_gloo {

inline constexpr DType kAllDTypes[] = {DType::kUint8,   DType::kInt8,    DType::kInt32,
                                       DType::kInt64,   DType::kFloat16, DType::kBFloat16,
                                       DType::kFloat32, DType::kFloat64};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                       ReduceOp::kMax, ReduceOp::kProduct};

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
      return is_unsigned ? 1 : -0.5;
    }
  }
  return 0;
}

inline double Expected(DType dtype, ReduceOp op, int size, size_t i) {
  double acc = Input(dtype, op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Input(dtype, op, r, i);
    acc = testing_elements::CombineValues(op, acc, v);
  }
  return acc;
}

// A prefix no other test in this process used.
inline std::string UniquePrefix() {
  static std::atomic<int> counter{0};
  return "test" + std::to_string(counter++);
}

// Creates `size` backends (one per thread, over one store), runs body(backend) on each thread and
// ends with a barrier. Failures of creation are reported through gtest and skip the body there.
inline void RunRanks(int size, const std::string& algorithm,
                     const std::function<void(Backend&)>& body,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      BackendOptions options;
      options.rank = rank;
      options.size = size;
      options.prefix = prefix;
      options.timeout = timeout;
      options.algorithm = algorithm;
      StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(options, &store);
      ASSERT_TRUE(backend.ok()) << "rank " << rank << ": " << backend.status().ToString();
      body(**backend);
      // Shut down collectively: Gloo's last sends may still be in flight when a collective
      // returns, and destroying the backend at once could cut them off for a slower peer.
      if (!::testing::Test::HasFailure()) {
        EXPECT_TRUE((*backend)->Barrier().ok());
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Two ranks run `op` once; then rank 1's backend goes away and rank 0 runs `op` again, which must
// fail (backend error or timeout) within `timeout` plus a second, with `mentions` in its message,
// and leave the backend refusing further calls with that same error.
inline void ExpectPeerGoneFails(
    const std::function<Status(Backend&)>& op, const std::string& mentions,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  std::atomic<bool> peer_gone{false};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      BackendOptions options;
      options.rank = rank;
      options.size = 2;
      options.prefix = prefix;
      options.timeout = timeout;
      StatusOr<std::unique_ptr<Backend>> created = CreateGlooBackend(options, &store);
      ASSERT_TRUE(created.ok()) << created.status().ToString();
      std::unique_ptr<Backend> backend = std::move(*created);
      ASSERT_TRUE(op(*backend).ok());
      ASSERT_TRUE(backend->Barrier().ok());
      if (rank == 1) {
        backend.reset();
        peer_gone = true;
        return;
      }
      while (!peer_gone) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
  for (auto& t : threads) t.join();
}

}  // namespace testing_gloo
}  // namespace concord
