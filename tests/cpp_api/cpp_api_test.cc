// Tests of the header-only C++ API (include/concord/concord.hpp): RAII communicators, TensorView,
// Future, callbacks, groups and errors as exceptions. Ranks are threads of this process, each with
// its own Communicator over a file store private to the test, so everything below the API is real
// (TCP control plane, Gloo over loopback).
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "concord/concord.hpp"
#include "gtest/gtest.h"
#include "tests/cpp_api/communicators.h"

namespace {

void RunRanks(int size, const std::function<void(concord::Communicator&)>& body) {
  concord::harness::RunCommunicators(size, "cpp-api-test", body);
}

TEST(CppApiTest, RankAndSize) {
  RunRanks(3, [](concord::Communicator& comm) {
    EXPECT_EQ(comm.size(), 3);
    EXPECT_GE(comm.rank(), 0);
    EXPECT_LT(comm.rank(), 3);
    EXPECT_EQ(comm.local_size(), 3);
    EXPECT_EQ(comm.local_rank(), comm.rank());
  });
}

TEST(CppApiTest, AllreduceAverageInPlaceAndOutOfPlace) {
  RunRanks(2, [](concord::Communicator& comm) {
    std::vector<float> v(1001, static_cast<float>(comm.rank() + 1));
    comm.allreduce("avg", concord::TensorView(v), concord::ReduceOp::kAverage);
    for (float x : v) ASSERT_FLOAT_EQ(x, 1.5f);
    std::vector<double> in(7, 2.0), out(7, 0.0);
    concord::TensorView out_view(out);
    comm.allreduce("scaled", concord::TensorView(in), concord::ReduceOp::kSum, &out_view, 0.5, 3.0);
    for (double x : out) ASSERT_DOUBLE_EQ(x, 6.0);  // (2*0.5 + 2*0.5) * 3
    for (double x : in) ASSERT_DOUBLE_EQ(x, 2.0);   // the input is untouched
  });
}

TEST(CppApiTest, SplitAndCreateGroup) {
  RunRanks(3, [](concord::Communicator& comm) {
    // Even ranks {2, 0} (reversed by key) and odd {1}.
    std::optional<concord::Communicator> parity = comm.split(comm.rank() % 2, -comm.rank());
    ASSERT_TRUE(parity.has_value());
    EXPECT_EQ(parity->size(), comm.rank() % 2 == 0 ? 2 : 1);
    EXPECT_EQ(parity->rank(), comm.rank() == 2 ? 0 : comm.rank() == 0 ? 1 : 0);
    std::vector<float> v(5, static_cast<float>(comm.rank()));
    parity->allreduce("sum", concord::TensorView(v), concord::ReduceOp::kSum);
    EXPECT_FLOAT_EQ(v[4], comm.rank() % 2 == 0 ? 2.0f : 1.0f);
    std::optional<concord::Communicator> pair = comm.create_group({1, 2});
    EXPECT_EQ(pair.has_value(), comm.rank() != 0);
    if (pair) {
      EXPECT_EQ(pair->rank(), comm.rank() - 1);
    }
    // A bad list on one rank: every rank gets the error.
    const std::vector<int> bad = comm.rank() == 1 ? std::vector<int>{0, 3} : std::vector<int>{0};
    try {
      comm.create_group(bad);
      ADD_FAILURE() << "a rank outside the communicator was accepted";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_INVALID_ARGUMENT) << e.what();
    }
  });
}

