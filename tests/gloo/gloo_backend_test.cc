// Tests of the Gloo backend with ranks as threads: allreduce over every dtype, op, algorithm and
// several counts against a locally computed result; allgatherv, broadcast, barrier; a peer that
// disappears.
#include "backends/gloo/gloo_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/dtype.h"
#include "rendezvous/hash_store.h"
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
using testing_gloo::RunRanks;

// Runs one allreduce on this rank's backend and checks every element (the first mismatch is a
// fatal gtest failure).
void CheckAllreduce(Backend& backend, DType dtype, ReduceOp op, size_t count) {
  std::vector<unsigned char> buffer(count * DTypeSize(dtype) + 1);
  for (size_t i = 0; i < count; ++i)
    StoreElement(dtype, buffer.data(), i, Input(dtype, op, backend.rank(), i));
  const Status status = backend.Allreduce(count ? buffer.data() : nullptr, count, dtype, op);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (size_t i = 0; i < count; ++i) {
    const double want = Expected(dtype, op, backend.size(), i);
    const double got = LoadElement(dtype, buffer.data(), i);
    ASSERT_EQ(got, want) << "rank " << backend.rank() << " of " << backend.size() << ", "
                         << DTypeName(dtype) << " " << ReduceOpName(op) << " count " << count
                         << " element " << i;
  }
}

// (ranks, algorithm)
class GlooAllreduceTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(GlooAllreduceTest, EveryDTypeOpAndCount) {
  const int size = std::get<0>(GetParam());
  const std::string algorithm = std::get<1>(GetParam());
  RunRanks(size, algorithm, [&](Backend& backend) {
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
          CheckAllreduce(backend, dtype, op, count);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  });
}

TEST_P(GlooAllreduceTest, LargeCount) {
  const int size = std::get<0>(GetParam());
  const std::string algorithm = std::get<1>(GetParam());
  // Every dtype and op at 1 << 20 with "auto" up to 3 ranks; elsewhere a float and a half case,
  // which keeps the run short on 2 cores.
  const bool full = algorithm == "auto" && size <= 3;
  RunRanks(size, algorithm, [&](Backend& backend) {
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        const bool pick = (dtype == DType::kFloat32 && op == ReduceOp::kSum) ||
                          (dtype == DType::kFloat16 && op == ReduceOp::kMax);
        if (!full && !pick) continue;
        CheckAllreduce(backend, dtype, op, size_t{1} << 20);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndAlgorithms, GlooAllreduceTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values("auto", "ring", "ring_chunked",
                                                              "halving_doubling", "allreduce")),
                         [](const ::testing::TestParamInfo<GlooAllreduceTest::ParamType>& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  std::get<1>(info.param);
                         });

// Reusing one buffer, alternating buffers on one rank only, and many distinct sizes (past the
// cache's bounds) must all give correct results: ranks rebuild cached algorithms at different
// times and still agree.
TEST(GlooBackendTest, BuffersChangingOnOneRankOnly) {
  for (const char* algorithm : {"ring", "ring_chunked", "halving_doubling", "allreduce"}) {
    RunRanks(3, algorithm, [&](Backend& backend) {
      std::vector<float> a(1000), b(1000);
      for (int step = 0; step < 6; ++step) {
        // Rank 0 alternates buffers, others keep one.
        std::vector<float>& buf = (backend.rank() == 0 && step % 2 == 1) ? b : a;
        for (size_t i = 0; i < buf.size(); ++i)
          buf[i] = static_cast<float>(i + backend.rank() + step);
        ASSERT_TRUE(
            backend.Allreduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum).ok());
        for (size_t i = 0; i < buf.size(); ++i) {
          ASSERT_EQ(buf[i], static_cast<float>(3 * (i + step) + 3))
              << algorithm << " step " << step;
        }
      }
    });
  }
}

TEST(GlooBackendTest, ManyDistinctCountsPastCacheBounds) {
  RunRanks(2, "auto", [&](Backend& backend) {
    for (int round = 0; round < 2; ++round) {
      for (size_t count = 1; count <= 80; ++count) {
        std::vector<int32_t> buf(count, backend.rank() + 1);
        ASSERT_TRUE(backend.Allreduce(buf.data(), count, DType::kInt32, ReduceOp::kSum).ok());
        for (int32_t v : buf) ASSERT_EQ(v, 3);
      }
    }
  });
}

