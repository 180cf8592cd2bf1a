// Point to point of device tensors: PointToPoint (core/p2p.h) over the TCP transport, with the
// in-process fake device backend (tests/unit/inproc_device.h: "device memory" is host memory) for
// the copies through host memory. Every dtype and sizes 0, 1, 7, 1001 and 1 Mi elements between
// device and device, device and host, host and device, at 2 and 3 ranks; FIFO per (peer, tag)
// with device and host messages interleaved; a mismatching device recv dropped (nothing copied)
// with the next intact; the send's copy waiting for its ready event and the recv's for its ready
// stream; and the refusals at submit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/p2p.h"
#include "tests/common/tensors.h"
#include "tests/unit/inproc_device.h"
#include "tests/unit/tcp_p2p_mesh.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

constexpr int kGpu = 1;  // the fake device of every rank

// Ranks: a PointToPoint each over a TCP mesh, with a fake device backend unless `with_device` is
// false. The device world outlives the ranks.
struct Job {
  explicit Job(int n, bool with_device = true)
      : devices(std::make_shared<InProcDeviceWorld>(n, milliseconds(0))) {
    auto transports = TcpP2pMesh(n);
    for (int r = 0; r < static_cast<int>(transports.size()); ++r) {
      if (with_device) backends.push_back(devices->MakeBackend(r, kGpu));
      ranks.push_back(std::make_unique<PointToPoint>(
          r, n, milliseconds(10000), std::chrono::microseconds(50), std::move(transports[r]),
          std::make_shared<ResultBuffers>(), Status(Code::kUnavailable, "none"),
          with_device ? backends.back().get() : nullptr,
          Status(Code::kUnavailable, "no GPU backend here (test)")));
    }
  }
  ~Job() {
    for (auto& r : ranks) r->Close(Status(Code::kNotInitialized, "test over"));
  }
  std::shared_ptr<InProcDeviceWorld> devices;
  std::vector<std::unique_ptr<DeviceBackend>> backends;
  std::vector<std::unique_ptr<PointToPoint>> ranks;
};

struct Op {
  std::shared_ptr<RequestState> state = std::make_shared<RequestState>();
  std::vector<unsigned char> bytes;
};

P2pEntry Entry(bool send, int peer, int64_t tag, DType dtype, int64_t n, Op& op, bool device) {
  P2pEntry e;
  e.send = send;
  e.peer = peer;
  e.tag = tag;
  e.dtype = dtype;
  e.shape = {n};
  e.device = device ? kGpu : -1;
  e.data = op.bytes.empty() ? nullptr : op.bytes.data();
  e.state = op.state;
  return e;
}

Status Await(Op& op) {
  EXPECT_TRUE(op.state->Wait(Deadline::After(milliseconds(20000))));
  return op.state->status();
}

// Element i of message `salt`: 0 .. 100, exact in every dtype.
double Value(int64_t i, int salt) {
  return static_cast<double>((i * 7 + salt * 13) % 101);
}

Op Filled(DType dtype, int64_t n, int salt) {
  Op op;
  op.bytes.assign(static_cast<size_t>(n) * DTypeSize(dtype), 0);
  for (int64_t i = 0; i < n; ++i) harness::StoreElement(dtype, op.bytes.data(), i, Value(i, salt));
  return op;
}

Op Empty(DType dtype, int64_t n) {
  Op op;
  op.bytes.assign(static_cast<size_t>(n) * DTypeSize(dtype), 0xEE);
  return op;
}

void ExpectValues(const Op& op, DType dtype, int64_t n, int salt, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(harness::LoadElement(dtype, op.bytes.data(), i), Value(i, salt))
        << what << " [" << i << "]";
  }
}

