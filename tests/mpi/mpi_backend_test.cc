// The MPI backend, control plane and environment (backends/mpi), run under mpirun at 1-4 ranks:
// every rank runs the same tests in the same order (they are collective).
//
//   mpi_backend_test                  the gtest suite below
//   mpi_backend_test --timeout-case   rank 0 runs an allreduce the others never join: it must
//                                     fail with kTimeout within the deadline and stay failed;
//                                     prints "TIMEOUT_OK". The request is abandoned, so MPI is
//                                     not finalized and mpirun ends the job non-zero (checked by
//                                     the test's driver).
//   mpi_backend_test --interrupt-case rank 0's allreduce, never joined, is ended by the backend's
//                                     Interrupter() long before its deadline; prints
//                                     "INTERRUPT_OK" (MPI unfinalized, as above).
//   mpi_backend_test --closing-case   np 3: a failed rank's control plane tells its star peers
//                                     (Abandon), who fail it and call their failure listeners
//                                     at once; prints "CLOSING_OK" on ranks 0 and 2.
//   mpi_backend_test --stalled-case   np 2: after a failure, a thread that never leaves MPI (as
//                                     Open MPI can stall) holds the environment's lock; rank 0's
//                                     collective and point-to-point transport give up on it
//                                     instead of waiting forever; prints "STALLED_OK".
//   mpi_backend_test --stuck-case     np 2: rank 0's point-to-point progress thread is stuck
//   holding
//                                     the transport's lock; Close() gives up on it after about
//                                     1 s and completes everything once; prints "STUCK_OK" (MPI
//                                     unfinalized, as above).
//   mpi_backend_test --drop-no-memory-case  np 2: a refused message whose drop buffer cannot be
//                                     allocated fails its recv with kSystemError; prints
//                                     "DROP_NO_MEMORY_OK" (MPI unfinalized, as above).
#include "backends/mpi/mpi_backend.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/sanitizers.h"
#include "tests/common/tensors.h"

namespace concord {
namespace {

using harness::LoadElement;
using harness::ReduceOverRanks;
using harness::StoreElement;

std::shared_ptr<MpiEnvironment>* g_env = nullptr;

using harness::kSanitized;

std::unique_ptr<Backend> MakeBackend(size_t max_message_bytes = kMpiMaxMessageBytes,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto b = CreateMpiBackend(*g_env, timeout, max_message_bytes);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : nullptr;
}

// Rank r's element i: small integers so every dtype and every op (product too) is exact.
double Value(int rank, size_t i) {
  return 1.0 + static_cast<double>((static_cast<size_t>(rank) + i) % 3);
}

void CheckAllreduce(Backend& b, DType dtype, ReduceOp op, size_t count) {
  const size_t esize = DTypeSize(dtype);
  std::vector<uint8_t> data(count * esize + 1);
  for (size_t i = 0; i < count; ++i) StoreElement(dtype, data.data(), i, Value(b.rank(), i));
  const Status s = b.Allreduce(count ? data.data() : nullptr, count, dtype, op);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < count; ++i) {
    // A backend's average is a sum: the engine divides.
    const double want = ReduceOverRanks(op, b.size(), [&](int r) { return Value(r, i); });
    ASSERT_EQ(LoadElement(dtype, data.data(), i), want)
        << DTypeName(dtype) << " " << ReduceOpName(op) << " count " << count << " [" << i << "]";
  }
}

TEST(MpiEnvironmentTest, OneSharedEnvironmentWithAUsableThreadLevel) {
  auto again = MpiEnvironment::Acquire();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->get(), g_env->get());
  EXPECT_GE((*g_env)->thread_level(), MPI_THREAD_SERIALIZED);
  EXPECT_TRUE((*g_env)->initialised_by_concord());
}

// MPI_TAG_UB + 1: how many tags MPI_Comm_create_group can tell apart (CreateGroupComm).
uint64_t TagCount() {
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  return found != 0 && tag_ub != nullptr ? static_cast<uint64_t>(*tag_ub) + 1 : 32768;
}

// Two sub-communicators of world ranks 0 and 1 whose identities coincide modulo MPI_TAG_UB + 1
// (so their tags do), started in opposite orders on the two ranks (as two threads may start
// them): MPI matches rank 0's first start with rank 1's first, which is the other
// sub-communicator. Both starts fail with kMismatch on both ranks, saying why, instead of leaving
// two cross-wired communicators (before the identity check: both started). The same
// sub-communicator started alike on both then works.
TEST(MpiTransportsTest, CrossedSubCommunicatorStartsAreRefused) {
  auto b = MakeBackend();
  if (b->rank() > 1) return;  // collective over ranks 0 and 1 only
  if (b->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const uint64_t first = 11, second = 11 + TagCount();
  const uint64_t mine[2] = {b->rank() == 0 ? first : second, b->rank() == 0 ? second : first};
  for (uint64_t identity : mine) {
    StatusOr<MpiTransports> t = CreateMpiTransports(std::chrono::seconds(20), {0, 1}, identity);
    ASSERT_FALSE(t.ok()) << "sub-communicator " << identity << " started, cross-wired";
    EXPECT_EQ(t.status().code(), Code::kMismatch) << t.status().ToString();
    EXPECT_NE(t.status().message().find("got the same MPI tag"), std::string::npos)
        << t.status().ToString();
  }
  StatusOr<MpiTransports> t = CreateMpiTransports(std::chrono::seconds(20), {0, 1}, 33);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size, 2);
}

// Two sub-communicators of world ranks 0 and 1 started at once from two threads, in opposite
// orders on the two ranks: rank 0's first thread starts A at once and its second B 300 ms later,
// rank 1 the other way round. Each rank's first start waits inside MPI_Comm_create_group for the
// other rank's, which comes from its second thread. Both start, and work (before: the first start
// held the MPI lock while it waited, the second waited for the lock, and both ranks hung there
// for good).
TEST(MpiTransportsTest, SubCommunicatorsStartedAtOnceFromTwoThreadsInOppositeOrders) {
  auto b = MakeBackend();
  if (b->rank() > 1) return;  // collective over ranks 0 and 1 only
  if (b->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  if (g_env->get()->thread_level() != MPI_THREAD_MULTIPLE) {
    GTEST_SKIP() << "MPI gave " << MpiThreadLevelName(g_env->get()->thread_level())
                 << ": sub-communicators start from one thread at a time there";
  }
  const uint64_t a = 101, c = 202;
  // A's, then C's, on both ranks.
  StatusOr<MpiTransports> started[2] = {Status(Code::kInternal, "not run"),
                                        Status(Code::kInternal, "not run")};
  auto start = [&](uint64_t identity, int delay_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    started[identity == a ? 0 : 1] =
        CreateMpiTransports(std::chrono::seconds(20), {0, 1}, identity);
  };
  std::thread first(start, b->rank() == 0 ? a : c, 0);
  std::thread second(start, b->rank() == 0 ? c : a, 300);
  first.join();
  second.join();
  for (auto& t : started) {
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->size, 2);
    // Each is its own communicator: a broadcast from rank 1 reaches rank 0.
    int value = t->rank == 1 ? 7 : 0;
    ASSERT_TRUE(t->backend->Broadcast(&value, sizeof(value), 1).ok());
    EXPECT_EQ(value, 7);
  }
}

TEST(MpiBackendTest, AllreduceEveryDtypeOpAndSize) {
  auto b = MakeBackend();
  ASSERT_NE(b, nullptr);
  EXPECT_STREQ(b->name(), "mpi");
  for (int t = 0; t < kNumDTypes; ++t) {
    for (int o = 0; o < kNumReduceOps; ++o) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
        CheckAllreduce(*b, static_cast<DType>(t), static_cast<ReduceOp>(o), count);
      }
    }
  }
  CheckAllreduce(*b, DType::kFloat32, ReduceOp::kSum, size_t{1} << 20);
  CheckAllreduce(*b, DType::kBFloat16, ReduceOp::kMax, size_t{1} << 20);
}

TEST(MpiBackendTest, LargeBuffersGoInPieces) {
  // 40 bytes a call: 5 float64, 20 float16, 40 uint8 elements; the counts leave a remainder.
  auto b = MakeBackend(40);
  ASSERT_NE(b, nullptr);
  for (DType t : {DType::kUint8, DType::kFloat16, DType::kInt32, DType::kFloat64}) {
    CheckAllreduce(*b, t, ReduceOp::kSum, 4099);
    CheckAllreduce(*b, t, ReduceOp::kMin, 97);
  }
}

