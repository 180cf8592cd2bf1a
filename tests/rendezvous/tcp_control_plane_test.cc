// The TCP control plane with ranks as threads over 127.0.0.1, rendezvousing through a HashStore.
#include "backends/tcp_control_plane.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/hash_store.h"
#include "rendezvous/net.h"
#include "tests/common/ranks.h"
#include "tests/rendezvous/control_plane_test_util.h"

namespace concord {
namespace {

using harness::Planes;
using harness::ReceiveUntilError;
using std::chrono::milliseconds;

TcpControlPlaneOptions Options(int rank, int size) {
  TcpControlPlaneOptions o;
  o.rank = rank;
  o.size = size;
  o.prefix = "job/comm0";
  o.connect_timeout = milliseconds(5000);
  o.liveness_timeout = milliseconds(5000);
  return o;
}

// Creates all ranks' planes concurrently (the call is collective).
Planes CreateAll(int size, HashStore* store,
                 const std::function<void(TcpControlPlaneOptions*)>& tweak = nullptr) {
  return harness::CreateAllPlanes(size, store, [&](int r) {
    TcpControlPlaneOptions o = Options(r, size);
    if (tweak) tweak(&o);
    return o;
  });
}

// Receives one message within the deadline or fails the test.
ControlMessage MustReceive(ControlPlane* p, milliseconds within = milliseconds(5000)) {
  const Deadline deadline = Deadline::After(within);
  ControlMessage m;
  for (;;) {
    auto got = p->Receive(&m, deadline);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok()) return m;
    if (*got) return m;
    if (deadline.passed()) {
      ADD_FAILURE() << "no message within the deadline";
      return m;
    }
  }
}

TEST(TcpControlPlaneTest, SizeOneNeedsNoSockets) {
  auto p = CreateTcpControlPlane(Options(0, 1), nullptr);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ((*p)->rank(), 0);
  EXPECT_EQ((*p)->size(), 1);
  EXPECT_EQ((*p)->Send(0, "x").code(), Code::kInvalidArgument);
  ControlMessage m;
  auto got = (*p)->Receive(&m, Deadline::After(milliseconds(30)));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  (*p)->Wake();
  const auto start = std::chrono::steady_clock::now();
  got = (*p)->Receive(&m, Deadline::After(milliseconds(5000)));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

TEST(TcpControlPlaneTest, InvalidOptions) {
  HashStore store;
  EXPECT_EQ(CreateTcpControlPlane(Options(2, 2), &store).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(CreateTcpControlPlane(Options(-1, 2), &store).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(CreateTcpControlPlane(Options(0, 0), &store).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(CreateTcpControlPlane(Options(1, 2), nullptr).status().code(), Code::kInvalidArgument);
  TcpControlPlaneOptions o = Options(0, 1);
  o.liveness_timeout = milliseconds(0);
  EXPECT_EQ(CreateTcpControlPlane(o, &store).status().code(), Code::kInvalidArgument);
}

class TcpControlPlaneSizes : public ::testing::TestWithParam<int> {};

TEST_P(TcpControlPlaneSizes, MessagesArriveInOrderAndWhole) {
  const int size = GetParam();
  HashStore store;
  Planes planes = CreateAll(size, &store);
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  constexpr int kCount = 200;
  std::atomic<int> finished{0};
  harness::RunRanks(size, [&](int r) {
    ControlPlane* p = planes[r].get();
    EXPECT_EQ(p->rank(), r);
    EXPECT_EQ(p->size(), size);
    // Rank 0 talks to everyone; the others only to rank 0.
    const std::vector<int> peers = [&] {
      std::vector<int> v;
      if (r == 0) {
        for (int q = 1; q < size; ++q) v.push_back(q);
      } else {
        v.push_back(0);
      }
      return v;
    }();
    for (int i = 0; i < kCount; ++i) {
      for (int to : peers) {
        // Sizes vary: empty, small, odd, a few KiB.
        const std::string msg = std::to_string(r) + ":" + std::to_string(i) +
                                std::string(i % 7 == 0 ? 0 : (i * 37) % 5000, 'z');
        EXPECT_TRUE(p->Send(to, i == 0 ? std::string() : msg).ok());
      }
    }
    std::vector<int> next(size, 0);
    for (size_t n = 0; n < kCount * peers.size(); ++n) {
      ControlMessage m = MustReceive(p);
      ASSERT_GE(m.from, 0);
      ASSERT_LT(m.from, size);
      const int i = next[m.from]++;
      const std::string expect = i == 0 ? std::string()
                                        : std::to_string(m.from) + ":" + std::to_string(i) +
                                              std::string(i % 7 == 0 ? 0 : (i * 37) % 5000, 'z');
      ASSERT_EQ(m.bytes, expect) << "rank " << r << " from " << m.from << " message " << i;
    }
    // Nothing else arrives; keep flushing until every rank has all its messages.
    ++finished;
    ControlMessage extra;
    while (finished.load() < size) {
      auto got = p->Receive(&extra, Deadline::After(milliseconds(10)));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_FALSE(*got);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, TcpControlPlaneSizes, ::testing::Values(1, 2, 3, 4));

TEST(TcpControlPlaneTest, LargeMessagesBothWaysAtOnce) {
  HashStore store;
  Planes planes = CreateAll(3, &store);
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  const size_t kBytes = 8u << 20;
  auto payload = [&](int from, int n) {
    std::string s(kBytes + n, '\0');
    for (size_t i = 0; i < s.size(); i += 4096) s[i] = static_cast<char>(from * 31 + n + i / 4096);
    return s;
  };
  std::atomic<int> finished{0};
  harness::RunRanks(3, [&](int r) {
    ControlPlane* p = planes[r].get();
    // Everyone sends first (Send never blocks), then receives: no deadlock.
    for (int n = 0; n < 2; ++n) {
      if (r == 0) {
        EXPECT_TRUE(p->Send(1, payload(0, n)).ok());
        EXPECT_TRUE(p->Send(2, payload(0, n)).ok());
      } else {
        EXPECT_TRUE(p->Send(0, payload(r, n)).ok());
      }
    }
    std::vector<int> seen(3, 0);
    const int expected = r == 0 ? 4 : 2;
    for (int k = 0; k < expected; ++k) {
      ControlMessage m = MustReceive(p, milliseconds(20000));
      ASSERT_TRUE(m.bytes == payload(m.from, seen[m.from])) << "rank " << r << " from " << m.from;
      ++seen[m.from];
    }
    // Queued bytes leave while Receive() runs (and at the liveness thread's rare rounds): keep
    // serving until everyone has its data.
    ++finished;
    ControlMessage extra;
    while (finished.load() < 3) {
      auto got = p->Receive(&extra, Deadline::After(milliseconds(10)));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_FALSE(*got);
    }
  });
}

// Two ranks drain large messages towards each other at once: each Drain() keeps reading what
// arrives, so neither blocks the other (a rank whose own queue emptied first goes on reading in
// Receive()), and both messages arrive whole.
TEST(TcpControlPlaneTest, DrainingTowardsEachOtherCompletes) {
  HashStore store;
  Planes planes = CreateAll(2, &store);
  ASSERT_TRUE(planes[0] && planes[1]);
  const std::string to_one(32u << 20, 'a'), to_zero(32u << 20, 'b');
  std::thread zero([&] {
    ASSERT_TRUE(planes[0]->Send(1, to_one).ok());
    Status s = planes[0]->Drain(Deadline::After(milliseconds(20000)));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(MustReceive(planes[0].get(), milliseconds(20000)).bytes == to_zero);
  });
  ASSERT_TRUE(planes[1]->Send(0, to_zero).ok());
  Status s = planes[1]->Drain(Deadline::After(milliseconds(20000)));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(MustReceive(planes[1].get(), milliseconds(20000)).bytes == to_one);
  zero.join();
}

// A peer that does not read makes Drain() time out, naming it; what was queued still arrives
// once the peer reads.
TEST(TcpControlPlaneTest, DrainTimesOutWhenThePeerDoesNotRead) {
  HashStore store;
  Planes planes = CreateAll(2, &store);
  ASSERT_TRUE(planes[0] && planes[1]);
  const std::string big(64u << 20, 'x');  // more than the sockets' buffers hold
  ASSERT_TRUE(planes[0]->Send(1, big).ok());
  Status s = planes[0]->Drain(Deadline::After(milliseconds(300)));
  EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  std::thread reader(
      [&] { EXPECT_TRUE(MustReceive(planes[1].get(), milliseconds(20000)).bytes == big); });
  s = planes[0]->Drain(Deadline::After(milliseconds(20000)));
  EXPECT_TRUE(s.ok()) << s.ToString();
  reader.join();
}

TEST(TcpControlPlaneTest, WakeInterruptsReceive) {
  HashStore store;
  Planes planes = CreateAll(2, &store);
  ASSERT_NE(planes[0], nullptr);
  const auto start = std::chrono::steady_clock::now();
  std::thread waker([&] {
    // Lets Receive() block first. Not an ordering the result depends on: a wake that came first
    // would end Receive() at once too (a wake is kept until a Receive() takes it).
    std::this_thread::sleep_for(milliseconds(100));
    planes[0]->Wake();
  });
  ControlMessage m;
  auto got = planes[0]->Receive(&m, Deadline::After(milliseconds(10000)));
  waker.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(*got);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  // The wake was consumed: the next Receive waits for its deadline again.
  got = planes[0]->Receive(&m, Deadline::After(milliseconds(50)));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  // A message still arrives after a wake.
  ASSERT_TRUE(planes[1]->Send(0, "after wake").ok());
  EXPECT_EQ(MustReceive(planes[0].get()).bytes, "after wake");
}

TEST(TcpControlPlaneTest, DestroyedPeerIsReportedQuickly) {
  HashStore store;
  Planes planes = CreateAll(3, &store);
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  // A last message sent before the peer went away is still delivered first.
  ASSERT_TRUE(planes[2]->Send(0, "goodbye").ok());
  planes[2].reset();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(MustReceive(planes[0].get()).bytes, "goodbye");
  Status s = ReceiveUntilError(planes[0].get(), milliseconds(3000));
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  // Sticky, and Send to the dead rank fails too.
  ControlMessage m;
  EXPECT_EQ(planes[0]->Receive(&m, Deadline::After(milliseconds(0))).status().code(),
            Code::kPeerFailure);
  EXPECT_EQ(planes[0]->Send(2, "x").code(), Code::kPeerFailure);

  // Rank 0 going away is seen by rank 1.
  planes[0].reset();
  s = ReceiveUntilError(planes[1].get(), milliseconds(3000));
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.message();
}

// `size` TCP planes started together, as TcpControlPlane (for PeerFailure()); a null one where the
// start failed (the failure is recorded).
std::vector<std::unique_ptr<TcpControlPlane>> StartAll(int size, HashStore* store) {
  std::vector<std::unique_ptr<TcpControlPlane>> planes(size);
  harness::RunRanks(size, [&](int r) {
    auto p = StartTcpControlPlane(Options(r, size), store);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    planes[r] = std::move(*p);
  });
  return planes;
}

// The plane's first peer failure, once its liveness thread has found one (OK after 3 s without).
Status AwaitPeerFailure(TcpControlPlane* plane) {
  const Deadline deadline = Deadline::After(milliseconds(3000));
  while (plane->PeerFailure().ok() && !deadline.passed()) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  return plane->PeerFailure();
}

// A peer's last message is received before the failure that its close causes, even by a rank
// that sends first: rank 0 sends an abort and closes (resetting the connection, since rank 1's
// message lies unread), and rank 1's Send() returns OK while the abort waits to be received, and
// the failure once it has been (a rank that blamed the closed connection would name rank 0, not
// the rank that the abort names).
TEST(TcpControlPlaneTest, APeersLastMessageComesBeforeTheFailureItsCloseCauses) {
  HashStore store;
  std::vector<std::unique_ptr<TcpControlPlane>> planes = StartAll(2, &store);
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  ASSERT_TRUE(planes[1]->Send(0, "requests").ok());
  ASSERT_TRUE(planes[0]->Send(1, "abort").ok());
  planes[0].reset();
  // Rank 1's liveness thread reads the abort and finds the connection ended.
  ASSERT_EQ(AwaitPeerFailure(planes[1].get()).code(), Code::kPeerFailure);
  EXPECT_TRUE(planes[1]->Send(0, "more requests").ok());
  EXPECT_EQ(MustReceive(planes[1].get()).bytes, "abort");
  Status s = planes[1]->Send(0, "more requests");
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.message();
  ControlMessage m;
  EXPECT_EQ(planes[1]->Receive(&m, Deadline::After(milliseconds(0))).status().code(),
            Code::kPeerFailure);
}

// Drain() too: rank 1 says why it fails and closes; rank 0, which sends its response list to ranks
// 1 and 2 and drains it before it reads (as the coordinator does), gets OK from the drain while
// rank 1's report waits, reads the report, and only then gets the failure (a coordinator that
// blamed the closed connection would name rank 1, not the rank that the report names).
TEST(TcpControlPlaneTest, ADrainReturnsAFailureOnlyAfterTheMessagesBeforeIt) {
  HashStore store;
  std::vector<std::unique_ptr<TcpControlPlane>> planes = StartAll(3, &store);
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  ASSERT_TRUE(planes[1]->Send(0, "report").ok());
  planes[1].reset();
  ASSERT_EQ(AwaitPeerFailure(planes[0].get()).code(), Code::kPeerFailure);
  EXPECT_TRUE(planes[0]->Send(1, "responses").ok());
  EXPECT_TRUE(planes[0]->Send(2, "responses").ok());
  Status s = planes[0]->Drain(Deadline::After(milliseconds(3000)));
  EXPECT_TRUE(s.ok()) << s.ToString();
  const ControlMessage report = MustReceive(planes[0].get());
  EXPECT_EQ(report.from, 1);
  EXPECT_EQ(report.bytes, "report");
  s = planes[0]->Drain(Deadline::After(milliseconds(3000)));
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  EXPECT_EQ(MustReceive(planes[2].get()).bytes, "responses");
}

TEST(TcpControlPlaneTest, HeartbeatsKeepQuietLinksAlive) {
  HashStore store;
  Planes planes = CreateAll(
      3, &store, [](TcpControlPlaneOptions* o) { o->liveness_timeout = milliseconds(300); });
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  harness::RunRanks(3, [&](int r) {
    EXPECT_TRUE(ReceiveUntilError(planes[r].get(), milliseconds(1200)).ok()) << "rank " << r;
  });
}

TEST(TcpControlPlaneTest, SendRules) {
  HashStore store;
  Planes planes = CreateAll(3, &store);
  for (auto& p : planes) ASSERT_NE(p, nullptr);
  EXPECT_EQ(planes[1]->Send(2, "x").code(), Code::kInvalidArgument);  // star only
  EXPECT_EQ(planes[1]->Send(1, "x").code(), Code::kInvalidArgument);  // self
  EXPECT_EQ(planes[0]->Send(3, "x").code(), Code::kInvalidArgument);  // out of range
  EXPECT_EQ(planes[0]->Send(-1, "x").code(), Code::kInvalidArgument);
}

TEST(TcpControlPlaneTest, ConnectTimeoutNamesMissingRanks) {
  HashStore store;
  TcpControlPlaneOptions o = Options(0, 3);
  o.connect_timeout = milliseconds(300);
  std::thread one([&] {
    TcpControlPlaneOptions o1 = Options(1, 3);
    o1.connect_timeout = milliseconds(300);
    auto p = CreateTcpControlPlane(o1, &store);
    EXPECT_TRUE(p.ok()) << p.status().ToString();  // rank 0 accepted it before timing out
  });
  auto p = CreateTcpControlPlane(o, &store);
  one.join();
  EXPECT_EQ(p.status().code(), Code::kTimeout);
  EXPECT_NE(p.status().message().find("missing: 2"), std::string::npos) << p.status().message();
}

TEST(TcpControlPlaneTest, NonRootTimesOutWithoutRoot) {
  HashStore store;
  TcpControlPlaneOptions o = Options(1, 2);
  o.connect_timeout = milliseconds(100);
  EXPECT_EQ(CreateTcpControlPlane(o, &store).status().code(), Code::kTimeout);
}

// A raw socket that plays rank 1 against a real rank 0.
class RawPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_thread_ = std::thread([&] {
      TcpControlPlaneOptions o = Options(0, 2);
      o.liveness_timeout = liveness_;
      auto p = CreateTcpControlPlane(o, &store_);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (p.ok()) root_ = std::move(p.value());
    });
  }
  void TearDown() override {
    if (root_thread_.joinable()) root_thread_.join();
  }

  // Connects and says hello with the given rank and nonce; returns rank 0's answer code.
  uint32_t Hello(net::Fd* fd, int rank, const std::string& nonce) {
    const Deadline d = Deadline::After(milliseconds(3000));
    std::string host;
    int port = 0;
    EXPECT_TRUE(net::SplitHostPort(*store_.Get("job/comm0/cp/addr", d), &host, &port).ok());
    auto c = net::Connect(host, port, d);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    *fd = std::move(c.value());
    std::string hello;
    net::PutU32(&hello, kControlHelloMagic);
    net::PutU16(&hello, kControlPlaneVersion);
    net::PutU16(&hello, 0);
    net::PutU32(&hello, static_cast<uint32_t>(rank));
    net::PutU32(&hello, 2);
    hello += nonce;
    EXPECT_TRUE(net::WriteAll(fd->get(), hello.data(), hello.size(), d, "rank 0").ok());
    unsigned char ack[8];
    EXPECT_TRUE(net::ReadFull(fd->get(), ack, sizeof(ack), d, "rank 0").ok());
    EXPECT_EQ(net::LoadU32(ack), kControlAckMagic);
    return net::LoadU32(ack + 4);
  }

  // Joins rank 0 properly as rank 1 after a few hostile attempts.
  net::Fd Join() {
    const std::string nonce =
        *store_.Get("job/comm0/cp/nonce", Deadline::After(milliseconds(3000)));
    net::Fd stray;
    EXPECT_EQ(Hello(&stray, 1, std::string(kControlNonceSize, '0')), 2u);  // wrong nonce
    net::Fd bad_rank;
    EXPECT_EQ(Hello(&bad_rank, 5, nonce), 3u);
    net::Fd fd;
    EXPECT_EQ(Hello(&fd, 1, nonce), 0u);
    root_thread_.join();
    return fd;
  }

  void SendRaw(int fd, uint32_t type, uint32_t length, const std::string& body) {
    std::string frame;
    net::PutU32(&frame, type);
    net::PutU32(&frame, length);
    frame += body;
    ASSERT_TRUE(
        net::WriteAll(fd, frame.data(), frame.size(), Deadline::After(milliseconds(3000)), "r0")
            .ok());
  }

  milliseconds liveness_{5000};  // rank 0's; a derived fixture's constructor may shorten it
  HashStore store_;
  std::thread root_thread_;
  std::unique_ptr<ControlPlane> root_;
};

TEST_F(RawPeerTest, UnknownFrameTypeIsProtocolError) {
  net::Fd fd = Join();
  ASSERT_NE(root_, nullptr);
  SendRaw(fd.get(), kControlFrameData, 5, "hello");
  SendRaw(fd.get(), 99, 0, "");
  EXPECT_EQ(MustReceive(root_.get()).bytes, "hello");
  const Status s = ReceiveUntilError(root_.get(), milliseconds(3000));
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.ToString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
}

TEST_F(RawPeerTest, OversizedFrameIsProtocolError) {
  net::Fd fd = Join();
  ASSERT_NE(root_, nullptr);
  SendRaw(fd.get(), kControlFrameData, kControlPlaneMaxFrame + 1, "");
  const Status s = ReceiveUntilError(root_.get(), milliseconds(3000));
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.ToString();
}

TEST_F(RawPeerTest, HeartbeatWithBodyIsProtocolError) {
  net::Fd fd = Join();
  ASSERT_NE(root_, nullptr);
  SendRaw(fd.get(), kControlFrameHeartbeat, 3, "abc");
  const Status s = ReceiveUntilError(root_.get(), milliseconds(3000));
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.ToString();
}

// A peer whose connection stays open but which sends nothing (a frozen process; this raw peer
// has no liveness thread) is failed after the liveness timeout, whether or not rank 0 listens.
class SilentRawPeerTest : public RawPeerTest {
 protected:
  SilentRawPeerTest() { liveness_ = milliseconds(300); }
};

TEST_F(SilentRawPeerTest, SilentPeerFailsAfterLivenessTimeout) {
  net::Fd fd = Join();
  ASSERT_NE(root_, nullptr);
  const auto start = std::chrono::steady_clock::now();
  Status s = ReceiveUntilError(root_.get(), milliseconds(5000));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 1 silent for 0.3 s"), std::string::npos) << s.message();
  EXPECT_GE(took, milliseconds(250));
  EXPECT_LT(took, milliseconds(2000));
}

TEST_F(RawPeerTest, TruncatedFrameThenCloseIsPeerFailure) {
  net::Fd fd = Join();
  ASSERT_NE(root_, nullptr);
  SendRaw(fd.get(), kControlFrameData, 100, "only part");
  fd.Reset();
  const Status s = ReceiveUntilError(root_.get(), milliseconds(3000));
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_NE(s.message().find("rank 1 closed its connection"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace concord
