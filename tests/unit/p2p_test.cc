// Point to point in one process: PointToPoint (core/p2p.h) over the TCP transport
// (backends/tcp_p2p_transport.cc), two or three ranks as threads meshed through an in-memory store.
// FIFO per (peer, tag) with recvs posted early and late (large and small messages in turn too),
// tags independent, a refused message dropped with the stream kept in sync, the sender's shape
// adopted, large messages that arrive before their recv, one too large to allocate refused, a
// recv that times out, a peer that closes, a peer that finalizes (Finish), Close() with operations
// in flight, and the checks at submit.
#include "core/p2p.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "tests/common/sanitizers.h"
#include "tests/unit/tcp_p2p_mesh.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

// Every test runs twice: payloads on the sockets, and payloads of 1000 bytes or more read from
// the sender's memory (same host).
class P2pTest : public ::testing::TestWithParam<bool> {};

// A rank: its PointToPoint over its transport.
std::vector<std::unique_ptr<PointToPoint>> Ranks(int n, bool direct,
                                                 milliseconds timeout = milliseconds(10000)) {
  auto transports = TcpP2pMesh(n, direct);
  std::vector<std::unique_ptr<PointToPoint>> ranks;
  for (int r = 0; r < static_cast<int>(transports.size()); ++r) {
    EXPECT_EQ(transports[r]->ReadsDirectly((r + 1) % n), direct) << "rank " << r;
    ranks.push_back(std::make_unique<PointToPoint>(
        r, n, timeout, std::chrono::microseconds(50), std::move(transports[r]),
        std::make_shared<ResultBuffers>(), Status(Code::kUnavailable, "none")));
  }
  return ranks;
}

struct Op {
  std::shared_ptr<RequestState> state = std::make_shared<RequestState>();
  std::vector<int32_t> data;
  int64_t n = 0;
};

P2pEntry Entry(bool send, int peer, int64_t tag, Op& op, bool expect = true) {
  P2pEntry e;
  e.send = send;
  e.peer = peer;
  e.tag = tag;
  e.expect = expect;
  e.dtype = DType::kInt32;
  e.shape = {op.n};
  e.data = op.data.empty() ? nullptr : op.data.data();
  e.state = op.state;
  return e;
}

Op Message(int64_t n, int32_t first) {
  Op op;
  op.n = n;
  for (int64_t i = 0; i < n; ++i) op.data.push_back(first + static_cast<int32_t>(i));
  return op;
}

Status Await(Op& op) {
  EXPECT_TRUE(op.state->Wait(Deadline::After(milliseconds(20000))));
  return op.state->status();
}

TEST_P(P2pTest, FifoPerTagWithRecvsEarlyAndLateAndTagsIndependent) {
  auto ranks = Ranks(2, GetParam());
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int kPer = 40;
  // Early: rank 1 posts half its recvs on tag 7 before anything is sent.
  std::vector<Op> recvs(2 * kPer);
  for (int j = 0; j < kPer; ++j) {
    recvs[j].n = 1000 + j;
    recvs[j].data.assign(recvs[j].n, -1);
    ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 7, recvs[j])).ok());
  }
  // Rank 0 sends on tags 7 and 8, interleaved, sizes that differ per message (and a 0).
  std::vector<Op> sends;
  sends.reserve(4 * kPer);
  for (int j = 0; j < 2 * kPer; ++j) {
    for (int64_t tag : {7, 8}) {
      sends.push_back(Message(tag == 7 ? 1000 + j : j % 5, static_cast<int32_t>(tag * 100000 + j)));
      ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, tag, sends.back())).ok());
    }
  }
  // Tag 8 first (its messages wait as unexpected ones), then the late half of tag 7.
  std::vector<Op> eights(2 * kPer);
  for (int j = 0; j < 2 * kPer; ++j) {
    eights[j].n = j % 5;
    eights[j].data.assign(eights[j].n, -1);
    ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 8, eights[j])).ok());
    ASSERT_TRUE(Await(eights[j]).ok());
    for (int64_t i = 0; i < eights[j].n; ++i) ASSERT_EQ(eights[j].data[i], 800000 + j + i);
  }
  for (int j = kPer; j < 2 * kPer; ++j) {
    recvs[j].n = 1000 + j;
    recvs[j].data.assign(recvs[j].n, -1);
    ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 7, recvs[j])).ok());
  }
  for (int j = 0; j < 2 * kPer; ++j) {
    ASSERT_TRUE(Await(recvs[j]).ok()) << j;
    for (int64_t i = 0; i < recvs[j].n; i += 97) ASSERT_EQ(recvs[j].data[i], 700000 + j + i);
  }
  for (auto& s : sends) EXPECT_TRUE(Await(s).ok());
}