void CheckAllgatherv(Backend& b, bool in_place) {
  std::vector<size_t> bytes(b.size());
  size_t total = 0;
  for (int r = 0; r < b.size(); ++r) total += bytes[r] = r == 1 ? 0 : 5 + (r * 37) % 50;
  size_t offset = 0;
  for (int r = 0; r < b.rank(); ++r) offset += bytes[r];
  std::vector<uint8_t> out(total + 1, 0xee), in(bytes[b.rank()] + 1);
  uint8_t* mine = in_place ? out.data() + offset : in.data();
  for (size_t i = 0; i < bytes[b.rank()]; ++i) mine[i] = static_cast<uint8_t>(b.rank() * 50 + i);
  const Status s = b.Allgatherv(mine, out.data(), bytes);
  ASSERT_TRUE(s.ok()) << s.ToString();
  size_t at = 0;
  for (int r = 0; r < b.size(); ++r) {
    for (size_t i = 0; i < bytes[r]; ++i, ++at) {
      ASSERT_EQ(out[at], static_cast<uint8_t>(r * 50 + i)) << "from rank " << r << " byte " << i;
    }
  }
  EXPECT_EQ(out[total], 0xee) << "wrote past the output";
}

TEST(MpiBackendTest, AllgathervDifferentCountsInAndOutOfPlace) {
  for (size_t max_bytes : {kMpiMaxMessageBytes, size_t{16}}) {  // 16: one broadcast per rank
    auto b = MakeBackend(max_bytes);
    ASSERT_NE(b, nullptr);
    CheckAllgatherv(*b, false);
    CheckAllgatherv(*b, true);
    std::vector<size_t> none(b->size(), 0);
    EXPECT_TRUE(b->Allgatherv(nullptr, nullptr, none).ok());
  }
}

// Reduce-scatter with uneven counts (rank k's block: 3k + 1 elements) and an alltoallv where
// rank s sends (s + 2d) % 4 * 5 + 1 bytes to rank d: in one call each, and with every call
// limited to 16 bytes (the per-root reduces and the pieced datatypes taken past MPI's int).
TEST(MpiBackendTest, ReduceScatterAndAlltoallvInOneCallAndInPieces) {
  for (size_t max_bytes : {kMpiMaxMessageBytes, size_t{16}}) {
    auto b = MakeBackend(max_bytes);
    ASSERT_NE(b, nullptr);
    const int size = b->size(), rank = b->rank();
    std::vector<size_t> counts(size);
    size_t total = 0, first = 0;
    for (int k = 0; k < size; ++k) {
      counts[k] = 3 * k + 1;
      if (k < rank) first += counts[k];
      total += counts[k];
    }
    for (int t = 0; t < kNumDTypes; ++t) {
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto dtype = static_cast<DType>(t);
        const auto op = static_cast<ReduceOp>(o);
        std::vector<uint8_t> in(total * DTypeSize(dtype)), out(counts[rank] * DTypeSize(dtype));
        for (size_t i = 0; i < total; ++i) StoreElement(dtype, in.data(), i, Value(rank, i));
        const Status s = b->ReduceScatter(in.data(), out.data(), counts, dtype, op);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (size_t i = 0; i < counts[rank]; ++i) {
          const double want = ReduceOverRanks(op, size, [&](int r) { return Value(r, first + i); });
          ASSERT_EQ(LoadElement(dtype, out.data(), i), want)
              << DTypeName(dtype) << " " << ReduceOpName(op) << " max " << max_bytes;
        }
      }
    }
    auto bytes = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 4 * 5 + 1); };
    auto byte = [](int from, int to, size_t i) { return static_cast<uint8_t>(from * 50 + to + i); };
    std::vector<size_t> send(size), recv(size);
    std::vector<uint8_t> in, want;
    for (int d = 0; d < size; ++d) {
      send[d] = bytes(rank, d);
      for (size_t i = 0; i < send[d]; ++i) in.push_back(byte(rank, d, i));
      recv[d] = bytes(d, rank);
      for (size_t i = 0; i < recv[d]; ++i) want.push_back(byte(d, rank, i));
    }
    std::vector<uint8_t> out(want.size() + 1, 0xEE);
    const Status s = b->Alltoallv(in.data(), send, out.data(), recv);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end() - 1), want) << "max " << max_bytes;
    EXPECT_EQ(out.back(), 0xEE);
  }
}

TEST(MpiBackendTest, BroadcastFromEveryRoot) {
  for (size_t max_bytes : {kMpiMaxMessageBytes, size_t{64}}) {
    auto b = MakeBackend(max_bytes);
    ASSERT_NE(b, nullptr);
    for (int root = 0; root < b->size(); ++root) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{4099}}) {
        std::vector<uint8_t> data(n + 1, 0);
        if (b->rank() == root) {
          for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint8_t>(root + 3 * i);
        }
        const Status s = b->Broadcast(n ? data.data() : nullptr, n, root);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(data[i], static_cast<uint8_t>(root + 3 * i)) << "root " << root << " [" << i;
        }
      }
    }
  }
}

// Reduce and gather to every root, in place and not, in one call and in 16-byte pieces (a gather
// past one call is an allgatherv): the root's output has the result, and nothing past it.
TEST(MpiBackendTest, ReduceAndGathervToEveryRoot) {
  for (size_t max_bytes : {kMpiMaxMessageBytes, size_t{16}}) {
    auto b = MakeBackend(max_bytes);
    ASSERT_NE(b, nullptr);
    for (int root = 0; root < b->size(); ++root) {
      for (DType dtype : {DType::kInt32, DType::kFloat16, DType::kFloat64}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{4099}}) {
            for (bool in_place : {false, true}) {
              const size_t esize = DTypeSize(dtype);
              std::vector<uint8_t> in(count * esize + 1), out(count * esize + 1, 0xee);
              uint8_t* mine = in_place ? out.data() : in.data();
              for (size_t i = 0; i < count; ++i) StoreElement(dtype, mine, i, Value(b->rank(), i));
              const Status s = b->Reduce(count ? mine : nullptr, count ? out.data() : nullptr,
                                         count, dtype, op, root);
              ASSERT_TRUE(s.ok()) << s.ToString();
              if (b->rank() != root) continue;
              for (size_t i = 0; i < count; ++i) {
                const double want =
                    ReduceOverRanks(op, b->size(), [&](int r) { return Value(r, i); });
                ASSERT_EQ(LoadElement(dtype, out.data(), i), want)
                    << DTypeName(dtype) << " " << ReduceOpName(op) << " root " << root << " [" << i
                    << "]";
              }
              EXPECT_EQ(out[count * esize], 0xee) << "wrote past the output";
            }
          }
        }
      }
      std::vector<size_t> bytes(b->size());
      size_t total = 0, offset = 0;
      for (int r = 0; r < b->size(); ++r) total += bytes[r] = r == 1 ? 0 : 5 + (r * 37) % 50;
      for (int r = 0; r < b->rank(); ++r) offset += bytes[r];
      for (bool in_place : {false, true}) {
        std::vector<uint8_t> out(total + 1, 0xee), in(bytes[b->rank()] + 1);
        uint8_t* mine = in_place ? out.data() + offset : in.data();
        for (size_t i = 0; i < bytes[b->rank()]; ++i) {
          mine[i] = static_cast<uint8_t>(b->rank() * 50 + i);
        }
        const Status s = b->Gatherv(mine, out.data(), bytes, root);
        ASSERT_TRUE(s.ok()) << s.ToString();
        if (b->rank() != root) continue;
        size_t at = 0;
        for (int r = 0; r < b->size(); ++r) {
          for (size_t i = 0; i < bytes[r]; ++i, ++at) {
            ASSERT_EQ(out[at], static_cast<uint8_t>(r * 50 + i)) << "from rank " << r;
          }
        }
        EXPECT_EQ(out[total], 0xee) << "wrote past the output";
      }
    }
  }
}