TEST(GlooBackendTest, AllgathervDifferingAndZeroSizes) {
  for (int size = 1; size <= 4; ++size) {
    RunRanks(size, "auto", [&](Backend& backend) {
      const std::vector<std::vector<size_t>> cases = {
          std::vector<size_t>(size, 0),
          [&] {
            std::vector<size_t> v(size);
            for (int r = 0; r < size; ++r) v[r] = (r % 2 == 0) ? 0 : 1000 * r + 3;
            return v;
          }(),
          [&] {
            std::vector<size_t> v(size);
            for (int r = 0; r < size; ++r) v[r] = (r == size - 1) ? 0 : (1 << 18) + r;
            return v;
          }(),
          std::vector<size_t>(size, 1),
      };
      for (const auto& bytes : cases) {
        const int rank = backend.rank();
        std::vector<unsigned char> in(bytes[rank] + 1);
        for (size_t i = 0; i < bytes[rank]; ++i) in[i] = static_cast<unsigned char>(i * 31 + rank);
        const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
        std::vector<unsigned char> out(total + 1, 0xee);
        const Status status = backend.Allgatherv(in.data(), out.data(), bytes);
        ASSERT_TRUE(status.ok()) << status.ToString();
        size_t offset = 0;
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < bytes[r]; ++i) {
            ASSERT_EQ(out[offset + i], static_cast<unsigned char>(i * 31 + r)) << "from rank " << r;
          }
          offset += bytes[r];
        }
        ASSERT_EQ(out[total], 0xee) << "wrote past the output";
      }
      EXPECT_EQ(backend.Allgatherv(nullptr, nullptr, std::vector<size_t>(size + 1, 0)).code(),
                Code::kInvalidArgument);
    });
  }
}

// Runs one reduce-scatter of `counts` on `backend` and checks this rank's block, and that nothing
// past it was written.
void CheckReduceScatter(Backend& backend, DType dtype, ReduceOp op,
                        const std::vector<size_t>& counts) {
  const int rank = backend.rank();
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  size_t first = 0;
  for (int k = 0; k < rank; ++k) first += counts[k];
  std::vector<unsigned char> in(total * DTypeSize(dtype));
  for (size_t i = 0; i < total; ++i) StoreElement(dtype, in.data(), i, Input(dtype, op, rank, i));
  std::vector<unsigned char> out((counts[rank] + 1) * DTypeSize(dtype), 0xee);
  const Status status = backend.ReduceScatter(in.data(), out.data(), counts, dtype, op);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (size_t i = 0; i < counts[rank]; ++i) {
    ASSERT_EQ(LoadElement(dtype, out.data(), i), Expected(dtype, op, backend.size(), first + i))
        << backend.size() << " ranks, " << DTypeName(dtype) << " " << ReduceOpName(op) << " [" << i
        << "]";
  }
  ASSERT_EQ(out[counts[rank] * DTypeSize(dtype)], 0xee) << "wrote past the output";
}

// Uneven blocks, one empty, every dtype and op: small (an allreduce underneath) and large (the
// ring, with one block longer than its 256 KiB segments).
TEST(GlooBackendTest, ReduceScatterUnevenBlocks) {
  for (int size = 1; size <= 4; ++size) {
    RunRanks(size, "auto", [&](Backend& backend) {
      for (DType dtype : kAllDTypes) {
        for (ReduceOp op : kAllReduceOps) {
          for (const bool large : {false, true}) {
            std::vector<size_t> counts(size);
            for (int k = 0; k < size; ++k) counts[k] = k == 1 ? 0 : 7 * k + 3;
            if (large) counts[size - 1] = (size_t{300} << 10) / DTypeSize(dtype) + 1;
            CheckReduceScatter(backend, dtype, op, counts);
          }
        }
      }
    });
  }
}

// Blocks of a few MB, which the ring cuts into halves larger than 256 KiB (RingSegmentBytes): the
// last segment of an odd block is a single element, and the blocks differ in length.
TEST(GlooBackendTest, ReduceScatterLargeBlocksInHalves) {
  for (int size = 2; size <= 4; ++size) {
    RunRanks(size, "auto", [&](Backend& backend) {
      for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          std::vector<size_t> counts(size);
          for (int k = 0; k < size; ++k) {
            counts[k] = (size_t{1300} << 10) * (k + 1) / DTypeSize(dtype) + 1;
          }
          CheckReduceScatter(backend, dtype, op, counts);
        }
      }
    });
  }
}