TEST(CppApiTest, SendRecvNamedAndAdoptedShapesAndMismatch) {
  RunRanks(2, [](concord::Communicator& comm) {
    std::vector<float> v(6);
    for (int i = 0; i < 6; ++i) v[i] = static_cast<float>(10 * comm.rank() + i);
    const concord::TensorView grid(v.data(), concord::DataType::kFloat32, {2, 3});
    const int peer = 1 - comm.rank();
    comm.send(grid, peer, 5);
    comm.send(grid, peer, 5);
    comm.send(grid, peer, 5);
    std::vector<float> got(6, -1);
    comm.recv(concord::TensorView(got.data(), concord::DataType::kFloat32, {2, 3}), peer, 5);
    for (int i = 0; i < 6; ++i) ASSERT_EQ(got[i], static_cast<float>(10 * peer + i));
    concord::Future any = comm.recv_async(nullptr, peer, 5);
    concord_dtype_t dtype = CONCORD_UINT8;
    EXPECT_EQ(any.output_shape(&dtype), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(dtype, CONCORD_FLOAT32);
    EXPECT_EQ(any.output().size(), 24u);
    std::vector<int32_t> wrong(6);
    try {
      comm.recv(concord::TensorView(wrong), peer, 5);
      ADD_FAILURE() << "a mismatching recv succeeded";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_MISMATCH);
      EXPECT_NE(std::string(e.what()).find("float32 [2, 3]"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm.send(grid, comm.rank(), 0), concord::Error);
  });
}

TEST(CppApiTest, FuturesCallbacksAndGroups) {
  RunRanks(2, [](concord::Communicator& comm) {
    std::atomic<int> callbacks{0};
    std::vector<std::vector<int64_t>> tensors(20, std::vector<int64_t>(33, comm.rank() + 1));
    std::vector<concord::Future> futures;
    {
      concord::Communicator::Group group(comm);
      for (size_t i = 0; i < tensors.size(); ++i) {
        futures.push_back(comm.allreduce_async(
            "g" + std::to_string(i), concord::TensorView(tensors[i]), concord::ReduceOp::kMax,
            nullptr, 1.0, 1.0, [&](concord_status_t s) {
              if (s == CONCORD_SUCCESS) ++callbacks;
            }));
      }
      // Waiting here would wait for the group's end, which only this thread reaches: refused.
      std::vector<int64_t> other(3, 1);
      auto expect_refused = [](const std::function<void()>& wait, const char* says) {
        try {
          wait();
          ADD_FAILURE() << "a wait inside the own group was not refused";
        } catch (const concord::Error& e) {
          EXPECT_EQ(e.status(), CONCORD_ERR_INVALID_ARGUMENT);
          EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
      };
      expect_refused([&] { comm.allreduce("blocking", concord::TensorView(other)); },
                     "blocking call inside a group");
      expect_refused([&] { comm.broadcast("blocking.b", concord::TensorView(other), 0); },
                     "blocking call inside a group");
      expect_refused([&] { comm.barrier(); }, "blocking call inside a group");
      {
        // Refused at enqueue, so nothing stays queued on buffers that go out of scope here (they
        // were once submitted and then waited for, which left them in the group).
        std::vector<float> in(4, 1.0f), out(2, 0.0f);
        expect_refused([&] { comm.reduce("blocking.r", concord::TensorView(in), 0); },
                       "blocking call inside a group");
        expect_refused(
            [&] {
              comm.reducescatter("blocking.rs", concord::TensorView(in), concord::TensorView(out));
            },
            "blocking call inside a group");
      }
      expect_refused([&] { futures[0].wait(); }, "'g0' is in the group this thread has open");
    }
    for (auto& f : futures) f.wait();
    EXPECT_EQ(callbacks.load(), 20);
    for (const auto& t : tensors) {
      for (int64_t x : t) ASSERT_EQ(x, 2);
    }
  });
}

// A barrier refused inside one rank's group takes no barrier number there: the ranks' next
// barriers still meet (they used to wait for each other's different numbers until the stall
// shutdown).
TEST(CppApiTest, BarrierRefusedInOneRanksGroupLeavesLaterBarriersMatched) {
  RunRanks(2, [](concord::Communicator& comm) {
    if (comm.rank() == 0) {
      concord::Communicator::Group group(comm);
      EXPECT_THROW(comm.barrier(), concord::Error);
    }
    concord_request_t r = nullptr;
    ASSERT_EQ(concord_barrier_async(comm.native(), nullptr, nullptr, &r), CONCORD_SUCCESS);
    EXPECT_EQ(concord_wait(r, 10.0), CONCORD_SUCCESS) << concord_request_error(r);
    concord_request_free(r);
    comm.barrier();
  });
}

// The same for a barrier in a group that group_end refuses (a member already in flight on this
// rank only): the barrier was numbered at its enqueue, so later barriers never met. The refused
// members' callbacks run inside concord_group_end: finalize from there is refused too (it once
// freed the communicator under the call).
struct FinalizeFromCallback {
  concord_comm_t comm = nullptr;
  concord_status_t status = CONCORD_SUCCESS;
};
void FinalizeInCallback(concord_request_t, concord_status_t, void* user_data) {
  auto* f = static_cast<FinalizeFromCallback*>(user_data);
  f->status = concord_finalize(f->comm);
}

TEST(CppApiTest, BarrierInARefusedGroupLeavesLaterBarriersMatched) {
  RunRanks(2, [](concord::Communicator& comm) {
    std::vector<float> v(4, 1.0f);
    concord::Future busy;
    if (comm.rank() == 0) {
      busy = comm.allreduce_async("busy", concord::TensorView(v));  // rank 1 submits it later
      ASSERT_EQ(concord_group_start(comm.native()), CONCORD_SUCCESS);
      concord_request_t again = nullptr, in_group = nullptr;
      std::vector<float> w(4, 1.0f);
      concord::TensorView wv(w);
      const concord_tensor_t wt = wv.c_tensor();
      ASSERT_EQ(concord_allreduce_async(comm.native(), "busy", &wt, nullptr, nullptr, nullptr,
                                        nullptr, &again),
                CONCORD_SUCCESS);
      FinalizeFromCallback f{comm.native()};
      ASSERT_EQ(concord_barrier_async(comm.native(), FinalizeInCallback, &f, &in_group),
                CONCORD_SUCCESS);
      EXPECT_EQ(concord_group_end(comm.native()), CONCORD_ERR_INVALID_ARGUMENT);
      EXPECT_EQ(f.status, CONCORD_ERR_INVALID_ARGUMENT);
      EXPECT_EQ(concord_wait(in_group, 10.0), CONCORD_ERR_INVALID_ARGUMENT);
      concord_request_free(again);
      concord_request_free(in_group);
    }
    concord_request_t r = nullptr;
    ASSERT_EQ(concord_barrier_async(comm.native(), nullptr, nullptr, &r), CONCORD_SUCCESS);
    EXPECT_EQ(concord_wait(r, 10.0), CONCORD_SUCCESS) << concord_request_error(r);
    concord_request_free(r);
    if (comm.rank() == 1) comm.allreduce("busy", concord::TensorView(v));
    if (comm.rank() == 0) busy.wait();
  });
}

TEST(CppApiTest, AllgatherOwnedOutputWithDifferentFirstDims) {
  RunRanks(3, [](concord::Communicator& comm) {
    const int r = comm.rank();
    std::vector<int32_t> mine((r + 1) * 2, r);
    concord::TensorView view(mine.data(), concord::DataType::kInt32, {r + 1, 2});
    concord::Future f = comm.allgather_async("gather", view);
    int64_t first = 0;
    const std::vector<uint8_t> bytes = f.output(&first);
    ASSERT_EQ(first, 1 + 2 + 3);
    ASSERT_EQ(bytes.size(), 6 * 2 * sizeof(int32_t));
    const auto* v = reinterpret_cast<const int32_t*>(bytes.data());
    const int expected[] = {0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2};
    for (int i = 0; i < 12; ++i) ASSERT_EQ(v[i], expected[i]);
  });
}

// stats() has the scratch memory: a fused group packs into a lane's fusion buffer (scratch_bytes),
// and an allgather result the library owned, once freed, is kept for reuse (kept_result_bytes).
TEST(CppApiTest, StatsShowTheScratchMemory) {
  RunRanks(2, [](concord::Communicator& comm) {
    constexpr size_t kElements = 16 * 1024;  // 64 KiB: under the direct threshold, so fused
    std::vector<std::vector<float>> tensors(4, std::vector<float>(kElements, 1.0f));
    std::vector<concord::Future> futures;
    {
      concord::Communicator::Group group(comm);
      for (size_t i = 0; i < tensors.size(); ++i) {
        futures.push_back(comm.allreduce_async("stats.fused" + std::to_string(i),
                                               concord::TensorView(tensors[i])));
      }
    }
    for (auto& f : futures) f.wait();
    EXPECT_EQ(comm.allgather_async("stats.owned", concord::TensorView(tensors[0])).output().size(),
              2 * kElements * sizeof(float));
    // The figures move after each response list: the barriers' lists come after both.
    comm.barrier();
    comm.barrier();
    const concord_stats_t s = comm.stats();
    EXPECT_EQ(s.struct_size, sizeof(concord_stats_t));
    EXPECT_GE(s.scratch_bytes, 4 * kElements * sizeof(float));
    EXPECT_GE(s.scratch_reallocations, 1u);
    EXPECT_GE(s.kept_result_bytes, 2 * kElements * sizeof(float));
  });
}

TEST(CppApiTest, ReducescatterAndAlltoallWithReceivedSplits) {
  RunRanks(3, [](concord::Communicator& comm) {
    const int r = comm.rank();
    // Reduce-scatter of 7 rows of 2 (even split: 3, 2, 2 rows), then all rows to rank 2.
    std::vector<float> in(14, static_cast<float>(r + 1));
    const int64_t mine = r == 0 ? 3 : 2;
    std::vector<float> out(mine * 2, 0.0f);
    comm.reducescatter("rs", concord::TensorView(in.data(), concord::DataType::kFloat32, {7, 2}),
                       concord::TensorView(out.data(), concord::DataType::kFloat32, {mine, 2}));
    for (float x : out) ASSERT_EQ(x, 6.0f);
    std::vector<float> all(r == 2 ? 14 : 0, 0.0f);
    comm.reducescatter(
        "rs.last", concord::TensorView(in.data(), concord::DataType::kFloat32, {7, 2}),
        concord::TensorView(all.data(), concord::DataType::kFloat32, {r == 2 ? 7 : 0, 2}),
        concord::ReduceOp::kMax, {0, 0, 7});
    for (float x : all) ASSERT_EQ(x, 3.0f);
    // Alltoall: rank r sends d + 1 rows of value r * 10 + d to rank d.
    std::vector<int32_t> send;
    for (int d = 0; d < 3; ++d) send.insert(send.end(), d + 1, r * 10 + d);
    concord::Future f = comm.alltoall_async(
        "a2a", concord::TensorView(send.data(), concord::DataType::kInt32, {6}), {1, 2, 3});
    int64_t first = 0;
    const std::vector<uint8_t> bytes = f.output(&first);
    ASSERT_EQ(first, 3 * (r + 1));
    EXPECT_EQ(f.received_splits(3), (std::vector<int64_t>{r + 1, r + 1, r + 1}));
    const auto* v = reinterpret_cast<const int32_t*>(bytes.data());
    for (int64_t i = 0; i < first; ++i) ASSERT_EQ(v[i], (i / (r + 1)) * 10 + r);
  });
}

TEST(CppApiTest, ReduceAndGatherToEveryRoot) {
  RunRanks(3, [](concord::Communicator& comm) {
    const int r = comm.rank();
    for (int root = 0; root < 3; ++root) {
      // Reduce out of place (the others' output untouched), then in place with a max.
      std::vector<float> in(5, static_cast<float>(r + 1)), out(5, -1.0f);
      concord::TensorView out_view(out.data(), concord::DataType::kFloat32, {5});
      comm.reduce("rd" + std::to_string(root),
                  concord::TensorView(in.data(), concord::DataType::kFloat32, {5}), root,
                  concord::ReduceOp::kSum, &out_view);
      for (float x : out) ASSERT_EQ(x, r == root ? 6.0f : -1.0f);
      for (float x : in) ASSERT_EQ(x, static_cast<float>(r + 1));
      concord::Future f =
          comm.reduce_async("rd.max" + std::to_string(root),
                            concord::TensorView(in.data(), concord::DataType::kFloat32, {5}), root,
                            concord::ReduceOp::kMax);
      f.wait();
      for (float x : in) ASSERT_EQ(x, r == root ? 3.0f : static_cast<float>(r + 1));
      // Gather of r + 1 rows of 2: the root owns the result, the others get none.
      std::vector<int32_t> mine((r + 1) * 2, r);
      concord::Future g = comm.gather_async(
          "ga" + std::to_string(root),
          concord::TensorView(mine.data(), concord::DataType::kInt32, {r + 1, 2}), root);
      int64_t first = -1;
      const std::vector<uint8_t> bytes = g.output(&first);
      if (r != root) {
        ASSERT_TRUE(bytes.empty());
        ASSERT_EQ(first, 0);
        continue;
      }
      ASSERT_EQ(first, 1 + 2 + 3);
      ASSERT_EQ(bytes.size(), 6 * 2 * sizeof(int32_t));
      const auto* v = reinterpret_cast<const int32_t*>(bytes.data());
      const int expected[] = {0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2};
      for (int i = 0; i < 12; ++i) ASSERT_EQ(v[i], expected[i]);
    }
  });
}

TEST(CppApiTest, BroadcastAndBarrier) {
  RunRanks(3, [](concord::Communicator& comm) {
    for (int root = 0; root < 3; ++root) {
      std::vector<uint8_t> v(4099, static_cast<uint8_t>(comm.rank() * 10));
      comm.broadcast("bcast" + std::to_string(root), concord::TensorView(v), root);
      for (uint8_t x : v) ASSERT_EQ(x, root * 10);
      comm.barrier();
    }
  });
}

TEST(CppApiTest, ErrorsAreThrownWithStatusAndMessage) {
  RunRanks(1, [](concord::Communicator& comm) {
    std::vector<float> v(4);
    try {
      comm.broadcast("bad-root", concord::TensorView(v), 5);
      ADD_FAILURE() << "a bad root was accepted";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find("root 5"), std::string::npos) << e.what();
    }
    concord::Future first = comm.allreduce_async("twice", concord::TensorView(v));
    first.wait();
    concord::Future empty;
    EXPECT_FALSE(empty.valid());
    EXPECT_THROW(empty.wait(), concord::Error);
  });
}

// Device options reach the C API's checks: refused for CPU tensors, ignored when empty; a CUDA
// tensor without a GPU backend and wait_stream on a CPU operation throw with the status.
TEST(CppApiTest, DeviceOptionsAndWaitStream) {
  RunRanks(1, [](concord::Communicator& comm) {
    std::vector<float> v(4, 2.0f);
    int not_a_stream = 0;
    concord::DeviceOptions device;
    device.stream = &not_a_stream;
    try {
      comm.allreduce_async("dev.cpu", concord::TensorView(v), concord::ReduceOp::kSum, nullptr, 1,
                           1, nullptr, "", device);
      ADD_FAILURE() << "a stream for a CPU tensor was accepted";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find("CPU tensor"), std::string::npos) << e.what();
    }
    concord::Future plain = comm.broadcast_async("dev.none", concord::TensorView(v), 0, nullptr,
                                                 nullptr, concord::DeviceOptions{});
    plain.wait();
    EXPECT_EQ(v[0], 2.0f);
    try {
      plain.wait_stream(&not_a_stream);
      ADD_FAILURE() << "wait_stream on a CPU operation was accepted";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_INVALID_ARGUMENT);
      // The C API's own reason (before: a fixed text, which also hid the reason of a CUDA
      // operation that failed with INVALID_ARGUMENT).
      EXPECT_NE(std::string(e.what()).find("not a CUDA operation"), std::string::npos) << e.what();
    }
    concord::TensorView gpu(v.data(), concord::DataType::kFloat32, {4}, /*device=*/0);
    try {
      comm.allreduce("dev.gpu", gpu);
      ADD_FAILURE() << "a CUDA tensor was accepted without a GPU backend";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_UNAVAILABLE);
      EXPECT_NE(std::string(e.what()).find("CUDA device 0"), std::string::npos) << e.what();
    }
  });
}

