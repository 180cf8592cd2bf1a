// ReduceElements' contract (base/dtype.h) on the values whose bits it fixes: floating min and max
// with NaN (the canonical quiet NaN, whichever operand holds which NaN) and -0/+0 (min -0, max
// +0), symmetric in their operands, for float16, bfloat16, float32 and float64, at lengths that
// take the vector loops and their tails; 8-bit sums and products wrap around.
#include "base/dtype.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace concord {
namespace {

struct Bits {
  DType dtype;
  uint64_t canonical_nan, other_nan, minus_nan, minus_zero, one, minus_two;
};
const Bits kFloats[] = {
    {DType::kFloat16, 0x7e00, 0x7e15, 0xfe01, 0x8000, 0x3c00, 0xc000},
    {DType::kBFloat16, 0x7fc0, 0x7fd5, 0xffc1, 0x8000, 0x3f80, 0xc000},
    {DType::kFloat32, 0x7fc00000, 0x7fc00015, 0xffc00001, 0x80000000, 0x3f800000, 0xc0000000},
    {DType::kFloat64, 0x7ff8000000000000, 0x7ff8000000000015, 0xfff8000000000001,
     0x8000000000000000, 0x3ff0000000000000, 0xc000000000000000},
};

// dst = a (op) b, elementwise, over n copies of the pair (x, y).
std::vector<uint64_t> Reduce(const Bits& t, ReduceOp op, uint64_t x, uint64_t y, size_t n) {
  const size_t es = DTypeSize(t.dtype);
  std::vector<unsigned char> a(n * es), b(n * es), d(n * es);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(&a[i * es], &x, es);
    std::memcpy(&b[i * es], &y, es);
  }
  ReduceElements(d.data(), a.data(), b.data(), n, t.dtype, op);
  std::vector<uint64_t> out(n, 0);
  for (size_t i = 0; i < n; ++i) std::memcpy(&out[i], &d[i * es], es);
  return out;
}

// Every element of (x op y) and of (y op x) has the bits `want`.
void ExpectBoth(const Bits& t, ReduceOp op, uint64_t x, uint64_t y, uint64_t want) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{1027}}) {
    for (const auto& out : {Reduce(t, op, x, y, n), Reduce(t, op, y, x, n)}) {
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], want) << DTypeName(t.dtype) << " " << ReduceOpName(op) << " of 0x"
                                << std::hex << x << " and 0x" << y << ", n " << std::dec << n
                                << " [" << i << "]";
      }
    }
  }
}

TEST(DTypeTest, MinMaxGiveTheCanonicalNanForAnyNanOperand) {
  for (const Bits& t : kFloats) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      for (uint64_t nan : {t.canonical_nan, t.other_nan, t.minus_nan}) {
        for (uint64_t other :
             {t.one, t.minus_two, t.minus_zero, uint64_t{0}, nan, t.other_nan, t.minus_nan}) {
          ExpectBoth(t, op, nan, other, t.canonical_nan);
        }
      }
    }
  }
}

TEST(DTypeTest, MinOfSignedZerosIsMinusZeroAndMaxPlusZero) {
  for (const Bits& t : kFloats) {
    ExpectBoth(t, ReduceOp::kMin, t.minus_zero, 0, t.minus_zero);
    ExpectBoth(t, ReduceOp::kMax, t.minus_zero, 0, 0);
    ExpectBoth(t, ReduceOp::kMin, t.minus_zero, t.minus_zero, t.minus_zero);
    ExpectBoth(t, ReduceOp::kMax, 0, 0, 0);
    ExpectBoth(t, ReduceOp::kMin, t.one, t.minus_two, t.minus_two);
    ExpectBoth(t, ReduceOp::kMax, t.one, t.minus_two, t.one);
    ExpectBoth(t, ReduceOp::kMin, t.minus_zero, t.one, t.minus_zero);
    ExpectBoth(t, ReduceOp::kMax, t.minus_zero, t.minus_two, t.minus_zero);
  }
}

// A NaN anywhere in a long row, in either input, leaves the other elements' min and max alone.
TEST(DTypeTest, MinMaxNanInOneElementOnly) {
  std::vector<float> a(37, 1.0f), b(37, 2.0f), d(37);
  uint32_t nan_bits = 0xffc00001;
  std::memcpy(&b[5], &nan_bits, 4);
  std::memcpy(&a[36], &nan_bits, 4);
  ReduceElements(d.data(), a.data(), b.data(), d.size(), DType::kFloat32, ReduceOp::kMax);
  for (size_t i = 0; i < d.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &d[i], 4);
    EXPECT_EQ(bits, i == 5 || i == 36 ? 0x7fc00000u : 0x40000000u) << i;
  }
}

TEST(DTypeTest, EightBitSumsAndProductsWrap) {
  std::vector<uint8_t> a(100, 200), b(100, 100), d(100);
  ReduceElements(d.data(), a.data(), b.data(), d.size(), DType::kUint8, ReduceOp::kSum);
  for (uint8_t v : d) EXPECT_EQ(v, 44);
  ReduceElements(d.data(), a.data(), b.data(), d.size(), DType::kUint8, ReduceOp::kProduct);
  for (uint8_t v : d) EXPECT_EQ(v, static_cast<uint8_t>(20000 % 256));
  std::vector<int8_t> x(100, -100), y(100, -100), z(100);
  ReduceElements(z.data(), x.data(), y.data(), z.size(), DType::kInt8, ReduceOp::kSum);
  for (int8_t v : z) EXPECT_EQ(v, 56);
}

}  // namespace
}  // namespace concord