// Rank s sends (s + 2d) % 4 * 1000 + d bytes to rank d (some 0 on 1 rank: d = 0, s = 0).
TEST(GlooBackendTest, AlltoallvDifferingSizes) {
  for (int size = 1; size <= 4; ++size) {
    RunRanks(size, "auto", [&](Backend& backend) {
      const int rank = backend.rank();
      auto bytes = [](int s, int d) { return static_cast<size_t>((s + 2 * d) % 4 * 1000 + d); };
      auto byte = [](int s, int d, size_t i) { return static_cast<unsigned char>(s * 50 + d + i); };
      std::vector<size_t> send(size), recv(size);
      std::vector<unsigned char> in, want;
      for (int d = 0; d < size; ++d) {
        send[d] = bytes(rank, d);
        for (size_t i = 0; i < send[d]; ++i) in.push_back(byte(rank, d, i));
        recv[d] = bytes(d, rank);
        for (size_t i = 0; i < recv[d]; ++i) want.push_back(byte(d, rank, i));
      }
      std::vector<unsigned char> out(want.size() + 1, 0xee);
      const Status status = backend.Alltoallv(in.data(), send, out.data(), recv);
      ASSERT_TRUE(status.ok()) << status.ToString();
      EXPECT_EQ(std::vector<unsigned char>(out.begin(), out.end() - 1), want);
      EXPECT_EQ(out.back(), 0xee);
    });
  }
}

TEST(GlooBackendTest, BroadcastFromEveryRoot) {
  for (int size = 1; size <= 4; ++size) {
    RunRanks(size, "auto", [&](Backend& backend) {
      for (int root = 0; root < size; ++root) {
        for (size_t bytes : {size_t{0}, size_t{1}, size_t{4099}, size_t{1} << 20}) {
          std::vector<unsigned char> data(bytes + 1, 0);
          for (size_t i = 0; i < bytes; ++i) {
            data[i] = backend.rank() == root ? static_cast<unsigned char>(i * 7 + root) : 0xaa;
          }
          const Status status = backend.Broadcast(data.data(), bytes, root);
          ASSERT_TRUE(status.ok()) << status.ToString();
          for (size_t i = 0; i < bytes; ++i) {
            ASSERT_EQ(data[i], static_cast<unsigned char>(i * 7 + root)) << "root " << root;
          }
        }
      }
      EXPECT_EQ(backend.Broadcast(nullptr, 0, size).code(), Code::kInvalidArgument);
    });
  }
}