// Every *_async call passes its DeviceOptions to the C API's _ex form: a stream given for a CPU
// tensor is refused there (before, reducescatter, reduce, gather, alltoall, send and recv had no
// DeviceOptions and CUDA tensors could only wait for the legacy default stream).
TEST(CppApiTest, EveryAsyncCallTakesDeviceOptions) {
  RunRanks(2, [](concord::Communicator& comm) {
    const int peer = 1 - comm.rank();
    std::vector<float> v(4, 1.0f), out(4, 0.0f);
    const concord::TensorView in(v);
    const concord::TensorView out_view(out);
    const concord::TensorView half(out.data(), concord::DataType::kFloat32, {2});  // a rank's split
    int not_a_stream = 0;
    concord::DeviceOptions device;
    device.stream = &not_a_stream;
    const std::vector<std::pair<std::string, std::function<concord::Future()>>> calls = {
        {"reducescatter",
         [&] {
           return comm.reducescatter_async("d.rs", in, half, concord::ReduceOp::kSum, {}, 1.0, 1.0,
                                           nullptr, "", device);
         }},
        {"reduce",
         [&] {
           return comm.reduce_async("d.rd", in, 0, concord::ReduceOp::kSum, nullptr, 1.0, 1.0,
                                    nullptr, device);
         }},
        {"gather",
         [&] {
           return comm.gather_async("d.ga", in, 0, out.data(), out.size() * sizeof(float), nullptr,
                                    device);
         }},
        {"alltoall",
         [&] {
           return comm.alltoall_async("d.a2a", in, {}, out.data(), out.size() * sizeof(float),
                                      nullptr, device);
         }},
        {"send", [&] { return comm.send_async(in, peer, 1, nullptr, device); }},
        {"recv", [&] { return comm.recv_async(&out_view, peer, 1, nullptr, device); }},
    };
    for (const auto& [what, call] : calls) {
      try {
        call();
        ADD_FAILURE() << what << ": a stream for a CPU tensor was accepted";
      } catch (const concord::Error& e) {
        EXPECT_EQ(e.status(), CONCORD_ERR_INVALID_ARGUMENT) << what << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("CPU tensor"), std::string::npos)
            << what << ": " << e.what();
      }
    }
    // Without options an alltoall still runs, its result owned by the Future: 2 rows from each
    // rank.
    concord::Future f = comm.alltoall_async("d.a2a.plain", in, {}, nullptr, 0, nullptr, {});
    int64_t first = -1;
    EXPECT_EQ(f.output(&first).size(), 4 * sizeof(float));
    EXPECT_EQ(first, 4);
  });
}

