// Tests of the allreduce over several buffers (Backend::AllreduceSpans on Gloo, the span ring of
// backends/gloo/span_allreduce.h) with ranks as threads: every dtype and op over layouts with
// empty, single-element and odd buffers at 1-4 ranks, fewer elements than ranks, segments far
// smaller than the buffers (pieces cut at segment and buffer boundaries), large buffers,
// bit-identical floats at 3 and 4 ranks, bad arguments and a peer that goes away.
#include "backends/gloo/span_allreduce.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/gloo/gloo_context.h"
#include "tests/gloo/gloo_test_util.h"

namespace concord {
namespace {

using harness::LoadElement;
using harness::StoreElement;
using testing_gloo::Expected;
using testing_gloo::Input;
using testing_gloo::RunRanks;

// One rank's buffers of the given element counts, filled with Input() by logical index (the
// index in all buffers laid end to end).
struct Buffers {
  Buffers(DType dtype, ReduceOp op, int rank, const std::vector<size_t>& counts) : dtype(dtype) {
    size_t logical = 0;
    for (size_t count : counts) {
      data.emplace_back(count * DTypeSize(dtype) + 1, 0xee);  // one guard byte past the end
      for (size_t i = 0; i < count; ++i) {
        StoreElement(dtype, data.back().data(), i, Input(dtype, op, rank, logical++));
      }
      spans.push_back(AllreduceSpan{count > 0 ? data.back().data() : nullptr, count});
    }
  }

  // Checks every element against Expected() and every guard byte (fatal gtest failures).
  void Check(ReduceOp op, int size, const std::string& what) const {
    size_t logical = 0;
    for (size_t b = 0; b < spans.size(); ++b) {
      for (size_t i = 0; i < spans[b].count; ++i, ++logical) {
        ASSERT_EQ(LoadElement(dtype, data[b].data(), i), Expected(dtype, op, size, logical))
            << what << ": " << DTypeName(dtype) << " " << ReduceOpName(op) << ", buffer " << b
            << " element " << i;
      }
      ASSERT_EQ(data[b].back(), 0xee) << what << ": wrote past buffer " << b;
    }
  }

