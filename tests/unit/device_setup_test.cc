// Which device backend CONCORD_BACKEND starts (core/device_setup.h), on ranks as threads sharing an
// in-memory store. Written for a machine where NCCL cannot start (not built, or no usable GPU):
// every rank then publishes why, and all ranks make the same choice.
#include "core/device_setup.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/device_backend.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"

namespace concord {
namespace {

// Runs StartDevicePlane on `size` ranks with `backend`; returns each rank's result.
std::vector<StatusOr<DevicePlane>> StartOnRanks(int size, const std::string& backend) {
  HashStore store;
  std::vector<StatusOr<DevicePlane>> results;
  for (int r = 0; r < size; ++r) results.emplace_back(Status(Code::kInternal, "not run"));
  harness::RunRanks(size, [&](int r) {
    Config c;
    c.rank = r;
    c.size = size;
    c.local_rank = r;
    c.backend = backend;
    BackendOptions o;
    o.rank = r;
    o.size = size;
    o.prefix = "job/comm0/" + backend;
    results[r] = StartDevicePlane(c, o, &store, Deadline::After(std::chrono::seconds(10)));
  });
  return results;
}

class DeviceSetupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<int> probe = ProbeDeviceBackend("nccl", 0);
    if (probe.ok()) GTEST_SKIP() << "NCCL can start here: these cases need a machine where not";
    why_ = probe.status().message();
  }
  std::string why_;  // this machine's reason
};

TEST_F(DeviceSetupTest, GlooStartsNoDeviceBackend) {
  for (auto& r : StartOnRanks(2, "gloo")) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->backend, nullptr);
    EXPECT_EQ(r->unavailable.code(), Code::kUnavailable);
    const std::string& m = r->unavailable.message();
    EXPECT_TRUE(m.find("CONCORD_BACKEND=gloo starts no GPU backend") != std::string::npos ||
                m.find("built without a GPU backend") != std::string::npos)
        << m;
  }
}

// Runs on every machine: an MPI communicator never has a device backend, and says what to set.
TEST(MpiDevicePlaneTest, SaysWhyAndWhatToSetInstead) {
  for (const char* backend : {"mpi", "auto"}) {
    Config c;
    c.backend = backend;
    const DevicePlane plane = MpiDevicePlane(c);
    EXPECT_EQ(plane.backend, nullptr);
    EXPECT_EQ(plane.unavailable.code(), Code::kUnavailable);
    const std::string& m = plane.unavailable.message();
    if (BuiltDeviceBackends().empty()) {
      EXPECT_NE(m.find("built without a GPU backend"), std::string::npos) << m;
      continue;
    }
    EXPECT_NE(m.find(std::string("CONCORD_BACKEND=") + backend), std::string::npos) << m;
    EXPECT_NE(m.find("set CONCORD_BACKEND=nccl"), std::string::npos) << m;
    EXPECT_EQ(m.find("chose mpi") != std::string::npos, std::string(backend) == "auto") << m;
  }
}

TEST_F(DeviceSetupTest, AutoStartsWithoutOneAndKeepsTheReason) {
  for (auto& r : StartOnRanks(3, "auto")) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->backend, nullptr);
    EXPECT_EQ(r->unavailable.code(), Code::kUnavailable);
    // Every rank names the same first rank that cannot start it, and why.
    EXPECT_NE(r->unavailable.message().find("cannot start on rank 0: " + why_), std::string::npos)
        << r->unavailable.message();
  }
}

TEST_F(DeviceSetupTest, NcclIsAnErrorAtInitOnEveryRank) {
  for (auto& r : StartOnRanks(2, "nccl")) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kUnavailable);
    EXPECT_NE(r.status().message().find("CONCORD_BACKEND=nccl"), std::string::npos);
    EXPECT_NE(r.status().message().find(why_), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace concord