TEST_P(P2pTest, MismatchDropsTheMessageAndTheNextArrivesIntact) {
  auto ranks = Ranks(2, GetParam());
  ASSERT_EQ(ranks.size(), 2u);
  Op a = Message(300000, 1), b = Message(6, 50);
  ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 3, a)).ok());
  ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 3, b)).ok());
  Op wrong;
  wrong.n = 6;
  wrong.data.assign(6, -1);
  ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 3, wrong)).ok());
  const Status s = Await(wrong);
  EXPECT_EQ(s.code(), Code::kMismatch);
  EXPECT_NE(s.message().find("int32 [300000]"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("int32 [6]"), std::string::npos) << s.ToString();
  EXPECT_EQ(wrong.data[0], -1);
  // The next one, taken with the sender's shape.
  Op any;
  ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 3, any, /*expect=*/false)).ok());
  ASSERT_TRUE(Await(any).ok());
  const auto& out = any.state->output();
  EXPECT_EQ(out.shape, std::vector<int64_t>{6});
  EXPECT_EQ(out.dtype, DType::kInt32);
  ASSERT_EQ(out.bytes, 24u);
  EXPECT_EQ(std::memcmp(out.data, b.data.data(), 24), 0);
  EXPECT_TRUE(Await(a).ok());
  EXPECT_TRUE(Await(b).ok());
}

// Whether `got` holds `n` elements of Message(n, first).
bool Holds(const int32_t* got, int64_t n, int32_t first) {
  for (int64_t i = 0; i < n; i += 4099) {
    if (got[i] != first + static_cast<int32_t>(i)) return false;
  }
  return n == 0 || got[n - 1] == first + static_cast<int32_t>(n - 1);
}

// Large payloads (16 MiB) whose recv is not posted when they arrive wait in the socket for it a
// few milliseconds, then go to unexpected buffers: a tag behind one still arrives, and recvs
// posted before, during and after the wait (into the caller's buffer or an owned one) all get
// their message intact, in order.
TEST_P(P2pTest, LargeMessagesWithoutTheirRecvWaitThenTagsBehindStillArrive) {
  auto ranks = Ranks(2, GetParam());
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int64_t kLarge = int64_t{4} << 20;
  Op a = Message(kLarge, 1), small = Message(3, 7), b = Message(kLarge, 2);
  ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 1, a)).ok());
  ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 2, small)).ok());
  ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 1, b)).ok());
  Op got_small;
  got_small.n = 3;
  got_small.data.assign(3, -1);
  ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 2, got_small)).ok());
  ASSERT_TRUE(Await(got_small).ok());
  EXPECT_EQ(got_small.data, small.data);
  Op got_a, got_b;
  for (Op* g : {&got_a, &got_b}) {
    g->n = kLarge;
    g->data.assign(kLarge, -1);
    ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 1, *g)).ok());
  }
  ASSERT_TRUE(Await(got_a).ok());
  ASSERT_TRUE(Await(got_b).ok());
  EXPECT_TRUE(Holds(got_a.data.data(), kLarge, 1));
  EXPECT_TRUE(Holds(got_b.data.data(), kLarge, 2));
  // Recvs posted 0 to 7 ms after their message was sent: taken while held, while arriving into
  // an unexpected buffer, or from a whole one; every other one owned by the request.
  for (int j = 0; j < 8; ++j) {
    Op sent = Message(kLarge, 100 * j);
    ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 3, sent)).ok());
    std::this_thread::sleep_for(milliseconds(j));
    Op got;
    const bool owned = j % 2 == 1;
    if (!owned) {
      got.n = kLarge;
      got.data.assign(kLarge, -1);
    }
    ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 3, got, /*expect=*/!owned)).ok());
    ASSERT_TRUE(Await(got).ok()) << j;
    const int32_t* data =
        owned ? static_cast<const int32_t*>(got.state->output().data) : got.data.data();
    EXPECT_TRUE(Holds(data, kLarge, 100 * j)) << j;
    ASSERT_TRUE(Await(sent).ok());
  }
  for (Op* s : {&a, &small, &b}) EXPECT_TRUE(Await(*s).ok());
}