TEST(GlooBackendTest, BarrierWaitsForEveryRank) {
  for (int size = 1; size <= 4; ++size) {
    std::atomic<int> arrived{0};
    RunRanks(size, "auto", [&](Backend& backend) {
      for (int round = 1; round <= 3; ++round) {
        // A slow last rank (time passing on purpose, not an ordering): the barrier must wait.
        if (backend.rank() == size - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++arrived;
        ASSERT_TRUE(backend.Barrier().ok());
        EXPECT_GE(arrived.load(), round * size);
        ASSERT_TRUE(backend.Barrier().ok());  // nobody starts the next round before all checked
      }
    });
  }
}

TEST(GlooBackendTest, UnknownAlgorithmIsInvalidArgument) {
  HashStore store;
  BackendOptions options;
  options.algorithm = "tree";
  StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(options, &store);
  EXPECT_EQ(backend.status().code(), Code::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("tree"), std::string::npos);
}

TEST(GlooBackendTest, BcubeIsRefusedWithTheReason) {
  HashStore store;
  BackendOptions options;
  options.algorithm = "bcube";
  StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(options, &store);
  EXPECT_EQ(backend.status().code(), Code::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("wrong results"), std::string::npos)
      << backend.status().message();
}

// Here there is no RDMA device: the ibverbs transport fails at once, saying what is missing, for
// one rank as for many (where a fabric exists, the test has nothing to check and says so).
TEST(GlooBackendTest, IbverbsWithoutDeviceFailsAtOnceNamingWhatIsMissing) {
  if (gloo_internal::CheckTransportAvailable(gloo_internal::GlooTransport::kIbverbs).ok()) {
    GTEST_SKIP() << "this host has an RDMA device";
  }
  for (int size : {1, 2}) {
    HashStore store;
    BackendOptions options;
    options.size = size;
    const auto start = std::chrono::steady_clock::now();
    StatusOr<std::unique_ptr<Backend>> backend =
        CreateGlooBackend(options, &store, gloo_internal::GlooTransport::kIbverbs);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(backend.status().code(), Code::kUnavailable);
    EXPECT_NE(backend.status().message().find("/sys/class/infiniband"), std::string::npos)
        << backend.status().message();
    EXPECT_NE(backend.status().message().find("CONCORD_BACKEND=gloo"), std::string::npos);
  }
}

TEST(GlooBackendTest, InvalidArguments) {
  RunRanks(1, "auto", [&](Backend& backend) {
    EXPECT_EQ(backend.Allreduce(nullptr, 4, DType::kFloat32, ReduceOp::kSum).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(backend.Allreduce(nullptr, 0, static_cast<DType>(99), ReduceOp::kSum).code(),
              Code::kInvalidArgument);
    EXPECT_TRUE(backend.Allreduce(nullptr, 0, DType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(backend.name(), std::string("gloo"));
  });
}

// A rank whose backend goes away turns the other rank's next allreduce into an error within the
// timeout, and the backend refuses further calls with that error.
TEST(GlooBackendTest, PeerGoneFailsWithinTimeout) {
  testing_gloo::ExpectPeerGoneFails(
      [](Backend& backend) {
        std::vector<float> data(4099, 1.0f);
        return backend.Allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
      },
      "allreduce");
}

// A rank that never enters a collective stands for one that died in the middle of a message
// (Gloo fails what is pending on a broken connection, but not a message it is sending or
// receiving: see backends/gloo/in_flight.h). Interrupter(), called from another thread, ends the
// others' span allreduce, reduce-scatter, all-to-all, allgather, broadcast (from the absent
// rank), barrier or ordered reductions (deterministic mode) at once with an error saying why, not
// at the 20 s timeout, and the backend refuses later calls.
TEST(GlooBackendTest, InterrupterEndsACollectiveWaitingForAPeer) {
  for (const std::string op :
       {"allreduce of", "reduce-scatter", "alltoallv", "allgatherv", "broadcast", "barrier",
        "ordered reduce-scatter", "ordered allreduce"}) {
    HashStore store;
    const std::string prefix = testing_gloo::UniquePrefix();
    std::vector<std::function<void()>> interrupters(3);
    harness::Latch created(3), finished(2);
    std::thread interrupting([&] {
      if (!created.Wait()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      interrupters[0]();
      interrupters[1]();
    });
    harness::RunRanks(3, [&](int rank) {
      StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(
          testing_gloo::Options(rank, 3, prefix, std::chrono::milliseconds(20000)), &store);
      ASSERT_TRUE(backend.ok()) << backend.status().ToString();
      interrupters[rank] = (*backend)->Interrupter();
      ASSERT_TRUE(interrupters[rank] != nullptr);
      created.CountDown();
      if (rank == 2) {
        EXPECT_TRUE(finished.Wait());
        return;
      }
      std::vector<float> in(3 << 18, 1.0f), out(3 << 18, 0.0f);
      const size_t third = in.size() / 3;
      const auto start = std::chrono::steady_clock::now();
      Status status;
      if (op == "allreduce of") {
        status = (*backend)->AllreduceSpans({{in.data(), third}, {out.data(), third}},
                                            DType::kFloat32, ReduceOp::kSum);
      } else if (op == "reduce-scatter") {
        status = (*backend)->ReduceScatter(in.data(), out.data(), {third, third, third},
                                           DType::kFloat32, ReduceOp::kSum);
      } else if (op == "alltoallv") {
        const std::vector<size_t> bytes(3, third * sizeof(float));
        status = (*backend)->Alltoallv(in.data(), bytes, out.data(), bytes);
      } else if (op == "allgatherv") {
        status = (*backend)->Allgatherv(in.data(), out.data(),
                                        std::vector<size_t>(3, third * sizeof(float)));
      } else if (op == "broadcast") {
        status = (*backend)->Broadcast(in.data(), in.size() * sizeof(float), 2);
      } else if (op == "barrier") {
        status = (*backend)->Barrier();
      } else if (op == "ordered reduce-scatter") {
        status = (*backend)->OrderedReduceScatter(in.data(), out.data(), {third, third, third},
                                                  DType::kFloat32, ReduceOp::kSum);
      } else {
        status =
            (*backend)->OrderedAllreduce(in.data(), in.size(), DType::kFloat32, ReduceOp::kSum);
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << op;
      EXPECT_EQ(status.code(), Code::kBackendError) << status.ToString();
      EXPECT_NE(status.message().find(op), std::string::npos) << status.ToString();
      // "aborted: a peer failed" when the interrupt ends a wait; "interrupted: a peer failed" when
      // it comes before the collective registers its buffers (InFlight::Scope), as it may where
      // the set-up is slow (ThreadSanitizer on a loaded machine).
      EXPECT_NE(status.message().find("a peer failed (reported by the control plane)"),
                std::string::npos)
          << status.ToString();
      EXPECT_EQ((*backend)->Barrier().message(), status.message());
      finished.CountDown();
    });
    interrupting.join();
  }
}

// A backend over a subset of the job's ranks (the hierarchical backend's one across hosts) is
// given the job's numbers for its ranks (BackendOptions::rank_names): its errors name them so,
// not by its own numbers. Here ranks 0 and 1 are the job's 6 and 3; rank 1 goes away, and rank
// 0's broadcast from it fails naming both by the job's numbers.
TEST(GlooBackendTest, ErrorsNameRanksByRankNames) {
  HashStore store;
  const std::string prefix = testing_gloo::UniquePrefix();
  harness::Latch peer_gone(1);
  harness::RunRanks(2, [&](int rank) {
    BackendOptions options =
        testing_gloo::Options(rank, 2, prefix, std::chrono::milliseconds(2000));
    options.rank_names = {6, 3};
    StatusOr<std::unique_ptr<Backend>> created = CreateGlooBackend(options, &store);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    std::unique_ptr<Backend> backend = std::move(*created);
    std::vector<char> data(4096, 1);
    ASSERT_TRUE(backend->Broadcast(data.data(), data.size(), 1).ok());
    ASSERT_TRUE(backend->Barrier().ok());
    if (rank == 1) {
      backend.reset();
      peer_gone.CountDown();
      return;
    }
    ASSERT_TRUE(peer_gone.Wait()) << "rank 1's backend was never destroyed";
    const Status status = backend->Broadcast(data.data(), data.size(), 1);
    EXPECT_TRUE(status.code() == Code::kBackendError || status.code() == Code::kTimeout)
        << status.ToString();
    EXPECT_NE(status.message().find("broadcast (4096 bytes from rank 3) on rank 6"),
              std::string::npos)
        << status.ToString();
  });
}

// A connect that fails says which of the job's ranks it was, and among which.
TEST(GlooBackendTest, RendezvousErrorNamesRanksByRankNames) {
  HashStore store;
  BackendOptions options =
      testing_gloo::Options(0, 2, testing_gloo::UniquePrefix(), std::chrono::milliseconds(300));
  options.rank_names = {4, 9};
  StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(options, &store);
  EXPECT_EQ(backend.status().code(), Code::kTimeout) << backend.status().ToString();
  EXPECT_EQ(backend.status().message().rfind("rank 4, as rank 0 of gloo among ranks 4, 9: ", 0), 0u)
      << backend.status().ToString();
}

TEST(GlooBackendTest, RendezvousTimesOutWithoutPeers) {
  HashStore store;
  StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(
      testing_gloo::Options(0, 2, testing_gloo::UniquePrefix(), std::chrono::milliseconds(300)),
      &store);
  EXPECT_EQ(backend.status().code(), Code::kTimeout) << backend.status().ToString();
}

}  // namespace
}  // namespace concord

namespace concord {
namespace {

// Data-parallel replicas stay identical only if every rank gets the very same bits. Float sums
// depend on the order of additions, so an algorithm where each rank accumulates in its own order
// would let replicas drift apart. Checks every algorithm "auto" may pick, at sizes that select
// each of them, with 3 and 4 ranks and values whose sums round.
class GlooBitIdenticalTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(GlooBitIdenticalTest, EveryRankGetsTheSameBits) {
  const auto [size, algorithm] = GetParam();
  for (size_t count : {size_t{1}, size_t{1000}, size_t{100000}, size_t{400000}}) {
    std::vector<std::vector<float>> results(size);
    testing_gloo::RunRanks(size, algorithm, [&](Backend& b) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) {
        v[i] = 1.0f / static_cast<float>(3 + i % 97) * static_cast<float>(b.rank() * 7 + 1) +
               1e-3f * static_cast<float>(i % 13);
      }
      ASSERT_TRUE(b.Allreduce(v.data(), count, DType::kFloat32, ReduceOp::kSum).ok());
      results[b.rank()] = std::move(v);
    });
    for (int r = 1; r < size; ++r) {
      ASSERT_EQ(0, std::memcmp(results[0].data(), results[r].data(), count * sizeof(float)))
          << "rank " << r << " differs from rank 0 with " << algorithm << " at count " << count;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DeterministicAlgorithms, GlooBitIdenticalTest,
                         ::testing::Combine(::testing::Values(3, 4),
                                            ::testing::Values("auto", "ring_chunked",
                                                              "halving_doubling", "allreduce")));

}  // namespace
}  // namespace concord
