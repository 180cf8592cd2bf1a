// The TCP control plane's liveness apart from progress: heartbeats come from the plane's own
// thread, so a rank away from Receive() (in a long collective, or an application that does not
// call into Concord) for several liveness timeouts is never called silent, while a rank that is
// frozen (SIGSTOP) is reported as PEER_FAILURE naming it within the timeout, whether or not the
// other side is listening.
//
// Ranks are threads of this process, or, for the frozen rank, a child process forked before this
// process starts any thread, rendezvousing through a FileStore in a fresh directory. The child
// never calls Receive() (only its plane's thread keeps it alive), lives at most kChildLifetime,
// dies with this process (PR_SET_PDEATHSIG), and is killed by PID when its test ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/tcp_control_plane.h"
#include "rendezvous/file_store.h"
#include "rendezvous/hash_store.h"
#include "tests/common/ranks.h"
#include "tests/common/temp_dir.h"
#include "tests/rendezvous/control_plane_test_util.h"

namespace concord {
namespace {

using harness::Planes;
using harness::ReceiveUntilError;
using std::chrono::milliseconds;

// Heartbeats every 125 ms: a live peer is heard at least four times per timeout.
constexpr milliseconds kLiveness{500};
// How much later than the timeout a frozen peer may be reported (a round's wake-up, the kernel's
// millisecond clock, a loaded machine).
constexpr milliseconds kDetectionSlack{400};
constexpr auto kChildLifetime = std::chrono::seconds(20);

TcpControlPlaneOptions Options(int rank, int size) {
  TcpControlPlaneOptions o;
  o.rank = rank;
  o.size = size;
  o.prefix = "job/comm0";
  o.connect_timeout = milliseconds(10000);
  o.liveness_timeout = kLiveness;
  return o;
}

Planes CreateAll(int size, Store* store) {
  return harness::CreateAllPlanes(size, store, [size](int r) { return Options(r, size); });
}

StatusOr<ControlMessage> ReceiveOne(ControlPlane* p, milliseconds within) {
  const Deadline deadline = Deadline::After(within);
  ControlMessage m;
  do {
    CONCORD_ASSIGN_OR_RETURN(const bool got, p->Receive(&m, deadline));
    if (got) return m;
  } while (!deadline.passed());
  return TimeoutError("no message");
}

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// (a) One rank stays away from Receive() for three liveness timeouts (a long collective) while
// the other keeps receiving: neither calls the other silent, and messages still flow both ways.
class AwayFromReceive : public ::testing::TestWithParam<int> {};

TEST_P(AwayFromReceive, IsNotSilence) {
  const int away = GetParam();
  const int listener = 1 - away;
  HashStore store;
  Planes planes = CreateAll(2, &store);
  ASSERT_TRUE(planes[0] && planes[1]);
  const Status heard = ReceiveUntilError(planes[listener].get(), 3 * kLiveness);
  EXPECT_TRUE(heard.ok()) << "rank " << listener << ": " << heard.ToString();
  ControlMessage m;
  auto got = planes[away]->Receive(&m, Deadline::After(milliseconds(0)));
  EXPECT_TRUE(got.ok()) << "rank " << away << ": " << got.status().ToString();
  ASSERT_TRUE(planes[away]->Send(listener, "back").ok());
  auto back = ReceiveOne(planes[listener].get(), milliseconds(5000));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->bytes, "back");
  ASSERT_TRUE(planes[listener]->Send(away, "welcome").ok());
  auto welcome = ReceiveOne(planes[away].get(), milliseconds(5000));
  ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
  EXPECT_EQ(welcome->bytes, "welcome");
}

INSTANTIATE_TEST_SUITE_P(Rank, AwayFromReceive, ::testing::Values(0, 1));

// Both ranks away (the same long collective) for three timeouts: nobody is silent afterwards.
TEST(TcpControlPlaneLiveness, BothAwayIsNotSilence) {
  HashStore store;
  Planes planes = CreateAll(3, &store);
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  std::this_thread::sleep_for(3 * kLiveness);
  harness::RunRanks(3, [&](int r) {
    const Status s = ReceiveUntilError(planes[r].get(), milliseconds(200));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
}

// While rank 1 is away, rank 0 sends it more than the sockets' buffers hold, so rank 0's queue
// never empties and it sends no heartbeats: rank 1's liveness thread reads the data off the socket
// at each round meanwhile, which lets more arrive (a sign of life) and keeps rank 1's heartbeats
// from backing up behind it. Nobody is called silent, and the message arrives whole.
TEST(TcpControlPlaneLiveness, AwayRankReceivingDataIsNotSilent) {
  HashStore store;
  Planes planes = CreateAll(2, &store);
  ASSERT_TRUE(planes[0] && planes[1]);
  const std::string big(32u << 20, 'b');
  ASSERT_TRUE(planes[0]->Send(1, big).ok());
  const Status heard = ReceiveUntilError(planes[0].get(), 3 * kLiveness);
  EXPECT_TRUE(heard.ok()) << heard.ToString();
  // Rank 0 keeps flushing the rest until rank 1 has it all.
  std::atomic<bool> done{false};
  Status at_rank0;
  std::thread serve([&] {
    while (!done.load() && at_rank0.ok()) {
      at_rank0 = ReceiveUntilError(planes[0].get(), milliseconds(10));
    }
  });
  auto got = ReceiveOne(planes[1].get(), milliseconds(10000));
  done = true;
  serve.join();
  EXPECT_TRUE(at_rank0.ok()) << at_rank0.ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->bytes == big);
}

// A rank in a child process: rendezvous through `dir`, then nothing but its plane's thread.
class ChildRank {
 public:
  ChildRank(const std::string& dir, int rank) {
    pid_ = ::fork();
    if (pid_ != 0) return;
    // The child: no gtest from here on, and _exit (nothing of the parent's is torn down twice).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto store = FileStore::Create(dir);
    if (!store.ok()) ::_exit(2);
    auto plane = CreateTcpControlPlane(Options(rank, 2), store->get());
    if (!plane.ok()) {
      std::fprintf(stderr, "child rank %d: %s\n", rank, plane.status().ToString().c_str());
      ::_exit(3);
    }
    std::this_thread::sleep_for(kChildLifetime);
    ::_exit(0);
  }
  ~ChildRank() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  ChildRank(const ChildRank&) = delete;
  ChildRank& operator=(const ChildRank&) = delete;

  pid_t pid() const { return pid_; }

  // Stops the child and waits until it is stopped.
  bool Freeze() {
    if (::kill(pid_, SIGSTOP) != 0) return false;
    int status = 0;
    return ::waitpid(pid_, &status, WUNTRACED) == pid_ && WIFSTOPPED(status);
  }

 private:
  pid_t pid_ = -1;
};

// (b) The child is the rank `frozen`; this process is the other one. The child, which never calls
// Receive(), stays alive for two timeouts; then it is stopped (SIGSTOP) and this side must report
// PEER_FAILURE naming it within the timeout (plus slack), either while blocked in Receive()
// (listening) or while doing nothing but Send(), which reads nothing (not listening). Two cases
// cover both directions of the star and both ways of waiting.
struct FreezeCase {
  int frozen;
  bool listening;
};

class FrozenRank : public ::testing::TestWithParam<FreezeCase> {};

TEST_P(FrozenRank, IsReportedWithinTheTimeout) {
  const FreezeCase c = GetParam();
  const int self = 1 - c.frozen;
  harness::TempDir dir("concord-liveness-");
  ASSERT_FALSE(dir.path().empty());
  ChildRank child(dir.path(), c.frozen);  // forked while this process runs no other thread
  ASSERT_GT(child.pid(), 0);
  auto store = FileStore::Create(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto made = CreateTcpControlPlane(Options(self, 2), store->get());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ControlPlane* plane = made->get();

  // Alive though it never receives: two timeouts, this side listening all along.
  const Status alive = ReceiveUntilError(plane, 2 * kLiveness);
  ASSERT_TRUE(alive.ok()) << alive.ToString();

  ASSERT_TRUE(child.Freeze());
  const auto frozen_at = Clock::now();
  Status s;
  if (c.listening) {
    s = ReceiveUntilError(plane, 10 * kLiveness);
  } else {
    while (s.ok() && Clock::now() - frozen_at < 10 * kLiveness) {
      std::this_thread::sleep_for(milliseconds(2));
      s = plane->Send(c.frozen, std::string());
    }
  }
  const auto took = Clock::now() - frozen_at;
  std::printf("rank %d frozen, rank %d %s: reported after %.3f s (timeout %.3f s): %s\n", c.frozen,
              self, c.listening ? "listening" : "not listening", Seconds(took), Seconds(kLiveness),
              s.ToString().c_str());
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  const std::string expect = "rank " + std::to_string(c.frozen) + " silent for 0.5 s";
  EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  // Its last heartbeat left at most a quarter of the timeout before it froze.
  EXPECT_GE(took, kLiveness * 3 / 4 - milliseconds(50));
  EXPECT_LE(took, kLiveness + kDetectionSlack);
}

INSTANTIATE_TEST_SUITE_P(Cases, FrozenRank,
                         ::testing::Values(FreezeCase{1, true}, FreezeCase{0, false}),
                         [](const ::testing::TestParamInfo<FreezeCase>& info) {
                           return "Rank" + std::to_string(info.param.frozen) +
                                  (info.param.listening ? "Listening" : "NotListening");
                         });

}  // namespace
}  // namespace concord
