// The hierarchical lanes' Gloo backend across hosts (core/lane_backends.cc) names its ranks by
// their ranks in the communicator (BackendOptions::rank_names), not by their hosts' numbers.
// Ranks as threads over one in-memory store, on pretend hosts (Config::host_id).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/lane_backends.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"
#include "tests/gloo/gloo_test_util.h"

namespace concord {
namespace {

// Four ranks on two interleaved hosts (ranks 0 and 2 on host "a", 1 and 3 on "b"), so that the
// backend across hosts of the second rank of each host has ranks 2 and 3 as its ranks 0 and 1.
// Rank 2's lane goes away; rank 3's broadcast from rank 0 starts with the broadcast across hosts
// of its host's part from rank 2, which fails at once (rank 2's connections closed) naming rank 2
// as the sender and rank 3 as the rank that failed, where it said "from rank 0 on rank 1". The
// other ranks' broadcasts wait for the gone rank until the 2 s timeout (shared memory cannot see
// a thread leave): any error will do there.
TEST(LaneCrossNamesTest, BackendAcrossHostsNamesTheCommunicatorsRanks) {
  HashStore store;
  const std::string prefix = testing_gloo::UniquePrefix();
  harness::Latch gone(1);
  harness::RunRanks(4, [&](int rank) {
    Config config;
    config.rank = rank;
    config.size = 4;
    config.backend = "gloo";
    config.host_id = prefix + (rank % 2 == 0 ? "a" : "b");
    config.hierarchical = "on";
    config.hierarchical_threshold_bytes = 0;
    config.lanes = 1;
    config.log_level = 0;
    const BackendOptions options =
        testing_gloo::Options(rank, 4, prefix + "/gloo", std::chrono::milliseconds(2000));
    auto lanes = CreateLaneBackends(config, options, &store, prefix + "/lanes",
                                    Deadline::After(std::chrono::seconds(20)));
    ASSERT_TRUE(lanes.ok()) << lanes.status().ToString();
    ASSERT_EQ(lanes->size(), 1u);
    std::unique_ptr<Backend> backend = std::move(lanes->front());
    ASSERT_TRUE(backend->Barrier().ok());
    if (rank == 2) {
      backend.reset();
      gone.CountDown();
      return;
    }
    ASSERT_TRUE(gone.Wait());
    std::vector<char> data(4096, 1);
    const Status status = backend->Broadcast(data.data(), data.size(), 0);
    EXPECT_FALSE(status.ok());
    if (rank == 3) {
      EXPECT_NE(status.message().find("gloo broadcast (2048 bytes from rank 2) on rank 3 failed"),
                std::string::npos)
          << status.ToString();
    }
  });
}

}  // namespace
}  // namespace concord
