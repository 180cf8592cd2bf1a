// Tests of the shared-memory backend (backends/shm) with ranks as threads over one in-memory
// store, through the segment and through direct reads: every collective, dtype and op at sizes 0,
// 1, odd and several chunks, each result compared bit for bit with the rank-order fold it promises
// (Backend::ReducesInRankOrder); a peer that never comes (timeout), an interrupt, a peer process
// killed with SIGKILL in the middle of collectives or exiting during the set-up (named at once;
// nothing left in /dev/shm), and a peer in another pid namespace (never taken for dead).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "base/dtype.h"
#include "rendezvous/file_store.h"
#include "rendezvous/hash_store.h"
#include "rendezvous/store.h"
#include "tests/common/comma_locale.h"
#include "tests/common/ranks.h"
#include "tests/common/temp_dir.h"
#include "tests/common/tensors.h"
#include "tests/gloo/gloo_test_util.h"

namespace concord {
namespace {

using harness::kAllDTypes;
using harness::kAllReduceOps;
using harness::StoreElement;
using testing_gloo::Options;
using testing_gloo::UniquePrefix;

// Each rank's share of the segment: small, so that the sizes below take several chunks.
constexpr size_t kBufferBytes = size_t{64} << 10;

// Every wait's deadline, unless a test sets its own.
constexpr std::chrono::milliseconds kTimeout{20000};

// Rank `rank`'s input: values of widely different magnitudes, so that the order of a sum shows in
// its bits; small integers for integer types.
std::vector<uint8_t> Input(DType dtype, int rank, size_t count, uint64_t salt = 0) {
  std::vector<uint8_t> data(count * DTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t h = (i + 1) * 2654435761u + rank * 40503u + salt * 977u;
    const double v = IsFloatingPoint(dtype)
                         ? (static_cast<double>(h % 2001) - 1000.0) * std::pow(10.0, h % 7 - 3.0)
                         : static_cast<double>(h % 9) + (dtype == DType::kUint8 ? 0 : -4);
    StoreElement(dtype, data.data(), i, v);
  }
  return data;
}

// The rank-order fold of every rank's input: what the backend promises, bit for bit.
std::vector<uint8_t> Fold(DType dtype, ReduceOp op, int size, size_t count, uint64_t salt = 0) {
  std::vector<uint8_t> acc = Input(dtype, 0, count, salt);
  for (int r = 1; r < size; ++r) {
    const std::vector<uint8_t> x = Input(dtype, r, count, salt);
    ReduceElements(acc.data(), acc.data(), x.data(), count, dtype, op);
  }
  return acc;
}

std::string Describe(DType dtype, ReduceOp op, size_t count) {
  return std::string(DTypeName(dtype)) + " " + ReduceOpName(op) + " count " + std::to_string(count);
}

// (ranks, direct): direct reads for every message, or the segment only.
class ShmBackendTest : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int size() const { return std::get<0>(GetParam()); }
  size_t direct_threshold() const { return std::get<1>(GetParam()) ? 0 : SIZE_MAX; }

  // Runs body(backend) on every rank, each with its own backend, and ends with a barrier.
  void RunRanks(const std::function<void(Backend&)>& body) {
    HashStore store;
    const std::string prefix = UniquePrefix();
    harness::RunRanks(size(), [&](int rank) {
      StatusOr<std::unique_ptr<Backend>> backend = CreateShmBackend(
          Options(rank, size(), prefix, kTimeout), &store, kBufferBytes, direct_threshold());
      ASSERT_TRUE(backend.ok()) << backend.status().ToString();
      EXPECT_TRUE((*backend)->ReducesInRankOrder());
      body(**backend);
      if (!::testing::Test::HasFailure()) {
        EXPECT_TRUE((*backend)->Barrier().ok());
      }
    });
  }
};

TEST_P(ShmBackendTest, AllreduceIsTheRankOrderFold) {
  RunRanks([&](Backend& backend) {
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{70001}}) {
          std::vector<uint8_t> data = Input(dtype, backend.rank(), count);
          const Status s = backend.Allreduce(count ? data.data() : nullptr, count, dtype, op);
          ASSERT_TRUE(s.ok()) << s.ToString();
          ASSERT_TRUE(data == Fold(dtype, op, backend.size(), count)) << Describe(dtype, op, count);
        }
      }
    }
  });
}

