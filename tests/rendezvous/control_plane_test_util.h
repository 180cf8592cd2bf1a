// What the TCP control plane tests share: creating every rank's plane at once, and receiving
// until a failure.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "backends/tcp_control_plane.h"
#include "tests/common/ranks.h"

namespace concord::harness {

using Planes = std::vector<std::unique_ptr<ControlPlane>>;

// Creates all ranks' planes concurrently (the call is collective); options(r) gives rank r's.
inline Planes CreateAllPlanes(int size, Store* store,
                              const std::function<TcpControlPlaneOptions(int rank)>& options) {
  Planes planes(size);
  RunRanks(size, [&](int r) {
    auto p = CreateTcpControlPlane(options(r), store);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) planes[r] = std::move(p.value());
  });
  return planes;
}

// Calls Receive until it returns an error or the time runs out; returns the error.
inline Status ReceiveUntilError(ControlPlane* p, std::chrono::milliseconds within) {
  const Deadline deadline = Deadline::After(within);
  ControlMessage m;
  while (!deadline.passed()) {
    auto got = p->Receive(&m, deadline);
    if (!got.ok()) return got.status();
  }
  return Status::Ok();
}

}  // namespace concord::harness
