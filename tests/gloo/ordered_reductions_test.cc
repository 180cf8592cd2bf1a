// Tests of the reduce-scatter and allreduce that fold in rank order
// (backends/gloo/ordered_reductions.h; Backend::OrderedReduceScatter and OrderedAllreduce on Gloo)
// with ranks as threads: at 2-4 ranks, for every dtype and op, uneven and empty blocks, counts 0,
// 1, odd and large, and segments from far smaller than a block to larger, each result must be bit
// for bit the left fold of ReduceElements over ranks 0, 1, ..., size-1, computed here from every
// rank's inputs (float inputs of widely varying magnitude, so that another order gives other bits:
// checked). Also through the backend with blocks of many 256 KiB segments, bad arguments, and a
// peer that goes away.
#include "backends/gloo/ordered_reductions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/gloo/gloo_context.h"
#include "tests/gloo/gloo_test_util.h"

namespace concord {
namespace {

using harness::StoreElement;
using testing_gloo::RunRanks;

// Rank `rank`'s `count` inputs as `dtype`: floats of magnitudes 2^-6 .. 2^7 and either sign (their
// sums round differently by order), integers testing_gloo::Input's (exact in every op).
std::vector<uint8_t> Inputs(DType dtype, ReduceOp op, size_t count, int rank) {
  std::vector<uint8_t> out(count * DTypeSize(dtype));
  std::mt19937 rng(7919 * static_cast<unsigned>(rank) + 17);
  for (size_t i = 0; i < count; ++i) {
    float f = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f,
                         static_cast<int>(rng() % 14) - 6);
    if ((rng() & 1) != 0) f = -f;
    switch (dtype) {
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(f);
        std::memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t b = FloatToBFloat16(f);
        std::memcpy(out.data() + 2 * i, &b, 2);
        break;
      }
      case DType::kFloat32:
        std::memcpy(out.data() + 4 * i, &f, 4);
        break;
      case DType::kFloat64: {
        const double d = static_cast<double>(f) * (1.0 + 1e-9 * static_cast<double>(rng() % 1000));
        std::memcpy(out.data() + 8 * i, &d, 8);
        break;
      }
      default:
        StoreElement(dtype, out.data(), i, testing_gloo::Input(dtype, op, rank, i));
    }
  }
  return out;
}

// Block `block` of the counts' layout folded over the ranks in `order`, as ReduceElements would.
std::vector<uint8_t> Fold(DType dtype, ReduceOp op, const std::vector<size_t>& counts, int block,
                          const std::vector<int>& order) {
  size_t total = 0, first = 0;
  for (size_t b = 0; b < counts.size(); ++b) {
    if (static_cast<int>(b) < block) first += counts[b];
    total += counts[b];
  }
  const size_t esize = DTypeSize(dtype);
  const size_t bytes = counts[block] * esize;
  const ReduceOp reduce = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  std::vector<uint8_t> acc;
  for (int rank : order) {
    const std::vector<uint8_t> in = Inputs(dtype, op, total, rank);
    if (acc.empty()) {
      acc.assign(in.begin() + first * esize, in.begin() + first * esize + bytes);
    } else {
      ReduceElements(acc.data(), acc.data(), in.data() + first * esize, counts[block], dtype,
                     reduce);
    }
  }
  return acc;
}

std::vector<int> RankOrder(int size) {
  std::vector<int> order(size);
  for (int r = 0; r < size; ++r) order[r] = r;
  return order;
}

// Runs the reduce-scatter on this rank and compares its block with the fold (fatal failures).
void CheckOne(const std::function<void(const void*, void*)>& run, DType dtype, ReduceOp op,
              const std::vector<size_t>& counts, int rank, const std::string& what) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::vector<uint8_t> in = Inputs(dtype, op, total, rank);
  const size_t bytes = counts[rank] * DTypeSize(dtype);
  std::vector<uint8_t> out(bytes + 1, 0xee);  // one guard byte past the end
  run(in.data(), out.data());
  const std::vector<uint8_t> want =
      Fold(dtype, op, counts, rank, RankOrder(static_cast<int>(counts.size())));
  ASSERT_EQ(bytes == 0 || std::memcmp(out.data(), want.data(), bytes) == 0, true)
      << what << ": " << DTypeName(dtype) << " " << ReduceOpName(op) << " rank " << rank
      << ": not the rank-order fold";
  ASSERT_EQ(out[bytes], 0xee) << what << ": wrote past the block";
}

