// The scalar IEEE binary16 and bfloat16 conversions (round to nearest even; inf kept; nan kept as a
// quiet nan with its sign and the top bits of its payload; subnormals kept), as inline functions
// that also compile as CUDA device code, so the GPU kernels in compression/cuda give the CPU's
// bits. Host code calls them through base/dtype.h (FloatToHalf, HalfToFloat, ...). Pure functions.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define CONCORD_HOST_DEVICE __host__ __device__
#else
#define CONCORD_HOST_DEVICE
#endif

namespace concord {
namespace half_convert {

CONCORD_HOST_DEVICE inline uint16_t FloatToHalf(float value) {
  uint32_t x;
  memcpy(&x, &value, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan; keep nan quiet and non-zero
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u)
      return static_cast<uint16_t>(sign);  // below half of the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

CONCORD_HOST_DEVICE inline float HalfToFloat(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0x1f) {  // inf, or nan made quiet as IEEE conversions do (as F16C does)
    out = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  } else if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // normalise a subnormal
      exp = 113;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      out = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &out, 4);
  return f;
}

CONCORD_HOST_DEVICE inline uint16_t FloatToBFloat16(float value) {
  uint32_t x;
  memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

CONCORD_HOST_DEVICE inline float BFloat16ToFloat(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

}  // namespace half_convert
}  // namespace concord