TEST_P(ShmBackendTest, AllreduceSpansIsTheFoldOfTheirConcatenation) {
  RunRanks([&](Backend& backend) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64}) {
      const std::vector<size_t> counts = {13, 0, 40000, 1, 9000};
      std::vector<std::vector<uint8_t>> data;
      std::vector<AllreduceSpan> spans;
      for (size_t k = 0; k < counts.size(); ++k) {
        data.push_back(Input(dtype, backend.rank(), counts[k], k));
      }
      for (size_t k = 0; k < counts.size(); ++k) spans.push_back({data[k].data(), counts[k]});
      const Status s = backend.AllreduceSpans(spans, dtype, ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (size_t k = 0; k < counts.size(); ++k) {
        EXPECT_TRUE(data[k] == Fold(dtype, ReduceOp::kSum, backend.size(), counts[k], k))
            << DTypeName(dtype) << " span " << k;
      }
    }
  });
}

TEST_P(ShmBackendTest, ReduceScatterGivesEachRankTheFoldOfItsBlock) {
  RunRanks([&](Backend& backend) {
    const int n = backend.size();
    std::vector<size_t> counts;
    for (int r = 0; r < n; ++r) counts.push_back(std::vector<size_t>{20011, 0, 1, 5000}[r % 4]);
    size_t total = 0, start = 0;
    for (int r = 0; r < n; ++r) {
      if (r < backend.rank()) start += counts[r];
      total += counts[r];
    }
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const std::vector<uint8_t> in = Input(dtype, backend.rank(), total);
        const size_t element = DTypeSize(dtype);
        std::vector<uint8_t> out(counts[backend.rank()] * element + 1, 0xEE);
        const Status s = backend.ReduceScatter(in.data(), out.data(), counts, dtype, op);
        ASSERT_TRUE(s.ok()) << s.ToString();
        const std::vector<uint8_t> want = Fold(dtype, op, n, total);
        ASSERT_EQ(0, std::memcmp(out.data(), want.data() + start * element, out.size() - 1))
            << Describe(dtype, op, counts[backend.rank()]);
        EXPECT_EQ(out.back(), 0xEE) << "wrote past its block";
      }
    }
  });
}

// Byte i of what rank `from` sends rank `to` (or contributes, for `to` = -1).
uint8_t Byte(int from, int to, size_t i) {
  return static_cast<uint8_t>(i * 31 + from * 7 + to);
}

TEST_P(ShmBackendTest, AllgathervConcatenatesEveryRanksBytes) {
  RunRanks([&](Backend& backend) {
    const int n = backend.size();
    std::vector<size_t> bytes;
    for (int r = 0; r < n; ++r) bytes.push_back(std::vector<size_t>{100003, 0, 1, 33333}[r % 4]);
    std::vector<uint8_t> in(bytes[backend.rank()]);
    for (size_t i = 0; i < in.size(); ++i) in[i] = Byte(backend.rank(), -1, i);
    size_t total = 0;
    for (size_t b : bytes) total += b;
    std::vector<uint8_t> out(total);
    const Status s = backend.Allgatherv(in.data(), out.data(), bytes);
    ASSERT_TRUE(s.ok()) << s.ToString();
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < bytes[r]; ++i) {
        ASSERT_EQ(out[at + i], Byte(r, -1, i)) << "rank " << r << "'s byte " << i;
      }
      at += bytes[r];
    }
  });
}

TEST_P(ShmBackendTest, BroadcastFromEveryRoot) {
  RunRanks([&](Backend& backend) {
    for (int root = 0; root < backend.size(); ++root) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{100003}}) {
        std::vector<uint8_t> data(bytes, 0);
        if (backend.rank() == root) {
          for (size_t i = 0; i < bytes; ++i) data[i] = Byte(root, -1, i);
        }
        const Status s = backend.Broadcast(data.data(), bytes, root);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(data[i], Byte(root, -1, i)) << "root " << root << " byte " << i;
        }
      }
    }
  });
}