// The function itself with segments of a few elements to more than a block: two segments per
// peer in flight, the scratch area reused across calls, empty blocks and fewer elements than
// ranks.
TEST(OrderedReductionsTest, EveryDTypeOpAndLayoutGivesTheRankOrderFold) {
  for (int size = 2; size <= 4; ++size) {
    std::vector<std::vector<size_t>> layouts = {
        {5, 0, 17, 1}, {1, 0, 0, 0}, {0, 0, 0, 0}, {100, 1, 64, 99}, {3, 3, 3, 3}};
    for (auto& counts : layouts) counts.resize(size);
    testing_gloo::RunContextRanks(
        size, [&](const std::shared_ptr<gloo_internal::GlooContext>& context, int rank) {
          std::vector<uint8_t> scratch;
          for (size_t segment_bytes : {size_t{4}, size_t{24}, size_t{1000}}) {
            for (DType dtype : harness::kAllDTypes) {
              for (ReduceOp op : harness::kAllReduceOps) {
                for (const auto& counts : layouts) {
                  // Gloo reports a failure by throwing: RunContextRanks fails the test with it.
                  CheckOne(
                      [&](const void* in, void* out) {
                        gloo_internal::OrderedRun run;
                        run.fold_slot = 0x4400;
                        run.segment_bytes = segment_bytes;
                        run.scratch = &scratch;
                        gloo_internal::OrderedReduceScatter(context, in, out, counts, dtype, op,
                                                            run);
                      },
                      dtype, op, counts, rank, "segment " + std::to_string(segment_bytes));
                  if (::testing::Test::HasFatalFailure()) return;
                }
              }
            }
          }
        });
  }
}

// The allreduce: every rank gets the whole fold, the same bits, in place.
TEST(OrderedReductionsTest, AllreduceGivesEveryRankTheRankOrderFold) {
  for (int size = 2; size <= 4; ++size) {
    testing_gloo::RunContextRanks(
        size, [&](const std::shared_ptr<gloo_internal::GlooContext>& context, int rank) {
          std::vector<uint8_t> scratch;
          // (segment bytes, count): segments of an element or a few, and of more than a block.
          // Blocks are whole cache lines: 40 4-byte elements at 4 ranks leave rank 3 none.
          const std::vector<std::pair<size_t, size_t>> cases = {
              {4, 0}, {4, 1}, {4, 3}, {4, 37}, {24, 37}, {8, 40}, {1000, 1}, {1000, 4099}};
          for (const auto& [segment_bytes, count] : cases) {
            for (DType dtype : harness::kAllDTypes) {
              for (ReduceOp op : harness::kAllReduceOps) {
                gloo_internal::OrderedRun run;
                run.fold_slot = 0x4400;
                run.gather_slot = 0x4401;
                run.segment_bytes = segment_bytes;
                run.scratch = &scratch;
                std::vector<uint8_t> data = Inputs(dtype, op, count, rank);
                data.push_back(0xee);  // a guard byte past the end
                gloo_internal::OrderedAllreduce(context, data.data(), count, dtype, op, run);
                const size_t bytes = count * DTypeSize(dtype);
                const std::vector<uint8_t> want = Fold(dtype, op, {count}, 0, RankOrder(size));
                ASSERT_TRUE(bytes == 0 || std::memcmp(data.data(), want.data(), bytes) == 0)
                    << size << " ranks, segment " << segment_bytes << ": " << DTypeName(dtype)
                    << " " << ReduceOpName(op) << " x " << count << " on rank " << rank
                    << ": not the rank-order fold";
                ASSERT_EQ(data[bytes], 0xee) << "wrote past the data";
              }
            }
          }
        });
  }
}

// The inputs make the order matter: another order's fold differs somewhere (else the test above
// could not tell a rank-order fold from any other).
TEST(OrderedReductionsTest, AnotherOrderGivesOtherBits) {
  const std::vector<size_t> counts = {1000, 1000, 1000, 1000};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    const std::vector<uint8_t> forward = Fold(dtype, ReduceOp::kSum, counts, 1, {0, 1, 2, 3});
    const std::vector<uint8_t> rotated = Fold(dtype, ReduceOp::kSum, counts, 1, {2, 3, 0, 1});
    EXPECT_NE(forward, rotated) << DTypeName(dtype);
  }
}

