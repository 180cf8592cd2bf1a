// The engine's asynchronous device path on the CPU: real Engines (ranks as threads) whose CUDA
// tensors go to the in-process fake device backend (inproc_device.h), which completes collectives
// on its own thread after a delay, and whose CPU tensors go to the in-process CPU backend.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/engine.h"
#include "tests/common/tensors.h"
#include "tests/unit/device_job.h"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/inproc_device.h"
#include "tests/unit/inproc_transport.h"
#include "tests/unit/timeline_events.h"

namespace concord {
namespace {

using device_testing::DeviceJob;
using device_testing::kGpu;
using device_testing::Request;
using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Submit;
using harness::kAllDTypes;
using harness::LoadElement;
using harness::RunRanks;
using harness::StoreElement;
using harness::WaitUntil;
using std::chrono::milliseconds;
using timeline_testing::Named;
using timeline_testing::ReadSlices;
using timeline_testing::SliceEvent;

// Every dtype x sizes {0, 1, 7, 4099, 300000}, sum and average, in place and out of place (with
// prescale 0.5 and postscale 4 on floating types), all in one group: the small ones fuse.
TEST(EngineDeviceTest, AllreduceEveryDTypeAndSizeFused) {
  const int size = 3;
  DeviceJob job(size, milliseconds(1));
  const std::vector<size_t> counts = {0, 1, 7, 4099, 300000};
  RunRanks(size, [&](int rank) {
    struct Case {
      DType dtype;
      ReduceOp op;
      size_t n;
      bool in_place;
      double pre, post;
      std::vector<uint8_t> in, out;
      std::shared_ptr<RequestState> state;
    };
    std::vector<Case> cases;
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        for (size_t n : counts) {
          for (bool in_place : {true, false}) {
            const bool scaled = !in_place && IsFloatingPoint(dtype);
            Case c{dtype, op, n, in_place, scaled ? 0.5 : 1.0, scaled ? 4.0 : 1.0, {}, {}, {}};
            c.in.resize(n * DTypeSize(dtype));
            for (size_t i = 0; i < n; ++i) {
              StoreElement(dtype, c.in.data(), i, static_cast<double>(i % 5 + rank * 2));
            }
            if (!in_place) c.out.assign(c.in.size(), 0xAB);
            cases.push_back(std::move(c));
          }
        }
      }
    }
    ASSERT_TRUE(job[rank].GroupStart().ok());
    for (size_t k = 0; k < cases.size(); ++k) {
      Case& c = cases[k];
      TensorRequest r = Request("t" + std::to_string(k), OpType::kAllreduce, c.dtype,
                                {static_cast<int64_t>(c.n)});
      r.reduce_op = c.op;
      r.prescale = c.pre;
      r.postscale = c.post;
      c.state = Submit(job[rank], Entry(r, c.in.data(), c.in_place ? c.in.data() : c.out.data()));
    }
    ASSERT_TRUE(job[rank].GroupEnd().ok());
    for (Case& c : cases) {
      Status s = Await(c.state);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const uint8_t* got = c.in_place ? c.in.data() : c.out.data();
      for (size_t i = 0; i < c.n; ++i) {
        const double want = harness::ExpectedAllreduce(
            c.op, c.dtype, size, [&](int r) { return static_cast<double>(i % 5 + r * 2); }, c.pre,
            c.post);
        const double tol = IsHalfPrecision(c.dtype) ? 0.05 * std::max(1.0, std::fabs(want)) : 1e-5;
        const double have = LoadElement(c.dtype, got, i);
        if (std::fabs(have - want) > tol) {
          FAIL() << DTypeName(c.dtype) << " " << ReduceOpName(c.op) << " n=" << c.n << " element "
                 << i << ": got " << have << ", want " << want;
        }
      }
    }
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_GT(job[r].stats().fused_tensors.load(), 0u);
    EXPECT_GT(job[r].stats().device_launches.load(), 0u);
    EXPECT_EQ(job[r].stats().inline_reductions.load(), 0u);  // never for device tensors
  }
  EXPECT_EQ(job.world().CollectivesOn(0) + job.world().CollectivesOn(1), 0u);  // CPU backend idle
}

// Allgather with different first dimensions (one rank contributes nothing) and broadcast from
// every root, on the device.
TEST(EngineDeviceTest, AllgatherAndBroadcast) {
  const int size = 3;
  DeviceJob job(size, milliseconds(2));
  RunRanks(size, [&](int rank) {
    const int64_t rows = rank;  // 0, 1, 2 rows of 2 floats
    std::vector<float> in(rows * 2);
    for (size_t j = 0; j < in.size(); ++j) in[j] = static_cast<float>(rank * 10 + j);
    std::vector<float> out(6 + 1, -1.0f);
    auto ag = Submit(job[rank], Entry(Request("ag", OpType::kAllgather, DType::kFloat32, {rows, 2}),
                                      in.data(), out.data(), 6 * sizeof(float)));
    std::vector<std::vector<int64_t>> data(size);
    std::vector<std::shared_ptr<RequestState>> bc;
    for (int root = 0; root < size; ++root) {
      data[root].assign(5, rank == root ? root * 7 + 1 : -5);
      TensorRequest r =
          Request("bc" + std::to_string(root), OpType::kBroadcast, DType::kInt64, {5});
      r.root = root;
      bc.push_back(Submit(job[rank], Entry(r, data[root].data(), data[root].data())));
    }
    Status s = Await(ag);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(out, (std::vector<float>{10, 11, 20, 21, 22, 23, -1}));
    EXPECT_EQ(ag->output().first_dim, 3);
    EXPECT_EQ(ag->output().bytes, 6 * sizeof(float));
    for (int root = 0; root < size; ++root) {
      ASSERT_TRUE(Await(bc[root]).ok());
      EXPECT_EQ(data[root], std::vector<int64_t>(5, root * 7 + 1));
    }
  });
}

// Many device tensors enqueued from several threads per rank complete, each with its own values,
// and every rank sees them complete in the same order (the plan's launch order).
TEST(EngineDeviceTest, ManyTensorsCompleteInLaunchOrder) {
  const int size = 2;
  const int kTensors = 300;
  DeviceJob job(size, milliseconds(0), [](Config& c) { c.fusion_threshold_bytes = 4096; });
  std::vector<std::vector<int>> order(size);
  std::mutex mu;
  RunRanks(size, [&](int rank) {
    std::vector<std::vector<int32_t>> bufs(kTensors);
    std::vector<std::shared_ptr<RequestState>> states;
    for (int k = 0; k < kTensors; ++k) {
      bufs[k].assign(1 + k % 50, k + rank);
      QueueEntry e = Entry(Request("m" + std::to_string(k), OpType::kAllreduce, DType::kInt32,
                                   {static_cast<int64_t>(bufs[k].size())}),
                           bufs[k].data(), bufs[k].data());
      e.state = std::make_shared<RequestState>([&, rank, k](const Status&) {
        std::lock_guard<std::mutex> lock(mu);
        order[rank].push_back(k);
      });
      states.push_back(Submit(job[rank], std::move(e)));
    }
    for (int k = 0; k < kTensors; ++k) {
      ASSERT_TRUE(Await(states[k]).ok());
      EXPECT_EQ(bufs[k], std::vector<int32_t>(bufs[k].size(), 2 * k + 1)) << k;
    }
  });
  ASSERT_EQ(order[0].size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(order[0], order[1]);
  EXPECT_GT(job[0].stats().fused_tensors.load(), 0u);
}

// The timeline's device tracks: every batch's launch (host time in Launch(), with its op, bytes
// and members), and the same batch's collective on the "device" track from its launch to its
// completion, recorded by the completion thread: one each, in launch order, none overlapping.
TEST(EngineDeviceTest, TimelineShowsLaunchesAndCompletions) {
  const int size = 2;
  const int kBatches = 4;
  const std::string base = ::testing::TempDir() + "/device_timeline_" + std::to_string(::getpid());
  DeviceJob job(size, milliseconds(3), [](Config& c) { c.fusion_threshold_bytes = 4096; });
  RunRanks(size, [&](int rank) {
    ASSERT_TRUE(job[rank].StartTimeline(base).ok());
    std::vector<std::vector<int32_t>> bufs(2 * kBatches, std::vector<int32_t>(10, rank));
    for (int b = 0; b < kBatches; ++b) {
      std::vector<std::shared_ptr<RequestState>> states;
      ASSERT_TRUE(job[rank].GroupStart().ok());
      for (int k = 2 * b; k < 2 * b + 2; ++k) {
        states.push_back(Submit(job[rank], Entry(Request("d" + std::to_string(k),
                                                         OpType::kAllreduce, DType::kInt32, {10}),
                                                 bufs[k].data(), bufs[k].data())));
      }
      ASSERT_TRUE(job[rank].GroupEnd().ok());
      for (const auto& state : states) ASSERT_TRUE(Await(state).ok());
    }
    job[rank].StopTimeline();
  });
  for (int rank = 0; rank < size; ++rank) {
    const std::string path = base + ".rank" + std::to_string(rank);
    const std::vector<SliceEvent> all = ReadSlices(path);
    std::remove(path.c_str());
    const std::vector<SliceEvent> launches = Named(all, "launch");
    std::vector<SliceEvent> completions = Named(all, "allreduce");
    completions.erase(
        std::remove_if(completions.begin(), completions.end(),
                       [](const SliceEvent& s) { return s.track != Timeline::kDeviceTrack; }),
        completions.end());
    ASSERT_EQ(launches.size(), static_cast<size_t>(kBatches)) << path;
    ASSERT_EQ(completions.size(), static_cast<size_t>(kBatches)) << path;
    for (int b = 0; b < kBatches; ++b) {
      const SliceEvent& launch = launches[b];
      const SliceEvent& done = completions[b];
      const std::string members =
          "\"members\":[\"d" + std::to_string(2 * b) + "\",\"d" + std::to_string(2 * b + 1) + "\"]";
      EXPECT_EQ(launch.track, Timeline::kDeviceLaunchTrack);
      EXPECT_EQ(launch.args, "{\"bytes\":80,\"op\":\"allreduce\"," + members + "}");
      EXPECT_EQ(done.args, "{\"backend\":\"inproc-device\",\"bytes\":80," + members + "}");
      // From the launch (or the previous completion) to its completion, 3 ms later at least.
      EXPECT_GE(done.begin_us + 0.2, launch.begin_us) << b;
      EXPECT_GE(done.end_us, launch.end_us) << b;
      EXPECT_GE(done.end_us - launch.begin_us, 3000.0) << b;
      if (b > 0) {
        EXPECT_GE(done.begin_us + 0.2, completions[b - 1].end_us) << b;
      }
    }
  }
}

// Blocking waits on device collectives: the waiting thread drives negotiation and launches, the
// device's completion thread completes the request and wakes the waiter.
TEST(EngineDeviceTest, WaiterDrivesDeviceCollectives) {
  const int size = 2;
  DeviceJob job(size, milliseconds(0));
  RunRanks(size, [&](int rank) {
    for (int k = 0; k < 50; ++k) {
      std::vector<float> buf(1 + 37 * (k % 5), static_cast<float>(rank + k));
      QueueEntry e = Entry(Request("w" + std::to_string(k % 3), OpType::kAllreduce, DType::kFloat32,
                                   {static_cast<int64_t>(buf.size())}),
                           buf.data(), buf.data());
      auto state = e.state;
      ASSERT_TRUE(job[rank].Enqueue(std::move(e), /*then_wait=*/true).ok());
      ASSERT_TRUE(job[rank].Wait(*state, Deadline::After(milliseconds(20000))));
      ASSERT_TRUE(state->status().ok()) << state->status().ToString();
      EXPECT_EQ(buf, std::vector<float>(buf.size(), static_cast<float>(1 + 2 * k))) << k;
    }
  });
}

// While a device collective is in flight (held back by its ready event, which the test sets only
// at the end), the engine keeps negotiating: CPU allreduces enqueued after it complete, over the
// CPU backend. A barrier after the device collective completes only once the device collective
// has.
TEST(EngineDeviceTest, NegotiatesWhileDeviceWorkIsInFlight) {
  const int size = 2;
  DeviceJob job(size, milliseconds(1));
  RunRanks(size, [&](int rank) {
    std::vector<float> gpu(1000, 1.0f);
    FakeEvent producer_done;
    QueueEntry held =
        Entry(Request("gpu", OpType::kAllreduce, DType::kFloat32, {1000}), gpu.data(), gpu.data());
    held.ready_event = &producer_done;
    auto slow = Submit(job[rank], std::move(held));
    ASSERT_TRUE(slow->WaitLaunched(Deadline::After(milliseconds(20000))).ok());
    for (int round = 0; round < 20; ++round) {
      std::vector<float> cpu(100000, static_cast<float>(rank + round));
      auto s = Submit(job[rank], Entry(Request("cpu" + std::to_string(round), OpType::kAllreduce,
                                               DType::kFloat32, {100000}, -1),
                                       cpu.data(), cpu.data()));
      ASSERT_TRUE(Await(s).ok());
      EXPECT_EQ(cpu[99999], static_cast<float>(1 + 2 * round));
    }
    EXPECT_FALSE(slow->done());
    QueueEntry bye =
        Entry(Request(job[rank].NextBarrierName(), OpType::kBarrier, DType::kUint8, {}, -1),
              nullptr, nullptr);
    auto barrier = Submit(job[rank], std::move(bye));
    EXPECT_FALSE(barrier->Wait(Deadline::After(milliseconds(200))))
        << "a barrier completed before the device work before it";
    producer_done.set.store(true);
    ASSERT_TRUE(Await(barrier).ok());
    EXPECT_TRUE(slow->done());
    ASSERT_TRUE(slow->status().ok());
    EXPECT_EQ(gpu[0], 2.0f);
  });
  EXPECT_GT(job.world().CollectivesOn(0) + job.world().CollectivesOn(1), 0u);
  EXPECT_EQ(job.devices().completed(), 1u);
}

// CPU and device tensors in one group go to different backends and are never fused together.
TEST(EngineDeviceTest, MixedGroupSplitsByDevice) {
  const int size = 2;
  DeviceJob job(size, milliseconds(5), [](Config& c) { c.inline_threshold_bytes = 0; });
  RunRanks(size, [&](int rank) {
    std::vector<std::vector<double>> bufs(8, std::vector<double>(64, rank + 1.0));
    std::vector<std::shared_ptr<RequestState>> states;
    ASSERT_TRUE(job[rank].GroupStart().ok());
    for (int k = 0; k < 8; ++k) {
      states.push_back(Submit(job[rank], Entry(Request("x" + std::to_string(k), OpType::kAllreduce,
                                                       DType::kFloat64, {64}, k % 2 ? kGpu : -1),
                                               bufs[k].data(), bufs[k].data())));
    }
    ASSERT_TRUE(job[rank].GroupEnd().ok());
    for (int k = 0; k < 8; ++k) {
      ASSERT_TRUE(Await(states[k]).ok());
      EXPECT_EQ(bufs[k], std::vector<double>(64, 3.0));
    }
  });
  EXPECT_EQ(job.devices().completed(), 1u);  // the four device tensors: one fused collective
  EXPECT_EQ(job.world().CollectivesOn(0) + job.world().CollectivesOn(1), 1u);  // the CPU ones
}

// The ready stream: the collective waits for the work queued on it when the tensor was enqueued,
// captured on the enqueuing thread, not for what the stream holds when the collective is launched
// (the next layers' backward pass, queued meanwhile: rank 1 enqueues only after rank 0 has queued
// more on its stream, so rank 0 launches after that). A launch that read the stream would wait
// for that later work, which never finishes here.
TEST(EngineDeviceTest, WaitsForTheReadyStreamAsItWasWhenEnqueued) {
  const int size = 2;
  DeviceJob job(size, milliseconds(1));
  std::mutex mu;
  std::condition_variable cv;
  bool rank0_queued_more = false;
  std::vector<std::thread::id> enqueuers(size);
  const auto queued_later = std::make_shared<std::atomic<bool>>(false);
  RunRanks(size, [&](int rank) {
    enqueuers[rank] = std::this_thread::get_id();
    std::vector<float> gpu(33, -1.0f);  // the producer has not written it yet
    FakeStream stream;
    const auto producer = std::make_shared<std::atomic<bool>>(false);
    stream.waits.push_back(producer);
    if (rank == 1) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return rank0_queued_more; });
    }
    QueueEntry e =
        Entry(Request("grad", OpType::kAllreduce, DType::kFloat32, {33}), gpu.data(), gpu.data());
    e.ready_stream = &stream;
    auto state = Submit(job[rank], std::move(e));
    if (rank == 0) {
      {
        std::lock_guard<std::mutex> lock(stream.mu);
        stream.waits.push_back(queued_later);
      }
      std::lock_guard<std::mutex> lock(mu);
      rank0_queued_more = true;
      cv.notify_all();
    }
    std::fill(gpu.begin(), gpu.end(), rank + 1.0f);
    producer->store(true);
    ASSERT_TRUE(Await(state, milliseconds(5000)).ok()) << state->status().ToString();
    EXPECT_EQ(gpu, std::vector<float>(33, 3.0f));
  });
  queued_later->store(true);
  const std::vector<std::thread::id> captured = job.devices().capture_threads();
  ASSERT_EQ(captured.size(), 2u);
  for (std::thread::id t : captured) {
    EXPECT_TRUE(t == enqueuers[0] || t == enqueuers[1]) << "captured on another thread";
  }
}