TEST_P(ShmBackendTest, AlltoallvDeliversEveryPairsBytes) {
  RunRanks([&](Backend& backend) {
    const int n = backend.size();
    const int me = backend.rank();
    // Pair sizes from 0 to several windows, different in each direction.
    auto pair_bytes = [](int from, int to) { return size_t((from + 1) * (to + 2) * 4099) % 70000; };
    std::vector<size_t> send(n), recv(n);
    size_t send_total = 0, recv_total = 0;
    for (int r = 0; r < n; ++r) {
      send[r] = pair_bytes(me, r);
      recv[r] = pair_bytes(r, me);
      send_total += send[r];
      recv_total += recv[r];
    }
    std::vector<uint8_t> in(send_total), out(recv_total, 0);
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < send[r]; ++i) in[at + i] = Byte(me, r, i);
      at += send[r];
    }
    const Status s = backend.Alltoallv(in.data(), send, out.data(), recv);
    ASSERT_TRUE(s.ok()) << s.ToString();
    at = 0;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < recv[r]; ++i) {
        ASSERT_EQ(out[at + i], Byte(r, me, i)) << "from rank " << r << " byte " << i;
      }
      at += recv[r];
    }
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndPaths, ShmBackendTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<ShmBackendTest::ParamType>& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) ? "direct" : "segment");
                         });

// Bad arguments, the same on every rank: each collective refuses them with kInvalidArgument on
// every rank, before touching the segment (a root or a size list beyond the ranks once read and
// wrote past them), and the backend stays usable.
TEST(ShmBackendArgumentsTest, BadArgumentsAreRefusedAndTheBackendStaysUsable) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  harness::RunRanks(2, [&](int rank) {
    auto made = CreateShmBackend(Options(rank, 2, prefix, kTimeout), &store, kBufferBytes, 0);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    Backend& backend = **made;
    std::vector<float> data(8, 1.0f), out(64, 0.0f);
    auto refused = [](const Status& s, const char* what) {
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << what << ": " << s.ToString();
      EXPECT_NE(s.message().find("shm "), std::string::npos) << what << ": " << s.ToString();
    };
    refused(backend.Broadcast(data.data(), 32, 2), "broadcast root 2");
    refused(backend.Broadcast(data.data(), 32, -1), "broadcast root -1");
    refused(backend.Broadcast(nullptr, 32, 0), "broadcast null");
    refused(backend.Allgatherv(data.data(), out.data(), {4}), "allgatherv 1 size");
    refused(backend.Allgatherv(data.data(), out.data(), {4, 4, 4}), "allgatherv 3 sizes");
    refused(backend.Allgatherv(nullptr, out.data(), {4, 4}), "allgatherv null in");
    refused(
        backend.ReduceScatter(data.data(), out.data(), {1, 1, 1}, DType::kFloat32, ReduceOp::kSum),
        "reduce-scatter 3 counts");
    refused(backend.ReduceScatter(data.data(), nullptr, {1, 1}, DType::kFloat32, ReduceOp::kSum),
            "reduce-scatter null out");
    refused(backend.Alltoallv(data.data(), {4, 4, 4}, out.data(), {4, 4}), "alltoallv 3 sends");
    refused(backend.Alltoallv(data.data(), {4, 4}, out.data(), {4}), "alltoallv 1 receive");
    refused(backend.Alltoallv(data.data(), {4, 4}, nullptr, {4, 4}), "alltoallv null out");
    refused(backend.Allreduce(data.data(), 8, static_cast<DType>(99), ReduceOp::kSum),
            "allreduce dtype 99");
    refused(backend.Allreduce(data.data(), 8, DType::kFloat32, static_cast<ReduceOp>(99)),
            "allreduce op 99");
    refused(backend.Allreduce(nullptr, 8, DType::kFloat32, ReduceOp::kSum), "allreduce null");
    const Status s = backend.Allreduce(data.data(), 8, DType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(data[7], 2.0f);
  });
}

// The failure tests' set-up: a file store in a directory of its own, which the ranks this test
// forks share (a HashStore lives in one process's memory). Each test's ranks use a fresh prefix.
class ShmBackendFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    auto store = FileStore::Create(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }

  Store* store() { return store_.get(); }

 private:
  harness::TempDir dir_{"concord-shm-test-"};
  std::unique_ptr<FileStore> store_;
};

