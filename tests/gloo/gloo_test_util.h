// Helpers for the Gloo tests: run one function per rank on threads, each with its own backend over
// a shared in-memory store on 127.0.0.1.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/gloo/gloo_backend.h"
#include "rendezvous/hash_store.h"

namespace concord {
namespace testing_gloo {

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

}  // namespace testing_gloo
}  // namespace concord