// Large (16 MiB) and small messages in turn on one (peer, tag): each recv, posted before its
// message arrives or after (the large ones then held in the socket, or in unexpected buffers),
// gets the next one sent, whatever its size.
TEST_P(P2pTest, LargeAndSmallMessagesOnOneTagArriveInTheOrderSent) {
  auto ranks = Ranks(2, GetParam());
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int64_t kLarge = int64_t{4} << 20;
  for (const int early : {0, 1, 4}) {  // how many recvs are posted before the sends
    std::vector<Op> sent, got(4);
    for (int i = 0; i < 4; ++i) sent.push_back(Message(i % 2 == 0 ? kLarge : 3, 1000 * i));
    for (int i = 0; i < early; ++i) {
      ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 6, got[i], /*expect=*/false)).ok());
    }
    for (Op& op : sent) ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 6, op)).ok());
    std::this_thread::sleep_for(milliseconds(30));
    for (int i = early; i < 4; ++i) {
      ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 6, got[i], /*expect=*/false)).ok());
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(Await(got[i]).ok()) << early << " " << i;
      const auto& out = got[i].state->output();
      ASSERT_EQ(out.shape, std::vector<int64_t>{sent[i].n}) << early << " " << i;
      EXPECT_TRUE(Holds(static_cast<const int32_t*>(out.data), sent[i].n, 1000 * i))
          << early << " " << i;
      EXPECT_TRUE(Await(sent[i]).ok());
    }
  }
}

