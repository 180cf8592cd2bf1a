// Tests of the hierarchical backend (backends/hierarchical) with ranks as threads: H hosts x L
// ranks (a host's ranks consecutive or interleaved), each rank with shared memory among its host's
// ranks, Gloo among the ranks of its local rank, and Gloo over all: allreduce in every dtype, op
// and size (0, 1, odd, several chunks), allgatherv with uneven and empty blocks, broadcast from
// every root, above the threshold in two levels and below it on the flat backend, against exactly
// computed results; the other collectives on the flat backend. With stand-in backends: which
// backend each call goes to, that the first error is returned by every later call, that bad
// allreduce arguments reach none, and the checks of the layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
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

// A layout: every rank's host (hosts numbered by their lowest rank, each with the same number of
// ranks, as core/lane_backends.cc's ExchangeHostLayout gives them).
struct Layout {
  std::string name;
  std::vector<int> host_of;
};
void PrintTo(const Layout& layout, std::ostream* os) {
  *os << layout.name;
}

// Runs body on the layout's ranks, each with a hierarchical backend of the given threshold (shared
// memory among its host's ranks, Gloo among the ranks of its local rank, Gloo over all), and ends
// with a barrier.
void RunHierarchical(const Layout& layout, size_t threshold,
                     const std::function<void(Backend&)>& body) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  const auto timeout = std::chrono::milliseconds(20000);
  const int size = static_cast<int>(layout.host_of.size());
  const int hosts = *std::max_element(layout.host_of.begin(), layout.host_of.end()) + 1;
  const int per_host = size / hosts;
  harness::RunRanks(size, [&](int rank) {
    const int host = layout.host_of[rank];
    const int local =
        static_cast<int>(std::count(layout.host_of.begin(), layout.host_of.begin() + rank, host));
    auto shm =
        CreateShmBackend(Options(local, per_host, prefix + "/shm" + std::to_string(host), timeout),
                         &store, size_t{64} << 10, 0);
    ASSERT_TRUE(shm.ok()) << shm.status().ToString();
    auto cross = CreateGlooBackend(
        Options(host, hosts, prefix + "/cross" + std::to_string(local), timeout), &store);
    ASSERT_TRUE(cross.ok()) << cross.status().ToString();
    auto flat = CreateGlooBackend(Options(rank, size, prefix + "/flat", timeout), &store);
    ASSERT_TRUE(flat.ok()) << flat.status().ToString();
    auto backend = CreateHierarchicalBackend(rank, layout.host_of, std::move(*shm),
                                             std::move(*cross), std::move(*flat), threshold);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    EXPECT_FALSE((*backend)->ReducesInRankOrder());
    body(**backend);
    if (!::testing::Test::HasFailure()) {
      EXPECT_TRUE((*backend)->Barrier().ok());
    }
  });
}

// Rank r's i-th byte of a collective's `call`-th input: differs between ranks, positions and calls.
uint8_t Byte(int rank, size_t i, int call) {
  return static_cast<uint8_t>(rank * 131 + i * 7 + call * 29 + 1);
}

