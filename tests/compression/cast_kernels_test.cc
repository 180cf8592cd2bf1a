// The fp16/bf16 array kernels: every SIMD path this CPU runs gives the portable path's bits
// (special values, every 16-bit pattern, a sweep of float bit patterns, random data, each size
// class), and the portable path keeps the cast's promises (rounding, error bounds, specials).
#include "compression/cast_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"

namespace concord {
namespace compression {
namespace {

constexpr HalfFormat kFormats[] = {HalfFormat::kFloat16, HalfFormat::kBFloat16};
constexpr CastPath kSimdPaths[] = {CastPath::kAvx2, CastPath::kAvx512};

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

// Values where conversions go wrong: specials, range edges, subnormals of all three formats,
// halfway cases.
std::vector<float> SpecialFloats() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          FromBits(0x7f800001u),
                          FromBits(0xff800001u),
                          FromBits(0x7fa00000u),
                          FromBits(0x7fc01234u),
                          FromBits(0x7fffffffu),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          FromBits(0x807fffffu),
                          FromBits(0x00400001u),
                          FromBits(0x00008000u),
                          FromBits(0x00018000u),
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          -65520.0f,
                          70000.0f,
                          1e10f,
                          std::ldexp(1.0f, -14),
                          std::ldexp(1.0f, -24),
                          std::ldexp(1.0f, -25),
                          std::ldexp(3.0f, -26),
                          std::ldexp(1.0f, -26),
                          std::ldexp(1.5f, -25),
                          1.0f + std::ldexp(1.0f, -11),
                          1.0f + std::ldexp(3.0f, -11),
                          1.0f + std::ldexp(1.0f, -8),
                          1.0f + std::ldexp(3.0f, -8),
                          FromBits(0x3f808000u),
                          FromBits(0x3f818000u),
                          FromBits(0x7f7f8000u),
                          FromBits(0x7f7f7fffu),
                          1.0f,
                          -1.0f,
                          0.1f,
                          3.14159f,
                          -2.5e-6f};
  return v;
}

// Special values, then random bit patterns (all exponents, nan payloads), then random normals.
std::vector<float> TestFloats(size_t n, uint32_t seed) {
  std::vector<float> v = SpecialFloats();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  while (v.size() < n / 2) v.push_back(FromBits(static_cast<uint32_t>(rng())));
  while (v.size() < n) v.push_back(normal(rng));
  v.resize(n);
  return v;
}

std::vector<uint8_t> Encode(HalfFormat f, const std::vector<float>& in, float scale, CastPath p) {
  std::vector<uint8_t> out(2 * in.size() + 1);
  EncodeFloats(f, in.data(), in.size(), scale, out.data() + 1, p);  // odd address on purpose
  return std::vector<uint8_t>(out.begin() + 1, out.end());
}

std::vector<uint32_t> DecodeBits(HalfFormat f, const std::vector<uint8_t>& in, CastPath p,
                                 bool accumulate) {
  const size_t n = in.size() / 2;
  std::vector<float> out(n, 1.5f);
  if (accumulate) {
    AccumulateFloats(f, in.data(), n, out.data(), p);
  } else {
    DecodeToFloats(f, in.data(), n, out.data(), p);
  }
  std::vector<uint32_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = Bits(out[i]);
  return bits;
}

TEST(CastKernelsTest, PortableIsAlwaysAvailableAndBestIsAvailable) {
  for (HalfFormat f : kFormats) {
    EXPECT_TRUE(CastPathAvailable(f, CastPath::kPortable));
    EXPECT_TRUE(CastPathAvailable(f, BestCastPath(f)));
    std::printf("%s: best path %s\n", HalfFormatName(f), CastPathName(BestCastPath(f)));
  }
}

TEST(CastKernelsTest, SimdPathsMatchPortableBitForBit) {
  int paths_run = 0;
  for (HalfFormat f : kFormats) {
    for (CastPath p : kSimdPaths) {
      if (!CastPathAvailable(f, p)) continue;
      ++paths_run;
      SCOPED_TRACE(std::string(HalfFormatName(f)) + " " + CastPathName(p));
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16},
                       size_t{17}, size_t{33}, size_t{1001}, size_t{262147}}) {
        const std::vector<float> in = TestFloats(n, static_cast<uint32_t>(n));
        for (float scale : {1.0f, 0.25f, 1.0f / 3.0f, 1e-30f}) {
          const std::vector<uint8_t> want = Encode(f, in, scale, CastPath::kPortable);
          const std::vector<uint8_t> got = Encode(f, in, scale, p);
          ASSERT_EQ(want, got) << "encode, n " << n << " scale " << scale;
        }
        const std::vector<uint8_t> enc = Encode(f, in, 1.0f, CastPath::kPortable);
        for (bool acc : {false, true}) {
          ASSERT_EQ(DecodeBits(f, enc, CastPath::kPortable, acc), DecodeBits(f, enc, p, acc))
              << (acc ? "accumulate" : "decode") << ", n " << n;
        }
      }
    }
  }
  std::printf("SIMD paths compared: %d\n", paths_run);
}