// A transport that matches every recv at once with `meta` (its payload never written), for what
// PointToPoint does with a message whatever its sender sent.
class DeliveringTransport : public P2pTransport {
 public:
  explicit DeliveringTransport(P2pMeta meta) : meta_(std::move(meta)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int64_t max_tag() const override { return INT64_MAX; }
  bool OnProgressThread() const override { return false; }
  void Send(int, int64_t, const P2pMeta&, const void*, Deadline, Done done) override {
    done(Status::Ok());
  }
  void Recv(int, int64_t, Deadline, Place place, Done done) override {
    placed_ = place(meta_);
    done(Status::Ok());
  }
  void Close(const Status&) override {}
  void* placed() const { return placed_; }

 private:
  const P2pMeta meta_;
  void* placed_ = reinterpret_cast<void*>(1);
};

// A recv that takes the sender's shape of a message larger than this rank can allocate refuses
// it (the payload is dropped, the stream stays in sync) with an error saying so, instead of
// letting std::bad_alloc escape the progress thread.
TEST(P2pRecvTest, AMessageTooLargeForThisRanksMemoryIsRefusedNotACrash) {
  if (harness::kSanitized) GTEST_SKIP() << harness::kSanitizedWhy;
  P2pMeta huge;
  huge.shape = {int64_t{1} << 62};
  huge.bytes = uint64_t{1} << 62;
  auto transport = std::make_unique<DeliveringTransport>(huge);
  DeliveringTransport* t = transport.get();
  PointToPoint p2p(0, 2, milliseconds(1000), std::chrono::microseconds(0), std::move(transport),
                   std::make_shared<ResultBuffers>(), Status(Code::kUnavailable, "none"));
  Op any;
  ASSERT_TRUE(p2p.Submit(Entry(false, 1, 0, any, /*expect=*/false)).ok());
  const Status s = Await(any);
  EXPECT_EQ(s.code(), Code::kSystemError) << s.ToString();
  EXPECT_NE(s.message().find("4611686018427387904-byte"), std::string::npos) << s.ToString();
  EXPECT_EQ(t->placed(), nullptr);
  EXPECT_EQ(any.state->output().bytes, 0u);
}

TEST_P(P2pTest, RecvWithoutSenderTimesOutThenPeerCloseFailsNamingIt) {
  auto ranks = Ranks(3, GetParam(), milliseconds(300));
  ASSERT_EQ(ranks.size(), 3u);
  Op late;
  late.n = 4;
  late.data.assign(4, 0);
  ASSERT_TRUE(ranks[0]->Submit(Entry(false, 1, 9, late)).ok());
  const Status t = Await(late);
  EXPECT_EQ(t.code(), Code::kTimeout) << t.ToString();
  EXPECT_NE(t.message().find("rank 1"), std::string::npos) << t.ToString();
  // Rank 2 goes away with rank 0 waiting for it; rank 1 still talks to rank 0. No cause comes
  // (no engine): the failure is held for the timeout and a second more, then completes as it is.
  Op pending = Message(4, 0);
  ASSERT_TRUE(ranks[0]->Submit(Entry(false, 2, 1, pending)).ok());
  const auto gone = std::chrono::steady_clock::now();
  ranks[2].reset();
  const Status p = Await(pending);
  EXPECT_GE(std::chrono::steady_clock::now() - gone, milliseconds(1300));
  EXPECT_EQ(p.code(), Code::kPeerFailure) << p.ToString();
  EXPECT_EQ(p.message().find("rank 2 closed"), 0u) << p.ToString();
  EXPECT_NE(p.message().find("(no rank was reported failed within 1.3 s of it)"), std::string::npos)
      << p.ToString();
  Op later = Message(4, 0);
  ASSERT_TRUE(ranks[0]->Submit(Entry(true, 2, 1, later)).ok());
  EXPECT_EQ(Await(later).code(), Code::kPeerFailure);
  Op one = Message(4, 9), got;
  got.n = 4;
  got.data.assign(4, 0);
  ASSERT_TRUE(ranks[1]->Submit(Entry(true, 0, 2, one)).ok());
  ASSERT_TRUE(ranks[0]->Submit(Entry(false, 1, 2, got)).ok());
  EXPECT_TRUE(Await(got).ok());
  EXPECT_EQ(got.data, one.data);
}

// Rank 0's recv from rank 1 with tag 3, in flight when rank 1 goes away.
Op RecvFromAPeerThatCloses(std::vector<std::unique_ptr<PointToPoint>>& ranks) {
  Op recv;
  recv.n = 4;
  recv.data.assign(4, 0);
  EXPECT_TRUE(ranks[0]->Submit(Entry(false, 1, 3, recv)).ok());
  ranks[1].reset();
  return recv;
}

// With three ranks a peer's closed connection may follow a failure elsewhere (the peer exited
// because of it): the operation waits for the communicator's failure, whose cause it reports
// first, its own failure after; Close() (a finalize) ends a hold with the operation's own failure.
TEST_P(P2pTest, APeerFailureAmongThreeRanksWaitsForTheCommunicatorsCause) {
  for (const bool failed : {true, false}) {
    auto ranks = Ranks(3, GetParam());
    ASSERT_EQ(ranks.size(), 3u);
    Op recv = RecvFromAPeerThatCloses(ranks);
    std::this_thread::sleep_for(milliseconds(200));
    EXPECT_FALSE(recv.state->done()) << "held for its cause";
    if (failed) {
      ranks[0]->Fail(Status(Code::kPeerFailure, "rank 0 aborted the job: rank 2 exited"));
    } else {
      ranks[0]->Close(Status(Code::kNotInitialized, "the communicator was finalized"));
    }
    ASSERT_TRUE(recv.state->done());
    const Status s = recv.state->status();
    EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
    const std::string own = "rank 1 closed its point-to-point connection";
    if (failed) {
      EXPECT_EQ(s.message().find("rank 0 aborted the job: rank 2 exited (rank 0's recv from rank 1 "
                                 "with tag 3 failed meanwhile: " +
                                 own),
                0u)
          << s.ToString();
    } else {
      EXPECT_EQ(s.message().find(own), 0u) << s.ToString();
    }
    EXPECT_EQ(recv.state->complete_calls(), 1);
  }
}

// A peer that finalizes says so (PointToPoint::Finish: a goodbye behind what it sent): among three
// ranks the operations waiting for it fail at once, not after a hold for another cause, and what
// it sent before its goodbye is still received; later operations with it fail at once too.
TEST_P(P2pTest, APeerThatFinalizesFailsWhatWaitsForItAtOnceAndItsMessagesStillArrive) {
  auto ranks = Ranks(3, GetParam());  // a 10 s timeout: the hold would last 11 s
  ASSERT_EQ(ranks.size(), 3u);
  Op waiting;
  waiting.n = 4;
  waiting.data.assign(4, 0);
  ASSERT_TRUE(ranks[0]->Submit(Entry(false, 1, 3, waiting)).ok());
  Op last = Message(100, 5);  // 400 bytes: on the socket in both cases (not read directly)
  ASSERT_TRUE(ranks[1]->Submit(Entry(true, 0, 4, last)).ok());
  ASSERT_TRUE(Await(last).ok());
  const auto finished = std::chrono::steady_clock::now();
  ranks[1]->Finish(Status(Code::kNotInitialized, "the communicator was finalized"));
  const Status w = Await(waiting);
  EXPECT_LT(std::chrono::steady_clock::now() - finished, milliseconds(5000)) << "held";
  EXPECT_EQ(w.code(), Code::kPeerFailure) << w.ToString();
  EXPECT_EQ(w.message().find("rank 1 finalized its communicator (concord_finalize)"), 0u)
      << w.ToString();
  Op got;
  got.n = 100;
  got.data.assign(100, 0);
  ASSERT_TRUE(ranks[0]->Submit(Entry(false, 1, 4, got)).ok());
  EXPECT_TRUE(Await(got).ok()) << got.state->status().ToString();
  EXPECT_EQ(got.data, last.data);
  for (const bool send : {true, false}) {
    Op later = Message(4, 0);
    ASSERT_TRUE(ranks[0]->Submit(Entry(send, 1, 5, later)).ok());
    const Status l = Await(later);
    EXPECT_EQ(l.code(), Code::kPeerFailure) << l.ToString();
    EXPECT_NE(l.message().find("rank 1 finalized"), std::string::npos) << l.ToString();
  }
  EXPECT_EQ(waiting.state->complete_calls(), 1);
}

// Rank 0's transport among three ranks, in the test's hands: sends complete at once, and the last
// recv waits until the test (or a subclass) fails it (FailRecv).
class HeldRecvTransport : public P2pTransport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 3; }
  int64_t max_tag() const override { return INT64_MAX; }
  bool OnProgressThread() const override { return false; }
  void Send(int, int64_t, const P2pMeta&, const void*, Deadline, Done done) override {
    done(Status::Ok());
  }
  void Recv(int, int64_t, Deadline, Place, Done done) override { recv_ = std::move(done); }
  void Close(const Status&) override {}
  void FailRecv(const Status& s) {
    if (recv_) std::exchange(recv_, nullptr)(s);
  }

 private:
  Done recv_;
};