// Through the backend: blocks of many of its 256 KiB segments, uneven, one of a single element.
TEST(OrderedReductionsTest, BackendFoldsLargeBlocksInRankOrder) {
  for (int size : {3, 4}) {
    std::vector<size_t> counts = {300001, 17, 600000, 1};
    counts.resize(size);
    RunRanks(size, "auto", [&](Backend& backend) {
      ASSERT_TRUE(backend.HasOrderedReductions());
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin}) {
        CheckOne(
            [&](const void* in, void* out) {
              const Status s = backend.OrderedReduceScatter(in, out, counts, DType::kFloat32, op);
              ASSERT_TRUE(s.ok()) << s.ToString();
              EXPECT_STREQ(backend.LastAlgorithm(), "ordered");
            },
            DType::kFloat32, op, counts, backend.rank(), std::to_string(size) + " ranks");
        if (::testing::Test::HasFatalFailure()) return;
      }
    });
  }
}

TEST(OrderedReductionsTest, BackendAllreducesLargeDataInRankOrder) {
  for (int size : {2, 3, 4}) {
    const size_t count = 1200007;  // 4.8 MB of float32: many segments per block
    RunRanks(size, "auto", [&](Backend& backend) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        std::vector<uint8_t> data = Inputs(DType::kFloat32, op, count, backend.rank());
        const Status s = backend.OrderedAllreduce(data.data(), count, DType::kFloat32, op);
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_STREQ(backend.LastAlgorithm(), "ordered");
        ASSERT_TRUE(data == Fold(DType::kFloat32, op, {count}, 0, RankOrder(size)))
            << size << " ranks, " << ReduceOpName(op) << ", rank " << backend.rank();
      }
    });
  }
}

TEST(OrderedReductionsTest, InvalidArgumentsAreRefusedOnTheCallingRank) {
  RunRanks(2, "auto", [&](Backend& backend) {
    std::vector<float> in(4, 1.0f), out(2, 0.0f);
    EXPECT_EQ(
        backend.OrderedReduceScatter(in.data(), out.data(), {2}, DType::kFloat32, ReduceOp::kSum)
            .code(),
        Code::kInvalidArgument);
    EXPECT_EQ(
        backend.OrderedReduceScatter(nullptr, out.data(), {2, 2}, DType::kFloat32, ReduceOp::kSum)
            .code(),
        Code::kInvalidArgument);
    EXPECT_EQ(backend
                  .OrderedReduceScatter(in.data(), out.data(), {2, 2}, static_cast<DType>(99),
                                        ReduceOp::kSum)
                  .code(),
              Code::kInvalidArgument);
    EXPECT_EQ(backend.OrderedAllreduce(nullptr, 4, DType::kFloat32, ReduceOp::kSum).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(
        backend.OrderedAllreduce(in.data(), 4, DType::kFloat32, static_cast<ReduceOp>(99)).code(),
        Code::kInvalidArgument);
    // Refused before anything was sent: the ranks still agree afterwards.
    ASSERT_TRUE(
        backend.OrderedReduceScatter(in.data(), out.data(), {2, 2}, DType::kFloat32, ReduceOp::kSum)
            .ok());
    EXPECT_EQ(out, std::vector<float>(2, 2.0f));
  });
}

// A rank whose backend goes away turns the other rank's ordered reduce-scatter into an error
// within the timeout; the backend then refuses further calls with that error.
TEST(OrderedReductionsTest, PeerGoneFailsWithinTimeout) {
  testing_gloo::ExpectPeerGoneFails(
      [](Backend& backend) {
        std::vector<float> in(600000, 1.0f), out(300000);
        return backend.OrderedReduceScatter(in.data(), out.data(), {300000, 300000},
                                            DType::kFloat32, ReduceOp::kSum);
      },
      "ordered reduce-scatter");
  testing_gloo::ExpectPeerGoneFails(
      [](Backend& backend) {
        std::vector<float> data(600001, 1.0f);
        return backend.OrderedAllreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
      },
      "ordered allreduce");
}

}  // namespace
}  // namespace concord