// The ready event: the collective reads its input only once the producer has set it.
TEST(EngineDeviceTest, WaitsForTheReadyEventAndSignalsStreams) {
  const int size = 2;
  DeviceJob job(size, milliseconds(300));
  RunRanks(size, [&](int rank) {
    std::vector<int32_t> data(16, -100);  // the producer has not written it yet
    FakeEvent ready;
    QueueEntry e =
        Entry(Request("ev", OpType::kAllreduce, DType::kInt32, {16}), data.data(), data.data());
    e.ready_event = &ready;
    auto state = Submit(job[rank], std::move(e));
    // The consumer orders its stream after the collective without waiting for it.
    auto launched = state->WaitLaunched(Deadline::After(milliseconds(5000)));
    ASSERT_TRUE(launched.ok()) << launched.status().ToString();
    ASSERT_NE(*launched, nullptr);
    FakeStream consumer;
    ASSERT_TRUE((*launched)->StreamWait(&consumer).ok());
    EXPECT_FALSE(consumer.Idle());
    // The producer is late: past the fake device's delay, a collective that did not wait for its
    // event would have read the unwritten input and completed.
    EXPECT_FALSE(state->Wait(Deadline::After(milliseconds(400))))
        << "the collective completed before its ready event was set";
    std::fill(data.begin(), data.end(), rank + 1);
    ready.set.store(true);
    ASSERT_TRUE(Await(state).ok());
    EXPECT_EQ(data, std::vector<int32_t>(16, 3));
    EXPECT_TRUE(consumer.Idle());
    // Once complete there is nothing left to wait for on the device.
    auto after = state->WaitLaunched(Deadline::After(milliseconds(0)));
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, nullptr);
  });
}