TEST(MpiBackendTest, BarrierAndBadArguments) {
  auto b = MakeBackend();
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->Barrier().ok());
  uint8_t x[8] = {0};
  // Refused locally, before any MPI call: no rank waits for the others.
  EXPECT_EQ(b->Broadcast(x, 8, b->size()).code(), Code::kInvalidArgument);
  EXPECT_EQ(b->Broadcast(x, 8, -1).code(), Code::kInvalidArgument);
  EXPECT_EQ(b->Broadcast(nullptr, 8, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(b->Allreduce(nullptr, 3, DType::kFloat32, ReduceOp::kSum).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(b->Allreduce(x, 1, static_cast<DType>(99), ReduceOp::kSum).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(b->Allgatherv(x, x, std::vector<size_t>(b->size() + 1, 1)).code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(b->Barrier().ok()) << "a refused call must leave the backend usable";
}

std::unique_ptr<ControlPlane> MakeControl(std::chrono::milliseconds liveness) {
  auto c = CreateMpiControlPlane(*g_env, liveness);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Waits for a message until `seconds` pass.
ControlMessage ReceiveOne(ControlPlane& c, double seconds = 20) {
  ControlMessage m;
  auto got = c.Receive(
      &m, Deadline::After(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000))));
  EXPECT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got.ok() && *got) << "no message";
  return m;
}

TEST(MpiControlPlaneTest, StarMessagesArriveWholeAndInOrder) {
  auto c = MakeControl(std::chrono::seconds(30));
  ASSERT_NE(c, nullptr);
  const std::vector<size_t> sizes = {0, 1, 100, size_t{1} << 20, 3};
  if (c->rank() != 0) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::string msg(sizes[k], static_cast<char>('a' + c->rank()));
      if (!msg.empty()) msg[0] = static_cast<char>(k);
      ASSERT_TRUE(c->Send(0, msg).ok());
    }
    const ControlMessage reply = ReceiveOne(*c);
    EXPECT_EQ(reply.from, 0);
    EXPECT_EQ(reply.bytes, "reply to " + std::to_string(c->rank()));
    return;
  }
  std::vector<size_t> next(c->size(), 0);
  for (int n = 0; n < (c->size() - 1) * static_cast<int>(sizes.size()); ++n) {
    const ControlMessage m = ReceiveOne(*c);
    ASSERT_GT(m.from, 0);
    ASSERT_LT(m.from, c->size());
    const size_t k = next[m.from]++;
    ASSERT_LT(k, sizes.size());
    ASSERT_EQ(m.bytes.size(), sizes[k]) << "from rank " << m.from << " message " << k;
    if (!m.bytes.empty()) {
      EXPECT_EQ(m.bytes[0], static_cast<char>(k));
    }
    if (m.bytes.size() > 1) {
      EXPECT_EQ(m.bytes.back(), static_cast<char>('a' + m.from));
    }
  }
  for (int r = 1; r < c->size(); ++r) ASSERT_TRUE(c->Send(r, "reply to " + std::to_string(r)).ok());
}

