// Which device backend CONCORD_BACKEND starts (core/device_setup.h), on ranks as threads sharing an
// in-memory store. Written for a machine where NCCL cannot start (not built, or no usable GPU):
// every rank then publishes why, and all ranks make the same choice.
#include "core/device_setup.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/device_backend.h"
#include "core/comm_split.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"
#include "tests/common/temp_dir.h"

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

// Runs on every machine: a sub-communicator's device plane keeps its parent's GPU. Parent ranks 0
// and 1 (local ranks 0 and 1, one host) split in reverse order, so their local ranks swap in the
// sub-communicator; a split of that in its own order keeps the swapped local ranks. Both still
// pick the parent's local rank's GPU (before: their own local_rank, the other rank's GPU).
TEST(DeviceSetupSplitTest, SubCommunicatorKeepsTheParentsDevice) {
  harness::TempDir dir("concord_device_split_");
  ASSERT_FALSE(dir.path().empty());
  harness::RunRanks(2, [&](int r) {
    Config c;
    c.rank = r;
    c.size = 2;
    c.store = "file://" + dir.path();
    c.job_id = "device_split";
    c.lanes = 1;
    c.timeout_s = 20;
    StatusOr<Communicator> parent = CreateCommunicator(c);
    ASSERT_TRUE(parent.ok()) << parent.status().ToString();
    EXPECT_EQ(DeviceLocalRank(parent->engine->config()), r);
    StatusOr<Communicator> sub = SplitCommunicator(*parent->engine, *parent->origin, 0, -r);
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    const Config& sc = sub->engine->config();
    EXPECT_EQ(sc.local_rank, 1 - r);
    EXPECT_EQ(DeviceLocalRank(sc), r);
    StatusOr<Communicator> nested = SplitCommunicator(*sub->engine, *sub->origin, 0, sc.rank);
    ASSERT_TRUE(nested.ok()) << nested.status().ToString();
    EXPECT_EQ(nested->engine->config().local_rank, 1 - r);
    EXPECT_EQ(DeviceLocalRank(nested->engine->config()), r);
  });
}

}  // namespace
}  // namespace concord