TEST(CastKernelsTest, EveryHalfPatternDecodesAlikeOnEveryPath) {
  std::vector<uint8_t> all(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    all[2 * h] = static_cast<uint8_t>(h);
    all[2 * h + 1] = static_cast<uint8_t>(h >> 8);
  }
  for (HalfFormat f : kFormats) {
    const std::vector<uint32_t> want = DecodeBits(f, all, CastPath::kPortable, false);
    for (CastPath p : kSimdPaths) {
      if (CastPathAvailable(f, p)) {
        EXPECT_EQ(want, DecodeBits(f, all, p, false)) << CastPathName(p);
      }
    }
    // Every non-nan pattern survives decode then encode unchanged (both directions exact).
    std::vector<float> decoded(65536);
    for (uint32_t h = 0; h < 65536; ++h) decoded[h] = FromBits(want[h]);
    const std::vector<uint8_t> back = Encode(f, decoded, 1.0f, BestCastPath(f));
    for (uint32_t h = 0; h < 65536; ++h) {
      if (std::isnan(decoded[h])) continue;
      ASSERT_EQ(back[2 * h] | (back[2 * h + 1] << 8), static_cast<int>(h)) << HalfFormatName(f);
    }
  }
}

TEST(CastKernelsTest, FloatBitPatternSweepMatchesAcrossPaths) {
  // Every 997th 32-bit pattern: all exponents, signs, nan payloads, subnormals.
  std::vector<float> in;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 997)
    in.push_back(FromBits(static_cast<uint32_t>(b)));
  for (HalfFormat f : kFormats) {
    const std::vector<uint8_t> want = Encode(f, in, 1.0f, CastPath::kPortable);
    for (CastPath p : kSimdPaths) {
      if (CastPathAvailable(f, p)) {
        EXPECT_EQ(want, Encode(f, in, 1.0f, p)) << CastPathName(p);
      }
    }
  }
}