// The allreduce does not depend on where a host's ranks are (HierarchicalBackendTest has more
// layouts).
class HierarchicalAllreduceTest : public ::testing::TestWithParam<Layout> {};
class HierarchicalBackendTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalAllreduceTest, EveryDTypeOpAndSize) {
  for (const size_t threshold : {size_t{0}, size_t{1} << 10}) {
    RunHierarchical(GetParam(), threshold, [&](Backend& backend) {
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

// Uneven blocks, zero-length ones among them, with totals below and above 1 KiB: every rank's
// block in rank order, byte for byte.
void CheckAllgatherv(Backend& backend, size_t threshold) {
  const std::vector<std::function<size_t(int rank)>> patterns = {
      [](int) { return size_t{0}; },
      [](int r) { return size_t(r % 2 == 0 ? 0 : 5); },
      [](int r) { return size_t(r * 3 + 1); },
      [](int r) { return size_t(r == 0 ? 0 : 70001 + r * 13); },
      [](int r) { return size_t(r == 1 ? 4099 : 0); },
  };
  const int n = backend.size();
  for (size_t p = 0; p < patterns.size(); ++p) {
    const int call = static_cast<int>(p);
    std::vector<size_t> bytes(n);
    std::vector<uint8_t> expected;
    for (int r = 0; r < n; ++r) {
      bytes[r] = patterns[p](r);
      for (size_t i = 0; i < bytes[r]; ++i) expected.push_back(Byte(r, i, call));
    }
    std::vector<uint8_t> in(bytes[backend.rank()]);
    for (size_t i = 0; i < in.size(); ++i) in[i] = Byte(backend.rank(), i, call);
    std::vector<uint8_t> out(expected.size(), 0xEE);
    const Status s = backend.Allgatherv(in.data(), out.data(), bytes);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(out == expected) << "allgatherv pattern " << p << " threshold " << threshold;
  }
}

// Every root, sizes 0, 1, odd, several shared-memory chunks.
void CheckBroadcast(Backend& backend, size_t threshold) {
  int call = 0;
  for (int root = 0; root < backend.size(); ++root) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{70001}}) {
      ++call;
      std::vector<uint8_t> expected(bytes), data(bytes, 0xEE);
      for (size_t i = 0; i < bytes; ++i) expected[i] = Byte(root, i, call);
      if (backend.rank() == root) data = expected;
      const Status s = backend.Broadcast(data.data(), bytes, root);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_TRUE(data == expected)
          << "broadcast root " << root << " bytes " << bytes << " threshold " << threshold;
    }
  }
}

// Reduce-scatter and all-to-all, which run flat.
void CheckFlatCollectives(Backend& backend) {
  const int n = backend.size();
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
}

// One set-up per threshold (set-ups cost more than these collectives): threshold 0 takes every
// allgatherv and broadcast through the two levels, 1 KiB the small ones through the flat backend.
TEST_P(HierarchicalBackendTest, AllgathervBroadcastAndFlatCollectives) {
  for (const size_t threshold : {size_t{0}, size_t{1} << 10}) {
    RunHierarchical(GetParam(), threshold, [&](Backend& backend) {
      ASSERT_NO_FATAL_FAILURE(CheckAllgatherv(backend, threshold));
      ASSERT_NO_FATAL_FAILURE(CheckBroadcast(backend, threshold));
      CheckFlatCollectives(backend);
    });
  }
}

// A stand-in backend of `size` ranks: moves no data, appends "<name>.<call>" to a shared log, and
// fails the call named `fail` (as "<name>.<call>") with a peer failure.
class StandIn : public Backend {
 public:
  StandIn(std::string name, int rank, int size, std::vector<std::string>* log, std::string fail)
      : name_(std::move(name)), rank_(rank), size_(size), log_(log), fail_(std::move(fail)) {}
  const char* name() const override { return name_.c_str(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Allreduce(void*, size_t, DType, ReduceOp) override { return Call("Allreduce"); }
  Status Allgatherv(const void*, void*, const std::vector<size_t>&) override {
    return Call("Allgatherv");
  }
  Status Broadcast(void*, size_t, int) override { return Call("Broadcast"); }
  Status Barrier() override { return Call("Barrier"); }
  Status ReduceScatter(const void*, void*, const std::vector<size_t>&, DType, ReduceOp) override {
    return Call("ReduceScatter");
  }
  Status Alltoallv(const void*, const std::vector<size_t>&, void*,
                   const std::vector<size_t>&) override {
    return Call("Alltoallv");
  }

 private:
  Status Call(const std::string& call) {
    log_->push_back(name_ + "." + call);
    if (log_->back() == fail_) return Status(Code::kPeerFailure, "stand-in " + fail_ + " failed");
    return Status::Ok();
  }
  const std::string name_;
  const int rank_, size_;
  std::vector<std::string>* const log_;
  const std::string fail_;
};

// Rank `rank` of `host_of` (one rank per host) on stand-ins, threshold 100 bytes.
std::unique_ptr<Backend> OnStandIns(int rank, const std::vector<int>& host_of,
                                    std::vector<std::string>* log, const std::string& fail = "") {
  const int size = static_cast<int>(host_of.size());
  auto made =
      CreateHierarchicalBackend(rank, host_of, std::make_unique<StandIn>("local", 0, 1, log, fail),
                                std::make_unique<StandIn>("cross", host_of[rank], size, log, fail),
                                std::make_unique<StandIn>("flat", rank, size, log, fail), 100);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return made.ok() ? std::move(*made) : nullptr;
}

using Log = std::vector<std::string>;

TEST(HierarchicalRouting, ThresholdPicksTwoLevelsOrFlat) {
  Log log;
  std::unique_ptr<Backend> b = OnStandIns(1, {0, 1}, &log);
  ASSERT_NE(b, nullptr);
  std::vector<uint8_t> buf(200);
  auto calls = [&](const std::function<Status()>& f) {
    log.clear();
    EXPECT_TRUE(f().ok());
    return log;
  };
  EXPECT_EQ(calls([&] { return b->Allreduce(buf.data(), 24, DType::kFloat32, ReduceOp::kSum); }),
            Log{"flat.Allreduce"});
  EXPECT_EQ(calls([&] { return b->Allreduce(buf.data(), 25, DType::kFloat32, ReduceOp::kSum); }),
            (Log{"local.ReduceScatter", "cross.Allreduce", "local.Allgatherv"}));
  EXPECT_EQ(calls([&] {
              return b->Allgatherv(buf.data(), buf.data(), {50, 49});
            }),
            Log{"flat.Allgatherv"});
  EXPECT_EQ(calls([&] {
              return b->Allgatherv(buf.data(), buf.data(), {0, 100});
            }),
            (Log{"local.Alltoallv", "cross.Allgatherv", "local.Allgatherv"}));
  EXPECT_EQ(calls([&] { return b->Broadcast(buf.data(), 99, 0); }), Log{"flat.Broadcast"});
  // Root on the other host: its part across hosts, then the parts within this host.
  EXPECT_EQ(calls([&] { return b->Broadcast(buf.data(), 100, 0); }),
            (Log{"cross.Broadcast", "local.Allgatherv"}));
  // Root on this host: within the host, then its part across hosts.
  EXPECT_EQ(calls([&] { return b->Broadcast(buf.data(), 100, 1); }),
            (Log{"local.Broadcast", "cross.Broadcast"}));
  EXPECT_EQ(calls([&] { return b->Barrier(); }), Log{"flat.Barrier"});
  EXPECT_EQ(calls([&] {
              return b->ReduceScatter(buf.data(), buf.data() + 100, {1, 1}, DType::kUint8,
                                      ReduceOp::kSum);
            }),
            Log{"flat.ReduceScatter"});
  EXPECT_EQ(calls([&] {
              return b->Alltoallv(buf.data(), {1, 1}, buf.data() + 100, {1, 1});
            }),
            Log{"flat.Alltoallv"});
  EXPECT_EQ(b->Broadcast(buf.data(), 100, 2).code(), Code::kInvalidArgument);
  EXPECT_EQ(b->Allgatherv(buf.data(), buf.data(), {100}).code(), Code::kInvalidArgument);
}

// An allreduce's bad arguments are refused before any backend sees them (an invalid dtype once
// counted 0 bytes: below the threshold it reached the flat backend as such, above a threshold of
// 0 the local one, whose windows it divided by 0), and leave the backend usable.
TEST(HierarchicalRouting, AllreduceRefusesBadArguments) {
  Log log;
  std::unique_ptr<Backend> b = OnStandIns(1, {0, 1}, &log);
  ASSERT_NE(b, nullptr);
  std::vector<uint8_t> buf(200);
  EXPECT_EQ(b->Allreduce(buf.data(), 25, static_cast<DType>(99), ReduceOp::kSum).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(b->Allreduce(buf.data(), 25, DType::kFloat32, static_cast<ReduceOp>(-1)).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(b->Allreduce(nullptr, 25, DType::kFloat32, ReduceOp::kSum).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(log, Log{}) << "a backend saw bad arguments";
  EXPECT_TRUE(b->Allreduce(buf.data(), 25, DType::kFloat32, ReduceOp::kSum).ok());
}

// A failure in any step of a two-level collective is returned by that call and by every later
// one, which reach no backend.
TEST(HierarchicalRouting, FirstErrorIsKept) {
  struct Case {
    std::string fail;
    std::function<Status(Backend&, uint8_t*)> call;
  };
  const std::vector<Case> cases = {
      {"local.Alltoallv",
       [](Backend& b, uint8_t* p) {
         return b.Allgatherv(p, p, {0, 100});
       }},
      {"cross.Allgatherv",
       [](Backend& b, uint8_t* p) {
         return b.Allgatherv(p, p, {0, 100});
       }},
      {"local.Allgatherv",
       [](Backend& b, uint8_t* p) {
         return b.Allgatherv(p, p, {0, 100});
       }},
      {"local.Broadcast", [](Backend& b, uint8_t* p) { return b.Broadcast(p, 100, 1); }},
      {"cross.Broadcast", [](Backend& b, uint8_t* p) { return b.Broadcast(p, 100, 0); }},
      {"local.Allgatherv", [](Backend& b, uint8_t* p) { return b.Broadcast(p, 100, 0); }},
      {"cross.Allreduce",
       [](Backend& b, uint8_t* p) { return b.Allreduce(p, 25, DType::kFloat32, ReduceOp::kSum); }},
      {"flat.Allgatherv",
       [](Backend& b, uint8_t* p) {
         return b.Allgatherv(p, p, {1, 1});
       }},
  };
  for (const Case& c : cases) {
    Log log;
    std::unique_ptr<Backend> b = OnStandIns(1, {0, 1}, &log, c.fail);
    ASSERT_NE(b, nullptr);
    std::vector<uint8_t> buf(200);
    const Status first = c.call(*b, buf.data());
    ASSERT_EQ(first.code(), Code::kPeerFailure) << c.fail;
    ASSERT_EQ(log.back(), c.fail);
    const size_t calls = log.size();
    for (const Status& later :
         {b->Allreduce(buf.data(), 1, DType::kUint8, ReduceOp::kSum),
          b->Allreduce(buf.data(), 100, DType::kUint8, ReduceOp::kSum),
          b->Allgatherv(buf.data(), buf.data(), {0, 100}), b->Broadcast(buf.data(), 100, 0),
          b->Broadcast(buf.data(), 1, 0), b->Barrier(),
          b->ReduceScatter(buf.data(), buf.data() + 100, {1, 1}, DType::kUint8, ReduceOp::kSum),
          b->Alltoallv(buf.data(), {1, 1}, buf.data() + 100, {1, 1})}) {
      EXPECT_EQ(later.code(), Code::kPeerFailure) << c.fail;
      EXPECT_EQ(later.message(), first.message()) << c.fail;
    }
    EXPECT_EQ(log.size(), calls) << c.fail;
  }
}

TEST(HierarchicalRouting, RefusesBackendsThatDoNotMatchTheLayout) {
  Log log;
  auto make = [&](const std::vector<int>& host_of, int local_rank, int local_size, int host) {
    return CreateHierarchicalBackend(
        0, host_of, std::make_unique<StandIn>("local", local_rank, local_size, &log, ""),
        std::make_unique<StandIn>("cross", host, 2, &log, ""),
        std::make_unique<StandIn>("flat", 0, static_cast<int>(host_of.size()), &log, ""), 0);
  };
  EXPECT_TRUE(make({0, 1, 0, 1}, 0, 2, 0).ok());
  EXPECT_EQ(make({0, 0, 1}, 0, 2, 0).status().code(), Code::kInvalidArgument);     // uneven
  EXPECT_EQ(make({0, 1, 0, 1}, 1, 2, 0).status().code(), Code::kInvalidArgument);  // local rank
  EXPECT_EQ(make({0, 1, 0, 1}, 0, 2, 1).status().code(), Code::kInvalidArgument);  // host
  EXPECT_EQ(make({0, 2, 0, 2}, 0, 2, 0).status().code(), Code::kInvalidArgument);  // 3 hosts
}

std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  return info.param.name;
}

// 2 hosts x 2 ranks, consecutive and interleaved (hosts [0, 2] and [1, 3]: ExchangeHostLayout
// numbers hosts by their lowest rank and allows any order), one rank per host, one host.
const Layout kTwoByTwo{"2hosts_x2", {0, 0, 1, 1}};
const Layout kInterleaved{"2hosts_x2_interleaved", {0, 1, 0, 1}};
const Layout kTwoByOne{"2hosts_x1", {0, 1}};
const Layout kOneByThree{"1host_x3", {0, 0, 0}};
INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalAllreduceTest,
                         ::testing::Values(kTwoByTwo, kTwoByOne, kOneByThree), LayoutName);
INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalBackendTest,
                         ::testing::Values(kTwoByTwo, kInterleaved, kTwoByOne, kOneByThree),
                         LayoutName);

}  // namespace
}  // namespace concord
