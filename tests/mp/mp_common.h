// Helpers shared by the multi-process tests (tests/mp/*.cc): dtype sizes, half-precision
// conversions written here (independent of the library's), element access as double, and small
// checking macros. Only the C API (concord.h) is used.
#ifndef CONCORD_TESTS_MP_MP_COMMON_H_
#define CONCORD_TESTS_MP_MP_COMMON_H_

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "concord/concord.h"

namespace mp {

inline size_t DTypeSize(concord_dtype_t t) {
  switch (t) {
    case CONCORD_UINT8:
    case CONCORD_INT8:
      return 1;
    case CONCORD_FLOAT16:
    case CONCORD_BFLOAT16:
      return 2;
    case CONCORD_INT32:
    case CONCORD_FLOAT32:
      return 4;
    case CONCORD_INT64:
    case CONCORD_FLOAT64:
      return 8;
  }
  return 0;
}

inline const char* DTypeName(concord_dtype_t t) {
  switch (t) {
    case CONCORD_UINT8:
      return "u8";
    case CONCORD_INT8:
      return "i8";
    case CONCORD_INT32:
      return "i32";
    case CONCORD_INT64:
      return "i64";
    case CONCORD_FLOAT16:
      return "f16";
    case CONCORD_BFLOAT16:
      return "bf16";
    case CONCORD_FLOAT32:
      return "f32";
    case CONCORD_FLOAT64:
      return "f64";
  }
  return "?";
}

inline bool IsFloat(concord_dtype_t t) {
  return t == CONCORD_FLOAT16 || t == CONCORD_BFLOAT16 || t == CONCORD_FLOAT32 ||
         t == CONCORD_FLOAT64;
}
inline bool IsSigned(concord_dtype_t t) {
  return t != CONCORD_UINT8;
}

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 <-> binary32, round to nearest even, with subnormals, infinities and NaN.
inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: ok
  return static_cast<uint16_t>(sign | h);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

inline uint16_t FloatToBf16(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
inline float Bf16ToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

inline void SetElem(void* data, concord_dtype_t t, size_t i, double v) {
  switch (t) {
    case CONCORD_UINT8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      break;
    case CONCORD_INT8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
      break;
    case CONCORD_INT32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      break;
    case CONCORD_INT64:
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v);
      break;
    case CONCORD_FLOAT16:
      static_cast<uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(v));
      break;
    case CONCORD_BFLOAT16:
      static_cast<uint16_t*>(data)[i] = FloatToBf16(static_cast<float>(v));
      break;
    case CONCORD_FLOAT32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      break;
    case CONCORD_FLOAT64:
      static_cast<double*>(data)[i] = v;
      break;
  }
}

inline double GetElem(const void* data, concord_dtype_t t, size_t i) {
  switch (t) {
    case CONCORD_UINT8:
      return static_cast<const uint8_t*>(data)[i];
    case CONCORD_INT8:
      return static_cast<const int8_t*>(data)[i];
    case CONCORD_INT32:
      return static_cast<const int32_t*>(data)[i];
    case CONCORD_INT64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case CONCORD_FLOAT16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case CONCORD_BFLOAT16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case CONCORD_FLOAT32:
      return static_cast<const float*>(data)[i];
    case CONCORD_FLOAT64:
      return static_cast<const double*>(data)[i];
  }
  return 0;
}

// Relative tolerance for a dtype: 0 (exact) for integers.
inline double Tolerance(concord_dtype_t t) {
  switch (t) {
    case CONCORD_FLOAT16:
      return 2e-3;
    case CONCORD_BFLOAT16:
      return 1.6e-2;
    case CONCORD_FLOAT32:
      return 1e-6;
    case CONCORD_FLOAT64:
      return 1e-12;
    default:
      return 0;
  }
}

inline bool Close(double got, double want, concord_dtype_t t) {
  const double tol = Tolerance(t);
  if (tol == 0) return got == want;
  return std::fabs(got - want) <= tol * std::fabs(want) + tol * 1e-3;
}

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline concord_tensor_t Tensor(void* data, concord_dtype_t t, int ndim, const int64_t* shape) {
  concord_tensor_t x;
  x.data = data;
  x.dtype = t;
  x.ndim = ndim;
  x.shape = shape;
  x.device = CONCORD_DEVICE_CPU;
  return x;
}

}  // namespace mp

#endif  // CONCORD_TESTS_MP_MP_COMMON_H_