TEST(CppApiTest, MismatchSurfacesAsErrorOnEveryRank) {
  RunRanks(2, [](concord::Communicator& comm) {
    std::vector<float> f(8, 1.f);
    std::vector<int32_t> i(8, 1);
    concord::Future fut = comm.rank() == 0 ? comm.allreduce_async("mixed", concord::TensorView(f))
                                           : comm.allreduce_async("mixed", concord::TensorView(i));
    try {
      fut.wait();
      ADD_FAILURE() << "a dtype mismatch was not reported";
    } catch (const concord::Error& e) {
      EXPECT_EQ(e.status(), CONCORD_ERR_MISMATCH);
      const std::string m = e.what();
      EXPECT_NE(m.find("mixed"), std::string::npos) << m;
      EXPECT_NE(m.find("dtype"), std::string::npos) << m;
    }
    // The communicator still works afterwards.
    comm.allreduce("after", concord::TensorView(f));
    EXPECT_FLOAT_EQ(f[0], 2.f);
  });
}

// A job-wide setting that differs between ranks stops that rank at init with a message naming
// the setting, instead of letting the ranks plan different collectives.
TEST(CppApiTest, DifferentFusionThresholdIsRefusedAtInit) {
  const std::string path = "/tmp/concord-cpp-api-test-" + std::to_string(getpid()) + "-settings";
  const std::string dir = "file://" + path;
  std::string rank1_error;
  concord_status_t rank1_status = CONCORD_SUCCESS;
  concord::harness::RunRanks(2, [&](int r) {
    concord_config_t config;
    concord_config_init(&config);
    config.rank = r;
    config.size = 2;
    config.store = dir.c_str();
    config.job_id = "settings";
    config.timeout_s = 2;
    if (r == 1) config.fusion_threshold_bytes = 1024;
    concord_comm_t comm = nullptr;
    const concord_status_t status = concord_init_config(&config, &comm);
    if (r == 0) {
      // Rank 1 never connects, so rank 0 gives up after its timeout.
      EXPECT_NE(status, CONCORD_SUCCESS);
      return;
    }
    rank1_status = status;
    rank1_error = concord_comm_last_error(nullptr);  // this thread's
  });
  std::filesystem::remove_all(path);
  EXPECT_EQ(rank1_status, CONCORD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(rank1_error.find("CONCORD_FUSION_THRESHOLD"), std::string::npos) << rank1_error;
  EXPECT_NE(rank1_error.find("rank 0 has '67108864'"), std::string::npos) << rank1_error;
}

// Finalizing from one of the communicator's own callbacks could only deadlock (the callback runs
// on the engine's thread or one of its lane threads): it is refused, the handle stays valid, and
// a later finalize works. Two large tensors in one group run on lanes 0 and 1, so callbacks come
// from both kinds of thread.
TEST(CppApiTest, FinalizeFromACallbackIsRefused) {
  concord_config_t config;
  concord_config_init(&config);
  config.rank = 0;
  config.size = 1;
  config.lanes = 2;
  concord_comm_t comm = nullptr;
  ASSERT_EQ(concord_init_config(&config, &comm), CONCORD_SUCCESS);
  struct Seen {
    concord_comm_t comm;
    concord_status_t finalize_status = CONCORD_SUCCESS;
  };
  constexpr int kRequests = 2;
  std::vector<Seen> seen(kRequests, Seen{comm});
  std::vector<std::vector<float>> data(kRequests, std::vector<float>(100000, 1.f));
  int64_t shape[1] = {100000};  // 400 KB: above the direct threshold, so never fused
  std::vector<concord_request_t> requests(kRequests, nullptr);
  ASSERT_EQ(concord_group_start(comm), CONCORD_SUCCESS);
  for (int i = 0; i < kRequests; ++i) {
    concord_tensor_t t{data[i].data(), CONCORD_FLOAT32, 1, shape, CONCORD_DEVICE_CPU};
    const std::string name = "cb." + std::to_string(i);
    ASSERT_EQ(concord_allreduce_async(
                  comm, name.c_str(), &t, nullptr, nullptr,
                  [](concord_request_t, concord_status_t, void* user) {
                    auto* s = static_cast<Seen*>(user);
                    s->finalize_status = concord_finalize(s->comm);
                  },
                  &seen[i], &requests[i]),
              CONCORD_SUCCESS);
  }
  ASSERT_EQ(concord_group_end(comm), CONCORD_SUCCESS);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(concord_wait(requests[i], 10), CONCORD_SUCCESS);
    concord_request_free(requests[i]);
    EXPECT_EQ(seen[i].finalize_status, CONCORD_ERR_INVALID_ARGUMENT) << "request " << i;
  }
  int size = 0;
  EXPECT_EQ(concord_comm_size(comm, &size), CONCORD_SUCCESS);  // still valid
  EXPECT_EQ(concord_finalize(comm), CONCORD_SUCCESS);
}

}  // namespace