  DType dtype;
  std::vector<std::vector<unsigned char>> data;
  std::vector<AllreduceSpan> spans;
};

class SpanAllreduceTest : public ::testing::TestWithParam<int> {};

TEST_P(SpanAllreduceTest, EveryDTypeOpAndLayout) {
  const int size = GetParam();
  const std::vector<std::vector<size_t>> layouts = {
      {}, {0}, {1}, {0, 1, 0}, {7, 0, 4099, 3}, {1, 1, 1, 1, 1}, {3, 5}};
  RunRanks(size, "auto", [&](Backend& backend) {
    for (DType dtype : harness::kAllDTypes) {
      for (ReduceOp op : harness::kAllReduceOps) {
        for (const auto& counts : layouts) {
          Buffers buffers(dtype, op, backend.rank(), counts);
          const Status s = backend.AllreduceSpans(buffers.spans, dtype, op);
          ASSERT_TRUE(s.ok()) << s.ToString();
          buffers.Check(op, size, "rank " + std::to_string(backend.rank()));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  });
}

TEST_P(SpanAllreduceTest, LargeBuffersSpanManySegments) {
  const int size = GetParam();
  // 4.8 MB of float32: blocks of 1.2-2.4 MB, which the backend cuts into halves
  // (RingSegmentBytes), buffer boundaries inside segments.
  const std::vector<size_t> counts = {300001, 17, 600000, 299999, 1};
  RunRanks(size, "auto", [&](Backend& backend) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      Buffers buffers(DType::kFloat32, op, backend.rank(), counts);
      const Status s = backend.AllreduceSpans(buffers.spans, DType::kFloat32, op);
      ASSERT_TRUE(s.ok()) << s.ToString();
      buffers.Check(op, size, "rank " + std::to_string(backend.rank()));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, SpanAllreduceTest, ::testing::Values(1, 2, 3, 4));

// The ring itself with tiny segments: pieces are cut at every segment and buffer boundary, two
// segments are in flight at a time, the scratch area is reused across calls of other layouts,
// and blocks are empty when there are fewer elements than ranks.
TEST(SpanRingTest, TinySegmentsAndFewerElementsThanRanks) {
  for (int size = 2; size <= 4; ++size) {
    testing_gloo::RunContextRanks(
        size, [&](const std::shared_ptr<gloo_internal::GlooContext>& context, int rank) {
          std::vector<uint8_t> scratch;
          const std::vector<std::vector<size_t>> layouts = {
              {5, 0, 17, 1, 64, 3}, {1}, {2, 0, 1}, {100, 1, 1, 100}, {0, 0}};
          for (size_t segment_bytes : {size_t{4}, size_t{24}, size_t{1000}}) {
            for (const auto& counts : layouts) {
              for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kFloat16}) {
                Buffers buffers(dtype, ReduceOp::kSum, rank, counts);
                // Gloo reports a failure by throwing: RunRanks fails the test with it.
                gloo_internal::SpanRingAllreduce(context, buffers.spans, dtype, ReduceOp::kSum,
                                                 0x4300, segment_bytes, &scratch, nullptr);
                buffers.Check(
                    ReduceOp::kSum, size,
                    "segment " + std::to_string(segment_bytes) + " rank " + std::to_string(rank));
                if (::testing::Test::HasFatalFailure()) return;
              }
            }
          }
        });
  }
}

// Every element is reduced on one rank and copied to the others: replicas get the same bits even
// where float sums round differently by order.
TEST(SpanAllreduceTest, EveryRankGetsTheSameBits) {
  for (int size : {3, 4}) {
    const std::vector<size_t> counts = {1, 1000, 0, 400000, 13};
    std::vector<std::vector<std::vector<float>>> results(size);
    RunRanks(size, "auto", [&](Backend& b) {
      std::vector<std::vector<float>> data;
      std::vector<AllreduceSpan> spans;
      for (size_t count : counts) {
        data.emplace_back(count);
        for (size_t i = 0; i < count; ++i) {
          data.back()[i] =
              1.0f / static_cast<float>(3 + i % 97) * static_cast<float>(b.rank() * 7 + 1) +
              1e-3f * static_cast<float>(i % 13);
        }
      }
      for (auto& d : data) spans.push_back(AllreduceSpan{d.data(), d.size()});
      ASSERT_TRUE(b.AllreduceSpans(spans, DType::kFloat32, ReduceOp::kSum).ok());
      results[b.rank()] = std::move(data);
    });
    for (int r = 1; r < size; ++r) {
      for (size_t k = 0; k < counts.size(); ++k) {
        if (counts[k] == 0) continue;  // memcmp must not see an empty vector's null data
        ASSERT_EQ(
            0, std::memcmp(results[0][k].data(), results[r][k].data(), counts[k] * sizeof(float)))
            << size << " ranks: rank " << r << " differs from rank 0 in buffer " << k;
      }
    }
  }
}

TEST(SpanAllreduceTest, InvalidArguments) {
  RunRanks(2, "auto", [&](Backend& backend) {
    std::vector<float> data(4, 1.0f);
    EXPECT_EQ(backend
                  .AllreduceSpans({AllreduceSpan{data.data(), 4}, AllreduceSpan{nullptr, 2}},
                                  DType::kFloat32, ReduceOp::kSum)
                  .code(),
              Code::kInvalidArgument);
    EXPECT_EQ(
        backend
            .AllreduceSpans({AllreduceSpan{data.data(), 4}}, static_cast<DType>(99), ReduceOp::kSum)
            .code(),
        Code::kInvalidArgument);
    // Refused on one rank before anything was sent: the ranks still agree afterwards.
    ASSERT_TRUE(
        backend.AllreduceSpans({AllreduceSpan{data.data(), 4}}, DType::kFloat32, ReduceOp::kSum)
            .ok());
    for (float v : data) EXPECT_EQ(v, 2.0f);
  });
}

// A rank whose backend goes away turns the other rank's span allreduce into an error within the
// timeout; the backend then refuses further calls with that error.
TEST(SpanAllreduceTest, PeerGoneFailsWithinTimeout) {
  testing_gloo::ExpectPeerGoneFails(
      [](Backend& backend) {
        std::vector<float> a(300000, 1.0f), b(5, 1.0f);
        return backend.AllreduceSpans({{a.data(), a.size()}, {b.data(), b.size()}}, DType::kFloat32,
                                      ReduceOp::kSum);
      },
      "allreduce of 2 buffers");
}

}  // namespace
}  // namespace concord