// Says that peer 1 finalized when the test tells it to (a failure read before the peer's goodbye).
class FinalizingPeerTransport : public HeldRecvTransport {
 public:
  bool PeerFinalized(int peer) const override { return peer == 1 && finalized_.load(); }
  void Finalize() { finalized_.store(true); }

 private:
  std::atomic<bool> finalized_{false};
};

// A peer failure held for its cause is completed once its peer says it finalized, well before
// the hold's time (10 s + 1 s), with that reason after its own failure.
TEST(P2pHoldTest, AHeldFailureEndsOnceItsPeerSaysItFinalized) {
  auto transport = std::make_unique<FinalizingPeerTransport>();
  FinalizingPeerTransport* t = transport.get();
  PointToPoint p2p(0, 3, milliseconds(10000), std::chrono::microseconds(0), std::move(transport),
                   std::make_shared<ResultBuffers>(), Status(Code::kUnavailable, "none"));
  Op recv;
  recv.n = 4;
  recv.data.assign(4, 0);
  ASSERT_TRUE(p2p.Submit(Entry(false, 1, 3, recv)).ok());
  t->FailRecv(Status(Code::kPeerFailure, "rank 1 withdrew a point-to-point message"));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(recv.state->done()) << "held for its cause";
  const auto said = std::chrono::steady_clock::now();
  t->Finalize();
  ASSERT_TRUE(recv.state->Wait(Deadline::After(milliseconds(5000))));
  EXPECT_LT(std::chrono::steady_clock::now() - said, milliseconds(2000));
  const Status s = recv.state->status();
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_EQ(s.message(),
            "rank 1 withdrew a point-to-point message (rank 1 finalized its communicator "
            "meanwhile)");
  EXPECT_EQ(recv.state->complete_calls(), 1);
}