TEST_F(ShmBackendFailureTest, APeerThatNeverComesTimesOutNamingIt) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  harness::Latch done(1);
  harness::RunRanks(2, [&](int rank) {
    auto backend = CreateShmBackend(Options(rank, 2, prefix, std::chrono::milliseconds(300)),
                                    &store, kBufferBytes, 0);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    if (rank == 1) {
      ASSERT_TRUE(done.Wait());
      // The group is aborted: rank 1's first collective fails at once, naming rank 0.
      const Status s = (*backend)->Barrier();
      EXPECT_EQ(s.code(), Code::kBackendError) << s.ToString();
      EXPECT_NE(s.message().find("rank 0 abandoned"), std::string::npos) << s.ToString();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const Status s = (*backend)->Barrier();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1300));
    EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
    EXPECT_NE(s.message().find("rank(s) 1 did not arrive"), std::string::npos) << s.ToString();
    EXPECT_EQ((*backend)->Barrier().message(), s.message()) << "later calls return the error";
    done.CountDown();
  });
}

TEST_F(ShmBackendFailureTest, InterrupterEndsAWaitPromptly) {
  HashStore store;
  const std::string prefix = UniquePrefix();
  harness::RunRanks(2, [&](int rank) {
    auto backend = CreateShmBackend(Options(rank, 2, prefix, kTimeout), &store, kBufferBytes, 0);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    if (rank == 1) return;  // never arrives; its backend goes away
    std::function<void()> interrupt = (*backend)->Interrupter();
    std::thread interrupter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      interrupt();
    });
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> data(100000, 1.0f);
    const Status s =
        (*backend)->Allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
    interrupter.join();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    EXPECT_EQ(s.code(), Code::kBackendError) << s.ToString();
    EXPECT_NE(s.message().find("interrupted"), std::string::npos) << s.ToString();
  });
}

// The names in /dev/shm of segments created by process `pid` (shm_segment.cc names them).
std::vector<std::string> SegmentsOf(pid_t pid) {
  std::vector<std::string> names;
  const std::string prefix = "concord-" + std::to_string(pid) + "-";
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir)) {
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) {
        names.push_back(entry->d_name);
      }
    }
    ::closedir(dir);
  }
  return names;
}

// A child process is rank 1; it SIGKILLs itself while both ranks run allreduces (the segment's
// and direct ones). This process, rank 0, must fail naming rank 1 long before its 20 s timeout,
// and no segment may remain in /dev/shm.
TEST_F(ShmBackendFailureTest, APeerKilledMidCollectiveIsNamedAndLeavesNothingBehind) {
  for (const size_t direct_threshold : {SIZE_MAX, size_t{0}}) {
    const std::string prefix = UniquePrefix();
    std::vector<float> data(size_t{4} << 20, 1.0f);  // 16 MiB: many chunks
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto backend = CreateShmBackend(Options(1, 2, prefix, kTimeout), store(), kBufferBytes,
                                      direct_threshold);
      if (!backend.ok()) ::_exit(3);
      std::thread killer([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        ::raise(SIGKILL);
      });
      // Until the killer ends this process (an error, which cannot come first, exits 4).
      while (
          (*backend)->Allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum).ok()) {
      }
      ::_exit(4);
    }
    auto backend =
        CreateShmBackend(Options(0, 2, prefix, kTimeout), store(), kBufferBytes, direct_threshold);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    EXPECT_TRUE(SegmentsOf(::getpid()).empty()) << "the segment's name outlived its set-up";
    const auto start = std::chrono::steady_clock::now();
    Status s;
    while (s.ok())
      s = (*backend)->Allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    backend->reset();
    EXPECT_TRUE(SegmentsOf(::getpid()).empty());
  }
}

