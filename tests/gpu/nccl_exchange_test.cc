// GPU tests of the NCCL backend's reduce-scatter, all-to-all, reduce and gather (one rank per
// usable GPU, as threads; tests/gpu/nccl_ranks.h), checked against the CPU reference: every dtype,
// sizes 0, 1, odd and large, even and uneven splits, scales, every root, outputs that overlap the
// input and outputs the backend must replace with scratch memory. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "backends/nccl/nccl_backend.h"
#include "tests/common/tensors.h"
#include "tests/gpu/nccl_ranks.h"

namespace concord {
namespace {

using harness::kAllDTypes;
using harness::LoadElement;
using harness::StoreElement;
using nccl_testing::Completion;
using nccl_testing::NcclBackendTest;
using std::chrono::milliseconds;

using NcclExchangeTest = NcclBackendTest;

// A device buffer of at least `bytes` (1 when 0) holding `host`.
cuda::DeviceBuffer Upload(int device, const std::vector<uint8_t>& host, size_t bytes = 0) {
  auto b = cuda::DeviceBuffer::Allocate(device, std::max<size_t>({host.size(), bytes, 1}));
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return cuda::DeviceBuffer();
  EXPECT_TRUE(b->Fill(0xAB).ok());
  EXPECT_TRUE(b->CopyFromHost(0, host.data(), host.size()).ok());
  return std::move(*b);
}

std::vector<uint8_t> Download(const cuda::DeviceBuffer& b, size_t offset, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  EXPECT_TRUE(b.CopyToHost(host.data(), offset, bytes).ok());
  return host;
}

// Launches `c` and waits for its completion.
Status LaunchAndWait(DeviceBackend& backend, DeviceCollective c) {
  c.deadline = Deadline::After(milliseconds(30000));
  Completion done;
  auto event = backend.Launch(c, done.Callback());
  if (!event.ok()) return event.status();
  return done.Wait();
}

double Input(size_t i, int rank) {
  return static_cast<double>(i % 7 + rank);
}

// Every dtype x block sizes {0, 1, 7, 4099, 2^18} x: even (out of place), uneven (rank r gets
// n + r elements), NCCL's in place (the output is this rank's block of the input), Concord's in
// place (the output at the input's start: overlapping, staged), average, and sum and average
// with prescale 0.5 and postscale 4 (floating types).
TEST_F(NcclExchangeTest, ReducescatterEveryDTypeSizeAndLayout) {
  OnRanks([&](int rank, DeviceBackend& backend) {
    for (DType dtype : kAllDTypes) {
      const size_t esize = DTypeSize(dtype);
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{1} << 18}) {
        for (int layout = 0; layout < 7; ++layout) {
          const bool scaled = layout == 5 || layout == 6;
          if (scaled && !IsFloatingPoint(dtype)) continue;
          DeviceCollective c;
          c.kind = DeviceOpKind::kReducescatter;
          c.device = rank;
          c.dtype = dtype;
          c.op = layout == 4 || layout == 6 ? ReduceOp::kAverage : ReduceOp::kSum;
          c.prescale = scaled ? 0.5 : 1.0;
          c.postscale = scaled ? 4.0 : 1.0;
          size_t total = 0, first = 0;
          for (int r = 0; r < ranks_; ++r) {
            c.counts_per_rank.push_back(layout == 1 ? n + r : n);
            if (r < rank) first += c.counts_per_rank.back();
            total += c.counts_per_rank.back();
          }
          const size_t mine = c.counts_per_rank[rank];
          std::vector<uint8_t> host(total * esize);
          for (size_t i = 0; i < total; ++i) StoreElement(dtype, host.data(), i, Input(i, rank));
          cuda::DeviceBuffer in = Upload(rank, host);
          cuda::DeviceBuffer out = Upload(rank, {}, (mine + 1) * esize);
          auto* base = static_cast<uint8_t*>(in.data());
          void* dst = layout == 2 ? base + first * esize : layout == 3 ? base : out.data();
          c.tensors.push_back(DeviceTensor{in.data(), dst, total, nullptr, nullptr});
          const Status s = LaunchAndWait(backend, c);
          ASSERT_TRUE(s.ok()) << s.ToString();
          // In place, the block may end the input: nothing past it is read.
          const bool in_place = layout == 2 || layout == 3;
          const size_t at = layout == 2 ? first * esize : 0;
          const std::vector<uint8_t> got =
              Download(in_place ? in : out, at, (in_place ? mine : mine + 1) * esize);
          size_t wrong = 0;
          for (size_t i = 0; i < mine; ++i) {
            const double want = harness::ExpectedAllreduce(
                c.op, dtype, ranks_, [&](int r) { return Input(first + i, r); }, c.prescale,
                c.postscale);
            const double tol = IsHalfPrecision(dtype) ? 2e-2 * std::max(1.0, std::fabs(want))
                                                      : 1e-5 * std::max(1.0, std::fabs(want));
            const double have = LoadElement(dtype, got.data(), i);
            if (std::fabs(have - want) > tol && ++wrong <= 3) {
              ADD_FAILURE() << DTypeName(dtype) << " n=" << n << " layout " << layout << " element "
                            << i << " of " << mine << ": got " << have << ", want " << want;
            }
          }
          EXPECT_EQ(wrong, 0u) << DTypeName(dtype) << " n=" << n << " layout " << layout;
          if (!in_place) {
            EXPECT_EQ(got[mine * esize], 0xAB) << "written past this rank's block";
          }
        }
      }
    }
    EXPECT_TRUE(backend.Drain(Deadline::After(milliseconds(10000))).ok());
  });
}

