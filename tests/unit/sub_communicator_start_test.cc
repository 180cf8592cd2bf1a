// Starting a sub-communicator (core/comm_split.h; StartSubCommunicator, core/bootstrap.h) that
// fails on a setting, on 4 ranks as threads over a file store. Ranks 0 and 1 say they are on host
// A, ranks 2 and 3 on host B (CONCORD_HOST_ID), with CONCORD_SHM = on: the world is 2 hosts x 2
// ranks (hierarchical), but a sub-communicator of 2 ranks of A and 1 of B is refused by every
// member, naming a rank of the other host. A member whose start fails before its control plane is
// up (it cannot listen, or its settings differ) publishes its failure, and the other members fail
// well within the timeout (20 s), naming it by its world rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/comm_split.h"
#include "tests/common/ranks.h"
#include "tests/common/temp_dir.h"

namespace concord {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int kSize = 4;
// A refused start returns at once: well below kParentGrace (500 ms), which every failed start
// waited whatever its failure, yet a generous bound for a loaded machine (the split's exchange
// and a control plane among 3 ranks come first; about 5 ms here).
constexpr milliseconds kAtOnce{300};
// The others learnt of a member's failure; they did not wait out the timeout (20 s). The failing
// member itself waits kParentGrace (500 ms) for a parent failure first.
constexpr milliseconds kWellUnderTimeout{5000};
// An address no interface of this host has (TEST-NET-1, RFC 5737): listening on it fails at once.
constexpr char kUnbindableHost[] = "192.0.2.1";

// Runs `body(rank, world)` on kSize ranks, each with its world communicator (CONCORD_SHM = on,
// ranks 0 and 1 on host A, 2 and 3 on host B).
void OnWorld(const std::string& job, const std::function<void(int, Communicator&)>& body) {
  harness::TempDir dir("concord_sub_start_");
  ASSERT_FALSE(dir.path().empty());
  harness::RunRanks(kSize, [&](int r) {
    Config c;
    c.rank = r;
    c.size = kSize;
    c.store = "file://" + dir.path();
    c.job_id = job;
    c.lanes = 1;
    c.timeout_s = 20;
    c.shm = "on";
    c.host_id = r < 2 ? "sub-start-host-A" : "sub-start-host-B";
    StatusOr<Communicator> world = CreateCommunicator(c);
    ASSERT_TRUE(world.ok()) << world.status().ToString();
    body(r, *world);
  });
}

// CreateGroupCommunicator on `parent` with `ranks`, every rank of it at once (`start`: a latch of
// its size); *took: how long the call took.
StatusOr<Communicator> TimedGroup(Communicator& parent, const std::vector<int>& ranks,
                                  harness::Latch& start, milliseconds* took) {
  start.CountDown();
  EXPECT_TRUE(start.Wait());
  const auto t0 = steady_clock::now();
  StatusOr<Communicator> sub = CreateGroupCommunicator(*parent.engine, *parent.origin, ranks.data(),
                                                       static_cast<int>(ranks.size()));
  *took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0);
  return sub;
}

// What world rank `r` got from a group of world ranks 1, 0 and 3 in that order (hosts A, A, B),
// in `took`: world rank 2, outside, no communicator; the members, CONCORD_SHM = on refused at
// once, naming the rank of the other host with its world rank.
void ExpectRefusedOnHostB(int r, const StatusOr<Communicator>& sub, milliseconds took) {
  if (r == 2) {
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    EXPECT_EQ(sub->engine, nullptr);
    return;
  }
  ASSERT_FALSE(sub.ok());
  EXPECT_EQ(sub.status().code(), Code::kInvalidArgument) << sub.status().ToString();
  EXPECT_LT(took.count(), kAtOnce.count()) << sub.status().ToString();
  const std::string want = r == 3 ? "rank 0 (world rank 1) runs on another host"
                                  : "rank 2 (world rank 3) runs on another host";
  EXPECT_NE(sub.status().message().find(want), std::string::npos) << sub.status().ToString();
}

// The group {1, 0, 3}: its rank 2 (world rank 3) is on host B, its ranks 0 and 1 on A. Every
// member's start refuses CONCORD_SHM = on at once (it waited 500 ms for a parent failure, as if a
// member might have died), and names the other host's rank with its world rank (it named only
// the sub-communicator's rank).
TEST(SubCommunicatorStartTest, RefusedSettingFailsAtOnceNamingTheWorldRank) {
  harness::Latch start(kSize);
  OnWorld("sub_start_refused", [&](int r, Communicator& world) {
    milliseconds took{0};
    StatusOr<Communicator> sub = TimedGroup(world, {1, 0, 3}, start, &took);
    ExpectRefusedOnHostB(r, sub, took);
  });
}

// Nested: the world in reverse ({3, 2, 1, 0}: hosts B, B, A, A, which CONCORD_SHM = on takes),
// then its group {2, 3, 0}: parent ranks 2, 3, 0 are world ranks 1, 0, 3. The names are the
// world's, not the parent's.
TEST(SubCommunicatorStartTest, NestedRefusalNamesTheWorldRankNotTheParents) {
  harness::Latch reverse_start(kSize);
  harness::Latch start(kSize);
  OnWorld("sub_start_nested", [&](int r, Communicator& world) {
    milliseconds took{0};
    StatusOr<Communicator> reversed = TimedGroup(world, {3, 2, 1, 0}, reverse_start, &took);
    ASSERT_TRUE(reversed.ok()) << reversed.status().ToString();
    StatusOr<Communicator> sub = TimedGroup(*reversed, {2, 3, 0}, start, &took);
    ExpectRefusedOnHostB(r, sub, took);
  });
}