// Its progress thread reads peer 1's end of stream while Fail() closes it: Close() fails the
// waiting recv with that link's own failure, not Close's status (the race of a rank that exits
// after the job failed, seen in mp_random_mix's kill runs).
class LinkFailsWhileClosingTransport : public HeldRecvTransport {
 public:
  void Close(const Status&) override {
    FailRecv(
        Status(Code::kPeerFailure, "rank 1 closed its point-to-point connection (end of stream)"));
  }
};

// Its Close() fails the waiting recv with Close's status, as the TCP and MPI transports do.
class ClosingTransport : public HeldRecvTransport {
 public:
  void Close(const Status& status) override { FailRecv(status); }
};

// What the transport's Close() fails with Fail()'s cause completes with the cause as it is: it
// needs no explaining by itself.
TEST(P2pHoldTest, WhatCloseFailsWithTheCauseCompletesWithTheCauseAlone) {
  PointToPoint p2p(0, 3, milliseconds(10000), std::chrono::microseconds(0),
                   std::make_unique<ClosingTransport>(), std::make_shared<ResultBuffers>(),
                   Status(Code::kUnavailable, "none"));
  Op recv;
  recv.n = 4;
  recv.data.assign(4, 0);
  ASSERT_TRUE(p2p.Submit(Entry(false, 1, 3, recv)).ok());
  const Status cause(Code::kPeerFailure, "rank 2 aborted the job: rank 2 exited");
  p2p.Fail(cause);
  ASSERT_TRUE(recv.state->Wait(Deadline::After(milliseconds(5000))));
  EXPECT_EQ(recv.state->status().ToString(), cause.ToString());
  EXPECT_EQ(recv.state->complete_calls(), 1);
}

// A peer failure that the transport reports while Fail() closes it is completed with the cause,
// as a held one is, not as the peer's own fault: rank 1 only left because the job failed. Before,
// it completed naming rank 1 alone.
TEST(P2pHoldTest, APeerFailureReadWhileTheCommunicatorFailsCompletesWithTheCause) {
  PointToPoint p2p(0, 3, milliseconds(10000), std::chrono::microseconds(0),
                   std::make_unique<LinkFailsWhileClosingTransport>(),
                   std::make_shared<ResultBuffers>(), Status(Code::kUnavailable, "none"));
  Op recv;
  recv.n = 4;
  recv.data.assign(4, 0);
  ASSERT_TRUE(p2p.Submit(Entry(false, 1, 3, recv)).ok());
  p2p.Fail(Status(Code::kPeerFailure, "rank 2 aborted the job: rank 2 exited"));
  ASSERT_TRUE(recv.state->Wait(Deadline::After(milliseconds(5000))));
  const Status s = recv.state->status();
  EXPECT_EQ(s.code(), Code::kPeerFailure) << s.ToString();
  EXPECT_EQ(s.message(),
            "rank 2 aborted the job: rank 2 exited (rank 0's recv from rank 1 with tag 3 failed "
            "meanwhile: rank 1 closed its point-to-point connection (end of stream))");
  EXPECT_EQ(recv.state->complete_calls(), 1);
}

// With two ranks the peer is the only other rank: its failure completes at once.
TEST_P(P2pTest, APeerFailureBetweenTwoRanksCompletesAtOnce) {
  auto ranks = Ranks(2, GetParam());
  ASSERT_EQ(ranks.size(), 2u);
  Op recv = RecvFromAPeerThatCloses(ranks);
  ASSERT_TRUE(recv.state->Wait(Deadline::After(milliseconds(5000))));  // the timeout is 10 s
  EXPECT_EQ(recv.state->status().code(), Code::kPeerFailure) << recv.state->status().ToString();
  EXPECT_EQ(recv.state->status().message().find("rank 1 closed"), 0u)
      << recv.state->status().ToString();
}