// As above, on direct reads only, with the ranks known to the job by other numbers (as a
// hierarchical backend's ranks on one host are: BackendOptions::rank_names): the survivor names
// the victim by its number in the job wherever it finds it gone, in a barrier or in a read of its
// memory (the reads named it by its number on this host).
TEST_F(ShmBackendFailureTest, APeerKilledMidDirectAllreduceIsNamedByItsNumberInTheJob) {
  const std::string prefix = UniquePrefix();
  auto options = [&](int rank) {
    BackendOptions named = Options(rank, 2, prefix, kTimeout);
    named.rank_names = {4, 9};
    return named;
  };
  std::vector<float> data(size_t{4} << 20, 1.0f);  // 16 MiB: most of the time goes to reads
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto backend = CreateShmBackend(options(1), store(), kBufferBytes, 0);
    if (!backend.ok()) ::_exit(3);
    std::thread killer([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      ::raise(SIGKILL);
    });
    while ((*backend)->Allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum).ok()) {
    }
    ::_exit(4);
  }
  auto backend = CreateShmBackend(options(0), store(), kBufferBytes, 0);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  Status s;
  while (s.ok()) {
    s = (*backend)->Allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
  }
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 9"), std::string::npos) << s.ToString();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

// A direct allreduce that fails on one rank must not return there while a peer may still write
// into that rank's buffer (the caller frees or reuses it at once). Rank 1 (a child process) is
// stopped (SIGSTOP) in the middle of its part, once it wrote its first piece into rank 0's
// buffer; rank 0 is interrupted meanwhile, so its allreduce fails; rank 1 resumes 300 ms later.
// When rank 0's allreduce returns, the test overwrites the buffer: nothing may change it after.
// (Before the fix rank 0 returned at once, and rank 1 went on writing the rest of its part.) An
// attempt in which rank 1 finished its part before the stop (a busy machine) proves nothing and
// is run again.
TEST_F(ShmBackendFailureTest, AFailedDirectAllreduceReturnsOnceNoPeerWritesIntoItsBuffer) {
  const size_t count = size_t{4} << 20;  // 16 MiB: rank 1 writes its half in 128 KiB pieces
  bool proved = false;
  for (int attempt = 0; attempt < 5 && !proved && !HasFailure(); ++attempt) {
    const std::string prefix = UniquePrefix();
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto backend = CreateShmBackend(Options(1, 2, prefix, kTimeout), store(), kBufferBytes, 0);
      if (!backend.ok()) ::_exit(3);
      std::vector<float> data(count, 2.0f);
      const Status s = (*backend)->Allreduce(data.data(), count, DType::kFloat32, ReduceOp::kSum);
      ::_exit(s.ok() ? 4 : 5);
    }
    auto backend = CreateShmBackend(Options(0, 2, prefix, kTimeout), store(), kBufferBytes, 0);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    std::vector<float> data(count, 1.0f);
    const std::function<void()> interrupt = (*backend)->Interrupter();
    bool stopped = false;
    std::atomic<bool> returned{false};
    std::thread stopper([&] {
      // Rank 1's part begins at count / 2: its first piece lands there. (On a busy machine the
      // allreduce may complete, and the buffer be overwritten, before this thread looks.)
      const volatile float* first = data.data() + count / 2;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (*first != 3.0f && !returned.load() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::yield();
      }
      stopped = *first == 3.0f && ::kill(child, SIGSTOP) == 0;
      interrupt();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::kill(child, SIGCONT);
    });
    const Status s = (*backend)->Allreduce(data.data(), count, DType::kFloat32, ReduceOp::kSum);
    returned = true;
    std::fill(data.begin(), data.end(), 7.0f);  // the caller reuses its buffer
    stopper.join();
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    if (s.ok()) continue;  // rank 1 was done before the stop
    ASSERT_TRUE(stopped) << "rank 1 never wrote into rank 0's buffer";
    proved = true;
    EXPECT_EQ(s.code(), Code::kBackendError) << s.ToString();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 5) << status;
    const size_t changed = count - std::count(data.begin(), data.end(), 7.0f);
    EXPECT_EQ(changed, 0u) << "rank 1 wrote into rank 0's buffer after rank 0's allreduce returned";
  }
  EXPECT_TRUE(proved) << "rank 1 finished its part before it was stopped, in every attempt";
}