// Rank s sends (s + d) % 3 + 1 rows of 5 float32 to rank d (values s * 1000 + d * 100 + j):
// out of place, with the output over the input (sent from a copy), and with no output (received
// into scratch, dropped); then 2^20 bytes per destination.
TEST_F(NcclExchangeTest, AlltoallvUnevenOverlappingAndScratch) {
  OnRanks([&](int rank, DeviceBackend& backend) {
    auto rows = [](int from, int to) { return static_cast<size_t>((from + to) % 3 + 1); };
    for (int layout = 0; layout < 3; ++layout) {
      DeviceCollective c;
      c.kind = DeviceOpKind::kAlltoallv;
      c.device = rank;
      c.dtype = DType::kFloat32;
      std::vector<float> send, want;
      for (int d = 0; d < ranks_; ++d) {
        c.bytes_per_rank.push_back(rows(rank, d) * 5 * 4);
        c.recv_bytes_per_rank.push_back(rows(d, rank) * 5 * 4);
        for (size_t j = 0; j < rows(rank, d) * 5; ++j) send.push_back(rank * 1000 + d * 100 + j);
        for (size_t j = 0; j < rows(d, rank) * 5; ++j) want.push_back(d * 1000 + rank * 100 + j);
      }
      std::vector<uint8_t> host(send.size() * 4);
      std::memcpy(host.data(), send.data(), host.size());
      const size_t capacity = std::max(send.size(), want.size()) * 4;
      cuda::DeviceBuffer in = Upload(rank, host, capacity);
      cuda::DeviceBuffer out = Upload(rank, {}, want.size() * 4 + 4);
      void* dst = layout == 0 ? out.data() : layout == 1 ? in.data() : nullptr;
      c.tensors.push_back(DeviceTensor{in.data(), dst, send.size(), nullptr, nullptr});
      const Status s = LaunchAndWait(backend, c);
      ASSERT_TRUE(s.ok()) << "layout " << layout << ": " << s.ToString();
      if (layout == 2) continue;
      const std::vector<uint8_t> got = Download(layout == 0 ? out : in, 0, want.size() * 4);
      std::vector<float> values(want.size());
      std::memcpy(values.data(), got.data(), got.size());
      EXPECT_EQ(values, want) << "layout " << layout;
    }
    const size_t per = size_t{1} << 20;
    std::vector<uint8_t> host(per * ranks_);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i / per * 16 + rank);
    cuda::DeviceBuffer in = Upload(rank, host), out = Upload(rank, {}, host.size());
    DeviceCollective big;
    big.kind = DeviceOpKind::kAlltoallv;
    big.device = rank;
    big.dtype = DType::kUint8;
    big.bytes_per_rank.assign(ranks_, per);
    big.recv_bytes_per_rank.assign(ranks_, per);
    big.tensors.push_back(DeviceTensor{in.data(), out.data(), host.size(), nullptr, nullptr});
    ASSERT_TRUE(LaunchAndWait(backend, big).ok());
    const std::vector<uint8_t> got = Download(out, 0, host.size());
    for (int src = 0; src < ranks_; ++src) {
      ASSERT_EQ(got[src * per], static_cast<uint8_t>(rank * 16 + src));
      ASSERT_EQ(got[src * per + per - 1], static_cast<uint8_t>(rank * 16 + src));
    }
  });
}