TEST_P(P2pTest, CloseCompletesWhatIsInFlightAndRefusesLater) {
  auto ranks = Ranks(2, GetParam());
  ASSERT_EQ(ranks.size(), 2u);
  Op r;
  r.n = 2;
  r.data.assign(2, 0);
  ASSERT_TRUE(ranks[0]->Submit(Entry(false, 1, 0, r)).ok());
  ranks[0]->Close(Status(Code::kNotInitialized, "finalized"));
  ASSERT_TRUE(r.state->done());
  EXPECT_EQ(r.state->status().code(), Code::kNotInitialized);
  Op s = Message(2, 0);
  EXPECT_EQ(ranks[0]->Submit(Entry(true, 1, 0, s)).code(), Code::kNotInitialized);
  EXPECT_EQ(r.state->complete_calls(), 1);
}

TEST(P2pSubmitTest, RefusesBadArgumentsAndCompletesNothing) {
  PointToPoint none(1, 3, milliseconds(1000), std::chrono::microseconds(0), nullptr,
                    std::make_shared<ResultBuffers>(), Status(Code::kUnavailable, "no transport"));
  Op x = Message(4, 0);
  auto refused = [&](P2pEntry e, Code code, const char* says) {
    const Status s = none.Submit(std::move(e));
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.ToString();
  };
  refused(Entry(true, 3, 0, x), Code::kInvalidArgument, "not a rank");
  refused(Entry(true, -1, 0, x), Code::kInvalidArgument, "not a rank");
  refused(Entry(false, 1, 0, x), Code::kInvalidArgument, "this rank");
  refused(Entry(true, 0, -1, x), Code::kInvalidArgument, "negative");
  P2pEntry null_data = Entry(true, 0, 0, x);
  null_data.data = nullptr;
  refused(std::move(null_data), Code::kInvalidArgument, "NULL");
  P2pEntry bad_shape = Entry(true, 0, 0, x);
  bad_shape.shape = {-2};
  refused(std::move(bad_shape), Code::kInvalidArgument, "negative");
  P2pEntry cuda = Entry(true, 0, 0, x);
  cuda.device = 0;
  refused(std::move(cuda), Code::kUnavailable, "CUDA");
  refused(Entry(true, 0, 0, x), Code::kUnavailable, "no transport");
  EXPECT_FALSE(x.state->done());
}

// A direct send withdrawn (its sender closed) before its receiver read it: the receiver gets the
// message intact (read before the close) or fails naming the sender, never the bytes the sender
// wrote into its buffer after the close.
TEST_P(P2pTest, ASendWithdrawnByItsSenderNeverArrivesChanged) {
  for (int round = 0; round < 6; ++round) {
    auto ranks = Ranks(2, GetParam());
    ASSERT_EQ(ranks.size(), 2u);
    constexpr int64_t kLarge = int64_t{4} << 20;
    Op sent = Message(kLarge, 5);
    ASSERT_TRUE(ranks[0]->Submit(Entry(true, 1, 4, sent)).ok());
    std::this_thread::sleep_for(milliseconds(round));
    ranks[0]->Close(Status(Code::kNotInitialized, "finalized"));
    const Status s = Await(sent);
    EXPECT_TRUE(s.ok() || s.code() == Code::kNotInitialized) << s.ToString();
    std::fill(sent.data.begin(), sent.data.end(), -7);  // the buffer is the caller's again
    Op got;
    got.n = kLarge;
    got.data.assign(kLarge, -1);
    ASSERT_TRUE(ranks[1]->Submit(Entry(false, 0, 4, got)).ok());
    const Status r = Await(got);
    if (r.ok()) {
      EXPECT_TRUE(Holds(got.data.data(), kLarge, 5)) << "round " << round;
    } else {
      EXPECT_EQ(r.code(), Code::kPeerFailure) << r.ToString();
      EXPECT_NE(r.message().find("rank 0"), std::string::npos) << r.ToString();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Payloads, P2pTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("DirectReads") : std::string("Sockets");
                         });

}  // namespace
}  // namespace concord