// Arguments the split itself refuses (a repeated rank, a rank out of range) never reach the start:
// every rank fails at once, with no wait.
TEST(SubCommunicatorStartTest, RefusedRankListFailsAtOnce) {
  const std::vector<std::vector<int>> lists = {{0, 2, 2}, {0, kSize}, {-1, 1}};
  std::deque<harness::Latch> starts;  // not movable: a deque does not move them
  for (size_t i = 0; i < lists.size(); ++i) starts.emplace_back(kSize);
  OnWorld("sub_start_list", [&](int, Communicator& world) {
    for (size_t i = 0; i < lists.size(); ++i) {
      milliseconds took{0};
      StatusOr<Communicator> sub = TimedGroup(world, lists[i], starts[i], &took);
      ASSERT_FALSE(sub.ok()) << "list " << i;
      EXPECT_EQ(sub.status().code(), Code::kInvalidArgument) << sub.status().ToString();
      EXPECT_LT(took.count(), kAtOnce.count()) << sub.status().ToString();
    }
  });
}

// What a member got when member `failed` (its sub-communicator rank, and world rank
// `failed_world`) failed to start on its own: well within the timeout, kPeerFailure naming that
// member by its world rank and its error (`its_error` in it).
void ExpectFailedWith(int r, const StatusOr<Communicator>& sub, milliseconds took, int failed,
                      int failed_world, const std::string& its_error) {
  ASSERT_FALSE(sub.ok()) << "world rank " << r;
  EXPECT_EQ(sub.status().code(), Code::kPeerFailure) << sub.status().ToString();
  EXPECT_LT(took.count(), kWellUnderTimeout.count()) << sub.status().ToString();
  const std::string named = "rank " + std::to_string(failed) + " (world rank " +
                            std::to_string(failed_world) + ") failed to start: ";
  const size_t at = sub.status().message().find(named);
  EXPECT_NE(at, std::string::npos) << sub.status().ToString();
  EXPECT_NE(sub.status().message().find(its_error, at), std::string::npos)
      << sub.status().ToString();
}

// The group {1, 0, 3, 2} (hosts A, A, B, B, which CONCORD_SHM = on takes): its rank 0, world rank
// 1, cannot listen for its control plane (on the address its world communicator advertises, made
// one this host does not have, on world rank 1 alone), after it published the settings. The other
// members, waiting for its address, fail well within the timeout naming it by its world rank (they
// waited out the timeout).
TEST(SubCommunicatorStartTest, RankZeroThatCannotListenFailsTheOthersAtOnce) {
  harness::Latch start(kSize);
  OnWorld("sub_start_unbindable", [&](int r, Communicator& world) {
    if (r == 1) world.origin->host = kUnbindableHost;
    milliseconds took{0};
    StatusOr<Communicator> sub = TimedGroup(world, {1, 0, 3, 2}, start, &took);
    if (r == 1) {
      ASSERT_FALSE(sub.ok());
      EXPECT_NE(sub.status().message().find(kUnbindableHost), std::string::npos)
          << sub.status().ToString();
      return;
    }
    ExpectFailedWith(r, sub, took, 0, 1, kUnbindableHost);
  });
}

// The group {1, 0, 3, 2}: its rank 1, world rank 0, connects its control plane to rank 0 (which
// needs no listener of its own), then cannot listen for its lane's connections (on the address its
// world communicator advertises, made one this host does not have). The other members fail well
// within the timeout naming it by its world rank and why (they named it, as closing its
// connection, but not why: a failure after the control plane is up was not published).
TEST(SubCommunicatorStartTest, MemberThatCannotListenAfterConnectingFailsTheOthersWithItsError) {
  harness::Latch start(kSize);
  OnWorld("sub_start_unbindable_member", [&](int r, Communicator& world) {
    if (r == 0) world.origin->host = kUnbindableHost;
    milliseconds took{0};
    StatusOr<Communicator> sub = TimedGroup(world, {1, 0, 3, 2}, start, &took);
    if (r == 0) {
      ASSERT_FALSE(sub.ok());
      EXPECT_NE(sub.status().message().find(kUnbindableHost), std::string::npos)
          << sub.status().ToString();
      EXPECT_NE(sub.status().code(), Code::kPeerFailure) << sub.status().ToString();
      return;
    }
    ExpectFailedWith(r, sub, took, 1, 0, kUnbindableHost);
  });
}

// A member other than rank 0 whose start fails before it connects its control plane: its settings
// differ from its rank 0's (StartSubCommunicator called directly: a split gives every member the
// parent's settings). Rank 0, waiting for its connection, fails well within the timeout naming it
// by its world rank, and so do the others, which had connected to rank 0 (they waited out the
// timeout).
TEST(SubCommunicatorStartTest, MemberThatFailsBeforeConnectingFailsTheOthersAtOnce) {
  const std::vector<int> members = {1, 0, 3, 2};  // world ranks, in the sub-communicator's order
  constexpr int kBad = 3;                         // world rank 2
  harness::Latch start(kSize);
  OnWorld("sub_start_settings", [&](int r, Communicator& world) {
    Config config = world.engine->config();
    config.rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    if (config.rank == kBad) config.lanes = 2;
    start.CountDown();
    ASSERT_TRUE(start.Wait());
    const auto t0 = steady_clock::now();
    StatusOr<Communicator> sub =
        StartSubCommunicator(config, *world.origin, world.origin->prefix + "/settings_differ",
                             members, [&world] { return world.engine->failure(); });
    const auto took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0);
    if (config.rank == kBad) {
      ASSERT_FALSE(sub.ok());
      EXPECT_EQ(sub.status().code(), Code::kInvalidArgument) << sub.status().ToString();
      return;
    }
    ExpectFailedWith(r, sub, took, kBad, 2, "CONCORD_LANES must be the same on every rank");
  });
}

}  // namespace
}  // namespace concord