// To every root: a reduce of 4099 float32 (average, prescale 2, postscale 0.5; in place on the
// root, no output elsewhere) and of 7 int64 (max, out of place); a gatherv of r + 1 rows of 3
// int32 from rank r (none from rank 1 when there are two ranks or more), into the root's output
// or, with no output, into scratch.
TEST_F(NcclExchangeTest, ReduceAndGathervToEveryRoot) {
  OnRanks([&](int rank, DeviceBackend& backend) {
    for (int root = 0; root < ranks_; ++root) {
      const bool is_root = rank == root;
      std::vector<uint8_t> fh(4099 * 4);
      for (size_t i = 0; i < 4099; ++i) StoreElement(DType::kFloat32, fh.data(), i, rank + 1.0);
      cuda::DeviceBuffer f = Upload(rank, fh);
      DeviceCollective avg;
      avg.kind = DeviceOpKind::kReduce;
      avg.device = rank;
      avg.dtype = DType::kFloat32;
      avg.op = ReduceOp::kAverage;
      avg.prescale = 2.0;
      avg.postscale = 0.5;
      avg.root = root;
      avg.tensors.push_back(
          DeviceTensor{f.data(), is_root ? f.data() : nullptr, 4099, nullptr, nullptr});
      ASSERT_TRUE(LaunchAndWait(backend, avg).ok());
      const std::vector<uint8_t> fg = Download(f, 0, fh.size());
      for (size_t i : {size_t{0}, size_t{4098}}) {
        const double have = LoadElement(DType::kFloat32, fg.data(), i);
        EXPECT_FLOAT_EQ(have, is_root ? (ranks_ + 1) / 2.0 : rank + 1.0) << "root " << root;
      }

      std::vector<uint8_t> ih(7 * 8);
      for (size_t i = 0; i < 7; ++i) StoreElement(DType::kInt64, ih.data(), i, Input(i, rank));
      cuda::DeviceBuffer in = Upload(rank, ih), out = Upload(rank, {}, ih.size());
      DeviceCollective max;
      max.kind = DeviceOpKind::kReduce;
      max.device = rank;
      max.dtype = DType::kInt64;
      max.op = ReduceOp::kMax;
      max.root = root;
      max.tensors.push_back(
          DeviceTensor{in.data(), is_root ? out.data() : nullptr, 7, nullptr, nullptr});
      ASSERT_TRUE(LaunchAndWait(backend, max).ok());
      if (is_root) {
        const std::vector<uint8_t> got = Download(out, 0, ih.size());
        for (size_t i = 0; i < 7; ++i) {
          EXPECT_EQ(LoadElement(DType::kInt64, got.data(), i), Input(i, ranks_ - 1));
        }
      }

      DeviceCollective g;
      g.kind = DeviceOpKind::kGatherv;
      g.device = rank;
      g.dtype = DType::kInt32;
      g.root = root;
      std::vector<int32_t> want;
      for (int r = 0; r < ranks_; ++r) {
        const size_t rows = r == 1 ? 0 : r + 1;
        g.bytes_per_rank.push_back(rows * 3 * 4);
        for (size_t j = 0; j < rows * 3; ++j) want.push_back(r * 100 + root * 10 + j);
      }
      std::vector<uint8_t> mine(g.bytes_per_rank[rank]);
      for (size_t j = 0; j < mine.size() / 4; ++j) {
        StoreElement(DType::kInt32, mine.data(), j, rank * 100 + root * 10 + j);
      }
      cuda::DeviceBuffer gin = Upload(rank, mine), gout = Upload(rank, {}, want.size() * 4);
      for (bool scratch : {false, true}) {
        DeviceCollective run = g;
        run.tensors.push_back(DeviceTensor{gin.data(), is_root && !scratch ? gout.data() : nullptr,
                                           mine.size() / 4, nullptr, nullptr});
        ASSERT_TRUE(LaunchAndWait(backend, run).ok())
            << "root " << root << (scratch ? " scratch" : "");
      }
      if (is_root) {
        const std::vector<uint8_t> got = Download(gout, 0, want.size() * 4);
        std::vector<int32_t> values(want.size());
        std::memcpy(values.data(), got.data(), got.size());
        EXPECT_EQ(values, want) << "root " << root;
      }
    }
    EXPECT_TRUE(backend.Drain(Deadline::After(milliseconds(10000))).ok());
  });
}

// Malformed collectives are refused at launch, before anything reaches NCCL, and the backend
// goes on working: counts or byte counts not one per rank, a root out of range.
TEST_F(NcclExchangeTest, MalformedCollectivesAreRefused) {
  OnRanks([&](int rank, DeviceBackend& backend) {
    cuda::DeviceBuffer b = Upload(rank, std::vector<uint8_t>(64, 1));
    DeviceCollective rs;
    rs.kind = DeviceOpKind::kReducescatter;
    rs.device = rank;
    rs.counts_per_rank.assign(ranks_ + 1, 1);
    rs.tensors.push_back(DeviceTensor{b.data(), b.data(), 4, nullptr, nullptr});
    DeviceCollective a2a = rs;
    a2a.kind = DeviceOpKind::kAlltoallv;
    a2a.bytes_per_rank.assign(ranks_, 4);  // no receive counts
    DeviceCollective reduce = rs;
    reduce.kind = DeviceOpKind::kReduce;
    reduce.root = ranks_;
    DeviceCollective gather = reduce;
    gather.kind = DeviceOpKind::kGatherv;
    gather.root = 0;
    gather.bytes_per_rank.assign(ranks_ + 2, 4);
    for (const DeviceCollective& c : {rs, a2a, reduce, gather}) {
      Completion never;
      auto launched = backend.Launch(c, never.Callback());
      ASSERT_FALSE(launched.ok()) << "kind " << static_cast<int>(c.kind);
      EXPECT_EQ(launched.status().code(), Code::kInvalidArgument) << launched.status().ToString();
    }
    DeviceCollective fine;
    fine.kind = DeviceOpKind::kAllreduce;
    fine.device = rank;
    fine.dtype = DType::kUint8;
    fine.tensors.push_back(DeviceTensor{b.data(), b.data(), 64, nullptr, nullptr});
    const Status s = LaunchAndWait(backend, fine);
    EXPECT_TRUE(s.ok()) << "after the refusals: " << s.ToString();
  });
}

}  // namespace
}  // namespace concord