// Rank 0 sends to every other rank, in each of the four placements, every dtype and size.
void EveryDtypeAndSize(int n) {
  Job job(n);
  ASSERT_EQ(job.ranks.size(), static_cast<size_t>(n));
  const int64_t kSizes[] = {0, 1, 7, 1001, int64_t{1} << 20};
  int salt = 0;
  for (DType dtype : harness::kAllDTypes) {
    for (int64_t count : kSizes) {
      if (count == (int64_t{1} << 20) && dtype != DType::kFloat32) continue;
      for (int placement = 0; placement < 4; ++placement) {
        const bool send_device = placement & 1, recv_device = placement & 2;
        ++salt;
        const std::string what = std::string(DTypeName(dtype)) + " n" + std::to_string(count) +
                                 (send_device ? " device" : " host") + " to" +
                                 (recv_device ? " device" : " host");
        std::vector<Op> sends, recvs;
        for (int to = 1; to < n; ++to) {
          recvs.push_back(Empty(dtype, count));
          ASSERT_TRUE(job.ranks[to]
                          ->Submit(Entry(false, 0, 5, dtype, count, recvs.back(), recv_device))
                          .ok());
        }
        for (int to = 1; to < n; ++to) {
          sends.push_back(Filled(dtype, count, salt));
          ASSERT_TRUE(job.ranks[0]
                          ->Submit(Entry(true, to, 5, dtype, count, sends.back(), send_device))
                          .ok());
        }
        for (int k = 0; k < n - 1; ++k) {
          ASSERT_TRUE(Await(recvs[k]).ok()) << what << ": " << recvs[k].state->status().ToString();
          ASSERT_TRUE(Await(sends[k]).ok()) << what;
          ExpectValues(recvs[k], dtype, count, salt, what);
          EXPECT_EQ(recvs[k].state->output().dtype, dtype);
          EXPECT_EQ(recvs[k].state->output().data, static_cast<void*>(recvs[k].bytes.data()));
        }
      }
    }
  }
  // Each device end of a non-empty message made one copy.
  EXPECT_GT(job.devices->copies(), 0u);
}

TEST(P2pDeviceTest, EveryDtypeAndSizeBetweenDeviceAndHostTwoRanks) {
  EveryDtypeAndSize(2);
}

TEST(P2pDeviceTest, EveryDtypeAndSizeBetweenDeviceAndHostThreeRanks) {
  EveryDtypeAndSize(3);
}

TEST(P2pDeviceTest, FifoPerTagWithDeviceAndHostMessagesInterleaved) {
  Job job(2);
  constexpr int kMessages = 60;
  std::vector<Op> sends, recvs(kMessages);
  sends.reserve(kMessages);
  for (int j = 0; j < kMessages; ++j) {
    sends.push_back(Filled(DType::kInt32, 100 + j, j));
    ASSERT_TRUE(job.ranks[0]
                    ->Submit(Entry(true, 1, 9, DType::kInt32, 100 + j, sends.back(), j % 3 == 0))
                    .ok());
  }
  for (int j = 0; j < kMessages; ++j) {
    recvs[j] = Empty(DType::kInt32, 100 + j);
    ASSERT_TRUE(job.ranks[1]
                    ->Submit(Entry(false, 0, 9, DType::kInt32, 100 + j, recvs[j], j % 2 == 0))
                    .ok());
  }
  for (int j = 0; j < kMessages; ++j) {
    ASSERT_TRUE(Await(recvs[j]).ok()) << j << ": " << recvs[j].state->status().ToString();
    ExpectValues(recvs[j], DType::kInt32, 100 + j, j, "message " + std::to_string(j));
    EXPECT_TRUE(Await(sends[j]).ok());
  }
}

TEST(P2pDeviceTest, MismatchingDeviceRecvDropsTheMessageAndCopiesNothing) {
  Job job(2);
  Op a = Filled(DType::kFloat32, 300, 1), b = Filled(DType::kFloat32, 6, 2);
  ASSERT_TRUE(job.ranks[0]->Submit(Entry(true, 1, 0, DType::kFloat32, 300, a, true)).ok());
  ASSERT_TRUE(job.ranks[0]->Submit(Entry(true, 1, 0, DType::kFloat32, 6, b, true)).ok());
  Op wrong = Empty(DType::kFloat32, 299), right = Empty(DType::kFloat32, 6);
  ASSERT_TRUE(job.ranks[1]->Submit(Entry(false, 0, 0, DType::kFloat32, 299, wrong, true)).ok());
  const Status dropped = Await(wrong);
  EXPECT_EQ(dropped.code(), Code::kMismatch) << dropped.ToString();
  EXPECT_NE(dropped.message().find("float32 [300]"), std::string::npos) << dropped.ToString();
  for (unsigned char c : wrong.bytes) ASSERT_EQ(c, 0xEE);  // never written
  const uint64_t copies = job.devices->copies();
  ASSERT_TRUE(job.ranks[1]->Submit(Entry(false, 0, 0, DType::kFloat32, 6, right, true)).ok());
  ASSERT_TRUE(Await(right).ok());
  ExpectValues(right, DType::kFloat32, 6, 2, "after the dropped message");
  EXPECT_EQ(job.devices->copies(), copies + 1);
}