TEST(MpiControlPlaneTest, WakeAndDeadlineEndReceive) {
  auto c = MakeControl(std::chrono::seconds(30));
  ASSERT_NE(c, nullptr);
  ControlMessage m;
  // A deadline with nothing to read.
  auto t0 = std::chrono::steady_clock::now();
  auto got = c->Receive(&m, Deadline::After(std::chrono::milliseconds(30)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(*got);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
  // Wake() before Receive(): the next Receive returns at once.
  c->Wake();
  t0 = std::chrono::steady_clock::now();
  got = c->Receive(&m, Deadline::Infinite());
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
  // Wake() from another thread while Receive() sleeps, with no deadline.
  std::thread waker([&c] {
    // Lets Receive() block first. Not an ordering the result depends on: a wake that came first
    // would end Receive() at once too (ControlPlane::Wake: "the current or next Receive()").
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c->Wake();
  });
  t0 = std::chrono::steady_clock::now();
  got = c->Receive(&m, Deadline::Infinite());
  const auto took = std::chrono::steady_clock::now() - t0;
  waker.join();
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  EXPECT_LT(took, std::chrono::milliseconds(500)) << "Wake() did not end Receive() promptly";
}

TEST(MpiControlPlaneTest, RefusesSendsOutsideTheStar) {
  auto c = MakeControl(std::chrono::seconds(30));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->Send(c->rank(), "x").code(), Code::kInvalidArgument);
  EXPECT_EQ(c->Send(c->size(), "x").code(), Code::kInvalidArgument);
  EXPECT_EQ(c->Send(-1, "x").code(), Code::kInvalidArgument);
  if (c->rank() != 0 && c->size() > 2) {
    EXPECT_EQ(c->Send(c->rank() == 1 ? 2 : 1, "x").code(), Code::kInvalidArgument);
  }
}

// Planes created and destroyed in quick succession, as communicators are: each new plane's first
// messages arrive, whatever the last plane left unreceived (its first heartbeats, sent at once,
// are still in flight when it is destroyed; a communicator freed with such messages let Open MPI
// hand them to the next communicator that took its context id, which then lost a message).
TEST(MpiControlPlaneTest, PlanesDestroyedAtOnceLeaveNothingToTheNext) {
  for (int round = 0; round < 20; ++round) {
    auto c = MakeControl(std::chrono::seconds(30));
    ASSERT_NE(c, nullptr);
    if (c->size() == 1) return;
    const std::string hello = "hello " + std::to_string(round);
    if (c->rank() != 0) {
      ASSERT_TRUE(c->Send(0, hello).ok());
      EXPECT_EQ(ReceiveOne(*c, 10).bytes, hello + " back") << "round " << round;
    } else {
      for (int n = 1; n < c->size(); ++n) {
        const ControlMessage m = ReceiveOne(*c, 10);
        ASSERT_EQ(m.bytes, hello) << "round " << round << ", from rank " << m.from;
        ASSERT_TRUE(c->Send(m.from, hello + " back").ok());
      }
    }
  }
}

// Whether process `pid` (on this host) is stopped: state 'T' in /proc/<pid>/stat.
bool IsStopped(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return false;
  char state = '?';
  const int read = std::fscanf(f, "%*d %*s %c", &state);
  std::fclose(f);
  return read == 1 && state == 'T';
}

// Liveness apart from progress: rank 1 freezes itself (SIGSTOP, so its plane's thread stops too)
// and rank 0, listening, must fail it within the liveness timeout, call its failure listener once,
// then resume it (SIGCONT). Ranks 2 and up never call Receive(): their planes' threads alone keep
// them alive meanwhile.
TEST(MpiControlPlaneTest, FrozenPeerIsAPeerFailure) {
  constexpr auto kLiveness = std::chrono::milliseconds(300);
  auto c = MakeControl(kLiveness);
  ASSERT_NE(c, nullptr);
  if (c->size() == 1) return;
  if (c->rank() == 1) {
    ASSERT_TRUE(c->Send(0, std::to_string(::getpid())).ok());
    EXPECT_EQ(ReceiveOne(*c).bytes, "freeze");  // rank 0 has the pid: it will resume this rank
    ::raise(SIGSTOP);
  } else if (c->rank() == 0) {
    auto listened = std::make_shared<std::atomic<int>>(0);
    c->SetFailureListener([listened] { listened->fetch_add(1); });
    const ControlMessage hello = ReceiveOne(*c);
    ASSERT_EQ(hello.from, 1);
    const pid_t pid = static_cast<pid_t>(std::stol(hello.bytes));
    struct Resume {
      pid_t pid;
      ~Resume() { ::kill(pid, SIGCONT); }  // whatever happens below
    } resume{pid};
    ASSERT_TRUE(c->Send(1, "freeze").ok());
    const Deadline stop_deadline = Deadline::After(std::chrono::seconds(10));
    while (!IsStopped(pid) && !stop_deadline.passed()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_TRUE(IsStopped(pid)) << "rank 1 did not stop";
    const auto frozen_at = std::chrono::steady_clock::now();
    const Deadline deadline = Deadline::After(10 * kLiveness);
    ControlMessage m;
    StatusOr<bool> got = false;
    while (got.ok() && !deadline.passed()) got = c->Receive(&m, deadline);
    const auto took = std::chrono::steady_clock::now() - frozen_at;
    std::printf("rank 1 frozen: reported after %.3f s (liveness %.3f s): %s\n",
                std::chrono::duration<double>(took).count(),
                std::chrono::duration<double>(kLiveness).count(),
                got.ok() ? "nothing" : got.status().ToString().c_str());
    ASSERT_FALSE(got.ok()) << "rank 1, frozen, was not failed";
    EXPECT_EQ(got.status().code(), Code::kPeerFailure);
    EXPECT_NE(got.status().message().find("rank 1 silent for 0.3 s"), std::string::npos)
        << got.status().ToString();
    // Its last heartbeat left at most a quarter of the timeout before it froze; probes see a
    // message at most a sixteenth of the timeout late; and some slack for a loaded machine.
    EXPECT_GE(took, kLiveness * 3 / 4 - std::chrono::milliseconds(30));
    EXPECT_LE(took, kLiveness * 17 / 16 + std::chrono::milliseconds(300));
    EXPECT_EQ(c->Send(1, "x").code(), Code::kPeerFailure) << "the failure is sticky";
    // The listener runs on the plane's thread just after it wakes Receive().
    const Deadline listener_deadline = Deadline::After(std::chrono::seconds(2));
    while (listened->load() == 0 && !listener_deadline.passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(listened->load(), 1) << "the failure listener is called once, on the failure";
    int late = 0;
    c->SetFailureListener([&late] { ++late; });
    EXPECT_EQ(late, 1) << "a listener set after the failure is called at once";
  } else {
    std::this_thread::sleep_for(6 * kLiveness);  // never listens
  }
  auto sync = MakeBackend();
  ASSERT_NE(sync, nullptr);
  EXPECT_TRUE(sync->Barrier().ok());
}

// A communicator of MPI_COMM_WORLD's ranks 0 .. n - 1 (MPI_COMM_NULL on the others), for the
// point-to-point tests' transports. Collective over MPI_COMM_WORLD.
MPI_Comm FirstRanks(int n) {
  auto lock = (*g_env)->Lock();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < n ? 0 : MPI_UNDEFINED, rank, &comm);
  return comm;
}
MPI_Comm PairComm() {
  return FirstRanks(2);
}

// Frees a communicator from FirstRanks(n) when it has fewer than n ranks (the job is smaller);
// false (freed) then.
bool HasRanks(MPI_Comm* comm, int n) {
  if (*comm == MPI_COMM_NULL) return false;
  auto lock = (*g_env)->Lock();
  int size = 0;
  MPI_Comm_size(*comm, &size);
  if (size < n) MPI_Comm_free(comm);
  return size >= n;
}
bool HasPeer(MPI_Comm* pair) {
  return HasRanks(pair, 2);
}

// This rank in `comm`.
int RankIn(MPI_Comm comm) {
  auto lock = (*g_env)->Lock();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

// A barrier that holds the environment's lock only for each call (a transport's progress thread
// may need MPI meanwhile).
void Barrier(MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  {
    auto lock = (*g_env)->Lock();
    ASSERT_EQ(MPI_Ibarrier(comm, &request), MPI_SUCCESS);
  }
  for (int done = 0; done == 0;) {
    {
      auto lock = (*g_env)->Lock();
      ASSERT_EQ(MPI_Test(&request, &done, MPI_STATUS_IGNORE), MPI_SUCCESS);
    }
    if (done == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// The tests that speak the transport's wire with raw MPI, on a duplicate of its base
// communicator (Duplicate, matching the transport's): a message with tag t has its header on MPI
// tag 2t, its large payload on 2t + 1, and a finalizing rank's goodbye is an empty message on
// tag 2 max_tag + 2 (max_tag: (MPI_TAG_UB - 2) / 2).
constexpr size_t kRawHeadWords = 4 + kP2pMaxDims;  // dtype | ndim | bytes | shape | id

// A uint8 message's header, shape {bytes}, id 0, followed by `eager` bytes of payload (zeros).
std::vector<uint64_t> RawHeader(uint64_t bytes, uint64_t eager) {
  std::vector<uint64_t> wire(kRawHeadWords + (eager + 7) / 8, 0);
  wire[0] = static_cast<uint64_t>(DType::kUint8);
  wire[1] = 1;  // ndim
  wire[2] = wire[3] = bytes;
  return wire;
}

void RawSend(MPI_Comm comm, const void* data, size_t bytes, int dest, int tag) {
  auto lock = (*g_env)->Lock();
  EXPECT_EQ(MPI_Send(data, static_cast<int>(bytes), MPI_BYTE, dest, tag, comm), MPI_SUCCESS);
}

int RawGoodbyeTag(MPI_Comm comm) {
  auto lock = (*g_env)->Lock();
  int* tag_ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &flag);
  const int64_t max_tag = flag && tag_ub != nullptr ? (int64_t{*tag_ub} - 2) / 2 : 16382;
  return static_cast<int>(2 * max_tag + 2);
}

// Waits until `count` reaches n (30 s at most); false when it did not.
bool WaitFor(const std::atomic<int>& count, int n) {
  const Deadline deadline = Deadline::After(std::chrono::seconds(30));
  while (count.load() < n && !deadline.passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return count.load() >= n;
}

// This process's data size (/proc/self/status VmData: its heap and private mappings), in bytes.
uint64_t DataBytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmData: %llu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

uint8_t Pattern(size_t i, int message) {
  return static_cast<uint8_t>(i * 7 + message * 31 + 1);
}

// A recv that refuses a large message (its place returns nullptr, as core does for another dtype
// or shape) drops the payload through a buffer of one piece, not one of the message's size: rank
// 0 refuses a 200 MiB message while its data may grow by 64 MiB only (RLIMIT_DATA), and the
// messages after it with the same tag, one large and one eager, arrive whole (the stream stays in
// sync). A drop buffer of the message's size threw std::bad_alloc on the progress thread, which
// ended the process. (Under a sanitizer the memory is not limited.)
TEST(MpiP2pTransportTest, RefusedLargeMessageIsDroppedInBoundedMemory) {
  MPI_Comm pair = PairComm();
  if (!HasPeer(&pair)) return;
  auto t = CreateMpiP2pTransport(*g_env, std::chrono::seconds(30), pair);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  P2pTransport& transport = **t;
  const std::vector<uint64_t> sizes = {(uint64_t{200} << 20) + 3, (uint64_t{40} << 20) + 5, 100};
  const Deadline deadline = Deadline::After(std::chrono::seconds(30));
  std::atomic<int> done{0};
  std::vector<Status> statuses(sizes.size());
  if (transport.rank() == 1) {
    std::vector<std::vector<uint8_t>> messages(sizes.size());
    for (size_t m = 0; m < sizes.size(); ++m) {
      messages[m].resize(sizes[m]);
      for (size_t i = 0; i < sizes[m]; ++i) messages[m][i] = Pattern(i, static_cast<int>(m));
      P2pMeta meta;
      meta.shape = {static_cast<int64_t>(sizes[m])};
      meta.bytes = sizes[m];
      transport.Send(0, 7, meta, messages[m].data(), deadline, [&, m](const Status& s) {
        statuses[m] = s;
        done.fetch_add(1);
      });
    }
    ASSERT_TRUE(WaitFor(done, static_cast<int>(sizes.size())));
  } else {
    std::vector<std::vector<uint8_t>> out(sizes.size());
    for (size_t m = 1; m < sizes.size(); ++m) out[m].resize(sizes[m]);
    std::vector<uint64_t> seen(sizes.size(), 0);
    rlimit old_limit{};
    ASSERT_EQ(::getrlimit(RLIMIT_DATA, &old_limit), 0);
    rlimit low = old_limit;
    low.rlim_cur = DataBytes() + (uint64_t{64} << 20);
    ASSERT_GT(low.rlim_cur, uint64_t{64} << 20);
    if (!kSanitized) {
      ASSERT_EQ(::setrlimit(RLIMIT_DATA, &low), 0);
    }
    for (size_t m = 0; m < sizes.size(); ++m) {
      transport.Recv(
          1, 7, deadline,
          [&, m](const P2pMeta& meta) -> void* {
            seen[m] = meta.bytes;
            return m == 0 ? nullptr : out[m].data();
          },
          [&, m](const Status& s) {
            statuses[m] = s;
            done.fetch_add(1);
          });
    }
    const bool finished = WaitFor(done, static_cast<int>(sizes.size()));
    ASSERT_EQ(::setrlimit(RLIMIT_DATA, &old_limit), 0);
    ASSERT_TRUE(finished);
    for (size_t m = 0; m < sizes.size(); ++m) EXPECT_EQ(seen[m], sizes[m]) << "message " << m;
    for (size_t m = 1; m < sizes.size(); ++m) {
      size_t wrong = 0;
      for (size_t i = 0; i < sizes[m]; ++i) wrong += out[m][i] != Pattern(i, static_cast<int>(m));
      EXPECT_EQ(wrong, 0u) << "message " << m;
    }
  }
  for (size_t m = 0; m < sizes.size(); ++m) EXPECT_TRUE(statuses[m].ok()) << statuses[m].ToString();
  auto lock = (*g_env)->Lock();
  MPI_Comm_free(&pair);
}

// Headers that no Concord sender writes, sent by rank 1 with raw MPI on the transport's
// communicator (a duplicate of the pair's, made by the same collective MPI_Comm_idup; a message
// with tag t has its header on MPI tag 2t): a large message's header that carries payload bytes
// too, and a shape with a dimension past its rank. Rank 0's recv fails with kProtocolError naming
// rank 1 and the tag, at once (the first used to wait for a payload that never comes, the second
// was taken).
TEST(MpiP2pTransportTest, MalformedHeadersAreProtocolErrors) {
  constexpr int64_t kTag = 7;
  MPI_Comm pair = PairComm();
  if (!HasPeer(&pair)) return;
  const int rank = RankIn(pair);
  for (const std::string which : {"large with payload bytes", "a dimension past its rank"}) {
    if (rank == 1) {
      auto comm = Duplicate(**g_env, pair, Deadline::After(std::chrono::seconds(30)));
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      // The header, then 16 bytes.
      std::vector<uint64_t> wire;
      if (which == "large with payload bytes") {
        wire = RawHeader(8192, 16);  // too large for an eager payload
      } else {
        wire = RawHeader(16, 16);
        wire[5] = 3;  // shape[2] of a shape of rank 1
      }
      RawSend(*comm, wire.data(), wire.size() * sizeof(uint64_t), 0, static_cast<int>(2 * kTag));
      auto lock = (*g_env)->Lock();
      MPI_Comm_free(&*comm);
    } else {
      auto t = CreateMpiP2pTransport(*g_env, std::chrono::seconds(30), pair);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      std::vector<char> sink(8192);
      std::atomic<int> done{0};
      Status status;
      (*t)->Recv(
          1, kTag, Deadline::After(std::chrono::seconds(5)),
          [&sink](const P2pMeta&) { return sink.data(); },
          [&](const Status& s) {
            status = s;
            done.fetch_add(1);
          });
      ASSERT_TRUE(WaitFor(done, 1));
      EXPECT_EQ(status.code(), Code::kProtocolError) << which << ": " << status.ToString();
      EXPECT_NE(status.message().find("malformed point-to-point header from rank 1 (tag 7)"),
                std::string::npos)
          << status.ToString();
    }
  }
  auto lock = (*g_env)->Lock();
  MPI_Comm_free(&pair);
}

// A transport that finished (Finish: its goodbyes sent, later operations refused) and then failed
// leaves MPI alone: its rounds no longer look for goodbyes nor drain what peers send. Rank 0
// finishes with a recv from rank 1 in flight; rank 1, with raw MPI, sends a malformed header for
// it (the recv fails with kProtocolError, which closes the transport), then a goodbye: rank 0
// must not take it (PeerFinalized(1) stays false). Before, the progress thread went on draining
// after the failure, re-posting each millisecond the goodbye receive that the failure had freed,
// and took the goodbye (rank 1 sent two then: the freed receive, still posted in MPI, took the
// first; goodbyes are probed now, and nothing stays posted).
TEST(MpiP2pTransportTest, FailureAfterFinishLeavesMpiAlone) {
  constexpr int64_t kTag = 5;
  MPI_Comm pair = PairComm();
  if (!HasPeer(&pair)) return;
  const int rank = RankIn(pair);
  if (rank == 1) {
    auto comm = Duplicate(**g_env, pair, Deadline::After(std::chrono::seconds(30)));
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    Barrier(pair);  // rank 0 has finished
    std::vector<uint64_t> wire = RawHeader(16, 16);
    wire[5] = 3;  // shape[2] of a shape of rank 1
    RawSend(*comm, wire.data(), wire.size() * sizeof(uint64_t), 0, static_cast<int>(2 * kTag));
    Barrier(pair);  // rank 0's transport has failed
    const int goodbye = RawGoodbyeTag(*comm);
    RawSend(*comm, nullptr, 0, 0, goodbye);
    Barrier(pair);  // rank 0 has looked
    auto lock = (*g_env)->Lock();
    // Rank 0's own goodbye, so that no message is left on the communicator freed here.
    EXPECT_EQ(MPI_Recv(nullptr, 0, MPI_BYTE, 0, goodbye, *comm, MPI_STATUS_IGNORE), MPI_SUCCESS);
    MPI_Comm_free(&*comm);
  } else {
    auto t = CreateMpiP2pTransport(*g_env, std::chrono::seconds(30), pair);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    P2pTransport& transport = **t;
    std::vector<char> sink(16);
    std::atomic<int> done{0};
    Status status;
    transport.Recv(
        1, kTag, Deadline::After(std::chrono::seconds(30)),
        [&sink](const P2pMeta&) { return sink.data(); },
        [&](const Status& s) {
          status = s;
          done.fetch_add(1);
        });
    EXPECT_FALSE(transport.Finish(Status(Code::kNotInitialized, "the communicator was finalized")));
    Barrier(pair);
    ASSERT_TRUE(WaitFor(done, 1));
    EXPECT_EQ(status.code(), Code::kProtocolError) << status.ToString();
    Barrier(pair);
    // Rank 1's goodbye has been sent: a round that still looked would take it within 1 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(transport.PeerFinalized(1));
    Barrier(pair);
  }
  auto lock = (*g_env)->Lock();
  MPI_Comm_free(&pair);
}

// After Finish, the drain takes what no recv in flight will take from every peer, even while one
// peer's next message waits for a recv: ranks 0 and 1 have transports, rank 2 speaks raw MPI.
// Rank 0 posts two recvs from rank 2, which sends the header of a large message (its payload held
// back) and a second message: the first recv waits for the payload, the second message waits for
// the second recv. Rank 1 has many large sends to rank 0 in flight, which no recv takes; rank 0
// finishes: its drain must take them all at once (each needs rank 0 to receive it, so each waits
// for the drain; each then fails with kPeerFailure saying that rank 0 finalized, as its drop
// notice came first), not one per look (1 ms) as when the drain stopped at rank 2's message: 1.0 s
// for these 1000 messages, where they now take milliseconds (Open MPI's wildcard probe turns to
// the next source after each find; another MPI's would stall until the payload came). Then rank
// 2 sends the payload, and both recvs complete.
TEST(MpiP2pTransportTest, DrainDoesNotWaitBehindOnePeer) {
  constexpr int64_t kTag = 3, kOtherTag = 4;
  constexpr int kSends = 500;
  constexpr uint64_t kLarge = 8192, kSendBytes = 64 << 10;  // both past the eager sizes
  MPI_Comm trio = FirstRanks(3);
  if (!HasRanks(&trio, 3)) return;
  const int rank = RankIn(trio);
  const Deadline deadline = Deadline::After(std::chrono::seconds(30));
  if (rank == 2) {
    auto comm = Duplicate(**g_env, trio, deadline);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    const std::vector<uint64_t> first = RawHeader(kLarge, 0), second = RawHeader(0, 0);
    RawSend(*comm, first.data(), first.size() * sizeof(uint64_t), 0, static_cast<int>(2 * kTag));
    RawSend(*comm, second.data(), second.size() * sizeof(uint64_t), 0, static_cast<int>(2 * kTag));
    Barrier(trio);  // rank 1's sends are in flight; rank 0 finishes
    Barrier(trio);  // rank 1's sends have completed
    const std::vector<char> payload(kLarge, 7);
    RawSend(*comm, payload.data(), payload.size(), 0, static_cast<int>(2 * kTag + 1));
    const int goodbye = RawGoodbyeTag(*comm);
    auto lock = (*g_env)->Lock();
    // Rank 0's goodbye, so that no message is left on the communicator freed here.
    EXPECT_EQ(MPI_Recv(nullptr, 0, MPI_BYTE, 0, goodbye, *comm, MPI_STATUS_IGNORE), MPI_SUCCESS);
    MPI_Comm_free(&*comm);
  } else {
    auto t = CreateMpiP2pTransport(*g_env, std::chrono::seconds(30), trio);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    P2pTransport& transport = **t;
    std::atomic<int> done{0};
    std::vector<Status> statuses(rank == 0 ? 2 : kSends);
    if (rank == 0) {
      std::vector<char> sink(kLarge);
      for (size_t i = 0; i < statuses.size(); ++i) {
        transport.Recv(
            2, kTag, deadline, [&sink](const P2pMeta&) { return sink.data(); },
            [&, i](const Status& s) {
              statuses[i] = s;
              done.fetch_add(1);
            });
      }
      Barrier(trio);
      EXPECT_FALSE(
          transport.Finish(Status(Code::kNotInitialized, "the communicator was finalized")));
      Barrier(trio);
      ASSERT_TRUE(WaitFor(done, 2));
      EXPECT_EQ(sink, std::vector<char>(kLarge, 7));
    } else {
      const std::vector<char> data(kSendBytes, 1);
      P2pMeta meta;
      meta.shape = {static_cast<int64_t>(kSendBytes)};
      meta.bytes = kSendBytes;
      for (int i = 0; i < kSends; ++i) {
        transport.Send(0, kOtherTag, meta, data.data(), deadline, [&, i](const Status& s) {
          statuses[i] = s;
          done.fetch_add(1);
        });
      }
      Barrier(trio);
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(WaitFor(done, kSends));
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank 1: %d sends to the finished rank 0 completed within %.3f s\n", kSends,
                  took);
      EXPECT_LT(took, 0.25) << "the drain waited behind rank 2's message";
      for (const Status& s : statuses) {
        EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
        EXPECT_NE(s.message().find("rank 0 finalized its communicator"), std::string::npos)
            << s.ToString();
      }
      Barrier(trio);
    }
    if (rank == 0) {
      for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.ToString();
    }
  }
  auto lock = (*g_env)->Lock();
  MPI_Comm_free(&trio);
}

// A send to a rank that finalized and never takes it (its drain is over: it closed) fails at its
// deadline alone, with kPeerFailure saying that the rank finalized, and the transport stays open:
// rank 1 speaks raw MPI, sends rank 0 a goodbye and receives nothing; rank 0's large send to it
// fails so at its 1 s deadline, and rank 0's recv from rank 2, posted before, still gets the
// message rank 2 sends after. Before, the deadline failed the whole transport (kTimeout, as for a
// message in transit), that recv too. Then rank 1 receives the message: MPI completes the send,
// which rank 0's transport kept until then, so nothing is left to MPI at MPI_Finalize.
TEST(MpiP2pTransportTest, SendThatAFinalizedRankNeverTakesFailsAlone) {
  constexpr int64_t kTag = 6;
  constexpr uint64_t kBytes = 64 << 10;  // past the eager sizes: MPI needs rank 1 to receive it
  MPI_Comm trio = FirstRanks(3);
  if (!HasRanks(&trio, 3)) return;
  const int rank = RankIn(trio);
  const Deadline deadline = Deadline::After(std::chrono::seconds(30));
  if (rank == 1) {
    auto comm = Duplicate(**g_env, trio, deadline);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    Barrier(trio);  // rank 0's send is in flight
    RawSend(*comm, nullptr, 0, 0, RawGoodbyeTag(*comm));
    Barrier(trio);  // rank 0's send has failed
    std::vector<char> message(kBytes);
    {
      auto lock = (*g_env)->Lock();
      EXPECT_EQ(MPI_Recv(message.data(), static_cast<int>(kBytes), MPI_BYTE, 0,
                         static_cast<int>(2 * kTag), *comm, MPI_STATUS_IGNORE),
                MPI_SUCCESS);  // the header
      EXPECT_EQ(MPI_Recv(message.data(), static_cast<int>(kBytes), MPI_BYTE, 0,
                         static_cast<int>(2 * kTag + 1), *comm, MPI_STATUS_IGNORE),
                MPI_SUCCESS);  // the payload
    }
    Barrier(trio);
    auto lock = (*g_env)->Lock();
    MPI_Comm_free(&*comm);
  } else {
    auto t = CreateMpiP2pTransport(*g_env, std::chrono::seconds(30), trio);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    P2pTransport& transport = **t;
    std::atomic<int> sent{0}, received{0};
    Status send_status, recv_status;
    std::vector<char> data(kBytes, 1);
    float in[4] = {0, 0, 0, 0};
    const float out[4] = {1, 2, 3, 4};
    P2pMeta small;
    small.dtype = DType::kFloat32;
    small.shape = {4};
    small.bytes = sizeof(out);
    if (rank == 0) {
      transport.Recv(
          2, kTag, deadline, [&in](const P2pMeta&) { return static_cast<void*>(in); },
          [&](const Status& s) {
            recv_status = s;
            received.fetch_add(1);
          });
      P2pMeta meta;
      meta.shape = {static_cast<int64_t>(kBytes)};
      meta.bytes = kBytes;
      const auto t0 = std::chrono::steady_clock::now();
      transport.Send(1, kTag, meta, data.data(), Deadline::After(std::chrono::seconds(1)),
                     [&](const Status& s) {
                       send_status = s;
                       sent.fetch_add(1);
                     });
      Barrier(trio);
      ASSERT_TRUE(WaitFor(sent, 1));
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(send_status.code(), Code::kPeerFailure) << send_status.ToString();
      EXPECT_NE(send_status.message().find("rank 1 finalized its communicator"), std::string::npos)
          << send_status.ToString();
      EXPECT_GE(took, 0.9);
      EXPECT_LT(took, 5.0);
      Barrier(trio);
      ASSERT_TRUE(WaitFor(received, 1));
      EXPECT_TRUE(recv_status.ok()) << recv_status.ToString();
      EXPECT_EQ(std::vector<float>(in, in + 4), std::vector<float>(out, out + 4));
    } else {
      Barrier(trio);
      Barrier(trio);
      transport.Send(0, kTag, small, out, deadline, [&](const Status& s) {
        send_status = s;
        sent.fetch_add(1);
      });
      ASSERT_TRUE(WaitFor(sent, 1));
      EXPECT_TRUE(send_status.ok()) << send_status.ToString();
    }
    Barrier(trio);
  }
  auto lock = (*g_env)->Lock();
  MPI_Comm_free(&trio);
}

int TimeoutCase() {
  auto env = MpiEnvironment::Acquire();
  if (!env.ok()) return 3;
  auto b = CreateMpiBackend(*env, std::chrono::milliseconds(300));
  if (!b.ok()) return 3;
  Backend& backend = **b;
  if (backend.rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(2));  // never joins
    return 0;
  }
  float x[4] = {1, 2, 3, 4};
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = backend.Allreduce(x, 4, DType::kFloat32, ReduceOp::kSum);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Status again = backend.Barrier();
  const bool ok = s.code() == Code::kTimeout && took >= 0.3 && took < 2.0 &&
                  again.code() == Code::kTimeout && (*env)->abandoned();
  std::printf("%s rank 0: %s after %.3f s; then %s\n", ok ? "TIMEOUT_OK" : "TIMEOUT_FAIL",
              s.ToString().c_str(), took, again.ToString().c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

// Rank 0 runs an allreduce the others never join, with a 30 s deadline, and another thread calls
// the backend's Interrupter() 200 ms in (as the engine's failure listener does): the wait must end
// then with kBackendError, and stay failed. Prints "INTERRUPT_OK"; MPI is left unfinalized, as
// after a timeout.
int InterruptCase() {
  auto env = MpiEnvironment::Acquire();
  if (!env.ok()) return 3;
  auto b = CreateMpiBackend(*env, std::chrono::seconds(30));
  if (!b.ok()) return 3;
  Backend& backend = **b;
  if (backend.rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(2));  // never joins
    return 0;
  }
  std::function<void()> interrupt = backend.Interrupter();
  if (!interrupt) return 3;
  std::thread interrupter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    interrupt();
  });
  float x[4] = {1, 2, 3, 4};
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = backend.Allreduce(x, 4, DType::kFloat32, ReduceOp::kSum);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  interrupter.join();
  const Status again = backend.Barrier();
  const bool ok = s.code() == Code::kBackendError &&
                  s.message().find("allreduce") != std::string::npos &&
                  s.message().find("interrupted") != std::string::npos && took >= 0.2 &&
                  took < 2.0 && again.message() == s.message() && (*env)->abandoned();
  std::printf("%s rank 0: %s after %.3f s; then %s\n", ok ? "INTERRUPT_OK" : "INTERRUPT_FAIL",
              s.ToString().c_str(), took, again.ToString().c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

// A failed rank's plane tells its star peers (Abandon()), np 3, liveness 16 s, so the liveness
// threads probe every second, all starting together: rank 1 abandons its plane 0.2 s in; rank 0
// must fail it and call its failure listener at its next probe (1 s in; a probe that leaves the
// notice to the round after would take 2 s), then abandon its own; rank 2 must then fail rank 0
// the same way (1 or 2 s in; late, 3 s). Rank 0's last words before its notice, an abort for
// rank 2, come first: rank 2's Send() and Drain() return OK while the abort waits to be received,
// and rank 0's failure once it has been. Ranks 0 and 2 print "CLOSING_OK"; MPI is left unfinalized
// (abandoned), so mpirun ends the job non-zero.
int ClosingCase() {
  auto env = MpiEnvironment::Acquire();
  if (!env.ok()) return 3;
  auto made = CreateMpiControlPlane(*env, std::chrono::seconds(16));
  if (!made.ok() || (*made)->size() != 3) return 3;
  std::unique_ptr<ControlPlane> plane = std::move(*made);
  const int rank = plane->rank();
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    plane->Abandon();
    plane.reset();
    std::this_thread::sleep_for(std::chrono::seconds(3));  // a failed rank that lingers
    return 0;
  }
  auto listened = std::make_shared<std::atomic<int>>(0);
  plane->SetFailureListener([listened] { listened->fetch_add(1); });
  const auto t0 = std::chrono::steady_clock::now();
  const Deadline deadline = Deadline::After(std::chrono::seconds(4));
  while (listened->load() == 0 && !deadline.passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ControlMessage m;
  // Rank 2: rank 0's abort first, a send and a drain meanwhile succeeding; then the failure, to
  // sends and drains too.
  bool last_words_first = true;
  if (rank == 2) {
    const Status before = plane->Send(0, "requests");
    const Status drained = plane->Drain(Deadline::After(std::chrono::milliseconds(100)));
    const StatusOr<bool> abort =
        plane->Receive(&m, Deadline::After(std::chrono::milliseconds(100)));
    last_words_first =
        before.ok() && drained.ok() && abort.ok() && *abort && m.bytes == "abort" &&
        plane->Send(0, "requests").code() == Code::kPeerFailure &&
        plane->Drain(Deadline::After(std::chrono::milliseconds(100))).code() == Code::kPeerFailure;
  }
  const StatusOr<bool> got = plane->Receive(&m, Deadline::After(std::chrono::milliseconds(100)));
  const int culprit = rank == 0 ? 1 : 0;
  const std::string named = "rank " + std::to_string(culprit) + " failed and closed";
  const bool ok = listened->load() == 1 && took < (rank == 0 ? 1.8 : 2.8) && !got.ok() &&
                  got.status().code() == Code::kPeerFailure &&
                  got.status().message().find(named) != std::string::npos && last_words_first;
  std::printf("%s rank %d: listener called %d time(s) after %.3f s; %s%s\n",
              ok ? "CLOSING_OK" : "CLOSING_FAIL", rank, listened->load(), took,
              got.ok() ? "no failure" : got.status().ToString().c_str(),
              last_words_first ? "" : "; rank 0's abort did not come first");
  std::fflush(stdout);
  if (rank == 0) {
    (void)plane->Send(2, "abort");  // its last words, before its closing notice
    plane->Abandon();               // rank 0 fails in turn, as the engine's failure path does
    plane.reset();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  return ok ? 0 : 1;
}

// After a failure (the environment abandoned, as the engine's plane teardown leaves it), a thread
// stuck for good inside MPI holds the environment's lock: on rank 0 a recv already posted, a
// collective must end with an error after kAbandonedLockWait (it waited forever behind it), and
// then the recv and the transport's Close() at once (each later wait gives up at once: a failure
// path that waited that long for each MPI call would add up). Rank 1 only lingers.
int StalledCase() {
  auto env = MpiEnvironment::Acquire();
  if (!env.ok()) return 3;
  auto b = CreateMpiBackend(*env, std::chrono::seconds(30));
  auto t = CreateMpiP2pTransport(*env, std::chrono::seconds(30));
  if (!b.ok() || !t.ok()) return 3;
  if ((*b)->rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    return 0;
  }
  P2pTransport& transport = **t;
  auto recv_done = std::make_shared<std::atomic<int>>(0);
  auto recv_status = std::make_shared<Status>();
  char sink[8];
  transport.Recv(
      1, 7, Deadline::After(std::chrono::seconds(30)), [&sink](const P2pMeta&) { return sink; },
      [recv_done, recv_status](const Status& s) {
        *recv_status = s;
        recv_done->fetch_add(1);
      });
  (*env)->MarkAbandoned();
  std::atomic<bool> release{false};
  std::atomic<bool> holding{false};
  std::thread stuck([&] {
    auto lock = (*env)->Lock();
    holding = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  while (!holding) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto t0 = std::chrono::steady_clock::now();
  float x[4] = {1, 2, 3, 4};
  const Status collective = (*b)->Allreduce(x, 4, DType::kFloat32, ReduceOp::kSum);
  const double collective_took = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  transport.Close(Status(Code::kPeerFailure, "rank 1 failed"));
  const double close_took = seconds_since(t0);
  release = true;
  stuck.join();
  const bool ok = collective.code() == Code::kBackendError &&
                  collective.message().find("gave up waiting for MPI") != std::string::npos &&
                  collective_took < 2.0 && close_took < 0.25 && recv_done->load() == 1 &&
                  !recv_status->ok();
  std::printf(
      "%s rank 0: allreduce %s after %.3f s; Close() took %.3f s; the recv ended %d "
      "time(s): %s\n",
      ok ? "STALLED_OK" : "STALLED_FAIL", collective.ToString().c_str(), collective_took,
      close_took, recv_done->load(), recv_status->ToString().c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

// np 2: rank 0's progress thread is stuck while it holds the transport's lock (as inside MPI when
// Open MPI blocks a call for good; here in a recv's `place`, which runs under that lock), with a
// send and another recv in flight, and a recv that it completed earlier in the same round (its
// callback not run yet). A driving waiter must leave at its deadline; Close() (or Finish(), with
// `finish_first`: it closes then) must give up on the thread within about kStuckWait (1 s) instead
// of waiting for ever, complete each operation once (the one completed in that round with its own
// status, by then; the others with its status), and refuse later calls at once; the thread,
// released after the handle is gone, completes nothing again, nor places the message that came
// for the other recv meanwhile. Prints "STUCK_OK". The environment is left abandoned (MPI
// unfinalized), so mpirun ends the job non-zero. Rank 1 sends its messages once rank 0 says go
// (tag 3, then 100 ms later tags 5 and 6), and lingers.
int StuckCase(bool finish_first) {
  auto env = MpiEnvironment::Acquire();
  if (!env.ok()) return 3;
  auto t = CreateMpiP2pTransport(*env, std::chrono::seconds(30));
  if (!t.ok()) return 3;
  std::unique_ptr<P2pTransport> transport = std::move(*t);
  float message[4] = {1, 2, 3, 4};
  P2pMeta small;
  small.dtype = DType::kFloat32;
  small.shape = {4};
  small.bytes = sizeof(message);
  const auto deadline = Deadline::After(std::chrono::seconds(30));
  if (transport->rank() == 1) {
    // Once rank 0 has started its operations (its message on tag 4 says so).
    std::atomic<int> done{0};
    float go[4];
    transport->Recv(
        0, 4, deadline, [&](const P2pMeta&) -> void* { return go; },
        [&](const Status&) { done.fetch_add(1); });
    WaitFor(done, 1);
    transport->Send(0, 3, small, message, deadline, [&](const Status&) { done.fetch_add(1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    transport->Send(0, 5, small, message, deadline, [&](const Status&) { done.fetch_add(1); });
    transport->Send(0, 6, small, message, deadline, [&](const Status&) { done.fetch_add(1); });
    WaitFor(done, 4);
    std::this_thread::sleep_for(std::chrono::seconds(4));
    return 0;
  }
  std::atomic<bool> holding{false}, release{false}, placed_first{false}, first_ran_first{false};
  std::atomic<bool> placed_late{false};
  float landed[4] = {}, first[4] = {}, late[4] = {};
  struct Op {
    std::atomic<int> calls{0};
    Status status;
  };
  // The stuck recv, the recv completed in its round, a recv, a send, a late send.
  auto ops = std::make_shared<std::array<Op, 5>>();
  auto done_of = [ops](int i) {
    return [ops, i](const Status& s) {
      (*ops)[i].status = s;
      (*ops)[i].calls.fetch_add(1);
    };
  };
  transport->Recv(
      1, 5, deadline,
      [&, ops](const P2pMeta&) -> void* {
        first_ran_first = (*ops)[1].calls.load() != 0;  // then this run proves nothing
        holding = true;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return landed;
      },
      done_of(0));
  // Tag 3 comes first, and sorts first in a round: the round that places it holds the lock here
  // until tag 5 has come too, completes it, and sticks in tag 5's place.
  transport->Recv(
      1, 3, deadline,
      [&](const P2pMeta&) -> void* {
        placed_first = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        return first;
      },
      done_of(1));
  // Tag 6's message comes while the thread is stuck: it must not be placed once the transport gave
  // up (its recv completed then), when the released thread goes on with its round.
  transport->Recv(
      1, 6, deadline,
      [&](const P2pMeta&) -> void* {
        placed_late = true;
        return late;
      },
      done_of(2));
  std::vector<char> large(1 << 20, 1);
  P2pMeta big;
  big.shape = {static_cast<int64_t>(large.size())};
  big.bytes = large.size();
  transport->Send(1, 7, big, large.data(), deadline, done_of(3));
  transport->Send(1, 4, small, message, deadline, [](const Status&) {});
  for (int i = 0; i < 10000 && !holding; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // A waiter driving the transport leaves at its deadline, although it cannot take the lock.
  auto t0 = std::chrono::steady_clock::now();
  transport->Drive([] { return false; }, Deadline::After(std::chrono::milliseconds(200)),
                   std::chrono::microseconds(0));
  const double drive_took = seconds_since(t0);
  // The first to give up: Close(), or Finish() (which closes then: it returns true).
  const Status cause(Code::kPeerFailure, "rank 1 failed");
  t0 = std::chrono::steady_clock::now();
  bool closed = true;
  if (finish_first) {
    closed = transport->Finish(cause);
  } else {
    transport->Close(cause);
  }
  const double close_took = seconds_since(t0);
  // Completed in the stuck round, its callback still on the stuck thread's side: run by now.
  const bool first_by_close = (*ops)[1].calls.load() == 1 && (*ops)[1].status.ok() &&
                              std::memcmp(first, message, sizeof(message)) == 0;
  t0 = std::chrono::steady_clock::now();
  transport->Send(1, 8, small, message, deadline, done_of(4));
  closed = closed && transport->Finish(Status(Code::kNotInitialized, "finalized"));
  transport->Close(Status(Code::kNotInitialized, "closed"));
  const double later_took = seconds_since(t0);
  transport.reset();
  release = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the thread ends, if it would
  bool each_once = (*ops)[1].calls.load() == 1 && (*ops)[1].status.ok();
  for (size_t i = 0; i < ops->size(); ++i) {
    const Op& op = (*ops)[i];
    each_once =
        each_once && op.calls.load() == 1 &&
        (i == 1 || (op.status.code() == Code::kPeerFailure &&
                    op.status.message().find("rank 1 failed (point-to-point gave up on MPI") == 0));
  }
  const bool ok = holding && placed_first && !first_ran_first && drive_took > 0.15 &&
                  drive_took < 0.5 && close_took > 0.9 && close_took < 2.0 && first_by_close &&
                  later_took < 0.1 && closed && each_once && !placed_late;
  std::printf(
      "%s rank 0: Drive() took %.3f s, %s %.3f s (the recv completed in the stuck round: %s by "
      "then), a later send, Finish() and Close() %.3f s; the message that came meanwhile %s; "
      "completions:",
      ok ? "STUCK_OK" : "STUCK_FAIL", drive_took, finish_first ? "Finish()" : "Close()", close_took,
      first_by_close ? "run" : "NOT run", later_took,
      placed_late ? "PLACED after its recv completed" : "not placed");
  for (const Op& op : *ops) {
    std::printf(" [%d: %s]", op.calls.load(), op.status.ToString().c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
  return ok ? 0 : 1;
}

// np 2: rank 0 refuses rank 1's 64 MiB message while its data may grow by 4 MiB only
// (RLIMIT_DATA), less than the one piece its drop needs: the recv fails with kSystemError saying
// so, instead of std::bad_alloc ending the process, and the transport is closed (MPI cannot skip
// the pieces). Prints "DROP_NO_MEMORY_OK". Rank 1's send is never received: it times out and
// leaves MPI unfinalized, so mpirun ends the job non-zero. Not under a sanitizer (kSanitized).
int DropNoMemoryCase() {
  auto env = MpiEnvironment::Acquire();
  if (!env.ok()) return 3;
  auto t = CreateMpiP2pTransport(*env, std::chrono::seconds(30));
  if (!t.ok()) return 3;
  P2pTransport& transport = **t;
  std::atomic<int> done{0};
  Status status;
  const uint64_t bytes = uint64_t{64} << 20;
  if (transport.rank() == 1) {
    std::vector<char> message(bytes, 1);
    P2pMeta meta;
    meta.shape = {static_cast<int64_t>(bytes)};
    meta.bytes = bytes;
    transport.Send(0, 3, meta, message.data(), Deadline::After(std::chrono::seconds(3)),
                   [&](const Status& s) {
                     status = s;
                     done.fetch_add(1);
                   });
    WaitFor(done, 1);
    return 0;
  }
  rlimit old_limit{};
  if (::getrlimit(RLIMIT_DATA, &old_limit) != 0) return 3;
  rlimit low = old_limit;
  low.rlim_cur = DataBytes() + (uint64_t{4} << 20);
  if (::setrlimit(RLIMIT_DATA, &low) != 0) return 3;
  transport.Recv(
      1, 3, Deadline::After(std::chrono::seconds(10)), [](const P2pMeta&) { return nullptr; },
      [&](const Status& s) {
        status = s;
        done.fetch_add(1);
      });
  const bool finished = WaitFor(done, 1);
  ::setrlimit(RLIMIT_DATA, &old_limit);
  const bool ok = finished && status.code() == Code::kSystemError &&
                  status.message().find(
                      "no memory for a 16777216-byte buffer to drop the "
                      "refused 67108864-byte message") != std::string::npos;
  std::printf("%s rank 0: %s\n", ok ? "DROP_NO_MEMORY_OK" : "DROP_NO_MEMORY_FAIL",
              finished ? status.ToString().c_str() : "the recv did not end");
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace concord

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--timeout-case") == 0) return concord::TimeoutCase();
  if (argc == 2 && std::strcmp(argv[1], "--interrupt-case") == 0) return concord::InterruptCase();
  if (argc == 2 && std::strcmp(argv[1], "--closing-case") == 0) return concord::ClosingCase();
  if (argc == 2 && std::strcmp(argv[1], "--stalled-case") == 0) return concord::StalledCase();
  if (argc == 3 && std::strcmp(argv[1], "--stuck-case") == 0) {
    return concord::StuckCase(std::strcmp(argv[2], "finish") == 0);
  }
  if (argc == 2 && std::strcmp(argv[1], "--drop-no-memory-case") == 0) {
    return concord::DropNoMemoryCase();
  }
  ::testing::InitGoogleTest(&argc, argv);
  auto env = concord::MpiEnvironment::Acquire();
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", env.status().ToString().c_str());
    return 1;
  }
  auto held = std::make_unique<std::shared_ptr<concord::MpiEnvironment>>(std::move(*env));
  concord::g_env = held.get();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int rc = RUN_ALL_TESTS();
  held.reset();  // the last holder: Concord initialised MPI, so this finalizes it
  int finalized = 0;
  MPI_Finalized(&finalized);
  std::printf("mpi_backend_test rank %d: %s, MPI %s\n", rank, rc == 0 ? "PASS" : "FAIL",
              finalized ? "finalized" : "NOT finalized");
  return rc == 0 && finalized ? 0 : 1;
}
