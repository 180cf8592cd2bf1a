// What connecting a Gloo full mesh (GlooContext::ConnectFullMesh) costs the rendezvous store: each
// rank must fetch only the addresses meant for it, size - 1 of them, in size - 1 requests. Gloo's
// own connectFullMesh has each rank fetch every peer's whole list of addresses, so the store
// served size^3 addresses (at 512 ranks, about 18 GB through one server). Ranks are threads over
// one in-memory store that counts what it serves.
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/gloo/gloo_context.h"
#include "rendezvous/hash_store.h"

namespace concord {
namespace {

// A HashStore that counts its Get requests and the bytes they return. Thread-safe.
class CountingStore : public HashStore {
 public:
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override {
    StatusOr<std::string> value = HashStore::Get(key, deadline);
    gets.fetch_add(1);
    if (value.ok()) bytes.fetch_add(value->size());
    return value;
  }
  std::atomic<uint64_t> gets{0};
  std::atomic<uint64_t> bytes{0};
};

// The length of one TCP pair's address, as ConnectFullMesh publishes it.
size_t AddressBytes() {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  return device->createContext(0, 2)->createPair(1)->address().bytes().size();
}

class GlooMeshStoreTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooMeshStoreTest, EachRankFetchesOnlyTheAddressesMeantForIt) {
  const int size = GetParam();
  CountingStore store;
  std::vector<Status> connected(static_cast<size_t>(size), InvalidArgument("not run"));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      gloo_internal::GlooConnectOptions options;
      options.rank = rank;
      options.size = size;
      options.host = "127.0.0.1";
      options.prefix = "job";
      options.timeout = std::chrono::milliseconds(20000);
      connected[static_cast<size_t>(rank)] = gloo_internal::ConnectGloo(options, &store).status();
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(connected[static_cast<size_t>(rank)].ok())
        << "rank " << rank << ": " << connected[static_cast<size_t>(rank)].ToString();
  }
  const uint64_t pairs = static_cast<uint64_t>(size) * static_cast<uint64_t>(size - 1);
  EXPECT_EQ(store.gets.load(), pairs);
  EXPECT_EQ(store.bytes.load(), pairs * AddressBytes())
      << "addresses fetched: " << store.bytes.load() / AddressBytes() << " for " << pairs
      << " pairs' ends";
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooMeshStoreTest, ::testing::Values(1, 2, 5, 8));

}  // namespace
}  // namespace concord