// A peer whose device collective never arrives: the others get kTimeout within the deadline,
// every engine fails, and the job shuts down cleanly.
TEST(EngineDeviceTest, PeerThatNeverArrivesTimesOut) {
  const int size = 2;
  DeviceJob job(size, milliseconds(1), [](Config& c) { c.timeout_s = 1.0; });
  job.devices().Stall(1);
  const auto start = Clock::now();
  RunRanks(size, [&](int rank) {
    std::vector<float> data(8, 1.0f);
    auto state = Submit(job[rank], Entry(Request("hang", OpType::kAllreduce, DType::kFloat32, {8}),
                                         data.data(), data.data()));
    Status s = Await(state, milliseconds(10000));
    EXPECT_EQ(s.code(), Code::kTimeout) << "rank " << rank << ": " << s.ToString();
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(WaitUntil([&] { return !job[r].failure().ok(); }, milliseconds(5000)));
    EXPECT_EQ(job[r].failure().code(), Code::kTimeout) << job[r].failure().ToString();
    // Later work fails: refused, or (enqueued while the engine was closing) completed with the
    // error.
    std::vector<float> more(1);
    QueueEntry e =
        Entry(Request("later", OpType::kAllreduce, DType::kFloat32, {1}), more.data(), more.data());
    auto state = e.state;
    if (job[r].Enqueue(std::move(e)).ok()) {
      EXPECT_FALSE(Await(state).ok());
    }
  }
}

// A failure that a user thread finds while it drives the engine, with a device collective in
// flight (rank 1 dies; the devices hang, so only each rank's own abort ends its collective): the
// engine's device abort fails the collective on rank 0, running its callback on that thread,
// which may then still finalize the communicator. Before, running the callback made the thread
// count as the device's completion thread for good: "a communicator cannot be finalized from its
// own completion callback".
TEST(EngineDeviceTest, FinalizeFromTheThreadThatDroveTheFailure) {
  const int size = 2;
  DeviceJob job(size, milliseconds(1));
  job.devices().Stall(0);
  job.devices().Stall(1);
  std::vector<std::vector<float>> gpu(size, std::vector<float>(8, 1.0f));
  std::vector<std::shared_ptr<RequestState>> stuck;
  for (int r = 0; r < size; ++r) {
    stuck.push_back(Submit(job[r], Entry(Request("stuck", OpType::kAllreduce, DType::kFloat32, {8}),
                                         gpu[r].data(), gpu[r].data())));
  }
  ASSERT_TRUE(stuck[0]->WaitLaunched(Deadline::After(milliseconds(20000))).ok());
  // This thread drives rank 0 (the engine thread parks meanwhile) when rank 1 dies.
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(200));
    job.world().Kill(1);
  });
  std::vector<float> cpu(4, 1.0f);
  QueueEntry e =
      Entry(Request("cpu", OpType::kAllreduce, DType::kFloat32, {4}), cpu.data(), cpu.data());
  auto waited = e.state;
  ASSERT_TRUE(job[0].Enqueue(std::move(e), /*then_wait=*/true).ok());
  EXPECT_TRUE(job[0].Wait(*waited, Deadline::After(milliseconds(20000))));
  killer.join();
  EXPECT_EQ(waited->status().code(), Code::kPeerFailure) << waited->status().ToString();
  EXPECT_FALSE(Await(stuck[0]).ok());
  const Status finalized = job[0].Shutdown();
  EXPECT_TRUE(finalized.ok()) << finalized.ToString();
}