// A store that ends this process (exit status 3) the moment it is asked to read (kGet) or write
// (kSet) the segment's name: a rank dying before it mapped the segment (kGet, any rank but 0), or
// after it created the segment and before it published the name (kSet, rank 0).
class DiesAtTheNameStore : public Store {
 public:
  enum class At { kGet, kSet };
  DiesAtTheNameStore(Store* inner, At at) : inner_(inner), at_(at) {}
  Status Set(const std::string& key, const std::string& value) override {
    if (at_ == At::kSet && IsTheName(key)) ::_exit(3);
    return inner_->Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override {
    if (at_ == At::kGet && IsTheName(key)) ::_exit(3);
    return inner_->Get(key, deadline);
  }
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override {
    return inner_->Wait(keys, deadline);
  }
  StatusOr<FoundKey> GetFirst(const std::vector<std::string>& keys, Deadline deadline) override {
    if (at_ == At::kGet && std::any_of(keys.begin(), keys.end(), IsTheName)) ::_exit(3);
    return inner_->GetFirst(keys, deadline);
  }
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_->Add(key, delta);
  }

 private:
  static bool IsTheName(const std::string& key) {
    const std::string name = "/name";
    return key.size() >= name.size() &&
           key.compare(key.size() - name.size(), name.size(), name) == 0;
  }

  Store* const inner_;
  const At at_;
};

// Rank 1 (a child process) exits during the set-up, after rank 0 created the segment: rank 0 fails
// naming it long before its 20 s timeout, and the segment's name is gone at once.
TEST_F(ShmBackendFailureTest, APeerThatExitsDuringSetUpIsNamedAndLeavesNothingBehind) {
  const std::string prefix = UniquePrefix();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DiesAtTheNameStore dying(store(), DiesAtTheNameStore::At::kGet);
    (void)CreateShmBackend(Options(1, 2, prefix, kTimeout), &dying, kBufferBytes, 0);
    ::_exit(4);  // not reached: the store ends the process first
  }
  const auto start = std::chrono::steady_clock::now();
  auto backend = CreateShmBackend(Options(0, 2, prefix, kTimeout), store(), kBufferBytes, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), Code::kPeerFailure) << backend.status().ToString();
  EXPECT_NE(backend.status().message().find("rank 1 (pid " + std::to_string(child) +
                                            ") exited while shared memory was set up"),
            std::string::npos)
      << backend.status().ToString();
  EXPECT_TRUE(SegmentsOf(::getpid()).empty()) << "the segment's name outlived a failed set-up";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
}

// Rank 0 (a child process) exits after it created the segment and before it published the name:
// rank 1 fails naming it, and unlinks the name, which nobody else knows.
TEST_F(ShmBackendFailureTest, ACreatorThatExitsBeforePublishingLeavesNothingBehind) {
  const std::string prefix = UniquePrefix();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DiesAtTheNameStore dying(store(), DiesAtTheNameStore::At::kSet);
    (void)CreateShmBackend(Options(0, 2, prefix, kTimeout), &dying, kBufferBytes, 0);
    ::_exit(4);  // not reached: the store ends the process first
  }
  const auto start = std::chrono::steady_clock::now();
  auto backend = CreateShmBackend(Options(1, 2, prefix, kTimeout), store(), kBufferBytes, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), Code::kPeerFailure) << backend.status().ToString();
  EXPECT_NE(backend.status().message().find("rank 0 (pid " + std::to_string(child) + ")"),
            std::string::npos)
      << backend.status().ToString();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  const std::vector<std::string> left = SegmentsOf(child);
  EXPECT_TRUE(left.empty()) << "/dev/shm/" << left.front() << " outlived its creator";
  for (const std::string& name : left) ::shm_unlink(("/" + name).c_str());
}

