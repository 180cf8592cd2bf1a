// Gloo's pair connections during a start end when the store gives up (Store::GiveUp: a
// sub-communicator whose parent failed because a member died), instead of waiting out Gloo's
// initial-connect time (5 x the timeout). Rank 1 here is a member that published its address and
// died: its key names a listener of a device that is gone, at the highest port, so that rank 0 is
// the side that waits for the connection.
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/gloo/gloo_context.h"
#include "base/clock.h"
#include "rendezvous/hash_store.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

// A HashStore that gives up once give_up is set: the test's stand-in for a sub-communicator's view
// of its parent's store. Thread-safe.
class GivingUpStore : public HashStore {
 public:
  Status GiveUp() override {
    if (!give_up.load()) return Status::Ok();
    return Status(Code::kPeerFailure, "rank 1 closed its connection");
  }
  std::atomic<bool> give_up{false};
};

// The address rank 1 would have published for its pair with rank 0, with its port set to 65535:
// no one listens there, and rank 0's own address compares lower, so rank 0 waits to be connected.
std::string DeadPeerAddress() {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = device->createContext(1, 2);
  std::vector<char> bytes = context->createPair(0)->address().bytes();
  bytes[2] = static_cast<char>(0xff);  // sockaddr_in's sin_port, in network order
  bytes[3] = static_cast<char>(0xff);
  return std::string(bytes.begin(), bytes.end());
}

TEST(GlooGiveUpTest, PairConnectionsEndWhenTheStoreGivesUp) {
  GivingUpStore store;
  ASSERT_TRUE(store.Set("job/gloo/1/0", DeadPeerAddress()).ok());
  gloo_internal::GlooConnectOptions options;
  options.rank = 0;
  options.size = 2;
  options.host = "127.0.0.1";
  options.prefix = "job";
  options.timeout = milliseconds(4000);
  std::thread member_dies([&store] {
    std::this_thread::sleep_for(milliseconds(300));
    store.give_up = true;
  });
  const auto start = Clock::now();
  auto context = gloo_internal::ConnectGloo(options, &store);
  const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  member_dies.join();
  ASSERT_FALSE(context.ok());
  EXPECT_EQ(context.status().code(), Code::kPeerFailure) << context.status().ToString();
  EXPECT_NE(context.status().message().find("rank 1 closed its connection"), std::string::npos)
      << context.status().ToString();
  EXPECT_LT(elapsed, milliseconds(2000)) << context.status().ToString();
}

// A store that never gives up: two ranks connect as before.
TEST(GlooGiveUpTest, RanksConnectWhileTheStoreGoesOn) {
  GivingUpStore store;
  StatusOr<std::shared_ptr<gloo_internal::GlooContext>> contexts[2] = {InvalidArgument("not run"),
                                                                       InvalidArgument("not run")};
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      gloo_internal::GlooConnectOptions options;
      options.rank = rank;
      options.size = 2;
      options.host = "127.0.0.1";
      options.prefix = "job";
      options.timeout = milliseconds(5000);
      contexts[rank] = gloo_internal::ConnectGloo(options, &store);
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& c : contexts) EXPECT_TRUE(c.ok()) << c.status().ToString();
}

}  // namespace
}  // namespace concord
