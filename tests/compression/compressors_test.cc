// The element-wise compressors (none, fp16, bf16) through the Compressor interface: round trips
// for every accepted dtype and size class with each cast's error bound, special values, refused
// dtypes and buffers, the prescale that keeps an average's half-precision sum finite, DecodeSum
// over gathered shares, the bytes-on-the-wire accounting and the CompressionState contract.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compression/casts.h"
#include "compression/registry.h"
#include "compression/topk.h"
#include "tests/common/tensors.h"
#include "tests/compression/compression_test_util.h"

namespace concord {
namespace compression {
namespace {

using harness::kAllDTypes;
using harness::LoadElement;
using testing_util::Buffer;
using testing_util::Make;

constexpr size_t kSizes[] = {0, 1, 17, 1001, (1 << 20) + 3};

// Random data of `dtype` (as raw bytes in an aligned buffer), values in the fp16 normal range.
Buffer RandomTensor(DType dtype, size_t n, uint32_t seed) {
  Buffer b(n * DTypeSize(dtype));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mag(-13.0, 15.0);
  for (size_t i = 0; i < n; ++i) {
    const double v = std::exp2(mag(rng)) * (rng() % 2 ? 1 : -1);
    switch (dtype) {
      case DType::kFloat32:
        reinterpret_cast<float*>(b.data())[i] = static_cast<float>(v);
        break;
      case DType::kFloat64:
        reinterpret_cast<double*>(b.data())[i] = v;
        break;
      default:
        for (size_t j = 0; j < DTypeSize(dtype); ++j) b.data()[i * DTypeSize(dtype) + j] = rng();
    }
  }
  return b;
}

TEST(CompressorsTest, NoneRoundTripsEveryDTypeExactly) {
  auto c = Make("none");
  for (DType t : kAllDTypes) {
    for (size_t n : kSizes) {
      ASSERT_TRUE(c->CheckDType(t).ok());
      Buffer in = RandomTensor(t, n, 1);
      const size_t bytes = c->EncodedBytes(t, n);
      ASSERT_EQ(bytes, n * DTypeSize(t));
      Buffer enc(bytes), out(bytes);
      ASSERT_TRUE(c->Encode({"x", t, n, in.data(), 1.0}, enc.data(), nullptr).ok());
      ASSERT_TRUE(c->Decode(enc.data(), t, n, out.data()).ok());
      ASSERT_EQ(0, std::memcmp(in.data(), out.data(), bytes)) << DTypeName(t) << " " << n;
    }
  }
}

TEST(CompressorsTest, CastsRoundTripWithinTheirBound) {
  for (const char* spec : {"fp16", "bf16"}) {
    auto c = Make(spec);
    const double bound = std::string(spec) == "fp16" ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    for (DType t : {DType::kFloat32, DType::kFloat64}) {
      for (size_t n : kSizes) {
        SCOPED_TRACE(std::string(spec) + " " + DTypeName(t) + " n=" + std::to_string(n));
        Buffer in = RandomTensor(t, n, 2);
        ASSERT_EQ(c->EncodedBytes(t, n), 2 * n);
        Buffer enc(2 * n), out(n * DTypeSize(t));
        ASSERT_TRUE(c->Encode({"x", t, n, in.data(), 1.0}, enc.data(), nullptr).ok());
        ASSERT_TRUE(c->Decode(enc.data(), t, n, out.data()).ok());
        for (size_t i = 0; i < n; ++i) {
          const double x = LoadElement(t, in.data(), i);
          ASSERT_LE(std::fabs(LoadElement(t, out.data(), i) - x), bound * std::fabs(x)) << x;
        }
      }
    }
  }
}

TEST(CompressorsTest, CastsKeepSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {inf,
                                 -inf,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 -0.0f,
                                 65504.0f,
                                 70000.0f,
                                 -1e9f,
                                 std::ldexp(1.0f, -24),
                                 std::ldexp(1.0f, -26),
                                 std::numeric_limits<float>::max(),
                                 std::numeric_limits<float>::denorm_min(),
                                 1e-40f};
  std::vector<float> fp16(in.size()), bf16(in.size());
  Buffer enc(2 * in.size());
  auto h = Make("fp16");
  ASSERT_TRUE(
      h->Encode({"x", DType::kFloat32, in.size(), in.data(), 1.0}, enc.data(), nullptr).ok());
  ASSERT_TRUE(h->Decode(enc.data(), DType::kFloat32, in.size(), fp16.data()).ok());
  auto b = Make("bf16");
  ASSERT_TRUE(
      b->Encode({"x", DType::kFloat32, in.size(), in.data(), 1.0}, enc.data(), nullptr).ok());
  ASSERT_TRUE(b->Decode(enc.data(), DType::kFloat32, in.size(), bf16.data()).ok());
  EXPECT_EQ(fp16[0], inf);
  EXPECT_EQ(fp16[1], -inf);
  EXPECT_TRUE(std::isnan(fp16[2]));
  EXPECT_TRUE(std::signbit(fp16[3]) && fp16[3] == 0.0f);
  EXPECT_EQ(fp16[4], 65504.0f);
  EXPECT_EQ(fp16[5], inf);                    // overflow
  EXPECT_EQ(fp16[6], -inf);                   // overflow
  EXPECT_EQ(fp16[7], std::ldexp(1.0f, -24));  // smallest subnormal kept
  EXPECT_EQ(fp16[8], 0.0f);                   // underflow
  EXPECT_EQ(fp16[9], inf);
  EXPECT_EQ(bf16[0], inf);
  EXPECT_TRUE(std::isnan(bf16[2]));
  EXPECT_TRUE(std::signbit(bf16[3]));
  EXPECT_EQ(bf16[5], 70144.0f);  // in range for bf16, to 8 significant bits
  EXPECT_EQ(bf16[9], inf);       // FLT_MAX rounds up past bf16's max
  EXPECT_EQ(bf16[10], 0.0f);     // 2^-149 is below half a bf16 subnormal ulp
  EXPECT_NE(bf16[11], 0.0f);     // a float subnormal bf16 can hold approximately is kept
}

TEST(CompressorsTest, CastsRefuseOtherDTypes) {
  for (const char* spec : {"fp16", "bf16"}) {
    auto c = Make(spec);
    Buffer buf(64);
    for (DType t : {DType::kUint8, DType::kInt8, DType::kInt32, DType::kInt64, DType::kFloat16,
                    DType::kBFloat16}) {
      const Status s = c->Encode({"x", t, 4, buf.data(), 1.0}, buf.data(), nullptr);
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << spec << " " << DTypeName(t);
      EXPECT_NE(s.message().find("float32 or float64"), std::string::npos) << s.message();
      EXPECT_FALSE(c->Decode(buf.data(), t, 4, buf.data()).ok());
    }
    EXPECT_FALSE(c->CheckDType(static_cast<DType>(42)).ok());
  }
  EXPECT_FALSE(Make("none")->CheckDType(static_cast<DType>(-1)).ok());
}

TEST(CompressorsTest, RefusesNullAndMisalignedBuffers) {
  for (const char* spec : {"none", "fp16", "bf16", "topk:density=0.5"}) {
    auto c = Make(spec);
    CompressionState state;
    Buffer buf(256);
    const std::vector<float> in(16, 1.0f);
    EXPECT_FALSE(c->Encode({"x", DType::kFloat32, 16, nullptr, 1.0}, buf.data(), &state).ok());
    EXPECT_FALSE(c->Encode({"x", DType::kFloat32, 16, in.data(), 1.0}, nullptr, &state).ok());
    EXPECT_FALSE(
        c->Encode({"x", DType::kFloat32, 16, in.data(), 1.0}, buf.data() + 2, &state).ok());
    EXPECT_FALSE(c->Decode(buf.data() + 4, DType::kFloat32, 16, buf.data() + 128).ok());
    EXPECT_FALSE(c->Decode(buf.data(), DType::kFloat32, 16, buf.data() + 129).ok()) << spec;
  }
}

// 4 ranks average values near fp16's max: the prescale keeps the half-precision sum finite.
TEST(CompressorsTest, PrescaleKeepsAnAveragedHalfSumInRange) {
  auto c = Make("fp16");
  const size_t n = 33;
  const int ranks = 4;
  std::vector<float> in(n, 60000.0f);
  for (double scale : {1.0, 1.0 / ranks}) {
    Buffer sum(2 * n), one(2 * n);
    ASSERT_TRUE(c->Encode({"x", DType::kFloat32, n, in.data(), scale}, sum.data(), nullptr).ok());
    for (int r = 1; r < ranks; ++r) {
      ASSERT_TRUE(c->Encode({"x", DType::kFloat32, n, in.data(), scale}, one.data(), nullptr).ok());
      ReduceElements(sum.data(), sum.data(), one.data(), n, c->reduce_dtype(DType::kFloat32),
                     ReduceOp::kSum);
    }
    std::vector<float> out(n);
    ASSERT_TRUE(c->Decode(sum.data(), DType::kFloat32, n, out.data()).ok());
    if (scale == 1.0) {
      EXPECT_TRUE(std::isinf(out[0]));  // the sum of four 60000s overflows fp16
    } else {
      EXPECT_NEAR(out[0], 60000.0f, 60000.0f * std::ldexp(1.0f, -10));
    }
  }
}

TEST(CompressorsTest, DecodeSumAddsEveryRanksShare) {
  for (const char* spec : {"none", "fp16", "bf16", "topk:density=1,method=exact"}) {
    auto c = Make(spec);
    const size_t n = 1001;
    const int ranks = 3;
    const size_t stride = (c->EncodedBytes(DType::kFloat32, n) + 7) / 8 * 8 + 8;
    Buffer gathered(stride * ranks);
    std::vector<CompressionState> states(ranks);
    std::vector<float> expected(n, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> g(n);
      for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i % 7) * (r + 1));  // exact in fp16
      for (size_t i = 0; i < n; ++i) expected[i] += g[i];
      ASSERT_TRUE(c->Encode({"x", DType::kFloat32, n, g.data(), 1.0}, gathered.data() + r * stride,
                            &states[r])
                      .ok());
    }
    std::vector<float> dense(n, 123.0f);
    ASSERT_TRUE(
        DecodeSum(*c, gathered.data(), stride, ranks, DType::kFloat32, n, dense.data()).ok());
    EXPECT_EQ(dense, expected) << spec;
    EXPECT_FALSE(
        DecodeSum(*c, gathered.data(), stride - 8 - 1, ranks, DType::kFloat32, n, dense.data())
            .ok());
    EXPECT_FALSE(DecodeSum(*c, gathered.data(), stride, 0, DType::kFloat32, n, dense.data()).ok());
  }
}

TEST(CompressorsTest, DoubleInputsAccumulateInDouble) {
  auto c = Make("bf16");
  const std::vector<double> in = {1.0, -2.0, 0.5};
  Buffer enc(6);
  ASSERT_TRUE(c->Encode({"x", DType::kFloat64, 3, in.data(), 0.5}, enc.data(), nullptr).ok());
  std::vector<double> dense = {1e-12, 0.0, 1.0};
  ASSERT_TRUE(c->DecodeAccumulate(enc.data(), DType::kFloat64, 3, dense.data()).ok());
  EXPECT_EQ(dense, (std::vector<double>{0.5 + 1e-12, -1.0, 1.25}));
}

// Integer sums and products wrap around (two's complement) rather than overflow, which was
// undefined behaviour (tests/fuzz/fuzz_compressed found it).
TEST(CompressorsTest, IntegerSumsWrapAround) {
  auto none = CreateCompressor("none");
  ASSERT_TRUE(none.ok());
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  alignas(8) const int32_t shares[2][2] = {{kMax, -5}, {1, kMin}};
  alignas(8) int32_t dense[2] = {};
  ASSERT_TRUE(DecodeSum(**none, shares, sizeof(shares[0]), 2, DType::kInt32, 2, dense).ok());
  EXPECT_EQ(dense[0], kMin);
  EXPECT_EQ(dense[1], kMax - 4);
  const int64_t a = std::numeric_limits<int64_t>::max(), b = 2;
  int64_t product = 0;
  ReduceElements(&product, &a, &b, 1, DType::kInt64, ReduceOp::kProduct);
  EXPECT_EQ(product, -2);
}

TEST(CompressorsTest, WireBytesFollowRingAlgorithms) {
  EXPECT_EQ(WireBytesPerRank(Exchange::kAllreduce, 100, 1), 0u);
  EXPECT_EQ(WireBytesPerRank(Exchange::kAllreduce, 100, 4), 150u);
  EXPECT_EQ(WireBytesPerRank(Exchange::kAllreduce, 100, 3), 134u);  // 133.3 rounded up
  EXPECT_EQ(WireBytesPerRank(Exchange::kAllgather, 100, 4), 300u);
  EXPECT_EQ(WireBytesPerRank(Exchange::kAllgather, 0, 4), 0u);
  EXPECT_STREQ(ExchangeName(Exchange::kAllreduce), "allreduce");
  EXPECT_STREQ(ExchangeName(Exchange::kAllgather), "allgather");
}

// A model-like mix of tensors at 4 ranks: fp16 sends half of none, top-k at 0.01 over 10x less.
TEST(CompressorsTest, WireBytesOfAModelStep) {
  std::vector<size_t> tensors;
  for (int layer = 0; layer < 50; ++layer) {
    tensors.push_back(64 << (layer % 4));                   // biases and norms
    tensors.push_back(size_t{9} * 64 * 64 << (layer % 4));  // convolutions
  }
  tensors.push_back(2048 * 1000);
  auto step_bytes = [&](const std::string& spec) {
    auto c = Make(spec);
    uint64_t total = 0;
    for (size_t n : tensors) {
      total += WireBytesPerRank(c->exchange(), c->EncodedBytes(DType::kFloat32, n), 4);
    }
    return total;
  };
  const uint64_t none = step_bytes("none");
  EXPECT_EQ(step_bytes("fp16") * 2, none);
  EXPECT_EQ(step_bytes("bf16") * 2, none);
  EXPECT_GE(none, 10 * step_bytes("topk:density=0.01"));
  EXPECT_GE(none, 100 * step_bytes("topk:density=0.001,values=fp16"));
}

TEST(CompressionStateTest, KeepsResidualsByName) {
  CompressionState state;
  EXPECT_EQ(state.FindResidual("a"), nullptr);
  float* a = state.Residual("a", 10);
  ASSERT_NE(a, nullptr);
  a[3] = 2.0f;
  ASSERT_NE(state.Residual("b", 5), nullptr);
  EXPECT_EQ(state.num_tensors(), 2u);
  EXPECT_EQ(state.residual_bytes(), 60u);
  EXPECT_EQ((*state.FindResidual("a"))[3], 2.0f);
  // Another shape under the same name starts again from zeros, and is counted.
  EXPECT_EQ(state.resets(), 0u);
  float* again = state.Residual("a", 11);
  EXPECT_EQ(state.resets(), 1u);
  EXPECT_EQ(state.last_reset(), "a");
  EXPECT_EQ(state.FindResidual("a")->size(), 11u);
  for (size_t i = 0; i < 11; ++i) EXPECT_EQ(again[i], 0.0f) << i;
  EXPECT_EQ(state.residual_bytes(), 64u);
  state.Erase("a");
  EXPECT_EQ(state.FindResidual("a"), nullptr);
  EXPECT_NE(state.Residual("a", 12), nullptr);
  EXPECT_EQ(state.resets(), 1u);  // a new name after Erase is no reset
  // The selection scratch's memory goes too, not only its contents.
  state.index_scratch().resize(1000);
  state.key_scratch().resize(1000);
  state.order_scratch().resize(1000);
  state.Clear();
  EXPECT_EQ(state.num_tensors(), 0u);
  EXPECT_EQ(state.index_scratch().capacity(), 0u);
  EXPECT_EQ(state.key_scratch().capacity(), 0u);
  EXPECT_EQ(state.order_scratch().capacity(), 0u);
}

TEST(CompressionStateTest, KeepsAtMostMaxResidualsEvictingTheLeastRecentlyUsed) {
  CompressionState state(3);
  EXPECT_EQ(state.max_residuals(), 3u);
  state.Residual("a", 4)[0] = 1.0f;
  ASSERT_NE(state.Residual("b", 4), nullptr);
  ASSERT_NE(state.Residual("c", 4), nullptr);
  ASSERT_NE(state.Residual("a", 4), nullptr);  // "b" is now the least recently used
  EXPECT_EQ(state.evictions(), 0u);
  ASSERT_NE(state.Residual("d", 4), nullptr);
  EXPECT_EQ(state.evictions(), 1u);
  EXPECT_EQ(state.last_evicted(), "b");
  EXPECT_EQ(state.FindResidual("b"), nullptr);
  ASSERT_NE(state.FindResidual("a"), nullptr);
  EXPECT_EQ((*state.FindResidual("a"))[0], 1.0f);
  EXPECT_EQ(state.num_tensors(), 3u);
  // Names used once each: memory stays at three residuals.
  for (int i = 0; i < 1000; ++i) ASSERT_NE(state.Residual("once." + std::to_string(i), 4), nullptr);
  EXPECT_EQ(state.num_tensors(), 3u);
  EXPECT_EQ(state.residual_bytes(), 3 * 4 * sizeof(float));
  EXPECT_EQ(state.evictions(), 1001u);
  // An evicted name comes back from zero.
  EXPECT_EQ(state.Residual("a", 4)[0], 0.0f);
  // A bound of 0 keeps one residual (the one being encoded).
  CompressionState one(0);
  EXPECT_EQ(one.max_residuals(), 1u);
  ASSERT_NE(one.Residual("x", 2), nullptr);
  ASSERT_NE(one.Residual("y", 2), nullptr);
  EXPECT_EQ(one.num_tensors(), 1u);
}

}  // namespace
}  // namespace compression
}  // namespace concord
