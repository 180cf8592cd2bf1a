// What a communicator's start costs the rendezvous store while ranks wait for each other: each
// wait for a key is one request, parked in the server for the whole wait, whatever its length.
// A start's waits end on a peer's key or on the key where a rank publishes that its start failed
// (StartFailures); they used to ask for both every 100 ms, so every rank waiting for a late rank 0
// cost the store 20 requests a second (at thousands of ranks, tens of thousands a second). Ranks
// are threads (CreateCommunicator, core/bootstrap.h) over a TcpStoreServer served here, which
// counts the requests.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/bootstrap.h"
#include "rendezvous/tcp_store.h"
#include "tests/common/ranks.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

constexpr int kSize = 3;
constexpr milliseconds kLate{1500};
// Requests a start may make beyond the same start without a late rank: none are expected (the
// waits are parked, not repeated); a margin for a wait that ends in the instant between two
// requests. Asking every 100 ms, the two ranks that wait for rank 0 made about 60.
constexpr uint64_t kMargin = 6;

// Store requests of one start of kSize ranks, rank `late` starting `delay` after the others;
// every rank's start must succeed.
uint64_t StartRequests(const std::string& job, int late, milliseconds delay) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "startup-token");
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  if (!server.ok()) return 0;
  harness::RunRanks(kSize, [&](int r) {
    Config c;
    c.rank = r;
    c.size = kSize;
    c.store = "tcp://" + (*server)->address();
    c.token = "startup-token";
    c.job_id = job;
    c.lanes = 1;
    c.timeout_s = 30;
    if (r == late) std::this_thread::sleep_for(delay);
    StatusOr<Communicator> comm = CreateCommunicator(c);
    ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status().ToString();
  });
  return (*server)->requests();
}

// Ranks 1 and 2 wait for rank 0's settings and address: one request each, however long.
TEST(StartupStoreRequestsTest, RanksWaitingForALateRankZeroAskTheStoreOnce) {
  const uint64_t on_time = StartRequests("store-requests-on-time", 0, milliseconds(0));
  const uint64_t late = StartRequests("store-requests-late", 0, kLate);
  RecordProperty("requests_on_time", static_cast<int>(on_time));
  RecordProperty("requests_rank0_late", static_cast<int>(late));
  EXPECT_LE(late, on_time + kMargin) << "on time: " << on_time << ", rank 0 late: " << late;
}

}  // namespace
}  // namespace concord