TEST(P2pDeviceTest, SendCopiesAfterItsReadyEvent) {
  Job job(2);
  Op send = Filled(DType::kFloat64, 64, 3), recv = Empty(DType::kFloat64, 64);
  ASSERT_TRUE(job.ranks[1]->Submit(Entry(false, 0, 1, DType::kFloat64, 64, recv, false)).ok());
  // The producer has not written the tensor yet: the copy must wait for its event.
  Op stale = Filled(DType::kFloat64, 64, 99);
  std::vector<unsigned char> produced = send.bytes;
  send.bytes = stale.bytes;
  FakeEvent ready;
  P2pEntry e = Entry(true, 1, 1, DType::kFloat64, 64, send, true);
  e.ready_event = &ready;
  auto submitted = std::async(std::launch::async, [&] { return job.ranks[0]->Submit(e); });
  EXPECT_EQ(submitted.wait_for(milliseconds(100)), std::future_status::timeout);
  std::memcpy(send.bytes.data(), produced.data(), produced.size());
  ready.set = true;
  ASSERT_TRUE(submitted.get().ok());
  ASSERT_TRUE(Await(recv).ok());
  ExpectValues(recv, DType::kFloat64, 64, 3, "after the ready event");
}

// The recv's tensor is still read by work on its stream: the copy in waits for it. The copy runs
// when the message has come, on another thread, and waits for what the stream held when the recv
// was submitted, not for work queued there after (which never finishes here).
TEST(P2pDeviceTest, RecvCopiesInAfterItsReadyStreamAsItWasWhenSubmitted) {
  Job job(2);
  Op send = Filled(DType::kInt64, 10, 4), recv = Empty(DType::kInt64, 10);
  FakeStream stream;
  auto busy = std::make_shared<std::atomic<bool>>(false);
  stream.waits.push_back(busy);
  P2pEntry e = Entry(false, 0, 2, DType::kInt64, 10, recv, true);
  e.ready_stream = &stream;
  ASSERT_TRUE(job.ranks[1]->Submit(e).ok());
  const auto queued_later = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(stream.mu);
    stream.waits.push_back(queued_later);
  }
  ASSERT_TRUE(job.ranks[0]->Submit(Entry(true, 1, 2, DType::kInt64, 10, send, false)).ok());
  ASSERT_TRUE(Await(send).ok());
  EXPECT_FALSE(recv.state->Wait(Deadline::After(milliseconds(100))));
  for (unsigned char c : recv.bytes) ASSERT_EQ(c, 0xEE);
  busy->store(true);
  ASSERT_TRUE(Await(recv).ok());
  ExpectValues(recv, DType::kInt64, 10, 4, "after the ready stream as it was");
  queued_later->store(true);
}

TEST(P2pDeviceTest, RefusalsAtSubmit) {
  Job job(2);
  Op op = Filled(DType::kFloat32, 4, 5);
  auto refused = [&](P2pEntry e, Code code, const std::string& says) {
    const Status s = job.ranks[0]->Submit(std::move(e));
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.ToString();
  };
  P2pEntry other_device = Entry(true, 1, 0, DType::kFloat32, 4, op, true);
  other_device.device = 0;
  refused(other_device, Code::kInvalidArgument, "send to rank 1 with tag 0: CUDA device 0");
  P2pEntry host_with_stream = Entry(true, 1, 0, DType::kFloat32, 4, op, false);
  FakeStream stream;
  host_with_stream.ready_stream = &stream;
  refused(host_with_stream, Code::kInvalidArgument, "for a CPU tensor");
  P2pEntry owned_with_event = Entry(false, 1, 0, DType::kFloat32, 4, op, false);
  owned_with_event.expect = false;
  FakeEvent event;
  owned_with_event.ready_event = &event;
  refused(owned_with_event, Code::kInvalidArgument, "without a tensor");
  EXPECT_EQ(job.devices->copies(), 0u);

  Job no_device(2, /*with_device=*/false);
  const Status s =
      no_device.ranks[1]->Submit(Entry(false, 0, 0, DType::kFloat32, 4, op, /*device=*/true));
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("recv from rank 0 with tag 0: CUDA device 1: no GPU backend here"),
            std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace concord