// Rank 1 runs in pid and mount namespaces of its own, with its own /proc (as ranks that
// CONCORD_HOST_ID puts on one host may): its pid names another process in rank 0's namespace,
// and rank 0's pid none in its. Neither may take the other for dead while it is late (each is, in
// turn); the collectives stay exact (through the segment: direct reads need the peer's pid). This
// process has used shared memory before it forks rank 1's parent: what it learnt of its own pid
// namespace then does not hold for rank 1.
TEST_F(ShmBackendFailureTest, APeerInAnotherPidNamespaceIsNotTakenForDead) {
  {
    HashStore warm_store;
    const std::string warm_prefix = UniquePrefix();
    harness::RunRanks(2, [&](int rank) {
      auto backend =
          CreateShmBackend(Options(rank, 2, warm_prefix, kTimeout), &warm_store, kBufferBytes, 0);
      ASSERT_TRUE(backend.ok()) << backend.status().ToString();
      EXPECT_TRUE((*backend)->Barrier().ok());
    });
  }
  const std::string prefix = UniquePrefix();
  constexpr int kRounds = 4;
  constexpr size_t kCount = 100003;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    const char no = 'n';
    // The next child is the first process of a new pid namespace (pid 1 there).
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
      (void)!::write(pipe_fds[1], &no, 1);
      ::_exit(0);
    }
    const pid_t rank1 = ::fork();
    if (rank1 < 0) ::_exit(5);
    if (rank1 == 0) {
      // Its own /proc, seen by nobody else: mounts here stay in this mount namespace.
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
        (void)!::write(pipe_fds[1], &no, 1);
        ::_exit(0);
      }
      const char yes = 'y';
      (void)!::write(pipe_fds[1], &yes, 1);
      auto backend = CreateShmBackend(Options(1, 2, prefix, kTimeout), store(), kBufferBytes, 0);
      if (!backend.ok()) ::_exit(3);
      for (int round = 0; round < kRounds; ++round) {
        // Rank 0 waits meanwhile; in odd rounds rank 1 waits for rank 0.
        if (round % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::vector<float> data(kCount, 2.0f);
        if (!(*backend)->Allreduce(data.data(), kCount, DType::kFloat32, ReduceOp::kSum).ok() ||
            data[kCount - 1] != 3.0f) {
          ::_exit(4);
        }
      }
      ::_exit(0);
    }
    int status = 0;
    if (::waitpid(rank1, &status, 0) != rank1) ::_exit(6);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 7);
  }
  ::close(pipe_fds[1]);
  char verdict = 'n';
  ASSERT_EQ(::read(pipe_fds[0], &verdict, 1), 1);
  ::close(pipe_fds[0]);
  if (verdict != 'y') {
    ASSERT_EQ(::waitpid(child, nullptr, 0), child);
    GTEST_SKIP() << "new pid and mount namespaces are not permitted here (CAP_SYS_ADMIN)";
  }
  auto backend = CreateShmBackend(Options(0, 2, prefix, kTimeout), store(), kBufferBytes, 0);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  for (int round = 0; round < kRounds; ++round) {
    if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<float> data(kCount, 1.0f);
    const Status s = (*backend)->Allreduce(data.data(), kCount, DType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.ToString();
    EXPECT_EQ(data[0], 3.0f);
    EXPECT_EQ(data[kCount - 1], 3.0f);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// The segment's name holds this process's pid as concordrun and the lifeline look for it when they
// remove a dead rank's segments (/dev/shm/concord-<pid>-*), whatever global C++ locale the
// application set: de_DE's groups the digits ("12.345").
TEST(ShmSegmentNameTest, ThePidIsNotGroupedWhateverTheApplicationsLocale) {
  harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  std::ostringstream grouped;
  grouped << ::getpid();
  if (grouped.str() == std::to_string(::getpid())) {
    GTEST_SKIP() << "this process's pid, " << ::getpid() << ", has no digits to group";
  }
  HashStore store;
  const std::string prefix = UniquePrefix();
  harness::RunRanks(2, [&](int rank) {
    auto backend = CreateShmBackend(Options(rank, 2, prefix, kTimeout), &store, kBufferBytes, 0);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  });
  const StatusOr<std::string> name =
      store.Get(prefix + "/name", Deadline::After(std::chrono::milliseconds(0)));
  ASSERT_TRUE(name.ok()) << name.status().ToString();
  EXPECT_EQ(name->rfind("/concord-" + std::to_string(::getpid()) + "-", 0), 0u) << *name;
}

TEST(ShmHostIdentityTest, StableAndOverridable) {
  EXPECT_EQ(ShmHostIdentity(""), ShmHostIdentity(""));
  EXPECT_NE(ShmHostIdentity("").find("mnt:"), std::string::npos) << ShmHostIdentity("");
  EXPECT_EQ(ShmHostIdentity("rack7-node3"), "id:rack7-node3");
}

}  // namespace
}  // namespace concord