// Refused at enqueue, with a message naming why; nothing is queued.
TEST(EngineDeviceTest, ValidationErrors) {
  DeviceJob job(1, milliseconds(0));
  std::vector<float> data(4);
  FakeEvent ev;
  auto expect = [&](QueueEntry e, Code code, const std::string& text) {
    Status s = job[0].Enqueue(std::move(e));
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
  };
  QueueEntry cpu_with_event =
      Entry(Request("a", OpType::kAllreduce, DType::kFloat32, {4}, -1), data.data(), data.data());
  cpu_with_event.ready_event = &ev;
  expect(std::move(cpu_with_event), Code::kInvalidArgument, "CPU tensor");
  QueueEntry cpu_with_stream =
      Entry(Request("b", OpType::kAllreduce, DType::kFloat32, {4}, -1), data.data(), data.data());
  cpu_with_stream.ready_stream = &ev;
  expect(std::move(cpu_with_stream), Code::kInvalidArgument, "CPU tensor");
  expect(Entry(Request("c", OpType::kAllreduce, DType::kFloat32, {4}, 7), data.data(), data.data()),
         Code::kUnavailable, "does not exist");
  expect(Entry(Request("d", OpType::kAllreduce, DType::kFloat32, {4}, 0), data.data(), data.data()),
         Code::kInvalidArgument, "runs on CUDA device 1");
  expect(
      Entry(Request("e", OpType::kAllreduce, DType::kFloat32, {4}, -2), data.data(), data.data()),
      Code::kInvalidArgument, "neither the CPU");
  expect(Entry(Request("f", OpType::kAllgather, DType::kFloat32, {4}), data.data(), nullptr),
         Code::kInvalidArgument, "needs an output buffer");

  DeviceJob cpu_only(1, milliseconds(0), nullptr, /*with_device=*/false);
  Status s = cpu_only[0].Enqueue(
      Entry(Request("g", OpType::kAllreduce, DType::kFloat32, {4}), data.data(), data.data()));
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_NE(s.message().find("no GPU here (test)"), std::string::npos) << s.message();
  // A size-1 and a size-0 tensor on a 1-rank job still go through the device backend.
  std::vector<float> one(1, 2.5f);
  auto ok1 = Submit(job[0], Entry(Request("h", OpType::kAllreduce, DType::kFloat32, {1}),
                                  one.data(), one.data()));
  auto ok0 = Submit(
      job[0], Entry(Request("i", OpType::kAllreduce, DType::kFloat32, {0}), nullptr, nullptr));
  ASSERT_TRUE(Await(ok1).ok());
  ASSERT_TRUE(Await(ok0).ok());
  EXPECT_EQ(one[0], 2.5f);
  EXPECT_GE(job.devices().completed(), 1u);  // one collective, or two when not fused
  EXPECT_EQ(job[0].stats().device_launches.load(), job.devices().completed());
}

