// Tests of the hierarchical backend (backends/hierarchical) with ranks as threads: H hosts x L
// ranks, each rank with shared memory among its host's ranks, Gloo among the ranks of its local
// rank, and Gloo over all; every dtype, op and size (0, 1, odd, several chunks) through the three
// steps and below the threshold through the flat backend, against exactly computed results; the
// other collectives go to the flat backend.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "backends/gloo/gloo_backend.h"
#include "base/dtype.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"
#include "tests/common/tensors.h"
#include "tests/gloo/gloo_test_util.h"

namespace concord {
namespace {

using harness::kAllDTypes;
using harness::kAllReduceOps;
using harness::LoadElement;
using harness::StoreElement;
using testing_gloo::Expected;
using testing_gloo::Input;
using testing_gloo::Options;
using testing_gloo::UniquePrefix;

// Runs body on hosts x per_host ranks (consecutive ranks share a host), each with a hierarchical
// backend of the given threshold, and ends with a barrier.
void RunHierarchical(int hosts, int per_host, size_t threshold,
                     const std::function<void(Backend&)>& body) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  const auto timeout = std::chrono::milliseconds(20000);
  const int size = hosts * per_host;
  harness::RunRanks(size, [&](int rank) {
    const int host = rank / per_host, local = rank % per_host;
    auto shm =
        CreateShmBackend(Options(local, per_host, prefix + "/shm" + std::to_string(host), timeout),
                         &store, size_t{64} << 10, 0);
    ASSERT_TRUE(shm.ok()) << shm.status().ToString();
    auto cross = CreateGlooBackend(
        Options(host, hosts, prefix + "/cross" + std::to_string(local), timeout), &store);
    ASSERT_TRUE(cross.ok()) << cross.status().ToString();
    auto flat = CreateGlooBackend(Options(rank, size, prefix + "/flat", timeout), &store);
    ASSERT_TRUE(flat.ok()) << flat.status().ToString();
    std::unique_ptr<Backend> backend = CreateHierarchicalBackend(
        rank, size, std::move(*shm), std::move(*cross), std::move(*flat), threshold);
    EXPECT_FALSE(backend->ReducesInRankOrder());
    body(*backend);
    if (!::testing::Test::HasFailure()) {
      EXPECT_TRUE(backend->Barrier().ok());
    }
  });
}

// (hosts, ranks per host)
class HierarchicalBackendTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(HierarchicalBackendTest, AllreduceEveryDTypeOpAndSize) {
  const int hosts = std::get<0>(GetParam()), per_host = std::get<1>(GetParam());
  for (const size_t threshold : {size_t{0}, size_t{1} << 10}) {
    RunHierarchical(hosts, per_host, threshold, [&](Backend& backend) {
      for (DType dtype : kAllDTypes) {
        for (ReduceOp op : kAllReduceOps) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{70001}}) {
            std::vector<uint8_t> data(count * DTypeSize(dtype));
            for (size_t i = 0; i < count; ++i) {
              StoreElement(dtype, data.data(), i, Input(dtype, op, backend.rank(), i));
            }
            const Status s = backend.Allreduce(data.data(), count, dtype, op);
            ASSERT_TRUE(s.ok()) << s.ToString();
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(LoadElement(dtype, data.data(), i), Expected(dtype, op, backend.size(), i))
                  << DTypeName(dtype) << " " << ReduceOpName(op) << " count " << count
                  << " element " << i << " threshold " << threshold;
            }
          }
        }
      }
    });
  }
}

TEST_P(HierarchicalBackendTest, OtherCollectivesRunFlat) {
  const int hosts = std::get<0>(GetParam()), per_host = std::get<1>(GetParam());
  RunHierarchical(hosts, per_host, 0, [&](Backend& backend) {
    const int n = backend.size();
    std::vector<size_t> bytes(n, 3);
    std::vector<uint8_t> in(3, static_cast<uint8_t>(backend.rank())), out(3 * n);
    ASSERT_TRUE(backend.Allgatherv(in.data(), out.data(), bytes).ok());
    for (int r = 0; r < n; ++r) EXPECT_EQ(out[3 * r + 2], r);
    uint8_t b = backend.rank() == n - 1 ? 42 : 0;
    ASSERT_TRUE(backend.Broadcast(&b, 1, n - 1).ok());
    EXPECT_EQ(b, 42);
    std::vector<float> rs_in(2 * n, 1.0f), rs_out(2);
    ASSERT_TRUE(backend
                    .ReduceScatter(rs_in.data(), rs_out.data(), std::vector<size_t>(n, 2),
                                   DType::kFloat32, ReduceOp::kSum)
                    .ok());
    EXPECT_EQ(rs_out[1], static_cast<float>(n));
    std::vector<uint8_t> a_in(n), a_out(n);
    for (int r = 0; r < n; ++r) a_in[r] = static_cast<uint8_t>(backend.rank() * 16 + r);
    ASSERT_TRUE(backend
                    .Alltoallv(a_in.data(), std::vector<size_t>(n, 1), a_out.data(),
                               std::vector<size_t>(n, 1))
                    .ok());
    for (int r = 0; r < n; ++r) EXPECT_EQ(a_out[r], r * 16 + backend.rank());
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalBackendTest,
                         ::testing::Values(std::make_tuple(2, 2), std::make_tuple(2, 1),
                                           std::make_tuple(1, 3)),
                         [](const ::testing::TestParamInfo<HierarchicalBackendTest::ParamType>& i) {
                           return std::to_string(std::get<0>(i.param)) + "hosts_x" +
                                  std::to_string(std::get<1>(i.param));
                         });

}  // namespace
}  // namespace concord
