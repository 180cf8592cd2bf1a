// `n` TCP point-to-point transports (backends/p2p_transport.h) in one process, created
// collectively from threads as ranks would, meshed through an in-memory store. For unit tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "rendezvous/hash_store.h"

namespace concord {

// `direct`: payloads of at least `direct_min_bytes` are read from the sender's memory (all ranks
// share this process, so they share a host).
inline std::vector<std::unique_ptr<P2pTransport>> TcpP2pMesh(int n, bool direct = false,
                                                             uint64_t direct_min_bytes = 1000) {
  HashStore store;  // needed only while the transports connect
  std::vector<std::future<StatusOr<std::unique_ptr<P2pTransport>>>> made;
  for (int r = 0; r < n; ++r) {
    made.push_back(std::async(std::launch::async, [&store, r, n, direct, direct_min_bytes] {
      BackendOptions o;
      o.rank = r;
      o.size = n;
      o.prefix = "test/p2p";
      o.timeout = std::chrono::milliseconds(10000);
      P2pDirectReads reads;
      if (direct) reads = P2pDirectReads{"test-host", direct_min_bytes};
      return CreateTcpP2pTransport(o, &store, reads);
    }));
  }
  std::vector<std::unique_ptr<P2pTransport>> out;
  for (auto& f : made) {
    auto t = f.get();
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) out.push_back(std::move(*t));
  }
  return out;
}

}  // namespace concord