// Deterministic mode covers CPU tensors only (NCCL does not reduce in rank order): a device
// allreduce is refused at enqueue, saying so; a CPU allreduce still runs.
TEST(EngineDeviceTest, DeterministicModeRefusesDeviceAllreduces) {
  DeviceJob job(1, milliseconds(0), [](Config& c) { c.deterministic = true; });
  std::vector<float> data(4, 1.0f), out(4);
  Status s = job[0].Enqueue(
      Entry(Request("a", OpType::kAllreduce, DType::kFloat32, {4}), data.data(), data.data()));
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("deterministic mode (CONCORD_DETERMINISTIC=1) covers CPU tensors"),
            std::string::npos)
      << s.message();
  auto ok = Submit(job[0], Entry(Request("b", OpType::kAllreduce, DType::kFloat32, {4}, -1),
                                 data.data(), out.data()));
  const Status done = Await(ok);
  ASSERT_TRUE(done.ok()) << done.ToString();
  EXPECT_EQ(out, data);
}

// Point to point of device tensors through the engine's PointToPoint, which the engine gives its
// device backend for the copies through host memory (tests/unit/p2p_device_test covers the
// component itself): device to device, device to host, host to device, and a device the engine
// does not use refused; without a device backend, refused naming why.
TEST(EngineDeviceTest, SendAndRecvOfDeviceTensorsCopyThroughTheDeviceBackend) {
  DeviceJob job(2, milliseconds(0), nullptr, /*with_device=*/true, /*with_p2p=*/true);
  auto entry = [](bool send, int peer, std::vector<float>& data, int device) {
    P2pEntry e;
    e.send = send;
    e.peer = peer;
    e.tag = 4;
    e.dtype = DType::kFloat32;
    e.shape = {static_cast<int64_t>(data.size())};
    e.device = device;
    e.data = data.data();
    e.state = std::make_shared<RequestState>();
    return e;
  };
  const int kPlacements[][2] = {{kGpu, kGpu}, {kGpu, -1}, {-1, kGpu}};
  for (const auto& placement : kPlacements) {
    std::vector<float> sent(1001), got(1001, -1.0f);
    for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<float>(i) + 0.5f;
    P2pEntry recv = entry(false, 0, got, placement[1]);
    P2pEntry send = entry(true, 1, sent, placement[0]);
    auto received = recv.state, done = send.state;
    ASSERT_TRUE(job[1].SubmitP2p(std::move(recv)).ok());
    ASSERT_TRUE(job[0].SubmitP2p(std::move(send)).ok());
    ASSERT_TRUE(Await(done).ok());
    ASSERT_TRUE(Await(received).ok()) << received->status().ToString();
    EXPECT_EQ(got, sent) << placement[0] << " to " << placement[1];
  }
  EXPECT_EQ(job.devices().copies(), 4u);  // one per device end
  std::vector<float> data(4);
  const Status elsewhere = job[0].SubmitP2p(entry(true, 1, data, 0));
  EXPECT_EQ(elsewhere.code(), Code::kInvalidArgument) << elsewhere.ToString();
  EXPECT_NE(elsewhere.message().find("send to rank 1 with tag 4: CUDA device 0: "),
            std::string::npos)
      << elsewhere.ToString();

  DeviceJob cpu_only(2, milliseconds(0), nullptr, /*with_device=*/false, /*with_p2p=*/true);
  const Status none = cpu_only[1].SubmitP2p(entry(false, 0, data, kGpu));
  EXPECT_EQ(none.code(), Code::kUnavailable) << none.ToString();
  EXPECT_NE(none.message().find("CUDA device 1: no GPU here (test)"), std::string::npos)
      << none.ToString();
}

}  // namespace
}  // namespace concord