TEST(CastKernelsTest, SpecialValuesConvertAsIeeeSays) {
  for (CastPath p : {CastPath::kPortable, CastPath::kAvx2, CastPath::kAvx512}) {
    auto h = [&](float x) {
      uint16_t out;
      EncodeFloats(HalfFormat::kFloat16, &x, 1, 1.0f, &out, p);
      return out;
    };
    auto b = [&](float x) {
      uint16_t out;
      EncodeFloats(HalfFormat::kBFloat16, &x, 1, 1.0f, &out, p);
      return out;
    };
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(h(inf), 0x7c00);
    EXPECT_EQ(h(-inf), 0xfc00);
    EXPECT_EQ(h(0.0f), 0x0000);
    EXPECT_EQ(h(-0.0f), 0x8000);
    EXPECT_EQ(h(std::numeric_limits<float>::quiet_NaN()), 0x7e00);   // positive quiet nan
    EXPECT_EQ(h(-std::numeric_limits<float>::quiet_NaN()), 0xfe00);  // sign kept
    EXPECT_EQ(h(FromBits(0x7f800001u)) & 0x7e00, 0x7e00);            // signalling -> quiet
    EXPECT_EQ(h(65504.0f), 0x7bff);                                  // max
    EXPECT_EQ(h(65519.0f), 0x7bff);                                  // below the halfway point
    EXPECT_EQ(h(65520.0f), 0x7c00);                                  // halfway rounds to inf
    EXPECT_EQ(h(-1e10f), 0xfc00);
    EXPECT_EQ(h(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
    EXPECT_EQ(h(std::ldexp(1.0f, -25)), 0x0000);         // tie to even: zero
    EXPECT_EQ(h(std::ldexp(3.0f, -26)), 0x0001);         // above the tie
    EXPECT_EQ(h(std::ldexp(3.0f, -25)), 0x0002);         // tie between 1 and 2 subnormal ulps: even
    EXPECT_EQ(h(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
    EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even (down)
    EXPECT_EQ(h(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie to even (up)
    EXPECT_EQ(b(inf), 0x7f80);
    EXPECT_EQ(b(-0.0f), 0x8000);
    EXPECT_EQ(b(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
    EXPECT_EQ(b(FromBits(0x7f800001u)), 0x7fc0);                     // signalling -> quiet
    EXPECT_EQ(b(std::numeric_limits<float>::max()), 0x7f80);         // rounds up to inf
    EXPECT_EQ(b(FromBits(0x7f7f7fffu)), 0x7f7f);                     // below the tie: max
    EXPECT_EQ(b(FromBits(0x3f808000u)), 0x3f80);                     // tie to even (down)
    EXPECT_EQ(b(FromBits(0x3f818000u)), 0x3f82);                     // tie to even (up)
    EXPECT_EQ(b(std::numeric_limits<float>::denorm_min()), 0x0000);  // 2^-149: below half ulp
    EXPECT_EQ(b(FromBits(0x00018000u)), 0x0002);                     // subnormal tie: even
    EXPECT_EQ(b(FromBits(0x00400001u)), 0x0040);                     // subnormal kept
  }
}

TEST(CastKernelsTest, RoundTripErrorWithinTheFormatsBound) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-14.0f, 15.9f);
  std::vector<float> in(100003);
  for (float& x : in) x = std::exp2(exponent(rng)) * (rng() % 2 ? 1.0f : -1.0f);
  std::vector<float> out(in.size());
  std::vector<uint8_t> enc(2 * in.size());
  EncodeFloats(HalfFormat::kFloat16, in.data(), in.size(), 1.0f, enc.data(),
               BestCastPath(HalfFormat::kFloat16));
  DecodeToFloats(HalfFormat::kFloat16, enc.data(), in.size(), out.data(),
                 BestCastPath(HalfFormat::kFloat16));
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(std::fabs(in[i]), -11)) << in[i];
  }
  std::uniform_real_distribution<float> wide(-126.0f, 127.9f);
  for (float& x : in) x = std::exp2(wide(rng)) * (rng() % 2 ? 1.0f : -1.0f);
  EncodeFloats(HalfFormat::kBFloat16, in.data(), in.size(), 1.0f, enc.data(),
               BestCastPath(HalfFormat::kBFloat16));
  DecodeToFloats(HalfFormat::kBFloat16, enc.data(), in.size(), out.data(),
                 BestCastPath(HalfFormat::kBFloat16));
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(std::fabs(in[i]), -8)) << in[i];
  }
}

TEST(CastKernelsTest, DoublesRoundOnceNotTwice) {
  // 1 + 2^-11 + 2^-40 lies just above the fp16 tie between 1 and 1 + 2^-10: the right answer is
  // 1 + 2^-10. Through a float rounded to nearest it would be the tie itself and round down to 1.
  for (CastPath p : {CastPath::kPortable, CastPath::kAvx2, CastPath::kAvx512}) {
    const double d16 = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
    uint16_t h;
    EncodeDoubles(HalfFormat::kFloat16, &d16, 1, 1.0, &h, p);
    EXPECT_EQ(h, 0x3c01);
    const double d16_down = 1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40);
    EncodeDoubles(HalfFormat::kFloat16, &d16_down, 1, 1.0, &h, p);
    EXPECT_EQ(h, 0x3c00);
    const double db = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
    EncodeDoubles(HalfFormat::kBFloat16, &db, 1, 1.0, &h, p);
    EXPECT_EQ(h, 0x3f81);
    const double big = 1e300;  // beyond float: inf in both formats
    EncodeDoubles(HalfFormat::kFloat16, &big, 1, 1.0, &h, p);
    EXPECT_EQ(h, 0x7c00);
    EncodeDoubles(HalfFormat::kBFloat16, &big, 1, 1.0, &h, p);
    EXPECT_EQ(h, 0x7f80);
    const double tiny = -1e-300;  // below every subnormal: -0
    EncodeDoubles(HalfFormat::kFloat16, &tiny, 1, 1.0, &h, p);
    EXPECT_EQ(h, 0x8000);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    EncodeDoubles(HalfFormat::kBFloat16, &nan, 1, 1.0, &h, p);
    EXPECT_EQ(h & 0x7fc0, 0x7fc0);
  }
}

TEST(CastKernelsTest, DoublePathsMatchAndDecodeExactly) {
  std::mt19937_64 rng(3);
  std::vector<double> in(4099);
  for (double& d : in) {
    const uint64_t bits = rng();
    std::memcpy(&d, &bits, 8);
  }
  in[0] = 0.1;
  in[1] = -65504.0;
  for (HalfFormat f : kFormats) {
    std::vector<uint8_t> want(2 * in.size()), got(2 * in.size());
    EncodeDoubles(f, in.data(), in.size(), 0.5, want.data(), CastPath::kPortable);
    for (CastPath p : kSimdPaths) {
      if (!CastPathAvailable(f, p)) continue;
      EncodeDoubles(f, in.data(), in.size(), 0.5, got.data(), p);
      EXPECT_EQ(want, got) << CastPathName(p);
    }
    std::vector<double> dec(in.size()), sum(in.size(), 1.0);
    DecodeToDoubles(f, want.data(), in.size(), dec.data(), BestCastPath(f));
    AccumulateDoubles(f, want.data(), in.size(), sum.data(), BestCastPath(f));
    std::vector<float> decf(in.size());
    DecodeToFloats(f, want.data(), in.size(), decf.data(), CastPath::kPortable);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(Bits(dec[i]), Bits(static_cast<double>(decf[i]))) << i;
      if (!std::isnan(dec[i])) {
        ASSERT_EQ(sum[i], 1.0 + dec[i]) << i;
      }
    }
  }
}

}  // namespace
}  // namespace compression
}  // namespace concord
